"""Keys of a fixed set of words (validation/choices.py): the words written there are the installed libraries' own,
read back here from their code, a wrong word is refused with a did-you-mean whose override resolves it, and a
dry run reports every such word at once before any launch."""

from __future__ import annotations

import ast
import inspect
import subprocess
import sys
import typing
from pathlib import Path

import pytest

from mbridge_offload.facts.config_tree import set_path
from mbridge_offload.validation import Context, check_rules
from mbridge_offload.validation.choices import CHOICES_TABLE, EMERGING_OPTIMIZERS

ROOT = Path(__file__).resolve().parents[2]
BY_KEY = {choice.key: choice for choice in CHOICES_TABLE}
DENSE = "qwen3_1b_proxy_pretrain_config"


def _literal_words(annotation) -> set:
    """The words of a Literal annotation (inside Optional too)."""
    if typing.get_origin(annotation) is typing.Literal:
        return set(typing.get_args(annotation))
    return set().union(*(_literal_words(arg) for arg in typing.get_args(annotation)))


def _compared_words(function, name: str) -> set[str]:
    """Every string the installed ``function`` compares ``name`` (a variable or an attribute) with: == / in."""
    words: set[str] = set()
    for node in ast.walk(ast.parse(_dedented(function))):
        if not isinstance(node, ast.Compare):
            continue
        left = node.left
        named = (isinstance(left, ast.Name) and left.id == name) or (isinstance(left, ast.Attribute) and left.attr == name)
        if not named:
            continue
        for comparator in node.comparators:
            items = comparator.elts if isinstance(comparator, (ast.List, ast.Tuple)) else [comparator]
            words |= {item.value for item in items if isinstance(item, ast.Constant) and isinstance(item.value, str)}
    return words


def _dedented(function) -> str:
    import textwrap

    return textwrap.dedent(inspect.getsource(function))


def test_optimizer_names_are_megatron_cores():
    from megatron.core.optimizer import (_get_megatron_optimizer_based_on_param_groups, get_megatron_optimizer)
    from megatron.core.optimizer.emerging_optimizers import _EMERGING_OPTIMIZERS

    assert set(EMERGING_OPTIMIZERS) == set(_EMERGING_OPTIMIZERS)
    # adam and sgd take the standard path; every other name goes to the emerging optimizers
    assert _compared_words(get_megatron_optimizer, "optimizer") == {"adam", "sgd"}
    assert {"adam", "sgd"} <= _compared_words(_get_megatron_optimizer_based_on_param_groups, "optimizer")
    assert set(BY_KEY["optimizer.optimizer"].words) == {"adam", "sgd", *_EMERGING_OPTIMIZERS}


def test_normalization_and_fp8_words_are_transformer_configs():
    """Megatron Core types them as Literals; Megatron Bridge's provider retypes them as plain str."""
    from megatron.bridge.training.mixed_precision import MixedPrecisionConfig
    from megatron.core.fp8_utils import get_fp8_recipe
    from megatron.core.transformer.transformer_config import TransformerConfig

    hints = typing.get_type_hints(TransformerConfig)
    assert set(BY_KEY["model.normalization"].words) == _literal_words(hints["normalization"])
    assert set(BY_KEY["model.fp8"].words) == _literal_words(hints["fp8"]) == _compared_words(get_fp8_recipe, "fp8")
    assert BY_KEY["model.fp8"].null_allowed and BY_KEY["mixed_precision.fp8"].words == BY_KEY["model.fp8"].words
    assert typing.get_type_hints(MixedPrecisionConfig)["fp8"] == typing.Optional[str]  # unchecked upstream


def test_load_balancing_words_are_the_routers():
    from megatron.core.transformer.moe.router import TopKRouter
    from megatron.core.transformer.transformer_config import TransformerConfig

    routed = _compared_words(TopKRouter, "routing_type")
    aux_losses = {"aux_loss", "seq_aux_loss", "global_aux_loss"}
    assert aux_losses <= {node.value for node in ast.walk(ast.parse(_dedented(TopKRouter.is_aux_loss_enabled)))
                          if isinstance(node, ast.Constant) and isinstance(node.value, str)}
    with_capacity = _compared_words(TransformerConfig.__post_init__, "load_balancing_type")
    assert set(BY_KEY["model.moe_router_load_balancing_type"].words) == routed | aux_losses | with_capacity


