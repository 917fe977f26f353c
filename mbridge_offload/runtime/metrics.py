"""Per-step metrics of a training run and its summary.

Every rank writes ``metrics.rank<R>.jsonl`` (one JSON object per step: step time, loss where the
rank has it, GPU memory allocated/reserved current and peak, what the whole device has in use (CUDA
context, library workspaces and communicator buffers included: ``torch.cuda.mem_get_info``), host RSS, pinned host memory, and the
host peaks that happen inside a step: the RSS high-water mark and the node's peak used memory, see
``mbridge_offload/runtime/host_memory.py``). Rank 0
then writes ``summary.json``: median steady-state step time (warm-up excluded), peak memory over
all ranks, final loss. ``format_summary`` renders it as the table users read in the terminal.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from mbridge_offload.facts.proc import proc_kib
from mbridge_offload.facts.run_records import read_steps, step_records_file
from mbridge_offload.facts.units import GIB
from mbridge_offload.runtime.host_memory import rss_high_water_bytes
from mbridge_offload.runtime.offload_timing import BREAKDOWN_FIELDS



def host_rss_bytes() -> int:
    """Resident set size of this process (Linux /proc; 0 where unavailable)."""
    return (proc_kib("VmRSS") or 0) * 1024


def pinned_host_bytes() -> int | None:
    """Bytes held by PyTorch's pinned host allocator (what offload pins), or None if not reported."""
    import torch

    stats_fn = getattr(torch.cuda, "host_memory_stats", None)
    if stats_fn is None:
        return None
    stats = stats_fn()
    for key in ("allocated_bytes.current", "allocated_bytes.all.current", "reserved_bytes.current"):
        if key in stats:
            return int(stats[key])
    return None


def allocator_layout() -> dict[str, Any]:
    """How PyTorch's caching allocator holds the device memory it reserved: whether its segments are expandable
    (``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` in effect: the environment is read once, when CUDA starts,
    so a recipe's value takes effect only as run_recipe.py applies it, runtime/allocator_settings.py) and how many
    segments it holds."""
    import torch

    segments = torch.cuda.memory_snapshot()
    expandable = {bool(segment["is_expandable"]) for segment in segments if "is_expandable" in segment}
    return {"allocator_expandable_segments": expandable.pop() if len(expandable) == 1 else None,
            "allocator_segments": len(segments)}


def heap_bytes() -> dict[str, int] | None:
    """glibc malloc's heap: bytes in use and bytes freed but kept by the process (both inside the RSS), or None
    where the C library is not glibc. Freed blocks below malloc's mmap threshold stay in the heap."""
    import ctypes

    class MallInfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in
                    ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                     "keepcost")]

    try:
        mallinfo2 = ctypes.CDLL(None).mallinfo2
    except (AttributeError, OSError):
        return None
    mallinfo2.restype = MallInfo2
    info = mallinfo2()
    return {"in_use": info.uordblks + info.hblkhd, "free_kept": info.fordblks}


def device_used_by_this_process() -> int | None:
    """Device memory NVML counts for this process (CUDA context and library workspaces included), or None
    where NVML is missing or cannot see the process (a container's PID namespace)."""
    import torch

    try:
        import pynvml

        handle = torch.cuda._get_pynvml_handler(torch.cuda.current_device())
        for process in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
            if process.pid == os.getpid() and isinstance(process.usedGpuMemory, int):
                return process.usedGpuMemory
    except Exception:  # noqa: BLE001  (no NVML: the whole device's use is recorded instead)
        return None
    return None


def _loss_value(loss_dict: dict | None) -> float | None:
    if not loss_dict:
        return None
    value = loss_dict.get("lm loss", next(iter(loss_dict.values())))
    if hasattr(value, "numel"):
        value = value.float()
        value = (value[0] / value[1]) if value.numel() == 2 else value.reshape(-1)[0]
        return float(value.item())
    return float(value)


def _learning_rate(optimizer) -> float | None:
    groups = getattr(optimizer, "param_groups", None) or []
    return float(groups[0]["lr"]) if groups else None


def _gib_or_none(n: int | None) -> float | None:
    return None if n is None else n / GIB


