//! The rules every stage that writes a dataset follows around its own work,
//! each written once: which output it may write given its inputs, how a run
//! is fingerprinted (the identity that decides whether an output on disk is
//! this run's, and whether partial datasets are parts of one job), and the
//! thread pool it works on.
//!
//! A stage plans its work, calls these, and hands its shards to
//! [`crate::output::Output`], which owns the directory's lifecycle.

use std::path::{Path, PathBuf};

use serde_json::json;

use crate::format::{
    checksum_hex, DocumentCounts, InputInfo, Manifest, Partition, Provenance, ShardInfo,
};
use crate::partition::Part;

/// How a stage writes its dataset, the same in every stage that writes
/// shards (tokenize, shuffle and its gather, pack, mix, split, import):
/// the library side of the CLI's `--shard-size` and `--overwrite`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Writing {
    /// Largest `.bin` of an output shard, in bytes (a single larger record
    /// gets a shard of its own).
    pub shard_size: u64,
    /// Replace what prep finds in the output directory (only prep's own
    /// files are ever removed).
    pub overwrite: bool,
    /// The user guarantees that this run is its output's only writer, so
    /// that prep may write to an object store whose conditional writes it
    /// cannot verify (its lock would lock nothing there); the manifest of
    /// such an output records it (`provenance.single_writer`).
    pub single_writer: bool,
}

/// The shard size unless told otherwise: 1 GiB.
pub const DEFAULT_SHARD_SIZE: u64 = 1 << 30;

impl Default for Writing {
    fn default() -> Writing {
        Writing {
            shard_size: DEFAULT_SHARD_SIZE,
            overwrite: false,
            single_writer: false,
        }
    }
}

/// Two inputs of one job that cannot be read as one (the datasets a
/// shuffle or a mix takes together, the parts a merge joins).
#[derive(Debug, thiserror::Error)]
#[error("cannot {verb} {} with {}: {what} differ ({a} and {b})", first.display(), other.display())]
pub struct Incompatible {
    /// What the job does with them: "shuffle", "mix", "merge".
    pub verb: &'static str,
    /// The first input.
    pub first: PathBuf,
    /// The input that differs from it.
    pub other: PathBuf,
    /// What differs.
    pub what: &'static str,
    /// The first input's value.
    pub a: String,
    /// The other's.
    pub b: String,
}

/// An input a stage reads as documents that holds something else: a
/// packed dataset's rows are not documents, and a shuffle or a mix of them
/// would write a dataset of their kind without the segment index it needs.
#[derive(Debug, thiserror::Error)]
#[error("{} is a {kind} dataset; {verb} takes documents datasets ({hint})", input.display())]
pub struct NotDocuments {
    /// The stage: "shuffle", "mix", "split", "pack".
    pub verb: &'static str,
    /// The input.
    pub input: PathBuf,
    /// Its kind.
    pub kind: String,
    /// Where in the pipeline the stage belongs.
    pub hint: &'static str,
}

/// Refuses an input that is not a documents dataset, for a stage that
/// reads documents: every stage between tokenize and pack.
pub fn documents_only(
    verb: &'static str,
    input: &Path,
    manifest: &Manifest,
    hint: &'static str,
) -> Result<(), Box<NotDocuments>> {
    if manifest.kind == "documents" {
        return Ok(());
    }
    Err(Box::new(NotDocuments {
        verb,
        input: input.into(),
        kind: manifest.kind.clone(),
        hint,
    }))
}

/// Documents datasets taken together (by `prep shuffle` or `prep mix`)
/// must each be documents ([`documents_only`]) and read the same way
/// ([`Manifest::reading_difference`]).
pub fn same_documents(
    verb: &'static str,
    first: &Path,
    a: &Manifest,
    other: &Path,
    b: &Manifest,
) -> Result<(), Box<Incompatible>> {
    match a.reading_difference(b) {
        None => Ok(()),
        Some((what, x, y)) => Err(Box::new(Incompatible {
            verb,
            first: first.into(),
            other: other.into(),
            what,
            a: x,
            b: y,
        })),
    }
}

/// An output directory that overlaps an input: writing it could destroy or
/// reread what the run reads.
#[derive(Debug, thiserror::Error)]
#[error("output directory {}: {} {what} {}{}; choose another directory", output.display(), if *holds { "holds" } else { "is" }, input.display(), if *holds { "" } else { " or lies inside it" })]
pub struct Overlap {
    /// The output directory.
    pub output: PathBuf,
    /// The input it overlaps.
    pub input: PathBuf,
    /// What the input is to the stage ("the input", "the part", ...).
    pub what: &'static str,
    /// True when the output holds the input; false when the output is the
    /// input or lies inside it.
    pub holds: bool,
}

