"""The parameter tensors one rank holds, stage by stage, in the orders Megatron Core walks them.

Parameters are enumerated tensor by tensor for one rank of each pipeline stage (the first stage holds
the embedding, the last the output layer and final norm), split by TP, EP and ETP, in the model's
``named_parameters()`` order (GPTModel with Transformer Engine's layer spec). Megatron Core 0.19.2 builds a
``HybridDeviceOptimizer`` twice per optimizer (megatron/core/optimizer/__init__.py:532 on the bf16 model
parameters, then distrib_optimizer.py:779 on the fp32 main shards), and both walk the parameter groups of
``_get_param_groups`` (2-D weights first, then the 1-D ones without weight decay): the first in
``named_parameters()`` order (the embedding first), the second in the gradient buffer's order, its reverse
(the output layer first, the embedding last). The greedy offload split (memory_plan.py) depends on both.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class Tensor:
    name: str
    numel: int
    kind: str  # "dense" (2-D, not embedding), "expert", "small" (1-D), "embedding"


def layers_per_stage(m, pp: int) -> list[int]:
    """Transformer layers on each of the ``pp`` pipeline stages of model config ``m`` (uneven first and
    last stages where the config sets them, or where the embedding and loss count as layers of the split)."""
    first = getattr(m, "num_layers_in_first_pipeline_stage", None)
    last = getattr(m, "num_layers_in_last_pipeline_stage", None)
    if pp == 1:
        return [m.num_layers]
    embedding = bool(getattr(m, "account_for_embedding_in_pipeline_split", False))
    loss = bool(getattr(m, "account_for_loss_in_pipeline_split", False))
    if (embedding or loss) and not (first or last):
        # Megatron Core's get_num_layers_to_build: the embedding and the loss each count as a layer of the split,
        # and the first and last stages build one layer fewer for them
        stages = [(m.num_layers + embedding + loss) // pp] * pp
        stages[0] -= embedding
        stages[-1] -= loss
        return stages
    if first or last:
        middle_layers = m.num_layers - (first or 0) - (last or 0)
        middle_stages = pp - bool(first) - bool(last)
        each = middle_layers // max(middle_stages, 1)
        stages = [each] * pp
        if first:
            stages[0] = first
        if last:
            stages[-1] = last
        return stages
    return [m.num_layers // pp] * pp


def moe_layer_pattern(m) -> list[bool] | None:
    """Which layers of the model (all stages, first to last) are MoE layers, as Megatron Core's block spec places
    them (gpt_layer_specs.get_gpt_decoder_layer_specs): none without experts; with moe_layer_freq N, every N-th from
    the first (layer i where i % N == 0); with a list, those equal to 1 (those equal to 0 are dense MLP layers). None
    where Megatron Core raises building the model: N = 0, a list that is not one 0 or 1 per layer, any other type."""
    if not m.num_moe_experts:
        return [False] * m.num_layers
    freq = getattr(m, "moe_layer_freq", 1)
    if isinstance(freq, int):
        return [i % freq == 0 for i in range(m.num_layers)] if freq != 0 else None
    if isinstance(freq, list) and len(freq) == m.num_layers and all(x == 1 or x == 0 for x in freq):
        return [x == 1 for x in freq]
    return None


def ffn_width(m) -> int:
    """The dense MLP's width: model.ffn_hidden_size, or where None 4 x hidden_size, which Megatron Core's
    TransformerConfig.__post_init__ sets when the provider finalizes (an expert's: moe_ffn_hidden_size, else this)."""
    return m.ffn_hidden_size if m.ffn_hidden_size is not None else 4 * m.hidden_size


def vocab_rows(cfg) -> int | None:
    """The embedding's and output layer's rows (all TP ranks): the vocabulary the run builds, or None where only the
    launch knows it. Megatron Bridge's setup (training/setup.py, _validate_and_set_vocab_size) keeps a set
    model.vocab_size unpadded, but where tokenizer.use_tokenizer_vocab_size is True or model.vocab_size is None it
    takes the tokenizer's vocabulary and GPTModelProvider.provide pads it up to a multiple of
    make_vocab_size_divisible_by x TP. The config says the tokenizer's size only for the NullTokenizer
    (tokenizer.vocab_size); another tokenizer's is known when it loads, so a set model.vocab_size stands for it, and
    is padded as the tokenizer's will be."""
    from mbridge_offload.validation.parallelism import VOCAB_FROM_CONFIG_TOKENIZERS

    m, tokenizer = cfg.model, getattr(cfg, "tokenizer", None)
    if not (m.vocab_size is None or getattr(tokenizer, "use_tokenizer_vocab_size", False)):
        return m.vocab_size
    size = getattr(tokenizer, "vocab_size", None)
    if getattr(tokenizer, "tokenizer_type", None) not in VOCAB_FROM_CONFIG_TOKENIZERS or not isinstance(size, int):
        size = m.vocab_size
        if size is None:
            return None
    multiple = (getattr(m, "make_vocab_size_divisible_by", None) or 1) * m.tensor_model_parallel_size
    return -(-size // multiple) * multiple


# The layer specs the count knows, by the name of the function (or partial's function) the provider sets: Megatron
# Bridge's GPT ones (the Transformer Engine spec and the local one hold tensors of the same sizes), OLMoE's (its
# q and k norms span all heads: olmoe_provider.OLMoESelfAttention) and Gemma3's (a norm after the attention's
# projection and one after fc2: te_layers.TERowParallelLinearLayerNorm). Any other spec builds modules the count
# does not know (plannable.py refuses it by model.transformer_layer_spec).
GPT_LAYER_SPECS = frozenset({"default_layer_spec", "transformer_engine_layer_spec",
                             "transformer_engine_full_layer_spec", "local_layer_spec"})
OLMOE_LAYER_SPEC = "olmoe_layer_spec"
GEMMA3_LAYER_SPEC = "gemma3_layer_spec"
COUNTED_LAYER_SPECS = GPT_LAYER_SPECS | {OLMOE_LAYER_SPEC, GEMMA3_LAYER_SPEC}


def layer_spec_name(m) -> str | None:
    """The name of model config ``m``'s transformer_layer_spec: the function's (a partial's function's), or the
    class of a spec given built; None where the config has none (a GPT spec then). A cached config holds a stand-in
    shown as the function was (mbridge_offload/fast_check/snapshot.py): the name is read from that text. A saved
    run_config.yaml names it by ``_target_`` (module.function)."""
    spec = getattr(m, "transformer_layer_spec", None)
    if spec is None:
        return None
    target = spec.get("_target_") if isinstance(spec, Mapping) else None
    if isinstance(target, str):
        return target.rsplit(".", 1)[-1]
    func = getattr(spec, "func", spec)
    if callable(func) and hasattr(func, "__qualname__"):
        return func.__qualname__
    shown = re.match(r"(?:functools\.partial\()?<function (\S+?)(?: at 0x[0-9a-fA-F]+)?>", repr(spec))
    return shown.group(1) if shown else type(spec).__qualname__


def post_norms(m) -> bool:
    """Whether each layer has a norm after the attention's projection and one after fc2 (Gemma3's layer spec)."""
    return layer_spec_name(m) == GEMMA3_LAYER_SPEC


def output_gate(m) -> bool:
    """Whether attention gates its output by a sigmoid of a gate the QKV projection makes per query head
    (attention_output_gate: Qwen3-Next's attention layers)."""
    return bool(getattr(m, "attention_output_gate", False))


def learned_position_rows(m) -> int:
    """Rows of the learned absolute position embedding (GPTModel builds it for max_sequence_length = seq_length,
    whole on every TP rank: a torch Embedding), 0 for RoPE and the others, which have no parameters."""
    return m.seq_length if getattr(m, "position_embedding_type", None) == "learned_absolute" else 0


def named_tensors(cfg, stage: int) -> list[Tensor]:
    """The parameter tensors one rank of pipeline stage ``stage`` holds, in ``named_parameters()`` order:
    per layer the attention's projection, its fused norm, QKV, the QK norms, then the MLP's fused norm and
    fc1/fc2 (MoE: the pre-MLP norm, the router, every expert's fc1, then every expert's fc2, then the shared
    expert). Checked against the gradient buffer's listing in the H200 runs' logs (its reverse)."""
    m = cfg.model
    tp, pp = m.tensor_model_parallel_size, m.pipeline_model_parallel_size
    ep, etp = m.expert_model_parallel_size, m.expert_tensor_parallel_size or tp  # null: TP's size, as Megatron
    h, kv = m.hidden_size, m.kv_channels or m.hidden_size // m.num_attention_heads
    heads, groups = m.num_attention_heads, m.num_query_groups or m.num_attention_heads
    gated = 2 if m.gated_linear_unit else 1
    # QKV is one column-parallel linear of heads + 2 x groups head widths, split over TP whatever the groups: with
    # fewer query groups than TP ranks Megatron Core all-gathers its output and each rank takes one group's key and
    # value (attention.py, get_query_key_value_tensors), so no rank holds a replicated group's weights. With
    # attention_output_gate the same linear also makes a gate per query head (SelfAttention.linear_qkv_out_dim).
    qkv_rows = (heads + 2 * groups) * kv + (heads * kv if output_gate(m) else 0)
    layers = layers_per_stage(m, pp)[stage]
    vocab = vocab_rows(cfg)  # the tokenizer's, padded, where it replaces model.vocab_size
    experts = m.num_moe_experts or 0
    # Biases (1-D): add_bias_linear gives every linear layer one, add_qkv_bias (Qwen2) the QKV projection only. A
    # column-parallel layer's bias (QKV, fc1) is split like its rows; a row-parallel one's (proj, fc2) is whole on
    # every rank (megatron/core/tensor_parallel/layers.py). LayerNorm has a bias beside each weight, RMSNorm none.
    bias = bool(getattr(m, "add_bias_linear", False))
    qkv_bias = bias or bool(getattr(m, "add_qkv_bias", False))
    norm_bias = getattr(m, "normalization", "RMSNorm") == "LayerNorm"
    out: list[Tensor] = []

    def add(name: str, numel: int, kind: str) -> None:
        out.append(Tensor(name=name, numel=numel, kind=kind))

    def norm(name: str, width: int) -> None:
        add(name, width, "small")
        if norm_bias:
            add(f"{name}.bias", width, "small")

    def linear(name: str, rows: int, cols: int, kind: str, split_rows: int, split_cols: int = 1) -> None:
        """A weight of ``rows`` x ``cols`` split over ``split_rows`` (column-parallel) or ``split_cols``
        (row-parallel) ranks, and its bias where the model has one."""
        add(name, rows * cols // (split_rows * split_cols), kind)
        if bias:
            add(f"{name}.bias", rows // split_rows, "small")

    # OLMoE normalizes the query and the key over all heads at once, a norm as wide as every head (not split by TP)
    q_norm, k_norm = (heads * kv, heads * kv) if layer_spec_name(m) == OLMOE_LAYER_SPEC else (kv, kv)
    # softmax_type learnable (gpt-oss's attention sinks): one learned offset per head of the rank
    sinks = getattr(m, "softmax_type", "vanilla") == "learnable"
    if stage == 0:
        add("embedding", vocab * h // tp, "embedding")
        if learned_position_rows(m):
            add("embedding.position", learned_position_rows(m) * h, "embedding")
    for layer in range(layers):
        if sinks:
            add(f"l{layer}.softmax_offset", heads // tp, "small")
        linear(f"l{layer}.proj", h, heads * kv, "dense", 1, tp)
        if post_norms(m):
            norm(f"l{layer}.proj.post_ln", h)
        norm(f"l{layer}.ln1", h)
        add(f"l{layer}.qkv", qkv_rows * h // tp, "dense")
        if qkv_bias:
            add(f"l{layer}.qkv.bias", qkv_rows // tp, "small")
        if m.qk_layernorm:
            norm(f"l{layer}.q_ln", q_norm)
            norm(f"l{layer}.k_ln", k_norm)
        if experts:
            ffn = m.moe_ffn_hidden_size or ffn_width(m)
            norm(f"l{layer}.ln2", h)
            linear(f"l{layer}.router", experts, h, "dense", 1)  # not split; its bias too (moe/router.py)
            for e in range(experts // ep):
                linear(f"l{layer}.e{e}.fc1", gated * ffn, h, "expert", etp)
            for e in range(experts // ep):
                linear(f"l{layer}.e{e}.fc2", h, ffn, "expert", 1, etp)
            shared = getattr(m, "moe_shared_expert_intermediate_size", None)
            if shared:
                linear(f"l{layer}.shared.fc1", gated * shared, h, "dense", tp)
                linear(f"l{layer}.shared.fc2", h, shared, "dense", 1, tp)
                if getattr(m, "moe_shared_expert_gate", False):  # a 1 x hidden weight (shared_experts.py)
                    add(f"l{layer}.shared.gate", h, "dense")
        else:
            norm(f"l{layer}.ln2", h)
            linear(f"l{layer}.fc1", gated * ffn_width(m), h, "dense", tp)
            linear(f"l{layer}.fc2", h, ffn_width(m), "dense", 1, tp)
            if post_norms(m):
                norm(f"l{layer}.fc2.post_ln", h)
    if stage == pp - 1:
        norm("final_ln", h)
        if not m.share_embeddings_and_output_weights or pp > 1:
            add("output", vocab * h // tp, "embedding")
    return out


def separate_expert_optimizer(m) -> bool:
    """Whether the experts have an optimizer of their own: Megatron marks expert weights ``allreduce=False`` (a
    gradient buffer and a DistributedOptimizer apart) only with EP > 1 or ETP != TP."""
    tp = m.tensor_model_parallel_size
    return bool(m.num_moe_experts) and (m.expert_model_parallel_size > 1
                                        or (m.expert_tensor_parallel_size or tp) != tp)


def optimizer_groups(cfg, stage: int) -> list[list[Tensor]]:
    """The tensors of each optimizer (each HybridDeviceOptimizer pair) of one rank, in ``named_parameters()``
    order: one, or the dense one and the experts' (``separate_expert_optimizer``)."""
    named = named_tensors(cfg, stage)
    if not separate_expert_optimizer(cfg.model):
        return [named]
    groups = [[t for t in named if t.kind != "expert"], [t for t in named if t.kind == "expert"]]
    return [g for g in groups if g]


def first_walk_order(tensors: list[Tensor]) -> list[Tensor]:
    """The walk of the HybridDeviceOptimizer Megatron builds on the bf16 parameters and throws away: the 2-D
    weights, then the 1-D parameters, each in ``named_parameters()`` order."""
    return [t for t in tensors if t.kind != "small"] + [t for t in tensors if t.kind == "small"]


def walk_order(tensors: list[Tensor]) -> list[Tensor]:
    """The walk of the HybridDeviceOptimizer that trains (on the DistributedOptimizer's fp32 shards): the same
    groups, each in the gradient buffer's order, the reverse of ``named_parameters()``."""
    return first_walk_order(tensors[::-1])


KIND_ORDER = ("dense", "expert", "small", "embedding")


def stage_tensors(cfg, stage: int) -> list[Tensor]:
    """The parameter tensors one rank of pipeline stage ``stage`` holds (``named_tensors``), grouped by kind: 2-D
    weights, expert weights, 1-D parameters, the embedding and output layer, each in ``named_parameters()``
    order. The stream engine's plan walks them by ``forward_position``; the library's walks are ``walk_order``
    and ``first_walk_order`` of ``optimizer_groups``."""
    return sorted(named_tensors(cfg, stage), key=lambda t: KIND_ORDER.index(t.kind))


def forward_position(tensor: Tensor) -> tuple[int, int]:
    """Where the forward meets ``tensor`` (sortable): the embedding, the layers in order, the final norm, the
    output layer (the order of the model's parameters, which the stream engine's choice of what to offload walks
    backwards)."""
    if tensor.name.startswith("embedding"):
        return (0, 0)
    if tensor.name.startswith("l"):
        return (1, int(tensor.name[1:tensor.name.index(".")]))
    return (2, tensor.name == "output")
