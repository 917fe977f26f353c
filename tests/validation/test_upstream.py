"""Upstream ConfigContainer.validate(): run on a copy, its error translated to our rule and fix, or to
the config key it names."""

from __future__ import annotations

import copy

from overrides import apply_overrides
from mbridge_offload.validation import Context, validate
from mbridge_offload.validation.upstream import translate_upstream, upstream_error

DENSE_ACT = "qwen3_1b_proxy_activation_offload_config"
MOE = "qwen3_30b_a3b_pretrain_config"


def test_upstream_validate_runs_and_is_translated(built):
    # The eval batch check is upstream's, translated into a rule of the table: reported once, with our fix.
    cfg = apply_overrides(built("qwen3_1b_proxy_pretrain_config"), ["validation.eval_global_batch_size=7"])
    message = upstream_error(cfg, 1, {})
    assert "eval_global_batch_size (7) must be divisible" in message
    problem = translate_upstream(message, cfg, Context(cfg, 1, environ={}))
    assert problem.source == "upstream" and problem.rule_id == "parallel/eval-global-batch"
    assert problem.key == "validation.eval_global_batch_size" and problem.value.startswith("7 ")
    report = validate(cfg, 1, environ={})
    (problem,) = report.errors
    assert problem.rule_id == "parallel/eval-global-batch" and problem.source == "plugin"
    assert problem.fix == "validation.eval_global_batch_size=8"


def test_upstream_message_maps_to_our_rule_and_fix(built):
    cfg = copy.deepcopy(built(DENSE_ACT))
    cfg.model.pipeline_model_parallel_size = 2
    message = upstream_error(cfg, 2, {})
    assert "Pipeline parallelism with CPU offloading" in message
    problem = translate_upstream(message, cfg, Context(cfg, 2, environ={}))
    assert problem.rule_id == "activation-offload/pipeline-parallel"
    assert problem.fix.startswith("model.pipeline_model_parallel_size=1")


def test_unknown_upstream_message_names_a_real_key(built):
    cfg = built(MOE)
    problem = translate_upstream("moe_router_topk must not exceed num_moe_experts", cfg, Context(cfg, 16, environ={}))
    assert problem.key == "model.num_moe_experts" or problem.key == "model.moe_router_topk"
    assert problem.value in ("128", "8")
