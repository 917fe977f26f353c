"""What a run's output says about the run: the command that started it, the offload settings and CPU
threads of its header, its step times, and the numbers of torch's out-of-memory message. Each fact is
None where the output does not say it (then the run's config may: config_source.py)."""

from __future__ import annotations

import json
import re
import shlex
import string
from dataclasses import dataclass, field
from pathlib import Path

from mbridge_offload.diagnosis.logs import SUMMARY_FILE, Line
from mbridge_offload.facts.environment import ALLOCATOR_LINE, expandable_in_allocator_line
from mbridge_offload.facts.offload_engine import (BF16_MOMENTS, FETCH_AHEAD_HEADER, FETCH_AHEAD_HELD, FP32_MOMENTS,
                                                  STREAM, STREAM_MOMENTS_HEADER)
from mbridge_offload.facts.run_records import recorded_expandable_segments, step_records_file

# a decimal number standing alone: a garbled one ("2.9.0", ".", digits run into others) matches nowhere in it, so it
# reads as not stated rather than as part of itself or as an error
_NUMBER = r"(?<![\d.])\d+(?:\.\d+)?(?!\.?\d)"
# torch's sizes (c10's format_size): "512 bytes", "12.50 KiB", "896.00 MiB", "2.32 GiB"; older releases "B"
_SIZE = f"({_NUMBER}) ?(GiB|MiB|KiB|bytes|B)\\b"
_UNIT = {"GiB": 1.0, "MiB": 1 / 1024, "KiB": 1 / 1024 ** 2, "bytes": 1 / 1024 ** 3, "B": 1 / 1024 ** 3}
_ITERATION = re.compile(r"iteration\s+(\d+)/\s*\d+ \|.*elapsed time per iteration \(ms\): (" + _NUMBER + ")")
_GPUS_IN_HEADER = re.compile(r"^(?:Recipe|Training) \S+ \((\d+) GPUs?: ")
_THREADS = re.compile(r"CPU threads per rank: (\d+)")
_GPU_PLAN = re.compile(r"GPU: (?:fit|total) .* of (" + _NUMBER + ") GiB")
_HOST_PLAN = re.compile(r"host: per node .* rank(?:s|\(s\))? of (" + _NUMBER + ") GiB")


def _template_pattern(template: str, fields: dict[str, str]) -> re.Pattern:
    """A str.format template as a pattern: its text literal, each field the pattern ``fields`` gives it (a field
    the template gains and ``fields`` lacks raises KeyError at import, rather than a pattern that never matches)."""
    return re.compile("".join(re.escape(literal) + ("" if name is None else fields[name])
                              for literal, name, _, _ in string.Formatter().parse(template)))


# rank 0's line of the GiB fetch-ahead's buffers held in a step; its GiB taken whatever it reads, so that a garbled one
# still says fetch-ahead ran
_FETCH_AHEAD_HELD = _template_pattern(FETCH_AHEAD_HELD, {"chunks": r"\S+", "gib": r"(\S+)"})
# what a line that states one of the facts below holds (the header's and the plan's first words, an iteration line's)
_FACT_WORDS = re.compile(r"^\s*(?:Recipe |Training |optimizer offload: |offload engine: |"
                         r"activation offload \(layer-level\): |"
                         r"fine-grained activation offload: |CPU threads per rank: |GPU: |host: per node |"
                         + re.escape(FETCH_AHEAD_HEADER) + "|" + re.escape(STREAM_MOMENTS_HEADER)
                         + r"|stream fetch-ahead: )|elapsed time per iteration \(ms\)")
_COMMAND = re.compile(r"(?:run_recipe(?:\.py)?|mbridge-run-recipe)\s+(.*)$")


def _gib(number: str, unit: str) -> float:
    return float(number) * _UNIT[unit]


def size_words(gib: float) -> str:
    """A size as torch writes it: in the largest unit that keeps it at 1 or more (a 512 KiB request is not
    '0.00 GiB')."""
    for unit, scale in (("GiB", 1.0), ("MiB", 1024.0), ("KiB", 1024.0 ** 2)):
        if gib * scale >= 1:
            return f"{gib * scale:.2f} {unit}"
    return f"{round(gib * 1024 ** 3)} bytes"


def _size(pattern: str, text: str) -> float | None:
    """The size ``pattern`` (holding SIZE where the size stands) finds in ``text``, in GiB."""
    match = re.search(pattern.replace("SIZE", _SIZE), text)
    return _gib(*match.groups()[-2:]) if match else None


