# shellcheck shell=sh
# Sourced by `make test` (and .ci/run): puts the test toolbox's apptainer on
# PATH and names the test images (the SIF, and the same image as a directory and as
# a SquashFS file for Charliecloud's ch-run), when tests/cluster/prepare.sh made them.
apptainer_home=${ALLOCSTACK_APPTAINER_HOME:-/opt/allocstack-apptainer}
if [ -x "$apptainer_home/bin/apptainer" ]; then
  export PATH="$apptainer_home/bin:$PATH"
fi
export ALLOCSTACK_TEST_IMAGE="${ALLOCSTACK_TEST_IMAGE:-$apptainer_home/images/allocstack-test.sif}"
export ALLOCSTACK_TEST_CHARLIECLOUD_IMAGE="${ALLOCSTACK_TEST_CHARLIECLOUD_IMAGE:-${ALLOCSTACK_CHARLIECLOUD_HOME:-/opt/allocstack-charliecloud}/images/allocstack-test}"
export ALLOCSTACK_TEST_CHARLIECLOUD_SQUASHFS="${ALLOCSTACK_TEST_CHARLIECLOUD_SQUASHFS:-$ALLOCSTACK_TEST_CHARLIECLOUD_IMAGE.sqfs}"
# The stack images (container/stacks/): NAME.sif for Apptainer, NAME/ for Charliecloud.
export ALLOCSTACK_STACK_IMAGES="${ALLOCSTACK_STACK_IMAGES:-$apptainer_home/images/stacks}"
export ALLOCSTACK_STACK_IMAGES_CHARLIECLOUD="${ALLOCSTACK_STACK_IMAGES_CHARLIECLOUD:-${ALLOCSTACK_CHARLIECLOUD_HOME:-/opt/allocstack-charliecloud}/images/stacks}"
unset apptainer_home
