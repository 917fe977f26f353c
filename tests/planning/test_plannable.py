"""What the planner cannot model is refused by key, value, rule and fix (planning/plannable.py), never planned with a
made-up split; and plan_offload.py exits 2 on it. Real recipes with overrides; the sizes are the published models'."""

from __future__ import annotations

import pytest

from overrides import apply_overrides
from mbridge_offload.cli import plan_offload
from mbridge_offload.planning import plan, plan_problems, plan_with_recommendation, what_would_fit
from mbridge_offload.validation import Report, validate

EIGHT_B = "qwen3_8b_pretrain_config"  # TP4, 36 layers, 32 heads, 8 query groups
MOE_PROXY = "qwen3_30b_a3b_proxy_pretrain_config"  # 4 layers, 128 experts, one GPU


@pytest.mark.parametrize("recipe_name,gpus,overrides,rule_id,key", [
    # TP4 x PP1 x CP1 does not divide 3 or 6 GPUs: there is no data-parallel size to shard the optimizer over
    (EIGHT_B, 3, [], "parallel/world-size", "model.tensor_model_parallel_size"),
    (EIGHT_B, 6, ["train.global_batch_size=7"], "parallel/world-size", "model.tensor_model_parallel_size"),
    # 128 experts do not split over EP3
    (MOE_PROXY, 3, ["model.expert_model_parallel_size=3"], "parallel/experts-per-ep", "model.expert_model_parallel_size"),
    # 7 samples are no whole number of micro batches of 3
    ("qwen3_0p6b_pretrain_config", 1, ["train.micro_batch_size=3", "train.global_batch_size=7"],
     "parallel/global-batch", "train.global_batch_size"),
    # 36 layers do not split over PP5
    (EIGHT_B, 20, ["model.pipeline_model_parallel_size=5"], "parallel/layers-per-stage",
     "model.pipeline_model_parallel_size"),
    # 9 layers per stage do not split into 2 model chunks
    (EIGHT_B, 16, ["model.pipeline_model_parallel_size=4", "model.virtual_pipeline_model_parallel_size=2",
                   "train.global_batch_size=8"], "parallel/layers-per-virtual-stage",
     "model.virtual_pipeline_model_parallel_size"),
    # 32 heads, 8 query groups: TP3 splits neither
    (EIGHT_B, 3, ["model.tensor_model_parallel_size=3"], "parallel/heads-per-tp", "model.tensor_model_parallel_size"),
    (EIGHT_B, 4, ["model.tensor_model_parallel_size=0"], "parallel/tp-range", "model.tensor_model_parallel_size"),
    # block recompute of 0 layers checkpoints none: the plan counted one
    ("qwen3_0p6b_pretrain_config", 1, ["model.recompute_granularity=full", "model.recompute_method=block",
                                       "model.recompute_num_layers=0"], "parallel/recompute-num-layers-range",
     "model.recompute_num_layers"),
    # an FFN width TP4 does not split (Qwen3-14B's 17408 less one)
    (EIGHT_B, 4, ["model.ffn_hidden_size=17407"], "parallel/ffn-per-tp", "model.ffn_hidden_size"),
])
def test_a_config_the_plan_cannot_model_is_refused_by_key_value_rule_and_fix(built, recipe_name, gpus, overrides,
                                                                             rule_id, key):
    cfg = apply_overrides(built(recipe_name), overrides)
    p = plan_with_recommendation(cfg, gpus, fraction=0.5)
    assert p.unplanned and p.total_bytes_gpu == 0 and p.params_per_rank == 0  # no number for a run that cannot start
    problems = plan_problems(p, None)
    found = [q for q in problems if q.rule_id == rule_id]
    assert found, [q.rule_id for q in problems]
    assert found[0].key == key and found[0].value and found[0].rule and found[0].fix and found[0].severity == "error"
    assert key in p.unplanned and found[0].fix in p.unplanned  # the one-line reason names key and fix too


