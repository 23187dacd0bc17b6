//! `prep tokenize --chat`: conversations through a chat template into
//! tokens with a loss mask beside them, and the mask through validate,
//! inspect and merge. (The differential check of rendering, ids and masks
//! against transformers on every real template is tests/python/test_chat.py
//! and crates/chat's own test.)

use std::path::{Path, PathBuf};

use prep::format::{Dataset, Manifest};

use crate::common::*;

/// A ChatML-style template, written out so that it has no newlines of its own.
const CHATML: &str = "{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content + \
    '<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/// A template that refuses a system message, as some real ones do.
const NO_SYSTEM: &str = "{% if messages[0].role == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}\
    {% for m in messages %}{{ m.role + ': ' + m.content + '\\n' }}{% endfor %}";

/// A template that rewrites earlier turns: each assistant message but the
/// last is rendered in short, so no prefix of the conversation renders as
/// a prefix of the whole.
const REWRITES: &str = "{% for m in messages %}{% if m.role == 'assistant' and not loop.last %}\
    {{ 'A: (earlier)\\n' }}{% else %}{{ m.role[0] | upper + ': ' + m.content + '\\n' }}{% endif %}{% endfor %}\
    {% if add_generation_prompt %}{{ 'A:' }}{% endif %}";

/// Words of the tests' conversations, with ids.
const WORDS: &[&str] = &[
    "[UNK]",
    "<|im_start|>",
    "<|im_end|>",
    "user",
    "assistant",
    "system",
    "a",
    "b",
    "c",
    "d",
    "e",
    "f",
    "user:",
    "assistant:",
    "system:",
    "U:",
    "A:",
    "(earlier)",
];

fn tokenizer(t: &TestDir) -> PathBuf {
    let vocab: Vec<(&str, u32)> = WORDS
        .iter()
        .enumerate()
        .map(|(i, w)| (*w, i as u32))
        .collect();
    word_level(t, "tok.json", &vocab, &["<|im_start|>", "<|im_end|>"])
}

fn id(word: &str) -> u32 {
    WORDS.iter().position(|w| *w == word).unwrap() as u32
}

fn ids(words: &str) -> Vec<u32> {
    words.split(' ').map(id).collect()
}

/// `prep tokenize --chat` with the tests' tokenizer and `template`.
fn chat(t: &TestDir, template: &str, rows: &str, out: &Path) -> std::process::Command {
    let tok = tokenizer(t);
    let template = t.write("template.jinja", template);
    // Written once: a file written again is another input (its time of
    // writing is part of a run's identity), and tests run the same rows
    // again to resume, merge or compare.
    let input = t.path("rows.jsonl");
    if std::fs::read(&input).ok().as_deref() != Some(rows.as_bytes()) {
        t.write("rows.jsonl", rows);
    }
    let mut cmd = tokenize_with(t, &tok, &[&input], out);
    cmd.arg("--chat").arg("--chat-template").arg(template);
    cmd
}

/// Every record's ids and mask.
fn masked_records(dir: &Path) -> Vec<(Vec<u32>, Vec<u8>)> {
    let ds = Dataset::open(dir).unwrap();
    (0..ds.len())
        .map(|i| {
            let mask = ds.loss_mask(i).unwrap().expect("a masked dataset").to_vec();
            (ds.record(i).unwrap().to_vec(), mask)
        })
        .collect()
}

const ROWS: &str = concat!(
    r#"{"messages": [{"role": "user", "content": "a b"}, {"role": "assistant", "content": "c d"}]}"#,
    "\n",
    r#"[{"role": "system", "content": "e"}, {"role": "user", "content": [{"type": "text", "text": "a "}, {"type": "text", "text": "b"}]}, {"role": "assistant", "content": "c"}, {"role": "user", "content": "d"}, {"role": "assistant", "content": "f"}]"#,
    "\n",
    r#"{"conversations": [{"from": "human", "value": "a"}, {"from": "gpt", "value": "b"}], "system": "e"}"#,
    "\n",
    r#"{"instruction": "a", "input": "b", "output": "c"}"#,
    "\n",
);

#[test]
fn masks_cover_assistant_turns_in_every_shape() {
    let t = TestDir::new();
    let out = t.path("out");
    ok(&mut chat(&t, CHATML, ROWS, &out));
    let got = masked_records(&out);
    let user = |w: &str| format!("<|im_start|> user {w} <|im_end|>");
    let system = |w: &str| format!("<|im_start|> system {w} <|im_end|>");
    let asst = |w: &str| format!("<|im_start|> assistant {w} <|im_end|>");
    // A turn's mask: the header not trained on, the reply and its end are.
    let mask_of = |turns: &[(&str, bool)]| -> Vec<u8> {
        turns
            .iter()
            .flat_map(|(words, trained)| {
                let n = words.split(' ').count();
                (0..n).map(move |k| u8::from(*trained && k >= 2))
            })
            .collect()
    };
    let want = [
        vec![(user("a b"), false), (asst("c d"), true)],
        vec![
            (system("e"), false),
            (user("a b"), false),
            (asst("c"), true),
            (user("d"), false),
            (asst("f"), true),
        ],
        vec![(system("e"), false), (user("a"), false), (asst("b"), true)],
        // Alpaca: instruction, a newline, input; the newline splits words.
        vec![(user("a b"), false), (asst("c"), true)],
    ];
    assert_eq!(got.len(), want.len());
    for (k, (turns, (got_ids, got_mask))) in want.iter().zip(&got).enumerate() {
        let words: Vec<&str> = turns.iter().map(|(w, _)| w.as_str()).collect();
        assert_eq!(got_ids, &ids(&words.join(" ")), "record {k}'s ids");
        let flags: Vec<(&str, bool)> = turns.iter().map(|(w, m)| (w.as_str(), *m)).collect();
        assert_eq!(got_mask, &mask_of(&flags), "record {k}'s mask");
    }
    let m = Manifest::read(&out).unwrap();
    assert_eq!(m.version, prep::format::MASKED_VERSION);
    let counts = m.provenance.chat.expect("chat counts");
    let trained: usize = got
        .iter()
        .map(|(_, m)| m.iter().filter(|&&b| b == 1).count())
        .sum();
    assert_eq!(counts.trainable_tokens, trained as u64);
    assert!(m.shards.iter().all(|s| s.mask.is_some()));
}

