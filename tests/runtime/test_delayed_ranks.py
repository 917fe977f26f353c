"""The delayed offload engine with several data-parallel ranks, on the CPU (no GPU here).

stream_cpu_check.py delayed-ranks runs 2 processes on gloo, each a rank of Megatron Core's real
DistributedDataParallel and get_megatron_optimizer (the DistributedOptimizer over a HybridDeviceOptimizer with the
library's CPU optimizers), with the plugin's real install_resume_fix() and streaming_engine.install("delayed"): step
k's CPU Adam on the engine's worker thread during step k+1. It trains the 12.6M-parameter model of
stream_cpu_scenarios.py 3 steps (fraction 0.6 with the all-gather overlapped with the forward, fraction 1 with it
in the step), then does what a save or an evaluation does first, then one more step. Each rank checks:

- every module's forward, on every rank, used the offloaded elements after update k-2 and the rest (updated on the
  GPU in their step) after update k-1, of torch AdamW on the full fp32 tensors with the ranks' mean gradient
  clipped by its global norm: the ranks stay alike one step behind;
- after the drain of a save or an evaluation (the plugin's wrapper of save_checkpoint_and_time and
  evaluate_and_print_results; or Megatron Bridge's parameter sync, which its evaluation runs first with the
  overlapped all-gather) every rank holds the whole weights after the last update, and the next step's forward
  uses them;
- every fp32 shard, host copy and moment equals the reference's after each drain;
- a broken engine is caught: a drain that applies this rank's shards without the all-gather leaves each rank
  with the other rank's shards one update behind.

The GPU is stream_cpu_device.py's stand-in (what that hides: its docstring); the worker thread and its waits are
real.

Across a checkpoint, as test_exact_ranks.py's docstring says with the exact engine, the delayed engine resumes
bit for bit (a save applies its pending update first, in the uninterrupted run too).
"""

from __future__ import annotations

import pytest

SCENARIOS = ["2 ranks, fraction 0.6, overlapped all-gather, drained", "2 ranks, fraction 1, all-gather in the step, drained",
             "2 ranks, fraction 1, overlapped all-gather, Bridge's parameter sync"]


@pytest.mark.parametrize("label", SCENARIOS)
def test_delayed_engine_on_several_ranks_stays_one_step_behind_alike_and_applies_at_a_save(stream_scenarios, label):
    stream_scenarios.assert_passed("delayed-ranks", label)


def test_a_save_that_applies_the_delayed_update_without_the_all_gather_is_caught(stream_scenarios):
    stream_scenarios.assert_caught("delayed-ranks", "2 ranks, broken: no-gather", "applied-weights")


def test_the_delayed_engine_resumes_bit_for_bit_and_a_load_that_does_nothing_is_caught(stream_scenarios,
                                                                                      engine_resume_label):
    stream_scenarios.assert_engine_resumes("delayed-ranks", engine_resume_label)


def test_every_delayed_scenario_ended_as_it_should(stream_scenarios):
    stream_scenarios.assert_all_ok("delayed-ranks")
