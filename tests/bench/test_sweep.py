"""The sweep's bookkeeping (CPU): fraction parsing, the Hydra multirun alias, rows, parity, outputs."""

from __future__ import annotations

import argparse
import re

import pytest

from mbridge_offload.bench import sweep
from mbridge_offload.runtime.run_outcome import recorded


def _result(fraction, step, peak, losses):
    return {"fraction": fraction, "summary": {"step_time_s": step, "peak_allocated_gib": peak,
                                              "final_loss": losses[-1], "losses": losses,
                                              "peak_host_rss_gib": 10.0, "peak_pinned_host_gib": 2.0}}


def test_fractions_parse_sorted_and_in_range():
    assert sweep.parse_fractions("1,0,0.5") == [0.0, 0.5, 1.0]
    assert sweep.parse_fractions("0.0,1e-3") == [0.0, 0.001]
    for bad in ("abc", "1.5", "-0.1", "", "nan"):
        with pytest.raises(argparse.ArgumentTypeError):
            sweep.parse_fractions(bad)


def test_a_fraction_given_twice_or_too_small_to_tell_from_zero_is_refused_not_merged():
    """0.5 twice ran once without a word; 1e-400 ran as the baseline (a float reads it as 0)."""
    with pytest.raises(argparse.ArgumentTypeError, match="0.5 is given twice.*--repeats"):
        sweep.parse_fractions("1,0,0.5,0.5")
    with pytest.raises(argparse.ArgumentTypeError, match="1e-400 is too small to tell from 0"):
        sweep.parse_fractions("0.5,1e-400")


def test_hydra_multirun_alias_and_owned_keys():
    fractions, rest = sweep.split_overrides(
        ["optimizer.optimizer_offload_fraction=0,0.5,1", "train.train_iters=5"])
    assert fractions == [0.0, 0.5, 1.0] and rest == ["train.train_iters=5"]
    with pytest.raises(SystemExit, match="set by the command for each of its runs; give the fractions"):
        sweep.split_overrides(["optimizer.optimizer_cpu_offload=True"])


def test_a_fraction_override_the_sweep_cannot_use_is_refused_with_what_is_wrong():
    fraction = "optimizer.optimizer_offload_fraction"
    assert sweep.split_overrides([f"++{fraction}=0.5,1"])[0] == [0.5, 1.0]  # '++' sets an existing key too
    with pytest.raises(SystemExit, match=r"'\+' would add or delete"):  # Hydra refuses '+' on an existing key
        sweep.split_overrides([f"+{fraction}=0.5,1"])
    with pytest.raises(SystemExit, match="'~' would add or delete"):
        sweep.split_overrides([f"~{fraction}"])
    with pytest.raises(SystemExit, match="gives no value"):
        sweep.split_overrides([f"{fraction}="])
    with pytest.raises(SystemExit, match="set by the command for each of its runs; drop it"):
        sweep.split_overrides([f"{fraction}=0.5"], owned_fix="drop it")


def test_fraction_zero_turns_offload_off():
    assert sweep.fraction_overrides(0.0) == [
        "optimizer.optimizer_cpu_offload=False", "optimizer.optimizer_offload_fraction=0.0"]
    assert sweep.fraction_overrides(0.25) == [
        "optimizer.optimizer_cpu_offload=True", "optimizer.optimizer_offload_fraction=0.25"]


def test_rows_parity_and_failed_runs():
    base = _result(0.0, 0.5, 40.0, [10.0, 9.0, 8.0])
    repeat = _result(0.0, 0.5, 40.0, [10.0, 9.002, 8.003])
    half = _result(0.5, 1.0, 30.0, [10.0, 9.001, 8.0025])
    far = _result(1.0, 2.0, 20.0, [10.0, 9.5, 8.0])
    oom = {"fraction": 0.75, "reason": "CUDA out of memory: Tried to allocate 2 GiB"}
    rows, parity = sweep.build_rows([base, half, oom, far], [base, repeat])
    by = {r["fraction"]: r for r in rows}
    assert parity["noise_floor_max_abs_delta"] == pytest.approx(0.003)
    assert by[0.5]["slowdown_vs_baseline"] == 2.0 and by[0.5]["memory_saved_gib"] == 10.0
    assert by[0.5]["loss_parity_noise_floor"] and not by[0.5]["loss_parity_seed"]
    assert not by[1.0]["loss_parity_noise_floor"]
    assert by[0.75]["ok"] is False and "out of memory" in by[0.75]["reason"]
    table = sweep.markdown(rows, parity, "t")
    assert "no: CUDA out of memory" in table and "| 0.5 | 1.000 | 2.00x |" in table


def test_the_noise_floor_is_the_widest_pair_of_baselines_not_only_the_distance_from_the_first():
    first = _result(0.0, 0.5, 40.0, [10.0, 9.0, 8.0])
    above = _result(0.0, 0.5, 40.0, [10.0, 9.03, 8.0])
    below = _result(0.0, 0.5, 40.0, [10.0, 8.97, 8.0])  # 0.03 from the first, 0.06 from the other
    offloaded = _result(1.0, 1.0, 30.0, [10.0, 9.05, 8.0])
    rows, parity = sweep.build_rows([offloaded], [first, above, below])
    assert parity["noise_floor_max_abs_delta"] == pytest.approx(0.06)
    assert rows[0]["loss_parity_noise_floor"]  # 0.05 from the first: within what identical runs showed


def test_plot_is_written(tmp_path):
    rows, _ = sweep.build_rows([_result(0.0, 0.5, 40.0, [1.0]), _result(1.0, 1.0, 30.0, [1.0])],
                                       [_result(0.0, 0.5, 40.0, [1.0])])
    assert sweep.plot(rows, tmp_path / "p.png", "t")
    assert (tmp_path / "p.png").stat().st_size > 1000


