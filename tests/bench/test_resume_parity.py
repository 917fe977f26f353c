"""check_resume's verdict, on the H200 runs committed in docs/benchmarks/resume-parity/ and on altered copies."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from mbridge_offload.bench.resume_parity import RUN_FOLDERS, STOP_BY, parity_row, reached_iteration, run_overrides
from mbridge_offload.bench.sweep import StopSignal, call_logged

COMMITTED = Path(__file__).parents[2] / "docs" / "benchmarks" / "resume-parity" / "dense" / "fraction-1"


def _runs(root: Path) -> dict[str, Path]:
    return {name: root / name for name in RUN_FOLDERS}


def test_the_committed_resume_is_bit_identical():
    row = parity_row(1.0, True, 5, 10, _runs(COMMITTED), {})
    assert row["ok"] and row["bit_identical"] and row["resumed_iterations"] == "6-10"


def test_one_changed_loss_bit_fails_deterministic_parity_but_not_the_seed_bound(tmp_path):
    shutil.copytree(COMMITTED, tmp_path / "runs")
    metrics = tmp_path / "runs" / "resumed" / "metrics.rank0.jsonl"
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    records[-1]["loss"] += 1e-6
    metrics.write_text("".join(json.dumps(r) + "\n" for r in records))
    strict = parity_row(1.0, True, 5, 10, _runs(tmp_path / "runs"), {})
    assert not strict["ok"] and not strict["bit_identical"] and "loss differs" in strict["reason"]
    loose = parity_row(1.0, False, 5, 10, _runs(tmp_path / "runs"), {})
    assert loose["ok"] and not loose["bit_identical"]


def test_a_resume_that_restarts_from_the_beginning_is_caught(tmp_path):
    shutil.copytree(COMMITTED, tmp_path / "runs")
    # the uninterrupted run in place of the resumed one: iterations 1-10 instead of 6-10
    shutil.rmtree(tmp_path / "runs" / "resumed")
    shutil.copytree(COMMITTED / "uninterrupted", tmp_path / "runs" / "resumed")
    row = parity_row(1.0, True, 5, 10, _runs(tmp_path / "runs"), {})
    assert not row["ok"] and "did not continue at iteration 6" in row["reason"]


def test_the_three_runs_differ_only_in_saving_stopping_and_loading():
    first, resumed = run_overrides("first-part", 10, 5, Path("/c")), run_overrides("resumed", 10, 5, Path("/c"))
    assert run_overrides("uninterrupted", 10, 5, Path("/c")) == ["train.train_iters=10"]
    assert "train.exit_interval=5" in first and "checkpoint.load=/c" not in first
    assert "checkpoint.load=/c" in resumed and "train.exit_interval=5" not in resumed


def test_with_the_delayed_engine_the_uninterrupted_run_saves_its_weights_where_the_first_part_saved():
    # a save applies the delayed engine's pending update: the uninterrupted run must save there too, weights only
    # (the optimizer's state would double the disk), into a folder of its own
    overrides = run_overrides("uninterrupted", 10, 5, Path("/runs/c"), uninterrupted_saves_at=6)
    assert overrides == ["train.train_iters=10", "checkpoint.save=/runs/uninterrupted-checkpoint",
                         "checkpoint.save_interval=6", "checkpoint.save_optim=False", "checkpoint.save_rng=False"]
    assert RUN_FOLDERS.index("first-part") < RUN_FOLDERS.index("uninterrupted")  # its save iteration comes first


def test_a_run_stopped_by_signal_saves_only_where_the_signal_stopped_it():
    first = run_overrides("first-part", 10, 5, Path("/c"), stop_by="sigterm")
    assert not any(o.startswith("train.exit_interval") for o in first)
    assert "checkpoint.save_interval=11" in first  # no periodic save: the only checkpoint is the signal's


def test_the_resumed_run_saves_nothing():
    # its final save would put a second checkpoint beside the first (the MoE proxy's filled the H200's disk)
    for stop_by in STOP_BY:
        assert not any(o.startswith("checkpoint.save") for o in run_overrides("resumed", 10, 5, Path("/c"), stop_by))


def test_the_resumed_run_is_compared_from_the_iteration_its_checkpoint_holds():
    # stopped by a signal after step 5, the checkpoint holds iteration 5: the committed resume matches that
    assert parity_row(1.0, True, 5, 10, _runs(COMMITTED), {}, stop_by="sigterm")["ok"]
    # had the signal's save been at 6, the resumed run starting at 6 would not be a continuation
    row = parity_row(1.0, True, 6, 10, _runs(COMMITTED), {}, stop_by="sigterm")
    assert not row["ok"] and "did not continue at iteration 7" in row["reason"]
    assert parity_row(1.0, True, None, 10, _runs(COMMITTED), {})["reason"] == "first-part: left no checkpoint"


def test_stop_when_sends_sigterm_to_the_whole_process_group(tmp_path):
    # a parent with a child, both stopping cleanly on SIGTERM, as a rank and its data-loader workers would
    script = tmp_path / "job.py"
    script.write_text(
        "import os, signal, sys, time\n"
        "out = sys.argv[1]\n"
        "pid = os.fork()\n"
        "signal.signal(signal.SIGTERM, lambda *a: (open(f'{out}/{os.getpid()}.term', 'w').close(), os._exit(0)))\n"
        "open(f'{out}/started', 'a').close()\n"
        "time.sleep(60)\n")
    with (tmp_path / "log.txt").open("w") as log:
        code = call_logged([sys.executable, str(script), str(tmp_path)], log, timeout_s=30,
                           stop=StopSignal(when=lambda: (tmp_path / "started").exists()))
    assert code == 0
    assert len(list(tmp_path.glob("*.term"))) == 2  # parent and child both got it


def test_reached_iteration_reads_rank_zero_metrics_as_they_are_written(tmp_path):
    reached = reached_iteration(tmp_path, 5)
    assert not reached()
    (tmp_path / "metrics.rank0.jsonl").write_text('{"iteration": 4}\n{"iterat')
    assert not reached()
    (tmp_path / "metrics.rank0.jsonl").write_text('{"iteration": 4}\n{"iteration": 5}\n')
    assert reached()


def _runs_that_save(engine: str, calls: list):
    """A stand-in for sweep.run_one that writes what Megatron Bridge's run would: the ``iter_*`` folder of each save
    its overrides ask for, and the committed run's step records; the summary names ``engine``."""
    def run_one(recipe, fraction, out_dir, overrides, extra_args, timeout_s, stop=None):
        settings = dict(o.split("=", 1) for o in overrides if "=" in o)
        if "checkpoint.save" in settings:
            (Path(settings["checkpoint.save"]) / f"iter_{int(settings['checkpoint.save_interval']):07d}").mkdir(
                parents=True)
        calls.append((out_dir.name, overrides, sorted(p.name for p in out_dir.parent.iterdir())))
        shutil.copytree(COMMITTED / out_dir.name, out_dir)
        return {"summary": {"offload_engine": engine}, "wall_s": 1.0, "returncode": 0}
    return run_one


@pytest.mark.parametrize("engine, saves", [("delayed", True), ("exact", False), ("library", False)])
def test_only_the_delayed_engines_uninterrupted_run_saves_and_its_checkpoint_goes(tmp_path, monkeypatch, engine,
                                                                                   saves):
    from mbridge_offload.bench import resume_parity

    calls = []
    monkeypatch.setattr(resume_parity, "run_one", _runs_that_save(engine, calls))
    row = resume_parity.check_resume("qwen3_1b_proxy_pretrain_config", 1.0, tmp_path, 5, [], [], True, None)
    assert [name for name, _, _ in calls] == ["first-part", "uninterrupted", "resumed"]
    uninterrupted = calls[1][1]
    assert ("checkpoint.save_interval=5" in uninterrupted) is saves
    assert ("checkpoint.save_optim=False" in uninterrupted) is saves
    assert row["ok"] and row["uninterrupted_saved_at"] == (5 if saves else None)
    assert "uninterrupted-checkpoint" not in calls[2][2]  # gone before the resumed run starts
    assert not (tmp_path / "uninterrupted-checkpoint").exists() and not (tmp_path / "checkpoint").exists()
