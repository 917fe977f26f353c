"""check_resume's verdict, on the H200 runs committed in docs/benchmarks/resume-parity/ and on altered copies."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from mbridge_offload.bench.resume_parity import RUN_FOLDERS, parity_row, run_overrides

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
