"""Activation memory of one rank: the tensors kept for backward, the loss's peak, the micro batches in flight,
and what activation offload takes off the GPU.

The count is of the tensors this stack's layers save (megatron-core 0.19.2 with the Transformer Engine spec,
TE 2.20), read from their code, per token of a micro batch on the rank:

- attention: the layer input and the fused norm's output (TE's LayerNormLinear keeps both); with q/k norms a
  copy of q and of k (the split of the fused qkv output is not contiguous, so the norms get copies); q and k
  after the unfused RoPE and a copy of v (TE's attention makes q, k, v contiguous); the attention output, which
  the projection keeps too; fp32 norm and softmax statistics. Unfused RoPE keeps its cos and sin per position.
  With an output gate (attention_output_gate), the gate's fp32 sigmoid and the gated output the projection keeps.
- dense MLP: the residual and the fused norm's output; with the unfused SwiGLU the fc1 output (its halves are
  views), the SiLU output, a copy of the linear half (``x + glu_linear_offset``) and their product (fc2's input).
- MoE MLP: the norm's input and output (the router keeps it), routing indices, probabilities and the permute's
  row map, the permuted tokens (fc1's input), the experts' fc1 output and the SwiGLU's three products, fc2's
  input, all top-k times per token (a capacity factor times that where the experts' input is padded to capacity).
- Gemma3's layer spec: its norms after the attention's projection and after fc2 keep their inputs and fp32
  statistics.
- after the last layer: the final norm's input and output; the loss peaks at the logits plus TE's fused cross
  entropy's bf16 copy (4 B per token and vocabulary entry; 6 B unfused: the fp32 copy beside the bf16 logits),
  or in the output layer's backward at the logits' gradient plus a bf16 weight gradient.

1F1B keeps up to PP micro batches in flight on the first stage (PP - s on stage s), never more than the step has;
the interleaved schedule (a virtual pipeline size) splits a stage's layers into VPP model chunks and keeps
2 (PP - s - 1) + (VPP - 1) x PP + 1 chunks' micro batches in flight (Megatron Core's schedules.py). Layer-level activation offload (TE's) removes
the first N layers' saved tensors except the non-contiguous ones (the unfused SwiGLU's view of fc1's output); fine-grained offload removes the chosen modules' tensors on every layer but the last.
Recompute follows Megatron Core's ``recompute.checkpointed_forward``: full recompute keeps only the input of each
checkpointed chunk (``uniform``: chunks of ``recompute_num_layers`` layers; ``block``: the first
``recompute_num_layers`` layers one by one) and rebuilds one chunk at a time in backward, after the loss's
tensors are freed; selective recompute
drops what the listed modules rebuild (``mlp`` on a dense layer, ``moe`` on a MoE layer: everything inside the MLP
but its input; ``shared_experts``: the shared expert's inside; ``moe_act``: the activation's products and output; ``layernorm``: the outputs of norms that are not fused into a linear;
``core_attn`` keeps the same tensors with TE's fused attention, which stores no score matrix).
"""

from __future__ import annotations

from dataclasses import dataclass

from mbridge_offload.facts.offload_bytes import pinned_block_bytes
from mbridge_offload.planning.tensors import ffn_width, layers_per_stage, output_gate, post_norms, vocab_rows


@dataclass(frozen=True, kw_only=True)
class LayerActivations:
    """What one transformer layer keeps for backward per micro batch."""

    bytes_kept: int  # all of it, after selective recompute
    fine_grained_offloaded_bytes: int  # of which fine-grained activation offload moves to the host
    tokens: int  # tokens of a micro batch on this rank (CP splits the sequence)
    input_bytes: int  # the layer's input (hidden states), what a full-recompute checkpoint keeps
    not_offloadable_bytes: int  # what stays on the GPU in a layer that layer-level offload moves to the host


