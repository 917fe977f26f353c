"""The parameter tensors one rank holds, stage by stage, in the order the optimizer walks them.

Parameters are enumerated tensor by tensor for one rank of each pipeline stage (the first stage holds
the embedding, the last the output layer and final norm), split by TP, EP and ETP. The order is
Megatron Core's ``HybridDeviceOptimizer``'s: 2-D weights by layer, expert weights, 1-D parameters, then
the embedding and output layer; its greedy offload split (memory_plan.py) depends on it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class Tensor:
    name: str
    numel: int
    kind: str  # "dense" (2-D, not embedding), "expert", "small" (1-D), "embedding"


def layers_per_stage(m, pp: int) -> list[int]:
    """Transformer layers on each of the ``pp`` pipeline stages of model config ``m`` (uneven first and
    last stages where the config sets them)."""
    first = getattr(m, "num_layers_in_first_pipeline_stage", None)
    last = getattr(m, "num_layers_in_last_pipeline_stage", None)
    if pp == 1:
        return [m.num_layers]
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


def stage_tensors(cfg, stage: int) -> list[Tensor]:
    """The parameter tensors one rank of pipeline stage ``stage`` holds, in optimizer order."""
    m = cfg.model
    tp, pp = m.tensor_model_parallel_size, m.pipeline_model_parallel_size
    ep, etp = m.expert_model_parallel_size, m.expert_tensor_parallel_size or tp  # null: TP's size, as Megatron
    h, kv = m.hidden_size, m.kv_channels or m.hidden_size // m.num_attention_heads
    heads, groups = m.num_attention_heads, m.num_query_groups or m.num_attention_heads
    gated = 2 if m.gated_linear_unit else 1
    layers = layers_per_stage(m, pp)[stage]
    vocab = m.vocab_size
    experts = m.num_moe_experts or 0
    dense, expert, small = [], [], []

    def add(into: list[Tensor], name: str, numel: int, kind: str) -> None:
        into.append(Tensor(name=name, numel=numel, kind=kind))

    for layer in range(layers):
        add(dense, f"l{layer}.qkv", (heads + 2 * groups) * kv * h // tp, "dense")
        add(dense, f"l{layer}.proj", heads * kv * h // tp, "dense")
        add(small, f"l{layer}.ln1", h, "small")
        add(small, f"l{layer}.ln2", h, "small")
        if m.qk_layernorm:
            add(small, f"l{layer}.q_ln", kv, "small")
            add(small, f"l{layer}.k_ln", kv, "small")
        if experts:
            ffn = m.moe_ffn_hidden_size or m.ffn_hidden_size
            add(dense, f"l{layer}.router", experts * h, "dense")
            for e in range(experts // ep):
                add(expert, f"l{layer}.e{e}.fc1", gated * ffn * h // etp, "expert")
                add(expert, f"l{layer}.e{e}.fc2", ffn * h // etp, "expert")
            shared = getattr(m, "moe_shared_expert_intermediate_size", None)
            if shared:
                add(dense, f"l{layer}.shared.fc1", gated * shared * h // tp, "dense")
                add(dense, f"l{layer}.shared.fc2", shared * h // tp, "dense")
        else:
            add(dense, f"l{layer}.fc1", gated * m.ffn_hidden_size * h // tp, "dense")
            add(dense, f"l{layer}.fc2", m.ffn_hidden_size * h // tp, "dense")
    embeddings = []
    if stage == 0:
        add(embeddings, "embedding", vocab * h // tp, "embedding")
    if stage == pp - 1:
        add(small, "final_ln", h, "small")
        if not m.share_embeddings_and_output_weights or pp > 1:
            add(embeddings, "output", vocab * h // tp, "embedding")
    return dense + expert + small + embeddings


def forward_position(tensor: Tensor) -> tuple[int, int]:
    """Where the forward meets ``tensor`` (sortable): the embedding, the layers in order, the final norm, the
    output layer (the order of the model's parameters, which the stream engine's choice of what to offload walks
    backwards)."""
    if tensor.name == "embedding":
        return (0, 0)
    if tensor.name.startswith("l"):
        return (1, int(tensor.name[1:tensor.name.index(".")]))
    return (2, tensor.name == "output")
