#!/usr/bin/env bash
# A Slurm test cluster (with accounting) on this machine, for allocstack's real-Slurm
# end-to-end tests: one node named after `hostname -s` (partitions debug and short), and on
# request N more nodes, each a slurmd in its own network, UTS and mount namespace.
#
#   tests/cluster/slurm.sh start              install if needed, start every daemon, wait until
#                                             usable; the single-node layout (the default)
#   tests/cluster/slurm.sh start --nodes 3    the same plus 3 namespaced nodes mn1..mn3 in
#                                             partition `multi`, beside the unchanged default
#                                             node and partitions
#   tests/cluster/slurm.sh start --nodes 6 --sets 2
#                                             6 namespaced nodes in 2 partitions of 3: `multi`
#                                             (mn1..mn3) and `multi2` (mn4..mn6), so that two
#                                             tests that each need their nodes idle run at once
#   tests/cluster/slurm.sh stop               cancel jobs, stop the daemons this script started
#   tests/cluster/slurm.sh purge              stop, then remove every piece of state and the
#                                             packages `start` installed, so that the next
#                                             `start` is a first start (what a fresh machine
#                                             runs; `.ci/run` starts from it)
#   tests/cluster/slurm.sh status             list daemons, show sinfo
#   tests/cluster/slurm.sh exec NODE CMD...   run CMD inside namespaced node NODE (its network,
#                                             hostname and mounts), e.g. `exec mn2 ip -br addr`
#   tests/cluster/slurm.sh crash NODE         kill every process of namespaced node NODE at once
#                                             (its slurmd, job steps and their programs), as a
#                                             power failure would; `start --nodes N` revives it
#
# The namespaced nodes (see shared/notes/multinode.md): each has its own hostname (mnK), its
# own address (10.254.1.1K) on a bridge this script creates (asbr0, the controller is
# 10.254.1.1 there), its own loopback, and no route anywhere else: the nodes only ever talk to
# each other and to the controller. They share the filesystem (munge's socket, the project
# directory), as the nodes of a real cluster share theirs, except one directory: each node has
# its own $NODE_SCRATCH (/tmp/allocstack-node-scratch, a bind of $STATE/multi/mnK/scratch in the
# node's mount namespace; an empty directory on the host), node-local scratch as most centers'
# $SLURM_TMPDIR or $TMPDIR is. One slurmctld manages all nodes:
#  - it reads $STATE/multi/slurm.conf, which includes /etc/slurm/slurm.conf (the single-node
#    configuration every client reads, left exactly as `start` writes it) and adds the nodes and
#    partition `multi`, so a `start` of another checkout that rewrites /etc/slurm/slurm.conf and
#    reconfigures never changes the node set (Slurm 22.05's slurmctld exits on a reconfigure
#    that does: "hostnames inconsistency detected");
#  - the namespaced slurmds (and every job step on them) read their own view of the same
#    configuration, bind-mounted over /etc/slurm/slurm.conf in their mount namespace: the
#    controller's address on the bridge instead of 127.0.0.1, their own spool, PID and log
#    files; and an /etc/hosts naming every node, bind-mounted the same way;
#  - adding or removing nodes restarts slurmctld only (running jobs survive; nothing is
#    cancelled). Going back to one node is refused while jobs run in a multi-node partition.
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
#   ALLOCSTACK_SLURM_NET      first three octets of the namespaced nodes' network
#                             (default 10.254.1: controller .1, node K at .1K)
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
# tini: slurmd runs under it as a child subreaper (see start_slurmd). iproute2: `ip` for the
# namespaced nodes' bridge and links.
readonly PACKAGES=(slurmctld slurmd slurm-client munge slurmdbd mariadb-server tini iproute2)
# Start order; `stop` walks it backwards.
readonly DAEMONS=(munged mariadb slurmdbd slurmctld slurmd)
# Daemons get a clean environment: nothing from the caller (say SLURM_* of an
# enclosing job) should leak into a long-running service.
readonly DAEMON_ENV=(env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8)
HOST=$(hostname -s)
readonly HOST
# Set by cmd_start: one deadline (bash's SECONDS) for all of its waits.
DEADLINE=0

