"""The offloaded gradients' copy to the host (the exact and delayed engines' D2H, issue #16).

The library (``HybridDeviceOptimizer._set_sub_optimizer_grads``) enqueues every offloaded gradient's copy at once in
``optimizer.step()``, so a small read the training stream makes after the step (the loss and norms brought to the
host) waits for all of it, and the next forward is launched only after that read (copy_pieces.py: why, and what was
measured). So a thread of its own issues the copies in pieces (``copy_pieces.copy_in_pieces``): in the order the
engine's worker takes the chunks, the pieces cut over the whole step's tensors, the window of pieces in flight kept
across steps and across the dense and the expert optimizer of a MoE. The end of each chunk's copies is an event the
worker waits for before that chunk's Adam.

The tensors and their values are the library's: the same host gradient buffers (``cpu_copy_map_grad``), each set as
its host parameter's ``.grad``, filled by the same ``copy_``; only when each copy is enqueued changes.
"""

from __future__ import annotations

import collections
import itertools
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from mbridge_offload.runtime.copy_pieces import PIECE_BYTES, copy_in_pieces, copy_thread, record_blocking
from mbridge_offload.runtime.serial_thread import LazySerialThread

@dataclass
class GradientCopies:
    """One step's copies: for each chunk, in the order they are issued, its (host buffer, GPU gradient) pairs. A
    chunk may come back in several runs (the delayed mode with the zeroing by region issues the pairs in the order
    the next backward writes the gradient buffer): it ends after its last run."""

    stream: Any  # the library's D2H stream
    chunks: list[tuple[int, list[tuple[Any, Any]]]]
    piece_bytes: int = PIECE_BYTES
    # (pairs enqueued, callback): called with a CUDA event after that many pairs' copies (a region's last reader;
    # grad_regions.RegionZeroing.copies_ended)
    region_ends: list[tuple[int, Callable[[Any], None]]] = field(default_factory=list)
    zeroings: list = field(default_factory=list)  # grad_regions.RegionZeroing: told when the copies fail
    copied: dict[int, threading.Event] = field(default_factory=dict)  # chunk: its copies are enqueued
    events: dict[int, Any] = field(default_factory=dict)  # chunk: CUDA event after its last copy
    all_enqueued: threading.Event = field(default_factory=threading.Event)
    last_event: Any = None  # after every copy: the gradients may be overwritten after it
    error: BaseException | None = None

    def __post_init__(self) -> None:
        self.copied = {chunk: threading.Event() for chunk, _ in self.chunks}

    def issue(self, in_flight: collections.deque | None = None, window: int | None = None,
              pause: Callable[[], None] | None = None) -> None:
        """Enqueue every copy (the copy thread). ``in_flight``: the events of the pieces enqueued and maybe not
        finished, kept by the copy thread from one call to the next (the dense and the expert optimizer's copies
        of a MoE follow each other)."""
        import torch

        in_flight = collections.deque() if in_flight is None else in_flight
        pairs = [pair for _, chunk_pairs in self.chunks for pair in chunk_pairs]
        # a chunk's copies end with its last pair's; a chunk without pairs ends where the one before it does
        chunk_ends: dict[int, int] = {}
        for chunk, enqueued in zip((chunk for chunk, _ in self.chunks),
                                   itertools.accumulate(len(chunk_pairs) for _, chunk_pairs in self.chunks)):
            chunk_ends[chunk] = enqueued
        marks = sorted([(enqueued, 0, index, chunk) for index, (chunk, enqueued) in enumerate(chunk_ends.items())]
                       + [(enqueued, 1, index, None) for index, (enqueued, _) in enumerate(self.region_ends)])
        passed = 0  # marks whose event is recorded

        def end_marks(pairs_enqueued: int) -> None:
            nonlocal passed
            while passed < len(marks) and marks[passed][0] <= pairs_enqueued:
                _, kind, index, chunk = marks[passed]
                event = self._record()
                if kind == 0:
                    self.events[chunk] = event
                    self.copied[chunk].set()
                else:
                    self.region_ends[index][1](event)
                passed += 1

        try:
            with torch.cuda.stream(self.stream):
                end_marks(0)
                # pieces cut over the whole step's tensors: a chunk's end is an event, not a piece of its own
                copy_in_pieces(pairs, stream=self.stream, piece_bytes=self.piece_bytes, in_flight=in_flight,
                               tensor_done=end_marks, window=window, pause=pause)
                end_marks(len(pairs))
                self.last_event = self._record()
        except BaseException as error:  # noqa: BLE001  (raised where the copies are waited for)
            self.error = error
            for zeroing in self.zeroings:
                zeroing.fail(error)
        finally:
            pairs = []  # the error's traceback keeps this frame: it must not hold gradients
            self.chunks = []  # the gradients may be freed now: each copy that reads one is enqueued
            for copied in self.copied.values():
                copied.set()
            self.all_enqueued.set()

    def _record(self):
        return record_blocking(self.stream)

    def raise_if_failed(self) -> None:
        if self.error is not None:
            raise self.error


_THREAD = LazySerialThread(lambda: copy_thread("mbridge-offload-gradient-copy"))


def start() -> None:
    """Start the copy thread before anything waits for copies handed to it later."""
    _THREAD.start()


def submit(copies: GradientCopies) -> None:
    """Hand one step's copies to the copy thread."""
    _THREAD.submit(copies)


def alive() -> bool:
    """Whether the copy thread runs (a wait for an event it sets would never end otherwise)."""
    return _THREAD.alive()
