"""prepare(): one pipeline from a recipe and a command line to a validated, planned config."""

from __future__ import annotations

import pytest

from recipes import registry
from mbridge_offload.planning.fraction_search import smallest_fitting_fraction
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
    expected, _ = smallest_fitting_fraction(prepared.cfg, 1, **H200)
    assert 0 < expected < 1
    assert prepared.auto_fraction == expected and prepared.cfg.optimizer.optimizer_offload_fraction == expected
    assert prepared.auto_line.startswith(f"optimizer.optimizer_offload_fraction=auto -> {expected:g} (")
    assert prepared.overrides == tuple(EIGHT_B)


def test_auto_keeps_the_offload_switch_the_command_line_set_and_a_second_value_is_refused():
    prepared = _prepare("qwen3_8b_pretrain_config", [*EIGHT_B, "optimizer.optimizer_cpu_offload=True",
                                                    "optimizer.optimizer_offload_fraction=auto"])
    assert prepared.cfg.optimizer.optimizer_cpu_offload is True
    twice = r"given twice \(first: optimizer.optimizer_offload_fraction=0.5\)"
    with pytest.raises(NotPrepared, match=twice) as refused:
        _prepare("qwen3_8b_pretrain_config", [*EIGHT_B, "optimizer.optimizer_offload_fraction=0.5",
                                             "optimizer.optimizer_offload_fraction=auto"])
    # said before the refusal: what auto resolved to
    assert refused.value.auto_line.startswith(f"optimizer.optimizer_offload_fraction=auto -> {prepared.auto_fraction:g} (")


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


def test_offload_engine_flag_sets_the_engine_tuned_and_validated_and_refuses_a_clash():
    prepared = _prepare("qwen3_1b_proxy_pretrain_config", ["optimizer.optimizer_cpu_offload=True",
                                                           "optimizer.optimizer_offload_fraction=1"], offload_engine="exact")
    assert prepared.cfg.env_vars["MBRIDGE_OFFLOAD_ENGINE"] == "exact" and prepared.report.ok
    assert prepared.cfg.optimizer.overlap_cpu_optimizer_d2h_h2d  # the tuning gave it the copy streams it needs
    several = _prepare("qwen3_1b_proxy_pretrain_config", ["optimizer.optimizer_cpu_offload=True"],
                       offload_engine="exact", num_gpus=2)  # its all-gathers wait for the update: allowed, warned
    assert several.report.ok and "offload-engine/exact-several-ranks" in {p.rule_id for p in several.report.problems}
    delayed = _prepare("qwen3_1b_proxy_pretrain_config", ["optimizer.optimizer_cpu_offload=True"],
                       offload_engine="delayed", num_gpus=2)  # a save's drain all-gathers its update: allowed, warned
    assert delayed.report.ok and "offload-engine/delayed-several-ranks" in {p.rule_id for p in delayed.report.problems}
    with pytest.raises(NotPrepared, match="--offload-engine delayed sets env_vars.MBRIDGE_OFFLOAD_ENGINE"):
        _prepare("qwen3_1b_proxy_pretrain_config", ["+env_vars.MBRIDGE_OFFLOAD_ENGINE=exact"], offload_engine="delayed")


ONE_RUN = ["model.cpu_offloading=true", "model.pipeline_model_parallel_size=2", "model.recompute_granularity=full",
           "model.recompute_method=uniform", "model.recompute_num_layers=1", "model.cpu_offloading_num_layers=48"]


def test_a_range_violation_and_the_rules_it_meets_are_reported_in_one_run():
    # issue #14: the range check used to stop the command before the validator saw PP=2 and recompute.
    prepared = _prepare("qwen3_30b_a3b_pretrain_config", ONE_RUN, num_gpus=16)
    by_id = {p.rule_id: p for p in prepared.report.errors}
    assert {"activation-offload/num-layers-range", "activation-offload/pipeline-parallel",
            "activation-offload/recompute"} <= set(by_id)
    layers = by_id["activation-offload/num-layers-range"]
    assert layers.key == "model.cpu_offloading_num_layers" and layers.value == "48 (model.num_layers=48)"
    assert "< model.num_layers" in layers.rule and layers.fix == "model.cpu_offloading_num_layers=47"
    assert prepared.cfg.model.cpu_offloading_num_layers == 48  # applied as asked, and the recipe untouched
    assert prepared.base_cfg.model.cpu_offloading_num_layers == 0


