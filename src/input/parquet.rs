//! Parquet input.
//!
//! Only the text column is read (a projection down to its leaf), about a
//! thousand rows at a time, so memory holds one decoded column chunk and one
//! small record batch however large the file.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use ::parquet::arrow::arrow_reader::{ParquetRecordBatchReader, ParquetRecordBatchReaderBuilder};
use ::parquet::arrow::ProjectionMask;
use ::parquet::errors::ParquetError;
use ::parquet::file::metadata::RowGroupMetaData;
use ::parquet::file::reader::ChunkReader;
use arrow::array::{Array, ArrayRef, AsArray};
use arrow::datatypes::{DataType, Fields};
use arrow::error::ArrowError;
use arrow::record_batch::RecordBatch;

use super::{DocError, InputError, Location, Payload, TextKey};

/// Rows decoded at a time: small enough to bound memory, large enough that
/// per-batch overhead does not show.
const BATCH_ROWS: usize = 1024;

/// An open Parquet file, handing out the text of each row in order.
pub(crate) struct ParquetSource {
    path: PathBuf,
    /// The dotted key, for [`DocError::Null`].
    key: String,
    reader: ParquetRecordBatchReader,
    /// Field names from the top-level column down to the text leaf.
    names: Vec<String>,
    /// Rows in each row group, in file order.
    group_rows: Vec<u64>,
    /// Compressed bytes of each row group, in file order.
    group_bytes: Vec<u64>,
    /// The file's index of the first row group read (a part may read a
    /// range of them).
    first_group: usize,
    /// The row group holding `row`, and the index of its first row.
    group: usize,
    group_start: u64,
    /// Index in the file of the next row to hand out.
    row: u64,
    /// The decoded batch being handed out.
    batch: Option<Decoded>,
    progress: Arc<AtomicU64>,
}

/// One record batch, reduced to the arrays on the path to the text.
struct Decoded {
    /// The top-level column, the struct fields below it, the text leaf last.
    /// A row is null if any of them is null there.
    chain: Vec<ArrayRef>,
    /// Whole rows as JSON objects, when whole rows are read.
    rows: Vec<Vec<u8>>,
    len: usize,
    pos: usize,
}

/// Checks that each column chunk of `leaves` in row groups `groups` (the
/// first being the file's `first`) lies within the file's `size` bytes, as
/// its footer places it: the reader would otherwise panic on a negative
/// place, or allocate what a chunk claims before reading it.
fn check_chunks(
    groups: &[RowGroupMetaData],
    first: usize,
    leaves: &[usize],
    size: u64,
) -> Result<(), String> {
    for (i, group) in groups.iter().enumerate() {
        for &leaf in leaves {
            let Some(column) = group.columns().get(leaf) else {
                return Err(format!(
                    "row group {} has {} columns, and the schema {} or more",
                    first + i,
                    group.num_columns(),
                    leaf + 1
                ));
            };
            // Where the reader starts the chunk (its `byte_range`).
            let start = column
                .dictionary_page_offset()
                .unwrap_or(column.data_page_offset());
            let length = column.compressed_size();
            let within = u64::try_from(start)
                .ok()
                .zip(u64::try_from(length).ok())
                .and_then(|(start, length)| start.checked_add(length))
                .is_some_and(|end| end <= size);
            if !within {
                return Err(format!(
                    "its footer puts column {} of row group {} at byte {start} with {length} bytes, \
                     outside the file's {size} bytes",
                    column.column_path(),
                    first + i
                ));
            }
        }
    }
    Ok(())
}