def test_metrics_summary_from_rank_files(tmp_path):
    import json

    from mbridge_offload.runtime.metrics import format_summary, summarize

    ranks = (([1.0, 0.5, 0.4, 0.5, 0.6, 0.5], [None] * 6, 30.0),
             ([1.2, 0.6, 0.5, 0.5, 0.7, 0.4], [9, 8, 7, 6, 5, 4.5], 32.0))
    for rank, (times, losses, peak) in enumerate(ranks):
        with (tmp_path / f"metrics.rank{rank}.jsonl").open("w") as f:
            for i, (t, loss) in enumerate(zip(times, losses)):
                f.write(json.dumps({"step": i + 1, "step_time_s": t, "loss": loss, "peak_allocated_gib": peak,
                                    "peak_reserved_gib": peak + 1, "host_rss_gib": 5.0,
                                    "pinned_host_gib": 1.0, "host_rss_high_water_gib": 6.0 + rank + i,
                                    "node_host_used_peak_gib": 20.0 + i}) + "\n")
    summary = summarize(tmp_path)
    assert summary["warmup_steps_excluded"] == 2
    assert summary["step_time_s"] == 0.5  # median of the per-step max over ranks: 0.5, 0.5, 0.7, 0.5
    assert summary["peak_allocated_gib"] == 32.0 and summary["final_loss"] == 4.5
    assert summary["peak_host_rss_high_water_gib"] == 12.0 and summary["peak_node_host_used_gib"] == 25.0
    table = format_summary(summary)
    assert re.search(r"median step time +0\.500 s", table)
    assert re.search(r"peak host used on the node +25\.00 GiB", table)
    # summaries written before the inside-step peaks existed show no row for them
    older = {k: v for k, v in summary.items() if k not in ("peak_host_rss_high_water_gib", "peak_node_host_used_gib")}
    assert "inside steps" not in format_summary(older) and "on the node" not in format_summary(older)


def test_prebuilt_dataset_helper_skips_make():
    import megatron.bridge.training.initialize as initialize
    import megatron.core.datasets.utils as dataset_utils

    from mbridge_offload.runtime.launch import use_prebuilt_dataset_helper

    original = dataset_utils.compile_helpers
    assert use_prebuilt_dataset_helper() is True
    initialize.compile_helpers()  # would run `make` and sys.exit(1) on a pip-installed stack
    assert initialize.compile_helpers is not original and dataset_utils.compile_helpers is original


def test_launch_mode():
    from mbridge_offload.runtime.launch import launch_mode

    assert launch_mode(1, 1, {}) == "single"
    assert launch_mode(4, 8, {}) == "torchrun"
    assert launch_mode(4, 4, {"WORLD_SIZE": "4"}) == "launcher"
    assert "needs 16 GPUs and this machine shows 1" in launch_mode(16, 1, {})
    assert "launcher started 8 processes" in launch_mode(16, 8, {"WORLD_SIZE": "8"})


def test_cpu_thread_warning(built):
    from mbridge_offload.runtime.launch import cpu_thread_warning

    offload = built("qwen3_1b_proxy_optimizer_offload_config")
    plain = built("qwen3_1b_proxy_pretrain_config")
    assert "--cpu-threads auto or 16" in cpu_thread_warning(offload, threads=1, ranks_on_node=1, cores=16)
    assert "--cpu-threads auto or 2" in cpu_thread_warning(offload, threads=1, ranks_on_node=8, cores=16)
    assert cpu_thread_warning(offload, threads=16, ranks_on_node=1, cores=16) is None
    assert cpu_thread_warning(offload, threads=1, ranks_on_node=16, cores=16) is None  # 1 is the fair share
    assert cpu_thread_warning(plain, threads=1, ranks_on_node=1, cores=16) is None
    # more threads than the node's cores: the ranks contend for them
    assert "= 32 threads on this node's 16 cores" in cpu_thread_warning(offload, threads=4, ranks_on_node=8, cores=16)
    assert "--cpu-threads auto or 1" in cpu_thread_warning(offload, threads=64, ranks_on_node=16, cores=16)
    assert cpu_thread_warning(offload, threads=2, ranks_on_node=8, cores=16) is None
    assert cpu_thread_warning(plain, threads=64, ranks_on_node=1, cores=16) is None


def test_recorded_results_and_no_stale_reuse(tmp_path):
    import json

    assert recorded(tmp_path) == {}
    (tmp_path / "failure.json").write_text(json.dumps({"reason": "CUDA out of memory"}))
    assert recorded(tmp_path) == {"reason": "CUDA out of memory"}
    (tmp_path / "summary.json").write_text(json.dumps({"step_time_s": 1.0}))
    assert recorded(tmp_path) == {"summary": {"step_time_s": 1.0}}
    assert recorded(tmp_path, succeeded=False) == {"reason": "CUDA out of memory"}


def test_a_killed_run_is_recorded_so_resume_keeps_it(tmp_path, monkeypatch):
    # a child that the kernel's OOM killer would end the same way: SIGKILL, no chance to write anything
    child = tmp_path / "killed.py"
    child.write_text("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    monkeypatch.setattr(sweep, "RUN_RECIPE", (str(child),))
    result = sweep.run_one("any_recipe", 1.0, tmp_path / "fraction-1", [], [], None)
    assert result["reason"] == "killed by signal 9 (SIGKILL: host memory exhausted?)"
    assert recorded(tmp_path / "fraction-1") == {"reason": result["reason"]}
