#!/usr/bin/env bash
# The real parts the test suite runs against (root only).
#
#   tests/cluster/prepare.sh [start]   install and start them (idempotent; `make test` runs it)
#   tests/cluster/prepare.sh purge     stop and remove all of them, their state and the packages
#                                      they installed: the next start is a first start, what a
#                                      fresh machine runs (`.ci/run` purges first, every time).
#                                      Kept, as apt keeps its downloads: the images built from
#                                      container/ in the image cache, each keyed by the SHA-256 of
#                                      everything that makes it (its recipe, image config, the
#                                      build script, Apptainer's version; container/build.sh), so
#                                      a changed recipe or build script is built again from nothing
#   tests/cluster/prepare.sh purge --all   the same, and the image cache too
#
# start:
#   1. the Slurm test cluster with six namespaced nodes beside the default one, two sets of three
#      (tests/cluster/slurm.sh start --nodes 6 --sets 2: the single-node tests keep the default node
#      and partitions; the multinode tests use partition `multi` or `multi2`, two of them at once),
#   2. the Apptainer toolbox (tests/cluster/apptainer.sh install), built while 1 starts,
#   3. the test image, built from container/test.def and cached by its hash, and the stack images
#      (container/stacks/NAME.def with NAME.oci.json: Redis, a Python application, the app images of the real
#      public stacks fastapi-celery and flask-celery with their pinned packages; built as Docker Hub gives images,
#      build.sh --oci),
#      cached the same way,
#   4. Charliecloud's ch-run and the same images as directories (the test image also as a SquashFS
#      file) (charliecloud.sh),
#   5. (while 4 makes the stack images) Debian's chromium, for the live status page test; tmux, a
#      real terminal for the tests of what a run prints on one; tcpdump, for the capture on the
#      multi-node cluster's bridge;
#      redis-server, the broker of the real public stacks run with their programs on the host
#      (tests/test_public_stacks.py: allocstack starts it as the stack's service; the system's
#      own redis service is not started here); passt (pasta), the way out of a stack's private network
#      (network.isolation: private), with /dev/net/tun usable by every user as Debian's udev leaves it.
# Each step prints the seconds since the start when it is done.
# Without root it says why and exits 0: the `slurm`, `multinode`, `apptainer` and `charliecloud`
# tests then skip with that reason. With ALLOCSTACK_REQUIRE_CLUSTER=1 (CI) any failure is fatal.
set -Eeuo pipefail

