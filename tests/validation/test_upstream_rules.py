"""Every translated upstream check (validation/upstream_rules.py) has a case where it applies and holds and
one where it is broken, reported with key, value, rule and fix (as tests/validation/test_rules.py does for
the offload rules), on real recipe configs."""

from __future__ import annotations

import dataclasses
import tempfile

import pytest

from mbridge_offload.facts.config_tree import set_path
from mbridge_offload.validation import RULES_BY_ID, Context, check_rules
from mbridge_offload.validation import upstream_rules

DENSE = "qwen3_1b_proxy_pretrain_config"  # 16 layers, GBS/MBS from the recipe, bf16_mixed
SAMPLES = {"train.train_samples": 1000, "train.train_iters": None}
FSDP = {"ddp.use_megatron_fsdp": True}
FP32 = {"mixed_precision": None, "model.bf16": False, "model.fp16": False}
NO_MODULES = {"has_module": lambda name: False}
ALL_MODULES = {"has_module": lambda name: True}


def _mxfp8(reuse: bool):
    from megatron.bridge.training.mixed_precision import get_mixed_precision_config

    preset = get_mixed_precision_config("bf16_with_mxfp8_mixed")
    return dataclasses.replace(preset, fp8_param_gather=True, reuse_grad_buf_for_mxfp8_param_ag=reuse)


def _lora():
    from megatron.bridge.peft.lora import LoRA

    return LoRA()


def _nvrx(**fields):
    from megatron.bridge.training.config import NVRxStragglerDetectionConfig

    return NVRxStragglerDetectionConfig(enabled=True, **fields)


def case(passing, failing, gpus=(1, 1), passing_ctx=None, failing_ctx=None, recipe=DENSE):
    return dict(recipe=recipe, passing=passing, failing=failing, gpus=gpus, passing_ctx=passing_ctx or {},
                failing_ctx=failing_ctx or {})


