//! The documentation's command lines against the flags prep really has.
//!
//! Every line of README.md and docs/**/*.md that runs `prep SUBCOMMAND ...`
//! inside a ```` ```sh ````, ```` ```bash ````, ```` ```shell ```` or
//! ```` ```console ```` block is split as a shell splits it and parsed by
//! [`Cli`], the parser the binary itself runs: a misspelt or removed flag,
//! a missing required argument or a value clap refuses fails the test,
//! naming the file, the line and clap's error. In a `console` block only
//! lines starting with `$ ` are commands (the rest is output); in the others
//! every line is, with a leading `$ ` dropped. A line ending in `\` goes on
//! on the next; a comment, and everything from the first `|`, `&`, `;`, `>`
//! or `<`, is left out; a line whose command word is not `prep` (or a path
//! ending in `/prep`) is skipped, after any `NAME=value` assignments. Values
//! are taken literally: `$VAR`, `$(...)` and globs are not expanded.
//!
//! Usage synopses (`prep pack IN OUT --seq-len L [--mode bestfit|concat]`)
//! are not runnable, so they live in ```` ```text ```` blocks; there each
//! line starting with `prep SUBCOMMAND` (or `$ prep`) must name a subcommand
//! that exists, and every `--flag` and `-f` on it must be one of that
//! subcommand's.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use clap::error::ErrorKind;
use clap::{CommandFactory, Parser};

use super::Cli;

/// Code block languages whose lines are shell commands.
const SHELL: &[&str] = &["sh", "bash", "shell", "console"];

/// The Markdown files the check reads: README.md and every .md under docs/,
/// in a fixed order.
fn doc_files() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = vec![root.join("README.md")];
    let mut stack = vec![root.join("docs")];
    let mut found = Vec::new();
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "md") {
                found.push(path);
            }
        }
    }
    found.sort();
    files.extend(found);
    files
}

/// Each of [`doc_files`] as (its path from the repository root, its text).
fn read_docs() -> Vec<(String, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    doc_files()
        .into_iter()
        .map(|path| {
            let markdown = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let name = path
                .strip_prefix(root)
                .unwrap_or(&path)
                .display()
                .to_string();
            (name, markdown)
        })
        .collect()
}

/// A command line found in a code block.
#[derive(Debug)]
struct Found {
    /// 1-based line of the file where the command starts.
    line: usize,
    /// The command, continuation lines joined, `$ ` dropped.
    text: String,
    /// A runnable command (a shell block) or a usage synopsis (a text block).
    synopsis: bool,
}

/// The command lines of the shell and text code blocks of `markdown`.
fn command_lines(markdown: &str) -> Vec<Found> {
    let mut found = Vec::new();
    // The open block's language and fence, if any.
    let mut block: Option<(String, String)> = None;
    // A command continued on the next line: its first line and text so far.
    let mut pending: Option<(usize, String)> = None;
    for (i, raw) in markdown.lines().enumerate() {
        let trimmed = raw.trim();
        let Some((lang, fence)) = &block else {
            let fence: String = trimmed.chars().take_while(|&c| c == '`').collect();
            if fence.len() >= 3 {
                let lang = trimmed[fence.len()..]
                    .split(|c: char| c == ',' || c.is_whitespace())
                    .next()
                    .unwrap_or("")
                    .to_string();
                block = Some((lang, fence));
            }
            continue;
        };
        if trimmed.starts_with(fence.as_str()) && trimmed.chars().all(|c| c == '`') {
            block = None;
            pending = None;
            continue;
        }
        let synopsis = lang == "text";
        if !synopsis && !SHELL.contains(&lang.as_str()) {
            continue;
        }
        let (start, text) = match pending.take() {
            Some((start, so_far)) => (start, format!("{so_far} {trimmed}")),
            None => match trimmed.strip_prefix("$ ") {
                Some(rest) => (i + 1, rest.trim_start().to_string()),
                // Output, in a console block.
                None if lang == "console" => continue,
                None => (i + 1, trimmed.to_string()),
            },
        };
        match text.strip_suffix('\\') {
            Some(head) => pending = Some((start, head.trim_end().to_string())),
            None => found.push(Found {
                line: start,
                text,
                synopsis,
            }),
        }
    }
    found
}

