#!/usr/bin/env bash
# Build an allocstack Apptainer image and its SHA-256 sidecar.
#
#   container/build.sh [--cache-dir DIR] [--mirror URL] [--oci CONFIG.json] DEF OUT.sif
#
# Writes OUT.sif and OUT.sif.sha256 (`sha256sum` format: "<hex>  <basename>"), which the
# workflow checks before every run. Both are written to temporary files beside OUT and renamed
# into place, so OUT is never a half-written image: it is either the old file or the new one.
#
# --cache-dir DIR  reuse DIR/<key>.sif when its own sidecar still matches it, where <key> is
#                  the SHA-256 of the definition file (plus the mirror, when the file uses
#                  one, and the image config with --oci), of this script and of `apptainer
#                  --version`. Rebuilds only when one of them changes.
# --mirror URL     Debian mirror for definition files that use {{ MIRROR }} (container/test.def).
#                  Default: $ALLOCSTACK_APT_MIRROR, else the main archive in /etc/apt.
# --oci CONFIG     make the image as Docker Hub gives one (container/stacks/): DEF's root filesystem
#                  with the image config CONFIG (ENTRYPOINT, CMD, EXPOSE, WORKDIR, ENV, VOLUME) as an
#                  OCI image (container/oci.py), built into the SIF from `oci-archive://`, so the SIF
#                  keeps that config and runs its ENTRYPOINT + CMD as a `docker://` one does. Needs
#                  unsquashfs (squashfs-tools). The cache key covers CONFIG too.
#
# Definition files that use {{ BUILD_CA }} (container/test.def: pip fetches a pinned wheel in
# %post) get a copy of this machine's CA bundle ($SSL_CERT_FILE, else the system bundle), so
# the build trusts what this machine trusts, a TLS-inspecting site proxy included. The copy
# lives in the build's temporary directory; the image does not keep it.
#
# Builds with `apptainer build --fakeroot`, which needs either root or an entry for your user
# in /etc/subuid and /etc/subgid (most centers set this up on build or login nodes).
#
# Exit codes: 0 ok, 1 build failed, 2 bad usage or missing prerequisite.
set -Eeuo pipefail

readonly PROG="${0##*/}"
# Definition files that take the mirror as a build argument say so with {{ MIRROR }}.
readonly MIRROR_PATTERN='\{\{[[:space:]]*MIRROR[[:space:]]*\}\}'
readonly BUILD_CA_PATTERN='\{\{[[:space:]]*BUILD_CA[[:space:]]*\}\}'

cache_dir=""
oci_config=""
mirror="${ALLOCSTACK_APT_MIRROR:-}"
def=""
out=""
workdir=""
# Temporary files not yet renamed into place, removed on any exit.
pending=()
# The running `apptainer build`, stopped with us on INT or TERM.
build_pid=""

usage() {
  echo "usage: $PROG [--cache-dir DIR] [--mirror URL] [--oci CONFIG.json] DEF OUT.sif" >&2
  exit 2
}

# A missing or wrong input: one clear line, exit 2.
fail() {
  echo "$PROG: $*" >&2
  exit 2
}

die() {
  echo "$PROG: $*" >&2
  exit 1
}

# A build takes a minute: stop it now rather than when it finishes. It runs in the background
# so that this trap runs at once (bash defers traps until a foreground child exits).
on_signal() {
  if [[ -n $build_pid ]]; then
    kill -TERM "$build_pid" 2>/dev/null || true
    wait "$build_pid" 2>/dev/null || true
  fi
  exit "$1"
}

