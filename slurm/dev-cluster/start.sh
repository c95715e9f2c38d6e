#!/usr/bin/env bash
# Start (idempotently) a real single-machine Slurm cluster for development and
# CI: munged, MariaDB, slurmdbd, slurmctld and slurmd, each tracked through a
# pid file in the state dir. See README.md next to this file.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
source "$HERE/lib.sh"

TIMEOUT=${LAUNCHER_SLURM_TIMEOUT:-180}
PACKAGES=(munge slurmctld slurmd slurm-client slurmdbd mariadb-server)
T0=$SECONDS

[[ $(id -u) == 0 ]] || { echo "start.sh must run as root (it installs packages and runs the Slurm daemons)" >&2; exit 1; }

# ---------------------------------------------------------------- packages
install_packages() {
    local missing=() p
    for p in "${PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
    done
    ((${#missing[@]})) || return 0
    log "installing ${missing[*]} (apt-get)"
    local t=$SECONDS created_policy=0
    # Keep the packages' maintainer scripts from starting their own copies of
    # the daemons (there is no systemd here; invoke-rc.d honours policy-rc.d).
    if [[ ! -e /usr/sbin/policy-rc.d ]]; then
        printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
        chmod 755 /usr/sbin/policy-rc.d
        created_policy=1
    fi
    local rc=0
    {
        export DEBIAN_FRONTEND=noninteractive
        apt-get -o DPkg::Lock::Timeout=300 update -qq &&
            apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends "${missing[@]}"
    } >"${TMPDIR:-/tmp}/launcher-slurm-apt.log" 2>&1 || rc=$?
    ((created_policy)) && rm -f /usr/sbin/policy-rc.d
    if ((rc)); then
        tail -n 40 "${TMPDIR:-/tmp}/launcher-slurm-apt.log" >&2
        die "apt-get install failed (rc=$rc)"
    fi
    log "packages installed in $((SECONDS - t))s"
}
install_packages

# ---------------------------------------------------------------- layout
mkdir -p "$STATE_DIR"
lock_state_dir
mkdir -p "$RUN_DIR" "$LOG_DIR" "$STATE_DIR/spool/ctld" "$STATE_DIR/dev-fake" "$SLURM_ETC"
chmod 755 "$STATE_DIR"
for i in 0 1 2 3 4 5 6 7; do
    ln -sfn /dev/null "$STATE_DIR/dev-fake/nvidia$i"
done
HOST=$(hostname -s)
DB_PASS_FILE=$STATE_DIR/db.pass
if [[ ! -s $DB_PASS_FILE ]]; then
    (umask 077 && head -c 18 /dev/urandom | base64 | tr -dc 'A-Za-z0-9' >"$DB_PASS_FILE")
fi
DB_PASS=$(cat "$DB_PASS_FILE")

# ---------------------------------------------------------------- configs
# write_conf PATH MODE FLAGVAR: stdin -> PATH when the content differs, and
# then set FLAGVAR=1. Refuses to overwrite a file that start.sh did not write.
CHANGED_SLURM=0
CHANGED_DBD=0
write_conf() {
    local path=$1 mode=$2 flag=$3 tmp
    if [[ -e $path ]] && ! grep -qF "$CONF_MARKER" "$path" && [[ -z ${LAUNCHER_SLURM_FORCE_CONF:-} ]]; then
        die "$path exists and was not written by start.sh; move it away or set LAUNCHER_SLURM_FORCE_CONF=1"
    fi
    tmp=$(mktemp "$path.XXXXXX")
    cat >"$tmp"
    chmod "$mode" "$tmp"
    chown root:root "$tmp"
    if [[ -e $path ]] && cmp -s "$tmp" "$path"; then
        rm -f "$tmp"
        return 0
    fi
    mv -f "$tmp" "$path"
    printf -v "$flag" 1
    log "wrote $path"
}

node_lines() {
    local n port="" i=0
    for n in $NODE_NAMES; do
        # several slurmd's on one host need a port each
        [[ $(wc -w <<<"$NODE_NAMES") -gt 1 ]] && port="Port=$((17001 + i++)) "
        echo "NodeName=$n NodeHostname=$HOST NodeAddr=127.0.0.1 ${port}CPUs=16 Boards=1 SocketsPerBoard=1 CoresPerSocket=16 ThreadsPerCore=1 RealMemory=20000 Gres=gpu:8 State=UNKNOWN"
    done
}

write_conf "$SLURM_ETC/slurm.conf" 644 CHANGED_SLURM <<EOF
$CONF_MARKER
# (state dir $STATE_DIR). Regenerated on every start; edit start.sh instead.
ClusterName=$CLUSTER_NAME
SlurmctldHost=$HOST(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort=6817
SlurmdPort=6818
AuthType=auth/munge
CredType=cred/munge
# Short step-credential lifetime: a requeued job restarts after ~30 s, not 120 s.
AuthInfo=cred_expire=30
StateSaveLocation=$STATE_DIR/spool/ctld
SlurmdSpoolDir=$STATE_DIR/spool/slurmd-%n
SlurmctldPidFile=$RUN_DIR/slurmctld.pid
SlurmdPidFile=$RUN_DIR/slurmd-%n.pid
SlurmctldLogFile=$LOG_DIR/slurmctld.log
SlurmdLogFile=$LOG_DIR/slurmd-%n.log
SlurmctldDebug=info
MailProg=/bin/true
SlurmdDebug=info
# No cgroups here: track processes through /proc, no task binding.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
# Without a default every job would be given all of the node's memory.
DefMemPerCPU=1000
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0
# Let the node declare more CPUs than the machine has (see NodeName below).
SlurmdParameters=config_overrides
ReturnToService=2
JobRequeue=1
KillWait=5
MinJobAge=30
InactiveLimit=0
Waittime=0
SlurmctldTimeout=30
SlurmdTimeout=60
MessageTimeout=10
GresTypes=gpu
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=6819
AccountingStorageTRES=gres/gpu
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=30
JobCompType=jobcomp/none
$(node_lines)
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF

write_conf "$SLURM_ETC/gres.conf" 644 CHANGED_SLURM <<EOF
$CONF_MARKER
# Fake GPUs: device files are symlinks to /dev/null. A File-less Count= would
# make the node invalid; AutoDetect=off keeps slurmd from probing NVML.
AutoDetect=off
Name=gpu File=$STATE_DIR/dev-fake/nvidia[0-7]
EOF

write_conf "$SLURM_ETC/slurmdbd.conf" 600 CHANGED_DBD <<EOF
$CONF_MARKER
AuthType=auth/munge
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=6819
SlurmUser=root
PidFile=$RUN_DIR/slurmdbd.pid
LogFile=$LOG_DIR/slurmdbd.log
DebugLevel=info
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=$DB_PASS
StorageLoc=slurm_acct_db
EOF

# ---------------------------------------------------------------- helpers
# wait_pidfile NAME PIDFILE COMM: wait for a daemon we just launched.
wait_pidfile() {
    local name=$1 f=$2 comm=$3 i
    for ((i = 0; i < 150; i++)); do
        pid_alive "$f" "$comm" >/dev/null && return 0
        sleep 0.2
    done
    die "$name did not come up (no live pid in $f)"
}

# wait_for DESCRIPTION SECONDS CMD...: retry CMD until it succeeds.
wait_for() {
    local what=$1 secs=$2 deadline
    shift 2
    deadline=$((SECONDS + secs))
    until "$@" >/dev/null 2>&1; do
        ((SECONDS < deadline)) || die "timed out after ${secs}s waiting for $what"
        sleep 0.5
    done
}

# detach CMD...: run CMD with every file descriptor above 2 closed, so a
# daemon holds neither our lock (fd 9) nor a pipe of whoever ran start.sh (a
# CI runner waiting for EOF on its pipes would otherwise wait forever), and
# with a clean environment (not the caller's venv, CI variables, ...).
detach() {
    (
        for fd in "/proc/$BASHPID/fd/"*; do
            fd=${fd##*/}
            if ((fd > 2)); then eval "exec $fd>&-" 2>/dev/null || true; fi
        done
        exec env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 HOME=/root "$@"
    )
}

# ---------------------------------------------------------------- munge
start_munged() {
    local f=$RUN_DIR/munged.pid pid
    if pid_alive "$f" munged >/dev/null; then return 0; fi
    rm -f "$f"
    if [[ ! -s /etc/munge/munge.key ]]; then
        log "generating /etc/munge/munge.key"
        install -d -o munge -g munge -m 0700 /etc/munge
        if command -v mungekey >/dev/null; then
            mungekey --create --keyfile=/etc/munge/munge.key --force
        else
            dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none
        fi
        chown munge:munge /etc/munge/munge.key
        chmod 0400 /etc/munge/munge.key
    fi
    [[ $(stat -c %U /etc/munge/munge.key) == munge ]] || chown munge:munge /etc/munge/munge.key
    install -d -o munge -g munge -m 0755 /run/munge
    if pid=$(pid_alive /run/munge/munged.pid munged) && munge -n </dev/null | unmunge >/dev/null 2>&1; then
        # Not ours (no pid file of ours): use it, and leave it to whoever started it.
        log "using the munged already running (pid $pid), not started by start.sh; stop.sh will leave it"
        return 0
    fi
    rm -f /run/munge/munged.pid
    install -d -o munge -g munge -m 0700 /var/lib/munge /var/log/munge
    log "starting munged"
    # munged insists on running as the owner of its key (the munge user).
    # It writes its pid where that user may; we keep a copy in the state dir.
    detach runuser -u munge -- /usr/sbin/munged --pid-file=/run/munge/munged.pid \
        --log-file="/var/log/munge/munged.log" </dev/null >>"$LOG_DIR/munged.stdout" 2>&1 ||
        die "munged failed to start: $(tail -n 5 /var/log/munge/munged.log 2>/dev/null)"
    ln -sfn /var/log/munge/munged.log "$LOG_DIR/munged.log"
    wait_pidfile munged /run/munge/munged.pid munged
    cp /run/munge/munged.pid "$f"
    wait_for "munge to answer" 20 bash -c 'munge -n | unmunge'
}

# ---------------------------------------------------------------- mariadb
DB_SOCK=$RUN_DIR/mariadb.sock
start_mariadb() {
    local f=$RUN_DIR/mariadb.pid datadir=$STATE_DIR/mysql
    if ! pid_alive "$f" mariadbd >/dev/null; then
        rm -f "$f"
        if [[ ! -d $datadir/mysql ]]; then
            log "initialising MariaDB data dir $datadir"
            rm -rf "$datadir"
            mariadb-install-db --no-defaults --datadir="$datadir" --user=root \
                --auth-root-authentication-method=socket --skip-test-db \
                >"$LOG_DIR/mariadb-install.log" 2>&1 || die "mariadb-install-db failed (see $LOG_DIR/mariadb-install.log)"
        fi
        log "starting mariadbd (127.0.0.1:$DB_PORT)"
        # mariadbd does not daemonize itself: setsid -f forks it off, so that
        # no shell of ours lingers as its parent holding our fds and lock.
        detach setsid -f /usr/sbin/mariadbd --no-defaults --user=root --datadir="$datadir" \
            --socket="$DB_SOCK" --pid-file="$f" --port="$DB_PORT" --bind-address=127.0.0.1 \
            --skip-name-resolve --log-error="$LOG_DIR/mariadb.log" \
            --innodb-buffer-pool-size=128M --innodb-log-file-size=64M \
            --innodb-lock-wait-timeout=900 --max-connections=100 \
            </dev/null >>"$LOG_DIR/mariadb.stdout" 2>&1
        wait_pidfile mariadbd "$f" mariadbd
        wait_for "MariaDB to accept connections" 60 mariadb-admin --no-defaults -S "$DB_SOCK" -u root ping
    fi
    mariadb --no-defaults -S "$DB_SOCK" -u root <<SQL || die "could not create the slurm database/user"
CREATE DATABASE IF NOT EXISTS slurm_acct_db;
CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '$DB_PASS';
CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$DB_PASS';
ALTER USER 'slurm'@'localhost' IDENTIFIED BY '$DB_PASS';
ALTER USER 'slurm'@'127.0.0.1' IDENTIFIED BY '$DB_PASS';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';
SQL
}

# ---------------------------------------------------------------- slurm
start_slurmdbd() {
    local f=$RUN_DIR/slurmdbd.pid
    if ((CHANGED_DBD)); then stop_daemon slurmdbd "$f" slurmdbd; fi
    if ! pid_alive "$f" slurmdbd >/dev/null; then
        rm -f "$f"
        log "starting slurmdbd"
        detach setsid /usr/sbin/slurmdbd </dev/null >>"$LOG_DIR/slurmdbd.stdout" 2>&1 || die "slurmdbd failed to start"
        wait_pidfile slurmdbd "$f" slurmdbd
    fi
    # The first start creates the accounting tables: can take a while.
    wait_for "slurmdbd to answer" "$TIMEOUT" sacctmgr -n -P show cluster
}

register_accounting() {
    if ! sacctmgr -n -P show cluster format=cluster | grep -qx "$CLUSTER_NAME"; then
        sacctmgr -i add cluster "$CLUSTER_NAME" >/dev/null || die "sacctmgr add cluster failed"
    fi
    if ! sacctmgr -n -P show account format=account | grep -qx launcher; then
        sacctmgr -i add account launcher Cluster="$CLUSTER_NAME" Description=launcher Organization=launcher >/dev/null ||
            die "sacctmgr add account failed"
    fi
    if ! sacctmgr -n -P show assoc where user=root account=launcher cluster="$CLUSTER_NAME" format=user | grep -qx root; then
        sacctmgr -i add user root Account=launcher Cluster="$CLUSTER_NAME" >/dev/null || die "sacctmgr add user failed"
    fi
}

start_slurmctld() {
    local f=$RUN_DIR/slurmctld.pid
    if ((CHANGED_SLURM)); then
        # slurm.conf/gres.conf changed (or first start): restart with the new
        # config; node lists may differ, so stop every slurmd we know of.
        stop_all_slurmd
        stop_daemon slurmctld "$f" slurmctld
    fi
    if ! pid_alive "$f" slurmctld >/dev/null; then
        rm -f "$f"
        log "starting slurmctld"
        detach setsid /usr/sbin/slurmctld -i </dev/null >>"$LOG_DIR/slurmctld.stdout" 2>&1 || die "slurmctld failed to start"
        wait_pidfile slurmctld "$f" slurmctld
    fi
    wait_for "slurmctld to answer" 60 scontrol ping
}

stop_all_slurmd() {
    local f
    for f in $(slurmd_pidfiles); do
        stop_daemon "$(basename "$f" .pid)" "$f" slurmd
    done
}

start_slurmd() {
    local n=$1 f=$RUN_DIR/slurmd-$1.pid
    if ! pid_alive "$f" slurmd >/dev/null; then
        rm -f "$f"
        mkdir -p "$STATE_DIR/spool/slurmd-$n"
        log "starting slurmd for node $n"
        detach setsid /usr/sbin/slurmd -N "$n" </dev/null >>"$LOG_DIR/slurmd-$n.stdout" 2>&1 || die "slurmd ($n) failed to start"
        wait_pidfile "slurmd-$n" "$f" slurmd
    fi
}

nodes_ready() {
    local out
    out=$(sinfo -h -N -p debug -o '%N %t') || return 1
    # every node listed, none down/drained/invalid/unknown
    [[ $(wc -l <<<"$out") -ge $(wc -w <<<"$NODE_NAMES") ]] || return 1
    ! grep -Eqv ' (idle|mix|alloc|comp)$' <<<"$out"
}

resume_nodes() {
    local n st
    for n in $NODE_NAMES; do
        st=$(sinfo -h -n "$n" -o '%t' 2>/dev/null | head -n1)
        case $st in
            drain* | drng* | down* | fail*)
                log "node $n is $st; resuming it"
                scontrol update NodeName="$n" State=RESUME || true
                ;;
        esac
    done
}

start_munged
start_mariadb
start_slurmdbd
register_accounting
start_slurmctld
# a slurmd for a node that is no longer configured
for f in $(slurmd_pidfiles); do
    n=$(basename "$f" .pid)
    n=${n#slurmd-}
    [[ " $NODE_NAMES " == *" $n "* ]] || stop_daemon "slurmd-$n" "$f" slurmd
done
for n in $NODE_NAMES; do start_slurmd "$n"; done

deadline=$((SECONDS + TIMEOUT))
until nodes_ready; do
    if ((SECONDS >= deadline)); then
        sinfo -N -l >&2 || true
        die "timed out after ${TIMEOUT}s waiting for the node(s) to become idle"
    fi
    resume_nodes
    sleep 1
done
wait_for "sacct to answer" 60 sacct -n -X -S now-1hours

log "cluster '$CLUSTER_NAME' is up in $((SECONDS - T0))s (state dir $STATE_DIR, config $SLURM_ETC)"
sinfo -N -o '%N %P %t %c %m %G' >&2