CASES = {
    "train/one-length": case({}, {"train.train_iters": None}),
    "train/num-epochs-dataset": case({}, {"train.num_epochs": 1.0}),
    "train/train-samples-positive": case(SAMPLES, {**SAMPLES, "train.train_samples": 0}),
    "train/no-rampup-with-samples": case(SAMPLES, {**SAMPLES, "train.rampup_batch_size": [1, 1, 100]}),
    "train/global-batch-set": case({}, {"train.global_batch_size": None}),
    "train/micro-batch-set": case({}, {"train.micro_batch_size": None}),
    "scheduler/max-steps-positive": case({"scheduler.max_steps": 10**6}, {"scheduler.max_steps": 0}),
    "scheduler/max-steps-iteration-based": case(SAMPLES, {**SAMPLES, "scheduler.max_steps": 10}),
    "scheduler/max-steps-covers-train": case({"scheduler.max_steps": 10**6}, {"scheduler.max_steps": 1}),
    "scheduler/start-weight-decay": case({"scheduler.start_weight_decay": 0.0, "scheduler.end_weight_decay": 0.1},
                                         {"scheduler.start_weight_decay": -1.0}),
    "scheduler/weight-decay-order": case({"scheduler.start_weight_decay": 0.0, "scheduler.end_weight_decay": 0.1},
                                         {"scheduler.start_weight_decay": 0.2, "scheduler.end_weight_decay": 0.1}),
    "scheduler/override-or-checkpoint": case(
        {"scheduler.override_opt_param_scheduler": True, "scheduler.use_checkpoint_opt_param_scheduler": False},
        {"scheduler.override_opt_param_scheduler": True, "scheduler.use_checkpoint_opt_param_scheduler": True}),
    "scheduler/iters-or-samples": case({}, {"scheduler.lr_warmup_samples": 10}),
    "scheduler/warmup-one-way": case({"scheduler.lr_warmup_fraction": 0.1, "scheduler.lr_warmup_iters": 0},
                                     {"scheduler.lr_warmup_fraction": 0.1, "scheduler.lr_warmup_iters": 10}),
    "scheduler/sample-based-fields": case({**SAMPLES, "scheduler.lr_warmup_iters": 0, "scheduler.lr_decay_iters": None},
                                          {**SAMPLES, "scheduler.lr_warmup_iters": 10}),
    "scheduler/iteration-based-fields": case({}, {"scheduler.lr_decay_samples": 100}),
    "scheduler/decay-steps-positive": case({"scheduler.lr_decay_iters": 100}, {"scheduler.lr_decay_iters": 0}),
    **{f"dataset/{name.replace('_', '-')}-set": case({}, {f"dataset.{name}": None})
       for name in ("reset_position_ids", "reset_attention_mask", "eod_mask_loss")},
    "checkpointing/pretrained-exists": case({"checkpoint.pretrained_checkpoint": tempfile.gettempdir()},
                                            {"checkpoint.pretrained_checkpoint": "/nonexistent/checkpoint"}),
    "checkpointing/main-params-without-optim": case(
        {"checkpoint.load_main_params_from_ckpt": True, "checkpoint.load_optim": False},
        {"checkpoint.load_main_params_from_ckpt": True, "checkpoint.load_optim": True}),
    "checkpointing/async-needs-save": case({"checkpoint.async_save": True, "checkpoint.save": "/tmp/ckpt"},
                                           {"checkpoint.async_save": True, "checkpoint.save": None}),
    "checkpointing/async-needs-persistent-worker": case(
        {"checkpoint.async_save": True, "checkpoint.use_persistent_ckpt_worker": True},
        {"checkpoint.async_save": True, "checkpoint.use_persistent_ckpt_worker": False}),
    "checkpointing/async-format": case({"checkpoint.async_save": True, "checkpoint.ckpt_format": "torch_dist"},
                                       {"checkpoint.async_save": True, "checkpoint.ckpt_format": "torch"}),
    "checkpointing/hf-export-format": case(
        {"checkpoint.also_save_hf_checkpoint": True, "checkpoint.ckpt_format": "torch_dist"},
        {"checkpoint.also_save_hf_checkpoint": True, "checkpoint.ckpt_format": "fsdp_dtensor"}),
    "checkpointing/hf-export-not-local": case(
        {"checkpoint.also_save_hf_checkpoint": True, "checkpoint.non_persistent_ckpt_type": "global"},
        {"checkpoint.also_save_hf_checkpoint": True, "checkpoint.non_persistent_ckpt_type": "local"}),
    "checkpointing/hf-export-source": case(
        {"checkpoint.also_save_hf_checkpoint": True, "checkpoint.hf_source_path": "Qwen/Qwen3-1.7B"},
        {"checkpoint.also_save_hf_checkpoint": True, "checkpoint.hf_source_path": None}),
    "checkpointing/ckpt-step-needs-load": case({"checkpoint.ckpt_step": 5, "checkpoint.load": "/tmp/never-saved"},
                                               {"checkpoint.ckpt_step": 5, "checkpoint.load": None}),
    "checkpointing/reshardable-mem-efficient": case(
        {"checkpoint.dist_ckpt_optim_fully_reshardable": True,
         "checkpoint.distrib_optim_fully_reshardable_mem_efficient": False},
        {"checkpoint.dist_ckpt_optim_fully_reshardable": True,
         "checkpoint.distrib_optim_fully_reshardable_mem_efficient": True}),
    "checkpointing/distributed-optimizer-format": case(
        {"dist.use_gloo_process_groups": False, "checkpoint.ckpt_format": "torch_dist"},
        {"dist.use_gloo_process_groups": False, "checkpoint.ckpt_format": "torch"}),
    "checkpointing/fsdp-dtensor-needs-megatron-fsdp": case(
        {**FSDP, "checkpoint.save": "/tmp/ckpt", "checkpoint.ckpt_format": "fsdp_dtensor"},
        {"checkpoint.save": "/tmp/ckpt", "checkpoint.ckpt_format": "fsdp_dtensor"}),
    **{f"precision/{section}-bf16-or-fp16": case(
        {"mixed_precision": None, f"{section}.bf16": True, f"{section}.fp16": False},
        {"mixed_precision": None, f"{section}.bf16": True, f"{section}.fp16": True})
       for section in ("model", "optimizer")},
    "precision/aware-optimizer-bf16": case(
        {"optimizer.use_precision_aware_optimizer": True},  # the bf16_mixed preset sets both
        {"mixed_precision": None, "optimizer.use_precision_aware_optimizer": True, "optimizer.bf16": False}),
    "precision/aware-optimizer-fp16": case(
        {**FP32, "model.fp16": True, "optimizer.use_precision_aware_optimizer": True, "optimizer.bf16": False,
         "optimizer.fp16": True},
        {**FP32, "model.fp16": True, "optimizer.use_precision_aware_optimizer": True, "optimizer.bf16": False,
         "optimizer.fp16": False}),
    "precision/aware-optimizer-fp32": case(
        {**FP32, "optimizer.use_precision_aware_optimizer": True, "optimizer.bf16": False, "optimizer.fp16": False},
        {**FP32, "optimizer.use_precision_aware_optimizer": True, "optimizer.bf16": True, "optimizer.fp16": False}),
    "precision/mxfp8-reuse-grad-buf": case({"mixed_precision": _mxfp8(True)}, {"mixed_precision": _mxfp8(False)}),
    "distributed/fsdp-exclusive": case({"dist.use_megatron_fsdp": True, "dist.use_torch_fsdp2": False},
                                       {"dist.use_megatron_fsdp": True, "dist.use_torch_fsdp2": True}),
    "distributed/fsdp-checkpoint-format": case(
        {**FSDP, "checkpoint.save": "/tmp/ckpt", "checkpoint.ckpt_format": "fsdp_dtensor"},
        {**FSDP, "checkpoint.save": "/tmp/ckpt", "checkpoint.ckpt_format": "torch_dist"}),
    "distributed/fsdp-cuda-device-max-connections": case(
        {**FSDP, "env_vars.CUDA_DEVICE_MAX_CONNECTIONS": "8"}, {**FSDP, "env_vars.CUDA_DEVICE_MAX_CONNECTIONS": "1"}),
    "distributed/fsdp-manual-registration": case({**FSDP, "ddp.fsdp_manual_registration": False},
                                                 {**FSDP, "ddp.fsdp_manual_registration": True}),
    "distributed/fsdp-weight-hash": case(
        {**FSDP, "ddp.data_parallel_sharding_strategy": "optim_grads_params",
         "train.check_weight_hash_across_dp_replicas_interval": None},
        {**FSDP, "ddp.data_parallel_sharding_strategy": "optim_grads_params",
         "train.check_weight_hash_across_dp_replicas_interval": 10}),
    "distributed/fsdp-tp-pp-dp-mapping": case(FSDP, {**FSDP, "dist.use_tp_pp_dp_mapping": True}),
    "distributed/decentralized-pg-gloo": case(
        {"dist.use_decentralized_pg": True, "dist.use_gloo_process_groups": False},
        {"dist.use_decentralized_pg": True, "dist.use_gloo_process_groups": True}),
    "parallel/eval-world-size": case({"dist.eval_context_parallel_size": 1}, {"dist.eval_context_parallel_size": 3}),
    "parallel/eval-global-batch": case({}, {"validation.eval_global_batch_size": 7}, gpus=(1, 1)),
    "parallel/cp-comm-type-per-layer": case(
        {"model.context_parallel_size": 2, "model.cp_comm_type": ["p2p"] * 16},
        {"model.context_parallel_size": 2, "model.cp_comm_type": ["p2p"] * 3}, gpus=(2, 2)),
    "parallel/hierarchical-cp-needed": case(
        {"model.cp_comm_type": "a2a+p2p", "model.hierarchical_context_parallel_sizes": [1]},
        {"model.cp_comm_type": "a2a+p2p", "model.hierarchical_context_parallel_sizes": None}),
    "parallel/hierarchical-cp-product": case({"model.hierarchical_context_parallel_sizes": [1]},
                                             {"model.hierarchical_context_parallel_sizes": [2]}),
    "model/full-iteration-graph-nan-check": case(
        {"model.cuda_graph_impl": "full_iteration", "rerun_state_machine.check_for_nan_in_loss": False},
        {"model.cuda_graph_impl": "full_iteration", "rerun_state_machine.check_for_nan_in_loss": True}),
    "model/modelopt-no-grad-accumulation-fusion": case(
        {"model.restore_modelopt_state": True, "model.gradient_accumulation_fusion": False},
        {"model.restore_modelopt_state": True, "model.gradient_accumulation_fusion": True}),
    "model/peft-needs-pretrained": case(
        {"peft": _lora(), "checkpoint.pretrained_checkpoint": tempfile.gettempdir()},
        {"peft": _lora(), "checkpoint.pretrained_checkpoint": None}),
    "recompute/full-needs-method": case(
        {"model.recompute_granularity": "full", "model.recompute_method": "uniform", "model.recompute_num_layers": 1},
        {"model.recompute_granularity": "full", "model.recompute_method": None, "model.recompute_num_layers": 1}),
    "recompute/full-needs-num-layers": case(
        {"model.recompute_granularity": "full", "model.recompute_method": "uniform", "model.recompute_num_layers": 1},
        {"model.recompute_granularity": "full", "model.recompute_method": "uniform",
         "model.recompute_num_layers": None}),
    "recompute/selective-no-num-layers": case(
        {"model.recompute_granularity": "selective", "model.recompute_num_layers": None},
        {"model.recompute_granularity": "selective", "model.recompute_num_layers": 2}),
    "logging/mlflow-run-name": case({"logger.mlflow_experiment": "x", "logger.mlflow_run_name": "run"},
                                    {"logger.mlflow_experiment": "x", "logger.mlflow_run_name": None}),
    "logging/mlflow-installed": case({"logger.mlflow_experiment": "x"}, {"logger.mlflow_experiment": "x"},
                                     passing_ctx=ALL_MODULES, failing_ctx=NO_MODULES),
    "logging/comet-experiment-name": case({"logger.comet_project": "x", "logger.comet_experiment_name": "e"},
                                          {"logger.comet_project": "x", "logger.comet_experiment_name": None}),
    "logging/comet-installed": case({"logger.comet_project": "x"}, {"logger.comet_project": "x"},
                                    passing_ctx=ALL_MODULES, failing_ctx=NO_MODULES),
    "profiling/one-profiler": case(
        {"profiling.use_pytorch_profiler": True, "profiling.use_nsys_profiler": False},
        {"profiling.use_pytorch_profiler": True, "profiling.use_nsys_profiler": True}),
    "profiling/profile-step-start": case({}, {"profiling.profile_step_start": -1}),
    "profiling/profile-step-end": case({}, {"profiling.profile_step_end": -1}),
    "profiling/step-order": case({}, {"profiling.profile_step_start": 5, "profiling.profile_step_end": 2}),
    "nvrx/measures-something": case({"nvrx_straggler": _nvrx()},
                                    {"nvrx_straggler": _nvrx(calc_relative_gpu_perf=False,
                                                             calc_individual_gpu_perf=False)}),
    "nvrx/report-interval": case({"nvrx_straggler": _nvrx()}, {"nvrx_straggler": _nvrx(report_time_interval=0)}),
    "nvrx/gpu-relative-perf-threshold": case({"nvrx_straggler": _nvrx()},
                                             {"nvrx_straggler": _nvrx(gpu_relative_perf_threshold=1.5)}),
    "nvrx/gpu-individual-perf-threshold": case({"nvrx_straggler": _nvrx()},
                                               {"nvrx_straggler": _nvrx(gpu_individual_perf_threshold=-0.1)}),
    "env/env-var-names": case({"env_vars": {"A": "1"}}, {"env_vars": {"": "1"}}),
    "env/env-var-values": case({"env_vars.X": "1"}, {"env_vars.X": [1, 2]}),
}

