"""What a finished run left in its folder: ``summary.json`` when it trained, ``failure.json`` with the
reason when it did not. One writer and one reader for every party that records or reads a run's end:
run_recipe refusing before launch, a training rank that failed, and a sweep recording a run that was
killed or timed out (which could not say so itself). A sweep's ``--resume`` keeps every run that has
either file.
"""

from __future__ import annotations

import json
from pathlib import Path

SUMMARY_FILE = "summary.json"  # written by mbridge_offload/runtime/metrics.py at the end of training
FAILURE_FILE = "failure.json"


def write_failure(run_dir: Path, reason: str) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / FAILURE_FILE).write_text(json.dumps({"reason": reason}, indent=2) + "\n")


def forget_outcome(run_dir: Path) -> None:
    """Remove an earlier run's results from ``run_dir``: they must not pass for the next run's."""
    for name in (SUMMARY_FILE, FAILURE_FILE):
        (run_dir / name).unlink(missing_ok=True)


def recorded(run_dir: Path, succeeded: bool = True) -> dict:
    """What a finished run left: its summary (when it succeeded) or its failure reason; {} if neither."""
    summary, failure = run_dir / SUMMARY_FILE, run_dir / FAILURE_FILE
    if succeeded and summary.exists():
        return {"summary": json.loads(summary.read_text())}
    if failure.exists():
        return {"reason": json.loads(failure.read_text())["reason"]}
    return {}
