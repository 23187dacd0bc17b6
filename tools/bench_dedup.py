#!/usr/bin/env python3
"""prep dedup beside datatrove's MinHash pipeline and rensa, against ground truth.

`make bench-dedup` runs it (venv target/venv-dedup from tools/requirements-dedup.txt).

What it does, in order:

1. **A planted corpus.** Real documents of debian-docs.jsonl.zst (PREP_EXTERNAL_DATA, tools/corpora.py)
   (100 to 10,000 words each), a known share of which get near-duplicate copies
   with edits of known size: exact copies, a replaced header line, swapped
   paragraphs, random words inserted, sentences from other documents inserted,
   a span deleted, words substituted, and mixes of these, at edit rates drawn
   so that the true Jaccard of a copy to its source spans about 0.3 to 1.0.
   Some sources get 2 to 4 copies, some made from the previous copy (chains),
   so that clusters and transitivity are exercised too. The documents are
   shuffled with a fixed seed and written as two JSONL files. Past the size of
   the real corpus (--size 1GB, 3GB) documents are repeated with every word
   mapped through a permutation of the vocabulary (within blocks of 64 ranks
   of frequency, so that word frequencies stay Zipf-like) that is new for each
   repetition: real lines and lengths, unrelated shingles.

2. **The same shingles for all three tools.** datatrove's MinhashDedupSignature
   (datatrove 0.10.1, minhash.py) hashes word 5-grams of
   `simplify_text(text)` (datatrove/utils/text.py: lowercase; runs of
   `\\p{Nd}` digits, with one decimal separator, become "0"; the characters of
   its PUNCTUATION string become spaces; whitespace runs become one space;
   NFD, then the combining marks of category Mn dropped) split into words by
   the word tokenizer of its default language, English: spaCy's blank "en"
   tokenizer (SpaCyTokenizer), whose prefix, suffix and infix rules and
   special cases still split some of the simplified words ("cannot" -> "can
   not", "id" -> "i d", "0km" -> "0 km", "©" off its word).
   `words_tokenizer()` builds a HF tokenizer.json (WordLevel) whose normalizer
   is the same simplification (Lowercase; Replace of the same number regex by
   "0"; Replace of the same characters by " "; NFD; Replace of \\p{Mn} by "")
   and whose pre-tokenizer is WhitespaceSplit then one Split, taken from spaCy's
   own tables at run time, that isolates spaCy's icons (anywhere), its
   single-character prefixes and suffixes (repeatedly, at the start and end of
   a word), its lowercase units after a digit, and its lowercase special cases
   of 2+ pieces; the vocabulary is trained on the corpus, so every word has an
   id and `prep tokenize` with it makes token n-grams that are datatrove's word
   n-grams. How close: on 600 random documents of the whole corpus the words
   are identical in 600 (not one word of 352,000 differs); what is left out
   are spaCy rules that do not arise after simplification (URLs, emoticons,
   infix punctuation that simplification has already removed) and a special
   case after a prefix ("©im"). The run measures this again on a sample of its
   own corpus and reports it (`tokenizer_agreement`). The tools still do not
   hash the same bytes: datatrove xxhash64s the 5 words joined by spaces,
   rensa hashes 20 bytes (5 little-endian uint32 ids), prep hashes the ids.

3. **Ground truth.** Exact Jaccard similarity of the sets of 5-gram shingles
   (of word ids) by brute force, for every planted pair, a random sample of
   other pairs, and every pair any tool reports. The candidate rate of each
   bin of true Jaccard is set beside the banding formula P(s) = 1 - (1 -
   s^r)^b summed over the pairs of the bin (the expected count) with its
   binomial standard error (Poisson binomial: sqrt(sum P(1-P))), and z, so
   that a reader sees whether the measured rate matches the formula within
   sampling error. Pairs chosen because a tool reported them are kept out of
   those bins (they would bias them upwards) and shown apart.
   The SE treats pairs as independent; pairs of one planted group are not, and
   on a 150 MB corpus the same signatures under 5 seeds of each family (prep's,
   datatrove's coefficients, and a splitmix64 mixer as the ideal) put z of the
   0.45-0.9 total anywhere in -2.5..+3.7: read |z| < 3 as agreement.
   Candidate pairs (sharing a band) are known for datatrove (recomputed from
   its signature files) and rensa (its LSH query); prep reports clusters only
   (duplicates.jsonl: each removed document and the kept one), so for prep the
   rate is "same cluster", measured on planted pairs whose group has one copy,
   where a cluster is the pair itself unless a third document joins it; and
   PrepModel re-implements prep's documented signature (src/dedup/minhash.rs)
   to give its candidate pairs ("prep-model"), checking that every one of them
   lies in one cluster of prep's output.

4. **Anchors.** datatrove's four stages (MinhashDedupSignature,
   MinhashDedupBuckets, MinhashDedupCluster, MinhashDedupFilter) with
   LocalPipelineExecutor at tasks = workers = 1 and 2, defaults (5-grams, 14
   buckets x 8 hashes, seed 1, xxhash64); rensa's RMinHash (num_perm 112) and
   RMinHashLSH (14 bands) over the same shingles, with RAYON_NUM_THREADS 1 and
   2, tokenizing with the same tokenizer.json; prep tokenize then prep dedup
   with --threads 1 and 2. Wall time end to end and peak RSS (os.wait4 of
   each command: the largest process of its tree), removed sets, their
   overlaps, and for each document removed by one tool and not the other the
   true Jaccard of the link that made the difference.

Output: Markdown on stdout, every figure in SCRATCH/dedup-results.json.
"""

import argparse
import io
import json
import math
import os
import random
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
from corpora import external  # noqa: E402

CORPUS = external("debian-docs.jsonl.zst")
GEN_VERSION = 3  # bump when the corpus generator changes: cached corpora are remade

NGRAM, BANDS, ROWS, SEED = 5, 14, 8, 1
THRESHOLD = (1 / BANDS) ** (1 / ROWS)  # 0.719: datatrove's "threshold"
BIN_EDGES = [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]


