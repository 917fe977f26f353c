"""The planner against the H200 measurements (docs/benchmarks/): within 10% on the runs its constants were
fitted on or its model checked against, within the issue's 2% on held-out runs, and the committed tables current."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mbridge_offload.bench.planner_accuracy import (CALIBRATION, HELDOUT, compare_host_markdown, compare_markdown, compare_rows,
                                                    heldout_markdown, largest_underprediction)
from mbridge_offload.facts.reserve_rule import FIRST_STEP, RESERVE_RULE_ENV, STEADY_PEAK, SUB_PAGE_GAPS_GIB
from mbridge_offload.planning import memory_plan

BENCHMARKS = Path(__file__).resolve().parents[2] / "docs" / "benchmarks"
# The run that set the reserve's loss-tensor term (memory_plan.LOSS_TENSOR_RESERVE_SLACK_BYTES) beside a calibration
# run: Qwen3-0.6B at 8192 tokens at fraction 1 reserved one bf16 logits tensor beyond its peak (planner-heldout-3).
# It was held out until then; its whole device no longer counts as held out, its PyTorch peak still does.
SET_THE_LOSS_TENSOR_TERM = ("planner-heldout-3/0p6b-sl8192-fraction-1-overlap-on",)


# The held-out run whose reserve the term is short of (planner-heldout-4/): the 1.1B proxy at 3 x 4096 tokens at
# fraction 1 reserved 3.527 GiB, its logits (3.477 GiB) + 0.050, against the 0.02 GiB slack the term was set with.
# Held out, so the slack was not refitted; the whole device is still planned (+0.0 %): PyTorch's peak is planned
# 0.04 GiB high. The reserve check leaves it out and the test after it holds it.
RESERVE_SHORT = ("planner-heldout-4/1b-proxy-sl4096-mb3-fraction-1",)


def _set_the_loss_tensor_term(row: dict) -> bool:
    return row["run"].endswith(SET_THE_LOSS_TENSOR_TERM)


def _reserve_gib(row: dict) -> float:
    """The allocator's reserve beyond PyTorch's peak: the whole device less the peak and the memory outside PyTorch,
    both from NVML."""
    return row["measured_device_gib"] - row["measured_outside_pytorch_gib"] - row["measured_gib"]


def _heldout_device_rows() -> list[dict]:
    return [r for folder in HELDOUT for r in compare_rows(BENCHMARKS / folder)
            if r["measured_device_gib"] is not None and not _set_the_loss_tensor_term(r)]


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


def test_first_step_never_underplans_the_whole_device_beyond_its_margin_on_heldout_runs(monkeypatch):
    """With first-step's 2 % margin. The default, full-device, plans what a full device needs: on these runs, on
    devices with room, the allocator kept more (test_full_device_* below)."""
    monkeypatch.setenv(RESERVE_RULE_ENV, FIRST_STEP)
    rows = _heldout_device_rows()
    assert len(rows) >= 15
    assert largest_underprediction(rows) <= memory_plan.HELDOUT_UNDERPREDICTION_SHARE


def test_the_planned_reserve_covers_every_heldout_run(monkeypatch):
    """The reserve first-step counts (the envelope of its setting, or the loss's largest tensor where that is larger)
    against the one measured (NVML's whole device less PyTorch's peak and the memory outside PyTorch), with and
    without expandable segments, on the runs that set nothing in it: it covers all but the four recompute runs named
    below, which it misses by at most 0.4 GiB."""
    monkeypatch.setenv(RESERVE_RULE_ENV, FIRST_STEP)
    rows = [r for r in _heldout_device_rows() if not r["run"].endswith(RESERVE_SHORT)]
    assert sum(r["expandable_segments"] for r in rows) >= 12
    short = {r["run"].split("/docs/benchmarks/")[1]: _reserve_gib(r) - r["planned_reserve_gib"] for r in rows
             if not 0 <= _reserve_gib(r) <= r["planned_reserve_gib"]}
    assert set(short) == RECOMPUTE_RESERVE_SHORT, short
    assert all(0 < gib <= 0.4 for gib in short.values()), short


# The held-out runs whose reserve beside the peak was more than the plan's envelope (1.17 GiB with expandable
# segments): Qwen3-4B with full recompute at 8192 and 16384 tokens, fraction 0.5, on the whole device (1.51 and 1.56
# GiB, planner-auto-7/), and the same 8192-token configuration at 0.6 and 0.55 with 2.2 and 0.7 GiB free
# (planner-auto-8/first-step-recheck/). Each stays within auto's 2 % margin of the whole device, and on a full device
# the 8192-token configuration kept 1.0 GiB (its out-of-memory errors at 0.5 and 0.45), under the envelope; on a
# device with room the allocator keeps more than a full device needs. No term of the plan predicts it yet.
RECOMPUTE_RESERVE_SHORT = {"planner-auto-7/whole-device/4b-sl8192-recompute-0.5",
                           "planner-auto-7/whole-device/4b-sl16384-recompute-0.5",
                           "planner-auto-8/first-step-recheck/4b-sl8192-recompute/auto",
                           "planner-auto-8/first-step-recheck/4b-sl8192-recompute/fraction-0.55"}


def test_the_recompute_runs_beyond_the_envelope_are_within_autos_margin():
    rows = {r["run"].split("/docs/benchmarks/")[1]: r for r in _heldout_device_rows()}
    for run in RECOMPUTE_RESERVE_SHORT:
        r = rows[run]
        assert "model.recompute_granularity=full" in r["overrides"], run
        planned = r["planned_device_gib"] * (1 + memory_plan.HELDOUT_UNDERPREDICTION_SHARE)
        assert r["measured_device_gib"] <= planned, r


# The configuration the full-device rule's allowance for sub-page gaps was read from (facts/reserve_rule.py's
# SUB_PAGE_GAPS_GIB: Qwen3-4B at 6144 tokens, planner-auto-5/ and reserve-snapshot/): not held out for that rule.
READ_THE_SUB_PAGE_ALLOWANCE = "/4b-sl6144/"


def test_full_device_plans_the_dense_whole_device_within_2_percent_where_its_allowance_decides(monkeypatch):
    """The issue's +-2 % for the whole device, with the full-device rule, the default, on the dense held-out runs with
    expandable segments (the recipes' setting; the rule applies to nothing else): within 2 % wherever the allowance
    beside the steady peak set the reserve, and never under by more than 2 % where first-step's block (an upper bound
    of the gap the loss can leave in step 1) set it. The runs under the plan ran on devices with room."""
    monkeypatch.delenv(RESERVE_RULE_ENV, raising=False)
    rows = [r for r in _heldout_device_rows() if r["expandable_segments"] and "a3b" not in r["recipe"]
            and READ_THE_SUB_PAGE_ALLOWANCE not in r["run"] + "/"]
    by_allowance = [r for r in rows if r["planned_reserve_gib"] == pytest.approx(SUB_PAGE_GAPS_GIB, abs=1e-6)]
    assert len(by_allowance) >= 40 and {r["recipe"] for r in by_allowance} >= {
        "qwen3_0p6b_pretrain_config", "qwen3_1b_proxy_pretrain_config", "qwen3_1p7b_pretrain_config",
        "qwen3_4b_pretrain_config", "qwen3_8b_pretrain_config"}
    for r in by_allowance:
        assert abs(r["device_error"]) <= 0.02, r
    for r in rows:
        assert r["device_error"] >= -0.02, r


def _is_moe(row: dict) -> bool:
    from overrides import apply_overrides
    from mbridge_offload.bench.planner_accuracy import _recipe

    return bool(apply_overrides(_recipe(row["recipe"]), row["overrides"]).model.num_moe_experts)


def test_first_step_plans_no_moe_heldout_run_below_what_it_used(monkeypatch):
    """first-step on the MoE models (one stage, the library's engine), decided on the order of the MoE proxy's
    communicators (reserve-snapshot/order/) and checked here on the held-out MoE runs, none of which set anything in
    it: its whole device is at or above what each used (NVML) and its reserve covers each one's, with and without
    expandable segments (the least: +0.003 GiB, planner-auto-2's 2-layer proxy at 8192 tokens at 0.65, where the
    envelope without expandable segments sets the plan). Where the loss's block beside the steady peak set
    steady-peak's reserve and the GPU keeps Adam moments, it plans less than steady-peak."""
    monkeypatch.setenv(RESERVE_RULE_ENV, FIRST_STEP)
    rows = [r for r in _heldout_device_rows() if _is_moe(r)]
    assert len(rows) >= 20 and sum(r["expandable_segments"] for r in rows) >= 12
    for r in rows:
        assert r["device_error"] >= 0, r
        assert 0 <= _reserve_gib(r) <= r["planned_reserve_gib"], r
    monkeypatch.setenv("MBRIDGE_OFFLOAD_RESERVE_RULE", "steady-peak")
    steady = {r["run"]: r["planned_device_gib"] for r in _heldout_device_rows() if _is_moe(r)}
    lower = [r for r in rows if r["planned_device_gib"] < steady[r["run"]] - 1e-9]
    assert all(r["planned_device_gib"] <= steady[r["run"]] for r in rows)
    assert len(lower) >= 6 and any(r["expandable_segments"] for r in lower)


def test_full_device_plans_the_moe_whole_device_within_2_percent_where_its_allowance_decides(monkeypatch):
    """The full-device rule, the default, on the held-out MoE runs with expandable segments, with the dense runs'
    criterion (the test above): within 2 % where the allowance beside the steady peak set the reserve (-1.3 % to
    +0.6 % on the 11 runs before planner-auto-moe/, +0.0 % to +0.9 % on its 10, on devices sized for first-step's
    plan; the least, alloc-conf/shell-env's 2-layer proxy, kept 1.09 GiB beyond its peak on a device with room and
    trained on one without it in alloc-tight/ with 0.21), and never under by more than 2 %."""
    monkeypatch.delenv(RESERVE_RULE_ENV, raising=False)
    rows = [r for r in _heldout_device_rows() if r["expandable_segments"] and _is_moe(r)]
    by_allowance = [r for r in rows if r["planned_reserve_gib"] == pytest.approx(SUB_PAGE_GAPS_GIB, abs=1e-6)]
    assert len(by_allowance) >= 10
    for r in by_allowance:
        assert abs(r["device_error"]) <= 0.02, r
    for r in rows:
        assert r["device_error"] >= -0.02, r


def test_the_heldout_run_whose_reserve_the_term_is_short_of():
    """The 1.1B proxy at 3 x 4096 tokens at fraction 1: the reserve was its bf16 logits + 0.05 GiB, 0.03 GiB beyond
    the plan's; the whole device is not under-planned. When the term covers it, this fails and the run rejoins the
    check above."""
    (row,) = [r for r in compare_rows(BENCHMARKS / "planner-heldout-4") if r["run"].endswith(RESERVE_SHORT)]
    assert 0 < _reserve_gib(row) - row["planned_reserve_gib"] <= 0.05
    assert row["device_error"] >= 0


def test_the_loss_tensor_term_on_the_heldout_runs_where_it_decides():
    """planner-heldout-4/: at fraction 1 (and 0.9) the dense runs with expandable segments reserved their loss's
    bf16 logits beyond the peak, 2.32-4.63 GiB, which the 1.17 GiB envelope alone would have been 2.5-7.4 % short of
    on the whole device; the plan is within +0.2 % of each. Runs that left no such block (the MoE proxy, Qwen3-4B,
    Megatron's own loss) are over-planned by up to the term: +1.4 %, +7.1 %, +12.1 %."""
    rows = {Path(r["run"]).name: r for r in compare_rows(BENCHMARKS / "planner-heldout-4")}
    kept_the_logits = ["0p6b-sl16384-fraction-1", "0p6b-sl8192-fraction-0.9", "1p7b-sl8192-fraction-1",
                       "1b-proxy-sl4096-mb3-fraction-1"]
    for name in kept_the_logits:
        r = rows[name]
        assert _reserve_gib(r) > 1.9 * memory_plan.EXPANDABLE_ALLOCATOR_RESERVE_BYTES / memory_plan.GIB, r
        assert abs(_reserve_gib(r) - r["planned_reserve_gib"]) <= 0.05, r  # one logits tensor, as planned
        assert -0.001 <= r["device_error"] <= 0.002, r
    for name in set(rows) - set(kept_the_logits):
        assert 0 <= rows[name]["device_error"] <= 0.13, rows[name]


def test_the_run_that_set_the_loss_tensor_term_is_kept_out_of_the_heldout_device_checks():
    """Qwen3-0.6B at 8192 tokens at fraction 1 (planner-heldout-3) reserved 2.32 GiB, beyond the 1.17 GiB envelope
    (set on another run), and set the term with the 1.1B proxy's calibration run: the held-out checks of the whole
    device and the reserve leave it out, and the term is checked on planner-heldout-4 instead (below). Nothing
    here tests the term on the runs it was set on."""
    (row,) = [r for r in compare_rows(BENCHMARKS / "planner-heldout-3") if _set_the_loss_tensor_term(r)]
    assert row["expandable_segments"]
    assert _reserve_gib(row) > memory_plan.EXPANDABLE_ALLOCATOR_RESERVE_BYTES / memory_plan.GIB
    assert row not in _heldout_device_rows()


def test_the_unfused_loss_reserve_is_covered_by_its_fp32_copy(built, monkeypatch):
    """The deterministic runs (the unfused cross entropy, whose largest loss tensor is its fp32 copy of the logits)
    reserved 1.21-1.80 GiB beyond their peaks with expandable segments, more than the 1.17 GiB envelope; the term
    counts the fp32 copy (4 B a token and vocabulary entry), which was set on no run. PyTorch's own figures
    (peak reserved - peak allocated) from the stream mode's parity runs (offload-engine/stream-lazy/), on a roomy
    device, against the steady-peak rule, which counts the block beside the peak. The first-step rule counts it
    beside step 1's memory without the GPU's Adam moments, and plans the baseline's reserve (fraction 0, 1.23 GiB
    kept) at the 1.17 GiB envelope, 0.06 GiB less: a block formed after step 1 is one PyTorch takes back on a full
    device (alloc-tight/0p6b-sl8192-mb2-fraction-0.65), and when this run's formed was not recorded. first-step's
    whole device still covers what the baseline used (NVML). The stream runs are planned here as the library's
    offload (their engine was chosen on the command line, --offload-engine), so only their reserve is compared."""
    from overrides import apply_overrides
    from mbridge_offload.facts.determinism import DETERMINISTIC_ENV, DETERMINISTIC_KEYS
    from mbridge_offload.facts.run_records import recorded_expandable_segments
    from mbridge_offload.planning import plan

    monkeypatch.setenv(RESERVE_RULE_ENV, STEADY_PEAK)
    parity = BENCHMARKS / "offload-engine/stream-lazy/stream-lazy-parity"
    runs = {"baseline": (0.0, []), "stream-0.25": (0.25, []), "stream-1": (1.0, []),
            "resume-stream/fraction-1/uninterrupted": (1.0, ["model.num_layers=2"])}
    # as --deterministic launched them: its keys and the environment its kernels need (a plan is of a launch that
    # starts: without the environment, deterministic mode is refused, deterministic/nccl-algo)
    deterministic = [f"{k}={v}" for k, v in DETERMINISTIC_KEYS.items()]
    deterministic += [f"++env_vars.{k}={v}" for k, v in DETERMINISTIC_ENV.items()]
    for name, (fraction, overrides) in runs.items():
        run = parity / name
        assert recorded_expandable_segments(run) is True
        summary = json.loads((run / "summary.json").read_text())
        measured = summary["peak_reserved_gib"] - summary["peak_allocated_gib"]
        cfg = apply_overrides(built("qwen3_1b_proxy_pretrain_config"), [*deterministic, *overrides])
        planned = plan(cfg, 1, fraction=fraction, expandable=True).allocator_reserve_bytes_gpu / memory_plan.GIB
        assert measured > memory_plan.EXPANDABLE_ALLOCATOR_RESERVE_BYTES / memory_plan.GIB, (name, measured)
        assert measured <= planned, (name, measured, planned)
    # the baseline, where first-step applies (no offload engine): its whole device covers what the run used
    monkeypatch.setenv(RESERVE_RULE_ENV, FIRST_STEP)
    summary = json.loads((parity / "baseline" / "summary.json").read_text())
    cfg = apply_overrides(built("qwen3_1b_proxy_pretrain_config"), deterministic)
    baseline = plan(cfg, 1, fraction=0.0, expandable=True)
    assert baseline.reserve_rule == FIRST_STEP
    assert baseline.total_bytes_gpu / memory_plan.GIB >= summary["peak_device_process_used_gib"]


def test_committed_accuracy_tables_are_current(monkeypatch):
    # the tables' whole device is first-step's plan, which counts what a device with room keeps (the runs' devices);
    # planner-accuracy.md gives the default's, full-device's, beside them
    monkeypatch.setenv(RESERVE_RULE_ENV, FIRST_STEP)
    dirs = [BENCHMARKS / d for d in CALIBRATION]
    heldout = [BENCHMARKS / d for d in HELDOUT]
    committed = (BENCHMARKS / "planner-accuracy.md").read_text()
    assert compare_markdown(dirs) in committed and compare_host_markdown(dirs) in committed
    assert heldout_markdown(heldout) in committed and compare_host_markdown(heldout) in committed


# The held-out runs whose step-end host RSS was more than 5 % above the plan (the fine-grained MoE proxy at 8192 tokens
# without offload, three runs, and Qwen3-0.6B at 16384 tokens at fraction 1) were short by the data loader's pinned
# batches, now planned (planning/data_loader.py, derived from the code, not fitted): every held-out run is within 5 %.


def test_host_between_steps_within_5_percent_on_heldout_runs():
    rows = [r for folder in HELDOUT for r in compare_rows(BENCHMARKS / folder) if r["host_error"] is not None]
    assert len(rows) >= 40
    for r in rows:
        assert abs(r["host_error"]) <= 0.05, r


# The first-step host peak (memory_plan.FIRST_STEP_HOST_BYTES_PER_OFFLOADED_PARAM): the MoE models' transient only.
# The held-out runs alone on the node or beside a ballast process only (their node peak is theirs, the ballast's and
# the system's; the others ran side by side).
ALONE_OR_BESIDE_A_BALLAST = ("/planner-auto-2/", "/planner-auto-3/", "/planner-auto-4/", "/planner-auto-5/",
                             "/planner-auto-moe/", "/planner-auto-7/", "/heap-release/",
                             "/planner-heldout-3/8b-sl2048-overlap-off", "/planner-heldout-2/4b-sl2048")
def _heldout_rows_with_cfg() -> list[tuple[dict, object]]:
    from overrides import apply_overrides
    from mbridge_offload.bench.planner_accuracy import _recipe

    return [(r, apply_overrides(_recipe(r["recipe"]), r["overrides"])) for folder in HELDOUT
            for r in compare_rows(BENCHMARKS / folder) if r["measured_host_high_water_gib"] is not None]


def _data_loader_gib(cfg, bytes_per_element: int) -> float:
    return bytes_per_element * cfg.train.micro_batch_size * cfg.model.seq_length ** 2 / memory_plan.GIB


def test_dense_first_step_peak_within_5_percent_of_the_rss_high_water_on_heldout_runs():
    """On dense models the plan adds no first-step transient, and none shows in the process: its RSS high water is
    its step-end RSS plus micro batch x sequence^2 bytes (the data loader's batch being pinned, to 0.01 GiB) on every
    held-out run, which the plan adds (data_loader_transient_bytes), and the planned peak is within the issue's 5 %
    of that high water on all of them (Qwen3-0.6B at 16384 tokens, -7.6 % before the data loader was planned,
    among them). The dense models' zero transient was decided on most of these runs; the test below holds the ones
    made after it."""
    from mbridge_offload.planning.data_loader import data_loader_transient_bytes

    rows = [(r, cfg) for r, cfg in _heldout_rows_with_cfg() if not cfg.model.num_moe_experts]
    assert len(rows) >= 40
    assert {r["overlap"] for r, _ in rows} >= {True, False}
    assert {r["recipe"] for r, _ in rows} >= {"qwen3_0p6b_pretrain_config", "qwen3_1b_proxy_pretrain_config",
                                              "qwen3_1p7b_pretrain_config", "qwen3_4b_pretrain_config",
                                              "qwen3_8b_pretrain_config"}
    assert any(cfg.model.seq_length == 16384 for _, cfg in rows)
    for r, cfg in rows:
        high_water = r["measured_host_high_water_gib"]
        transient = data_loader_transient_bytes(cfg) / memory_plan.GIB
        assert r["planned_host_peak_gib"] == pytest.approx(r["planned_host_gib"] + transient, abs=1e-6), r
        assert abs(high_water - r["measured_host_rss_gib"] - _data_loader_gib(cfg, 1)) <= 0.01, r
        error = r["planned_host_peak_gib"] / high_water - 1
        assert abs(error) <= 0.05, (r["run"], error)


def test_dense_first_step_peak_blind_on_the_runs_made_after_the_zero_transient_was_decided():
    """planner-auto-5/ (nineteenth session): five dense configurations new to the planner, 14 runs that trained, the
    overlap on, each beside a ballast process. The plan's first-step peak (no transient, the data loader's batch)
    against each process's RSS high water."""
    rows = [r for r in compare_rows(BENCHMARKS / "planner-auto-5") if r["measured_host_high_water_gib"] is not None]
    assert len(rows) == 14
    for r in rows:
        error = r["planned_host_peak_gib"] / r["measured_host_high_water_gib"] - 1
        assert abs(error) <= 0.05, (r["run"], error)


def test_the_first_step_transient_shows_on_the_moe_proxy_and_not_on_dense_runs():
    """The data the split was set on (26 dense runs), and the 14 of planner-auto-5/ made after it: on the held-out runs
    alone or beside a ballast, the node's peak sat 1.8-4.6 GiB above a dense run's RSS high water (the ballast and
    the system, 0.3-4.5B offloaded, the overlap on and off) and 6.5-16.6 GiB above a MoE run's (12 runs), where the
    plan's first-step peak is within 4 GiB below the node's peak (-2.5 % to -8.6 %; the node's peak counts the system
    and the ballast)."""
    rows = [(r, cfg) for r, cfg in _heldout_rows_with_cfg()
            if any(a in r["run"] for a in ALONE_OR_BESIDE_A_BALLAST) and r["fraction"] > 0]
    dense = [r for r, cfg in rows if not cfg.model.num_moe_experts]
    moe = [r for r, cfg in rows if cfg.model.num_moe_experts]
    assert len(dense) >= 26 + 14 and len(moe) >= 12 + 10
    assert {r["overlap"] for r in dense} == {True, False}
    for r in dense:
        assert 1.5 <= r["measured_node_peak_gib"] - r["measured_host_high_water_gib"] <= 5.0, r
    for r in moe:
        assert r["measured_node_peak_gib"] - r["measured_host_high_water_gib"] >= 6.0, r
        assert 0 <= r["measured_node_peak_gib"] - r["planned_host_peak_gib"] <= 4.0, r
        assert r["planned_host_peak_gib"] > r["planned_host_gib"], r