# The rule's trigger is the violation itself: its passing case is the valid neighbour, where it does not apply.
PASS_BY_NOT_APPLYING = {"train/num-epochs-dataset"}


def test_every_translated_rule_has_a_case():
    assert set(CASES) == {rule.id for rule in upstream_rules.RULES}


def _problems(recipe, spec, which):
    cfg = recipe(spec["recipe"])
    for key, value in spec[which].items():
        set_path(cfg, key, value)
    ctx = Context(cfg, spec["gpus"][0 if which == "passing" else 1], environ={}, **spec[f"{which}_ctx"])
    return ctx, check_rules(ctx)


@pytest.mark.parametrize("rule_id", sorted(CASES))
def test_translated_rule_passes(recipe, rule_id):
    ctx, problems = _problems(recipe, CASES[rule_id], "passing")
    assert RULES_BY_ID[rule_id].applies(ctx) != (rule_id in PASS_BY_NOT_APPLYING), "the passing case must exercise it"
    assert rule_id not in {p.rule_id for p in problems}


@pytest.mark.parametrize("rule_id", sorted(CASES))
def test_translated_rule_fails_with_key_value_rule_and_fix(recipe, rule_id):
    ctx, problems = _problems(recipe, CASES[rule_id], "failing")
    found = [p for p in problems if p.rule_id == rule_id]
    assert found, f"{rule_id} not reported; got {[p.rule_id for p in problems]}"
    problem, rule = found[0], RULES_BY_ID[rule_id]
    assert problem.key == rule.key and problem.rule == rule.text
    assert problem.value and problem.value != "?" and problem.fix


@pytest.mark.parametrize("sizes, named_by", [({"train.train_iters": -3}, "parallel/train-iters-range"),
                                             ({"train.global_batch_size": 0}, "parallel/global-batch-range"),
                                             ({**SAMPLES, "train.train_samples": 0}, "train/train-samples-positive")])
def test_a_decay_that_follows_a_refused_size_is_that_sizes_error_alone(recipe, sizes, named_by):
    """The decay's length follows the training's when the scheduler does not set it: a size <= 0 is its own key's
    error, not also the scheduler's (whose fix, lr_decay_iters=null, would already be its value)."""
    ctx, problems = _problems(recipe, case({}, sizes), "failing")
    ids = {p.rule_id for p in problems}
    assert named_by in ids and "scheduler/decay-steps-positive" not in ids


def test_a_sample_based_decay_of_zero_is_fixed_on_the_samples_key(recipe):
    ctx, problems = _problems(recipe, case({}, {**SAMPLES, "scheduler.lr_decay_samples": 0}), "failing")
    (problem,) = [p for p in problems if p.rule_id == "scheduler/decay-steps-positive"]
    assert problem.fix.startswith("scheduler.lr_decay_samples=null")
