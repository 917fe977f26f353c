"""The reading of docs/benchmarks/reserve-snapshot/ (issue #15): the allocator's histories of two runs recorded on
the H200 show the block kept beside the peak as a free gap too small for the loss's next tensor, formed in step 2."""

import gzip
import json
import importlib.util
import pickle
from pathlib import Path

import pytest

FOLDER = Path(__file__).resolve().parents[2] / "docs" / "benchmarks" / "reserve-snapshot"
_spec = importlib.util.spec_from_file_location("holes", FOLDER / "holes.py")
holes = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(holes)


@pytest.mark.parametrize("run", ["0p6b-sl8192-mb2", "1b-proxy-sl6144-mb2"])
def test_the_kept_block_is_a_gap_smaller_than_the_request_that_grew_the_segment_in_step_2(run):
    with gzip.open(FOLDER / f"{run}.pickle.gz", "rb") as f:
        snapshot = pickle.load(f)
    growths = holes.growths(snapshot)
    # two logits-sized requests a step: the output layer's and the cross entropy's; step 2's first reused step 1's
    assert len(growths) == 3
    step_one, step_two = growths[:2], growths[2]
    assert all(g["free_gib"] < 0.05 for g in step_one)  # step 1 grew with nothing free: no hole yet
    assert 0.5 < step_two["free_gib"]  # step 2 grew beside free memory ...
    assert step_two["largest_gap_gib"] < step_two["request_gib"]  # ... in no gap large enough for the request
    # that gap is what the run's metrics show as reserved beyond the step's peak
    steps = [json.loads(line) for line in (FOLDER / run / "metrics.rank0.jsonl").read_text().splitlines()]
    kept = steps[1]["peak_reserved_gib"] - steps[1]["peak_allocated_gib"]
    assert kept == pytest.approx(step_two["free_gib"], abs=0.05)
    assert steps[0]["peak_reserved_gib"] - steps[0]["peak_allocated_gib"] < 0.1
