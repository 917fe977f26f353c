"""The offload engine's run-time errors as a rank prints them, for test_engine_failures.py: run as a script
(``python engine_tracebacks.py OUT_DIR``), it writes one file per scenario holding the traceback Python prints for
it (traceback.print_exc: the default excepthook's text, chained causes first) or the line the engine prints.

Where it is cheap on a CPU the engine's own code raises it: a CPU optimizer step that fails on the real worker
thread (``_WORKER.submit`` running ``StreamingEngine.run``) and reaches the training thread through
``StreamingEngine.drain``; a worker, gradient or weight copy thread found gone (``_wait``); ``install`` with an
unknown engine; the stream mode's warning of a torch without ``_host_emptyCache``. The rest need a built distributed
optimizer or a GPU: their EngineError is raised with the text formatted from the engine's own templates
(facts/engine_messages.py), as the engine formats it.
"""

from __future__ import annotations

import contextlib
import io
from collections import OrderedDict
import sys
import threading
import traceback
from pathlib import Path
from types import SimpleNamespace

import torch

from mbridge_offload.facts import engine_messages as messages
from mbridge_offload.facts.offload_engine import EXACT
from mbridge_offload.runtime import gradient_copies, streaming_engine, weight_copies
from mbridge_offload.runtime.gradient_copies import GradientCopies
from mbridge_offload.runtime.streaming_engine import EngineError, StreamingEngine, _Job


def param_copy_back_gpu_hook(optimizer, args, kwargs) -> None:
    """Named as the library's hook (megatron-core's HybridDeviceOptimizer), which the worker's step leaves out."""
    raise AssertionError("the worker's step ran the library's copy-back hook")


class _HostAdam:
    """A CPU optimizer chunk whose step fails as ``fail`` does (on the worker thread)."""

    def __init__(self, fail) -> None:
        self.param_groups, self.fail = [], fail
        # the library's copy-back hook, which the worker's step leaves to the weight copy thread
        self._optimizer_step_post_hooks = OrderedDict({0: param_copy_back_gpu_hook})

    def step(self):
        self.fail()


def _engine(fail) -> StreamingEngine:
    """A StreamingEngine of one chunk with only what its worker's ``run`` and ``drain`` read."""
    engine = object.__new__(StreamingEngine)
    engine.hdo = SimpleNamespace(cpu_optimizers=[_HostAdam(fail)], _h2d_stream=None,
                                 _sync_sub_optimizers_state_to_hdo=lambda: None)
    engine.mode, engine.casts, engine.wait_s, engine.job, engine.copies_to_take = EXACT, {0: []}, 0.0, None, None
    if torch.cuda.is_available():
        engine._worker_stream, engine._device, engine._threads = None, torch.cuda.current_device(), 1
    else:
        engine._worker_stream = object()  # torch.cuda.stream() leaves the current stream alone without CUDA
    return engine


class _Done:
    def synchronize(self) -> None:
        pass


def _copied_chunk() -> GradientCopies:
    """Chunk 0's gradient copies, already enqueued (it has no gradients: the step under test fails in its Adam)."""
    copies = GradientCopies(stream=None, chunks=[(0, [])])
    copies.events[0] = _Done()
    copies.copied[0].set()
    copies.all_enqueued.set()
    return copies


def cpu_step_failed(fail) -> None:
    """The real path: the worker thread runs the step and keeps its error, the training thread's drain raises it."""
    engine = _engine(fail)
    job = _Job(order=[0], ready={0: threading.Event()}, copies=_copied_chunk())
    engine.job = job
    streaming_engine._WORKER.submit((engine, job))
    engine.drain()


def _host_out_of_memory() -> None:
    torch.empty(1 << 50, dtype=torch.uint8)  # 1 PiB: beyond any host's address space, so ENOMEM at once


def _missing_state() -> None:
    state: dict = {}
    state["exp_avg"].mul_(0.9)


# The library's hook after a CPU chunk's step (megatron/core/optimizer/cpu_offloading/hybrid_optimizer.py) looks up
# each host copy's GPU parameter; after a load that rebuilt the host copies the lookup fails: KeyError: tensor(...).
# Compiled under the library file's name, so that the traceback names it as the real one does.
_HOOK = """
def param_copy_back_gpu_hook(cpu_copys_map_gpu_param, param):
    gpu_param = cpu_copys_map_gpu_param[param]
"""
_hook_namespace: dict = {}
exec(compile(_HOOK, "/opt/venv/lib/python3.12/site-packages/megatron/core/optimizer/cpu_offloading/hybrid_optimizer.py",
             "exec"), _hook_namespace)


