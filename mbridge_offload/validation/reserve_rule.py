"""Rules of the planner's reserve rule (env MBRIDGE_OFFLOAD_RESERVE_RULE, facts/reserve_rule.py)."""

from __future__ import annotations

from mbridge_offload.facts.key_ranges import fixed
from mbridge_offload.facts.reserve_rule import (FIRST_STEP, FULL_DEVICE, RESERVE_RULE_ENV, RESERVE_RULE_KEY,
                                                RESERVE_RULES, STEADY_PEAK, reserve_rule)
from mbridge_offload.validation.guard import guarded
from mbridge_offload.validation.rule import OPTIMIZER, Context, Rule


def _rule(ctx: Context) -> str:
    return reserve_rule(ctx.cfg.env_vars, ctx.environ)


RULES: tuple[Rule, ...] = guarded(
    Rule(id="planner/reserve-rule-known", mechanism=OPTIMIZER, key=RESERVE_RULE_KEY,
         text=f"the planner's reserve rule ({RESERVE_RULE_ENV}) is one of {', '.join(RESERVE_RULES)}",
         applies=lambda c: c.env(RESERVE_RULE_ENV) is not None, holds=lambda c: _rule(c) in RESERVE_RULES,
         observed=_rule, fix=fixed(f"++{RESERVE_RULE_KEY}={FULL_DEVICE}  (the default; or {FIRST_STEP} or "
                                   f"{STEADY_PEAK}, which plan more room; a value in the shell wins: unset it "
                                   "there)")),
)