# The namespaced nodes (start --nodes N [--sets S]): names mn1..mnN, in S partitions of N/S
# nodes each: `multi`, `multi2`, ... (set_partition).
readonly NODE_PREFIX=mn
readonly MULTI_PARTITION=multi
readonly MAX_NODES=9
readonly NET=${ALLOCSTACK_SLURM_NET:-10.254.1}
readonly BRIDGE=asbr0
readonly BRIDGE_ADDR=$NET.1
readonly MULTI_DIR=$STATE/multi
# What slurmctld reads in the multi-node layout (includes $SLURM_CONF), what the nodes read.
readonly CONTROLLER_CONF=$MULTI_DIR/slurm.conf
readonly NODE_CONF=$MULTI_DIR/node-slurm.conf
readonly NODE_HOSTS=$MULTI_DIR/hosts
# The layout for tests and benchmarks: partition, bridge, node names and addresses (JSON).
readonly LAYOUT_FILE=$MULTI_DIR/layout.json
# Node-local scratch: the same path on every namespaced node, a different directory on each
# (node_scratch_dir: what the host sees of node NAME's), world-writable with the sticky bit as a
# node's /tmp, so a run's own modes keep other users out.
readonly NODE_SCRATCH=/tmp/allocstack-node-scratch
node_scratch_dir() { echo "$MULTI_DIR/$1/scratch"; }

trap 'echo "$PROG: error: line $LINENO: $BASH_COMMAND failed" >&2' ERR
# shellcheck source=tests/cluster/packages.sh
. "$SCRIPT_DIR/packages.sh"

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
        slurmd-*) echo slurmd ;;
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
# group), output appended to NAME.out, PID in $RUN_DIR/NAME.pid. It inherits no
# other descriptor of ours: a daemon holding the caller's `flock FILE` descriptor
# would hold that lock for as long as it runs.
start_daemon() {
    local name=$1 log
    shift
    log=$(out_file "$name")
    echo "--- $(date -Is) $PROG start" >>"$log"
    (
        close_inherited_fds
        exec setsid "${DAEMON_ENV[@]}" "$@" </dev/null >>"$log" 2>&1
    ) &
    echo $! >"$(pid_file "$name")"
    info "started $name (pid $!, log $log)"
}

# In a subshell about to exec a daemon: close every descriptor above 2.
close_inherited_fds() {
    local fd
    for fd in /proc/"$BASHPID"/fd/*; do
        fd=${fd##*/}
        if ((fd > 2)); then
            eval "exec $fd>&-" 2>/dev/null || true
        fi
    done
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
    packages_install slurm "${PACKAGES[@]}"
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
    install_job_scripts
    # Every client (sbatch, srun, sacct, the Snakemake plugin) reads the default path.
    sed -e "s|@HOST@|$HOST|g" -e "s|@STATE@|$STATE|g" "$SCRIPT_DIR/slurm.conf.in" |
        install_conf "$SLURM_CONF" 644
}