/// Splits a command line into words as a POSIX shell does, up to the first
/// comment or control or redirection operator. Quotes and backslashes are
/// removed; `$VAR` and `$(...)` stay as written.
fn shell_words(line: &str) -> Result<Vec<String>, String> {
    let mut words = Vec::new();
    let mut word: Option<String> = None;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                let w = word.get_or_insert_with(String::new);
                loop {
                    match chars.next() {
                        Some('\'') => break,
                        Some(c) => w.push(c),
                        None => return Err("unterminated single quote".into()),
                    }
                }
            }
            '"' => {
                let w = word.get_or_insert_with(String::new);
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') => match chars.next() {
                            Some(c @ ('"' | '\\' | '$' | '`')) => w.push(c),
                            Some(c) => {
                                w.push('\\');
                                w.push(c);
                            }
                            None => return Err("unterminated double quote".into()),
                        },
                        Some(c) => w.push(c),
                        None => return Err("unterminated double quote".into()),
                    }
                }
            }
            '\\' => {
                if let Some(c) = chars.next() {
                    word.get_or_insert_with(String::new).push(c);
                }
            }
            '#' if word.is_none() => break,
            '|' | '&' | ';' => break,
            '>' | '<' => {
                // `2> file`: the digits are the redirected descriptor, not a word.
                if word
                    .as_deref()
                    .is_some_and(|w| w.chars().all(|c| c.is_ascii_digit()))
                {
                    word = None;
                }
                break;
            }
            c if c.is_whitespace() => {
                if let Some(w) = word.take() {
                    words.push(w);
                }
            }
            c => word.get_or_insert_with(String::new).push(c),
        }
    }
    if let Some(w) = word {
        words.push(w);
    }
    Ok(words)
}

/// The words from `prep` on, when prep is the command word; `None` for any
/// other command.
fn prep_command(words: &[String]) -> Option<&[String]> {
    let first = words.iter().position(|w| !is_assignment(w))?;
    is_prep(&words[first]).then_some(&words[first..])
}

/// `prep`, or a path to it (`target/release/prep`).
fn is_prep(word: &str) -> bool {
    word == "prep" || word.ends_with("/prep")
}

/// `NAME=value` before a command: an environment assignment.
fn is_assignment(word: &str) -> bool {
    match word.split_once('=') {
        Some((name, _)) => {
            !name.is_empty()
                && !name.starts_with(|c: char| c.is_ascii_digit())
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        }
        None => false,
    }
}

/// Parses a runnable command line with prep's own parser.
fn check_command(words: &[String]) -> Result<(), String> {
    let mut argv = vec!["prep".to_string()];
    argv.extend(words[1..].iter().cloned());
    match Cli::try_parse_from(&argv) {
        Ok(_) => Ok(()),
        Err(e) if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) => Ok(()),
        Err(e) => Err(clap_message(&e)),
    }
}

/// clap's error without its usage block, on one line.
fn clap_message(e: &clap::Error) -> String {
    let text = e.to_string();
    let text = text.split("\n\nUsage:").next().unwrap_or(&text);
    let text = text.strip_prefix("error: ").unwrap_or(text);
    text.split('\n')
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("; ")
}

/// Checks a usage synopsis: the subcommand exists and has every flag named.
fn check_synopsis(text: &str) -> Result<(), String> {
    let words: Vec<&str> = text
        .split(|c: char| c.is_whitespace() || matches!(c, '[' | ']' | '|' | '(' | ')'))
        .filter(|w| !w.is_empty())
        .collect();
    let name = words.get(1).ok_or("no subcommand")?;
    if name.starts_with('-') {
        return Ok(()); // `prep --help`, `prep --version`
    }
    let cli = Cli::command();
    let sub = cli
        .find_subcommand(name)
        .ok_or_else(|| format!("prep has no subcommand {name:?}"))?;
    let mut unknown = Vec::new();
    for word in &words[2..] {
        let flag = word.split('=').next().unwrap_or(word);
        let known = if let Some(long) = flag.strip_prefix("--") {
            long.is_empty() || has_long(sub, long)
        } else if let Some(short) = flag.strip_prefix('-') {
            let mut cs = short.chars();
            match (cs.next(), cs.next()) {
                (Some(c), None) if c.is_ascii_alphabetic() => {
                    c == 'h' || sub.get_arguments().any(|a| a.get_short() == Some(c))
                }
                _ => true,
            }
        } else {
            true
        };
        if !known {
            unknown.push(format!("{flag:?}"));
        }
    }
    if unknown.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "prep {name} has no flag {}",
            unknown.join(", no flag ")
        ))
    }
}

