"""Every recompute and activation offload setting a user can give, alone and with MoE, context, sequence and
virtual pipeline parallelism, on the plugin's recipes: the planner plans it with finite positive numbers or refuses
it by key, value, rule and fix; never a traceback. Where the activation model (planning/activations.py) documents
what a setting keeps, the plan says so: recompute and offload never add activations, more offloaded layers never
keep more on the GPU, a recompute module that does not apply to the layer changes nothing."""

from __future__ import annotations

import math

import pytest

from mbridge_offload.facts.key_ranges import FINE_GRAINED_MODULES
from mbridge_offload.planning import format_plan, plan, plan_problems, plan_with_recommendation
from mbridge_offload.planning.activations import activation_bytes
from overrides import apply_overrides

DENSE = "qwen3_0p6b_pretrain_config"  # 28 layers, one GPU
MOE = "qwen3_30b_a3b_proxy_pretrain_config"  # 4 layers, 128 experts, one GPU
LAYERS = {DENSE: 28, MOE: 4}
RECOMPUTE_MODULES = ("core_attn", "mlp", "moe", "moe_act", "layernorm", "shared_experts", "mla_up_proj",
                     "gdn_norm_out")
MOE_PARALLEL = [  # (overrides, GPUs): the Qwen3-30B-A3B proxy's expert parallel, dispatchers and grouped GEMM
    ([f"model.expert_model_parallel_size={ep}", f"model.moe_token_dispatcher_type={dispatcher}",
      f"model.moe_grouped_gemm={grouped}"], ep)
    for ep in (1, 2, 4) for dispatcher in ("alltoall", "allgather", "flex") for grouped in (True, False)]
PARALLEL = [  # (overrides, GPUs) on both recipes
    ([], 1),
    (["model.context_parallel_size=2"], 2),
    (["model.tensor_model_parallel_size=2", "model.sequence_parallel=True"], 2),
    (["model.tensor_model_parallel_size=2", "model.sequence_parallel=True", "model.context_parallel_size=2"], 4),
    (["model.pipeline_model_parallel_size=2", "model.virtual_pipeline_model_parallel_size=2",
      "train.global_batch_size=8"], 2),
    (["model.pipeline_model_parallel_size=2", "model.account_for_embedding_in_pipeline_split=True",
      "model.account_for_loss_in_pipeline_split=True", "train.global_batch_size=8"], 2),
    (["model.pipeline_model_parallel_size=2", "model.account_for_embedding_in_pipeline_split=True",
      "train.global_batch_size=8"], 2),
    (["model.pipeline_model_parallel_size=2", "model.pipeline_model_parallel_layout=Et|tL",
      "train.global_batch_size=8"], 2),
]


