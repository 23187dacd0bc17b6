//! Object storage: the one place prep talks to the network.
//!
//! Inputs and datasets may live at `s3://bucket/key`, `gs://bucket/key`,
//! `az://container/key` (also `azure://`) or a plain `https://` (or
//! `http://`) address of a single file. Everything else is a local path.
//! prep's readers of inputs and datasets (`prep::input`, `prep::fetch`,
//! [`crate::format::Files`]) call this module; no stage builds a client or
//! sends a request itself.
//!
//! Each cloud is configured as its own tools are, from the environment
//! (Apache `object_store`'s `from_env` builders): `AWS_ACCESS_KEY_ID`,
//! `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, `AWS_REGION`,
//! `AWS_ENDPOINT_URL` (an S3-compatible server: MinIO, R2, a local test
//! server) and `AWS_ALLOW_HTTP=true` for a plain-http endpoint;
//! `GOOGLE_APPLICATION_CREDENTIALS` / `GOOGLE_SERVICE_ACCOUNT`;
//! `AZURE_STORAGE_ACCOUNT_NAME`, `AZURE_STORAGE_ACCOUNT_KEY` and the other
//! `AZURE_*` variables.
//!
//! Reading is synchronous for the callers and bounded in memory: an object
//! is read as a sequence of ranged GETs of [`CHUNK`] bytes, [`IN_FLIGHT`] of
//! them at once ([`ObjectReader`]), so one stream reads at network speed
//! while holding at most `IN_FLIGHT + 1` chunks. Parquet reads only the byte
//! ranges its reader asks for (prep's `input::remote_parquet`, over
//! [`Object::reader`] and [`Object::get_range`]): the footer, then each row
//! group's projected column chunks.
//!
//! A request that fails is retried a few times with backoff (a dropped
//! connection, a 5xx), then reported as a [`StoreError`] naming the URL and
//! what was being done.

use std::collections::HashMap;
use std::io::Read;
use std::ops::Range;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path as KeyPath;
use object_store::{ObjectStore, ObjectStoreExt, RetryConfig};

/// Bytes asked for by one ranged GET of a stream, unless the environment
/// variable [`CHUNK_VAR`] says otherwise.
pub const CHUNK: u64 = 8 << 20;
/// The variable that sets the bytes of one ranged GET (tests use small
/// chunks to cross many chunk boundaries with a small corpus).
pub const CHUNK_VAR: &str = "PREP_STORE_CHUNK_BYTES";
/// Ranged GETs of one stream in flight at once.
pub const IN_FLIGHT: usize = 4;

/// The URL schemes prep reads through object storage.
const SCHEMES: [&str; 6] = ["s3", "gs", "az", "azure", "https", "http"];

/// Every way a request to object storage can fail. (The store's own errors
/// are boxed: they are large, and rare.)
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The address is not one prep can reach (a scheme it does not know, no
    /// bucket, a key object_store refuses), or the store's configuration
    /// from the environment is incomplete.
    #[error("{url}: cannot use this address: {why}")]
    BadUrl {
        /// The address as given.
        url: String,
        /// What is wrong, and what to do.
        why: String,
    },
    /// There is no object (or no bucket) at the address.
    #[error("{url}: no such object or bucket ({cause})")]
    NotFound {
        /// The address.
        url: String,
        /// The store's own words.
        cause: Box<object_store::Error>,
    },
    /// The bucket (or container) itself does not exist.
    #[error("{url}: no such bucket ({op} answered: the bucket does not exist)")]
    NoBucket {
        /// The address.
        url: String,
        /// What was being done.
        op: String,
    },
    /// The store refused the credentials, or they are missing.
    #[error(
        "{url}: {op} refused: bad or missing credentials (check AWS_ACCESS_KEY_ID / \
         AWS_SECRET_ACCESS_KEY, GOOGLE_APPLICATION_CREDENTIALS or AZURE_STORAGE_*): {source}"
    )]
    Denied {
        /// The address.
        url: String,
        /// What was being done, e.g. `GET bytes 0-8388607`.
        op: String,
        /// The store's own words.
        #[source]
        source: Box<object_store::Error>,
    },
    /// Any other failure: a connection refused or dropped, a server error,
    /// after the retries.
    #[error("{url}: {op} failed: {cause}")]
    Request {
        /// The address.
        url: String,
        /// What was being done.
        op: String,
        /// The store's own words.
        cause: Box<object_store::Error>,
    },
    /// A local file to upload could not be read.
    #[error("{url}: not uploaded: {}: {cause}", path.display())]
    Local {
        /// The object it was going to.
        url: String,
        /// The file.
        path: std::path::PathBuf,
        /// What failed.
        cause: std::io::Error,
    },
    /// A file to upload does not hold the bytes recorded for it (it changed
    /// on disk after it was written); the upload was aborted.
    #[error("{url}: not uploaded: {} does not hold the size and XXH3-64 recorded for it", path.display())]
    Mismatch {
        /// The object it was going to.
        url: String,
        /// The local file.
        path: std::path::PathBuf,
    },
    /// The object changed size while it was read.
    #[error("{url}: the object is {found} bytes, not the {expected} it was listed with; it changed while being read")]
    Changed {
        /// The address.
        url: String,
        /// The size it was listed with.
        expected: u64,
        /// The size found.
        found: u64,
    },
}

