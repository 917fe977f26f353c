"""A run's output as numbered lines, with the rank that printed each one when the launcher says so.

Read as given: one rank's log, torchrun's interleaved output (``[rank3]:``, ``[default3]:`` with
``--tee``), Slurm's ``srun --label`` output (``3: ``), mpirun's ``[1,3]<stdout>:``, a sweep's
``failure.json`` (its reason, as line 1), or a run folder (its log.txt and failure.json). Compressed files,
UTF-16 and colour codes are undone by log_text.py; lines are counted as an editor or ``grep -n`` counts them
(a carriage return inside a line, a progress bar's redraw, starts no new line).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from mbridge_offload.diagnosis.log_text import STDIN, LogError, log_text

LOG_FILE = "log.txt"  # what the sweep and the benchmark write into each run folder
FAILURE_FILE = "failure.json"  # as mbridge_offload/runtime/run_outcome.py writes it
SUMMARY_FILE = "summary.json"

_RANK_PREFIXES = (
    re.compile(r"^\[rank(\d+)\]:\s?"),  # torchrun / Megatron
    re.compile(r"^\[default(\d+)\]:\s?"),  # torchrun --tee
    re.compile(r"^\[\d+,(\d+)\]<std(?:out|err)>:\s?"),  # mpirun --tag-output
    re.compile(r"^\s{0,3}(\d{1,5}): "),  # srun --label
)
# What a line carries before a rank prefix without naming a rank: a container log's or journald's timestamp, and
# docker compose's service column ("train-1  | ", v1: "train_1  | "; its names end in the replica's number)
_TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?\s+(?=\S)"
                        r"|^[\w.-]+[-_]\d+\s+\| ")
# One layer of prefixes, read by one match: a timestamp or compose's column, then the first rank prefix that stands
# there (in _RANK_PREFIXES's order); a layer that holds neither ends the reading
_LAYER = re.compile(f"({_TIMESTAMP.pattern})?(?:" + "|".join(p.pattern[1:] for p in _RANK_PREFIXES) + ")?")
_MAX_PREFIXES = 4  # srun's label around torchrun's --tee prefix around torchrun's rank prefix, and a timestamp
# Ranks a launcher's own line names where the line has no rank prefix: Slurm's "srun: error: node: tasks 3,5:",
# the NCCL watchdog's "[Rank 3]", Megatron's "failed on rank=3"
_SRUN_TASKS = re.compile(r"srun: error: \S+: tasks? ([\d,\-]+):")
_NAMED_RANK = re.compile(r"\[Rank (\d+)\]|\bon rank[= ](\d+)\b")
_AGENT_LINE = re.compile(r"torch/distributed/elastic/|torch\.distributed\.elastic\.")
# torchrun's ChildFailedError block: "rank : 3 (local_rank: 3)" beside the "exitcode : -9" and "traceback :" rows
_BLOCK_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)")
_BLOCK_ROW = re.compile(r"^\s*(time|host|rank|exitcode|error_file|traceback)\s*:")


@dataclass(frozen=True)
class Line:
    path: Path
    number: int  # 1-based, in its file
    rank: int | None  # None where the line carries no rank prefix
    text: str  # without the rank prefix

    def where(self) -> str:
        return f"{self.path}:{self.number}" + ("" if self.rank is None else f" [rank {self.rank}]")


def strip_rank(raw: str) -> tuple[int | None, str]:
    """The rank a line's prefix names and the line without it (nested prefixes too: Slurm's around torchrun's;
    the innermost rank is the process's own)."""
    rank = None
    for _ in range(_MAX_PREFIXES):
        layer = _LAYER.match(raw)
        if not layer.end():
            break
        named = layer.group(2) or layer.group(3) or layer.group(4) or layer.group(5)
        if named is not None:
            rank = int(named)
        raw = raw[layer.end():]
    return rank, raw


def _expand(tasks: str) -> list[int]:
    """Slurm's task list ("3", "3,5", "0-3,7") as numbers."""
    ranks = []
    for part in tasks.split(","):
        low, _, high = part.partition("-")
        if low.isdigit() and (not high or high.isdigit()):
            ranks += range(int(low), int(high or low) + 1)
    return ranks


