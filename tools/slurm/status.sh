#!/usr/bin/env bash
# How far a partitioned prep run on Slurm is: per stage, the tasks done, the
# attempts that failed, the tokens and records written, and the wall time;
# then which tasks failed and why, and what Slurm says of the run's jobs.
#
#   status.sh RUN            a table, the failures, the jobs' states, and a
#                            last line that starts with done, running or failed
#   status.sh --json RUN     RUN/run-summary.json's contents (prep-task.sh
#                            writes that file with this when merge-packed ends)
#
# Reads the attempt records RUN/.tasks/STAGE-IIIII.json of prep-task.sh and
# the task counts of RUN/slurm.env (else of the environment, as prep-task.sh).
# A task is done when one of its attempts succeeded; its tokens and records
# are those of its last successful attempt (from the manifest.json it wrote,
# or the documents of a scatter or signature part; a bucket part of prep
# dedup counts neither, and its stage shows none);
# it has failed when its last attempt failed, and the record of that attempt
# says why (prep's last line on stderr, or the signal that ended it). A
# stage's wall time runs from its first attempt's start to its last attempt's
# end; the run's from the first start to the last end, so it includes the
# time jobs waited in the queue.
#
# The states of the jobs of the last submission (RUN/slurm-jobs) come from
# sacct where the cluster keeps accounting (slurmdbd), else from squeue,
# which knows finished jobs for MinJobAge seconds (300 by default) after they
# end: enough to see a task FAILED and the jobs after it CANCELLED with reason
# DependencyNeverSatisfied (submit.sh passes --kill-on-invalid-dep=yes). Where
# neither answers, the attempt records and RUN/logs/ are all there is. $SACCT
# and $SQUEUE name the commands (default sacct and squeue; `false` for none).
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

