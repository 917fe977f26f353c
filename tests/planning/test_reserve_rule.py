"""The planner's reserve rules (facts/reserve_rule.py): steady-peak, the default, counts the loss's block beside the
steady state's peak; first-step counts it beside step 1's memory before the GPU part's Adam moments exist
(docs/benchmarks/reserve-snapshot/), on the configurations whose reading was made, and says so in the plan."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from overrides import apply_overrides
from mbridge_offload.facts.reserve_rule import FIRST_STEP, RESERVE_RULE_ENV, STEADY_PEAK
from mbridge_offload.planning import GIB, memory_plan, plan
from mbridge_offload.planning.activations import largest_loss_tensor_bytes
from mbridge_offload.planning.report import FIRST_STEP_LOSS_TENSOR_NOTE, LOSS_TENSOR_RESERVE_NOTE, format_plan

SNAPSHOTS = Path(__file__).resolve().parents[2] / "docs" / "benchmarks" / "reserve-snapshot"
# the two runs whose allocator history the rule reads, as they ran (fraction 0.65, micro batch 2)
SNAPSHOT_RUNS = {"0p6b-sl8192-mb2": ("qwen3_0p6b_pretrain_config", 8192),
                 "1b-proxy-sl6144-mb2": ("qwen3_1b_proxy_pretrain_config", 6144)}


def _cfg(built, recipe: str, tokens: int, *extra: str):
    return apply_overrides(built(recipe), [f"model.seq_length={tokens}", f"dataset.seq_length={tokens}",
                                           "train.micro_batch_size=2", "train.global_batch_size=2", *extra])


def _plans(cfg, monkeypatch, fraction: float):
    monkeypatch.delenv(RESERVE_RULE_ENV, raising=False)
    steady = plan(cfg, 1, fraction=fraction, expandable=True)
    monkeypatch.setenv(RESERVE_RULE_ENV, FIRST_STEP)
    return steady, plan(cfg, 1, fraction=fraction, expandable=True)


def _gpu_moments(p) -> int:
    return (p.optimizer_params_per_rank - p.offloaded_params_per_rank) * 8


@pytest.mark.parametrize("fraction", [0.0, 0.65, 1.0])
def test_first_step_counts_the_block_beside_the_memory_without_the_gpu_parts_moments(built, monkeypatch, fraction):
    cfg = _cfg(built, "qwen3_0p6b_pretrain_config", 8192)
    steady, first = _plans(cfg, monkeypatch, fraction)
    assert steady.reserve_rule == STEADY_PEAK and first.reserve_rule == FIRST_STEP
    assert first.allocated_bytes_gpu == steady.allocated_bytes_gpu  # the rule moves only the reserve
    envelope = memory_plan.reserve_envelope_bytes(steady.allocated_bytes_gpu, True)
    block = largest_loss_tensor_bytes(cfg) + memory_plan.LOSS_TENSOR_RESERVE_SLACK_BYTES
    allocated, outside = steady.allocated_bytes_gpu, steady.outside_pytorch_bytes_gpu
    assert steady.total_bytes_gpu == allocated + max(envelope, block) + outside
    assert first.total_bytes_gpu == max(allocated + envelope, allocated - _gpu_moments(first) + block) + outside
    # without moments on the GPU (fraction 1) the two rules agree; with them, first-step plans less
    assert (first.total_bytes_gpu == steady.total_bytes_gpu) == (fraction == 1.0)


def test_the_plan_says_which_rule_counted_the_block(built, monkeypatch):
    steady, first = _plans(_cfg(built, "qwen3_0p6b_pretrain_config", 8192), monkeypatch, 0.65)
    assert LOSS_TENSOR_RESERVE_NOTE in format_plan(steady) and FIRST_STEP_LOSS_TENSOR_NOTE not in format_plan(steady)
    assert FIRST_STEP_LOSS_TENSOR_NOTE in format_plan(first)
    assert any(f"{RESERVE_RULE_ENV}={FIRST_STEP}" in note and "NOT yet checked" in note for note in first.notes)
    assert not any(RESERVE_RULE_ENV in note for note in steady.notes)


@pytest.mark.parametrize("recipe, extra, stream", [
    ("qwen3_30b_a3b_proxy_pretrain_config", ("model.num_layers=3",), False),  # communicators made in step 2
    ("qwen3_0p6b_pretrain_config", (), True),  # the stream engine's GPU state was not traced
])
def test_first_step_is_not_applied_where_its_reading_was_not_made_and_the_plan_says_so(built, monkeypatch, recipe,
                                                                                       extra, stream):
    cfg = _cfg(built, recipe, 8192, *extra, *(("++env_vars.MBRIDGE_OFFLOAD_ENGINE=stream",) if stream else ()))
    steady, first = _plans(cfg, monkeypatch, 0.65)
    assert first.reserve_rule == STEADY_PEAK and first.total_bytes_gpu == steady.total_bytes_gpu
    assert any("does not apply to this configuration" in note for note in first.notes)


@pytest.mark.parametrize("run", sorted(SNAPSHOT_RUNS))
def test_step_ones_memory_without_the_moments_is_what_the_recorded_runs_held_in_step_1(built, monkeypatch, run):
    """The memory the rule counts the block beside, against the recorded runs' step-1 peak (no constant of the rule
    was set on them: it has none), and the whole device it plans against what they used on the whole H200."""
    recipe, tokens = SNAPSHOT_RUNS[run]
    _, first = _plans(_cfg(built, recipe, tokens), monkeypatch, 0.65)
    steps = [json.loads(line) for line in (SNAPSHOTS / run / "metrics.rank0.jsonl").read_text().splitlines()]
    beside = (first.allocated_bytes_gpu - _gpu_moments(first)) / GIB
    assert beside == pytest.approx(steps[0]["peak_allocated_gib"], rel=0.01)
    # the run kept its step-2 hole on the roomy device; the plan still covers that use
    assert first.total_bytes_gpu / GIB >= max(s["device_process_used_gib"] for s in steps)
