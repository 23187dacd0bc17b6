//! Parquet read from object storage in place.

use bytes::Bytes;

use crate::store::Object;

/// An object read by Parquet's synchronous reader through ranged GETs:
/// the footer, then only the column chunks it decodes; never the whole
/// file unless every column is wanted.
pub struct RemoteFile {
    object: Object,
    size: u64,
}

impl RemoteFile {
    /// The object, whose size is known (from its listing).
    pub fn new(object: Object, size: u64) -> RemoteFile {
        RemoteFile { object, size }
    }
}

impl parquet::file::reader::Length for RemoteFile {
    fn len(&self) -> u64 {
        self.size
    }
}

impl parquet::file::reader::ChunkReader for RemoteFile {
    type T = crate::store::ObjectReader;

    fn get_read(&self, start: u64) -> parquet::errors::Result<crate::store::ObjectReader> {
        Ok(self.object.reader(start, self.size))
    }

    fn get_bytes(&self, start: u64, length: usize) -> parquet::errors::Result<Bytes> {
        let end = start.saturating_add(length as u64);
        self.object
            .get_range(start..end)
            .map_err(|e| parquet::errors::ParquetError::External(Box::new(e)))
    }
}
