"""text_override: a folder or name as one override that Hydra reads back as the same text, on a real config."""

from __future__ import annotations

from pathlib import Path

import pytest

from overrides import apply_overrides
from overrides.grammar import text_override
from mbridge_offload.bench.resume_parity import run_overrides

DENSE = "qwen3_1b_proxy_pretrain_config"
VALUES = ["/tmp/runs/x", "runs/a,b", "a=b", "/tmp/it's", "true", "1", "1e5", "null", "x y", "~/ckpt", "/p/[1]",
          "{a:1}", "a\\b", "end\\", "x\\'y", "it's\\", "/tmp/run-1.5/x_y", "ckpt(1)", "naïve/dir"]


@pytest.mark.parametrize("value", VALUES)
def test_a_text_value_reads_back_as_typed(built, value):
    override = text_override("checkpoint.save", value)
    assert apply_overrides(built(DENSE), [override]).checkpoint.save == value, override


def test_plain_paths_stay_bare():
    assert text_override("checkpoint.save", "/tmp/runs/ckpt-1.5") == "checkpoint.save=/tmp/runs/ckpt-1.5"


def test_resume_parity_hands_a_checkpoint_folder_with_a_comma_over_as_one_path(built):
    folder = Path("/tmp/runs/resume,fraction-1")
    for run in ("first-part", "resumed"):
        cfg = apply_overrides(built(DENSE), run_overrides(run, 10, 5, folder))
        assert (cfg.checkpoint.save if run == "first-part" else cfg.checkpoint.load) == str(folder)
    # the delayed engine's uninterrupted run: a weights-only save at the first part's iteration, in its own folder
    cfg = apply_overrides(built(DENSE), run_overrides("uninterrupted", 10, 5, folder, uninterrupted_saves_at=5))
    assert cfg.checkpoint.save == str(folder.parent / "uninterrupted-checkpoint") and cfg.checkpoint.save_interval == 5
    assert cfg.checkpoint.save_optim is False and cfg.checkpoint.save_rng is False and cfg.checkpoint.load is None
