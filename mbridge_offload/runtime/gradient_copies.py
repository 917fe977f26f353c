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
from typing import Any

from mbridge_offload.runtime.copy_pieces import PIECE_BYTES, copy_in_pieces, copy_thread, record_blocking
from mbridge_offload.runtime.serial_thread import LazySerialThread

@dataclass
class GradientCopies:
    """One step's copies: for each chunk, in the order they are issued, its (host buffer, GPU gradient) pairs."""

    stream: Any  # the library's D2H stream
    chunks: list[tuple[int, list[tuple[Any, Any]]]]
    piece_bytes: int = PIECE_BYTES
    copied: dict[int, threading.Event] = field(default_factory=dict)  # chunk: its copies are enqueued
    events: dict[int, Any] = field(default_factory=dict)  # chunk: CUDA event after its last copy
    all_enqueued: threading.Event = field(default_factory=threading.Event)
    last_event: Any = None  # after every copy: the gradients may be overwritten after it
    error: BaseException | None = None

    def __post_init__(self) -> None:
        self.copied = {chunk: threading.Event() for chunk, _ in self.chunks}

    def issue(self, in_flight: collections.deque | None = None, window: int | None = None) -> None:
        """Enqueue every copy (the copy thread). ``in_flight``: the events of the pieces enqueued and maybe not
        finished, kept by the copy thread from one call to the next (the dense and the expert optimizer's copies
        of a MoE follow each other)."""
        import torch

        in_flight = collections.deque() if in_flight is None else in_flight
        pairs = [pair for _, chunk_pairs in self.chunks for pair in chunk_pairs]
        # a chunk's copies end with its last pair's; a chunk without pairs ends where the one before it does
        chunk_ends = list(itertools.accumulate(len(chunk_pairs) for _, chunk_pairs in self.chunks))
        order = [chunk for chunk, _ in self.chunks]
        finished = 0  # chunks whose end event is recorded

        def end_chunks(pairs_enqueued: int) -> None:
            nonlocal finished
            while finished < len(order) and chunk_ends[finished] <= pairs_enqueued:
                self.events[order[finished]] = self._record()
                self.copied[order[finished]].set()
                finished += 1

        try:
            with torch.cuda.stream(self.stream):
                end_chunks(0)
                # pieces cut over the whole step's tensors: a chunk's end is an event, not a piece of its own
                copy_in_pieces(pairs, stream=self.stream, piece_bytes=self.piece_bytes, in_flight=in_flight,
                               tensor_done=end_chunks, window=window)
                end_chunks(len(pairs))
                self.last_event = self._record()
        except BaseException as error:  # noqa: BLE001  (raised where the copies are waited for)
            self.error = error
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


def submit(copies: GradientCopies) -> None:
    """Hand one step's copies to the copy thread."""
    _THREAD.submit(copies)


def alive() -> bool:
    """Whether the copy thread runs (a wait for an event it sets would never end otherwise)."""
    return _THREAD.alive()
