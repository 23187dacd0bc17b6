//! prep-chat against Python transformers (the reference, `tests/reference.py`):
//! every template of the shared chat corpus on many kinds of conversation and
//! on the corpus's real conversations, and small templates for single
//! constructs. Rendered text must be byte-identical, generation spans equal,
//! and a template that raises (or fails) in one must raise (or fail) in the
//! other. All cases go to one Python process.
//!
//! The corpus is fixtures/chat/corpus, and the Llama and Gemma templates the
//! repository does not ship are read from `$PREP_EXTERNAL_DATA/chat` by a
//! test of their own, reported skipped (ignored) where the variable was not
//! set at build time. Skips, saying why, where the reference Python
//! (`PREP_REFERENCE_PYTHON`, else `<target>/venv/bin/python`) or
//! transformers is missing, and fails there under `PREP_REQUIRE_REFERENCE`
//! (`make test` sets it).

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use common::constructs::{
    CONSTRUCTS, DOCUMENTS, EXTRA_TEMPLATES, LENIENT, MESSAGES, REFUSED, VARS,
};
use common::conversations::{real_conversations, special_tokens, CONVERSATIONS, KWARGS, TOOLS};
use common::{describe, rust_outcome, start_python, Case, Outcome};
use prep_chat::Template;

/// Every case with both outcomes.
struct Run {
    cases: Vec<Case>,
    rust: Vec<Outcome>,
    python: Vec<Outcome>,
}

/// The templates of the shipped corpus (10) and of the one the repository
/// does not ship (5): 15 in all.
const SHIPPED: usize = 10;
const EXTERNAL: usize = 5;

/// Renders every case both ways: those of the corpus templates in `corpus`
/// that `shipped` does not also hold, and with `constructs`, the single
/// constructs. `None` (saying why) without the reference.
fn run(corpus: &Path, shipped: Option<&Path>, constructs: bool) -> Option<Run> {
    let mut templates = Vec::new();
    let mut cases = Vec::new();
    corpus_cases(corpus, shipped, constructs, &mut templates, &mut cases);
    if constructs {
        construct_cases(&mut templates, &mut cases);
    }
    // Python renders in its own process while prep renders here.
    let reference = start_python(&templates, &cases)?;
    let compiled: BTreeMap<&str, Result<Template, String>> = templates
        .iter()
        .map(|(name, src)| (name.as_str(), Template::new(src).map_err(|e| e.to_string())))
        .collect();
    let rust = cases
        .iter()
        .map(|c| rust_outcome(&compiled[c.template.as_str()], c))
        .collect();
    let python = reference.outcomes()?;
    Some(Run {
        cases,
        rust,
        python,
    })
}

/// The corpus templates of `corpus` but those `shipped` also holds, each
/// with the synthetic conversations (with and without the generation
/// prompt, under each set of keyword arguments) and the real ones; with
/// `extra`, also the extra templates.
fn corpus_cases(
    corpus: &Path,
    shipped: Option<&Path>,
    extra: bool,
    templates: &mut Vec<(String, String)>,
    cases: &mut Vec<Case>,
) {
    let mut files: Vec<_> = std::fs::read_dir(corpus.join("templates"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "jinja"))
        .filter(|p| {
            shipped.is_none_or(|s| !s.join("templates").join(p.file_name().unwrap()).exists())
        })
        .collect();
    files.sort();
    let real = real_conversations();
    let corpus_templates = files.iter().map(|file| {
        let name = file.file_stem().unwrap().to_str().unwrap().to_owned();
        (name, std::fs::read_to_string(file).unwrap(), true)
    });
    let extra = EXTRA_TEMPLATES
        .iter()
        .filter(|_| extra)
        .map(|(name, source)| (name.to_string(), source.to_string(), false));
    for (name, source, with_real) in corpus_templates.chain(extra) {
        templates.push((name.clone(), source));
        let tokens = special_tokens(corpus, &name);
        let vars = |kwargs: &str| {
            let inner = kwargs
                .trim()
                .trim_start_matches('{')
                .trim_end_matches('}')
                .trim();
            match (tokens.is_empty(), inner.is_empty()) {
                (_, true) => format!("{{{tokens}}}"),
                (true, false) => format!("{{{inner}}}"),
                (false, false) => format!("{{{tokens}, {inner}}}"),
            }
        };
        for (label, messages, with_tools) in CONVERSATIONS {
            for add_generation_prompt in [false, true] {
                for (kw_label, kwargs) in KWARGS {
                    cases.push(Case {
                        template: name.clone(),
                        label: format!("{label}, agp={add_generation_prompt}, {kw_label}"),
                        messages: messages.to_string(),
                        tools: with_tools.then(|| TOOLS.to_owned()),
                        documents: None,
                        add_generation_prompt,
                        vars: vars(kwargs),
                    });
                }
            }
        }
        // Tools offered to a conversation that uses none.
        cases.push(Case {
            template: name.clone(),
            label: "tools-unused".into(),
            messages: CONVERSATIONS[2].1.to_owned(),
            tools: Some(TOOLS.to_owned()),
            documents: None,
            add_generation_prompt: true,
            vars: vars("{}"),
        });
        for (i, (label, messages, tools)) in real.iter().enumerate().filter(|_| with_real) {
            cases.push(Case {
                template: name.clone(),
                label: label.clone(),
                messages: messages.clone(),
                tools: tools.clone(),
                documents: None,
                add_generation_prompt: i % 4 == 0,
                vars: vars("{}"),
            });
        }
    }
}