def test_overrides_that_cannot_apply_are_reported_with_the_problems_of_the_rest():
    with pytest.raises(NotPrepared) as refused:
        _prepare("qwen3_30b_a3b_pretrain_config", [*ONE_RUN, "model.cpu_offload=True", "train.train_iters=many"],
                 num_gpus=16)
    message = refused.value.message
    head, _, rest = message.partition("And the configuration the other overrides make")
    assert "model.cpu_offload=True" in head and "did you mean" in head and "train.train_iters=many" in head
    assert "Validation for 16 GPUs: FAILED" in rest
    for rule_id in ("activation-offload/num-layers-range", "activation-offload/pipeline-parallel",
                    "activation-offload/recompute"):
        assert f"[{rule_id}]" in rest
    assert "those 2" in message


def test_an_unappliable_override_alone_says_the_rest_is_valid():
    with pytest.raises(NotPrepared) as refused:
        _prepare("qwen3_1b_proxy_pretrain_config", ["optimizer.optimizer_offload_fraction=abc"])
    assert "expects a float" in refused.value.message and "Validation for 1 GPU: OK" in refused.value.message


def test_auto_chooses_no_fraction_for_a_configuration_the_planner_cannot_model():
    """TP4 on 3 GPUs: no plan, so no fraction (a chosen one would claim a fit nobody computed); the report names the
    grid problem once, with its fix."""
    prepared = _prepare("qwen3_8b_pretrain_config", ["optimizer.optimizer_offload_fraction=auto"], num_gpus=3)
    assert prepared.auto_fraction is None and "no fraction chosen" in prepared.auto_line
    assert not prepared.report.ok
    assert [p.rule_id for p in prepared.report.problems].count("parallel/world-size") == 1


def test_auto_names_the_refusal_when_only_optimizer_offload_is_refused():
    """The distributed optimizer off on a GPU the run without offload does not fit: every fraction with offload is a
    launch the validator refuses, so auto chooses none. The report that follows is of the run without offload and has
    no error naming that refusal, so auto's line names it: key, value, rule and fix."""
    from mbridge_offload.planning import plan

    off = ["optimizer.use_distributed_optimizer=False", "ddp.use_distributed_optimizer=False"]
    small = {"gpu_memory_gib": 20.0}
    prepared = _prepare("qwen3_1b_proxy_pretrain_config", [*off, "optimizer.optimizer_offload_fraction=auto"],
                        plan_options=small)
    line = prepared.auto_line
    assert prepared.auto_fraction is None and "no fraction chosen" in line
    assert not plan(prepared.cfg, 1, fraction=0.0, **small).fits_gpu
    refused = plan(prepared.cfg, 1, fraction=0.05, **small).unplanned_problems
    assert refused and {p.key for p in refused} >= {"optimizer.use_distributed_optimizer"}
    for p in refused:
        assert f"{p.key} = {p.value}: {p.rule} (fix: {p.fix})" in line, line
    assert "the errors below" not in line
    assert not any(p.key == "optimizer.use_distributed_optimizer" for p in prepared.report.problems)


def test_auto_says_when_the_host_cannot_hold_even_the_run_without_offload():
    with pytest.raises(NotPrepared, match="cannot hold even the run without optimizer offload"):
        _prepare("qwen3_8b_optimizer_offload_config", ["optimizer.optimizer_offload_fraction=auto"], num_gpus=4,
                 plan_options={**H200, "host_memory_gib": 1.0})


def test_the_keys_the_command_line_gave_reach_the_validator_also_beside_an_override_that_cannot_apply():
    """model.fp8_recipe=delayed is the model's default: only the command line tells that it was asked for (and the
    preset replaces it). Where another override cannot apply, the rest is validated with the keys it gave."""
    overrides = ["mixed_precision=bf16_with_fp8_current_scaling_mixed", "model.fp8_recipe=delayed"]
    prepared = _prepare("qwen3_1b_proxy_pretrain_config", overrides)
    assert [p.rule_id for p in prepared.report.errors] == ["precision/preset-replaces-fp8-recipe"]
    with pytest.raises(NotPrepared) as refused:
        _prepare("qwen3_1b_proxy_pretrain_config", [*overrides, "train.train_iters=many"])
    rest = refused.value.message.partition("And the configuration the other overrides make")[2]
    assert "[precision/preset-replaces-fp8-recipe] model.fp8_recipe = delayed" in rest, refused.value.message