#[test]
fn last_and_all_policies() {
    let t = TestDir::new();
    let (last, all) = (t.path("last"), t.path("all"));
    ok(chat(&t, CHATML, ROWS, &last).args(["--loss-mask", "last"]));
    ok(chat(&t, CHATML, ROWS, &all).args(["--loss-mask", "all"]));
    let whole = masked_records(&all);
    assert!(whole.iter().all(|(_, m)| m.iter().all(|&b| b == 1)));
    // Row 1 has two assistant turns: only the second is trained on under `last`.
    let (ids1, mask1) = &masked_records(&last)[1];
    let trained: Vec<u32> = ids1
        .iter()
        .zip(mask1)
        .filter(|(_, &m)| m == 1)
        .map(|(&i, _)| i)
        .collect();
    assert_eq!(trained, ids("f <|im_end|>"));
}

#[test]
fn a_flipped_mask_byte_fails_validate() {
    let t = TestDir::new();
    let out = t.path("out");
    ok(&mut chat(&t, CHATML, ROWS, &out));
    ok(t.prep().arg("validate").arg(&out));
    let mask = out.join("shard-00000.mask");
    let mut bytes = std::fs::read(&mask).unwrap();
    bytes[0] ^= 1;
    std::fs::write(&mask, &bytes).unwrap();
    let report = run(t.prep().args(["validate", "--json"]).arg(&out));
    assert_eq!(report.status.code(), Some(1));
    let text = String::from_utf8_lossy(&report.stdout);
    assert!(
        text.contains("shard-00000.mask") && text.contains("checksum"),
        "{text}"
    );
    // A byte that is no mask value at all is named as such.
    bytes[0] = 7;
    std::fs::write(&mask, &bytes).unwrap();
    let text =
        String::from_utf8_lossy(&run(t.prep().args(["validate", "--json"]).arg(&out)).stdout)
            .into_owned();
    assert!(
        text.contains("loss_mask") && text.contains("is 7"),
        "{text}"
    );
}

/// A shuffle reads every mask through its checks: a flipped mask byte in
/// its input stops it (in memory and through bucket files), naming the
/// file, and leaves no dataset.
#[test]
fn a_flipped_mask_byte_stops_a_shuffle() {
    let t = TestDir::new();
    let docs = t.path("docs");
    // Enough documents that the smallest budget (64 KiB) does not hold them.
    ok(chat(&t, CHATML, &many_rows(600), &docs).args(["--shard-size", "4KiB"]));
    let shuffle = |out: &Path, extra: &[&str]| {
        let mut cmd = t.prep();
        cmd.args(["shuffle", "--seed", "7"])
            .arg(&docs)
            .arg(out)
            .args(extra);
        cmd
    };
    let through_buckets = ["--memory", "1KiB"];
    let clean = ok(&mut shuffle(&t.path("clean"), &through_buckets));
    let summary = String::from_utf8_lossy(&clean.stderr).into_owned();
    assert!(summary.contains("out of core through"), "{summary}");
    let mask = docs.join("shard-00001.mask");
    let mut bytes = std::fs::read(&mask).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 1;
    std::fs::write(&mask, &bytes).unwrap();
    for (name, extra) in [("mem", &[][..]), ("buckets", &through_buckets[..])] {
        let out = t.path(name);
        let e = fails(&mut shuffle(&out, extra), 2);
        assert!(
            e.contains("shard-00001.mask") && e.contains("damaged"),
            "{name}: {e}"
        );
        assert!(!out.join("manifest.json").exists(), "{name}");
    }
}

#[test]
fn exports_write_masks_beside_tokens_or_refuse_them() {
    let t = TestDir::new();
    let out = t.path("out");
    ok(&mut chat(&t, CHATML, ROWS, &out));
    let (ids, masks): (Vec<u32>, Vec<u8>) = masked_records(&out)
        .into_iter()
        .flat_map(|(i, m)| i.into_iter().zip(m))
        .unzip();
    let u16s = |bytes: Vec<u8>| -> Vec<u32> {
        bytes
            .chunks(2)
            .map(|c| u32::from(u16::from_le_bytes([c[0], c[1]])))
            .collect()
    };
    // nanoGPT and Megatron have no mask format: the mask goes beside the tokens.
    ok(t.prep()
        .args(["export", "--quiet", "--to", "nanogpt"])
        .arg(&out)
        .arg(t.path("nano/train.bin")));
    assert_eq!(u16s(std::fs::read(t.path("nano/train.bin")).unwrap()), ids);
    assert_eq!(std::fs::read(t.path("nano/train.mask")).unwrap(), masks);
    ok(t.prep()
        .args(["export", "--quiet", "--to", "megatron"])
        .arg(&out)
        .arg(t.path("mega/chat")));
    assert_eq!(u16s(std::fs::read(t.path("mega/chat.bin")).unwrap()), ids);
    assert_eq!(std::fs::read(t.path("mega/chat.mask")).unwrap(), masks);
    // llm.c and datatrove shards have no room for a mask either, and the
    // export refuses rather than drop it.
    for (to, dest) in [("llmc", "llmc"), ("datatrove", "dt/chat")] {
        let err = fails(
            t.prep()
                .args(["export", "--quiet", "--to", to])
                .arg(&out)
                .arg(t.path(dest)),
            2,
        );
        assert!(
            err.contains("loss masks") && err.contains("prep export"),
            "{err}"
        );
    }
    assert!(!t.path("llmc").exists() && !t.path("dt").exists());
    // A damaged mask stops the export, and leaves nothing behind.
    let mask = out.join("shard-00000.mask");
    let mut bytes = std::fs::read(&mask).unwrap();
    bytes[0] ^= 1;
    std::fs::write(&mask, &bytes).unwrap();
    let err = fails(
        t.prep()
            .args(["export", "--quiet", "--to", "nanogpt"])
            .arg(&out)
            .arg(t.path("bad/train.bin")),
        2,
    );
    assert!(
        err.contains("shard-00000.mask") && err.contains("XXH3"),
        "{err}"
    );
    assert!(!t.path("bad").exists());
}

