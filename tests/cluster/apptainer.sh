#!/usr/bin/env bash
# Install, check or remove a real Apptainer for allocstack's cluster tests.
#
#   tests/cluster/apptainer.sh install|status|uninstall|purge
#   tests/cluster/apptainer.sh prerequisites
#
# prerequisites: the host packages install needs (mmdebstrap), alone: the rest of install uses the
# host's apt no more (mmdebstrap has its own, in the toolbox), so it may run beside another install.
# purge: uninstall, then remove the packages install added (mmdebstrap), so that the next
# install is a first install (.ci/run starts from it).
#
# Why this exists: Apptainer is not packaged for Debian 12, and Debian sid's apptainer needs a
# newer glibc than the host has. So we build a private Debian sid root filesystem (the
# "toolbox") that contains apptainer, and put a small wrapper script named `apptainer` on PATH
# that enters the toolbox and runs the real binary. Snakemake's `--sdm apptainer` and our own
# scripts then call `apptainer` as on any cluster.
#
# Root only: the wrapper needs mount namespaces and /dev/fuse, which a normal user does not
# have here. It is a test fixture for this kind of machine, not something to install at a
# center (there, `module load apptainer`).
#
# Environment:
#   ALLOCSTACK_APPTAINER_HOME  where to install (default /opt/allocstack-apptainer); the
#                              toolbox goes to $HOME/rootfs, the wrapper to $HOME/bin/apptainer
#   ALLOCSTACK_APT_MIRROR      Debian mirror to build the toolbox from (default: the first
#                              main-archive URI in the machine's apt sources)
#   ALLOCSTACK_APPTAINER_BINDS read by the wrapper at run time: extra host paths
#                              (colon-separated) to make visible inside the toolbox
#
# Exit codes: 0 ok, 1 failure, 2 usage or not root, 3 (status only) not installed.
set -Eeuo pipefail

readonly PROG="${0##*/}"
readonly APPTAINER_HOME="${ALLOCSTACK_APPTAINER_HOME:-/opt/allocstack-apptainer}"
readonly ROOTFS="$APPTAINER_HOME/rootfs"
readonly BIN_DIR="$APPTAINER_HOME/bin"
readonly WRAPPER="$BIN_DIR/apptainer"
# A place for test images that the wrapper always makes visible inside the toolbox (/opt is
# not: binding it would nest the toolbox inside itself).
readonly IMAGES_DIR="$APPTAINER_HOME/images"
# fuse2fs and squashfuse let apptainer mount SIF/ext3 images without kernel mounts;
# debootstrap is what `Bootstrap: debootstrap` definition files (container/test.def) run.
readonly TOOLBOX_PACKAGES="apptainer,e2fsprogs,fuse2fs,squashfuse,debootstrap,ca-certificates"
readonly SUBID_RANGE="root:100000:65536"
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
readonly HERE
# shellcheck source=tests/cluster/packages.sh
. "$HERE/packages.sh"

die() {
  echo "$PROG: $*" >&2
  exit 1
}

log() {
  echo "$PROG: $*" >&2
}

usage() {
  echo "usage: $PROG install|prerequisites|status|uninstall|purge" >&2
  exit 2
}

require_root() {
  if [[ $EUID -ne 0 ]]; then
    echo "$PROG: must run as root (the toolbox needs mount namespaces and /dev/fuse)" >&2
    exit 2
  fi
}

