#!/usr/bin/env bash
# Prepare the real parts the test suite runs against (root only):
#   1. the Slurm test cluster with its three namespaced nodes beside the default one
#      (tests/cluster/slurm.sh start --nodes 3: the single-node tests keep the default node
#      and partitions, the multinode tests use partition `multi`),
#   2. the Apptainer toolbox (tests/cluster/apptainer.sh install),
#   3. the test image, built from container/test.def and cached by its hash,
#   4. Charliecloud's ch-run and the same image as a directory and a SquashFS file (charliecloud.sh),
#   5. Debian's chromium, for the live status page test,
#   6. tmux, a real terminal for the tests of what a run prints on one,
#   7. tcpdump, for the capture on the multi-node cluster's bridge.
# Without root it says why and exits 0: the `slurm`, `multinode`, `apptainer` and `charliecloud`
# tests then skip with that reason. With ALLOCSTACK_REQUIRE_CLUSTER=1 (CI) any failure is fatal.
set -Eeuo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
apptainer_home=${ALLOCSTACK_APPTAINER_HOME:-/opt/allocstack-apptainer}
image=${ALLOCSTACK_TEST_IMAGE:-$apptainer_home/images/allocstack-test.sif}

if [[ $(id -u) -ne 0 ]]; then
  echo "prepare: not root: Slurm, Apptainer and Charliecloud cannot be installed here; their tests will be skipped" >&2
  [[ ${ALLOCSTACK_REQUIRE_CLUSTER:-0} == 1 ]] && exit 1
  exit 0
fi

started=$SECONDS
bash "$here/slurm.sh" start --nodes 3
echo "prepare: Slurm test cluster (and 3 namespaced nodes) up after $((SECONDS - started)) s"
bash "$here/apptainer.sh" install
echo "prepare: Apptainer toolbox ready after $((SECONDS - started)) s"
PATH="$apptainer_home/bin:$PATH" bash "$root/container/build.sh" \
  --cache-dir "$apptainer_home/images/cache" "$root/container/test.def" "$image"
echo "prepare: test image $image ready after $((SECONDS - started)) s"
PATH="$apptainer_home/bin:$PATH" bash "$here/charliecloud.sh" install "$image"
echo "prepare: Charliecloud and its test image ready after $((SECONDS - started)) s"
missing=()
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v tcpdump >/dev/null 2>&1 || missing+=(tcpdump)
if ((${#missing[@]})); then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null \
    || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null; }
fi
echo "prepare: $(chromium --version), $(tcpdump --version 2>&1 | head -1) ready after $((SECONDS - started)) s"
if ! command -v tmux >/dev/null 2>&1; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends tmux >/dev/null \
    || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends tmux >/dev/null; }
fi
echo "prepare: $(tmux -V) ready after $((SECONDS - started)) s"
