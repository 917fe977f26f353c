"""On a GPU: the streaming offload engine's exact mode trains the same steps as the library's offloaded path,
bit for bit in deterministic mode, its delayed mode trains, and its stream mode trains the same steps as no
offload at all, bit for bit, with and without fetch-ahead (a 4-layer dense proxy, 8 steps).
Skipped without CUDA; the recorded runs are in docs/benchmarks/offload-engine/."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _train(out: Path, *args: str, fraction: float = 1) -> str:
    offload = [f"optimizer.optimizer_cpu_offload={fraction > 0}", f"optimizer.optimizer_offload_fraction={fraction:g}"]
    command = [sys.executable, str(ROOT / "scripts" / "run_recipe.py"), "--recipe", "qwen3_1b_proxy_pretrain_config",
               "--deterministic", "--out", str(out), "model.num_layers=4", "train.train_iters=8", *offload, *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


@pytest.mark.gpu
def test_exact_engine_is_bit_identical_to_the_library_and_delayed_trains(tmp_path):
    from mbridge_offload.bench.engine_parity import parity
    from mbridge_offload.bench.resume_parity import steps_by_iteration

    _train(tmp_path / "library")
    header = _train(tmp_path / "exact", "--offload-engine", "exact")
    _train(tmp_path / "delayed", "--offload-engine", "delayed")
    row = parity("exact vs library", tmp_path / "library", tmp_path / "exact")
    assert row["iterations"] == 8 and row["bit_identical"], row
    assert "offload engine: exact: " in header
    delayed = steps_by_iteration(tmp_path / "delayed")
    assert len(delayed) == 8 and all(r["loss"] == r["loss"] for r in delayed.values())  # finite, every step
    assert parity("delayed vs library", tmp_path / "library", tmp_path / "delayed")["max_abs_loss_delta"] > 0


@pytest.mark.gpu
def test_stream_engine_is_bit_identical_to_no_offload(tmp_path):
    from mbridge_offload.bench.engine_parity import parity

    _train(tmp_path / "baseline", fraction=0)
    header = _train(tmp_path / "stream", "--offload-engine", "stream")
    # a quarter of the 4-layer proxy: the last layers, not the tied embedding the forward needs first
    quarter = _train(tmp_path / "stream-quarter", "--offload-engine", "stream", fraction=0.25)
    assert "offload engine: stream: " in header
    said = [line for line in quarter.splitlines() if line.startswith("stream offload engine: ")]
    assert said and "from decoder.layers." in said[0] and "embedding" not in said[0], said
    # each step records how long the training thread spent inside the engine's step (enqueueing its work)
    records = [json.loads(line) for line in (tmp_path / "stream" / "metrics.rank0.jsonl").read_text().splitlines()]
    assert len(records) == 8 and all(0 < r["engine_step_s"] < r["step_time_s"] for r in records), records
    for name in ("stream", "stream-quarter"):
        row = parity(f"{name} vs no offload", tmp_path / "baseline", tmp_path / name)
        assert row["iterations"] == 8 and row["bit_identical"], row


@pytest.mark.gpu
def test_stream_with_fetch_ahead_is_bit_identical_and_keeps_the_peak(tmp_path):
    """Fetch-ahead (runtime/fetch_ahead.py): the same update as stream without it, bit for bit, and the run's peak
    allocated where stream's is (the rule keeps the buffers below it; the reserved memory it does not bound:
    docs/benchmarks/offload-engine/stream-fetch-ahead/). 8 steps: it fetches from the third."""
    from mbridge_offload.bench.engine_parity import parity

    _train(tmp_path / "stream", "--offload-engine", "stream")
    header = _train(tmp_path / "ahead", "--offload-engine", "stream",
                    "++env_vars.MBRIDGE_OFFLOAD_STREAM_FETCH_AHEAD=on")
    assert "fetch-ahead: on " in header
    # rank 0 says how many chunks came up during the backward (fetch_ahead.py): it must have fetched at all
    said = re.findall(r"^stream fetch-ahead: (\d+) chunks", header, flags=re.MULTILINE)
    assert said and max(map(int, said)) > 0, header[-3000:]
    row = parity("fetch-ahead vs stream", tmp_path / "stream", tmp_path / "ahead")
    assert row["iterations"] == 8 and row["bit_identical"], row
    peaks = [json.loads((tmp_path / name / "summary.json").read_text())["peak_allocated_gib"]
             for name in ("stream", "ahead")]
    assert peaks[1] <= peaks[0] + 1e-3, peaks
