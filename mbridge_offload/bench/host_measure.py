"""Measuring the host the floor model prices (mbridge_offload/planning/cost_model.py): host memory
bandwidth and fused CPU AdamW over thread counts, pinned copy bandwidth each way, and whether the copies
take from the bandwidth the cores reach. scripts/measure_host.py prints or saves what ``measure_host``
returns; scripts/bench_offload.py feeds it to ``floor``. Needs torch; the copies need a CUDA device."""

from __future__ import annotations

import contextlib
import statistics
import time
from typing import Any

from mbridge_offload.facts.cores import available_cores
from mbridge_offload.facts.offload_bytes import ADAM_TOUCHED_BYTES_PER_FP32_PARAM
from mbridge_offload.facts.units import GB


@contextlib.contextmanager
def _torch_threads(threads: int | None):
    """Run the block with ``threads`` intra-op threads (None: as they are), then restore them."""
    import torch

    previous = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def _median_seconds(fn, repeats: int) -> float:
    fn()  # warm-up (first touch, allocator, thread pool start)
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def host_memory_gbps(size_mib: int = 1024, threads: int | None = None, repeats: int = 3) -> float:
    """Streaming bandwidth of host memory for in-place updates, as Adam makes them (a += b: read a and b,
    write a, 3 x 4 bytes per element; an out-of-place add would also pay the write-allocate read), GB/s."""
    import torch

    with _torch_threads(threads):
        n = size_mib * 2**20 // 4
        a, b = torch.zeros(n), torch.ones(n)
        seconds = _median_seconds(lambda: a.add_(b), repeats)
    return 3 * 4 * n / seconds / GB


def cpu_adam_gbps(params_m: int = 64, threads: int | None = None, repeats: int = 3) -> float:
    """Bytes per second fused CPU AdamW touches (28 per fp32 parameter), as HybridDeviceOptimizer runs it."""
    import torch

    with _torch_threads(threads):
        n = params_m * 2**20
        param = torch.nn.Parameter(torch.zeros(n))
        param.grad = torch.full((n,), 1e-3)
        optimizer = torch.optim.AdamW([param], lr=1e-4, weight_decay=0.1, fused=True)
        seconds = _median_seconds(optimizer.step, repeats)
    return ADAM_TOUCHED_BYTES_PER_FP32_PARAM * n / seconds / GB


def copy_gbps(size_mib: int = 1024, repeats: int = 5) -> dict[str, float]:
    """Pinned host <-> GPU copy bandwidth and GPU memory bandwidth (device copy: read + write), GB/s."""
    import torch

    n = size_mib * 2**20 // 4
    host = torch.empty(n, pin_memory=True)
    device = torch.empty(n, device="cuda")
    other = torch.empty(n, device="cuda")

    def timed(copy) -> float:
        copy()
        times = []
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            copy()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1000.0)
        return statistics.median(times)

    nbytes = 4 * n
    return {
        "d2h_gbps": nbytes / timed(lambda: host.copy_(device, non_blocking=True)) / GB,
        "h2d_gbps": nbytes / timed(lambda: device.copy_(host, non_blocking=True)) / GB,
        "device_memory_gbps": 2 * nbytes / timed(lambda: other.copy_(device)) / GB,
    }


def copies_beside_cpu_work(size_mib: int = 1024, copies: int = 24, cpu_passes: int = 16) -> dict[str, Any]:
    """Do pinned D2H/H2D copies take from the host memory bandwidth the cores reach? Times the in-place
    add of ``host_memory_gbps`` (all threads) alone and while both copy directions stream, and the copies
    alone and beside it, GB/s: what the floor's two host memory terms rest on (planning/cost_model.py's
    docstring). The copies are sized to last about as long as the adds (~0.45 s each on the H200);
    ``copies_outlasted_cpu_work`` says whether both directions were still running when the adds ended."""
    import torch

    n = size_mib * 2**20 // 4
    nbytes = 4 * n
    a, b = torch.zeros(n), torch.ones(n)
    pinned_down, pinned_up = torch.empty(n, pin_memory=True), torch.empty(n, pin_memory=True)
    device_down, device_up = torch.empty(n, device="cuda"), torch.empty(n, device="cuda")
    streams = torch.cuda.Stream(), torch.cuda.Stream()

    def cpu_work() -> float:
        started = time.perf_counter()
        for _ in range(cpu_passes):
            a.add_(b)
        return time.perf_counter() - started

    def start_copies() -> list:
        """Queue ``copies`` copies each way on two streams; (start, end) events per direction."""
        events = []
        for stream, copy in ((streams[0], lambda: pinned_down.copy_(device_down, non_blocking=True)),
                             (streams[1], lambda: device_up.copy_(pinned_up, non_blocking=True))):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            with torch.cuda.stream(stream):
                start.record()
                for _ in range(copies):
                    copy()
                end.record()
            events.append((start, end))
        return events

    def copy_seconds(events) -> list[float]:
        for _, end in events:
            end.synchronize()
        return [start.elapsed_time(end) / 1000.0 for start, end in events]

    cpu_work()  # warm-up: first touch, thread pool
    copy_seconds(start_copies())
    cpu_alone_s = cpu_work()
    d2h_alone_s, h2d_alone_s = copy_seconds(start_copies())
    events = start_copies()  # the copy engines stream while the cores add
    cpu_beside_s = cpu_work()
    outlasted = all(not end.query() for _, end in events)
    d2h_beside_s, h2d_beside_s = copy_seconds(events)
    cpu_bytes, copy_bytes = 3 * nbytes * cpu_passes, nbytes * copies
    return {"host_memory_gbps_alone": cpu_bytes / cpu_alone_s / GB,
            "host_memory_gbps_beside_copies": cpu_bytes / cpu_beside_s / GB,
            "d2h_gbps_alone": copy_bytes / d2h_alone_s / GB, "d2h_gbps_beside_cpu": copy_bytes / d2h_beside_s / GB,
            "h2d_gbps_alone": copy_bytes / h2d_alone_s / GB, "h2d_gbps_beside_cpu": copy_bytes / h2d_beside_s / GB,
            "cpu_work_s": cpu_beside_s, "copies_s": max(d2h_beside_s, h2d_beside_s),
            "copies_outlasted_cpu_work": outlasted}


def measure_host(thread_counts: list[int] | None = None, size_mib: int = 1024) -> dict[str, Any]:
    """Everything the floor needs, measured on this host (copies only where a GPU is present)."""
    import torch

    cores = len(available_cores())
    thread_counts = sorted(set(thread_counts or [1, 2, 4, 8, cores]) | {cores})
    result: dict[str, Any] = {
        "cores": cores,
        "host_memory_gbps": {str(t): round(host_memory_gbps(size_mib, t), 2) for t in thread_counts},
        "cpu_adam_gbps": {str(t): round(cpu_adam_gbps(max(8, size_mib // 4), t), 2) for t in thread_counts},
    }
    if torch.cuda.is_available():
        result.update({k: round(v, 2) for k, v in copy_gbps(size_mib).items()})
        result["gpu"] = torch.cuda.get_device_name()
        beside = copies_beside_cpu_work(size_mib)
        result["copies_beside_cpu_work"] = {k: v if isinstance(v, bool) else round(v, 3) for k, v in beside.items()}
        result["host_memory_total_gbps"] = round(beside["host_memory_gbps_beside_copies"] + beside["d2h_gbps_beside_cpu"]
                                                 + beside["h2d_gbps_beside_cpu"], 2)
    return result