@dataclass(frozen=True)
class OutOfMemory:
    """The numbers of torch's ``CUDA out of memory`` message, in GiB (None where the message lacks them). Read from
    each spelling torch has had: 2.2 on ("GPU 0 has a total capacity of ... of which ... is free ... Of the allocated
    memory ... is allocated by PyTorch, and ... is reserved by PyTorch but unallocated"), 2.1's ("total capacty"),
    and 1.x's parenthesis ("(GPU 0; 79.35 GiB total capacity; 76.51 GiB already allocated; 13.19 MiB free;
    77.20 GiB reserved in total by PyTorch)")."""

    requested_gib: float
    capacity_gib: float | None = None
    free_gib: float | None = None
    allocated_gib: float | None = None  # by PyTorch
    reserved_unallocated_gib: float | None = None
    other_processes_gib: float | None = None  # what the other processes on the GPU held ("Process N has ...")
    device: int | None = None  # the GPU index the message names (local to its node, not a rank)

    @classmethod
    def parse(cls, text: str) -> "OutOfMemory | None":
        requested = _size(r"Tried to allocate SIZE", text)
        if requested is None:
            return None
        capacity = _size(r"total capaci?ty of SIZE", text) or _size(r"SIZE total capacity", text)
        free = _size(r"of which SIZE is free", text)
        if free is None:
            free = _size(r"already allocated; SIZE free", text)
        allocated = _size(r"Of the allocated memory SIZE is allocated by PyTorch", text)
        if allocated is None:
            allocated = _size(r"SIZE already allocated", text)
        reserved = _size(r"SIZE is reserved by PyTorch but unallocated", text)
        reserved_in_total = _size(r"SIZE reserved in total by PyTorch", text)
        if reserved is None and reserved_in_total is not None and allocated is not None:
            reserved = max(0.0, reserved_in_total - allocated)
        # "Process N has ..." lists other processes only where the message names this one apart ("this process
        # has", torch 2.2 on); torch 2.1 listed every process so, this one among them
        others = ([_gib(*m) for m in re.findall(r"Process \d+ has " + _SIZE + " memory in use", text)]
                  if re.search(r"this process has", text) else [])
        device = re.search(r"\bGPU (\d+)\b", text)
        return cls(requested_gib=requested, capacity_gib=capacity, free_gib=free if capacity is not None else None,
                   allocated_gib=allocated, reserved_unallocated_gib=reserved,
                   other_processes_gib=sum(others) if others else None,
                   device=int(device.group(1)) if device else None)

    @property
    def shortfall_gib(self) -> float | None:
        """What the failed allocation lacked: at least this much must come off the GPU."""
        return None if self.free_gib is None else max(0.0, self.requested_gib - self.free_gib)

    def words(self) -> str:
        parts = [f"tried to allocate {size_words(self.requested_gib)}"]
        if self.capacity_gib is not None:
            parts.append(f"{size_words(self.free_gib or 0.0)} free of {self.capacity_gib:.2f} GiB")
        if self.allocated_gib is not None:
            held = f"PyTorch held {self.allocated_gib:.2f} GiB"
            if self.reserved_unallocated_gib is not None:
                held += f" (+{size_words(self.reserved_unallocated_gib)} reserved, unused)"
            parts.append(held)
        if self.other_processes_gib:
            parts.append(f"other processes {self.other_processes_gib:.2f} GiB")
        return ", ".join(parts) + ("" if self.device is None else f" (GPU {self.device})")


@dataclass(frozen=True)
class Command:
    """``run_recipe.py --recipe NAME ... key=value ...`` as the log's first line records it."""

    recipe: str
    overrides: tuple[str, ...]
    num_gpus: int | None

    @classmethod
    def parse(cls, text: str) -> "Command | None":
        return cls.read(text)[0]

    @classmethod
    def read(cls, text: str) -> tuple["Command | None", str]:
        """The command ``text`` holds and "", or None and why the run_recipe.py command on it cannot be read ("" where
        the line holds none)."""
        match = _COMMAND.search(text)
        if not match:
            return None, ""
        try:
            words = shlex.split(match.group(1))
        except ValueError as error:  # shlex's "No closing quotation", "No escaped character"
            return None, f"its words cannot be split as the shell splits them ({error})"
        recipe, num_gpus, overrides, i = None, None, [], 0
        while i < len(words):
            word = words[i]
            value = words[i + 1] if i + 1 < len(words) else None
            if word == "--recipe" and value:
                recipe, i = value, i + 2
            elif word == "--num-gpus" and value and value.isdigit():
                num_gpus, i = int(value), i + 2
            elif word.startswith("-") and "=" not in word:
                # another flag of run_recipe.py: skip its value unless the next word is a flag or an override
                i += 2 if value is not None and not value.startswith("-") and "=" not in value else 1
            else:
                if "=" in word:
                    overrides.append(word)
                i += 1
        # a line with no recipe named is no command to rebuild (argparse's usage line names "[--recipe NAME]")
        return (cls(recipe, tuple(overrides), num_gpus) if recipe else None), ""


