//! OLMo-core's fine-tuning files, as open-instruct's converter writes them
//! for OLMo-core's `label_mask_paths`, in an output folder:
//!
//! - `token_ids_part_NNNN.npy`: the ids back to back, little-endian in the
//!   dataset's dtype (OLMo-core picks the same one from the vocabulary
//!   size), raw as `numpy.memmap` writes them: no `.npy` header, whatever
//!   the name says;
//! - `labels_mask_part_NNNN.npy`: one byte per token, 1 where it is trained
//!   on (a `numpy.bool_` memmap), the same parts; written from the loss
//!   masks of a `prep tokenize --chat` dataset, and left out for a dataset
//!   without masks (every token trained on);
//! - `token_ids_part_NNNN.csv.gz`: one `start,end` line per record in the
//!   part, token offsets within the part: the document boundaries, so that
//!   no trainer infers them from eos.
//!
//! Parts hold at most 1 GiB of ids, as open-instruct cuts them; a record
//! that crosses a part's end is listed in both parts, cut there.

use std::io::Write;
use std::path::{Path, PathBuf};

use super::{ExportConfig, ExportReport, InteropError, TmpFile};
use crate::format::Dataset;

/// Bytes of ids per part, as open-instruct writes them.
const PART_BYTES: u64 = 1 << 30;

pub(crate) fn export(ds: &Dataset, config: &ExportConfig) -> Result<ExportReport, InteropError> {
    let part_tokens = PART_BYTES / ds.dtype().size() as u64;
    export_in_parts(ds, config, part_tokens)
}

/// The files of one part being written.
struct Part {
    ids: TmpFile,
    mask: Option<TmpFile>,
    /// `start,end` lines of the part's records.
    bounds: String,
}

/// [`export`] with parts of `part_tokens` tokens (at least 1) instead of
/// open-instruct's 1 GiB: OLMo-core reads parts of any size.
pub fn export_in_parts(
    ds: &Dataset,
    config: &ExportConfig,
    part_tokens: u64,
) -> Result<ExportReport, InteropError> {
    let out = &config.output;
    let part_tokens = part_tokens.max(1);
    let masked = ds.manifest().has_loss_mask();
    let mut files = Vec::new();
    // Every record and mask is read through the dataset's checks.
    let checked = ds.verified()?;
    let mut part: Option<Part> = None;
    let (mut n, mut at) = (0usize, 0u64); // parts begun; tokens written
    let size = ds.dtype().size();
    for r in 0..ds.len() {
        let bytes = checked.record_bytes(r)?;
        let mask = checked.loss_mask(r)?.unwrap_or(&[]);
        let len = (bytes.len() / size) as u64;
        let mut k = 0u64; // tokens of the record written
        while k < len {
            let p = match &mut part {
                Some(p) => p,
                None => {
                    n += 1;
                    part.insert(open_part(out, n - 1, masked, config.overwrite)?)
                }
            };
            let start = at - (n as u64 - 1) * part_tokens;
            let take = (part_tokens - start).min(len - k);
            let (lo, hi) = (k as usize, (k + take) as usize);
            p.ids.write(&bytes[lo * size..hi * size])?;
            if let Some(m) = &mut p.mask {
                m.write(&mask[lo..hi])?;
            }
            p.bounds += &format!("{},{}\n", start, start + take);
            k += take;
            at += take;
            if start + take == part_tokens {
                let full = part.take().expect("a part is open");
                finish(full, out, n - 1, config.overwrite, &mut files)?;
            }
        }
    }
    if let Some(done) = part.take() {
        finish(done, out, n - 1, config.overwrite, &mut files)?;
    }
    let bytes = files
        .iter()
        .map(|f| std::fs::metadata(f).map(|m| m.len()).unwrap_or(0))
        .sum();
    Ok(ExportReport {
        files,
        records: ds.len(),
        tokens: ds.n_tokens(),
        bytes,
    })
}

/// Starts part `n`.
fn open_part(out: &Path, n: usize, masked: bool, overwrite: bool) -> Result<Part, InteropError> {
    let file =
        |name: &str| TmpFile::create(&out.join(format!("{name}_part_{n:04}.npy")), overwrite);
    Ok(Part {
        ids: file("token_ids")?,
        mask: masked.then(|| file("labels_mask")).transpose()?,
        bounds: String::new(),
    })
}

/// Closes a part: its ids and mask, then its boundaries, gzipped.
fn finish(
    part: Part,
    out: &Path,
    n: usize,
    overwrite: bool,
    files: &mut Vec<PathBuf>,
) -> Result<(), InteropError> {
    let mut csv = TmpFile::create(
        &out.join(format!("token_ids_part_{n:04}.csv.gz")),
        overwrite,
    )?;
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(part.bounds.as_bytes())
        .and_then(|()| gz.flush())
        .map_err(super::io(out))?;
    csv.write(&gz.finish().map_err(super::io(out))?)?;
    let mut ids = part.ids;
    ids.close()?;
    files.push(ids.commit()?);
    if let Some(mut mask) = part.mask {
        mask.close()?;
        files.push(mask.commit()?);
    }
    csv.close()?;
    files.push(csv.commit()?);
    Ok(())
}