/// Refuses an output that is one of `inputs`, lies inside one, or holds
/// one. Paths are compared as canonical paths, so a symlink or a `..`
/// does not hide an overlap; the output need not exist yet.
pub fn refuse_overlap<P: AsRef<Path>>(
    output: &Path,
    inputs: &[P],
    what: &'static str,
) -> Result<(), Overlap> {
    refuse_inside(output, inputs, what)?;
    match inputs.iter().find(|i| same_or_inside(i.as_ref(), output)) {
        Some(input) => Err(Overlap {
            output: output.into(),
            input: input.as_ref().into(),
            what,
            holds: true,
        }),
        None => Ok(()),
    }
}

/// [`refuse_overlap`] for inputs named as `prep tokenize` names them
/// (files, directories and globs, see [`crate::input::expand`]): a file
/// or a directory counts as itself; a glob counts as the folder it searches
/// (the path before its first wildcard), which the output may not hold,
/// and as every path it can match, which the output may not be or lie
/// inside (a glob with `**` can match anything below its folder). So a
/// re-run never reads its own output as input. Object-store addresses
/// are compared as paths.
pub fn refuse_overlap_patterns(
    output: &Path,
    patterns: &[String],
    what: &'static str,
) -> Result<(), Overlap> {
    for pattern in patterns {
        let is_glob = pattern.contains(['*', '?', '[']) && !Path::new(pattern).exists();
        if !is_glob {
            refuse_overlap(output, &[pattern], what)?;
            continue;
        }
        let path = Path::new(pattern);
        let wild =
            |c: &std::path::Component| c.as_os_str().to_string_lossy().contains(['*', '?', '[']);
        let base: PathBuf = path.components().take_while(|c| !wild(c)).collect();
        let rest: PathBuf = path.components().skip_while(|c| !wild(c)).collect();
        let base = if base.as_os_str().is_empty() {
            PathBuf::from(".")
        } else {
            base
        };
        let overlap = |holds| Overlap {
            output: output.into(),
            input: pattern.into(),
            what,
            holds,
        };
        if same_or_inside(&base, output) {
            return Err(overlap(true));
        }
        let Some(below) = relative_below(output, &base) else {
            continue;
        };
        let rest = rest.to_string_lossy();
        let options = glob::MatchOptions {
            case_sensitive: true,
            require_literal_separator: true,
            require_literal_leading_dot: true,
        };
        let matched = glob::Pattern::new(&rest).map_or(true, |glob| {
            rest.contains("**")
                || (1..=below.len()).any(|k| glob.matches_with(&below[..k].join("/"), options))
        });
        if matched {
            return Err(overlap(false));
        }
    }
    Ok(())
}

/// The components of `path` below `dir`, compared as canonical paths, when
/// it lies inside it.
fn relative_below(path: &Path, dir: &Path) -> Option<Vec<String>> {
    let (path, dir) = (canonical(path), canonical(dir));
    let below = path.strip_prefix(&dir).ok()?;
    Some(
        below
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect(),
    )
}

/// Refuses an output that is one of `inputs` or lies inside one, and
/// allows one that holds them: for `prep merge`, whose parts may lie inside
/// the directory they are merged into.
pub fn refuse_inside<P: AsRef<Path>>(
    output: &Path,
    inputs: &[P],
    what: &'static str,
) -> Result<(), Overlap> {
    match inputs.iter().find(|i| same_or_inside(output, i.as_ref())) {
        Some(input) => Err(Overlap {
            output: output.into(),
            input: input.as_ref().into(),
            what,
            holds: false,
        }),
        None => Ok(()),
    }
}

/// True when `path` is `dir` or lies inside it, compared as canonical paths
/// (`path` need not exist yet: its nearest existing ancestor is resolved).
pub(crate) fn same_or_inside(path: &Path, dir: &Path) -> bool {
    canonical(path).starts_with(canonical(dir))
}

