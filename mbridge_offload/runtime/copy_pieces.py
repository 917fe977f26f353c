"""Host-device copies issued in pieces, a few in flight at a time: the streaming engine's gradients to the host
(gradient_copies.py) and its updated weights back to the GPU (weight_copies.py).

A GPU's copy engine serves the copies of one direction from every stream in the order they were issued. One large
copy enqueued at once makes a small copy of the training stream in the same direction (a step-end read of the loss;
the next micro batch's inputs) wait for all of it, and the compute after that copy waits too. In plain torch on an
H100, a read waited 81.8 ms behind the dense proxy's 4.47 GB of gradients enqueued at once, and 5.2 ms behind the same
copy in 256 MiB pieces (docs/benchmarks/offload-engine/d2h-queue/). The delayed mode's profile showed the same for the
weights' H2D: the training stream idle 12.2 ms of a 12.4 ms gap while only that copy ran
(docs/benchmarks/offload-engine/delayed-profile/).

So a thread of the engine's own issues them in pieces of about ``PIECE_BYTES``, each once the one ``PIECES_IN_FLIGHT``
before it has finished. Two in flight, so that the copy engine has the next piece queued while the thread, woken by
the last one's end, waits for the interpreter's lock, which the training thread holds while it launches kernels (up
to the 5 ms switch interval, two 128 MiB pieces' copy). But in copy-pieces/'s profile, with two in flight, the
training stream's own small copies still waited 8-32 ms behind the engine's: the copy engine seems to go on serving
a stream that has a copy queued, so another stream's copy gets in only when the thread's queue runs dry. One in
flight (d2h-queue/'s test: a read waited for one 256 MiB piece) would leave that gap after every piece, at the cost
of the lock's wait. copy-window/'s script measures both, with a thread that holds the lock as the training thread
does; it has not run yet, so the default stays what the engine ran with.
"""

from __future__ import annotations

import collections
import os
from collections.abc import Callable
from typing import Any

from mbridge_offload.facts.offload_engine import COPY_PAUSE_ENV, DEFAULT_COPY_WINDOW, copy_pause_us, copy_window
from mbridge_offload.runtime.serial_thread import SerialThread

PIECE_BYTES = 128 * 2**20
PIECES_IN_FLIGHT = DEFAULT_COPY_WINDOW  # a run's MBRIDGE_OFFLOAD_COPY_PIECES_IN_FLIGHT sets the threads' window


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


def record_blocking(stream) -> Any:
    """An event recorded on ``stream`` now; its ``synchronize`` sleeps rather than spinning a core that the CPU Adam
    uses."""
    import torch

    return stream.record_event(torch.cuda.Event(blocking=True))


