"""The planner against the H200 measurements (docs/benchmarks/): within 10% on the runs its constants were
fitted on or its model checked against, within the issue's 2% on held-out runs, and the committed tables current."""

from __future__ import annotations

from pathlib import Path

import pytest

from mbridge_offload.bench.planner_accuracy import (CALIBRATION, HELDOUT, compare_host_markdown, compare_markdown, compare_rows,
                                                    heldout_markdown, largest_underprediction)
from mbridge_offload.planning import memory_plan

BENCHMARKS = Path(__file__).resolve().parents[2] / "docs" / "benchmarks"
# The held-out run whose whole device the plan is short of (docs/benchmarks/planner-heldout-3/README.md): Qwen3-0.6B
# at 8192 tokens at fraction 1 with the overlap reserved 2.32 GiB beyond its peak against the plan's 1.17 GiB, 4.0 %
# short of the whole device, beyond auto's 2 % margin. Held out, so no constant was refitted on it. The two checks
# below leave it out and the test after them holds it, so a planner that covers it, or a second such run, shows.
UNDERPLANNED = ("planner-heldout-3/0p6b-sl8192-fraction-1-overlap-on",)


def _known_underplanned(row: dict) -> bool:
    return row["run"].endswith(UNDERPLANNED)


def _reserve_gib(row: dict) -> float:
    """The allocator's reserve beyond PyTorch's peak: the whole device less the peak and the memory outside PyTorch,
    both from NVML."""
    return row["measured_device_gib"] - row["measured_outside_pytorch_gib"] - row["measured_gib"]


@pytest.mark.parametrize("folder", CALIBRATION)
def test_plan_within_10_percent_of_the_calibration_runs(folder):
    rows = compare_rows(BENCHMARKS / folder)
    measured = [r for r in rows if r["measured_gib"] is not None]
    assert measured
    for r in measured:
        assert abs(r["error"]) <= 0.10, r


def test_peak_allocated_within_2_percent_on_every_heldout_run():
    """The issue's goal, on runs made after the planner was fixed (none of them set or checked anything in it)."""
    rows = [r for folder in HELDOUT for r in compare_rows(BENCHMARKS / folder) if r["measured_gib"] is not None]
    assert len(rows) >= 15
    assert {r["recipe"] for r in rows} >= {"qwen3_0p6b_pretrain_config", "qwen3_1p7b_pretrain_config",
                                           "qwen3_4b_pretrain_config", "qwen3_30b_a3b_proxy_pretrain_config"}
    for r in rows:
        assert abs(r["error"]) <= 0.02, r


def test_the_whole_device_is_never_underplanned_beyond_autos_margin_on_heldout_runs():
    rows = [r for folder in HELDOUT for r in compare_rows(BENCHMARKS / folder)
            if r["measured_device_gib"] is not None and not _known_underplanned(r)]
    assert len(rows) >= 15
    assert largest_underprediction(rows) <= memory_plan.HELDOUT_UNDERPREDICTION_SHARE


def test_the_expandable_segments_reserve_covers_the_heldout_runs_with_them():
    """Set on the three runs of alloc-conf/calibration; checked on the held-out runs that had expandable segments
    (measured reserve: the whole device less PyTorch's peak and the memory outside PyTorch, both from NVML)."""
    rows = [r for folder in HELDOUT for r in compare_rows(BENCHMARKS / folder)
            if r["expandable_segments"] and r["measured_device_gib"] is not None and not _known_underplanned(r)]
    assert len(rows) >= 6
    for r in rows:
        assert 0 <= _reserve_gib(r) <= memory_plan.EXPANDABLE_ALLOCATOR_RESERVE_BYTES / memory_plan.GIB, r


def test_the_heldout_run_the_plan_is_short_of():
    """Qwen3-0.6B at 8192 tokens at fraction 1 with the overlap (planner-heldout-3, H200): PyTorch's peak and the
    memory outside PyTorch as planned, but the allocator reserved 2.32 GiB beyond the peak, about one bf16 logits
    tensor (8192 x 151,936 x 2 B); the plan counts 1.17 GiB, and is 4.0 % short of the whole device."""
    (row,) = [r for r in compare_rows(BENCHMARKS / "planner-heldout-3") if _known_underplanned(r)]
    assert abs(row["error"]) <= 0.02  # PyTorch's own peak is planned
    # the miss is the reserve alone: when a planner change covers it, this fails, and the run rejoins the checks above
    assert _reserve_gib(row) > memory_plan.EXPANDABLE_ALLOCATOR_RESERVE_BYTES / memory_plan.GIB
    assert largest_underprediction([row]) > memory_plan.HELDOUT_UNDERPREDICTION_SHARE


def test_committed_accuracy_tables_are_current():
    dirs = [BENCHMARKS / d for d in CALIBRATION]
    heldout = [BENCHMARKS / d for d in HELDOUT]
    committed = (BENCHMARKS / "planner-accuracy.md").read_text()
    assert compare_markdown(dirs) in committed and compare_host_markdown(dirs) in committed
    assert heldout_markdown(heldout) in committed and compare_host_markdown(heldout) in committed
