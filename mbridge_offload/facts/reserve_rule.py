"""Which memory the planner counts the loss's block against (the caching allocator's gap beside the peak that is at
most the loss's largest tensor, docs/benchmarks/reserve-snapshot/), and what it counts beside the steady peak.

One environment variable selects it, like the offload engine, so that ``plan_offload.py``, ``run_recipe.py -of auto``
and ``check_auto.py`` (whose runs inherit the shell) plan with the same rule; the shell wins over ``env_vars``.
"""

from __future__ import annotations

from typing import Mapping

from mbridge_offload.facts.environment import run_env

RESERVE_RULE_ENV = "MBRIDGE_OFFLOAD_RESERVE_RULE"
RESERVE_RULE_KEY = f"env_vars.{RESERVE_RULE_ENV}"
STEADY_PEAK = "steady-peak"
FIRST_STEP = "first-step"
# first-step's block, and beside the steady peak only the free gaps smaller than a 20 MiB page, which a full device
# cannot give back (docs/benchmarks/smallest-trains/). The default since the thirtieth session, where it applies (one
# GPU, expandable segments, no activation recompute: planning/memory_plan.py); elsewhere first-step. Its GPU checks of
# auto: a pick that trained on each of eight dense and three MoE proxy configurations on devices sized to its plan
# (planner-auto-6/ to planner-auto-8/, planner-auto-moe-2/), nine at the smallest fraction that trains and two one
# step above it; replayed on every committed auto check but the one whose runs set its allowance, no pick at or below
# a fraction that ran out of memory (tests/planning/test_auto_checks.py).
FULL_DEVICE = "full-device"
# full-device's allowance for those gaps beside the steady peak, in GiB (why this figure: planning/memory_plan.py's
# SUB_PAGE_GAPS_BYTES)
SUB_PAGE_GAPS_GIB = 0.55
DEFAULT_RESERVE_RULE = FULL_DEVICE
RESERVE_RULES = (FIRST_STEP, STEADY_PEAK, FULL_DEVICE)
# What steady-peak counts, in the words of the plan's note where it is used. first-step counts the loss's block
# beside step 1's memory before the GPU part's Adam moments exist (docs/benchmarks/reserve-snapshot/): in the
# two runs recorded (the dense 1.1B proxy and the 3-layer MoE proxy) every communicator is made before step 2's loss
# grows the segment, while PyTorch holds step 1's peak reserved (reserve-snapshot/order/; planning/memory_plan.py's
# first_step_rule_applies gives the order). Its GPU evidence: auto trained at its pick on 5 of 5 new dense
# configurations (planner-auto-5/, where the envelope, not the block, set each plan's reserve), a run trained on a
# device without room for its step-2 block (alloc-tight/), and no MoE run of planner-accuracy.md used more than its
# first-step plan.
STEADY_PEAK_COUNTS = ("the loss's block beside the steady state's peak, as if a block the allocator keeps after "
                      "step 1 were lost to the run; where the GPU part keeps Adam moments that is more than the "
                      "first-step rule counts (docs/benchmarks/planner-auto-4/)")
# What full-device counts, in the words of the plan's note
FULL_DEVICE_COUNTS = ("the loss's block beside step 1's memory as first-step does, and beside the steady peak only "
                      "an allowance for the free gaps smaller than a 20 MiB page that PyTorch cannot give back on a "
                      "full device (at most 0.58 GiB measured on a full device without recompute: "
                      "docs/benchmarks/planner-auto-8/; each configuration's gaps are not predicted); auto trained at "
                      "its pick on eight dense and three MoE proxy configurations it was not set on, up to the 8B's "
                      "widths and with activation offload, at most one 0.05 step above the smallest fraction that "
                      "trains (docs/benchmarks/planner-auto-8/, planner-auto-moe-2/)")


def reserve_rule(env_vars: Mapping[str, object] | None, environ: Mapping[str, str]) -> str:
    """The rule asked for: the shell's MBRIDGE_OFFLOAD_RESERVE_RULE, else the config's, else the default. Unknown
    values come back as given (the validator names them; a plan uses the default for them)."""
    value = run_env(RESERVE_RULE_ENV, env_vars, environ)
    return DEFAULT_RESERVE_RULE if value is None else value.strip()
