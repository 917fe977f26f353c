"""Memory planner: per-GPU and host memory of a config, before anything is queued.

The model, checked against the seed's Qwen3-30B-A3B numbers and the H200 runs (docs/benchmarks/):

- Parameters are enumerated tensor by tensor for the worst rank (pipeline stage with the most bytes;
  first stage holds the embedding, last the output layer and final norm), split by TP, EP and ETP.
- GPU state = bf16 weights (2 B) + gradient buffer (4 B with ``grad_reduce_in_fp32``, else 2 B)
  + optimizer state. The distributed optimizer shards the optimizer state of dense parameters over
  DP x CP and of expert parameters over the expert-data-parallel group. Its fp32 main parameters
  stay on the GPU under offload; Adam's m and v (8 B) move to the host for offloaded parameters.
- Which parameters are offloaded follows Megatron Core's ``HybridDeviceOptimizer``: it walks the
  optimizer's parameters in order (2-D weights by layer, expert weights, 1-D parameters, then the
  embedding and output layer) and offloads whole tensors until the offloaded share reaches the
  fraction, so a large last tensor can overshoot (measured: 0.75 offloads everything on the dense
  proxy because the embedding comes last).
- Host per offloaded parameter: m and v (8 B, pageable) plus pinned fp32 copies of the parameter
  and its gradient (8 B), each pinned tensor rounded up to a power of two by PyTorch's caching host
  allocator; plus a fixed base per process. That is the steady state. The node's memory peaks above it
  inside the first optimizer step, by a measured 5.1 B per offloaded parameter; the host check uses that
  peak, since a host overflow is a SIGKILL.
- Activations per micro batch and layer from the tensors kept for backward (bf16), plus the logits
  (bf16 output and fp32 loss work), times the micro batches in flight on the first pipeline stage
  (1F1B keeps up to PP of them). Layer-level activation offload removes the offloaded layers but one;
  fine-grained offload removes the chosen modules' inputs.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from mbridge_offload.facts.dtypes import dtype_bytes
from mbridge_offload.facts.proc import proc_kib
from mbridge_offload.facts.units import GIB
from mbridge_offload.planning.cost_model import (H200_HOST_MEMORY_GBPS, H200_HOST_MEMORY_TOTAL_GBPS, HOST_BYTES_PER_OFFLOADED_PARAM,
                                   offload_time_lower_bound)
from mbridge_offload.facts.offload_bytes import traffic_of

BASE_GPU_BYTES = int(0.5 * GIB)  # CUDA context, NCCL and library workspaces outside the model
BASE_HOST_BYTES_PER_RANK = int(2.6 * GIB)  # measured RSS of a training process before offload
DEFAULT_MARGIN_GIB = 4.0  # allocator fragmentation and workspace the model does not count
# The node's used memory peaks inside the first optimizer step, above the steady state the rest of the
# host model counts. Measured on the H200 (docs/benchmarks/host-peak/): the 7-layer MoE proxy at fraction 1
# (4.98B parameters offloaded, overlap off) held 114.6 GiB of the node (above the 1.4 GiB in use before
# it started) for ~10 s of its first step, against 91.1 GiB planned between steps: 23.6 GiB more, 5.1 B
# per offloaded parameter, up to 22 GiB of it outside any process's RSS; the steps after held 94.2 GiB.
# The 8-layer proxy (5.61B, 101.9 GiB planned between steps, 128.5 GiB at this peak) was killed by the
# 125.8 GiB host in that step. Which allocation makes the transient is not identified, so this is a
# measured rate, applied with overlap on too (not measured there).
FIRST_STEP_HOST_BYTES_PER_OFFLOADED_PARAM = 5.1
# Host memory per offloading rank kept free beyond that peak: for what the measurements above do not
# cover (other processes, another stack or allocator); a host overflow is a SIGKILL, not an error message.
DEFAULT_HOST_MARGIN_GIB = 4.0
DEFAULT_HOST_LINK_GBPS = 50.0  # PCIe Gen5 x16, practical pinned copy rate per direction
HOST_MEMORY_GIVEN = "given (--host-memory-gib)"
HOST_MEMORY_AVAILABLE_NOW = "available on this node now (MemAvailable)"
AUTO_STEP = 0.05
AUTO_OVERRIDE = "optimizer.optimizer_offload_fraction=auto"  # resolved by the planner


@dataclass(frozen=True)
class Tensor:
    name: str
    numel: int
    kind: str  # "dense" (2-D, not embedding), "expert", "small" (1-D), "embedding"


@dataclass
class Plan:
    num_gpus: int
    fraction: float
    gpu_memory_gib: float
    host_memory_gib: float | None
    margin_gib: float
    host_margin_gib: float  # per offloading rank, counted in the host check
    params_per_rank: int
    optimizer_params_per_rank: int
    offloaded_params_per_rank: int
    weights_bytes_gpu: int
    grads_bytes_gpu: int
    optimizer_bytes_gpu: int
    state_bytes_gpu: int
    activation_bytes_gpu: int
    total_bytes_gpu: int
    offloaded_bytes_host_per_rank: int
    pinned_bytes_host_per_rank: int
    host_bytes_per_node: int  # steady state, between steps
    host_peak_bytes_per_node: int  # inside the first optimizer step: what the host check uses
    ranks_per_node: int
    transfer_bytes_per_step: int
    transfer_time_lower_bound_s: float
    host_link_gbps: float
    offload_time_lower_bound_s: float  # per step: the link or the node's host memory, whichever is slower
    offload_time_bound_by: str
    host_memory_gbps: float
    host_memory_total_gbps: float
    fits_gpu: bool
    fits_host: bool | None
    host_memory_source: str = HOST_MEMORY_GIVEN  # where host_memory_gib came from, for the messages
    # set by plan_with_recommendation when the host does not fit: the largest fraction (steps of 0.05)
    # whose peak fits it, and whether the GPU fits at that fraction (None: no fraction fits the host)
    host_fit_searched: bool = False
    host_fitting_fraction: float | None = None
    host_fitting_fraction_fits_gpu: bool | None = None
    recommendation: str = ""
    notes: list[str] = field(default_factory=list)
    stages: list[dict] = field(default_factory=list)  # per pipeline stage: params, state, activations, total

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _layers_per_stage(m, pp: int) -> list[int]:
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
    ep, etp = m.expert_model_parallel_size, m.expert_tensor_parallel_size or 1
    h, kv = m.hidden_size, m.kv_channels or m.hidden_size // m.num_attention_heads
    heads, groups = m.num_attention_heads, m.num_query_groups or m.num_attention_heads
    gated = 2 if m.gated_linear_unit else 1
    layers = _layers_per_stage(m, pp)[stage]
    vocab = m.vocab_size
    experts = m.num_moe_experts or 0
    dense, expert, small = [], [], []
    for layer in range(layers):
        dense.append(Tensor(f"l{layer}.qkv", (heads + 2 * groups) * kv * h // tp, "dense"))
        dense.append(Tensor(f"l{layer}.proj", heads * kv * h // tp, "dense"))
        small += [Tensor(f"l{layer}.ln1", h, "small"), Tensor(f"l{layer}.ln2", h, "small")]
        if m.qk_layernorm:
            small += [Tensor(f"l{layer}.q_ln", kv, "small"), Tensor(f"l{layer}.k_ln", kv, "small")]
        if experts:
            ffn = m.moe_ffn_hidden_size or m.ffn_hidden_size
            dense.append(Tensor(f"l{layer}.router", experts * h, "dense"))
            for e in range(experts // ep):
                expert.append(Tensor(f"l{layer}.e{e}.fc1", gated * ffn * h // etp, "expert"))
                expert.append(Tensor(f"l{layer}.e{e}.fc2", ffn * h // etp, "expert"))
            shared = getattr(m, "moe_shared_expert_intermediate_size", None)
            if shared:
                dense.append(Tensor(f"l{layer}.shared.fc1", gated * shared * h // tp, "dense"))
                dense.append(Tensor(f"l{layer}.shared.fc2", shared * h // tp, "dense"))
        else:
            dense.append(Tensor(f"l{layer}.fc1", gated * m.ffn_hidden_size * h // tp, "dense"))
            dense.append(Tensor(f"l{layer}.fc2", m.ffn_hidden_size * h // tp, "dense"))
    embeddings = []
    if stage == 0:
        embeddings.append(Tensor("embedding", vocab * h // tp, "embedding"))
    if stage == pp - 1:
        small.append(Tensor("final_ln", h, "small"))
        if not m.share_embeddings_and_output_weights or pp > 1:
            embeddings.append(Tensor("output", vocab * h // tp, "embedding"))
    return dense + expert + small + embeddings


def _pow2(nbytes: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(nbytes, 1))))


def _activation_bytes_per_layer(cfg) -> tuple[int, int, int]:
    """(bytes a layer keeps for backward per micro batch, of which fine-grained-offloadable, tokens)."""
    m = cfg.model
    tokens = m.seq_length * cfg.train.micro_batch_size // m.context_parallel_size
    tp = m.tensor_model_parallel_size
    h, kv = m.hidden_size, m.kv_channels or m.hidden_size // m.num_attention_heads
    heads, groups = m.num_attention_heads, m.num_query_groups or m.num_attention_heads
    sp = m.sequence_parallel and tp > 1
    # Kept for backward, elements per token: norm inputs/outputs and residuals (sharded by SP),
    # q/k/v and attention output (sharded by TP), MLP or routed-expert inputs and outputs.
    replicated = 5 * h  # ln1 in, qkv in, residual, ln2 in, fc1 in
    replicated = replicated / tp if sp else replicated
    attention = ((heads + 2 * groups) * kv + heads * kv) / tp
    offloadable = {}
    if m.num_moe_experts:
        ffn = m.moe_ffn_hidden_size or m.ffn_hidden_size
        topk = m.moe_router_topk
        offloadable["expert_fc1"] = topk * h
        offloadable["moe_act"] = topk * 2 * ffn
        mlp = offloadable["expert_fc1"] + offloadable["moe_act"] + topk * ffn + 2 * m.num_moe_experts
    else:
        gated = 2 if m.gated_linear_unit else 1
        mlp = (gated * m.ffn_hidden_size + m.ffn_hidden_size) / tp
    offloadable["core_attn"] = (heads + 2 * groups) * kv / tp
    offloadable["attn_proj"] = heads * kv / tp
    offloadable["qkv_linear"] = h / (tp if sp else 1)
    offloadable["attn_norm"] = h / (tp if sp else 1)
    offloadable["mlp_norm"] = h / (tp if sp else 1)
    per_token = replicated + attention + mlp
    chosen = 0.0
    if m.fine_grained_activation_offloading:
        chosen = sum(offloadable.get(name, 0) for name in (m.offload_modules or []))
        chosen *= m.activation_offload_fraction
    return int(2 * per_token * tokens), int(2 * chosen * tokens), tokens


def activation_bytes(cfg, stage: int | None = None) -> int:
    """Peak activation bytes of one rank of pipeline stage ``stage`` (None: the worst stage)."""
    m = cfg.model
    pp = m.pipeline_model_parallel_size
    if stage is None:
        return max(activation_bytes(cfg, s) for s in range(pp))
    per_layer, fine_grained, tokens = _activation_bytes_per_layer(cfg)
    layers = _layers_per_stage(m, pp)[stage]
    kept_layers = layers
    if m.cpu_offloading:
        # Offloaded layers leave the GPU; the one being copied stays until its copy ends.
        kept_layers = layers - max(0, m.cpu_offloading_num_layers - 1)
    layer_bytes = kept_layers * per_layer - layers * fine_grained
    in_flight = pp - stage  # 1F1B: stage s holds up to PP - s micro batches before its first backward
    # Logits on the last stage: bf16 output, fp32 softmax work and its gradient.
    logits = tokens * m.vocab_size // m.tensor_model_parallel_size * (2 + 4) if stage == pp - 1 else 0
    return int(layer_bytes * in_flight + logits)


def _offloaded(shards: list[tuple[Tensor, int]], fraction: float) -> list[tuple[Tensor, int]]:
    """HybridDeviceOptimizer's greedy split: whole tensors in order until the share is reached."""
    total = sum(n for _, n in shards)
    threshold = total * fraction
    done, out = 0, []
    for tensor, n in shards:
        if done < threshold:
            out.append((tensor, n))
            done += n
    return out


