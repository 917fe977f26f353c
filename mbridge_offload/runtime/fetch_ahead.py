"""Fetch-ahead for the stream engine (opt-in: MBRIDGE_OFFLOAD_STREAM_FETCH_AHEAD=on; design section 9.2).

The stream engine brings each chunk's Adam moments up through a ring of ``STREAM_RING_SLOTS`` GPU buffers while the
next forward runs. On the 4-layer MoE proxy the forward then waits for up-copies at every MoE layer, while the
host-to-device direction is idle through the whole backward (docs/benchmarks/offload-engine/stream-moe-profile/).
Fetch-ahead brings the chunks after the ring's up during the backward instead, into buffers of their own allocated
in memory the backward has freed; when a chunk's turn comes, a copy on the GPU moves it into its ring slot.

The rule that keeps the run's peak where it was. A step's window runs from its backward's first hook to the moment
every engine has enqueued the update that step's optimizer set up (in the next forward, or in a drain): the time its
buffers may be held, whether or not any were. Points cut the window into intervals: every ``stride``-th backward
hook (one per parameter of at least a chunk's minimum size, per micro batch; the stride keeps a window to at most
``MAX_POINTS`` points, since each reads the allocator) and each buffer's release. The allocator's peak of each
interval, less the buffers held in it, is that interval's base. At a point, buffers may be held as long as every
later interval's base in the previous window, plus them, stays below the run's peak allocated less a guard: twice the
largest change of a backward interval's base from one window to the next seen so far, and at least
``GUARD_FLOOR_BYTES``. A window whose hooks or stride differ from the previous window's fetches nothing past the
previous one's points. What this cannot see: a step whose memory rises beyond the previous step's by more than the
guard (a MoE layer's experts receive other token counts every step), and the reserved memory: the rule bounds
the bytes allocated, and where the freed memory is in ranges smaller than a buffer the allocator maps more. On one
H100 and the 4-layer MoE proxy (docs/benchmarks/offload-engine/stream-fetch-ahead/) the peak allocated stayed put,
the reserved memory rose by the 2.9 GiB of buffers, and no step-time gain was resolved: it stays opt-in.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass, field
from functools import cached_property

from mbridge_offload.facts.offload_engine import FETCH_AHEAD_HELD

GUARD_FLOOR_BYTES = 64 * 1024**2  # one chunk of a 1.1B model's moments is ~0.28 GB: the floor is below any chunk
# points per window at most: each reads and resets the allocator's peak (torch.cuda.memory_stats_as_nested_dict), and
# a MoE's backward has a hook per expert weight per micro batch (thousands); the intervals' peaks stay exact, only
# coarser
MAX_POINTS = 256


@dataclass
class Window:
    """One step's intervals, from its backward's first hook to the end of the enqueueing of its update."""

    bases: list[int] = field(default_factory=list)  # each interval's peak allocated less the buffers held in it
    hooks: int = 0  # points among the backward's hooks (the intervals they open)
    raw_hooks: int = 0  # backward hooks in the window
    stride: int = 1  # a point every ``stride`` hooks
    fetched: int = 0  # chunks fetched ahead in the window
    fetched_bytes: int = 0

    @cached_property
    def later(self) -> list[int]:
        """later[i]: the largest of bases[i:] (read only once the window is complete)."""
        return suffix_max(self.bases)


def suffix_max(values: list[int]) -> list[int]:
    """``out[i] == max(values[i:])`` for every i."""
    out, largest = [0] * len(values), None
    for i in range(len(values) - 1, -1, -1):
        largest = values[i] if largest is None else max(largest, values[i])
        out[i] = largest
    return out


def allowed_held(previous: Window, hook: int, run_peak: int, guard: int) -> int:
    """Bytes of buffers that may be held from point ``hook`` on (the ``hook``-th of the backward, 0 first): the
    run's peak less the guard less the largest base of the previous window's intervals from that point on."""
    later = previous.later
    if hook >= len(later):
        return 0
    return max(0, run_peak - guard - later[hook])


def guard_bytes(largest_change: int) -> int:
    """The guard: twice the largest change of an interval's base between two windows seen in the run."""
    return max(GUARD_FLOOR_BYTES, 2 * largest_change)


class CudaMemory:
    """The allocator's figures the rule reads (a stand-in replaces it where there is no GPU)."""

    @staticmethod
    def interval_peak() -> int:
        from mbridge_offload.runtime.allocator_peaks import interval_peak_allocated

        return interval_peak_allocated()

    @staticmethod
    def run_peak() -> int:
        from mbridge_offload.runtime.allocator_peaks import run_peak_allocated

        return run_peak_allocated()


def _say(line: str) -> None:
    """One line on the first rank (the run's log: what the GPU session greps)."""
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized() and dist.get_rank() != 0:
            return
    except ImportError:
        pass
    print(line, flush=True)