# The Prolog, Epilog and TaskProlog slurm.conf names (job-tmpdir.sh under those names): a copy in
# the state directory, so the configuration never points into a checkout that may go away.
install_job_scripts() {
    local name
    mkdir -p "$STATE/scripts"
    install -m 755 "$SCRIPT_DIR/job-tmpdir.sh" "$STATE/scripts/job-tmpdir.sh.new"
    mv -f "$STATE/scripts/job-tmpdir.sh.new" "$STATE/scripts/job-tmpdir.sh"
    for name in prolog epilog task-prolog; do
        ln -sfn job-tmpdir.sh "$STATE/scripts/$name"
    done
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

# slurmctld reads /etc/slurm/slurm.conf, or with namespaced nodes ($WANT_NODES > 1) the
# controller's configuration that includes it.
start_slurmctld() {
    running_pid slurmctld >/dev/null && return 0
    if ((WANT_NODES > 1)); then
        start_daemon slurmctld slurmctld -D -f "$CONTROLLER_CONF"
    else
        start_daemon slurmctld slurmctld -D
    fi
    wait_for slurmctld "scontrol ping to answer UP" \
        bash -c 'scontrol ping | grep -q UP'
}

# A new node set needs a restart in Slurm 22.05 (a reconfigure would make slurmctld exit).
# Job state is saved on TERM and recovered on start: running jobs survive, none is cancelled.
restart_slurmctld() {
    info "restarting slurmctld for the new node set (running jobs survive)"
    RESTARTED=1
    stop_daemon slurmctld
    DEADLINE=$((SECONDS + TIMEOUT))
    start_slurmctld
}

# sinfo prints a node once per partition it is in (the default node is in two): the first line.
node_state() {
    local states
    states=$(sinfo -h -N -n "$1" -o %T)
    echo "${states%%$'\n'*}"
}

node_usable() {
    [[ $(node_state "$HOST") =~ ^(idle|mixed|allocated)$ ]]
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
    local job
    job=$(sbatch --parsable --account="$ACCOUNT" --job-name=allocstack-smoke \
        --time=1 --output=/dev/null --wrap=true)
    await_completed "$job" "smoke job" "$LOG_DIR/slurmd.log"
    info "smoke job $job COMPLETED"
}

# await_completed JOB WHAT LOG: wait (until $DEADLINE) for JOB to reach COMPLETED in sacct.
await_completed() {
    local job=$1 what=$2 log=$3 state=
    until [[ $state == COMPLETED ]]; do
        state=$(sacct -n -X -P -j "$job" -o State 2>/dev/null || true)
        case $state in
            FAILED* | CANCELLED* | TIMEOUT* | NODE_FAIL* | OUT_OF_MEMORY*)
                die "$what $job ended $state; see $log" ;;
        esac
        ((SECONDS < DEADLINE)) ||
            die "timed out after ${TIMEOUT}s waiting for $what $job to reach COMPLETED in sacct (state: '${state:-none}'); see $LOG_DIR/slurmctld.log and $LOG_DIR/slurmdbd.log"
        sleep 0.5
    done
}

all_running() {
    local name
    for name in "${DAEMONS[@]}"; do
        running_pid "$name" >/dev/null || return 1
    done
}

cluster_answers() { timeout 15 sinfo >/dev/null 2>&1; }

# ---------------------------------------------------------------- namespaced nodes

node_names() { # node_names N: mn1 .. mnN
    local i
    for ((i = 1; i <= $1; i++)); do
        echo "$NODE_PREFIX$i"
    done
}

node_addr() { echo "$NET.1${1#"$NODE_PREFIX"}"; } # mn3 -> 10.254.1.13

# set_partition K: the partition of node set K (1-based): multi, multi2, multi3 ...
set_partition() { if (($1 == 1)); then echo "$MULTI_PARTITION"; else echo "$MULTI_PARTITION$1"; fi; }

# set_nodes N S K: the names of set K's nodes when N nodes make S sets.
set_nodes() {
    local size=$(($1 / $2)) i
    for ((i = ($3 - 1) * size + 1; i <= $3 * size; i++)); do
        echo "$NODE_PREFIX$i"
    done
}

# multi_partitions: every multi-node partition slurmctld knows (comma-separated; empty if none).
multi_partitions() {
    [[ -f $CONTROLLER_CONF ]] || return 0
    sed -n "s/^PartitionName=\(${MULTI_PARTITION}[0-9]*\) .*/\1/p" "$CONTROLLER_CONF" | paste -sd,
}

# How many namespaced nodes the running slurmctld manages (0: the single-node layout).
running_node_count() {
    local pid
    local argv=()
    pid=$(running_pid slurmctld) && mapfile -d '' -t argv <"/proc/$pid/cmdline"
    if [[ " ${argv[*]} " != *" -f $CONTROLLER_CONF "* ]]; then
        echo 0
        return 0
    fi
    grep -c "^NodeName=$NODE_PREFIX" "$CONTROLLER_CONF" || true
}

