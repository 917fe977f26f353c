"""The fraction search: the smallest fraction the GPU fits (auto), the largest the host holds, and what
would fit when no fraction does."""

from __future__ import annotations

from overrides import apply_overrides
from mbridge_offload.cli import run_recipe
from mbridge_offload.planning import (plan, plan_problems, plan_with_recommendation, smallest_fitting_fraction,
                                      what_would_fit)

EIGHT_B_ONE_GPU = ["model.tensor_model_parallel_size=1", "model.seq_length=2048", "dataset.seq_length=2048",
                   "train.global_batch_size=2"]


def test_auto_matches_what_the_h200_showed(built):
    """Qwen3-8B on one H200: fraction 0 ran out of memory, 0.5 trained."""
    cfg = apply_overrides(built("qwen3_8b_pretrain_config"), EIGHT_B_ONE_GPU)
    fraction, fitting = smallest_fitting_fraction(cfg, 1, gpu_memory_gib=139.8)
    assert fraction is not None and 0.0 < fraction <= 0.5 and fitting.fits_gpu
    assert not plan(cfg, 1, fraction=0.0, gpu_memory_gib=139.8).fits_gpu


def test_nothing_fits_says_what_would(built, capsys):
    cfg = apply_overrides(built("qwen3_8b_pretrain_config"), ["model.tensor_model_parallel_size=1"])
    assert smallest_fitting_fraction(cfg, 1, gpu_memory_gib=80)[0] is None
    assert any("pipeline_model_parallel_size=2" in o for o in what_would_fit(cfg, 1, gpu_memory_gib=80))
    code = run_recipe.main(["--recipe", "qwen3_8b_pretrain_config", "--dry-run", "--num-gpus", "1", "-tp", "1",
                            "--gpu-memory-gib", "80", "optimizer.optimizer_offload_fraction=auto"])
    assert code == 2 and "nothing fits" in capsys.readouterr().err


def test_auto_resolves_before_launch(capsys, built):
    """Full Qwen3-8B on one H200 runs out of memory without offload (docs/benchmarks/oom-8b/): auto resolves to
    the planner's smallest fitting fraction, above 0, and the command applies it before launch."""
    cfg = apply_overrides(built("qwen3_8b_pretrain_config"), ["model.tensor_model_parallel_size=1",
                          "model.seq_length=2048", "dataset.seq_length=2048", "train.global_batch_size=2"])
    expected, _ = smallest_fitting_fraction(cfg, 1, gpu_memory_gib=139.8)
    assert expected is not None and 0 < expected < 1
    code = run_recipe.main(["--recipe", "qwen3_8b_pretrain_config", "--dry-run", "--num-gpus", "1", "-tp", "1",
                            "-sl", "2048", "-gb", "2", "--gpu-memory-gib", "139.8", "-of", "auto"])
    out = capsys.readouterr().out
    assert code == 0 and f"optimizer.optimizer_offload_fraction=auto -> {expected:g} (" in out
    assert f"optimizer.optimizer_offload_fraction: 0.0 -> {expected:g}" in out


def test_host_fit_fix_names_the_largest_fraction_the_host_holds(built):
    cfg = apply_overrides(built("qwen3_30b_a3b_proxy_pretrain_config"), ["model.num_layers=8"])
    refused = plan_with_recommendation(cfg, 1, fraction=1.0, gpu_memory_gib=139.8, host_memory_gib=124.4)
    largest = refused.host_fitting_fraction
    assert refused.fits_host is False and 0 < largest < 1 and refused.host_fitting_fraction_fits_gpu
    fix = next(p for p in plan_problems(refused, None) if p.rule_id == "memory/host-fit").fix
    assert fix.startswith(f"optimizer.optimizer_offload_fraction={largest:g} (the largest that fits this host")
    assert plan(cfg, 1, fraction=largest, host_memory_gib=124.4).fits_host
    assert not plan(cfg, 1, fraction=round(largest + 0.05, 2), host_memory_gib=124.4).fits_host


def test_auto_says_when_no_fraction_fits_both_gpu_and_host(capsys):
    args = ["--recipe", "qwen3_8b_pretrain_config", "--dry-run", "--num-gpus", "1", "-tp", "1", "-sl", "2048",
            "-gb", "2", "--gpu-memory-gib", "110", "-of", "auto"]
    assert run_recipe.main([*args, "--host-memory-gib", "500"]) == 0  # the GPU alone: some fraction fits
    capsys.readouterr()
    assert run_recipe.main([*args, "--host-memory-gib", "40"]) == 2
    err = capsys.readouterr().err
    assert "auto: nothing fits both: the GPU needs fraction" in err and "40.0 GiB given (--host-memory-gib)" in err


def test_when_activations_do_not_fit_full_recompute_and_context_parallelism_are_offered(built):
    """Qwen3-0.6B at 32768 tokens on a 60 GiB GPU: its activations, not its optimizer state, do not fit, so no
    fraction helps; recomputing every layer or splitting the sequence over 2 GPUs does, and both are offered. A
    config that already recomputes every layer is not offered it again."""
    long = ["model.seq_length=32768", "dataset.seq_length=32768"]
    cfg = apply_overrides(built("qwen3_0p6b_pretrain_config"), long)
    assert smallest_fitting_fraction(cfg, 1, gpu_memory_gib=60)[0] is None
    options = what_would_fit(cfg, 1, gpu_memory_gib=60)
    assert any(o.startswith("model.recompute_granularity=full model.recompute_method=uniform") for o in options)
    assert any(o.startswith("model.context_parallel_size=2 with --num-gpus 2") for o in options)
    recomputed = apply_overrides(cfg, ["model.recompute_granularity=full", "model.recompute_method=uniform",
                                       "model.recompute_num_layers=1"])
    assert not any("recompute_granularity" in o for o in what_would_fit(recomputed, 1, gpu_memory_gib=8))
