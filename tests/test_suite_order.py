"""The order the suite hands its tests out in (tests/conftest.py): the runs on the test cluster's one node spread
among the local tests, the multi-node chains first."""

from __future__ import annotations

import itertools

from conftest import interleaved, multinode_scope


def test_the_spread_tests_come_evenly_among_the_others_and_end_at_their_share():
    items = [f"local-{n}" for n in range(24)] + [f"slurm-{n}" for n in range(8)]
    order = interleaved(items, lambda item: item.startswith("slurm"), share=0.75)
    assert sorted(order) == sorted(items)
    assert [item for item in order if item.startswith("slurm")] == [f"slurm-{n}" for n in range(8)]  # kept in order
    assert [item for item in order if item.startswith("local")] == [f"local-{n}" for n in range(24)]
    positions = [order.index(f"slurm-{n}") for n in range(8)]
    gaps = [later - earlier for earlier, later in itertools.pairwise(positions)]
    assert set(gaps) <= {3, 4}, positions  # about every 3 local tests, none bunched
    assert positions[0] <= 2 and positions[-1] <= 0.75 * len(items) + 1, positions


def test_nothing_to_spread_keeps_the_order():
    items = ["a", "b", "c"]
    assert interleaved(items, lambda item: False) == items
    assert interleaved(items, lambda item: True, share=1.0) == items


def test_the_multinode_tests_make_two_chains_by_their_file():
    assert multinode_scope("test_multinode.py::test_baseline_runs[x]") == "multinode-1"
    assert multinode_scope("test_tmpdir_matrix.py::test_every_row_on_the_three_multinode_nodes[tmp]") == "multinode-2"
    assert multinode_scope("test_slurm.py::test_baseline_is_one_sbatch_job") is None
    assert multinode_scope("test_slurm.py::test_x[multinode-looking-param]") is None  # the id's parameters do not count