def test_fsdp_sharding_words_are_megatron_fsdps():
    import importlib

    # the package's fully_shard is the function of the same name: the module by its path
    fully_shard = importlib.import_module("megatron.core.distributed.fsdp.src.megatron_fsdp.fully_shard")
    param_and_grad_buffer = importlib.import_module("megatron.core.distributed.fsdp.src.megatron_fsdp.param_and_grad_buffer")

    buffers = param_and_grad_buffer.ParamAndGradBuffer._init_each_parameter_group_buffers
    assert set(BY_KEY["ddp.data_parallel_sharding_strategy"].words) == _compared_words(
        buffers, "data_parallel_sharding_strategy")
    assert set(BY_KEY["ddp.outer_dp_sharding_strategy"].words) == _compared_words(
        fully_shard.fully_shard_model, "outer_dp_sharding_strategy")


def test_checkpoint_and_logger_words_are_megatrons():
    from megatron.bridge.training.utils.train_utils import report_runtime
    from megatron.core.dist_checkpointing.strategies.torch import get_async_strategy

    assert set(BY_KEY["checkpoint.async_strategy"].words) == _compared_words(get_async_strategy, "async_strategy")
    assert set(BY_KEY["logger.runtime_time_unit"].words) == _compared_words(report_runtime, "time_unit")


def test_every_key_is_a_plain_str_field_of_the_recipes_config(built):
    """The keys exist where the recipes put them, and upstream does not type them as a choice (else the override
    layer would refuse a wrong word already)."""
    cfg = built(DENSE)
    for choice in CHOICES_TABLE:
        section, name = choice.key.split(".")
        owner = getattr(cfg, section)
        if section == "mixed_precision":  # a preset name in the recipes; a MixedPrecisionConfig when given whole
            from megatron.bridge.training.mixed_precision import MixedPrecisionConfig as owner_type
        else:
            owner_type = type(owner)
        annotation = typing.get_type_hints(owner_type)[name]
        assert not _literal_words(annotation), (choice.key, annotation)


@pytest.mark.parametrize("key,typed,near", [
    ("model.normalization", "rmsnorm", "RMSNorm"), ("model.normalization", "LayerNrom", "LayerNorm"),
    ("optimizer.optimizer", "adamw", "adam"), ("optimizer.optimizer", "moun", "muon"),
    ("model.fp8", "hybird", "hybrid"), ("ddp.data_parallel_sharding_strategy", "optim_grad", "optim_grads"),
])
def test_a_close_word_is_suggested_and_its_fix_resolves_the_problem(recipe, key, typed, near):
    from overrides import apply_overrides

    cfg = recipe(DENSE)
    set_path(cfg, key, typed)
    (problem,) = [p for p in check_rules(Context(cfg, 1, environ={})) if p.key == key and p.rule_id.startswith("choices/")]
    assert problem.value == typed and problem.fix.startswith(f"{key}={near}  (did you mean {near}?")
    assert "allowed: " in problem.fix and BY_KEY[key].words[0] in problem.fix
    fixed = apply_overrides(cfg, [problem.fix.split()[0]])
    assert problem.rule_id not in {p.rule_id for p in check_rules(Context(fixed, 1, environ={}))}


def test_a_far_word_gets_the_default_and_fp8_gets_null(recipe):
    from overrides import apply_overrides

    cfg = recipe(DENSE)
    set_path(cfg, "model.fp8", "bf16")  # bf16 training without FP8: fp8 off
    set_path(cfg, "optimizer.optimizer", "foo")
    problems = {p.key: p for p in check_rules(Context(cfg, 1, environ={})) if p.rule_id.startswith("choices/")}
    assert problems["model.fp8"].fix.startswith("model.fp8=null  (allowed: e4m3, hybrid or null")
    assert problems["optimizer.optimizer"].fix.startswith("optimizer.optimizer=adam  (allowed: adam, sgd, muon")
    fixed = apply_overrides(cfg, [problems["model.fp8"].fix.split()[0], problems["optimizer.optimizer"].fix.split()[0]])
    assert not [p for p in check_rules(Context(fixed, 1, environ={})) if p.rule_id.startswith("choices/")]