impl StoreError {
    /// The address the failure is about.
    pub fn url(&self) -> &str {
        match self {
            StoreError::BadUrl { url, .. }
            | StoreError::NotFound { url, .. }
            | StoreError::NoBucket { url, .. }
            | StoreError::Denied { url, .. }
            | StoreError::Request { url, .. }
            | StoreError::Local { url, .. }
            | StoreError::Mismatch { url, .. }
            | StoreError::Changed { url, .. } => url,
        }
    }

    fn from_store(url: &str, op: impl Into<String>, source: object_store::Error) -> StoreError {
        let url = url.to_owned();
        // A listing of a missing bucket comes back as a generic 404 whose
        // body names the code; S3 and Azure spell it their own way.
        let text = source.to_string();
        if ["NoSuchBucket", "ContainerNotFound"]
            .iter()
            .any(|code| text.contains(code))
        {
            return StoreError::NoBucket { url, op: op.into() };
        }
        // Listings report a refused signature as a generic 401/403 too.
        let denied = [
            "401 Unauthorized",
            "403 Forbidden",
            "InvalidAccessKeyId",
            "SignatureDoesNotMatch",
            "AuthenticationFailed",
        ]
        .iter()
        .any(|code| text.contains(code));
        if denied {
            return StoreError::Denied {
                url,
                op: op.into(),
                source: Box::new(source),
            };
        }
        let source = Box::new(source);
        match *source {
            object_store::Error::NotFound { .. } => StoreError::NotFound { url, cause: source },
            object_store::Error::Unauthenticated { .. }
            | object_store::Error::PermissionDenied { .. } => StoreError::Denied {
                url,
                op: op.into(),
                source,
            },
            _ => StoreError::Request {
                url,
                op: op.into(),
                cause: source,
            },
        }
    }
}

impl From<StoreError> for std::io::Error {
    fn from(e: StoreError) -> std::io::Error {
        let kind = match e {
            StoreError::NotFound { .. } => std::io::ErrorKind::NotFound,
            StoreError::Denied { .. } => std::io::ErrorKind::PermissionDenied,
            _ => std::io::ErrorKind::Other,
        };
        std::io::Error::new(kind, e)
    }
}

/// Whether `s` names an object in storage (`s3://`, `gs://`, `az://`,
/// `azure://`, `http(s)://`) rather than a local path.
pub fn is_url(s: &str) -> bool {
    s.split_once("://")
        .is_some_and(|(scheme, _)| SCHEMES.contains(&scheme.to_ascii_lowercase().as_str()))
}

/// One object's address: the store that holds it and its key there.
#[derive(Clone)]
pub struct Object {
    store: Arc<dyn ObjectStore>,
    key: KeyPath,
    /// The address as written, for messages.
    url: String,
}

impl std::fmt::Debug for Object {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.url)
    }
}

/// An object found by [`list`]: its address, size and version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    /// `scheme://bucket/key`.
    pub url: String,
    /// Size in bytes.
    pub bytes: u64,
    /// Which version of the object this is ([`Tag::identity`]): what an
    /// input's identity takes beside its size.
    pub version: Option<String>,
}

impl Object {
    /// The object at `url`.
    ///
    /// # Errors
    /// [`StoreError::BadUrl`] for an address that is not an object store's,
    /// or a store the environment does not configure.
    pub fn at(url: &str) -> Result<Object, StoreError> {
        let (root, key) = split(url)?;
        Ok(Object {
            store: store_for(&root, url)?,
            key: key_path(url, key)?,
            url: url.to_owned(),
        })
    }

    /// The address as given.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The object `name` beside this one's key taken as a folder
    /// (`s3://b/ds` + `manifest.json` = `s3://b/ds/manifest.json`).
    pub fn child(&self, name: &str) -> Result<Object, StoreError> {
        let url = format!("{}/{name}", self.url.trim_end_matches('/'));
        let key = format!("{}/{name}", self.key.as_ref().trim_end_matches('/'));
        Ok(Object {
            store: Arc::clone(&self.store),
            key: key_path(&url, &key)?,
            url,
        })
    }

