"""The scale benchmark's simulated workers (benchmarks/scale.py) against a real coordinator, small: the shape the
plan gives (a relay per step above 16 workers, each worker its own connection below) finishes every task exactly
once, no allowed worker refused, and the relays carried the workers' requests in batches (what the benchmark's
figures rest on; its speed is the benchmark's, not asserted here)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import scale


@pytest.mark.parametrize(("workers", "nodes"), [(4, 1), (192, 3)])
def test_simulated_workers_finish_every_task_once_with_no_refusal(workers, nodes):
    row = scale.simulated_run(3000, workers, nodes)
    assert row["exactlyOnce"] and row["resultCount"] == row["results"] == 3000
    assert row["refused"] == 0 and row["unanswered"] == 0 and row["done"] == workers
    if workers > 16:
        assert row["perStep"] == 64 and row["coordinatorRequests"] < row["requests"]  # batched by the relays
    else:
        assert row["perStep"] == 1 and row["roundTrips"] == row["requests"]  # each request its own round trip
