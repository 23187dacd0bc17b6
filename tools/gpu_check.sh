#!/usr/bin/env bash
# The GPU path's checks, in one run on a machine with an NVIDIA GPU
# (docs/performance.md "The batch loader on a GPU" has what they gave):
#
#   1. the device tests (tests/it/gpu.rs), none skipped;
#   2. the loader's sweep (tools/bench_gpu.py): batches of 64 KiB to 64 MiB
#      against the event-timed pinned copy, and the waits per step at 2x
#      and 1x the copy time, on a packed dataset of 1.2 GB;
#   3. prep.DeviceLoader into PyTorch (tests/python/test_device.py);
#   4. compute-sanitizer memcheck and racecheck over the device tests, and
#      memcheck over one bench-read run.
#
# BUILD holds what was built where Rust is (this machine may have no
# toolchain): prep.gz (`cargo build --release --features cuda`), it.gz (the
# integration tests: `cargo test --features cuda --test it --no-run`) and
# wheel/ (`maturin build`), gzipped to travel light.
#
#   tools/gpu_check.sh BUILD OUT
#   STEPS="device-tests sweep-dma" tools/gpu_check.sh BUILD OUT   # only those
#
# Every step's output goes to OUT/gpu.log; the sweep's reports to
# OUT/bench_*.json. The tables and the summary come last.
set -u
BUILD=${1:?BUILD}
OUT=${2:?OUT}
WORK=${WORK:-/tmp/prep-gpu}
mkdir -p "$OUT" "$WORK/bin"
LOG=$OUT/gpu.log
SUMMARY=$WORK/summary
: >"$SUMMARY"

for f in prep it; do gunzip -c "$BUILD/$f.gz" >"$WORK/bin/$f" && chmod +x "$WORK/bin/$f"; done
PREP=$WORK/bin/prep
IT=$WORK/bin/it

# step NAME SECONDS CMD...: runs CMD with a time limit, logs it, notes its
# status. With STEPS set (names, space-separated), only the steps it names run:
# device time is short, and a rerun need only repeat what failed.
step() {
    local name=$1 limit=$2
    shift 2
    if [[ -n "${STEPS:-}" && " $STEPS " != *" $name "* ]]; then
        echo "$name: not run (STEPS)" >>"$SUMMARY"
        return 0
    fi
    local start=$SECONDS
    echo "=== $name: $*" >>"$LOG"
    timeout "$limit" "$@" >>"$LOG" 2>&1
    local rc=$?
    echo "=== $name: exit $rc in $((SECONDS - start)) s" >>"$LOG"
    echo "$name: exit $rc, $((SECONDS - start)) s" >>"$SUMMARY"
    return $rc
}

{
    date -u
    nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.max,pcie.link.width.max --format=csv
    nvidia-smi | head -n 4
    nproc
    command -v compute-sanitizer || echo "no compute-sanitizer"
} >>"$LOG" 2>&1
sed -n '2p' <(nvidia-smi --query-gpu=name,driver_version --format=csv) >>"$SUMMARY"

# 1. The device tests, each in turn; a "skipped" line means one did not run.
step device-tests 120 "$IT" gpu:: --test-threads 1 --nocapture
if grep -q "skipped: no CUDA" "$LOG"; then echo "device-tests: SOME SKIPPED" >>"$SUMMARY"; fi

# 2. The sweeps: plain pinned staging (the default), rows gathered by a
#    kernel on the GPU, rows copied by its copy engines, write-combined
#    staging, and to host memory (the gather alone, no copy to the device).
step sweep-plain 300 python3 tools/bench_gpu.py --prep "$PREP" --scratch "$WORK/data" --json "$OUT/bench_gpu_plain.json"
step sweep-device 200 python3 tools/bench_gpu.py --prep "$PREP" --scratch "$WORK/data" --gather device --json "$OUT/bench_gpu_device.json"
step sweep-dma 200 python3 tools/bench_gpu.py --prep "$PREP" --scratch "$WORK/data" --gather dma --json "$OUT/bench_gpu_dma.json"
step sweep-wc 200 python3 tools/bench_gpu.py --prep "$PREP" --scratch "$WORK/data" --pinned wc --json "$OUT/bench_gpu_wc.json"
step sweep-cpu 200 python3 tools/bench_gpu.py --prep "$PREP" --scratch "$WORK/data" --device cpu --json "$OUT/bench_cpu.json"

# 3. PyTorch.
python3 -m pip install -q --no-index --no-deps --no-compile --target "$WORK/site" "$BUILD"/wheel/*.whl >>"$LOG" 2>&1
PYTHONPATH=$WORK/site PREP_BIN=$PREP step torch 180 \
    python3 -m pytest -q -p no:cacheprovider tests/python/test_device.py

# 4. The sanitizers.
SAN="compute-sanitizer --error-exitcode 9 --print-limit 20"
step memcheck-tests 180 $SAN --tool memcheck "$IT" gpu:: --test-threads 1
step racecheck-tests 180 $SAN --tool racecheck "$IT" gpu:: --test-threads 1
step memcheck-bench 180 $SAN --tool memcheck "$PREP" bench-read "$WORK/data/packed-2048" \
    --device cuda:0 --batch 256 --steps 64
step memcheck-bench-device 180 $SAN --tool memcheck "$PREP" bench-read "$WORK/data/packed-2048" \
    --device cuda:0 --batch 256 --steps 64 --gather device
step memcheck-bench-dma 180 $SAN --tool memcheck "$PREP" bench-read "$WORK/data/packed-2048" \
    --device cuda:0 --batch 256 --steps 64 --gather dma

echo "=== summary" >>"$LOG"
cat "$SUMMARY" >>"$LOG"
grep -B2 -A7 '^| batch' "$LOG" | grep -v '^|---' 
cat "$SUMMARY"
