#!/usr/bin/env bash
# Submit a partitioned prep run to Slurm: seven jobs (eleven with --near-dedup)
# chained by afterok.
#
#   tools/slurm/submit.sh --prep PATH --tokenizer TOK --input IN [IN2 ...] [--input IN3 ...] --run RUN \
#       --parts N --buckets B --seed S --seq-len L [--mode bestfit|concat] [--window W] [--text-key K] \
#       [--dedup] [--near-dedup] [--threads T] [--data URL] [--sbatch-arg ARG ...]
#
#   tokenize        array 0..N-1   prep tokenize --part I/N   -> RUN/tokenized/part-IIIII
#   merge-tokenized after tokenize                            -> RUN/tokenized
#   signatures      array 0..N-1   prep dedup --signatures --part I/N -> RUN/dedup-work/signatures-IIIII
#   buckets         array 0..B-1   prep dedup --buckets --part J/B    -> RUN/dedup-work/buckets-JJJJJ
#   dedup           array 0..N-1   prep dedup --part I/N      -> RUN/deduped/part-IIIII
#   merge-deduped   after dedup                               -> RUN/deduped
#   scatter         array 0..N-1   prep shuffle --scatter --part I/N --buckets B
#   gather          array 0..B-1   prep shuffle --gather --bucket J (after every scatter task)
#   merge-shuffled  after gather                              -> RUN/shuffled
#   pack            array 0..N-1   prep pack --part I/N       -> RUN/packed/part-IIIII
#   merge-packed    after pack                                -> RUN/packed, RUN/run-summary.json
#
# With --data s3://bucket/prefix (or gs://, az://) the datasets (parts,
# scatter parts, merges) go to object storage instead of RUN, and the nodes
# need share only RUN's small files (configuration, logs, attempt records);
# each job gets the store's variables (AWS_*, ...) from the submitting
# shell's environment, as Slurm hands it on. Below, DATA is that address, or
# RUN without --data.
#
# The four dedup jobs run only with --near-dedup, which removes near-duplicate
# documents (prep dedup, MinHash; its work directory is RUN/dedup-work) before
# the shuffle: scatter then reads RUN/deduped instead of RUN/tokenized.
#
# RUN/packed equals prep tokenize, [dedup,] shuffle --seed S and pack on one
# machine, record for record. Every job runs tools/slurm/prep-task.sh with the
# configuration this script writes to RUN/slurm.env; logs go to RUN/logs/.
# Each job waits for the previous one with --dependency=afterok and is
# cancelled if that one fails (--kill-on-invalid-dep=yes). After a failure,
# run this script again with the same arguments: finished tasks do nothing,
# interrupted ones resume. `tools/slurm/status.sh RUN` shows the progress.
#
# --threads T asks Slurm for T CPUs per task (--cpus-per-task) and gives prep
# --threads T; --sbatch-arg passes one argument to every sbatch (a partition,
# an account, a time limit: --sbatch-arg=--partition=cpu). $SBATCH names the
# sbatch command (default sbatch). The job ids are printed and written to
# RUN/slurm-jobs.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SBATCH=${SBATCH:-sbatch}

