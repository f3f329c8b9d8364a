#!/usr/bin/env bash
# Prepare the real parts the test suite runs against (root only):
#   1. the single-node Slurm test cluster (tests/cluster/slurm.sh start),
#   2. the Apptainer toolbox (tests/cluster/apptainer.sh install),
#   3. the test image, built from container/test.def and cached by its hash,
#   4. Charliecloud's ch-run and the same image as a directory (tests/cluster/charliecloud.sh),
#   5. Debian's chromium, for the live status page test,
#   6. tmux, a real terminal for the tests of what a run prints on one.
# Without root it says why and exits 0: the `slurm`, `apptainer` and `charliecloud`
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
bash "$here/slurm.sh" start
echo "prepare: Slurm test cluster up after $((SECONDS - started)) s"
bash "$here/apptainer.sh" install
echo "prepare: Apptainer toolbox ready after $((SECONDS - started)) s"
PATH="$apptainer_home/bin:$PATH" bash "$root/container/build.sh" \
  --cache-dir "$apptainer_home/images/cache" "$root/container/test.def" "$image"
echo "prepare: test image $image ready after $((SECONDS - started)) s"
PATH="$apptainer_home/bin:$PATH" bash "$here/charliecloud.sh" install "$image"
echo "prepare: Charliecloud and its test image ready after $((SECONDS - started)) s"
if ! command -v chromium >/dev/null 2>&1; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium >/dev/null \
    || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium >/dev/null; }
fi
echo "prepare: $(chromium --version) ready after $((SECONDS - started)) s"
if ! command -v tmux >/dev/null 2>&1; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends tmux >/dev/null \
    || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends tmux >/dev/null; }
fi
echo "prepare: $(tmux -V) ready after $((SECONDS - started)) s"