# Print the Debian main-archive mirror the machine already uses, so the toolbox comes from
# the same (possibly local or snapshot) mirror and works where only that mirror is reachable.
# Reads deb822 *.sources and one-line *.list files; skips security and third-party suites by
# requiring the suite to be the host's own codename (e.g. "bookworm").
host_mirror() {
  if [[ -n ${ALLOCSTACK_APT_MIRROR:-} ]]; then
    echo "$ALLOCSTACK_APT_MIRROR"
    return
  fi
  local codename f files=() uri
  # shellcheck source=/dev/null
  codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
  [[ -n $codename ]] || die "cannot read VERSION_CODENAME from /etc/os-release; set ALLOCSTACK_APT_MIRROR"
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
    [[ -f $f ]] && files+=("$f")
  done
  ((${#files[@]})) || die "no apt sources found; set ALLOCSTACK_APT_MIRROR"
  uri=$(awk -v want="$codename" '
    # deb822 stanzas: remember URIs and Suites until a blank line ends the stanza.
    FILENAME ~ /\.sources$/ {
      if ($0 ~ /^[[:space:]]*$/) { uris = ""; suites = ""; next }
      if (tolower($1) == "uris:")   { uris = $2 }
      if (tolower($1) == "suites:") { suites = " " substr($0, index($0, ":") + 1) " " }
      if (uris != "" && suites ~ (" " want " ")) { print uris; exit }
      next
    }
    # One-line format: deb [options] URI SUITE COMPONENTS...
    $1 == "deb" {
      i = 2
      if ($i ~ /^\[/) { while ($i !~ /\]$/) i++; i++ }
      if ($(i + 1) == want) { print $i; exit }
    }
  ' "${files[@]}")
  [[ -n $uri ]] || die "no '$codename' apt source found in /etc/apt; set ALLOCSTACK_APT_MIRROR"
  echo "$uri"
}

ensure_mmdebstrap() {
  packages_install apptainer mmdebstrap
}

# True when the wrapper exists and the apptainer behind it answers.
works() {
  [[ -x $WRAPPER ]] && "$WRAPPER" --version >/dev/null 2>&1
}

# Build the toolbox into a temporary directory and rename it into place only when complete,
# so an interrupted install never leaves a half-built toolbox that looks installed.
build_rootfs() {
  local mirror tmp
  mirror=$(host_mirror)
  tmp="$ROOTFS.partial"
  rm -rf -- "$tmp"
  log "building Debian sid toolbox from $mirror (takes ~15-35 s)"
  # Mirrors here serve a frozen snapshot: sid's Release file is past its Valid-Until date, and
  # apt refuses it unless told to skip that check (signatures are still verified).
  mmdebstrap --variant=minbase --include="$TOOLBOX_PACKAGES" \
    --aptopt='Acquire::Check-Valid-Until "false"' \
    sid "$tmp" "$mirror" >&2 || die "mmdebstrap failed; see the messages above"
  configure_rootfs "$tmp"
  mv -T -- "$tmp" "$ROOTFS"
}

# Settings apptainer needs in this sandbox. Idempotent, so it can also repair an old toolbox.
configure_rootfs() {
  local root=$1 conf="$1/etc/apptainer/apptainer.conf" f
  [[ -f $conf ]] || die "$conf missing: apptainer did not install into the toolbox"
  # The sandbox lacks CAP_SYS_RESOURCE; apptainer's default ("full") would try to keep it.
  if grep -q '^root default capabilities' "$conf"; then
    sed -i 's/^root default capabilities.*/root default capabilities = file/' "$conf"
  else
    echo 'root default capabilities = file' >>"$conf"
  fi
  # `apptainer build --fakeroot` maps root to a subordinate id range, even when run as root.
  for f in "$root/etc/subuid" "$root/etc/subgid"; do
    grep -qx "$SUBID_RANGE" "$f" 2>/dev/null || echo "$SUBID_RANGE" >>"$f"
  done
  # Mount points the wrapper needs and the minbase image may not have.
  mkdir -p "$root/.host-root" "$root/work" "$root/run" "$root/var/tmp"
}

# Write the wrapper with the toolbox path baked in, unless the same one is already there.
# Written to a temporary file and renamed, so a concurrent caller never runs half a script.
write_wrapper() {
  local tmp
  mkdir -p -- "$BIN_DIR" "$IMAGES_DIR"
  tmp=$(mktemp "$BIN_DIR/.apptainer.XXXXXX")
  {
    echo '#!/bin/bash'
    echo "# Generated by allocstack tests/cluster/apptainer.sh: runs the toolbox's apptainer."
    printf 'readonly ROOTFS=%q IMAGES_DIR=%q\n' "$ROOTFS" "$IMAGES_DIR"
    wrapper_body
  } >"$tmp"
  chmod 0755 "$tmp"
  if cmp -s -- "$tmp" "$WRAPPER"; then
    rm -f -- "$tmp"
  else
    mv -f -- "$tmp" "$WRAPPER"
    log "wrote $WRAPPER"
  fi
}

# The wrapper itself. It runs in two stages in ONE process: every step `exec`s the next
# (bash -> unshare -> bash -> apptainer -> apptainer's starter), so the PID the caller started
# is the PID that receives signals, and a SIGTERM reaches starter, which forwards it to the
# containerised process. Helpers (mount, realpath) run and exit before that exec; never leave
# a long-lived child between the caller and apptainer.
wrapper_body() {
  cat <<'EOF'
# Root only: needs mount namespaces, pivot_root and /dev/fuse.
#
# Only these host paths exist inside the toolbox (at the same location): HOST_PATHS below, the
# caller's working directory, every existing absolute host path named in the arguments (an
# image, a definition file, a `--bind SRC[:DST]` source, a script), and
# ALLOCSTACK_APPTAINER_BINDS (colon-separated). Anything else (say, a file that a bound
# script opens from another tree) is "no such file": add its directory to
# ALLOCSTACK_APPTAINER_BINDS.
set -Eeuo pipefail

# /etc/resolv.conf is here so that `apptainer build` (debootstrap) and containers can resolve
# mirror names.
readonly HOST_PATHS=(/tmp /dev /sys /root /home /work /run /var/tmp /etc/hosts /etc/resolv.conf
  "$IMAGES_DIR")

fail() {
  echo "apptainer (allocstack toolbox): $*" >&2
  exit 2
}

# True when $1 is one of the paths $2... or below one of them.
inside_any() {
  local p target=$1
  shift
  for p in "$@"; do
    [[ $target == "$p" || $target == "$p"/* ]] && return 0
  done
  return 1
}

# True when $1 is one of HOST_PATHS or below one of them (already visible).
covered() {
  inside_any "$1" "${HOST_PATHS[@]}"
}

# The toolbox's own system directories: a host path below them (say /usr/bin/python3 as a
# command argument) must not shadow the toolbox's files.
readonly SYSTEM_PATHS=(/usr /bin /sbin /lib /lib32 /lib64 /libx32 /etc /var /boot /proc)

# True when $1 is the toolbox, inside it, or one of its ancestors (binding those would nest
# the toolbox inside itself).
toolbox_path() {
  [[ $1 == "$ROOTFS" || $1 == "$ROOTFS"/* || $ROOTFS == "$1"/* || $1 == / ]]
}

# Print the host paths named in the arguments: each argument, split at commas (`--bind a,b`)
# and cut at the first colon (`SRC:DST[:OPTS]`), that is an absolute path which exists.
# Covers `--bind=SRC` too. A checkout outside HOST_PATHS (CI clones to /check/...) needs this.
named_host_paths() {
  local arg item path items
  for arg in "$@"; do
    arg=${arg#--bind=}
    IFS=, read -ra items <<<"$arg"
    for item in "${items[@]}"; do
      path=${item%%:*}
      [[ $path == /* && -e $path ]] && printf '%s\n' "$path"
    done
  done
  return 0
}

# Bind host path $1 to the same path inside the toolbox, creating the mount point.
bind_host_path() {
  local src=$1 dst="$ROOTFS$1"
  [[ -e $src ]] || return 0
  if [[ -d $src ]]; then
    mkdir -p -- "$dst"
  else
    mkdir -p -- "${dst%/*}"
    [[ -e $dst ]] || : >"$dst"
  fi
  # --rbind keeps submounts (/dev/pts, /dev/shm, /sys/fs/cgroup, ...).
  mount --rbind -- "$src" "$dst"
}

# Stage 2, inside a private mount namespace: assemble the toolbox's view and switch to it.
enter_toolbox() {
  local cwd=$PWD extra p
  unset ALLOCSTACK_APPTAINER_STAGE
  # pivot_root needs the new root to be a mount point.
  mount --bind -- "$ROOTFS" "$ROOTFS"
  for p in "${HOST_PATHS[@]}"; do
    bind_host_path "$p"
  done
  # The caller's directory, ALLOCSTACK_APPTAINER_BINDS and the paths named in the arguments
  # (those never below the toolbox's system directories), unless already visible: covered, or
  # inside a path bound earlier.
  IFS=: read -ra extra <<<"${ALLOCSTACK_APPTAINER_BINDS:-}"
  local -a named=() bound=()
  mapfile -t named < <(named_host_paths "$@")
  for p in "$(pwd -P)" "${extra[@]}" "${named[@]}"; do
    [[ -n $p ]] || continue
    p=$(realpath -m -- "$p")
    covered "$p" || toolbox_path "$p" || inside_any "$p" "${bound[@]}" && continue
    if inside_any "$p" "${SYSTEM_PATHS[@]}" && ! inside_any "$p" "$(pwd -P)" "${extra[@]}"; then
      continue
    fi
    bind_host_path "$p"
    bound+=("$p")
  done
  # A fresh proc for this mount namespace; fall back to the host's where that is refused.
  mount -t proc proc "$ROOTFS/proc" 2>/dev/null || mount --rbind /proc "$ROOTFS/proc"
  cd -- "$ROOTFS"
  pivot_root . .host-root
  # Drop the host's root (apptainer would run with it, too): otherwise the whole host stays
  # reachable under /.host-root and hides a path someone forgot to bind.
  umount -l /.host-root
  cd -- "$cwd" 2>/dev/null || cd /
  exec /usr/bin/apptainer "$@"
}

[[ $EUID -eq 0 ]] || fail "root only (this test toolbox needs mount namespaces and /dev/fuse)"
[[ -x $ROOTFS/usr/bin/apptainer ]] || fail "toolbox missing at $ROOTFS; run tests/cluster/apptainer.sh install"
if [[ ${ALLOCSTACK_APPTAINER_STAGE:-} == inside ]]; then
  enter_toolbox "$@"
fi
# Stage 1: re-run this script in a new private mount namespace (unshare execs, no fork).
export ALLOCSTACK_APPTAINER_STAGE=inside
exec unshare --mount --propagation private -- /bin/bash "$0" "$@"
EOF
}

# Idempotent: an existing, working toolbox is kept; only a changed wrapper is rewritten.
cmd_prerequisites() {
  require_root
  [[ -d $ROOTFS ]] || ensure_mmdebstrap
}

cmd_install() {
  require_root
  if [[ ! -d $ROOTFS ]]; then
    ensure_mmdebstrap
    mkdir -p -- "$APPTAINER_HOME"
    build_rootfs
  elif ! works; then
    log "toolbox exists at $ROOTFS but does not answer; refreshing its settings"
    configure_rootfs "$ROOTFS"
  fi
  write_wrapper
  works || die "$WRAPPER --version fails; run '$PROG uninstall' then '$PROG install'"
  log "installed: $("$WRAPPER" --version)"
  # Last line: the directory to put on PATH.
  echo "$BIN_DIR"
}

cmd_status() {
  require_root
  if works; then
    echo "installed: $("$WRAPPER" --version) (toolbox $ROOTFS, wrapper $WRAPPER, images $IMAGES_DIR)"
  else
    echo "not installed (expected toolbox $ROOTFS and wrapper $WRAPPER)"
    exit 3
  fi
}

cmd_uninstall() {
  require_root
  [[ $APPTAINER_HOME == /?*/?* ]] ||
    die "refusing to remove suspicious ALLOCSTACK_APPTAINER_HOME '$APPTAINER_HOME'"
  # The wrapper's mounts live in private namespaces, but refuse if anything is mounted in the
  # toolbox of THIS namespace: rm -rf would then delete host files through the bind mounts.
  if awk -v root="$ROOTFS" '$2 == root || index($2, root "/") == 1 { found = 1 } END { exit !found }' /proc/self/mounts; then
    die "something is mounted under $ROOTFS; unmount it first"
  fi
  rm -rf -- "$APPTAINER_HOME"
  log "removed $APPTAINER_HOME (toolbox, wrapper and test images)"
}

cmd_purge() {
  require_root
  if [[ -e $APPTAINER_HOME ]]; then
    cmd_uninstall
  fi
  packages_purge apptainer
  [[ ! -e $APPTAINER_HOME ]] || die "purge left $APPTAINER_HOME"
  log "purged: the next install is a first install"
}

main() {
  (($# == 1)) || usage
  case $1 in
    install) cmd_install ;;
    prerequisites) cmd_prerequisites ;;
    status) cmd_status ;;
    uninstall) cmd_uninstall ;;
    purge) cmd_purge ;;
    *) usage ;;
  esac
}

main "$@"