    /// The object's size in bytes (a HEAD request).
    ///
    /// # Errors
    /// [`StoreError::NotFound`] when there is no such object, else the
    /// request's failure.
    pub fn size(&self) -> Result<u64, StoreError> {
        let meta = block_on(self.store.head(&self.key))
            .map_err(|e| StoreError::from_store(&self.url, "HEAD", e))?;
        Ok(meta.size)
    }

    /// The bytes in `range` (one ranged GET).
    ///
    /// # Errors
    /// The request's failure.
    pub fn get_range(&self, range: Range<u64>) -> Result<Bytes, StoreError> {
        let op = range_op(&range);
        block_on(self.store.get_range(&self.key, range))
            .map_err(|e| StoreError::from_store(&self.url, op, e))
    }

    /// The whole object, in memory: for small files only (a manifest).
    ///
    /// # Errors
    /// The request's failure.
    pub fn get_all(&self) -> Result<Bytes, StoreError> {
        let url = &self.url;
        block_on(async { self.store.get(&self.key).await?.bytes().await })
            .map_err(|e| StoreError::from_store(url, "GET", e))
    }

    /// A reader of the object's bytes `start..end`, by ranged GETs several
    /// at a time (see [`ObjectReader`]).
    pub fn reader(&self, start: u64, end: u64) -> ObjectReader {
        ObjectReader::new(self.clone(), start, end)
    }
}

/// The version of an object a conditional write replaces: its ETag (and
/// version id, where the store keeps versions), as a HEAD or a write
/// returned it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tag {
    e_tag: Option<String>,
    version: Option<String>,
}

impl Tag {
    /// The object's version as an input's identity records it: its
    /// version id where the store keeps versions (`version:ID`), else its
    /// ETag (`etag:E`), which every store prep reads gives and which
    /// changes whenever the object is written again. The ETag is taken
    /// without its quotes: a store may quote it in a HEAD's header and not
    /// in a listing (Azure does), and the two are one version.
    pub fn identity(&self) -> Option<String> {
        match (&self.version, &self.e_tag) {
            (Some(v), _) => Some(format!("version:{v}")),
            (None, Some(e)) => Some(format!("etag:{}", unquoted(e))),
            (None, None) => None,
        }
    }
}

/// An ETag without the quotes (and weak marker) HTTP puts around it:
/// `"abc"`, `W/"abc"` and `abc` are the same tag.
fn unquoted(e_tag: &str) -> &str {
    let e = e_tag.strip_prefix("W/").unwrap_or(e_tag);
    e.strip_prefix('"')
        .and_then(|e| e.strip_suffix('"'))
        .unwrap_or(e)
}

/// An object's HEAD: size, version and when it was last written.
#[derive(Debug, Clone)]
pub struct Head {
    /// Size in bytes.
    pub bytes: u64,
    /// What a conditional write must name to replace it.
    pub tag: Tag,
    /// Seconds since the Unix epoch, by the store's clock.
    pub modified: i64,
}

/// Objects above this size are uploaded in parts of this size
/// ([`Object::upload`]), unless [`PART_VAR`] says otherwise.
pub const PART_BYTES: usize = 16 << 20;
/// The variable that sets the bytes of one uploaded part (tests use small
/// parts to upload a small shard in several); S3 takes no part below 5 MiB
/// but the last, so smaller values are raised to that.
pub const PART_VAR: &str = "PREP_STORE_PART_BYTES";
/// Parts of one upload in flight at once.
const PARTS_IN_FLIGHT: usize = 4;

impl Object {
    /// The object's HEAD, or `None` when there is none.
    ///
    /// # Errors
    /// The request's failure (a missing bucket, refused credentials).
    pub fn head(&self) -> Result<Option<Head>, StoreError> {
        match block_on(self.store.head(&self.key)) {
            Ok(meta) => Ok(Some(Head {
                bytes: meta.size,
                tag: Tag {
                    e_tag: meta.e_tag,
                    version: meta.version,
                },
                modified: meta.last_modified.timestamp(),
            })),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(StoreError::from_store(&self.url, "HEAD", e)),
        }
    }

    /// Writes the whole object at once (one PUT: atomic, a reader sees the
    /// old object or the new one).
    ///
    /// # Errors
    /// The request's failure.
    pub fn put(&self, bytes: &[u8]) -> Result<(), StoreError> {
        let payload = object_store::PutPayload::from(Bytes::copy_from_slice(bytes));
        block_on(self.store.put(&self.key, payload))
            .map(|_| ())
            .map_err(|e| StoreError::from_store(&self.url, "PUT", e))
    }