impl ParquetSource {
    /// Opens `path` and checks that `key` names a string column; the size of
    /// each row group is added to `progress` once its last row is handed out.
    /// With `groups`, only those row groups are read.
    pub(crate) fn open(
        path: &Path,
        key: &TextKey,
        groups: Option<std::ops::Range<usize>>,
        progress: Arc<AtomicU64>,
    ) -> Result<ParquetSource, InputError> {
        let parquet_error = |source| InputError::ParquetOpen {
            path: path.to_owned(),
            cause: source,
        };
        // An object in storage is read by ranged GETs of what the reader
        // asks for: the footer, then the projected column chunks.
        // The parquet reader panics on some damaged footers: those are
        // damaged files too.
        let damaged = |why: String| {
            parquet_error(ParquetError::General(format!("the file is damaged: {why}")))
        };
        match super::remote(path)? {
            Some((object, size)) => {
                let remote = crate::input::remote_parquet::RemoteFile::new(object, size);
                let builder =
                    crate::util::catch_panic(|| ParquetRecordBatchReaderBuilder::try_new(remote))
                        .map_err(damaged)?
                        .map_err(parquet_error)?;
                Self::from_builder(builder, path, size, key, groups, progress)
            }
            None => {
                let open_error = |source| InputError::Open {
                    path: path.to_owned(),
                    cause: source,
                };
                let file = File::open(path).map_err(open_error)?;
                let size = file.metadata().map_err(open_error)?.len();
                let builder =
                    crate::util::catch_panic(|| ParquetRecordBatchReaderBuilder::try_new(file))
                        .map_err(damaged)?
                        .map_err(parquet_error)?;
                Self::from_builder(builder, path, size, key, groups, progress)
            }
        }
    }

