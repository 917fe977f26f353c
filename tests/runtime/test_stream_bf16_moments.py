"""The stream engine with Adam's moments in bf16 (MBRIDGE_OFFLOAD_STREAM_MOMENTS=bf16), on the CPU (no GPU here).

stream_cpu_check.py's ``bf16-moments`` scenarios run Megatron Core's real DistributedDataParallel and
DistributedOptimizer over a HybridDeviceOptimizer on 2 gloo ranks with the plugin's real stream engine, and
Transformer Engine's real FusedAdam class built with bf16 moments (its kernel is stream_cpu_device.py's stand-in:
fp32 arithmetic, the moments stored rounded to their dtype, as transformer_engine/common/multi_tensor/adam.cu does).

- The host buffers, the CPU optimizers' states that are views of them, and the ring hold bf16; the host copy of the
  weights stays fp32. A break that leaves the host buffers in fp32 (the update is the same, the host saves nothing)
  is caught by that check.
- Over 4 steps, at fractions 1 and 0.6, and with fetch-ahead (its buffers in bf16): the fp32 shards and the moments follow AdamW whose moments are rounded to
  bf16 after each update (at most 1 in 10^4 elements off; the run prints the count, 0 here), and not fp32 AdamW
  (at least 1 in 10 off; ~94 % of the weights and ~98 % of the moments here): the rounding happens, once per step.
- Checkpoints in Megatron Bridge's format (dp_reshardable, through dist_checkpointing): saved with bf16 moments and
  loaded with bf16 or fp32, and saved with fp32 and loaded with bf16. The weights and the step come back as saved,
  the moments as saved cast to the new dtype, bit for bit, into the engine's buffers, and a step trains after it.
  Right after the load the optimizer's states are still the engine's buffers: torch's Optimizer.load_state_dict (and
  the resume fix's rebinding) would cast each state to its parameter's dtype, an fp32 copy of every moment until the
  next step; the engine keeps them (resume_fix's ``keep_state_dtypes_through_load``). A break that lets torch cast them is
  caught by that check.

What the stand-in hides (its docstring): the real kernel's arithmetic and its dtype dispatch, which the GPU test
tests/runtime/test_gpu_engine.py checks against this same reference arithmetic."""

from __future__ import annotations

import pytest

KIND = "bf16-moments"
TRAINS = ["2 ranks, bf16 moments, fraction 1, overlapped all-gather",
          "2 ranks, bf16 moments, fraction 0.6, all-gather in the step",
          "2 ranks, bf16 moments, fetch-ahead, fraction 1, overlapped all-gather"]
RESUMES = ["2 ranks, saved with bf16 moments, loaded with bf16", "2 ranks, saved with bf16 moments, loaded with fp32",
           "2 ranks, saved with fp32 moments, loaded with bf16"]


@pytest.mark.parametrize("label", TRAINS)
def test_bf16_moments_follow_adamw_with_moments_rounded_each_step(stream_scenarios, label):
    stream_scenarios.assert_passed(KIND, label)


def test_host_buffers_left_in_fp32_are_caught(stream_scenarios):
    stream_scenarios.assert_caught(KIND, "2 ranks, broken: bf16-fp32-host", "moments-dtype")


@pytest.mark.parametrize("label", RESUMES)
def test_a_checkpoint_loads_across_the_moments_dtype(stream_scenarios, label):
    stream_scenarios.assert_passed(KIND, label)


def test_a_load_that_casts_the_moments_to_fp32_is_caught(stream_scenarios):
    stream_scenarios.assert_caught(KIND, "2 ranks, broken: bf16-load-cast", "resume-in-place")


def test_every_bf16_scenario_ends_as_it_should(stream_scenarios):
    stream_scenarios.assert_all_ok(KIND)