#[test]
fn split_and_mix_keep_each_documents_mask() {
    let t = TestDir::new();
    let docs = t.path("docs");
    ok(chat(&t, CHATML, &many_rows(90), &docs).args(["--shard-size", "300B"]));
    let split = t.path("split");
    ok(t.prep()
        .args(["split", "--quiet", "--val", "0.3", "--seed", "5"])
        .arg(&docs)
        .arg(&split));
    let (train, val) = (
        masked_records(&split.join("train")),
        masked_records(&split.join("val")),
    );
    assert!(!train.is_empty() && !val.is_empty());
    let mut both: Vec<_> = train.into_iter().chain(val).collect();
    both.sort();
    assert_eq!(
        both,
        sorted_pairs(&docs),
        "every document on one side, with its mask"
    );

    let mix = t.path("mix");
    let other = t.path("other");
    ok(&mut chat(&t, CHATML, &many_rows(30), &other));
    ok(t.prep()
        .args(["mix", "--quiet", "--seed", "2", "--tokens", "1500"])
        .arg(&mix)
        .arg("--source")
        .arg(format!("{}:0.7", docs.display()))
        .arg("--source")
        .arg(format!("{}:0.3", other.display())));
    let sources: std::collections::HashSet<_> = masked_records(&docs)
        .into_iter()
        .chain(masked_records(&other))
        .collect();
    let mixed = masked_records(&mix);
    assert!(!mixed.is_empty());
    assert!(
        mixed.iter().all(|pair| sources.contains(pair)),
        "a mixed record lost its mask"
    );
    ok(t.prep().arg("validate").arg(&mix));

    // Sources that differ in having masks do not mix.
    let plain = t.path("plain");
    ok(&mut tokenize_with(
        &t,
        &tokenizer(&t),
        &[t.write("plain.jsonl", "{\"text\": \"a b\"}\n")],
        &plain,
    ));
    let err = fails(
        t.prep()
            .args(["mix", "--quiet", "--seed", "2", "--tokens", "10"])
            .arg(t.path("mixed-kinds"))
            .arg("--source")
            .arg(format!("{}:0.5", docs.display()))
            .arg("--source")
            .arg(format!("{}:0.5", plain.display())),
        2,
    );
    assert!(err.contains("loss masks"), "{err}");
}

#[test]
fn dedup_keeps_each_kept_documents_mask() {
    let t = TestDir::new();
    let docs = t.path("docs");
    ok(chat(&t, CHATML, &many_rows(90), &docs).args(["--shard-size", "300B"]));
    let out = t.path("dedup");
    // Short conversations: 2-token shingles, so that near copies are found.
    ok(t.prep()
        .args(["dedup", "--quiet", "--ngram", "2"])
        .arg(&docs)
        .arg(&out));
    let removed: std::collections::HashSet<u64> =
        std::fs::read_to_string(out.join("duplicates.jsonl"))
            .unwrap()
            .lines()
            .map(|l| {
                serde_json::from_str::<serde_json::Value>(l).unwrap()["doc"]
                    .as_u64()
                    .unwrap()
            })
            .collect();
    assert!(!removed.is_empty());
    let kept: Vec<_> = masked_records(&docs)
        .into_iter()
        .enumerate()
        .filter(|(i, _)| !removed.contains(&(*i as u64)))
        .map(|(_, pair)| pair)
        .collect();
    assert_eq!(
        masked_records(&out),
        kept,
        "every kept document, with its mask"
    );
    ok(t.prep().arg("validate").arg(&out));
}

/// The (ids, mask) pairs of `dir`, sorted: what a shuffle must keep.
fn sorted_pairs(dir: &Path) -> Vec<(Vec<u32>, Vec<u8>)> {
    let mut pairs = masked_records(dir);
    pairs.sort();
    pairs
}

#[test]
fn shuffles_keep_each_documents_mask() {
    let t = TestDir::new();
    let docs = t.path("docs");
    // Enough documents that the smallest budget (64 KiB) does not hold them.
    ok(chat(&t, CHATML, &many_rows(600), &docs).args(["--shard-size", "4KiB"]));
    let want = sorted_pairs(&docs);
    let shuffle = |out: &Path, extra: &[&str], how: &str| {
        let done = ok(t
            .prep()
            .args(["shuffle", "--seed", "7"])
            .arg(&docs)
            .arg(out)
            .args(extra));
        let summary = String::from_utf8_lossy(&done.stderr).into_owned();
        assert!(summary.contains(how), "{summary}");
        ok(t.prep().arg("validate").arg(out));
        masked_records(out)
    };
    let in_memory = shuffle(&t.path("mem"), &[], "in memory");
    // A budget far below the dataset: through bucket files.
    let buckets = shuffle(
        &t.path("buckets"),
        &["--memory", "1KiB"],
        "out of core through",
    );
    assert_eq!(in_memory, buckets);
    let mut sorted = in_memory.clone();
    sorted.sort();
    assert_eq!(sorted, want, "the same documents, each with its own mask");
    assert_ne!(
        in_memory,
        masked_records(&docs),
        "an order other than the input's"
    );

    // Scatter and gather on many machines: the buckets in order are the shuffle.
    let work = t.path("work");
    for i in 0..2 {
        ok(t.prep()
            .args([
                "shuffle",
                "--quiet",
                "--scatter",
                "--seed",
                "7",
                "--buckets",
                "2",
                "--part",
            ])
            .arg(format!("{i}/2"))
            .arg(&docs)
            .arg(&work));
    }
    let mut gathered = Vec::new();
    for j in 0..2 {
        let out = t.path(&format!("gathered-{j}"));
        ok(t.prep()
            .args(["shuffle", "--quiet", "--gather", "--bucket", &j.to_string()])
            .arg(&work)
            .arg(&out));
        gathered.extend(masked_records(&out));
    }
    assert_eq!(gathered, in_memory);

    // Tokenize and shuffle in one command: the same dataset.
    let fused = t.path("fused");
    ok(chat(&t, CHATML, &many_rows(600), &fused).args([
        "--shard-size",
        "4KiB",
        "--shuffle-seed",
        "7",
    ]));
    assert_eq!(masked_records(&fused), in_memory);
}

/// Rows of one or two assistant turns of varied lengths.
fn many_rows(n: usize) -> String {
    let words = ["a", "b", "c", "d", "e", "f"];
    (0..n)
        .map(|i| {
            let text = |k: usize| -> String {
                (0..1 + (i * 7 + k) % 9).map(|j| words[(i + j + k) % 6]).collect::<Vec<_>>().join(" ")
            };
            let mut turns = format!(
                r#"{{"role": "user", "content": "{}"}}, {{"role": "assistant", "content": "{}"}}"#,
                text(1),
                text(2)
            );
            if i % 3 == 0 {
                turns += &format!(
                    r#", {{"role": "user", "content": "{}"}}, {{"role": "assistant", "content": "{}"}}"#,
                    text(3),
                    text(4)
                );
            }
            format!("{{\"messages\": [{turns}]}}\n")
        })
        .collect()
}

