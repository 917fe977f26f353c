"""The rule table: every rule of every concern, in the order the validator reports them, and the
README's table generated from it (``run_recipe.py --rules``)."""

from __future__ import annotations

from mbridge_offload.facts.key_ranges import KEY_RANGES
from mbridge_offload.validation import (activation_offload, checkpoint, choices, determinism, environment,
                                        fine_grained, hyperparameters, offload_engine, optimizer_offload, parallelism,
                                        reserve_rule)
from mbridge_offload.validation import runtime_failures
from mbridge_offload.validation import upstream_rules
from mbridge_offload.validation import upstream_model_rules
from mbridge_offload.validation.rule import MECHANISMS, Rule

RULES: tuple[Rule, ...] = (*optimizer_offload.RULES, *offload_engine.RULES, *reserve_rule.RULES, *activation_offload.RULES, *fine_grained.RULES,
                           *parallelism.RULES, *environment.RULES, *determinism.RULES, *checkpoint.RULES,
                           *choices.RULES, *hyperparameters.RULES)
RULES += runtime_failures.RULES  # diagnose-only: read from a run's log, never apply to a config
RULES += upstream_rules.RULES  # Megatron Bridge's own validate() checks, translated (all at once, before it runs)
RULES += upstream_model_rules.RULES  # what validate() reaches outside its module: the model's, optimizer's, DDP's checks

RULES_BY_ID = {rule.id: rule for rule in RULES}
assert len(RULES_BY_ID) == len(RULES), "rule ids must be unique"
assert {key_range.id for key_range in KEY_RANGES} <= set(RULES_BY_ID), "every key range must be a rule of the table"


def rules_markdown() -> str:
    """The README's table of offload modes and constraints, generated from RULES."""
    lines = ["| mechanism | key | rule | fix | severity |", "|---|---|---|---|---|"]
    for mechanism in (*MECHANISMS, *upstream_rules.MECHANISMS):
        for rule in RULES:
            if rule.mechanism != mechanism:
                continue
            fix = rule.fix_text or rule.fix(None)  # type: ignore[arg-type]  # constant fixes ignore ctx
            lines.append(f"| {mechanism} | `{rule.key}` | {rule.text} | `{fix}` | {rule.severity} |")
    return "\n".join(lines)