/// `p` as a canonical path; when it does not exist yet, its nearest
/// existing ancestor's canonical path with the rest of `p` after it.
fn canonical(p: &Path) -> PathBuf {
    let mut head = p.to_path_buf();
    let mut tail = Vec::new();
    while !head.exists() {
        match (head.file_name().map(|n| n.to_owned()), head.parent()) {
            (Some(name), Some(parent)) => {
                tail.push(name);
                head = if parent.as_os_str().is_empty() {
                    PathBuf::from(".")
                } else {
                    parent.to_path_buf()
                };
            }
            _ => break,
        }
    }
    let mut out = std::fs::canonicalize(&head).unwrap_or(head);
    out.extend(tail.iter().rev());
    out
}

/// The fingerprint of a job: XXH3-64 (16 hex digits) of everything that
/// shapes its output. Equal fingerprints mean equal bytes; every part of a
/// partitioned job shares it, and `prep merge` joins only parts that do.
///
/// The one rule for what goes in: prep's version, the command, the options
/// that change the bytes written (the caller leaves out those that do not,
/// and never puts a path among them), and the inputs by what they hold,
/// not where they are mounted:
/// - an input with a checksum (a dataset: the XXH3 of its manifest, which
///   names every shard's) counts by that checksum and its size;
/// - an input without one (raw text, which is not read twice to be
///   hashed) counts by its size, its version (a local file's modification
///   time in nanoseconds, an object's version id or ETag: see
///   [`InputInfo::version`]) and its path below the directory all the
///   inputs share, so that `/mnt/a/corpus/x.jsonl` and `/data/corpus/x.jsonl`
///   agree while two files of one job stay distinct. An input edited in
///   place, to the same size or not, is another input: its run is another
///   run, whose output is "made from other inputs", and whose journal no
///   resume of the first run takes up.
///
/// So tasks that see the same inputs through other mount points, symlinks
/// or object-store prefixes compute the same fingerprint: the inode and the
/// device, which differ there, are not part of it.
pub fn job_fingerprint(command: &str, options: &serde_json::Value, inputs: &[InputInfo]) -> String {
    let names = relative_names(inputs.iter().map(|i| i.path.as_str()));
    let inputs: Vec<serde_json::Value> = inputs
        .iter()
        .zip(names)
        .map(|(i, name)| match (&i.xxh3, &i.version) {
            (Some(xxh3), _) => json!({ "bytes": i.bytes, "xxh3": xxh3 }),
            (None, None) => json!({ "bytes": i.bytes, "name": name }),
            (None, Some(version)) => json!({ "bytes": i.bytes, "name": name, "version": version }),
        })
        .collect();
    fingerprint(&json!({
        "prep_version": env!("CARGO_PKG_VERSION"),
        "command": command,
        "options": options,
        "inputs": inputs,
    }))
}

/// Who a run is: its command, its inputs, and the fingerprints of its job
/// and of its own part, computed once by the one rule
/// ([`job_fingerprint`]); and the provenance and partition its manifest
/// records, derived from them in one place.
#[derive(Debug, Clone)]
pub struct Identity {
    command: &'static str,
    inputs: Vec<InputInfo>,
    part: Option<Part>,
    /// The whole job's fingerprint: every part's `partition.job`.
    pub job: String,
    /// This run's own: the job's for a whole run, the part's for a part.
    pub fingerprint: String,
}

impl Identity {
    /// The identity of a `command` run over `inputs` with the `options`
    /// that shape its bytes (no paths among them), writing part `part` of
    /// the job or all of it.
    pub fn new(
        command: &'static str,
        options: &serde_json::Value,
        inputs: Vec<InputInfo>,
        part: Option<Part>,
    ) -> Identity {
        let job = job_fingerprint(command, options, &inputs);
        Identity::of_job(command, job, inputs, part)
    }

    fn of_job(
        command: &'static str,
        job: String,
        inputs: Vec<InputInfo>,
        part: Option<Part>,
    ) -> Identity {
        Identity {
            fingerprint: part_fingerprint(&job, part),
            command,
            inputs,
            part,
            job,
        }
    }

    /// The run's inputs, as its manifest records them.
    pub fn inputs(&self) -> &[InputInfo] {
        &self.inputs
    }

    /// The part this run writes, or `None` for the whole job.
    pub fn part(&self) -> Option<Part> {
        self.part
    }

    /// The identity of one of several outputs of this job (split's sides):
    /// a job of its own, with the same part.
    pub fn output(&self, name: &str) -> Identity {
        let job = sub_fingerprint(&self.job, name);
        Identity::of_job(self.command, job, self.inputs.clone(), self.part)
    }

