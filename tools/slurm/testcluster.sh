#!/usr/bin/env bash
# A one-node Slurm cluster on 127.0.0.1 for testing tools/slurm against real
# daemons: munged, slurmctld and slurmd, every file of theirs (slurm.conf,
# state, spool, logs, munge key and socket) in one temporary directory.
#
#   testcluster.sh run -- COMMAND [ARG ...]
#
# Installs Debian's slurm-wlm and munge when they are missing and this
# machine allows it (root, apt-get reachable), starts the cluster, runs
# COMMAND with PREP_TEST_SLURM=DIR/cluster.env (the variables a Slurm client
# needs: SLURM_CONF), and stops every daemon it started when COMMAND ends,
# fails or is interrupted. Where no cluster can be had (not root, no
# packages, a daemon that does not come up) it says why and runs COMMAND
# with PREP_TEST_SLURM_UNAVAILABLE=REASON instead, so that tests can skip
# saying so. The exit status is COMMAND's.
#
#   testcluster.sh start DIR     start a cluster in the empty directory DIR
#   testcluster.sh stop DIR      stop the daemons a start in DIR started
#
# The daemons listen on 127.0.0.1 only (NoCtldInAddrAny and NoInAddrAny), on
# ports that are free when the cluster starts; nothing is sent elsewhere.
# Slurm's and munge's own files under /etc are neither read nor written.
set -euo pipefail
export LC_ALL=C

say() { echo "testcluster.sh: $*" >&2; }

# The reason no cluster can be had, on stdout, or nothing where one can.
unavailable() {
    if [[ $(id -u) != 0 ]]; then
        echo "not root: slurmd must run as root to start jobs"
        return
    fi
    if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null ||
        ! command -v sbatch >/dev/null || ! command -v munged >/dev/null; then
        if ! command -v apt-get >/dev/null; then
            echo "slurm-wlm and munge are not installed and there is no apt-get to install them"
            return
        fi
        say "installing slurm-wlm and munge from the distribution's packages"
        if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
            apt-get install -y -qq --no-install-recommends slurm-wlm munge; } >&2; then
            echo "apt-get could not install slurm-wlm and munge"
            return
        fi
    fi
}

# A TCP port nothing on 127.0.0.1 listens on now.
free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# stop DIR: cancels the cluster's jobs, then stops every daemon whose pid file
# is in DIR, newest first, and waits for each.
stop() {
    local dir=$1 name pid k
    if [[ -f $dir/run/slurmctld.pid && -f $dir/slurm.conf ]]; then
        # A job's slurmstepd outlives slurmd: end the jobs while slurmd can.
        SLURM_CONF=$dir/slurm.conf scancel --full --quiet --user="$(id -un)" 2>/dev/null || true
        for ((k = 0; k < 100; k++)); do
            [[ -n $(SLURM_CONF=$dir/slurm.conf squeue -h -t running,completing -o %i 2>/dev/null) ]] || break
            sleep 0.1
        done
    fi
    for name in slurmd slurmctld munged; do
        [[ -f $dir/run/$name.pid ]] || continue
        pid=$(<"$dir/run/$name.pid")
        [[ $pid =~ ^[0-9]+$ ]] || continue
        # Only the daemon this start started, not a process that reused its id.
        [[ $(cat "/proc/$pid/comm" 2>/dev/null) == "$name" ]] || continue
        kill -TERM "$pid" 2>/dev/null || continue
        for ((k = 0; k < 100; k++)); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        kill -KILL "$pid" 2>/dev/null || true
        rm -f "$dir/run/$name.pid"
    done
}

