#!/usr/bin/env bash
# A one-node Slurm test cluster (with accounting) on this machine, for allocstack's
# real-Slurm end-to-end tests.
#
#   tests/cluster/slurm.sh start    install if needed, start every daemon, wait until usable
#   tests/cluster/slurm.sh stop     cancel jobs, stop the daemons this script started
#   tests/cluster/slurm.sh status   list daemons, show sinfo
#
# Written for Debian 12 as root with no systemd and no cgroups (see
# shared/notes/slurm.md): apt does not start daemons here, so this script starts
# munged, MariaDB, slurmdbd, slurmctld and slurmd itself, each in its own
# session with a PID file, and stops them only through those PID files.
#
# Environment:
#   ALLOCSTACK_SLURM_STATE    state dir: PID files, logs, spool, database
#                             (default /var/lib/allocstack-slurm)
#   ALLOCSTACK_SLURM_TIMEOUT  seconds `start` may wait for the daemons (default 60)
#   ALLOCSTACK_SLURM_DB_PORT  MariaDB TCP port on 127.0.0.1 (default 3307, so a
#                             system MariaDB on 3306 does not collide)
#
# Exit codes: 0 ok; 1 failure (message names the daemon and its log);
#             2 not root; 3 `status`: the cluster does not answer; 64 usage.
set -Eeuo pipefail

readonly PROG=${0##*/}
SCRIPT_DIR=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
readonly SCRIPT_DIR
readonly STATE=${ALLOCSTACK_SLURM_STATE:-/var/lib/allocstack-slurm}
readonly TIMEOUT=${ALLOCSTACK_SLURM_TIMEOUT:-60}
readonly DB_PORT=${ALLOCSTACK_SLURM_DB_PORT:-3307}
readonly RUN_DIR=$STATE/run
readonly LOG_DIR=$STATE/log
readonly DB_DIR=$STATE/mariadb
readonly DB_SOCKET_DIR=$STATE/mariadb-run
readonly DB_SOCKET=$DB_SOCKET_DIR/mariadb.sock
readonly DB_PASSWORD_FILE=$STATE/slurmdbd.password
readonly SLURM_CONF=/etc/slurm/slurm.conf
readonly SLURMDBD_CONF=/etc/slurm/slurmdbd.conf
readonly MUNGE_KEY=/etc/munge/munge.key
readonly CONF_MARKER="written by tests/cluster/slurm.sh"
readonly ACCOUNT=allocstack
# An account that exists but root may not use: tests of a refused slurm_account.
readonly OTHER_ACCOUNT=allocstack-other
readonly CLUSTER=allocstack
# tini: slurmd runs under it as a child subreaper (see start_slurmd).
readonly PACKAGES=(slurmctld slurmd slurm-client munge slurmdbd mariadb-server tini)
# Start order; `stop` walks it backwards.
readonly DAEMONS=(munged mariadb slurmdbd slurmctld slurmd)
# Daemons get a clean environment: nothing from the caller (say SLURM_* of an
# enclosing job) should leak into a long-running service.
readonly DAEMON_ENV=(env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8)
HOST=$(hostname -s)
readonly HOST
# Set by cmd_start: one deadline (bash's SECONDS) for all of its waits.
DEADLINE=0

trap 'echo "$PROG: error: line $LINENO: $BASH_COMMAND failed" >&2' ERR

info() { echo "$PROG: $*"; }
die() {
    echo "$PROG: error: $*" >&2
    exit 1
}

require_root() {
    if [[ $EUID -ne 0 ]]; then
        echo "$PROG: must run as root: it installs packages, writes /etc/slurm and starts system daemons" >&2
        exit 2
    fi
}

# ---------------------------------------------------------------- PID files

pid_file() { echo "$RUN_DIR/$1.pid"; }

# The executable a daemon's PID must belong to.
daemon_binary() {
    case $1 in
        mariadb) echo mariadbd ;;
        *) echo "$1" ;;
    esac
}

