"""Where a step's GPU time goes, from a PyTorch profiler trace: each stream's busy time, the copies' bytes and
rates, and the training stream's idle gaps with what the other streams were doing meanwhile.

A run writes the trace with ``profiling.use_pytorch_profiler=True profiling.profile_step_start=S
profiling.profile_step_end=E`` (Megatron Bridge's profiler: ``<out>/torch_profile/rank-0.json.gz``). Then::

    python -m mbridge_offload.bench.gpu_trace <out>/torch_profile/rank-0.json.gz [--gap-ms 0.5]

The training stream is the one with the most kernel time. A gap in it is time the GPU's compute waited: on an
event (an offload engine's gate, a copy), or on the CPU launching work. Which of the two: the work after the gap was
launched by the CPU (the CUDA runtime call with the same correlation id) some time before the gap ended. Launched
long before, the GPU held it (it waited on an event, or a copy on the copy engine's queue); launched just before, the
CPU was late (the launching thread was busy or blocked). The report gives that lead and the CPU op that launched it,
and, in a trace written with Python stacks (``profiling.pytorch_profiler_collect_callstack=True``), the innermost
Python function outside PyTorch around the launch: which of the training loop's reads a copy is, for example.
"""

from __future__ import annotations

import argparse
import gzip
import json
from dataclasses import dataclass
from pathlib import Path

COPY_KINDS = {"HtoD": "host to device", "DtoH": "device to host", "DtoD": "device to device"}


@dataclass(frozen=True, kw_only=True)
class GpuEvent:
    stream: int
    start_us: float
    end_us: float
    name: str
    category: str  # kernel, gpu_memcpy, gpu_memset
    nbytes: int  # copies only
    correlation: int | None = None  # the CUDA runtime call that launched it (Launch)

    @property
    def copy_kind(self) -> str | None:
        if self.category != "gpu_memcpy":
            return None
        return next((kind for kind in COPY_KINDS if kind in self.name), "other")


