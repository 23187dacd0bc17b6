//! Arrow IPC input: the `.arrow` files of a Hugging Face `datasets` cache
//! (`save_to_disk` folders and the download cache both write IPC streams),
//! and Arrow IPC files (`ARROW1` magic, Feather v2) alike.
//!
//! Only the top-level column on the way to the text is decoded, one record
//! batch at a time (as the writer cut them), so memory holds one batch of
//! one column however large the file. The text column is found by the same
//! [`TextKey`] rules as in Parquet.

use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use arrow::array::{ArrayRef, AsArray};
use arrow::datatypes::SchemaRef;
use arrow::error::ArrowError;
use arrow::ipc::reader::{FileReader, StreamReader};
use arrow::record_batch::RecordBatch;

use super::parquet::{plain_strings, resolve, row_payload};
use super::{InputError, Location, Payload, TextKey};

/// What an Arrow IPC file (as opposed to a stream) starts with.
const FILE_MAGIC: &[u8; 6] = b"ARROW1";

type Batches = Box<dyn Iterator<Item = Result<RecordBatch, ArrowError>> + Send>;

/// Whole rows are written as JSON this many at a time: a record batch may
/// claim far more rows than its bytes hold (a column of nulls needs no
/// buffer), and the JSON of all of them at once could fill memory.
const JSON_ROWS: usize = 1024;

/// An open `.arrow` file, handing out the text of each row in order.
pub(crate) struct ArrowSource {
    path: PathBuf,
    /// The dotted key, for [`super::DocError::Null`].
    key: String,
    batches: Batches,
    /// Field names from the top-level column down to the text leaf.
    names: Vec<String>,
    /// The arrays on the path to the text in the batch being handed out
    /// (top-level column first, the text last), its length and position.
    chain: Vec<ArrayRef>,
    /// The batch being handed out, when whole rows are read, and the JSON
    /// objects of its rows from `rows_from` on (at most [`JSON_ROWS`]).
    whole: Option<RecordBatch>,
    rows: Vec<Vec<u8>>,
    rows_from: usize,
    len: usize,
    pos: usize,
    /// 0-based index in the file of the next row; record batches read so far.
    row: u64,
    batch: usize,
}

/// What an IPC file is read through: a local file, or an object in storage
/// read by ranged GETs.
trait ReadSeek: Read + Seek + Send {}
impl<T: Read + Seek + Send> ReadSeek for T {}

/// Opens `path` (a local file, or an object in storage) as an IPC file or
/// stream (by its first bytes), reading only the columns in `projection`;
/// the schema comes back with the batches.
fn open(path: &Path, projection: Option<Vec<usize>>) -> Result<(SchemaRef, Batches), InputError> {
    let io = |source| InputError::Open {
        path: path.to_owned(),
        cause: source,
    };
    let bad = |source| InputError::ArrowOpen {
        path: path.to_owned(),
        cause: source,
    };
    let remote = super::remote(path)?;
    let (mut seekable, len): (Box<dyn ReadSeek>, u64) = match &remote {
        Some((object, size)) => (
            Box::new(crate::store::SeekableObject::new(object.clone(), *size)),
            *size,
        ),
        None => {
            let file = File::open(path).map_err(io)?;
            let len = file.metadata().map_err(io)?.len();
            (Box::new(file), len)
        }
    };
    // The first bytes say file or stream: from storage, a GET of them alone
    // (the seekable reader would fetch a whole chunk that a stream does not
    // read again).
    let is_file = match &remote {
        Some((object, size)) => {
            let magic = object.get_range(0..(*size).min(FILE_MAGIC.len() as u64))?;
            magic[..] == FILE_MAGIC[..]
        }
        None => {
            let mut magic = [0u8; 6];
            let mut got = 0;
            while got < magic.len() {
                match seekable.read(&mut magic[got..]).map_err(io)? {
                    0 => break,
                    n => got += n,
                }
            }
            seekable.seek(SeekFrom::Start(0)).map_err(io)?;
            got == magic.len() && &magic == FILE_MAGIC
        }
    };
    let damaged = |why: String| bad(ArrowError::IpcError(format!("the file is damaged: {why}")));
    if is_file {
        check_blocks(&mut seekable, len).map_err(|e| match e {
            Footer::Io(e) => io(e),
            Footer::Damaged(why) => damaged(why),
        })?;
        seekable.seek(SeekFrom::Start(0)).map_err(io)?;
        let reader =
            crate::util::catch_panic(|| FileReader::try_new_buffered(seekable, projection))
                .map_err(damaged)?
                .map_err(bad)?;
        Ok((reader.schema(), Box::new(reader)))
    } else {
        // A stream is read front to back: from storage, by ranged GETs
        // several at a time.
        let stream: Box<dyn Read + Send> = match remote {
            Some((object, size)) => Box::new(object.reader(0, size)),
            None => seekable,
        };
        let reader =
            crate::util::catch_panic(|| StreamReader::try_new(BufReader::new(stream), projection))
                .map_err(damaged)?
                .map_err(bad)?;
        Ok((reader.schema(), Box::new(reader)))
    }
}

