"""The exact and delayed engines' worker and weight copy thread together, on the CPU (the real threads, stand-in
streams): when a job ends, what a failure in either thread does, and where the delayed mode's wait for the training
thread's copy of the weights lands on the H2D stream. A GPU run checks the update's values
(tests/runtime/test_gpu_engine.py); races between the threads are what these look for."""

from __future__ import annotations

import collections
import itertools
import threading
import time
from types import SimpleNamespace

import pytest
import torch

from mbridge_offload.facts.offload_engine import DELAYED, EXACT
from mbridge_offload.runtime import streaming_engine, weight_copies
from mbridge_offload.runtime.gradient_copies import GradientCopies
from mbridge_offload.runtime.serial_thread import LazySerialThread, SerialThread
from mbridge_offload.runtime.streaming_engine import EngineError, StreamingEngine, _Job


class _Done:
    def synchronize(self) -> None:
        pass


class _Stream:
    """Logs the events recorded on it and the events it was made to wait for."""

    def __init__(self) -> None:
        self.log: list = []
        self._numbers = itertools.count()

    def record_event(self, event=None):
        number = next(self._numbers)
        self.log.append(("record", number))
        return _Done()

    def wait_event(self, event) -> None:
        self.log.append(("wait", event))


def param_copy_back_gpu_hook(optimizer, args, kwargs) -> None:
    """Named as the library's copy-back hook, which the worker's step must leave to the weight copy thread."""
    raise AssertionError("the worker's step ran the library's copy-back hook")


@pytest.fixture
def uploads_take(monkeypatch):
    """The weight copy thread, each upload taking ``seconds`` first (a slow copy engine); a fresh thread per test."""
    def make(seconds: float = 0.0) -> None:
        in_flight: collections.deque = collections.deque()

        def handle(item) -> None:
            time.sleep(seconds)
            item.issue(in_flight)

        monkeypatch.setattr(weight_copies, "_THREAD",
                            LazySerialThread(lambda: SerialThread(name="test-weight-copy", handle=handle)))

    monkeypatch.setattr(torch.cuda, "current_stream", lambda *args: _Stream())
    return make


def _engine_and_job(chunks: int, mode: str = EXACT, bad_chunk: int | None = None):
    """An engine of ``chunks`` one-tensor CPU optimizers whose gradients are on the host already; chunk ``bad_chunk``'s
    GPU parameter has the wrong size, so its upload fails."""
    optimizers, gpu_of = [], {}
    for chunk in range(chunks):
        host = torch.nn.Parameter(torch.randn(8))
        host.grad = torch.randn(8)
        optimizer = torch.optim.AdamW([host], lr=0.1)
        optimizer.register_step_post_hook(param_copy_back_gpu_hook)
        optimizers.append(optimizer)
        gpu_of[host] = torch.zeros(9 if chunk == bad_chunk else 8)
    engine = object.__new__(StreamingEngine)
    engine.hdo = SimpleNamespace(cpu_optimizers=optimizers, _h2d_stream=_Stream(), cpu_copys_map_gpu_param=gpu_of,
                                 _sync_sub_optimizers_state_to_hdo=lambda: None)
    engine.mode, engine.casts, engine.wait_s, engine.copies_to_take = mode, {c: [] for c in range(chunks)}, 0.0, None
    engine._worker_stream = object()  # torch.cuda.stream() leaves the current stream alone without CUDA
    copies = GradientCopies(stream=None, chunks=[(c, []) for c in range(chunks)])
    for chunk in range(chunks):
        copies.events[chunk] = _Done()
        copies.copied[chunk].set()
    copies.all_enqueued.set()
    engine.job = _Job(order=list(range(chunks)), ready={c: threading.Event() for c in range(chunks)}, copies=copies)
    return engine, engine.job, gpu_of


def _start(engine, job) -> None:
    weight_copies.start()
    streaming_engine._WORKER.submit((engine, job))


def test_the_job_ends_after_its_last_upload_and_the_gpu_holds_every_update(uploads_take):
    uploads_take(0.1)
    engine, job, gpu_of = _engine_and_job(3)
    _start(engine, job)
    engine.drain()
    assert job.finished.is_set() and sorted(job.done_events) == [0, 1, 2]
    assert all(torch.equal(gpu, host.detach()) for host, gpu in gpu_of.items())  # each chunk's Adam, then its copy


def test_an_upload_that_fails_is_raised_by_the_drain_after_the_uploads_handed_over(uploads_take):
    uploads_take(0.05)
    engine, job, gpu_of = _engine_and_job(4, bad_chunk=1)
    _start(engine, job)
    with pytest.raises(EngineError, match="ValueError: copy 0 of 1: 8 elements into 9"):
        engine.drain()
    assert job.finished.is_set()
    assert torch.equal(next(iter(gpu_of.values())), next(iter(gpu_of)).detach())  # chunk 0 went up before it


def test_a_job_of_no_chunk_ends(uploads_take):
    uploads_take()
    engine, job, _ = _engine_and_job(0)
    _start(engine, job)
    engine.drain()
    assert job.finished.is_set()


def test_delayed_h2d_stream_waits_for_the_training_thread_copy_before_any_upload(uploads_take):
    uploads_take()
    engine, job, _ = _engine_and_job(2, mode=DELAYED)
    _start(engine, job)
    time.sleep(0.2)
    assert engine.hdo._h2d_stream.log == [] and not job.ready[0].is_set()  # no Adam before the model's copy
    job.model_copied_event = "the training stream's copy of the weights"
    job.model_copied.set()
    engine.drain()
    log = engine.hdo._h2d_stream.log
    assert log[0] == ("wait", "the training stream's copy of the weights")
    assert [what for what, _ in log[1:]] == ["record"] * (len(log) - 1)  # then the two chunks' pieces and ends
