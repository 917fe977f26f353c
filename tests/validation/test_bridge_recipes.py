"""The validator on configs composed from Megatron Bridge's own recipes of other model families (those that build
offline). Upstream's validation must not crash the validator nor report the validating machine as the config's
problem: every problem names its key."""

from __future__ import annotations

import copy
import functools

from recipes.offload import with_optimizer_offload
from mbridge_offload.validation import validate


@functools.lru_cache(maxsize=None)
def _bridge_built(name: str):
    import megatron.bridge.recipes as bridge_recipes

    return getattr(bridge_recipes, name)()


def bridge_recipe(name: str):
    return with_optimizer_offload(copy.deepcopy(_bridge_built(name)), fraction=0.5)


def test_a_gpu_architecture_check_is_not_the_configs_problem_on_a_machine_without_a_gpu():
    """Nemotron 3 Nano's recipe uses the flex token dispatcher, whose backend Bridge checks against
    torch.cuda.get_device_properties(0): on a machine without a GPU that raised 'Found no NVIDIA driver', reported
    as an error with no key and no rule."""
    problems = validate(bridge_recipe("nemotron_3_nano_pretrain_config"), 8, environ={}).problems
    assert not [p for p in problems if "NVIDIA driver" in p.rule], problems
    assert all(p.key and p.rule_id for p in problems), problems


def test_sizes_of_zero_are_their_range_rules_problems_not_a_crash():
    """Bridge's vanilla GPT recipe leaves num_layers, hidden_size and num_attention_heads at 0: upstream's
    validation divides by zero (ZeroDivisionError escaped validate()); the range rules name each key and fix."""
    problems = validate(bridge_recipe("vanilla_gpt_pretrain_config"), 1, environ={}).problems
    by_key = {p.key: p for p in problems}
    for key in ("model.num_layers", "model.hidden_size", "model.num_attention_heads"):
        assert by_key[key].value == "0" and by_key[key].fix.startswith(key + "="), problems
    assert all(p.key and p.rule_id for p in problems), problems


def test_a_size_given_as_text_is_its_range_rules_problem_not_an_anonymous_upstream_one():
    """model.num_layers='16' composed in Python: upstream's TransformerConfig raised TypeError (can't multiply
    sequence by non-int), reported with no key and no rule beside the range rule that names it."""
    cfg = bridge_recipe("olmoe_7b_pretrain_config")
    cfg.model.num_layers = "16"
    problems = validate(cfg, 8, environ={}).problems
    assert [p.rule_id for p in problems if p.key == "model.num_layers"] == ["parallel/num-layers-range"]
    assert all(p.key and p.rule_id for p in problems), problems
