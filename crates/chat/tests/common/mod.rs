//! The differential harness: cases rendered by prep-chat and by Python
//! transformers (tests/reference.py, one process for all), compared byte for
//! byte.
#![allow(dead_code)]

pub mod constructs;
pub mod conversations;

use std::path::{Path, PathBuf};
use std::process::Command;

use prep_chat::{value_from_json, Now, RenderError, RenderInput, Template, Value};

/// The date both sides give `strftime_now`.
pub const NOW: Now = Now {
    year: 2025,
    month: 3,
    day: 7,
    hour: 9,
    minute: 5,
    second: 3,
};

/// The crate's directory.
pub fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The Cargo target directory this test was built in (the test binary is
/// `<target>/<profile>/deps/<name>`), else the workspace's `target/`.
fn target_dir() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.ancestors().nth(3).map(Path::to_path_buf))
        .unwrap_or_else(|| crate_dir().join("../../target"))
}

/// Skips, saying why, where the reference is missing; where `make test`
/// has set `PREP_REQUIRE_REFERENCE` (it builds the reference first), fails.
fn skip(why: &str) {
    assert!(
        std::env::var_os("PREP_REQUIRE_REFERENCE").is_none(),
        "{why}, and PREP_REQUIRE_REFERENCE is set"
    );
    eprintln!("skipped: {why}");
}

