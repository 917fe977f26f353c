"""Every rule of the rule table has a case where it applies and holds, and one where it is broken.

Each case starts from a real recipe, sets a few keys, and checks the rule table through the same
``check_rules`` the validator uses. A broken rule must come back with its key, value, rule and fix.
"""

from __future__ import annotations

import math
import tempfile
from pathlib import Path

import pytest
import torch
from megatron.bridge.training.config import FaultToleranceConfig

from mbridge_offload.facts.checkpoint_dir import RUN_CONFIG_FILE
from mbridge_offload.facts.config_tree import set_path
from mbridge_offload.facts.determinism import DETERMINISTIC_ENV
from mbridge_offload.facts.key_ranges import GRID_RANGES
from mbridge_offload.validation import RULES_BY_ID, Context, check_rules

DENSE = "qwen3_1b_proxy_pretrain_config"  # 16 layers, 16 heads, 8 query groups
DENSE_OPT = "qwen3_1b_proxy_optimizer_offload_config"
DENSE_ACT = "qwen3_1b_proxy_activation_offload_config"
MOE = "qwen3_30b_a3b_pretrain_config"  # 48 layers, 128 experts, TP2 PP2 EP4, 16 GPUs
MOE_FG = "qwen3_30b_a3b_proxy_fine_grained_offload_config"
FT = FaultToleranceConfig()


def case(recipe, passing, failing, gpus=(1, 1), passing_ctx=None, failing_ctx=None):
    return dict(recipe=recipe, passing=passing, failing=failing, gpus=gpus,
                passing_ctx=passing_ctx or {}, failing_ctx=failing_ctx or {})


FG_DENSE = {"model.fine_grained_activation_offloading": True, "env_vars.NVTE_CPU_OFFLOAD_V1": "1"}
NO_MODULES = {"has_module": lambda name: False}
ALL_MODULES = {"has_module": lambda name: True}

DETERMINISTIC = {"model.deterministic_mode": True, "model.cross_entropy_loss_fusion": False,
                 **{f"env_vars.{name}": value for name, value in DETERMINISTIC_ENV.items()}}


def _checkpoint(offload: bool, fraction: float) -> str:
    """A checkpoint folder as Megatron Bridge leaves it, as far as the resume rules read it."""
    folder = Path(tempfile.mkdtemp(prefix="ckpt-")) / "iter_0000005"
    folder.mkdir()
    (folder / RUN_CONFIG_FILE).write_text(
        "optimizer:\n  _target_: megatron.bridge.training.config.OptimizerConfig\n"
        f"  optimizer_cpu_offload: {str(offload).lower()}\n  optimizer_offload_fraction: {fraction}\n"
        "  use_precision_aware_optimizer: false\n  exp_avg_dtype: !!python/name:torch.float32 ''\n")
    return str(folder.parent)


SAVED_AT_HALF, SAVED_WITHOUT = _checkpoint(True, 0.5), _checkpoint(False, 0.0)

EXACT = {"env_vars.MBRIDGE_OFFLOAD_ENGINE": "exact", "optimizer.overlap_cpu_optimizer_d2h_h2d": True}
DELAYED = {**EXACT, "env_vars.MBRIDGE_OFFLOAD_ENGINE": "delayed"}
STREAM = {**EXACT, "env_vars.MBRIDGE_OFFLOAD_ENGINE": "stream"}
FETCH_AHEAD = "env_vars.MBRIDGE_OFFLOAD_STREAM_FETCH_AHEAD"
MOMENTS = "env_vars.MBRIDGE_OFFLOAD_STREAM_MOMENTS"
COPY_WINDOW = "env_vars.MBRIDGE_OFFLOAD_COPY_PIECES_IN_FLIGHT"
BY_REGION = "env_vars.MBRIDGE_OFFLOAD_ZERO_BY_REGION"
COPY_START = "env_vars.MBRIDGE_OFFLOAD_DELAYED_COPY_START"
PAUSE = "env_vars.MBRIDGE_OFFLOAD_COPY_PIECE_PAUSE_US"
RESUME_AT_HALF = {"checkpoint.load": SAVED_AT_HALF, "optimizer.optimizer_offload_fraction": 0.5}