DATA=${PREP_DATA:-$RUN}
# The manifest of the finished dataset, if there is one yet (in object
# storage, as the last merge's attempt record counted it).
output_count() {
    local v
    if [[ $DATA =~ ^[a-z0-9]+:// ]]; then
        v=$(grep -h '"ok":true' "$RUN"/.tasks/merge-packed-00000.json 2>/dev/null | tail -n 1 |
            grep -o "\"${1#n_}\":[0-9]*" | grep -o '[0-9]*$') || true
    else
        v=$(grep -o "\"$1\": *[0-9]*" "$RUN/packed/manifest.json" 2>/dev/null | head -n 1 | grep -o '[0-9]*$') || true
    fi
    echo "${v:-null}"
}

# The jobs of the last submission, as lines "slurm|STAGE|JOBID|STATE|REASON"
# in $slurm_lines (JOBID: 12, 12_3 or 12_[0-7] for an array's tasks that
# share a state), and in $slurm_source which command said so.
slurm_source=null slurm_lines=''
slurm_jobs() {
    local ids out
    [[ -f $RUN/slurm-jobs ]] || return 0
    ids=$(sed -n 's/^[a-z-]*=\([0-9][0-9]*\)$/\1/p' "$RUN/slurm-jobs" | paste -s -d, -)
    [[ -n $ids ]] || return 0
    # sacct says "accounting storage is disabled" and fails where there is no slurmdbd.
    if command -v "${SACCT:-sacct}" >/dev/null &&
        out=$(timeout 30 "${SACCT:-sacct}" -X -n -P -j "$ids" -o JobID,State,Reason 2>/dev/null) && [[ -n $out ]]; then
        slurm_source=sacct
    elif command -v "${SQUEUE:-squeue}" >/dev/null &&
        out=$(timeout 30 "${SQUEUE:-squeue}" -h -t all -j "$ids" -o '%i|%T|%r' 2>/dev/null) && [[ -n $out ]]; then
        slurm_source=squeue
    else
        return 0
    fi
    # The stage of each job id, from RUN/slurm-jobs; sacct writes "CANCELLED by 0".
    slurm_lines=$(awk -F'|' -v jobs="$RUN/slurm-jobs" '
        BEGIN { while ((getline line < jobs) > 0) { split(line, kv, "="); stage[kv[2]] = kv[1] } }
        { id = $1; sub(/_.*/, "", id); state = $2; sub(/ .*/, "", state)
          if (id in stage) print "slurm|" stage[id] "|" $1 "|" state "|" $3 }' <<<"$out")
}
slurm_jobs

{ cat "${records[@]}" /dev/null; [[ -z $slurm_lines ]] || echo "$slurm_lines"; } |
    awk -v json="$json" -v run="$RUN" -v data="$DATA" -v parts="$PREP_PARTS" -v slurm_source="$slurm_source" \
    -v buckets="$PREP_BUCKETS" -v seed="$PREP_SEED" -v seq_len="$PREP_SEQ_LEN" -v mode="${PREP_MODE:-}" \
    -v dedup="${PREP_DEDUP:-0}" -v near_dedup="${PREP_NEAR_DEDUP:-0}" \
    -v out_tokens="$(output_count n_tokens)" -v out_records="$(output_count n_records)" '
# A field of a record: a number, true, false, null, or a string without its
# quotes and escapes (prep-task.sh writes no control characters).
function field(line, key,    v) {
    if (!match(line, "\"" key "\":(\"([^\"\\\\]|\\\\.)*\"|[^,}]*)")) return ""
    v = substr(line, RSTART + length(key) + 3, RLENGTH - length(key) - 3)
    if (v ~ /^"/) {
        v = substr(v, 2, length(v) - 2)
        gsub(/\\"/, "\"", v); gsub(/\\\\/, "\\", v)
    }
    return v
}
# The array task ids of a list of specs (3, [0-7], [0,2-4%2], ...), sorted and
# written as ranges: "0-3,5". Sets n_ids to how many there are.
function ranges(list,    k, j, a, b, items, ends, ids, n, out) {
    gsub(/[][]/, "", list)
    n = 0
    k = split(list, items, ",")
    for (j = 1; j <= k; j++) {
        sub(/%.*/, "", items[j])
        if (items[j] == "") continue
        if (split(items[j], ends, "-") == 2) { a = ends[1] + 0; b = ends[2] + 0 }
        else a = b = items[j] + 0
        for (; a <= b; a++) if (!(a in ids)) { ids[a]; n++ }
    }
    n_ids = n
    out = ""
    for (a = 0; n > 0; a++) {
        if (!(a in ids)) continue
        for (b = a; (b + 1) in ids; b++) n--
        n--
        out = out (out == "" ? "" : ",") (a == b ? a : a "-" b)
        a = b
    }
    return out
}
function num(v) { return v == "null" || v == "" ? 0 : v + 0 }
function jstr(s) { gsub(/\\/, "\\\\", s); gsub(/"/, "\\\"", s); return "\"" s "\"" }
function human(n) {
    if (n >= 1e9) return sprintf("%.1fG", n / 1e9)
    if (n >= 1e6) return sprintf("%.1fM", n / 1e6)
    if (n >= 1e3) return sprintf("%.1fk", n / 1e3)
    return sprintf("%d", n)
}
/^slurm\|/ {
    split($0, sl, "|")
    if (!(sl[2] in slurm_job)) { slurm_job[sl[2]] = sl[3]; sub(/_.*/, "", slurm_job[sl[2]]) }
    task = sl[3] ~ /_/ ? sl[3] : ""; sub(/^[0-9]*_/, "", task)
    key = sl[2] SUBSEP sl[4] SUBSEP sl[5]
    if (!(key in slurm_tasks)) { slurm_keys[++n_slurm] = key; slurm_tasks[key] = task }
    else slurm_tasks[key] = slurm_tasks[key] "," task
    slurm_tasks[key] = ranges(slurm_tasks[key])
    slurm_count[key] = task == "" ? 1 : n_ids
    if (sl[4] ~ /^(FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY|BOOT_FAIL|DEADLINE|PREEMPTED)$/) slurm_failed = 1
    next
}
{
    s = field($0, "stage"); i = field($0, "index")
    if (s == "" || i == "") next  # a line cut short by a node that died mid-write
    k = s SUBSEP i
    attempts[s]++; att[k]++
    if (field($0, "ok") == "true") {
        if (!(k in ok)) done[s]++
        ok[k] = 1
        tokens[k] = field($0, "tokens"); recs[k] = field($0, "records")
        secs[k] = num(field($0, "seconds"))
        last_failed[k] = 0
    } else {
        failed[s]++
        if (!(k in ok)) {
            last_failed[k] = 1
            why[k] = field($0, "error"); why_exit[k] = field($0, "exit")
            why_job[k] = field($0, "job"); why_host[k] = field($0, "host")
        }
    }
    t0 = num(field($0, "started")); t1 = num(field($0, "finished"))
    if (!(s in start) || t0 < start[s]) start[s] = t0
    if (!(s in end) || t1 > end[s]) end[s] = t1
    if (first == "" || t0 < first) first = t0
    if (last == "" || t1 > last) last = t1
    seen[k] = 1
}
END {
    # The stages of prep dedup (--near-dedup) come between tokenize and the shuffle.
    near = near_dedup == 1 ? "signatures buckets dedup merge-deduped " : ""
    n = split("tokenize merge-tokenized " near "scatter gather merge-shuffled pack merge-packed", order, " ")
    total["tokenize"] = parts; total["scatter"] = parts; total["pack"] = parts; total["gather"] = buckets
    total["signatures"] = parts; total["buckets"] = buckets; total["dedup"] = parts
    total["merge-tokenized"] = 1; total["merge-deduped"] = 1; total["merge-shuffled"] = 1; total["merge-packed"] = 1
    merge_of["tokenize"] = "merge-tokenized"; merge_of["dedup"] = "merge-deduped"
    merge_of["gather"] = "merge-shuffled"; merge_of["pack"] = "merge-packed"
    merge_dir["merge-tokenized"] = "tokenized"; merge_dir["merge-deduped"] = "deduped"
    merge_dir["merge-shuffled"] = "shuffled"; merge_dir["merge-packed"] = "packed"
    for (k in seen) {
        split(k, ks, SUBSEP)
        if (k in ok) {
            # Scatter and signature parts count documents, not tokens, and
            # bucket parts neither: such a stage has no count of them.
            if (tokens[k] == "null" || tokens[k] == "") no_tokens[ks[1]] = 1
            if (recs[k] == "null" || recs[k] == "") no_records[ks[1]] = 1
            sum_tokens[ks[1]] += num(tokens[k]); sum_recs[ks[1]] += num(recs[k]); sum_secs[ks[1]] += secs[k]
        }
        if (last_failed[k]) failing[ks[1]]++
        if (att[k] > 1) retries[ks[1]] += att[k] - 1
    }
    status = done["merge-packed"] >= 1 ? "done" : "running"
    for (j = 1; j <= n; j++) if (failing[order[j]] > 0 && status != "done") status = "failed"
    if (slurm_failed && status != "done") status = "failed"
    # The failed tasks in stage order, then index order.
    n_fail = 0
    for (j = 1; j <= n; j++) {
        total_j = total[order[j]] > 0 ? total[order[j]] : 1
        for (i = 0; i < total_j; i++) {
            k = order[j] SUBSEP i
            if (last_failed[k]) { fail_stage[++n_fail] = order[j]; fail_index[n_fail] = i; fail_key[n_fail] = k }
        }
    }

    if (!json) {
        printf "%-16s %9s %8s %9s %10s %9s\n", "stage", "done", "failed", "tokens", "records", "wall s"
        for (j = 1; j <= n; j++) {
            s = order[j]
            printf "%-16s %9s %8d %9s %10s %9s\n", s, (done[s] + 0) "/" total[s], failed[s], \
                (s in no_tokens ? "-" : human(sum_tokens[s])), \
                (s in no_records ? "-" : sprintf("%.0f", sum_recs[s])), \
                (s in start ? sprintf("%.1f", end[s] - start[s]) : "-")
        }
        for (q = 1; q <= n_fail; q++) {
            k = fail_key[q]
            printf "failed: %s task %d (job %s on %s, exit %s): %s\n", fail_stage[q], fail_index[q], why_job[k], \
                why_host[k], why_exit[k], (why[k] == "" ? "no message" : why[k])
            if (why_job[k] != "") printf "        log: %s/logs/prep-%s-%s.out\n", run, fail_stage[q], why_job[k]
        }
        for (j = 1; j <= n; j++) {
            for (m = 1; m <= n_slurm; m++) {
                split(slurm_keys[m], sk, SUBSEP)
                if (sk[1] != order[j]) continue
                printf "slurm: %s job %s: %s", sk[1], slurm_job[sk[1]], sk[2]
                if (slurm_tasks[slurm_keys[m]] != "")
                    printf " (%s %s)", (slurm_count[slurm_keys[m]] == 1 ? "task" : "tasks"), slurm_tasks[slurm_keys[m]]
                if (sk[3] != "" && sk[3] != "None") printf ", reason %s", sk[3]
                printf "\n"
            }
        }
        printf "%s", status
        if (first != "") printf " (%.1fs from the first task start to the last task end)", last - first
        printf "\n"
        exit
    }
    printf "{\n  \"engine\": \"slurm\",\n  \"status\": \"%s\",\n  \"run\": %s,\n", status, jstr(run)
    printf "  \"config\": {\"parts\": %d, \"buckets\": %d, \"seed\": %s, \"seq_len\": %d, \"mode\": %s, \"dedup\": %s, \"near_dedup\": %s},\n", \
        parts, buckets, seed, seq_len, (mode == "" ? "null" : jstr(mode)), (dedup == 1 ? "true" : "false"), \
        (near_dedup == 1 ? "true" : "false")
    printf "  \"stages\": {"
    m = split("tokenize " (near_dedup == 1 ? "signatures buckets dedup " : "") "scatter gather pack", stages, " ")
    for (j = 1; j <= m; j++) {
        s = stages[j]
        printf "%s\n    \"%s\": {\"tasks\": %d, \"done\": %d, \"attempts\": %d, \"retries\": %d, ", \
            (j > 1 ? "," : ""), s, total[s], done[s], attempts[s], retries[s]
        printf "\"failed_attempts\": %d, \"wall_seconds\": %.3f, \"task_seconds\": %.3f, \"tokens\": %s, \"records\": %s, ", \
            failed[s], (s in start ? end[s] - start[s] : 0), sum_secs[s], \
            (s in no_tokens ? "null" : sprintf("%.0f", sum_tokens[s])), \
            (s in no_records ? "null" : sprintf("%.0f", sum_recs[s]))
        g = merge_of[s]
        if (g == "") printf "\"merge\": null}"
        else if (!done[g]) printf "\"merge\": {\"out\": %s, \"done\": false}}", jstr(data "/" merge_dir[g])
        else printf "\"merge\": {\"out\": %s, \"done\": true, \"attempts\": %d, \"seconds\": %.3f, \"tokens\": %.0f, \"records\": %.0f}}", \
            jstr(data "/" merge_dir[g]), attempts[g], sum_secs[g], sum_tokens[g], sum_recs[g]
    }
    printf "\n  },\n  \"failures\": ["
    for (q = 1; q <= n_fail; q++) {
        k = fail_key[q]
        printf "%s\n    {\"stage\": %s, \"index\": %d, \"exit\": %d, \"job\": %s, \"host\": %s, \"error\": %s}", \
            (q > 1 ? "," : ""), jstr(fail_stage[q]), fail_index[q], why_exit[k], jstr(why_job[k]), jstr(why_host[k]), \
            (why[k] == "" ? "null" : jstr(why[k]))
    }
    printf "%s],\n", (n_fail ? "\n  " : "")
    if (slurm_source == "null") printf "  \"slurm\": null,\n"
    else {
        printf "  \"slurm\": {\"source\": %s, \"jobs\": [", jstr(slurm_source)
        c = 0
        for (j = 1; j <= n; j++) {
            for (m = 1; m <= n_slurm; m++) {
                split(slurm_keys[m], sk, SUBSEP)
                if (sk[1] != order[j]) continue
                printf "%s\n    {\"stage\": %s, \"job\": %s, \"state\": %s, \"reason\": %s, \"tasks\": %s, \"count\": %d}", \
                    (c++ ? "," : ""), jstr(sk[1]), jstr(slurm_job[sk[1]]), jstr(sk[2]), \
                    (sk[3] == "" || sk[3] == "None" ? "null" : jstr(sk[3])), \
                    (slurm_tasks[slurm_keys[m]] == "" ? "null" : jstr(slurm_tasks[slurm_keys[m]])), slurm_count[slurm_keys[m]]
            }
        }
        printf "%s]},\n", (c ? "\n  " : "")
    }
    printf "  \"output\": {\"dir\": %s, \"tokens\": %s, \"records\": %s},\n", jstr(data "/packed"), out_tokens, out_records
    printf "  \"wall_seconds\": %.3f\n}\n", (first == "" ? 0 : last - first)
}'
