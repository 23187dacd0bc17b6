//! nanoGPT: one flat file of little-endian uint16 tokens, documents back to
//! back (as nanoGPT's prepare scripts write `train.bin`), no header and no
//! document boundaries. A dataset with ids above 65,535 (a uint32 dataset)
//! is refused. A dataset with loss masks also gets `train.mask` beside it
//! (see [`super::mask_file`]), which nanoGPT does not read.

use std::path::{Path, PathBuf};

use super::{
    ExportConfig, ExportReport, ImportConfig, InteropError, RecordSink, Splitter, TmpFile,
};
use crate::format::{Dataset, Dtype, MappedFile};

pub(crate) fn export(ds: &Dataset, config: &ExportConfig) -> Result<ExportReport, InteropError> {
    if ds.dtype() != Dtype::U16 {
        return Err(InteropError::Unsupported(format!(
            "nanoGPT files hold uint16 tokens, and this dataset's vocabulary has {} ids",
            ds.manifest().vocab_size
        )));
    }
    let mut out = TmpFile::create(&config.output, config.overwrite)?;
    super::write_all_tokens(ds, &mut out)?;
    let mask = match ds.manifest().has_loss_mask() {
        true => Some(super::mask_file(&config.output, ds, config.overwrite)?),
        false => None,
    };
    let bytes = out.bytes() + mask.as_ref().map_or(0, TmpFile::bytes);
    let mut files = vec![out.commit()?];
    files.extend(mask.map(TmpFile::commit).transpose()?);
    Ok(ExportReport {
        files,
        records: ds.len(),
        tokens: ds.n_tokens(),
        bytes,
    })
}

/// Reads one flat uint16 file into records (split at `--eos`, or one record).
pub(crate) fn import(
    path: &Path,
    config: &ImportConfig,
    sink: &mut impl RecordSink,
) -> Result<Vec<PathBuf>, InteropError> {
    let map = MappedFile::open(path)?;
    if map.bytes().len() % 2 != 0 {
        return Err(super::bad(
            path,
            format!("{} bytes: not whole uint16 tokens", map.bytes().len()),
        ));
    }
    let mut split = Splitter::new(sink, 2, config.eos, false)?;
    split.push(map.bytes())?;
    split.finish()?;
    Ok(vec![path.into()])
}
