"""The opt-in full-device reserve rule against auto checks it was not read from: planner-auto-6/ (twenty-fifth
session, one H100, each device a ballast's remainder): three dense configurations, none of them the 4B whose gaps
set the rule's 0.55 GiB allowance (smallest-trains/). For each, today's planner with the rule picks a fraction that
trained there; at every fraction that trained the plan is at or above the whole device the run used (NVML), and at
the one that ran out of memory it is above the device."""

from __future__ import annotations

import json
from pathlib import Path

from overrides import apply_overrides
from mbridge_offload.facts.reserve_rule import FULL_DEVICE, RESERVE_RULE_ENV
from mbridge_offload.planning import GIB, plan
from mbridge_offload.planning.fraction_search import smallest_fitting_fraction

CHECKS = Path(__file__).resolve().parents[2] / "docs" / "benchmarks" / "planner-auto-6"


def _checks() -> list[tuple[str, dict]]:
    return [(path.parent.name, check) for path in sorted(CHECKS.glob("*/auto_check.json"))
            for check in json.loads(path.read_text())]


def test_full_device_picks_a_fraction_that_trained_and_plans_above_every_run(built, monkeypatch):
    monkeypatch.setenv(RESERVE_RULE_ENV, FULL_DEVICE)
    checks = _checks()
    assert len(checks) == 3
    out_of_memory = 0
    for case, check in checks:
        cfg = apply_overrides(built(check["recipe"]), check["overrides"])
        runs = {check[k]["fraction"]: check[k] for k in ("at_auto", "below", "two_below") if check.get(k)}
        picked, picked_plan = smallest_fitting_fraction(cfg, 1, gpu_memory_gib=check["device_gib"], expandable=True)
        assert picked_plan.reserve_rule == FULL_DEVICE, case
        assert runs.get(picked, {}).get("outcome") == "trained", (case, picked)
        for fraction, run in runs.items():
            planned = plan(cfg, 1, fraction=fraction, gpu_memory_gib=check["device_gib"],
                           expandable=True).total_bytes_gpu / GIB
            if run["outcome"] == "trained":
                assert planned >= run["device_used_gib"], (case, fraction, planned)
            else:
                assert run["outcome"] == "out of memory", (case, fraction, run["outcome"])
                assert planned > check["device_gib"], (case, fraction, planned)
                out_of_memory += 1
    assert out_of_memory == 1