/// The Python with the reference `transformers`: `PREP_REFERENCE_PYTHON`,
/// else the venv `make test` builds (`<target>/venv`), as prep's own
/// differential tests find it. `None`, saying why, when it is not there.
pub fn reference_python() -> Option<PathBuf> {
    let python = std::env::var_os("PREP_REFERENCE_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| target_dir().join("venv/bin/python"));
    if python.exists() {
        Some(python)
    } else {
        skip(&format!("no reference Python at {}", python.display()));
        None
    }
}

/// The chat corpus the repository ships: templates, their configs and the
/// datasets (fixtures/chat/corpus; fixtures/README.md has their sources
/// and licences).
pub fn shipped_corpus() -> PathBuf {
    crate_dir().join("../../fixtures/chat/corpus")
}

/// The part of the chat corpus the repository does not ship (the Llama
/// and Gemma templates and configs): `$PREP_EXTERNAL_DATA/chat`. Only
/// tests compiled with `cfg(prep_external_data)` call it.
pub fn external_corpus() -> PathBuf {
    let dir = std::env::var_os("PREP_EXTERNAL_DATA")
        .map(|d| PathBuf::from(d).join("chat"))
        .expect("PREP_EXTERNAL_DATA is not set, and this test reads its chat/");
    assert!(
        dir.join("templates").is_dir(),
        "{} is not there",
        dir.display()
    );
    dir
}

/// A dataset of the shipped corpus (`data/NAME`, stored as `NAME.zst`),
/// decompressed.
pub fn dataset_text(name: &str) -> String {
    let path = shipped_corpus().join(format!("data/{name}.zst"));
    let file = std::fs::File::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    String::from_utf8(zstd::decode_all(file).unwrap()).unwrap()
}

/// One rendering to compare.
pub struct Case {
    /// The key of its template in the template list.
    pub template: String,
    /// What it is, for failure messages.
    pub label: String,
    /// JSON text of the messages (kept as text so key order survives).
    pub messages: String,
    /// JSON text of the tools list, if any.
    pub tools: Option<String>,
    /// JSON text of the documents list, if any.
    pub documents: Option<String>,
    pub add_generation_prompt: bool,
    /// JSON text of an object of further variables (special tokens, kwargs).
    pub vars: String,
}

/// What one side gave.
#[derive(Debug, PartialEq, Eq, Clone)]
pub enum Outcome {
    Text(String, Vec<(usize, usize)>),
    Raised(String),
    Error(String),
}

impl Outcome {
    /// Whether two outcomes agree: the same text and spans, the same raised
    /// message, or both some other error.
    pub fn agrees(&self, other: &Outcome) -> bool {
        match (self, other) {
            (Outcome::Error(_), Outcome::Error(_)) => true,
            (a, b) => a == b,
        }
    }
}

/// The reference rendering every case, running in the background.
pub struct PythonRun {
    child: std::process::Child,
    dir: tempfile::TempDir,
    cases: usize,
}

/// Starts rendering every case with Python transformers; `None` (saying
/// why) when the reference Python is not there.
pub fn start_python(templates: &[(String, String)], cases: &[Case]) -> Option<PythonRun> {
    let python = reference_python()?;
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("cases.json");
    std::fs::write(&input, cases_json(templates, cases)).unwrap();
    let child = Command::new(&python)
        .arg(crate_dir().join("tests/reference.py"))
        .arg(&input)
        .arg(dir.path().join("results.json"))
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    Some(PythonRun {
        child,
        dir,
        cases: cases.len(),
    })
}

impl PythonRun {
    /// Waits for the reference's outcomes; `None` (saying why) when
    /// transformers is not importable there.
    pub fn outcomes(self) -> Option<Vec<Outcome>> {
        let out = self.child.wait_with_output().unwrap();
        if out.status.code() == Some(3) {
            skip(String::from_utf8_lossy(&out.stderr).trim());
            return None;
        }
        assert!(
            out.status.success(),
            "reference.py failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = std::fs::read_to_string(self.dir.path().join("results.json")).unwrap();
        let results: serde_json::Value = serde_json::from_str(&text).unwrap();
        let version = results["transformers"].as_str().unwrap_or("?");
        eprintln!("reference: transformers {version}");
        let results = results["results"].as_array().unwrap();
        assert_eq!(results.len(), self.cases);
        Some(results.iter().map(outcome_from_python).collect())
    }
}

fn outcome_from_python(r: &serde_json::Value) -> Outcome {
    if let Some(text) = r.get("text") {
        let spans = r["spans"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| {
                (
                    s[0].as_u64().unwrap() as usize,
                    s[1].as_u64().unwrap() as usize,
                )
            })
            .collect();
        Outcome::Text(text.as_str().unwrap().to_owned(), spans)
    } else if let Some(m) = r.get("raised") {
        Outcome::Raised(m.as_str().unwrap().to_owned())
    } else {
        Outcome::Error(r["error"].as_str().unwrap().to_owned())
    }
}

/// The cases file reference.py reads. Built as text so that every object
/// keeps its key order.
fn cases_json(templates: &[(String, String)], cases: &[Case]) -> String {
    let s = |t: &str| serde_json::to_string(t).unwrap();
    let mut out = String::from("{\"date\": [");
    out.push_str(&format!(
        "{}, {}, {}, {}, {}, {}",
        NOW.year, NOW.month, NOW.day, NOW.hour, NOW.minute, NOW.second
    ));
    out.push_str("], \"templates\": {");
    for (i, (name, source)) in templates.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        out.push_str(&format!("{}: {}", s(name), s(source)));
    }
    out.push_str("}, \"cases\": [\n");
    for (i, c) in cases.iter().enumerate() {
        if i > 0 {
            out.push_str(",\n");
        }
        out.push_str(&format!(
            "{{\"template\": {}, \"messages\": {}, \"tools\": {}, \"documents\": {}, \"add_generation_prompt\": {}, \"vars\": {}}}",
            s(&c.template),
            c.messages,
            c.tools.as_deref().unwrap_or("null"),
            c.documents.as_deref().unwrap_or("null"),
            c.add_generation_prompt,
            c.vars
        ));
    }
    out.push_str("]}");
    out
}

/// Renders a case with prep-chat.
pub fn rust_outcome(template: &Result<Template, String>, case: &Case) -> Outcome {
    let template = match template {
        Ok(t) => t,
        Err(e) => return Outcome::Error(e.clone()),
    };
    let messages = value_from_json(&case.messages).unwrap();
    let tools = case.tools.as_deref().map(|t| value_from_json(t).unwrap());
    let documents = case
        .documents
        .as_deref()
        .map(|t| value_from_json(t).unwrap());
    let vars_value = value_from_json(&case.vars).unwrap();
    let vars: Vec<(String, Value)> = vars_value
        .try_iter()
        .unwrap()
        .map(|k| {
            (
                k.as_str().unwrap().to_owned(),
                vars_value.get_item(&k).unwrap(),
            )
        })
        .collect();
    let input = RenderInput {
        messages: &messages,
        tools: tools.as_ref(),
        documents: documents.as_ref(),
        add_generation_prompt: case.add_generation_prompt,
        vars: &vars,
        now: NOW,
    };
    match template.render(&input) {
        Ok(r) => Outcome::Text(
            r.text,
            r.generation.into_iter().map(|g| (g.start, g.end)).collect(),
        ),
        Err(RenderError::Raised(m)) => Outcome::Raised(m),
        Err(RenderError::Failed(m)) => Outcome::Error(m),
    }
}

/// Where two texts first differ, with some context, for failure messages.
pub fn first_difference(a: &str, b: &str) -> String {
    let n = a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count();
    let mut start = n.saturating_sub(60);
    while !a.is_char_boundary(start) {
        start -= 1;
    }
    let cut = |s: &str| {
        let mut end = (n + 60).min(s.len());
        while !s.is_char_boundary(end) {
            end += 1;
        }
        let mut st = start.min(end);
        while !s.is_char_boundary(st) {
            st -= 1;
        }
        s[st..end].to_owned()
    };
    format!(
        "at byte {n}:\n  prep:   {:?}\n  python: {:?}",
        cut(a),
        cut(b)
    )
}

/// One line per disagreement, at most `limit`.
pub fn describe(case: &Case, rust: &Outcome, python: &Outcome) -> String {
    let detail = match (rust, python) {
        (Outcome::Text(a, sa), Outcome::Text(b, sb)) if a == b => {
            format!("spans differ: prep {sa:?}, python {sb:?}")
        }
        (Outcome::Text(a, _), Outcome::Text(b, _)) => first_difference(a, b),
        _ => format!("prep {rust:?}\n  python {python:?}"),
    };
    format!("{} [{}]: {detail}", case.template, case.label)
}