    /// Writes the object only if there is none (`If-None-Match: *`), or,
    /// with `replacing`, only if it is still that version (`If-Match`).
    /// `Ok(None)` when the condition failed: somebody else wrote it.
    ///
    /// # Errors
    /// The request's failure, or a store that does not offer conditional
    /// writes (its error says so).
    pub fn put_if(&self, bytes: &[u8], replacing: Option<&Tag>) -> Result<Option<Tag>, StoreError> {
        let mode = match replacing {
            None => object_store::PutMode::Create,
            Some(tag) => object_store::PutMode::Update(object_store::UpdateVersion {
                e_tag: tag.e_tag.clone(),
                version: tag.version.clone(),
            }),
        };
        let payload = object_store::PutPayload::from(Bytes::copy_from_slice(bytes));
        let op = if replacing.is_some() {
            "PUT If-Match"
        } else {
            "PUT If-None-Match"
        };
        match block_on(self.store.put_opts(&self.key, payload, mode.into())) {
            Ok(done) => Ok(Some(Tag {
                e_tag: done.e_tag,
                version: done.version,
            })),
            Err(
                object_store::Error::AlreadyExists { .. }
                | object_store::Error::Precondition { .. },
            ) => Ok(None),
            Err(e) => Err(StoreError::from_store(&self.url, op, e)),
        }
    }

    /// Removes the object (no error when there is none).
    ///
    /// # Errors
    /// The request's failure.
    pub fn delete(&self) -> Result<(), StoreError> {
        match block_on(self.store.delete(&self.key)) {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(StoreError::from_store(&self.url, "DELETE", e)),
        }
    }

    /// Uploads the local file `path` as this object, and returns its size
    /// and XXH3-64, computed from the bytes as they were sent. With
    /// `expect`, the upload completes only if those are the bytes sent;
    /// otherwise it is aborted and nothing appears at the address. A file
    /// of more than [`PART_BYTES`] goes up in parts, [`PARTS_IN_FLIGHT`] at once; the
    /// object appears whole when the last part is in, never half.
    ///
    /// # Errors
    /// [`StoreError::Local`] for the local file, [`StoreError::Mismatch`] for
    /// bytes other than `expect`, else the requests' failure.
    pub fn upload(
        &self,
        path: &Path,
        expect: Option<(u64, u64)>,
    ) -> Result<(u64, u64), StoreError> {
        let local = |source| StoreError::Local {
            url: self.url.clone(),
            path: path.to_path_buf(),
            cause: source,
        };
        let mut file = std::fs::File::open(path).map_err(local)?;
        let size = file.metadata().map_err(local)?.len();
        let mut hasher = xxhash_rust::xxh3::Xxh3::new();
        let mismatch = |got: (u64, u64)| match expect {
            Some(want) if want != got => Some(StoreError::Mismatch {
                url: self.url.clone(),
                path: path.to_path_buf(),
            }),
            _ => None,
        };
        let part = part_bytes();
        if size <= part as u64 {
            let mut bytes = Vec::with_capacity(size as usize);
            file.read_to_end(&mut bytes).map_err(local)?;
            hasher.update(&bytes);
            let got = (bytes.len() as u64, hasher.digest());
            if let Some(e) = mismatch(got) {
                return Err(e);
            }
            let payload = object_store::PutPayload::from(Bytes::from(bytes));
            block_on(self.store.put(&self.key, payload))
                .map_err(|e| StoreError::from_store(&self.url, "PUT", e))?;
            return Ok(got);
        }
        block_on(async {
            let upload = self
                .store
                .put_multipart(&self.key)
                .await
                .map_err(|e| StoreError::from_store(&self.url, "CreateMultipartUpload", e))?;
            let mut writer = object_store::WriteMultipart::new_with_chunk_size(upload, part);
            let mut sent = 0u64;
            let mut buf = vec![0u8; 1 << 20];
            let failed = loop {
                if let Err(e) = writer.wait_for_capacity(PARTS_IN_FLIGHT).await {
                    break Some(StoreError::from_store(&self.url, "UploadPart", e));
                }
                let n = match file.read(&mut buf) {
                    Ok(0) => break None,
                    Ok(n) => n,
                    Err(e) => break Some(local(e)),
                };
                hasher.update(&buf[..n]);
                sent += n as u64;
                writer.write(&buf[..n]);
            };
            let got = (sent, hasher.digest());
            if let Some(e) = failed.or_else(|| mismatch(got)) {
                let _ = writer.abort().await;
                return Err(e);
            }
            writer
                .finish()
                .await
                .map_err(|e| StoreError::from_store(&self.url, "CompleteMultipartUpload", e))?;
            Ok(got)
        })
    }

