"""Every rule of validation/upstream_model_rules.py (what upstream validate() reaches outside its module: the
model's TransformerConfig.__post_init__, Megatron Core's optimizer / DDP checks, CUDA graphs, mixed precision,
comm overlap) has a case where it applies and holds and one where it is broken, reported with key, value, rule
and fix, on the real recipe configs (the dense and the MoE proxy). The reasons given for the sites no user
reaches are checked where they state a fact of the installed packages."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from mbridge_offload.facts.config_tree import set_path
from mbridge_offload.validation import RULES_BY_ID, Context, check_rules
from mbridge_offload.validation import upstream_model_rules

DENSE = "qwen3_1b_proxy_pretrain_config"  # 16 layers, 16 heads, 8 query groups, silu GLU, bf16_mixed
MOE = "qwen3_30b_a3b_proxy_pretrain_config"  # 4 layers, 128 experts top-8, alltoall, grouped GEMM, permute fusion
TE_NEW, TE_OLD = {"te_version": "2.20.0"}, {"te_version": "1.6.0"}
PP2 = {"model.pipeline_model_parallel_size": 2}
GDN = {"model.experimental_attention_variant": "gated_delta_net", "model.linear_attention_freq": 4,
       "model.linear_conv_kernel_dim": 4, "model.linear_key_head_dim": 128, "model.linear_value_head_dim": 128,
       "model.linear_num_key_heads": 16, "model.linear_num_value_heads": 32}
DSA = {"model.experimental_attention_variant": "dsa", "model.dsa_kernel_backend": "none"}
FP8 = {"mixed_precision": None, "model.fp8": "hybrid", "model.fp8_recipe": "tensorwise"}
FULL_RECOMPUTE = {"model.recompute_granularity": "full", "model.recompute_method": "uniform",
                  "model.recompute_num_layers": 1}
SELECTIVE = {"model.recompute_granularity": "selective"}
TE_GRAPH = {"model.cuda_graph_impl": "transformer_engine"}
EP_OVERLAP = {"model.overlap_moe_expert_parallel_comm": True, "model.expert_model_parallel_size": 2}
FINE = {"model.fine_grained_activation_offloading": True, "model.offload_modules": ["expert_fc1"]}


CURRENT, DELAYED = "bf16_with_fp8_current_scaling_mixed", "bf16_with_fp8_delayed_scaling_mixed"


class Preset:
    """A mixed_precision preset as a config (MixedPrecisionConfig), some fields changed: made when a case is set up."""

    def __init__(self, name, **fields):
        self.name, self.fields = name, fields

    def make(self):
        from megatron.bridge.training.mixed_precision import get_mixed_precision_config

        preset = get_mixed_precision_config(self.name)
        for key, value in self.fields.items():
            setattr(preset, key, value)
        return preset


def case(passing, failing, recipe=DENSE, gpus=(1, 1), passing_ctx=None, failing_ctx=None):
    return dict(recipe=recipe, passing=passing, failing=failing, gpus=gpus, passing_ctx=passing_ctx or {},
                failing_ctx=failing_ctx or {})


CASES = {
    "model/transformer-engine-version": case({}, {}, recipe=MOE, passing_ctx=TE_NEW, failing_ctx=TE_OLD),
    "model/torch-version": case({"model.overlap_moe_expert_parallel_comm": True},
                                {"model.overlap_moe_expert_parallel_comm": True}, recipe=MOE,
                                passing_ctx={"torch_version": "2.7.0"}, failing_ctx={"torch_version": "2.5.1"}),
    "model/gated-delta-net": case(GDN, {**GDN, "model.linear_num_value_heads": 24}),
    "model/dsa": case(DSA, {**DSA, "model.add_bias_linear": True}),
    "model/multi-latent-attention-rope": case({"model.multi_latent_attention": True},
                                              {"model.multi_latent_attention": True, "model.rotary_interleaved": True}),
    "model/fused-qkv-rope-gate": case({"model.fused_single_qkv_rope": True},
                                      {"model.fused_single_qkv_rope": True, "model.attention_output_gate": True}),
    "model/rope-fusion-available": case({"model.apply_rope_fusion": True}, {"model.apply_rope_fusion": True},
                                        passing_ctx=TE_NEW, failing_ctx={"te_version": None}),
    "model/no-rope-freq": case({"model.no_rope_freq": 4}, {"model.no_rope_freq": 5}),
    "model/flash-attention-version": case({"model.flash_attention_version": 3}, {"model.flash_attention_version": 1}),
    "model/batch-invariant-mode": case(
        {"model.batch_invariant_mode": True, "model.attention_backend": "flash", "model.flash_attention_version": 3},
        {"model.batch_invariant_mode": True, "model.attention_backend": "flash", "model.flash_attention_version": 2}),
    "model/inference-optimized": case({"model.transformer_impl": "inference_optimized"},
                                      {"model.transformer_impl": "inference_optimized", "model.add_bias_linear": True}),
    "model/inference-only-options": case(
        {"model.transformer_impl": "inference_optimized", "model.inference_fuse_tp_communication": True},
        {"model.inference_fuse_tp_communication": True}),
    "model/bias-activation-fusion": case({"model.bias_activation_fusion": True},
                                         {"model.bias_activation_fusion": True, "model.use_te_activation_func": True}),
    "model/te-activation-func": case({"model.use_te_activation_func": True},
                                     {"model.use_te_activation_func": True, "model.activation_func": torch.tanh}),
    "model/activation-fp8-input-store": case({"model.activation_func_fp8_input_store": True},
                                             {"model.activation_func_fp8_input_store": True,
                                              "model.activation_func": F.gelu}),
    "model/fused-residual-rmsnorm": case({"model.fused_residual_rmsnorm": True},
                                         {"model.fused_residual_rmsnorm": True, "model.normalization": "LayerNorm"}),
    "model/mup-base-hidden-size": case({"model.use_mup": True}, {"model.use_mup": True, "model.mup_base_hidden_size": -1}),
    "precision/fp8-options": case(FP8, {**FP8, "model.fp8_output_proj": True}),
    "precision/fp4-options": case({"mixed_precision": None, "model.fp4": "nvfp4"},
                                  {"mixed_precision": None, "model.fp4": "nvfp4", "model.fp8": "hybrid"}),
    "precision/preset-known": case({}, {"mixed_precision": "bf16_with_nothing_mixed"}),
    # bf16_mixed (the recipes' preset) sets fp8 to null at setup: a format set on the model alone is dropped
    "precision/preset-replaces-fp8": case({"model.fp8": "hybrid", "mixed_precision": "bf16_with_fp8_current_scaling_mixed"},
                                          {"model.fp8": "hybrid"}),
    "precision/preset-replaces-fp4": case({"model.fp4": "e2m1", "mixed_precision": "bf16_with_nvfp4_mixed"},
                                          {"model.fp4": "e2m1"}),
    "precision/preset-replaces-fp4-recipe": case({"mixed_precision": "bf16_with_nvfp4_mixed"},
                                                 {"model.fp4_recipe": "custom", "mixed_precision": "bf16_with_nvfp4_mixed"}),
    # a value other than Megatron Core's default, set on the model, where the preset's FP8 reads it: kept only where
    # the preset writes the same (a preset given as a config, where no registered one does)
    # a precision key the command line gave: kept where the preset writes the same, refused where it writes another
    "precision/preset-replaces-given": case({"ddp.grad_reduce_in_fp32": True}, {"ddp.grad_reduce_in_fp32": False},
                                            passing_ctx={"given_keys": frozenset({"ddp.grad_reduce_in_fp32"})},
                                            failing_ctx={"given_keys": frozenset({"ddp.grad_reduce_in_fp32"})}),
    "precision/preset-replaces-fp8-recipe": case({"mixed_precision": CURRENT, "model.fp8_recipe": "tensorwise"},
                                                 {"mixed_precision": CURRENT, "model.fp8_recipe": "blockwise"}),
    "precision/preset-replaces-fp8-param": case({"mixed_precision": CURRENT, "model.fp8_param": True},
                                                {"mixed_precision": "bf16_with_fp8_subchannel_scaling_mixed",
                                                 "model.fp8_param": True}),
    "precision/preset-replaces-fp8-dot-product-attention": case(
        {"mixed_precision": Preset(CURRENT, fp8_dot_product_attention=True), "model.fp8_dot_product_attention": True},
        {"mixed_precision": CURRENT, "model.fp8_dot_product_attention": True}),
    "precision/preset-replaces-fp8-multi-head-attention": case(
        {"mixed_precision": Preset(DELAYED, fp8_multi_head_attention=True), "model.fp8_multi_head_attention": True},
        {"mixed_precision": DELAYED, "model.fp8_multi_head_attention": True}),
    "precision/preset-replaces-fp8-amax-history-len": case(
        {"mixed_precision": DELAYED, "model.fp8_amax_history_len": 1024},
        {"mixed_precision": DELAYED, "model.fp8_amax_history_len": 16}),
    "precision/preset-replaces-fp8-amax-compute-algo": case(
        {"mixed_precision": DELAYED, "model.fp8_amax_compute_algo": "max"},
        {"mixed_precision": Preset(DELAYED, fp8_amax_compute_algo="most_recent"), "model.fp8_amax_compute_algo": "max"}),
    "precision/preset-replaces-fp8-margin": case({"mixed_precision": Preset(DELAYED, fp8_margin=2), "model.fp8_margin": 2},
                                                 {"mixed_precision": DELAYED, "model.fp8_margin": 2}),
    "precision/preset-replaces-fp8-wgrad": case({"mixed_precision": Preset(DELAYED, fp8_wgrad=False), "model.fp8_wgrad": False},
                                                {"mixed_precision": DELAYED, "model.fp8_wgrad": False}),
    "precision/preset-replaces-first-last-layers-bf16": case(
        {"mixed_precision": CURRENT, "model.first_last_layers_bf16": True},
        {"mixed_precision": DELAYED, "model.first_last_layers_bf16": True}),
    **{f"precision/preset-replaces-num-layers-at-{end}-in-bf16": case(
        {"mixed_precision": "nemotron_h_bf16_with_fp8_current_scaling_mixed", f"model.num_layers_at_{end}_in_bf16": 2},
        {"mixed_precision": CURRENT, f"model.num_layers_at_{end}_in_bf16": 2}) for end in ("start", "end")},
    "moe/ffn-hidden-size-needs-experts": case({"model.moe_ffn_hidden_size": 512, "model.moe_layer_freq": 2},
                                              {"model.moe_ffn_hidden_size": 512}),
    "moe/single-grouped-weight": case(
        {"model.moe_single_grouped_weight": True, "model.use_transformer_engine_op_fuser": True},
        {"model.moe_single_grouped_weight": True, "model.use_transformer_engine_op_fuser": False}, recipe=MOE),
    "moe/flex-dispatcher": case({"model.moe_token_dispatcher_type": "flex", "model.moe_flex_dispatcher_backend": "deepep"},
                                {"model.moe_flex_dispatcher_backend": "ncclep"}, recipe=MOE),
    "moe/flex-dispatcher-num-sms": case({"model.moe_deepep_num_sms": 20, "model.moe_hybridep_num_sms": 20},
                                        {"model.moe_deepep_num_sms": 20, "model.moe_hybridep_num_sms": 24}, recipe=MOE),
    "moe/shared-expert-size": case({"model.moe_shared_expert_intermediate_size": 768},
                                   {"model.moe_shared_expert_intermediate_size": 0}, recipe=MOE),
    "moe/shared-expert-overlap": case(
        {"model.moe_shared_expert_intermediate_size": 768, "model.moe_shared_expert_overlap": True},
        {"model.moe_shared_expert_intermediate_size": 768, "model.moe_shared_expert_overlap": True,
         "model.moe_token_dispatcher_type": "allgather"}, recipe=MOE),
    "moe/shared-expert-bias": case({"model.moe_shared_expert_intermediate_size": 768},
                                   {"model.moe_shared_expert_intermediate_size": 768, "model.add_bias_linear": True},
                                   recipe=MOE),
    "moe/aux-loss-coeff-per-type": case(
        {"model.moe_router_load_balancing_type": ["aux_loss", "seq_aux_loss"], "model.moe_aux_loss_coeff": [1e-3, 1e-4]},
        {"model.moe_router_load_balancing_type": ["aux_loss", "seq_aux_loss"], "model.moe_aux_loss_coeff": 1e-3},
        recipe=MOE),
    "moe/capacity-factor-balancing": case({"model.moe_expert_capacity_factor": 1.0},
                                          {"model.moe_expert_capacity_factor": 1.0,
                                           "model.moe_router_load_balancing_type": "sinkhorn"}, recipe=MOE),
    "moe/pad-needs-capacity": case({"model.moe_pad_expert_input_to_capacity": True, "model.moe_expert_capacity_factor": 1.0},
                                   {"model.moe_pad_expert_input_to_capacity": True}, recipe=MOE),
    "moe/rank-capacity-factor": case(
        {"model.moe_expert_rank_capacity_factor": 1.5, "model.moe_token_dispatcher_type": "flex",
         "model.moe_flex_dispatcher_backend": "ncclep"},
        {"model.moe_expert_rank_capacity_factor": 1.5}, recipe=MOE),
    "moe/paged-stash": case({"model.moe_paged_stash": True, "model.moe_expert_rank_capacity_factor": 1.5},
                            {"model.moe_paged_stash": True}, recipe=MOE),
    "moe/bias-needs-etp-1": case({"model.add_bias_linear": True},
                                 {"model.add_bias_linear": True, "model.expert_tensor_parallel_size": 2}, recipe=MOE),
    "moe/expert-bias-score-function": case(
        {"model.moe_router_enable_expert_bias": True, "model.moe_router_score_function": "sigmoid"},
        {"model.moe_router_enable_expert_bias": True}, recipe=MOE),
    "moe/router-padding-quantization": case({**FP8, "model.moe_router_padding_for_quantization": True},
                                            {"model.moe_router_padding_for_quantization": True}, recipe=MOE),
    "moe/topk-1-pre-softmax": case({"model.moe_router_topk": 1, "model.moe_router_pre_softmax": True},
                                   {"model.moe_router_topk": 1}, recipe=MOE),
    "moe/group-limited-routing": case({"model.moe_router_group_topk": 2, "model.moe_router_num_groups": 8},
                                      {"model.moe_router_group_topk": 2, "model.moe_router_num_groups": 12}, recipe=MOE),
    "moe/allgather-fixed-lengths": case({"model.moe_token_dispatcher_type": "allgather"},
                                        {"model.moe_token_dispatcher_type": "allgather",
                                         "model.variable_seq_lengths": True}, recipe=MOE),
    "moe/ep-comm-overlap": case(EP_OVERLAP, {**EP_OVERLAP, "model.moe_shared_expert_overlap": True}, recipe=MOE,
                                gpus=(2, 2)),
    "moe/wgrad-overlap": case({**EP_OVERLAP, "model.delay_wgrad_compute": True}, {"model.delay_wgrad_compute": True},
                              recipe=MOE, gpus=(2, 2)),
    "recompute/granularity-known": case(SELECTIVE, {"model.recompute_granularity": "partial"}),
    "recompute/method-known": case(FULL_RECOMPUTE, {**FULL_RECOMPUTE, "model.recompute_method": "diagonal"}),
    "recompute/distribute-saved-activations": case(
        {**SELECTIVE, "model.distribute_saved_activations": True},
        {**SELECTIVE, "model.distribute_saved_activations": True, "model.tensor_model_parallel_size": 2,
         "model.sequence_parallel": True}, gpus=(1, 2)),
    "recompute/modules-known": case({**SELECTIVE, "model.recompute_modules": ["core_attn", "mlp"]},
                                    {**SELECTIVE, "model.recompute_modules": ["core_attn", "attention"]}),
    "recompute/modules-need-features": case({**SELECTIVE, "model.recompute_modules": ["moe_act"]},
                                            {**SELECTIVE, "model.recompute_modules": ["moe_act"],
                                             "model.moe_grouped_gemm": False}, recipe=MOE),
    "recompute/moe-layer-not-full": case({"model.moe_layer_recompute": True},
                                         {**FULL_RECOMPUTE, "model.moe_layer_recompute": True}, recipe=MOE),
    "fine-grained/delta-offload-bytes": case(FINE, {**FINE, "model.delta_offload_bytes_across_pp_ranks": -1},
                                             recipe=MOE),
    "pipeline/one-layout-way": case({**PP2, "model.num_layers_in_first_pipeline_stage": 8},
                                    {**PP2, "model.num_layers_in_first_pipeline_stage": 8,
                                     "model.account_for_loss_in_pipeline_split": True}, gpus=(2, 2)),
    "pipeline/layout-valid": case({**PP2, "model.pipeline_model_parallel_layout": "Et*8|t*8L"},
                                  {**PP2, "model.pipeline_model_parallel_layout": "Et*8|t*7L"}, gpus=(2, 2)),
    "pipeline/uneven-stages": case({**PP2, "model.num_layers_in_first_pipeline_stage": 6},
                                   {**PP2, "model.num_layers_in_first_pipeline_stage": 16}, gpus=(2, 2)),
    "pipeline/embedding-loss-split": case(
        {**PP2, "model.account_for_embedding_in_pipeline_split": True, "model.account_for_loss_in_pipeline_split": True},
        {**PP2, "model.account_for_loss_in_pipeline_split": True}, gpus=(2, 2)),
    "parallel/pipeline-dtype": case(PP2, {**PP2, "mixed_precision": None, "model.params_dtype": None}, gpus=(2, 2)),
    "parallel/defer-embedding-wgrad": case(
        {**PP2, "model.defer_embedding_wgrad_compute": True, "model.gradient_accumulation_fusion": True},
        {**PP2, "model.defer_embedding_wgrad_compute": True}, gpus=(2, 2)),
    "parallel/p2p-warmup-flush": case({"model.overlap_p2p_comm_warmup_flush": True, "model.overlap_p2p_comm": True,
                                       "model.batch_p2p_comm": False}, {"model.overlap_p2p_comm_warmup_flush": True}),
    "parallel/tp-weight-shards": case({"model.tensor_parallel_num_weight_shards": 4},
                                      {"model.tensor_parallel_num_weight_shards": 3, "model.tensor_model_parallel_size": 2},
                                      gpus=(1, 2)),
    "model/cuda-graph-legacy-flags": case({"model.enable_cuda_graph": True},
                                          {"model.enable_cuda_graph": True, "model.external_cuda_graph": True}),
    "model/cuda-graph-impl-known": case(TE_GRAPH, {"model.cuda_graph_impl": "partial"}),
    "model/cuda-graph-modules-valid": case({**TE_GRAPH, "model.cuda_graph_modules": ["attn"]},
                                           {**TE_GRAPH, "model.cuda_graph_modules": ["full", "attn"]}),
    "model/cuda-graph-inference-scope": case({"model.cuda_graph_impl": "local", "model.inference_cuda_graph_scope": "block"},
                                             {**TE_GRAPH, "model.inference_cuda_graph_scope": "block"}),
    "model/cuda-graph-local-full-iteration": case(
        {"model.cuda_graph_impl": "local", "model.cuda_graph_modules": ["full_iteration"]},
        {"model.cuda_graph_impl": "local", "model.cuda_graph_modules": ["attn"]}),
    "model/cuda-graph-full-iteration-modules": case({"model.cuda_graph_impl": "full_iteration"},
                                                    {"model.cuda_graph_impl": "full_iteration",
                                                     "model.cuda_graph_modules": ["attn"]}),
    "model/cuda-graph-moe-modules": case({**TE_GRAPH, "model.cuda_graph_modules": ["attn", "moe_router"]},
                                         {**TE_GRAPH, "model.cuda_graph_modules": ["moe"]}, recipe=MOE),
    "model/cuda-graph-recompute": case({**TE_GRAPH, **SELECTIVE}, {**TE_GRAPH, **FULL_RECOMPUTE}),
    "model/cuda-graph-fine-grained-offload": case({**TE_GRAPH, **FINE},
                                                  {**TE_GRAPH, **FINE, "model.cuda_graph_warmup_steps": 0}, recipe=MOE),
    "optimizer/mxfp8-param-gather-overlap": case(
        {"mixed_precision": None, "optimizer.reuse_grad_buf_for_mxfp8_param_ag": True},
        {"mixed_precision": None, "optimizer.reuse_grad_buf_for_mxfp8_param_ag": True,
         "optimizer.overlap_param_gather_with_optimizer_step": True}),
    "optimizer/precision-aware-adam": case({"optimizer.use_precision_aware_optimizer": True},
                                           {"optimizer.use_precision_aware_optimizer": True, "optimizer.optimizer": "sgd"}),
    "optimizer/dtypes-need-precision-aware": case({"optimizer.use_precision_aware_optimizer": False},
                                                  {"optimizer.exp_avg_dtype": torch.bfloat16}),
    "optimizer/precision-aware-te-fused-adam": case({"optimizer.use_precision_aware_optimizer": True},
                                                    {"optimizer.use_precision_aware_optimizer": True},
                                                    passing_ctx=TE_NEW, failing_ctx={"te_version": None}),
    "ddp/reuse-grad-buf-needs-fp8-param-gather": case(
        {"mixed_precision": None, "ddp.reuse_grad_buf_for_mxfp8_param_ag": True, "ddp.fp8_param_gather": True},
        {"mixed_precision": None, "ddp.reuse_grad_buf_for_mxfp8_param_ag": True, "ddp.fp8_param_gather": False}),
    "ddp/nccl-ub-expandable-segments": case(
        {"ddp.nccl_ub": True, "env_vars.PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False"},
        {"ddp.nccl_ub": True, "env_vars.PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
        passing_ctx={"torch_version": "2.10.0"}, failing_ctx={"torch_version": "2.10.0"}),
    "ddp/fp32-accumulation-patterns": case(
        {"mixed_precision": None, "ddp.grad_reduce_in_fp32": False,
         "ddp.param_name_patterns_for_fp32_local_accumulation": ["router"]},
        {"ddp.param_name_patterns_for_fp32_local_accumulation": ["router"]}),
    "ddp/buckets": case({"ddp.num_buckets": 4}, {"ddp.num_buckets": 0}),
}


def test_every_rule_has_a_case():
    assert set(CASES) == {rule.id for rule in upstream_model_rules.RULES}


def _problems(recipe, spec, which):
    cfg = recipe(spec["recipe"])
    for key, value in spec[which].items():
        set_path(cfg, key, value.make() if isinstance(value, Preset) else value)
    extra = dict(spec[f"{which}_ctx"])
    torch_version = extra.pop("torch_version", None)
    ctx = Context(cfg, spec["gpus"][0 if which == "passing" else 1], environ={}, **extra)
    if torch_version:
        ctx.torch_version = torch_version  # the PyTorch version to validate for (the rules read it as installed else)
    return ctx, check_rules(ctx)


@pytest.mark.parametrize("rule_id", sorted(CASES))
def test_rule_passes(recipe, rule_id):
    ctx, problems = _problems(recipe, CASES[rule_id], "passing")
    assert RULES_BY_ID[rule_id].applies(ctx), "the passing case must exercise the rule"
    assert rule_id not in {p.rule_id for p in problems}, [p.format() for p in problems if p.rule_id == rule_id]


@pytest.mark.parametrize("rule_id", sorted(CASES))
def test_rule_fails_with_key_value_rule_and_fix(recipe, rule_id):
    ctx, problems = _problems(recipe, CASES[rule_id], "failing")
    found = [p for p in problems if p.rule_id == rule_id]
    assert found, f"{rule_id} not reported; got {[p.rule_id for p in problems]}"
    problem, rule = found[0], RULES_BY_ID[rule_id]
    assert problem.key == rule.key and problem.rule == rule.text
    assert problem.value and problem.value != "?" and "unreadable" not in problem.value and problem.fix
    assert "could not" not in problem.fix, problem.fix  # the guard's words: the rule itself raised


def _after_setup(cfg):
    """The model as Megatron Bridge leaves it at setup: the preset finalized and applied over it (runtime_config_update)."""
    from megatron.bridge.training.mixed_precision import get_mixed_precision_config

    model, preset = copy.deepcopy(cfg.model), get_mixed_precision_config(cfg.mixed_precision)
    preset.finalize()
    preset.setup(model)
    return model


def _preset_problems(cfg):
    return [p for p in check_rules(Context(cfg, 1, environ={})) if p.rule_id.startswith("precision/preset-replaces")]


def test_an_fp4_choice_the_preset_drops_is_refused_once_and_its_fix_keeps_it(recipe):
    from overrides import apply_overrides

    # the recipes' bf16_mixed: FP4 asked for on the model (with a recipe of its own too) is gone after setup
    cfg = apply_overrides(recipe(DENSE), ["model.fp4=e2m1", "model.fp4_recipe=custom"])
    assert _after_setup(cfg).fp4 is None
    (problem,) = _preset_problems(cfg)
    assert problem.key == "model.fp4" and problem.value == "e2m1 (mixed_precision=bf16_mixed sets None)"
    assert problem.rule == RULES_BY_ID["precision/preset-replaces-fp4"].text
    assert problem.fix.startswith("mixed_precision=bf16_with_nvfp4_mixed  (")
    kept = apply_overrides(cfg, ["model.fp4_recipe=nvfp4", problem.fix.split()[0]])
    assert _after_setup(kept).fp4 == "e2m1" and not check_rules(Context(kept, 1, environ={}))


def test_an_fp4_recipe_the_nvfp4_preset_replaces_is_refused(recipe):
    from overrides import apply_overrides

    cfg = apply_overrides(recipe(DENSE), ["mixed_precision=bf16_with_nvfp4_mixed", "model.fp4_recipe=custom",
                                          "model.fp4_quantizer_factory=my.quantizers.factory"])
    assert _after_setup(cfg).fp4_recipe == "nvfp4"
    (problem,) = _preset_problems(cfg)
    assert problem.key == "model.fp4_recipe" and problem.value == "custom (mixed_precision=bf16_with_nvfp4_mixed sets nvfp4)"
    assert not _preset_problems(apply_overrides(cfg, [problem.fix.split()[0]]))


@pytest.mark.parametrize("value", ["e2m1", "nvfp4"])
def test_an_fp4_value_the_nvfp4_preset_keeps_on_passes(recipe, value):
    """Megatron Core reads model.fp4 as on or off: the preset's e2m1 over a model's nvfp4 (a Python recipe may write
    it; the override layer takes only e2m1) changes nothing it reads."""
    cfg = recipe(DENSE)
    set_path(cfg, "mixed_precision", "bf16_with_nvfp4_mixed")
    set_path(cfg, "model.fp4", value)
    assert bool(_after_setup(cfg).fp4) and not _preset_problems(cfg)


# (the case's key, the preset's name, a value the model asks for that the preset writes otherwise)
REPLACED_FP8_SETTINGS = [
    ("fp8_recipe", CURRENT, "blockwise"),
    ("fp8_param", "bf16_with_fp8_subchannel_scaling_mixed", True),
    ("fp8_dot_product_attention", CURRENT, True),
    ("fp8_multi_head_attention", DELAYED, True),
    ("fp8_amax_history_len", DELAYED, 16),
    ("fp8_amax_compute_algo", Preset(DELAYED, fp8_amax_compute_algo="most_recent"), "max"),
    ("fp8_margin", DELAYED, 2),
    ("fp8_wgrad", DELAYED, False),
    ("first_last_layers_bf16", DELAYED, True),
    ("num_layers_at_start_in_bf16", CURRENT, 2),
    ("num_layers_at_end_in_bf16", CURRENT, 3),
]


@pytest.mark.parametrize("name,preset,value", REPLACED_FP8_SETTINGS, ids=[n for n, _, _ in REPLACED_FP8_SETTINGS])
def test_an_fp8_setting_the_preset_replaces_is_refused_once_and_kept_where_the_preset_has_it(recipe, name, preset, value):
    cfg = recipe(DENSE)
    set_path(cfg, "mixed_precision", preset.make() if isinstance(preset, Preset) else preset)
    set_path(cfg, f"model.{name}", value)
    replaced = getattr(_after_setup(cfg), name)
    assert str(replaced).rsplit(".", 1)[-1] != str(value)  # Megatron Bridge drops the model's value at setup
    (problem,) = _preset_problems(cfg)
    assert problem.rule_id == f"precision/preset-replaces-{name.replace('_', '-')}" and problem.key == f"model.{name}"
    assert problem.value.startswith(f"{value} (mixed_precision=") and problem.value.endswith(f" sets {replaced})")
    assert problem.fix and "<" not in problem.fix.split()[0], problem.fix
    # the fix's first override pasted: no problem left, and what setup leaves is what the config says
    from overrides import apply_overrides

    fixed = apply_overrides(cfg, [problem.fix.split()[0]])
    assert not _preset_problems(fixed)
    # the preset as a config with the model's value: Bridge keeps it, and the rule holds
    kept = copy.deepcopy(cfg)
    as_config = _after_setup_preset(cfg)
    setattr(as_config, name, value)
    kept.mixed_precision = as_config
    assert str(getattr(_after_setup(kept), name)).rsplit(".", 1)[-1] == str(value) and not _preset_problems(kept)


def _after_setup_preset(cfg):
    from megatron.bridge.training.mixed_precision import get_mixed_precision_config

    return get_mixed_precision_config(copy.deepcopy(cfg.mixed_precision))


def test_an_fp8_recipe_the_preset_replaces_names_the_preset_with_it(recipe):
    from overrides import apply_overrides

    cfg = apply_overrides(recipe(DENSE), [f"mixed_precision={CURRENT}", "model.fp8_recipe=blockwise"])
    assert _after_setup(cfg).fp8_recipe == "tensorwise"
    (problem,) = _preset_problems(cfg)
    assert problem.rule_id == "precision/preset-replaces-fp8-recipe"
    assert problem.value == f"blockwise (mixed_precision={CURRENT} sets tensorwise)"
    assert problem.fix.startswith("mixed_precision=bf16_with_fp8_subchannel_scaling_mixed  (")
    assert "model.fp8_recipe=tensorwise" in problem.fix
    for fix in (problem.fix.split()[0], "model.fp8_recipe=tensorwise"):
        fixed = apply_overrides(cfg, [fix])
        assert _after_setup(fixed).fp8_recipe == fixed.model.fp8_recipe and not _preset_problems(fixed), fix


@pytest.mark.parametrize("fp8,fp8_recipe,preset", [("hybrid", "tensorwise", "bf16_mixed"),  # the preset turns FP8 off
                                                   ("e4m3", "mxfp8", "bf16_mixed"),
                                                   ("hybrid", "blockwise", "bf16_mixed"),
                                                   ("e4m3", "mxfp8", CURRENT)])  # another format and recipe
def test_an_fp8_format_and_recipe_both_replaced_are_one_problem_whose_fix_keeps_both(recipe, fp8, fp8_recipe, preset):
    from overrides import apply_overrides

    cfg = apply_overrides(recipe(DENSE), [f"mixed_precision={preset}", f"model.fp8={fp8}",
                                          f"model.fp8_recipe={fp8_recipe}"])
    (problem,) = _preset_problems(cfg)
    assert problem.rule_id == "precision/preset-replaces-fp8" and problem.key == "model.fp8"
    fixed = apply_overrides(cfg, [problem.fix.split()[0]])
    after = _after_setup(fixed)
    assert (after.fp8, after.fp8_recipe) == (fp8, fp8_recipe) and not _preset_problems(fixed), problem.fix


@pytest.mark.parametrize("preset", ["bf16_mixed", DELAYED, CURRENT, "bf16_with_mxfp8_mixed",
                                    "bf16_with_fp8_subchannel_scaling_mixed", "nemotron_h_bf16_with_fp8_current_scaling_mixed",
                                    "fp16_with_fp8_delayed_scaling_mixed", "bf16_with_nvfp4_mixed"])
def test_a_model_left_at_its_defaults_passes_under_every_preset(recipe, preset):
    """Megatron Core's defaults differ from the presets' (fp8_recipe delayed, num_layers_at_*_in_bf16 1): a model
    nobody set is not refused, whatever preset replaces them."""
    cfg = recipe(DENSE)
    set_path(cfg, "mixed_precision", preset)
    assert not _preset_problems(cfg)


def test_valid_recipes_break_none_of_these_rules(built):
    ids = {rule.id for rule in upstream_model_rules.RULES}
    for name in (DENSE, MOE, "qwen3_30b_a3b_proxy_fine_grained_offload_config"):
        problems = check_rules(Context(built(name), 1, environ={"NVTE_CPU_OFFLOAD_V1": "1"}, te_version="2.20.0"))
        assert [p.rule_id for p in problems if p.rule_id in ids] == []


@pytest.mark.parametrize("value", [None, 0, -1])
def test_rules_do_not_raise_on_null_zero_or_negative_values(recipe, value):
    for key in ("model.num_layers", "model.pipeline_model_parallel_size", "model.num_moe_experts",
                "model.moe_router_num_groups", "model.linear_num_key_heads", "model.cuda_graph_warmup_steps"):
        for name in (DENSE, MOE):
            cfg = recipe(name)
            for k, v in {**GDN, **PP2, "model.moe_router_group_topk": 2}.items():
                set_path(cfg, k, v)
            set_path(cfg, key, value)
            problems = check_rules(Context(cfg, 2, environ={}))
            assert all("could not" not in p.fix for p in problems if p.rule_id in CASES), key


# -- the reasons given for sites no user reaches, where they state a fact ------------------------------

def test_the_unreachable_reasons_hold(built):
    import importlib

    cfg = built(DENSE)
    assert importlib.util.find_spec("packaging") is not None  # "packaging is importable"
    assert hasattr(cfg.model, "overlap_moe_expert_parallel_comm")  # comm_overlap's model_cfg check
    assert any(hasattr(cfg.model, name) for name in ("moe_hybridep_pad_uneven_dispatch_inputs",
                                                     "moe_hybridep_pad_variable_tokens"))  # HybridEP padding field
    assert type(cfg.model).__name__ == "GPTModelProvider"  # no MLATransformerConfig
    # Bridge's finalize turns sequence parallelism off without TP, before Megatron Core checks it
    import copy

    model = copy.deepcopy(cfg.model)
    model.sequence_parallel, model.tensor_model_parallel_size = True, 1
    model.finalize()
    assert model.sequence_parallel is False


# -- keys the command line gave (Context.given_keys) ------------------------------------------------------
# The final config cannot tell a value given at Megatron Core's default from one nobody set: the keys the command line
# gave can. A given key the active preset writes over with another value is refused, whatever its value.

def _given_problems(cfg, overrides):
    from overrides.grammar import given_keys

    return [p for p in check_rules(Context(cfg, 1, environ={}, given_keys=given_keys(overrides)))
            if p.rule_id.startswith("precision/preset-replaces")]


def _pasted(overrides, fix):
    """The command line with a fix's override in place of the one of the same key (or added)."""
    key = fix.split("=", 1)[0]
    return [o for o in overrides if o.split("=", 1)[0] != key] + [fix]


