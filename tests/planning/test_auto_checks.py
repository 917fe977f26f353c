"""auto's checks on the GPU that no constant of the planner was set on, replayed with today's planner: at each
device, the fraction it picks was run there and trained, and the plan at every run's fraction is at or above the
whole device the run used (NVML), or above the device where the run ran out of memory. Each device is a ballast's
remainder of one H100; the overlap on, expandable segments; runs at auto's pick, one 0.05 step below and, where that
trained, two steps below.

- planner-auto-6/ (twenty-fifth session): three dense configurations, none of them the 4B whose gaps set the opt-in
  full-device rule's 0.55 GiB allowance (smallest-trains/), run with that rule.
- planner-auto-7/ (twenty-ninth session): four Qwen3-4B configurations (4096 tokens; 3072 tokens, micro batch 2; 8192
  tokens with full recompute) and planner-auto-6's 1.7B again, run with the full-device rule; the recompute case ran
  out of memory at its pick, and the rule is no longer applied with recompute.
- planner-auto-8/ (thirtieth session): the 4B's widths at 8192 tokens (24 of 36 layers), the 8B's widths (16 of 36
  layers) and Qwen3-1.7B with activation offload, run with the full-device rule, the default since; and
  planner-auto-7/'s recompute case again with the rule used there since, first-step (first-step-recheck/).
- planner-auto-moe/ (twenty-sixth session): four configurations of the MoE proxy (2, 3, 4 and 6 layers, 4096 to 12288
  tokens, micro batch 1 and 2), run with the first-step rule, then the default (reserve-snapshot/order/): its first
  auto checks on devices sized for its plan.
- planner-auto-moe-2/ (thirty-first session, and a later call the same day for the third case): the MoE proxy with 3
  layers at 6144 tokens (micro batch 2), 5 layers at 8192 tokens and 7 layers at 4096 tokens, run with the
  full-device rule, the default: its first checks on MoE."""

from __future__ import annotations

import pytest

from mbridge_offload.facts.reserve_rule import FIRST_STEP, FULL_DEVICE, RESERVE_RULE_ENV
from mbridge_offload.planning import GIB, plan
from mbridge_offload.planning.fraction_search import smallest_fitting_fraction

STEP = 0.05


def _replayed(built, checks, rule: str) -> list[tuple[str, dict, dict, float, object, dict[float, float]]]:
    """(case, check, {fraction: run}, today's pick, its plan, {fraction: planned GiB}) of each auto check, replayed
    on its device; the pick's plan must come from ``rule`` (the reserve rule the test set)."""
    replayed = []
    for c in checks:
        cfg, check, case = c.cfg(built), c.check, c.case_dir.name
        picked, picked_plan = smallest_fitting_fraction(cfg, 1, gpu_memory_gib=check["device_gib"], expandable=True)
        assert picked_plan.reserve_rule == rule, case
        planned = {f: plan(cfg, 1, fraction=f, gpu_memory_gib=check["device_gib"], expandable=True).total_bytes_gpu
                   / GIB for f in c.runs}
        replayed.append((case, check, c.runs, picked, picked_plan, planned))
    return replayed


def _plans_above_every_run(case: str, check: dict, runs: dict, planned: dict[float, float]) -> int:
    """At every fraction that trained the plan is at or above the whole device the run used (NVML); at one that ran
    out of memory it is above the device. The number of runs that ran out."""
    out_of_memory = 0
    for fraction, run in runs.items():
        if run["outcome"] == "trained":
            assert planned[fraction] >= run["device_used_gib"], (case, fraction, planned[fraction])
        else:
            assert run["outcome"] == "out of memory", (case, fraction, run["outcome"])
            assert planned[fraction] > check["device_gib"], (case, fraction, planned[fraction])
            out_of_memory += 1
    return out_of_memory


def test_full_device_picks_a_fraction_that_trained_and_plans_above_every_dense_run(built, auto_checks, monkeypatch):
    """planner-auto-6/: with the full-device rule, the default, each pick trained, and the plan is above the device
    where the 1.1B proxy at 12288 tokens ran out of memory at 0.4."""
    monkeypatch.delenv(RESERVE_RULE_ENV, raising=False)
    replayed = _replayed(built, auto_checks("planner-auto-6"), FULL_DEVICE)
    assert len(replayed) == 3
    out_of_memory = 0
    for case, check, runs, picked, picked_plan, planned in replayed:
        assert runs.get(picked, {}).get("outcome") == "trained", (case, picked)
        out_of_memory += _plans_above_every_run(case, check, runs, planned)
    assert out_of_memory == 1


