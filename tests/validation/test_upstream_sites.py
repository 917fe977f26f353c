"""Every check of upstream's pre-launch validation (runtime_config_update -> ConfigContainer.validate() and
what it calls in megatron.bridge.training.config, and what it reaches outside it: the model's
TransformerConfig.__post_init__, Megatron Core's optimizer / DDP __post_init__, CUDA-graph, mixed-precision and
comm-overlap checks), read from the installed source, has a rule of the table (or a stated reason no user reaches
it); the rules agree with upstream on real configs; what still arrives untranslated is printed whole, with where
it came from."""

from __future__ import annotations

import pytest

from overrides import apply_overrides
from mbridge_offload.facts.config_tree import set_path
from mbridge_offload.validation import RULES_BY_ID, validate
from mbridge_offload.validation.checks import check_rules
from mbridge_offload.validation.rule import Context
from mbridge_offload.validation.upstream import rule_for, translate_upstream, upstream_failure
from mbridge_offload.validation.upstream_rules import SITES, UNREACHABLE, site_target
from mbridge_offload.validation.upstream_sites import CONFIG_MODULE, EXTERNAL_ROOTS, upstream_sites

DENSE = "qwen3_1b_proxy_pretrain_config"
MOE = "qwen3_30b_a3b_proxy_pretrain_config"


def test_the_walk_reaches_validate_and_what_it_calls():
    sites = upstream_sites()
    functions = {site.function for site in sites}
    assert {"ConfigContainer.validate", "ConfigContainer._validate_and_apply_deterministic_mode",
            "ConfigContainer._calculate_scheduler_steps", "SchedulerConfig.finalize", "TrainingConfig.finalize",
            "CheckpointConfig.finalize", "apply_environment_variables", "_validate_mixed_precision_consistency",
            "ConfigContainer.get_data_parallel_size"} <= functions
    assert len(sites) >= 90


def test_the_walk_reaches_what_validate_calls_outside_its_module():
    sites = [site for site in upstream_sites() if site.module != CONFIG_MODULE]
    by_module = {}
    for site in sites:
        by_module.setdefault(site.module, set()).add(site.function)
    assert "TransformerConfig.__post_init__" in by_module["megatron.core.transformer.transformer_config"]
    assert "ModelParallelConfig.__post_init__" in by_module["megatron.core.model_parallel_config"]
    assert "OptimizerConfig.__post_init__" in by_module["megatron.core.optimizer.optimizer_config"]
    assert "DistributedDataParallelConfig.__post_init__" in by_module[
        "megatron.core.distributed.distributed_data_parallel_config"]
    assert "validate_cuda_graph_configuration" in by_module["megatron.bridge.utils.cuda_graph"]
    assert {"PipelineParallelLayerLayout.__init__", "PipelineParallelLayerLayout.validate_layer_layout",
            "PipelineParallelLayerLayout.parse_str_to_list"} <= by_module[
        "megatron.core.transformer.pipeline_parallel_layer_layout"]  # parse_str_to_list: followed from from_str
    assert {module for module, _ in EXTERNAL_ROOTS} == set(by_module)  # every root holds checks
    assert len([s for s in sites if s.function == "TransformerConfig.__post_init__"]) >= 190
    assert all(site.section for site in sites)


def test_validate_reaches_the_external_roots():
    """The roots are where validate() / runtime_config_update call out (read in their source), so a refactor
    upstream that moves a call fails here rather than silently dropping a module from the walk."""
    import inspect

    from megatron.bridge.models.transformer_config import TransformerConfig as BridgeTransformerConfig
    from megatron.bridge.training import config

    validate_src = inspect.getsource(config.ConfigContainer.validate)
    update_src = inspect.getsource(config.runtime_config_update)
    finalize_src = inspect.getsource(BridgeTransformerConfig.finalize)
    assert "self.model.finalize()" in validate_src and "MCoreTransformerConfig.__post_init__(self)" in finalize_src
    assert "validate_cuda_graph_configuration(self.model)" in validate_src
    assert "self.optimizer.finalize()" in validate_src and "self.ddp.finalize()" in validate_src
    assert "_enable_safe_hybridep_dispatch(" in validate_src and "_resolve_string_fields(self)" in finalize_src
    assert "get_mixed_precision_config(" in update_src and "cfg.mixed_precision.finalize()" in update_src
    assert "cfg.comm_overlap.setup(" in update_src


