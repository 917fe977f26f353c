"""A saved run_config.yaml names its model provider and layer spec only by ``_target_``: the classes are read from the
installed source (diagnosis/saved_classes.py) so that the planner tells what they build as it does for a built config."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from mbridge_offload.diagnosis.config_source import load_run_config
from mbridge_offload.diagnosis.saved_classes import linearization
from mbridge_offload.planning import plan

REPO = Path(__file__).resolve().parents[2]
SAVED_CONFIG = REPO / "docs" / "benchmarks" / "resume-parity" / "saved-run_config.yaml"
GPT = "megatron.bridge.models.gpt_provider.GPTModelProvider"

# Providers of several shapes: GPT itself, one that inherits provide() through two bases (MLA), ones that define their
# own (a vision-language model, T5, the Mamba hybrid), and one whose name a package re-exports
PROVIDERS = ("megatron.bridge.models.gpt_provider.GPTModelProvider",
             "megatron.bridge.models.mla_provider.MLAModelProvider",
             "megatron.bridge.models.qwen_vl.qwen25_vl_provider.Qwen25VLModelProvider",
             "megatron.bridge.models.t5_provider.T5ModelProvider",
             "megatron.bridge.models.hybrid.hybrid_provider.HybridModelProvider")


def _real(qualified: str) -> type:
    module, name = qualified.rsplit(".", 1)
    return getattr(importlib.import_module(module), name)


@pytest.mark.parametrize("qualified", PROVIDERS)
def test_the_source_gives_the_classes_method_resolution_order(built, qualified):
    """Read without importing, the same classes in the same order as Python's MRO (less typing's Generic and object,
    which define no provide), and the same ones defining provide()."""
    built("qwen3_1b_proxy_pretrain_config")  # Megatron Bridge imported once for the session
    real = [k for k in _real(qualified).__mro__ if k.__module__ not in ("typing", "builtins")]
    read = linearization(qualified)
    assert [c.qualified for c in read] == [f"{k.__module__}.{k.__qualname__}" for k in real]
    assert [("provide" in c.defines) for c in read] == [("provide" in vars(k)) for k in real]


def test_a_name_a_package_re_exports_is_followed_to_its_definition():
    chain = linearization("megatron.bridge.models.GPTModelProvider")
    assert chain and chain[0].qualified == GPT


def _saved_with(tmp_path, replacements: dict[str, str]):
    text = SAVED_CONFIG.read_text()
    for old, new in replacements.items():
        assert old in text
        text = text.replace(old, new)
    path = tmp_path / "run_config.yaml"
    path.write_text(text)
    return load_run_config(path)


def test_a_saved_gpt_provider_plans(tmp_path):
    saved = load_run_config(SAVED_CONFIG)
    assert plan(saved, 1, fraction=0.5).unplanned_problems == ()


@pytest.mark.parametrize("target, builds", [
    ("megatron.bridge.models.qwen_vl.qwen25_vl_provider.Qwen25VLModelProvider",
     "megatron.bridge.models.qwen_vl.qwen25_vl_provider.Qwen25VLModelProvider.provide"),
    ("megatron.bridge.models.t5_provider.T5ModelProvider", "megatron.bridge.models.t5_provider.T5ModelProvider.provide"),
])
def test_a_saved_provider_that_builds_another_model_is_refused_by_key(tmp_path, target, builds):
    saved = _saved_with(tmp_path, {f"model:\n  _target_: {GPT}\n": f"model:\n  _target_: {target}\n"})
    problems = plan(saved, 1, fraction=0.5).unplanned_problems
    assert [(p.key, p.rule_id, p.value) for p in problems] == [("model", "memory/unmodeled-model", target)]
    assert builds in problems[0].rule


def test_a_saved_provider_whose_source_is_not_here_is_refused_by_its_name(tmp_path):
    saved = _saved_with(tmp_path, {f"model:\n  _target_: {GPT}\n": "model:\n  _target_: my_lab.models.MyProvider\n"})
    problems = plan(saved, 1, fraction=0.5).unplanned_problems
    assert [(p.key, p.value) for p in problems] == [("model", "my_lab.models.MyProvider")]
    assert problems[0].rule.startswith("MyProvider builds no GPT model")


def test_a_saved_layer_spec_is_read_by_its_target(tmp_path):
    saved = _saved_with(tmp_path, {"_target_: megatron.bridge.models.gpt_provider.default_layer_spec":
                                   "_target_: my_lab.specs.my_layer_spec"})
    problems = plan(saved, 1, fraction=0.5).unplanned_problems
    assert [(p.key, p.value, p.rule_id) for p in problems] == [
        ("model.transformer_layer_spec", "my_layer_spec", "memory/unmodeled-layer-spec")]
