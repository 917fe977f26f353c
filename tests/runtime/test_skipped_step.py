"""A skipped optimizer step with each offload engine, on the CPU (no GPU here).

An fp16 run's loss scaler skips a step whose gradients hold an inf or a NaN: Megatron's distributed optimizer checks
them (all-reduced over the ranks) and returns before its HybridDeviceOptimizer's step, so the engine's step never
runs that step. stream_cpu_scenarios.py's ``skipped_step_case`` trains 5 steps on 2 gloo ranks (Megatron Core's real
DistributedDataParallel and distributed optimizer with its constant loss scaler, the plugin's engine and threads on
the CPU stand-in for the GPU), with an inf in one rank's gradient at step 3, and checks on each rank:

- only step 3 reports no update, and it leaves the engine's pending update as it was;
- every forward uses the weights the engine promises counted in updates: after every earlier update (exact,
  stream), the offloaded elements one update behind (delayed);
- after the drain, the weights, every shard, moment, host copy and Adam's step count equal torch AdamW's that
  skipped the same step.

With the gradient buffers zeroed by region (the exact and delayed engines), a step that follows the skip has no
copies pending on the buffers; a zeroing that then zeroes nothing keeps the inf, and every later step is skipped
too: that broken engine is caught.
"""

from __future__ import annotations

import pytest

LABELS = ["2 ranks, fraction 0.6, overlapped all-gather, a skipped step",
          "2 ranks, fraction 1, all-gather in the step, a skipped step"]
KINDS = {"ranks": "", "exact-ranks": "", "delayed-ranks": "", "exact-by-region": ", by region",
         "delayed-by-region": ", by region"}


@pytest.mark.parametrize("kind, label", [(kind, label + suffix) for kind, suffix in KINDS.items() for label in LABELS])
def test_a_skipped_step_leaves_the_pending_update_and_counts_no_update(stream_scenarios, kind, label):
    stream_scenarios.assert_passed(kind, label)


@pytest.mark.parametrize("kind", ["exact-by-region", "delayed-by-region"])
def test_a_zeroing_that_zeroes_only_after_an_update_misses_a_skipped_step_and_is_caught(stream_scenarios, kind):
    stream_scenarios.assert_caught(kind, "2 ranks, broken: region-zero-only-after-update", "skipped-steps")