def test_an_fp8_recipe_given_at_the_default_that_the_preset_replaces_is_refused_by_validate(recipe):
    """mixed_precision=bf16_with_fp8_current_scaling_mixed model.fp8_recipe=delayed: delayed is the model's default,
    the preset writes tensorwise at setup, with no message. The user asked for delayed scaling: refused, naming the
    key, the value, the rule and a fix; each fix, pasted, trains what the command line says."""
    from overrides import apply_overrides
    from overrides.grammar import given_keys
    from mbridge_offload.validation import validate

    overrides = [f"mixed_precision={CURRENT}", "model.fp8_recipe=delayed"]
    cfg = apply_overrides(recipe(DENSE), overrides)
    assert cfg.model.fp8_recipe == "delayed" and _after_setup(cfg).fp8_recipe == "tensorwise"
    report = validate(cfg, 1, environ={}, given_keys=given_keys(overrides))
    (problem,) = [p for p in report.errors if p.rule_id.startswith("precision/")]
    assert (problem.rule_id, problem.key) == ("precision/preset-replaces-fp8-recipe", "model.fp8_recipe")
    assert problem.value == f"delayed (mixed_precision={CURRENT} sets tensorwise)"
    assert problem.rule == RULES_BY_ID["precision/preset-replaces-fp8-recipe"].text
    assert problem.fix.startswith(f"mixed_precision={DELAYED}  (the preset with fp8_recipe=delayed; ")
    assert "model.fp8_recipe=tensorwise" in problem.fix
    for fix in (problem.fix.split()[0], "model.fp8_recipe=tensorwise"):
        fixed_overrides = _pasted(overrides, fix)
        fixed = apply_overrides(recipe(DENSE), fixed_overrides)
        assert _after_setup(fixed).fp8_recipe == fixed.model.fp8_recipe, fix
        assert validate(fixed, 1, environ={}, given_keys=given_keys(fixed_overrides)).ok, fix