    /// [`ParquetSource::open`] once the footer is read, whatever reads the bytes.
    fn from_builder<T: ChunkReader + 'static>(
        builder: ParquetRecordBatchReaderBuilder<T>,
        path: &Path,
        size: u64,
        key: &TextKey,
        groups: Option<std::ops::Range<usize>>,
        progress: Arc<AtomicU64>,
    ) -> Result<ParquetSource, InputError> {
        let parquet_error = |source| InputError::ParquetOpen {
            path: path.to_owned(),
            cause: source,
        };
        let schema = builder.parquet_schema();
        let (names, leaves): (Vec<String>, Vec<usize>) = if key.is_whole_row() {
            (Vec::new(), (0..schema.num_columns()).collect())
        } else {
            let names = resolve(builder.schema().fields(), key, path)?;
            // Parquet leaf paths are the Arrow field names from the top, so
            // the leaves under `names` are exactly the text column.
            let leaves = schema
                .columns()
                .iter()
                .enumerate()
                .filter(|(_, column)| column.path().parts().starts_with(&names))
                .map(|(index, _)| index)
                .collect();
            (names, leaves)
        };
        let mask = ProjectionMask::leaves(schema, leaves.iter().copied());

        let all = builder.metadata().row_groups();
        let groups = groups.unwrap_or(0..all.len());
        let groups = groups.start.min(all.len())..groups.end.min(all.len());
        let first_group = groups.start;
        let selected = &all[groups.clone()];
        check_chunks(selected, first_group, &leaves, size).map_err(|why| {
            parquet_error(ParquetError::General(format!("the file is damaged: {why}")))
        })?;
        let group_rows = selected
            .iter()
            .map(|g| u64::try_from(g.num_rows()).unwrap_or(0))
            .collect();
        let group_bytes = selected
            .iter()
            .map(|g| u64::try_from(g.compressed_size()).unwrap_or(0))
            .collect();
        let reader = builder
            .with_row_groups(groups.collect())
            .with_projection(mask)
            .with_batch_size(BATCH_ROWS)
            .build()
            .map_err(parquet_error)?;
        Ok(ParquetSource {
            path: path.to_owned(),
            key: key.as_str().to_owned(),
            reader,
            names,
            group_rows,
            group_bytes,
            first_group,
            group: 0,
            group_start: 0,
            row: 0,
            batch: None,
            progress,
        })
    }

    /// The next row's text (or [`DocError::Null`]), or `None` at the end of the file.
    pub(crate) fn next_doc(&mut self) -> Result<Option<(Location, Payload)>, InputError> {
        loop {
            if let Some(batch) = self.batch.as_mut().filter(|b| b.pos < b.len) {
                let pos = batch.pos;
                batch.pos += 1;
                let payload = match batch.rows.get_mut(pos) {
                    Some(row) => Payload::Json(std::mem::take(row)),
                    None => row_payload(&batch.chain, pos, &self.key),
                };
                let (row_group, row) = self.locate();
                self.row += 1;
                return Ok(Some((Location::Row { row_group, row }, payload)));
            }
            let next = crate::util::catch_panic(|| self.reader.next()).unwrap_or_else(|why| {
                Some(Err(ArrowError::ParquetError(format!(
                    "the file is damaged: {why}"
                ))))
            });
            let batch = match next {
                None => return Ok(None),
                Some(Ok(batch)) => batch,
                Some(Err(source)) => {
                    let (row_group, _) = self.locate();
                    return Err(InputError::ParquetRead {
                        path: self.path.clone(),
                        row_group,
                        cause: source,
                    });
                }
            };
            self.batch = Some(self.decode(&batch)?);
        }
    }

    /// The row group of row `self.row` and its index within it, moving on to
    /// that row group (and counting the ones finished as consumed) if need be.
    fn locate(&mut self) -> (usize, u64) {
        while let Some(&rows) = self.group_rows.get(self.group) {
            if self.row < self.group_start + rows {
                break;
            }
            let bytes = self.group_bytes.get(self.group).copied().unwrap_or(0);
            self.progress.fetch_add(bytes, Ordering::Relaxed);
            self.group_start += rows;
            self.group += 1;
        }
        (self.first_group + self.group, self.row - self.group_start)
    }

    /// Finds the arrays on the path to the text in a projected batch (or,
    /// reading whole rows, writes each row as JSON).
    fn decode(&self, batch: &RecordBatch) -> Result<Decoded, InputError> {
        if self.names.is_empty() {
            let rows = json_rows(batch).map_err(|cause| InputError::ParquetRead {
                path: self.path.clone(),
                row_group: self.first_group + self.group,
                cause,
            })?;
            return Ok(Decoded {
                chain: Vec::new(),
                rows,
                len: batch.num_rows(),
                pos: 0,
            });
        }
        let missing = || InputError::MissingColumn {
            path: self.path.clone(),
            column: self.key.clone(),
            available: batch
                .schema()
                .fields()
                .iter()
                .map(|f| f.name().clone())
                .collect(),
        };
        let mut chain: Vec<ArrayRef> = Vec::with_capacity(self.names.len());
        for name in &self.names {
            let next = match chain.last() {
                None => batch.column_by_name(name),
                Some(parent) => parent.as_struct_opt().and_then(|s| s.column_by_name(name)),
            };
            chain.push(Arc::clone(next.ok_or_else(missing)?));
        }
        if let Some(leaf) = chain.last_mut() {
            *leaf = plain_strings(leaf).map_err(|cause| InputError::ParquetRead {
                path: self.path.clone(),
                row_group: self.first_group + self.group,
                cause,
            })?;
        }
        Ok(Decoded {
            chain,
            rows: Vec::new(),
            len: batch.num_rows(),
            pos: 0,
        })
    }
}

/// Every row of `batch` as a JSON object of its columns, in schema order
/// (nulls left out), as arrow's JSON writer writes it: the whole-row
/// documents of Parquet and Arrow IPC inputs.
pub(super) fn json_rows(batch: &RecordBatch) -> Result<Vec<Vec<u8>>, arrow::error::ArrowError> {
    let mut out = Vec::new();
    {
        let mut writer = arrow::json::LineDelimitedWriter::new(&mut out);
        writer.write(batch)?;
        writer.finish()?;
    }
    Ok(out
        .split(|&b| b == b'\n')
        .filter(|line| !line.is_empty())
        .map(<[u8]>::to_vec)
        .collect())
}

