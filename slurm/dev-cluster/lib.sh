# Shared helpers for slurm/dev-cluster/{start,stop,status}.sh. Sourced, not run.
# shellcheck shell=bash disable=SC2034

STATE_DIR=${LAUNCHER_SLURM_STATE:-/var/tmp/launcher-slurm}
RUN_DIR=$STATE_DIR/run
LOG_DIR=$STATE_DIR/log
SLURM_ETC=/etc/slurm
CLUSTER_NAME=${LAUNCHER_SLURM_CLUSTER:-launcher}
# Node names. Debian's slurmd runs fine several times on one host when each
# node has its own Port= (slurmd -N NAME), so by default two nodes: a job can
# ask for -N2. A single name gives a one-node cluster.
NODE_NAMES=${LAUNCHER_SLURM_NODES:-node1 node2}
DB_PORT=${LAUNCHER_SLURM_DB_PORT:-16819}
CONF_MARKER="# Managed by launcher slurm/dev-cluster/start.sh"

log() { printf '[slurm-dev %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() {
    log "ERROR: $*"
    dump_logs
    exit 1
}

dump_logs() {
    local f
    for f in "$LOG_DIR"/*.log; do
        [[ -s $f ]] || continue
        printf '\n===== tail -n 25 %s =====\n' "$f" >&2
        tail -n 25 "$f" >&2
    done
}

# Serialise start.sh/stop.sh runs on one state dir (lock on fd 9; start.sh
# launches the daemons with it closed).
lock_state_dir() {
    exec 9>"$STATE_DIR/.lock"
    flock -w 600 9 || die "could not lock $STATE_DIR/.lock (another start.sh/stop.sh running?)"
}

# slurmd pid files that exist now (nodes from the current or an older config)
slurmd_pidfiles() {
    local f
    for f in "$RUN_DIR"/slurmd-*.pid; do
        [[ -e $f ]] && echo "$f"
    done
    return 0
}

# proc_alive PID COMM: succeed if PID is a live (not zombie) process whose
# comm is COMM. PID 1 here is not an init that reaps promptly, so an exited
# daemon can linger as a zombie: treat it as dead. The comm check guards
# against a stale pid file whose pid has been reused by something else.
proc_alive() {
    local pid=$1 comm=$2 stat state
    [[ -n $pid ]] || return 1
    stat=$(cat "/proc/$pid/stat" 2>/dev/null) || return 1
    state=${stat##*) }
    state=${state%% *}
    [[ $state != Z && $state != X && $state != x ]] || return 1
    [[ -z $comm || "$(cat "/proc/$pid/comm" 2>/dev/null)" == "$comm" ]]
}

# pid_alive PIDFILE COMM: print the pid if the pid file names a live daemon.
pid_alive() {
    local f=$1 comm=$2 pid
    [[ -r $f ]] || return 1
    pid=$(head -n1 "$f" 2>/dev/null | tr -dc '0-9')
    proc_alive "$pid" "$comm" || return 1
    echo "$pid"
}

# stop_daemon NAME PIDFILE COMM [TIMEOUT]: TERM, wait, KILL; remove pid file.
stop_daemon() {
    local name=$1 f=$2 comm=$3 timeout=${4:-30} pid i
    if ! pid=$(pid_alive "$f" "$comm"); then
        rm -f "$f"
        return 0
    fi
    log "stopping $name (pid $pid)"
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < timeout * 5; i++)); do
        proc_alive "$pid" "$comm" || break
        sleep 0.2
    done
    if proc_alive "$pid" "$comm"; then
        log "$name did not exit in ${timeout}s; sending KILL"
        kill -KILL "$pid" 2>/dev/null || true
        for ((i = 0; i < 50; i++)); do
            proc_alive "$pid" "$comm" || break
            sleep 0.2
        done
    fi
    if proc_alive "$pid" "$comm"; then
        log "WARNING: $name (pid $pid) is still alive"
        return 1
    fi
    rm -f "$f"
}
