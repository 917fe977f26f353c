"""On a GPU: optimizer.optimizer_offload_fraction=auto picks a fraction that trains on a GPU of the given size,
and the next 0.05 below runs out of memory or leaves less free than auto's margin (scripts/check_auto.py on an
8-layer proxy with full recompute, a configuration no planner constant was fitted on, on a 16 GiB device made
by a ballast process). Needs the GPU to itself. Skipped without CUDA; the recorded pairs are in
docs/benchmarks/planner-auto/."""

from __future__ import annotations

import json

import pytest


@pytest.mark.gpu
def test_auto_trains_and_one_step_less_does_not_fit(tmp_path):
    from mbridge_offload.cli.check_auto import main

    code = main(["--recipe", "qwen3_1b_proxy_pretrain_config", "--device-gib", "16", "--out", str(tmp_path),
                 "model.num_layers=8", "model.seq_length=4096", "dataset.seq_length=4096", "train.micro_batch_size=1",
                 "train.global_batch_size=1", "model.recompute_granularity=full", "model.recompute_method=uniform",
                 "model.recompute_num_layers=2"])
    row = json.loads((tmp_path / "auto_check.json").read_text())[0]
    assert code == 0, row
    assert row["at_auto"]["outcome"] == "trained", row
    assert row["at_auto"]["headroom_gib"] >= 0, row
    below = row["below"]
    assert below["outcome"] == "out of memory" or below["headroom_gib"] < row["auto"]["margin_gib"], row
