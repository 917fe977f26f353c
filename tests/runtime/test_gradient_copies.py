"""The exact and delayed engines' gradient copies to the host, in pieces (mbridge_offload/runtime/gradient_copies.py):
the cut into pieces, and what the copy thread's ``issue`` enqueues, waits for and hands on, on host tensors (no GPU
here: the stream below records its events and what each wait was for, so the test sees the order a GPU would
run them in; a GPU run checks the engine's update bit for bit, tests/runtime/test_gpu_engine.py)."""

from __future__ import annotations

import collections

import pytest
import torch

from mbridge_offload.runtime.copy_pieces import PIECES_IN_FLIGHT, copy_in_pieces, pieces_of
from mbridge_offload.runtime.gradient_copies import GradientCopies


@pytest.mark.parametrize("numels, piece", [([10, 3, 7], 4), ([5], 5), ([1, 1, 1, 1], 3), ([17, 2, 40, 1, 9], 11),
                                           ([300], 1), ([0, 6, 0], 4), ([], 8)])
def test_pieces_cover_every_element_once_in_order_and_none_is_over_its_size(numels, piece):
    pieces = pieces_of(numels, piece)
    flat = [(index, element) for p in pieces for index, start, stop in p for element in range(start, stop)]
    assert flat == [(index, element) for index, numel in enumerate(numels) for element in range(numel)]
    assert all(0 < sum(stop - start for _, start, stop in p) <= piece for p in pieces)
    # only the last piece may be short: small tensors share a piece rather than each taking one
    assert all(sum(stop - start for _, start, stop in p) == piece for p in pieces[:-1])


def test_a_piece_of_no_element_is_refused():
    with pytest.raises(ValueError, match="at least one element"):
        pieces_of([4], 0)


def _pairs(numels: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(torch.zeros(n), torch.randn(n)) for n in numels]


def _pieces_and_waits(stream, not_pieces: set[int]) -> tuple[list[int], list[int]]:
    recorded = [n for what, n in stream.log if what == "record" and n not in not_pieces]
    return recorded, [n for what, n in stream.log if what == "wait"]