    /// Every object under this one's key taken as a folder, with its name
    /// below it (`a/b` for `KEY/a/b`) and size.
    ///
    /// # Errors
    /// The listing's failure (a missing bucket, refused credentials).
    pub fn list_below(&self) -> Result<Vec<(String, u64)>, StoreError> {
        let prefix = self.key.as_ref().trim_end_matches('/').to_owned();
        let at = (!prefix.is_empty())
            .then(|| key_path(&self.url, &prefix))
            .transpose()?;
        let metas: Vec<_> = block_on(self.store.list(at.as_ref()).try_collect::<Vec<_>>())
            .map_err(|e| StoreError::from_store(&self.url, "LIST", e))?;
        let mut found: Vec<(String, u64)> = metas
            .into_iter()
            .filter_map(|meta| {
                let name = meta.location.as_ref();
                let below = if prefix.is_empty() {
                    name
                } else {
                    name.strip_prefix(&prefix)?.strip_prefix('/')?
                };
                Some((below.to_owned(), meta.size))
            })
            .collect();
        found.sort();
        Ok(found)
    }
}

/// `GET bytes a-b`, inclusive as HTTP writes ranges, for messages.
fn range_op(range: &Range<u64>) -> String {
    format!(
        "GET bytes {}-{}",
        range.start,
        range.end.saturating_sub(1).max(range.start)
    )
}

/// Expands one object-storage `--input` pattern into the objects it names,
/// sorted by address.
///
/// - With `*`, `?` or `[` in the key, the objects under the pattern's
///   literal prefix are listed and matched as a shell matches paths:
///   wildcards do not cross `/` and do not match a leading dot.
/// - Otherwise, the object itself; or, when there is none, every object
///   under `key/` whose name `keep` accepts (a "folder"), skipping names
///   that start with a dot.
///
/// An empty result is not an error here; the caller says which pattern
/// matched nothing.
///
/// # Errors
/// [`StoreError::BadUrl`] for a bad address or glob, [`StoreError::NotFound`]
/// for a missing object with nothing under it, and the listing's failure
/// (a missing bucket, bad credentials, no connection).
pub fn list(pattern: &str, keep: impl Fn(&str) -> bool) -> Result<Vec<Listed>, StoreError> {
    let (root, key) = split(pattern)?;
    let store = store_for(&root, pattern)?;
    let wild = key.find(['*', '?', '[']);
    let (prefix, matcher) = match wild {
        Some(at) => {
            let glob = glob::Pattern::new(key).map_err(|e| StoreError::BadUrl {
                url: pattern.to_owned(),
                why: format!("not a valid glob pattern: {e}"),
            })?;
            let prefix = key[..at].rsplit_once('/').map_or("", |(dir, _)| dir);
            (prefix.to_owned(), Some(glob))
        }
        None => {
            let object = Object::at(pattern)?;
            match object.head()? {
                Some(head) => {
                    return Ok(vec![Listed {
                        url: pattern.to_owned(),
                        bytes: head.bytes,
                        version: head.tag.identity(),
                    }])
                }
                None => (key.trim_end_matches('/').to_owned(), None),
            }
        }
    };
    let options = glob::MatchOptions {
        case_sensitive: true,
        require_literal_separator: true,
        require_literal_leading_dot: true,
    };
    let prefix_path = (!prefix.is_empty())
        .then(|| key_path(pattern, &prefix))
        .transpose()?;
    let metas: Vec<_> = block_on(store.list(prefix_path.as_ref()).try_collect::<Vec<_>>())
        .map_err(|e| StoreError::from_store(pattern, "LIST", e))?;
    let mut found = Vec::new();
    for meta in metas {
        let name = meta.location.as_ref();
        let wanted = match &matcher {
            Some(glob) => glob.matches_with(name, options),
            None => {
                let below = name.strip_prefix(&prefix).unwrap_or(name);
                let hidden = below.split('/').any(|part| part.starts_with('.'));
                !hidden && keep(name)
            }
        };
        if wanted {
            let tag = Tag {
                e_tag: meta.e_tag.clone(),
                version: meta.version.clone(),
            };
            found.push(Listed {
                url: format!("{root}/{name}"),
                bytes: meta.size,
                version: tag.identity(),
            });
        }
    }
    if found.is_empty() && matcher.is_none() {
        // Neither an object nor a folder: say so as a missing object does.
        let object = Object::at(pattern)?;
        return object.size().map(|_| Vec::new());
    }
    found.sort_by(|a, b| a.url.cmp(&b.url));
    Ok(found)
}

