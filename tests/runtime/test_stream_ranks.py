"""The stream offload engine with several data-parallel ranks, on the CPU (no GPU here).

stream_cpu_check.py runs 2 and 4 processes on gloo, each a rank of Megatron Core's real DistributedDataParallel
(several buckets, each its own bucket group and parameter all-gather) and get_megatron_optimizer (the
DistributedOptimizer over a HybridDeviceOptimizer), with the plugin's real install_resume_fix() and
streaming_engine.install("stream"), and trains a 12.6M-parameter model 3 steps (fraction 0.6 and 1, the
all-gather overlapped with the forward and in the step, the library's one or several CPU optimizers). Each rank
checks:

- ownership and layout: the union over the ranks of their shards covers every element of every parameter once
  (with fraction 1 all offloaded); each rank offloads the tensors the forward uses last, by the library's
  threshold; its chunks cover its flat host buffers end to end, with the ring wrapping (6 chunks, 3 slots);
  ``chunk_of_model`` agrees with the pieces; each ``_model_shard_view`` is the rank's shard in the DDP parameter
  buffer the all-gather sends; the library's host copies and the CPU optimizers' states are the engine's buffers;
- ``gate_param_gather``: each bucket group's all-gather waits for exactly the chunks holding this rank's shards
  of its parameters; the chunks are enqueued once each, in order, by the step's all-gathers or by the next
  forward (module gates, pacing, the all-gathers it starts);
- the arithmetic: every module's forward, on every rank, uses the weights of torch AdamW on the full fp32
  tensors with the ranks' mean gradient clipped by its global norm (Megatron's real clipping: the norm
  all-reduced over the ranks; the engine does no reduction of its own): the other ranks' shards came through
  Megatron's all-gather after their update. After ``drain_all`` (a save's or an evaluation's drain), each rank's
  fp32 shards, the host copies of them, Adam's moments on the host and the step equal the reference's;
- a broken engine is caught: with ``gate_param_gather`` a no-op the forward uses stale weights of the other ranks
  (run here). Checked by hand to fail too: a model view on the buffer's range instead of the bucket's, no copy
  of the moments back to the host, no prefetch of the first chunks, gradient pieces off by one element, the
  gradient buffers zeroed before the overlapped update read them.

The GPU is stream_cpu_device.py's stand-in: device tensors are CPU tensors that say they are on the GPU, streams
and events run everything when issued, pinning does nothing, Transformer Engine's Adam, norm and scale kernels
are the same arithmetic in torch. So this cannot see: the overlap of the copy streams with the forward, a missing
or misplaced event wait (every wait is satisfied at once; only a wait on no event is refused), pinned-memory DMA,
NCCL, the real kernels' rounding, GPU memory (a gate that waits before it enqueues fails here only when the
all-gather is in the step; otherwise it waits on the previous update's event, which the stand-in cannot tell).
The exact and delayed engines' several-rank paths have scenarios of their own (test_exact_ranks.py,
test_delayed_ranks.py). ~90 s here: ~55 s of it imports Megatron Bridge, once, in the process
that forks the ranks.
"""

from __future__ import annotations

import pytest

SCENARIOS = ["2 ranks, fraction 0.6, overlapped all-gather", "2 ranks, fraction 1, all-gather in the step",
             "4 ranks, fraction 1, overlapped all-gather"]


@pytest.mark.parametrize("label", SCENARIOS)
def test_stream_engine_on_several_ranks_updates_each_shard_as_adamw_on_the_full_tensors(stream_scenarios, label):
    stream_scenarios.assert_passed("ranks", label)


def test_an_all_gather_that_does_not_wait_for_the_update_is_caught(stream_scenarios):
    stream_scenarios.assert_caught("ranks", "2 ranks, broken: no-gather-gate", "forward-weights")


FETCH_AHEAD_SCENARIOS = ["2 ranks, fraction 1, fetch-ahead, overlapped all-gather",
                         "2 ranks, fraction 0.6, fetch-ahead, all-gather in the step",
                         "2 ranks, EP 2, fraction 1, fetch-ahead, overlapped all-gather",
                         "4 ranks, 2 pipeline stages x DP 2, fraction 1, fetch-ahead, overlapped all-gather",
                         "2 ranks, fraction 1, fetch-ahead, evaluations between steps"]


@pytest.mark.parametrize("label", FETCH_AHEAD_SCENARIOS)
def test_chunks_fetched_ahead_during_the_backward_give_the_same_update(stream_scenarios, label):
    """Fetch-ahead on (MBRIDGE_OFFLOAD_STREAM_FETCH_AHEAD=on), with a stand-in allocator that always has room: every
    chunk after the ring's comes up during each backward from the third step's, once, and is moved into its ring slot
    by the next forward or an evaluation's drain; the weights every module uses and the host's moments are the
    reference's, and no buffer is left. Also with the dense and the experts' engines sharing the room, with two
    pipeline stages of 4 micro batches (a hook per parameter per micro batch), and with evaluations between steps."""
    stream_scenarios.assert_passed("ranks", label)


def test_a_chunk_fetched_ahead_but_not_moved_into_its_slot_is_caught(stream_scenarios):
    stream_scenarios.assert_caught("ranks", "2 ranks, broken: fetch-ahead-no-fill", "forward-weights")


def test_every_scenario_ended_as_it_should(stream_scenarios):
    stream_scenarios.assert_all_ok("ranks")