/// Row `pos` of a record batch as a document: `chain` holds the arrays on
/// the path to the text (struct columns, then the string leaf); a null
/// anywhere on it is a bad document naming `key`. Parquet and Arrow IPC
/// inputs share this rule.
pub(super) fn row_payload(chain: &[ArrayRef], pos: usize, key: &str) -> Payload {
    if chain.iter().any(|array| array.is_null(pos)) {
        return Payload::Bad(DocError::Null {
            key: key.to_owned(),
        });
    }
    // `resolve` admitted only string types, so this is always Some.
    let text = chain
        .last()
        .and_then(|leaf| string_at(leaf, pos))
        .unwrap_or_default();
    Payload::Text(text.to_owned())
}

/// Whether `data_type` is one of Arrow's string layouts.
fn is_string(data_type: &DataType) -> bool {
    matches!(
        data_type,
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View
    )
}

/// Whether the text column may have `data_type`: a string layout, or a
/// dictionary of one (pandas' category columns, and any column a writer
/// chose to dictionary-encode in its Arrow schema), keys of any width.
fn is_text_type(data_type: &DataType) -> bool {
    match data_type {
        DataType::Dictionary(_, values) => is_string(values),
        other => is_string(other),
    }
}

/// The text leaf of a batch as a plain string array: a dictionary column
/// is decoded to its values' layout (a batch at a time, as the texts are
/// copied out anyway), so that it reads row for row, nulls included, as
/// the plain column of the same texts. Parquet and Arrow IPC inputs share
/// this rule.
pub(super) fn plain_strings(leaf: &ArrayRef) -> Result<ArrayRef, ArrowError> {
    match leaf.data_type() {
        DataType::Dictionary(_, values) => arrow::compute::cast(leaf, values),
        _ => Ok(Arc::clone(leaf)),
    }
}

/// The text of a string array at `index`, for any of Arrow's string layouts.
pub(super) fn string_at(array: &ArrayRef, index: usize) -> Option<&str> {
    match array.data_type() {
        DataType::Utf8 => array.as_string_opt::<i32>().map(|a| a.value(index)),
        DataType::LargeUtf8 => array.as_string_opt::<i64>().map(|a| a.value(index)),
        DataType::Utf8View => array.as_string_view_opt().map(|a| a.value(index)),
        _ => None,
    }
}