def test_full_device_without_recompute_picks_the_smallest_fraction_that_trained_on_the_4b_checks(built, auto_checks,
                                                                                                 monkeypatch):
    """planner-auto-7/, the cases without recompute: each pick trained, with the plan and its 0.1 % margin at or above
    the whole device every run that trained used (the 4B at 4096 tokens used 0.03 GiB more than the plan, 0.044 GiB
    less than plan + margin), and above the device where a run ran out of memory; on both 4B configurations 0.05
    below the pick ran out of memory, and on the 1.7B 0.45 trained and 0.4 ran out (the step goal met on all three).
    planner-auto-8/: the same on the 4B's widths at 8192 tokens, the 8B's widths and activation offload, where 0.05
    below the pick ran out of memory on each (the 4B's widths used 69.795 GiB against 69.79 planned, within the
    margin: its gaps, 0.58 GiB, were 0.03 over the allowance). planner-auto-moe-2/: the same on three MoE proxy
    configurations (3 layers at 6144 tokens, micro batch 2; 5 layers at 8192 tokens; 7 layers at 4096 tokens), the
    rule's first checks on MoE, where 0.45 ran out of memory below the pick (0.5) on each."""
    monkeypatch.delenv(RESERVE_RULE_ENV, raising=False)
    checks = [c for c in [*auto_checks("planner-auto-7"), *auto_checks("planner-auto-8"),
                          *auto_checks("planner-auto-moe-2")]
              if c.cfg(built).model.recompute_granularity is None]
    replayed = _replayed(built, checks, FULL_DEVICE)
    assert len(replayed) == 9
    for case, check, runs, picked, picked_plan, planned in replayed:
        assert runs.get(picked, {}).get("outcome") == "trained", (case, picked)
        for fraction, run in runs.items():
            if run["outcome"] == "trained":
                assert planned[fraction] + picked_plan.margin_gib >= run["device_used_gib"], (case, fraction)
            else:
                assert planned[fraction] > check["device_gib"], (case, fraction, planned[fraction])
        smallest = min(f for f, run in runs.items() if run["outcome"] == "trained")
        assert round(picked - smallest, 2) <= STEP, (case, picked, smallest)
        assert any(run["outcome"] == "out of memory" for f, run in runs.items() if f < smallest), case


def test_full_device_with_recompute_plans_first_step_above_both_fractions_that_ran_out(built, auto_checks,
                                                                                       monkeypatch):
    """planner-auto-7/'s 4B at 8192 tokens with full recompute ran out of memory at full-device's pick (0.5) and at
    0.45 on a 61.73 GiB device, with 1.0 GiB of gaps kept at each error. Today the rule falls back to first-step
    there, which picks above both and plans each of them above the device. planner-auto-8/first-step-recheck/ ran
    that check again on the same device: first-step's pick, 0.6, trained, 0.55 trained with 0.70 GiB free (less than
    the 1.18 GiB margin) and 0.5 ran out of memory again, so the pick is one step above the smallest that trains."""
    monkeypatch.delenv(RESERVE_RULE_ENV, raising=False)
    (check,) = [c for c in auto_checks("planner-auto-7") if c.cfg(built).model.recompute_granularity == "full"]
    ((case, _, runs, picked, picked_plan, planned),) = _replayed(built, [check], FIRST_STEP)
    assert {f: run["outcome"] for f, run in runs.items()} == {0.5: "out of memory", 0.45: "out of memory"}
    assert picked > 0.5, picked
    _plans_above_every_run(case, check.check, runs, planned)
    (recheck,) = auto_checks("planner-auto-8/first-step-recheck")
    assert recheck.check["device_gib"] == check.check["device_gib"]
    ((case, _, runs, repicked, repicked_plan, planned),) = _replayed(built, [recheck], FIRST_STEP)
    assert repicked == picked == recheck.check["auto"]["fraction"]
    assert {f: run["outcome"] for f, run in runs.items()} == {0.6: "trained", 0.55: "trained", 0.5: "out of memory"}
    assert runs[0.55]["headroom_gib"] < repicked_plan.margin_gib
    # with recompute the allocator kept more beside the peak than first-step's envelope (test_accuracy's
    # RECOMPUTE_RESERVE_SHORT): the runs that trained are covered with the margin, not without it
    for fraction, run in runs.items():
        if run["outcome"] == "trained":
            assert planned[fraction] + repicked_plan.margin_gib >= run["device_used_gib"], (fraction, planned[fraction])
        else:
            assert planned[fraction] > recheck.check["device_gib"], (fraction, planned[fraction])