# The node and partition lines both configurations add. SlurmdTimeout: a namespaced node
# whose slurmd stops answering (the node-loss tests kill everything in one) is DOWN after
# 30 s instead of Slurm's 300; the single-node configuration keeps the default.
multi_node_lines() {
    local n=$1 sets=$2 name k
    echo "SlurmdTimeout=30"
    for name in $(node_names "$n"); do
        echo "NodeName=$name NodeHostname=$name NodeAddr=$(node_addr "$name") CPUs=16 RealMemory=8000 State=UNKNOWN"
    done
    for ((k = 1; k <= sets; k++)); do
        echo "PartitionName=$(set_partition "$k") Nodes=$(set_nodes "$n" "$sets" "$k" | paste -sd,) MaxTime=INFINITE State=UP"
    done
}

# json_map FUNCTION NAME...: a JSON object of each NAME -> FUNCTION's output for it.
json_map() {
    local function=$1 separator="" name
    shift
    printf '{'
    for name in "$@"; do
        printf '%s"%s": "%s"' "$separator" "$name" "$("$function" "$name")"
        separator=", "
    done
    printf '}'
}

# layout_fields N S K: set K's members of the layout file (JSON, no braces): its partition, nodes and their scratch.
layout_fields() {
    local names=()
    mapfile -t names < <(set_nodes "$@")
    printf '"partition": "%s", "nodes": %s, "scratchDirs": %s' "$(set_partition "$3")" \
        "$(json_map node_addr "${names[@]}")" "$(json_map node_scratch_dir "${names[@]}")"
}

# write_in_place PATH: stdin into PATH, only if changed, keeping PATH's inode (the nodes
# bind-mount it: a renamed new file would stay invisible to them).
write_in_place() {
    local path=$1 tmp
    tmp=$(mktemp "$path.XXXXXX")
    cat >"$tmp"
    if [[ -f $path ]] && cmp -s "$tmp" "$path"; then
        rm -f "$tmp"
        return 0
    fi
    cat "$tmp" >"$path"
    chmod 644 "$path"
    rm -f "$tmp"
}

# write_layout N S: the layout file for the tests and benchmarks (JSON): the first set's partition,
# nodes and scratch at the top (what a one-set layout always had), every set under "sets", and
# the arguments of `start` that bring the layout back.
write_layout() {
    local n=$1 sets=$2 k
    {
        printf '{"bridge": "%s", "controller": {"name": "%s", "address": "%s"}, "scratch": "%s", ' \
            "$BRIDGE" "$HOST" "$BRIDGE_ADDR" "$NODE_SCRATCH"
        printf '"start": ["--nodes", "%s", "--sets", "%s"], ' "$n" "$sets"
        layout_fields "$n" "$sets" 1
        printf ', "sets": ['
        for ((k = 1; k <= sets; k++)); do
            ((k == 1)) || printf ', '
            printf '{%s}' "$(layout_fields "$n" "$sets" "$k")"
        done
        printf ']}\n'
    } | write_in_place "$LAYOUT_FILE"
}

write_multi_confs() {
    local n=$1 sets=$2 name
    mkdir -p "$MULTI_DIR"
    for name in $(node_names "$n"); do
        mkdir -p "$MULTI_DIR/$name/spool"
        install -d -m 1777 "$(node_scratch_dir "$name")"
    done
    install -d -m 1777 "$NODE_SCRATCH" # the mount point; on the host itself an empty directory
    {
        echo "# allocstack test cluster: $CONF_MARKER (start --nodes $n --sets $sets). What slurmctld"
        echo "# reads: the single-node configuration every client reads, plus $n namespaced nodes."
        echo "Include $SLURM_CONF"
        echo "# The namespaced nodes read their own view of it (node-slurm.conf): no log line for that."
        echo "DebugFlags=NO_CONF_HASH"
        multi_node_lines "$n" "$sets"
    } | install_conf "$CONTROLLER_CONF" 644
    # What the namespaced slurmds and their job steps read (bind-mounted over $SLURM_CONF):
    # what the host reaches on 127.0.0.1, a node reaches on the bridge.
    {
        echo "# allocstack test cluster: $CONF_MARKER (start --nodes $n --sets $sets). The namespaced nodes' view."
        sed -e "s|127\.0\.0\.1|$BRIDGE_ADDR|g" \
            -e "s|^SlurmdSpoolDir=.*|SlurmdSpoolDir=$MULTI_DIR/%n/spool|" \
            -e "s|^SlurmdPidFile=.*|SlurmdPidFile=$MULTI_DIR/%n/slurmd.pid|" \
            -e "s|^SlurmdLogFile=.*|SlurmdLogFile=$LOG_DIR/slurmd-%n.log|" "$SLURM_CONF"
        echo "DebugFlags=NO_CONF_HASH"
        multi_node_lines "$n" "$sets"
    } | write_in_place "$NODE_CONF"
    {
        echo "127.0.0.1 localhost"
        echo "$BRIDGE_ADDR $HOST"
        for name in $(node_names "$n"); do
            echo "$(node_addr "$name") $name"
        done
    } | write_in_place "$NODE_HOSTS"
    write_layout "$n" "$sets"
}