CASES = {
    "optimizer-offload/fraction-range": case(DENSE_OPT, {"optimizer.optimizer_offload_fraction": 0.3},
                                             {"optimizer.optimizer_offload_fraction": 1.5}),
    "optimizer-offload/distributed-optimizer": case(
        DENSE_OPT, {"ddp.use_distributed_optimizer": False},
        {"optimizer.use_distributed_optimizer": False, "ddp.use_distributed_optimizer": False}),
    "optimizer-offload/optimizer-kind": case(DENSE_OPT, {"optimizer.optimizer": "sgd"}, {"optimizer.optimizer": "muon"}),
    "optimizer-offload/decoupled-weight-decay": case(DENSE_OPT, {}, {"optimizer.decoupled_weight_decay": False}),
    "optimizer-offload/fraction-zero": case(DENSE_OPT, {"optimizer.optimizer_offload_fraction": 0.05},
                                            {"optimizer.optimizer_offload_fraction": 0.0}),
    "optimizer-offload/fraction-ignored": case(DENSE, {"optimizer.optimizer_offload_fraction": 0.0},
                                               {"optimizer.optimizer_offload_fraction": 0.5}),
    "optimizer-offload/overlap-ignored": case(DENSE, {"optimizer.overlap_cpu_optimizer_d2h_h2d": False},
                                              {"optimizer.overlap_cpu_optimizer_d2h_h2d": True}),
    "optimizer-offload/precision-aware-ignored": case(
        DENSE_OPT, {"optimizer.use_precision_aware_optimizer": True},
        {"optimizer.use_precision_aware_optimizer": True, "optimizer.exp_avg_dtype": torch.bfloat16,
         "optimizer.exp_avg_sq_dtype": torch.bfloat16}),
    "planner/reserve-rule-known": case(DENSE_OPT, {"env_vars.MBRIDGE_OFFLOAD_RESERVE_RULE": "steady-peak"},
                                       {"env_vars.MBRIDGE_OFFLOAD_RESERVE_RULE": "tightest"}),
    "offload-engine/known": case(DENSE_OPT, DELAYED, {**EXACT, "env_vars.MBRIDGE_OFFLOAD_ENGINE": "fastest"}),
    "offload-engine/needs-optimizer-offload": case(DENSE_OPT, EXACT, {**EXACT, "optimizer.optimizer_cpu_offload": False,
                                                                      "optimizer.optimizer_offload_fraction": 0.0}),
    "offload-engine/needs-overlap-streams": case(DENSE_OPT, DELAYED,
                                                 {**DELAYED, "optimizer.overlap_cpu_optimizer_d2h_h2d": False}),
    "offload-engine/delayed-several-ranks": case(DENSE_OPT, DELAYED, DELAYED, gpus=(1, 2)),
    "offload-engine/stream-adam": case(DENSE_OPT, {**EXACT, "env_vars.MBRIDGE_OFFLOAD_ENGINE": "stream"},
                                       {**EXACT, "env_vars.MBRIDGE_OFFLOAD_ENGINE": "stream", "optimizer.optimizer": "sgd"}),
    "offload-engine/stream-several-ranks": case(DENSE_OPT, {**EXACT, "env_vars.MBRIDGE_OFFLOAD_ENGINE": "stream"},
                                                {**EXACT, "env_vars.MBRIDGE_OFFLOAD_ENGINE": "stream"}, gpus=(1, 2)),
    "offload-engine/exact-several-ranks": case(DENSE_OPT, EXACT, EXACT, gpus=(1, 2)),
    "offload-engine/fetch-ahead-known": case(DENSE_OPT, {**STREAM, FETCH_AHEAD: "off"}, {**STREAM, FETCH_AHEAD: "yes"}),
    "offload-engine/fetch-ahead-needs-stream": case(DENSE_OPT, {**STREAM, FETCH_AHEAD: "on"}, {**EXACT, FETCH_AHEAD: "on"}),
    "offload-engine/fetch-ahead-measured": case(DENSE_OPT, {**STREAM, FETCH_AHEAD: "off"}, {**STREAM, FETCH_AHEAD: "on"}),
    "offload-engine/copy-pieces-in-flight-known": case(DENSE_OPT, {**DELAYED, COPY_WINDOW: "1"},
                                                       {**DELAYED, COPY_WINDOW: "5"}),
    "offload-engine/copy-pieces-need-exact-or-delayed": case(DENSE_OPT, {**EXACT, COPY_WINDOW: "2"},
                                                             {**STREAM, COPY_WINDOW: "1"}),
    "offload-engine/zero-by-region-known": case(DENSE_OPT, {**DELAYED, BY_REGION: "off"}, {**DELAYED, BY_REGION: "1"}),
    "offload-engine/zero-by-region-needs-exact-or-delayed": case(DENSE_OPT, {**EXACT, BY_REGION: "on"},
                                                                 {**STREAM, BY_REGION: "on"}),
    "offload-engine/zero-by-region-needs-unfused-accumulation": case(
        DENSE_OPT, {**DELAYED, BY_REGION: "on"}, {**DELAYED, BY_REGION: "on", "model.gradient_accumulation_fusion": True}),
    "offload-engine/copy-piece-pause-known": case(DENSE_OPT, {**DELAYED, PAUSE: "20"}, {**DELAYED, PAUSE: "0.02"}),
    "offload-engine/copy-piece-pause-needs-exact-or-delayed": case(DENSE_OPT, {**EXACT, PAUSE: "20"},
                                                                   {**STREAM, PAUSE: "20"}),
    "offload-engine/copy-piece-pause-or-window": case(DENSE_OPT, {**DELAYED, PAUSE: "20"},
                                                      {**DELAYED, PAUSE: "20", COPY_WINDOW: "1"}),
    "offload-engine/copy-piece-pause-unmeasured": case(DENSE_OPT, DELAYED, {**DELAYED, PAUSE: "20"}),
    "offload-engine/delayed-copy-start-unmeasured": case(DENSE_OPT, {**DELAYED, COPY_START: "step"},
                                                         {**DELAYED, COPY_START: "next-step"}),
    "offload-engine/delayed-copy-start-known": case(DENSE_OPT, {**DELAYED, COPY_START: "next-step"},
                                                    {**DELAYED, COPY_START: "later"}),
    "offload-engine/delayed-copy-start-needs-delayed": case(DENSE_OPT, {**DELAYED, COPY_START: "next-step"},
                                                            {**EXACT, COPY_START: "next-step"}),
    "offload-engine/zero-by-region-no-gain": case(DENSE_OPT, {**DELAYED, BY_REGION: "off"},
                                                     {**DELAYED, BY_REGION: "on"}),
    "offload-engine/stream-moments-known": case(DENSE_OPT, {**STREAM, MOMENTS: "bf16"}, {**STREAM, MOMENTS: "fp16"}),
    "offload-engine/stream-moments-need-stream": case(DENSE_OPT, {**STREAM, MOMENTS: "bf16"}, {**EXACT, MOMENTS: "bf16"}),
    "offload-engine/stream-moments-not-exact": case(DENSE_OPT, {**STREAM, MOMENTS: "fp32"}, {**STREAM, MOMENTS: "bf16"}),
    "offload-engine/stream-sync-save": case(DENSE_OPT, {**EXACT, "env_vars.MBRIDGE_OFFLOAD_ENGINE": "stream"},
                                            {**EXACT, "env_vars.MBRIDGE_OFFLOAD_ENGINE": "stream",
                                             "checkpoint.async_save": True, "checkpoint.save": "/tmp/ckpt"}),
    "offload-engine/not-run-with-activation-offload": case(DENSE_OPT, EXACT, {**EXACT, "model.cpu_offloading": True}),
    "offload-engine/not-run-with-fine-grained": case(DENSE_OPT, EXACT, {**EXACT, **FG_DENSE}),
    "offload-engine/not-run-with-pipeline": case(DENSE_OPT, {**EXACT, "env_vars.MBRIDGE_OFFLOAD_ENGINE": "stream"},
                                                 {**EXACT, "env_vars.MBRIDGE_OFFLOAD_ENGINE": "stream",
                                                  "model.pipeline_model_parallel_size": 2}, gpus=(1, 2)),
    "offload-engine/delayed-low-precision-weights": case(DENSE_OPT, DELAYED, {**DELAYED, "model.bf16": False}),
    "offload-engine/params-norm": case(DENSE_OPT, EXACT, {**EXACT, "logger.log_params_norm": True}),
    "offload-engine/bf16-params-fp8-param-gather": case(DENSE_OPT, EXACT, {**EXACT, "ddp.fp8_param_gather": True}),
    "offload-engine/bf16-params-fp4-param-gather": case(DENSE_OPT, EXACT, {**EXACT, "ddp.fp4_param_gather": True}),
    "offload-engine/bf16-params-use-precision-aware-optimizer": case(
        DENSE_OPT, EXACT, {**EXACT, "optimizer.use_precision_aware_optimizer": True}),
    "offload-engine/bf16-params-use-megatron-fsdp": case(DENSE_OPT, DELAYED, {**DELAYED, "ddp.use_megatron_fsdp": True}),
    "offload-engine/cuda-graphs": case(DENSE_OPT, EXACT, {**EXACT, "model.cuda_graph_impl": "local"}),
    "offload-engine/optimizer-cuda-graph": case(DENSE_OPT, EXACT, {**EXACT, "optimizer.optimizer_cuda_graph": True}),
    "activation-offload/num-layers-range": case(DENSE_ACT, {"model.cpu_offloading_num_layers": 15},
                                                {"model.cpu_offloading_num_layers": 16}),
    "activation-offload/pipeline-parallel": case(DENSE_ACT, {}, {"model.pipeline_model_parallel_size": 2}, gpus=(1, 2)),
    "activation-offload/recompute": case(DENSE_ACT, {}, {"model.recompute_granularity": "full",
                                                         "model.recompute_method": "uniform",
                                                         "model.recompute_num_layers": 1}),
    "activation-offload/cuda-graphs": case(DENSE_ACT, {}, {"model.cuda_graph_impl": "transformer_engine"}),
    "activation-offload/not-with-fine-grained": case(
        DENSE_ACT, {}, {**FG_DENSE, "model.offload_modules": ["core_attn"]}),
    "activation-offload/offloads-something": case(
        DENSE_ACT, {"model.cpu_offloading_activations": False, "model.cpu_offloading_weights": True},
        {"model.cpu_offloading_activations": False, "model.cpu_offloading_weights": False}),
    "activation-offload/transformer-engine": case(DENSE_ACT, {}, {"model.transformer_impl": "local"}),
    "activation-offload/paged-stash": case(DENSE_ACT, {}, {"model.moe_paged_stash": True}),
    "fine-grained/modules-known": case(MOE_FG, {"model.offload_modules": ["core_attn", "attn_proj"]},
                                       {"model.offload_modules": ["expert_fc2"]}),
    "fine-grained/fraction-range": case(MOE_FG, {"model.activation_offload_fraction": 0.5},
                                        {"model.activation_offload_fraction": -0.1}),
    "fine-grained/min-tensor-size": case(MOE_FG, {"model.min_offloaded_tensor_size": 0},
                                         {"model.min_offloaded_tensor_size": -1}),
    "fine-grained/pp-balance": case(MOE_FG, {"model.delta_offload_bytes_across_pp_ranks": 4096},
                                    {"model.delta_offload_bytes_across_pp_ranks": -5}),
    "fine-grained/modules-given": case(MOE_FG, {}, {"model.offload_modules": []}),
    "fine-grained/transformer-engine": case(MOE_FG, {}, {"model.transformer_impl": "local"}),
    "fine-grained/attn-proj-needs-core-attn": case(MOE_FG, {"model.offload_modules": ["core_attn", "attn_proj"]},
                                                   {"model.offload_modules": ["attn_proj"]}),
    "fine-grained/moe-modules-need-experts": case(DENSE, {**FG_DENSE, "model.offload_modules": ["core_attn"]},
                                                  {**FG_DENSE, "model.offload_modules": ["expert_fc1"]}),
    "fine-grained/fused-group-mlp": case(
        MOE_FG, {"model.offload_modules": ["fused_group_mlp"], "model.use_transformer_engine_op_fuser": True},
        {"model.offload_modules": ["fused_group_mlp", "moe_act"], "model.use_transformer_engine_op_fuser": True}),
    "fine-grained/not-inside-moe-recompute": case(
        MOE_FG, {"model.recompute_granularity": "selective", "model.recompute_modules": ["core_attn"]},
        {"model.recompute_granularity": "selective", "model.recompute_modules": ["moe"]}),
    "fine-grained/cuda-graphs": case(MOE_FG, {"model.cuda_graph_impl": "transformer_engine"},
                                     {"model.cuda_graph_impl": "local", "model.offload_modules": ["core_attn"]}),
    "fine-grained/nvte-cpu-offload-v1": case(MOE_FG, {}, {"env_vars": {}}),
    "parallel/world-size": case(MOE, {}, {}, gpus=(16, 6)),
    "parallel/layers-per-stage": case(MOE, {"model.pipeline_model_parallel_size": 4},
                                      {"model.pipeline_model_parallel_size": 5}, gpus=(16, 20)),
    "parallel/layers-per-virtual-stage": case(
        DENSE, {"model.pipeline_model_parallel_size": 2, "model.virtual_pipeline_model_parallel_size": 4},
        {"model.pipeline_model_parallel_size": 2, "model.virtual_pipeline_model_parallel_size": 3}, gpus=(2, 2)),
    "parallel/interleaved-micro-batches": case(
        DENSE, {"model.pipeline_model_parallel_size": 2, "model.virtual_pipeline_model_parallel_size": 2,
                "train.global_batch_size": 8},  # micro batch 2 x DP 1: 4 micro batches in groups of PP=2
        {"model.pipeline_model_parallel_size": 2, "model.virtual_pipeline_model_parallel_size": 2,
         "train.global_batch_size": 6}, gpus=(2, 2)),  # 3 micro batches: a last group of 1 < PP
    "parallel/global-batch": case(MOE, {"train.global_batch_size": 8}, {"train.global_batch_size": 6}, gpus=(16, 16)),
    # 16 heads, 8 query groups: TP16 gives each rank one group, replicated (Megatron Core allows it); TP32 splits no head
    "parallel/heads-per-tp": case(DENSE, {"model.tensor_model_parallel_size": 16},
                                  {"model.tensor_model_parallel_size": 32}, gpus=(16, 32)),
    "parallel/heads-per-query-group": case(DENSE, {"model.num_query_groups": 4}, {"model.num_query_groups": 3}),
    "parallel/experts-per-ep": case(MOE, {"model.expert_model_parallel_size": 8},
                                    {"model.expert_model_parallel_size": 3}, gpus=(16, 12)),
    "parallel/expert-grid": case(MOE, {}, {"model.expert_model_parallel_size": 16}, gpus=(16, 16)),
    "parallel/ep-needs-experts": case(DENSE, {"model.expert_model_parallel_size": 2, "model.num_moe_experts": 8},
                                      {"model.expert_model_parallel_size": 2}, gpus=(2, 2)),
    "parallel/seq-length-match": case(DENSE, {"model.seq_length": 1024, "dataset.seq_length": 1024},
                                      {"dataset.seq_length": 1024}),
    "parallel/seq-length-cp": case(DENSE, {"model.context_parallel_size": 2},
                                   {"model.context_parallel_size": 2, "model.seq_length": 2050,
                                    "dataset.seq_length": 2050}, gpus=(2, 2)),
    # 2049 positions do not split over TP2's sequence-parallel ranks
    "parallel/seq-length-sp": case(DENSE, {"model.tensor_model_parallel_size": 2, "model.sequence_parallel": True},
                                   {"model.tensor_model_parallel_size": 2, "model.sequence_parallel": True,
                                    "model.seq_length": 2049, "dataset.seq_length": 2049}, gpus=(2, 2)),
    "parallel/shared-expert-ffn-per-tp": case(MOE, {"model.moe_shared_expert_intermediate_size": 1024},
                                              {"model.moe_shared_expert_intermediate_size": 1001}, gpus=(16, 16)),
    "env/transformer-engine": case(DENSE, {}, {}, failing_ctx={"te_version": None}),
    "env/apex-gradient-accumulation-fusion": case(
        DENSE, {"model.gradient_accumulation_fusion": True}, {"model.gradient_accumulation_fusion": True},
        passing_ctx=ALL_MODULES, failing_ctx=NO_MODULES),
    "env/nvidia-resiliency-ext": case(DENSE, {"ft": FT}, {"ft": FT}, passing_ctx=ALL_MODULES, failing_ctx=NO_MODULES),
    "env/fast-hadamard-transform": case(
        DENSE, {"model.experimental_attention_variant": "dsa"}, {"model.experimental_attention_variant": "dsa"},
        passing_ctx=ALL_MODULES, failing_ctx=NO_MODULES),
    "deterministic/cross-entropy-fusion": case(DENSE, DETERMINISTIC,
                                               {**DETERMINISTIC, "model.cross_entropy_loss_fusion": True}),
    "deterministic/nccl-algo": case(DENSE, DETERMINISTIC, {**DETERMINISTIC, "env_vars.NCCL_ALGO": "NVLS"}),
    "deterministic/nvte-allow-nondeterministic-algo": case(
        DENSE, DETERMINISTIC, {**DETERMINISTIC, "env_vars.NVTE_ALLOW_NONDETERMINISTIC_ALGO": "1"}),
    "deterministic/cublas-workspace-config": case(
        DENSE, DETERMINISTIC, {**DETERMINISTIC, "env_vars.CUBLAS_WORKSPACE_CONFIG": ":0:0"}),
    "checkpoint/offload-turned-on": case(DENSE_OPT, RESUME_AT_HALF, {"checkpoint.load": SAVED_WITHOUT}),
    "checkpoint/fraction-changed": case(DENSE_OPT, RESUME_AT_HALF,
                                        {**RESUME_AT_HALF, "optimizer.optimizer_offload_fraction": 1.0}),
    "checkpoint/precision-aware-changed": case(
        DENSE_OPT, RESUME_AT_HALF, {**RESUME_AT_HALF, "optimizer.use_precision_aware_optimizer": True}),
}


