#!/usr/bin/env bash
# Install Charliecloud's ch-run and make the directory image allocstack's Charliecloud tests run.
#
#   tests/cluster/charliecloud.sh install SIF    (root; SIF = the test image tests/cluster/prepare.sh built)
#   tests/cluster/charliecloud.sh stacks DIR     (root; DIR = the stack images prepare.sh built, DIR/NAME.sif)
#   tests/cluster/charliecloud.sh status
#   tests/cluster/charliecloud.sh purge          (root; the images and the packages install added,
#                                                 so that the next install is a first install)
#
# ch-run comes from Debian 12's `charliecloud-runtime` (0.31); it runs unprivileged (user
# namespaces), as any user. The image is the SIF's own root filesystem, unpacked: the same
# recipe (container/test.def), the same files, so Apptainer and Charliecloud run the same
# Python. Like a center adding its filesystems' mount points, the image gets an empty
# directory for the top level of this checkout (/work, /check, ...): ch-run binds a path only
# onto a directory the image has. Then ch/environment (where ch-image puts a Dockerfile's ENV)
# from the SIF's %environment, read permission for everyone (the tests also run it as a
# second user), and the tree digest sidecar that the workflow checks before every run.
# Then the same tree as a SquashFS file (mksquashfs, lz4: ch-run mounts it itself) with its
# sha256sum sidecar, for the tests of SquashFS images.
#
# Cached: the directory is rebuilt only when the SIF, the mount point or this recipe changes
# (~10 s), the SquashFS file only when the directory's digest does (~1-3 s), else ~0 s.
#
# stacks: each stack image (container/stacks/NAME.def + NAME.oci.json, built by container/build.sh --oci)
# as a Charliecloud directory image, laid out as `ch-image pull` leaves an image from Docker Hub: the SIF's
# root filesystem with /ch/config.pulled.json (the image config: ENTRYPOINT, CMD, EXPOSE, WORKDIR),
# /ch/metadata.json and /ch/environment, each VOLUME's directory (container/oci.py charliecloud), this
# checkout's top-level directory as a mount point, and the tree digest sidecar. Cached like the test image.
#
# Environment:
#   ALLOCSTACK_CHARLIECLOUD_HOME   where the image goes (default /opt/allocstack-charliecloud)
#   ALLOCSTACK_TEST_CHARLIECLOUD_IMAGE  the image directory (default $HOME/images/allocstack-test)
#   ALLOCSTACK_TEST_CHARLIECLOUD_SQUASHFS  the SquashFS image (default: the directory's path + .sqfs)
#
# Exit codes: 0 ok, 1 failure, 2 usage or not root, 3 (status only) not installed.
set -Eeuo pipefail

readonly PROG="${0##*/}"
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
readonly HERE
ROOT=$(cd "$HERE/../.." && pwd)
readonly ROOT
# shellcheck source=tests/cluster/packages.sh
. "$HERE/packages.sh"
readonly CH_HOME="${ALLOCSTACK_CHARLIECLOUD_HOME:-/opt/allocstack-charliecloud}"
readonly IMAGE="${ALLOCSTACK_TEST_CHARLIECLOUD_IMAGE:-$CH_HOME/images/allocstack-test}"
readonly SQUASHFS="${ALLOCSTACK_TEST_CHARLIECLOUD_SQUASHFS:-$IMAGE.sqfs}"
readonly STACK_IMAGES="${ALLOCSTACK_STACK_IMAGES_CHARLIECLOUD:-$CH_HOME/images/stacks}"
# ch-run itself (it mounts SquashFS images with its own libsquashfuse); squashfs-tools:
# unsquashfs unpacks the SIF's root filesystem, mksquashfs makes the SquashFS image.
readonly PACKAGES=(charliecloud-runtime squashfs-tools)
# Bump when the steps below change what ends up in the image.
readonly RECIPE=1

log() { echo "$PROG: $*" >&2; }
die() { log "$*"; exit 1; }
usage() { echo "usage: $PROG install SIF | stacks DIR | status | purge" >&2; exit 2; }

ensure_packages() {
  packages_install charliecloud "${PACKAGES[@]}"
}