# (the overrides as typed, the rule that refuses them): every value is the model's default (or null), which the preset
# writes over with another
GIVEN_AT_THE_DEFAULT = [
    ([f"mixed_precision={CURRENT}", "model.fp8_recipe=delayed"], "precision/preset-replaces-fp8-recipe"),
    ([f"mixed_precision={DELAYED}", "model.fp8_amax_history_len=1"], "precision/preset-replaces-fp8-amax-history-len"),
    ([f"mixed_precision={DELAYED}", "model.fp8_amax_compute_algo=most_recent"],
     "precision/preset-replaces-fp8-amax-compute-algo"),
    ([f"mixed_precision={CURRENT}", "model.fp8_param=False"], "precision/preset-replaces-fp8-param"),
    ([f"mixed_precision={CURRENT}", "model.first_last_layers_bf16=False"],
     "precision/preset-replaces-first-last-layers-bf16"),
    (["mixed_precision=nemotron_h_bf16_with_fp8_current_scaling_mixed", "model.num_layers_at_start_in_bf16=1"],
     "precision/preset-replaces-num-layers-at-start-in-bf16"),
    ([f"mixed_precision={CURRENT}", "model.fp8=null"], "precision/preset-replaces-fp8"),  # FP8 off, asked for
    (["mixed_precision=bf16_with_nvfp4_mixed", "model.fp4=null"], "precision/preset-replaces-fp4"),
]