def test_no_resume_rule_applies_without_a_checkpoint_to_load(recipe):
    cfg = recipe(DENSE_OPT)
    set_path(cfg, "checkpoint.load", str(Path(tempfile.mkdtemp()) / "never-saved"))
    ctx = Context(cfg, 1, environ={})
    assert not any(RULES_BY_ID[i].applies(ctx) for i in RULES_BY_ID if i.startswith("checkpoint/"))


def test_deterministic_environment_set_in_the_shell_counts(recipe):
    cfg = recipe(DENSE)
    set_path(cfg, "model.deterministic_mode", True)
    set_path(cfg, "model.cross_entropy_loss_fusion", False)
    problems = check_rules(Context(cfg, 1, environ=dict(DETERMINISTIC_ENV)))
    assert not [p for p in problems if p.rule_id.startswith("deterministic/")]
    problems = check_rules(Context(cfg, 1, environ={}))
    assert {p.key for p in problems if p.rule_id.startswith("deterministic/")} == {
        f"env_vars.{name}" for name in DETERMINISTIC_ENV}


# The sizes the rules and the planner divide by (facts.key_ranges.GRID_RANGES): the recipe's own value
# passes, zero is refused by key (before: a ZeroDivisionError inside a rule).
CASES.update({key_range.id: case(DENSE, {}, {key_range.key: 0}) for key_range in GRID_RANGES})
# the MoE sizes are read on MoE models only: 129 of 128 experts, a zero-width expert
CASES.update({"parallel/topk-range": case(MOE, {"model.moe_router_topk": 128}, {"model.moe_router_topk": 129},
                                          gpus=(16, 16)),
              "parallel/expert-ffn-range": case(MOE, {"model.moe_ffn_hidden_size": None},
                                                {"model.moe_ffn_hidden_size": 0}, gpus=(16, 16))})