def copy_in_pieces(pairs: list[tuple[Any, Any]], *, stream, piece_bytes: int, in_flight: collections.deque,
                   tensor_done: Callable[[int], None] = lambda copied: None,
                   window: int | None = None, pause: Callable[[], None] | None = None) -> None:
    """``destination.copy_(source)`` for each (destination, source) pair of tensors of one numel, contiguous, on
    ``stream`` (the caller's current stream), in pieces cut over all the pairs, each piece enqueued once the one
    ``window`` (default ``PIECES_IN_FLIGHT``) before it has finished. ``in_flight``: the events of the pieces
    enqueued and maybe not finished, kept by the caller from one call to the next. ``tensor_done(n)``: the first
    ``n`` pairs' copies are all enqueued (called after each pair's last piece, with ``n`` counting the pairs before
    it too). ``pause``: instead of the window, every piece enqueued at once, each after ``pause()`` (a GPU-side pause
    on ``stream``, ``gpu_pause``; the first piece too, since the last item's last piece may still be running: a MoE's
    dense and expert copies, the weights' chunks); ``in_flight`` is then left as it is."""
    limit = PIECES_IN_FLIGHT if window is None else window
    if limit < 1:
        raise ValueError(f"at least one piece is in flight, got a window of {window}")
    destination = source = None
    try:
        for index, (destination, source) in enumerate(pairs):
            if destination.numel() != source.numel():
                raise ValueError(f"copy {index} of {len(pairs)}: {source.numel()} elements into "
                                 f"{destination.numel()}: a copy in pieces copies whole tensors of one size")
        element = max((destination.element_size() for destination, _ in pairs), default=1)
        for piece in pieces_of([destination.numel() for destination, _ in pairs], max(1, piece_bytes // element)):
            if pause is not None:
                pause()
            else:
                while len(in_flight) >= limit:
                    in_flight.popleft().synchronize()
            for index, start, stop in piece:
                destination, source = pairs[index]
                destination.view(-1)[start:stop].copy_(source.view(-1)[start:stop], non_blocking=True)
                if stop == destination.numel():
                    tensor_done(index + 1)
            if pause is None:
                in_flight.append(record_blocking(stream))
    finally:
        # an error's traceback keeps this frame: it must not hold the tensors (a gradient the allocator would free)
        pairs = destination = source = None


def gpu_pause(microseconds: int) -> Callable[[], None]:
    """A pause of about ``microseconds`` enqueued on the current stream when called (``torch.cuda._sleep``, its
    cycles measured once here on the current GPU); it may run longer beside kernels that fill every SM, and a
    measurement beside them may make it shorter."""
    import math

    import torch

    from mbridge_offload.runtime.gpu_sleep import sleep_cycles_per_ms

    with torch.cuda.stream(torch.cuda.Stream()):  # measured beside the training stream's work, not behind it
        per_ms = sleep_cycles_per_ms()
    if not (math.isfinite(per_ms) and per_ms > 0):
        raise ValueError(f"torch.cuda._sleep measured {per_ms} cycles per millisecond")
    cycles = max(1, int(microseconds * per_ms / 1000))
    return lambda: torch.cuda._sleep(cycles)


def _failing_pause(microseconds: int, error: BaseException) -> Callable[[], None]:
    """What a copy thread pauses with when ``gpu_pause`` failed at its start: raises, with the setting and its fix,
    inside the item's ``issue``, which reports it where the copies are waited for (the thread itself stays up)."""
    def pause() -> None:
        raise RuntimeError(f"{COPY_PAUSE_ENV}={microseconds}: the GPU-side pause between the copies' pieces could not "
                           f"be set up ({type(error).__name__}: {error}). Fix: drop ++env_vars.{COPY_PAUSE_ENV} (the "
                           "copies then keep a window of pieces in flight)") from error

    return pause


def copy_thread(name: str) -> SerialThread:
    """A thread named ``name`` on the current CUDA device that runs ``item.issue(in_flight, window, pause)`` for
    each item handed to it (a step's gradient copies, a chunk's upload): its pieces in flight kept from one item to
    the next (steps, and the dense and the expert optimizer of a MoE), its window the run's
    MBRIDGE_OFFLOAD_COPY_PIECES_IN_FLIGHT, or, with MBRIDGE_OFFLOAD_COPY_PIECE_PAUSE_US, every piece enqueued at once
    each after that pause (``gpu_pause``, calibrated when the thread starts). ``issue`` catches everything
    itself and reports it where it is waited for."""
    import torch

    device = torch.cuda.current_device()
    in_flight: collections.deque = collections.deque()
    # the run's env_vars are in the environment by its first step
    window, pause_us = copy_window(None, os.environ), copy_pause_us(None, os.environ)
    pause: list = [None]

    def start() -> None:
        torch.cuda.set_device(device)
        if pause_us is not None:
            try:
                pause[0] = gpu_pause(pause_us)
            except Exception as error:  # noqa: BLE001  (raised, with its fix, where the copies are waited for)
                pause[0] = _failing_pause(pause_us, error)

    return SerialThread(name=name, start=start, handle=lambda item: item.issue(in_flight, window, pause[0]))

