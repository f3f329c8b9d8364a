# Sourced by `make test` (and .ci/run): puts the test toolbox's apptainer on
# PATH and names the test image, when tests/cluster/prepare.sh made them.
apptainer_home=${ALLOCSTACK_APPTAINER_HOME:-/opt/allocstack-apptainer}
if [ -x "$apptainer_home/bin/apptainer" ]; then
  export PATH="$apptainer_home/bin:$PATH"
fi
export ALLOCSTACK_TEST_IMAGE=${ALLOCSTACK_TEST_IMAGE:-$apptainer_home/images/allocstack-test.sif}
unset apptainer_home
