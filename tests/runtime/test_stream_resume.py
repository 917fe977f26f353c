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

import subprocess
import sys
from pathlib import Path

import pytest

CHECK = Path(__file__).with_name("stream_cpu_check.py")
SCENARIOS = ["2 ranks, Megatron's load into a new model and optimizer",
             "2 ranks, Megatron's load into the running optimizer",
             "2 ranks, torch's load_state_dict into a new optimizer"]
BROKEN = ["2 ranks, broken: no adoption after Megatron's load", "2 ranks, broken: no adoption after torch's load"]


@pytest.fixture(scope="module")
def resume_run():
    return subprocess.run([sys.executable, str(CHECK), "resume"], capture_output=True, text=True, timeout=900)


def _line(done, label: str) -> str:
    lines = [line for line in done.stdout.splitlines() if f"] {label}: " in line]
    assert len(lines) == 1, done.stdout[-4000:] + done.stderr[-4000:]
    return lines[0]


@pytest.mark.parametrize("label", SCENARIOS)
def test_the_update_after_a_load_is_the_one_from_the_loaded_state(resume_run, label):
    line = _line(resume_run, label)
    assert line.startswith("OK ") and line.endswith(": passed"), line


@pytest.mark.parametrize("label", BROKEN)
def test_without_adoption_the_update_after_a_load_is_wrong(resume_run, label):
    line = _line(resume_run, label)
    assert line.startswith("OK ") and "check: resume-forward-weights:" in line, line
    assert "forward 2 after the load" in line, line  # forward 1 uses the loaded weights: the first update is wrong


def test_every_scenario_ended_as_it_should(resume_run):
    assert resume_run.returncode == 0 and resume_run.stdout.rstrip().endswith("ALL OK"), \
        resume_run.stdout[-4000:] + resume_run.stderr[-4000:]