def node_before_run_record(node_used_at_start: int | None, rss_at_start: int) -> dict[str, float]:
    """The node's memory in use when the sampler started, less this process's RSS then: what the node held before
    this run (with several ranks on a node, the others' memory at that moment too). The node's peak less it is the
    run's own share, which the plan's host peak per node is compared with; without it the comparison is off by
    whatever else the node held (1-3 GiB beside a ballast process)."""
    if node_used_at_start is None:
        return {}
    return {"node_host_used_before_run_gib": max(0, node_used_at_start - rss_at_start) / GIB}


def step_record(step: int, step_time_s: float, loss: float | None, grad_norm: float | None,
                node_used_peak_bytes: int | None = None) -> dict[str, Any]:
    import torch

    from mbridge_offload.runtime.allocator_peaks import run_peak_allocated, run_peak_reserved

    free, total = torch.cuda.mem_get_info()
    own = device_used_by_this_process()
    # outside PyTorch: this process's device memory when NVML sees it, else the whole device's use (which
    # counts other processes too: meaningful only when the run has the GPU to itself)
    in_use = own if own is not None else total - free
    return {
        "step": step,
        "step_time_s": round(step_time_s, 6),
        "loss": loss,
        "grad_norm": None if grad_norm is None else float(grad_norm),
        "allocated_gib": torch.cuda.memory_allocated() / GIB,
        "reserved_gib": torch.cuda.memory_reserved() / GIB,
        "peak_allocated_gib": run_peak_allocated() / GIB,
        "peak_reserved_gib": run_peak_reserved() / GIB,
        # every process's use of the device, this one's outside PyTorch too: what an OOM is measured against
        "device_used_gib": (total - free) / GIB,
        "device_total_gib": total / GIB,
        "device_process_used_gib": _gib_or_none(own),
        "device_outside_pytorch_gib": (in_use - torch.cuda.memory_reserved()) / GIB,
        "device_outside_pytorch_source": "this process (NVML)" if own is not None else "whole device (mem_get_info)",
        "host_rss_gib": host_rss_bytes() / GIB,
        "pinned_host_gib": _gib_or_none(pinned_host_bytes()),
        "host_rss_high_water_gib": _gib_or_none(rss_high_water_bytes()),
        "node_host_used_peak_gib": _gib_or_none(node_used_peak_bytes),
    }


def _heap_record() -> dict[str, float]:
    heap = heap_bytes()
    if heap is None:
        return {}
    return {"host_heap_in_use_gib": heap["in_use"] / GIB, "host_heap_free_kept_gib": heap["free_kept"] / GIB}


def _warm_up_record() -> dict[str, Any]:
    from mbridge_offload.runtime.communicators import last_warm_up

    warmed = last_warm_up()
    if warmed is None:
        return {}
    return {"communicators_warmed": len(warmed.groups), "communicator_warm_up_device_gib": warmed.device_bytes / GIB}