/// Resolves `key` against the file's Arrow schema into the field names from
/// the top-level column down to the text, checking every type on the way.
///
/// At each level the whole remaining dotted name is tried as one field name
/// first, so a column literally named `meta.text` wins over a struct `meta`.
pub(super) fn resolve(top: &Fields, key: &TextKey, path: &Path) -> Result<Vec<String>, InputError> {
    let dotted = key.as_str();
    let parts = key.parts();
    let mut fields = top;
    let mut names = Vec::new();
    // Where the not-yet-followed part of the dotted key starts.
    let mut rest_start = 0;
    for (depth, head) in parts.iter().enumerate() {
        let rest = &dotted[rest_start..];
        if let Some(field) = fields.iter().find(|f| f.name() == rest) {
            names.push(rest.to_owned());
            return match field.data_type() {
                t if is_text_type(t) => Ok(names),
                other => Err(InputError::ColumnType {
                    path: path.to_owned(),
                    column: dotted.to_owned(),
                    found: other.to_string(),
                }),
            };
        }
        let is_last = depth + 1 == parts.len();
        let field = if is_last {
            None
        } else {
            fields.iter().find(|f| f.name() == head)
        };
        let Some(field) = field else {
            let prefix = &dotted[..rest_start];
            return Err(InputError::MissingColumn {
                path: path.to_owned(),
                column: dotted.to_owned(),
                available: fields
                    .iter()
                    .map(|f| format!("{prefix}{}", f.name()))
                    .collect(),
            });
        };
        names.push(head.clone());
        let field_end = rest_start + head.len();
        match field.data_type() {
            DataType::Struct(children) => fields = children,
            other => {
                return Err(InputError::NotAStruct {
                    path: path.to_owned(),
                    column: dotted[..field_end].to_owned(),
                    key: dotted.to_owned(),
                    found: other.to_string(),
                })
            }
        }
        rest_start = field_end + 1;
    }
    // The last part is always tried as the whole remaining name, so the loop
    // returns; this only satisfies the compiler.
    Err(InputError::MissingColumn {
        path: path.to_owned(),
        column: dotted.to_owned(),
        available: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use arrow::array::{Int64Array, LargeStringArray, StringArray, StringViewArray, StructArray};
    use arrow::buffer::NullBuffer;
    use arrow::datatypes::Field;
    use parquet::arrow::ArrowWriter;
    use parquet::file::properties::WriterProperties;

    use super::*;
    use crate::input::{InputFile, InputKind, RawDoc, Reader};

    /// Writes `columns` as one Parquet file with row groups of at most `group_rows`.
    fn write(
        dir: &Path,
        name: &str,
        columns: Vec<(&str, ArrayRef)>,
        group_rows: usize,
    ) -> InputFile {
        let path = dir.join(name);
        let batch = RecordBatch::try_from_iter(columns).unwrap();
        let props = WriterProperties::builder()
            .set_max_row_group_row_count(Some(group_rows))
            .build();
        let mut writer =
            ArrowWriter::try_new(File::create(&path).unwrap(), batch.schema(), Some(props))
                .unwrap();
        writer.write(&batch).unwrap();
        writer.close().unwrap();
        let bytes = std::fs::metadata(&path).unwrap().len();
        InputFile {
            path,
            kind: InputKind::Parquet,
            bytes,
            version: None,
        }
    }

    fn read(file: InputFile, key: &str) -> Result<Vec<RawDoc>, InputError> {
        let mut reader = Reader::new(vec![file], TextKey::parse(key));
        let mut docs = Vec::new();
        while let Some(batch) = reader.next_batch(1 << 20, 1000)? {
            docs.extend(batch);
        }
        Ok(docs)
    }

    /// Each document as its text, or `None` for a null.
    fn texts(docs: &[RawDoc]) -> Vec<Option<String>> {
        docs.iter()
            .map(|d| match &d.payload {
                Payload::Text(text) => Some(text.clone()),
                Payload::Bad(DocError::Null { .. }) => None,
                other => panic!("unexpected {other:?}"),
            })
            .collect()
    }

    fn ids(n: i64) -> ArrayRef {
        Arc::new(Int64Array::from_iter_values(0..n))
    }

    #[test]
    fn utf8_large_utf8_and_utf8_view_columns() {
        let dir = tempfile::tempdir().unwrap();
        let values = ["a", "", "ünïcødé 😀"];
        let arrays: [(&str, ArrayRef); 3] = [
            (
                "utf8.parquet",
                Arc::new(StringArray::from_iter_values(values)),
            ),
            (
                "large.parquet",
                Arc::new(LargeStringArray::from_iter_values(values)),
            ),
            (
                "view.pq",
                Arc::new(StringViewArray::from_iter_values(values)),
            ),
        ];
        for (name, array) in arrays {
            let file = write(
                dir.path(),
                name,
                vec![("id", ids(3)), ("text", array)],
                1000,
            );
            let docs = read(file, "text").unwrap();
            let expected: Vec<_> = values.iter().map(|v| Some(v.to_string())).collect();
            assert_eq!(texts(&docs), expected, "{name}");
            assert_eq!(
                docs[2].loc,
                Location::Row {
                    row_group: 0,
                    row: 2
                }
            );
        }
    }

    #[test]
    fn a_null_is_a_bad_document_at_its_row() {
        let dir = tempfile::tempdir().unwrap();
        let text: ArrayRef = Arc::new(StringArray::from(vec![Some("a"), None, Some("c")]));
        let docs = read(
            write(dir.path(), "n.parquet", vec![("text", text)], 1000),
            "text",
        )
        .unwrap();
        assert_eq!(texts(&docs), [Some("a".into()), None, Some("c".into())]);
        assert_eq!(
            docs[1].loc,
            Location::Row {
                row_group: 0,
                row: 1
            }
        );
        let Payload::Bad(err) = &docs[1].payload else {
            panic!()
        };
        assert_eq!(err.to_string(), r#"field "text" is null"#);
    }

    #[test]
    fn nested_struct_column_with_nulls_at_both_levels() {
        let dir = tempfile::tempdir().unwrap();
        let inner: ArrayRef = Arc::new(StringArray::from(vec![
            Some("x"),
            None,
            Some("hidden"),
            Some("z"),
        ]));
        let other: ArrayRef = Arc::new(Int64Array::from(vec![1, 2, 3, 4]));
        let fields = vec![
            Arc::new(Field::new("text", DataType::Utf8, true)),
            Arc::new(Field::new("n", DataType::Int64, false)),
        ];
        let nulls = NullBuffer::from(vec![true, true, false, true]);
        let meta = StructArray::try_new(fields.into(), vec![inner, other], Some(nulls)).unwrap();
        let file = write(
            dir.path(),
            "s.parquet",
            vec![("id", ids(4)), ("meta", Arc::new(meta))],
            1000,
        );
        let docs = read(file.clone(), "meta.text").unwrap();
        assert_eq!(
            texts(&docs),
            [Some("x".into()), None, None, Some("z".into())]
        );

        let err = read(file.clone(), "meta.nope").unwrap_err();
        assert!(
            matches!(err, InputError::MissingColumn { ref available, .. } if available == &["meta.text", "meta.n"])
        );
        let err = read(file.clone(), "meta.n").unwrap_err();
        assert!(
            matches!(err, InputError::ColumnType { ref found, .. } if found == "Int64"),
            "{err:?}"
        );
        let err = read(file.clone(), "meta").unwrap_err();
        assert!(matches!(err, InputError::ColumnType { .. }), "{err:?}");
        let err = read(file, "id.text").unwrap_err();
        assert!(
            err.to_string().contains(
                r#"column "id" has type Int64, not a struct, so "id.text" cannot be reached"#
            ),
            "{err}"
        );
    }

    #[test]
    fn a_column_named_with_a_dot_is_found_by_its_exact_name() {
        let dir = tempfile::tempdir().unwrap();
        let text: ArrayRef = Arc::new(StringArray::from_iter_values(["flat"]));
        let docs = read(
            write(dir.path(), "d.parquet", vec![("meta.text", text)], 10),
            "meta.text",
        )
        .unwrap();
        assert_eq!(texts(&docs), [Some("flat".into())]);
    }

    #[test]
    fn int_column_is_a_type_error() {
        let dir = tempfile::tempdir().unwrap();
        let file = write(dir.path(), "i.parquet", vec![("text", ids(3))], 1000);
        let err = read(file, "text").unwrap_err();
        let message = err.to_string();
        assert!(
            message.contains("i.parquet") && message.contains(r#"column "text" has type Int64"#),
            "{message}"
        );
        assert!(message.contains("expected a string column"), "{message}");
    }

    #[test]
    fn missing_column_lists_the_columns() {
        let dir = tempfile::tempdir().unwrap();
        let body: ArrayRef = Arc::new(StringArray::from_iter_values(["a"]));
        let file = write(
            dir.path(),
            "m.parquet",
            vec![("id", ids(1)), ("body", body)],
            1000,
        );
        let err = read(file, "text").unwrap_err();
        assert!(
            err.to_string()
                .ends_with(r#"m.parquet: no column "text"; available columns: id, body"#),
            "{err}"
        );
    }

    #[test]
    fn locations_across_row_groups_and_progress() {
        let dir = tempfile::tempdir().unwrap();
        let text: ArrayRef = Arc::new(StringArray::from_iter_values(
            (0..10).map(|i| format!("doc {i}")),
        ));
        let file = write(dir.path(), "g.parquet", vec![("text", text)], 3);
        let bytes = file.bytes;
        let mut reader = Reader::new(vec![file], TextKey::parse("text"));
        let progress = reader.progress();
        let mut docs = Vec::new();
        let mut last = 0;
        while let Some(batch) = reader.next_batch(usize::MAX, 2).unwrap() {
            let now = progress.load(Ordering::Relaxed);
            assert!(now >= last && now <= bytes);
            last = now;
            docs.extend(batch);
        }
        assert_eq!(progress.load(Ordering::Relaxed), bytes);
        let locs: Vec<_> = docs
            .iter()
            .map(|d| match d.loc {
                Location::Row { row_group, row } => (row_group, row),
                _ => panic!("a parquet row has a row location"),
            })
            .collect();
        assert_eq!(
            locs,
            [
                (0, 0),
                (0, 1),
                (0, 2),
                (1, 0),
                (1, 1),
                (1, 2),
                (2, 0),
                (2, 1),
                (2, 2),
                (3, 0)
            ]
        );
        assert_eq!(texts(&docs)[9], Some("doc 9".into()));
    }

    #[test]
    fn many_rows_span_record_batches() {
        let dir = tempfile::tempdir().unwrap();
        let n = 3 * BATCH_ROWS + 7;
        let text: ArrayRef = Arc::new(StringArray::from_iter_values((0..n).map(|i| i.to_string())));
        let docs = read(
            write(dir.path(), "b.parquet", vec![("text", text)], 2000),
            "text",
        )
        .unwrap();
        assert_eq!(docs.len(), n);
        assert_eq!(
            docs[2500].loc,
            Location::Row {
                row_group: 1,
                row: 500
            }
        );
        assert_eq!(texts(&docs)[2500], Some("2500".into()));
    }

    #[test]
    fn garbage_named_parquet_is_an_error_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        for (name, content) in [
            (
                "bad.parquet",
                &b"this is not parquet at all, not even close"[..],
            ),
            ("empty.parquet", b""),
        ] {
            let path = dir.path().join(name);
            std::fs::write(&path, content).unwrap();
            let file = InputFile {
                path,
                kind: InputKind::Parquet,
                bytes: content.len() as u64,
                version: None,
            };
            let err = read(file, "text").unwrap_err();
            assert!(matches!(err, InputError::ParquetOpen { .. }), "{err:?}");
            assert!(err.to_string().contains(name), "{err}");
        }
    }

    #[test]
    fn a_corrupt_data_page_is_an_error_not_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        let text: ArrayRef = Arc::new(StringArray::from_iter_values(
            (0..2000).map(|i| format!("document {i}")),
        ));
        let file = write(dir.path(), "c.parquet", vec![("text", text)], 500);
        let mut bytes = std::fs::read(&file.path).unwrap();
        // Damage the data, well before the footer.
        let half = bytes.len() / 2;
        bytes[4..half].fill(0x5a);
        std::fs::write(&file.path, &bytes).unwrap();
        assert!(read(file, "text").is_err());
    }

    /// A damaged file found by the parquet fuzz target: its footer places
    /// the text column's chunk at byte -19, on which the parquet reader
    /// panics. prep names the file, the column and the row group, for text
    /// and for whole rows (chat mode), and no panic escapes.
    #[test]
    fn a_column_chunk_outside_the_file_is_refused_naming_it() {
        let fixture = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("fixtures/parquet/damaged-chunk-offset.parquet");
        let bytes = std::fs::metadata(&fixture).unwrap().len();
        for key in ["text", ""] {
            let file = InputFile {
                path: fixture.clone(),
                kind: InputKind::Parquet,
                bytes,
                version: None,
            };
            let mut reader = Reader::new(
                vec![file],
                if key.is_empty() {
                    TextKey::whole_row()
                } else {
                    TextKey::parse(key)
                },
            );
            let err = crate::util::catch_panic(|| reader.next_batch(1 << 20, 1000))
                .expect("no panic")
                .expect_err("a damaged file")
                .to_string();
            assert!(
                err.contains("damaged-chunk-offset.parquet")
                    && err.contains(&format!(
                        "its footer puts column \"text\" of row group 0 at byte -19 with 206 bytes, outside the file's {bytes} bytes"
                    )),
                "{err}"
            );
        }
    }
}
