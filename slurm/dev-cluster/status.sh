#!/usr/bin/env bash
# Show which dev-cluster daemons are alive (through start.sh's pid files) and
# what Slurm reports. Exit 0 when every daemon is alive, 1 otherwise.
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
source "$HERE/lib.sh"

all=0
show() {
    local name=$1 f=$2 comm=$3 pid
    if pid=$(pid_alive "$f" "$comm"); then
        printf '  %-14s alive  pid %s\n' "$name" "$pid"
    else
        printf '  %-14s DEAD\n' "$name"
        all=1
    fi
}

echo "state dir: $STATE_DIR   config: $SLURM_ETC/slurm.conf"
echo "daemons:"
if ! pid_alive "$RUN_DIR/munged.pid" munged >/dev/null && pid=$(pid_alive /run/munge/munged.pid munged); then
    printf '  %-14s alive  pid %s (not started by start.sh)\n' munged "$pid"
else
    show munged "$RUN_DIR/munged.pid" munged
fi
show mariadb "$RUN_DIR/mariadb.pid" mariadbd
show slurmdbd "$RUN_DIR/slurmdbd.pid" slurmdbd
show slurmctld "$RUN_DIR/slurmctld.pid" slurmctld
declared=$(for n in $NODE_NAMES; do echo "$RUN_DIR/slurmd-$n.pid"; done)
for f in $( (echo "$declared"; slurmd_pidfiles) | sort -u); do
    show "$(basename "$f" .pid)" "$f" slurmd
done

if command -v sinfo >/dev/null && pid_alive "$RUN_DIR/slurmctld.pid" slurmctld >/dev/null; then
    echo
    timeout 10 sinfo -N -o '%N %P %t %c %m %G' || true
    echo
    timeout 10 squeue || true
fi
exit $all