def test_the_fix_of_the_refusal_makes_a_plannable_config(built):
    """The GPU count's fix (--num-gpus 4 for TP4) is one the planner then plans."""
    cfg = built(EIGHT_B)
    (problem,) = plan_problems(plan(cfg, 3), None)
    assert problem.fix.startswith("--num-gpus 4")
    assert not plan(cfg, 4).unplanned


def test_a_dry_run_reports_the_refusal_once(built):
    """The validator and the planner both name the GPU grid; the report of a dry run says it once."""
    cfg = built(EIGHT_B)
    report = Report(num_gpus=3, problems=validate(cfg, 3, environ={}, upstream=False).problems
                    + tuple(plan_problems(plan(cfg, 3), None)))
    assert [p.rule_id for p in report.problems].count("parallel/world-size") == 1


def test_what_would_fit_offers_no_change_the_plan_cannot_model(built):
    """Doubling PP from 2 to 4 leaves 7 layers per stage, which VPP2 cannot split: never offered; every option
    offered is a config the planner models."""
    cfg = apply_overrides(built("qwen3_0p6b_pretrain_config"), [
        "model.pipeline_model_parallel_size=2", "model.virtual_pipeline_model_parallel_size=2",
        "model.seq_length=32768", "dataset.seq_length=32768", "train.global_batch_size=8"])
    assert not plan(cfg, 2, fraction=1.0, gpu_memory_gib=64.0).fits_gpu
    options = what_would_fit(cfg, 2, gpu_memory_gib=64.0)
    assert not any("pipeline_model_parallel_size=4" in option for option in options)
    four = apply_overrides(cfg, ["model.pipeline_model_parallel_size=4"])
    assert plan(four, 4).unplanned  # the change the search must not offer
    # ... which, without the virtual stages it cannot split into, would fit: the search did try it
    plain_four = apply_overrides(four, ["model.virtual_pipeline_model_parallel_size=null"])
    assert plan(plain_four, 4, fraction=0.0, gpu_memory_gib=64.0).fits_gpu


def test_plan_offload_exits_2_naming_the_key_value_rule_and_fix(capsys):
    code = plan_offload.main(["--recipe", EIGHT_B, "--num-gpus", "3"])
    out = capsys.readouterr().out
    assert code == 2
    assert "not planned" in out and "model.tensor_model_parallel_size = 4" in out
    assert "rule: the GPU count must be a multiple of TP x PP x CP" in out and "fix:  --num-gpus 4" in out


def test_the_recommendation_never_says_fits_when_the_host_does_not(built):
    """A host too small for even the run without offload: the recommendation says so instead of 'fits'."""
    p = plan_with_recommendation(built("qwen3_8b_optimizer_offload_config"), 4, host_memory_gib=1.0)
    assert p.fits_host is False
    assert not p.recommendation.startswith("fits") and "host" in p.recommendation


def test_a_node_holds_no_more_ranks_than_the_job_has(built):
    """--gpus-per-node 8 for a 1-GPU job: the node's host memory is that one rank's, not eight ranks'."""
    cfg = built("qwen3_1b_proxy_optimizer_offload_config")
    alone = plan(cfg, 1)
    said_eight = plan(cfg, 1, gpus_per_node=8)
    assert said_eight.ranks_per_node == 1
    assert said_eight.host_bytes_per_node == alone.host_bytes_per_node
    assert said_eight.offload_time_lower_bound_s == alone.offload_time_lower_bound_s


