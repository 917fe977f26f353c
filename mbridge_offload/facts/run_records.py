"""A run folder's per-step records, ``metrics.rank<R>.jsonl`` (written by runtime/metrics.py, one JSON object per
step), read back by the layers that judge a finished run: diagnosis, the benchmarks' tables and checks."""

from __future__ import annotations

import json
import re
from pathlib import Path

STEP_RECORDS_GLOB = "metrics.rank*.jsonl"
_STEP_RECORDS_NAME = re.compile(r"metrics\.rank(\d+)\.jsonl")


def step_records_file(out_dir: Path, rank: int) -> Path:
    return Path(out_dir) / f"metrics.rank{rank}.jsonl"


def read_steps(out_dir: Path) -> dict[int, list[dict]]:
    """Per-rank step records of a run folder (files named otherwise, a rank's copy for one, are not a rank's)."""
    runs = {}
    for path in sorted(Path(out_dir).glob(STEP_RECORDS_GLOB)):
        if match := _STEP_RECORDS_NAME.fullmatch(path.name):
            runs[int(match.group(1))] = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return runs


def recorded_expandable_segments(out_dir: Path) -> bool | None:
    """Whether rank 0's allocator had expandable segments, as its step records say (measured in the process:
    the segments PyTorch held at step 1); None where no record says it (no folder, an older run, a run that
    stopped before its first step, or a record that found none or both kinds). Read line by line: a run that
    crashed mid-write leaves a torn last line, and the records before it still count."""
    try:
        lines = step_records_file(out_dir, 0).read_text(errors="replace").splitlines()
    except OSError:
        return None
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and isinstance(record.get("allocator_expandable_segments"), bool):
            return record["allocator_expandable_segments"]
    return None