# start DIR: writes the configuration, starts the daemons and waits until the
# node takes jobs. Prints the reason and returns 1 where something fails.
start() {
    local dir=$1 cpus ctld_port slurmd_port k
    mkdir -p "$dir"/{munge,state,spool,log,run}
    chmod 700 "$dir" "$dir/munge"
    cpus=$(nproc)
    ctld_port=$(free_port) slurmd_port=$(free_port)
    while [[ $slurmd_port == "$ctld_port" ]]; do slurmd_port=$(free_port); done

    # munge: a fresh key, a socket in DIR; --force because it runs as root here.
    head -c 1024 /dev/urandom >"$dir/munge/munge.key"
    chmod 400 "$dir/munge/munge.key"
    if ! munged --force --origin=127.0.0.1 --socket="$dir/munge/munge.socket" \
        --key-file="$dir/munge/munge.key" --pid-file="$dir/run/munged.pid" \
        --log-file="$dir/log/munged.log" --seed-file="$dir/munge/munged.seed" 2>>"$dir/log/munged.log"; then
        echo "munged did not start: $(tail -n 3 "$dir/log/munged.log" | tr '\n' ' ')"
        return 1
    fi

    : >"$dir/plugstack.conf"
    cat >"$dir/slurm.conf" <<EOF
# A one-node test cluster, written by tools/slurm/testcluster.sh.
ClusterName=preptest
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
CommunicationParameters=NoCtldInAddrAny,NoInAddrAny
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/munge.socket
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/run/slurmctld.pid
SlurmdPidFile=$dir/run/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
PlugStackConfig=$dir/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
MailProg=/bin/true
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
# Finished jobs stay in squeue for 10 minutes: without accounting that is
# where their final state is read.
MinJobAge=600
KillWait=5
# A job starts as soon as its dependency is met, not up to 3 s later.
SchedulerParameters=batch_sched_delay=0,sched_min_interval=0
NodeName=preptest NodeHostname=localhost NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=1024 State=UNKNOWN
PartitionName=test Nodes=preptest Default=YES MaxTime=INFINITE State=UP
EOF
    export SLURM_CONF=$dir/slurm.conf
    printf 'SLURM_CONF=%q\n' "$SLURM_CONF" >"$dir/cluster.env"

    # -c: a clean start, with no saved state.
    if ! slurmctld -c -f "$SLURM_CONF" 2>>"$dir/log/slurmctld.log"; then
        echo "slurmctld did not start: $(tail -n 3 "$dir/log/slurmctld.log" | tr '\n' ' ')"
        return 1
    fi
    if ! slurmd -N preptest -f "$SLURM_CONF" 2>>"$dir/log/slurmd.log"; then
        echo "slurmd did not start: $(tail -n 3 "$dir/log/slurmd.log" | tr '\n' ' ')"
        return 1
    fi
    # The node registers within a few seconds; give it 60.
    for ((k = 0; k < 120; k++)); do
        if [[ $(sinfo -h -N -n preptest -o %T 2>/dev/null) =~ ^(idle|mixed|allocated) ]]; then
            return 0
        fi
        sleep 0.5
    done
    echo "the node did not come up: sinfo says '$(sinfo -h -N -o '%N %T %E' 2>&1 | tr '\n' ' ')';" \
        "slurmd.log: $(tail -n 3 "$dir/log/slurmd.log" | tr '\n' ' ')"
    return 1
}

case ${1:-} in
start)
    [[ $# == 2 ]] || { say "usage: testcluster.sh start DIR"; exit 2; }
    reason=$(unavailable)
    [[ -z $reason ]] || { say "no cluster: $reason"; exit 1; }
    if ! reason=$(start "$2"); then
        say "no cluster: $reason"
        stop "$2"
        exit 1
    fi
    ;;
stop)
    [[ $# == 2 ]] || { say "usage: testcluster.sh stop DIR"; exit 2; }
    stop "$2"
    ;;
run)
    shift
    [[ ${1:-} == -- ]] && shift
    (($#)) || { say "usage: testcluster.sh run -- COMMAND [ARG ...]"; exit 2; }
    dir=$(mktemp -d "${TMPDIR:-/tmp}/prep-slurm.XXXXXX")
    trap 'stop "$dir"; rm -rf "$dir"' EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    reason=$(unavailable)
    started=$EPOCHREALTIME
    if [[ -z $reason ]] && reason=$(start "$dir"); then
        took=$(awk -v a="$started" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')
        say "a one-node cluster is up in ${took}s (state in $dir)"
        status=0
        PREP_TEST_SLURM=$dir/cluster.env "$@" || status=$?
        if ((status != 0)); then
            say "the command failed (exit $status); the daemons' logs:"
            tail -n 20 "$dir"/log/*.log >&2 || true
        fi
        exit "$status"
    fi
    say "no Slurm cluster here ($reason): the tests on real Slurm are skipped"
    stop "$dir"
    PREP_TEST_SLURM_UNAVAILABLE=$reason "$@"
    ;;
*)
    sed -n '2,22p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
    exit 2
    ;;
esac