def test_what_would_fit_offers_only_changes_the_validator_accepts(built):
    """The ~1.1B proxy with layer-level activation offload at 8192 tokens on a 40 GiB GPU: more pipeline stages are
    offered with that offload off (it needs one stage), and every option passes the rule table."""
    from mbridge_offload.validation import Context, check_rules

    cfg = apply_overrides(built("qwen3_1b_proxy_activation_offload_config"),
                          ["model.seq_length=8192", "dataset.seq_length=8192"])
    assert not plan(cfg, 1, fraction=1.0, gpu_memory_gib=40.0).fits_gpu
    options = what_would_fit(cfg, 1, gpu_memory_gib=40.0)
    assert any("model.pipeline_model_parallel_size=2 model.cpu_offloading=False" in option for option in options)
    for option in options:
        overrides = option.split(" (then")[0].split(" with --num-gpus ")
        gpus = int(overrides[1]) if len(overrides) > 1 else 1
        changed = apply_overrides(cfg, overrides[0].split())
        assert not [p for p in check_rules(Context(changed, gpus, environ={})) if p.severity == "error"], option


def test_fewer_query_groups_than_tp_ranks_are_split_not_refused(built):
    """Qwen3-30B-A3B has 4 key/value groups. On TP8, Megatron Core 0.19.2 splits all of the QKV rows over the ranks
    and all-gathers them, each rank then taking one group's key and value (attention.py,
    get_query_key_value_tensors). The validator accepts it, and the plan counts the split weight:
    (32 + 2 x 4) x 128 x 2048 / 8 per rank, by hand from the published shape (tests/planning/test_shapes.py checks it
    against the meta-device model)."""
    from mbridge_offload.planning.tensors import named_tensors

    cfg = apply_overrides(built(MOE_PROXY), ["model.tensor_model_parallel_size=8", "model.sequence_parallel=True"])
    assert not [p for p in validate(cfg, 8, environ={}, upstream=False).errors if p.rule_id.startswith("parallel/")]
    qkv = next(t for t in named_tensors(cfg, 0) if t.name == "l0.qkv")
    assert qkv.numel == (32 + 2 * 4) * 128 * 2048 // 8
    assert not plan(cfg, 8).unplanned


@pytest.mark.parametrize("recipe_name,gpus,overrides,rule_id,key", [
    # 4097 positions do not split over TP2's sequence-parallel ranks (nor 130 per CP rank of 260 over TP4)
    ("qwen3_0p6b_pretrain_config", 2, ["model.tensor_model_parallel_size=2", "model.sequence_parallel=True",
                                       "model.seq_length=4097", "dataset.seq_length=4097", "train.global_batch_size=8"],
     "parallel/seq-length-sp", "model.seq_length"),
    ("qwen3_0p6b_pretrain_config", 8, ["model.tensor_model_parallel_size=4", "model.sequence_parallel=True",
                                       "model.context_parallel_size=2", "model.seq_length=260",
                                       "dataset.seq_length=260", "train.global_batch_size=8"],
     "parallel/seq-length-sp", "model.seq_length"),
    # a shared expert of 1001 does not split over TP2
    (MOE_PROXY, 2, ["model.tensor_model_parallel_size=2", "model.sequence_parallel=True",
                    "model.moe_shared_expert_intermediate_size=1001"],
     "parallel/shared-expert-ffn-per-tp", "model.moe_shared_expert_intermediate_size"),
])
def test_a_split_megatron_core_asserts_on_is_refused_and_its_fix_plans(built, recipe_name, gpus, overrides, rule_id,
                                                                        key):
    """Sizes TP must divide, or the run fails in its first step (an assertion in Megatron Core): one rule of the
    validator's table, which refuses the launch and the plan alike."""
    cfg = apply_overrides(built(recipe_name), overrides)
    assert rule_id in {q.rule_id for q in validate(cfg, gpus, environ={}, upstream=False).errors}
    p = plan_with_recommendation(cfg, gpus, fraction=0.5)
    assert p.unplanned and p.params_per_rank == 0
    (problem,) = [q for q in plan_problems(p, None) if q.rule_id == rule_id]
    assert problem.key == key and problem.value.startswith(str(value_of(cfg, key)))
    fixed = apply_overrides(cfg, problem.fix.split("  (")[0].split())
    assert not plan_with_recommendation(fixed, gpus, fraction=0.5).unplanned