def test_a_list_of_load_balancing_types_is_checked_word_by_word(recipe):
    cfg = recipe("qwen3_30b_a3b_pretrain_config")
    set_path(cfg, "model.moe_router_load_balancing_type", ["aux_loss", "seq_aux_loss"])
    assert not [p for p in check_rules(Context(cfg, 16, environ={})) if p.rule_id == "choices/moe-load-balancing"]
    set_path(cfg, "model.moe_router_load_balancing_type", ["aux_loss", "seq_aux_los"])
    (problem,) = [p for p in check_rules(Context(cfg, 16, environ={})) if p.rule_id == "choices/moe-load-balancing"]
    assert problem.fix.startswith("model.moe_router_load_balancing_type=[aux_loss,seq_aux_loss]  (did you mean "
                                  "seq_aux_los -> seq_aux_loss?")


def test_a_deprecated_dist_spelling_passes_and_dist_adam_does_not(recipe):
    """_get_megatron_emerging_optimizer strips dist_ from an emerging optimizer's name; dist_adam names none."""
    cfg = recipe(DENSE)
    for name, ok in (("dist_muon", True), ("dist_adam", False), ("Adam", False), ("", False)):
        set_path(cfg, "optimizer.optimizer", name)
        found = [p for p in check_rules(Context(cfg, 1, environ={})) if p.rule_id == "choices/optimizer"]
        assert (not found) is ok, name


@pytest.mark.parametrize("name,rule_ids", [
    ("foo", ["choices/optimizer"]),  # no word Megatron Core knows: one problem, the fixed word's, with its fix
    ("adamw", ["choices/optimizer"]),
    ("muon", ["optimizer-offload/optimizer-kind"]),  # a known optimizer offload has no CPU twin for
    ("dist_muon", ["optimizer-offload/optimizer-kind"]),
    ("sgd", []),
])
def test_an_optimizer_under_offload_is_refused_once(recipe, name, rule_ids):
    cfg = recipe("qwen3_1b_proxy_optimizer_offload_config")
    set_path(cfg, "optimizer.optimizer", name)
    found = [p for p in check_rules(Context(cfg, 1, environ={})) if p.key == "optimizer.optimizer"]
    assert [p.rule_id for p in found] == rule_ids
    if rule_ids == ["choices/optimizer"]:
        assert found[0].value == name and found[0].fix.startswith("optimizer.optimizer=adam  (")
    if rule_ids == ["optimizer-offload/optimizer-kind"]:
        assert found[0].fix == "optimizer.optimizer=adam" and "'adam' and 'sgd'" in found[0].rule


@pytest.mark.parametrize("settings,key,word,other_rule", [
    # use_precision_aware_optimizer needs adam: a word Megatron Core does not know is the fixed-word rule's alone
    ({"optimizer.use_precision_aware_optimizer": True}, "optimizer.optimizer", "foo", "optimizer/precision-aware-adam"),
    # a preset replaces model.fp8 (bf16_mixed: with null); a misspelt format is one problem still
    ({}, "model.fp8", "hybird", "precision/preset-replaces-fp8"),
    ({"mixed_precision": "bf16_with_fp8_current_scaling_mixed"}, "model.fp8", "hybird", "precision/preset-replaces-fp8"),
    # a capacity factor needs an aux-loss balancing (or none): a misspelt aux_loss is one problem
    ({"model.num_moe_experts": 8, "model.moe_expert_capacity_factor": 1.0}, "model.moe_router_load_balancing_type",
     "aux_los", "moe/capacity-factor-balancing"),
    ({"model.fused_residual_rmsnorm": True}, "model.normalization", "rmsnorm", "model/fused-residual-rmsnorm"),
    ({"model.transformer_impl": "inference_optimized"}, "model.normalization", "rmsnorm",
     "model/inference-optimized"),
    # the stream engine updates with the GPU's Adam: a word Megatron Core does not know is the fixed-word rule's alone
    ({"optimizer.optimizer_cpu_offload": True, "optimizer.optimizer_offload_fraction": 1.0,
      "env_vars.MBRIDGE_OFFLOAD_ENGINE": "stream"}, "optimizer.optimizer", "foo", "offload-engine/stream-adam"),
])
def test_an_unknown_word_another_rule_reads_is_one_problem(recipe, settings, key, word, other_rule):
    cfg = recipe(DENSE)
    for k, v in settings.items():
        set_path(cfg, k, v)
    set_path(cfg, key, word)
    found = [p.rule_id for p in check_rules(Context(cfg, 1, environ={}))]
    assert other_rule not in found and found.count(next(c.id for c in CHOICES_TABLE if c.key == key)) == 1, found