def _counts(layers: int, every: bool) -> tuple[int, ...]:
    """Layer counts to try: all of 0..layers+1, or its ends and middle (beside another parallelism)."""
    return tuple(range(layers + 2)) if every else tuple(sorted({0, 1, 2, layers // 2, layers - 1, layers, layers + 1}))


def _recompute(layers: int, every: bool = True) -> list[list[str]]:
    cases = [["model.recompute_granularity=full", f"model.recompute_method={method}", f"model.recompute_num_layers={n}"]
             for method in ("uniform", "block") for n in _counts(layers, every)]
    cases += [["model.recompute_granularity=full", "model.recompute_method=null", "model.recompute_num_layers=1"]]
    cases += [["model.recompute_granularity=selective", f"model.recompute_modules=[{module}]"]
              for module in RECOMPUTE_MODULES]
    cases += [["model.recompute_granularity=selective", "model.recompute_modules=[" + ",".join(RECOMPUTE_MODULES[:6])
               + "]"], ["model.recompute_granularity=selective", "model.recompute_modules=null"]]
    return cases


def _activation_offload(layers: int, every: bool = True) -> list[list[str]]:
    return [["model.cpu_offloading=True", f"model.cpu_offloading_num_layers={n}", f"model.cpu_offloading_weights={w}",
             f"model.cpu_offloading_activations={a}"]
            for n in _counts(layers - 1, every) for w in (True, False) for a in (True, False)]


# what Transformer Engine >= 2.10 needs for fine-grained offload, as the plugin's fine-grained recipes set it (else
# the validator refuses the launch, fine-grained/nvte-cpu-offload-v1, and so does the planner)
TE_OFFLOAD_V1 = "++env_vars.NVTE_CPU_OFFLOAD_V1=1"


def _fine_grained() -> list[list[str]]:
    return [["model.fine_grained_activation_offloading=True", f"model.offload_modules=[{module}]",
             f"model.activation_offload_fraction={fraction}", TE_OFFLOAD_V1]
            for module in FINE_GRAINED_MODULES for fraction in (0.0, 0.5, 1.0)]


def _settings(recipe_name: str, every: bool) -> list[list[str]]:
    layers = LAYERS[recipe_name]
    return [[], *_recompute(layers, every), *_activation_offload(layers, every), *_fine_grained(),
            # recompute beside offload
            ["model.recompute_granularity=full", "model.recompute_method=uniform", "model.recompute_num_layers=1",
             "model.cpu_offloading=True", f"model.cpu_offloading_num_layers={layers // 2}"],
            ["model.recompute_granularity=selective", "model.recompute_modules=[moe_act,layernorm]",
             "model.fine_grained_activation_offloading=True", "model.offload_modules=[expert_fc1,moe_act]", TE_OFFLOAD_V1]]


def _cases():
    for recipe_name in (DENSE, MOE):
        for parallel, gpus in PARALLEL:
            for setting in _settings(recipe_name, every=not parallel):
                yield pytest.param(recipe_name, setting + parallel, gpus,
                                   id=f"{recipe_name.split('_')[1]}-{' '.join(setting + parallel) or 'as-built'}")
    for setting in ([], *_recompute(4)[::5], *_fine_grained()[::2]):
        for parallel, gpus in MOE_PARALLEL:
            yield pytest.param(MOE, setting + parallel, gpus, id=f"moe-{' '.join(setting + parallel)}")


def plans_or_refuses(cfg, gpus: int):
    """The plan, checked: finite positive numbers for every stage, or a refusal whose every problem names its key,
    value, rule and fix (None then)."""
    p = plan_with_recommendation(cfg, gpus, fraction=0.5, gpu_memory_gib=139.8)
    text = format_plan(p)
    problems = plan_problems(p, None)
    if p.unplanned:
        assert problems and p.total_bytes_gpu == 0 and p.params_per_rank == 0, p.unplanned
        for q in problems:
            assert q.key and q.value and q.rule and q.fix and q.rule_id and q.severity == "error", q
            assert q.key in text
        return None
    numbers = {k: v for k, v in p.to_json().items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    assert all(math.isfinite(v) and v >= 0 for v in numbers.values()), numbers
    assert p.params_per_rank > 0 and p.activation_bytes_gpu > 0 and p.allocated_bytes_gpu > 0
    assert p.total_bytes_gpu >= p.allocated_bytes_gpu
    assert p.stages and all(s.activation_bytes_gpu > 0 and s.total_bytes_gpu > 0 for s in p.stages), p.stages
    return p


@pytest.mark.parametrize("recipe_name,overrides,gpus", list(_cases()))
def test_every_recompute_and_offload_setting_plans_or_is_refused_by_key(built, recipe_name, overrides, gpus):
    plans_or_refuses(apply_overrides(built(recipe_name), overrides), gpus)


def _activations(cfg, overrides: list[str]) -> int:
    changed = apply_overrides(cfg, overrides)
    assert plans_or_refuses(changed, 1) is not None, overrides
    return activation_bytes(changed)


# the fine-grained modules each recipe's launch refuses (validation/fine_grained.py), which the planner refuses too
REFUSED_FINE_GRAINED = {DENSE: {"attn_proj", "expert_fc1", "moe_act", "fused_group_mlp"}, MOE: {"attn_proj", "fused_group_mlp"}}


@pytest.mark.parametrize("recipe_name", [DENSE, MOE])
def test_recompute_and_offload_never_keep_more_than_none(built, recipe_name):
    cfg, layers = built(recipe_name), LAYERS[recipe_name]
    none = activation_bytes(cfg)
    for method in ("uniform", "block"):
        kept = [_activations(cfg, ["model.recompute_granularity=full", f"model.recompute_method={method}",
                                   f"model.recompute_num_layers={n}"]) for n in range(1, layers + 1)]
        assert max(kept) <= none, (method, kept, none)
        if method == "block":  # each more layer checkpointed keeps its input only
            assert kept == sorted(kept, reverse=True), kept
    offloaded = [_activations(cfg, ["model.cpu_offloading=True", f"model.cpu_offloading_num_layers={n}"])
                 for n in range(layers)]
    assert offloaded[0] == none and offloaded == sorted(offloaded, reverse=True), offloaded
    # with the weights only, TE offloads nothing
    assert _activations(cfg, ["model.cpu_offloading=True", f"model.cpu_offloading_num_layers={layers - 1}",
                              "model.cpu_offloading_activations=False", "model.cpu_offloading_weights=True"]) == none
    for module in [m for m in FINE_GRAINED_MODULES if m not in REFUSED_FINE_GRAINED[recipe_name]]:
        on = ["model.fine_grained_activation_offloading=True", f"model.offload_modules=[{module}]", TE_OFFLOAD_V1]
        by_fraction = [_activations(cfg, on + [f"model.activation_offload_fraction={f}"]) for f in (0.0, 0.5, 1.0)]
        assert by_fraction[0] == none and by_fraction == sorted(by_fraction, reverse=True), (module, by_fraction)


@pytest.mark.parametrize("recipe_name,module,applies", [
    (DENSE, "core_attn", False),  # TE's fused attention keeps no scores: nothing to rebuild
    (DENSE, "moe", False), (DENSE, "shared_experts", False),  # no MoE layer (moe_act: refused, see below)
    (DENSE, "layernorm", False),  # both norms are fused into a linear
    (DENSE, "mlp", True),
    (MOE, "mlp", False),  # Megatron Core's TransformerLayer recomputes the MLP of a dense layer only
    (MOE, "shared_experts", False),  # Qwen3-30B-A3B has none
    (MOE, "moe", True), (MOE, "moe_act", True), (MOE, "layernorm", True),
])
def test_a_selective_recompute_module_changes_only_the_layers_it_applies_to(built, recipe_name, module, applies):
    cfg = built(recipe_name)
    kept = _activations(cfg, ["model.recompute_granularity=selective", f"model.recompute_modules=[{module}]"])
    assert (kept < activation_bytes(cfg)) == applies and kept <= activation_bytes(cfg)


@pytest.mark.parametrize("recipe_name,pp,embedding,loss,stages", [
    # Megatron Core's get_num_layers_to_build: (layers + embedding + loss) / PP, one fewer on the first and last
    (DENSE, 3, True, True, [9, 10, 9]),
    (DENSE, 5, True, True, [5, 6, 6, 6, 5]),
    (MOE, 3, True, True, [1, 2, 1]),
    (MOE, 5, True, False, [0, 1, 1, 1, 1]),
])
def test_the_embedding_and_loss_counted_in_the_pipeline_split_move_layers(built, recipe_name, pp, embedding, loss,
                                                                          stages):
    from mbridge_offload.planning.tensors import layers_per_stage

    cfg = apply_overrides(built(recipe_name), [
        f"model.pipeline_model_parallel_size={pp}", f"model.account_for_embedding_in_pipeline_split={embedding}",
        f"model.account_for_loss_in_pipeline_split={loss}", f"train.global_batch_size={4 * pp}"])
    assert layers_per_stage(cfg.model, pp) == stages
    p = plan(cfg, pp, fraction=0.5, gpu_memory_gib=139.8)
    assert not p.unplanned and len(p.stages) == pp


@pytest.mark.parametrize("overrides,gpus,rule_id,key", [
    # 28 layers and the embedding do not split over 2 stages
    (["model.pipeline_model_parallel_size=2", "model.account_for_embedding_in_pipeline_split=True",
      "train.global_batch_size=8"], 2, "pipeline/embedding-loss-split", "model.pipeline_model_parallel_size"),
    (["model.pipeline_model_parallel_size=2", "model.pipeline_model_parallel_layout=Et*14|t*14L",
      "train.global_batch_size=8"], 2, "memory/unmodeled-pipeline-layout", "model.pipeline_model_parallel_layout"),
])
def test_a_pipeline_split_the_planner_cannot_count_is_refused_by_key(built, overrides, gpus, rule_id, key):
    p = plans_or_refuses(apply_overrides(built(DENSE), overrides), gpus)
    assert p is None
    cfg = apply_overrides(built(DENSE), overrides)
    found = [q for q in plan_problems(plan(cfg, gpus), None) if q.rule_id == rule_id]
    assert found and found[0].key == key, [q.rule_id for q in plan_problems(plan(cfg, gpus), None)]
    fixed = apply_overrides(cfg, [found[0].fix.split()[0]])
    assert not [q for q in plan_problems(plan(fixed, gpus), None) if q.rule_id == rule_id]


def test_shared_experts_recompute_keeps_the_shared_experts_input_only(built):
    cfg = apply_overrides(built(MOE), ["model.moe_shared_expert_intermediate_size=768"])
    kept = _activations(cfg, ["model.recompute_granularity=selective", "model.recompute_modules=[shared_experts]"])
    assert kept < activation_bytes(cfg)
    assert kept == activation_bytes(built(MOE))  # all that the shared expert keeps inside it is rebuilt


@pytest.mark.parametrize("recipe_name,overrides,rule_id", [
    # Megatron Core's TransformerConfig raises at finalize: the module needs a feature the model does not have
    (DENSE, ["model.recompute_modules=[mla_up_proj]"], "recompute/modules-need-features"),
    (DENSE, ["model.recompute_modules=[gdn_norm_out]"], "recompute/modules-need-features"),
    (DENSE, ["model.recompute_modules=[core_attn,moe_act]"], "recompute/modules-need-features"),
    (MOE, ["model.recompute_modules=[mla_up_proj]"], "recompute/modules-need-features"),
])
def test_a_recompute_module_the_model_cannot_have_is_refused_as_run_recipe_refuses_it(built, recipe_name, overrides,
                                                                                       rule_id):
    """The planner's refusal is the validator's rule, by key and id: the launch fails, no plan is made of it."""
    from mbridge_offload.validation import validate

    cfg = apply_overrides(built(recipe_name), ["model.recompute_granularity=selective", *overrides])
    p = plan_with_recommendation(cfg, 1, fraction=0.5, gpu_memory_gib=139.8)
    assert p.unplanned and plans_or_refuses(cfg, 1) is None
    refused = {(q.rule_id, q.key) for q in plan_problems(p, None)}
    assert (rule_id, "model.recompute_modules") in refused
    said = {(q.rule_id, q.key) for q in validate(cfg, 1, upstream=False).errors}
    assert (rule_id, "model.recompute_modules") in said


def test_the_deprecated_moe_layer_recompute_recomputes_the_moe_layer(built):
    """Megatron Core's TransformerConfig turns moe_layer_recompute into selective recompute of moe: it keeps what
    recompute_modules=[moe] keeps, less than without recompute."""
    cfg = built(MOE)
    deprecated = _activations(cfg, ["model.moe_layer_recompute=True"])
    listed = _activations(cfg, ["model.recompute_granularity=selective", "model.recompute_modules=[moe]"])
    assert deprecated == listed < activation_bytes(cfg)


def test_fine_grained_offload_of_the_fused_grouped_mlp_is_refused_with_a_fix_that_plans(built):
    """fused_group_mlp (with the op fuser, which the launch needs) moves tensors the planner does not count: refused
    by key, never planned as offloading nothing; its fix (the experts' fc1 input and activation) plans."""
    cfg = apply_overrides(built(MOE), ["model.fine_grained_activation_offloading=True",
                                       "model.offload_modules=[core_attn,fused_group_mlp]",
                                       "model.use_transformer_engine_op_fuser=True", TE_OFFLOAD_V1])
    p = plan_with_recommendation(cfg, 1, fraction=0.5, gpu_memory_gib=139.8)
    assert p.unplanned and plans_or_refuses(cfg, 1) is None
    refused = [q for q in plan_problems(p, None) if q.rule_id == "memory/unmodeled-fused-group-mlp"]
    assert len(refused) == 1 and refused[0].key == "model.offload_modules"
    assert refused[0].value == "[core_attn,fused_group_mlp]"
    fixed = apply_overrides(cfg, refused[0].fix.split("  (")[0].split())
    assert plans_or_refuses(fixed, 1) is not None
    assert fixed.model.offload_modules == ["core_attn", "expert_fc1", "moe_act"]
