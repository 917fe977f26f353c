"""What the plan refuses (plan_problems: host overflow, the offload-time budget, a predicted GPU
overflow), how a refused launch records it, and plan_offload.py --json."""

from __future__ import annotations

import json

import pytest

from overrides import apply_overrides
from mbridge_offload.cli import plan_offload, run_recipe
from mbridge_offload.planning import GIB, memory_plan, plan, plan_problems, plan_with_recommendation
from mbridge_offload.runtime.run_outcome import recorded
from mbridge_offload.validation.problem import Problem

EIGHT_B_ONE_GPU = ["model.tensor_model_parallel_size=1", "model.seq_length=2048", "dataset.seq_length=2048",
                   "train.global_batch_size=2"]


def test_host_guard_and_link_budget(built):
    cfg = apply_overrides(built("qwen3_8b_pretrain_config"), EIGHT_B_ONE_GPU)
    p = plan(cfg, 1, fraction=1.0, gpu_memory_gib=139.8, host_memory_gib=125)
    problems = plan_problems(p, step_time_budget_s=0.1)
    ids = {problem.rule_id for problem in problems}
    assert p.fits_host is False and ids == {"memory/host-fit", "memory/offload-time-budget"}
    assert all(isinstance(problem, Problem) and problem.source == "planner" and problem.severity == "error"
               for problem in problems)
    ok = plan(cfg, 1, fraction=0.5, gpu_memory_gib=139.8, host_memory_gib=125)
    assert ok.fits_host and plan_problems(ok, step_time_budget_s=10.0) == []
    assert p.transfer_bytes_per_step == 8 * p.offloaded_params_per_rank


def test_a_predicted_gpu_overflow_is_a_warning_that_says_what_fits(built):
    cfg = apply_overrides(built("qwen3_8b_pretrain_config"), EIGHT_B_ONE_GPU)
    over = plan(cfg, 1, fraction=0.0, gpu_memory_gib=139.8)
    [problem] = plan_problems(over, None)
    assert (problem.rule_id, problem.severity, problem.key) == ("memory/gpu-fit", "warning",
                                                                "optimizer.optimizer_offload_fraction")
    assert problem.fix == "optimizer.optimizer_offload_fraction=auto"  # no recommendation made: auto finds one


def test_host_guard_keeps_a_margin_per_offloading_rank(built):
    cfg = apply_overrides(built("qwen3_8b_pretrain_config"), EIGHT_B_ONE_GPU)
    need = plan(cfg, 1, fraction=0.5).host_peak_bytes_per_node / GIB
    # 2 GiB to spare: enough for the plan, not for the 4 GiB per rank the H200 runs showed it needs
    tight = plan(cfg, 1, fraction=0.5, host_memory_gib=need + 2)
    assert tight.fits_host is False and tight.host_margin_gib == 4.0
    problem = next(p for p in plan_problems(tight, None) if p.rule_id == "memory/host-fit")
    assert "4 GiB margin per rank" in problem.rule and "--host-margin-gib" in problem.fix
    assert f"{need + 2:.1f} GiB given (--host-memory-gib)" in problem.rule
    assert plan(cfg, 1, fraction=0.5, host_memory_gib=need + 2, host_margin_gib=1.0).fits_host
    eight_gpus = apply_overrides(cfg, ["train.global_batch_size=8"])  # a whole micro batch per data-parallel rank
    eight = plan(eight_gpus, 8, fraction=0.5, host_memory_gib=1000, gpus_per_node=8)
    assert not eight.unplanned and eight.fits_host is not None
    assert eight.fits_host == (eight.host_peak_bytes_per_node / GIB + 8 * 4 <= 1000)
    nothing_offloaded = plan(cfg, 1, fraction=0.0,
                             host_memory_gib=plan(cfg, 1, fraction=0.0).host_peak_bytes_per_node / GIB)
    assert nothing_offloaded.fits_host and nothing_offloaded.host_margin_gib == 0.0


def test_a_stream_run_whose_host_does_not_fit_is_offered_bf16_moments_where_they_fit(built):
    """The stream engine with fp32 moments holds 12 B per offloaded parameter on the host, with bf16 moments 8: where
    the 4 B make this fraction fit, the host-fit problem's fix names them with the peak they would leave; where they
    would not, or with another engine, it does not."""
    from recipes import with_offload_engine, with_stream_moments

    stream = with_offload_engine(apply_overrides(built("qwen3_8b_pretrain_config"), EIGHT_B_ONE_GPU), "stream")
    fp32 = plan(stream, 1, fraction=1.0)
    saved = 4 * fp32.offloaded_params_per_rank
    need = fp32.host_peak_bytes_per_node / GIB + 4  # the plan's peak and the margin of one rank
    between = plan_with_recommendation(stream, 1, fraction=1.0, host_memory_gib=need - saved / GIB / 2)
    [problem] = [p for p in plan_problems(between, None) if p.rule_id == "memory/host-fit"]
    assert problem.fix.startswith("++env_vars.MBRIDGE_OFFLOAD_STREAM_MOMENTS=bf16 at this fraction")
    assert f"{(fp32.host_peak_bytes_per_node - saved) / GIB:.2f} GiB" in problem.fix
    with pytest.MonkeyPatch.context() as shell:  # the launch shell's fp32 wins: the fix says to change it there
        shell.setenv("MBRIDGE_OFFLOAD_STREAM_MOMENTS", "fp32")
        forced = plan_with_recommendation(with_stream_moments(stream, "bf16"), 1, fraction=1.0,
                                          host_memory_gib=need - saved / GIB / 2)
        [problem] = [p for p in plan_problems(forced, None) if p.rule_id == "memory/host-fit"]
        assert problem.fix.startswith("MBRIDGE_OFFLOAD_STREAM_MOMENTS=bf16 in the launch shell (its fp32 wins")
    too_small = plan_with_recommendation(stream, 1, fraction=1.0, host_memory_gib=need - 2 * saved / GIB)
    [problem] = [p for p in plan_problems(too_small, None) if p.rule_id == "memory/host-fit"]
    assert "STREAM_MOMENTS" not in problem.fix
    library = apply_overrides(built("qwen3_8b_pretrain_config"), EIGHT_B_ONE_GPU)
    lib = plan_with_recommendation(library, 1, fraction=1.0, host_memory_gib=need - saved / GIB / 2)
    assert all("STREAM_MOMENTS" not in p.fix for p in plan_problems(lib, None))


