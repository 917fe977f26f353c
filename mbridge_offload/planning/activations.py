"""Activation memory of one rank: the tensors kept for backward, the logits, the micro batches in flight,
and what activation offload takes off the GPU.

Activations per micro batch and layer come from the tensors kept for backward (bf16), plus the logits
(bf16 output and fp32 loss work), times the micro batches in flight on the stage (1F1B keeps up to PP of
them on the first). Layer-level activation offload removes the offloaded layers but one; fine-grained
offload removes the chosen modules' inputs.

Recompute follows Megatron Core's ``recompute.checkpointed_forward``: full recompute keeps only the input of
each checkpointed chunk (``uniform``: chunks of ``recompute_num_layers`` layers; ``block``: the first
``recompute_num_layers`` layers one by one) and rebuilds one chunk's activations at a time in backward;
selective recompute drops what the listed modules rebuild (``layernorm``: the norms' outputs; ``mlp``/``moe``:
everything inside the MLP but its input; ``moe_act``: the activation's output; ``core_attn`` keeps the same
tensors with TE's fused attention, which stores no score matrix to drop).
"""

from __future__ import annotations

from dataclasses import dataclass

from mbridge_offload.planning.tensors import layers_per_stage


@dataclass(frozen=True, kw_only=True)
class LayerActivations:
    """What one transformer layer keeps for backward per micro batch."""

    bytes_kept: int  # all of it, bf16, after selective recompute
    fine_grained_offloaded_bytes: int  # of which fine-grained activation offload moves to the host
    tokens: int  # tokens of a micro batch on this rank (CP splits the sequence)
    input_bytes: int  # the layer's input (hidden states), what a full-recompute checkpoint keeps


def layer_activations(cfg) -> LayerActivations:
    """Bytes a layer keeps for backward per micro batch, and how many of them fine-grained offload takes."""
    m = cfg.model
    tokens = m.seq_length * cfg.train.micro_batch_size // m.context_parallel_size
    tp = m.tensor_model_parallel_size
    h, kv = m.hidden_size, m.kv_channels or m.hidden_size // m.num_attention_heads
    heads, groups = m.num_attention_heads, m.num_query_groups or m.num_attention_heads
    sp = m.sequence_parallel and tp > 1
    # Kept for backward, elements per token: norm inputs/outputs and residuals (sharded by SP),
    # q/k/v and attention output (sharded by TP), MLP or routed-expert inputs and outputs.
    shard = tp if sp else 1
    norm_outputs = 2 * h / shard  # qkv in, fc1 in
    other_replicated = 3 * h / shard  # ln1 in, residual, ln2 in
    attention = ((heads + 2 * groups) * kv + heads * kv) / tp
    recomputed = set(m.recompute_modules or []) if m.recompute_granularity == "selective" else set()
    offloadable = {}
    if m.num_moe_experts:
        ffn = m.moe_ffn_hidden_size or m.ffn_hidden_size
        topk = m.moe_router_topk
        offloadable["expert_fc1"] = topk * h
        offloadable["moe_act"] = topk * 2 * ffn
        act_output = 0 if "moe_act" in recomputed else topk * ffn
        mlp = 0 if "moe" in recomputed else offloadable["expert_fc1"] + offloadable["moe_act"] + act_output
        mlp += 2 * m.num_moe_experts  # router scores and probabilities
    else:
        gated = 2 if m.gated_linear_unit else 1
        mlp = 0 if "mlp" in recomputed else (gated * m.ffn_hidden_size + m.ffn_hidden_size) / tp
    if "layernorm" in recomputed:
        norm_outputs = 0
    offloadable["core_attn"] = (heads + 2 * groups) * kv / tp
    offloadable["attn_proj"] = heads * kv / tp
    offloadable["qkv_linear"] = h / shard
    offloadable["attn_norm"] = h / shard
    offloadable["mlp_norm"] = h / shard
    per_token = norm_outputs + other_replicated + attention + mlp
    chosen = 0.0
    if m.fine_grained_activation_offloading:
        chosen = sum(offloadable.get(name, 0) for name in (m.offload_modules or []))
        chosen *= m.activation_offload_fraction
    # tensor_parallel.checkpoint keeps the chunk's input, split over TP with distribute_saved_activations
    input_shard = tp if (sp or m.distribute_saved_activations) else 1
    return LayerActivations(bytes_kept=int(2 * per_token * tokens),
                            fine_grained_offloaded_bytes=int(2 * chosen * tokens), tokens=tokens,
                            input_bytes=int(2 * h / input_shard * tokens))


def _full_recompute_bytes(m, layer: LayerActivations, layers: int) -> tuple[int, int]:
    """(kept per micro batch in flight, transient once) for ``layers`` layers under full recompute: the
    checkpoints' inputs stay; backward rebuilds one chunk (uniform) or one layer (block) at a time."""
    n = max(1, m.recompute_num_layers or 1)
    if m.recompute_method == "block":
        checkpointed = min(n, layers)
        kept = checkpointed * layer.input_bytes + (layers - checkpointed) * layer.bytes_kept
        return kept, (layer.bytes_kept if checkpointed else 0)
    chunks = -(-layers // n)  # uniform: every chunk of n layers is one checkpoint
    return chunks * layer.input_bytes, min(n, layers) * layer.bytes_kept


def activation_bytes(cfg, stage: int | None = None) -> int:
    """Peak activation bytes of one rank of pipeline stage ``stage`` (None: the worst stage)."""
    m = cfg.model
    pp = m.pipeline_model_parallel_size
    if stage is None:
        return max(activation_bytes(cfg, s) for s in range(pp))
    layer = layer_activations(cfg)
    layers = layers_per_stage(m, pp)[stage]
    kept_layers = layers
    if m.cpu_offloading:
        # Offloaded layers leave the GPU; the one being copied stays until its copy ends.
        kept_layers = layers - max(0, m.cpu_offloading_num_layers - 1)
    layer_bytes = kept_layers * layer.bytes_kept - layers * layer.fine_grained_offloaded_bytes
    transient = 0
    if m.recompute_granularity == "full":
        layer_bytes, transient = _full_recompute_bytes(m, layer, layers)
    in_flight = pp - stage  # 1F1B: stage s holds up to PP - s micro batches before its first backward
    # Logits on the last stage: bf16 output, fp32 softmax work and its gradient.
    logits = layer.tokens * m.vocab_size // m.tensor_model_parallel_size * (2 + 4) if stage == pp - 1 else 0
    return int(layer_bytes * in_flight + transient + logits)


def offloaded_layer_bytes(cfg) -> int:
    """Host bytes (pinned) layer-level activation offload holds per rank: the offloaded layers' activations."""
    m = cfg.model
    return layer_activations(cfg).bytes_kept * m.cpu_offloading_num_layers if m.cpu_offloading else 0
