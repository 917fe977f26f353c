"""The exact and delayed engines' zeroing of the gradient buffers by region (mbridge_offload/runtime/grad_regions.py,
MBRIDGE_OFFLOAD_ZERO_BY_REGION, design section 12).

The cut into regions and the copies' region ends are checked here on host tensors; the whole mechanism runs in
stream_cpu_check.py's ``exact-by-region`` and ``delayed-by-region`` kinds: 2-4 gloo ranks of Megatron Core's real
DistributedDataParallel and distributed optimizer, the plugin's engine and its threads, on the CPU stand-in for the
GPU, which runs each copy and memset when it is issued. There a memset issued before its region's copy, or after the
backward's first write of the region, changes the host gradients or loses a gradient, and the forward's weights then
differ from torch AdamW's:

- every forward's weights and every state equal the reference's with the zeroing by region, with the copy thread
  reporting each region's end late (after the next step asked for the zeroing), with regions cut inside the buckets,
  with one bucket per buffer reduced at the end (``overlap_grad_reduce`` off), on the model with experts (a dense
  and an experts' engine), on two pipeline stages of 4 micro batches, and with layers that get no gradient in some
  steps (regions that no DDP hook waits for, only the gradient sync) and a step that calls zero_grad_buffer twice;
- across a checkpoint, as test_exact_ranks.py and test_delayed_ranks.py resume (a save, Megatron Bridge's load into
  a newly built model and optimizer, and into the running one with an update pending): the resumed run equals the
  uninterrupted one bit for bit;
- two broken engines are caught: memsets issued where zero_grad_buffer asks, before the copies (both engines), and a
  backward that does not wait for its regions (the delayed engine; the exact engine's forward gates wait for every
  chunk's update, which follows its copies, so there the memsets are issued before the backward anyway).

What the stand-in cannot show is a missing wait on a GPU stream (its waits are satisfied at once): the GPU test
(tests/runtime/test_gpu_engine.py) and a profile are for that.
"""

from __future__ import annotations

import pytest
import torch

from mbridge_offload.runtime.gradient_copies import GradientCopies
from mbridge_offload.runtime.grad_regions import cut_regions


def _covers_once(regions, total):
    return [a for a, _ in regions] == [0, *[b for _, b in regions[:-1]]] and regions[-1][1] == total


@pytest.mark.parametrize("total, buckets, starts, cap", [
    (100, [(0, 40), (40, 100)], [0, 10, 40, 50, 90], 1000),  # regions are the buckets
    (100, [(0, 100)], [0, 10, 20, 30, 60, 95], 25),  # one bucket, cut at parameter starts
    (128, [(0, 100)], [0, 50], 10),  # the buffer's padding after the last bucket joins the last region
    (100, [(0, 30), (30, 100)], [0, 5, 30, 31, 70], 20),  # both cuts
    (7, [(0, 7)], [0], 1),  # one parameter: one region, whatever the cap
])
def test_regions_cover_the_buffer_once_cut_at_buckets_and_parameter_starts(total, buckets, starts, cap):
    regions = cut_regions(total, buckets, starts, cap)
    assert _covers_once(regions, total)
    cuts = {a for a, _ in regions} - {0}
    assert {start for start, _ in buckets if start > 0} <= cuts  # every bucket starts a region
    assert cuts <= set(starts) | {start for start, _ in buckets}  # no parameter is split
    bucket_starts = sorted(start for start, _ in buckets)
    for a, b in regions:
        # a region is cut inside a bucket only once it holds the cap: only its last parameter may take it past
        inside = [s for s in starts if a < s < b and s not in bucket_starts]
        assert all(s - a < cap for s in inside)


def test_a_region_is_cut_at_the_first_parameter_start_past_the_cap():
    assert cut_regions(100, [(0, 100)], [0, 10, 20, 30, 60, 95], 25) == [(0, 30), (30, 60), (60, 95), (95, 100)]
    assert cut_regions(100, [(0, 40), (40, 100)], [0, 10, 40, 50, 90], 1000) == [(0, 40), (40, 100)]


