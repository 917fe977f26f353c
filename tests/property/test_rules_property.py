"""Property tests of the rule table and the planner on values at the edges: whatever a key the rules read
holds (zero, negative, huge, null, a string, a list), validating and planning never raise; a size out of its
range is a problem naming that key (facts/key_ranges.py), reported with the other rules' problems."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).parent))
from cmdline_strategies import DENSE, HOT_KEYS, SEED  # noqa: E402

from mbridge_offload.facts.config_tree import set_path  # noqa: E402
from mbridge_offload.facts.key_ranges import KEY_RANGES  # noqa: E402

SETTINGS = settings(max_examples=100, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])

EDGE_VALUES = st.one_of(
    st.sampled_from((0, -1, 1, 2, 3, 2**31, 2**63, 10**30, -(10**30), None, True, False, 0.0, -0.5, 1.5,
                     float("nan"), float("inf"), "", "abc", "full", [], ["moe"], ["expert_fc1", "bogus"], {})),
    st.integers(), st.floats(), st.text(max_size=5),
)
RANGE_KEYS = {key_range.key for key_range in KEY_RANGES}


@SETTINGS
@given(changes=st.lists(st.tuples(st.sampled_from(HOT_KEYS[:-1]), EDGE_VALUES), min_size=1, max_size=3),
       recipe=st.sampled_from((SEED, DENSE)), num_gpus=st.sampled_from((1, 2, 16, 0, -4, 3)))
def test_rules_and_planner_never_raise(built, changes, recipe, num_gpus):
    from mbridge_offload.planning import plan_problems, plan_with_recommendation
    from mbridge_offload.validation import Context, check_rules

    cfg = copy.deepcopy(built(recipe))
    for key, value in changes:
        set_path(cfg, key, value)
    problems = check_rules(Context(cfg, num_gpus, environ={}))  # raises nothing
    for p in problems:
        assert p.key and p.rule and p.fix is not None and isinstance(p.value, str)
        assert "could not read the config" not in p.fix, f"a rule raised on {changes}: {p.format()}"
    plan = plan_with_recommendation(cfg, num_gpus)
    plan_problems(plan, None)
    # a range broken by a change is reported under that key
    final = dict(changes)
    reported = {p.key for p in problems}
    for key_range in KEY_RANGES:
        if key_range.key in final and not key_range.holds(cfg):
            assert key_range.key in reported, (key_range.id, final)
        if key_range.key in final and not key_range.holds(cfg) and key_range.key in RANGE_KEYS:
            assert plan.unplanned, "the planner must not plan a config whose sizes are out of range"


@SETTINGS
@given(key=st.sampled_from(sorted({r.key for r in KEY_RANGES})),
       value=st.sampled_from((0, -1, None, 10**30, float("nan"), "x")))
def test_a_size_out_of_range_is_refused_by_key(built, key, value):
    from mbridge_offload.validation import Context, check_rules

    cfg = copy.deepcopy(built(SEED))
    set_path(cfg, key, value)
    broken = [r for r in KEY_RANGES if r.key == key and not r.holds(cfg)]
    problems = check_rules(Context(cfg, 16, environ={}))
    for key_range in broken:
        assert any(p.rule_id == key_range.id and p.key == key for p in problems), (key, value)


def test_a_rule_that_raises_is_a_problem_naming_the_rule(built):
    """The guard of validation/guard.py: an exception inside a rule is reported, never raised."""
    from mbridge_offload.validation import Context
    from mbridge_offload.validation.guard import guard
    from mbridge_offload.validation.rule import Rule

    def boom(ctx):
        raise ZeroDivisionError("division by zero")

    rule = guard(Rule(id="test/boom", mechanism="parallelism", key="train.global_batch_size", text="t",
                      applies=boom, holds=boom, fix=boom, observed=boom))
    ctx = Context(copy.deepcopy(built(DENSE)), 1, environ={})
    assert rule.applies(ctx) and not rule.holds(ctx)
    assert "test/boom" in rule.fix(ctx) and "ZeroDivisionError" in rule.fix(ctx)
    assert rule.value(ctx).startswith("(unreadable: ZeroDivisionError")
