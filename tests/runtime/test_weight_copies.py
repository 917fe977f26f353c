"""The exact and delayed engines' updated weights back to the GPU, in pieces (mbridge_offload/runtime/weight_copies.py):
the worker's Adam without the library's copy-back hook, and what the weight copy thread enqueues for a chunk, on host
tensors (no GPU here: the stream below logs what was enqueued and waited for; tests/runtime/test_gpu_engine.py checks
the engine's update bit for bit on a GPU)."""

from __future__ import annotations

import collections

import pytest
import torch

from mbridge_offload.runtime.copy_pieces import PIECES_IN_FLIGHT, copy_in_pieces
from mbridge_offload.runtime.weight_copies import ChunkUpload, CopyBackHookNotFound, step_without_copy_back


def _adam_with_hooks(*hooks) -> tuple[torch.optim.AdamW, torch.Tensor]:
    weight = torch.nn.Parameter(torch.ones(4))
    weight.grad = torch.full((4,), 0.5)
    adam = torch.optim.AdamW([weight], lr=0.1)
    for hook in hooks:
        adam.register_step_post_hook(hook)
    return adam, weight


def test_the_worker_step_runs_adam_and_every_hook_but_the_library_copy_back():
    ran = []

    def param_copy_back_gpu_hook(optimizer, args, kwargs):  # the library's name (hybrid_optimizer.py)
        ran.append("copy back")

    def timing_hook(optimizer, args, kwargs):
        ran.append("timing")

    adam, weight = _adam_with_hooks(param_copy_back_gpu_hook, timing_hook)
    hooks = adam._optimizer_step_post_hooks
    step_without_copy_back(adam)
    assert ran == ["timing"] and not torch.equal(weight.detach(), torch.ones(4))  # Adam stepped
    assert adam._optimizer_step_post_hooks is hooks and len(hooks) == 2  # the library's step keeps its hook
    adam.step()
    assert ran == ["timing", "copy back", "timing"]


@pytest.mark.parametrize("copies", [0, 2])
def test_without_exactly_one_library_copy_back_the_step_is_refused_before_adam(copies):
    def param_copy_back_gpu_hook(optimizer, args, kwargs):
        pass

    adam, weight = _adam_with_hooks(*[param_copy_back_gpu_hook] * copies)
    with pytest.raises(CopyBackHookNotFound, match=f"found {copies}.*megatron-core 0.19.2"):
        step_without_copy_back(adam)
    assert torch.equal(weight.detach(), torch.ones(4))


class _LoggedCast:
    """A model weight view whose cast is logged, to see it come after the chunk's copies."""

    def __init__(self, log: list) -> None:
        self.log, self.value = log, None

    def copy_(self, main: torch.Tensor) -> None:
        self.log.append(("cast", None))
        self.value = main.to(torch.bfloat16)


def test_a_chunk_goes_up_in_pieces_then_its_casts_then_its_event(logged_stream):
    stream, in_flight, finished = logged_stream, collections.deque(), []
    # (GPU fp32 weight: an optimizer's leaf, which may require grad; host weight)
    pairs = [(torch.nn.Parameter(torch.zeros(n)), torch.randn(n)) for n in (700, 100, 300)]
    expected = [host.clone() for _, host in pairs]
    cast = _LoggedCast(stream.log)
    upload = ChunkUpload(stream=stream, pairs=list(pairs), casts=[(pairs[0][0], cast)], done=finished.append,
                         failed=lambda error: pytest.fail(f"failed: {error!r}"), piece_bytes=4 * 256)
    upload.issue(in_flight)
    assert all(torch.equal(gpu.detach(), host) for (gpu, _), host in zip(pairs, expected))
    assert torch.equal(cast.value.detach(), expected[0].to(torch.bfloat16))
    [event] = finished
    pieces = [n for what, n in stream.log if what == "record" and n != event.number]
    assert len(pieces) == -(-1100 // 256)
    assert stream.log.index(("cast", None)) > stream.log.index(("record", pieces[-1]))  # after every copy
    assert stream.log[-1] == ("record", event.number)
    assert [n for what, n in stream.log if what == "wait"] == pieces[:len(pieces) - PIECES_IN_FLIGHT]
    assert list(in_flight) and upload.pairs == [] and upload.casts == []  # the window carries over to the next chunk


def test_a_failed_upload_goes_to_failed_and_never_to_done(logged_stream):
    stream, errors, finished = logged_stream, [], []
    upload = ChunkUpload(stream=stream, pairs=[(torch.zeros(6), torch.randn(5))], casts=[], done=finished.append,
                         failed=errors.append)
    upload.issue()
    assert finished == [] and len(errors) == 1 and isinstance(errors[0], ValueError)
    assert upload.pairs == []


def test_a_chunk_is_enqueued_on_its_h2d_stream_and_its_event_is_recorded_there(logged_stream, monkeypatch):
    """Without CUDA ``torch.cuda.stream`` does nothing: logged here, to see the copies, the casts and the chunk's
    event all issued inside the H2D stream's context (the event that the training stream waits on covers them)."""
    class _Entered:
        def __init__(self, stream) -> None:
            self.stream = stream

        def __enter__(self):
            logged_stream.log.append(("enter", self.stream is logged_stream))

        def __exit__(self, *exc) -> None:
            logged_stream.log.append(("exit", None))

    monkeypatch.setattr(torch.cuda, "stream", _Entered)
    cast = _LoggedCast(logged_stream.log)
    finished = []
    pairs = [(torch.zeros(300), torch.randn(300))]
    ChunkUpload(stream=logged_stream, pairs=pairs, casts=[(pairs[0][0], cast)], done=finished.append,
                failed=lambda error: pytest.fail(f"failed: {error!r}"), piece_bytes=4 * 256).issue()
    log = logged_stream.log
    assert log[0] == ("enter", True) and log[-1] == ("exit", None)
    assert [what for what, _ in log[1:-1]] == ["record", "record", "cast", "record"]
    assert finished and finished[0].number == log[-2][1]


@pytest.mark.parametrize("pairs, window, refused", [
    ([(torch.zeros(4), torch.zeros(5))], None, "copy 0 of 1: 5 elements into 4"),
    ([(torch.zeros(4), torch.zeros(4))], 0, "at least one piece is in flight, got a window of 0"),
])
def test_copy_in_pieces_refuses_what_it_would_cut_wrong(pairs, window, refused):
    with pytest.raises(ValueError, match=refused):
        copy_in_pieces(pairs, stream=None, piece_bytes=1024, in_flight=collections.deque(), window=window)

