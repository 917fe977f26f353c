"""Validation before any launch: every rule of the rule table, then upstream ``validate()``.

All problems are reported at once, each with the dotted key, its current value, the rule and a fix
to paste. Upstream ``ConfigContainer.validate()`` stops at its first error and mutates what it
checks: its checks are rules of the table (``upstream_rules.py``), so they all show at once; then it runs
on a copy (``upstream.py``), and its error is translated into the same form (and dropped when it repeats a
problem the rule table already reported).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Iterable, Iterator, Mapping

from mbridge_offload.validation.problem import Problem, Report
from mbridge_offload.validation.registry import RULES, RULES_BY_ID
from mbridge_offload.validation.rule import Context
from mbridge_offload.validation.upstream import translate_upstream, upstream_failure


def breaches(rules: Iterable[Any], ctx: Context, **fields: Any) -> Iterator[Problem]:
    """A problem for each of ``rules`` that applies to ``ctx`` and does not hold, in order; ``fields`` replace the
    rule's own (the planner's source and severity)."""
    for rule in rules:
        if rule.applies(ctx) and not rule.holds(ctx):
            problem = Problem(key=rule.key, value=rule.value(ctx), rule=rule.text, fix=rule.fix(ctx),
                              severity=rule.severity, rule_id=rule.id)
            yield dataclasses.replace(problem, **fields) if fields else problem


def check_rules(ctx: Context) -> list[Problem]:
    return list(breaches(RULES, ctx))


def _explained_by_an_unknown_word(rule_id: str, problems: list[Problem], ctx: Context) -> bool:
    """Upstream failed at a check whose rule holds here while a fixed-word rule (choices.py) refused a word: the
    table's rule judges only words Megatron knows (optimizer.optimizer=foo with use_precision_aware_optimizer makes
    Megatron Core's OptimizerConfig raise 'only supported with adam'), so the word's problem is the one. Upstream
    stops at its first failure: once the word is fixed, a rerun shows any other."""
    rule = RULES_BY_ID.get(rule_id)
    return (rule is not None and any(p.rule_id.startswith("choices/") and p.severity == "error" for p in problems)
            and not (rule.applies(ctx) and not rule.holds(ctx)))


def validate(cfg: Any, num_gpus: int, environ: Mapping[str, str] | None = None,
             upstream: bool = True, given_keys: Iterable[str] = frozenset()) -> Report:
    """Every problem of ``cfg`` for a run on ``num_gpus`` GPUs (nothing is modified). ``given_keys``: the keys the
    command line gave (``overrides.grammar.given_keys``; none for a config composed in Python)."""
    ctx = Context(cfg=cfg, num_gpus=num_gpus, environ=dict(os.environ if environ is None else environ),
                  given_keys=frozenset(given_keys))
    problems = check_rules(ctx)
    if upstream:
        failure = upstream_failure(cfg, num_gpus, ctx.environ)
        if failure is not None:
            translated = translate_upstream(failure, cfg, ctx)
            already = {p.rule_id for p in problems}
            if not translated.rule_id or (translated.rule_id not in already
                                          and not _explained_by_an_unknown_word(translated.rule_id, problems, ctx)):
                problems.append(translated)
    return Report(num_gpus=num_gpus, problems=tuple(problems))