@pytest.mark.parametrize("overrides,rule_id", GIVEN_AT_THE_DEFAULT, ids=[r for _, r in GIVEN_AT_THE_DEFAULT])
def test_a_key_given_at_the_default_that_the_preset_replaces_is_refused_once_with_a_fix_that_keeps_it(
        recipe, overrides, rule_id):
    from overrides import apply_overrides

    cfg = apply_overrides(recipe(DENSE), overrides)
    key = overrides[-1].split("=", 1)[0]
    name = key.split(".", 1)[1]
    asked = getattr(cfg.model, name)
    assert str(getattr(_after_setup(cfg), name)) != str(asked)  # Megatron Bridge drops what was asked for at setup
    assert not _preset_problems(cfg)  # the values alone: at the default, as if nobody set it
    (problem,) = _given_problems(cfg, overrides)
    assert (problem.rule_id, problem.key, problem.severity) == (rule_id, key, "error")
    assert problem.rule == RULES_BY_ID[rule_id].text
    assert problem.value.startswith(f"{asked} (mixed_precision={overrides[0].split('=', 1)[1]} sets ")
    assert problem.fix and "<" not in problem.fix.split()[0], problem.fix
    fixed_overrides = _pasted(overrides, problem.fix.split()[0])
    fixed = apply_overrides(recipe(DENSE), fixed_overrides)
    assert str(getattr(_after_setup(fixed), name)) == str(getattr(fixed.model, name)), problem.fix
    assert not _given_problems(fixed, fixed_overrides), problem.fix


