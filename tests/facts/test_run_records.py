"""A run folder's step records read back: the allocator setting a run measured, from records as runs leave them
(a torn last line after a crash, lines that are not records, another file beside rank 0's)."""

from __future__ import annotations

import json
from pathlib import Path

from mbridge_offload.facts.run_records import read_steps, recorded_expandable_segments, step_records_file

BENCHMARKS = Path(__file__).resolve().parents[2] / "docs" / "benchmarks"


def test_the_setting_of_committed_runs_with_and_without_the_record():
    assert recorded_expandable_segments(BENCHMARKS / "planner-auto-3" / "0p6b-sl2048-mb4" / "auto") is True
    assert recorded_expandable_segments(BENCHMARKS / "planner-auto-2" / "1p7b-sl4096" / "auto") is None  # older run
    assert recorded_expandable_segments(BENCHMARKS / "alloc-tight" / "1b-proxy-fraction-1") is None  # died in step 1


def test_records_before_a_torn_line_count_and_lines_that_are_no_records_are_skipped(tmp_path):
    records = step_records_file(tmp_path, 0)
    records.write_text("null\n[1]\n" + json.dumps({"step": 1, "allocator_expandable_segments": False}) + "\n"
                       + '{"step": 2, "allocator_')
    (tmp_path / "metrics.rank1.jsonl").write_text("not json\n")  # another rank's file does not matter
    assert recorded_expandable_segments(tmp_path) is False


def test_a_record_that_found_both_kinds_says_nothing(tmp_path):
    step_records_file(tmp_path, 0).write_text(json.dumps({"step": 1, "allocator_expandable_segments": None}) + "\n")
    assert recorded_expandable_segments(tmp_path) is None


def test_files_beside_the_ranks_records_are_not_a_rank(tmp_path):
    step_records_file(tmp_path, 0).write_text(json.dumps({"step": 1}) + "\n")
    (tmp_path / "metrics.rank0.old.jsonl").write_text("a copy\n")
    assert read_steps(tmp_path) == {0: [{"step": 1}]}
