"""A run's output as numbered lines, with the rank that printed each one when the launcher says so.

Read as given: one rank's log, torchrun's interleaved output (``[rank3]:``, ``[default3]:`` with
``--tee``), Slurm's ``srun --label`` output (``3: ``), mpirun's ``[1,3]<stdout>:``, a sweep's
``failure.json`` (its reason, as line 1), or a run folder (its log.txt and failure.json).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

LOG_FILE = "log.txt"  # what the sweep and the benchmark write into each run folder
FAILURE_FILE = "failure.json"  # as mbridge_offload/runtime/run_outcome.py writes it
SUMMARY_FILE = "summary.json"

_RANK_PREFIXES = (
    re.compile(r"^\[rank(\d+)\]:\s?"),  # torchrun / Megatron
    re.compile(r"^\[default(\d+)\]:\s?"),  # torchrun --tee
    re.compile(r"^\[\d+,(\d+)\]<std(?:out|err)>:\s?"),  # mpirun --tag-output
    re.compile(r"^\s{0,3}(\d{1,5}): "),  # srun --label
)


class LogError(Exception):
    """A LOG that cannot be read: the message names the file."""


@dataclass(frozen=True)
class Line:
    path: Path
    number: int  # 1-based, in its file
    rank: int | None  # None where the line carries no rank prefix
    text: str  # without the rank prefix

    def where(self) -> str:
        return f"{self.path}:{self.number}" + ("" if self.rank is None else f" [rank {self.rank}]")


def strip_rank(raw: str) -> tuple[int | None, str]:
    """The rank a line's prefix names and the line without it (nested prefixes too: Slurm's around torchrun's)."""
    rank = None
    for _ in range(2):
        for prefix in _RANK_PREFIXES:
            match = prefix.match(raw)
            if match:
                rank, raw = int(match.group(1)), raw[match.end():]
                break
        else:
            break
    return rank, raw


def _lines_of(path: Path) -> list[Line]:
    try:
        text = path.read_text(errors="replace")
    except OSError as error:
        raise LogError(f"cannot read {path}: {error.strerror or error}") from None
    if path.name == FAILURE_FILE or path.suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            data = None
        if isinstance(data, dict) and isinstance(data.get("reason"), str):
            return [Line(path, 1, None, data["reason"])]
    lines = []
    for number, raw in enumerate(text.splitlines(), 1):
        rank, stripped = strip_rank(raw.rstrip("\r"))
        lines.append(Line(path, number, rank, stripped))
    return lines


def log_files(path: Path) -> list[Path]:
    """The files a LOG argument stands for: itself, or a run folder's log and failure record."""
    if not path.exists():
        raise LogError(f"no such file: {path}")
    if path.is_dir():
        found = [path / name for name in (LOG_FILE, FAILURE_FILE) if (path / name).is_file()]
        if not found and not (path / SUMMARY_FILE).is_file():
            raise LogError(f"{path} is a folder without {LOG_FILE}, {FAILURE_FILE} or {SUMMARY_FILE}")
        return found
    return [path]


def read_lines(path: Path) -> list[Line]:
    """Every line of a LOG argument (a file or a run folder); LogError names the file it cannot read."""
    lines: list[Line] = []
    for file in log_files(path):
        lines += _lines_of(file)
    return lines


def run_folder(path: Path) -> Path:
    """The folder of the run a LOG argument belongs to (the sweep's layout: DIR/log.txt, DIR/failure.json)."""
    return path if path.is_dir() else path.parent