#[test]
fn packed_rows_carry_their_pieces_masks() {
    let t = TestDir::new();
    let docs = t.path("docs");
    ok(chat(&t, CHATML, &many_rows(60), &docs).args(["--shard-size", "200B"]));
    let doc_masks = masked_records(&docs);
    for mode in ["bestfit", "concat"] {
        let packed = t.path(mode);
        ok(t.prep()
            .args([
                "pack",
                "--seq-len",
                "16",
                "--pad",
                "0",
                "--no-sep",
                "--quiet",
                "--mode",
                mode,
            ])
            .args(["--shard-size", "100B"])
            .arg(&docs)
            .arg(&packed));
        ok(t.prep().arg("validate").arg(&packed));
        let ds = Dataset::open(&packed).unwrap();
        assert_eq!(ds.manifest().version, prep::format::MASKED_VERSION);
        let mut trained = 0;
        for r in 0..ds.len() {
            let row = ds.record(r).unwrap().to_vec();
            let mask = ds.loss_mask(r).unwrap().expect("a masked row").to_vec();
            let mut want = vec![0u8; row.len()];
            for seg in ds.segments(r).unwrap() {
                let (ids, m) = &doc_masks[seg.doc as usize];
                let (from, start, n) = (
                    seg.doc_offset as usize,
                    seg.start as usize,
                    seg.length as usize,
                );
                assert_eq!(row[start..start + n], ids[from..from + n], "{mode} row {r}");
                want[start..start + n].copy_from_slice(&m[from..from + n]);
            }
            assert_eq!(
                mask, want,
                "{mode} row {r}: the pieces' masks, 0 on padding"
            );
            trained += mask.iter().filter(|&&b| b == 1).count();
        }
        let all: usize = doc_masks
            .iter()
            .map(|(_, m)| m.iter().filter(|&&b| b == 1).count())
            .sum();
        if mode == "bestfit" {
            assert_eq!(trained, all, "bestfit keeps every token");
        }
        same_through_both_storages(&packed);
    }
    same_through_both_storages(&docs);
}

/// The one dataset type reads the same records, masks and pieces whether
/// its files are mapped whole or read by range.
fn same_through_both_storages(dir: &Path) {
    use prep::format::Files;
    let mapped = Dataset::open(dir).unwrap();
    let ranged = Dataset::open_in(Files::new(dir).unwrap()).unwrap();
    assert_eq!(mapped.len(), ranged.len());
    let mut lengths = Vec::new();
    ranged.for_each_length(|n| lengths.push(n)).unwrap();
    assert_eq!(lengths, mapped.record_lengths().collect::<Vec<_>>());
    for r in 0..mapped.len() {
        assert_eq!(
            ranged.record_ids(r).unwrap(),
            mapped.record(r).unwrap().to_vec()
        );
        assert_eq!(
            *ranged.record_bytes(r).unwrap(),
            *mapped.record_bytes(r).unwrap()
        );
        assert_eq!(ranged.record_len(r).unwrap(), mapped.record_len(r).unwrap());
        assert_eq!(
            ranged.loss_mask(r).unwrap().as_deref(),
            mapped.loss_mask(r).unwrap()
        );
        match (mapped.segments(r), ranged.segments(r)) {
            (Ok(a), Ok(b)) => assert_eq!(a, &b[..], "row {r}"),
            (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string()),
            (a, b) => panic!("row {r}: {a:?} but {b:?}"),
        }
    }
}

#[test]
fn bad_rows_are_named_or_skipped_and_counted() {
    let t = TestDir::new();
    let rows = concat!(
        r#"{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}"#,
        "\n",
        r#"{"messages": [{"role": "wizard", "content": "a"}]}"#,
        "\n",
        r#"{"text": "not a conversation"}"#,
        "\n",
        r#"{"messages": [{"role": "system", "content": "e"}, {"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}"#,
        "\n",
        r#"{"messages": [{"role": "user", "content": "a"}]}"#,
        "\n",
    );
    let out = t.path("out");
    let err = fails(&mut chat(&t, NO_SYSTEM, rows, &out), 2);
    assert!(
        err.contains("rows.jsonl: line 2") && err.contains("unknown role \"wizard\""),
        "{err}"
    );
    assert!(!out.join("manifest.json").exists());
    ok(chat(&t, NO_SYSTEM, rows, &out).args(["--skip-bad", "--overwrite"]));
    let m = Manifest::read(&out).unwrap();
    let c = m.provenance.chat.unwrap();
    assert_eq!((c.malformed, c.refused, c.no_trainable_token), (2, 1, 1));
    assert_eq!(
        (m.provenance.documents.read, m.provenance.documents.written),
        (5, 1)
    );
    assert_eq!(m.provenance.documents.skipped, 3);

    // A template that rewrites earlier turns cannot have its masks verified.
    let two_turns = concat!(
        r#"{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}, {"role": "assistant", "content": "d"}]}"#,
        "\n"
    );
    let err = fails(&mut chat(&t, REWRITES, two_turns, &t.path("rw")), 2);
    assert!(
        err.contains("line 1") && err.contains("cannot be verified"),
        "{err}"
    );
}

#[test]
fn over_long_conversations_are_dropped_or_truncated() {
    let t = TestDir::new();
    let (dropped, cut) = (t.path("dropped"), t.path("cut"));
    // Only record 1 (21 tokens) is over 14; cut there, its first
    // assistant turn is kept whole.
    ok(chat(&t, CHATML, ROWS, &dropped).args(["--max-tokens", "14"]));
    ok(chat(&t, CHATML, ROWS, &cut).args(["--max-tokens", "14", "--overlong", "truncate"]));
    let d = Manifest::read(&dropped).unwrap();
    let c = Manifest::read(&cut).unwrap();
    assert_eq!(d.provenance.chat.unwrap().too_long, 1);
    assert_eq!(d.n_records, 3);
    assert_eq!(c.provenance.chat.unwrap().truncated, 1);
    assert_eq!(c.n_records, 4);
    let full = masked_records(&{
        let all = t.path("full");
        ok(&mut chat(&t, CHATML, ROWS, &all));
        all
    });
    for ((ids, mask), (full_ids, full_mask)) in masked_records(&cut).iter().zip(&full) {
        assert!(ids.len() <= 14);
        assert_eq!(ids[..], full_ids[..ids.len()]);
        assert_eq!(mask[..], full_mask[..ids.len()]);
    }
}

#[test]
fn parts_merge_into_the_one_run_with_masks() {
    // Many duplicates (3 distinct rows), so --dedup drops across parts, and
    // --max-tokens 7 truncates every conversation.
    parts_merge_with(&[]);
    parts_merge_with(&["--dedup", "--max-tokens", "7", "--overlong", "truncate"]);
}

