"""The stream offload engine across a checkpoint load, on the CPU (no GPU here): ``_adopt_states``.

stream_cpu_check.py runs 2 ranks on gloo (the model, optimizer and engine of test_stream_ranks.py: Megatron
Core's real DDP and DistributedOptimizer over a HybridDeviceOptimizer, the plugin's install_resume_fix() and
install("stream")), trains 2 steps, saves as Megatron Bridge does (the plugin's drain, Bridge's
force_param_sync, the optimizer's dp_reshardable sharded state dict through dist_checkpointing), trains 2 more
(the uninterrupted run), then loads and trains the same 2 steps again:

- Megatron Bridge's load (model weights, the optimizer's sharded state dict for loading, dist_checkpointing.load,
  optimizer.load_state_dict: the real DistributedOptimizer load with install_resume_fix's hooks), into a newly
  built model and optimizer with other initial weights (a restarted job) and into the running optimizer, whose
  host buffers hold the later state;
- torch's load_state_dict of the HybridDeviceOptimizer (every state tensor replaced by the loaded one), the fp32
  shards copied in as Megatron's load does.

After each, the weights every forward uses, the weights after the last update, each rank's fp32 shards, Adam's
moments on the host and the step equal the uninterrupted run's bit for bit, and torch AdamW's on the full tensors
within rounding; the optimizer's states are the engine's host buffers again. With the adoption disabled after
the build, both loads train on from the wrong state (the check fails at the first update after the load).

What the adoption does in each: Megatron's load copies the moments into the state tensors that are already the
engine's buffers (in place), and replaces only the step; torch's replaces the moments too, so only it needs the
copy (a local check: an adoption that rebinds without copying passes Megatron's load and fails torch's).

The GPU is stream_cpu_device.py's stand-in (what it cannot see: test_stream_ranks.py's docstring); the
checkpoint is written to and read from a temporary folder with dist_checkpointing's torch_dist format, not
through Bridge's save_checkpoint / load_checkpoint (the run's config, RNG and iteration are not part of it).
~2 min here: ~55 s of it imports Megatron Bridge, once, in the process that forks the ranks.
"""

from __future__ import annotations

import pytest

SCENARIOS = ["2 ranks, Megatron's load into a new model and optimizer",
             "2 ranks, Megatron's load into the running optimizer",
             "2 ranks, torch's load_state_dict into a new optimizer"]
BROKEN = ["2 ranks, broken: no adoption after Megatron's load", "2 ranks, broken: no adoption after torch's load"]


@pytest.mark.parametrize("label", SCENARIOS)
def test_the_update_after_a_load_is_the_one_from_the_loaded_state(stream_scenarios, label):
    stream_scenarios.assert_passed("resume", label)


@pytest.mark.parametrize("label", BROKEN)
def test_without_adoption_the_update_after_a_load_is_wrong(stream_scenarios, label):
    line = stream_scenarios.assert_caught("resume", label, "resume-forward-weights")
    assert "forward 2 after the load" in line, line  # forward 1 uses the loaded weights: the first update is wrong


def test_every_scenario_ended_as_it_should(stream_scenarios):
    stream_scenarios.assert_all_ok("resume")