usage() {
    sed -n '4,7p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
    exit 2
}
die() { echo "submit.sh: $*" >&2; exit 2; }
# Absolute, without resolving links or globs: every node must see the same path.
abspath() { case $1 in /*) printf '%s' "$1" ;; *) printf '%s' "$PWD/$1" ;; esac; }
# An input: an object-storage address as it is, else a path made absolute.
location() { if [[ $1 =~ ^[a-z0-9]+:// ]]; then printf '%s' "$1"; else abspath "$1"; fi; }

prep='' tokenizer='' run='' data='' parts='' buckets='' seed='' seq_len='' mode='' window='' text_key='' dedup=0 near_dedup=0 threads=''
inputs=() sbatch_args=()
while (($#)); do
    case $1 in
    --prep | --tokenizer | --input | --run | --data | --parts | --buckets | --seed | --seq-len | --mode | --window | --text-key | --threads | --sbatch-arg)
        (($# >= 2)) || die "$1 needs a value"
        opt=$1 val=$2
        shift 2
        ;;
    --*=*) opt=${1%%=*} val=${1#*=}; shift ;;
    --dedup) dedup=1; shift; continue ;;
    --near-dedup) near_dedup=1; shift; continue ;;
    -h | --help) usage ;;
    *) die "unknown argument: $1" ;;
    esac
    case $opt in
    --prep) prep=$(abspath "$val") ;;
    --tokenizer) tokenizer=$(abspath "$val") ;;
    --input)
        inputs+=("$(location "$val")")
        # Several paths after one --input, as prep takes them: a glob the shell expanded.
        while (($#)) && [[ $1 != -* ]]; do inputs+=("$(location "$1")"); shift; done
        ;;
    --data)
        [[ $val =~ ^(s3|gs|az|azure)://[^/]+ ]] || die "--data must be an object-storage address (s3://, gs://, az://)"
        data=${val%/}
        ;;
    --run) run=$(abspath "$val") ;;
    --parts) parts=$val ;;
    --buckets) buckets=$val ;;
    --seed) seed=$val ;;
    --seq-len) seq_len=$val ;;
    --mode) mode=$val ;;
    --window) window=$val ;;
    --text-key) text_key=$val ;;
    --threads) threads=$val ;;
    --sbatch-arg) sbatch_args+=("$val") ;;
    *) die "unknown argument: $opt" ;;
    esac
done
for v in prep tokenizer run parts buckets seed seq_len; do
    [[ -n ${!v} ]] || die "--${v//_/-} is required"
done
((${#inputs[@]})) || die "--input is required"
[[ -x $prep ]] || die "--prep $prep is not an executable file"
for v in parts buckets seq_len; do
    [[ ${!v} =~ ^[1-9][0-9]*$ ]] || die "--${v//_/-} must be a whole number of at least 1"
done
[[ $seed =~ ^[0-9]+$ ]] || die "--seed must be a whole number"
[[ -z $threads || $threads =~ ^[1-9][0-9]*$ ]] || die "--threads must be a whole number of at least 1"
[[ -z $mode || $mode == bestfit || $mode == concat ]] || die "--mode is bestfit or concat"
[[ -z $window || $window =~ ^[1-9][0-9]*$ ]] || die "--window must be a whole number of at least 1"

mkdir -p "$run/logs"
# Sourced by prep-task.sh and status.sh (bash quoting, by printf %q).
{
    echo "# A partitioned prep run, written by tools/slurm/submit.sh."
    printf 'PREP_%s=%q\n' BIN "$prep" TOKENIZER "$tokenizer" INPUTS "$(printf '%s\n' "${inputs[@]}")" \
        PARTS "$parts" BUCKETS "$buckets" SEED "$seed" SEQ_LEN "$seq_len" MODE "$mode" WINDOW "$window" TEXT_KEY "$text_key" \
        DEDUP "$dedup" NEAR_DEDUP "$near_dedup" THREADS "$threads" SLURM_DIR "$here" DATA "$data"
} >"$run/.slurm.env.tmp"
mv "$run/.slurm.env.tmp" "$run/slurm.env"

common=(--parsable --kill-on-invalid-dep=yes)
[[ -z $threads ]] || common+=(--cpus-per-task="$threads")
common+=("${sbatch_args[@]}")

# submit STAGE ARRAY DEPENDENCY: prints the job id.
submit() {
    local stage=$1 array=$2 dep=$3 args out id
    args=("${common[@]}" --job-name="prep-$stage")
    if [[ -n $array ]]; then
        args+=(--array="$array" --output="$run/logs/%x-%A_%a.out")
    else
        args+=(--output="$run/logs/%x-%j.out")
    fi
    [[ -z $dep ]] || args+=(--dependency="afterok:$dep")
    out=$("$SBATCH" "${args[@]}" "$here/prep-task.sh" "$stage" "$run") || die "sbatch failed for $stage"
    id=${out%%;*} # --parsable prints "id" or "id;cluster"
    [[ $id =~ ^[0-9]+$ ]] || die "sbatch printed no job id for $stage: $out"
    echo "$id"
}

# Each job after the one before it: "STAGE=ID" lines in $jobs, the last id in $last.
jobs='' last=''
chain() {
    last=$(submit "$1" "$2" "$last")
    jobs+="${jobs:+$'\n'}$1=$last"
}
chain tokenize "0-$((parts - 1))"
chain merge-tokenized ""
if ((near_dedup)); then
    chain signatures "0-$((parts - 1))"
    chain buckets "0-$((buckets - 1))"
    chain dedup "0-$((parts - 1))"
    chain merge-deduped ""
fi
chain scatter "0-$((parts - 1))"
chain gather "0-$((buckets - 1))"
chain merge-shuffled ""
chain pack "0-$((parts - 1))"
chain merge-packed ""

echo "$jobs" >"$run/slurm-jobs"
echo "$jobs"
echo "progress: $here/status.sh $run" >&2