class FetchAhead:
    """One per process: the backward's hooks, the windows, and which engine's chunk comes up next."""

    def __init__(self, memory=None) -> None:
        self.memory = memory or CudaMemory()
        self._engines: list = []  # weak references: an engine dropped with its model (an in-process restart) leaves
        self._hooked: weakref.WeakSet = weakref.WeakSet()  # the model chunks whose parameters carry the hook
        self.previous: Window | None = None
        self.current: Window | None = None
        self.held = 0  # bytes of buffers allocated and not yet released
        self.largest_change = 0
        self.fetched = 0  # chunks fetched ahead over the run (the tests read it)
        self.windows = 0  # complete windows since the run's start or the last void one
        self._stride = 1  # for the next window: from the last complete window's hooks
        self._said: tuple | None = None

    @property
    def engines(self) -> list:
        return [engine for engine in (ref() for ref in self._engines) if engine is not None]

    def add(self, engine, model_chunks, minimum_numel: int) -> None:
        """Fetch ahead for ``engine`` too; the hooks go on its model's parameters once (the dense and the expert
        engines share the model)."""
        self._engines = [ref for ref in self._engines if ref() is not None] + [weakref.ref(engine)]
        for chunk in model_chunks:
            if chunk in self._hooked:
                continue
            for param in chunk.parameters():
                if param.requires_grad and param.numel() >= minimum_numel:
                    param.register_post_accumulate_grad_hook(lambda _param: self.on_backward_hook())
            self._hooked.add(chunk)

    def _close_interval(self) -> int:
        """Close the interval open now; returns its index in the window."""
        peak = self.memory.interval_peak()
        self.current.bases.append(peak - self.held)
        return len(self.current.bases) - 1

    def on_backward_hook(self) -> None:
        """A parameter's gradient is accumulated: at a point, close the interval, then fetch what the rule allows."""
        engines = self.engines
        if not any(e.awaits_next_update() for e in engines):
            return
        current = self.current
        if current is None:
            self.memory.interval_peak()  # the forward's and the loss's peak: folded into the run's peak
            self.current = current = Window(stride=self._stride)
            current.raw_hooks = current.hooks = 1
            return  # at the first point no interval of this window has been compared with the previous one's yet
        raw = current.raw_hooks
        current.raw_hooks += 1
        if raw % current.stride:
            return
        index = self._close_interval()
        hook = current.hooks
        current.hooks += 1
        previous = self.previous
        if previous is None or previous.stride != current.stride or hook >= previous.hooks:
            return
        self.largest_change = max(self.largest_change, abs(current.bases[index] - previous.bases[index]))
        room = allowed_held(previous, hook, self.memory.run_peak(), guard_bytes(self.largest_change)) - self.held
        fetched = True
        while fetched:  # one chunk of each engine in turn: the dense and the expert chunks interleave in the forward
            fetched = False
            for engine in engines:
                size = engine.next_ahead_bytes()
                if size is not None and size <= room:
                    engine.fetch_next_ahead()
                    self.held += size
                    room -= size
                    self.fetched += 1
                    current.fetched += 1
                    current.fetched_bytes += size
                    fetched = True

    def released(self, size: int) -> None:
        """A buffer's chunk went into its ring slot: the interval closes with it."""
        if self.current is not None:
            self._close_interval()
        self.held -= size

    def dropped(self, size: int) -> None:
        """Buffers given up without use (a load or a drain put other moments on the host): the window is void."""
        self.held -= size
        if self.held == 0:
            self.previous = self.current = None
            self.windows = 0

    def update_enqueued(self) -> None:
        """An engine enqueued the last chunk of its update: once no engine has chunks left to enqueue, the window
        ends, its last interval closed (the buffers of its step are all released by then)."""
        if self.current is None or any(e.unqueued() for e in self.engines):
            return
        self._close_interval()
        self._keep_window()

    def _keep_window(self) -> None:
        """The window is complete: the next step's rule reads it. The run's first is not read: in step 1 the GPU's
        own optimizer states do not exist yet, so its intervals are lower than the next steps' by their size."""
        window = self.current
        self.windows += 1
        self.previous = window if self.windows >= 2 else None
        self.current = None
        self._stride = max(1, math.ceil(window.raw_hooks / MAX_POINTS))
        said = (window.fetched, window.fetched_bytes)
        if self.windows >= 2 and said != self._said:
            self._said = said
            _say(FETCH_AHEAD_HELD.format(chunks=window.fetched, gib=window.fetched_bytes / 2**30)
                 + f" (window {self.windows}: {window.raw_hooks} hooks, {window.hooks} points, "
                 f"{len(window.bases)} intervals, largest base {max(window.bases, default=0) / 2**30:.2f} GiB, guard "
                 f"{guard_bytes(self.largest_change) / 2**20:.0f} MiB); said again when it changes")


_PROCESS: list[FetchAhead] = []


def process_fetch_ahead() -> FetchAhead:
    """This process's FetchAhead: every engine's chunks share the room one backward frees."""
    if not _PROCESS:
        _PROCESS.append(FetchAhead())
    return _PROCESS[0]