# read with full recompute only: 0 layers per uniform chunk never ends the first forward
CASES["parallel/recompute-num-layers-range"] = case(
    DENSE, {"model.recompute_granularity": "full", "model.recompute_method": "uniform", "model.recompute_num_layers": 1},
    {"model.recompute_granularity": "full", "model.recompute_method": "uniform", "model.recompute_num_layers": 0})
# Bridge's setup divides by it when it pads the tokenizer's vocabulary
CASES["parallel/vocab-padding-range"] = case(DENSE, {"model.make_vocab_size_divisible_by": 64},
                                             {"model.make_vocab_size_divisible_by": 0})
# keys of a fixed set of words that upstream types plain str (validation/choices.py): a word of the set, a typo


def _preset(fp8):
    """A mixed_precision given whole (a MixedPrecisionConfig, not a preset's name), with its own fp8 format."""
    from megatron.bridge.training.mixed_precision import get_mixed_precision_config

    preset = get_mixed_precision_config("bf16_mixed")
    preset.fp8 = fp8
    return preset


CASES.update({
    "choices/optimizer": case(DENSE, {"optimizer.optimizer": "muon"}, {"optimizer.optimizer": "foo"}),
    "choices/normalization": case(DENSE, {"model.normalization": "LayerNorm"}, {"model.normalization": "Foo"}),
    "choices/fp8-format": case(DENSE, {"model.fp8": "hybrid"}, {"model.fp8": "bf16"}),
    "choices/preset-fp8-format": case(DENSE, {"mixed_precision": _preset("e4m3")}, {"mixed_precision": _preset("E5M2")}),
    "choices/moe-load-balancing": case(MOE, {"model.moe_router_load_balancing_type": "seq_aux_loss"},
                                       {"model.moe_router_load_balancing_type": "aux_los"}, gpus=(16, 16)),
    "choices/fsdp-sharding": case(DENSE, {"ddp.data_parallel_sharding_strategy": "optim_grads_params"},
                                  {"ddp.data_parallel_sharding_strategy": "optim_grad"}),
    "choices/fsdp-outer-sharding": case(DENSE, {"ddp.outer_dp_sharding_strategy": "optim"},
                                        {"ddp.outer_dp_sharding_strategy": "full"}),
    "choices/async-checkpoint-strategy": case(DENSE, {"checkpoint.async_strategy": "mcore"},
                                              {"checkpoint.async_strategy": "torch"}),
    "choices/runtime-time-unit": case(DENSE, {"logger.runtime_time_unit": "minutes"},
                                      {"logger.runtime_time_unit": "hour"}),
})
# Qwen3-30B-A3B's TP2 with sequence parallelism (the recipe's), and without: Megatron Core raises in the first forward
CASES["parallel/moe-tp-needs-sequence-parallel"] = case(MOE, {"model.sequence_parallel": True},
                                                        {"model.sequence_parallel": False}, gpus=(16, 16))
# widths a tensor-parallel linear splits (Megatron Core's divide() asserts when it builds the model)
CASES.update({
    "parallel/ffn-per-tp": case(DENSE, {"model.tensor_model_parallel_size": 2},
                                {"model.tensor_model_parallel_size": 2, "model.ffn_hidden_size": 6143}, gpus=(2, 2)),
    "parallel/expert-ffn-per-etp": case(MOE, {"model.expert_tensor_parallel_size": 2},
                                        {"model.expert_tensor_parallel_size": 2, "model.moe_ffn_hidden_size": 767},
                                        gpus=(16, 16)),
    "parallel/vocab-per-tp": case(DENSE, {"model.tensor_model_parallel_size": 2},
                                  {"model.tensor_model_parallel_size": 2, "model.vocab_size": 151001}, gpus=(2, 2)),
})
# the recipes' NullTokenizer has the model's vocabulary (151936): a smaller model.vocab_size is refused at setup
# tokenizer.use_tokenizer_vocab_size takes the NullTokenizer's 151936 over a model.vocab_size that differs
CASES["model/vocab-replaced-by-tokenizer"] = case(DENSE, {"tokenizer.use_tokenizer_vocab_size": True},
                                                  {"tokenizer.use_tokenizer_vocab_size": True, "model.vocab_size": 200000})
# model.vocab_size given on the command line: kept where the NullTokenizer's vocabulary is the same, refused where not
GIVEN_VOCAB = {"given_keys": frozenset({"model.vocab_size"})}
CASES["model/given-vocab-replaced-by-tokenizer"] = case(
    DENSE, {"tokenizer.use_tokenizer_vocab_size": True, "model.vocab_size": 151936},
    {"tokenizer.use_tokenizer_vocab_size": True, "model.vocab_size": 200000},
    passing_ctx=GIVEN_VOCAB, failing_ctx=GIVEN_VOCAB)
# the flex dispatcher's GPU check: made where there is a CUDA device, said to be skipped where there is none
CASES["env/flex-dispatcher-gpu-unchecked"] = case(
    MOE, {"model.moe_token_dispatcher_type": "flex"}, {"model.moe_token_dispatcher_type": "flex"}, gpus=(16, 16),
    passing_ctx={"has_cuda": lambda: True}, failing_ctx={"has_cuda": lambda: False})
CASES["model/vocab-below-tokenizer"] = case(DENSE, {"model.vocab_size": 1024, "tokenizer.vocab_size": 1024},
                                            {"model.vocab_size": 1024})


@pytest.mark.parametrize("rule_id", ["parallel/ffn-per-tp", "parallel/expert-ffn-per-etp", "parallel/vocab-per-tp",
                                     "parallel/layers-per-virtual-stage", "parallel/interleaved-micro-batches"])
def test_the_fix_of_a_width_or_schedule_rule_resolves_it(recipe, rule_id):
    """The override the fix starts with, pasted, makes the problem go away (and raises no other grid problem)."""
    from overrides import apply_overrides

    ctx, problems = _problems(recipe, CASES[rule_id], "failing")
    (problem,) = [p for p in problems if p.rule_id == rule_id]
    fixed = apply_overrides(ctx.cfg, [problem.fix.split()[0]])
    after = {p.rule_id for p in check_rules(Context(fixed, ctx.num_gpus, environ={})) if p.rule_id.startswith("parallel/")}
    assert not after, after


def _problems(recipe, spec, which):
    cfg = recipe(spec["recipe"])
    for key, value in spec[which].items():
        set_path(cfg, key, value)
    gpus = spec["gpus"][0 if which == "passing" else 1]
    ctx = Context(cfg, gpus, environ={}, **spec[f"{which}_ctx"])
    return ctx, check_rules(ctx)


