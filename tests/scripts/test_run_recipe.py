"""The command line: fast help and argument errors, --list, --rules, dry runs and exit codes."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from mbridge_offload.cli import run_recipe

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "run_recipe.py"

SEED = ["--recipe", "qwen3_30b_a3b_pretrain_config", "optimizer.optimizer_cpu_offload=True",
        "optimizer.optimizer_offload_fraction=0.5", "train.train_iters=20", "train.global_batch_size=8",
        "train.micro_batch_size=1"]


def _run(*args, timeout=300):
    started = time.monotonic()
    done = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)
    return done, time.monotonic() - started


@pytest.mark.parametrize("args,code", [
    (["--help"], 0), (["--list"], 0), (["--rules"], 0), ([], 2), (["--recipe", "qwen3_30b"], 2),
    (["--recipe", "qwen3_1b_proxy_pretrain_config", "--num-gpus", "0"], 2), (["--bogus"], 2),
    (["--recipe", "qwen3_1b_proxy_pretrain_config", "--cpu-threads", "none"], 2),
])
def test_help_list_and_argument_errors_answer_fast_without_megatron(args, code):
    done, seconds = _run(*args)
    assert done.returncode == code, done.stderr
    assert seconds < 2.0, f"{args} took {seconds:.1f} s"
    assert "Traceback" not in done.stderr


def test_unknown_recipe_suggests_names():
    done, _ = _run("--recipe", "qwen3_30b_a3b_pretrain")
    assert "did you mean" in done.stderr.lower() and "qwen3_30b_a3b_pretrain_config" in done.stderr


def test_seed_command_dry_runs_as_a_user_types_it():
    done, _ = _run(*SEED, "--dry-run")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "optimizer offload: ON, 50% of optimizer states on the CPU" in done.stdout
    assert "train.train_iters: 100 -> 20" in done.stdout and "Validation for 16 GPUs: OK" in done.stdout
    # the stack's import-time notices say nothing about the run (facts/import_notices.py)
    for notice in ("No CUDA runtime is found", "`torch_dtype` is deprecated"):
        assert notice not in done.stderr, done.stderr[-2000:]


def test_invalid_override_exits_2_with_report_and_no_traceback(capsys):
    code = run_recipe.main(["--recipe", "qwen3_1b_proxy_pretrain_config", "--dry-run",
                            "optimizer.optimizer_offload_fraction=abc", "model.cpu_offload=True"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert "optimizer.optimizer_offload_fraction: expects a float" in err
    assert "did you mean model.cpu_offloading" in err


def test_invalid_config_exits_2_with_every_problem(capsys):
    code = run_recipe.main(["--recipe", "qwen3_1b_proxy_activation_offload_config", "--dry-run", "-pp", "2",
                            "--num-gpus", "2", "model.recompute_granularity=full"])
    out = capsys.readouterr().out
    assert code == 2
    assert "[activation-offload/pipeline-parallel] model.pipeline_model_parallel_size = 2" in out
    assert "[activation-offload/recompute] model.recompute_granularity = full" in out


def test_dry_run_shows_offload_settings_and_differences(capsys):
    code = run_recipe.main(["--recipe", "qwen3_1b_proxy_pretrain_config", "--dry-run", "-of", "0.25",
                            "-gb", "16", "train.global_batch_size=8"])
    out = capsys.readouterr().out
    assert code == 0
    assert "optimizer offload: ON, 25% of optimizer states on the CPU" in out
    assert "train.global_batch_size" not in out.split("Changed from the recipe")[1].split("Validation")[0]
    assert "optimizer.optimizer_offload_fraction: 0.0 -> 0.25" in out


def test_launch_without_cuda_stops_after_validation(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    code = run_recipe.main(["--recipe", "qwen3_1b_proxy_pretrain_config", "train.train_iters=2"])
    captured = capsys.readouterr()
    assert code == 1 and "Validation for 1 GPU: OK" in captured.out
    assert "no CUDA device" in captured.err and "Traceback" not in captured.err


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()
    assert "```bash\nuv run pytest\n```" in readme
    assert ci[-1] == "uv run pytest"
