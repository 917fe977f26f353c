"""prepare(): one pipeline from a recipe and a command line to a validated, planned config."""

from __future__ import annotations

import pytest

from recipes import registry
from mbridge_offload.prepare import NotPrepared, prepare

EIGHT_B = ["model.tensor_model_parallel_size=1", "model.seq_length=2048", "dataset.seq_length=2048",
           "train.global_batch_size=2"]
H200 = {"gpu_memory_gib": 139.8}


def _prepare(name, overrides, num_gpus=1, **kwargs):
    return prepare(registry.get(name), overrides, num_gpus=num_gpus, num_gpus_from="--num-gpus",
                   plan_options=kwargs.pop("plan_options", H200), **kwargs)


def test_auto_applies_each_override_once(monkeypatch):
    import overrides.apply

    applied = []
    original = overrides.apply.apply_overrides

    def counting(cfg, texts):
        applied.extend(texts)
        return original(cfg, texts)

    monkeypatch.setattr(overrides.apply, "apply_overrides", counting)
    prepared = _prepare("qwen3_8b_pretrain_config", [*EIGHT_B, "optimizer.optimizer_offload_fraction=auto"])
    assert sorted(applied) == sorted([*EIGHT_B, f"optimizer.optimizer_offload_fraction={prepared.auto_fraction:g}",
                                      "optimizer.optimizer_cpu_offload=True"])
    assert prepared.auto_fraction == 0.25 and prepared.cfg.optimizer.optimizer_offload_fraction == 0.25
    assert prepared.auto_line.startswith("optimizer.optimizer_offload_fraction=auto -> 0.25 (")
    assert prepared.overrides == tuple(EIGHT_B)


def test_auto_keeps_the_offload_switch_the_command_line_set_and_a_second_value_is_refused():
    prepared = _prepare("qwen3_8b_pretrain_config", [*EIGHT_B, "optimizer.optimizer_cpu_offload=True",
                                                    "optimizer.optimizer_offload_fraction=auto"])
    assert prepared.cfg.optimizer.optimizer_cpu_offload is True
    twice = r"given twice \(first: optimizer.optimizer_offload_fraction=0.5\)"
    with pytest.raises(NotPrepared, match=twice) as refused:
        _prepare("qwen3_8b_pretrain_config", [*EIGHT_B, "optimizer.optimizer_offload_fraction=0.5",
                                             "optimizer.optimizer_offload_fraction=auto"])
    assert refused.value.auto_line.startswith("optimizer.optimizer_offload_fraction=auto -> 0.25")  # said before


def test_prepared_holds_the_tuned_config_the_plan_and_the_report():
    prepared = _prepare("qwen3_1b_proxy_pretrain_config", ["optimizer.optimizer_cpu_offload=True",
                                                           "optimizer.optimizer_offload_fraction=0.5"], num_gpus=2)
    assert prepared.recipe_name == "qwen3_1b_proxy_pretrain_config" and prepared.num_gpus == 2
    assert prepared.cfg.optimizer.overlap_cpu_optimizer_d2h_h2d and prepared.overlap_chunks == 8
    assert prepared.cpu_threads == "auto" and prepared.offload_tuning == "tuned" and prepared.tuning_lines
    assert not prepared.base_cfg.optimizer.optimizer_cpu_offload  # the recipe as built, untouched
    assert prepared.memory.fraction == 0.5 and prepared.report.ok and prepared.report.num_gpus == 2
    stock = _prepare("qwen3_1b_proxy_pretrain_config", ["optimizer.optimizer_cpu_offload=True"],
                     offload_tuning="stock", validated=False)
    assert stock.tuning_lines == () and stock.overlap_chunks is None and stock.cpu_threads == "launcher"


def test_what_makes_no_config_is_not_prepared():
    with pytest.raises(NotPrepared, match="expects a float"):
        _prepare("qwen3_1b_proxy_pretrain_config", ["optimizer.optimizer_offload_fraction=abc"])
    with pytest.raises(NotPrepared, match="--overlap-chunks 4: chunks the D2H/H2D overlap"):
        _prepare("qwen3_1b_proxy_pretrain_config", [], overlap_chunks=4)


def test_deterministic_sets_keys_and_environment_and_refuses_a_clash():
    prepared = _prepare("qwen3_1b_proxy_pretrain_config", [], deterministic=True)
    assert prepared.cfg.model.deterministic_mode and not prepared.cfg.model.cross_entropy_loss_fusion
    assert prepared.cfg.env_vars["NCCL_ALGO"] == "Ring" and prepared.report.ok
    assert any(line.startswith("deterministic:") for line in prepared.run_lines)
    with pytest.raises(NotPrepared, match="--deterministic sets model.deterministic_mode"):
        _prepare("qwen3_1b_proxy_pretrain_config", ["model.deterministic_mode=False"], deterministic=True)