def test_every_rule_has_a_passing_and_a_failing_case():
    # runtime failures (validation/runtime_failures.py) never apply to a config: tests/diagnosis checks them on logs
    # upstream's own checks, translated (validation/upstream_rules.py): tests/validation/test_upstream_rules.py;
    # what validate() reaches outside its module (validation/upstream_model_rules.py): test_upstream_model_rules.py
    from mbridge_offload.validation.upstream_rules import RULES as UPSTREAM_RULES

    from mbridge_offload.validation.upstream_model_rules import RULES as UPSTREAM_MODEL_RULES  # ...model_rules.py

    from mbridge_offload.validation.runtime_failures import RULES as RUNTIME_RULES

    translated = {rule.id for rule in (*UPSTREAM_RULES, *UPSTREAM_MODEL_RULES)}
    diagnose_only = {rule.id for rule in RUNTIME_RULES}  # runtime/... and the offload engine's engine/...
    assert set(CASES) == {rule_id for rule_id in RULES_BY_ID
                          if rule_id not in diagnose_only and rule_id not in translated}


# Rules whose trigger is the violation itself (e.g. "moe in recompute_modules while offloading MoE
# modules"): their passing case is the neighbouring valid setting, where the rule does not apply.
PASS_BY_NOT_APPLYING = {
    "optimizer-offload/fraction-ignored", "optimizer-offload/overlap-ignored",
    "fine-grained/moe-modules-need-experts", "fine-grained/not-inside-moe-recompute",
    # warnings that hold nowhere they apply: fetch-ahead costs reserved memory for no measured gain
    "offload-engine/fetch-ahead-measured",
    "offload-engine/zero-by-region-no-gain",  # a notice: no step-time gain measured
    "offload-engine/copy-piece-pause-unmeasured",  # a notice: sized only together with the next one
    "offload-engine/delayed-copy-start-unmeasured",  # likewise
    "offload-engine/stream-moments-not-exact",  # bf16 moments round the moments at every step
    "env/flex-dispatcher-gpu-unchecked",  # a notice that holds nowhere it applies: the check it names is skipped
}


@pytest.mark.parametrize("rule_id", sorted(CASES))
def test_rule_passes(recipe, rule_id):
    ctx, problems = _problems(recipe, CASES[rule_id], "passing")
    rule = RULES_BY_ID[rule_id]
    assert rule.applies(ctx) != (rule_id in PASS_BY_NOT_APPLYING), "the passing case must exercise the rule"
    assert rule_id not in {p.rule_id for p in problems}


@pytest.mark.parametrize("rule_id", sorted(CASES))
def test_rule_fails_with_key_value_rule_and_fix(recipe, rule_id):
    ctx, problems = _problems(recipe, CASES[rule_id], "failing")
    found = [p for p in problems if p.rule_id == rule_id]
    assert found, f"{rule_id} not reported; got {[p.rule_id for p in problems]}"
    problem = found[0]
    rule = RULES_BY_ID[rule_id]
    assert problem.key == rule.key and problem.rule == rule.text
    assert problem.value and problem.fix and problem.severity == rule.severity


def _bridge_setup_vocab(cfg):
    """What Megatron Bridge's setup makes of the model's vocabulary with the tokenizer it builds (after launch)."""
    from megatron.bridge.training.setup import _validate_and_set_vocab_size
    from megatron.bridge.training.tokenizers.tokenizer import build_tokenizer

    return _validate_and_set_vocab_size(model_vocab_size=cfg.model.vocab_size,
                                        tokenizer_vocab_size=build_tokenizer(cfg.tokenizer).vocab_size,
                                        use_tokenizer_vocab_size=cfg.tokenizer.use_tokenizer_vocab_size)


def test_a_vocabulary_below_the_tokenizers_is_refused_before_bridge_raises_at_setup(recipe):
    import re

    from overrides import apply_overrides

    rule = RULES_BY_ID["model/vocab-below-tokenizer"]
    cfg = apply_overrides(recipe(DENSE), ["model.vocab_size=1024"])
    with pytest.raises(ValueError) as raised:
        _bridge_setup_vocab(cfg)
    assert any(re.search(signature, str(raised.value)) for signature in rule.log_signatures)  # diagnose reads it
    (problem,) = [p for p in check_rules(Context(cfg, 1, environ={})) if p.rule_id == rule.id]
    assert problem.key == "model.vocab_size" and problem.value.startswith("1024 (tokenizer NullTokenizer")
    assert problem.fix.startswith("tokenizer.vocab_size=1024  (")
    # either fix passes the rule and Bridge's check alike
    for fix in (problem.fix.split()[0], problem.fix.rsplit("or ", 1)[1].rstrip(")")):
        fixed = apply_overrides(cfg, [fix])
        assert _bridge_setup_vocab(fixed)[0] >= 1024, fix
        assert rule.id not in {p.rule_id for p in check_rules(Context(fixed, 1, environ={}))}, fix
    # tokenizer.use_tokenizer_vocab_size takes the tokenizer's vocabulary instead: Bridge does not raise, nor the rule
    taken = apply_overrides(cfg, ["tokenizer.use_tokenizer_vocab_size=True"])
    assert _bridge_setup_vocab(taken) == (151936, True)
    assert rule.id not in {p.rule_id for p in check_rules(Context(taken, 1, environ={}))}


@pytest.mark.parametrize("vocab", [200000, 1024])
def test_a_model_vocabulary_the_tokenizer_replaces_is_warned_and_each_fix_trains_it(recipe, vocab):
    from overrides import apply_overrides

    rule = RULES_BY_ID["model/vocab-replaced-by-tokenizer"]
    cfg = apply_overrides(recipe(DENSE), [f"model.vocab_size={vocab}", "tokenizer.use_tokenizer_vocab_size=True"])
    assert _bridge_setup_vocab(cfg) == (151936, True)  # Bridge trains the tokenizer's vocabulary, not the model's
    found = [p for p in check_rules(Context(cfg, 1, environ={})) if p.key == "model.vocab_size"]
    assert [p.rule_id for p in found] == [rule.id]  # one problem (not vocab-below-tokenizer too, for 1024)
    (problem,) = found
    assert problem.severity == "warning" and rule.severity == "warning"
    assert problem.value == (f"{vocab} (tokenizer.use_tokenizer_vocab_size=True: the NullTokenizer's "
                             "tokenizer.vocab_size=151936 trains)")
    assert problem.fix.startswith(f"tokenizer.vocab_size={vocab}  (") and "model.vocab_size=151936" in problem.fix
    assert ("tokenizer.use_tokenizer_vocab_size=False" in problem.fix) is (vocab >= 151936)  # else Bridge raises
    fixes = [problem.fix.split()[0], "model.vocab_size=151936"] + (
        ["tokenizer.use_tokenizer_vocab_size=False"] if vocab >= 151936 else [])
    for fix in fixes:
        fixed = apply_overrides(cfg, [fix])
        assert _bridge_setup_vocab(fixed)[0] == fixed.model.vocab_size, fix  # what the config says trains
        assert not [p for p in check_rules(Context(fixed, 1, environ={})) if p.key == "model.vocab_size"], fix


def test_num_layers_range_is_strictly_below_num_layers(recipe):
    """Megatron Core enforces 0 <= n < num_layers: n = num_layers - 1 is allowed, -1 is not."""
    rule = RULES_BY_ID["activation-offload/num-layers-range"]
    for n, ok in ((0, True), (15, True), (16, False), (-1, False)):
        cfg = recipe(DENSE_ACT)
        cfg.model.cpu_offloading_num_layers = n
        assert rule.holds(Context(cfg, 1, environ={})) is ok, n


def test_shell_value_of_nvte_wins_over_the_recipe(recipe):
    cfg = recipe(MOE_FG)
    ok = Context(cfg, 1, environ={})
    overridden = Context(cfg, 1, environ={"NVTE_CPU_OFFLOAD_V1": "0"})
    assert "fine-grained/nvte-cpu-offload-v1" not in {p.rule_id for p in check_rules(ok)}
    problems = {p.rule_id: p for p in check_rules(overridden)}
    assert "export NVTE_CPU_OFFLOAD_V1=1" in problems["fine-grained/nvte-cpu-offload-v1"].fix