/// Checks the prep command lines of one Markdown text: how many there are,
/// and every problem, as `FILE:LINE: COMMAND: ERROR`.
fn check(file: &str, markdown: &str) -> (usize, Vec<String>) {
    let mut checked = 0;
    let mut out = Vec::new();
    for found in command_lines(markdown) {
        let verdict = if found.synopsis {
            if !found.text.split_whitespace().next().is_some_and(is_prep) {
                continue;
            }
            check_synopsis(&found.text)
        } else {
            match shell_words(&found.text) {
                Err(e) => Err(e),
                Ok(words) => match prep_command(&words) {
                    None => continue,
                    Some(command) => check_command(command),
                },
            }
        };
        checked += 1;
        if let Err(e) = verdict {
            out.push(format!("{file}:{}: {}: {e}", found.line, found.text));
        }
    }
    (checked, out)
}

/// The problems [`check`] finds.
fn problems(file: &str, markdown: &str) -> Vec<String> {
    check(file, markdown).1
}

#[test]
fn every_documented_command_line_parses() {
    let mut report = String::new();
    let mut checked = 0;
    for (name, markdown) in read_docs() {
        let (n, problems) = check(&name, &markdown);
        checked += n;
        for problem in problems {
            let _ = writeln!(report, "{problem}");
        }
    }
    // A broken finder would pass vacuously: the docs hold well over 50.
    assert!(
        checked > 50,
        "only {checked} prep command lines found in README.md and docs/"
    );
    assert!(
        report.is_empty(),
        "command lines in the docs that prep does not accept:\n{report}"
    );
}

#[test]
fn a_misspelt_flag_is_caught() {
    let doc = "text\n\n```sh\nprep pack a b --seq-len 8 --shard-sise 1MiB\n```\n";
    let found = problems("x.md", doc);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].starts_with("x.md:4: "), "{}", found[0]);
    assert!(found[0].contains("--shard-sise"), "{}", found[0]);
    assert!(problems("x.md", &doc.replace("sise", "size")).is_empty());
}

#[test]
fn a_misspelt_flag_in_a_synopsis_is_caught() {
    let doc = "```text\nprep pack IN OUT --seq-len L [--mode bestfit|concat] [--windw N]\n```\n";
    let found = problems("x.md", doc);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].contains("\"--windw\""), "{}", found[0]);
    assert!(problems("x.md", &doc.replace("windw", "window")).is_empty());
    let doc = "```text\nprep packs IN OUT\n```\n";
    assert!(problems("x.md", doc)[0].contains("no subcommand \"packs\""));
}