@pytest.mark.parametrize("overrides", [
    [f"mixed_precision={DELAYED}", "model.fp8_recipe=delayed"],  # the preset writes the same
    [f"mixed_precision={CURRENT}", "model.fp8_recipe=tensorwise"],
    [f"mixed_precision={CURRENT}", "model.num_layers_at_start_in_bf16=1", "model.fp8_param=True"],
    ["model.fp8_recipe=delayed"],  # the recipes' bf16_mixed: no FP8, so no FP8 recipe trains
    ["mixed_precision=bf16_with_nvfp4_mixed", "model.fp8_recipe=delayed"],  # FP4: FP8 off
    ["mixed_precision=null", "model.fp8_recipe=delayed", "model.fp8_amax_history_len=1"],  # no preset: the model's own
    ["model.fp8=null", "model.fp4=null"],  # bf16_mixed writes null: the same
    [f"mixed_precision={CURRENT}", "~model.fp8_recipe"],  # a reset to the default asks for no value
], ids=["same-delayed", "same-tensorwise", "same-settings", "no-fp8-preset", "fp4-preset", "no-preset", "same-null",
        "reset"])
def test_a_key_given_that_the_preset_keeps_or_never_reads_passes(recipe, overrides):
    from overrides import apply_overrides

    assert not _given_problems(apply_overrides(recipe(DENSE), overrides), overrides)