ensure_bridge() {
    ip link show "$BRIDGE" >/dev/null 2>&1 || ip link add name "$BRIDGE" type bridge
    local addresses
    addresses=$(ip -4 addr show dev "$BRIDGE")
    [[ $addresses == *"inet $BRIDGE_ADDR/24 "* ]] || ip addr add "$BRIDGE_ADDR/24" dev "$BRIDGE"
    ip link set "$BRIDGE" up
}

# Runs INSIDE the new namespaces (see start_node): wait for the link the host moves in, then
# become node NAME and exec slurmd, keeping the PID that the PID file names.
cmd_node_init() {
    local name=$1 addr=$2 i
    for ((i = 0; i < 100; i++)); do
        ip link show eth0 >/dev/null 2>&1 && break
        sleep 0.1
    done
    ip link show eth0 >/dev/null 2>&1 || die "node $name: no eth0 after 10 s"
    hostname "$name"
    ip link set lo up
    ip addr add "$addr/24" dev eth0
    ip link set eth0 up
    mount --bind "$NODE_HOSTS" /etc/hosts
    mount --bind "$NODE_CONF" "$SLURM_CONF"
    mount --bind "$(node_scratch_dir "$name")" "$NODE_SCRATCH"
    exec tini -s -- slurmd -D -N "$name" # a child subreaper, as the default node's slurmd (start_slurmd)
}

in_own_netns() {
    [[ $(readlink "/proc/$1/ns/net") != "$(readlink /proc/self/ns/net)" ]]
}

node_named_usable() {
    [[ $(node_state "$1") =~ ^(idle|mixed|allocated)$ ]]
}

# A node started before it had node-local scratch: bind it now, in the node's own mount
# namespace (job steps started from then on see it; nothing is restarted). The same for its
# view of the configuration: writing a new $SLURM_CONF on the host renames a file over the
# node's bind mount there, which the kernel then detaches in the node's namespace (the node
# would read the host's configuration: no node of its name, a controller on its own loopback),
# so the node's view is bound again before the reconfigure that follows.
ensure_node_scratch() {
    local name=$1 pid
    pid=$(running_pid "slurmd-$name") || return 0
    nsenter --target "$pid" --mount -- mountpoint -q "$NODE_SCRATCH" ||
        nsenter --target "$pid" --mount -- mount --bind "$(node_scratch_dir "$name")" "$NODE_SCRATCH"
    nsenter --target "$pid" --mount -- cmp -s "$NODE_CONF" "$SLURM_CONF" ||
        nsenter --target "$pid" --mount -- mount --bind "$NODE_CONF" "$SLURM_CONF"
}