def read_trace(path: Path) -> list[dict]:
    """The complete ("X") events of a Chrome trace written by torch.profiler (.json or .json.gz), read once for
    ``load_events`` and ``load_launches`` (a profiled run's trace can take hundreds of MB)."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as handle:
        trace = json.load(handle)
    return [event for event in trace.get("traceEvents", trace if isinstance(trace, list) else [])
            if event.get("ph") == "X" and "dur" in event]


def load_events(trace: Path | list[dict]) -> tuple[list[GpuEvent], list[tuple[float, float]]]:
    """(the GPU's kernels, copies and memsets; the profiled steps' spans on the GPU, or the CPU's when the trace
    has no GPU annotation) of a Chrome trace (its path, or ``read_trace``'s events)."""
    # a step's GPU annotation is written once per stream that ran work in it: one span per step name
    events, gpu_steps, cpu_steps = [], {}, {}
    for event in trace if isinstance(trace, list) else read_trace(trace):
        category, name = event.get("cat", ""), event.get("name", "")
        start, end = float(event["ts"]), float(event["ts"]) + float(event["dur"])
        if name.startswith("ProfilerStep#"):
            steps = gpu_steps if category == "gpu_user_annotation" else cpu_steps
            first, last = steps.get(name, (start, end))
            steps[name] = (min(first, start), max(last, end))
        elif category in ("kernel", "gpu_memcpy", "gpu_memset"):
            args = event.get("args", {})
            correlation = args.get("correlation")
            events.append(GpuEvent(stream=int(args.get("stream", event.get("tid", 0))), start_us=start, end_us=end,
                                   name=name, category=category, nbytes=int(args.get("bytes", 0) or 0),
                                   correlation=int(correlation) if correlation is not None else None))
    return sorted(events, key=lambda e: e.start_us), sorted((gpu_steps or cpu_steps).values())


@dataclass(frozen=True, kw_only=True)
class Launch:
    """The CPU side of a GPU event: the CUDA runtime (or driver) call that enqueued it, and the innermost CPU op
    running on that thread around it (what the training loop was doing: ``aten::copy_``, ``aten::mm``, ...)."""

    start_us: float
    end_us: float
    call: str  # cudaLaunchKernel, cudaMemcpyAsync, ...
    op: str  # "" when no CPU op encloses it
    caller: str = ""  # the innermost Python frame outside PyTorch around it ("file(line): function"); "" without stacks


def load_launches(trace: Path | list[dict]) -> dict[int, Launch]:
    """By correlation id, the launches of a Chrome trace (its path, or ``read_trace``'s events; empty if it has
    none)."""
    calls, ops, frames = [], {}, {}
    for event in trace if isinstance(trace, list) else read_trace(trace):
        category = event.get("cat", "")
        start, end = float(event["ts"]), float(event["ts"]) + float(event["dur"])
        if category in ("cuda_runtime", "cuda_driver") and event.get("args", {}).get("correlation") is not None:
            calls.append((start, end, event.get("tid"), event.get("name", ""), int(event["args"]["correlation"])))
        elif category == "cpu_op":
            ops.setdefault(event.get("tid"), []).append((start, end, event.get("name", "")))
        elif category == "python_function":
            frames.setdefault(event.get("tid"), []).append((start, end, event.get("name", "")))
    callers = _callers(calls, frames)
    launches = {}
    for start, end, thread, call, correlation in calls:
        around = [op for op in ops.get(thread, []) if op[0] <= start and end <= op[1]]
        op = min(around, key=lambda o: o[1] - o[0])[2] if around else ""
        launches[correlation] = Launch(start_us=start, end_us=end, call=call, op=op,
                                       caller=callers.get(correlation, ""))
    return launches


def _outside_torch(frame: str) -> bool:
    """Whether a Python frame's name ("path(line): function") is the caller's code, not PyTorch's own or the
    interpreter's built-ins."""
    path = frame.split("(", 1)[0].replace("\\", "/")
    return not (path.startswith("torch/") or "/torch/" in path or frame.startswith("<built-in"))


def _callers(calls: list[tuple], frames: dict) -> dict[int, str]:
    """By correlation id, the innermost Python frame outside PyTorch that encloses each call on its thread. A
    thread's frames nest (a call stack), so one sweep in time order keeps the stack of frames open at each call."""
    found: dict[int, str] = {}
    by_thread: dict = {}
    for start, end, thread, _, correlation in calls:
        by_thread.setdefault(thread, []).append((start, end, correlation))
    for thread, thread_calls in by_thread.items():
        opened = sorted(frames.get(thread, []), key=lambda f: (f[0], -f[1]))
        if not opened:
            continue
        stack: list[tuple[float, float, str]] = []
        index = 0
        for start, end, correlation in sorted(thread_calls):
            while index < len(opened) and opened[index][0] <= start:
                while stack and stack[-1][1] < opened[index][0]:
                    stack.pop()
                stack.append(opened[index])
                index += 1
            while stack and stack[-1][1] < end:
                stack.pop()
            caller = next((frame[2] for frame in reversed(stack) if frame[1] >= end and _outside_torch(frame[2])), "")
            if caller:
                found[correlation] = caller
    return found


def union_us(spans: list[tuple[float, float]]) -> float:
    """Total length of the union of ``spans``."""
    total, end = 0.0, float("-inf")
    for start, stop in sorted(spans):
        if stop <= end:
            continue
        total += stop - max(start, end)
        end = stop
    return total


def overlap_us(spans: list[tuple[float, float]], window: tuple[float, float]) -> float:
    lo, hi = window
    return union_us([(max(a, lo), min(b, hi)) for a, b in spans if b > lo and a < hi])


def training_stream(events: list[GpuEvent]) -> int:
    kernel_us: dict[int, float] = {}
    for event in events:
        if event.category == "kernel":
            kernel_us[event.stream] = kernel_us.get(event.stream, 0.0) + event.end_us - event.start_us
    if not kernel_us:
        raise ValueError("the trace holds no GPU kernels (was the profiler's CUDA activity on?)")
    return max(kernel_us, key=kernel_us.get)


def gaps(events: list[GpuEvent], stream: int, min_us: float) -> list[tuple[float, float, str, str]]:
    """The idle spans of ``stream`` of at least ``min_us``: (start, end, the work before, the work after)."""
    return [(start, end, before, after.name) for start, end, before, after in _gaps(events, stream, min_us)]


def _gaps(events: list[GpuEvent], stream: int, min_us: float) -> list[tuple[float, float, str, GpuEvent]]:
    own = [e for e in events if e.stream == stream]
    found, end, before = [], None, ""
    for event in own:
        if end is not None and event.start_us - end >= min_us:
            found.append((end, event.start_us, before, event))
        if end is None or event.end_us > end:
            end, before = event.end_us, event.name
    return found


def launch_lead(after: GpuEvent, gap_end_us: float, launches: dict[int, Launch]) -> tuple[str, str]:
    """(how long before the gap's end the work after it was launched, in ms, and by what), or ("-", "-") when the
    trace does not link it to a launch."""
    launch = launches.get(after.correlation) if after.correlation is not None else None
    if launch is None:
        return "-", "-"
    by = f"{launch.op[:40]} ({launch.call})" if launch.op else launch.call
    if launch.caller:
        by += f" from {launch.caller[-90:]}"
    return f"{(gap_end_us - launch.end_us) / 1e3:.2f}", by


def report(path: Path, gap_ms: float = 0.5) -> str:
    trace = read_trace(path)
    events, steps = load_events(trace)
    main = training_stream(events)
    window = (steps[0][0], steps[-1][1]) if steps else (events[0].start_us, max(e.end_us for e in events))
    inside = [e for e in events if e.end_us > window[0] and e.start_us < window[1]]
    span_ms = (window[1] - window[0]) / 1e3
    lines = [f"# GPU trace: {path}", "",
             f"{len(steps)} profiled step(s), {span_ms:.1f} ms on the GPU; training stream: {main} (the most kernel "
             "time)", "", "| stream | busy (ms) | busy share | kernels | copies: kind, GB, busy ms, GB/s while copying |",
             "|---|---|---|---|---|"]
    for stream in sorted({e.stream for e in inside}):
        own = [e for e in inside if e.stream == stream]
        busy = overlap_us([(e.start_us, e.end_us) for e in own], window) / 1e3
        copies = []
        for kind in sorted({e.copy_kind for e in own if e.copy_kind}):
            moved = [e for e in own if e.copy_kind == kind]
            nbytes = sum(e.nbytes for e in moved)
            copy_ms = union_us([(e.start_us, e.end_us) for e in moved]) / 1e3
            rate = nbytes / 1e9 / (copy_ms / 1e3) if copy_ms else 0.0
            copies.append(f"{kind} {nbytes / 1e9:.2f} GB in {copy_ms:.1f} ms ({rate:.1f} GB/s)")
        kernels = sum(1 for e in own if e.category == "kernel")
        label = f"{stream} (training)" if stream == main else str(stream)
        lines.append(f"| {label} | {busy:.1f} | {busy / span_ms:.0%} | {kernels} | {'; '.join(copies) or '-'} |")
    idle = _gaps(inside, main, gap_ms * 1e3)
    launches = load_launches(trace)
    idle_ms = sum(b - a for a, b, _, _ in idle) / 1e3
    lines += ["", f"Training stream idle in gaps of >= {gap_ms} ms: {idle_ms:.1f} ms over {len(idle)} gap(s) "
              f"({idle_ms / max(len(steps), 1):.1f} ms per step). The longest:", "",
              "| at (ms from the first step) | gap (ms) | other streams busy meanwhile (ms) | before | after | "
              "after: launched (ms before the gap's end) | after: launched by |",
              "|---|---|---|---|---|---|---|"]
    for start, end, before, after in sorted(idle, key=lambda g: g[0] - g[1])[:12]:
        others = {}
        for stream in sorted({e.stream for e in inside} - {main}):
            busy = overlap_us([(e.start_us, e.end_us) for e in inside if e.stream == stream], (start, end)) / 1e3
            if busy > 0.05:
                others[stream] = busy
        lead, by = launch_lead(after, end, launches)
        lines.append(f"| {(start - window[0]) / 1e3:.1f} | {(end - start) / 1e3:.2f} | "
                     f"{', '.join(f'{s}: {ms:.1f}' for s, ms in others.items()) or '-'} | {before[:50]} | "
                     f"{after.name[:50]} | {lead} | {by} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trace", type=Path, help="a Chrome trace from torch.profiler (.json or .json.gz)")
    parser.add_argument("--gap-ms", type=float, default=0.5, help="the shortest idle span of the training stream "
                        "listed (default 0.5)")
    parser.add_argument("--out", type=Path, help="also write the report to this file")
    args = parser.parse_args(argv)
    text = report(args.trace, args.gap_ms)
    print(text, end="")
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
