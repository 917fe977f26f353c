"""Rules of layer-level activation offload (Transformer Engine's offload context, ``model.cpu_offloading``)."""

from __future__ import annotations

from mbridge_offload.facts.key_ranges import CPU_OFFLOADING_NUM_LAYERS, fixed
from mbridge_offload.validation.fine_grained import fine_grained_on
from mbridge_offload.validation.guard import guarded
from mbridge_offload.validation.rule import ACTIVATION, Context, Rule


def activation_offload_on(ctx: Context) -> bool:
    return bool(ctx.model.cpu_offloading)


RULES: tuple[Rule, ...] = guarded(
    Rule.of_range(ACTIVATION, CPU_OFFLOADING_NUM_LAYERS),
    Rule(id="activation-offload/pipeline-parallel", mechanism=ACTIVATION, key="model.pipeline_model_parallel_size",
         text="layer-level activation offload needs pipeline parallel size 1",
         applies=activation_offload_on, holds=lambda c: c.model.pipeline_model_parallel_size == 1,
         fix=fixed("model.pipeline_model_parallel_size=1  (or keep PP and use fine-grained offload: "
                   "model.cpu_offloading=False model.fine_grained_activation_offloading=True "
                   "model.offload_modules=[expert_fc1,moe_act])")),
    Rule(id="activation-offload/recompute", mechanism=ACTIVATION, key="model.recompute_granularity",
         text="layer-level activation offload cannot be combined with activation recomputation",
         applies=activation_offload_on, holds=lambda c: c.model.recompute_granularity is None,
         fix=fixed("model.recompute_granularity=null model.recompute_method=null model.recompute_num_layers=null")),
    Rule(id="activation-offload/cuda-graphs", mechanism=ACTIVATION, key="model.cuda_graph_impl",
         text="layer-level activation offload cannot run inside CUDA graphs",
         applies=activation_offload_on, holds=lambda c: c.model.cuda_graph_impl == "none",
         fix=fixed("model.cuda_graph_impl=none")),
    Rule(id="activation-offload/not-with-fine-grained", mechanism=ACTIVATION,
         key="model.fine_grained_activation_offloading",
         text="layer-level and fine-grained activation offload are mutually exclusive",
         applies=activation_offload_on, holds=lambda c: not fine_grained_on(c),
         fix=fixed("model.fine_grained_activation_offloading=False  (or model.cpu_offloading=False)")),
    Rule(id="activation-offload/offloads-something", mechanism=ACTIVATION, key="model.cpu_offloading_activations",
         text="with cpu_offloading on, at least one of cpu_offloading_activations / cpu_offloading_weights must be True",
         applies=activation_offload_on,
         holds=lambda c: bool(c.model.cpu_offloading_activations or c.model.cpu_offloading_weights),
         fix=fixed("model.cpu_offloading_activations=True")),
    Rule(id="activation-offload/transformer-engine", mechanism=ACTIVATION, key="model.transformer_impl",
         text="layer-level activation offload uses Transformer Engine's offload context "
              "(transformer_impl=transformer_engine)",
         applies=activation_offload_on, holds=lambda c: c.model.transformer_impl == "transformer_engine",
         fix=fixed("model.transformer_impl=transformer_engine")),
    Rule(id="activation-offload/paged-stash", mechanism=ACTIVATION, key="model.moe_paged_stash",
         text="layer-level activation offload cannot be combined with moe_paged_stash",
         applies=activation_offload_on, holds=lambda c: not getattr(c.model, "moe_paged_stash", False),
         fix=fixed("model.moe_paged_stash=False")),
)