def plan(cfg, num_gpus: int, fraction: float | None = None, gpu_memory_gib: float = 80.0,
         host_memory_gib: float | None = None, margin_gib: float = DEFAULT_MARGIN_GIB,
         host_link_gbps: float = DEFAULT_HOST_LINK_GBPS, gpus_per_node: int | None = None,
         host_memory_gbps: float = H200_HOST_MEMORY_GBPS, host_margin_gib: float = DEFAULT_HOST_MARGIN_GIB,
         host_memory_total_gbps: float = H200_HOST_MEMORY_TOTAL_GBPS,
         host_memory_source: str = HOST_MEMORY_GIVEN) -> Plan:
    """Memory plan of ``cfg`` on ``num_gpus`` GPUs (``fraction`` defaults to the config's)."""
    m, opt = cfg.model, cfg.optimizer
    if fraction is None:
        fraction = opt.optimizer_offload_fraction if opt.optimizer_cpu_offload else 0.0
    tp, pp, cp = m.tensor_model_parallel_size, m.pipeline_model_parallel_size, m.context_parallel_size
    ep, etp = m.expert_model_parallel_size, m.expert_tensor_parallel_size or 1
    distributed = bool(opt.use_distributed_optimizer or cfg.ddp.use_distributed_optimizer)
    dp_cp = max(1, num_gpus // (tp * pp))  # dense optimizer-state shards (DP x CP)
    expert_dp = max(1, num_gpus // (pp * ep * etp))
    grad_bytes = 4 if getattr(cfg.ddp, "grad_reduce_in_fp32", True) else 2
    # HybridDeviceOptimizer ignores the precision-aware dtypes (rule optimizer-offload/precision-aware-ignored)
    precision_aware = opt.use_precision_aware_optimizer and not (opt.optimizer_cpu_offload or fraction > 0)
    main_bytes = dtype_bytes(opt.main_params_dtype) if precision_aware else 4
    moment_bytes = dtype_bytes(opt.exp_avg_dtype) + dtype_bytes(opt.exp_avg_sq_dtype) if precision_aware else 8

    stages = []
    for stage in range(pp):
        tensors = stage_tensors(cfg, stage)
        params = sum(t.numel for t in tensors)
        shards = [(t, math.ceil(t.numel / ((expert_dp if t.kind == "expert" else dp_cp) if distributed else 1)))
                  for t in tensors]
        offloaded = _offloaded(shards, fraction) if fraction > 0 else []
        shard_params = sum(n for _, n in shards)
        off_params = sum(n for _, n in offloaded)
        optimizer = shard_params * main_bytes + (shard_params - off_params) * moment_bytes
        state = 2 * params + grad_bytes * params + optimizer
        activations = activation_bytes(cfg, stage)
        pinned = sum(2 * _pow2(4 * n) for _, n in offloaded)  # fp32 parameter and gradient copies
        stages.append({"stage": stage, "params": params, "shard_params": shard_params, "off_params": off_params,
                       "optimizer": optimizer, "state_bytes_gpu": state, "activation_bytes_gpu": activations,
                       "total_bytes_gpu": state + activations + BASE_GPU_BYTES, "pinned": pinned})
    worst = max(stages, key=lambda s: s["total_bytes_gpu"])
    params, shard_params, off_params = worst["params"], worst["shard_params"], worst["off_params"]
    state, activations, pinned = worst["state_bytes_gpu"], worst["activation_bytes_gpu"], worst["pinned"]
    host_off = off_params * moment_bytes + pinned
    ranks_per_node = gpus_per_node or min(num_gpus, 8)
    if m.cpu_offloading:
        per_layer, _, _ = _activation_bytes_per_layer(cfg)
        pinned_act = per_layer * m.cpu_offloading_num_layers
        host_off += pinned_act
        pinned += pinned_act
    host_node = ranks_per_node * (host_off + BASE_HOST_BYTES_PER_RANK)
    host_peak = host_node + ranks_per_node * int(FIRST_STEP_HOST_BYTES_PER_OFFLOADED_PARAM * off_params)
    total = worst["total_bytes_gpu"]
    transfer = 2 * 4 * off_params  # fp32 gradients down, fp32 parameters up
    # The speed model of the offload floor (mbridge_offload/planning/cost_model.py): links per rank, host memory per node.
    bound = offload_time_lower_bound(traffic_of(off_params), host_link_gbps, host_link_gbps, host_memory_gbps,
                                     ranks_per_node, host_memory_total_gbps)
    lower_bound = max(bound["d2h_s"], bound["h2d_s"])  # both directions run at once
    fits_gpu = total + margin_gib * GIB <= gpu_memory_gib * GIB
    host_margin = host_margin_gib if pinned else 0.0  # the unplanned memory is pinned memory of offload
    fits_host = (None if host_memory_gib is None else
                 host_peak + ranks_per_node * host_margin * GIB <= host_memory_gib * GIB)
    shown = ("stage", "params", "state_bytes_gpu", "activation_bytes_gpu", "total_bytes_gpu")
    result = Plan(num_gpus, fraction, gpu_memory_gib, host_memory_gib, margin_gib, host_margin, params, shard_params,
                  off_params, 2 * params, grad_bytes * params, worst["optimizer"], state, activations, total,
                  host_off, pinned, host_node, host_peak, ranks_per_node, transfer, lower_bound, host_link_gbps,
                  bound["lower_bound_s"], bound["bound_by"], host_memory_gbps, host_memory_total_gbps, fits_gpu,
                  fits_host, host_memory_source, stages=[{k: s[k] for k in shown} for s in stages])
    if not distributed and fraction > 0:
        result.notes.append("optimizer offload needs the distributed optimizer: the plan assumes it is on")
    return result


def smallest_fitting_fraction(cfg, num_gpus: int, **kwargs) -> tuple[float | None, Plan]:
    """The smallest fraction (steps of 0.05) whose plan fits the GPU with the margin."""
    steps = int(round(1 / AUTO_STEP))
    last = None
    for i in range(steps + 1):
        fraction = round(i * AUTO_STEP, 2)
        last = plan(cfg, num_gpus, fraction=fraction, **kwargs)
        if last.fits_gpu:
            return fraction, last
    return None, last


def largest_host_fitting_fraction(cfg, num_gpus: int, **kwargs) -> tuple[float | None, Plan | None]:
    """The largest fraction (steps of 0.05) whose host peak fits the node, with its plan."""
    steps = int(round(1 / AUTO_STEP))
    for i in range(steps, -1, -1):
        candidate = plan(cfg, num_gpus, fraction=round(i * AUTO_STEP, 2), **kwargs)
        if candidate.fits_host is not False:
            return candidate.fraction, candidate
    return None, None


def what_would_fit(cfg, num_gpus: int, **kwargs) -> list[str]:
    """Changes that make a plan fit when no offload fraction does (each checked with the planner)."""
    import copy

    from mbridge_offload.facts.config_tree import set_path

    def what_if(deltas: dict):  # a changed copy, not logged: nothing is applied to the user's config
        changed = copy.deepcopy(cfg)
        for key, value in deltas.items():
            set_path(changed, key, value)
        return changed

    m = cfg.model
    options = []
    tries = [
        (f"{num_gpus * 2} GPUs (--num-gpus {num_gpus * 2}, twice the data parallelism)", cfg, num_gpus * 2),
    ]
    if m.num_layers % (m.pipeline_model_parallel_size * 2) == 0:
        tries.append((f"model.pipeline_model_parallel_size={m.pipeline_model_parallel_size * 2} "
                      f"with --num-gpus {num_gpus * 2}",
                      what_if({"model.pipeline_model_parallel_size": m.pipeline_model_parallel_size * 2}),
                      num_gpus * 2))
    if cfg.train.micro_batch_size > 1:
        tries.append(("train.micro_batch_size=1", what_if({"train.micro_batch_size": 1}),
                      num_gpus))
    if m.pipeline_model_parallel_size == 1 and not m.cpu_offloading and not m.fine_grained_activation_offloading:
        tries.append((f"activation offload: model.cpu_offloading=True model.cpu_offloading_num_layers={m.num_layers - 1}",
                      what_if({"model.cpu_offloading": True, "model.cpu_offloading_num_layers": m.num_layers - 1}),
                      num_gpus))
    for text, candidate, gpus in tries:
        fraction, _ = smallest_fitting_fraction(candidate, gpus, **kwargs)
        if fraction is not None:
            options.append(f"{text} (then fits at fraction {fraction:g})")
    return options


def recommend(cfg, num_gpus: int, **kwargs) -> str:
    fraction, fitting = smallest_fitting_fraction(cfg, num_gpus, **kwargs)
    if fraction is None:
        options = what_would_fit(cfg, num_gpus, **kwargs)
        return ("does not fit even with all optimizer states on the CPU"
                + (": try " + "; or ".join(options) if options else ""))
    if fraction == 0.0:
        return "fits without optimizer offload"
    if fitting.fits_host is False:
        return (f"the GPU needs optimizer offload fraction {fraction:g} or more, and the host holds less "
                "(see memory/host-fit)")
    return (f"smallest optimizer offload fraction that fits: {fraction:g} "
            f"({fitting.total_bytes_gpu / GIB:.1f} GiB of {fitting.gpu_memory_gib:g} GiB with "
            f"{fitting.margin_gib:g} GiB margin)")


def plan_with_recommendation(cfg, num_gpus: int, fraction: float | None = None, **kwargs) -> Plan:
    """plan() plus its recommendation (the smallest fitting fraction, or what would fit)."""
    result = plan(cfg, num_gpus, fraction=fraction, **kwargs)
    result.recommendation = recommend(cfg, num_gpus, **kwargs)
    if result.fits_host is False:
        largest, at_largest = largest_host_fitting_fraction(cfg, num_gpus, **kwargs)
        result.host_fit_searched = True
        result.host_fitting_fraction = largest
        result.host_fitting_fraction_fits_gpu = None if at_largest is None else at_largest.fits_gpu
    return result


def format_plan(p: Plan) -> str:
    def g(n: int) -> str:
        return f"{n / GIB:.2f} GiB"

    rows = [
        ("optimizer offload fraction", f"{p.fraction:g} ({p.offloaded_params_per_rank / 1e9:.3f}B of "
                                       f"{p.optimizer_params_per_rank / 1e9:.3f}B sharded parameters offloaded)"),
        ("parameters on the worst rank", f"{p.params_per_rank / 1e9:.3f}B"),
        ("GPU: weights + grads + optimizer", f"{g(p.weights_bytes_gpu)} + {g(p.grads_bytes_gpu)} + "
                                             f"{g(p.optimizer_bytes_gpu)} = {g(p.state_bytes_gpu)}"),
        ("GPU: activations (peak)", g(p.activation_bytes_gpu)),
        ("GPU: total (+0.5 GiB context)", f"{g(p.total_bytes_gpu)} of {p.gpu_memory_gib:g} GiB, margin "
                                          f"{p.margin_gib:g} GiB: {'fits' if p.fits_gpu else 'DOES NOT FIT'}"),
        ("host: offloaded per rank", f"{g(p.offloaded_bytes_host_per_rank)} ({g(p.pinned_bytes_host_per_rank)} pinned)"),
        ("host: per node", f"{g(p.host_bytes_per_node)} between steps, {g(p.host_peak_bytes_per_node)} at the "
                           f"first optimizer step's peak, for {p.ranks_per_node} rank(s)"
                           + ("" if p.fits_host is None else
                              f" of {p.host_memory_gib:g} GiB, margin {p.host_margin_gib:g} GiB per rank: "
                              f"{'fits' if p.fits_host else 'DOES NOT FIT'}")),
        ("host link per step", f"{p.transfer_bytes_per_step / 1e9:.2f} GB, >= {p.transfer_time_lower_bound_s:.3f} s "
                               f"at {p.host_link_gbps:g} GB/s"),
        ("offload time per step", f">= {p.offload_time_lower_bound_s:.3f} s, bound by {p.offload_time_bound_by} "
                                  f"({HOST_BYTES_PER_OFFLOADED_PARAM} B of CPU Adam per offloaded parameter x "
                                  f"{p.ranks_per_node} rank(s) through the cores' {p.host_memory_gbps:g} GB/s of host "
                                  f"memory, and with the copies through {p.host_memory_total_gbps:g} GB/s in all; "
                                  f"copies at {p.host_link_gbps:g} GB/s per link)"),
        ("recommendation", p.recommendation),
    ]
    if len(p.stages) > 1:
        rows.insert(5, ("GPU per pipeline stage", ", ".join(
            f"stage {s['stage']}: {s['total_bytes_gpu'] / GIB:.1f} GiB" for s in p.stages)))
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"  {name:<{width}}  {value}" for name, value in rows + [("note", n) for n in p.notes])


def host_memory_available_gib() -> float | None:
    """MemAvailable of this machine (the node a launch runs on), or None where unknown."""
    kib = proc_kib("MemAvailable", "/proc/meminfo")
    return None if kib is None else kib * 1024 / GIB


def gpu_memory_gib_here() -> float | None:
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_properties(0).total_memory / GIB
    except Exception:  # noqa: BLE001  (no usable CUDA: the caller's default applies)
        pass
    return None


def add_plan_arguments(parser) -> None:
    """The planner's options, shared by plan_offload.py and run_recipe.py."""
    group = parser.add_argument_group("memory plan")
    group.add_argument("--gpu-memory-gib", type=float, metavar="G",
                       help="GPU memory per device (default: this GPU's, else 80 for an H100 80GB)")
    group.add_argument("--host-memory-gib", type=float, metavar="H",
                       help="host memory per node (default: not checked for a plan or dry run; "
                            "this machine's MemAvailable when launching)")
    group.add_argument("--gpus-per-node", type=int, metavar="N", help="ranks per node (default min(GPUs, 8))")
    group.add_argument("--margin-gib", type=float, default=DEFAULT_MARGIN_GIB, metavar="M",
                       help=f"GPU memory kept free for workspace and fragmentation (default {DEFAULT_MARGIN_GIB:g})")
    group.add_argument("--host-margin-gib", type=float, default=DEFAULT_HOST_MARGIN_GIB, metavar="M",
                       help="host memory kept free per offloading rank beyond the planned peak of the first optimizer "
                            f"step, for what the H200 measurements do not cover (default {DEFAULT_HOST_MARGIN_GIB:g})")
    group.add_argument("--host-link-gbps", type=float, default=DEFAULT_HOST_LINK_GBPS, metavar="B",
                       help=f"host<->GPU bandwidth per direction in GB/s (default {DEFAULT_HOST_LINK_GBPS:g}, PCIe Gen5 x16)")
    group.add_argument("--host-memory-gbps", type=float, default=H200_HOST_MEMORY_GBPS, metavar="B",
                       help=f"host memory bandwidth per node in GB/s that the cores reach, which the CPU Adam of all "
                            f"its ranks shares (default {H200_HOST_MEMORY_GBPS:g}, the project's 16-core H200 host; "
                            "scripts/measure_host.py measures yours)")
    group.add_argument("--host-memory-total-gbps", type=float, default=H200_HOST_MEMORY_TOTAL_GBPS, metavar="B",
                       help="host memory bandwidth per node in GB/s for all traffic, the copies' DMA with the cores' "
                            f"work (default {H200_HOST_MEMORY_TOTAL_GBPS:g}, the best measured on the H200 host; "
                            "scripts/measure_host.py measures yours as host_memory_total_gbps)")
    group.add_argument("--step-time-budget-s", type=float, metavar="S",
                       help="refuse when the offload work alone (copies and CPU Adam) needs longer than S seconds "
                            "per step")


def plan_kwargs(args, launching: bool = False) -> dict[str, Any]:
    """Planner options from the command line. The host is only checked against this machine's
    memory when launching here; a plan for another node checks it when --host-memory-gib is given."""
    gpu = args.gpu_memory_gib or gpu_memory_gib_here() or 80.0
    host, source = args.host_memory_gib, HOST_MEMORY_GIVEN
    if host is None and launching:
        host, source = host_memory_available_gib(), HOST_MEMORY_AVAILABLE_NOW
    return dict(gpu_memory_gib=gpu, host_memory_gib=host, host_memory_source=source, margin_gib=args.margin_gib,
                host_margin_gib=args.host_margin_gib, host_memory_total_gbps=args.host_memory_total_gbps,
                host_link_gbps=args.host_link_gbps, gpus_per_node=args.gpus_per_node,
                host_memory_gbps=args.host_memory_gbps)


def _host_fit_fix(p: Plan) -> str:
    more = ("fewer ranks per node or more nodes; free host memory if other processes hold it "
            "(--host-margin-gib to change the margin)")
    largest = p.host_fitting_fraction
    if not p.host_fit_searched:  # a plan made without plan_with_recommendation's search
        return f"a smaller optimizer.optimizer_offload_fraction, {more}"
    if largest is None:
        return f"not even without optimizer offload does this host fit: {more}, or less activation offload"
    if p.host_fitting_fraction_fits_gpu:
        return (f"optimizer.optimizer_offload_fraction={largest:g} (the largest that fits this host; the GPU "
                f"fits too), or {more}")
    return (f"no fraction fits both: this host holds at most optimizer.optimizer_offload_fraction={largest:g} and "
            f"the GPU needs more; {more}, or more GPUs (less on each)")


def plan_problems(p: Plan, step_time_budget_s: float | None) -> list[tuple[str, str, str, str, str, str]]:
    """(rule id, key, value, rule, fix, severity) for what the plan refuses: host overflow and the
    offload-time budget are errors; a predicted GPU overflow is a warning (a prediction, within ~10% of measurements)."""
    problems = []
    if p.fits_host is False:
        problems.append(("memory/host-fit", "optimizer.optimizer_offload_fraction",
                         f"{p.fraction:g} ({p.host_peak_bytes_per_node / GIB:.1f} GiB per node at the first optimizer "
                         f"step's peak, {p.host_bytes_per_node / GIB:.1f} GiB between steps)",
                         f"the node's peak host memory plus {p.host_margin_gib:g} GiB margin per rank must fit the "
                         f"{p.host_memory_gib:.1f} GiB {p.host_memory_source} (the kernel kills the job otherwise)",
                         _host_fit_fix(p), "error"))
    if step_time_budget_s is not None and p.offload_time_lower_bound_s > step_time_budget_s:
        problems.append(("memory/offload-time-budget", "optimizer.optimizer_offload_fraction",
                         f"{p.fraction:g} ({p.offloaded_params_per_rank / 1e9:.3f}B parameters offloaded per rank)",
                         f"the offload work needs at least {p.offload_time_lower_bound_s:.3f} s per step, bound by "
                         f"{p.offload_time_bound_by} ({p.host_link_gbps:g} GB/s link, {p.host_memory_gbps:g} GB/s host "
                         f"memory for {p.ranks_per_node} rank(s)), over the {step_time_budget_s:g} s budget",
                         "a smaller optimizer.optimizer_offload_fraction, fewer ranks per node, or a larger "
                         "--step-time-budget-s", "error"))
    if not p.fits_gpu:
        problems.append(("memory/gpu-fit", "optimizer.optimizer_offload_fraction",
                         f"{p.fraction:g} ({p.total_bytes_gpu / GIB:.1f} GiB predicted)",
                         f"predicted GPU memory plus {p.margin_gib:g} GiB margin exceeds {p.gpu_memory_gib:g} GiB",
                         p.recommendation or AUTO_OVERRIDE, "warning"))
    return problems