@dataclass
class RunFacts:
    """What the output (and the run folder's summary.json) says; None: it does not say."""

    run_dir: Path | None = None
    command: Command | None = None
    command_unread: str = ""  # a run_recipe.py command line that could not be read: where it stands and why
    num_gpus: int | None = None
    optimizer_offload: bool | None = None
    fraction: float | None = None
    activation_offload: bool | None = None
    fine_grained: bool | None = None
    threads: int | None = None
    step_times_s: list[float] = field(default_factory=list)
    step_times_from: str = ""
    summary: dict | None = None
    gpu_memory_gib: float | None = None  # from the memory plan run_recipe.py prints
    host_memory_gib: float | None = None
    expandable_segments: bool | None = None  # whether the run's allocator had expandable segments
    expandable_segments_from: str = ""  # what says so: the run's step records, else the header's line
    fetch_ahead: bool | None = None  # the stream engine's fetch-ahead on (its header line, else the run's config)
    fetch_ahead_gib: float | None = None  # the most its buffers held in a step, as rank 0's lines say
    fetch_ahead_unread: str = ""  # the first GiB of those lines that is not a number (a garbled line)
    engine: str | None = None  # the engine of the offloaded optimizer step (the header's line, else the run's config)
    stream_moments: str | None = None  # the stream engine's moments, fp32 or bf16; None with another engine
    stream_moments_from: str = ""  # what says so, in words

    @property
    def steady_step_s(self) -> float | None:
        """The median step time after the first step (the warm-up)."""
        rest = sorted(self.step_times_s[1:])
        return rest[len(rest) // 2] if rest else None


def read_summary(run_dir: Path | None) -> dict | None:
    if run_dir is None or not (run_dir / SUMMARY_FILE).is_file():
        return None
    try:
        data = json.loads((run_dir / SUMMARY_FILE).read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


# what shows that a run got under way: after one of these, run_recipe.py's header begins the next run in the log
_RUN_PROGRESS = re.compile(r"elapsed time per iteration \(ms\)|^Traceback \(most recent call last\)|^Run summary \(")


def run_segments(lines: list[Line]) -> list[range]:
    """The runs one log holds, one after another: a job that appends to its log across restarts (a preemption's
    requeue, torchrun's --max-restarts, a relaunch by hand) writes each run's header, steps and end in turn. A run
    begins at run_recipe.py's header, or at the command line just before it, once the run before it has trained a
    step, raised or summarised: the header each rank's run_recipe.py prints at the start of one run stays in that
    run. The lines of several files (a run folder's per-rank logs) are one run."""
    if len({line.path for line in lines}) > 1:
        return [range(len(lines))]
    starts, progressed, command = [0], False, None
    for i, line in enumerate(lines):
        text = line.text.strip()
        if _GPUS_IN_HEADER.match(text):
            if progressed:
                starts.append(i if command is None else command)
                progressed = False
            command = None
        elif progressed and "--recipe" in text and _COMMAND.search(text):
            command = i if command is None else command
        elif _RUN_PROGRESS.search(text):
            progressed = True
    return [range(start, stop) for start, stop in zip(starts, [*starts[1:], len(lines)])]


def run_facts(lines: list[Line], run_dir: Path | None) -> RunFacts:
    facts = RunFacts(run_dir=run_dir)
    iterations: dict[int, float] = {}
    for line in lines:
        raw = line.text
        # most lines state none of these facts: the words each one starts with, or holds, are looked for first
        if not (_FACT_WORDS.search(raw) or ALLOCATOR_LINE in raw or "--recipe" in raw):
            continue
        text = raw.strip()
        if facts.command is None and "--recipe" in text:
            facts.command, unread = Command.read(text)
            if unread and not facts.command_unread:
                facts.command_unread = (f"the log's run_recipe.py command ({line.path.name}:{line.number}) could not "
                                        f"be read: {unread}")
        if facts.num_gpus is None and (match := _GPUS_IN_HEADER.match(text)):
            facts.num_gpus = int(match.group(1))
        if text.startswith("optimizer offload: "):
            on = text.startswith("optimizer offload: ON")
            facts.optimizer_offload = on
            share = re.search(f"ON, ({_NUMBER})% of optimizer states", text)
            facts.fraction = float(share.group(1)) / 100 if share else (None if on else 0.0)
            if not on:  # fetch-ahead runs only inside the stream engine, which optimizer offload starts
                facts.fetch_ahead = False
        elif text.startswith("offload engine: "):
            # the header names the engine where optimizer offload is on, and says on the next line if fetch-ahead
            # is on (the launch shell's value included, which the saved config does not know); so for bf16 moments
            facts.fetch_ahead = False
            facts.engine = text[len("offload engine: "):].split(":", 1)[0].strip()
            stream = facts.engine == STREAM
            facts.stream_moments = FP32_MOMENTS if stream else None
            facts.stream_moments_from = (f"the run's header names the stream engine, with no '{STREAM_MOMENTS_HEADER}' "
                                         "line below it" if stream else "")
        elif text.startswith("activation offload (layer-level): "):
            facts.activation_offload = text.endswith(": off") is False
        elif text.startswith("fine-grained activation offload: "):
            facts.fine_grained = text.endswith(": off") is False
        elif match := _THREADS.match(text):
            facts.threads = int(match.group(1))
        elif match := _GPU_PLAN.match(text):  # "total": logs of before
            facts.gpu_memory_gib = float(match.group(1))
        elif match := _HOST_PLAN.match(text):  # "rank(s)": today's plan
            facts.host_memory_gib = float(match.group(1))
        elif text.startswith(FETCH_AHEAD_HEADER):
            facts.fetch_ahead = True
        elif text.startswith(STREAM_MOMENTS_HEADER):  # printed only under the stream engine's line
            facts.engine, facts.stream_moments = STREAM, BF16_MOMENTS
            facts.stream_moments_from = f"the run's header line '{STREAM_MOMENTS_HEADER}'"
        elif match := _FETCH_AHEAD_HELD.search(text):
            facts.fetch_ahead = True
            if re.fullmatch(_NUMBER, match.group(1)):
                facts.fetch_ahead_gib = max(facts.fetch_ahead_gib or 0.0, float(match.group(1)))
            else:
                facts.fetch_ahead_unread = facts.fetch_ahead_unread or match.group(1)
        elif (expandable := expandable_in_allocator_line(text)) is not None:
            facts.expandable_segments, facts.expandable_segments_from = expandable, "as the log's header says"
        elif match := _ITERATION.search(text):
            if line.rank in (None, 0):
                iterations.setdefault(int(match.group(1)), float(match.group(2)) / 1000)
    if facts.num_gpus is None and facts.command is not None:
        facts.num_gpus = facts.command.num_gpus
    # What the process measured outranks what run_recipe.py set out to give it
    if run_dir is not None and (recorded := recorded_expandable_segments(run_dir)) is not None:
        facts.expandable_segments = recorded
        facts.expandable_segments_from = f"as the run's step records say ({step_records_file(run_dir, 0)}, step 1)"
    facts.summary = read_summary(run_dir)
    if facts.summary and facts.summary.get("step_times_s"):
        facts.step_times_s, facts.step_times_from = list(facts.summary["step_times_s"]), f"{run_dir}/{SUMMARY_FILE}"
    elif iterations:
        facts.step_times_s = [iterations[k] for k in sorted(iterations)]
        facts.step_times_from = "the log's iteration lines"
    summary = facts.summary or {}
    if facts.optimizer_offload is None and "optimizer_cpu_offload" in summary:
        facts.optimizer_offload = bool(summary["optimizer_cpu_offload"])
        facts.fraction = float(summary.get("optimizer_offload_fraction") or 0.0) if facts.optimizer_offload else 0.0
    if facts.threads is None and summary.get("cpu_threads_per_rank"):
        facts.threads = int(summary["cpu_threads_per_rank"])
    if facts.command is None and isinstance(summary.get("recipe"), str):  # the recipe, its overrides unknown
        facts.command = Command(summary["recipe"], (), summary.get("num_gpus"))
    if facts.num_gpus is None and summary.get("num_gpus"):
        facts.num_gpus = int(summary["num_gpus"])
    return facts
