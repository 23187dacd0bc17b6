#!/usr/bin/env bash
# One task of one stage of a partitioned prep run: the body of every Slurm job
# that tools/slurm/submit.sh submits.
#
#   prep-task.sh [STAGE [RUN]]        (else the environment's STAGE and RUN)
#
# STAGE is tokenize, signatures, buckets, dedup, scatter, gather or pack
# (array jobs: the task is $SLURM_ARRAY_TASK_ID, given to prep as --part
# I/PARTS, --part J/BUCKETS for buckets or --bucket J for gather), or
# merge-tokenized, merge-deduped, merge-shuffled or merge-packed (single
# jobs). signatures, buckets, dedup and merge-deduped are prep dedup's stages
# (with --near-dedup), in the work directory DATA/dedup-work.
# The run's configuration comes from RUN/slurm.env, which submit.sh writes,
# or where there is no such file from the environment (the file wins: Slurm
# hands jobs the submitting shell's environment, which may hold anything):
#
#   PREP_BIN PREP_TOKENIZER PREP_INPUTS (newline-separated) PREP_PARTS
#   PREP_BUCKETS PREP_SEED PREP_SEQ_LEN PREP_MODE PREP_WINDOW PREP_TEXT_KEY
#   PREP_DEDUP (1 or 0) PREP_NEAR_DEDUP (1 or 0: scatter reads DATA/deduped)
#   PREP_THREADS (else $SLURM_CPUS_PER_TASK)
#   PREP_DATA (where the datasets go: an object-storage address; else RUN)
#
# Every attempt appends one line of JSON to RUN/.tasks/STAGE-IIIII.json
# (ok, exit status, tokens and records of the dataset it wrote, seconds,
# start and end times, host, Slurm job, and for a failed attempt the error:
# prep's last line on stderr, or the signal that ended it):
# tools/slurm/status.sh reads them.
# merge-packed also writes RUN/run-summary.json from them.
#
# prep tasks are idempotent: a finished one does nothing when run again and
# an interrupted one resumes, so a requeued or resubmitted task is safe.
# Exit status: prep's (0 done, 2 failed), 2 for a bad configuration.
set -euo pipefail
export LC_ALL=C # a decimal point in the times, whatever the node's locale

die() { echo "prep-task.sh: $*" >&2; exit 2; }

STAGE=${1:-${STAGE:-}}
RUN=${2:-${RUN:-}}
[[ -n $STAGE ]] || die "no stage: pass STAGE as the first argument or in the environment"
[[ -n $RUN ]] || die "no run directory: pass RUN as the second argument or in the environment"
if [[ -f $RUN/slurm.env ]]; then
    # shellcheck source=/dev/null
    source "$RUN/slurm.env"
fi
for var in PREP_BIN PREP_TOKENIZER PREP_INPUTS PREP_PARTS PREP_BUCKETS PREP_SEED PREP_SEQ_LEN; do
    [[ -n ${!var:-} ]] || die "$var is not set (in the environment or $RUN/slurm.env)"
