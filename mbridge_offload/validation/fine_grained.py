"""Rules of fine-grained activation offload (the inputs of chosen submodules, ``model.offload_modules``)."""

from __future__ import annotations

from mbridge_offload.facts.config_tree import show
from mbridge_offload.facts.key_ranges import (ACTIVATION_OFFLOAD_FRACTION, DELTA_OFFLOAD_BYTES_ACROSS_PP_RANKS,
                                              MIN_OFFLOADED_TENSOR_SIZE, OFFLOAD_MODULES_KNOWN, fixed,
                                              offload_modules)
from mbridge_offload.validation.guard import guarded
from mbridge_offload.validation.installed import version_tuple
from mbridge_offload.validation.rule import FINE_GRAINED, Context, Rule

# The fine-grained modules that exist only inside an MoE layer.
MOE_MODULES = frozenset({"expert_fc1", "moe_act", "fused_group_mlp"})


def fine_grained_on(ctx: Context) -> bool:
    return bool(ctx.model.fine_grained_activation_offloading)


def _modules(ctx: Context) -> set[str]:
    return offload_modules(ctx.cfg)


def _recompute_modules(ctx: Context) -> list[str]:
    modules = ctx.model.recompute_modules or []
    return [modules] if isinstance(modules, str) else [str(m) for m in modules]


def _nvte_v1_needed(ctx: Context) -> bool:
    te = ctx.installed_te
    return fine_grained_on(ctx) and te not in (None, "unknown") and version_tuple(te) >= (2, 10, 0)


RULES: tuple[Rule, ...] = guarded(
    Rule.of_range(FINE_GRAINED, OFFLOAD_MODULES_KNOWN),
    Rule.of_range(FINE_GRAINED, ACTIVATION_OFFLOAD_FRACTION),
    Rule.of_range(FINE_GRAINED, MIN_OFFLOADED_TENSOR_SIZE),
    Rule.of_range(FINE_GRAINED, DELTA_OFFLOAD_BYTES_ACROSS_PP_RANKS),
    Rule(id="fine-grained/modules-given", mechanism=FINE_GRAINED, key="model.offload_modules",
         text="fine-grained offload needs at least one module to offload",
         applies=fine_grained_on, holds=lambda c: bool(_modules(c)),
         fix=fixed("model.offload_modules=[expert_fc1,moe_act]")),
    Rule(id="fine-grained/transformer-engine", mechanism=FINE_GRAINED, key="model.transformer_impl",
         text="fine-grained activation offload needs transformer_impl=transformer_engine",
         applies=fine_grained_on, holds=lambda c: c.model.transformer_impl == "transformer_engine",
         fix=fixed("model.transformer_impl=transformer_engine")),
    Rule(id="fine-grained/attn-proj-needs-core-attn", mechanism=FINE_GRAINED, key="model.offload_modules",
         text="attn_proj can only be offloaded together with core_attn (its input is core_attn's output)",
         applies=lambda c: fine_grained_on(c) and "attn_proj" in _modules(c),
         holds=lambda c: "core_attn" in _modules(c),
         fix=lambda c: "model.offload_modules=[" + ",".join(sorted(_modules(c) | {"core_attn"})) + "]",
         fix_text="add core_attn to model.offload_modules"),
    Rule(id="fine-grained/moe-modules-need-experts", mechanism=FINE_GRAINED, key="model.offload_modules",
         text="expert_fc1, moe_act and fused_group_mlp exist only in MoE models (model.num_moe_experts set)",
         applies=lambda c: fine_grained_on(c) and bool(_modules(c) & MOE_MODULES),
         holds=lambda c: c.num_experts > 0,
         fix=lambda c: "model.offload_modules=[" + ",".join(sorted(_modules(c) - MOE_MODULES) or ["core_attn"]) + "]",
         fix_text="offload dense modules instead, e.g. model.offload_modules=[core_attn]"),
    Rule(id="fine-grained/fused-group-mlp", mechanism=FINE_GRAINED, key="model.offload_modules",
         text="fused_group_mlp needs use_transformer_engine_op_fuser and excludes expert_fc1 / moe_act",
         applies=lambda c: fine_grained_on(c) and "fused_group_mlp" in _modules(c),
         holds=lambda c: bool(getattr(c.model, "use_transformer_engine_op_fuser", False))
         and not ({"expert_fc1", "moe_act"} & _modules(c)),
         fix=fixed("model.offload_modules=[expert_fc1,moe_act]  (or model.use_transformer_engine_op_fuser=True "
                   "with model.offload_modules=[fused_group_mlp])")),
    Rule(id="fine-grained/not-inside-moe-recompute", mechanism=FINE_GRAINED, key="model.recompute_modules",
         text="MoE-internal modules cannot be offloaded while selective recompute wraps the whole MoE layer",
         applies=lambda c: fine_grained_on(c) and c.model.recompute_granularity == "selective"
         and "moe" in _recompute_modules(c) and bool(_modules(c) & MOE_MODULES),
         holds=lambda c: False,
         fix=lambda c: "model.recompute_modules=[" + ",".join(m for m in _recompute_modules(c) if m != "moe") + "]",
         fix_text="remove moe from model.recompute_modules"),
    Rule(id="fine-grained/cuda-graphs", mechanism=FINE_GRAINED, key="model.cuda_graph_impl",
         text="with CUDA graphs, fine-grained offload needs cuda_graph_impl none, transformer_engine or "
              "full_iteration (local graphs only for expert_fc1 / moe_act / fused_group_mlp)",
         applies=fine_grained_on,
         holds=lambda c: c.model.cuda_graph_impl in ("none", "transformer_engine", "full_iteration")
         or _modules(c) <= MOE_MODULES,
         fix=fixed("model.cuda_graph_impl=transformer_engine")),
    Rule(id="fine-grained/nvte-cpu-offload-v1", mechanism=FINE_GRAINED, key="env_vars.NVTE_CPU_OFFLOAD_V1",
         text="with Transformer Engine >= 2.10, NVTE_CPU_OFFLOAD_V1=1 must be set (else TE offloads weights too)",
         applies=_nvte_v1_needed, holds=lambda c: c.env("NVTE_CPU_OFFLOAD_V1") == "1",
         fix=lambda c: ("export NVTE_CPU_OFFLOAD_V1=1  (your shell sets it to "
                        f"{c.environ['NVTE_CPU_OFFLOAD_V1']!r}, which wins over the recipe)")
         if "NVTE_CPU_OFFLOAD_V1" in c.environ else "++env_vars.NVTE_CPU_OFFLOAD_V1=1",
         observed=lambda c: show(c.env("NVTE_CPU_OFFLOAD_V1")) + f" (Transformer Engine {c.installed_te})",
         fix_text="++env_vars.NVTE_CPU_OFFLOAD_V1=1 (or export NVTE_CPU_OFFLOAD_V1=1)"),
)