def test_an_unknown_optimizer_upstream_trips_on_is_one_problem_with_upstream_validation_too(recipe):
    """Megatron Core's OptimizerConfig raises 'only supported with adam' for optimizer=foo with the precision-aware
    optimizer; validate() runs it after the rule table: the unknown word is still the one problem."""
    from mbridge_offload.validation import validate

    cfg = recipe(DENSE)
    set_path(cfg, "optimizer.use_precision_aware_optimizer", True)
    set_path(cfg, "optimizer.optimizer", "foo")
    assert [p.rule_id for p in validate(cfg, 1, environ={}).errors] == ["choices/optimizer"]
    set_path(cfg, "optimizer.optimizer", "sgd")  # a word Megatron Core knows: upstream's check is the rule's
    assert [p.rule_id for p in validate(cfg, 1, environ={}).errors] == ["optimizer/precision-aware-adam"]


@pytest.mark.parametrize("settings,other_rule", [
    ({"optimizer.use_precision_aware_optimizer": True, "optimizer.optimizer": "sgd"}, "optimizer/precision-aware-adam"),
    ({"model.fp8": "hybrid"}, "precision/preset-replaces-fp8"),
    ({"model.num_moe_experts": 8, "model.moe_expert_capacity_factor": 1.0,
      "model.moe_router_load_balancing_type": "sinkhorn"}, "moe/capacity-factor-balancing"),
    ({"model.fused_residual_rmsnorm": True, "model.normalization": "LayerNorm"}, "model/fused-residual-rmsnorm"),
    ({"model.transformer_impl": "inference_optimized", "model.normalization": "LayerNorm"},
     "model/inference-optimized"),
])
def test_a_known_word_those_rules_refuse_is_still_refused(recipe, settings, other_rule):
    cfg = recipe(DENSE)
    for k, v in settings.items():
        set_path(cfg, k, v)
    found = [p.rule_id for p in check_rules(Context(cfg, 1, environ={}))]
    assert other_rule in found and not [r for r in found if r.startswith("choices/")], found


def test_dry_run_refuses_every_wrong_word_at_once_and_exits_2():
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "run_recipe.py"), "--recipe", DENSE, "--dry-run",
         "optimizer.optimizer=foo", "model.normalization=Foo"],
        capture_output=True, text=True, timeout=300, cwd=ROOT)
    out = done.stdout + done.stderr
    assert done.returncode == 2, out
    assert "Validation for 1 GPU: FAILED" in out, out
    assert "[choices/optimizer] optimizer.optimizer = foo" in out
    assert "[choices/normalization] model.normalization = Foo" in out
    assert "fix:  model.normalization=RMSNorm  (allowed: LayerNorm, RMSNorm)" in out
    assert "fix:  optimizer.optimizer=adam  (allowed: adam, sgd, " in out
    assert "Traceback" not in out


@pytest.mark.parametrize("raised,rule_id", [
    ("ValueError: E4M3 and HYBRID are the only supported FP8 formats.", "choices/fp8-format"),
    ("ValueError: Unsupported emerging optimizer: foo", "choices/optimizer"),
    ("Exception: Only LayerNorm and RMSNorm are currently supported", "choices/normalization"),
    ("ValueError: Invalid data_parallel_sharding_strategy: optim_grad", "choices/fsdp-sharding"),
    ("TypeError: async_strategy nvrxx is not supported. Available strategies: nvrx, mcore.",
     "choices/async-checkpoint-strategy"),
    ('ValueError: Invalid time_unit: hour. Must be one of "seconds", "minutes", "hours", or "days".',
     "choices/runtime-time-unit"),
])
def test_diagnose_names_the_rule_from_the_error_a_run_raised(tmp_path, raised, rule_id):
    """A run launched without the validator fails on the word after launch: diagnose reads the same rule off its log."""
    from mbridge_offload.diagnosis.engine import diagnose

    log = tmp_path / "run.log"
    log.write_text(f"[rank0]: Traceback (most recent call last):\n[rank0]:   File \"x.py\", line 1, in f\n"
                   f"[rank0]: {raised}\n")
    (diagnosis,) = diagnose([log], build_config=False)
    assert rule_id in {finding.rule_id for finding in diagnosis.findings}
