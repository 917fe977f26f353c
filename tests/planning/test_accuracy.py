"""The planner against the H200 measurements (docs/benchmarks/): within 10%, and the committed table current."""

from __future__ import annotations

from pathlib import Path

import pytest

from mbridge_offload.bench.planner_accuracy import compare_host_markdown, compare_markdown, compare_rows

BENCHMARKS = Path(__file__).resolve().parents[2] / "docs" / "benchmarks"
SWEEPS = ("dense-1b-sweep", "moe-proxy-sweep", "moe-proxy-sweep-deep", "oom-8b")


@pytest.mark.parametrize("sweep", SWEEPS)
def test_plan_within_10_percent_of_h200_peaks(sweep):
    rows = compare_rows(BENCHMARKS / sweep)
    measured = [r for r in rows if r["measured_gib"] is not None]
    assert measured
    for r in measured:
        assert abs(r["error"]) <= 0.10, r


def test_committed_accuracy_table_is_current():
    dirs = [BENCHMARKS / d for d in SWEEPS]
    committed = (BENCHMARKS / "planner-accuracy.md").read_text()
    assert compare_markdown(dirs) in committed and compare_host_markdown(dirs) in committed