@dataclass(frozen=True, kw_only=True)
class _Widths:
    """One rank's share of a layer, what every count below is made of."""

    tp: int
    shard: int  # what sequence parallel splits the hidden states into (TP with SP, else 1)
    positions: int  # sequence positions on this rank (CP splits the sequence)
    tokens: int  # tokens of a micro batch on this rank
    kv: int  # the attention head's width
    heads: float  # attention heads per rank
    groups: float  # query groups per rank
    h: float  # hidden states per token, split over SP
    q: float  # query width per token
    k: float  # key (and value) width per token


def _widths(cfg) -> _Widths:
    m = cfg.model
    tp = m.tensor_model_parallel_size
    shard = tp if (m.sequence_parallel and tp > 1) else 1
    positions = m.seq_length // m.context_parallel_size
    kv = m.kv_channels or m.hidden_size // m.num_attention_heads
    # fewer query groups than TP ranks: each rank computes one group's key and value, replicated (attention.py)
    heads, groups = m.num_attention_heads / tp, max((m.num_query_groups or m.num_attention_heads) / tp, 1)
    return _Widths(tp=tp, shard=shard, positions=positions, tokens=positions * cfg.train.micro_batch_size, kv=kv,
                   heads=heads, groups=groups, h=m.hidden_size / shard, q=heads * kv, k=groups * kv)


def _attention_bytes_per_token(m, w: _Widths) -> float:
    kept = 2 * (2 * w.h)  # the layer input and the fused norm's output
    kept += 2 * (w.q + 2 * w.k) + 2 * w.q + 4 * w.heads + 4  # q, k, v; the attention output; softmax and norm stats
    if getattr(m, "qk_layernorm", False):
        kept += 2 * (w.q + w.k) + 4 * (w.heads + w.groups)  # the norms' contiguous inputs and their statistics
    if output_gate(m):
        # Attention._apply_output_gate: x * sigmoid(gate.float()) keeps the sigmoid's fp32 output and the attention
        # output (x, kept anyway), and the projection keeps the gated output, a bf16 copy beside x
        kept += 4 * w.q + 2 * w.q
    return kept


def _unfused_rope(m) -> bool:
    """RoPE as torch ops: each layer keeps its own cos and sin for q and for k (rope_utils.py)."""
    return m.position_embedding_type == "rope" and not m.apply_rope_fusion


def _glu_unfused(m) -> bool:
    """The gated MLP's activation runs as torch ops (mlp.py): SiLU keeps a half of fc1's output, a view."""
    return bool(m.gated_linear_unit and not (m.bias_activation_fusion or getattr(m, "use_te_activation_func", False)))


def _mlp_bytes_per_token(m, w: _Widths, recomputed: set) -> tuple[float, dict]:
    """(bytes kept, {expert fine-grained module: bytes it takes off the GPU}) of the MLP half per token."""
    h, tp, shard = m.hidden_size, w.tp, w.shard  # h: the full width, which routed tokens have
    glu_unfused = _glu_unfused(m)

    def ffn_bytes(ffn: float) -> float:  # fc1's output (the activation keeps it), the activation's output
        if not m.gated_linear_unit:
            return 2 * ffn + 2 * ffn
        return 4 * ffn + (4 * ffn if glu_unfused else 0) + 2 * ffn  # unfused: + SiLU's output, the linear copy

    if not m.num_moe_experts:
        if "mlp" in recomputed:
            return 2 * w.h, {}
        return 2 * (2 * w.h) + 4 + ffn_bytes(ffn_width(m) / tp), {}
    experts, topk = m.num_moe_experts, m.moe_router_topk
    ffn, routed = _expert_ffn(m, tp), _routed_per_token(m, tp, shard)
    norm_output = 0 if "layernorm" in recomputed else 2 * w.h  # a separate norm: the router keeps its output
    kept = 2 * w.h + 4 + norm_output
    if "moe" in recomputed:  # "mlp" recomputes a dense layer's MLP only (TransformerLayer: not is_moe_layer)
        return kept, {"expert_fc1": 0, "moe_act": 0}  # nothing inside the experts is kept to move
    routing = 22 * topk + 7 * experts + 4 * (2 * experts + 1)  # indices, probabilities, the permute's row map
    if m.moe_router_load_balancing_type in ("aux_loss", "seq_aux_loss"):
        routing += 4 * experts  # the auxiliary loss's fp32 softmax over all experts
    fc1_input = 2 * h * routed
    activation = routed * (4 * ffn + (6 * ffn if glu_unfused else 0)) if m.gated_linear_unit else routed * 2 * ffn
    fc2_input = routed * 2 * ffn
    if "moe_act" in recomputed:  # the activation keeps its input only; its output is rebuilt for fc2's backward
        activation, fc2_input = routed * (4 * ffn if m.gated_linear_unit else 2 * ffn), 0
    shared = getattr(m, "moe_shared_expert_intermediate_size", None)
    # shared_experts recompute keeps the shared expert's input only, the norm's output counted above
    shared_kept = ffn_bytes(shared / tp) if shared and "shared_experts" not in recomputed else 0
    kept += routing / shard + fc1_input + activation + fc2_input + shared_kept
    return kept, {"expert_fc1": fc1_input, "moe_act": activation}