    /// The provenance a manifest records: `options` as the stage records
    /// them, with `"part": "I/N"` added for a part.
    pub fn provenance(
        &self,
        mut options: serde_json::Value,
        documents: DocumentCounts,
    ) -> Provenance {
        if let (Some(p), Some(map)) = (self.part, options.as_object_mut()) {
            map.insert("part".into(), p.to_string().into());
        }
        Provenance::new(
            self.command,
            self.inputs.clone(),
            options,
            documents,
            self.fingerprint.clone(),
        )
    }

    /// The manifest's `partition`: which part of which job, for `prep
    /// merge`; none for a whole run.
    pub fn partition(&self) -> Option<Partition> {
        self.part.map(|p| Partition {
            stage: self.command.into(),
            part: p.index,
            parts: p.count,
            job: self.job.clone(),
            hashes: None,
        })
    }

    /// The manifest of a dataset derived from `base` (the input's): its
    /// shards, this run's provenance and its partition.
    pub fn derive(
        &self,
        base: &Manifest,
        shards: Vec<ShardInfo>,
        options: serde_json::Value,
        documents: DocumentCounts,
    ) -> Manifest {
        base.derived(shards, self.provenance(options, documents))
            .with_partition(self.partition())
    }
}

/// The fingerprint of part `part` of the job whose fingerprint is `job`
/// (the job's own for a run that is not partitioned): every part's output
/// differs, and a part re-run into its directory recognises its own.
pub fn part_fingerprint(job: &str, part: Option<Part>) -> String {
    match part {
        None => job.into(),
        Some(p) => fingerprint(&json!({ "job": job, "part": p.to_string() })),
    }
}

/// A fingerprint derived from another one and a name: each output of a
/// job that writes several (split's sides) is a job of its own.
pub fn sub_fingerprint(job: &str, name: &str) -> String {
    fingerprint(&json!({ "job": job, "side": name }))
}

fn fingerprint(value: &serde_json::Value) -> String {
    checksum_hex(xxhash_rust::xxh3::xxh3_64(value.to_string().as_bytes()))
}

/// Each path with the directory all of them share taken off (`/`- or
/// `\`-separated, local paths and URLs alike): one path keeps its file
/// name.
fn relative_names<'a>(paths: impl Iterator<Item = &'a str> + Clone) -> Vec<&'a str> {
    let dir_of = |p: &'a str| p.rfind(['/', '\\']).map_or("", |i| &p[..=i]);
    let mut common: Option<&str> = None;
    for p in paths.clone() {
        let dir = dir_of(p);
        common = Some(match common {
            None => dir,
            Some(c) => {
                let shared = c
                    .char_indices()
                    .zip(dir.chars())
                    .take_while(|((_, a), b)| a == b)
                    .filter(|((_, a), _)| *a == '/' || *a == '\\')
                    .last()
                    .map_or(0, |((i, _), _)| i + 1);
                &c[..shared]
            }
        });
    }
    let cut = common.map_or(0, str::len);
    paths.map(|p| &p[cut..]).collect()
}

