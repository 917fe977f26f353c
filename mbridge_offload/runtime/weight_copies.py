"""The updated weights' copy back to the GPU (the exact and delayed engines' H2D, issue #16).

The library's hook after each CPU optimizer's step (``HybridDeviceOptimizer``'s ``param_copy_back_gpu_hook``)
enqueues the chunk's copies at once on the H2D stream: about half a GB for most chunks of the dense proxy, 1.24 GB or
more for the one that holds its embedding (arithmetic from its shapes). A small H2D of the training stream (a micro
batch's inputs) waits for all of it, and the compute after it waits too (copy_pieces.py). So the engine's worker runs
each chunk's Adam without that hook (``step_without_copy_back``) and hands the chunk to a thread of its own, which
enqueues the same copies in pieces (``copy_pieces.copy_in_pieces``), then, in exact mode, the chunk's cast into the
model's bf16 weights, then records the event the training stream waits on for that chunk. The window of pieces in
flight is kept across chunks, steps and the dense and the expert optimizer of a MoE.

The tensors and their values are the library's: each host parameter copied into its GPU fp32 parameter
(``cpu_copys_map_gpu_param``) in the hook's order, by the same ``copy_``; only when each copy is enqueued changes.
"""

from __future__ import annotations

import collections
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mbridge_offload.runtime.copy_pieces import PIECE_BYTES, copy_in_pieces, copy_thread
from mbridge_offload.runtime.serial_thread import LazySerialThread

# the library's post-step hook that copies a CPU optimizer's parameters back (megatron-core 0.19.2,
# hybrid_optimizer.py's _register_param_copy_back_gpu_hook), found by its function's name
LIBRARY_COPY_BACK = "param_copy_back_gpu_hook"


class CopyBackHookNotFound(RuntimeError):
    """The CPU optimizer has not exactly one library copy-back hook: the library changed under the engine."""


def step_without_copy_back(optimizer) -> None:
    """``optimizer.step()`` with every step hook but the library's copy-back (its copies are the weight copy
    thread's). Only the engine's worker steps these optimizers while it runs, so the hooks are swapped for the call."""
    hooks = optimizer._optimizer_step_post_hooks
    kept = OrderedDict((key, hook) for key, hook in hooks.items() if _name_of(hook) != LIBRARY_COPY_BACK)
    if len(kept) != len(hooks) - 1:
        raise CopyBackHookNotFound(
            f"expected one {LIBRARY_COPY_BACK} among the CPU optimizer's step post hooks, found "
            f"{len(hooks) - len(kept)} (hooks: {[_name_of(h) for h in hooks.values()]}): the library's "
            "HybridDeviceOptimizer is not the one this engine was written for (megatron-core 0.19.2)")
    optimizer._optimizer_step_post_hooks = kept
    try:
        optimizer.step()
    finally:
        optimizer._optimizer_step_post_hooks = hooks


def _name_of(hook) -> str:
    return getattr(hook, "__name__", type(hook).__name__)


@dataclass(kw_only=True)
class ChunkUpload:
    """One chunk's updated weights to the GPU: its copies, then its casts, then ``done`` with the event after them."""

    stream: Any  # the library's H2D stream
    pairs: list[tuple[Any, Any]]  # (GPU fp32 parameter, host fp32 parameter), in the library hook's order
    casts: list[tuple[Any, Any]]  # exact mode: (GPU fp32 parameter, the model's bf16 view), cast after the copies
    done: Callable[[Any], None]  # called with the CUDA event after the chunk's copies and casts
    failed: Callable[[BaseException], None]
    piece_bytes: int = PIECE_BYTES

    def issue(self, in_flight: collections.deque | None = None, window: int | None = None,
              pause: Callable[[], None] | None = None) -> None:
        """Enqueue the chunk (the weight copy thread); an error goes to ``failed``, never out of here."""
        import torch

        in_flight = collections.deque() if in_flight is None else in_flight
        try:
            # the GPU fp32 parameters are the optimizer's leaves (they may require grad), and grad mode is per thread
            with torch.no_grad(), torch.cuda.stream(self.stream):
                copy_in_pieces(self.pairs, stream=self.stream, piece_bytes=self.piece_bytes, in_flight=in_flight,
                               window=window, pause=pause)
                for main, model_view in self.casts:
                    model_view.copy_(main)
                event = self.stream.record_event()
        except BaseException as error:  # noqa: BLE001  (raised where the chunk is waited for)
            self.failed(error)
            return
        finally:
            self.pairs, self.casts = [], []
        self.done(event)


@dataclass(kw_only=True)
class UploadsEnd:
    """The end of a job's uploads: ``done()`` on the weight copy thread, after every upload handed to it before."""

    done: Callable[[], None]

    def issue(self, in_flight: collections.deque | None = None, window: int | None = None,
              pause: Callable[[], None] | None = None) -> None:
        self.done()


_THREAD = LazySerialThread(lambda: copy_thread("mbridge-offload-weight-copy"))


def start() -> None:
    """Start the weight copy thread (the training thread, before it hands the worker a step whose chunks the worker
    hands on here): a wait for a chunk asks whether this thread is alive, and it must be before the first chunk."""
    _THREAD.start()


def submit(upload: ChunkUpload) -> None:
    """Hand one chunk's upload to the weight copy thread."""
    _THREAD.submit(upload)


def alive() -> bool:
    """Whether the weight copy thread runs (a wait for a chunk it finishes would never end otherwise)."""
    return _THREAD.alive()