def test_a_config_composed_in_python_is_judged_on_its_values_as_before(recipe):
    """No command line: Context's given_keys is empty, a value at the default reads as unset and one set otherwise is
    the model's own, as before."""
    from mbridge_offload.validation import validate

    cfg = recipe(DENSE)
    set_path(cfg, "mixed_precision", CURRENT)
    set_path(cfg, "model.fp8_recipe", "delayed")
    assert Context(cfg, 1).given_keys == frozenset()
    assert not _preset_problems(cfg)
    assert validate(cfg, 1, environ={}, upstream=False) == validate(cfg, 1, environ={}, upstream=False,
                                                                      given_keys=frozenset())
    set_path(cfg, "model.fp8_recipe", "blockwise")
    (problem,) = _preset_problems(cfg)
    assert problem.rule_id == "precision/preset-replaces-fp8-recipe"


def test_dry_run_refuses_an_fp8_recipe_given_at_the_default_that_the_preset_replaces():
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, str(root / "scripts" / "run_recipe.py"), "--recipe", DENSE, "--dry-run",
         f"mixed_precision={CURRENT}", "model.fp8_recipe=delayed"],
        capture_output=True, text=True, timeout=300, cwd=root)
    out = done.stdout + done.stderr
    assert done.returncode == 2, out
    assert "Validation for 1 GPU: FAILED (1 error" in out, out
    assert (f"[precision/preset-replaces-fp8-recipe] model.fp8_recipe = delayed (mixed_precision={CURRENT} sets "
            "tensorwise)") in out
    assert f"rule: {RULES_BY_ID['precision/preset-replaces-fp8-recipe'].text}" in out
    assert f"fix:  mixed_precision={DELAYED}  (the preset with fp8_recipe=delayed; " in out
    assert "Traceback" not in out