def test_every_upstream_site_has_a_rule_or_a_reason():
    unmapped = [f"{s.function}:{s.lineno}: {s.text}" for s in upstream_sites() if site_target(s.text) is None]
    assert not unmapped, ("upstream validate() has checks without a rule; add a rule (in upstream_rules.py, or "
                          "upstream_model_rules.py for what it reaches outside its module) or a reason to "
                          "mbridge_offload/validation/upstream_rules.py SITES / MODEL_SITES:\n" + "\n".join(unmapped))
    for site in upstream_sites():
        target = site_target(site.text)
        if target.startswith(UNREACHABLE):
            assert len(target) > len(UNREACHABLE) + 20, f"say why no user reaches {site.text!r}"
        else:
            assert target in RULES_BY_ID, f"{site.text!r} -> unknown rule {target!r}"


def test_no_site_entry_is_stale():
    texts = [site.text for site in upstream_sites()]
    stale = [prefix for prefix, _ in SITES if not any(text.startswith(prefix) for text in texts)]
    assert not stale, f"entries of SITES that match no upstream check any more: {stale}"


AGREEMENT = {  # overrides on the dense proxy (1 GPU) -> the rule upstream's first refusal is translated to
    ("scheduler.max_steps=0",): "scheduler/max-steps-positive",
    ("scheduler.max_steps=5", "train.train_iters=10"): "scheduler/max-steps-covers-train",
    ("scheduler.start_weight_decay=-1",): "scheduler/start-weight-decay",
    ("scheduler.start_weight_decay=0.1", "scheduler.end_weight_decay=0.01"): "scheduler/weight-decay-order",
    ("scheduler.override_opt_param_scheduler=True", "scheduler.use_checkpoint_opt_param_scheduler=True"):
        "scheduler/override-or-checkpoint",
    ("scheduler.lr_warmup_samples=10",): "scheduler/iters-or-samples",
    ("scheduler.lr_warmup_fraction=0.1",): "scheduler/warmup-one-way",
    ("train.train_samples=100",): "train/one-length",
    ("train.train_iters=null",): "train/one-length",
    ("train.train_samples=1000", "train.train_iters=null"): "scheduler/sample-based-fields",
    ("train.train_samples=1000", "train.train_iters=null", "scheduler.lr_warmup_iters=0",
     "scheduler.lr_decay_iters=null", "scheduler.max_steps=10"): "scheduler/max-steps-iteration-based",
    ("train.num_epochs=1",): "train/num-epochs-dataset",
    ("dataset.reset_position_ids=null",): "dataset/reset-position-ids-set",
    ("checkpoint.pretrained_checkpoint=/nonexistent/ckpt",): "checkpointing/pretrained-exists",
    ("checkpoint.async_save=True",): "checkpointing/async-needs-save",
    ("checkpoint.ckpt_step=5",): "checkpointing/ckpt-step-needs-load",
    ("checkpoint.load_main_params_from_ckpt=True", "checkpoint.load_optim=True"):
        "checkpointing/main-params-without-optim",
    ("checkpoint.also_save_hf_checkpoint=True",): "checkpointing/hf-export-source",
    ("checkpoint.async_save=True", "checkpoint.save=/tmp/x", "checkpoint.ckpt_format=torch"):
        "checkpointing/async-format",
    ("dist.use_gloo_process_groups=False", "checkpoint.ckpt_format=torch"): "checkpointing/distributed-optimizer-format",
    ("logger.mlflow_experiment=x",): "logging/mlflow-run-name",
    ("logger.comet_project=x",): "logging/comet-experiment-name",
    ("profiling.profile_step_start=5", "profiling.profile_step_end=2"): "profiling/step-order",
    ("profiling.use_pytorch_profiler=True", "profiling.use_nsys_profiler=True"): "profiling/one-profiler",
    ("validation.eval_global_batch_size=7",): "parallel/eval-global-batch",
    ("dist.eval_context_parallel_size=3",): "parallel/eval-world-size",
    ("mixed_precision=null", "model.fp16=True", "model.bf16=True"): "precision/model-bf16-or-fp16",
    ("mixed_precision=null", "optimizer.use_precision_aware_optimizer=True", "optimizer.bf16=False"):
        "precision/aware-optimizer-bf16",
    ("dist.use_megatron_fsdp=True", "dist.use_torch_fsdp2=True"): "distributed/fsdp-exclusive",
    ("dist.use_decentralized_pg=True", "dist.use_gloo_process_groups=True"): "distributed/decentralized-pg-gloo",
    ("model.context_parallel_size=1", "model.hierarchical_context_parallel_sizes=[2]"):
        "parallel/hierarchical-cp-product",
    ("model.deterministic_mode=True",): "deterministic/cross-entropy-fusion",
    ("model.recompute_granularity=full", "model.recompute_method=null"): "recompute/full-needs-method",
    ("model.recompute_granularity=selective", "model.recompute_num_layers=2"): "recompute/selective-no-num-layers",
}


