#!/usr/bin/env bash
# How far a partitioned prep run on Slurm is: per stage, the tasks done, the
# attempts that failed, the tokens and records written, and the wall time.
#
#   status.sh RUN            a table
#   status.sh --json RUN     RUN/run-summary.json's contents (prep-task.sh
#                            writes that file with this when merge-packed ends)
#
# Reads the attempt records RUN/.tasks/STAGE-IIIII.json of prep-task.sh and
# the task counts of RUN/slurm.env (else of the environment, as prep-task.sh). A task is done when one of its attempts
# succeeded; its tokens and records are those of its last successful attempt
# (from the manifest.json it wrote). A stage's wall time runs from its first
# attempt's start to its last attempt's end; the run's from the first start to
# the last end, so it includes the time jobs waited in the queue.
set -euo pipefail
export LC_ALL=C

json=0
if [[ ${1:-} == --json ]]; then json=1; shift; fi
[[ $# == 1 ]] || { echo "usage: status.sh [--json] RUN" >&2; exit 2; }
RUN=$1
if [[ -f $RUN/slurm.env ]]; then
    # shellcheck source=/dev/null
    source "$RUN/slurm.env"
fi
[[ -n ${PREP_PARTS:-} && -n ${PREP_BUCKETS:-} ]] ||
    { echo "status.sh: no $RUN/slurm.env (or PREP_PARTS and PREP_BUCKETS): not a run of submit.sh" >&2; exit 2; }

shopt -s nullglob
records=("$RUN"/.tasks/*.json)
shopt -u nullglob

# The manifest of the finished dataset, if there is one yet.
output_count() {
    local v
    v=$(grep -o "\"$1\": *[0-9]*" "$RUN/packed/manifest.json" 2>/dev/null | head -n 1 | grep -o '[0-9]*$') || true
    echo "${v:-null}"
}

cat "${records[@]}" /dev/null | awk -v json="$json" -v run="$RUN" -v parts="$PREP_PARTS" \
    -v buckets="$PREP_BUCKETS" -v seed="$PREP_SEED" -v seq_len="$PREP_SEQ_LEN" -v mode="${PREP_MODE:-}" \
    -v dedup="${PREP_DEDUP:-0}" \
    -v out_tokens="$(output_count n_tokens)" -v out_records="$(output_count n_records)" '
function field(line, key,    v) {
    if (!match(line, "\"" key "\":(\"[^\"]*\"|[^,}]*)")) return ""
    v = substr(line, RSTART + length(key) + 3, RLENGTH - length(key) - 3)
    gsub(/"/, "", v)
    return v
}
function num(v) { return v == "null" || v == "" ? 0 : v + 0 }
function jstr(s) { gsub(/\\/, "\\\\", s); gsub(/"/, "\\\"", s); return "\"" s "\"" }
function human(n) {
    if (n >= 1e9) return sprintf("%.1fG", n / 1e9)
    if (n >= 1e6) return sprintf("%.1fM", n / 1e6)
    if (n >= 1e3) return sprintf("%.1fk", n / 1e3)
    return sprintf("%d", n)
}
{
    s = field($0, "stage"); i = field($0, "index")
    if (s == "" || i == "") next  # a line cut short by a node that died mid-write
    k = s SUBSEP i
    attempts[s]++; att[k]++
    if (field($0, "ok") == "true") {
        if (!(k in ok)) done[s]++
        ok[k] = 1
        tokens[k] = field($0, "tokens"); recs[k] = num(field($0, "records"))
        secs[k] = num(field($0, "seconds"))
        last_failed[k] = 0
    } else {
        failed[s]++
        if (!(k in ok)) last_failed[k] = 1
    }
    t0 = num(field($0, "started")); t1 = num(field($0, "finished"))
    if (!(s in start) || t0 < start[s]) start[s] = t0
    if (!(s in end) || t1 > end[s]) end[s] = t1
    if (first == "" || t0 < first) first = t0
    if (last == "" || t1 > last) last = t1
    seen[k] = 1
}
END {
    n = split("tokenize merge-tokenized scatter gather merge-shuffled pack merge-packed", order, " ")
    total["tokenize"] = parts; total["scatter"] = parts; total["pack"] = parts; total["gather"] = buckets
    total["merge-tokenized"] = 1; total["merge-shuffled"] = 1; total["merge-packed"] = 1
    merge_of["tokenize"] = "merge-tokenized"; merge_of["gather"] = "merge-shuffled"; merge_of["pack"] = "merge-packed"
    merge_dir["merge-tokenized"] = "tokenized"; merge_dir["merge-shuffled"] = "shuffled"; merge_dir["merge-packed"] = "packed"
    for (k in seen) {
        split(k, ks, SUBSEP)
        if (k in ok) {
            # Scatter parts count documents, not tokens: their stage has no token count.
            if (tokens[k] == "null" || tokens[k] == "") no_tokens[ks[1]] = 1
            sum_tokens[ks[1]] += num(tokens[k]); sum_recs[ks[1]] += recs[k]; sum_secs[ks[1]] += secs[k]
        }
        if (last_failed[k]) failing[ks[1]]++
        if (att[k] > 1) retries[ks[1]] += att[k] - 1
    }
    status = done["merge-packed"] >= 1 ? "done" : "running"
    for (j = 1; j <= n; j++) if (failing[order[j]] > 0 && status != "done") status = "failed"

    if (!json) {
        printf "%-16s %9s %8s %9s %10s %9s\n", "stage", "done", "failed", "tokens", "records", "wall s"
        for (j = 1; j <= n; j++) {
            s = order[j]
            printf "%-16s %9s %8d %9s %10.0f %9s\n", s, (done[s] + 0) "/" total[s], failed[s], \
                (s in no_tokens ? "-" : human(sum_tokens[s])), \
                sum_recs[s], (s in start ? sprintf("%.1f", end[s] - start[s]) : "-")
        }
        printf "%s", status
        if (first != "") printf " (%.1fs from the first task start to the last task end)", last - first
        printf "\n"
        exit
    }
    printf "{\n  \"engine\": \"slurm\",\n  \"status\": \"%s\",\n  \"run\": %s,\n", status, jstr(run)
    printf "  \"config\": {\"parts\": %d, \"buckets\": %d, \"seed\": %s, \"seq_len\": %d, \"mode\": %s, \"dedup\": %s},\n", \
        parts, buckets, seed, seq_len, (mode == "" ? "null" : jstr(mode)), (dedup == 1 ? "true" : "false")
    printf "  \"stages\": {"
    m = split("tokenize scatter gather pack", stages, " ")
    for (j = 1; j <= m; j++) {
        s = stages[j]
        printf "%s\n    \"%s\": {\"tasks\": %d, \"done\": %d, \"attempts\": %d, \"retries\": %d, ", \
            (j > 1 ? "," : ""), s, total[s], done[s], attempts[s], retries[s]
        printf "\"failed_attempts\": %d, \"wall_seconds\": %.3f, \"task_seconds\": %.3f, \"tokens\": %s, \"records\": %.0f, ", \
            failed[s], (s in start ? end[s] - start[s] : 0), sum_secs[s], \
            (s in no_tokens ? "null" : sprintf("%.0f", sum_tokens[s])), sum_recs[s]
        g = merge_of[s]
        if (g == "") printf "\"merge\": null}"
        else if (!(g in done)) printf "\"merge\": {\"out\": %s, \"done\": false}}", jstr(run "/" merge_dir[g])
        else printf "\"merge\": {\"out\": %s, \"done\": true, \"attempts\": %d, \"seconds\": %.3f, \"tokens\": %.0f, \"records\": %.0f}}", \
            jstr(run "/" merge_dir[g]), attempts[g], sum_secs[g], sum_tokens[g], sum_recs[g]
    }
    printf "\n  },\n  \"output\": {\"dir\": %s, \"tokens\": %s, \"records\": %s},\n", jstr(run "/packed"), out_tokens, out_records
    printf "  \"wall_seconds\": %.3f\n}\n", (first == "" ? 0 : last - first)
}'