/// Splits `scheme://bucket/key` into `scheme://bucket` and `key`.
fn split(url: &str) -> Result<(String, &str), StoreError> {
    let bad = |why: &str| StoreError::BadUrl {
        url: url.to_owned(),
        why: why.to_owned(),
    };
    let (scheme, rest) = url.split_once("://").ok_or_else(|| bad("not a URL"))?;
    if !SCHEMES.contains(&scheme.to_ascii_lowercase().as_str()) {
        return Err(bad(
            "unknown scheme; prep reads s3://, gs://, az://, azure://, https:// and http://",
        ));
    }
    let (bucket, key) = rest.split_once('/').unwrap_or((rest, ""));
    if bucket.is_empty() {
        return Err(bad("no bucket (or host) after the scheme"));
    }
    Ok((format!("{scheme}://{bucket}"), key))
}

fn key_path(url: &str, key: &str) -> Result<KeyPath, StoreError> {
    KeyPath::parse(key).map_err(|e| StoreError::BadUrl {
        url: url.to_owned(),
        why: format!("not a valid object key: {e}"),
    })
}

/// The store for `root` (`scheme://bucket`), built once per process from
/// the environment and then shared.
///
/// A process forked from one that used a store (a DataLoader worker) builds
/// its own: a client's pooled connections and tasks belong to the process
/// and the runtime that made them.
fn store_for(root: &str, url: &str) -> Result<Arc<dyn ObjectStore>, StoreError> {
    type Stores = (u32, HashMap<String, Arc<dyn ObjectStore>>);
    static STORES: OnceLock<Mutex<Stores>> = OnceLock::new();
    let stores = STORES.get_or_init(Default::default);
    let mut stores = stores.lock().unwrap_or_else(|e| e.into_inner());
    let pid = std::process::id();
    if stores.0 != pid {
        // Forgotten, not dropped: their drop would touch the parent's runtime.
        std::mem::forget(std::mem::take(&mut stores.1));
        stores.0 = pid;
    }
    let stores = &mut stores.1;
    if let Some(store) = stores.get(root) {
        return Ok(Arc::clone(store));
    }
    runtime(); // installs the TLS provider the clients need
    let scheme = root
        .split_once("://")
        .map_or("", |(s, _)| s)
        .to_ascii_lowercase();
    let built: Result<Arc<dyn ObjectStore>, object_store::Error> = match scheme.as_str() {
        "s3" => object_store::aws::AmazonS3Builder::from_env()
            .with_url(root)
            .with_retry(retry())
            .build()
            .map(|s| Arc::new(s) as _),
        "gs" => object_store::gcp::GoogleCloudStorageBuilder::from_env()
            .with_url(root)
            .with_retry(retry())
            .build()
            .map(|s| Arc::new(s) as _),
        "az" | "azure" => object_store::azure::MicrosoftAzureBuilder::from_env()
            .with_url(root)
            .with_retry(retry())
            .build()
            .map(|s| Arc::new(s) as _),
        _ => {
            let options = object_store::ClientOptions::new().with_allow_http(true);
            object_store::http::HttpBuilder::new()
                .with_url(root)
                .with_client_options(options)
                .with_retry(retry())
                .build()
                .map(|s| Arc::new(s) as _)
        }
    };
    let store = built.map_err(|e| StoreError::BadUrl {
        url: url.to_owned(),
        why: e.to_string(),
    })?;
    stores.insert(root.to_owned(), Arc::clone(&store));
    Ok(store)
}

/// A few retries with backoff, about 5 s in all: a flaky connection is
/// ridden out, a dead one is reported while the user still waits for it.
fn retry() -> RetryConfig {
    RetryConfig {
        max_retries: 4,
        retry_timeout: Duration::from_secs(30),
        ..RetryConfig::default()
    }
}