/// Why an IPC file's footer is refused.
enum Footer {
    Io(std::io::Error),
    Damaged(String),
}

/// Checks that every block an IPC file's footer lists (each record batch
/// and dictionary: where its message starts, its metadata's and its body's
/// lengths) lies between the magic and the footer. arrow's file reader
/// allocates a block's claimed length before reading it, so a damaged
/// footer could otherwise claim terabytes of memory; this names the block
/// instead. (An IPC stream's reader grows its buffer as the bytes come.)
fn check_blocks(file: &mut dyn ReadSeek, len: u64) -> Result<(), Footer> {
    let damaged = |why: String| Err(Footer::Damaged(why));
    // The file starts with the magic padded to 8 bytes, and ends with the
    // footer's length (i32) and the magic again.
    const START: u64 = 8;
    const TAIL: u64 = 4 + FILE_MAGIC.len() as u64;
    if len < START + TAIL {
        return damaged(format!("{len} bytes is too short for an IPC file"));
    }
    let mut tail = [0u8; TAIL as usize];
    file.seek(SeekFrom::Start(len - TAIL)).map_err(Footer::Io)?;
    file.read_exact(&mut tail).map_err(Footer::Io)?;
    if tail[4..] != *FILE_MAGIC {
        return damaged("it does not end with the ARROW1 magic".into());
    }
    let footer_len = i32::from_le_bytes(tail[..4].try_into().expect("4 bytes"));
    let footer_start = u64::try_from(footer_len)
        .ok()
        .and_then(|n| (len - TAIL).checked_sub(n))
        .filter(|&at| at >= START);
    let Some(footer_start) = footer_start else {
        return damaged(format!(
            "its footer claims {footer_len} bytes, and the file has {len}"
        ));
    };
    let mut footer = vec![0u8; footer_len as usize];
    file.seek(SeekFrom::Start(footer_start))
        .map_err(Footer::Io)?;
    file.read_exact(&mut footer).map_err(Footer::Io)?;
    let footer = match arrow::ipc::root_as_footer(&footer) {
        Ok(footer) => footer,
        Err(e) => return damaged(format!("its footer does not parse: {e}")),
    };
    let lists = [
        ("record batch", footer.recordBatches()),
        ("dictionary", footer.dictionaries()),
    ];
    for (what, blocks) in lists {
        for (i, block) in blocks.into_iter().flatten().enumerate() {
            let (offset, meta, body) = (block.offset(), block.metaDataLength(), block.bodyLength());
            let within = u64::try_from(offset)
                .ok()
                .filter(|&o| o >= START)
                .zip(u64::try_from(meta).ok())
                .zip(u64::try_from(body).ok())
                .and_then(|((o, m), b)| o.checked_add(m)?.checked_add(b))
                .is_some_and(|end| end <= footer_start);
            if !within {
                return damaged(format!(
                    "its footer puts {what} {i} at byte {offset} with {meta} bytes of metadata \
                     and {body} of body, outside the {footer_start} bytes before the footer"
                ));
            }
        }
    }
    Ok(())
}

impl ArrowSource {
    /// Opens `path` and checks that `key` names a string column.
    pub(crate) fn open(path: &Path, key: &TextKey) -> Result<ArrowSource, InputError> {
        let (schema, batches) = open(path, None)?;
        let (names, batches) = if key.is_whole_row() {
            (Vec::new(), batches)
        } else {
            let names = resolve(schema.fields(), key, path)?;
            // `resolve` found names[0] among the top-level fields.
            let column = schema.index_of(&names[0]).ok();
            (names.clone(), open(path, column.map(|c| vec![c]))?.1)
        };
        Ok(ArrowSource {
            path: path.to_owned(),
            key: key.as_str().to_owned(),
            batches,
            names,
            chain: Vec::new(),
            whole: None,
            rows: Vec::new(),
            rows_from: 0,
            len: 0,
            pos: 0,
            row: 0,
            batch: 0,
        })
    }