fn construct_cases(templates: &mut Vec<(String, String)>, cases: &mut Vec<Case>) {
    for (name, source) in CONSTRUCTS.iter().chain(REFUSED).chain(LENIENT) {
        let key = format!("construct:{name}");
        templates.push((key.clone(), source.to_string()));
        cases.push(Case {
            template: key,
            label: (*name).to_owned(),
            messages: MESSAGES.to_owned(),
            tools: Some(TOOLS.to_owned()),
            documents: (*name == "documents").then(|| DOCUMENTS.to_owned()),
            add_generation_prompt: false,
            vars: VARS.to_owned(),
        });
    }
}

/// Whether to print what each construct gave and why cases failed in both
/// (`PREP_CHAT_SHOW=1`, with `--nocapture`).
fn show() -> bool {
    std::env::var_os("PREP_CHAT_SHOW").is_some()
}

/// Per template: cases, equal, raised in both, failed in both.
#[derive(Default)]
struct Tally {
    cases: usize,
    equal: usize,
    raised: usize,
    failed: usize,
}

/// One test for all the shipped corpus (one Python process, whichever
/// runner): the corpus templates, then the constructs, then the constructs
/// known to differ.
#[test]
fn renders_as_transformers() {
    let Some(run) = run(&common::shipped_corpus(), None, true) else {
        return;
    };
    let mut bad = corpus_disagreements(&run, SHIPPED);
    bad.extend(construct_disagreements(&run));
    assert!(
        bad.is_empty(),
        "{} cases differ from transformers:\n{}",
        bad.len(),
        bad.iter().take(40).cloned().collect::<Vec<_>>().join("\n")
    );
}

/// The Llama and Gemma templates (`$PREP_EXTERNAL_DATA/chat`), on the same
/// conversations.
#[test]
#[cfg_attr(
    not(prep_external_data),
    ignore = "needs PREP_EXTERNAL_DATA (chat/: the Llama and Gemma chat templates)"
)]
fn renders_the_templates_not_shipped_as_transformers() {
    let shipped = common::shipped_corpus();
    let Some(run) = run(&common::external_corpus(), Some(&shipped), false) else {
        return;
    };
    let bad = corpus_disagreements(&run, EXTERNAL);
    assert!(
        bad.is_empty(),
        "{} cases differ from transformers:\n{}",
        bad.len(),
        bad.iter().take(40).cloned().collect::<Vec<_>>().join("\n")
    );
}

/// The corpus cases that disagree, and a wrong count of corpus templates;
/// prints the per-template tally.
fn corpus_disagreements(run: &Run, templates: usize) -> Vec<String> {
    let mut tallies: BTreeMap<&str, Tally> = BTreeMap::new();
    let mut bad = Vec::new();
    for ((case, rust), python) in run.cases.iter().zip(&run.rust).zip(&run.python) {
        if case.template.starts_with("construct:") {
            continue;
        }
        let t = tallies.entry(&case.template).or_default();
        t.cases += 1;
        if !rust.agrees(python) {
            bad.push(describe(case, rust, python));
            continue;
        }
        t.equal += 1;
        match python {
            Outcome::Raised(_) => t.raised += 1,
            Outcome::Error(pe) => {
                t.failed += 1;
                if show() {
                    eprintln!(
                        "{} [{}] failed in both:\n  python: {pe}\n  prep: {rust:?}",
                        case.template, case.label
                    );
                }
            }
            Outcome::Text(..) => {}
        }
    }
    eprintln!(
        "{:<22} {:>6} {:>6} {:>7} {:>7}",
        "template", "cases", "equal", "raised", "failed"
    );
    for (name, t) in &tallies {
        eprintln!(
            "{name:<22} {:>6} {:>6} {:>7} {:>7}",
            t.cases, t.equal, t.raised, t.failed
        );
    }
    let corpus = tallies.keys().filter(|k| !k.starts_with("extra:")).count();
    if corpus != templates {
        bad.push(format!(
            "{templates} corpus templates expected, not {corpus}"
        ));
    }
    bad
}

/// The constructs that disagree, and those known to differ that no longer
/// do as listed: REFUSED ones render in transformers and fail in prep,
/// LENIENT ones fail in transformers and render in prep.
fn construct_disagreements(run: &Run) -> Vec<String> {
    let mut bad = Vec::new();
    for ((case, rust), python) in run.cases.iter().zip(&run.rust).zip(&run.python) {
        if !case.template.starts_with("construct:") {
            continue;
        }
        if show() {
            eprintln!("{}: {python:?}", case.label);
        }
        let listed = |list: &[(&str, &str)]| list.iter().any(|r| r.0 == case.label);
        let ok = if listed(REFUSED) {
            matches!((rust, python), (Outcome::Error(_), Outcome::Text(..)))
        } else if listed(LENIENT) {
            matches!((rust, python), (Outcome::Text(..), Outcome::Error(_)))
        } else {
            rust.agrees(python)
        };
        if !ok {
            bad.push(describe(case, rust, python));
        }
    }
    bad
}
