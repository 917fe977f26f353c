"""Configs composed from Megatron Bridge's own recipes of other model families (built offline: the Nemotron-H and
Nemotron 3 hybrids, OLMoE; those that read a Hugging Face config cannot be built here). What the planner does not
count (Mamba layers, multi-latent attention, dense layers among MoE layers, multi-token prediction, a vocabulary
left to the tokenizer) is refused by key, value, rule and fix, never planned as another model or crashed on."""

from __future__ import annotations

import copy
import functools

import pytest

from recipes.offload import with_optimizer_offload
from mbridge_offload.planning import plan_problems, plan_with_recommendation, smallest_fitting_fraction


@functools.lru_cache(maxsize=None)
def _bridge_built(name: str):
    import megatron.bridge.recipes as bridge_recipes

    return getattr(bridge_recipes, name)()


def bridge_recipe(name: str, **model_fields):
    """A fresh copy of Megatron Bridge's recipe ``name`` with 50% optimizer offload, ``model_fields`` set."""
    cfg = copy.deepcopy(_bridge_built(name))
    for key, value in model_fields.items():
        setattr(cfg.model, key, value)
    return with_optimizer_offload(cfg, fraction=0.5)


def _refused(cfg, num_gpus: int, rule_id: str, key: str):
    p = plan_with_recommendation(cfg, num_gpus, fraction=0.5, gpu_memory_gib=139.8)
    assert p.unplanned and p.params_per_rank == 0 and p.total_bytes_gpu == 0, p.params_per_rank
    found = [q for q in plan_problems(p, None) if q.rule_id == rule_id]
    assert found, [q.rule_id for q in plan_problems(p, None)]
    assert found[0].key == key and found[0].value and found[0].rule and found[0].fix and found[0].severity == "error"
    fraction, fitting = smallest_fitting_fraction(cfg, num_gpus, gpu_memory_gib=139.8)  # auto chooses nothing
    assert fitting.unplanned
    return found[0]


@pytest.mark.parametrize("name,num_gpus", [
    ("nemotronh_4b_pretrain_config", 1),  # Nemotron-H 4B: model.vocab_size None (TypeError in the count before)
    ("nemotron_3_nano_4b_pretrain_config", 1),  # vocab 131072: planned as a 5.7B transformer before
    ("nemotron_3_nano_pretrain_config", 8),  # hybrid MoE with MTP, EP8
])
def test_a_hybrid_mamba_model_is_refused_not_planned_as_a_transformer(name, num_gpus):
    problem = _refused(bridge_recipe(name), num_gpus, "memory/unmodeled-mamba", "model.hybrid_layer_pattern")
    assert "M" in problem.value  # the pattern with its Mamba layers


def test_a_vocabulary_left_to_a_tokenizer_the_config_does_not_size_is_refused_by_its_key():
    """model.vocab_size None with a Hugging Face tokenizer: the vocabulary is known when the tokenizer loads."""
    cfg = bridge_recipe("olmoe_7b_pretrain_config", vocab_size=None)
    cfg.tokenizer.tokenizer_type, cfg.tokenizer.tokenizer_model = "HuggingFaceTokenizer", "allenai/OLMoE-1B-7B-0924"
    problem = _refused(cfg, 8, "memory/vocab-size-known", "model.vocab_size")
    assert problem.value == "None" and problem.fix.startswith("model.vocab_size=")


def test_a_vocabulary_left_to_the_null_tokenizer_is_planned_with_its_size():
    """model.vocab_size None with the NullTokenizer (Bridge's Nemotron-H recipes): its tokenizer.vocab_size, padded."""
    p = plan_with_recommendation(bridge_recipe("olmoe_7b_pretrain_config", vocab_size=None), 8, fraction=0.5,
                                 gpu_memory_gib=139.8)
    assert not p.unplanned and p.params_per_rank > 0


