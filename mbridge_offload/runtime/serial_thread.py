"""A daemon thread that runs the items handed to it one at a time, in the order they came: the streaming engine's
worker (the CPU Adam of each step) and its two copy threads (copy_pieces.copy_thread: the gradients' D2H pieces of
each step, the updated weights' H2D pieces of each chunk).

What the training thread waits for, such a thread sets. So a wait asks ``alive()`` while it waits: a thread that is
gone would never set it (streaming_engine._wait).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any


class SerialThread:
    """``handle(item)`` for each ``submit(item)``, on one daemon thread named ``name``, in submission order.

    ``handle`` catches what its item can raise and reports it where the item is waited for: an exception that
    reaches this loop ends the thread, which ``alive()`` then tells. ``start`` runs once on the thread before the
    first item (the CUDA device it issues work on)."""

    def __init__(self, *, name: str, handle: Callable[[Any], None], start: Callable[[], None] | None = None) -> None:
        self._queue: queue.Queue = queue.Queue()
        self._handle = handle
        self._start = start
        self.thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self.thread.start()

    def submit(self, item: Any) -> None:
        self._queue.put(item)

    def alive(self) -> bool:
        return self.thread.is_alive()

    def _loop(self) -> None:
        if self._start is not None:
            self._start()
        while True:
            self._handle(self._queue.get())


class LazySerialThread:
    """One ``SerialThread`` per process, started at the first ``submit``; ``made(...)`` builds it then (its
    arguments may need CUDA, which importing this module must not)."""

    def __init__(self, made: Callable[[], SerialThread]) -> None:
        self._made = made
        self._thread: SerialThread | None = None
        self._lock = threading.Lock()  # the training thread starts it; the worker submits to it

    def start(self) -> None:
        """Start the thread if it is not running yet: before anything waits on work that another thread hands it."""
        with self._lock:
            if self._thread is None:
                self._thread = self._made()

    def submit(self, item: Any) -> None:
        self.start()
        self._thread.submit(item)

    def alive(self) -> bool:
        """Whether the thread runs (never started: not running, so a wait for it would never end)."""
        return self._thread is not None and self._thread.alive()

    def forget(self) -> None:
        """Drop the thread (it keeps running if it does, unreachable): the next ``submit`` starts a new one. For the
        diagnosis scenarios that show a stopped thread."""
        self._thread = None