def _expert_ffn(m, tp: int) -> float:
    """An expert's fc1 width per rank: the expert FFN split over expert tensor parallel (null: TP's size)."""
    return (m.moe_ffn_hidden_size or ffn_width(m)) / (getattr(m, "expert_tensor_parallel_size", None) or tp)


def _routed_per_token(m, tp: int, shard: int) -> float:
    """Routed tokens a rank's experts process per token of the micro batch: top-k of the tokens it holds (a
    sequence-parallel shard: Megatron requires SP for MoE with TP > 1), gathered over expert tensor parallel. With a
    capacity factor each expert takes at most capacity = factor x its even share of the routed tokens, padded up to
    it where moe_pad_expert_input_to_capacity (token_dispatcher.py: every expert then processes capacity tokens, so
    the rank's experts process factor x top-k per token whatever the routing; Megatron's ceil of the capacity adds
    under one token per expert); unpadded, a factor below 1 drops what is beyond it."""
    etp = getattr(m, "expert_tensor_parallel_size", None) or tp
    factor = getattr(m, "moe_expert_capacity_factor", None)
    scale = 1.0
    if factor is not None:
        scale = factor if getattr(m, "moe_pad_expert_input_to_capacity", False) else min(factor, 1.0)
    return m.moe_router_topk * etp / shard * scale


def _fine_grained_tensors(m, w: _Widths) -> dict[str, list[float]]:
    """What each fine-grained offload module copies to the host: its tensors' elements per token. The norms are
    modules of their own only where they are not fused into a linear (transformer_layer.py turns attn_norm off when
    the input norm is fused into the qkv linear, as in every non-MLA TE spec, and mlp_norm off on dense layers,
    whose pre-MLP norm is fused into fc1)."""
    modules = {"core_attn": [w.q, w.k, w.k], "attn_proj": [w.q], "qkv_linear": [w.h],
               "attn_norm": [w.h] if getattr(m, "multi_latent_attention", False) else [],
               "mlp_norm": [w.h] if m.num_moe_experts else []}
    if m.num_moe_experts:
        routed, ffn = _routed_per_token(m, w.tp, w.shard), _expert_ffn(m, w.tp)
        modules["expert_fc1"] = [routed * m.hidden_size]
        # moe_act: the unfused SwiGLU's input half, its output, the linear copy and the product; else fc1's output
        modules["moe_act"] = ([routed * ffn] * 4 if _glu_unfused(m)
                              else [(2 if m.gated_linear_unit else 1) * routed * ffn])
    return modules


def recomputed_modules(m) -> set[str]:
    """The modules selective recompute rebuilds, as Megatron Core's TransformerConfig sets them at finalize: the
    listed ones (None: core_attn), and moe for the deprecated moe_layer_recompute, which turns selective on."""
    modules = set()
    if m.recompute_granularity == "selective":
        modules = set(["core_attn"] if m.recompute_modules is None else m.recompute_modules)
    if getattr(m, "moe_layer_recompute", False) and m.recompute_granularity != "full":
        modules.add("moe")
    return modules