@pytest.mark.parametrize("fields,rule_id,key", [
    # DeepSeek-V3 style: the first layer dense, the rest MoE
    ({"moe_layer_freq": [0] + [1] * 15}, "memory/unmodeled-moe-layer-freq", "model.moe_layer_freq"),
    ({"moe_layer_freq": 2}, "memory/unmodeled-moe-layer-freq", "model.moe_layer_freq"),
    ({"mtp_num_layers": 1}, "memory/unmodeled-mtp", "model.mtp_num_layers"),
    ({"multi_latent_attention": True}, "memory/unmodeled-mla", "model.multi_latent_attention"),
])
def test_olmoe_with_a_feature_the_planner_does_not_count_is_refused(fields, rule_id, key):
    _refused(bridge_recipe("olmoe_7b_pretrain_config", **fields), 8, rule_id, key)


@pytest.mark.parametrize("backend", ["local", "unfused"])
def test_attention_that_keeps_its_scores_is_refused_with_the_backend_that_does_not(backend):
    """The planner counts no sequence x sequence scores: refused, and its fix is a config the planner plans."""
    from megatron.core.transformer.enums import AttnBackend

    from overrides import apply_overrides

    cfg = bridge_recipe("olmoe_7b_pretrain_config", attention_backend=AttnBackend[backend])
    problem = _refused(cfg, 8, "memory/unmodeled-attention-backend", "model.attention_backend")
    assert problem.value == backend
    fixed = apply_overrides(cfg, [problem.fix.split()[0]])
    assert not plan_with_recommendation(fixed, 8, fraction=0.5, gpu_memory_gib=139.8).unplanned


def test_olmoe_as_its_recipe_makes_it_is_planned():
    """The refusals are of the features only: Bridge's OLMoE (every layer MoE, GQA-less attention) is planned."""
    p = plan_with_recommendation(bridge_recipe("olmoe_7b_pretrain_config"), 8, fraction=0.5, gpu_memory_gib=139.8)
    assert not p.unplanned and p.params_per_rank > 0


def test_a_model_without_an_mlp_width_is_planned_with_megatron_cores():
    """Bridge's Gemma3 1B with model.ffn_hidden_size None (4 x hidden at finalize): the activations' count raised
    TypeError as well as the parameters'."""
    p = plan_with_recommendation(bridge_recipe("gemma3_1b_pretrain_config", ffn_hidden_size=None), 1, fraction=0.5,
                                 gpu_memory_gib=139.8)
    assert not p.unplanned and p.activation_bytes_gpu > 0


def test_a_layer_spec_the_planner_does_not_count_is_refused_by_its_key():
    """Gemma2's layer spec (post norms and an attention that may keep its scores) on OLMoE: not the modules the count
    has, so refused by model.transformer_layer_spec, never planned as OLMoE's."""
    from megatron.bridge.models.gemma.gemma2_provider import gemma2_layer_spec

    problem = _refused(bridge_recipe("olmoe_7b_pretrain_config", transformer_layer_spec=gemma2_layer_spec), 8,
                       "memory/unmodeled-layer-spec", "model.transformer_layer_spec")
    assert problem.value == "gemma2_layer_spec"


@pytest.mark.parametrize("fields,key", [
    ({"tensor_model_parallel_size": 2, "sequence_parallel": True}, "model.tensor_model_parallel_size"),
    ({"num_query_groups": 8}, "model.num_query_groups"),
])
def test_olmoe_with_a_query_or_key_narrower_than_its_norms_is_refused(fields, key):
    """OLMoE's q and k norms are num_attention_heads x kv_channels wide (OLMoESelfAttention): a TP shard of the heads
    or fewer key/value groups fail the first forward on the norm's shape."""
    problem = _refused(bridge_recipe("olmoe_7b_pretrain_config", **fields), 8, "memory/olmoe-qk-norm-width", key)
    assert problem.fix.split("=")[0] == key


