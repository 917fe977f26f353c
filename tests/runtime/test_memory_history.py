"""run_recipe --memory-snapshot STEPS: the CUDA allocator's history of the first steps, for PyTorch's viewer
(mbridge_offload/runtime/memory_history.py). The recording itself needs a GPU (the last test)."""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from recipes import registry
from mbridge_offload.cli import run_recipe
from mbridge_offload.describe import offload_summary, topology
from mbridge_offload.runtime.launch import LaunchSettings, run_header
from mbridge_offload.runtime.memory_history import snapshot_path

ROOT = Path(__file__).resolve().parents[2]
RECIPE = "qwen3_1b_proxy_pretrain_config"


def test_the_flag_reaches_the_launch_and_the_run_header(tmp_path):
    parser = run_recipe.build_parser()
    assert parser.parse_args(["--recipe", RECIPE, "--memory-snapshot", "2"]).memory_snapshot == 2
    assert parser.parse_args(["--recipe", RECIPE]).memory_snapshot == 0
    cfg = registry.get(RECIPE).build()

    def header(steps: int) -> str:
        return run_header(cfg, LaunchSettings(
            recipe_name=RECIPE, num_gpus=1, out_dir=tmp_path, cpu_threads="auto", tuning_lines=(), run_lines=(),
            overlap_chunks=None, topology=topology(cfg, 1), offload_lines=tuple(offload_summary(cfg)),
            memory_snapshot_steps=steps), "auto")

    assert f"first 2 step(s), written to {snapshot_path(tmp_path, 0)}" in header(2)
    assert "memory snapshot" not in header(0)


def test_a_snapshot_of_no_steps_is_refused_naming_the_flag(capsys):
    with pytest.raises(SystemExit) as stop:
        run_recipe.build_parser().parse_args(["--recipe", RECIPE, "--memory-snapshot", "0"])
    assert stop.value.code == 2
    error = capsys.readouterr().err
    assert "--memory-snapshot" in error and "at least 1 step" in error


def test_megatron_bridges_own_memory_recording_and_the_flag_are_refused_together(capsys):
    code = run_recipe.main(["--recipe", RECIPE, "--num-gpus", "1", "--dry-run", "--memory-snapshot", "2",
                            "profiling.record_memory_history=True"])
    error = capsys.readouterr().err
    assert code == 2
    assert "--memory-snapshot 2 with profiling.record_memory_history=True" in error
    assert "Drop one" in error
    assert run_recipe.main(["--recipe", RECIPE, "--num-gpus", "1", "--dry-run", "--memory-snapshot", "2"]) == 0


@pytest.mark.gpu
def test_a_short_run_writes_the_history_of_its_first_steps_for_pytorchs_viewer(tmp_path):
    out = tmp_path / "run"
    command = [sys.executable, str(ROOT / "scripts" / "run_recipe.py"), "--recipe", RECIPE, "--num-gpus", "1",
               "--out", str(out), "--memory-snapshot", "2", "model.num_layers=2", "train.train_iters=3",
               "optimizer.optimizer_cpu_offload=True", "optimizer.optimizer_offload_fraction=1"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    path = snapshot_path(out, 0)
    assert f"memory snapshot: steps 1-2 of this run in {path}" in done.stdout
    snapshot = pickle.loads(path.read_bytes())
    (trace,) = [t for t in snapshot["device_traces"] if t]  # one GPU
    actions = {event["action"] for event in trace}
    assert {"alloc", "free_completed"} <= actions
    assert any(frame["filename"].endswith(".py") for event in trace for frame in event.get("frames", []))
    from torch.cuda import _memory_viz

    assert "<html" in _memory_viz.trace_plot(snapshot).lower()  # PyTorch's own viewer reads it