start_node() {
    local name=$1 daemon=slurmd-$1 pid
    if running_pid "$daemon" >/dev/null; then
        ensure_node_scratch "$name"
        return 0
    fi
    ip link del "h-$name" >/dev/null 2>&1 || true # left by an unclean stop
    # env: start_daemon clears the environment; node-init needs to find the same state.
    start_daemon "$daemon" env ALLOCSTACK_SLURM_STATE="$STATE" ALLOCSTACK_SLURM_NET="$NET" \
        unshare --net --uts --mount --propagation private -- \
        bash "$SCRIPT_DIR/slurm.sh" node-init "$name" "$(node_addr "$name")"
    pid=$(<"$(pid_file "$daemon")")
    # Until unshare has run, the PID is still in this network namespace.
    wait_for "$daemon" "its own network namespace" in_own_netns "$pid"
    ip link add name "h-$name" type veth peer name eth0 netns "$pid"
    ip link set "h-$name" master "$BRIDGE" up
    wait_for "$daemon" "sinfo to show node $name idle" node_named_usable "$name"
}

# stop_nodes_from K: stop the namespaced nodes mnK..mn$MAX_NODES that run, all at once (a
# slurmd takes about 2 s to end).
stop_nodes_from() {
    local i stopping=()
    for ((i = $1; i <= MAX_NODES; i++)); do
        stop_daemon "slurmd-$NODE_PREFIX$i" &
        stopping+=("$!")
    done
    wait "${stopping[@]}" # these alone: daemons this shell started run in the background too
    for ((i = $1; i <= MAX_NODES; i++)); do
        ip link del "h-$NODE_PREFIX$i" >/dev/null 2>&1 || true
    done
}

# Removing nodes kills what runs on them: refuse while a multi-node partition has jobs.
refuse_if_multi_jobs() {
    local jobs partitions
    partitions=$(multi_partitions)
    [[ -n $partitions ]] || return 0
    jobs=$(squeue -h -p "$partitions" -o %A -t PENDING,RUNNING,SUSPENDED,COMPLETING 2>/dev/null || true)
    if [[ -n $jobs ]]; then
        die "jobs ${jobs//$'\n'/ } are in partition(s) $partitions: removing their nodes would kill them; wait for them (or scancel them yourself), then rerun"
    fi
}

# A batch job in each set's partition runs one step on every node of the set: proves the
# nodes reach the controller, each other and accounting, each under its own hostname.
smoke_test_multi() {
    local n=$1 sets=$2 size=$(($1 / $2)) k job out partition expected names=()
    for ((k = 1; k <= sets; k++)); do
        partition=$(set_partition "$k")
        mapfile -t names < <(set_nodes "$n" "$sets" "$k")
        out=$MULTI_DIR/smoke-$partition.out
        rm -f "$out"
        job=$(sbatch --parsable --account="$ACCOUNT" --partition="$partition" --nodes="$size" \
            --ntasks="$size" --job-name=allocstack-smoke-multi --time=1 --output="$out" \
            --wrap='srun hostname | sort | tr "\n" " "')
        expected=$(printf '%s\n' "${names[@]}" | sort | tr '\n' ' ')
        await_completed "$job" "multi-node smoke job" "$out and $LOG_DIR/slurmd-${names[0]}.log"
        [[ $(<"$out") == "$expected" ]] ||
            die "multi-node smoke job $job ran on '$(<"$out")', not once on every node of partition $partition"
        info "multi-node smoke job $job COMPLETED on $(<"$out")(partition $partition)"
    done
}

# Bring the namespaced nodes to $WANT_NODES (1: none), restarting slurmctld only when the
# node set changes.
apply_layout() {
    local have name
    have=$(running_node_count)
    if ((WANT_NODES > 1)); then
        ((have <= WANT_NODES)) || refuse_if_multi_jobs
        ensure_bridge
        write_multi_confs "$WANT_NODES" "$WANT_SETS"
        stop_nodes_from $((WANT_NODES + 1))
        ((have == WANT_NODES)) || restart_slurmctld
        for name in $(node_names "$WANT_NODES"); do
            start_node "$name"
        done
    else
        ((have == 0)) || refuse_if_multi_jobs
        stop_nodes_from 1
        ((have == 0)) || restart_slurmctld
        ip link del "$BRIDGE" >/dev/null 2>&1 || true
        rm -f "$LAYOUT_FILE"
    fi
}