@pytest.mark.parametrize("texts", sorted(AGREEMENT), ids=lambda texts: " ".join(texts))
def test_the_rule_table_reports_what_upstream_refuses_before_it_runs(built, texts):
    cfg = apply_overrides(built(DENSE), list(texts))
    expected = AGREEMENT[texts]
    ours = {p.rule_id: p for p in check_rules(Context(cfg, 1, environ={}))}
    assert expected in ours, f"the rule table misses what upstream refuses: {sorted(ours)}"
    failure = upstream_failure(cfg, 1, {})
    assert failure is not None and rule_for(failure) == expected, failure
    problem = ours[expected]
    assert problem.key and problem.fix and "?" != problem.value
    report = validate(cfg, 1, environ={})
    assert [p.rule_id for p in report.errors].count(expected) == 1  # upstream's repeat dropped


PP2 = ("model.pipeline_model_parallel_size=2",)
SELECTIVE = ("model.recompute_granularity=selective",)
MODEL_AGREEMENT = {  # (recipe, GPUs, overrides) -> the rule upstream's first refusal (outside its module) is
    (DENSE, 2, (*SELECTIVE, "model.distribute_saved_activations=True", "model.tensor_model_parallel_size=2",
                "model.sequence_parallel=True")): "recompute/distribute-saved-activations",
    (DENSE, 1, (*SELECTIVE, "model.recompute_modules=[core_attn,attention]")): "recompute/modules-known",
    (DENSE, 1, (*SELECTIVE, "model.recompute_modules=[moe_act]")): "recompute/modules-need-features",
    (DENSE, 1, ("model.bias_activation_fusion=True", "model.use_te_activation_func=True")):
        "model/bias-activation-fusion",
    (DENSE, 1, ("model.fused_residual_rmsnorm=True", "model.normalization=LayerNorm")): "model/fused-residual-rmsnorm",
    (DENSE, 2, (*PP2, "model.num_layers_in_first_pipeline_stage=16")): "pipeline/uneven-stages",
    (DENSE, 2, (*PP2, "model.account_for_loss_in_pipeline_split=True")): "pipeline/embedding-loss-split",
    (DENSE, 2, (*PP2, "model.num_layers_in_first_pipeline_stage=6", "model.account_for_loss_in_pipeline_split=True")):
        "pipeline/one-layout-way",
    (DENSE, 2, (*PP2, "model.pipeline_model_parallel_layout=Et*8|t*7L")): "pipeline/layout-valid",
    (DENSE, 2, (*PP2, "model.defer_embedding_wgrad_compute=True")): "parallel/defer-embedding-wgrad",
    (DENSE, 1, ("model.overlap_p2p_comm_warmup_flush=True",)): "parallel/p2p-warmup-flush",
    (DENSE, 1, ("model.moe_ffn_hidden_size=512",)): "moe/ffn-hidden-size-needs-experts",
    (DENSE, 1, ("model.cuda_graph_impl=local", "model.cuda_graph_modules=[attn]")):
        "model/cuda-graph-local-full-iteration",
    (DENSE, 1, ("model.cuda_graph_impl=full_iteration", "model.cuda_graph_modules=[attn]",
                "rerun_state_machine.check_for_nan_in_loss=False")): "model/cuda-graph-full-iteration-modules",
    (DENSE, 1, ("model.cuda_graph_impl=transformer_engine", "model.recompute_granularity=full",
                "model.recompute_method=uniform", "model.recompute_num_layers=1")): "model/cuda-graph-recompute",
    (DENSE, 1, ("model.no_rope_freq=5",)): "model/no-rope-freq",
    (DENSE, 1, ("model.experimental_attention_variant=gated_delta_net",)): "model/gated-delta-net",
    (DENSE, 1, ("model.batch_invariant_mode=True",)): "model/batch-invariant-mode",
    (DENSE, 1, ("model.transformer_impl=inference_optimized", "model.add_bias_linear=True")):
        "model/inference-optimized",
    (DENSE, 1, ("model.use_mup=True", "model.mup_base_hidden_size=-1")): "model/mup-base-hidden-size",
    (DENSE, 1, ("ddp.num_buckets=0",)): "ddp/buckets",
    (DENSE, 1, ("optimizer.use_precision_aware_optimizer=True", "optimizer.optimizer=sgd")):
        "optimizer/precision-aware-adam",
    (DENSE, 1, ("mixed_precision=bf16_with_nothing_mixed",)): "precision/preset-known",
    (MOE, 1, ("model.moe_pad_expert_input_to_capacity=True",)): "moe/pad-needs-capacity",
    (MOE, 1, ("model.moe_expert_capacity_factor=1.0", "model.moe_router_load_balancing_type=sinkhorn")):
        "moe/capacity-factor-balancing",
    (MOE, 1, ("model.moe_router_topk=1",)): "moe/topk-1-pre-softmax",
    (MOE, 1, ("model.moe_router_enable_expert_bias=True",)): "moe/expert-bias-score-function",
    (MOE, 1, ("model.moe_router_group_topk=2",)): "moe/group-limited-routing",
    (MOE, 1, ("model.moe_shared_expert_intermediate_size=0",)): "moe/shared-expert-size",
    (MOE, 1, ("model.overlap_moe_expert_parallel_comm=True",)): "moe/ep-comm-overlap",
    (MOE, 1, ("model.moe_flex_dispatcher_backend=ncclep",)): "moe/flex-dispatcher",
    (MOE, 1, ("model.moe_token_dispatcher_type=allgather", "model.variable_seq_lengths=True")):
        "moe/allgather-fixed-lengths",
}