PROG=${0##*/}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
apptainer_home=${ALLOCSTACK_APPTAINER_HOME:-/opt/allocstack-apptainer}
image=${ALLOCSTACK_TEST_IMAGE:-$apptainer_home/images/allocstack-test.sif}
stack_images=${ALLOCSTACK_STACK_IMAGES:-$apptainer_home/images/stacks}
# Built images by the SHA-256 of what makes them (container/build.sh --cache-dir): outside the toolbox's home,
# so a purge keeps them. Building the five images from nothing takes about 400 s of a first start here.
image_cache=${ALLOCSTACK_IMAGE_CACHE:-/var/cache/allocstack-images}
# The second local user the tests make for "nobody else gets in" (tests/conftest.py OTHER_USER).
readonly OTHER_USER=allocstack-other
# shellcheck source=tests/cluster/packages.sh
. "$here/packages.sh"

if [[ $(id -u) -ne 0 && ${1:-start} == start ]]; then
  echo "prepare: not root: Slurm, Apptainer and Charliecloud cannot be installed here; their tests will be skipped" >&2
  [[ ${ALLOCSTACK_REQUIRE_CLUSTER:-0} == 1 ]] && exit 1
  exit 0
fi

# step_ended NAME WHAT CODE: a background step's output ($logs/NAME), whole, once it ended with CODE; when CODE
# is not 0, on stderr with a line saying WHAT failed, and false.
step_ended() {
  if (($3 == 0)); then
    cat "$logs/$1"
    return 0
  fi
  cat "$logs/$1" >&2
  echo "prepare: error: $2 failed (its output above)" >&2
  return 1
}

start() {
  local started=$SECONDS toolbox code
  logs=$(mktemp -d)
  trap 'rm -rf -- "$logs"' EXIT # the steps' own logs: printed as each ends, removed however this ends
  # The Apptainer toolbox is built beside Slurm's start: past its prerequisites it uses no host apt (mmdebstrap
  # has its own, in the toolbox), and both mostly wait for downloads and dpkg. Its output is printed once it ended.
  bash "$here/apptainer.sh" prerequisites
  bash "$here/apptainer.sh" install >"$logs/toolbox" 2>&1 &
  toolbox=$!
  if ! bash "$here/slurm.sh" start --nodes 6 --sets 2; then
    pkill -TERM -P "$toolbox" || true
    kill -TERM "$toolbox" 2>/dev/null || true
    exit 1
  fi
  echo "prepare: Slurm test cluster (and 6 namespaced nodes in 2 partitions) up after $((SECONDS - started)) s"
  code=0
  wait "$toolbox" || code=$?
  step_ended toolbox "the Apptainer toolbox" "$code" || exit 1
  echo "prepare: Apptainer toolbox ready after $((SECONDS - started)) s"
  # The test image and the stack images are built side by side (each mostly waits for downloads and dpkg):
  # each build's output goes to its own log, printed whole when it ends.
  packages_install prepare squashfs-tools
  mkdir -p "$stack_images"
  local def name pid failed=0
  local -A builds=()
  PATH="$apptainer_home/bin:$PATH" bash "$root/container/build.sh" \
    --cache-dir "$image_cache" "$root/container/test.def" "$image" >"$logs/test" 2>&1 &
  builds[$!]="test"
  for def in "$root"/container/stacks/*.def; do
    name=$(basename "$def" .def)
    PATH="$apptainer_home/bin:$PATH" bash "$root/container/build.sh" --cache-dir "$image_cache" \
      --oci "${def%.def}.oci.json" "$def" "$stack_images/$name.sif" >"$logs/$name" 2>&1 &
    builds[$!]=$name
  done
  while ((${#builds[@]})); do
    code=0
    wait -n -p pid "${!builds[@]}" || code=$?
    if step_ended "${builds[$pid]}" "building image ${builds[$pid]}" "$code"; then
      echo "prepare: image ${builds[$pid]} ready after $((SECONDS - started)) s"
    else
      failed=1
    fi
    unset "builds[$pid]"
  done
  ((failed == 0)) || exit 1
  # Images no start used for a week (build.sh touches what it takes from the cache): recipes since changed.
  find "$image_cache" -maxdepth 1 -name '*.sif*' -mtime +7 -delete
  echo "prepare: test image $image ready after $((SECONDS - started)) s"
  echo "prepare: stack images in $stack_images ready after $((SECONDS - started)) s"
  PATH="$apptainer_home/bin:$PATH" bash "$here/charliecloud.sh" install "$image"
  # The stack images' conversion uses no apt: the last packages are installed meanwhile.
  PATH="$apptainer_home/bin:$PATH" bash "$here/charliecloud.sh" stacks "$stack_images" &
  pid=$!
  packages_install prepare chromium tcpdump tmux redis-server passt
  wait "$pid" || { echo "prepare: error: Charliecloud's stack images failed (above)" >&2; exit 1; }
  echo "prepare: Charliecloud and its test image ready after $((SECONDS - started)) s"
  tun_for_users
  echo "prepare: $(chromium --version), $(tcpdump --version 2>&1 | head -1), $(tmux -V), $(redis-server --version | cut -d' ' -f1-3), pasta ready after $((SECONDS - started)) s"
}

# pasta (the stack's private network's way out, network.isolation: private) opens /dev/net/tun as the user who runs
# the stack. Debian's udev makes it crw-rw-rw-; this sandbox's device is root's alone (0600): given Debian's mode,
# the old one kept in $tun_mode_file for purge to restore.
tun_mode_file=/var/lib/allocstack-prepare/tun-mode
tun_for_users() {
  [[ -c /dev/net/tun ]] || return 0
  local mode
  mode=$(stat -c %a /dev/net/tun)
  if [[ $mode != 666 ]]; then
    mkdir -p "${tun_mode_file%/*}"
    echo "$mode" >"$tun_mode_file"
    chmod 0666 /dev/net/tun
  fi
}

tun_restore() {
  if [[ -f $tun_mode_file ]]; then
    chmod "$(cat "$tun_mode_file")" /dev/net/tun
    rm -f -- "$tun_mode_file"
  fi
}

purge() {
  local started=$SECONDS everything=${1:-}
  bash "$here/slurm.sh" purge
  bash "$here/charliecloud.sh" purge
  bash "$here/apptainer.sh" purge
  packages_purge prepare
  packages_purge lint
  tun_restore
  if getent passwd "$OTHER_USER" >/dev/null; then
    userdel "$OTHER_USER"
  fi
  if [[ $everything == --all ]]; then
    rm -rf -- "$image_cache"
    echo "prepare: removed the image cache $image_cache"
  elif [[ -d $image_cache ]]; then
    echo "prepare: kept the image cache $image_cache ($(du -sh -- "$image_cache" | cut -f1)): an image is built again" \
      "when its recipe, image config, container/build.sh or Apptainer changes (purge --all removes it)"
  fi
  echo "prepare: purged in $((SECONDS - started)) s: the next start is a first start"
}

case ${1:-start} in
  start) start ;;
  purge)
    [[ $# -le 2 && ${2:---all} == --all ]] || { echo "usage: $PROG purge [--all]" >&2; exit 64; }
    purge "${2:-}" ;;
  *) echo "usage: $PROG [start|purge [--all]]" >&2; exit 64 ;;
esac