    /// The next row's text (or [`super::DocError::Null`]), or `None` at the end of the file.
    pub(crate) fn next_doc(&mut self) -> Result<Option<(Location, Payload)>, InputError> {
        while self.pos == self.len {
            // The IPC reader panics on some damaged files (a buffer that
            // claims more bytes than its message holds): an error here.
            let next = crate::util::catch_panic(|| self.batches.next()).unwrap_or_else(|why| {
                Some(Err(ArrowError::IpcError(format!(
                    "the file is damaged: {why}"
                ))))
            });
            let batch = match next {
                None => return Ok(None),
                Some(Ok(batch)) => batch,
                Some(Err(source)) => {
                    return Err(InputError::ArrowRead {
                        path: self.path.clone(),
                        batch: self.batch,
                        row: self.row,
                        cause: source,
                    })
                }
            };
            self.batch += 1;
            self.len = batch.num_rows();
            self.pos = 0;
            if self.names.is_empty() {
                self.whole = Some(batch);
                self.rows.clear();
                self.rows_from = 0;
            } else {
                self.chain = self.decode(&batch)?;
            }
        }
        let pos = self.pos;
        let payload = match &self.whole {
            Some(batch) => {
                if pos >= self.rows_from + self.rows.len() {
                    let n = JSON_ROWS.min(self.len - pos);
                    let rows = super::parquet::json_rows(&batch.slice(pos, n))
                        .and_then(|rows| {
                            (rows.len() == n).then_some(rows).ok_or_else(|| {
                                ArrowError::JsonError(format!("{n} rows gave other JSON lines"))
                            })
                        })
                        .map_err(|source| InputError::ArrowRead {
                            path: self.path.clone(),
                            batch: self.batch,
                            row: self.row,
                            cause: source,
                        })?;
                    self.rows = rows;
                    self.rows_from = pos;
                }
                Payload::Json(std::mem::take(&mut self.rows[pos - self.rows_from]))
            }
            None => row_payload(&self.chain, pos, &self.key),
        };
        self.pos += 1;
        let row = self.row;
        self.row += 1;
        Ok(Some((Location::FileRow(row), payload)))
    }