cleanup() {
  [[ -z $workdir ]] || rm -rf -- "$workdir"
  ((${#pending[@]} == 0)) || rm -f -- "${pending[@]}"
}

parse_args() {
  while (($#)); do
    case $1 in
      --cache-dir) (($# >= 2)) || usage; cache_dir=$2; shift 2 ;;
      --mirror) (($# >= 2)) || usage; mirror=$2; shift 2 ;;
      --oci) (($# >= 2)) || usage; oci_config=$2; shift 2 ;;
      -h | --help) usage ;;
      -*) fail "unknown option '$1'" ;;
      *) break ;;
    esac
  done
  (($# == 2)) || usage
  def=$1
  out=$2
}

check_prerequisites() {
  command -v apptainer >/dev/null ||
    fail "apptainer not found on PATH: run 'module load apptainer' (or install Apptainer; on the test machine: tests/cluster/apptainer.sh install)"
  apptainer --version >/dev/null 2>&1 || fail "'apptainer --version' fails; check your apptainer installation"
  [[ -f $def && -r $def ]] || fail "definition file '$def' not found or not readable"
  if [[ -n $oci_config ]]; then
    [[ -f $oci_config && -r $oci_config ]] || fail "image config '$oci_config' not found or not readable"
    command -v unsquashfs >/dev/null || fail "--oci needs unsquashfs (Debian: apt-get install squashfs-tools)"
    command -v python3 >/dev/null || fail "--oci needs python3 (container/oci.py)"
  fi
  [[ $out != */ && -n ${out##*/} ]] || fail "OUT must be a file name, not a directory: '$out'"
  [[ -d $(dirname -- "$out") ]] || fail "output directory '$(dirname -- "$out")' does not exist"
  [[ -w $(dirname -- "$out") ]] || fail "output directory '$(dirname -- "$out")' is not writable"
}

# Print the Debian main-archive mirror from the machine's apt sources: the first deb822
# (*.sources) or one-line (*.list) entry whose suite is the host's own codename, which skips
# security and third-party repositories.
host_mirror() {
  local codename f files=()
  [[ -r /etc/os-release ]] || return 1
  # shellcheck source=/dev/null
  codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
  [[ -n $codename ]] || return 1
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
    [[ -f $f ]] && files+=("$f")
  done
  ((${#files[@]})) || return 1
  awk -v want="$codename" '
    FILENAME ~ /\.sources$/ {
      if ($0 ~ /^[[:space:]]*$/) { uris = ""; suites = ""; next }
      if (tolower($1) == "uris:")   { uris = $2 }
      if (tolower($1) == "suites:") { suites = " " substr($0, index($0, ":") + 1) " " }
      if (uris != "" && suites ~ (" " want " ")) { print uris; found = 1; exit }
      next
    }
    $1 == "deb" {
      i = 2
      if ($i ~ /^\[/) { while ($i !~ /\]$/) i++; i++ }
      if ($(i + 1) == want) { print $i; found = 1; exit }
    }
    END { exit !found }
  ' "${files[@]}"
}

uses_mirror() {
  grep -Eq "$MIRROR_PATTERN" -- "$def"
}

uses_build_ca() {
  grep -Eq "$BUILD_CA_PATTERN" -- "$def"
}

# Print the CA bundle this machine trusts.
host_ca_bundle() {
  local f
  for f in "${SSL_CERT_FILE:-}" /etc/ssl/certs/ca-certificates.crt /etc/pki/tls/certs/ca-bundle.crt; do
    [[ -n $f && -r $f ]] && { printf '%s\n' "$f"; return 0; }
  done
  return 1
}

# The cache key: what decides the image's contents that we can see from here: the definition file
# (and the mirror it uses), the image config and the code that makes the OCI image from it, this script
# itself and the Apptainer that builds. A change to any of them is a new key, so a new build.
cache_key() {
  {
    cat -- "$def"
    if uses_mirror; then printf '\nMIRROR=%s\n' "$mirror"; fi
    if [[ -n $oci_config ]]; then printf '\nOCI\n'; cat -- "$oci_config" "$(dirname -- "${BASH_SOURCE[0]}")/oci.py"; fi
    printf '\nBUILDER\n'
    cat -- "${BASH_SOURCE[0]}"
    apptainer --version
  } | sha256sum | cut -d' ' -f1
}

sha256_of() {
  sha256sum -- "$1" | cut -d' ' -f1
}

# True when FILE.sha256 exists and matches FILE (checked the way users check it).
sidecar_matches() {
  local file=$1
  [[ -f $file && -f $file.sha256 ]] &&
    (cd -- "$(dirname -- "$file")" && sha256sum --check --status -- "${file##*/}.sha256")
}

# Copy SRC to DEST with a DEST.sha256 sidecar, each via a temporary file and a rename.
# The image is renamed before the sidecar: in between, the old sidecar does not match the new
# image, so a concurrent check fails closed rather than accepting a wrong image.
install_with_sidecar() {
  local src=$1 dest=$2 dir tmp hex
  dir=$(dirname -- "$dest")
  hex=$(sha256_of "$src")
  tmp=$(mktemp "$dir/.${dest##*/}.XXXXXX")
  pending+=("$tmp")
  cp --reflink=auto -- "$src" "$tmp"
  chmod 0644 -- "$tmp"
  mv -f -- "$tmp" "$dest"
  tmp=$(mktemp "$dir/.${dest##*/}.sha256.XXXXXX")
  pending+=("$tmp")
  printf '%s  %s\n' "$hex" "${dest##*/}" >"$tmp"
  chmod 0644 -- "$tmp"
  mv -f -- "$tmp" "$dest.sha256"
}

# Build DEF into $workdir/image.sif (apptainer's %test section runs as part of the build).
build_image() {
  local args=(build --fakeroot)
  if uses_mirror; then args+=(--build-arg "MIRROR=$mirror"); fi
  if uses_build_ca; then
    local ca
    ca=$(host_ca_bundle) || fail "'$def' needs a CA bundle: none at \$SSL_CERT_FILE or the system paths"
    cp -- "$ca" "$workdir/build-ca.crt"
    args+=(--build-arg "BUILD_CA=$workdir/build-ca.crt")
  fi
  apptainer "${args[@]}" "$workdir/image.sif" "$def" >&2 &
  build_pid=$!
  wait "$build_pid" ||
    die "apptainer build failed for '$def'; see the messages above ($out left unchanged)"
  build_pid=""
  if [[ -n $oci_config ]]; then
    as_oci_image
  fi
}

# $workdir/image.sif's root filesystem + $oci_config -> an OCI image layout -> $workdir/image.sif again, built
# from oci-archive:// as Apptainer builds an image from Docker Hub.
as_oci_image() {
  local id
  id=$(apptainer sif list "$workdir/image.sif" | awk -F'|' '/FS \(Squashfs/ { gsub(/ /, "", $1); print $1; exit }')
  [[ -n $id ]] || die "no SquashFS partition in the image built from '$def'"
  apptainer sif dump "$id" "$workdir/image.sif" >"$workdir/rootfs.sqfs"
  unsquashfs -q -n -d "$workdir/rootfs" "$workdir/rootfs.sqfs" >/dev/null
  python3 "$(dirname -- "${BASH_SOURCE[0]}")/oci.py" archive "$workdir/rootfs" "$oci_config" "$workdir/image.tar"
  rm -rf -- "$workdir/rootfs" "$workdir/rootfs.sqfs" "$workdir/image.sif"
  apptainer build "$workdir/image.sif" "oci-archive://$workdir/image.tar" >&2 &
  build_pid=$!
  wait "$build_pid" || die "apptainer build from the OCI image of '$def' failed ($out left unchanged)"
  build_pid=""
  rm -f -- "$workdir/image.tar"
}

# Seconds since START (an $EPOCHREALTIME value), e.g. "81.3".
elapsed_since() {
  awk -v start="$1" -v now="$EPOCHREALTIME" 'BEGIN { printf "%.1f", now - start }'
}

main() {
  local started key cached="" source how
  parse_args "$@"
  check_prerequisites
  if uses_mirror && [[ -z $mirror ]]; then
    mirror=$(host_mirror) || fail "'$def' needs a Debian mirror: pass --mirror URL or set ALLOCSTACK_APT_MIRROR"
  fi
  started=$EPOCHREALTIME
  trap cleanup EXIT
  trap 'on_signal 130' INT
  trap 'on_signal 143' TERM
  workdir=$(mktemp -d "$(dirname -- "$out")/.${out##*/}.build.XXXXXX")

  key=$(cache_key)
  if [[ -n $cache_dir ]]; then
    mkdir -p -- "$cache_dir" || fail "cannot create cache directory '$cache_dir'"
    cached="$cache_dir/$key.sif"
  fi

  if [[ -n $cached ]] && sidecar_matches "$cached"; then
    source=$cached
    how="cache hit $cached"
    touch -- "$cached" "$cached.sha256"  # last used now: a cache may drop what was not used for long
  else
    build_image
    source="$workdir/image.sif"
    how="built from $def${oci_config:+ with the image config $oci_config}"
    [[ -z $cached ]] || install_with_sidecar "$source" "$cached"
  fi
  install_with_sidecar "$source" "$out"
  printf '%s: %s -> %s (sha256 %s) in %.1f s\n' "$PROG" "$how" "$out" \
    "$(cut -d' ' -f1 "$out.sha256")" "$(elapsed_since "$started")"
}

main "$@"
