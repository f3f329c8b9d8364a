# shellcheck shell=bash
# Debian packages for the test machine's real parts, installed and purged with a ledger.
# Sourced by slurm.sh, apptainer.sh, charliecloud.sh, prepare.sh and shellcheck.sh (root only).
#
#   packages_install OWNER PKG...   install the PKGs that are missing; record in OWNER's ledger
#                                   the ones asked for and every package the install added
#   packages_purge OWNER            purge what OWNER's ledger recorded (what it asked for, then
#                                   the dependencies it added that nothing else needs), then the
#                                   ledger itself
#
# The ledger is what makes `purge` give a first start without touching what the machine had
# before: a package that was already installed is never recorded, so never removed. One ledger
# per owner (/var/lib/allocstack-ledger/OWNER.{asked,added}), so `slurm.sh purge` takes Slurm's
# packages and leaves the toolbox's. apt's download cache (/var/cache/apt/archives, keyed by
# package and version) stays: a purge costs the next start the install, not the download.
#
# Expects the caller's PROG (the messages name it).

readonly LEDGER_DIR=${ALLOCSTACK_LEDGER_DIR:-/var/lib/allocstack-ledger}

packages_say() { echo "$PROG: $*" >&2; }
packages_die() {
    echo "$PROG: error: $*" >&2
    exit 1
}

# Every installed package, one "name:arch" a line, sorted.
installed_packages() {
    dpkg-query -W -f='${db:Status-Abbrev} ${binary:Package}\n' | awk '$1 == "ii" { print $2 }' | sort
}

packages_missing() {
    local pkg
    for pkg in "$@"; do
        dpkg-query -W -f='${db:Status-Abbrev}' "$pkg" 2>/dev/null | grep -q '^ii' || echo "$pkg"
    done
}

packages_install() {
    local owner=$1 before missing=()
    shift
    mapfile -t missing < <(packages_missing "$@")
    ((${#missing[@]})) || return 0
    packages_say "installing ${missing[*]}"
    mkdir -p "$LEDGER_DIR"
    before=$(installed_packages)
    export DEBIAN_FRONTEND=noninteractive
    # The package lists may be missing or stale on a fresh machine: update once and retry.
    if ! apt-get install -y -q --no-install-recommends "${missing[@]}" >"$LEDGER_DIR/$owner.apt.log" 2>&1; then
        apt-get update -q >>"$LEDGER_DIR/$owner.apt.log" 2>&1 || true
        apt-get install -y -q --no-install-recommends "${missing[@]}" >>"$LEDGER_DIR/$owner.apt.log" 2>&1 ||
            packages_die "apt-get install ${missing[*]} failed; see $LEDGER_DIR/$owner.apt.log"
    fi
    printf '%s\n' "${missing[@]}" >>"$LEDGER_DIR/$owner.asked"
    comm -13 <(echo "$before") <(installed_packages) >>"$LEDGER_DIR/$owner.added"
}

packages_purge() {
    local owner=$1 asked=() added=() removable=()
    [[ -f $LEDGER_DIR/$owner.asked || -f $LEDGER_DIR/$owner.added ]] || return 0
    export DEBIAN_FRONTEND=noninteractive
    mapfile -t asked < <(sort -u "$LEDGER_DIR/$owner.asked" 2>/dev/null | packages_installed_of)
    if ((${#asked[@]})); then
        packages_say "purging ${asked[*]}"
        apt-get purge -y -q "${asked[@]}" >"$LEDGER_DIR/$owner.purge.log" 2>&1 ||
            packages_die "apt-get purge ${asked[*]} failed; see $LEDGER_DIR/$owner.purge.log"
    fi
    # What the install added as dependencies and nothing installed needs any more: exactly the
    # ledger's part of what `apt-get autoremove` would remove (never someone else's leftovers).
    mapfile -t added < <(sort -u "$LEDGER_DIR/$owner.added" 2>/dev/null)
    mapfile -t removable < <(apt-get -s autoremove 2>/dev/null | awk '/^Remv/ { print $2 }' | sort |
        comm -12 - <(printf '%s\n' "${added[@]%%:*}" | sort -u))
    if ((${#removable[@]})); then
        packages_say "purging ${#removable[@]} dependencies it added"
        apt-get purge -y -q "${removable[@]}" >>"$LEDGER_DIR/$owner.purge.log" 2>&1 ||
            packages_die "apt-get purge of the added dependencies failed; see $LEDGER_DIR/$owner.purge.log"
    fi
    rm -f "$LEDGER_DIR/$owner".{asked,added,apt.log,purge.log}
    rmdir "$LEDGER_DIR" 2>/dev/null || true
}

# stdin: package names; stdout: those installed.
packages_installed_of() {
    local pkg
    while IFS= read -r pkg; do
        [[ -n $pkg ]] || continue
        dpkg-query -W -f='${db:Status-Abbrev}' "$pkg" 2>/dev/null | grep -q '^ii' && echo "$pkg"
    done
    return 0
}