def recomputes(m) -> bool:
    """Whether the run recomputes any activations in the backward: full recompute, selective (of any modules, or of
    none listed), or the deprecated moe_layer_recompute, which Megatron Core turns into selective at finalize."""
    return m.recompute_granularity is not None or bool(recomputed_modules(m))


def layer_activations(cfg) -> LayerActivations:
    """Bytes a layer keeps for backward per micro batch, and how many of them fine-grained offload takes."""
    m = cfg.model
    w = _widths(cfg)
    tp, shard, tokens = w.tp, w.shard, w.tokens
    recomputed = recomputed_modules(m)
    mlp, expert_modules = _mlp_bytes_per_token(m, w, recomputed)
    # what each module takes off the GPU: the bf16 tensors it copies; the expert modules free more than they copy
    fine_grained = {name: 2 * sum(numels) for name, numels in _fine_grained_tensors(m, w).items()}
    fine_grained.update(expert_modules)
    per_layer = (_attention_bytes_per_token(m, w) + mlp) * tokens
    if post_norms(m):  # Gemma3's norms after the projection and after fc2 keep their inputs and fp32 statistics
        per_layer += 2 * (2 * w.h + 4) * tokens
    if _unfused_rope(m):
        per_layer += 8 * w.kv * w.positions  # cos and sin for q and for k, per position
    chosen = 0.0
    if m.fine_grained_activation_offloading:
        chosen = sum(fine_grained.get(name, 0) for name in (m.offload_modules or []))
        chosen *= m.activation_offload_fraction
    # tensor_parallel.checkpoint keeps the chunk's input, split over TP with distribute_saved_activations
    input_shard = tp if (shard > 1 or m.distribute_saved_activations) else 1
    # TE's layer-level offload skips non-contiguous saved tensors: the unfused SwiGLU's half of an fc1 output (the
    # dense MLP's, the experts', a shared expert's), which keeps all of that output on the GPU (cpu_offload.py)
    not_offloadable = 0.0
    if _glu_unfused(m) and not m.num_moe_experts:
        not_offloadable = 4 * ffn_width(m) / tp
    elif _glu_unfused(m):
        shared = getattr(m, "moe_shared_expert_intermediate_size", None)
        not_offloadable = 4 * _expert_ffn(m, tp) * _routed_per_token(m, tp, shard) + (4 * shared / tp if shared else 0)
    return LayerActivations(bytes_kept=int(per_layer), fine_grained_offloaded_bytes=int(chosen * tokens),
                            tokens=tokens, input_bytes=int(2 * m.hidden_size / input_shard * tokens),
                            not_offloadable_bytes=int(not_offloadable * tokens))


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


def te_fused_cross_entropy(m) -> bool:
    """Whether the loss is Transformer Engine's fused cross entropy (the recipes' choice); else Megatron's own, fused
    or not, which keeps an fp32 copy of the logits and all-reduces over the tensor-parallel group."""
    return bool(m.cross_entropy_loss_fusion) and getattr(m, "cross_entropy_fusion_impl", "native") == "te"


def loss_peak_bytes(cfg, tokens: int) -> int:
    """The last stage's peak beyond the layers: the final norm's input and output, and the larger of the loss's
    forward (logits and the cross entropy's copy) and the output layer's backward (the logits' gradient, a bf16
    weight gradient unless gradient accumulation fusion writes it into the fp32 buffer, the input's gradient)."""
    m = cfg.model
    tp = m.tensor_model_parallel_size
    vocab, h = vocab_rows(cfg) / tp, m.hidden_size
    fused_te = te_fused_cross_entropy(m)
    forward = (4 if fused_te else 6) * tokens * vocab + 12 * tokens  # + the loss and its fp32 statistics
    weight_grad = 0 if m.gradient_accumulation_fusion else 2 * vocab * h
    backward = 2 * tokens * vocab + weight_grad + 2 * tokens * h
    return int(2 * 2 * h * tokens + max(forward, backward))