def make_callback(out_dir: Path, rank: int):
    """A Megatron Bridge training callback that writes this rank's per-step metrics."""
    import torch
    from megatron.bridge.training.callbacks import Callback

    from mbridge_offload.runtime.host_memory import NodeUsedPeak
    from mbridge_offload.runtime.streaming_engine import (take_step_s as take_engine_step_s,
                                                          take_wait_s as take_engine_wait_s)

    class StepMetrics(Callback):
        def __init__(self) -> None:
            # from before the model and optimizer are built: their pinning counts towards the node's peak
            self.node_used = NodeUsedPeak().start()
            self.rss_at_start = host_rss_bytes()
            out_dir.mkdir(parents=True, exist_ok=True)
            self.path = step_records_file(out_dir, rank)
            self.file = self.path.open("w")
            self.started = 0.0
            self.step = 0
            self.offload_timer = None
            self.last_iteration = None  # the last training iteration this process ran

        def on_train_start(self, context) -> None:
            from mbridge_offload.runtime.offload_timing import OffloadTimer
            from mbridge_offload.runtime.streaming_engine import installed_mode

            if installed_mode() is not None:  # the breakdown times the library's step, which the engine replaces
                return
            try:
                timer = OffloadTimer(context.optimizer)
            except Exception as error:  # noqa: BLE001  (a missing breakdown must not stop training)
                print(f"WARNING: no per-step offload breakdown for this run ({type(error).__name__}: {error}); "
                      "step times and memory are still recorded", file=sys.stderr, flush=True)
                return
            self.offload_timer = timer if timer.active else None

        def on_train_step_start(self, context) -> None:
            # time the step itself, not work queued before it. The training stream only: the offload engine's
            # copies on its own streams belong to the next step, which waits for them where it needs them
            torch.cuda.current_stream().synchronize()
            self.started = time.perf_counter()

        def on_train_step_end(self, context) -> None:
            torch.cuda.current_stream().synchronize()
            elapsed = time.perf_counter() - self.started
            self.step += 1
            record = step_record(self.step, elapsed, _loss_value(context.loss_dict), context.grad_norm,
                                 self.node_used.peak_bytes())
            record["skipped"] = bool(context.skipped_iter)
            # the training iteration (a resumed run starts past 1) and the learning rate it used: what a
            # resumed run is compared on against the uninterrupted one
            record["iteration"] = self.last_iteration = context.state.train_state.step + 1  # bumped after this call
            record["lr"] = _learning_rate(context.optimizer)
            engine_wait_s = take_engine_wait_s()
            if engine_wait_s is not None:  # the training thread blocked on the offload engine in this step
                record["engine_wait_s"] = engine_wait_s
                record["engine_step_s"] = take_engine_step_s()  # and enqueued its work instead of the forward
            if self.step == 1:
                record.update(node_before_run_record(self.node_used.start_bytes, self.rss_at_start))
                record.update(allocator_layout())
                record.update(_warm_up_record())
            if self.step <= 2:  # glibc walks its free lists for this: 0.16 s with 150k free blocks
                record.update(_heap_record())
            if self.offload_timer is not None:
                record.update(self.offload_timer.collect() or {})
                if self.step == 1:
                    record["offload_traffic"] = self.offload_timer.traffic()
            self.file.write(json.dumps(record) + "\n")
            self.file.flush()

        def on_train_end(self, context) -> None:
            self.node_used.stop()
            self.file.close()

    return StepMetrics()


