"""Fetch-ahead for the stream engine (opt-in: MBRIDGE_OFFLOAD_STREAM_FETCH_AHEAD=on; design section 9.1).

The stream engine brings each chunk's Adam moments up through a ring of ``STREAM_RING_SLOTS`` GPU buffers while the
next forward runs. On the 4-layer MoE proxy the forward then waits for up-copies at every MoE layer, while the
host-to-device direction is idle through the whole backward (docs/benchmarks/offload-engine/stream-moe-profile/).
Fetch-ahead brings the chunks after the ring's up during the backward instead, into buffers of their own allocated
in memory the backward has freed; when a chunk's turn comes, a copy on the GPU moves it into its ring slot.

The rule that keeps the run's peak where it was. The backward's hooks (one per parameter of at least a chunk's
minimum size) cut the time from the first hook of a step's backward to the release of its last buffer in the next
forward into intervals; the allocator's peak of each interval, less the buffers held in it, is that interval's
base. At a hook, buffers may be held as long as every later interval's base in the previous step, plus them, stays
below the run's peak allocated less a guard: twice the largest change of any interval's base from one step to the
next seen so far, and at least ``GUARD_FLOOR_BYTES``. A step whose hooks differ in number from the previous step's
fetches nothing ahead. What this cannot see: a step whose memory rises beyond the previous step's by more than the
guard (a MoE layer's experts receive other token counts every step). The GPU run that measures it compares the
run's peak with fetch-ahead on and off (phase ``stream-fetch-ahead`` of docs/benchmarks/h200.sh).
"""

from __future__ import annotations

from dataclasses import dataclass, field

GUARD_FLOOR_BYTES = 64 * 1024**2  # one chunk of a 1.1B model's moments is ~0.28 GB: the floor is below any chunk


@dataclass
class Window:
    """One step's intervals, from its backward's first hook to the release of its last fetched-ahead buffer."""

    bases: list[int] = field(default_factory=list)  # each interval's peak allocated less the buffers held in it
    hooks: int = 0  # backward hooks in the step (the intervals they open)


def allowed_held(previous: Window, hook: int, run_peak: int, guard: int) -> int:
    """Bytes of buffers that may be held from hook ``hook`` on (the ``hook``-th of the backward, 0 first): the
    run's peak less the guard less the largest base of the previous step's intervals from that hook on."""
    later = previous.bases[hook:]
    if not later:
        return 0
    return max(0, run_peak - guard - max(later))


def guard_bytes(previous: Window, current: Window, largest_change: int) -> tuple[int, int]:
    """(guard, largest change): the guard after comparing ``current``'s intervals so far with ``previous``'s, twice
    the largest change of an interval's base between two steps seen in the run (``largest_change``, updated)."""
    for before, now in zip(previous.bases, current.bases):
        largest_change = max(largest_change, abs(now - before))
    return max(GUARD_FLOOR_BYTES, 2 * largest_change), largest_change


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


class FetchAhead:
    """One per process: the backward's hooks, the windows, and which engine's chunk comes up next."""

    def __init__(self, memory=None) -> None:
        self.memory = memory or CudaMemory()
        self.engines: list = []
        self.previous: Window | None = None
        self.current: Window | None = None
        self.held = 0  # bytes of buffers allocated and not yet released
        self.largest_change = 0
        self.hooked = False
        self.fetched = 0  # chunks fetched ahead over the run (the run's header and the tests read it)
        self.windows = 0  # complete windows since the run's start or the last void one

    def add(self, engine, model_chunks, minimum_numel: int) -> None:
        """Fetch ahead for ``engine`` too; the hooks go on the first engine's model (every engine shares it)."""
        self.engines.append(engine)
        if self.hooked:
            return
        for chunk in model_chunks:
            for param in chunk.parameters():
                if param.requires_grad and param.numel() >= minimum_numel:
                    param.register_post_accumulate_grad_hook(lambda _param: self.on_backward_hook())
        self.hooked = True

    def _close_interval(self) -> None:
        peak = self.memory.interval_peak()
        if self.current is not None:
            self.current.bases.append(peak - self.held)

    def on_backward_hook(self) -> None:
        """A parameter's gradient is accumulated: close the interval, then fetch what the rule allows."""
        if not any(e.awaits_next_update() for e in self.engines):
            return
        if self.current is None:
            self.memory.interval_peak()  # the forward's and the loss's peak: folded into the run's peak
            self.current = Window()
        else:
            self._close_interval()
        hook = self.current.hooks
        self.current.hooks += 1
        previous = self.previous
        # at the first hook no interval of this step has been compared with the previous step's yet
        if previous is None or hook == 0 or hook >= previous.hooks:
            return
        guard, self.largest_change = guard_bytes(previous, self.current, self.largest_change)
        room = allowed_held(previous, hook, self.memory.run_peak(), guard) - self.held
        fetched = True
        while fetched:  # one chunk of each engine in turn: the dense and the expert chunks interleave in the forward
            fetched = False
            for engine in self.engines:
                size = engine.next_ahead_bytes()
                if size is not None and size <= room:
                    engine.fetch_next_ahead()
                    self.held += size
                    room -= size
                    self.fetched += 1
                    fetched = True

    def released(self, size: int) -> None:
        """A buffer's chunk went into its ring slot: the interval closes with it; the window ends with the last."""
        self._close_interval()
        self.held -= size
        if self.held == 0 and not any(e.holds_ahead() for e in self.engines):
            self._keep_window()

    def dropped(self, size: int) -> None:
        """Buffers given up without use (a load or a drain put other moments on the host): the window is void."""
        self.held -= size
        if self.held == 0:
            self.previous = self.current = None
            self.windows = 0

    def end_of_step(self) -> None:
        """The optimizer's step began: a window with no buffer held ends here, its last interval closed."""
        if self.current is not None and self.held == 0:
            self._close_interval()
            self._keep_window()

    def _keep_window(self) -> None:
        """The window is complete: the next step's rule reads it. The run's first is not read: in step 1 the GPU's
        own optimizer states do not exist yet, so its intervals are lower than the next steps' by their size."""
        self.windows += 1
        self.previous = self.current if self.windows >= 2 else None
        self.current = None


_PROCESS: list[FetchAhead] = []


def process_fetch_ahead() -> FetchAhead:
    """This process's FetchAhead: every engine's chunks share the room one backward frees."""
    if not _PROCESS:
        _PROCESS.append(FetchAhead())
    return _PROCESS[0]