def _moments_problems(cfg, environ=None) -> dict[str, object]:
    return {p.rule_id: p for p in check_rules(Context(cfg, 1, environ=environ or {}))
            if p.key == MOMENTS}


@pytest.mark.parametrize("engine", ["library", "exact", "delayed", "stream"])
@pytest.mark.parametrize("offload", [True, False])
def test_fp32_moments_set_with_any_engine_are_no_problem(recipe, engine, offload):
    """fp32 is what every engine keeps its moments in: setting it explicitly, with any engine and with offload off,
    is harmless (unlike bf16, which only the stream engine with optimizer offload reads)."""
    cfg = recipe(DENSE_OPT)
    for key, value in {**EXACT, "env_vars.MBRIDGE_OFFLOAD_ENGINE": engine, "optimizer.optimizer_cpu_offload": offload,
                       MOMENTS: "fp32"}.items():
        set_path(cfg, key, value)
    assert _moments_problems(cfg) == {}
    set_path(cfg, MOMENTS, "bf16")
    expected = ({"offload-engine/stream-moments-not-exact"} if engine == "stream" and offload
                else {"offload-engine/stream-moments-need-stream"})
    assert set(_moments_problems(cfg)) == expected


@pytest.mark.parametrize("engine,offload", [("exact", True), ("library", True), ("delayed", True), ("stream", False)])
def test_bf16_moments_the_run_would_ignore_are_refused_and_either_fix_resolves_it(recipe, engine, offload):
    """bf16 moments with another engine or with optimizer offload off would be silently ignored: an error naming the
    engine and the offload, whose fix (the stream engine with offload on, or fp32 moments), pasted, resolves it."""
    from overrides import apply_overrides

    cfg = recipe(DENSE_OPT)
    for key, value in {**EXACT, "env_vars.MBRIDGE_OFFLOAD_ENGINE": engine, "optimizer.optimizer_cpu_offload": offload,
                       MOMENTS: "bf16"}.items():
        set_path(cfg, key, value)
    problem = _moments_problems(cfg)["offload-engine/stream-moments-need-stream"]
    assert problem.severity == "error" and problem.key == MOMENTS
    assert problem.value == f"bf16 with the {engine} engine, optimizer offload {'on' if offload else 'off'}"
    stream, fp32 = problem.fix.split("  (or ")
    assert fp32 == "++env_vars.MBRIDGE_OFFLOAD_STREAM_MOMENTS=fp32)"
    for fix in (stream.split(), [fp32.rstrip(")")]):
        fixed = apply_overrides(cfg, fix)
        assert "offload-engine/stream-moments-need-stream" not in _moments_problems(fixed), fix


TURNS_OFFLOAD_ON = [("offload-engine/needs-optimizer-offload", EXACT),
                    ("offload-engine/needs-optimizer-offload", DELAYED),
                    ("offload-engine/fetch-ahead-needs-stream", {**EXACT, FETCH_AHEAD: "on"}),
                    ("offload-engine/stream-moments-need-stream", {**EXACT, MOMENTS: "bf16"}),
                    ("optimizer-offload/overlap-ignored", {"optimizer.overlap_cpu_optimizer_d2h_h2d": True}),
                    ("optimizer-offload/fraction-ignored", {})]
WITHOUT_WHAT_OFFLOAD_NEEDS = {
    "nothing else": {},
    "no distributed optimizer": {"optimizer.use_distributed_optimizer": False, "ddp.use_distributed_optimizer": False},
    "no overlap streams": {"optimizer.overlap_cpu_optimizer_d2h_h2d": False},
}


@pytest.mark.parametrize("rule_id,settings", TURNS_OFFLOAD_ON)
@pytest.mark.parametrize("lacking", sorted(WITHOUT_WHAT_OFFLOAD_NEEDS))
@pytest.mark.parametrize("fraction", [0.0, 0.3, 1.5])
def test_a_fix_that_turns_offload_on_brings_what_offload_needs(recipe, rule_id, settings, lacking, fraction):
    """With optimizer offload off, a fix that turns it on, pasted whole before its "(or", leaves no error and not the
    fraction-zero warning: it names a fraction where the config's offloads nothing or is out of range (and keeps one
    the user chose), the distributed optimizer where it is off, and the exact and delayed engines' overlap streams."""
    from overrides import apply_overrides

    extra = WITHOUT_WHAT_OFFLOAD_NEEDS[lacking]
    if rule_id == "optimizer-offload/overlap-ignored" and lacking == "no overlap streams":
        pytest.skip("that rule fires only with the overlap on")
    if rule_id == "optimizer-offload/fraction-ignored" and fraction == 0.0:
        pytest.skip("that rule fires only with a fraction above 0")
    cfg = recipe(DENSE_OPT)
    for key, value in {**settings, **extra, "optimizer.optimizer_cpu_offload": False,
                       "optimizer.optimizer_offload_fraction": fraction}.items():
        set_path(cfg, key, value)
    problem = {p.rule_id: p for p in check_rules(Context(cfg, 1, environ={}))}[rule_id]
    fix = problem.fix.split("  (or ")[0].split()
    assert ("optimizer.optimizer_offload_fraction=0.5" in fix) == (fraction != 0.3), fix
    assert ("ddp.use_distributed_optimizer=True" in fix) == (lacking == "no distributed optimizer"), fix
    after = check_rules(Context(apply_overrides(cfg, fix), 1, environ={}))
    assert rule_id not in {p.rule_id for p in after}
    assert not [p.rule_id for p in after if p.severity == "error" or p.rule_id == "optimizer-offload/fraction-zero"]


def test_the_shells_moments_win_over_the_configs(recipe):
    """The engine reads the moments from its process's environment, where the launch shell's value wins over the
    config's env_vars: so does the validator."""
    cfg = recipe(DENSE_OPT)
    for key, value in {**EXACT, MOMENTS: "bf16"}.items():
        set_path(cfg, key, value)
    assert "offload-engine/stream-moments-need-stream" in _moments_problems(cfg)
    assert _moments_problems(cfg, {"MBRIDGE_OFFLOAD_STREAM_MOMENTS": "fp32"}) == {}
    set_path(cfg, MOMENTS, "fp32")
    set_path(cfg, "env_vars.MBRIDGE_OFFLOAD_ENGINE", "stream")
    assert _moments_problems(cfg) == {}
    shell = _moments_problems(cfg, {"MBRIDGE_OFFLOAD_STREAM_MOMENTS": "bf16"})
    assert set(shell) == {"offload-engine/stream-moments-not-exact"}
    assert shell["offload-engine/stream-moments-not-exact"].severity == "warning"


@pytest.mark.parametrize("value", ["BF16", "fp16", "", "bfloat16"])
def test_moments_the_engine_does_not_know_are_refused_with_both_values(recipe, value):
    """The engine takes the words fp32 and bf16 only (another raises STREAM_MOMENTS_UNKNOWN at the optimizer's build):
    refused before the launch, the value shown quoted (an empty one too), the fix naming both and the shell."""
    cfg = recipe(DENSE_OPT)
    for key, val in {**STREAM, MOMENTS: value}.items():
        set_path(cfg, key, val)
    problems = _moments_problems(cfg)
    assert set(problems) == {"offload-engine/stream-moments-known"}  # neither bf16's error nor its warning
    problem = problems["offload-engine/stream-moments-known"]
    assert problem.value == repr(value)
    assert "=bf16" in problem.fix and "fp32" in problem.fix and "shell" in problem.fix

def test_fixes_are_overrides_that_resolve_the_problem(recipe):
    """Pasting the fix of a parallelism problem makes that problem go away."""
    from overrides import apply_overrides

    cfg = recipe(MOE)
    cfg.train.global_batch_size = 6
    problem = next(p for p in check_rules(Context(cfg, 16, environ={})) if p.rule_id == "parallel/global-batch")
    fixed = apply_overrides(cfg, problem.fix.split())
    assert "parallel/global-batch" not in {p.rule_id for p in check_rules(Context(fixed, 16, environ={}))}


