"""The validator: all problems at once, upstream's error not repeating one of ours, no mutation."""

from __future__ import annotations

import copy
import os

from overrides import apply_overrides
from mbridge_offload.describe import config_diff
from mbridge_offload.validation import validate

DENSE_ACT = "qwen3_1b_proxy_activation_offload_config"
MOE = "qwen3_30b_a3b_pretrain_config"


def test_every_problem_is_reported_at_once(built):
    cfg = apply_overrides(built(DENSE_ACT), [
        "model.pipeline_model_parallel_size=2", "model.recompute_granularity=full",
        "model.recompute_method=uniform", "model.recompute_num_layers=1",
        "model.cuda_graph_impl=transformer_engine", "train.global_batch_size=9"])
    report = validate(cfg, 4, environ={})
    ids = [p.rule_id for p in report.errors]
    assert {"activation-offload/pipeline-parallel", "activation-offload/recompute",
            "activation-offload/cuda-graphs", "parallel/global-batch"} <= set(ids)
    assert len(ids) == len(set(ids)), "upstream's error must not repeat one of ours"
    text = report.format()
    for p in report.errors:
        assert p.key in text and p.fix in text


def test_validation_changes_neither_config_nor_process(built):
    cfg = built(MOE)
    before_cfg = copy.deepcopy(cfg)
    before_env = dict(os.environ)
    validate(cfg, 16)
    validate(apply_overrides(cfg, ["model.pipeline_model_parallel_size=3"]), 16)
    assert config_diff(before_cfg, cfg) == []
    assert dict(os.environ) == before_env


def test_num_gpus_changes_the_verdict(built):
    cfg = built(MOE)
    assert validate(cfg, 16, environ={}).ok
    assert validate(cfg, 32, environ={}).ok
    assert validate(cfg, 8, environ={}).ok  # TP2 x PP2 -> DP2, EP4 over the 4 GPUs of a stage
    assert [p.rule_id for p in validate(cfg, 6, environ={}).errors][0] == "parallel/world-size"
    assert "parallel/expert-grid" in [p.rule_id for p in validate(cfg, 4, environ={}).errors]