def largest_loss_tensor_bytes(cfg) -> int:
    """The largest single tensor of the loss of one micro batch on the last stage: the logits in bf16 (2 B per token
    and vocabulary entry), or, with the unfused cross entropy, its fp32 copy of them (4 B)."""
    m = cfg.model
    fused_te = te_fused_cross_entropy(m)
    return int((2 if fused_te else 4) * _widths(cfg).tokens * vocab_rows(cfg) / m.tensor_model_parallel_size)


def virtual_stages(m) -> int:
    """Model chunks per pipeline stage: Megatron Core's interleaved schedule with a virtual pipeline size on several
    stages (with one stage the model is one chunk and the size is not read: model_provider.py), else 1."""
    vpp = getattr(m, "virtual_pipeline_model_parallel_size", None)
    return vpp if vpp and m.pipeline_model_parallel_size > 1 else 1


def micro_batches_in_flight(m, stage: int, micro_batches: int | None = None) -> int:
    """Micro batches of one model chunk whose activations stage ``stage`` holds at its peak, as Megatron Core's
    schedules run them (pipeline_parallel/schedules.py get_pp_rank_microbatches): the warm-up forwards and the one
    of the first 1F1B step. Without interleaving PP - stage; interleaved, 2 (PP - stage - 1) + (VPP - 1) x the micro
    batch group (null: PP) + 1 chunks. Never more than the step has (``micro_batches`` x VPP; None: not capped)."""
    pp, chunks = m.pipeline_model_parallel_size, virtual_stages(m)
    if pp == 1:
        in_flight = 1
    elif chunks == 1 and getattr(m, "virtual_pipeline_model_parallel_size", None) is None:
        in_flight = pp - stage
    else:
        group = getattr(m, "microbatch_group_size_per_vp_stage", None) or pp
        in_flight = 2 * (pp - stage - 1) + (chunks - 1) * group + 1
    return in_flight if micro_batches is None else max(1, min(in_flight, micro_batches * chunks))


def _layers_kept_bytes(m, layer: LayerActivations, layers: int) -> tuple[int, int]:
    """(bytes ``layers`` consecutive layers of one model chunk keep per micro batch, the transient of rebuilding a
    checkpointed chunk in backward) with the config's activation offload and recompute."""
    layer_bytes = layers * layer.bytes_kept
    if _layer_offload(m):
        # TE frees offloaded layer i when layer L-N+i starts: at the loss, layers N..L-1 are whole on the GPU
        offloaded = min(m.cpu_offloading_num_layers, layers)
        layer_bytes = (layers - offloaded) * layer.bytes_kept + offloaded * layer.not_offloadable_bytes
    # fine-grained offload keeps each module's last layer on the GPU (its copy would end after backward needs it)
    layer_bytes -= max(0, layers - 1) * layer.fine_grained_offloaded_bytes
    transient = 0
    if m.recompute_granularity == "full":
        layer_bytes, transient = _full_recompute_bytes(m, layer, layers)
    return layer_bytes, transient


