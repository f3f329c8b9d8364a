"""The order the suite hands its tests out in (tests/conftest.py): the multi-node tests as two chains, one per set of
namespaced nodes."""

from __future__ import annotations

from conftest import multinode_scope


def test_the_multinode_tests_make_two_chains_by_their_file():
    assert multinode_scope("test_multinode.py::test_baseline_runs[x]") == "multinode-1"
    assert multinode_scope("test_tmpdir_matrix.py::test_every_row_on_the_three_multinode_nodes[tmp]") == "multinode-2"
    assert multinode_scope("test_slurm.py::test_baseline_is_one_sbatch_job") is None
    assert multinode_scope("test_slurm.py::test_x[multinode-looking-param]") is None  # the id's parameters do not count
