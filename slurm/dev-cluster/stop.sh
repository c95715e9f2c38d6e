#!/usr/bin/env bash
# Stop the Slurm dev cluster that start.sh started, through its pid files
# only. Idempotent. By default running/pending jobs are cancelled first (so
# no job processes outlive the cluster); --keep-jobs leaves them, and Slurm
# re-attaches to still-running steps on the next start.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
source "$HERE/lib.sh"

KEEP_JOBS=0
for arg in "$@"; do
    case $arg in
        --keep-jobs) KEEP_JOBS=1 ;;
        -h | --help)
            echo "usage: $0 [--keep-jobs]"
            exit 0
            ;;
        *)
            echo "unknown argument: $arg" >&2
            exit 2
            ;;
    esac
done

[[ $(id -u) == 0 ]] || { echo "stop.sh must run as root" >&2; exit 1; }

if [[ ! -d $RUN_DIR ]]; then
    log "nothing to stop ($RUN_DIR does not exist)"
    exit 0
fi

lock_state_dir

if ((!KEEP_JOBS)) && pid_alive "$RUN_DIR/slurmctld.pid" slurmctld >/dev/null; then
    jobs=$(timeout 20 squeue -h -o %A 2>/dev/null | sort -u | tr '\n' ' ' || true)
    if [[ -n ${jobs// /} ]]; then
        log "cancelling jobs: $jobs"
        # shellcheck disable=SC2086
        timeout 20 scancel $jobs 2>/dev/null || true
        for ((i = 0; i < 40; i++)); do
            [[ -z $(timeout 10 squeue -h -o %A 2>/dev/null || true) ]] && break
            sleep 0.5
        done
    fi
fi

rc=0
for f in $(slurmd_pidfiles); do
    stop_daemon "$(basename "$f" .pid)" "$f" slurmd || rc=1
done
stop_daemon slurmctld "$RUN_DIR/slurmctld.pid" slurmctld || rc=1
stop_daemon slurmdbd "$RUN_DIR/slurmdbd.pid" slurmdbd || rc=1
stop_daemon mariadb "$RUN_DIR/mariadb.pid" mariadbd 60 || rc=1
stop_daemon munged "$RUN_DIR/munged.pid" munged || rc=1

if ((rc)); then
    log "some daemons could not be stopped"
    exit 1
fi
log "stopped (state kept in $STATE_DIR)"
