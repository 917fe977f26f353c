"""The offloaded gradients' copy to the host, in pieces (the exact and delayed engines' D2H, issue #16).

A GPU's copy engine serves the device-to-host copies of every stream in the order they were issued. The library
(``HybridDeviceOptimizer._set_sub_optimizer_grads``) enqueues every offloaded gradient's copy at once in
``optimizer.step()``. A small read the training stream makes after it (the step's loss and norms brought to the host)
then waits for the whole copy, and the next forward is launched only after that read. In plain torch on an H100, with
4.47 GB (the 1.1B dense proxy's gradients), the read waited 81.8 ms, against 5.2 ms with the copy issued in 256 MiB
pieces one after the other (docs/benchmarks/offload-engine/d2h-queue/).

So a thread of its own issues the copies: in the order the engine's worker takes the chunks, in pieces of about
``PIECE_BYTES`` cut over the whole step's tensors, with at most ``PIECES_IN_FLIGHT`` pieces enqueued and not finished
(across steps, and across the dense and the expert optimizer of a MoE). A read on another stream then waits for at
most that many pieces. With two in flight, the copy engine has the next piece queued while this thread waits for the
first to finish and for the interpreter's lock; it idles only where that lock takes longer than one piece's copy
(~2.4 ms). The end of each chunk's copies is an event the worker waits for before that chunk's Adam.

The tensors and their values are the library's: the same host gradient buffers (``cpu_copy_map_grad``), each set as
its host parameter's ``.grad``, filled by the same ``copy_``; only when each copy is enqueued changes.
"""

from __future__ import annotations

import collections
import itertools
import threading
from dataclasses import dataclass, field
from typing import Any

PIECE_BYTES = 128 * 2**20
PIECES_IN_FLIGHT = 2
COPY_THREAD = "gradient copy"


def pieces_of(numels: list[int], piece_numel: int) -> list[list[tuple[int, int, int]]]:
    """``numels`` tensors (in order) cut into pieces of at most ``piece_numel`` elements: each piece a list of
    (tensor index, start, stop); small tensors share a piece, a large one spans several. Every element of every
    tensor is in exactly one piece, in order."""
    if piece_numel < 1:
        raise ValueError(f"a piece holds at least one element, got {piece_numel}")
    pieces: list[list[tuple[int, int, int]]] = []
    current: list[tuple[int, int, int]] = []
    room = piece_numel
    for index, numel in enumerate(numels):
        start = 0
        while start < numel:
            stop = min(numel, start + room)
            current.append((index, start, stop))
            room -= stop - start
            start = stop
            if room == 0:
                pieces.append(current)
                current, room = [], piece_numel
    if current:
        pieces.append(current)
    return pieces


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

    def issue(self, in_flight: collections.deque | None = None) -> None:
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

        host = grad = None
        try:
            with torch.cuda.stream(self.stream):
                end_chunks(0)
                element = max((host.element_size() for host, _ in pairs), default=1)
                # pieces cut over the whole step's tensors: a chunk's end is an event, not a piece of its own
                for piece in pieces_of([host.numel() for host, _ in pairs], max(1, self.piece_bytes // element)):
                    while len(in_flight) >= PIECES_IN_FLIGHT:
                        in_flight.popleft().synchronize()
                    for index, start, stop in piece:
                        host, grad = pairs[index]
                        host.view(-1)[start:stop].copy_(grad.view(-1)[start:stop], non_blocking=True)
                        if stop == host.numel():
                            end_chunks(index + 1)
                    in_flight.append(self._record())
                end_chunks(len(pairs))
                self.last_event = self._record()
        except BaseException as error:  # noqa: BLE001  (raised where the copies are waited for)
            self.error = error
        finally:
            pairs, host, grad = [], None, None  # the error's traceback keeps this frame: it must not hold gradients
            self.chunks = []  # the gradients may be freed now: each copy that reads one is enqueued
            for copied in self.copied.values():
                copied.set()
            self.all_enqueued.set()

    def _record(self):
        """An event recorded on the copy stream now; its ``synchronize`` sleeps rather than spinning a core that the
        CPU Adam uses."""
        import torch

        return self.stream.record_event(torch.cuda.Event(blocking=True))

    def raise_if_failed(self) -> None:
        if self.error is not None:
            raise self.error


class _CopyThread:
    """One thread per process issues the steps' copies in the order they were handed over."""

    def __init__(self) -> None:
        import queue

        import torch

        self.device = torch.cuda.current_device()
        self.queue: Any = queue.Queue()
        self.thread = threading.Thread(target=self._loop, name="mbridge-offload-gradient-copy", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        import torch

        torch.cuda.set_device(self.device)
        in_flight: collections.deque = collections.deque()  # across steps' and optimizers' copies
        while True:
            copies = self.queue.get()
            copies.issue(in_flight)  # catches everything itself and always sets its events


_THREAD: list[_CopyThread] = []


def submit(copies: GradientCopies) -> None:
    """Hand one step's copies to the copy thread."""
    if not _THREAD:
        _THREAD.append(_CopyThread())
    _THREAD[0].queue.put(copies)


def alive() -> bool:
    """Whether the copy thread runs (a wait for an event it sets would never end otherwise)."""
    return bool(_THREAD) and _THREAD[0].thread.is_alive()