def activation_bytes(cfg, stage: int | None = None, micro_batches: int | None = None) -> int:
    """Peak activation bytes of one rank of pipeline stage ``stage`` (None: the worst stage), for a step of
    ``micro_batches`` micro batches (global batch / (micro batch x DP); None: as many as the schedule holds)."""
    m = cfg.model
    pp = m.pipeline_model_parallel_size
    if stage is None:
        return max(activation_bytes(cfg, s, micro_batches) for s in range(pp))
    layer = layer_activations(cfg)
    # the interleaved schedule: the stage's layers in VPP model chunks, each micro batch in flight holding one chunk's
    # (the most of them: with account_for_embedding/loss_in_pipeline_split the first or last chunk holds one fewer)
    chunk_layers = -(-layers_per_stage(m, pp)[stage] // virtual_stages(m))
    layer_bytes, transient = _layers_kept_bytes(m, layer, chunk_layers)
    in_flight = micro_batches_in_flight(m, stage, micro_batches)
    loss = loss_peak_bytes(cfg, layer.tokens) if stage == pp - 1 else 0
    # the loss's tensors are gone before backward rebuilds the first checkpointed chunk
    return int(layer_bytes * in_flight + max(transient, loss))


def _layer_offload(m) -> bool:
    """Layer-level offload of activations (with weights only, TE 2.20 offloads nothing: cpu_offload.py)."""
    return bool(m.cpu_offloading and getattr(m, "cpu_offloading_activations", True))


# TE's layer-level offload copies a saved tensor from this many elements up (transformer_engine/pytorch/cpu_offload.py)
TE_LAYER_OFFLOAD_MIN_NUMEL = 256 * 1024


def _dense_layer_offloaded_tensors(m, w: _Widths) -> list[int]:
    """Bytes of each tensor TE's layer-level offload copies from one dense layer to pinned host memory: the
    contiguous saved tensors of at least TE_LAYER_OFFLOAD_MIN_NUMEL elements (the list in the module docstring)."""
    h, q, k, ffn = w.h, w.q, w.k, ffn_width(m) / w.tp
    # input, norm output, q and k after RoPE, v, attention output, residual, MLP norm output
    per_token = [h, h, q, k, k, q, h, h]
    if getattr(m, "qk_layernorm", False):
        per_token += [q, k]  # the norms' contiguous inputs
    if output_gate(m):
        per_token += [q, 2 * q]  # the gated output, the gate's fp32 sigmoid (2 x q bf16 elements' bytes)
    if post_norms(m):
        per_token += [h, h]  # the inputs of the norms after the projection and after fc2
    if _glu_unfused(m):
        per_token += [ffn, ffn, ffn]  # SiLU's output, the linear copy, the product (fc1's output stays: a view)
    else:
        per_token += [2 * ffn if m.gated_linear_unit else ffn, ffn]  # fc1's output, the activation's output
    numels = [n * w.tokens for n in per_token]
    if _unfused_rope(m):
        numels += [w.kv * w.positions] * 4  # cos and sin for q and for k
    return [int(2 * n) for n in numels if n >= TE_LAYER_OFFLOAD_MIN_NUMEL]


def _fine_grained_offloaded_tensors(m, w: _Widths) -> list[int]:
    """Bytes of each tensor fine-grained offload copies from one layer to pinned host memory: per chosen module,
    its tensors of at least ``min_offloaded_tensor_size`` elements."""
    modules = _fine_grained_tensors(m, w)
    smallest = getattr(m, "min_offloaded_tensor_size", 0) or 0
    numels = [n * w.tokens for name in (m.offload_modules or []) for n in modules.get(name, [])]
    return [int(2 * n) for n in numels if n >= smallest]


def activation_offload_pinned_bytes(cfg, micro_batches: int | None = None) -> int:
    """Pinned host bytes activation offload holds per rank, each tensor in a block of PyTorch's caching host
    allocator (a power of two; the blocks are reused across micro batches and steps, not between layers).
    Layer-level: the N offloaded layers' copies (a MoE layer's many routed tensors are counted unrounded).
    Fine-grained: every layer's, since the first iteration offloads them all and the allocator keeps the blocks,
    for each micro batch in flight (``micro_batches_in_flight``: a step of ``micro_batches``; None: uncapped), on the
    stage that holds the most."""
    m = cfg.model
    pp, w = m.pipeline_model_parallel_size, _widths(cfg)
    if _layer_offload(m):
        if m.num_moe_experts:
            layer = layer_activations(cfg)
            return (layer.bytes_kept - layer.not_offloadable_bytes) * m.cpu_offloading_num_layers
        per_layer = _dense_layer_offloaded_tensors(m, w)
        return m.cpu_offloading_num_layers * sum(pinned_block_bytes(b) for b in per_layer)
    if m.fine_grained_activation_offloading:
        per_layer = _fine_grained_offloaded_tensors(m, w)
        chunks, stages = virtual_stages(m), layers_per_stage(m, pp)
        held = max(stages[s] // chunks * micro_batches_in_flight(m, s, micro_batches) for s in range(pp))
        return held * sum(pinned_block_bytes(b) for b in per_layer)
    return 0