def test_precision_aware_states_under_offload_are_flagged_fixed_and_planned_as_fp32(recipe):
    from overrides import apply_overrides
    from mbridge_offload.planning import plan

    lower = ["optimizer.use_precision_aware_optimizer=True", "optimizer.exp_avg_dtype=bfloat16",
             "optimizer.exp_avg_sq_dtype=bfloat16"]
    offloaded = apply_overrides(recipe(DENSE_OPT), lower)
    problem = next(p for p in check_rules(Context(offloaded, 1, environ={}))
                   if p.rule_id == "optimizer-offload/precision-aware-ignored")
    assert problem.severity == "warning" and "exp_avg_dtype=bfloat16" in problem.value
    fixed = apply_overrides(offloaded, problem.fix.split("  ")[0].split())
    assert "optimizer-offload/precision-aware-ignored" not in {p.rule_id for p in check_rules(Context(fixed, 1, environ={}))}
    # the plan counts what HybridDeviceOptimizer keeps (fp32 m and v), and the bf16 states where there is no offload
    assert plan(offloaded, 1).offloaded_bytes_host_per_rank == plan(fixed, 1).offloaded_bytes_host_per_rank
    on_gpu = apply_overrides(recipe(DENSE), lower)
    assert plan(on_gpu, 1).optimizer_bytes_gpu < plan(recipe(DENSE), 1).optimizer_bytes_gpu


def test_resume_rules_read_a_checkpoint_megatron_bridge_wrote(recipe, tmp_path):
    """The run_config.yaml of a real H200 checkpoint (dense proxy, saved at fraction 1): resuming it at 1 passes,
    at 0.5 is refused with the fraction it was saved with as the fix."""
    saved = tmp_path / "iter_0000005"
    saved.mkdir()
    (saved / RUN_CONFIG_FILE).write_text(
        (Path(__file__).parents[2] / "docs" / "benchmarks" / "resume-parity" / "saved-run_config.yaml").read_text())
    cfg = recipe(DENSE_OPT)
    set_path(cfg, "checkpoint.load", str(tmp_path))
    for fraction, refused in ((1.0, False), (0.5, True)):
        set_path(cfg, "optimizer.optimizer_offload_fraction", fraction)
        found = [p for p in check_rules(Context(cfg, 1, environ={})) if p.rule_id.startswith("checkpoint/")]
        assert [p.rule_id for p in found] == (["checkpoint/fraction-changed"] if refused else [])
        if refused:
            assert found[0].fix == "optimizer.optimizer_offload_fraction=1" and "saved with 1" in found[0].value


def test_expert_grid_reads_a_null_expert_tensor_parallel_size_as_tp(recipe):
    """model.expert_tensor_parallel_size=null means TP's size (Megatron Core): Qwen3-30B-A3B on 16 GPUs, TP2 PP2,
    8 GPUs per stage; EP4 x ETP2 fits them, EP16 x ETP2 does not, and its fix is a size that does."""
    cfg = recipe(MOE)
    set_path(cfg, "model.expert_tensor_parallel_size", None)
    assert not [p for p in check_rules(Context(cfg, 16, environ={})) if p.rule_id.startswith("parallel/")]
    set_path(cfg, "model.expert_model_parallel_size", 16)
    (problem,) = [p for p in check_rules(Context(cfg, 16, environ={})) if p.rule_id == "parallel/expert-grid"]
    assert "could not" not in problem.fix and "ETP2" in problem.value
    ep = int(problem.fix.split("=")[1])
    set_path(cfg, "model.expert_model_parallel_size", ep)
    assert not [p for p in check_rules(Context(cfg, 16, environ={})) if p.rule_id.startswith("parallel/")]


def test_a_model_count_out_of_range_does_not_hide_the_grid_problems(recipe):
    """Every problem at once: a full-recompute chunk of 0 layers or a top-k of 0 is refused by key beside the grid's
    own problems (the grid rules stop only for the sizes they divide by)."""
    from overrides import apply_overrides

    cfg = apply_overrides(recipe("qwen3_8b_pretrain_config"), [
        "model.tensor_model_parallel_size=3", "model.recompute_granularity=full", "model.recompute_method=uniform",
        "model.recompute_num_layers=0", "model.ffn_hidden_size=12287"])
    ids = {p.rule_id for p in check_rules(Context(cfg, 8, environ={}))}
    assert {"parallel/recompute-num-layers-range", "parallel/world-size", "parallel/heads-per-tp",
            "parallel/ffn-per-tp"} <= ids
    moe = apply_overrides(recipe(MOE), ["model.moe_router_topk=0", "model.expert_model_parallel_size=5"])
    ids = {p.rule_id for p in check_rules(Context(moe, 16, environ={}))}
    assert {"parallel/topk-range", "parallel/experts-per-ep"} <= ids


# training hyperparameters (facts/key_ranges.py's HYPERPARAMETER_RANGES): a value that trains and one that cannot
HYPERPARAMETER_CASES = {
    "hyperparameter/lr-range": ("optimizer.lr", 1e-4, math.inf),
    "hyperparameter/min-lr-range": ("optimizer.min_lr", 0.0, 1.0),
    "hyperparameter/weight-decay-range": ("optimizer.weight_decay", 0.0, -0.1),
    "hyperparameter/adam-beta1-range": ("optimizer.adam_beta1", 0.9, 1.0),
    "hyperparameter/adam-beta2-range": ("optimizer.adam_beta2", 0.999, 1.0),
    "hyperparameter/adam-eps-range": ("optimizer.adam_eps", 1e-8, 0.0),
    "hyperparameter/clip-grad-range": ("optimizer.clip_grad", 0.0, -1.0),
    "hyperparameter/loss-scale-range": ("optimizer.loss_scale", 1024.0, 0.0),
    "hyperparameter/initial-loss-scale-range": ("optimizer.initial_loss_scale", 65536.0, math.inf),
    "hyperparameter/min-loss-scale-range": ("optimizer.min_loss_scale", 1.0, 0.0),
    "hyperparameter/loss-scale-window-range": ("optimizer.loss_scale_window", 1000, 0),
    "hyperparameter/hysteresis-range": ("optimizer.hysteresis", 1, 0),
    "hyperparameter/warmup-iters-range": ("scheduler.lr_warmup_iters", 0, -5),
    "hyperparameter/warmup-samples-range": ("scheduler.lr_warmup_samples", 0, -5),
    "hyperparameter/warmup-init-range": ("scheduler.lr_warmup_init", 0.0, 1.0),
    "hyperparameter/start-weight-decay-set": ("scheduler.start_weight_decay", 0.033, None),
    "hyperparameter/end-weight-decay-set": ("scheduler.end_weight_decay", 0.033, math.inf),
    "hyperparameter/init-method-std-range": ("model.init_method_std", 0.01, 0.0),
    "hyperparameter/hidden-dropout-range": ("model.hidden_dropout", 0.1, 1.0),
    "hyperparameter/attention-dropout-range": ("model.attention_dropout", 0.1, -0.1),
    "hyperparameter/layernorm-epsilon-range": ("model.layernorm_epsilon", 1e-5, 0.0),
    "hyperparameter/rotary-base-range": ("model.rotary_base", 500000, 0),
    "hyperparameter/rotary-percent-range": ("model.rotary_percent", 0.5, 0.0),
    "hyperparameter/moe-aux-loss-coeff-range": ("model.moe_aux_loss_coeff", 0.01, math.nan),
    "hyperparameter/moe-z-loss-coeff-range": ("model.moe_z_loss_coeff", 0.001, -1.0),
    "hyperparameter/eval-interval-range": ("validation.eval_interval", 0, -1),
    "hyperparameter/eval-iters-range": ("validation.eval_iters", 10, -1),
    "hyperparameter/train-eval-interval-range": ("train.eval_interval", 100, -1),
    "hyperparameter/train-eval-iters-range": ("train.eval_iters", 10, -1),
    "hyperparameter/seed-range": ("rng.seed", 1234, 0),  # Megatron Bridge's launch asserts a positive seed
}
CASES.update({rule_id: case(MOE if "moe" in key else DENSE, {key: good}, {key: bad}, gpus=(16, 16) if "moe" in key
                            else (1, 1)) for rule_id, (key, good, bad) in HYPERPARAMETER_CASES.items()})
