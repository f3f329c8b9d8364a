#!/usr/bin/env bash
# `make lint`'s shell part: Debian's shellcheck over the scripts of tests/cluster/ and container/.
# Installs shellcheck when it is missing and this runs as root (recorded for `prepare.sh purge`);
# without root and without it, says so and exits 0 (1 with ALLOCSTACK_REQUIRE_CLUSTER=1, as in CI).
set -Eeuo pipefail

PROG=${0##*/}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
# shellcheck source=tests/cluster/packages.sh
. "$here/packages.sh"

if ! command -v shellcheck >/dev/null 2>&1; then
  if [[ $(id -u) -eq 0 ]]; then
    packages_install lint shellcheck
  else
    echo "$PROG: shellcheck is not installed (as root: apt-get install shellcheck): shell scripts not checked" >&2
    [[ ${ALLOCSTACK_REQUIRE_CLUSTER:-0} == 1 ]] && exit 1
    exit 0
  fi
fi
cd "$root"
# -x: follow the `. packages.sh` lines, so what a script sources is checked as part of it.
shellcheck -x tests/cluster/*.sh container/*.sh .ci/run
echo "$PROG: $(find tests/cluster container -maxdepth 1 -name '*.sh' | wc -l) scripts and .ci/run clean ($(shellcheck --version | sed -n 's/^version: //p'))"