# Prints the recorded PID of daemon $1 if that process is alive and still is
# that daemon (a stale PID file may point at a recycled PID).
running_pid() {
    local name=$1 file pid arg
    file=$(pid_file "$name")
    [[ -r $file ]] || return 1
    pid=$(<"$file")
    [[ $pid =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null || return 1
    # Compare whole argv elements: "slurmd" is a substring of "slurmdbd".
    while IFS= read -r -d '' arg; do
        if [[ ${arg##*/} == "$(daemon_binary "$name")" ]]; then
            echo "$pid"
            return 0
        fi
    done <"/proc/$pid/cmdline"
    return 1
}

# Every daemon's stdout+stderr goes to $LOG_DIR/NAME.out (the Slurm daemons
# copy their log there too, and it holds fatal errors printed before a log file
# is opened); the Slurm daemons also keep a timestamped $LOG_DIR/NAME.log.
out_file() { echo "$LOG_DIR/$1.out"; }

# start_daemon NAME CMD...: runs CMD in the foreground of a new session
# (setsid, so it outlives this script and `stop` can signal its whole process
# group), output appended to NAME.out, PID in $RUN_DIR/NAME.pid.
start_daemon() {
    local name=$1 log
    shift
    log=$(out_file "$name")
    echo "--- $(date -Is) $PROG start" >>"$log"
    setsid "${DAEMON_ENV[@]}" "$@" </dev/null >>"$log" 2>&1 &
    echo $! >"$(pid_file "$name")"
    info "started $name (pid $!, log $log)"
}

# stop_daemon NAME: TERM its process group, wait up to 20 s, then KILL.
stop_daemon() {
    local name=$1 pid target i
    if ! pid=$(running_pid "$name"); then
        rm -f "$(pid_file "$name")"
        return 0
    fi
    # setsid made the daemon a process-group leader; signal the group so
    # helpers it forked (slurmctld's slurmscriptd) go too. Else the PID alone.
    target=$pid
    if [[ $(awk '{print $5}' "/proc/$pid/stat") == "$pid" ]]; then
        target=-$pid
    fi
    kill -TERM -- "$target" 2>/dev/null || true
    for ((i = 0; i < 200; i++)); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
        info "$name (pid $pid) ignored TERM for 20 s; sending KILL"
        kill -KILL -- "$target" 2>/dev/null || true
    fi
    rm -f "$(pid_file "$name")"
    info "stopped $name (pid $pid)"
}

# ---------------------------------------------------------------- waiting

# wait_for NAME WHAT CHECK...: polls CHECK until it succeeds, failing early if
# the daemon died and at the latest at the start deadline ($DEADLINE).
wait_for() {
    local name=$1 what=$2 log pid
    log=$(out_file "$name")
    shift 2
    pid=$(<"$(pid_file "$name")")
    until "$@" >/dev/null 2>&1; do
        # Liveness only: right after the fork the PID may still be running
        # setsid or env on its way to exec'ing the daemon.
        if ! kill -0 "$pid" 2>/dev/null; then
            tail -n 20 "$log" >&2 || true
            die "$name exited before $what; see $log ('$PROG stop' cleans up)"
        fi
        if ((SECONDS >= DEADLINE)); then
            tail -n 20 "$log" >&2 || true
            die "timed out after ${TIMEOUT}s waiting for $name: $what; see $log ('$PROG stop' cleans up)"
        fi
        sleep 0.5
    done
}

# ---------------------------------------------------------------- setup

install_packages() {
    local missing=() pkg
    for pkg in "${PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'ok installed' ||
            missing+=("$pkg")
    done
    ((${#missing[@]})) || return 0
    info "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

make_dirs() {
    mkdir -p "$RUN_DIR" "$LOG_DIR" "$STATE/slurmctld" "$STATE/slurmd" /etc/slurm
    chmod 755 "$STATE"
    # munged and mariadbd drop to their own users and need these.
    install -d -o munge -g munge -m 755 /run/munge
    install -d -o munge -g munge -m 700 /var/lib/munge /var/log/munge
    install -d -o mysql -g mysql -m 750 "$DB_SOCKET_DIR"
}

# install_conf PATH MODE: moves stdin into PATH only if the content changed,
# keeping a foreign file (one without our marker) as PATH.allocstack-backup.
install_conf() {
    local path=$1 mode=$2 tmp
    tmp=$(mktemp "$path.XXXXXX")
    cat >"$tmp"
    chmod "$mode" "$tmp"
    if [[ -f $path ]] && cmp -s "$tmp" "$path"; then
        rm -f "$tmp"
        return 0
    fi
    if [[ -f $path ]] && ! grep -q "$CONF_MARKER" "$path"; then
        cp -p "$path" "$path.allocstack-backup"
        info "kept the existing $path as $path.allocstack-backup"
    fi
    mv -f "$tmp" "$path"
}

write_slurm_conf() {
    [[ $STATE == /* && $STATE != *'|'* ]] ||
        die "ALLOCSTACK_SLURM_STATE must be an absolute path without '|': $STATE"
    # Every client (sbatch, srun, sacct, the Snakemake plugin) reads the default path.
    sed -e "s|@HOST@|$HOST|g" -e "s|@STATE@|$STATE|g" "$SCRIPT_DIR/slurm.conf.in" |
        install_conf "$SLURM_CONF" 644
}

write_slurmdbd_conf() {
    # slurmdbd refuses a conf readable by others: it holds the DB password.
    install_conf "$SLURMDBD_CONF" 600 <<EOF
# allocstack test cluster: $CONF_MARKER
AuthType=auth/munge
DbdAddr=127.0.0.1
DbdHost=$HOST
SlurmUser=root
LogFile=$LOG_DIR/slurmdbd.log
PidFile=$STATE/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=$(<"$DB_PASSWORD_FILE")
StorageLoc=slurm_acct_db
EOF
}

ensure_munge_key() {
    [[ -s $MUNGE_KEY ]] || mungekey --create --keyfile="$MUNGE_KEY"
    chown munge:munge "$MUNGE_KEY"
    chmod 400 "$MUNGE_KEY"
}

ensure_db_password() {
    [[ -s $DB_PASSWORD_FILE ]] && return 0
    (umask 077 && head -c 18 /dev/urandom | base64 | tr -d '/+=' >"$DB_PASSWORD_FILE")
}

# ---------------------------------------------------------------- daemons

start_munged() {
    running_pid munged >/dev/null && return 0
    # setpriv execs munged as the munge user, so the PID file holds munged
    # itself. (runuser would stay in between as a supervisor that, on TERM,
    # waits 2 s and then SIGKILLs munged: a 2-4 s stop and an unclean exit.)
    # In the foreground munged logs to stderr, i.e. to our log file.
    start_daemon munged setpriv --reuid=munge --regid=munge --init-groups \
        /usr/sbin/munged --foreground
    wait_for munged "a credential round trip (munge -n | unmunge)" \
        bash -c 'munge -n | unmunge'
}

# shellcheck disable=SC2120 # wait_for passes arguments indirectly
mariadb_client() {
    mariadb --no-defaults --protocol=socket --socket="$DB_SOCKET" -u root "$@"
}

start_mariadb() {
    running_pid mariadb >/dev/null && return 0
    if [[ ! -d $DB_DIR/mysql ]]; then
        info "initialising MariaDB datadir $DB_DIR"
        mariadb-install-db --no-defaults --user=mysql --datadir="$DB_DIR" \
            --auth-root-authentication-method=socket --skip-test-db \
            >>"$(out_file mariadb)" 2>&1 ||
            die "mariadb-install-db failed; see $(out_file mariadb)"
    fi
    # Own datadir, socket and port, bound to loopback: independent of any
    # system MariaDB and unreachable from outside. The InnoDB values are the
    # minimums slurmdbd checks for (it logs an error below them).
    start_daemon mariadb mariadbd --no-defaults --user=mysql --datadir="$DB_DIR" \
        --socket="$DB_SOCKET" --pid-file="$DB_SOCKET_DIR/mariadbd.pid" \
        --bind-address=127.0.0.1 --port="$DB_PORT" --skip-name-resolve \
        --innodb-buffer-pool-size=128M --innodb-lock-wait-timeout=900
    wait_for mariadb "a query over $DB_SOCKET" mariadb_client -e 'SELECT 1'
    # slurmdbd connects over TCP, where root's socket authentication does not
    # apply: give it its own user. ALTER keeps the password in step with the file.
    local pw
    pw=$(<"$DB_PASSWORD_FILE")
    mariadb_client <<EOF
CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$pw';
ALTER USER 'slurm'@'127.0.0.1' IDENTIFIED BY '$pw';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';
EOF
}

start_slurmdbd() {
    running_pid slurmdbd >/dev/null && return 0
    start_daemon slurmdbd slurmdbd -D
    wait_for slurmdbd "sacctmgr to reach it" sacctmgr -n list cluster
}

# The cluster, the account and root's association must exist before
# slurmctld registers, so that AccountingStorageEnforce accepts root's jobs.
ensure_accounting() {
    if [[ -z $(sacctmgr -n -P list cluster "$CLUSTER" format=cluster) ]]; then
        sacctmgr -i add cluster "$CLUSTER" >/dev/null
    fi
    if [[ -z $(sacctmgr -n -P list account "$ACCOUNT" format=account) ]]; then
        sacctmgr -i add account "$ACCOUNT" cluster="$CLUSTER" \
            description="allocstack tests" organization=allocstack >/dev/null
    fi
    if [[ -z $(sacctmgr -n -P list account "$OTHER_ACCOUNT" format=account) ]]; then
        sacctmgr -i add account "$OTHER_ACCOUNT" cluster="$CLUSTER" \
            description="an account root is not associated with" organization=allocstack >/dev/null
    fi
    if [[ -z $(sacctmgr -n -P list assoc user=root account="$ACCOUNT" format=user) ]]; then
        sacctmgr -i add user root account="$ACCOUNT" cluster="$CLUSTER" >/dev/null
    fi
    if [[ $(sacctmgr -n -P list user root format=defaultaccount) != "$ACCOUNT" ]]; then
        sacctmgr -i modify user root set defaultaccount="$ACCOUNT" >/dev/null
    fi
}

start_slurmctld() {
    running_pid slurmctld >/dev/null && return 0
    start_daemon slurmctld slurmctld -D
    wait_for slurmctld "scontrol ping to answer UP" \
        bash -c 'scontrol ping | grep -q UP'
}

# sinfo lists the node once per partition it is in: one state each time.
node_usable() {
    [[ $(sinfo -h -N -n "$HOST" -o %T | sort -u) =~ ^(idle|mixed|allocated)$ ]]
}

# slurmd runs under `tini -s`, a child subreaper that reaps every orphan at once, as init
# does on a real node. Here PID 1 is the sandbox's own process manager, which reaps
# orphans only every second or so; and `srun` leaves an orphaned child behind each time
# it runs inside a step (Slurm 22.05). With proctrack/pgid a step ends only when its
# process group is empty, zombies included, so every step that ran srun (the Snakemake
# plugin's batch step, Snakemake's step inside the job) ended ~3 s late: 3 s of each
# allocation that no real cluster has. slurmstepd is double-forked, so it and everything
# orphaned below it reparent to tini, the nearest subreaper.
start_slurmd() {
    running_pid slurmd >/dev/null && return 0
    start_daemon slurmd tini -s -- slurmd -D
    wait_for slurmd "sinfo to show node $HOST idle" node_usable
}

# True when the running slurmd was started under tini (start_slurmd).
slurmd_under_tini() {
    local pid
    pid=$(running_pid slurmd) || return 1
    tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q '^tini '
}

# A batch job must reach COMPLETED in sacct: proves slurmctld, slurmd and
# slurmdbd work together and that --account is accepted.
smoke_test() {
    local job state=
    job=$(sbatch --parsable --account="$ACCOUNT" --job-name=allocstack-smoke \
        --time=1 --output=/dev/null --wrap=true)
    until [[ $state == COMPLETED ]]; do
        state=$(sacct -n -X -P -j "$job" -o State 2>/dev/null || true)
        case $state in
            FAILED* | CANCELLED* | TIMEOUT* | NODE_FAIL* | OUT_OF_MEMORY*)
                die "smoke job $job ended $state; see $LOG_DIR/slurmd.log" ;;
        esac
        ((SECONDS < DEADLINE)) ||
            die "timed out after ${TIMEOUT}s waiting for smoke job $job to reach COMPLETED in sacct (state: '${state:-none}'); see $LOG_DIR/slurmctld.log and $LOG_DIR/slurmdbd.log"
        sleep 0.5
    done
    info "smoke job $job COMPLETED"
}

all_running() {
    local name
    for name in "${DAEMONS[@]}"; do
        running_pid "$name" >/dev/null || return 1
    done
}

cluster_answers() { timeout 15 sinfo >/dev/null 2>&1; }

# A running cluster whose slurm.conf.in changed (say a new partition): write the new
# conf and have slurmctld and slurmd re-read it. Jobs keep running; nothing is cancelled.
refresh_running_cluster() {
    local before after
    before=$(sha256sum "$SLURM_CONF" 2>/dev/null || true)
    write_slurm_conf
    after=$(sha256sum "$SLURM_CONF")
    if [[ $before != "$after" ]]; then
        info "slurm.conf changed: scontrol reconfigure"
        scontrol reconfigure
    fi
    ensure_accounting
    # A cluster started before slurmd ran under tini: restart slurmd alone. Running jobs
    # keep running (their slurmstepd does not depend on slurmd).
    if ! slurmd_under_tini; then
        install_packages
        info "restarting slurmd under tini (running jobs are not affected)"
        DEADLINE=$((SECONDS + TIMEOUT))
        stop_daemon slurmd
        start_slurmd
    fi
}

# ---------------------------------------------------------------- commands

cmd_start() {
    if all_running && cluster_answers && node_usable; then
        refresh_running_cluster
        cmd_status
        return 0
    fi
    install_packages
    make_dirs
    ensure_munge_key
    ensure_db_password
    write_slurm_conf
    write_slurmdbd_conf
    DEADLINE=$((SECONDS + TIMEOUT))
    start_munged
    start_mariadb
    start_slurmdbd
    ensure_accounting
    start_slurmctld
    start_slurmd
    smoke_test
    info "cluster up in ${SECONDS}s (state $STATE)"
}

cmd_stop() {
    local jobs i
    if running_pid slurmctld >/dev/null && cluster_answers; then
        # Cancel first, so slurmd can still end the steps and their process groups.
        jobs=$(squeue -h -o %A -t PENDING,RUNNING,SUSPENDED,COMPLETING || true)
        if [[ -n $jobs ]]; then
            info "cancelling jobs: ${jobs//$'\n'/ }"
            # shellcheck disable=SC2086 # one job ID per word
            scancel $jobs || true
            for ((i = 0; i < 30; i++)); do
                [[ -z $(squeue -h -o %A -t PENDING,RUNNING,SUSPENDED,COMPLETING) ]] && break
                sleep 0.5
            done
        fi
    fi
    for ((i = ${#DAEMONS[@]} - 1; i >= 0; i--)); do
        stop_daemon "${DAEMONS[i]}"
    done
}

cmd_status() {
    local name pid
    for name in "${DAEMONS[@]}"; do
        if pid=$(running_pid "$name"); then
            printf '%-10s running (pid %s)\n' "$name" "$pid"
        else
            printf '%-10s not running\n' "$name"
        fi
    done
    if ! timeout 15 sinfo 2>&1; then
        echo "$PROG: the cluster does not answer (sinfo failed)" >&2
        # exit, not return: a failing function would also fire the ERR trap.
        exit 3
    fi
}

usage() {
    echo "usage: $PROG start|stop|status" >&2
    exit 64
}

main() {
    (($# == 1)) || usage
    case $1 in
        start | stop | status) ;;
        *) usage ;;
    esac
    require_root
    "cmd_$1"
}

main "$@"
