"""Host memory peaks that step-boundary samples miss, and the freed heap a process keeps.

Offloaded training's host memory peaks inside the first optimizer step, not between steps: on the H200
the 7-layer MoE proxy at fraction 1 read 93.1 GiB of RSS at the step boundaries while the node's used
memory (MemTotal - MemAvailable) stood at 116.0 GiB for ten seconds inside its first step, and the
8-layer proxy was killed by the kernel there (docs/benchmarks/host-peak/). So the metrics also keep
- the process's RSS high-water mark (VmHWM: the kernel tracks it, nothing is sampled), and
- the node's peak used memory, sampled by a background thread: it also sees memory no process's RSS
  shows (22 GiB of it at that peak).

glibc's malloc keeps the pages of blocks freed below its mmap threshold in the process: the 6-layer MoE proxy at
fraction 0.75 held 1.02 GiB of them from its first step on, outside any planned term
(docs/benchmarks/planner-accuracy.md). ``release_free_heap`` gives them back after setup and after each checkpoint
save (``malloc_trim``); the pages of a block used again are mapped again when it is.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Callable

from mbridge_offload.facts.proc import proc_kib

NODE_SAMPLE_INTERVAL_S = 0.2  # the peak above lasted ~10 s; the kill came within ~2 s of the rise


def rss_high_water_bytes() -> int | None:
    """The most resident memory this process has held since it started (Linux VmHWM), or None."""
    kib = proc_kib("VmHWM")
    return None if kib is None else kib * 1024


def node_used_bytes() -> int | None:
    """Memory in use on this node: MemTotal - MemAvailable (Linux /proc/meminfo), or None."""
    total, available = proc_kib("MemTotal", "/proc/meminfo"), proc_kib("MemAvailable", "/proc/meminfo")
    return None if total is None or available is None else (total - available) * 1024


class NodeUsedPeak:
    """The node's peak used memory since ``start()``, sampled every ``interval_s`` by a daemon thread."""

    def __init__(self, interval_s: float = NODE_SAMPLE_INTERVAL_S,
                 read: Callable[[], int | None] = node_used_bytes) -> None:
        self.interval_s = interval_s
        self._read = read
        self._peak: int | None = None
        self.start_bytes: int | None = None  # the node's use at start(): other processes' memory and this one's so far
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _sample(self) -> None:
        used = self._read()
        if used is not None and (self._peak is None or used > self._peak):
            self._peak = used

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def start(self) -> "NodeUsedPeak":
        self._sample()
        self.start_bytes = self._peak
        self._thread = threading.Thread(target=self._run, name="node-memory-peak", daemon=True)
        self._thread.start()
        return self

    def peak_bytes(self) -> int | None:
        self._sample()  # the peak includes now
        return self._peak

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()


def release_free_heap() -> int | None:
    """Return glibc's freed heap pages to the OS (``malloc_trim(0)``): the bytes of RSS it released (0 or more), or
    None where the C library has no ``malloc_trim``."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (AttributeError, OSError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    before = proc_kib("VmRSS")
    trim(0)
    after = proc_kib("VmRSS")
    return None if before is None or after is None else max(0, before - after) * 1024


def make_heap_release_callback(rank: int):
    """A Megatron Bridge callback that releases the freed heap once the model and optimizer are built and after
    each checkpoint save (both free large temporary buffers), saying on rank 0 what setup left."""
    from megatron.bridge.training.callbacks import Callback

    from mbridge_offload.facts.units import GIB

    class ReleaseFreeHeap(Callback):
        def on_train_start(self, context) -> None:
            released = release_free_heap()
            if rank == 0 and released is not None:
                print(f"host memory: {released / GIB:.2f} GiB of heap freed during setup returned to the OS "
                      "(glibc malloc_trim)", flush=True)

        def on_checkpoint_save(self, context) -> None:
            release_free_heap()

    return ReleaseFreeHeap()
