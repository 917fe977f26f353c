"""The streaming offload engine's parts that run without a GPU: the order its worker takes the chunks in,
the recipe transform that selects it, and the header line a run prints. The engine's training runs are
GPU tests (tests/runtime/test_gpu_engine.py) and docs/benchmarks/offload-engine/."""

from __future__ import annotations

import pytest

from mbridge_offload.facts.offload_engine import DEFAULT_ENGINE, ENGINE_MODES, engine_mode
from mbridge_offload.runtime.streaming_engine import install, processing_order


def test_worker_takes_chunks_in_first_forward_use_then_highest_first():
    # the forward met chunk 7 (first layers) first, then 5; 6 and the rest it never used
    assert processing_order([7, 5, 7, 9], 8) == [7, 5, 6, 4, 3, 2, 1, 0]
    assert processing_order([], 3) == [2, 1, 0]  # before any forward: the library's buffers run backwards


def test_the_shell_wins_over_the_config_and_the_default_is_the_library():
    assert engine_mode({}, {}) == DEFAULT_ENGINE == "library"
    assert engine_mode({"MBRIDGE_OFFLOAD_ENGINE": "exact"}, {}) == "exact"
    assert engine_mode({"MBRIDGE_OFFLOAD_ENGINE": "exact"}, {"MBRIDGE_OFFLOAD_ENGINE": "delayed"}) == "delayed"
    assert engine_mode({"MBRIDGE_OFFLOAD_ENGINE": "fast"}, {}) == "fast"  # the validator names it


def test_recipe_transform_selects_the_engine_and_refuses_an_unknown_one(recipe):
    from recipes import with_offload_engine, with_optimizer_offload

    base = with_optimizer_offload(recipe("qwen3_1b_proxy_pretrain_config"), fraction=1.0, overlap=True)
    cfg = with_offload_engine(base, "delayed")
    assert cfg.env_vars["MBRIDGE_OFFLOAD_ENGINE"] == "delayed" and "MBRIDGE_OFFLOAD_ENGINE" not in base.env_vars
    with pytest.raises(ValueError, match="one of library, exact, delayed"):
        with_offload_engine(base, "fastest")


def test_install_refuses_an_unknown_mode_and_the_library_changes_nothing():
    with pytest.raises(ValueError, match="unknown offload engine 'fast'"):
        install("fast")
    from megatron.core.optimizer.cpu_offloading.hybrid_optimizer import HybridDeviceOptimizer

    step = HybridDeviceOptimizer.step
    install("library")
    assert HybridDeviceOptimizer.step is step


def test_run_header_says_which_engine_runs_and_what_it_guarantees(recipe, tmp_path):
    from recipes import with_offload_engine, with_optimizer_offload
    from mbridge_offload.runtime.launch import LaunchSettings, run_header

    cfg = with_offload_engine(with_optimizer_offload(recipe("qwen3_1b_proxy_pretrain_config"), 1.0, True), "exact")
    settings = LaunchSettings(recipe_name="r", num_gpus=1, out_dir=tmp_path, cpu_threads="auto", tuning_lines=(),
                              run_lines=(), overlap_chunks=8, topology="1 GPU", offload_lines=())
    header = run_header(cfg, settings, "test")
    assert f"offload engine: exact: {ENGINE_MODES['exact']}" in header
    assert "bit-identical in deterministic mode" in header