@pytest.mark.parametrize("spec", sorted(MODEL_AGREEMENT), ids=lambda spec: f"{spec[0][:8]}-{spec[1]}: " + " ".join(spec[2]))
def test_the_model_rules_report_what_upstream_refuses_first(built, spec):
    name, gpus, texts = spec
    cfg = apply_overrides(built(name), list(texts))
    expected = MODEL_AGREEMENT[spec]
    ours = {p.rule_id: p for p in check_rules(Context(cfg, gpus, environ={}))}
    assert expected in ours, f"the rule table misses what upstream refuses: {sorted(ours)}"
    failure = upstream_failure(cfg, gpus, {})
    assert failure is not None and failure.site_text is not None, failure  # found by its site, not by its words
    assert rule_for(failure) == expected, failure
    problem = ours[expected]
    assert problem.key and problem.fix and "?" != problem.value
    assert [p.rule_id for p in validate(cfg, gpus, environ={}).errors].count(expected) == 1  # upstream's repeat dropped


def test_several_model_problems_show_at_once(built):
    """Upstream stops at the first; the rule table reports them all, each with key and fix."""
    cfg = apply_overrides(built(MOE), ["model.moe_router_topk=1", "model.moe_router_enable_expert_bias=True",
                                       "model.moe_shared_expert_intermediate_size=0",
                                       "model.moe_pad_expert_input_to_capacity=True", *SELECTIVE,
                                       "model.recompute_modules=[core_attn,attention]"])
    ids = {p.rule_id for p in validate(cfg, 1, environ={}).errors}
    assert {"moe/topk-1-pre-softmax", "moe/expert-bias-score-function", "moe/shared-expert-size",
            "moe/pad-needs-capacity", "recompute/modules-known"} <= ids