#[test]
fn command_lines_are_found_and_split_as_a_shell_would() {
    let doc = "\
```console
$ prep validate 'my data' \\
    --json --quick   # a comment
out/ds: valid
```
```bash
export X=1
FOO=bar target/release/prep inspect \"a b\" --record 3 | head -5
prep validate ds 2> err.txt
python tools/prep_ray.py --prep $(pwd)/prep --input x
```
```python
prep tokenize --nonsense
```
";
    let found = command_lines(doc);
    let texts: Vec<&str> = found.iter().map(|f| f.text.as_str()).collect();
    assert_eq!(
        texts,
        [
            "prep validate 'my data' --json --quick   # a comment",
            "export X=1",
            "FOO=bar target/release/prep inspect \"a b\" --record 3 | head -5",
            "prep validate ds 2> err.txt",
            "python tools/prep_ray.py --prep $(pwd)/prep --input x",
        ]
    );
    assert_eq!(found[0].line, 2);
    let words = shell_words(&found[0].text).unwrap();
    assert_eq!(words, ["prep", "validate", "my data", "--json", "--quick"]);
    let words = shell_words(&found[2].text).unwrap();
    assert_eq!(
        prep_command(&words).unwrap(),
        ["target/release/prep", "inspect", "a b", "--record", "3"]
    );
    assert_eq!(
        shell_words(&found[3].text).unwrap(),
        ["prep", "validate", "ds"]
    );
    assert!(prep_command(&shell_words(&found[4].text).unwrap()).is_none());
    assert!(
        problems("x.md", doc).is_empty(),
        "{:?}",
        problems("x.md", doc)
    );
}

#[test]
fn help_and_version_are_accepted_and_a_bad_value_is_not() {
    let doc =
        "```sh\nprep --help\nprep pack --help\nprep --version\nprep pack a b --seq-len L\n```\n";
    let found = problems("x.md", doc);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].starts_with("x.md:5: "), "{}", found[0]);
}

/// Whether `sub` (a subcommand's `Command`) has the long flag `long`.
fn has_long(sub: &clap::Command, long: &str) -> bool {
    long == "help"
        || sub.get_arguments().any(|a| {
            a.get_long() == Some(long)
                || a.get_all_aliases()
                    .is_some_and(|aliases| aliases.contains(&long))
        })
}

/// The subcommand a heading names as `prep NAME` (backticked or not).
fn heading_command(heading: &str) -> Option<String> {
    let words: Vec<&str> = heading
        .split(|c: char| !c.is_alphanumeric() && c != '-')
        .filter(|w| !w.is_empty())
        .collect();
    let i = words.iter().position(|w| *w == "prep")?;
    let name = words.get(i + 1)?;
    Cli::command()
        .find_subcommand(name)
        .map(|_| name.to_string())
}

/// Flags the docs name that belong to other programs, each with its owner:
/// a flag in prose that is no subcommand's is an error unless listed here.
const FOREIGN_FLAGS: &[(&str, &str)] = &[
    ("features", "cargo"),
    ("workspace", "cargo"),
    ("no-deps", "cargo doc, pip"),
    ("no-default-features", "cargo"),
    ("split-sentences", "Megatron-LM's tools/preprocess_data.py"),
    ("train-samples", "Megatron-LM's training"),
    ("split", "Megatron-LM's training"),
    ("data-path", "Megatron-LM's training"),
    ("array", "sbatch"),
    ("dependency", "sbatch"),
    ("kill-on-invalid-dep", "sbatch"),
    ("address", "tools/prep_ray.py"),
    ("num-cpus", "tools/prep_ray.py"),
    ("task-cpus", "tools/prep_ray.py"),
    ("max-retries", "tools/prep_ray.py"),
    ("run", "tools/prep_ray.py"),
    ("log-dir", "tools/prep_ray.py"),
    ("parts", "tools/prep_ray.py, tools/slurm"),
    ("near-dedup", "tools/prep_ray.py, tools/slurm"),
    ("bucket", "tools/slurm/prep_slurm.sh"),
    ("data", "tools/slurm/prep_slurm.sh"),
    ("repeat", "tools/bench_*.py"),
    ("mib", "tools/bench_*.py"),
    ("limit-mb", "tools/bench_*.py"),
    ("settle", "tools/bench_*.py"),
];

/// The flags named in a Markdown text's prose (outside code blocks), each
/// against the subcommands it is about, as `FILE:LINE: ERROR`:
/// - a backticked `prep SUBCOMMAND ...` is checked as a usage synopsis;
/// - a backticked bare flag (`--seq-len`, `--seq-len 2049`, `--to=llmc`) must
///   be a flag of the subcommand the section is about (the nearest heading
///   below the title that names `prep NAME`) or of one the line names, or,
///   outside such a section, of any subcommand; a flag of another program
///   must be in [`FOREIGN_FLAGS`].
fn prose_problems(file: &str, markdown: &str) -> Vec<String> {
    let cli = Cli::command();
    let mut out = Vec::new();
    // The subcommand of the nearest heading that names one, and its level.
    let mut section: Option<(usize, String)> = None;
    let mut in_block = false;
    for (i, line) in markdown.lines().enumerate() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("```") {
            in_block = !in_block;
            continue;
        }
        if in_block {
            continue;
        }
        if trimmed.starts_with('#') {
            let level = trimmed.chars().take_while(|&c| c == '#').count();
            // A page's title names every command the page is about; only a
            // section heading narrows the flags to one subcommand.
            match heading_command(trimmed).filter(|_| level >= 2) {
                Some(name) => section = Some((level, name)),
                // A heading at the same level or above ends the section.
                None if section.as_ref().is_some_and(|(l, _)| level <= *l) => section = None,
                None => {}
            }
            continue;
        }
        // The section's subcommand, and any the line itself names ("as
        // export's `--val-tokens`").
        let mut context: Vec<String> = section.iter().map(|(_, n)| n.clone()).collect();
        if !context.is_empty() {
            context.extend(
                line.split(|c: char| !c.is_ascii_alphanumeric() && c != '-')
                    .filter(|w| cli.find_subcommand(w).is_some())
                    .map(str::to_string),
            );
        }
        for (n, span) in line.split('`').enumerate() {
            // The odd pieces of a line split at backticks are code spans.
            if n % 2 == 0 {
                continue;
            }
            let span = span.trim();
            let mut words = span.split_whitespace();
            // `prep NAME ...`, not a placeholder (`prep COMMAND`, `prep ...`).
            if words.next() == Some("prep")
                && words
                    .next()
                    .is_some_and(|w| w.starts_with(|c: char| c.is_ascii_lowercase() || c == '-'))
            {
                if let Err(e) = check_synopsis(span) {
                    out.push(format!("{file}:{}: `{span}`: {e}", i + 1));
                }
                continue;
            }
            let Some(long) = span.strip_prefix("--") else {
                continue;
            };
            let long = long
                .split(|c: char| c == '=' || c.is_whitespace())
                .next()
                .unwrap_or("");
            if !long.starts_with(|c: char| c.is_ascii_alphanumeric())
                || !long.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
                || FOREIGN_FLAGS.iter().any(|(flag, _)| *flag == long)
            {
                continue;
            }
            let known = if context.is_empty() {
                cli.get_subcommands().any(|s| has_long(s, long))
            } else {
                context
                    .iter()
                    .filter_map(|name| cli.find_subcommand(name))
                    .any(|s| has_long(s, long))
            };
            if !known {
                let whose = if context.is_empty() {
                    "no subcommand of prep".to_string()
                } else {
                    format!("prep {}", context.join(" / prep "))
                };
                out.push(format!(
                    "{file}:{}: `--{long}`: {whose} has no such flag",
                    i + 1
                ));
            }
        }
    }
    out
}