    /// The arrays on the path to the text in a projected batch.
    fn decode(&self, batch: &RecordBatch) -> Result<Vec<ArrayRef>, InputError> {
        let mut chain: Vec<ArrayRef> = Vec::with_capacity(self.names.len());
        for name in &self.names {
            let next = match chain.last() {
                None => batch.column_by_name(name),
                Some(parent) => parent.as_struct_opt().and_then(|s| s.column_by_name(name)),
            };
            let Some(next) = next else {
                return Err(InputError::MissingColumn {
                    path: self.path.clone(),
                    column: self.key.clone(),
                    available: batch
                        .schema()
                        .fields()
                        .iter()
                        .map(|f| f.name().clone())
                        .collect(),
                });
            };
            chain.push(next.clone());
        }
        if let Some(leaf) = chain.last_mut() {
            *leaf = plain_strings(leaf).map_err(|cause| InputError::ArrowRead {
                path: self.path.clone(),
                // `next_doc` counted this batch before decoding it.
                batch: self.batch.saturating_sub(1),
                row: self.row,
                cause,
            })?;
        }
        Ok(chain)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{Int64Array, StringArray, StructArray};
    use arrow::datatypes::{DataType, Field};
    use arrow::ipc::writer::{FileWriter, StreamWriter};

    use super::*;
    use crate::input::{expand, InputKind, RawDoc, Reader};

    fn batch(texts: &[Option<&str>]) -> RecordBatch {
        let text: ArrayRef = Arc::new(StringArray::from(texts.to_vec()));
        let id: ArrayRef = Arc::new(Int64Array::from_iter_values(0..texts.len() as i64));
        let meta: ArrayRef = Arc::new(StructArray::from(vec![(
            Arc::new(Field::new("body", DataType::Utf8, true)),
            text.clone(),
        )]));
        RecordBatch::try_from_iter(vec![("id", id), ("text", text), ("meta", meta)]).unwrap()
    }

    /// Writes the batches as an IPC stream (as `datasets` does) or an IPC file.
    fn write(path: &Path, batches: &[RecordBatch], stream: bool) {
        let file = File::create(path).unwrap();
        let schema = batches[0].schema();
        if stream {
            let mut w = StreamWriter::try_new(file, &schema).unwrap();
            batches.iter().for_each(|b| w.write(b).unwrap());
            w.finish().unwrap();
        } else {
            let mut w = FileWriter::try_new(file, &schema).unwrap();
            batches.iter().for_each(|b| w.write(b).unwrap());
            w.finish().unwrap();
        }
    }

    fn read(dir: &Path, key: &str) -> Result<Vec<RawDoc>, InputError> {
        let files = expand(&[dir.to_str().unwrap().to_owned()])?;
        let mut reader = Reader::new(files, TextKey::parse(key));
        let mut docs = Vec::new();
        while let Some(batch) = reader.next_batch(1 << 20, 1000)? {
            docs.extend(batch);
        }
        Ok(docs)
    }

    fn texts(docs: &[RawDoc]) -> Vec<String> {
        docs.iter()
            .map(|d| match &d.payload {
                Payload::Text(t) => t.clone(),
                Payload::Bad(e) => format!("<{e}>"),
                Payload::Json(_) => unreachable!("arrow gives text"),
            })
            .collect()
    }

    /// A dictionary-typed text column (pandas' category, as `datasets`
    /// keeps it) reads as the plain column, nulls included, in a stream
    /// whose later batch brings a dictionary of its own.
    #[test]
    fn a_dictionary_text_column_reads_as_the_plain_column() {
        use arrow::array::DictionaryArray;
        use arrow::datatypes::Int16Type;
        let dir = tempfile::tempdir().unwrap();
        let batch = |texts: &[Option<&str>]| {
            let text: DictionaryArray<Int16Type> = texts.iter().copied().collect();
            RecordBatch::try_from_iter_with_nullable(vec![(
                "text",
                Arc::new(text) as ArrayRef,
                true,
            )])
            .unwrap()
        };
        write(
            &dir.path().join("data.arrow"),
            &[
                batch(&[Some("a"), Some("b"), Some("a")]),
                batch(&[Some("c"), None]),
            ],
            true,
        );
        let docs = read(dir.path(), "text").unwrap();
        assert_eq!(
            texts(&docs),
            ["a", "b", "a", "c", r#"<field "text" is null>"#]
        );
    }

    #[test]
    fn a_datasets_cache_folder_is_read_as_ipc_streams_and_files() {
        let dir = tempfile::tempdir().unwrap();
        // What save_to_disk writes: data files and two JSON files of metadata.
        write(
            &dir.path().join("data-00000-of-00002.arrow"),
            &[batch(&[Some("a"), Some("b")]), batch(&[Some("c")])],
            true,
        );
        write(
            &dir.path().join("data-00001-of-00002.arrow"),
            &[batch(&[Some("d"), None])],
            false,
        );
        std::fs::write(dir.path().join("dataset_info.json"), b"{}").unwrap();
        std::fs::write(
            dir.path().join("state.json"),
            br#"{"_data_files": [{"filename": "data-00000-of-00002.arrow"}, {"filename": "data-00001-of-00002.arrow"}]}"#,
        )
        .unwrap();
        let files = expand(&[dir.path().to_str().unwrap().to_owned()]).unwrap();
        assert!(
            files.iter().all(|f| f.kind == InputKind::Arrow),
            "{files:?}"
        );
        let docs = read(dir.path(), "text").unwrap();
        assert_eq!(
            texts(&docs),
            ["a", "b", "c", "d", "<field \"text\" is null>"]
        );
        assert_eq!(docs[2].loc, Location::FileRow(2));
        assert_eq!(docs[2].loc.to_string(), "row 2");
        assert_eq!(
            texts(&read(dir.path(), "meta.body").unwrap())[..4],
            ["a", "b", "c", "d"]
        );
    }

    #[test]
    fn a_missing_or_non_string_column_is_named() {
        let dir = tempfile::tempdir().unwrap();
        write(&dir.path().join("x.arrow"), &[batch(&[Some("a")])], true);
        let err = read(dir.path(), "content").unwrap_err();
        assert!(
            matches!(err, InputError::MissingColumn { ref available, .. } if available == &["id", "text", "meta"]),
            "{err}"
        );
        let err = read(dir.path(), "id").unwrap_err();
        assert!(matches!(err, InputError::ColumnType { .. }), "{err}");
    }

    /// A footer whose block claims more bytes than the file has is refused
    /// naming the block, before arrow allocates what it claims.
    #[test]
    fn a_footer_block_past_the_end_is_refused_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.arrow");
        write(&path, &[batch(&[Some("a")]), batch(&[Some("b")])], false);
        assert_eq!(texts(&read(dir.path(), "text").unwrap()), ["a", "b"]);
        let mut bytes = std::fs::read(&path).unwrap();
        let n = bytes.len();
        let footer_len = i32::from_le_bytes(bytes[n - 10..n - 6].try_into().unwrap()) as usize;
        let footer_at = n - 10 - footer_len;
        let block = {
            let footer = arrow::ipc::root_as_footer(&bytes[footer_at..n - 10]).unwrap();
            let b = footer.recordBatches().unwrap().get(1);
            (b.offset(), b.metaDataLength(), b.bodyLength())
        };
        // The block as the footer stores it (a struct: offset i64,
        // metadata length i32 and 4 bytes of padding, body length i64).
        let mut stored = block.0.to_le_bytes().to_vec();
        stored.extend(block.1.to_le_bytes());
        let at = (footer_at..n - 10 - 24)
            .find(|&i| {
                bytes[i..i + 12] == stored[..] && bytes[i + 16..i + 24] == block.2.to_le_bytes()
            })
            .expect("the second block in the footer");
        bytes[at + 16..at + 24].copy_from_slice(&(1i64 << 40).to_le_bytes());
        std::fs::write(&path, &bytes).unwrap();
        let err = read(dir.path(), "text").unwrap_err();
        assert!(matches!(err, InputError::ArrowOpen { .. }), "{err}");
        let msg = err.to_string();
        assert!(msg.starts_with(&format!("{}: ", path.display())), "{msg}");
        assert!(
            msg.contains("record batch 1") && msg.contains(&(1u64 << 40).to_string()),
            "{msg}"
        );
        // A footer length past the start of the file.
        bytes[n - 10..n - 6].copy_from_slice(&(n as i32).to_le_bytes());
        std::fs::write(&path, &bytes).unwrap();
        let msg = read(dir.path(), "text").unwrap_err().to_string();
        assert!(msg.contains("its footer claims"), "{msg}");
    }

    #[test]
    fn a_file_that_is_not_arrow_is_refused_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("broken.arrow");
        std::fs::write(&path, b"this is not arrow at all").unwrap();
        let err = read(dir.path(), "text").unwrap_err();
        assert!(matches!(err, InputError::ArrowOpen { .. }), "{err}");
        assert!(
            err.to_string()
                .starts_with(&format!("{}: ", path.display())),
            "{err}"
        );
    }

