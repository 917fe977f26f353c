"""The rule table: every constraint of the three offload mechanisms, the parallelism arithmetic they
depend on, and the environment they need. One source of truth: the validator's errors, the override
layer's range checks, the README's table (``run_recipe.py --rules``) all read this list.

A rule names the dotted key it is about, states the rule in words, and computes a fix the user can
paste as an override. This module imports nothing heavy; rules only read attributes of a config.
"""

from __future__ import annotations

import importlib.util
import math
import os
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Callable, Mapping

from mbridge_offload.facts.config_tree import get_path, show
from mbridge_offload.facts.dtypes import dtype_bytes  # the planner's bytes per element: one notion of "below fp32"

# Mechanism names, as shown to users (the README's offload table groups by these).
OPTIMIZER = "optimizer offload"
ACTIVATION = "activation offload (layer-level)"
FINE_GRAINED = "fine-grained activation offload"
PARALLELISM = "parallelism"
ENVIRONMENT = "environment"
MECHANISMS = (OPTIMIZER, ACTIVATION, FINE_GRAINED, PARALLELISM, ENVIRONMENT)

# Megatron Core's accepted fine-grained offload modules (TransformerConfig.__post_init__).
FINE_GRAINED_MODULES = ("attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm",
                        "expert_fc1", "moe_act", "fused_group_mlp")
MOE_MODULES = frozenset({"expert_fc1", "moe_act", "fused_group_mlp"})


