"""bench_offload.py --deterministic: every run (baselines and offloaded) starts with run_recipe.py
--deterministic, loss parity is judged at the seed's criterion exactly, and the recorded command carries the
flag so that --resume reassembles the same table. Why: on the H200 the MoE proxy's step time follows its expert
routing, which diverges between non-deterministic runs (three identical baselines 41.7 % apart)."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest

from mbridge_offload.bench import overhead, sweep
from mbridge_offload.cli import bench_offload
from mbridge_offload.facts.determinism import SEED_PARITY

ROOT = Path(__file__).resolve().parents[2]
HOST_JSON = str(ROOT / "docs" / "benchmarks" / "offload-overhead" / "host.json")
RECIPE = "qwen3_1b_proxy_pretrain_config"
# losses of each run by folder: the baselines differ from each other by 0.003 (above the seed's 0.001), the
# offloaded runs lie 0.0005 from the first baseline (inside it)
LOSSES = {"baseline": [3.0, 2.0], "baseline-repeat1": [3.0, 2.003]}


def _summary(step_time: float, losses: list[float]) -> dict:
    return {"step_time_s": step_time, "losses": losses, "step_times_s": [9.0, step_time, step_time],
            "warmup_steps_excluded": 1, "peak_allocated_gib": 20.0, "offload_traffic": None,
            "cpu_threads_per_rank": 16, "overlap_cpu_optimizer_d2h_h2d": True, "offload_breakdown": None}


def _launch_without_training(launched: list[list[str]]):
    """sweep.run_one without the training process: it records the command run_one starts, writes it as the
    first line of log.txt (as run_one does) and leaves summary.json as a finished run does, so --resume keeps it."""

    def run_one(recipe, fraction, run_dir, overrides, extra_args, timeout_s):
        command = sweep.run_recipe_command(recipe, fraction, run_dir, overrides, extra_args)
        launched.append(command)
        summary = _summary(0.5 + fraction, LOSSES.get(run_dir.name, [3.0, 2.0005]))
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "log.txt").write_text(" ".join(command) + "\nthe training's output\n")
        (run_dir / "summary.json").write_text(json.dumps(summary))
        return {"fraction": fraction, "dir": str(run_dir), "returncode": 0, "wall_s": 0.0, "summary": summary}

    return run_one


def _bench(out: Path, *extra: str) -> list[str]:
    return ["--recipe", RECIPE, "--out", str(out), "--fractions", "1", "--configs", "stock-all-cores,engine-exact",
            "--repeats", "2", "--baseline-runs", "2", "--host-json", HOST_JSON, "--num-gpus", "1", *extra]


def test_the_run_recipe_command_is_the_interpreter_on_run_recipe_with_every_argument(tmp_path):
    command = sweep.run_recipe_command(RECIPE, 0.5, tmp_path / "run", ["train.train_iters=33"],
                                      ["--num-gpus", "1", "--deterministic"])
    assert command == [sys.executable, "-m", "mbridge_offload.cli.run_recipe", "--recipe", RECIPE,
                       "--out", str(tmp_path / "run"), "--num-gpus", "1", "--deterministic", "train.train_iters=33",
                       "optimizer.optimizer_cpu_offload=True", "optimizer.optimizer_offload_fraction=0.5"]


def test_every_run_args_carry_deterministic_only_when_asked():
    assert overhead.every_run_args(None, deterministic=False) == []
    assert overhead.every_run_args(None, deterministic=True) == ["--deterministic"]
    assert overhead.every_run_args(2, deterministic=True) == ["--num-gpus", "2", "--deterministic"]


def test_deterministic_reaches_every_launched_run_and_only_when_asked(tmp_path, monkeypatch):
    deterministic, plain = [], []
    monkeypatch.setattr(overhead, "run_one", _launch_without_training(deterministic))
    bench_offload.main(_bench(tmp_path / "out", "--deterministic"))
    monkeypatch.setattr(overhead, "run_one", _launch_without_training(plain))
    bench_offload.main(_bench(tmp_path / "out-plain"))
    # 2 baselines and 2 runs of each of the 2 configurations
    assert len(deterministic) == len(plain) == 6
    assert all(command.count("--deterministic") == 1 for command in deterministic)
    assert not any("--deterministic" in command for command in plain)
    # the flag is the only difference: the same runs, in the same order, with the same arguments
    same_folder = [[a.replace(str(tmp_path / "out"), str(tmp_path / "out-plain")) for a in command
                    if a != "--deterministic"] for command in deterministic]
    assert same_folder == plain
    baseline = next(c for c in deterministic if c[c.index("--out") + 1].endswith("/baseline"))
    assert "optimizer.optimizer_cpu_offload=False" in baseline  # the baselines too, not only the offloaded runs


def test_deterministic_parity_is_the_seed_criterion_exactly_though_the_baselines_differ():
    configs = overhead.configurations(16)
    baselines = [{"fraction": 0.0, "summary": _summary(0.5, LOSSES["baseline"])},
                 {"fraction": 0.0, "summary": _summary(0.5, LOSSES["baseline-repeat1"])}]
    offloaded = [("engine-exact", {"fraction": 1.0, "summary": _summary(0.6, [3.0, 2.002])})]
    assert sweep.baseline_parity(baselines, deterministic=True)["tolerance_used"] == SEED_PARITY
    rows, parity = overhead.build_rows(offloaded, baselines, None, configs, deterministic=True)
    assert parity["tolerance_used"] == SEED_PARITY and parity["deterministic"] is True
    assert parity["noise_floor_max_abs_delta"] == pytest.approx(0.003)  # measured, shown, not used
    assert rows[0]["max_abs_loss_delta"] == pytest.approx(0.002) and rows[0]["loss_parity_noise_floor"] is False
    table = overhead.markdown(rows, parity, [], "t")
    assert (f"Loss parity tolerance: the seed's {SEED_PARITY} exactly: every run deterministic (--deterministic); "
            "the identical baseline runs differed by 0.003.") in table
    # the same runs judged without the flag: the baselines' 0.003 apart is the noise floor, and 0.002 passes
    rows, parity = overhead.build_rows(offloaded, baselines, None, configs)
    assert parity["tolerance_used"] == pytest.approx(0.003) and "deterministic" not in parity
    assert rows[0]["loss_parity_noise_floor"] is True
    assert "max(seed's 0.001, noise floor 0.0030) = 0.0030." in overhead.markdown(rows, parity, [], "t")


def test_the_recorded_command_carries_deterministic_and_resume_reassembles_the_table(tmp_path, monkeypatch, capsys):
    launched = []
    monkeypatch.setattr(overhead, "run_one", _launch_without_training(launched))
    out = tmp_path / "out"
    bench_offload.main(_bench(out, "--deterministic"))
    recorded = json.loads((out / "offload_overhead.json").read_text())
    argv = shlex.split(recorded["command"])[3:]  # after "uv run scripts/bench_offload.py"
    assert "--deterministic" in argv and recorded["parity"]["deterministic"] is True
    assert recorded["parity"]["tolerance_used"] == SEED_PARITY
    table = (out / "offload_overhead.md").read_text()
    assert "every run deterministic (--deterministic)" in table
    assert [r["loss_parity_noise_floor"] for r in recorded["rows"]] == [True, True]  # 0.0005 apart

    # reassembled from the recorded command with --resume: nothing runs, the same table
    launched.clear()
    bench_offload.main([*argv, "--resume"])
    assert launched == []
    assert (out / "offload_overhead.md").read_text().split("\n", 1)[1] == table.split("\n", 1)[1]
    assert json.loads((out / "offload_overhead.json").read_text())["rows"] == recorded["rows"]

    # resumed without the flag, the kept deterministic runs would be judged at the noise floor: refused
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        bench_offload.main([a for a in argv if a != "--deterministic"] + ["--resume"])
    assert exit_info.value.code == 2 and launched == []
    err = capsys.readouterr().err
    assert "baseline, baseline-repeat1, fraction-1-engine-exact" in err and "ran with --deterministic" in err


def test_kept_runs_of_the_other_mode_are_read_from_the_command_in_their_log(tmp_path):
    def finished(name: str, first_line: str, outcome: str | None = "summary.json") -> None:
        (tmp_path / name).mkdir()
        (tmp_path / name / "log.txt").write_text(first_line + "\n")
        if outcome:
            (tmp_path / name / outcome).write_text(json.dumps({"reason": "CUDA out of memory"}))

    finished("baseline", "python -m mbridge_offload.cli.run_recipe --recipe r --deterministic x=1")
    finished("fraction-1-tuned", "python -m mbridge_offload.cli.run_recipe --recipe r x=1")
    finished("fraction-1-stock", "python -m mbridge_offload.cli.run_recipe --recipe r x=1", outcome="failure.json")
    finished("fraction-0.5-tuned", "python -m mbridge_offload.cli.run_recipe --recipe r x=1", outcome=None)
    # a run that did not finish is not kept (it runs again), so its mode does not matter
    assert overhead.kept_runs_of_the_other_mode(tmp_path, deterministic=True) == ["fraction-1-stock",
                                                                                   "fraction-1-tuned"]
    assert overhead.kept_runs_of_the_other_mode(tmp_path, deterministic=False) == ["baseline"]
    assert overhead.kept_runs_of_the_other_mode(tmp_path / "absent", deterministic=True) == []