fn parts_merge_with(flags: &[&str]) {
    let t = TestDir::new();
    let rows: String = (0..40).map(|i| {
        let reply = ["a b", "c", "d e f"][i % 3];
        format!("{{\"messages\": [{{\"role\": \"user\", \"content\": \"a\"}}, {{\"role\": \"assistant\", \"content\": \"{reply}\"}}]}}\n")
    }).collect();
    let one = t.path("one");
    ok(chat(&t, CHATML, &rows, &one)
        .args(["--shard-size", "64B"])
        .args(flags));
    let run_dir = t.path("run");
    for i in 0..3 {
        ok(chat(&t, CHATML, &rows, &run_dir.join(format!("part-{i}")))
            .args(["--shard-size", "64B", "--part", &format!("{i}/3")])
            .args(flags));
    }
    let mut cmd = t.prep();
    cmd.args(["merge", "--quiet"]);
    for i in 0..3 {
        cmd.arg(run_dir.join(format!("part-{i}")));
    }
    ok(cmd.arg(&run_dir));
    assert_eq!(masked_records(&run_dir), masked_records(&one));
    let (a, b) = (
        Manifest::read(&run_dir).unwrap(),
        Manifest::read(&one).unwrap(),
    );
    assert_eq!(a.provenance.chat, b.provenance.chat, "{flags:?}");
    assert_eq!(a.provenance.documents, b.provenance.documents, "{flags:?}");
    if flags.contains(&"--dedup") {
        assert!(a.provenance.documents.deduplicated > 0);
        assert!(a.provenance.chat.unwrap().truncated > 0);
    }
    assert_eq!(a.version, b.version);
    ok(t.prep().arg("validate").arg(&run_dir));
}

#[test]
fn inspect_prints_the_mask_beside_the_ids() {
    let t = TestDir::new();
    let out = t.path("out");
    ok(&mut chat(&t, CHATML, ROWS, &out));
    let json = ok(t
        .prep()
        .args(["inspect", "--json", "--record", "0"])
        .arg(&out))
    .stdout;
    let v: serde_json::Value = serde_json::from_slice(&json).unwrap();
    let (want_ids, want_mask) = &masked_records(&out)[0];
    let ids: Vec<u32> = serde_json::from_value(v["record"]["ids"].clone()).unwrap();
    let mask: Vec<u8> = serde_json::from_value(v["record"]["loss_mask"].clone()).unwrap();
    assert_eq!((&ids, &mask), (want_ids, want_mask));
}

#[test]
fn olmo_core_parts_cut_records_and_list_both_pieces() {
    let t = TestDir::new();
    let docs = t.path("docs");
    ok(chat(&t, CHATML, &many_rows(20), &docs).args(["--shard-size", "200B"]));
    let ds = Dataset::open(&docs).unwrap();
    let out = t.path("olmo");
    let config = prep::interop::ExportConfig::new(&docs, prep::interop::Format::OlmoCore, &out);
    let part = 37u64;
    prep::interop::olmocore::export_in_parts(&ds, &config, part).unwrap();
    let (ids, masks): (Vec<u32>, Vec<u8>) = masked_records(&docs)
        .into_iter()
        .flat_map(|(i, m)| i.into_iter().zip(m))
        .unzip();
    let n_parts = ids.len().div_ceil(part as usize);
    let mut got_ids = Vec::new();
    let mut got_masks = Vec::new();
    let mut pieces = Vec::new();
    for p in 0..n_parts {
        let bytes = std::fs::read(out.join(format!("token_ids_part_{p:04}.npy"))).unwrap();
        got_ids.extend(
            bytes
                .chunks(2)
                .map(|c| u32::from(u16::from_le_bytes([c[0], c[1]]))),
        );
        got_masks.extend(std::fs::read(out.join(format!("labels_mask_part_{p:04}.npy"))).unwrap());
        let gz = std::fs::read(out.join(format!("token_ids_part_{p:04}.csv.gz"))).unwrap();
        let mut text = String::new();
        std::io::Read::read_to_string(&mut flate2::read::GzDecoder::new(&gz[..]), &mut text)
            .unwrap();
        for line in text.lines() {
            let (a, b) = line.split_once(',').unwrap();
            let base = p as u64 * part;
            pieces.push((
                base + a.parse::<u64>().unwrap(),
                base + b.parse::<u64>().unwrap(),
            ));
        }
    }
    assert!(!out
        .join(format!("token_ids_part_{n_parts:04}.npy"))
        .exists());
    assert_eq!((got_ids, got_masks), (ids, masks));
    // The records' spans, each cut where a part ends.
    let mut want = Vec::new();
    let mut at = 0u64;
    for r in 0..ds.len() {
        let end = at + ds.record_len(r).unwrap();
        let mut a = at;
        while a < end {
            let b = end.min((a / part + 1) * part);
            want.push((a, b));
            a = b;
        }
        at = end;
    }
    assert_eq!(pieces, want);
}

/// GPT-2 with ChatML's control tokens and an NFC normalizer; `<|im_end|>`
/// takes the whitespace before it (`lstrip`), as some real tokenizers'
/// control tokens do.
fn gpt2_chatml(t: &TestDir) -> PathBuf {
    let json = crate::common::engine::read_zst(&fixture("tokenizers/gpt2.tokenizer.json.zst"));
    let mut j: serde_json::Value = serde_json::from_slice(&json).unwrap();
    j["normalizer"] = serde_json::json!({"type": "NFC"});
    let added = j["added_tokens"].as_array_mut().unwrap();
    for (id, content, lstrip) in [(50257, "<|im_start|>", false), (50258, "<|im_end|>", true)] {
        added.push(
            serde_json::json!({"id": id, "content": content, "single_word": false,
            "lstrip": lstrip, "rstrip": false, "normalized": false, "special": true}),
        );
    }
    t.write("gpt2-chatml.json", serde_json::to_string(&j).unwrap())
}

/// On a byte-level tokenizer chat mode runs the fast engine: the same
/// tokens and masks as HF tokenizers' offsets give, for conversations the
/// engine places itself (an `<|im_end|>` that took the whitespace before
/// it among them) and for those it hands to HF (text the normalizer
/// changed: a decomposed `é`), which the manifest counts.
#[test]
fn the_fast_engine_masks_as_hf_offsets_do() {
    let t = TestDir::new();
    let tok = gpt2_chatml(&t);
    let template = t.write("template.jinja", CHATML);
    let turn = |user: &str, reply: &str| {
        serde_json::json!({"messages": [{"role": "user", "content": user},
            {"role": "assistant", "content": reply}]})
        .to_string()
    };
    let rows = [
        turn("hello there", "general kenobi"),
        turn("  spaces  around ", "a reply ending in spaces   "),
        turn("naïve 中文 🎉", "ça va\n\n- list\n- items\t"),
        turn("x", " leading space"),
        turn("tabs\tand\r\nbreaks", "¿qué?  "),
        turn("cafe\u{301}", "ok"),
        turn("x", "re\u{301}sume\u{301}  "),
    ]
    .join("\n");
    let input = t.write("rows.jsonl", &rows);
    let run = |engine: &str, out: &Path| {
        let mut cmd = tokenize_with(&t, &tok, &[&input], out);
        cmd.args(["--chat", "--engine", engine])
            .arg("--chat-template")
            .arg(&template);
        ok(&mut cmd);
        Manifest::read(out).unwrap()
    };
    let (fast, hf) = (t.path("fast"), t.path("hf"));
    let m_fast = run("fast", &fast);
    let m_hf = run("hf", &hf);
    assert_eq!(m_fast.provenance.options["engine"], "fast");
    assert_eq!(m_hf.provenance.options["engine"], "hf");
    assert_eq!(masked_records(&fast), masked_records(&hf));
    let placed = |m: &Manifest| m.provenance.chat.unwrap().placed_by_hf;
    assert_eq!(
        placed(&m_fast),
        2,
        "the conversations the normalizer changed"
    );
    assert_eq!(placed(&m_hf), 0, "counted in fast runs only");
}