def stated_ranks(lines: list["Line"], index: int) -> list[int]:
    """The ranks ``lines[index]`` is about: its prefix's, else those the launcher's line itself names (srun's task
    list, NCCL's "[Rank 3]", the "rank :" row of torchrun's failure block the line belongs to); [] if none."""
    line = lines[index]
    # torchrun's agent prints its own lines: a prefix there is srun's label of the agent (a node), not a rank
    if line.rank is not None and not _AGENT_LINE.search(line.text):
        return [line.rank]
    if match := _SRUN_TASKS.search(line.text):
        return _expand(match.group(1))
    if match := _NAMED_RANK.search(line.text):
        return [int(match.group(1) or match.group(2))]
    if _BLOCK_ROW.match(line.text):
        for step in (-1, 1):  # the block's rows, up to its ends
            j = index
            while 0 <= j < len(lines) and abs(j - index) <= 8 and _BLOCK_ROW.match(lines[j].text):
                if match := _BLOCK_RANK.match(lines[j].text):
                    return [int(match.group(1))]
                j += step
    return []


def _failure_reason(path: Path, text: str, notes: list[str]) -> str | None:
    """A sweep's failure.json's reason, or None where the file is not one: then a note says why, since the file is
    read as plain text instead (a run's own failure record that cannot be read is worth knowing: a disk that filled,
    a copy cut short)."""
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as error:
        notes.append(f"{path} is not valid JSON ({error}), so it is no failure record ({{\"reason\": ...}}, as "
                     "runtime/run_outcome.py writes it): read as plain text")
        return None
    if isinstance(data, dict) and isinstance(data.get("reason"), str):
        return data["reason"]
    notes.append(f"{path} holds no \"reason\" text, so it is no failure record ({{\"reason\": ...}}, as "
                 "runtime/run_outcome.py writes it): read as plain text")
    return None


def _lines_of(path: Path, notes: list[str]) -> list[Line]:
    parts = log_text(path, notes)
    if path.name == FAILURE_FILE or path.suffix == ".json":
        reason = _failure_reason(path, parts[0][1], notes)
        if reason is not None:
            return [Line(path, 1, None, reason.strip())]
    lines = []
    for first_number, text in parts:
        for number, raw in enumerate(text.split("\n"), first_number):
            # a carriage return inside a line (CRLF's, or a progress bar redrawn in place): the line holds each
            # text written over the one before; an editor shows them as one line, so they keep its number
            for piece in raw.rstrip("\r").split("\r"):
                if piece.strip() or not lines or lines[-1].number != number:
                    rank, stripped = strip_rank(piece)
                    lines.append(Line(path, number, rank, stripped))
    if lines and not lines[-1].text and lines[-1].rank is None:  # the text's final newline ends the last line
        lines.pop()
    return lines


def log_files(path: Path) -> list[Path]:
    """The files a LOG argument stands for: itself, or a run folder's log and failure record ("-": standard input)."""
    if path == STDIN:
        return [path]
    if not path.exists():
        raise LogError(f"no such file: {path}")
    if path.is_dir():
        found = [path / name for name in (LOG_FILE, FAILURE_FILE) if (path / name).is_file()]
        if not found and not (path / SUMMARY_FILE).is_file():
            raise LogError(f"{path} is a folder without {LOG_FILE}, {FAILURE_FILE} or {SUMMARY_FILE}")
        return found
    return [path]


def read_lines(path: Path, notes: list[str] | None = None) -> list[Line]:
    """Every line of a LOG argument (a file or a run folder); LogError names the file it cannot read, or the
    LOG that holds no text at all (an empty file: nothing to diagnose is not 'nothing went wrong'). ``notes`` gets
    what the reading has to tell about a file it did read, one line each (a .gz cut short, a failure.json that is
    not one)."""
    notes = [] if notes is None else notes
    lines: list[Line] = []
    files = log_files(path)
    for file in files:
        lines += _lines_of(file, notes)
    if files and not any(line.text.strip() for line in lines):
        if path.is_dir() and (path / SUMMARY_FILE).is_file():
            return []  # the summary alone still has step times to judge
        empty = " and ".join("standard input" if file == STDIN else str(file) for file in files)
        raise LogError(f"{empty} {'is' if len(files) == 1 else 'are'} empty: nothing to diagnose. Give the run's "
                       "output (the file torchrun's or srun's stdout/stderr went to, e.g. slurm-JOBID.out)")
    return lines


def run_folder(path: Path) -> Path | None:
    """The folder of the run a LOG argument belongs to (the sweep's layout: DIR/log.txt, DIR/failure.json); None for
    standard input, which belongs to no folder (the current one is not the run's)."""
    if path == STDIN:
        return None
    return path if path.is_dir() else path.parent
