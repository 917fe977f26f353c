"""The planner's parameter count (tensors.named_tensors) against Megatron Core's own: the GPTModel a config's
provider builds, on the meta device (no memory, no GPU: Megatron Core's local layer spec, whose tensors have the
sizes of the Transformer Engine spec's, with the modules a model's own spec adds: OLMoE's attention, Gemma3's
norms after the projection and fc2). Biases (add_bias_linear, add_qkv_bias), LayerNorm's bias, the shared
expert's gate, OLMoE's q and k norms over all heads, Gemma3's post norms, gpt-oss's attention sinks and a learned
position embedding were missing from the count."""

from __future__ import annotations

import copy
import functools
import os
import socket

import pytest

from overrides import apply_overrides
from mbridge_offload.planning.tensors import GEMMA3_LAYER_SPEC, OLMOE_LAYER_SPEC, layer_spec_name, named_tensors


@pytest.fixture(scope="module")
def one_rank():
    """A one-rank gloo group and Megatron's parallel state (TP = PP = EP = 1), torn down after the module."""
    import torch.distributed as dist
    from megatron.core import parallel_state

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    parallel_state.initialize_model_parallel(1, 1)
    yield
    parallel_state.destroy_model_parallel()
    dist.destroy_process_group()


def _local_row_parallel_with_post_norm():
    """Megatron Bridge's TERowParallelLinearLayerNorm (Gemma's linear_proj and linear_fc2: the row-parallel linear,
    then a norm of its output width) on Megatron Core's local linear and norm, which need no Transformer Engine."""
    import inspect

    from megatron.bridge.models.common.te_layers import TERowParallelLinearLayerNorm
    from megatron.core.models.gpt.gpt_layer_specs import LNImpl
    from megatron.core.tensor_parallel import RowParallelLinear

    assert "self.post_layernorm = TENorm(config, output_size)" in inspect.getsource(TERowParallelLinearLayerNorm)

    class RowParallelLinearPostNorm(RowParallelLinear):
        def __init__(self, input_size, output_size, *, config, **kwargs):
            super().__init__(input_size, output_size, config=config, **kwargs)
            self.post_layernorm = LNImpl(config=config, hidden_size=output_size, eps=config.layernorm_epsilon)

    return RowParallelLinearPostNorm


def local_layer_spec(m):
    """The local layer spec with the modules of ``m``'s own spec that hold other tensors than the GPT spec's."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    spec = get_gpt_layer_local_spec(num_experts=m.num_moe_experts, moe_grouped_gemm=False,
                                    qk_layernorm=m.qk_layernorm, normalization=m.normalization)
    if layer_spec_name(m) == OLMOE_LAYER_SPEC:
        from megatron.bridge.models.olmoe.olmoe_provider import OLMoESelfAttention

        spec.submodules.self_attention.module = OLMoESelfAttention
    if layer_spec_name(m) == GEMMA3_LAYER_SPEC:
        post_norm = _local_row_parallel_with_post_norm()
        spec.submodules.self_attention.submodules.linear_proj = post_norm
        mlp = spec.submodules.mlp  # a ModuleSpec, or a partial of the MLP given its submodules
        (mlp.keywords["submodules"] if isinstance(mlp, functools.partial) else mlp.submodules).linear_fc2 = post_norm
    return spec


def megatron_count(cfg) -> int:
    """Parameters of the GPTModel Megatron Core builds from ``cfg.model`` on one rank, on the meta device."""
    import torch
    from unittest import mock

    m = copy.deepcopy(cfg.model)
    m.perform_initialization, m.use_cpu_initialization, m.gradient_accumulation_fusion = False, True, False
    m.persist_layer_norm = False  # a Transformer Engine or Apex kernel: the local spec's torch LayerNorm has none
    m.layernorm_zero_centered_gamma = False  # the same weight read as 1 + w (Gemma): the torch norm has no such mode
    m.moe_grouped_gemm, m.moe_token_dispatcher_type = False, "allgather"  # the others allocate on a GPU
    m.transformer_layer_spec = local_layer_spec(m)
    m.finalize()
    # the learnable softmax offset is made on torch.cuda.current_device() (dot_product_attention.py), which a
    # machine without a GPU has not: it is made on the meta device like every other tensor here
    with torch.device("meta"), mock.patch.object(torch.cuda, "current_device", lambda: "meta"):
        model = m.provide(pre_process=True, post_process=True)
    return sum(p.numel() for p in model.parameters())


@functools.lru_cache(maxsize=None)
def _bridge_built(name: str):
    import megatron.bridge.recipes as bridge_recipes

    return getattr(bridge_recipes, name)()


def one_gpu(cfg):
    """``cfg`` on one GPU (the model fields as they are, the parallel sizes 1): one rank holds every tensor."""
    return apply_overrides(cfg, ["model.tensor_model_parallel_size=1", "model.pipeline_model_parallel_size=1",
                                 "model.expert_model_parallel_size=1", "model.expert_tensor_parallel_size=1",
                                 "model.context_parallel_size=1", "model.sequence_parallel=False"])


@pytest.mark.parametrize("overrides", [
    [],
    ["model.add_qkv_bias=True"],  # Qwen2's QKV bias
    ["model.add_bias_linear=True"],  # every linear layer's bias, experts' included (GPT-3, gpt-oss)
    ["model.normalization=LayerNorm"],  # LayerNorm's bias beside each weight, the QK norms' too
    ["model.moe_shared_expert_intermediate_size=1024", "model.moe_shared_expert_gate=True"],  # Qwen2-MoE's shared
])
def test_olmoe_counts_as_megatron_core_builds_it(one_rank, overrides):
    """Megatron Bridge's OLMoE recipe (64 experts, QK norm, untied output layer), with each feature set."""
    cfg = one_gpu(apply_overrides(copy.deepcopy(_bridge_built("olmoe_7b_pretrain_config")), overrides))
    assert sum(t.numel for t in named_tensors(cfg, 0)) == megatron_count(cfg)