# The mount point this checkout needs in the image: its top-level directory.
checkout_top() {
  local top=${ROOT#/}
  echo "/${top%%/*}"
}

cache_key() {
  local sif=$1
  { cut -d' ' -f1 "$sif.sha256"; checkout_top; echo "$RECIPE"; } | sha256sum | cut -d' ' -f1
}

# The SIF's %environment as NAME=VALUE lines (the `export NAME=VALUE` lines Apptainer stored).
sif_environment() {
  local file="$1/.singularity.d/env/90-environment.sh"
  [[ -f $file ]] || return 0
  sed -n 's/^[[:space:]]*export[[:space:]]\{1,\}\([A-Za-z_][A-Za-z0-9_]*=.*\)$/\1/p' "$file"
}

# Unpack SIF into a new directory image, via a temporary directory renamed into place, so an
# interrupted build never leaves a half-made image that looks complete.
build_image() {
  local sif=$1 key=$2 tmp id top
  tmp="$IMAGE.partial"
  rm -rf -- "$tmp" "$tmp.sqfs"
  mkdir -p -- "$(dirname -- "$IMAGE")"
  # The SIF's root filesystem is its "FS (Squashfs...)" object.
  id=$(apptainer sif list "$sif" | awk -F'|' '/FS \(Squashfs/ { gsub(/ /, "", $1); print $1; exit }')
  [[ -n $id ]] || die "no SquashFS partition in $sif"
  apptainer sif dump "$id" "$sif" >"$tmp.sqfs"
  unsquashfs -q -n -d "$tmp" "$tmp.sqfs" >/dev/null
  rm -f -- "$tmp.sqfs"
  top=$(checkout_top)
  [[ -d $tmp$top ]] || mkdir -m 0755 -- "$tmp$top"
  mkdir -p -- "$tmp/ch"
  sif_environment "$tmp" >"$tmp/ch/environment"
  chmod -R a+rX -- "$tmp"
  rm -rf -- "$IMAGE" "$IMAGE.sha256"
  mv -T -- "$tmp" "$IMAGE"
  python3 "$ROOT/workflow/scripts/image_digest.py" "$IMAGE" >/dev/null
  echo "$key" >"$IMAGE.key"
}

# The directory image as one SquashFS file, via a temporary file renamed into place, and its
# sidecar. lz4: ~1 s here against ~30 s with mksquashfs's default gzip, for a file ~1.4x larger.
build_squashfs() {
  local key=$1 tmp="$SQUASHFS.partial"
  rm -f -- "$tmp"
  mksquashfs "$IMAGE" "$tmp" -noappend -comp lz4 -quiet -no-progress >/dev/null
  chmod 0644 -- "$tmp"
  rm -f -- "$SQUASHFS.sha256"
  mv -T -- "$tmp" "$SQUASHFS"
  python3 "$ROOT/workflow/scripts/image_digest.py" "$SQUASHFS" >/dev/null
  echo "$key" >"$SQUASHFS.key"
}

cmd_install() {
  local sif=$1 key started=$SECONDS
  [[ $EUID -eq 0 ]] || { echo "$PROG: must run as root (apt-get install)" >&2; exit 2; }
  [[ -f $sif && -f $sif.sha256 ]] || die "no SIF with a sidecar at '$sif' (tests/cluster/prepare.sh builds it)"
  command -v apptainer >/dev/null || die "apptainer not on PATH (tests/cluster/apptainer.sh install)"
  ensure_packages
  key=$(cache_key "$sif")
  if [[ -d $IMAGE && -f $IMAGE.sha256 && $(cat "$IMAGE.key" 2>/dev/null) == "$key" ]]; then
    log "image $IMAGE is current"
  else
    log "unpacking $sif into $IMAGE"
    build_image "$sif" "$key"
  fi
  key=$(cut -d' ' -f1 "$IMAGE.sha256")  # the directory image's tree digest
  if [[ -f $SQUASHFS && -f $SQUASHFS.sha256 && $(cat "$SQUASHFS.key" 2>/dev/null) == "$key" ]]; then
    log "image $SQUASHFS is current"
  else
    log "packing $IMAGE into $SQUASHFS"
    build_squashfs "$key"
  fi
  log "ready: ch-run $(USER=${USER:-root} ch-run --version 2>&1), images $IMAGE and $SQUASHFS after $((SECONDS - started)) s"
}

# The root filesystem of SIF ($1) unpacked into directory $2.
unpack_sif() {
  local sif=$1 dir=$2 id
  id=$(apptainer sif list "$sif" | awk -F'|' '/FS \(Squashfs/ { gsub(/ /, "", $1); print $1; exit }')
  [[ -n $id ]] || die "no SquashFS partition in $sif"
  apptainer sif dump "$id" "$sif" >"$dir.sqfs"
  unsquashfs -q -n -d "$dir" "$dir.sqfs" >/dev/null
  rm -f -- "$dir.sqfs"
}

# Stack image SIF $1 with its image config $2 as the directory $3, its cache key $4; this checkout's top-level
# directory $5 as a mount point.
make_stack_image() {
  local sif=$1 config=$2 target=$3 key=$4 top=$5 tmp="$3.partial"
  rm -rf -- "$tmp" "$tmp.rootfs"
  unpack_sif "$sif" "$tmp.rootfs"
  python3 "$ROOT/container/oci.py" charliecloud "$tmp.rootfs" "$config" "$tmp"
  rm -rf -- "$tmp.rootfs"
  [[ -d $tmp$top ]] || mkdir -m 0755 -- "$tmp$top"
  chmod -R a+rX -- "$tmp"
  rm -rf -- "$target" "$target.sha256"
  mv -T -- "$tmp" "$target"
  python3 "$ROOT/workflow/scripts/image_digest.py" "$target" >/dev/null
  echo "$key" >"$target.key"
  log "stack image $target made from $sif"
}

# Each stack image not current is made side by side with the others (unpacking, copying and hashing a tree each:
# 33 s one after another on 2 CPUs for the four).
cmd_stacks() {
  local dir=$1 sif name config key target top pid failed=0 started=$SECONDS
  local -A making=()
  [[ $EUID -eq 0 ]] || { echo "$PROG: must run as root" >&2; exit 2; }
  command -v apptainer >/dev/null || die "apptainer not on PATH (tests/cluster/apptainer.sh install)"
  ensure_packages
  mkdir -p -- "$STACK_IMAGES"
  top=$(checkout_top)
  for sif in "$dir"/*.sif; do
    [[ -f $sif ]] || continue
    name=$(basename -- "$sif" .sif)
    config="$ROOT/container/stacks/$name.oci.json"
    [[ -f $config && -f $sif.sha256 ]] || die "no image config $config (or sidecar $sif.sha256) for $sif"
    key=$({ cut -d' ' -f1 "$sif.sha256"; cat -- "$config" "$ROOT/container/oci.py"; echo "$top $RECIPE"; } |
      sha256sum | cut -d' ' -f1)
    target="$STACK_IMAGES/$name"
    if [[ -d $target && -f $target.sha256 && $(cat "$target.key" 2>/dev/null) == "$key" ]]; then
      log "stack image $target is current"
      continue
    fi
    make_stack_image "$sif" "$config" "$target" "$key" "$top" &
    making[$!]=$target
  done
  for pid in "${!making[@]}"; do
    wait "$pid" || { log "error: making stack image ${making[$pid]} failed (its error above)"; failed=1; }
  done
  ((failed == 0)) || exit 1
  log "stack images ready in $STACK_IMAGES after $((SECONDS - started)) s"
}

cmd_status() {
  if command -v ch-run >/dev/null && [[ -d $IMAGE && -f $IMAGE.sha256 && -f $SQUASHFS && -f $SQUASHFS.sha256 ]]; then
    echo "installed: ch-run $(USER=${USER:-root} ch-run --version 2>&1), images $IMAGE and $SQUASHFS"
  else
    echo "not installed (expected ch-run on PATH and the images $IMAGE and $SQUASHFS with their sidecars)"
    exit 3
  fi
}

cmd_purge() {
  [[ $EUID -eq 0 ]] || { echo "$PROG: must run as root (apt-get purge)" >&2; exit 2; }
  [[ $CH_HOME == /?*/?* ]] || die "refusing to remove suspicious ALLOCSTACK_CHARLIECLOUD_HOME '$CH_HOME'"
  rm -rf -- "$CH_HOME" "$IMAGE" "$IMAGE".{sha256,key} "$SQUASHFS" "$SQUASHFS".{sha256,key} "$STACK_IMAGES"
  packages_purge charliecloud
  log "purged: the next install is a first install"
}

main() {
  case ${1:-} in
    install) (($# == 2)) || usage; cmd_install "$2" ;;
    stacks) (($# == 2)) || usage; cmd_stacks "$2" ;;
    status) (($# == 1)) || usage; cmd_status ;;
    purge) (($# == 1)) || usage; cmd_purge ;;
    *) usage ;;
  esac
}

main "$@"