/// The rayon pool a stage works on: `--threads N` threads (one per core
/// for 0), named `prep-STAGE-I` so that a profile or `top -H` says whose
/// they are; its build error as an I/O error (the one way it fails: the OS
/// refused a thread).
pub fn thread_pool(requested: usize, stage: &str) -> std::io::Result<rayon::ThreadPool> {
    let stage = stage.to_owned();
    rayon::ThreadPoolBuilder::new()
        .num_threads(crate::util::thread_count(requested))
        .thread_name(move |i| format!("prep-{stage}-{i}"))
        .build()
        .map_err(std::io::Error::other)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(path: &str, bytes: u64) -> InputInfo {
        InputInfo {
            path: path.into(),
            bytes,
            xxh3: None,
            version: Some("mtime:1".into()),
        }
    }

    #[test]
    fn names_are_relative_to_the_shared_directory() {
        fn names<'a>(p: &[&'a str]) -> Vec<&'a str> {
            relative_names(p.iter().copied())
        }
        assert_eq!(names(&["/mnt/a/x.jsonl"]), ["x.jsonl"]);
        assert_eq!(
            names(&[
                "/mnt/a/c/x.jsonl",
                "/mnt/a/c/d/y.jsonl",
                "/mnt/a/cc/z.jsonl"
            ]),
            ["c/x.jsonl", "c/d/y.jsonl", "cc/z.jsonl"]
        );
        assert_eq!(names(&["s3://b/p/x.gz", "s3://b/p/y.gz"]), ["x.gz", "y.gz"]);
        assert_eq!(names(&["x.jsonl", "d/y.jsonl"]), ["x.jsonl", "d/y.jsonl"]);
    }

    #[test]
    fn mount_points_do_not_change_a_fingerprint_and_content_does() {
        let options = json!({ "seed": 1 });
        let a = job_fingerprint("t", &options, &[raw("/mnt/a/c/x", 5), raw("/mnt/a/c/y", 6)]);
        let b = job_fingerprint("t", &options, &[raw("/data/c/x", 5), raw("/data/c/y", 6)]);
        assert_eq!(a, b);
        for other in [
            job_fingerprint("t", &options, &[raw("/data/c/x", 5), raw("/data/c/z", 6)]),
            job_fingerprint("t", &options, &[raw("/data/c/x", 5), raw("/data/c/y", 7)]),
            job_fingerprint("t", &options, &[raw("/data/c/y", 6), raw("/data/c/x", 5)]),
            job_fingerprint("u", &options, &[raw("/data/c/x", 5), raw("/data/c/y", 6)]),
            job_fingerprint(
                "t",
                &json!({ "seed": 2 }),
                &[raw("/data/c/x", 5), raw("/data/c/y", 6)],
            ),
        ] {
            assert_ne!(a, other);
        }
        let dataset = |path: &str, xxh3: &str| InputInfo {
            path: path.into(),
            bytes: 9,
            xxh3: Some(xxh3.into()),
            version: None,
        };
        // The same size, edited in place: another version.
        let edited = InputInfo {
            version: Some("mtime:2".into()),
            ..raw("/data/c/x", 5)
        };
        assert_ne!(
            a,
            job_fingerprint("t", &options, &[edited, raw("/data/c/y", 6)])
        );
        assert_eq!(
            job_fingerprint("t", &options, &[dataset("/a/tok", "00ff")]),
            job_fingerprint("t", &options, &[dataset("/b/other-name", "00ff")])
        );
        assert_ne!(
            job_fingerprint("t", &options, &[dataset("/a/tok", "00ff")]),
            job_fingerprint("t", &options, &[dataset("/a/tok", "00fe")])
        );
    }

    #[test]
    fn overlaps_are_refused_in_both_directions() {
        let t = tempfile::tempdir().unwrap();
        let input = t.path().join("in");
        std::fs::create_dir(&input).unwrap();
        let link = t.path().join("link");
        std::os::unix::fs::symlink(&input, &link).unwrap();
        let inside = refuse_overlap(&link.join("out"), &[&input], "the input").unwrap_err();
        assert!(!inside.holds);
        assert!(inside.to_string().contains("or lies inside it"), "{inside}");
        let holds = refuse_overlap(t.path(), &[&input], "the input").unwrap_err();
        assert!(holds.holds);
        assert!(holds.to_string().contains("holds the input"), "{holds}");
        assert!(refuse_inside(t.path(), &[&input], "the part").is_ok());
        assert!(refuse_overlap(&t.path().join("out"), &[&input], "the input").is_ok());
    }

    #[test]
    fn a_glob_overlaps_the_outputs_it_could_match_and_the_folder_it_searches() {
        let t = tempfile::tempdir().unwrap();
        let raw = t.path().join("raw");
        std::fs::create_dir(&raw).unwrap();
        let glob = |p: &str| vec![format!("{}/{p}", raw.display())];
        let refused = |out: &Path, p: &str| refuse_overlap_patterns(out, &glob(p), "the input");
        assert!(refused(&raw.join("tok"), "*").is_err());
        assert!(refused(&raw.join("tok/deeper"), "t*").is_err());
        assert!(refused(&raw.join("tok"), "**/*.json").is_err());
        assert!(refused(&raw, "*.jsonl").unwrap_err().holds);
        assert!(refused(t.path(), "*.jsonl").unwrap_err().holds);
        assert!(refused(&raw.join("tok"), "*.jsonl").is_ok());
        assert!(refused(&raw.join(".tok"), "*").is_ok());
        assert!(refused(&t.path().join("out"), "*").is_ok());
        // Files and directories count as themselves.
        let file = raw.join("a.jsonl");
        std::fs::write(&file, "{}").unwrap();
        let named = |out: &Path, p: &Path| {
            refuse_overlap_patterns(out, &[p.display().to_string()], "the input")
        };
        assert!(named(&raw.join("tok"), &raw).is_err());
        assert!(named(&raw, &file).unwrap_err().holds);
        assert!(named(&raw.join("tok"), &file).is_ok());
    }
}
