"""Rules of the planner's reserve rule (env MBRIDGE_OFFLOAD_RESERVE_RULE, facts/reserve_rule.py)."""

from __future__ import annotations

from mbridge_offload.facts.key_ranges import fixed
from mbridge_offload.facts.reserve_rule import (FIRST_STEP, FULL_DEVICE, RESERVE_RULE_ENV, RESERVE_RULE_KEY,
                                                RESERVE_RULES, STEADY_PEAK, SUB_PAGE_GAPS_GIB, reserve_rule)
from mbridge_offload.validation.guard import guarded
from mbridge_offload.validation.rule import OPTIMIZER, Context, Rule


def _rule(ctx: Context) -> str:
    return reserve_rule(ctx.cfg.env_vars, ctx.environ)


RULES: tuple[Rule, ...] = guarded(
    Rule(id="planner/reserve-rule-known", mechanism=OPTIMIZER, key=RESERVE_RULE_KEY,
         text=f"the planner's reserve rule ({RESERVE_RULE_ENV}) is one of {', '.join(RESERVE_RULES)}",
         applies=lambda c: c.env(RESERVE_RULE_ENV) is not None, holds=lambda c: _rule(c) in RESERVE_RULES,
         observed=_rule, fix=fixed(f"++{RESERVE_RULE_KEY}={FIRST_STEP}  (the default; or {STEADY_PEAK}, which "
                                   f"plans more, or {FULL_DEVICE}, which plans less, opt-in; a value in the shell "
                                   "wins: unset it there)")),
    Rule(id="planner/reserve-rule-full-device", mechanism=OPTIMIZER, key=RESERVE_RULE_KEY,
         text=f"the {FULL_DEVICE} reserve rule plans less GPU memory than the default rule: its "
              f"{SUB_PAGE_GAPS_GIB:g} GiB allowance for the sub-page gaps a full device keeps was read from one "
              "configuration; GPU runs of auto trained at its pick on five other dense configurations on one GPU "
              "without recompute, and with full recompute it ran out of memory, so it is not applied there "
              "(docs/benchmarks/planner-auto-6/, planner-auto-7/); no model over 4B and no activation offload has been "
              "checked: check a fraction it picks with scripts/check_auto.py before a long run",
         applies=lambda c: _rule(c) == FULL_DEVICE, holds=lambda c: False, observed=_rule,
         fix=fixed(f"++{RESERVE_RULE_KEY}={FIRST_STEP}  (the default, which auto was checked with; a value in the "
                   "shell wins: unset it there)"), severity="warning"),
)