#[test]
fn every_flag_named_in_prose_is_a_flag_of_its_subcommand() {
    let mut report = String::new();
    for (name, markdown) in read_docs() {
        for problem in prose_problems(&name, &markdown) {
            let _ = writeln!(report, "{problem}");
        }
    }
    assert!(
        report.is_empty(),
        "flags named in the docs' prose that prep does not have:\n{report}"
    );
}

#[test]
fn a_flag_in_prose_is_checked_against_its_section() {
    let doc = "# Mix and split\n\nUse `--seq-len 2049` and `--seed`.\n\n## `prep split`\n\n\
               Deterministic for any `--threads`.\n\n## Both\n\nAny `--threads`.\n";
    let found = prose_problems("x.md", doc);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].starts_with("x.md:7: `--threads`: prep split"),
        "{}",
        found[0]
    );
    // A foreign flag is known by its owner; an unknown one is not.
    assert!(prose_problems("x.md", "`cargo build --features cuda`, `--features`\n").is_empty());
    let found = prose_problems("x.md", "Run `prep pack a b --seq-lenn 8`, then `--nope`.\n");
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(found[0].contains("--seq-lenn"), "{}", found[0]);
    assert!(found[1].contains("no subcommand of prep"), "{}", found[1]);
    assert!(prose_problems("x.md", "```sh\n`--nope`\n```\n").is_empty());
}

/// The layout block of docs/development.md: the path each entry starts with.
fn layout_entries(markdown: &str) -> Vec<String> {
    let start = markdown
        .find("## Layout")
        .expect("docs/development.md has a ## Layout");
    let block = &markdown[start..];
    let open = block.find("```text\n").expect("the layout is a text block") + "```text\n".len();
    let close = block[open..].find("```").expect("the layout block ends") + open;
    block[open..close]
        .lines()
        .filter(|l| !l.starts_with(' ') && !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

#[test]
fn the_documented_layout_is_the_tree() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let markdown = std::fs::read_to_string(root.join("docs/development.md")).unwrap();
    let entries = layout_entries(&markdown);
    let mut problems = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for e in &entries {
        if !seen.insert(e.as_str()) {
            problems.push(format!("{e} is listed twice"));
        }
        if !root.join(e).exists() {
            problems.push(format!("{e} is listed but does not exist"));
        }
    }
    // Every directory at the top and every module under src/ is listed (a
    // file or directory listed whole, or its parent directory).
    let listed = |path: &str| {
        entries.iter().any(|e| {
            e.trim_end_matches('/') == path.trim_end_matches('/')
                || (e.ends_with('/') && path.starts_with(e.as_str()))
        })
    };
    let mut names = Vec::new();
    for entry in std::fs::read_dir(root).unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if entry.path().is_dir() && !name.starts_with('.') && name != "target" {
            names.push(format!("{name}/"));
        }
    }
    for entry in std::fs::read_dir(root.join("src")).unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let slash = if entry.path().is_dir() { "/" } else { "" };
        names.push(format!("src/{name}{slash}"));
    }
    for name in names {
        let covered = listed(&name)
            || entries
                .iter()
                .any(|e| e.starts_with(&name) && name.ends_with('/'));
        if !covered {
            problems.push(format!("{name} is in the tree but not in the layout"));
        }
    }
    assert!(
        problems.is_empty(),
        "docs/development.md's layout and the tree differ:\n{}",
        problems.join("\n")
    );
}