NO_WARMUP_ITERS = {"scheduler.lr_warmup_iters": 0}
SAMPLE_BASED = {"train.train_samples": 1000, "train.train_iters": None, **NO_WARMUP_ITERS}
CASES["hyperparameter/warmup-samples-range"] = case(DENSE, {**SAMPLE_BASED, "scheduler.lr_warmup_samples": 0},
                                                    {**SAMPLE_BASED, "scheduler.lr_warmup_samples": -5})
CASES["hyperparameter/warmup-fraction-range"] = case(DENSE, {**NO_WARMUP_ITERS, "scheduler.lr_warmup_fraction": 0.1},
                                                     {**NO_WARMUP_ITERS, "scheduler.lr_warmup_fraction": 1.5})


def test_a_seed_numpy_cannot_take_is_refused(recipe):
    """numpy's seed takes at most 2**32 - 1, after Megatron Bridge adds 100 per pipeline stage: a seed of 2**32 was
    accepted and failed at the launch."""
    import numpy as np

    with pytest.raises(ValueError):
        np.random.seed(2**32)
    cfg = recipe(DENSE)
    cfg.rng.seed = 2**32
    problems = [p for p in check_rules(Context(cfg, 1, environ={})) if p.rule_id == "hyperparameter/seed-range"]
    assert problems and problems[0].key == "rng.seed" and "rng.seed=1234" in problems[0].fix


def _given(*keys):
    return {"given_keys": frozenset(keys)}


# a value given on the command line that the scheduler replaces or ignores (the recipe: 100 iterations of 8 samples,
# weight decay 0.033 from start to end, cosine decay)
CASES.update({
    "scheduler/constant-weight-decay-equal": case(DENSE, {"scheduler.end_weight_decay": 0.033},
                                                  {"scheduler.end_weight_decay": 0.1}),
    "scheduler/weight-decay-replaces-given": case(DENSE, {"optimizer.weight_decay": 0.033},
                                                  {"optimizer.weight_decay": 0.05},
                                                  passing_ctx=_given("optimizer.weight_decay"),
                                                  failing_ctx=_given("optimizer.weight_decay")),
    "scheduler/max-steps-replaces-decay-iters": case(
        DENSE, {"scheduler.max_steps": 1000, "scheduler.lr_decay_iters": 1000},
        {"scheduler.max_steps": 1000, "scheduler.lr_decay_iters": 500},
        passing_ctx=_given("scheduler.lr_decay_iters"), failing_ctx=_given("scheduler.lr_decay_iters")),
    "scheduler/warmup-capped": case(DENSE, {"scheduler.lr_warmup_iters": 50}, {"scheduler.lr_warmup_iters": 200},
                                    passing_ctx=_given("scheduler.lr_warmup_iters"),
                                    failing_ctx=_given("scheduler.lr_warmup_iters")),
    "recompute/modules-given-without-selective": case(
        DENSE, {"model.recompute_granularity": "selective", "model.recompute_modules": ["core_attn"]},
        {"model.recompute_modules": ["core_atn"]},
        passing_ctx=_given("model.recompute_modules"), failing_ctx=_given("model.recompute_modules")),
    "scheduler/wsd-given-without-wsd": case(DENSE, {"scheduler.lr_decay_style": "WSD",
                                                    "scheduler.lr_wsd_decay_iters": 10},
                                            {"scheduler.lr_wsd_decay_iters": 10},
                                            passing_ctx=_given("scheduler.lr_wsd_decay_iters"),
                                            failing_ctx=_given("scheduler.lr_wsd_decay_iters")),
    "scheduler/constant-lr-ignores-given": case(DENSE, {"optimizer.min_lr": 0.0},
                                                {"scheduler.lr_decay_style": "constant", "optimizer.min_lr": 0.0},
                                                passing_ctx=_given("optimizer.min_lr"),
                                                failing_ctx=_given("optimizer.min_lr")),
})


@pytest.mark.parametrize("rule_id", sorted(HYPERPARAMETER_CASES))
def test_a_hyperparameter_out_of_range_is_accepted_by_megatron_bridge_before_the_launch(recipe, rule_id):
    """One source of truth: each hyperparameter range is a rule only because nothing upstream refuses its value before
    the launch (validate(), its finalize() and __post_init__ calls, run on the broken config as the validator runs
    them). Were one to start refusing it, the range would duplicate it: this fails then."""
    from mbridge_offload.validation.upstream import upstream_failure

    ctx, problems = _problems(recipe, CASES[rule_id], "failing")
    assert rule_id in {p.rule_id for p in problems}
    failure = upstream_failure(ctx.cfg, ctx.num_gpus, {})
    assert failure is None, failure.message


@pytest.mark.parametrize("rule_id", sorted(rule_id for rule_id in HYPERPARAMETER_CASES
                                           if not rule_id.endswith("-set")))
def test_the_fix_of_a_hyperparameter_range_resolves_it(recipe, rule_id):
    from overrides import apply_overrides

    ctx, problems = _problems(recipe, CASES[rule_id], "failing")
    (problem,) = [p for p in problems if p.rule_id == rule_id]
    fixed = apply_overrides(ctx.cfg, problem.fix.split("  ")[0].split())
    assert rule_id not in {p.rule_id for p in check_rules(Context(fixed, ctx.num_gpus, environ={}))}


@pytest.mark.parametrize("key, value", [("optimizer.lr", "inf"), ("optimizer.lr", "-inf"), ("optimizer.adam_eps", "inf"),
                                        ("optimizer.min_lr", "inf"), ("model.init_method_std", "inf"),
                                        ("model.layernorm_epsilon", "inf"), ("scheduler.lr_warmup_init", "inf"),
                                        ("optimizer.weight_decay", "inf"), ("model.hidden_dropout", "inf")])
def test_an_infinite_hyperparameter_given_on_the_command_line_is_refused_by_key(recipe, key, value):
    """optimizer.lr=inf was accepted (NaN was refused by the override layer): every weight is NaN after one step."""
    from overrides import apply_overrides
    from mbridge_offload.validation import validate

    cfg = apply_overrides(recipe(DENSE), [f"{key}={value}"])
    report = validate(cfg, 1, environ={}, upstream=False, given_keys={key})
    (problem,) = [p for p in report.problems if p.key == key and p.rule_id.startswith("hyperparameter/")]
    assert "inf" in problem.value and problem.fix.startswith(f"{key}=")


@pytest.mark.parametrize("rule_id, key, value", [
    ("offload-engine/copy-pieces-need-exact-or-delayed", COPY_WINDOW, "1"),
    ("offload-engine/zero-by-region-needs-exact-or-delayed", BY_REGION, "on"),
    ("offload-engine/delayed-copy-start-needs-delayed", COPY_START, "next-step"),
    ("offload-engine/copy-piece-pause-needs-exact-or-delayed", PAUSE, "20"),
])
def test_an_ignored_engine_setting_is_shown_with_its_value_and_the_engine_that_ignores_it(recipe, rule_id, key, value):
    """The refusal names the setting's own value, and the engine and offload that would ignore it (a plain run
    without optimizer offload: the library's path)."""
    cfg = recipe(DENSE)
    set_path(cfg, key, value)
    (problem,) = [p for p in check_rules(Context(cfg, 1, environ={})) if p.rule_id == rule_id]
    assert problem.key == key and problem.value == f"{value} (engine library, optimizer offload off)", problem
