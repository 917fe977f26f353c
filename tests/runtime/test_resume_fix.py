"""The resume fix on the CPU: megatron-core's real HybridDeviceOptimizer and DistributedOptimizer save/load
methods, run by resume_fix_cpu_check.py in a process of its own (it stubs CUDA streams for that process).
Without the fix the load fails as users see it (KeyError in _update_fp32_params_by_new_state); upstream's
own `.get()` fix alone resumes from the wrong weights; with the fix a resumed run equals the uninterrupted
one bit for bit (weights, fp32 masters, CPU copies, Adam moments, step counters)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

CHECK = Path(__file__).with_name("resume_fix_cpu_check.py")


def _check(*flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(CHECK), *flags], capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("flags", [(), ("--chunks", "3"), ("--cross", "--bridge"), ("--pao",)],
                         ids=["stock", "chunked", "other-fraction-and-bridge-sync", "precision-aware"])
def test_resume_with_the_fix_is_bit_exact(flags):
    done = _check(*flags)
    assert done.returncode == 0 and "ALL OK" in done.stdout, done.stdout + done.stderr
    assert "bit-exact=True" in done.stdout


def test_without_the_fix_resume_fails_as_upstream_does():
    done = _check("--nofix")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "KeyError" in done.stdout


def test_upstreams_get_fix_alone_resumes_from_the_wrong_state():
    done = _check("--getonly")
    assert done.returncode == 1 and "bit-exact=False" in done.stdout, done.stdout + done.stderr
