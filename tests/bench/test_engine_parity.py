"""engine_parity compares the losses and grad norms of run folders, iteration by iteration."""

from __future__ import annotations

import json

from mbridge_offload.bench import engine_parity


def _run(folder, losses, norms=None):
    folder.mkdir(parents=True)
    norms = norms or [1.0] * len(losses)
    folder.joinpath("metrics.rank0.jsonl").write_text("".join(
        json.dumps({"step": i + 1, "iteration": i + 1, "loss": loss, "grad_norm": norm}) + "\n"
        for i, (loss, norm) in enumerate(zip(losses, norms))))
    return folder


def test_identical_runs_are_bit_identical_and_a_later_difference_is_found(tmp_path):
    ref = _run(tmp_path / "ref", [10.0, 9.5, 9.0])
    same = _run(tmp_path / "same", [10.0, 9.5, 9.0])
    later = _run(tmp_path / "later", [10.0, 9.5, 9.0004], [1.0, 1.0, 1.1])
    row = engine_parity.parity("same", ref, same)
    assert row["bit_identical"] and row["max_abs_loss_delta"] == 0 and row["first_differing_iteration"] is None
    row = engine_parity.parity("later", ref, later)
    assert not row["bit_identical"] and row["first_differing_iteration"] == 3 and row["within_seed_parity"]
    assert abs(row["max_abs_loss_delta"] - 0.0004) < 1e-9 and abs(row["max_abs_grad_norm_delta"] - 0.1) < 1e-9


def test_a_shorter_candidate_is_not_called_bit_identical(tmp_path):
    ref = _run(tmp_path / "ref", [10.0, 9.5, 9.0])
    short = _run(tmp_path / "short", [10.0, 9.5])
    assert not engine_parity.parity("short", ref, short)["bit_identical"]


def test_command_line_writes_json_and_markdown(tmp_path):
    ref = _run(tmp_path / "ref", [10.0, 9.0])
    cand = _run(tmp_path / "cand", [10.0, 9.002])
    assert engine_parity.main(["--out", str(tmp_path / "out"), f"delayed=${ref}:{cand}".replace("$", "")]) == 0
    table = (tmp_path / "out" / "engine_parity.md").read_text()
    assert "| delayed | 2 (reference 2) | 0.002 |" in table and "| no |" in table
