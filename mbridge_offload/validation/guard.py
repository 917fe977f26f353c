"""The last net under the rule table: a rule that still raises on some value reports a problem naming
the rule and its key instead of letting a traceback out of the validator.

Every rule module passes its rules through ``guarded``. The rules themselves check their inputs (the key
ranges of facts/key_ranges.py refuse zero, negative, null and huge sizes, and a rule whose inputs are out
of range does not apply), so this net is for what no one foresaw: its words say so.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from mbridge_offload.facts.key_ranges import show_typed
from mbridge_offload.validation.rule import Context, Rule


def _reason(error: Exception) -> str:
    return f"{type(error).__name__}: {error}"[:200]


def _failures(ctx: Any) -> dict[str, str]:
    """Where a context keeps what its rules failed to read (the same context is asked applies, holds,
    value and fix in turn)."""
    if ctx is None or not hasattr(ctx, "__dict__"):
        return {}
    return ctx.__dict__.setdefault("_rule_failures", {})


def guard(rule: Rule) -> Rule:
    """``rule`` with every callable answering instead of raising: applies and holds raising make the rule
    fail (reported), the value and the fix say that the rule could not read the config."""
    applies, holds, fix, observed = rule.applies, rule.holds, rule.fix, rule.observed

    def safe_applies(ctx: Context) -> bool:
        try:
            return bool(applies(ctx))
        except Exception as error:  # noqa: BLE001 - reported as a problem of this rule
            _failures(ctx)[rule.id] = _reason(error)
            return True

    def safe_holds(ctx: Context) -> bool:
        if rule.id in _failures(ctx):
            return False
        try:
            return bool(holds(ctx))
        except Exception as error:  # noqa: BLE001
            _failures(ctx)[rule.id] = _reason(error)
            return False

    def safe_fix(ctx: Context) -> str:
        try:
            text = fix(ctx)
        except Exception as error:  # noqa: BLE001
            text = f"check {rule.key} (rule {rule.id} could not compute a fix: {_reason(error)})"
        failed = _failures(ctx).get(rule.id)
        if failed:
            return f"check {rule.key}: rule {rule.id} could not read the config ({failed}); {text}"
        return text

    def safe_observed(ctx: Context) -> str:
        try:
            return observed(ctx) if observed is not None else show_typed(ctx.get(rule.key))
        except Exception as error:  # noqa: BLE001
            return f"(unreadable: {_reason(error)})"

    return dataclasses.replace(rule, applies=safe_applies, holds=safe_holds, fix=safe_fix, observed=safe_observed)


def guarded(*rules: Rule) -> tuple[Rule, ...]:
    return tuple(guard(rule) for rule in rules)


def sane(check: Callable[[Context], bool]) -> Callable[[Any], bool]:
    """An ``applies`` that is false, not raising, while the grid sizes it reads are out of range (their
    range rules report that)."""
    from mbridge_offload.facts.key_ranges import grid_sane

    def applies(ctx: Context) -> bool:
        return ctx is not None and gpus_ok(ctx) and grid_sane(ctx.cfg) and check(ctx)

    return applies


def gpus_ok(ctx: Context) -> bool:
    return isinstance(ctx.num_gpus, int) and not isinstance(ctx.num_gpus, bool) and ctx.num_gpus >= 1