def p_candidate(s, b=BANDS, r=ROWS):
    return 1.0 - (1.0 - s**r) ** b


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def parse_size(s):
    m = re.fullmatch(r"\s*([0-9.]+)\s*([KMGT]?i?B?)?\s*", s, re.I)
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {s}")
    unit = (m.group(2) or "").upper()
    mult = {"": 1, "B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12, "K": 1e3, "M": 1e6, "G": 1e9,
            "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}[unit]
    return int(float(m.group(1)) * mult)


# --------------------------------------------------------------------------
# The word-level tokenizer (datatrove's words as token ids)
# --------------------------------------------------------------------------

def _x(c):
    return "\\x{%x}" % ord(c)


def _lit(s):
    return "".join(_x(c) for c in s)


def _trie(words):
    """A regex (onig) matching exactly the keys of `words`, each followed by its value, as a trie."""

    def node(items, depth):
        end = [tail for w, tail in items if len(w) == depth]
        by = {}
        for w, tail in items:
            if len(w) > depth:
                by.setdefault(w[depth], []).append((w, tail))
        alts = [_x(c) + node(sub, depth + 1) for c, sub in sorted(by.items())]
        alts += end
        return alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")"

    return node(sorted(words.items()), 0)


def words_pipeline():
    """The normalizer and pre-tokenizer that give datatrove's English words (see the module doc)."""
    import spacy
    from datatrove.utils.text import PUNCTUATION, simplify_text
    from spacy.lang.char_classes import CURRENCY, LIST_ICONS, UNITS
    from spacy.lang.punctuation import TOKENIZER_PREFIXES, TOKENIZER_SUFFIXES
    from spacy.symbols import ORTH
    from tokenizers import Regex, normalizers, pre_tokenizers

    punct = set(PUNCTUATION)
    norm = normalizers.Sequence([
        normalizers.Lowercase(),
        normalizers.Replace(Regex(r"\p{Nd}+(?:[.,،٫⎖⎗⎘]\p{Nd}+)?"), "0"),
        normalizers.Replace(Regex("[" + _lit(PUNCTUATION) + "]"), " "),
        normalizers.NFD(),
        normalizers.Replace(Regex(r"\p{Mn}"), ""),
    ])

    def single_chars(patterns):
        out = set()
        for pat in patterns:
            lit = re.sub(r"\\(.)", r"\1", pat)
            if len(lit) == 1 and lit not in punct and not lit.isspace():
                out.add(lit)
        return out

    pcls = "[" + _lit(sorted(single_chars(TOKENIZER_PREFIXES))) + "]"
    scls = "[" + _lit(sorted(single_chars(TOKENIZER_SUFFIXES))) + "]"
    icons = LIST_ICONS[0]
    icons = re.sub(r"\\u([0-9A-Fa-f]{4})", lambda m: "\\x{%s}" % m.group(1), icons)
    icons = re.sub(r"\\U([0-9A-Fa-f]{8})", lambda m: "\\x{%x}" % int(m.group(1), 16), icons)
    units = {u.replace("\\", "") for u in UNITS.split("|") + CURRENCY.split("|")}
    units = {u for u in units if u and u == u.lower() and not any(c in punct for c in u)}

    firsts, rest_alts, nspecial = {}, [], 0
    for key, pieces in spacy.blank("en").tokenizer.rules.items():
        orths = [p.get(ORTH, p.get("ORTH")) for p in pieces]
        if len(orths) < 2 or None in orths or "".join(orths) != key:
            continue
        if key != key.lower() or simplify_text(key) != key or " " in key:
            continue
        nspecial += 1
        firsts.setdefault(orths[0], set()).add("".join(orths[1:]))
        for i in range(1, len(orths)):
            before, after = "".join(orths[:i]), "".join(orths[i + 1:])
            a = "(?<=^" + _lit(before) + ")" + _lit(orths[i])
            rest_alts.append(a + (("(?=" + _lit(after) + "$)") if after else "$"))
    first_re = _trie({p: "(?=(?:" + "|".join(_lit(r) for r in sorted(rs)) + ")$)" for p, rs in firsts.items()})
    special_re = r"\G(?:^" + first_re + "|(?!^)(?:" + "|".join(rest_alts) + "))"
    one = "|".join([
        icons,                                                     # icons: anywhere (infix)
        r"\G" + pcls,                                              # prefixes, from the start
        scls + "(?=" + scls + "*$)",                               # suffixes, from the end
        "(?<=[0-9])" + _trie({u: "" for u in units}) + "(?=" + scls + "*$)",  # a unit after a digit
        special_re,                                                # special cases: dont -> do nt
    ])
    pre = pre_tokenizers.Sequence([
        pre_tokenizers.WhitespaceSplit(),
        pre_tokenizers.Split(Regex(one), behavior="isolated"),
    ])
    return norm, pre


def words_tokenizer(texts, path):
    """Train the word-level tokenizer on `texts` (every word gets an id) and save it."""
    from tokenizers import Tokenizer, models, trainers

    norm, pre = words_pipeline()
    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.normalizer, tok.pre_tokenizer = norm, pre
    trainer = trainers.WordLevelTrainer(vocab_size=1 << 31, min_frequency=0, special_tokens=["[UNK]"],
                                        show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    tok.save(str(path))
    return tok


# --------------------------------------------------------------------------
# The planted corpus
# --------------------------------------------------------------------------

EDIT_KINDS = [  # (kind, weight)
    ("exact", 0.08), ("header", 0.10), ("swap", 0.10), ("insert_words", 0.14), ("insert_sentences", 0.14),
    ("delete_span", 0.14), ("substitute", 0.16), ("mixed", 0.14),
]


def load_pool(path, min_words, max_words):
    import zstandard

    out = []
    with open(path, "rb") as fh:
        for line in io.TextIOWrapper(zstandard.ZstdDecompressor().stream_reader(fh), encoding="utf-8"):
            t = json.loads(line)["text"]
            if min_words <= len(t.split()) <= max_words:
                out.append(t)
    return out


class Editor:
    """Edits of known size on a document's text (words are runs of non-space)."""

    def __init__(self, rng, donors):
        self.rng, self.donors = rng, donors

    def donor_words(self, k):
        out = []
        while len(out) < k:
            w = self.rng.choice(self.donors).split()
            out.extend(self.rng.sample(w, min(len(w), k - len(out))))
        return out

    def donor_run(self, k):
        w = self.rng.choice(self.donors).split()
        s = self.rng.randrange(max(1, len(w) - k))
        return w[s:s + k]

    def donor_line(self):
        for _ in range(50):
            lines = [ln for ln in self.rng.choice(self.donors).split("\n") if len(ln.split()) >= 3]
            if lines:
                return self.rng.choice(lines)
        return " ".join(self.donor_words(8))

    def apply(self, kind, text, t):
        rng = self.rng
        pieces = re.split(r"(\s+)", text)  # word, space, word, ... (the first may be "")
        n = sum(1 for i in range(0, len(pieces), 2) if pieces[i])
        if kind == "exact":
            return text, {}
        if kind == "header":
            lines = text.split("\n")
            h = next((i for i, ln in enumerate(lines) if ln.strip()), 0)
            lines[h] = self.donor_line()
            return "\n".join(lines), {}
        if kind == "swap":
            paras = re.split(r"\n\s*\n", text)
            sep = "\n\n"
            if len(paras) < 3:
                paras, sep = text.split("\n"), "\n"
            swaps = rng.randint(1, 3)
            if len(paras) >= 3:
                for _ in range(swaps):
                    a, b = rng.sample(range(len(paras)), 2)
                    paras[a], paras[b] = paras[b], paras[a]
                return sep.join(paras), {"swaps": swaps}
            w = text.split()
            return " ".join(w[n // 2:] + w[:n // 2]), {"swaps": 1}
        if kind == "mixed":
            # header + swap, then half the budget each to substitutions and one deletion
            text2, _ = self.apply("header", text, 1.0)
            text2, _ = self.apply("swap", text2, 1.0)
            t2 = math.sqrt(t)
            text2, a = self.apply("substitute", text2, t2)
            text2, b = self.apply("delete_span", text2, t2)
            return text2, {"substitute": a, "delete_span": b}
        words = [pieces[i] for i in range(0, len(pieces), 2) if pieces[i]]
        if kind == "insert_words":  # each insertion: 4 shingles lost, 5 new
            k = max(1, round(n * (1 - t) / (4 + 5 * t)))
            at = sorted(rng.randrange(n + 1) for _ in range(k))
            new = self.donor_words(k)
            out, j = [], 0
            for i, w in enumerate(words + [None]):
                while j < k and at[j] == i:
                    out.append(new[j])
                    j += 1
                if w is not None:
                    out.append(w)
            return _rejoin(pieces, out, text), {"words": k}
        if kind == "substitute":  # each substitution: 5 lost, 5 new
            k = max(1, min(n, round(n * (1 - t) / (5 * (1 + t)))))
            new = self.donor_words(k)
            for j, i in enumerate(rng.sample(range(n), k)):
                words[i] = new[j]
            return _rejoin(pieces, words, text), {"words": k}
        if kind == "delete_span":  # J ~ 1 - d
            k = max(1, min(n - 10, round(n * (1 - t))))
            s = rng.randrange(n - k + 1)
            return _rejoin(pieces, words[:s] + words[s + k:], text), {"words": k}
        if kind == "insert_sentences":  # J ~ n / (n + m)
            m = max(5, round(n * (1 / t - 1)))
            lines = text.split("\n")
            inserted = 0
            while inserted < m:
                k = min(m - inserted, rng.randint(8, 25))
                lines.insert(rng.randrange(len(lines) + 1), " ".join(self.donor_run(k)))
                inserted += k
            return "\n".join(lines), {"words": inserted}
        raise ValueError(kind)


def _rejoin(pieces, words, text):
    """Words back with the original's whitespace (newlines kept where they were, spaces where words were added)."""
    seps = [pieces[i] for i in range(1, len(pieces), 2)]
    lead = pieces[0] == ""
    if lead and seps:
        seps = seps[1:]
    out = []
    for i, w in enumerate(words):
        out.append(w)
        if i < len(words) - 1:
            out.append(seps[i] if i < len(seps) else " ")
    return "".join(out)


def make_corpus(args, cdir):
    """Write cdir/jsonl/part-0000{0,1}.jsonl, cdir/words.tokenizer.json, cdir/planted.json; return the meta."""
    key = dict(gen=GEN_VERSION, size=args.size, seed=args.seed, plant=args.plant_fraction,
               corpus=str(args.corpus), corpus_bytes=os.path.getsize(args.corpus))
    meta_path = cdir / "meta.json"
    if meta_path.exists() and json.loads(meta_path.read_text()).get("key") == key and not args.regenerate:
        log(f"corpus: reusing {cdir}")
        return json.loads(meta_path.read_text())
    shutil.rmtree(cdir, ignore_errors=True)
    (cdir / "jsonl").mkdir(parents=True)
    t0 = time.time()
    rng = random.Random(args.seed)
    pool = load_pool(args.corpus, 100, 10_000)
    order = list(range(len(pool)))
    rng.shuffle(order)
    # Plan: which documents, how many copies, which edits.
    plan, est = [], 0
    k = 0
    kinds, weights = zip(*EDIT_KINDS)
    while est < args.size:
        i, rep = order[k % len(order)], k // len(order)
        k += 1
        copies = []
        if rng.random() < args.plant_fraction:
            ncopies = 1 if rng.random() < 0.8 else rng.randint(2, 4)
            for c in range(ncopies):
                copies.append(dict(kind=rng.choices(kinds, weights)[0], target=rng.uniform(0.3, 1.0),
                                   parent="source" if c == 0 or rng.random() < 0.5 else "previous"))
        plan.append((i, rep, copies))
        est += len(pool[i].encode()) * (1 + len(copies))
    used = sorted({i for i, _, _ in plan})
    reps = max(r for _, r, _ in plan)
    log(f"corpus: {len(plan)} documents planned ({len(used)} distinct, {reps} vocabulary permutations), "
        f"training the word tokenizer on {sum(len(pool[i]) for i in used) / 1e6:.0f} MB")
    tok = words_tokenizer([pool[i] for i in used], cdir / "words.tokenizer.json")
    vocab = tok.get_vocab_size()
    # Repetitions past the real corpus: words through a permutation of the vocabulary.
    line_ids, id_word, perms = None, None, {}
    if reps:
        id_word = np.empty(vocab, dtype=object)
        for w, j in tok.get_vocab().items():
            id_word[j] = w
        line_ids = {}
        for i in used:
            lines = pool[i].split("\n")
            line_ids[i] = [np.array(e.ids, dtype=np.int64) for e in tok.encode_batch_fast(lines, add_special_tokens=False)]
        prng = np.random.default_rng(args.seed)
        for r in range(1, reps + 1):
            p = np.arange(vocab)
            for b in range(1, vocab, 64):
                p[b:b + 64] = prng.permutation(p[b:b + 64])
            perms[r] = p

    def base_text(i, rep):
        if rep == 0:
            return pool[i]
        p = perms[rep]
        return "\n".join(" ".join(id_word[p[ids]]) for ids in line_ids[i])

    editor = Editor(rng, [pool[i] for i in used])
    tmp = cdir / "unshuffled.jsonl"
    offsets = []  # (offset, length) of each generated document's line in tmp
    groups = []
    nbytes = 0
    with open(tmp, "wb") as out:
        def emit(text):
            nonlocal nbytes
            line = (json.dumps({"text": text}, ensure_ascii=False) + "\n").encode()
            offsets.append((out.tell(), len(line)))
            out.write(line)
            nbytes += len(text.encode())
            return len(offsets) - 1

        for i, rep, copies in plan:
            src_text = base_text(i, rep)
            src = emit(src_text)
            if not copies:
                continue
            members, prev_text, prev = [], src_text, src
            for c in copies:
                parent_text, parent = (src_text, src) if c["parent"] == "source" else (prev_text, prev)
                text, detail = editor.apply(c["kind"], parent_text, c["target"])
                d = emit(text)
                members.append(dict(doc=d, parent=parent, kind=c["kind"], target=round(c["target"], 4), detail=detail))
                prev_text, prev = text, d
            groups.append(dict(source=src, copies=members))
    ndocs = len(offsets)
    perm = list(range(ndocs))
    rng.shuffle(perm)  # perm[new] = old
    new_of = [0] * ndocs
    for new, old in enumerate(perm):
        new_of[old] = new
    half = ndocs // 2
    with open(tmp, "rb") as src:
        for part, (lo, hi) in enumerate([(0, half), (half, ndocs)]):
            with open(cdir / "jsonl" / f"part-{part:05d}.jsonl", "wb") as out:
                for new in range(lo, hi):
                    off, n = offsets[perm[new]]
                    src.seek(off)
                    line = json.loads(src.read(n))
                    out.write((json.dumps({"text": line["text"], "id": str(new)}, ensure_ascii=False) + "\n").encode())
    tmp.unlink()
    for g in groups:
        g["source"] = new_of[g["source"]]
        for c in g["copies"]:
            c["doc"], c["parent"] = new_of[c["doc"]], new_of[c["parent"]]
    (cdir / "planted.json").write_text(json.dumps(groups))
    meta = dict(key=key, documents=ndocs, parts=[half, ndocs - half], text_bytes=nbytes,
                jsonl_bytes=sum(p.stat().st_size for p in (cdir / "jsonl").iterdir()),
                groups=len(groups), copies=sum(len(g["copies"]) for g in groups), vocab=vocab,
                permutations=reps, seconds=round(time.time() - t0, 1))
    meta_path.write_text(json.dumps(meta, indent=1))
    log(f"corpus: {ndocs} documents, {nbytes / 1e6:.1f} MB of text, {meta['groups']} planted groups, "
        f"{meta['copies']} copies, vocabulary {vocab}, in {meta['seconds']} s")
    return meta


def read_texts(cdir, wanted=None):
    """The corpus's texts in record order (all, or a dict of the wanted indices)."""
    out = {} if wanted is not None else []
    g = 0
    for part in sorted((cdir / "jsonl").glob("part-*.jsonl")):
        with open(part, encoding="utf-8") as fh:
            for line in fh:
                if wanted is None:
                    out.append(json.loads(line)["text"])
                elif g in wanted:
                    out[g] = json.loads(line)["text"]
                g += 1
    return out


# --------------------------------------------------------------------------
# Running the tools, each a measured child process
# --------------------------------------------------------------------------

def measured(cmd, logfile, env=None):
    """Run cmd; wall seconds, peak RSS and exit status.

    Peak RSS is GNU time's %M where /usr/bin/time exists (the largest process of the command's tree); else
    os.wait4's ru_maxrss, which also counts the forked copy of this (large) process before it execs.
    """
    gtime = Path("/usr/bin/time")
    tf = Path(str(logfile) + ".time")
    full = [str(gtime), "-o", str(tf), "-f", "%M %U %S"] + list(cmd) if gtime.exists() else list(cmd)
    with open(logfile, "wb") as lf:
        t0 = time.perf_counter()
        p = subprocess.Popen(full, stdout=lf, stderr=subprocess.STDOUT, env=env)
        _, status, ru = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    rss_kb, cpu = ru.ru_maxrss, ru.ru_utime + ru.ru_stime
    if gtime.exists() and tf.exists():
        last = tf.read_text().strip().splitlines()[-1].split()
        try:
            rss_kb, cpu = int(last[0]), float(last[1]) + float(last[2])
        except (ValueError, IndexError):
            pass  # "Command exited with non-zero status": rc says so
    return dict(wall_s=round(wall, 3), peak_rss_mb=round(rss_kb / 1024, 1), rc=p.returncode,
                cpu_s=round(cpu, 2), log=str(logfile))


def thread_env(n):
    env = dict(os.environ)
    env.update(RAYON_NUM_THREADS=str(n), RAYON_RS_NUM_CPUS=str(n), OMP_NUM_THREADS="1",
               TOKENIZERS_PARALLELISM="true" if n > 1 else "false")
    return env


def prep_has_dedup(prep):
    if not prep or not Path(prep).exists():
        return False, f"no prep binary at {prep} (pass --prep target/release/prep)"
    r = subprocess.run([prep, "dedup", "--help"], capture_output=True, text=True)
    if r.returncode != 0:
        first = ((r.stderr or r.stdout).strip().splitlines() or [""])[0]
        return False, f"`{prep} dedup --help` failed ({first}): this binary has no `prep dedup` yet"
    return True, ""


def prep_tokenize(args, cdir, work, threads, tokenizer=None, name="prep-tok"):
    """prep tokenize of the corpus: with the word-level tokenizer.json (datatrove's
    words), or with `tokenizer` (a training tokenizer: GPT-2's)."""
    out = work / f"{name}-t{threads}"
    tokenizer = tokenizer or cdir / "words.tokenizer.json"
    m = measured([args.prep, "tokenize", "--tokenizer", str(tokenizer),
                  "--input", str(cdir / "jsonl"), "--output", str(out), "--no-eos", "--threads", str(threads),
                  "--overwrite", "-q", "--shard-size", args.shard_size],
                 work / f"{name}-t{threads}.log")
    if m["rc"] != 0:
        raise SystemExit(f"prep tokenize failed; see {m['log']}")
    manifest = json.loads((out / "manifest.json").read_text())
    m.update(dataset=str(out), threads=threads, records=manifest["n_records"], tokens=manifest["n_tokens"])
    return m


def prep_dedup(args, work, tok, threads, name="prep-dedup"):
    out = work / f"{name}-t{threads}"
    cmd = [args.prep, "dedup", tok["dataset"], str(out), "--threads", str(threads), "--overwrite", "-q",
           "--shard-size", args.shard_size]
    if args.memory:
        cmd += ["--memory", args.memory]
    dd = measured(cmd, work / f"{name}-t{threads}.log")
    if dd["rc"] != 0:
        raise SystemExit(f"prep dedup failed; see {dd['log']}")
    pairs = []
    with open(out / "duplicates.jsonl") as fh:
        for line in fh:
            d = json.loads(line)
            pairs.append((d["doc"], d["kept"]))
    manifest = json.loads((out / "manifest.json").read_text())
    if manifest["n_records"] != tok["records"] - len(pairs):
        raise SystemExit(f"prep dedup kept {manifest['n_records']} of {tok['records']} documents but "
                         f"duplicates.jsonl lists {len(pairs)} removed")
    return dict(threads=threads, tokenize=tok, dedup=dd, removed_pairs=pairs,
                end_to_end_s=round(tok["wall_s"] + dd["wall_s"], 3), output_records=manifest["n_records"])


def run_worker(args, cdir, work, name, threads):
    out = work / f"{name}-t{threads}.json"
    cmd = [sys.executable, __file__, "_worker", name, "--dir", str(cdir), "--work", str(work),
           "--threads", str(threads), "--out", str(out)]
    m = measured(cmd, work / f"{name}-t{threads}.log", env=thread_env(threads))
    if m["rc"] != 0:
        raise SystemExit(f"{name} ({threads} threads) failed; see {m['log']}")
    r = json.loads(out.read_text())
    r.update(threads=threads, run=m)
    return r


def worker_rensa(cdir, work, threads, out):
    """rensa: word ids -> 5-gram byte shingles -> RMinHash (112) -> RMinHashLSH (14 bands) -> clusters."""
    from rensa import RMinHash, RMinHashLSH
    from tokenizers import Tokenizer

    t = {}
    t0 = time.perf_counter()
    tok = Tokenizer.from_file(str(cdir / "words.tokenizer.json"))
    lsh = RMinHashLSH(threshold=THRESHOLD, num_perm=BANDS * ROWS, num_bands=BANDS)
    mhs, empty = [], set()
    t_tok = t_sig = 0.0
    batch = []

    def flush():
        nonlocal t_tok, t_sig
        a = time.perf_counter()
        encs = tok.encode_batch_fast(batch, add_special_tokens=False)
        b = time.perf_counter()
        sets = []
        for e in encs:
            ids = np.asarray(e.ids, dtype=np.uint32)
            if len(ids) == 0:
                empty.add(len(mhs) + len(sets))
                ids = np.array([0xFFFFFFFF], dtype=np.uint32)  # signed, never a candidate (skipped below)
            if len(ids) < NGRAM:  # one shingle of all its tokens (prep's rule)
                sets.append([ids.tobytes()])
                continue
            sw = np.ascontiguousarray(np.lib.stride_tricks.sliding_window_view(ids, NGRAM))
            sets.append(sw.view(np.dtype((np.void, 4 * NGRAM))).ravel().tolist())
        ms = RMinHash.from_token_sets(sets, num_perm=BANDS * ROWS, seed=SEED)
        lsh.insert_many(ms, start_key=len(mhs))
        mhs.extend(ms)
        c = time.perf_counter()
        t_tok += b - a
        t_sig += c - b
        batch.clear()

    for part in sorted((cdir / "jsonl").glob("part-*.jsonl")):
        with open(part, encoding="utf-8") as fh:
            for line in fh:
                batch.append(json.loads(line)["text"])
                if len(batch) == 4096:
                    flush()
    if batch:
        flush()
    t["tokenize_s"], t["sign_and_insert_s"] = round(t_tok, 3), round(t_sig, 3)
    a = time.perf_counter()
    cands = lsh.query_all(mhs)
    pairs = set()
    for i, cs in enumerate(cands):
        if i in empty:
            continue
        for j in cs:
            if j > i and j not in empty:
                pairs.add((i, j))
    t["query_s"] = round(time.perf_counter() - a, 3)
    a = time.perf_counter()
    parent = list(range(len(mhs)))

    def find(x):
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for i, j in pairs:
        ri, rj = find(i), find(j)
        if ri != rj:
            parent[max(ri, rj)] = min(ri, rj)  # the root is the smallest index: prep's keep rule
    removed = [(g, find(g)) for g in range(len(mhs)) if find(g) != g]
    t["cluster_s"] = round(time.perf_counter() - a, 3)
    t["inside_s"] = round(time.perf_counter() - t0, 3)
    Path(out).write_text(json.dumps(dict(timings=t, candidate_pairs=sorted(pairs), removed_pairs=removed,
                                         documents=len(mhs))))


def worker_datatrove(cdir, work, threads, out):
    """datatrove's four MinHash stages, defaults, tasks = workers = threads."""
    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.dedup.minhash import (MinhashConfig, MinhashDedupBuckets, MinhashDedupCluster,
                                                  MinhashDedupFilter, MinhashDedupSignature)
    from datatrove.pipeline.readers import JsonlReader
    from datatrove.pipeline.writers import JsonlWriter

    base = work / f"datatrove-t{threads}"
    shutil.rmtree(base, ignore_errors=True)
    cfg = MinhashConfig()  # 5-grams, 14 buckets x 8 hashes, seed 1, xxhash 64 bits
    data = str(cdir / "jsonl")
    stages = [
        ("signatures", [JsonlReader(data, glob_pattern="*.jsonl"),
                        MinhashDedupSignature(output_folder=str(base / "signatures"), config=cfg)], threads, threads),
        ("buckets", [MinhashDedupBuckets(input_folder=str(base / "signatures"), output_folder=str(base / "buckets"),
                                         config=cfg)], cfg.num_buckets, threads),
        ("cluster", [MinhashDedupCluster(input_folder=str(base / "buckets"), output_folder=str(base / "remove_ids"),
                                         config=cfg, save_cluster_id=True)], 1, 1),
        ("filter", [JsonlReader(data, glob_pattern="*.jsonl"),
                    MinhashDedupFilter(input_folder=str(base / "remove_ids")),
                    JsonlWriter(str(base / "deduped"), compression=None)], threads, threads),
    ]
    t = {}
    for name, pipeline, tasks, workers in stages:
        a = time.perf_counter()
        LocalPipelineExecutor(pipeline=pipeline, tasks=tasks, workers=workers,
                              logging_dir=str(base / "logs" / name)).run()
        t[name + "_s"] = round(time.perf_counter() - a, 3)
    Path(out).write_text(json.dumps(dict(timings=t, base=str(base), tasks=threads)))


def datatrove_results(r, parts):
    """Read what datatrove wrote: kept ids, clusters (.clusters), candidate pairs (signature files)."""
    base, tasks = Path(r["base"]), r["tasks"]
    # rank -> global index of its first document: files are dealt to ranks as files[rank::tasks]
    offsets = [sum(parts[:k]) for k in range(len(parts))]
    rank_files = [list(range(len(parts)))[k::tasks] for k in range(tasks)]

    rank_map = [np.concatenate([np.arange(offsets[f], offsets[f] + parts[f]) for f in fs]).astype(np.int64)
                for fs in rank_files]

    kept = set()
    for f in (base / "deduped").glob("*.jsonl"):
        with open(f) as fh:
            for line in fh:
                kept.add(int(json.loads(line)["id"]))
    n = sum(parts)
    removed = sorted(set(range(n)) - kept)
    cluster_of = {}
    for f in (base / "remove_ids").glob("*.clusters"):
        rank = int(f.name.split(".")[0])
        a = np.fromfile(f, dtype="<u4").reshape(-1, 2)
        for doc, cid in zip(rank_map[rank][a[:, 0]].tolist(), a[:, 1].tolist()):
            cluster_of[doc] = cid
    members = {}
    for g, c in cluster_of.items():
        members.setdefault(c, []).append(g)
    # datatrove's own choice: every cluster member it removed; canonical: all but the smallest index
    canonical = sorted(g for ms in members.values() for g in sorted(ms)[1:])
    rem_of_raw = {}
    for ms in members.values():
        keeper = [g for g in ms if g in kept]
        for g in ms:
            if g not in kept:
                rem_of_raw[g] = keeper[0] if keeper else min(ms)
    # candidate pairs: documents with the same 8 hashes in some bucket
    dt = np.dtype([(f"h{i}", "<u8") for i in range(ROWS)] + [("doc", "<u4")])
    pairs = set()
    big_groups = 0
    for bdir in sorted((base / "signatures").glob("bucket_*")):
        sigs, docs = [], []
        for f in sorted(bdir.glob("*.minhash.sig")):
            rank = int(f.name.split(".")[0])
            rec = np.fromfile(f, dtype=dt)
            sigs.append(np.stack([rec[f"h{i}"] for i in range(ROWS)], axis=1))
            docs.append(rank_map[rank][rec["doc"].astype(np.int64)])
        if not sigs:
            continue
        s = np.ascontiguousarray(np.concatenate(sigs)).view(np.dtype((np.void, 8 * ROWS))).ravel()
        d = np.concatenate(docs)
        _, inv, counts = np.unique(s, return_inverse=True, return_counts=True)
        dup = counts[inv] > 1
        for grp in _groups(inv[dup], d[dup]):
            grp = sorted(grp)
            if len(grp) > 200:
                big_groups += 1
                pairs.update((grp[0], x) for x in grp[1:])
            else:
                pairs.update((a, b) for k, a in enumerate(grp) for b in grp[k + 1:])
    return dict(removed=removed, removed_canonical=canonical, removed_matches_clusters=set(rem_of_raw) == set(removed), clusters=members, cluster_of=cluster_of,
                removed_pairs=sorted(rem_of_raw.items()), candidate_pairs=sorted(pairs), big_groups=big_groups)


def _groups(keys, values):
    order = np.argsort(keys, kind="stable")
    k, v = keys[order], values[order]
    cuts = np.flatnonzero(np.diff(k)) + 1
    return [list(x) for x in np.split(v, cuts)]


# --------------------------------------------------------------------------
# Ground truth
# --------------------------------------------------------------------------

class Truth:
    """Exact Jaccard of 5-gram shingle sets of word ids, computed on demand and cached."""

    def __init__(self, cdir, tokenizer):
        self.cdir, self.tok = cdir, tokenizer
        self.sets, self.ids, self.cache, self.unk = {}, {}, {}, 0
        self.bits = max(1, (tokenizer.get_vocab_size() + 1).bit_length())
        if NGRAM * self.bits > 128:
            raise SystemExit("vocabulary too large for the 128-bit shingle keys")

    def load(self, docs):
        need = set(docs) - set(self.sets)
        if not need:
            return
        texts = read_texts(self.cdir, need)
        keys = sorted(texts)
        for k0 in range(0, len(keys), 2048):
            ks = keys[k0:k0 + 2048]
            for g, e in zip(ks, self.tok.encode_batch_fast([texts[g] for g in ks], add_special_tokens=False)):
                ids = np.asarray(e.ids, dtype=np.uint64)
                self.unk += int((ids == 0).sum())
                self.sets[g] = self._shingles(ids)
                self.ids[g] = ids.astype(np.uint32)

    def _shingles(self, ids):
        if len(ids) == 0:
            return np.empty(0, dtype=np.dtype((np.void, 16)))
        if len(ids) < NGRAM:
            ids = np.concatenate([ids, np.full(NGRAM - len(ids), (1 << self.bits) - 1, dtype=np.uint64)])
        w = np.lib.stride_tricks.sliding_window_view(ids, NGRAM)
        lo = np.zeros(len(w), dtype=np.uint64)
        hi = np.zeros(len(w), dtype=np.uint64)
        for k in range(NGRAM):  # pack the 5 ids into 128 bits, exactly
            v, pos = w[:, k], k * self.bits
            if pos < 64:
                lo |= v << np.uint64(pos)  # bits past 64 fall off here and go to hi below
                if pos + self.bits > 64:
                    hi |= v >> np.uint64(64 - pos)
            else:
                hi |= v << np.uint64(pos - 64)
        key = np.stack([lo, hi], axis=1)
        return np.unique(np.ascontiguousarray(key).view(np.dtype((np.void, 16))).ravel())

    def jaccard(self, a, b):
        k = (a, b) if a < b else (b, a)
        if k not in self.cache:
            sa, sb = self.sets[a], self.sets[b]
            if len(sa) == 0 or len(sb) == 0:
                self.cache[k] = 0.0
            else:
                inter = len(np.intersect1d(sa, sb, assume_unique=True))
                self.cache[k] = inter / (len(sa) + len(sb) - inter)
        return self.cache[k]


class PrepModel:
    """prep dedup's signature as src/dedup/minhash.rs documents it, re-implemented here.

    Shingle hash x = XXH3-64 of the n ids as little-endian u32s (a document under n tokens: one shingle of
    all of them); h_i(x) = ((a_i x + b_i) mod 2^64) mod (2^61 - 1) with a_i in [1, p), b_i in [0, p) drawn
    in turn from SplitMix64(seed) (the top 61 bits, by rejection); signature = the minima; two documents
    are candidates when the 8 values of some band are equal (prep compares XXH3 keys of the bands: equal
    values, save a 2^-64 collision). It gives prep's candidate pairs, which prep itself does not report,
    and checks prep's clusters: every candidate pair must be in one cluster.
    """

    P, M = (1 << 61) - 1, (1 << 64) - 1

    def __init__(self, seed=SEED, k=BANDS * ROWS):
        a, b, st = [], [], seed
        for _ in range(k):
            st, x = self._below(st, 1)
            a.append(x)
            st, x = self._below(st, 0)
            b.append(x)
        self.a, self.b = np.array(a, dtype=np.uint64), np.array(b, dtype=np.uint64)
        self.sigs = {}

    def _splitmix(self, st):
        st = (st + 0x9E3779B97F4A7C15) & self.M
        z = st
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & self.M
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & self.M
        return st, z ^ (z >> 31)

    def _below(self, st, lo):
        while True:
            st, x = self._splitmix(st)
            x >>= 3
            if lo <= x < self.P:
                return st, x

    def sign(self, g, ids):
        import xxhash

        if len(ids) == 0:
            self.sigs[g] = None
            return
        n = min(NGRAM, len(ids))
        by = np.asarray(ids, dtype="<u4").tobytes()
        xs = np.fromiter((xxhash.xxh3_64_intdigest(by[4 * i:4 * (i + n)]) for i in range(len(ids) - n + 1)),
                         dtype=np.uint64, count=len(ids) - n + 1)
        m = np.full(len(self.a), np.iinfo(np.uint64).max, dtype=np.uint64)
        for k0 in range(0, len(xs), 4096):  # numpy's uint64 product wraps mod 2^64, as the family wants
            m = np.minimum(m, ((xs[k0:k0 + 4096, None] * self.a[None, :] + self.b[None, :]) % np.uint64(self.P)).min(0))
        self.sigs[g] = m

    def candidates(self, a, b):
        sa, sb = self.sigs[a], self.sigs[b]
        if sa is None or sb is None:
            return False
        return bool((sa == sb).reshape(BANDS, ROWS).all(axis=1).any())


def datatrove_jaccard(texts_a, texts_b):
    """Jaccard in datatrove's own units (simplify_text + spaCy words, 5-grams joined by spaces)."""
    from datatrove.utils.text import ngrams, simplify_text
    from datatrove.utils.word_tokenizers import load_word_tokenizer

    wt = load_word_tokenizer("en")

    def sh(t):
        return {" ".join(x) for x in ngrams(wt.word_tokenize(simplify_text(t)), NGRAM)}

    a, b = sh(texts_a), sh(texts_b)
    return len(a & b) / max(1, len(a | b))


def tokenizer_agreement(cdir, tok, n, ndocs, seed):
    """Documents (and words) where the tokenizer's words equal datatrove's (spaCy's) words."""
    import difflib

    from datatrove.utils.text import simplify_text
    from datatrove.utils.word_tokenizers import load_word_tokenizer

    wt = load_word_tokenizer("en")
    sample = sorted(random.Random(seed).sample(range(ndocs), min(n, ndocs)))
    texts = read_texts(cdir, set(sample))
    same_docs = words = diff_words = 0
    shingle_j = []
    for g in sample:
        a = wt.word_tokenize(simplify_text(texts[g]))
        b = [w for w, _ in tok.pre_tokenizer.pre_tokenize_str(tok.normalizer.normalize_str(texts[g]))]
        words += len(a)
        if a == b:
            same_docs += 1
            shingle_j.append(1.0)
            continue
        sm = difflib.SequenceMatcher(a=a, b=b, autojunk=False)
        diff_words += sum(max(i2 - i1, j2 - j1) for op, i1, i2, j1, j2 in sm.get_opcodes() if op != "equal")
        sa = {tuple(a[i:i + NGRAM]) for i in range(max(1, len(a) - NGRAM + 1))}
        sb = {tuple(b[i:i + NGRAM]) for i in range(max(1, len(b) - NGRAM + 1))}
        shingle_j.append(len(sa & sb) / max(1, len(sa | sb)))
    return dict(documents=len(sample), identical_documents=same_docs, words=words, differing_words=diff_words,
                mean_shingle_jaccard=round(float(np.mean(shingle_j)), 6) if shingle_j else None)


# --------------------------------------------------------------------------
# Evaluation
# --------------------------------------------------------------------------

class Clusters:
    def __init__(self, removed_pairs):
        self.root = {g: k for g, k in removed_pairs}
        self.removed = set(self.root)

    def of(self, g):
        return self.root.get(g, g)

    def members(self):
        m = {}
        for g, k in self.root.items():
            m.setdefault(k, {k}).add(g)
        return m


def bin_of(s):
    if s >= 1.0:
        return "1.0"
    k = min(int(s * 10), 9)
    return f"{BIN_EDGES[k]:.1f}-{BIN_EDGES[k + 1]:.1f}"


BIN_NAMES = [f"{BIN_EDGES[k]:.1f}-{BIN_EDGES[k + 1]:.1f}" for k in range(10)] + ["1.0"]


def rate_table(pairs, truth, found_by):
    """Per bin of true Jaccard: pairs, expected count under P(s) with its SE, and each tool's count and z."""
    rows = []
    for name in BIN_NAMES:
        ps = [(a, b) for a, b in pairs if bin_of(truth.jaccard(a, b)) == name]
        if not ps:
            continue
        probs = np.array([p_candidate(truth.jaccard(a, b)) for a, b in ps])
        exp, se = float(probs.sum()), float(math.sqrt((probs * (1 - probs)).sum()))
        row = dict(bin=name, pairs=len(ps), mean_s=round(float(np.mean([truth.jaccard(a, b) for a, b in ps])), 4),
                   p_formula=round(exp / len(ps), 4), expected=round(exp, 1), se=round(se, 2))
        for tool, f in found_by.items():
            obs = sum(1 for a, b in ps if f(a, b))
            row[tool] = obs
            row[tool + "_rate"] = round(obs / len(ps), 4)
            row[tool + "_z"] = round((obs - exp) / se, 2) if se > 0 else (0.0 if abs(obs - exp) < 0.5 else None)
        rows.append(row)
    return rows


def overlap(a_name, a_set, a_cl, b_name, b_set, b_cl, truth, limit_dt_units, texts_for):
    """Removed sets of two tools: sizes, intersection, and why the others differ."""
    only_a, only_b = sorted(a_set - b_set), sorted(b_set - a_set)
    am, bm = a_cl.members(), b_cl.members()

    def explain(g, x_cl, xm, y_cl, ym):
        """g is removed by X, not by Y: same cluster (a keep-rule difference) or which link Y lacks."""
        xa = xm[x_cl.of(g)]
        yb = ym.get(y_cl.of(g), {g})
        e = dict(doc=g, kept_by=x_cl.of(g), cluster_x=len(xa), cluster_y=len(yb))
        diff = xa - yb
        if not diff:
            e["why"] = "keep rule (same cluster)" if xa == yb else "keep rule (Y's cluster is larger)"
            return e
        common = sorted(xa & yb)[:50]
        diff = sorted(diff)[:50]
        truth.load(common + diff)
        u, v = max(((u, v) for u in common for v in diff), key=lambda p: truth.jaccard(*p))
        e.update(why="cluster differs", link=[u, v], link_jaccard=round(truth.jaccard(u, v), 4),
                 p_formula=round(p_candidate(truth.jaccard(u, v)), 4))
        return e

    ea = [explain(g, a_cl, am, b_cl, bm) for g in only_a]
    eb = [explain(g, b_cl, bm, a_cl, am) for g in only_b]
    for e in (ea + eb)[:limit_dt_units]:
        if e["why"] == "cluster differs":
            tx = texts_for(e["link"])
            e["link_jaccard_datatrove_units"] = round(datatrove_jaccard(tx[e["link"][0]], tx[e["link"][1]]), 4)

    def summary(es):
        js = [e["link_jaccard"] for e in es if e["why"] == "cluster differs"]
        return dict(documents=len(es), keep_rule=sum(1 for e in es if e["why"] != "cluster differs"),
                    cluster_differs=len(js),
                    link_jaccard_min=min(js) if js else None, link_jaccard_median=round(float(np.median(js)), 4) if js else None,
                    link_jaccard_max=max(js) if js else None,
                    within_0_55_to_0_9=sum(1 for j in js if 0.55 <= j <= 0.9))

    return dict(a=a_name, b=b_name, a_removed=len(a_set), b_removed=len(b_set), both=len(a_set & b_set),
                only_a=summary(ea), only_b=summary(eb), only_a_docs=ea[:200], only_b_docs=eb[:200])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prep", help="the prep binary (target/release/prep)")
    ap.add_argument("--scratch", type=Path, default=ROOT / "target" / "bench" / "dedup")
    ap.add_argument("--corpus", type=Path, default=CORPUS)
    ap.add_argument("--size", type=parse_size, default=None,
                    help="bytes of text in the planted corpus [default 16MB; --scale sets it]")
    ap.add_argument("--scale", choices=["default", "1g", "3g"], default="default",
                    help="1g / 3g: a 1 GB or 3 GB corpus for prep's time and peak RSS (prep only unless --tools; "
                         "tokenized once, with the most threads)")
    ap.add_argument("--tools", default=None, help="comma list of prep,rensa,datatrove [default: all; scale runs: prep]")
    ap.add_argument("--threads", default="1,2", help="thread counts to run each tool with")
    ap.add_argument("--memory", default=None, help="prep dedup --memory (default: prep's, 1GiB)")
    ap.add_argument("--shard-size", default="1GiB")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--plant-fraction", type=float, default=0.5, help="share of documents that get copies")
    ap.add_argument("--random-pairs", type=int, default=3000, help="random unplanted pairs in the ground truth")
    ap.add_argument("--max-eval-pairs", type=int, default=20000, help="cap on planted and reported pairs evaluated")
    ap.add_argument("--agreement-docs", type=int, default=300, help="documents for the tokenizer agreement check")
    ap.add_argument("--regenerate", action="store_true", help="remake the corpus even if a cached one matches")
    args = ap.parse_args()
    if args.size is None:
        args.size = {"default": 16_000_000, "1g": 1_000_000_000, "3g": 3_000_000_000}[args.scale]
    tools = (args.tools or ("prep,rensa,datatrove" if args.scale == "default" else "prep")).split(",")
    threads = [int(x) for x in args.threads.split(",")]
    scratch = args.scratch.resolve()
    scratch.mkdir(parents=True, exist_ok=True)
    cdir = scratch / f"corpus-{args.size}-s{args.seed}"
    work = scratch / "runs"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    results = dict(size=args.size, seed=args.seed, params=dict(ngram=NGRAM, bands=BANDS, rows=ROWS, seed=SEED,
                                                               threshold=round(THRESHOLD, 4)), notes=[])

    results["load_average_at_start"] = os.getloadavg()
    meta = make_corpus(args, cdir)
    results["corpus"] = meta
    mb = meta["jsonl_bytes"] / 1e6
    ndocs = meta["documents"]

    # ---- the tools
    prep_runs, rensa_runs, dt_runs, gpt2_runs = {}, {}, {}, {}
    if "prep" in tools:
        ok, why = prep_has_dedup(args.prep)
        if not ok:
            msg = f"prep half skipped: {why}"
            log(msg)
            results["notes"].append(msg)
        else:
            toks = {}
            for n in threads:
                if args.scale == "default" or not toks:  # at scale: tokenize once, with the most threads
                    m = max(threads) if args.scale != "default" else n
                    log(f"prep: tokenize, {m} thread(s)")
                    toks[n] = prep_tokenize(args, cdir, work, m)
                else:
                    toks[n] = next(iter(toks.values()))
                log(f"prep: dedup, {n} thread(s)")
                prep_runs[n] = prep_dedup(args, work, toks[n], n)
                if args.scale == "default":
                    # The pipeline a user runs: the training tokenizer (GPT-2),
                    # which the data needs anyway, then dedup over its tokens.
                    log(f"prep: tokenize with GPT-2 and dedup, {n} thread(s)")
                    gpt2 = prep_tokenize(args, cdir, work, n, ROOT / "fixtures/tokenizers/gpt2.tokenizer.json.zst",
                                         "prep-gpt2-tok")
                    gpt2_runs[n] = prep_dedup(args, work, gpt2, n, "prep-gpt2-dedup")
    if "rensa" in tools:
        for n in threads:
            log(f"rensa: {n} thread(s)")
            rensa_runs[n] = run_worker(args, cdir, work, "rensa", n)
    if "datatrove" in tools:
        for n in threads:
            log(f"datatrove: tasks = workers = {n}")
            r = run_worker(args, cdir, work, "datatrove", n)
            r.update(datatrove_results(r, meta["parts"]))
            dt_runs[n] = r
            results.setdefault("datatrove_checks", {})[f"t{n}"] = dict(
                removed_from_output_equals_removed_from_clusters=r["removed_matches_clusters"],
                signature_groups_over_200=r["big_groups"])

    # ---- ground truth
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(cdir / "words.tokenizer.json"))
    truth = Truth(cdir, tok)
    rng = random.Random(args.seed + 7)
    groups = json.loads((cdir / "planted.json").read_text())
    planted, isolated = [], []
    for g in groups:
        members = [g["source"]] + [c["doc"] for c in g["copies"]]
        ps = [(min(a, b), max(a, b)) for k, a in enumerate(members) for b in members[k + 1:]]
        planted.extend(ps)
        if len(members) == 2:
            isolated.extend(ps)
    planted_set = set(planted)
    if len(planted) > args.max_eval_pairs:
        planted = rng.sample(planted, args.max_eval_pairs)
        planted_set_eval = set(planted)
        isolated = [p for p in isolated if p in planted_set_eval]
    randoms = set()
    while len(randoms) < min(args.random_pairs, ndocs * (ndocs - 1) // 2 - len(planted_set)):
        a, b = rng.randrange(ndocs), rng.randrange(ndocs)
        if a != b and (min(a, b), max(a, b)) not in planted_set:
            randoms.add((min(a, b), max(a, b)))
    randoms = sorted(randoms)
    reported = {}
    for n, r in prep_runs.items():
        reported[f"prep-t{n}"] = sorted({(min(a, b), max(a, b)) for a, b in r["removed_pairs"]})
    for n, r in rensa_runs.items():
        reported[f"rensa-t{n}"] = [tuple(p) for p in r["candidate_pairs"]]
    for n, r in dt_runs.items():
        reported[f"datatrove-t{n}"] = [tuple(p) for p in r["candidate_pairs"]]
    eval_reported = {k: (v if len(v) <= args.max_eval_pairs else rng.sample(v, args.max_eval_pairs))
                     for k, v in reported.items()}
    docs = {x for p in planted + randoms for x in p} | {x for v in eval_reported.values() for p in v for x in p}
    log(f"ground truth: {len(docs)} documents, {len(planted)} planted + {len(randoms)} random pairs")
    a = time.perf_counter()
    truth.load(docs)
    for p in planted + randoms + [p for v in eval_reported.values() for p in v]:
        truth.jaccard(*p)
    results["ground_truth"] = dict(documents=len(docs), planted_pairs=len(planted), random_pairs=len(randoms),
                                   seconds=round(time.perf_counter() - a, 1), unknown_tokens=truth.unk)
    log(f"tokenizer agreement with datatrove's words on {args.agreement_docs} documents")
    results["tokenizer_agreement"] = tokenizer_agreement(cdir, tok, args.agreement_docs, ndocs, args.seed)

    # ---- candidate rates by bin
    found_by, cluster_by, clusters = {}, {}, {}
    for n, r in dt_runs.items():
        cp = set(map(tuple, r["candidate_pairs"]))
        found_by[f"datatrove-t{n}"] = lambda a, b, cp=cp: (a, b) in cp
        co = r["cluster_of"]
        cluster_by[f"datatrove-t{n}"] = lambda a, b, co=co: a in co and co.get(a) == co.get(b)
        clusters[f"datatrove-t{n}"] = Clusters(r["removed_pairs"])
        clusters[f"datatrove-t{n}-canonical"] = Clusters(
            [(g, min(ms)) for ms in r["clusters"].values() for g in ms if g != min(ms)])
    for n, r in rensa_runs.items():
        cp = set(map(tuple, r["candidate_pairs"]))
        found_by[f"rensa-t{n}"] = lambda a, b, cp=cp: (a, b) in cp
        cl = Clusters(r["removed_pairs"])
        clusters[f"rensa-t{n}"] = cl
        cluster_by[f"rensa-t{n}"] = lambda a, b, cl=cl: cl.of(a) == cl.of(b)
    for n, r in prep_runs.items():
        cl = Clusters(r["removed_pairs"])
        clusters[f"prep-t{n}"] = cl
        cluster_by[f"prep-t{n}"] = lambda a, b, cl=cl: cl.of(a) == cl.of(b)
    if prep_runs:  # prep's candidate pairs through the model of its signature, and its clusters checked
        model = PrepModel()
        for g in {x for p in planted + randoms for x in p}:
            model.sign(g, truth.ids[g])
        found_by["prep-model"] = model.candidates
        cl = clusters[f"prep-t{min(prep_runs)}"]
        cand = [p for p in planted + randoms if model.candidates(*p)]
        missing = [p for p in cand if cl.of(p[0]) != cl.of(p[1])]
        results["prep_model_check"] = dict(
            model_candidate_pairs=len(cand), not_in_one_prep_cluster=len(missing), examples=missing[:20],
            note="prep-model: this script's re-implementation of src/dedup/minhash.rs's documented signature; "
                 "a candidate pair of the model outside one prep cluster is a disagreement between the two")
    results["candidate_rate"] = rate_table(planted + randoms, truth, found_by)
    results["cluster_rate_isolated_pairs"] = rate_table(isolated, truth, cluster_by)

    # ---- precision and recall of the pairs each tool reports
    pr = {}
    for k, v in eval_reported.items():
        js = [truth.jaccard(*p) for p in v]
        natural = sum(1 for p in v if p not in planted_set)
        pr[k] = dict(reported_pairs=len(reported[k]), evaluated=len(v),
                     precision_at_threshold=round(sum(1 for j in js if j >= THRESHOLD) / len(js), 4) if js else None,
                     share_below_0_5=round(sum(1 for j in js if j < 0.5) / len(js), 4) if js else None,
                     not_planted=natural,
                     not_planted_by_bin={b: sum(1 for p, j in zip(v, js) if p not in planted_set and bin_of(j) == b)
                                         for b in BIN_NAMES})
    above = [p for p in planted if truth.jaccard(*p) >= THRESHOLD]
    exp_recall = float(np.mean([p_candidate(truth.jaccard(*p)) for p in above])) if above else None
    for k in list(found_by) + [x for x in cluster_by if x.startswith("prep")]:
        f = found_by.get(k) or cluster_by[k]
        pr.setdefault(k, {})["recall_planted_above_threshold"] = (
            round(sum(1 for p in above if f(*p)) / len(above), 4) if above else None)
    results["pairs"] = dict(planted_above_threshold=len(above), expected_recall=round(exp_recall, 4) if exp_recall else None,
                            by_tool=pr)

    # ---- removed sets and their overlaps
    texts_cache = {}

    def texts_for(gs):
        need = [g for g in gs if g not in texts_cache]
        if need:
            texts_cache.update(read_texts(cdir, set(need)))
        return {g: texts_cache[g] for g in gs}

    results["removed"] = {k: len(c.removed) for k, c in clusters.items()}
    if ndocs <= 200_000:  # the sets themselves, as removed -> kept pairs
        results["removed_pairs"] = {k: sorted(c.root.items()) for k, c in clusters.items()}
    comps = []
    names = list(clusters)
    first = {t: next((k for k in names if k.startswith(t + "-t")), None) for t in ("prep", "rensa", "datatrove")}
    pairs_to_compare = [("prep", "datatrove"), ("prep", "rensa"), ("rensa", "datatrove")]
    for x, y in pairs_to_compare:
        if first[x] and first[y]:
            comps.append(overlap(first[x], clusters[first[x]].removed, clusters[first[x]], first[y],
                                 clusters[first[y]].removed, clusters[first[y]], truth, 60, texts_for))
            if y == "datatrove":
                yc = first[y] + "-canonical"
                comps.append(overlap(first[x], clusters[first[x]].removed, clusters[first[x]], yc,
                                     clusters[yc].removed, clusters[yc], truth, 0, texts_for))
    for t in ("prep", "rensa", "datatrove"):  # the same tool at 1 and 2 threads
        ks = [k for k in names if k.startswith(t + "-t") and not k.endswith("canonical")]
        if len(ks) == 2:
            c = [clusters[k] for k in ks]
            results.setdefault("thread_consistency", {})[t] = dict(
                same_removed=c[0].removed == c[1].removed, same_pairs=c[0].root == c[1].root)
    results["overlaps"] = comps

    # ---- time
    tm = {}
    for n, r in prep_runs.items():
        tm[f"prep-t{n}"] = dict(tokenize_s=r["tokenize"]["wall_s"], tokenize_threads=r["tokenize"]["threads"],
                                dedup_s=r["dedup"]["wall_s"], end_to_end_s=r["end_to_end_s"],
                                tokenize_rss_mb=r["tokenize"]["peak_rss_mb"], dedup_rss_mb=r["dedup"]["peak_rss_mb"],
                                dedup_mtokens_per_s=round(r["tokenize"]["tokens"] / 1e6 / r["dedup"]["wall_s"], 2),
                                dedup_cpu_s=r["dedup"]["cpu_s"], memory_flag=args.memory or "default (1GiB)")
    for n, r in gpt2_runs.items():
        tm[f"prep-gpt2-t{n}"] = dict(tokenize_s=r["tokenize"]["wall_s"], tokenize_threads=r["tokenize"]["threads"],
                                     dedup_s=r["dedup"]["wall_s"], end_to_end_s=r["end_to_end_s"],
                                     tokenize_rss_mb=r["tokenize"]["peak_rss_mb"],
                                     dedup_rss_mb=r["dedup"]["peak_rss_mb"], removed=len(r["removed_pairs"]))
    for n, r in rensa_runs.items():
        tm[f"rensa-t{n}"] = dict(end_to_end_s=r["run"]["wall_s"], peak_rss_mb=r["run"]["peak_rss_mb"], **r["timings"])
    for n, r in dt_runs.items():
        tm[f"datatrove-t{n}"] = dict(end_to_end_s=r["run"]["wall_s"], peak_rss_mb=r["run"]["peak_rss_mb"], **r["timings"])
    for k, v in tm.items():
        v["mb_per_s"] = round(mb / v["end_to_end_s"], 3)
    ratios = {}
    for n in threads:
        p, d, rs = tm.get(f"prep-t{n}"), tm.get(f"datatrove-t{n}"), tm.get(f"rensa-t{n}")
        if not p:
            continue
        th = f"{n} thread{'s' if n > 1 else ''}"
        if d:
            ratios[f"datatrove / prep, end to end from JSONL (prep: tokenize + dedup), {th}"] = round(
                d["end_to_end_s"] / p["end_to_end_s"], 2)
            ratios[f"datatrove end to end / prep dedup alone (data already tokenized), {th}"] = round(
                d["end_to_end_s"] / p["dedup_s"], 2)
            g = tm.get(f"prep-gpt2-t{n}")
            if g:
                ratios[f"datatrove / prep with GPT-2, end to end from JSONL (the training tokenizer; GPT-2 "
                       f"shingles, not datatrove's words), {th}"] = round(d["end_to_end_s"] / g["end_to_end_s"], 2)
        if rs:
            ratios[f"rensa / prep, end to end from JSONL (both tokenize with the same tokenizer.json), {th}"] = round(
                rs["end_to_end_s"] / p["end_to_end_s"], 2)
            mh = rs["sign_and_insert_s"] + rs["query_s"] + rs["cluster_s"]
            ratios[f"rensa from token ids (shingles, sign, LSH, clusters; in process) / prep dedup alone "
                   f"(whole command), {th}"] = round(mh / p["dedup_s"], 2)
    results["time"], results["ratios"] = tm, ratios

    results["load_average_at_end"] = os.getloadavg()
    out = scratch / "dedup-results.json"
    out.write_text(json.dumps(results, indent=1, default=lambda o: sorted(o) if isinstance(o, set) else str(o)))
    print(report(results, mb, ndocs))
    log(f"all figures: {out}")


def report(r, mb, ndocs):
    L = []
    c = r["corpus"]
    L.append(f"## prep dedup beside datatrove and rensa: {ndocs} documents, {mb:.1f} MB of JSONL\n")
    L.append(f"{c['groups']} planted groups ({c['copies']} copies), vocabulary {c['vocab']} words, "
             f"{c['permutations']} vocabulary permutations. MinHash {NGRAM}-grams, {BANDS} bands x {ROWS} rows, "
             f"P(s) = 1 - (1 - s^{ROWS})^{BANDS}, P = 0.5 at s = {(1 - 0.5 ** (1 / BANDS)) ** (1 / ROWS):.3f}.\n")
    for n in r["notes"]:
        L.append(f"**Note:** {n}\n")
    L.append(f"Load average (1, 5, 15 min) at start {tuple(round(x, 1) for x in r['load_average_at_start'])}, "
             f"at end {tuple(round(x, 1) for x in r['load_average_at_end'])}: times are only as good as the "
             f"machine was idle.\n")
    a = r["tokenizer_agreement"]
    L.append(f"Word tokenizer vs datatrove's words (simplify_text + spaCy en) on {a['documents']} documents: "
             f"{a['identical_documents']} identical, {a['differing_words']} of {a['words']} words differ, "
             f"mean Jaccard of the two shingle sets {a['mean_shingle_jaccard']}. "
             f"Unknown tokens in the ground truth: {r['ground_truth']['unknown_tokens']}.\n")
    if r["time"]:
        L.append("### Time (wall, end to end) and peak RSS\n")
        L.append("| run | tokenize s | dedup s | end to end s | MB/s | peak RSS MB |")
        L.append("|---|---:|---:|---:|---:|---:|")
        for k, v in r["time"].items():
            if k.startswith("prep-gpt2"):
                L.append(f"| {k} (GPT-2 tokens; tokenize {v['tokenize_threads']} thr.; {v['removed']} removed) | "
                         f"{v['tokenize_s']} | {v['dedup_s']} | {v['end_to_end_s']} | {v['mb_per_s']} | "
                         f"{v['tokenize_rss_mb']} / {v['dedup_rss_mb']} |")
            elif k.startswith("prep"):
                L.append(f"| {k} (tokenize {v['tokenize_threads']} thr.; dedup {v['dedup_mtokens_per_s']} Mtok/s, "
                         f"--memory {v['memory_flag']}) | {v['tokenize_s']} | {v['dedup_s']} | {v['end_to_end_s']} | "
                         f"{v['mb_per_s']} | {v['tokenize_rss_mb']} / {v['dedup_rss_mb']} |")
            elif k.startswith("rensa"):
                L.append(f"| {k} | {v['tokenize_s']} | {v['sign_and_insert_s'] + v['query_s'] + v['cluster_s']:.2f} | "
                         f"{v['end_to_end_s']} | {v['mb_per_s']} | {v['peak_rss_mb']} |")
            else:
                st = ", ".join(f"{s[:-2]} {v[s]}" for s in ("signatures_s", "buckets_s", "cluster_s", "filter_s"))
                L.append(f"| {k} ({st}) | (in signatures) | | {v['end_to_end_s']} | {v['mb_per_s']} | {v['peak_rss_mb']} |")
        L.append("")
        for k, v in r["ratios"].items():
            L.append(f"- {k}: **{v}x**")
        L.append("")
    if r["candidate_rate"]:
        tools = [k for k in r["candidate_rate"][0] if k.endswith("_z")]
        L.append("### Candidate pairs by true Jaccard (planted + random pairs) beside P(s)\n")
        L.append("| J bin | pairs | mean J | P(s) | expected ± SE | " + " | ".join(t[:-2] + " (z)" for t in tools) + " |")
        L.append("|---|---:|---:|---:|---:|" + "---:|" * len(tools))
        for row in r["candidate_rate"]:
            L.append(f"| {row['bin']} | {row['pairs']} | {row['mean_s']} | {row['p_formula']} | "
                     f"{row['expected']} ± {row['se']} | " +
                     " | ".join(f"{row[t[:-2]]} ({row[t]})" for t in tools) + " |")
        L.append("")
        L.append("z = (found - expected) / SE; where the expected count is under about 5, read the counts, "
                 "not z. Candidate pairs (some band equal): datatrove's from its signature files, rensa's from "
                 "its LSH; prep-model: this script's model of prep's signature (PrepModel), checked below "
                 "against prep's clusters.\n")
        if "prep_model_check" in r:
            c = r["prep_model_check"]
            L.append(f"prep-model check: {c['model_candidate_pairs']} candidate pairs of the model, "
                     f"{c['not_in_one_prep_cluster']} of them not in one prep cluster.\n")
    if r["cluster_rate_isolated_pairs"]:
        tools = [k for k in r["cluster_rate_isolated_pairs"][0] if k.endswith("_z")]
        L.append("### Same cluster, planted pairs of one-copy groups, beside P(s)\n")
        L.append("| J bin | pairs | P(s) | expected ± SE | " + " | ".join(t[:-2] + " (z)" for t in tools) + " |")
        L.append("|---|---:|---:|---:|" + "---:|" * len(tools))
        for row in r["cluster_rate_isolated_pairs"]:
            L.append(f"| {row['bin']} | {row['pairs']} | {row['p_formula']} | {row['expected']} ± {row['se']} | " +
                     " | ".join(f"{row[t[:-2]]} ({row[t]})" for t in tools) + " |")
        L.append("")
    p = r["pairs"]
    L.append(f"### Reported pairs: precision (true J >= {THRESHOLD:.3f}) and recall of planted pairs above it "
             f"({p['planted_above_threshold']} pairs, expected recall {p['expected_recall']})\n")
    L.append("| tool | pairs reported | precision | share J < 0.5 | not planted | recall |")
    L.append("|---|---:|---:|---:|---:|---:|")
    for k, v in p["by_tool"].items():
        L.append(f"| {k} | {v.get('reported_pairs', '')} | {v.get('precision_at_threshold', '')} | "
                 f"{v.get('share_below_0_5', '')} | {v.get('not_planted', '')} | {v.get('recall_planted_above_threshold', '')} |")
    L.append("\n(prep reports removed -> kept pairs of its clusters, not candidate pairs: a pair of a chain "
             "A~B~C may be far below the threshold; datatrove and rensa: all candidate pairs.)\n")
    L.append("### Removed documents\n")
    L.append(" | ".join(f"{k}: {v}" for k, v in r["removed"].items()) + "\n")
    L.append("Only A: documents A removes and B keeps: (same cluster, other keeper / clusters differ; for these, the "
             "true J of the strongest pair that A links and B does not: min, median, max; how many in 0.55-0.9).\n")
    L.append("| A | B | removed A | removed B | both | only A | only B |")
    L.append("|---|---|---:|---:|---:|---|---|")
    for o in r["overlaps"]:
        def f(s):
            if not s["cluster_differs"]:
                return f"{s['documents']} ({s['keep_rule']} / 0)"
            return (f"{s['documents']} ({s['keep_rule']} / {s['cluster_differs']}; J {s['link_jaccard_min']}, "
                    f"{s['link_jaccard_median']}, {s['link_jaccard_max']}; {s['within_0_55_to_0_9']} in 0.55-0.9)")
        L.append(f"| {o['a']} | {o['b']} | {o['a_removed']} | {o['b_removed']} | {o['both']} | "
                 f"{f(o['only_a'])} | {f(o['only_b'])} |")
    if "thread_consistency" in r:
        L.append("\n1 vs 2 threads: " + ", ".join(f"{k}: same removed {v['same_removed']}, same pairs {v['same_pairs']}"
                                                   for k, v in r["thread_consistency"].items()))
    return "\n".join(L)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_worker":
        wp = argparse.ArgumentParser()
        wp.add_argument("_w")
        wp.add_argument("name")
        wp.add_argument("--dir", type=Path)
        wp.add_argument("--work", type=Path)
        wp.add_argument("--threads", type=int)
        wp.add_argument("--out")
        w = wp.parse_args()
        {"rensa": worker_rensa, "datatrove": worker_datatrove}[w.name](w.dir, w.work, w.threads, w.out)
    else:
        main()