/// `--dedup` in chat mode compares conversations as rendered: rows that
/// differ only in what the template does not render (an id, key order) are
/// one. A run stopped part way and resumed drops exactly what an
/// uninterrupted run drops: the resumed run renders and tokenizes the rows
/// the first one wrote, to know which were written and their hashes.
#[test]
fn dedup_compares_renderings_and_resumes_exactly() {
    let t = TestDir::new();
    let words = ["a", "b", "c", "d", "e", "f"];
    let mut rows = String::new();
    for i in 0..400 {
        if i == 300 {
            rows.push_str("{\"messages\": oops}\n");
            continue;
        }
        let (u, r) = (words[i % 6], words[(i / 6) % 4]);
        let row = if i % 7 == 0 {
            // No assistant turn: nothing trained, never written.
            serde_json::json!({"id": i, "messages": [{"role": "user", "content": u}]})
        } else if i % 2 == 0 {
            serde_json::json!({"id": i, "messages": [{"role": "user", "content": u},
                {"role": "assistant", "content": r}]})
        } else {
            serde_json::json!({"messages": [{"content": u, "role": "user"},
                {"content": r, "role": "assistant"}], "source": format!("row {i}")})
        };
        rows.push_str(&format!("{row}\n"));
    }
    let flags = ["--dedup", "--shard-size", "64B", "--threads", "2"];
    let out = t.path("resumed");
    let mut first = chat(&t, CHATML, &rows, &out);
    let err = String::from_utf8_lossy(&first.args(flags).output().unwrap().stderr).into_owned();
    assert!(err.contains("line 301"), "{err}");
    assert!(
        out.join(".prep-journal.json").exists(),
        "shards kept for a resume"
    );
    ok(chat(&t, CHATML, &rows, &out).args(flags).arg("--skip-bad"));
    let fresh = t.path("fresh");
    ok(chat(&t, CHATML, &rows, &fresh)
        .args(flags)
        .arg("--skip-bad"));
    assert_eq!(masked_records(&out), masked_records(&fresh));
    let (a, b) = (
        Manifest::read(&out).unwrap(),
        Manifest::read(&fresh).unwrap(),
    );
    assert_eq!(a.provenance.documents, b.provenance.documents);
    assert_eq!(a.provenance.chat, b.provenance.chat);
    // 6 user words by 4 replies: at most 24 conversations, each once.
    let written = masked_records(&fresh);
    let distinct: std::collections::HashSet<_> = written.iter().collect();
    assert_eq!(distinct.len(), written.len(), "no conversation twice");
    assert_eq!(written.len(), 24);
    assert!(b.provenance.documents.deduplicated > 300);
}