def test_a_region_of_no_element_is_refused():
    with pytest.raises(ValueError, match="at least one element"):
        cut_regions(10, [(0, 10)], [0], 0)


def _pairs(numels):
    return [(torch.zeros(n), torch.randn(n)) for n in numels]


def test_a_chunk_in_several_runs_ends_after_its_last_and_region_ends_follow_their_last_copy(logged_stream):
    """The delayed mode with the zeroing by region issues the pairs in the backward's order: a chunk comes back in
    several runs, and ends (the worker's event) after its last; each region's end is recorded once the copies up to
    its last reader are enqueued, in that order, and the callback gets that event."""
    stream = logged_stream
    chunks = [(1, _pairs([8])), (0, _pairs([8, 8])), (1, _pairs([8])), (2, [])]
    expected = [(host, grad.clone()) for _, pairs in chunks for host, grad in pairs]
    ended = []
    region_ends = [(1, lambda event: ended.append(("a", event.number))),
                   (3, lambda event: ended.append(("b", event.number))),
                   (4, lambda event: ended.append(("c", event.number)))]
    copies = GradientCopies(stream=stream, chunks=chunks, piece_bytes=4 * 8, region_ends=region_ends)
    copies.issue(window=1)
    copies.raise_if_failed()
    assert all(torch.equal(host, grad) for host, grad in expected)
    recorded = [n for what, n in stream.log if what == "record"]
    marks = {copies.events[c].number for c in (0, 1, 2)} | {n for _, n in ended} | {copies.last_event.number}
    pieces = [n for n in recorded if n not in marks]  # one piece per pair here (8 fp32 elements each)
    assert len(pieces) == 4
    assert [name for name, _ in ended] == ["a", "b", "c"]
    a, b, c = (n for _, n in ended)
    # an end is recorded once its last pair's copy is enqueued, inside the piece that holds it: after the piece
    # before that one
    assert a < pieces[0]
    assert pieces[1] < copies.events[0].number < b < pieces[2]  # chunk 0 (pairs 2-3) ends, then region b
    # chunk 1 ends after its second run (the last pair), chunk 2 (no pairs) with it, then region c
    assert pieces[2] < copies.events[1].number < copies.events[2].number < c < pieces[3]
    assert copies.last_event.number > max(marks - {copies.last_event.number})


def test_a_failed_copy_fails_the_zeroings_that_wait_for_it(logged_stream):
    """A copy that fails leaves regions whose copies never end: each zeroing waiting for them is told, so the
    backward's wait raises instead of waiting for ever."""
    failed = []

    class Zeroing:
        def fail(self, error):
            failed.append(error)

    chunks = [(0, [(torch.zeros(4), torch.randn(5))])]  # sizes differ: copy_in_pieces refuses the pair
    copies = GradientCopies(stream=logged_stream, chunks=chunks, region_ends=[(1, lambda event: None)],
                            zeroings=[Zeroing()])
    copies.issue()
    assert isinstance(copies.error, ValueError) and failed == [copies.error]
    assert copies.all_enqueued.is_set()


@pytest.mark.parametrize("kind", ["exact-by-region", "delayed-by-region"])
def test_the_zeroing_by_region_keeps_every_update_and_the_broken_ones_are_caught(stream_scenarios, kind):
    stream_scenarios.assert_all_ok(kind)


def test_a_zeroing_before_the_copies_is_caught(stream_scenarios):
    for kind in ("exact-by-region", "delayed-by-region"):
        stream_scenarios.assert_caught(kind, "2 ranks, broken: region-zero-before-copies", "forward-weights")


def test_a_backward_that_does_not_wait_for_its_regions_is_caught(stream_scenarios):
    stream_scenarios.assert_caught("delayed-by-region", "2 ranks, broken: region-no-wait", "forward-weights")