def test_a_refused_launch_records_why_in_its_out_dir(tmp_path, capsys):
    code = run_recipe.main(["--recipe", "qwen3_30b_a3b_proxy_pretrain_config", "--out", str(tmp_path),
                            "--host-memory-gib", "124.4", "--gpu-memory-gib", "139.8", "model.num_layers=8",
                            "optimizer.optimizer_cpu_offload=True", "optimizer.optimizer_offload_fraction=1",
                            "optimizer.overlap_cpu_optimizer_d2h_h2d=False"])
    assert code == 2 and "[memory/host-fit]" in capsys.readouterr().out
    reason = json.loads((tmp_path / "failure.json").read_text())["reason"]
    assert reason.startswith("refused before launch: [memory/host-fit] optimizer.optimizer_offload_fraction = 1 (")
    assert "124.4 GiB given (--host-memory-gib)" in reason
    # a sweep's row for this fraction says so, and --resume keeps it
    assert recorded(tmp_path, succeeded=False) == {"reason": reason}


def test_json_has_the_fields(capsys):
    code = plan_offload.main(["--recipe", "qwen3_30b_a3b_pretrain_config", "--json", "--gpu-memory-gib", "80"])
    data = json.loads(capsys.readouterr().out)
    assert code == 0
    for key in ("state_bytes_gpu", "activation_bytes_gpu", "total_bytes_gpu", "offloaded_bytes_host_per_rank",
                "host_bytes_per_node", "transfer_bytes_per_step", "transfer_time_lower_bound_s",
                "offload_time_lower_bound_s", "offload_time_bound_by", "recommendation"):
        assert key in data
    moe_base = memory_plan.BASE_GPU_BYTES + memory_plan.MOE_EXTRA_GPU_BYTES  # PyTorch's other allocations, MoE
    assert data["allocated_bytes_gpu"] == data["state_bytes_gpu"] + data["activation_bytes_gpu"] + moe_base
    assert data["total_bytes_gpu"] == (data["allocated_bytes_gpu"] + data["allocator_reserve_bytes_gpu"]
                                       + data["outside_pytorch_bytes_gpu"])


def test_the_plan_says_when_the_loss_tensor_sets_the_reserve_and_what_that_costs_auto(built, monkeypatch):
    """With the steady-peak rule, which counts the loss's block beside the peak (the default rule's own note:
    test_reserve_rule.py)."""
    from mbridge_offload.facts.reserve_rule import RESERVE_RULE_ENV, STEADY_PEAK
    from mbridge_offload.planning.activations import largest_loss_tensor_bytes
    from mbridge_offload.planning.report import LOSS_TENSOR_RESERVE_NOTE, format_plan

    monkeypatch.setenv(RESERVE_RULE_ENV, STEADY_PEAK)

    def planned(seq_length: int):
        cfg = apply_overrides(built("qwen3_0p6b_pretrain_config"), [
            f"model.seq_length={seq_length}", f"dataset.seq_length={seq_length}", "train.micro_batch_size=2",
            "train.global_batch_size=2"])
        return cfg, plan(cfg, 1, fraction=0.65, expandable=True)

    long_cfg, long_plan = planned(8192)  # 2 x 8192 tokens of bf16 logits: 4.6 GiB, above the 1.17 GiB envelope
    assert long_plan.allocator_reserve_is_loss_tensor
    assert long_plan.allocator_reserve_bytes_gpu > largest_loss_tensor_bytes(long_cfg)
    assert LOSS_TENSOR_RESERVE_NOTE in format_plan(long_plan)
    short_cfg, short_plan = planned(1024)  # 0.6 GiB of logits: the envelope decides
    assert largest_loss_tensor_bytes(short_cfg) < memory_plan.EXPANDABLE_ALLOCATOR_RESERVE_BYTES
    assert not short_plan.allocator_reserve_is_loss_tensor
    assert LOSS_TENSOR_RESERVE_NOTE not in format_plan(short_plan)