def module_available(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def te_version() -> str | None:
    """Installed Transformer Engine version, or None when it cannot be imported."""
    if not module_available("transformer_engine"):
        return None
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("transformer-engine", "transformer_engine"):
        try:
            return version(dist)
        except PackageNotFoundError:
            continue
    return "unknown"


def _version_tuple(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


@dataclass
class Context:
    """What rules read: the config, the GPU count it is validated for, the process environment."""

    cfg: Any
    num_gpus: int
    environ: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    has_module: Callable[[str], bool] = module_available
    te_version: str | None = "detect"  # "detect": look at what is installed; None: not installed

    def get(self, key: str) -> Any:
        return get_path(self.cfg, key)

    @property
    def model(self) -> Any:
        return self.cfg.model

    @property
    def opt(self) -> Any:
        return self.cfg.optimizer

    @property
    def model_parallel(self) -> int:
        m = self.model
        return m.tensor_model_parallel_size * m.pipeline_model_parallel_size * m.context_parallel_size

    @property
    def dp(self) -> int | None:
        """Data-parallel size, or None when the GPU count does not split into the model grid."""
        if self.num_gpus % self.model_parallel:
            return None
        return self.num_gpus // self.model_parallel

    @property
    def num_experts(self) -> int:
        return self.model.num_moe_experts or 0

    def env(self, name: str) -> str | None:
        """The value a launched run will see: the shell wins over the recipe's ``env_vars``."""
        if name in self.environ:
            return self.environ[name]
        value = (self.cfg.env_vars or {}).get(name)
        return None if value is None else str(value)

    @cached_property
    def installed_te(self) -> str | None:
        return te_version() if self.te_version == "detect" else self.te_version


@dataclass(frozen=True)
class Rule:
    """One constraint. ``holds`` is only asked when ``applies`` is true."""

    id: str
    mechanism: str
    key: str
    text: str
    applies: Callable[[Context], bool]
    holds: Callable[[Context], bool]
    fix: Callable[[Context], str]
    severity: str = "error"  # "error" blocks a launch, "warning" is reported only
    observed: Callable[[Context], str] | None = None  # the value to show, when not the key's own
    range_check: bool = False  # also checked by the override layer when the key is overridden
    fix_text: str = ""  # the fix in the docs table, where ``fix`` depends on the config

    def value(self, ctx: Context) -> str:
        if self.observed is not None:
            return self.observed(ctx)
        return show(ctx.get(self.key))


def _always(ctx: Context) -> bool:
    return True


def _opt_offload(ctx: Context) -> bool:
    return bool(ctx.opt.optimizer_cpu_offload)


PRECISION_AWARE_DTYPES = ("exp_avg_dtype", "exp_avg_sq_dtype", "main_params_dtype")


def _dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


def _lower_precision_states(ctx: Context) -> bool:
    return any(dtype_bytes(getattr(ctx.opt, name)) < 4 for name in PRECISION_AWARE_DTYPES)


def _act_offload(ctx: Context) -> bool:
    return bool(ctx.model.cpu_offloading)


def _fine_grained(ctx: Context) -> bool:
    return bool(ctx.model.fine_grained_activation_offloading)


def _modules(ctx: Context) -> set[str]:
    return set(ctx.model.offload_modules or [])


def _fix(text: str) -> Callable[[Context], str]:
    return lambda ctx: text


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _nearest(candidates: list[int], target: int) -> int:
    return min(candidates, key=lambda c: (abs(c - target), c))


def _grid(ctx: Context) -> str:
    m = ctx.model
    return (f"{m.tensor_model_parallel_size} (TP{m.tensor_model_parallel_size} x "
            f"PP{m.pipeline_model_parallel_size} x CP{m.context_parallel_size} = {ctx.model_parallel} "
            f"GPUs per model replica; {ctx.num_gpus} GPU{'s' if ctx.num_gpus != 1 else ''} given)")


def _fix_world(ctx: Context) -> str:
    mp = ctx.model_parallel
    return (f"--num-gpus {mp * max(1, math.ceil(ctx.num_gpus / mp))}  (a multiple of {mp}), "
            "or smaller model.tensor_model_parallel_size / pipeline / context parallel sizes")


def _uneven_pipeline(ctx: Context) -> bool:
    m = ctx.model
    return any(getattr(m, name, None) for name in (
        "num_layers_in_first_pipeline_stage", "num_layers_in_last_pipeline_stage",
        "pipeline_model_parallel_layout", "account_for_embedding_in_pipeline_split",
        "account_for_loss_in_pipeline_split"))


def _fix_pp(ctx: Context) -> str:
    pp = _nearest(_divisors(ctx.model.num_layers), ctx.model.pipeline_model_parallel_size)
    return f"model.pipeline_model_parallel_size={pp}"


def _batch_unit(ctx: Context) -> int:
    return ctx.cfg.train.micro_batch_size * (ctx.dp or 1)


def _fix_global_batch(ctx: Context) -> str:
    unit = _batch_unit(ctx)
    gbs = ctx.cfg.train.global_batch_size
    return f"train.global_batch_size={max(unit, round(gbs / unit) * unit)}"


def _fix_ep(ctx: Context) -> str:
    decoder_ranks = ctx.num_gpus // ctx.model.pipeline_model_parallel_size
    etp = ctx.model.expert_tensor_parallel_size
    options = [d for d in _divisors(ctx.num_experts or 1)
               if decoder_ranks % (d * etp) == 0] or [1]
    return f"model.expert_model_parallel_size={_nearest(options, ctx.model.expert_model_parallel_size)}"


def _fix_tp_heads(ctx: Context) -> str:
    m = ctx.model
    groups = m.num_query_groups or m.num_attention_heads
    options = [d for d in _divisors(m.num_attention_heads) if groups % d == 0]
    return f"model.tensor_model_parallel_size={_nearest(options, m.tensor_model_parallel_size)}"


def _nvte_v1_needed(ctx: Context) -> bool:
    te = ctx.installed_te
    return _fine_grained(ctx) and te not in (None, "unknown") and _version_tuple(te) >= (2, 10, 0)


def _resiliency_features(ctx: Context) -> list[str]:
    cfg = ctx.cfg
    used = []
    if cfg.ft is not None:
        used.append("ft")
    if cfg.nvrx_straggler is not None:
        used.append("nvrx_straggler")
    if cfg.inprocess_restart is not None and getattr(cfg.inprocess_restart, "enabled", True):
        used.append("inprocess_restart")
    if getattr(cfg.checkpoint, "non_persistent_ckpt_type", None) == "local":
        used.append("checkpoint.non_persistent_ckpt_type=local")
    return used


RULES: tuple[Rule, ...] = (
    # ---------------------------------------------------------------- optimizer offload
    Rule("optimizer-offload/fraction-range", OPTIMIZER, "optimizer.optimizer_offload_fraction",
         "must be a number from 0 to 1: the share of optimizer states (and their Adam step) moved to the CPU",
         _always, lambda c: 0.0 <= c.opt.optimizer_offload_fraction <= 1.0,
         _fix("optimizer.optimizer_offload_fraction=0.5"), range_check=True),
    Rule("optimizer-offload/distributed-optimizer", OPTIMIZER, "optimizer.use_distributed_optimizer",
         "optimizer offload needs the distributed optimizer (HybridDeviceOptimizer works on its shard)",
         _opt_offload,
         lambda c: bool(c.opt.use_distributed_optimizer or c.cfg.ddp.use_distributed_optimizer),
         _fix("optimizer.use_distributed_optimizer=True ddp.use_distributed_optimizer=True")),
    Rule("optimizer-offload/optimizer-kind", OPTIMIZER, "optimizer.optimizer",
         "optimizer offload supports only 'adam' and 'sgd' (CPU twins exist for these two)",
         _opt_offload, lambda c: c.opt.optimizer in ("adam", "sgd"), _fix("optimizer.optimizer=adam")),
    Rule("optimizer-offload/decoupled-weight-decay", OPTIMIZER, "optimizer.decoupled_weight_decay",
         "optimizer offload supports AdamW-style decoupled weight decay only",
         _opt_offload, lambda c: bool(c.opt.decoupled_weight_decay),
         _fix("optimizer.decoupled_weight_decay=True")),
    Rule("optimizer-offload/fraction-zero", OPTIMIZER, "optimizer.optimizer_offload_fraction",
         "with optimizer offload on and fraction 0 nothing is offloaded, yet the hybrid optimizer runs",
         _opt_offload, lambda c: c.opt.optimizer_offload_fraction > 0.0,
         _fix("optimizer.optimizer_offload_fraction=0.5  (or optimizer.optimizer_cpu_offload=False)"),
         severity="warning"),
    Rule("optimizer-offload/fraction-ignored", OPTIMIZER, "optimizer.optimizer_cpu_offload",
         "optimizer_offload_fraction > 0 has no effect while optimizer_cpu_offload is False",
         lambda c: not _opt_offload(c) and c.opt.optimizer_offload_fraction > 0.0, lambda c: False,
         _fix("optimizer.optimizer_cpu_offload=True  (or optimizer.optimizer_offload_fraction=0)"),
         severity="warning"),
    Rule("optimizer-offload/overlap-ignored", OPTIMIZER, "optimizer.overlap_cpu_optimizer_d2h_h2d",
         "D2H/H2D overlap has no effect while optimizer_cpu_offload is False",
         lambda c: not _opt_offload(c) and bool(c.opt.overlap_cpu_optimizer_d2h_h2d), lambda c: False,
         _fix("optimizer.optimizer_cpu_offload=True  (or optimizer.overlap_cpu_optimizer_d2h_h2d=False)"),
         severity="warning"),
    Rule("optimizer-offload/precision-aware-ignored", OPTIMIZER, "optimizer.use_precision_aware_optimizer",
         "with optimizer offload, lower-precision Adam states and master parameters are not used: Megatron Core "
         "builds HybridDeviceOptimizer without exp_avg_dtype / exp_avg_sq_dtype / main_params_dtype (torch AdamW "
         "on the CPU, fused Adam on the GPU, fp32 updates), so they save no memory; the planner counts fp32",
         lambda c: _opt_offload(c) and bool(c.opt.use_precision_aware_optimizer),
         lambda c: not _lower_precision_states(c),
         _fix("optimizer.exp_avg_dtype=float32 optimizer.exp_avg_sq_dtype=float32 optimizer.main_params_dtype=float32  "
              "(or optimizer.optimizer_cpu_offload=False to keep the lower-precision states on the GPU)"),
         observed=lambda c: ", ".join(f"{name}={_dtype_name(getattr(c.opt, name))}" for name in PRECISION_AWARE_DTYPES),
         severity="warning"),
    # ---------------------------------------------------------------- activation offload (layer-level)
    Rule("activation-offload/num-layers-range", ACTIVATION, "model.cpu_offloading_num_layers",
         "must satisfy 0 <= cpu_offloading_num_layers < model.num_layers",
         _always, lambda c: 0 <= c.model.cpu_offloading_num_layers < c.model.num_layers,
         lambda c: f"model.cpu_offloading_num_layers={max(0, min(c.model.cpu_offloading_num_layers, c.model.num_layers - 1))}",
         observed=lambda c: f"{c.model.cpu_offloading_num_layers} (model.num_layers={c.model.num_layers})",
         range_check=True, fix_text="model.cpu_offloading_num_layers=<n below model.num_layers>"),
    Rule("activation-offload/pipeline-parallel", ACTIVATION, "model.pipeline_model_parallel_size",
         "layer-level activation offload needs pipeline parallel size 1",
         _act_offload, lambda c: c.model.pipeline_model_parallel_size == 1,
         _fix("model.pipeline_model_parallel_size=1  (or keep PP and use fine-grained offload: "
              "model.cpu_offloading=False model.fine_grained_activation_offloading=True "
              "model.offload_modules=[expert_fc1,moe_act])")),
    Rule("activation-offload/recompute", ACTIVATION, "model.recompute_granularity",
         "layer-level activation offload cannot be combined with activation recomputation",
         _act_offload, lambda c: c.model.recompute_granularity is None,
         _fix("model.recompute_granularity=null model.recompute_method=null model.recompute_num_layers=null")),
    Rule("activation-offload/cuda-graphs", ACTIVATION, "model.cuda_graph_impl",
         "layer-level activation offload cannot run inside CUDA graphs",
         _act_offload, lambda c: c.model.cuda_graph_impl == "none", _fix("model.cuda_graph_impl=none")),
    Rule("activation-offload/not-with-fine-grained", ACTIVATION, "model.fine_grained_activation_offloading",
         "layer-level and fine-grained activation offload are mutually exclusive",
         _act_offload, lambda c: not _fine_grained(c),
         _fix("model.fine_grained_activation_offloading=False  (or model.cpu_offloading=False)")),
    Rule("activation-offload/offloads-something", ACTIVATION, "model.cpu_offloading_activations",
         "with cpu_offloading on, at least one of cpu_offloading_activations / cpu_offloading_weights must be True",
         _act_offload, lambda c: bool(c.model.cpu_offloading_activations or c.model.cpu_offloading_weights),
         _fix("model.cpu_offloading_activations=True")),
    Rule("activation-offload/transformer-engine", ACTIVATION, "model.transformer_impl",
         "layer-level activation offload uses Transformer Engine's offload context (transformer_impl=transformer_engine)",
         _act_offload, lambda c: c.model.transformer_impl == "transformer_engine",
         _fix("model.transformer_impl=transformer_engine")),
    Rule("activation-offload/paged-stash", ACTIVATION, "model.moe_paged_stash",
         "layer-level activation offload cannot be combined with moe_paged_stash",
         _act_offload, lambda c: not getattr(c.model, "moe_paged_stash", False), _fix("model.moe_paged_stash=False")),
    # ---------------------------------------------------------------- fine-grained activation offload
    Rule("fine-grained/modules-known", FINE_GRAINED, "model.offload_modules",
         "each module must be one of " + ", ".join(FINE_GRAINED_MODULES),
         _always, lambda c: _modules(c) <= set(FINE_GRAINED_MODULES),
         lambda c: "model.offload_modules=[" + ",".join(sorted(_modules(c) & set(FINE_GRAINED_MODULES)) or ["expert_fc1", "moe_act"]) + "]",
         range_check=True, fix_text="model.offload_modules=[expert_fc1,moe_act]"),
    Rule("fine-grained/fraction-range", FINE_GRAINED, "model.activation_offload_fraction",
         "must be a number from 0 to 1: the share of eligible activations offloaded",
         _always, lambda c: 0.0 <= c.model.activation_offload_fraction <= 1.0,
         _fix("model.activation_offload_fraction=1.0"), range_check=True),
    Rule("fine-grained/min-tensor-size", FINE_GRAINED, "model.min_offloaded_tensor_size",
         "must be >= 0 (bytes; smaller tensors stay on the GPU)",
         _always, lambda c: c.model.min_offloaded_tensor_size >= 0,
         _fix("model.min_offloaded_tensor_size=1048576"), range_check=True),
    Rule("fine-grained/pp-balance", FINE_GRAINED, "model.delta_offload_bytes_across_pp_ranks",
         "must be >= 0 (bytes)", _always, lambda c: c.model.delta_offload_bytes_across_pp_ranks >= 0,
         _fix("model.delta_offload_bytes_across_pp_ranks=0"), range_check=True),
    Rule("fine-grained/modules-given", FINE_GRAINED, "model.offload_modules",
         "fine-grained offload needs at least one module to offload",
         _fine_grained, lambda c: bool(_modules(c)), _fix("model.offload_modules=[expert_fc1,moe_act]")),
    Rule("fine-grained/transformer-engine", FINE_GRAINED, "model.transformer_impl",
         "fine-grained activation offload needs transformer_impl=transformer_engine",
         _fine_grained, lambda c: c.model.transformer_impl == "transformer_engine",
         _fix("model.transformer_impl=transformer_engine")),
    Rule("fine-grained/attn-proj-needs-core-attn", FINE_GRAINED, "model.offload_modules",
         "attn_proj can only be offloaded together with core_attn (its input is core_attn's output)",
         lambda c: _fine_grained(c) and "attn_proj" in _modules(c), lambda c: "core_attn" in _modules(c),
         lambda c: "model.offload_modules=[" + ",".join(sorted(_modules(c) | {"core_attn"})) + "]",
         fix_text="add core_attn to model.offload_modules"),
    Rule("fine-grained/moe-modules-need-experts", FINE_GRAINED, "model.offload_modules",
         "expert_fc1, moe_act and fused_group_mlp exist only in MoE models (model.num_moe_experts set)",
         lambda c: _fine_grained(c) and bool(_modules(c) & MOE_MODULES), lambda c: c.num_experts > 0,
         lambda c: "model.offload_modules=[" + ",".join(sorted(_modules(c) - MOE_MODULES) or ["core_attn"]) + "]",
         fix_text="offload dense modules instead, e.g. model.offload_modules=[core_attn]"),
    Rule("fine-grained/fused-group-mlp", FINE_GRAINED, "model.offload_modules",
         "fused_group_mlp needs use_transformer_engine_op_fuser and excludes expert_fc1 / moe_act",
         lambda c: _fine_grained(c) and "fused_group_mlp" in _modules(c),
         lambda c: bool(getattr(c.model, "use_transformer_engine_op_fuser", False))
         and not ({"expert_fc1", "moe_act"} & _modules(c)),
         _fix("model.offload_modules=[expert_fc1,moe_act]  (or model.use_transformer_engine_op_fuser=True "
              "with model.offload_modules=[fused_group_mlp])")),
    Rule("fine-grained/not-inside-moe-recompute", FINE_GRAINED, "model.recompute_modules",
         "MoE-internal modules cannot be offloaded while selective recompute wraps the whole MoE layer",
         lambda c: _fine_grained(c) and c.model.recompute_granularity == "selective"
         and "moe" in (c.model.recompute_modules or []) and bool(_modules(c) & MOE_MODULES),
         lambda c: False,
         lambda c: "model.recompute_modules=[" + ",".join(m for m in c.model.recompute_modules if m != "moe") + "]",
         fix_text="remove moe from model.recompute_modules"),
    Rule("fine-grained/cuda-graphs", FINE_GRAINED, "model.cuda_graph_impl",
         "with CUDA graphs, fine-grained offload needs cuda_graph_impl none, transformer_engine or "
         "full_iteration (local graphs only for expert_fc1 / moe_act / fused_group_mlp)",
         _fine_grained,
         lambda c: c.model.cuda_graph_impl in ("none", "transformer_engine", "full_iteration")
         or _modules(c) <= MOE_MODULES,
         _fix("model.cuda_graph_impl=transformer_engine")),
    Rule("fine-grained/nvte-cpu-offload-v1", FINE_GRAINED, "env_vars.NVTE_CPU_OFFLOAD_V1",
         "with Transformer Engine >= 2.10, NVTE_CPU_OFFLOAD_V1=1 must be set (else TE offloads weights too)",
         _nvte_v1_needed, lambda c: c.env("NVTE_CPU_OFFLOAD_V1") == "1",
         lambda c: ("export NVTE_CPU_OFFLOAD_V1=1  (your shell sets it to "
                    f"{c.environ['NVTE_CPU_OFFLOAD_V1']!r}, which wins over the recipe)")
         if "NVTE_CPU_OFFLOAD_V1" in c.environ else "++env_vars.NVTE_CPU_OFFLOAD_V1=1",
         observed=lambda c: show(c.env("NVTE_CPU_OFFLOAD_V1")) + f" (Transformer Engine {c.installed_te})",
         fix_text="++env_vars.NVTE_CPU_OFFLOAD_V1=1 (or export NVTE_CPU_OFFLOAD_V1=1)"),
    # ---------------------------------------------------------------- parallelism
    Rule("parallel/world-size", PARALLELISM, "model.tensor_model_parallel_size",
         "the GPU count must be a multiple of TP x PP x CP", _always, lambda c: c.dp is not None,
         _fix_world, observed=_grid, fix_text="--num-gpus <multiple of TP*PP*CP>, or smaller TP/PP/CP"),
    Rule("parallel/layers-per-stage", PARALLELISM, "model.pipeline_model_parallel_size",
         "model.num_layers must be divisible by the pipeline parallel size",
         lambda c: c.model.pipeline_model_parallel_size > 1 and not _uneven_pipeline(c),
         lambda c: c.model.num_layers % c.model.pipeline_model_parallel_size == 0, _fix_pp,
         observed=lambda c: f"{c.model.pipeline_model_parallel_size} (model.num_layers={c.model.num_layers})",
         fix_text="model.pipeline_model_parallel_size=<divisor of num_layers>"),
    Rule("parallel/global-batch", PARALLELISM, "train.global_batch_size",
         "train.global_batch_size must be divisible by micro_batch_size x data-parallel size",
         lambda c: c.dp is not None, lambda c: c.cfg.train.global_batch_size % _batch_unit(c) == 0,
         _fix_global_batch,
         observed=lambda c: (f"{c.cfg.train.global_batch_size} (micro batch {c.cfg.train.micro_batch_size} "
                             f"x DP {c.dp} = {_batch_unit(c)})"),
         fix_text="train.global_batch_size=<multiple of micro_batch_size*DP>"),
    Rule("parallel/heads-per-tp", PARALLELISM, "model.tensor_model_parallel_size",
         "attention heads and query groups must be divisible by the tensor parallel size",
         _always,
         lambda c: c.model.num_attention_heads % c.model.tensor_model_parallel_size == 0
         and (c.model.num_query_groups or c.model.num_attention_heads) % c.model.tensor_model_parallel_size == 0,
         _fix_tp_heads,
         observed=lambda c: (f"{c.model.tensor_model_parallel_size} (heads {c.model.num_attention_heads}, "
                             f"query groups {c.model.num_query_groups})"),
         fix_text="model.tensor_model_parallel_size=<divisor of the query groups>"),
    Rule("parallel/experts-per-ep", PARALLELISM, "model.expert_model_parallel_size",
         "model.num_moe_experts must be divisible by the expert parallel size",
         lambda c: c.num_experts > 0, lambda c: c.num_experts % c.model.expert_model_parallel_size == 0,
         _fix_ep, observed=lambda c: f"{c.model.expert_model_parallel_size} (experts {c.num_experts})",
         fix_text="model.expert_model_parallel_size=<divisor of num_moe_experts>"),
    Rule("parallel/expert-grid", PARALLELISM, "model.expert_model_parallel_size",
         "EP x expert TP must divide the GPUs of one pipeline stage (GPUs / PP)",
         lambda c: c.num_experts > 0 and c.num_gpus % c.model.pipeline_model_parallel_size == 0,
         lambda c: (c.num_gpus // c.model.pipeline_model_parallel_size)
         % (c.model.expert_model_parallel_size * c.model.expert_tensor_parallel_size) == 0,
         _fix_ep,
         observed=lambda c: (f"EP{c.model.expert_model_parallel_size} x ETP{c.model.expert_tensor_parallel_size} "
                             f"vs {c.num_gpus // c.model.pipeline_model_parallel_size} GPUs per stage"),
         fix_text="model.expert_model_parallel_size=<divisor of GPUs/PP>"),
    Rule("parallel/ep-needs-experts", PARALLELISM, "model.expert_model_parallel_size",
         "expert parallelism needs an MoE model (model.num_moe_experts set)",
         lambda c: c.model.expert_model_parallel_size > 1, lambda c: c.num_experts > 0,
         _fix("model.expert_model_parallel_size=1")),
    Rule("parallel/seq-length-match", PARALLELISM, "dataset.seq_length",
         "dataset.seq_length must equal model.seq_length",
         lambda c: hasattr(c.cfg.dataset, "seq_length"), lambda c: c.cfg.dataset.seq_length == c.model.seq_length,
         lambda c: f"dataset.seq_length={c.model.seq_length}  (or set both, e.g. --seq-length {c.cfg.dataset.seq_length})",
         observed=lambda c: f"{c.cfg.dataset.seq_length} (model.seq_length={c.model.seq_length})",
         fix_text="set both model.seq_length and dataset.seq_length (--seq-length N)"),
    Rule("parallel/seq-length-cp", PARALLELISM, "model.seq_length",
         "with context parallelism, seq_length must be divisible by 2 x CP",
         lambda c: c.model.context_parallel_size > 1,
         lambda c: c.model.seq_length % (2 * c.model.context_parallel_size) == 0,
         lambda c: f"--seq-length {math.ceil(c.model.seq_length / (2 * c.model.context_parallel_size)) * 2 * c.model.context_parallel_size}",
         fix_text="--seq-length <multiple of 2*CP>"),
    # ---------------------------------------------------------------- environment
    Rule("env/transformer-engine", ENVIRONMENT, "model.transformer_impl",
         "transformer_impl=transformer_engine (and every activation offload) needs Transformer Engine importable",
         lambda c: c.model.transformer_impl == "transformer_engine" or _act_offload(c) or _fine_grained(c),
         lambda c: c.installed_te is not None,
         _fix("uv sync  (builds transformer-engine-torch once; see README 'Install')"),
         observed=lambda c: f"{c.model.transformer_impl} (Transformer Engine not importable)"),
    Rule("env/apex-gradient-accumulation-fusion", ENVIRONMENT, "model.gradient_accumulation_fusion",
         "gradient_accumulation_fusion needs APEX's fused_weight_gradient_mlp_cuda, absent from a pip-installed stack",
         lambda c: bool(getattr(c.model, "gradient_accumulation_fusion", False)),
         lambda c: c.has_module("fused_weight_gradient_mlp_cuda"),
         _fix("model.gradient_accumulation_fusion=False")),
    Rule("env/nvidia-resiliency-ext", ENVIRONMENT, "ft",
         "fault tolerance, NVRx straggler detection, in-process restart and local checkpoints need "
         "nvidia-resiliency-ext, which is not installed (no wheel for this glibc)",
         lambda c: bool(_resiliency_features(c)), lambda c: c.has_module("nvidia_resiliency_ext"),
         lambda c: " ".join(("checkpoint.non_persistent_ckpt_type=null" if f.startswith("checkpoint")
                             else f"~{f}") for f in _resiliency_features(c)),
         observed=lambda c: "enabled: " + ", ".join(_resiliency_features(c)),
         fix_text="~ft / ~nvrx_straggler / ~inprocess_restart, or install nvidia-resiliency-ext"),
    Rule("env/fast-hadamard-transform", ENVIRONMENT, "model.experimental_attention_variant",
         "DeepSeek sparse attention (dsa) needs fast-hadamard-transform, which is not installed (needs its own CUDA build)",
         lambda c: getattr(c.model, "experimental_attention_variant", None) == "dsa",
         lambda c: c.has_module("fast_hadamard_transform"),
         _fix("model.experimental_attention_variant=null")),
)

RULES_BY_ID = {rule.id: rule for rule in RULES}
assert len(RULES_BY_ID) == len(RULES), "rule ids must be unique"


def range_violations(cfg: Any, keys) -> list[tuple[Rule, str, str]]:
    """Range/choice rules of ``keys`` that ``cfg`` breaks: (rule, value shown, fix)."""
    ctx = Context(cfg, num_gpus=1)
    keys = set(keys)
    return [(rule, rule.value(ctx), rule.fix(ctx)) for rule in RULES
            if rule.range_check and rule.key in keys and not rule.holds(ctx)]


def rules_markdown() -> str:
    """The README's table of offload modes and constraints, generated from RULES."""
    lines = ["| mechanism | key | rule | fix | severity |", "|---|---|---|---|---|"]
    for mechanism in MECHANISMS:
        for rule in RULES:
            if rule.mechanism != mechanism:
                continue
            fix = rule.fix_text or rule.fix(None)  # type: ignore[arg-type]  # constant fixes ignore ctx
            lines.append(f"| {mechanism} | `{rule.key}` | {rule.text} | `{fix}` | {rule.severity} |")
    return "\n".join(lines)