# A cluster started before slurmd ran under tini: restart slurmd alone. Running jobs keep
# running (their slurmstepd does not depend on slurmd).
ensure_slurmd_under_tini() {
    if ! slurmd_under_tini; then
        install_packages
        info "restarting slurmd under tini (running jobs are not affected)"
        DEADLINE=$((SECONDS + TIMEOUT))
        stop_daemon slurmd
        start_slurmd
    fi
}

# A file that does not exist yet (the first start) counts as empty: `cat` of a missing file fails,
# and under pipefail that failure would end `start` before it installs anything.
conf_digest() {
    local file
    for file in "$SLURM_CONF" "$CONTROLLER_CONF" "$NODE_CONF"; do
        [[ -f $file ]] && cat "$file"
        echo "--- $file"
    done | sha256sum
}

# Daemons that ran before this `start` re-read a configuration that changed (another
# checkout's slurm.conf.in with a new partition, say), unless slurmctld was just restarted
# anyway. Jobs keep running; nothing is cancelled.
reconfigure_if_changed() {
    local before=$1
    if ((!RESTARTED)) && [[ $before != "$(conf_digest)" ]]; then
        info "configuration changed: scontrol reconfigure"
        if ! scontrol reconfigure; then
            # A node's CPUs or memory changed: Slurm 22.05 refuses a reconfigure and asks
            # for its daemons to be restarted (running jobs survive both restarts).
            restart_slurmctld
            info "restarting slurmd for the new node configuration"
            stop_daemon slurmd
            start_slurmd
        fi
    fi
}

# ---------------------------------------------------------------- commands

