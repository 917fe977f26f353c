"""The exact offload engine with several data-parallel ranks, on the CPU (no GPU here).

stream_cpu_check.py exact-ranks runs 2 processes on gloo, each a rank of Megatron Core's real
DistributedDataParallel (several buckets, each its own bucket group and parameter all-gather) and
get_megatron_optimizer (the DistributedOptimizer over a HybridDeviceOptimizer with the library's CPU optimizers),
with the plugin's real install_resume_fix() and streaming_engine.install("exact"): the CPU Adam on the engine's
worker thread, each module's forward waiting for its own chunks, each bucket group's all-gather waiting for this
rank's chunks in it (``gate_param_gather``). It trains the 12.6M-parameter model of stream_cpu_scenarios.py 3 steps
(fraction 0.6 with the all-gather overlapped with the forward, fraction 1 with the all-gather in the step). Each
rank checks:

- every module's forward, on every rank, used the weights of torch AdamW on the full fp32 tensors after all
  earlier updates, with the ranks' mean gradient clipped by its global norm (the other ranks' shards came through
  Megatron's all-gather after their update);
- each step left its update pending on the worker;
- each bucket group's all-gather waited for exactly the chunks holding this rank's offloaded shards of its
  parameters;
- after ``drain_all``, every rank holds the whole weights after the last update, and every fp32 shard, the host
  copies of the offloaded ones and the Adam moments equal the reference's;
- a broken engine is caught: with ``gate_param_gather`` a no-op and the worker slowed, a forward uses stale
  weights of the other rank.

The GPU is stream_cpu_device.py's stand-in (what that hides: its docstring); the worker thread and its waits are
real. The delayed engine's several-rank path has scenarios of its own (test_delayed_ranks.py).

Across a checkpoint (``engine_resume_case``): 2 steps, a save as Megatron Bridge does it (the plugin's drain,
force_param_sync, the optimizer's dp_reshardable sharded state dict through dist_checkpointing), 2 more steps (the
uninterrupted run), then Megatron Bridge's load in its order (the plugin's drain, which wraps Bridge's
load_checkpoint; the optimizer's sharded state dict, which drains too; dist_checkpointing.load; the model's
weights; the optimizer's real load with install_resume_fix's hooks) and the same 2 steps again: into a newly
built model and optimizer with other initial weights (a restarted job), into the running optimizer, and into the
running optimizer with the next step's update still pending on the worker. Every forward's weights, the weights
after the last update, every fp32 shard, moment, step and host copy equal the uninterrupted run's bit for bit and
torch AdamW's within rounding; a load that does nothing is caught at the first forward after it.
"""

from __future__ import annotations

import pytest

SCENARIOS = ["2 ranks, fraction 0.6, overlapped all-gather", "2 ranks, fraction 1, all-gather in the step"]


@pytest.mark.parametrize("label", SCENARIOS)
def test_exact_engine_on_several_ranks_updates_each_shard_as_adamw_on_the_full_tensors(stream_scenarios, label):
    stream_scenarios.assert_passed("exact-ranks", label)


def test_an_all_gather_that_does_not_wait_for_the_exact_update_is_caught(stream_scenarios):
    stream_scenarios.assert_caught("exact-ranks", "2 ranks, broken: no-gather-gate, slow worker", "forward-weights")


def test_the_exact_engine_resumes_bit_for_bit_and_a_load_that_does_nothing_is_caught(stream_scenarios,
                                                                                      engine_resume_label):
    stream_scenarios.assert_engine_resumes("exact-ranks", engine_resume_label)


def test_every_exact_scenario_ended_as_it_should(stream_scenarios):
    stream_scenarios.assert_all_ok("exact-ranks")