/// The runtime object_store's futures run on: two worker threads of its
/// own, so that blocking on it from any of prep's threads (never one of
/// its own) is safe.
///
/// One per process: a forked child (a PyTorch DataLoader worker) inherits
/// the parent's runtime without its threads, and blocking on it would wait
/// forever, so the child builds its own (the parent's is leaked there: it
/// cannot be shut down without threads). Lock-free, so that a fork taken
/// while another thread held a lock cannot leave the child waiting on it.
fn runtime() -> &'static tokio::runtime::Runtime {
    use std::sync::atomic::{AtomicPtr, Ordering};
    static RUNTIME: AtomicPtr<(u32, tokio::runtime::Runtime)> =
        AtomicPtr::new(std::ptr::null_mut());
    let pid = std::process::id();
    let current = RUNTIME.load(Ordering::Acquire);
    // SAFETY: a non-null pointer in RUNTIME comes from `Box::leak` below and
    // is never freed, so it is valid for the rest of the process.
    if let Some((owner, rt)) = unsafe { current.as_ref() } {
        if *owner == pid {
            return rt;
        }
    }
    // reqwest is built with rustls and no bundled provider: ring is
    // installed here, once, before any client exists. Another part of
    // the process may have installed one already; that one serves.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("prep-store")
        .enable_all()
        .build()
        .expect("the object-store runtime starts");
    let fresh: *mut (u32, tokio::runtime::Runtime) = Box::leak(Box::new((pid, rt)));
    match RUNTIME.compare_exchange(current, fresh, Ordering::AcqRel, Ordering::Acquire) {
        // SAFETY: `fresh` was just leaked: valid forever.
        Ok(_) => unsafe { &(*fresh).1 },
        Err(winner) => {
            // Another thread of this process built one first; ours is
            // dropped (it never ran anything) and theirs serves.
            // SAFETY: `fresh` is ours alone (the exchange failed), from Box::leak.
            drop(unsafe { Box::from_raw(fresh) });
            // SAFETY: as above, a leaked pointer, never freed.
            unsafe { &(*winner).1 }
        }
    }
}

fn block_on<F: std::future::Future>(future: F) -> F::Output {
    runtime().block_on(future)
}

/// [`PART_BYTES`], or what [`PART_VAR`] says, at least 5 MiB.
fn part_bytes() -> usize {
    std::env::var(PART_VAR)
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .map_or(PART_BYTES, |p| p.max(5 << 20))
}

/// [`CHUNK`], or what [`CHUNK_VAR`] says when it is a positive number.
fn chunk_bytes() -> u64 {
    std::env::var(CHUNK_VAR)
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|&c| c > 0)
        .unwrap_or(CHUNK)
}

/// A [`Read`] over a range of an object, by ranged GETs of [`CHUNK`] bytes,
/// [`IN_FLIGHT`] at once, handed over in order.
///
/// Memory is bounded: at most `IN_FLIGHT` chunks are being fetched and one
/// waits in the channel while the reader consumes another. Dropping the
/// reader stops the fetches. A failed GET (after the store's retries) is the
/// read's error: an [`std::io::Error`] wrapping the [`StoreError`].
pub struct ObjectReader {
    chunks: tokio::sync::mpsc::Receiver<Result<Bytes, StoreError>>,
    current: Bytes,
    url: String,
    /// Bytes expected in all, and handed out so far.
    expected: u64,
    read: u64,
}

impl ObjectReader {
    fn new(object: Object, start: u64, end: u64) -> ObjectReader {
        let (send, chunks) = tokio::sync::mpsc::channel(1);
        let url = object.url.clone();
        let chunk = chunk_bytes();
        let ranges: Vec<Range<u64>> = (start..end)
            .step_by(usize::try_from(chunk).unwrap_or(usize::MAX))
            .map(|at| at..at.saturating_add(chunk).min(end))
            .collect();
        runtime().spawn(async move {
            let mut fetched = futures::stream::iter(ranges)
                .map(|range| {
                    let object = object.clone();
                    async move {
                        let op = range_op(&range);
                        let want = range.end - range.start;
                        let bytes = object
                            .store
                            .get_range(&object.key, range)
                            .await
                            .map_err(|e| StoreError::from_store(&object.url, op, e))?;
                        if bytes.len() as u64 != want {
                            return Err(StoreError::Changed {
                                url: object.url.clone(),
                                expected: end,
                                found: end - want + bytes.len() as u64,
                            });
                        }
                        Ok(bytes)
                    }
                })
                .buffered(IN_FLIGHT);
            while let Some(chunk) = fetched.next().await {
                let failed = chunk.is_err();
                if send.send(chunk).await.is_err() || failed {
                    break;
                }
            }
        });
        ObjectReader {
            chunks,
            current: Bytes::new(),
            url,
            expected: end.saturating_sub(start),
            read: 0,
        }
    }
}

impl ObjectReader {
    /// The next block of the range as it was fetched, without a copy, or
    /// `None` at its end: for callers that consume bytes in blocks (hashing,
    /// scanning) rather than into a buffer of their own. Blocks are at most
    /// [`CHUNK`] bytes (or what [`CHUNK_VAR`] says); their sizes carry no
    /// meaning. Errors as [`Read::read`]'s.
    pub fn next_chunk(&mut self) -> std::io::Result<Option<Bytes>> {
        if self.current.is_empty() {
            match self.chunks.blocking_recv() {
                Some(Ok(chunk)) => self.current = chunk,
                Some(Err(e)) => return Err(e.into()),
                None if self.read < self.expected => {
                    return Err(std::io::Error::other(format!(
                        "{}: the transfer stopped after {} of {} bytes",
                        self.url, self.read, self.expected
                    )))
                }
                None => return Ok(None),
            }
        }
        let chunk = std::mem::take(&mut self.current);
        self.read += chunk.len() as u64;
        Ok(Some(chunk))
    }
}