def test_gemma3_is_planned_with_its_post_norms_activations():
    """Gemma3's norms after the projection and fc2 keep their inputs: more activations than the same model with
    the GPT layer spec."""
    from megatron.bridge.models.gpt_provider import default_layer_spec

    gemma = plan_with_recommendation(bridge_recipe("gemma3_1b_pretrain_config"), 1, fraction=0.5, gpu_memory_gib=139.8)
    gpt = plan_with_recommendation(bridge_recipe("gemma3_1b_pretrain_config", transformer_layer_spec=default_layer_spec),
                                   1, fraction=0.5, gpu_memory_gib=139.8)
    assert not gemma.unplanned and gemma.activation_bytes_gpu > gpt.activation_bytes_gpu


def _as_provider(cfg, provider_class):
    """``cfg`` with its model built by Megatron Bridge's ``provider_class`` from the sizes both classes have."""
    import dataclasses

    cfg = copy.deepcopy(cfg)
    takes = {f.name for f in dataclasses.fields(provider_class) if f.init}
    cfg.model = provider_class(**{f.name: getattr(cfg.model, f.name) for f in dataclasses.fields(cfg.model)
                                  if f.init and f.name in takes})
    return cfg


def _real_and_cached(cfg):
    """The config, and the look-alike of it a cached command plans (fast_check/snapshot.py)."""
    from mbridge_offload.fast_check import snapshot

    return [("real", cfg), ("cached", snapshot.load(snapshot.dump(cfg)))]


@pytest.mark.parametrize("module,name,language_model", [
    ("megatron.bridge.models.qwen_vl.qwen25_vl_provider", "Qwen25VLModelProvider", True),
    ("megatron.bridge.models.gemma_vl.gemma3_vl_provider", "Gemma3VLModelProvider", True),
    ("megatron.bridge.models.t5_provider", "T5ModelProvider", False),
    ("megatron.bridge.diffusion.models.wan.wan_provider", "WanModelProvider", False),
])
def test_a_provider_that_builds_another_model_than_gpt_is_refused_by_its_class(built, module, name, language_model):
    """A vision-language provider (a GPT provider whose provide() builds an encoder around the language model), T5
    and Wan: refused by key ``model`` naming the class, from the real config and from the cache's look-alike, whose
    class keeps the names of its bases and where provide() is defined."""
    import importlib

    cfg = _as_provider(built("qwen3_0p6b_optimizer_offload_config"), getattr(importlib.import_module(module), name))
    for where, config in _real_and_cached(cfg):
        p = plan_with_recommendation(config, 1, fraction=0.5, gpu_memory_gib=139.8)
        assert p.unplanned and p.params_per_rank == 0, where
        (problem,) = plan_problems(p, None)
        assert (problem.rule_id, problem.key, problem.value) == ("memory/unmodeled-model", "model", f"{module}.{name}")
        assert ("plan the language model alone" in problem.fix) == language_model, problem.fix
        assert "optimizer.optimizer_offload_fraction=" in problem.fix


@pytest.mark.parametrize("module,name", [
    ("megatron.bridge.models.gpt_provider", "GPTModelProvider"),
    ("megatron.bridge.models.gemma.gemma3_provider", "Gemma3ModelProvider"),  # its own provide(), GPTModel's tensors
])
def test_a_gpt_provider_is_planned_from_the_real_config_and_from_the_cache(built, module, name):
    import importlib

    cfg = _as_provider(built("qwen3_0p6b_optimizer_offload_config"), getattr(importlib.import_module(module), name))
    (_, real), (_, cached) = _real_and_cached(cfg)
    planned = [plan_with_recommendation(c, 1, fraction=0.5, gpu_memory_gib=139.8) for c in (real, cached)]
    assert not planned[0].unplanned and planned[0].params_per_rank > 0
    assert planned[1].params_per_rank == planned[0].params_per_rank
    assert planned[1].total_bytes_gpu == planned[0].total_bytes_gpu


def test_a_cached_hybrid_model_is_refused_as_the_real_one_is():
    """The look-alike of a Mamba hybrid keeps HybridModelProvider among its bases' names."""
    cfg = bridge_recipe("nemotronh_4b_pretrain_config")
    for where, config in _real_and_cached(cfg):
        problem = _refused(config, 1, "memory/unmodeled-mamba", "model.hybrid_layer_pattern")
        assert "M" in problem.value, where