def test_issue_fills_every_host_buffer_with_pieces_over_the_whole_step_and_at_most_the_pieces_in_flight(logged_stream):
    stream = logged_stream
    piece = 256  # fp32 elements
    chunks = [(2, _pairs([1000, 24])), (0, _pairs([3000])), (1, [])]
    expected = [(host, grad.clone()) for _, pairs in chunks for host, grad in pairs]
    copies = GradientCopies(stream=stream, chunks=chunks, piece_bytes=4 * piece)
    copies.issue()
    copies.raise_if_failed()
    assert all(torch.equal(host, grad) for host, grad in expected)
    assert copies.chunks == []  # the gradients are no longer held
    assert all(done.is_set() for done in copies.copied.values()) and copies.all_enqueued.is_set()
    ends = {chunk: copies.events[chunk].number for chunk in (2, 0, 1)}
    assert ends[2] < ends[0] < ends[1] < copies.last_event.number  # in the worker's order, then the step's end
    pieces, waits = _pieces_and_waits(stream, {*ends.values(), copies.last_event.number})
    total = 1000 + 24 + 3000
    assert len(pieces) == -(-total // piece)  # cut over the step: no chunk starts a piece of its own
    # a chunk's end is recorded inside the piece that holds its last element: after the piece before it
    for chunk, last_element in ((2, 1024 - 1), (0, total - 1)):
        holding = last_element // piece
        assert (holding == 0 or pieces[holding - 1] < ends[chunk]) and ends[chunk] < pieces[holding]
    # before each piece is enqueued, the one PIECES_IN_FLIGHT before it has finished; the ends are never waited for
    for k in range(PIECES_IN_FLIGHT, len(pieces)):
        assert stream.log.index(("wait", pieces[k - PIECES_IN_FLIGHT])) < stream.log.index(("record", pieces[k]))
    assert waits == pieces[:len(pieces) - PIECES_IN_FLIGHT]


def test_the_pieces_in_flight_carry_over_to_the_next_copies(logged_stream):
    """The dense and the expert optimizer of a MoE hand over their copies one after the other: the second's first
    piece waits for the first's pieces still in flight."""
    stream, in_flight = logged_stream, collections.deque()
    first = GradientCopies(stream=stream, chunks=[(0, _pairs([256 * (PIECES_IN_FLIGHT + 1)]))], piece_bytes=4 * 256)
    first.issue(in_flight)
    first_pieces, _ = _pieces_and_waits(stream, {first.events[0].number, first.last_event.number})
    assert [event.number for event in in_flight] == first_pieces[-PIECES_IN_FLIGHT:]
    second = GradientCopies(stream=stream, chunks=[(0, _pairs([256]))], piece_bytes=4 * 256)
    second.issue(in_flight)
    [second_piece] = [n for what, n in stream.log if what == "record" and n > first.last_event.number
                      and n not in (second.events[0].number, second.last_event.number)]
    assert stream.log.index(("wait", first_pieces[-PIECES_IN_FLIGHT])) < stream.log.index(("record", second_piece))
    # still in flight: the next copies wait for them first
    assert [event.number for event in in_flight] == [*first_pieces, second_piece][-PIECES_IN_FLIGHT:]


@pytest.mark.parametrize("window", [1, 2, 3])
def test_copy_in_pieces_enqueues_a_piece_once_the_one_its_window_before_has_finished(window, logged_stream):
    stream, in_flight = logged_stream, collections.deque()
    pairs = _pairs([1000, 600])
    copy_in_pieces(pairs, stream=stream, piece_bytes=4 * 256, in_flight=in_flight, window=window)
    assert all(torch.equal(host, grad) for host, grad in pairs)
    pieces, waits = _pieces_and_waits(stream, set())
    assert len(pieces) == -(-1600 // 256) and waits == pieces[:len(pieces) - window]
    for k in range(window, len(pieces)):
        assert stream.log.index(("wait", pieces[k - window])) < stream.log.index(("record", pieces[k]))
    assert len(in_flight) == window


def test_a_failed_copy_is_kept_for_the_training_thread_and_releases_every_waiter(logged_stream):
    stream = logged_stream
    copies = GradientCopies(stream=stream, chunks=[(0, _pairs([8])), (1, [(torch.zeros(6), torch.randn(5))])])
    copies.issue()
    assert all(done.is_set() for done in copies.copied.values()) and copies.all_enqueued.is_set()
    assert 1 not in copies.events and copies.last_event is None
    with pytest.raises(ValueError, match="copy 1 of 2: 5 elements into 6"):
        copies.raise_if_failed()
    # the error's traceback keeps the copy's frame: it holds no gradient
    frames = [tb.tb_frame for tb in _walk(copies.error.__traceback__)]
    assert not any(isinstance(v, torch.Tensor) for f in frames for v in f.f_locals.values())


def _walk(tb):
    while tb is not None:
        yield tb
        tb = tb.tb_next


def test_the_copy_thread_window_reaches_the_pieces(logged_stream):
    """The copy thread passes the run's window (MBRIDGE_OFFLOAD_COPY_PIECES_IN_FLIGHT) to each step's copies."""
    copies = GradientCopies(stream=logged_stream, chunks=[(0, _pairs([1024]))], piece_bytes=4 * 256)
    copies.issue(collections.deque(), window=1)
    pieces, waits = _pieces_and_waits(logged_stream, {copies.events[0].number, copies.last_event.number})
    assert len(pieces) == 4 and waits == pieces[:3]  # each piece waited for before the next: one in flight


def test_with_a_pause_every_piece_is_enqueued_at_once_each_after_a_pause(logged_stream):
    """MBRIDGE_OFFLOAD_COPY_PIECE_PAUSE_US: no piece waits for another (so no thread has to wake between them), and a
    GPU-side pause goes before each piece (the first too: the item before may still be copying), where another
    stream's copy can get in; every element is copied, each chunk's end is recorded inside the piece that holds its
    last element, and the in-flight events of an earlier window are left alone."""
    chunks = [(1, _pairs([600])), (0, _pairs([424]))]  # 1024 fp32 elements: 4 pieces of 256
    expected = [(host, grad.clone()) for _, pairs in chunks for host, grad in pairs]
    copies = GradientCopies(stream=logged_stream, chunks=chunks, piece_bytes=4 * 256)
    earlier = logged_stream.record_event()
    in_flight = collections.deque([earlier])
    copies.issue(in_flight, window=1, pause=lambda: logged_stream.log.append(("pause", None)))
    copies.raise_if_failed()
    assert all(torch.equal(host, grad) for host, grad in expected)
    log = logged_stream.log
    assert [what for what, _ in log if what == "wait"] == [] and list(in_flight) == [earlier]

    def pauses_before(event) -> int:
        return sum(1 for what, _ in log[:log.index(("record", event.number))] if what == "pause")

    assert sum(1 for what, _ in log if what == "pause") == 4
    assert pauses_before(copies.events[1]) == 3  # element 599 is in the third piece
    assert pauses_before(copies.events[0]) == pauses_before(copies.last_event) == 4


def test_a_pause_that_could_not_be_set_up_fails_the_step_with_the_setting_and_its_fix(logged_stream):
    """A copy thread whose pause's calibration failed at its start pauses with one that raises: the step's copies
    fail where they are waited for, naming MBRIDGE_OFFLOAD_COPY_PIECE_PAUSE_US, its value and the fix."""
    from mbridge_offload.runtime.copy_pieces import _failing_pause

    copies = GradientCopies(stream=logged_stream, chunks=[(0, _pairs([8]))])
    copies.issue(collections.deque(), pause=_failing_pause(20, RuntimeError("no sleep kernel")))
    assert copies.all_enqueued.is_set() and copies.copied[0].is_set()
    with pytest.raises(RuntimeError, match=r"MBRIDGE_OFFLOAD_COPY_PIECE_PAUSE_US=20: .*no sleep kernel.*Fix: drop "
                                           r"\+\+env_vars\.MBRIDGE_OFFLOAD_COPY_PIECE_PAUSE_US"):
        copies.raise_if_failed()