def test_widths_left_to_megatron_core_count_as_it_sets_them(one_rank):
    """OLMoE composed in Python with no MLP widths (its provider types them int, so overrides cannot null them):
    TransformerConfig sets ffn_hidden_size to 4 x hidden and the experts' to it; the plan raised TypeError."""
    cfg = one_gpu(copy.deepcopy(_bridge_built("olmoe_7b_pretrain_config")))
    cfg.model.ffn_hidden_size = cfg.model.moe_ffn_hidden_size = None
    assert sum(t.numel for t in named_tensors(cfg, 0)) == megatron_count(cfg)


@pytest.mark.parametrize("overrides", [
    [],
    ["model.add_qkv_bias=True"],
    ["model.add_bias_linear=True", "model.normalization=LayerNorm", "model.gated_linear_unit=False"],  # GPT-2 like
    ["model.ffn_hidden_size=null"],  # 4 x hidden, as TransformerConfig sets it (the plan raised TypeError)
])
def test_a_dense_model_with_tied_embeddings_counts_as_megatron_core_builds_it(one_rank, recipe, overrides):
    """The plugin's Qwen3 0.6B (Megatron Bridge's Qwen3 provider: GQA, QK norm, tied embeddings)."""
    cfg = one_gpu(apply_overrides(recipe("qwen3_0p6b_pretrain_config"), overrides))
    assert sum(t.numel for t in named_tensors(cfg, 0)) == megatron_count(cfg)