done
PREP=$PREP_BIN TOKENIZER=$PREP_TOKENIZER PARTS=$PREP_PARTS BUCKETS=$PREP_BUCKETS SEED=$PREP_SEED
SEQ_LEN=$PREP_SEQ_LEN MODE=${PREP_MODE:-} WINDOW=${PREP_WINDOW:-} TEXT_KEY=${PREP_TEXT_KEY:-} DEDUP=${PREP_DEDUP:-0}
NEAR_DEDUP=${PREP_NEAR_DEDUP:-0}
THREADS=${PREP_THREADS:-${SLURM_CPUS_PER_TASK:-}}
mapfile -t inputs <<<"$PREP_INPUTS"
# The datasets' home: RUN, or an object-storage address (RUN then holds only
# the run's configuration, logs and attempt records).
DATA=${PREP_DATA:-$RUN}
remote=0
[[ ! $DATA =~ ^[a-z0-9]+:// ]] || remote=1
# prep dedup's work directory, and what the shuffle reads: the documents
# left by prep dedup with --near-dedup, else all those tokenized.
WORK=$DATA/dedup-work
documents=$DATA/tokenized
[[ $NEAR_DEDUP != 1 ]] || documents=$DATA/deduped

index=${SLURM_ARRAY_TASK_ID:-0}
[[ $index =~ ^[0-9]+$ ]] || die "SLURM_ARRAY_TASK_ID is not a number: $index"
threads=()
[[ -z $THREADS ]] || threads=(--threads "$THREADS")

part() { printf '%s/%s-%05d' "$1" "$2" "$3"; }
# Every part or bucket of a stage, named one by one for prep merge.
parts_of() {
    local dir=$1 prefix=$2 count=$3 i
    for ((i = 0; i < count; i++)); do part "$dir" "$prefix" "$i"; echo; done
}

case $STAGE in
tokenize | signatures | dedup | scatter | pack)
    ((index < PARTS)) || die "$STAGE task $index is past --parts $PARTS"
    ;;
buckets | gather)
    ((index < BUCKETS)) || die "$STAGE task $index is past --buckets $BUCKETS"
    ;;
esac

case $STAGE in
tokenize)
    out=$(part "$DATA/tokenized" part "$index")
    args=(tokenize --tokenizer "$TOKENIZER")
    for x in "${inputs[@]}"; do args+=(--input "$x"); done
    args+=(--output "$out" --part "$index/$PARTS")
    [[ -z $TEXT_KEY ]] || args+=(--text-key "$TEXT_KEY")
    [[ $DEDUP != 1 ]] || args+=(--dedup)
    args+=("${threads[@]}")
    ;;
signatures)
    out=$(part "$WORK" signatures "$index")
    args=(dedup "$DATA/tokenized" --work "$WORK" --signatures --part "$index/$PARTS" "${threads[@]}")
    ;;
buckets)
    out=$(part "$WORK" buckets "$index")
    args=(dedup --work "$WORK" --buckets --part "$index/$BUCKETS" "${threads[@]}")
    ;;
dedup)
    out=$(part "$DATA/deduped" part "$index")
    args=(dedup "$DATA/tokenized" "$out" --work "$WORK" --part "$index/$PARTS" "${threads[@]}")
    ;;
scatter)
    out=$(part "$DATA/scatter" scatter "$index")
    args=(shuffle "$documents" "$DATA/scatter" --seed "$SEED" --scatter --part "$index/$PARTS"
        --buckets "$BUCKETS" "${threads[@]}")
    ;;
gather)
    out=$(part "$DATA/shuffled" bucket "$index")
    args=(shuffle "$DATA/scatter" "$out" --gather --bucket "$index" "${threads[@]}")
    ;;
pack)
    out=$(part "$DATA/packed" part "$index")
    args=(pack "$DATA/shuffled" "$out" --part "$index/$PARTS" --seq-len "$SEQ_LEN")
    [[ -z $MODE ]] || args+=(--mode "$MODE")
    [[ -z $WINDOW ]] || args+=(--window "$WINDOW")
    args+=("${threads[@]}")
    ;;
merge-tokenized | merge-deduped | merge-shuffled | merge-packed)
    index=0
    case $STAGE in
    merge-tokenized) out=$DATA/tokenized; mapfile -t parts < <(parts_of "$out" part "$PARTS") ;;
    merge-deduped) out=$DATA/deduped; mapfile -t parts < <(parts_of "$out" part "$PARTS") ;;
    merge-shuffled) out=$DATA/shuffled; mapfile -t parts < <(parts_of "$out" bucket "$BUCKETS") ;;
    merge-packed) out=$DATA/packed; mapfile -t parts < <(parts_of "$out" part "$PARTS") ;;
    esac
    args=(merge "${parts[@]}" "$out")
    ;;
*)
    die "unknown stage '$STAGE': tokenize, merge-tokenized, signatures, buckets, dedup, merge-deduped, scatter, gather, merge-shuffled, pack or merge-packed"
    ;;
