"""On a GPU: an offloaded run stopped at step k and resumed continues the uninterrupted run bit for bit in
deterministic mode (scripts/check_resume.py on a 2-layer proxy), stopped by SIGTERM to its whole process group
as a preempted job is. Skipped without CUDA; the recorded runs are in
docs/benchmarks/resume-parity/."""

from __future__ import annotations

import json

import pytest


@pytest.mark.gpu
@pytest.mark.parametrize("stop_by", ["sigterm"])  # exit-interval: docs/benchmarks/resume-parity/
def test_resumed_offloaded_run_is_bit_identical(tmp_path, stop_by):
    from mbridge_offload.cli.check_resume import main

    code = main(["--recipe", "qwen3_1b_proxy_pretrain_config", "--fractions", "1", "--save-at", "3",
                 "--deterministic", "--stop-by", stop_by, "--out", str(tmp_path), "model.num_layers=2"])
    rows = json.loads((tmp_path / "resume_parity.json").read_text())["rows"]
    assert code == 0, rows
    assert rows[0]["bit_identical"] and rows[0]["max_abs_loss_delta"] == 0.0, rows
    assert not (tmp_path / "fraction-1" / "checkpoint").exists()  # removed once compared
    first_part_log = (tmp_path / "fraction-1" / "first-part" / "log.txt").read_text()
    assert f"stopped at iteration {rows[0]['save_at']} of 6 by a stop signal" in first_part_log
