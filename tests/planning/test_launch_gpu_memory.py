"""run_recipe.py --gpu-memory-gib on a launch: never more than the GPU it trains on; a plan made without a GPU is for
an H100 80GB as torch measures it (planning/arguments.py, planning/capacity.py)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from mbridge_offload.planning.arguments import add_plan_arguments, launch_gpu_memory_problem, plan_kwargs
from mbridge_offload.planning.capacity import H100_80GB_GIB

H100_GIB = 79.1787109375  # torch's total memory of an "80GB" H100 (docs/benchmarks/planner-auto-moe/, device_total_gib)
BENCHMARKS = Path(__file__).resolve().parents[2] / "docs" / "benchmarks"


def test_the_makers_gigabytes_are_refused_on_an_h100():
    problem = launch_gpu_memory_problem(80, H100_GIB)
    assert problem and "--gpu-memory-gib 80 " in problem and "79.18" in problem and "leave --gpu-memory-gib out" in problem


def test_less_than_the_gpu_or_no_gpu_or_no_value_is_fine():
    assert launch_gpu_memory_problem(40.36, H100_GIB) is None  # check_auto's device beside a ballast
    assert launch_gpu_memory_problem(H100_GIB, H100_GIB) is None
    assert launch_gpu_memory_problem(141, None) is None  # no GPU here: the launch itself will say so
    assert launch_gpu_memory_problem(None, H100_GIB) is None


def test_without_a_gpu_the_plan_is_for_what_the_h100_runs_recorded_not_the_makers_80(monkeypatch):
    """The full-device rule's 0.1 % margin is ~0.08 GiB on an H100: 80 GiB, 0.82 more than the card has, would let
    auto pick a fraction that runs out of memory there."""
    totals = {json.loads(line)["device_total_gib"]
              for path in BENCHMARKS.glob("planner-auto-8/*/auto/metrics.rank0.jsonl")
              for line in path.read_text().splitlines()}
    assert len(totals) == 1 and H100_80GB_GIB == pytest.approx(totals.pop(), abs=0.005)
    monkeypatch.setattr("mbridge_offload.planning.arguments.gpu_memory_gib_here", lambda: None)  # this machine's GPU
    parser = argparse.ArgumentParser()
    add_plan_arguments(parser)
    assert plan_kwargs(parser.parse_args([]))["gpu_memory_gib"] == H100_80GB_GIB
    assert plan_kwargs(parser.parse_args(["--gpu-memory-gib", "139.8"]))["gpu_memory_gib"] == 139.8