def warmup_steps(n_steps: int) -> int:
    """Steps excluded from the steady state: the first 3 (first third of a short run)."""
    return min(3, n_steps // 3)


def _slowest_rank(ranks: dict[int, list[dict]], step: int, field: str) -> float | None:
    """A step's value of ``field`` on its slowest rank (None where no rank recorded it)."""
    values = [r[step][field] for r in ranks.values() if step < len(r) and r[step].get(field) is not None]
    return max(values) if values else None


def _steady_median(ranks: dict[int, list[dict]], steps: range, field: str) -> float | None:
    values = [v for v in (_slowest_rank(ranks, i, field) for i in steps) if v is not None]
    return statistics.median(values) if values else None


def _first(ranks: dict[int, list[dict]], field: str) -> float | None:
    """``field`` as the lowest rank that recorded it did (a value recorded once per run)."""
    return next((s[field] for _, r in sorted(ranks.items()) for s in r if s.get(field) is not None), None)


def summarize(out_dir: Path) -> dict[str, Any]:
    ranks = read_steps(out_dir)
    if not ranks or not any(ranks.values()):
        raise ValueError(f"no step metrics under {out_dir}")
    steps0 = ranks[min(ranks)]
    skip = warmup_steps(len(steps0))
    # A step ends when its slowest rank ends: take the per-step maximum over ranks.
    per_step = [max(r[i]["step_time_s"] for r in ranks.values() if i < len(r)) for i in range(len(steps0))]
    losses = next((([s["loss"] for s in r]) for _, r in sorted(ranks.items(), reverse=True)
                   if any(s["loss"] is not None for s in r)), [])

    def peak(field: str) -> float | None:
        values = [s[field] for r in ranks.values() for s in r if s.get(field) is not None]
        return max(values) if values else None

    breakdown = {}
    for field in BREAKDOWN_FIELDS:
        value = _steady_median(ranks, range(skip, len(steps0)), field)
        if value is not None:
            breakdown[field.removeprefix("offload_")] = value
    if breakdown and per_step[skip:]:
        optimizer = [_slowest_rank(ranks, i, "offload_optimizer_step_s") or 0.0 for i in range(len(per_step))]
        breakdown["rest_of_step_s"] = statistics.median(t - o for t, o in zip(per_step[skip:], optimizer[skip:]))
    traffic = [s["offload_traffic"] for r in ranks.values() for s in r if "offload_traffic" in s]

    return {
        "steps": len(steps0),
        "warmup_steps_excluded": skip,
        "step_time_s": statistics.median(per_step[skip:]) if per_step[skip:] else None,
        "step_times_s": per_step,
        "peak_allocated_gib": peak("peak_allocated_gib"),
        "peak_reserved_gib": peak("peak_reserved_gib"),
        "peak_host_rss_gib": peak("host_rss_gib"),
        "peak_pinned_host_gib": peak("pinned_host_gib"),
        "peak_host_rss_high_water_gib": peak("host_rss_high_water_gib"),
        "peak_node_host_used_gib": peak("node_host_used_peak_gib"),
        "node_host_used_before_run_gib": _first(ranks, "node_host_used_before_run_gib"),
        "peak_device_used_gib": peak("device_used_gib"),
        "peak_device_process_used_gib": peak("device_process_used_gib"),
        # the device memory PyTorch's allocator does not hold (CUDA context, cuBLAS/TE workspaces, NCCL
        # buffers; other processes' too, when the GPU is shared): what a plan of PyTorch's memory misses
        "device_outside_pytorch_gib": peak("device_outside_pytorch_gib"),
        "final_loss": next((x for x in reversed(losses) if x is not None), None),
        "losses": losses,
        "ranks": len(ranks),
        "offload_breakdown": breakdown or None,
        "offload_traffic": max(traffic, key=lambda t: t["offloaded_params"]) if traffic else None,
    }


def write_summary(out_dir: Path, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    summary = {**summarize(out_dir), **(extra or {})}
    (Path(out_dir) / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


BREAKDOWN_LABELS = (  # median per step, as the terminal table shows it
    ("optimizer_step_s", "offloaded optimizer step"),
    ("d2h_s", "D2H gradient copies"),
    ("cpu_optimizer_s", "CPU optimizer (Adam)"),
    ("h2d_s", "H2D parameter copies"),
    ("gpu_optimizer_s", "GPU optimizer (the rest)"),
    ("rest_of_step_s", "rest of the step"),
)


def _gib(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f} GiB"


def format_summary(summary: dict[str, Any]) -> str:
    step = summary["step_time_s"]
    rows = [
        ("steps", f"{summary['steps']} ({summary['warmup_steps_excluded']} warm-up excluded)"),
        ("median step time", "n/a" if step is None else f"{step:.3f} s"),
        ("peak GPU allocated", _gib(summary["peak_allocated_gib"])),
        ("peak GPU reserved", _gib(summary["peak_reserved_gib"])),
        ("peak host RSS at step ends", _gib(summary["peak_host_rss_gib"])),
        ("peak pinned host", _gib(summary["peak_pinned_host_gib"])),
        ("final loss", "n/a" if summary["final_loss"] is None else f"{summary['final_loss']:.4f}"),
    ]
    # inside-step host peaks (mbridge_offload/runtime/host_memory.py); summaries written before they existed lack them
    rows[6:6] = [(label, _gib(summary[key])) for key, label in (
        ("peak_host_rss_high_water_gib", "peak host RSS inside steps"),
        ("peak_node_host_used_gib", "peak host used on the node"),
        ("node_host_used_before_run_gib", "  of which in use before the run")) if summary.get(key) is not None]
    breakdown = summary.get("offload_breakdown")
    if breakdown:
        rows += [(f"  {label}", f"{breakdown[key]:.3f} s") for key, label in BREAKDOWN_LABELS if key in breakdown]
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"  {name:<{width}}  {value}" for name, value in rows)