cmd_start() {
    local before
    before=$(conf_digest)
    if all_running && cluster_answers && node_usable; then
        write_slurm_conf
        DEADLINE=$((SECONDS + TIMEOUT))
        apply_layout
        reconfigure_if_changed "$before"
        ensure_accounting
        ensure_slurmd_under_tini
        ((WANT_NODES < 2)) || smoke_test_multi "$WANT_NODES" "$WANT_SETS"
        cmd_status
        return 0
    fi
    running_pid slurmctld >/dev/null || before=started # a slurmctld started now reads the new files
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
    if ((WANT_NODES > 1)); then
        write_multi_confs "$WANT_NODES" "$WANT_SETS"
    fi
    start_slurmctld
    start_slurmd
    apply_layout
    [[ $before == started ]] || reconfigure_if_changed "$before"
    smoke_test
    ((WANT_NODES < 2)) || smoke_test_multi "$WANT_NODES" "$WANT_SETS"
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
    stop_nodes_from 1
    for ((i = ${#DAEMONS[@]} - 1; i >= 0; i--)); do
        stop_daemon "${DAEMONS[i]}"
    done
    ip link del "$BRIDGE" >/dev/null 2>&1 || true
    rm -f "$LAYOUT_FILE"
}

# Paths `start` creates. The Slurm and MariaDB state, the configuration it wrote (a foreign
# configuration it kept aside goes back), munge's key and directories when munge is its package.
purge_paths() {
    echo "$STATE"
    echo "$NODE_SCRATCH"
    local conf
    for conf in "$SLURM_CONF" "$SLURMDBD_CONF"; do
        if [[ -f $conf ]] && grep -q "$CONF_MARKER" "$conf"; then
            echo "$conf"
        fi
    done
    if grep -qx munge "$LEDGER_DIR/slurm.asked" 2>/dev/null; then
        echo "$MUNGE_KEY"
        echo /run/munge
        echo /var/lib/munge
        echo /var/log/munge
    fi
}

cmd_purge() {
    local path name paths=() leftovers=()
    cmd_stop
    mapfile -t paths < <(purge_paths)
    for path in "${paths[@]}"; do
        rm -rf -- "$path"
    done
    for path in "$SLURM_CONF" "$SLURMDBD_CONF"; do
        if [[ -f $path.allocstack-backup && ! -e $path ]]; then
            mv -- "$path.allocstack-backup" "$path"
            info "restored the configuration that was there before: $path"
        fi
    done
    ip link del "$BRIDGE" >/dev/null 2>&1 || true
    for name in $(node_names "$MAX_NODES"); do
        ip link del "h-$name" >/dev/null 2>&1 || true
    done
    packages_purge slurm
    rmdir /etc/slurm 2>/dev/null || true
    # What a first start must find absent: say what is left instead of starting on it later.
    for path in "${paths[@]}"; do
        [[ ! -e $path ]] || leftovers+=("$path")
    done
    for name in "${DAEMONS[@]}"; do
        ! running_pid "$name" >/dev/null || leftovers+=("daemon $name")
    done
    ! ip link show "$BRIDGE" >/dev/null 2>&1 || leftovers+=("bridge $BRIDGE")
    [[ ! -s $LEDGER_DIR/slurm.asked ]] || leftovers+=("ledger $LEDGER_DIR/slurm.asked")
    ((${#leftovers[@]} == 0)) || die "purge left: ${leftovers[*]}"
    info "purged: the next start is a first start"
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
    for name in $(node_names "$MAX_NODES"); do
        if pid=$(running_pid "slurmd-$name"); then
            printf '%-10s running (pid %s): namespaced node %s at %s on %s\n' "slurmd-$name" "$pid" \
                "$name" "$(node_addr "$name")" "$BRIDGE"
        fi
    done
    if ! timeout 15 sinfo 2>&1; then
        echo "$PROG: the cluster does not answer (sinfo failed)" >&2
        # exit, not return: a failing function would also fire the ERR trap.
        exit 3
    fi
}

# exec NODE CMD...: CMD inside namespaced node NODE (its network, hostname and mounts).
cmd_exec() {
    local pid
    pid=$(running_pid "slurmd-$1") || die "no namespaced node $1 runs (start --nodes N starts them)"
    shift
    exec nsenter --target "$pid" --net --uts --mount -- "$@"
}

# crash NODE: SIGKILL to every process in NODE's network namespace (Slurm finds the node DOWN
# after SlurmdTimeout; with --no-kill the job goes on without it).
cmd_crash() {
    local pid namespace entry victims=()
    pid=$(running_pid "slurmd-$1") || die "no namespaced node $1 runs"
    namespace=$(readlink "/proc/$pid/ns/net")
    for entry in /proc/[0-9]*; do
        [[ $(readlink "$entry/ns/net" 2>/dev/null) == "$namespace" ]] && victims+=("${entry#/proc/}")
    done
    kill -KILL "${victims[@]}" 2>/dev/null || true
    rm -f "$(pid_file "slurmd-$1")"
    info "crashed node $1: killed ${#victims[@]} processes (${victims[*]})"
}

usage() {
    echo "usage: $PROG start [--nodes N [--sets S]] | stop | purge | status | exec NODE CMD... | crash NODE" >&2
    exit 64
}

# start's layout: 1 = the single node only; N > 1 adds N namespaced nodes, in WANT_SETS
# partitions of N / WANT_SETS nodes each.
WANT_NODES=1
WANT_SETS=1
# Set when this run restarted slurmctld (it then read every configuration file anew).
RESTARTED=0

main() {
    (($# >= 1)) || usage
    local command=$1
    shift
    case $command in
        start)
            if (($# == 2 || $# == 4)) && [[ $1 == --nodes && $2 =~ ^[1-9]$ ]]; then
                WANT_NODES=$2
            elif (($# != 0)); then
                usage
            fi
            if (($# == 4)); then
                [[ $3 == --sets && $4 =~ ^[1-9]$ ]] || usage
                WANT_SETS=$4
                ((WANT_NODES % WANT_SETS == 0 && WANT_NODES / WANT_SETS >= 2)) ||
                    die "--nodes $WANT_NODES --sets $WANT_SETS: each set needs the same number of nodes, at least 2"
            fi
            ;;
        stop | purge | status) (($# == 0)) || usage ;;
        exec) (($# >= 2)) || usage ;;
        crash) (($# == 1)) || usage ;;
        node-init) (($# == 2)) || usage ;; # internal: see start_node
        *) usage ;;
    esac
    require_root
    "cmd_${command//-/_}" "$@"
}

# Sourced (the tests of its functions): define everything, run nothing.
if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
    main "$@"
fi