    /// The arrow fuzz target's out-of-memory input was a batch of 1.6 KB
    /// claiming far more rows than its bytes hold, whose JSON as whole rows
    /// ran to gigabytes. Whole rows are now written a slice of [`JSON_ROWS`] at a
    /// time, and every row is still handed out once, in order.
    #[test]
    fn whole_rows_of_a_batch_claiming_many_rows_are_written_a_slice_at_a_time() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nulls.arrow");
        const ROWS: usize = 10 * JSON_ROWS + 7;
        let nulls: ArrayRef = Arc::new(arrow::array::NullArray::new(ROWS));
        let id: ArrayRef = Arc::new(Int64Array::from_iter_values(0..ROWS as i64));
        let big = RecordBatch::try_from_iter(vec![("gone", nulls), ("id", id)]).unwrap();
        write(&path, &[big], true);
        let mut source = ArrowSource::open(&path, &TextKey::whole_row()).unwrap();
        let mut seen = 0;
        while let Some((location, payload)) = source.next_doc().unwrap() {
            assert!(
                source.rows.len() <= JSON_ROWS,
                "{} rows as JSON",
                source.rows.len()
            );
            assert_eq!(location, Location::FileRow(seen as u64));
            let Payload::Json(row) = payload else {
                panic!("row {seen}: {payload:?}");
            };
            assert_eq!(row, format!("{{\"id\":{seen}}}").into_bytes(), "row {seen}");
            seen += 1;
        }
        assert_eq!(seen, ROWS);
    }
}