def _rebuilt_host_copy() -> None:
    _hook_namespace["param_copy_back_gpu_hook"]({}, torch.tensor([0.5, 0.25]))


class _NeverSet(threading.Event):
    """An event nobody sets, whose wait returns at once (``_wait`` then looks for the thread that would set it); a
    wait that never gives up fails after a few rounds instead of hanging the test."""

    def __init__(self) -> None:
        super().__init__()
        self.rounds = 0

    def wait(self, timeout=None) -> bool:
        self.rounds += 1
        if self.rounds > 3:
            raise AssertionError("the wait went on although the thread that would end it is gone")
        return False


def worker_stopped() -> None:
    engine = _engine(lambda: None)
    job = _Job(order=[0], ready={0: threading.Event()}, copies=_copied_chunk(), finished=_NeverSet())
    engine.job = job
    streaming_engine._WORKER.forget()  # the worker thread is gone
    engine.drain()


def copy_thread_stopped() -> None:
    """The drain waits for the gradients' copies to be enqueued, and the copy thread is gone."""
    engine = _engine(lambda: None)
    copies = GradientCopies(stream=None, chunks=[(0, [])], all_enqueued=_NeverSet())
    engine.job = _Job(order=[0], ready={0: threading.Event()}, copies=copies)
    engine.copies_to_take = copies
    gradient_copies._THREAD.forget()  # no copy thread runs
    engine.drain()


def weight_copy_thread_stopped() -> None:
    """The drain waits for the step's end, which the weight copy thread marks after the last chunk's copies back; the
    worker runs, and the weight copy thread is gone."""
    engine = _engine(lambda: None)
    engine.job = _Job(order=[0], ready={0: threading.Event()}, copies=_copied_chunk(), finished=_NeverSet())
    streaming_engine._WORKER.start()
    weight_copies._THREAD.forget()  # no weight copy thread runs
    engine.drain()


def unknown_engine() -> None:
    streaming_engine.install("fast")


def _raise(text: str):
    def raising() -> None:
        raise EngineError(text)
    return raising


SCENARIOS = {
    "cpu-step-host-oom": lambda: cpu_step_failed(_host_out_of_memory),
    "cpu-step-keyerror": lambda: cpu_step_failed(_missing_state),
    "cpu-step-resume-keyerror": lambda: cpu_step_failed(_rebuilt_host_copy),
    "worker-stopped": worker_stopped,
    "copy-thread-stopped": copy_thread_stopped,
    "weight-copy-thread-stopped": weight_copy_thread_stopped,
    "unknown-engine": unknown_engine,
    "delayed-fp32-weights": _raise(messages.DELAYED_FP32_WEIGHTS.format(count=4)),
    "stream-outside-distributed-optimizer": _raise(messages.STREAM_OUTSIDE_DISTRIBUTED_OPTIMIZER),
    "stream-not-fp32": _raise(messages.STREAM_NOT_FP32.format(dtypes="torch.bfloat16")),
    "stream-pin-failed": _raise(messages.STREAM_PIN_FAILED.format(gib=37.25, status=torch._C._cudart.cudaError(2))),
    "stream-fused-adam-import": _raise(messages.STREAM_FUSED_ADAM_IMPORT),
    "stream-not-fused-adam": _raise(messages.STREAM_NOT_FUSED_ADAM.format(optimizer="SGD")),
    "stream-not-main-weights": _raise(messages.STREAM_NOT_MAIN_WEIGHTS.format(count=2)),
    "stream-step-counts": _raise(messages.STREAM_STEP_COUNTS.format(steps=sorted({1200.0, 1300.0}))),
    "stream-moments-unknown": _raise(messages.STREAM_MOMENTS_UNKNOWN.format(value="BF16", values="fp32, bf16")),
}


def pinned_cache_warning() -> str:
    """What streamed_states.release_pinned_cache prints on a torch without torch._C._host_emptyCache."""
    from mbridge_offload.runtime import streamed_states

    saved = torch._C.__dict__.get("_host_emptyCache")
    if saved is not None:
        delattr(torch._C, "_host_emptyCache")
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            streamed_states.release_pinned_cache()
    finally:
        if saved is not None:
            torch._C._host_emptyCache = saved
    return err.getvalue()


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name, scenario in SCENARIOS.items():
        try:
            scenario()
        except BaseException:  # noqa: BLE001  (what the rank prints of it is the point)
            (out / f"{name}.txt").write_text(traceback.format_exc())
        else:
            raise SystemExit(f"{name} raised nothing")
    (out / "stream-pinned-cache-kept.txt").write_text(pinned_cache_warning())


if __name__ == "__main__":
    main(Path(sys.argv[1]))
