#!/bin/sh
# A per-job temporary directory on each node, made by Slurm's prolog and removed at the job's end,
# as many centers give one ($TMPDIR=/local/$SLURM_JOB_ID, job_container/tmpfs): the test cluster's
# Prolog, Epilog and TaskProlog (tests/cluster/slurm.sh installs this file under those three names
# in its state directory and names them in slurm.conf).
#
#   prolog       (root, on each node, before the job's first step there): make
#                $NODE_SCRATCH/job-$SLURM_JOB_ID, 0700, owned by the job's user
#   epilog       (root, on each node, at the job's end): remove it
#   task-prolog  (the job's user, before each task): for a job that asks for it
#                (ALLOCSTACK_TEST_JOB_TMPDIR=TMPDIR, or =SLURM_TMPDIR, in its environment),
#                print `export TMPDIR=<that directory>` (or SLURM_TMPDIR, as centers that
#                name it so do), which Slurm sets in the task's environment
#
# Every other job gets an empty directory for its lifetime and nothing else: harmless for the
# other tests. It never fails (a failing Prolog or Epilog would drain the node): what it cannot
# do, it leaves undone.
NODE_SCRATCH=/tmp/allocstack-node-scratch
dir="$NODE_SCRATCH/job-${SLURM_JOB_ID:-none}"
case "${0##*/}" in
    prolog)
        [ -n "$SLURM_JOB_ID" ] && [ -d "$NODE_SCRATCH" ] || exit 0
        mkdir -m 0700 "$dir" 2>/dev/null && chown "${SLURM_JOB_UID:-0}" "$dir" 2>/dev/null
        ;;
    epilog)
        [ -n "$SLURM_JOB_ID" ] && rm -rf "$dir" 2>/dev/null
        ;;
    task-prolog)
        case "$ALLOCSTACK_TEST_JOB_TMPDIR" in
            TMPDIR | SLURM_TMPDIR) [ -d "$dir" ] && echo "export $ALLOCSTACK_TEST_JOB_TMPDIR=$dir" ;;
        esac
        ;;
esac
exit 0