def test_a_bias_of_a_row_parallel_layer_is_whole_on_every_tp_rank(recipe):
    """TP2: QKV's and fc1's biases are split like their rows, proj's and fc2's are whole on each rank."""
    one = one_gpu(apply_overrides(recipe("qwen3_0p6b_pretrain_config"), ["model.add_bias_linear=True"]))
    two = apply_overrides(one, ["model.tensor_model_parallel_size=2"])
    biases = {t.name: t.numel for t in named_tensors(one, 0) if t.name.endswith(".bias")}
    split = {t.name: t.numel for t in named_tensors(two, 0) if t.name.endswith(".bias")}
    for name, numel in biases.items():
        whole = name.split(".")[1] in ("proj", "fc2")
        assert split[name] == (numel if whole else numel // 2), name


def _vocabulary_as_bridge_sets_it(cfg):
    """``cfg`` with the model's vocabulary as Megatron Bridge's setup sets it from the tokenizer it builds."""
    from megatron.bridge.training.setup import _validate_and_set_vocab_size
    from megatron.bridge.training.tokenizers.tokenizer import build_tokenizer

    cfg = copy.deepcopy(cfg)
    cfg.model.vocab_size, cfg.model.should_pad_vocab = _validate_and_set_vocab_size(
        cfg.model.vocab_size, build_tokenizer(cfg.tokenizer).vocab_size, cfg.tokenizer.use_tokenizer_vocab_size)
    return cfg


@pytest.mark.parametrize("vocab_size,tokenizer_vocab", [(50304, 50000), (None, 50000), (None, 50304)])
def test_the_null_tokenizers_vocabulary_replaces_the_models_as_bridge_sets_it(one_rank, vocab_size, tokenizer_vocab):
    """Bridge's pretraining recipes set tokenizer.use_tokenizer_vocab_size: the NullTokenizer's vocabulary, padded
    to 128 x TP, is the model's at setup whatever model.vocab_size says (Bridge's Gemma3 1B: 262144 in the model,
    32000 trained). The planner counted model.vocab_size (and crashed on None)."""
    cfg = one_gpu(copy.deepcopy(_bridge_built("olmoe_7b_pretrain_config")))
    cfg.model.vocab_size, cfg.tokenizer.vocab_size = vocab_size, tokenizer_vocab
    assert sum(t.numel for t in named_tensors(cfg, 0)) == megatron_count(_vocabulary_as_bridge_sets_it(cfg))


def test_gemma3_trains_the_null_tokenizers_vocabulary_not_the_models():
    """Bridge's gemma3_1b recipe: model.vocab_size 262144, NullTokenizer 32000 with use_tokenizer_vocab_size."""
    cfg = _bridge_built("gemma3_1b_pretrain_config")
    built = _vocabulary_as_bridge_sets_it(cfg)
    from megatron.training.vocab_utils import calculate_padded_vocab_size

    rows = calculate_padded_vocab_size(built.model.vocab_size, built.model.make_vocab_size_divisible_by, 1, False)
    assert rows != cfg.model.vocab_size
    (embedding,) = [t for t in named_tensors(cfg, 0) if t.name == "embedding"]
    assert embedding.numel == rows * cfg.model.hidden_size


def test_olmoes_q_and_k_norms_span_all_heads():
    """OLMoE's attention (olmoe_provider.OLMoESelfAttention) normalizes q and k over all 16 heads x 128 channels at
    once: 2 x 2048 norm weights per layer, where Megatron Core's QK norm has 2 x 128. The count had 2 x 128."""
    cfg = one_gpu(copy.deepcopy(_bridge_built("olmoe_7b_pretrain_config")))
    m = cfg.model
    norms = {t.name: t.numel for t in named_tensors(cfg, 0) if t.name.startswith("l0.") and t.name[3:5] in ("q_", "k_")}
    assert norms == {"l0.q_ln": m.num_attention_heads * m.kv_channels, "l0.k_ln": m.num_attention_heads * m.kv_channels}


@pytest.mark.parametrize("overrides", [["model.softmax_type=learnable"], ["model.softmax_type=learnable",
                                                                          "model.tensor_model_parallel_size=2"]])
def test_attention_sinks_are_one_parameter_per_head_of_the_rank(one_rank, overrides):
    """gpt-oss's learnable softmax offsets (its attention sinks): a parameter of heads / TP per layer, which the count
    had not. On one rank, the count is Megatron Core's; on TP2 each rank holds half of them."""
    one = one_gpu(copy.deepcopy(_bridge_built("olmoe_7b_pretrain_config")))
    cfg = apply_overrides(one, overrides)
    sinks = [t.numel for t in named_tensors(cfg, 0) if t.name.endswith("softmax_offset")]
    heads = cfg.model.num_attention_heads // cfg.model.tensor_model_parallel_size
    assert sinks == [heads] * cfg.model.num_layers
    if cfg.model.tensor_model_parallel_size == 1:
        assert sum(t.numel for t in named_tensors(cfg, 0)) == megatron_count(cfg)


def test_a_learned_position_embedding_is_counted(one_rank, recipe):
    """position_embedding_type learned_absolute (GPT-3's): GPTModel builds a seq_length x hidden table beside the
    word embedding, whole on every TP rank."""
    cfg = one_gpu(apply_overrides(recipe("qwen3_0p6b_pretrain_config"),
                                  ["model.position_embedding_type=learned_absolute"]))
    assert sum(t.numel for t in named_tensors(cfg, 0)) == megatron_count(cfg)
    tp2 = apply_overrides(cfg, ["model.tensor_model_parallel_size=2"])
    (position,) = [t for t in named_tensors(tp2, 0) if t.name == "embedding.position"]
    assert position.numel == cfg.model.seq_length * cfg.model.hidden_size


def test_gemma3_counts_its_norms_after_the_projection_and_fc2(one_rank):
    """Bridge's Gemma3 layer spec (TERowParallelLinearLayerNorm for linear_proj and linear_fc2): a hidden-wide norm
    after each, two per layer the count had not."""
    cfg = _vocabulary_as_bridge_sets_it(one_gpu(copy.deepcopy(_bridge_built("gemma3_1b_pretrain_config"))))
    assert sum(t.numel for t in named_tensors(cfg, 0)) == megatron_count(cfg)