def test_a_valid_config_breaks_none_of_the_translated_rules(built):
    from mbridge_offload.validation import upstream_rules

    ids = {rule.id for rule in upstream_rules.RULES}
    for name in (DENSE, "qwen3_30b_a3b_proxy_fine_grained_offload_config"):
        problems = check_rules(Context(built(name), 1, environ={"NVTE_CPU_OFFLOAD_V1": "1"}))
        assert [p.rule_id for p in problems if p.rule_id in ids] == []


def test_deterministic_mode_reports_every_requirement_at_once_with_key_and_fix(built):
    cfg = apply_overrides(built(DENSE), ["model.deterministic_mode=True"])
    report = validate(cfg, 1, environ={})
    by_id = {p.rule_id: p for p in report.errors}
    assert set(by_id) == {"deterministic/cross-entropy-fusion", "deterministic/nccl-algo",
                          "deterministic/nvte-allow-nondeterministic-algo", "deterministic/cublas-workspace-config"}
    assert by_id["deterministic/nccl-algo"].key == "env_vars.NCCL_ALGO"
    assert "environment variable" in by_id["deterministic/nccl-algo"].value
    for problem in report.errors:
        assert problem.fix and problem.value != "?"
    assert "= ?" not in report.format() and "see the rule" not in report.format()


def test_an_untranslated_upstream_message_names_its_section_and_is_printed_whole(recipe):
    # A site no override reaches (an activation function given by name, as only Python code can) has no rule.
    cfg = recipe(DENSE)
    set_path(cfg, "model.activation_func", "no_such_activation")
    failure = upstream_failure(cfg, 1, {})
    assert failure is not None and rule_for(failure) is None
    assert failure.site_text is not None and site_target(failure.site_text).startswith(UNREACHABLE)
    assert failure.section == "model" and "str_to_callable" in failure.where
    problem = translate_upstream(failure, cfg, Context(cfg, 1, environ={}))
    text = problem.format()
    assert "[upstream: ConfigContainer.validate -> str_to_callable / model]" in text
    assert failure.message.strip() in text  # whole, not cut to a first line or a pattern
    assert "= ?" not in text and "see the rule" not in text
    assert [p.source for p in validate(cfg, 1, environ={}).errors] == ["upstream"]


def test_a_model_check_names_where_upstream_raised_it(built):
    cfg = apply_overrides(built(MOE), ["model.moe_pad_expert_input_to_capacity=True"])
    failure = upstream_failure(cfg, 1, {})
    assert failure.where == "ConfigContainer.validate -> TransformerConfig.__post_init__ / model"
    assert failure.site_text and site_target(failure.site_text) == "moe/pad-needs-capacity"


def test_a_message_without_any_key_still_says_where_it_came_from(built):
    cfg = built(DENSE)
    problem = translate_upstream("something upstream did not like", cfg, Context(cfg, 1, environ={}))
    text = problem.format()
    assert text.startswith("ERROR   [upstream: ConfigContainer.validate]")
    assert "something upstream did not like" in text and "= ?" not in text and "see the rule" not in text
