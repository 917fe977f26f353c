"""A run folder's per-step records, ``metrics.rank<R>.jsonl`` (written by runtime/metrics.py, one JSON object per
step), read back by the layers that judge a finished run: diagnosis, the benchmarks' tables and checks."""

from __future__ import annotations

import json
from pathlib import Path


def step_records_file(out_dir: Path, rank: int) -> Path:
    return Path(out_dir) / f"metrics.rank{rank}.jsonl"


def read_steps(out_dir: Path) -> dict[int, list[dict]]:
    """Per-rank step records of a run folder."""
    runs = {}
    for path in sorted(Path(out_dir).glob("metrics.rank*.jsonl")):
        rank = int(path.name.removeprefix("metrics.rank").removesuffix(".jsonl"))
        runs[rank] = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return runs


def recorded_expandable_segments(out_dir: Path) -> bool | None:
    """Whether rank 0's allocator had expandable segments, as its step records say (measured in the process:
    the segments PyTorch held at step 1); None where no record says it (no folder, an older run, a run that
    stopped before its first step, or a record that found none or both kinds)."""
    try:
        steps = read_steps(out_dir).get(0, [])
    except (OSError, ValueError):
        return None
    return next((step["allocator_expandable_segments"] for step in steps
                 if isinstance(step.get("allocator_expandable_segments"), bool)), None)