/// An assistant turn with `"weight": 0` is not trained on, under both kinds
/// of template; a weight other than 0 or 1 is a bad row naming the message.
#[test]
fn weight_zero_turns_are_not_trained() {
    let t = TestDir::new();
    // The same replies marked by {% generation %} blocks instead of prefixes.
    let generation = "{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' }}{% if m.role == 'assistant' %}\
        {% generation %}{{ m.content + '<|im_end|>' }}{% endgeneration %}{% else %}{{ m.content + '<|im_end|>' }}\
        {% endif %}{{ '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
    let conv = |w1: &str, w2: &str| {
        format!(
            r#"{{"messages": [{{"role": "user", "content": "a"}}, {{"role": "assistant", "content": "b c"{w1}}}, {{"role": "user", "content": "d"}}, {{"role": "assistant", "content": "e f"{w2}}}]}}"#
        )
    };
    let sharegpt = r#"{"conversations": [{"from": "human", "value": "a"}, {"from": "gpt", "value": "b c", "weight": 0}, {"from": "human", "value": "d"}, {"from": "gpt", "value": "e f"}]}"#;
    let rows = [
        conv("", ""),
        conv(r#", "weight": 0"#, ""),
        conv(r#", "weight": 1"#, r#", "weight": 0.0"#),
        sharegpt.to_owned(),
    ]
    .join("\n")
        + "\n";
    for template in [CHATML, generation] {
        let out = t.path("out");
        ok(chat(&t, template, &rows, &out).arg("--overwrite"));
        let records = masked_records(&out);
        let trained = |r: usize| -> Vec<u32> {
            let (ids, mask) = &records[r];
            ids.iter()
                .zip(mask)
                .filter(|(_, &m)| m == 1)
                .map(|(&i, _)| i)
                .collect()
        };
        let (first, second) = (ids("b c <|im_end|>"), ids("e f <|im_end|>"));
        assert_eq!(trained(0), [first.clone(), second.clone()].concat());
        assert_eq!(trained(1), second, "the first reply has weight 0");
        assert_eq!(trained(2), first, "the second reply has weight 0.0");
        assert_eq!(trained(3), second, "a ShareGPT turn's weight");
    }
    let bad = conv(r#", "weight": 0.5"#, "") + "\n";
    let err = fails(&mut chat(&t, CHATML, &bad, &t.path("bad")), 2);
    assert!(
        err.contains("line 1") && err.contains("message 1: weight is 0.5"),
        "{err}"
    );
}

/// The real instruction-tuning files that are one JSON array (Alpaca,
/// ShareGPT with tool calls, preference pairs: LLaMA-Factory's `.json`
/// files, in fixtures/chat/corpus/data, compressed as shipped) are read as
/// they are: the same tokens, masks and counts as the JSON Lines of the
/// same rows.
#[test]
fn real_json_array_datasets_read_as_their_json_lines() {
    let dir = fixture("chat/corpus/data");
    let t = TestDir::new();
    let tok = gpt2_chatml(&t);
    let template = t.write("template.jinja", CHATML);
    let run = |input: &Path, out: &Path| {
        let mut cmd = tokenize_with(&t, &tok, &[input], out);
        cmd.args(["--chat", "--skip-bad"])
            .arg("--chat-template")
            .arg(&template);
        ok(&mut cmd);
        Manifest::read(out).unwrap()
    };
    let mut seen = 0;
    for name in ["alpaca_en_demo", "glaive_toolcall_en_demo", "dpo_en_demo"] {
        let array = dir.join(format!("{name}.json.zst"));
        let rows: Vec<serde_json::Value> = serde_json::from_slice(
            &zstd::decode_all(std::fs::File::open(&array).unwrap()).unwrap(),
        )
        .unwrap();
        let lines: String = rows.iter().map(|r| format!("{r}\n")).collect();
        let jsonl = t.write(&format!("{name}.jsonl"), lines);
        let (a, b) = (
            t.path(&format!("{name}-array")),
            t.path(&format!("{name}-lines")),
        );
        let (ma, mb) = (run(&array, &a), run(&jsonl, &b));
        assert_eq!(masked_records(&a), masked_records(&b), "{name}");
        assert_eq!(ma.provenance.documents, mb.provenance.documents, "{name}");
        assert_eq!(ma.provenance.documents.read, rows.len() as u64, "{name}");
        seen += ma.n_records;
    }
    assert!(seen > 1000, "the three files give conversations: {seen}");
}

/// A Phi-3-style template: each turn is a role token, a newline, the text
/// and `<|end|>`; the whole ends with the eos.
const PHI3_LIKE: &str =
    "{% for m in messages %}{{ '<|' + m.role + '|>\\n' + m.content + '<|end|>\\n' }}{% endfor %}\
    {% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% else %}{{ eos_token }}{% endif %}";

/// `base` (a tokenizer.json) with Phi-3's role tokens added, each taking
/// the whitespace after it (`rstrip`), as Phi-3's own do; `<|end|>` too.
fn with_rstrip_role_tokens(t: &TestDir, base: &[u8], name: &str) -> PathBuf {
    let mut j: serde_json::Value = serde_json::from_slice(base).unwrap();
    let next = j["model"]["vocab"].as_object().unwrap().len() as u64;
    let added = j["added_tokens"].as_array_mut().unwrap();
    let next = next.max(
        added
            .iter()
            .map(|a| a["id"].as_u64().unwrap() + 1)
            .max()
            .unwrap_or(0),
    );
    for (k, content) in ["<|user|>", "<|assistant|>", "<|end|>"].iter().enumerate() {
        added.push(
            serde_json::json!({"id": next + k as u64, "content": content, "single_word": false,
            "lstrip": false, "rstrip": true, "normalized": false, "special": true}),
        );
    }
    t.write(name, serde_json::to_string(&j).unwrap())
}

/// Issue 51: a reply that begins with whitespace, after a header token that
/// takes the whitespace after it (Phi-3's `<|assistant|>`, `rstrip`): the
/// header's offsets reach into the reply's first characters, but it begins
/// in the prompt and is never trained; the reply's first token is. The
/// same on the fast engine and on HF tokenizers.
#[test]
fn a_header_that_strips_the_replys_leading_whitespace_is_never_trained() {
    let t = TestDir::new();
    let words: Vec<(&str, u32)> = WORDS
        .iter()
        .chain(&["</s>"])
        .enumerate()
        .map(|(i, w)| (*w, i as u32))
        .collect();
    let plain = word_level(&t, "plain.json", &words, &[]);
    let word_tok = with_rstrip_role_tokens(&t, &std::fs::read(&plain).unwrap(), "words.json");
    let gpt2 = crate::common::engine::read_zst(&fixture("tokenizers/gpt2.tokenizer.json.zst"));
    let gpt2_tok = with_rstrip_role_tokens(&t, &gpt2, "gpt2-phi3.json");
    let template = t.write("phi3.jinja", PHI3_LIKE);
    let leads = ["", " ", "  ", "\n", "\n\n", "\t", " \n\t"];
    let rows: String = leads
        .iter()
        .map(|lead| {
            let row = serde_json::json!({"messages": [
                {"role": "user", "content": "a b"}, {"role": "assistant", "content": format!("{lead}c d")},
                {"role": "user", "content": "e"}, {"role": "assistant", "content": format!("{lead}f")}]});
            format!("{row}\n")
        })
        .collect();
    let input = t.write("rows.jsonl", &rows);
    let run = |tok: &Path, engine: &str, out: &Path| {
        let mut cmd = tokenize_with(&t, tok, &[&input], out);
        cmd.args(["--chat", "--engine", engine, "--chat-var", "eos_token=</s>"])
            .arg("--chat-template")
            .arg(&template);
        ok(&mut cmd);
        masked_records(out)
    };
    let header = |tok: &Path| -> u32 {
        let j: serde_json::Value = serde_json::from_slice(&std::fs::read(tok).unwrap()).unwrap();
        let added = j["added_tokens"].as_array().unwrap();
        let a = added
            .iter()
            .find(|a| a["content"] == "<|assistant|>")
            .unwrap();
        a["id"].as_u64().unwrap() as u32
    };
    // Word-level: the exact mask, every row alike whatever its leading whitespace.
    let records = run(&word_tok, "hf", &t.path("words"));
    let [user, asst, end] = [0, 1, 2].map(|k| header(&word_tok) - 1 + k);
    let want_ids = [
        vec![user, id("a"), id("b"), end],
        vec![asst, id("c"), id("d"), end],
        vec![user, id("e"), end],
        vec![asst, id("f"), end, words.len() as u32 - 1],
    ]
    .concat();
    // The last reply's span runs to the end: the eos that closes only the
    // last turn is trained with it.
    let want_mask = vec![0, 0, 0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1];
    assert_eq!(records.len(), leads.len());
    for ((ids, mask), lead) in records.iter().zip(leads) {
        assert_eq!(ids, &want_ids, "{lead:?}");
        assert_eq!(
            mask, &want_mask,
            "{lead:?}: the header is prompt, the reply is trained"
        );
    }
    // Byte-level BPE: both engines, the header never trained, the token
    // after it (the reply's first) always.
    let fast = run(&gpt2_tok, "fast", &t.path("fast"));
    assert_eq!(fast, run(&gpt2_tok, "hf", &t.path("hf")));
    let asst = header(&gpt2_tok);
    for ((ids, mask), lead) in fast.iter().zip(leads) {
        let at: Vec<usize> = (0..ids.len()).filter(|&k| ids[k] == asst).collect();
        assert_eq!(at.len(), 2, "{lead:?}");
        for k in at {
            assert_eq!((mask[k], mask[k + 1]), (0, 1), "{lead:?}: token {k}");
        }
    }
}

/// Issue 51: `--tokenizer MODEL_DIR` with no `--chat-template` takes the
/// template and the special tokens from the model folder itself (a
/// `save_pretrained` folder, a hub cache snapshot, a hub cache model
/// folder), not from the folder above it.
#[test]
fn a_model_folder_given_as_tokenizer_holds_the_template() {
    let t = TestDir::new();
    let words: Vec<(&str, u32)> = WORDS
        .iter()
        .chain(&["<s>"])
        .enumerate()
        .map(|(i, w)| (*w, i as u32))
        .collect();
    let tok = word_level(
        &t,
        "tok.json",
        &words,
        &["<|im_start|>", "<|im_end|>", "<s>"],
    );
    let template = format!("{{{{ bos_token }}}}{CHATML}");
    let config = serde_json::json!({"bos_token": "<s>", "eos_token": "<|im_end|>"}).to_string();
    let saved = t.path("saved");
    let snapshot = t.path("hub/models--org--name/snapshots/abc123");
    for dir in [&saved, &snapshot] {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::copy(&tok, dir.join("tokenizer.json")).unwrap();
        std::fs::write(dir.join("chat_template.jinja"), &template).unwrap();
        std::fs::write(dir.join("tokenizer_config.json"), &config).unwrap();
    }
    t.write("hub/models--org--name/refs/main", "abc123");
    let input = t.write("rows.jsonl", ROWS);
    let want = {
        let out = t.path("given");
        let mut cmd = tokenize_with(&t, &tok, &[&input], &out);
        cmd.args(["--chat", "--chat-var", "bos_token=<s>", "--chat-template"])
            .arg(t.write("t.jinja", &template));
        ok(&mut cmd);
        masked_records(&out)
    };
    assert!(want.iter().all(|(ids, _)| ids[0] == id_of(&words, "<s>")));
    for (k, model) in [saved, snapshot, t.path("hub/models--org--name")]
        .iter()
        .enumerate()
    {
        let out = t.path(&format!("out-{k}"));
        ok(tokenize_with(&t, model, &[&input], &out).arg("--chat"));
        assert_eq!(masked_records(&out), want, "{}", model.display());
        let m = Manifest::read(&out).unwrap();
        let source = m.provenance.options["chat"]["template"]
            .as_str()
            .unwrap()
            .to_owned();
        assert!(source.ends_with("chat_template.jinja"), "{source}");
    }
}

fn id_of(words: &[(&str, u32)], word: &str) -> u32 {
    words.iter().find(|(w, _)| *w == word).unwrap().1
}

/// Issue 51: a template that writes `bos_token` or `eos_token` when nothing
/// gives it is refused before any work, naming the variable and the ways to
/// give it, instead of rendering every conversation without it.
#[test]
fn a_template_whose_bos_or_eos_nothing_gives_is_refused() {
    let t = TestDir::new();
    let input = t.write("rows.jsonl", ROWS);
    let tok = tokenizer(&t);
    let dir = t.path("bare");
    std::fs::create_dir_all(&dir).unwrap();
    let cases = [
        ("bos", format!("{{{{ bos_token }}}}{CHATML}")),
        (
            "eos",
            format!("{CHATML}{{% if not add_generation_prompt %}}{{{{ eos_token }}}}{{% endif %}}"),
        ),
    ];
    for (what, template) in &cases {
        let name = format!("{what}_token");
        let template = t.write(&format!("bare/{what}.jinja"), template);
        let out = t.path(&format!("out-{what}"));
        let mut cmd = tokenize_with(&t, &tok, &[&input], &out);
        cmd.arg("--chat").arg("--chat-template").arg(&template);
        let err = fails(&mut cmd, 2);
        for needed in [
            format!("{}", template.display()),
            format!("`{name}`"),
            "tokenizer_config.json".into(),
            format!("--chat-var {name}="),
        ] {
            assert!(err.contains(&needed), "{what}: no {needed:?} in {err}");
        }
        assert!(!out.exists(), "{what}: refused before any work");
        // Given by --chat-var: rendered.
        let mut cmd = tokenize_with(&t, &tok, &[&input], &out);
        cmd.args(["--chat", "--chat-var", &format!("{name}=a")])
            .arg("--chat-template")
            .arg(&template);
        ok(&mut cmd);
    }
    // A tokenizer_config.json beside the template gives them; one that says
    // the model has none (null, as Qwen's bos_token) is taken at its word.
    t.write(
        "bare/tokenizer_config.json",
        r#"{"bos_token": null, "eos_token": "b"}"#,
    );
    for (what, _) in &cases {
        let out = t.path(&format!("beside-{what}"));
        let mut cmd = tokenize_with(&t, &tok, &[&input], &out);
        cmd.arg("--chat")
            .arg("--chat-template")
            .arg(dir.join(format!("{what}.jinja")));
        ok(&mut cmd);
        let records = masked_records(&out);
        let (first, _) = &records[0];
        match *what {
            "bos" => assert_eq!(first[0], id("<|im_start|>"), "no bos: the model has none"),
            _ => assert_eq!(*first.last().unwrap(), id("b"), "the config's eos"),
        }
    }
}

/// Issue 51: a row the template fails on because a message's content is
/// null or missing names the line, the message and the field, not only the
/// template's own words; a missing role likewise.
#[test]
fn a_null_or_missing_field_is_named_by_message_and_field() {
    let t = TestDir::new();
    let good = r#"{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}"#;
    let cases = [
        (
            r#"{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": null}]}"#,
            r#"message 1: field "content" is null"#,
        ),
        (
            r#"{"messages": [{"role": "user", "content": "a"}, {"role": "assistant"}]}"#,
            r#"message 1: no field "content""#,
        ),
        (
            r#"{"messages": [{"role": "user", "content": "a"}, {"content": "b"}]}"#,
            r#"message 1: no field "role""#,
        ),
        (
            r#"[{"role": "user", "content": "a", "name": null}, {"role": "assistant", "content": "b"}, {"role": "user", "content": null}]"#,
            r#"message 2: field "content" is null"#,
        ),
    ];
    for (k, (row, said)) in cases.iter().enumerate() {
        let rows = format!("{good}\n{good}\n{row}\n");
        let out = t.path(&format!("out-{k}"));
        let err = fails(&mut chat(&t, CHATML, &rows, &out), 2);
        assert!(
            err.contains("rows.jsonl: line 3: ") && err.contains(said),
            "{said}: {err}"
        );
    }
    // A null content the template does not read is no error: an assistant
    // turn of tool calls only, as OpenAI writes it.
    let tolerant =
        "{% for m in messages %}{{ m.role + ': ' + (m.content or 'a') + '\\n' }}{% endfor %}";
    let row = r#"{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": null, "tool_calls": []}, {"role": "assistant", "content": "b"}]}"#;
    ok(&mut chat(
        &t,
        tolerant,
        &format!("{row}\n"),
        &t.path("tolerant"),
    ));
}