impl Read for ObjectReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.current.is_empty() {
            match self.chunks.blocking_recv() {
                Some(Ok(chunk)) => self.current = chunk,
                Some(Err(e)) => return Err(e.into()),
                None if self.read < self.expected => {
                    return Err(std::io::Error::other(format!(
                        "{}: the transfer stopped after {} of {} bytes",
                        self.url, self.read, self.expected
                    )))
                }
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.current.len());
        buf[..n].copy_from_slice(&self.current.split_to(n));
        self.read += n as u64;
        Ok(n)
    }
}

/// An object read with seeks (an Arrow IPC file's footer, then the blocks
/// it lists) by ranged GETs of up to [`CHUNK`] bytes from where it is read,
/// the last of which is kept for the reads that follow.
pub struct SeekableObject {
    object: Object,
    size: u64,
    pos: u64,
    /// The bytes fetched last, from `at`.
    held: Bytes,
    at: u64,
}

impl SeekableObject {
    /// The object, whose size is known (from its listing).
    pub fn new(object: Object, size: u64) -> SeekableObject {
        SeekableObject {
            object,
            size,
            pos: 0,
            held: Bytes::new(),
            at: 0,
        }
    }
}

impl Read for SeekableObject {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if buf.is_empty() || self.pos >= self.size {
            return Ok(0);
        }
        let held = self.at..self.at + self.held.len() as u64;
        if !held.contains(&self.pos) {
            let want = (buf.len() as u64).max(chunk_bytes());
            let end = self.size.min(self.pos.saturating_add(want));
            self.held = self.object.get_range(self.pos..end)?;
            self.at = self.pos;
            if self.held.is_empty() {
                return Err(std::io::Error::other(format!(
                    "{}: no bytes at {} of {}",
                    self.object.url, self.pos, self.size
                )));
            }
        }
        let from = (self.pos - self.at) as usize;
        let n = buf.len().min(self.held.len() - from);
        buf[..n].copy_from_slice(&self.held[from..from + n]);
        self.pos += n as u64;
        Ok(n)
    }
}

impl std::io::Seek for SeekableObject {
    fn seek(&mut self, to: std::io::SeekFrom) -> std::io::Result<u64> {
        let pos = match to {
            std::io::SeekFrom::Start(at) => Some(at),
            std::io::SeekFrom::End(delta) => self.size.checked_add_signed(delta),
            std::io::SeekFrom::Current(delta) => self.pos.checked_add_signed(delta),
        };
        self.pos = pos.ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("{}: a seek before the start", self.object.url),
            )
        })?;
        Ok(self.pos)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_etag_is_one_version_quoted_or_not() {
        assert_eq!(unquoted("\"0x22878FDF6387E60\""), "0x22878FDF6387E60");
        assert_eq!(unquoted("0x22878FDF6387E60"), "0x22878FDF6387E60");
        assert_eq!(unquoted("W/\"abc\""), "abc");
        assert_eq!(unquoted("\""), "\"");
    }

    #[test]
    fn urls_and_paths_are_told_apart() {
        for url in [
            "s3://b/k",
            "gs://b/k",
            "az://c/k",
            "S3://b",
            "https://h/f.jsonl",
        ] {
            assert!(is_url(url), "{url}");
        }
        for path in [
            "data/a.jsonl",
            "/abs/s3://x",
            "file.jsonl",
            "ftp://h/f",
            "s3:/b/k",
        ] {
            assert!(!is_url(path), "{path}");
        }
    }

    #[test]
    fn a_url_splits_into_bucket_and_key() {
        assert_eq!(
            split("s3://bucket/in/a.jsonl").unwrap(),
            ("s3://bucket".to_owned(), "in/a.jsonl")
        );
        assert_eq!(
            split("gs://bucket").unwrap(),
            ("gs://bucket".to_owned(), "")
        );
        assert!(matches!(split("s3:///key"), Err(StoreError::BadUrl { .. })));
        assert!(matches!(split("ftp://h/k"), Err(StoreError::BadUrl { .. })));
    }

    #[test]
    fn a_closed_port_is_a_request_error_naming_the_url() {
        // Port 9 (discard) on loopback: nothing listens in a test sandbox.
        let url = "http://127.0.0.1:9/none.jsonl";
        let err = Object::at(url).unwrap().size().unwrap_err();
        let message = err.to_string();
        assert!(message.starts_with(url), "{message}");
        assert!(matches!(err, StoreError::Request { .. }), "{err:?}");
    }
}