def test_first_step_picks_a_fraction_that_trained_and_plans_above_every_moe_run(built, auto_checks, monkeypatch):
    """auto with the first-step rule (a 2 % margin), the default when these ran, picked 0.5 on each device and
    trained there; 0.45 trained on all four with less free than the margin (the issue's bar); 0.4 ran out of memory on
    the 4- and 6-layer proxies (the step goal met) and trained on the 2- and 3-layer ones (not met: two steps
    above)."""
    monkeypatch.setenv(RESERVE_RULE_ENV, FIRST_STEP)
    replayed = _replayed(built, auto_checks("planner-auto-moe"), FIRST_STEP)
    assert len(replayed) == 4
    out_of_memory = 0
    for case, check, runs, picked, picked_plan, planned in replayed:
        assert picked == check["auto"]["fraction"], case  # the planner that made the checks, unchanged since
        assert runs[picked]["outcome"] == "trained", case
        below = runs[round(picked - STEP, 2)]
        assert below["outcome"] != "trained" or below["headroom_gib"] < picked_plan.margin_gib, case
        out_of_memory += _plans_above_every_run(case, check, runs, planned)
    assert out_of_memory == 2


def test_full_device_replayed_on_the_moe_checks_picks_lower_fractions_that_trained(built, auto_checks, monkeypatch):
    """The full-device rule, the default since (0.55 GiB for the sub-page gaps, a 0.1 % margin), on the same devices:
    it picks 0.4, 0.45, 0.45 and 0.45, each a fraction that trained; on the two configurations where a run ran out of
    memory that is the smallest that trains (the step goal), on the other two it is below first-step's two steps above.
    Its plan is at or above every run that trained (the closest: the 2-layer proxy at 0.4, which trained with
    0.11 GiB free)."""
    monkeypatch.delenv(RESERVE_RULE_ENV, raising=False)
    picks = {}
    for case, check, runs, picked, picked_plan, planned in _replayed(built, auto_checks("planner-auto-moe"),
                                                                     FULL_DEVICE):
        assert runs.get(picked, {}).get("outcome") == "trained", (case, picked)
        assert picked < check["auto"]["fraction"], case
        failed = [f for f, r in runs.items() if r["outcome"] != "trained"]
        if failed:
            assert picked == pytest.approx(max(failed) + STEP), case
        _plans_above_every_run(case, check, runs, planned)
        picks[case] = picked
    assert len(picks) == 4


def test_the_default_replayed_on_every_committed_check_never_picks_a_fraction_that_ran_out_of_memory(built,
                                                                                                     auto_checks,
                                                                                                     monkeypatch):
    """Every auto check committed with expandable segments (planner-auto-3/ to -8/, planner-auto-moe/ and -moe-2/, some
    run with rules of their day and on devices sized for them), replayed with today's default: no pick is at or below a
    fraction that ran out of memory on that device, and each pick that was run there trained. Where the pick is below
    every fraction run there (devices sized for a rule that planned more), nothing was run to confirm it: those are
    counted, not claimed. planner-auto-5/'s 4B at 6144 tokens is left out: its runs set the rule's allowance."""
    from mbridge_offload.facts.run_records import recorded_expandable_segments
    from mbridge_offload.planning.fraction_search import smallest_fitting_fraction

    monkeypatch.delenv(RESERVE_RULE_ENV, raising=False)
    checks = [c for pattern in ("planner-auto-[3-8]", "planner-auto-moe", "planner-auto-moe-2",
                                        "planner-auto-8/first-step-recheck")
              for c in auto_checks(pattern)
              if all(recorded_expandable_segments(c.run_folder(run)) is True for run in c.runs.values())
              and c.case_dir.relative_to(c.case_dir.parents[1]).as_posix() != "planner-auto-5/4b-sl6144"]
    confirmed = unconfirmed = 0
    for c in checks:
        picked, _ = smallest_fitting_fraction(c.cfg(built), 1, gpu_memory_gib=c.check["device_gib"], expandable=True)
        assert picked is not None, c.case_dir
        failed = [f for f, run in c.runs.items() if run["outcome"] != "trained"]
        assert not failed or picked > max(failed), (c.case_dir, picked, failed)
        if picked in c.runs:
            assert c.runs[picked]["outcome"] == "trained", (c.case_dir, picked)
            confirmed += 1
        else:
            unconfirmed += picked < min(c.runs)
    print(f"{len(checks)} checks: {confirmed} picks run and trained, {unconfirmed} below every run")
    assert len(checks) == 32 and confirmed >= 21