def value_of(cfg, key: str):
    section, name = key.split(".")
    return getattr(getattr(cfg, section), name)


@pytest.mark.parametrize("seq", [1, 129, 131072])
@pytest.mark.parametrize("micro_batch", [1, 3, 16])
def test_odd_sequence_lengths_and_micro_batches_plan_finite_positive_numbers(built, seq, micro_batch):
    """From 1 token to 128k, micro batches of 1 to 16: a plan of finite numbers, none negative, that grows with
    the tokens of a micro batch."""
    import dataclasses
    import math

    def numbers(obj):
        if dataclasses.is_dataclass(obj):
            return [n for f in dataclasses.fields(obj) for n in numbers(getattr(obj, f.name))]
        if isinstance(obj, (list, tuple)):
            return [n for x in obj for n in numbers(x)]
        return [obj] if isinstance(obj, (int, float)) and not isinstance(obj, bool) else []

    def planned(s):
        cfg = apply_overrides(built(MOE_PROXY), [f"model.seq_length={s}", f"dataset.seq_length={s}",
                                                 f"train.micro_batch_size={micro_batch}",
                                                 f"train.global_batch_size={4 * micro_batch}"])
        return plan(cfg, 1, fraction=0.5)

    p = planned(seq)
    assert not p.unplanned and all(math.isfinite(n) and n >= 0 for n in numbers(p))
    assert planned(seq + 1).activation_bytes_gpu > p.activation_bytes_gpu


@pytest.mark.parametrize("fraction", ["-1", "1.5"])
def test_an_offload_fraction_out_of_range_is_refused_in_the_words_of_its_key_range(capsys, fraction):
    """-of below 0 and above 1 (the fraction given to the planner, and the config's own) say one rule and one fix:
    the key range's (facts/key_ranges.py), once."""
    from mbridge_offload.facts.key_ranges import OPTIMIZER_OFFLOAD_FRACTION

    code = plan_offload.main(["--recipe", "qwen3_0p6b_pretrain_config", "-of", fraction])
    out = capsys.readouterr().out
    assert code == 2
    assert out.count(f"rule: {OPTIMIZER_OFFLOAD_FRACTION.text}") == 1, out
    assert out.count("fix:  ") == 1 and f"fix:  {OPTIMIZER_OFFLOAD_FRACTION.fix(None)}\n" in out, out


def test_a_fraction_argument_out_of_range_is_refused_as_the_configs_own(built):
    cfg = built("qwen3_0p6b_optimizer_offload_config")
    for fraction in (-1.0, 1.5):
        given = plan_problems(plan(cfg, 1, fraction=fraction), None)
        configured = plan_problems(plan(apply_overrides(cfg, [f"optimizer.optimizer_offload_fraction={fraction}"]), 1),
                                   None)
        assert [(q.rule_id, q.key, q.value, q.rule, q.fix) for q in given] \
            == [(q.rule_id, q.key, q.value, q.rule, q.fix) for q in configured], (given, configured)


def test_a_shared_expert_with_a_bias_is_refused_as_megatron_core_refuses_to_build_it(built):
    """SharedExpertMLP asserts add_bias_linear is False when the model is built (moe/shared_experts.py), which the
    plan would count as a shared expert without a bias: the plan is refused by the validator's rule, with its fix."""
    cfg = apply_overrides(built(MOE_PROXY), ["model.moe_shared_expert_intermediate_size=768",
                                             "model.add_bias_linear=True"])
    p = plan_with_recommendation(cfg, 1, fraction=0.5)
    assert p.unplanned and p.params_per_rank == 0
    (problem,) = [q for q in plan_problems(p, None) if q.rule_id == "moe/shared-expert-bias"]
    assert problem.key == "model.add_bias_linear" and problem.value.startswith("True")
    fixed = apply_overrides(cfg, problem.fix.split("  (")[0].split())
    assert not plan_with_recommendation(fixed, 1, fraction=0.5).unplanned