esac
args+=(--quiet)

now() { echo "${EPOCHREALTIME:-$(date +%s.%N)}"; }
# The first number after "KEY": in a JSON file: the top-level counts of a
# manifest come before the shards' own (serde writes fields in declaration order).
number() { grep -o "\"$1\": *[0-9]*" "$2" 2>/dev/null | head -n 1 | grep -o '[0-9]*$' || true; }
# n_tokens or n_records of the dataset written, or null. A scatter part and a
# signature part have no manifest; their scatter.json or signatures.json
# counts documents (start..end), not tokens. A bucket part counts neither.
count() {
    local v=''
    if ((remote)); then
        # prep reads the manifest where it lies (a scatter part has none: null).
        v=$("$PREP" inspect --json "$out" 2>/dev/null | grep -o "\"$1\": *[0-9]*" | head -n 1 | grep -o '[0-9]*$') || true
    elif [[ -f $out/manifest.json ]]; then
        v=$(number "$1" "$out/manifest.json")
    elif [[ $1 == n_records ]]; then
        local d
        for d in "$out/scatter.json" "$out/signatures.json"; do
            [[ ! -f $d ]] || v=$(($(number end "$d") - $(number start "$d")))
        done
    fi
    echo "${v:-null}"
}

mkdir -p "$RUN/.tasks"
record=$RUN/.tasks/$(printf '%s-%05d.json' "$STAGE" "$index")
started=$(now)
host=$(hostname 2>/dev/null || echo unknown)
job=${SLURM_ARRAY_JOB_ID:+${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}}
job=${job:-${SLURM_JOB_ID:-}}

# prep's stderr, kept to say why an attempt failed, then passed on to the log.
errors=$(mktemp "${TMPDIR:-/tmp}/prep-task.XXXXXX")

# $1 as a JSON string, its control characters dropped.
json_string() {
    local s
    s=$(printf '%s' "$1" | tr -d '\000-\037')
    s=${s//\\/\\\\}
    s=${s//\"/\\\"}
    printf '"%s"' "$s"
}

# One line per attempt, appended with a single write so that attempts on
# other nodes cannot interleave within it.
log_attempt() {
    local status=$1 why=${2:-} finished tokens=null records=null error=null
    finished=$(now)
    if ((status == 0)); then
        tokens=$(count n_tokens) records=$(count n_records)
    else
        [[ -n $why ]] || why=$(grep -v '^[[:space:]]*$' "$errors" 2>/dev/null | tail -n 1) || true
        [[ -z $why ]] || error=$(json_string "$why")
    fi
    printf '{"stage":"%s","index":%d,"ok":%s,"exit":%d,"tokens":%s,"records":%s,"seconds":%.3f,"started":%.3f,"finished":%.3f,"host":"%s","job":"%s","error":%s}\n' \
        "$STAGE" "$index" "$([[ $status == 0 ]] && echo true || echo false)" "$status" "$tokens" "$records" \
        "$(awk -v a="$started" -v b="$finished" 'BEGIN { print b - a }')" "$started" "$finished" "$host" "$job" \
        "$error" >>"$record"
}
# Slurm sends SIGTERM at the time limit or on scancel: the attempt is still recorded.
trap 'cat "$errors" >&2; log_attempt 143 "terminated by SIGTERM (scancel, the time limit, or the node shutting down)"; rm -f "$errors"; exit 143' TERM

status=0
"$PREP" "${args[@]}" 2>"$errors" || status=$?
cat "$errors" >&2
log_attempt "$status"
rm -f "$errors"
if ((status != 0)); then
    echo "prep-task.sh: $STAGE task $index failed (exit $status): $PREP ${args[*]}" >&2
    exit "$status"
fi

if [[ $STAGE == merge-packed ]]; then
    status_sh=${PREP_SLURM_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)}/status.sh
    "$status_sh" --json "$RUN" >"$RUN/.run-summary.json.tmp"
    mv "$RUN/.run-summary.json.tmp" "$RUN/run-summary.json"
fi
