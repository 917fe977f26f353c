"""The inside-step host peaks the metrics keep, and the freed heap given back (mbridge_offload/runtime/host_memory.py)."""

from __future__ import annotations

import threading

import pytest

from mbridge_offload.facts.units import GIB
from mbridge_offload.runtime.host_memory import (NodeUsedPeak, make_heap_release_callback, node_used_bytes,
                                                 release_free_heap, rss_high_water_bytes)

linux_proc = pytest.mark.skipif(node_used_bytes() is None, reason="needs Linux /proc")


@linux_proc
def test_rss_high_water_keeps_a_peak_that_is_gone():
    before = rss_high_water_bytes()
    block = bytearray(512 * 1024**2)
    block[::4096] = b"\x01" * len(block[::4096])  # touch every page: resident now
    held = rss_high_water_bytes()
    del block
    assert held - before > 256 * 1024**2 or before > 512 * 1024**2
    # freed, and still the high-water mark (the kernel's RSS counters are approximate by a few pages)
    assert rss_high_water_bytes() >= held - 16 * 1024**2


@linux_proc
def test_node_used_is_this_node_s_memory():
    assert 0 < node_used_bytes() / GIB < 100_000


def _sampled(readings_gib: list[float]) -> NodeUsedPeak:
    """A sampler run over ``readings_gib`` (one per sample; the last repeats once they are used up), stopped."""
    readings = iter(readings_gib)
    done = threading.Event()

    def read():
        value = next(readings, None)
        if value is None:
            done.set()
            return int(readings_gib[-1] * GIB)
        return int(value * GIB)

    sampler = NodeUsedPeak(interval_s=0.001, read=read).start()
    assert done.wait(5)
    sampler.stop()
    return sampler


def test_node_peak_keeps_a_rise_that_lasted_between_step_ends():
    # readings of MemTotal - MemAvailable as the H200's 7-layer run gave them, one per sample (GiB):
    # the rise inside the first optimizer step, then back down before the step ends
    sampler = _sampled([79.3, 94.4, 116.0, 116.1, 95.6, 95.6])
    assert sampler.peak_bytes() == int(116.1 * GIB)


def test_node_peak_without_proc_is_none():
    sampler = NodeUsedPeak(interval_s=0.001, read=lambda: None).start()
    sampler.stop()
    assert sampler.peak_bytes() is None


@linux_proc
def test_the_heap_freed_between_live_blocks_goes_back_to_the_os():
    """CPU tensors of 100 kB come from glibc's heap (below its mmap threshold); every other one freed leaves holes
    that stay resident until released. Fresh blocks, so earlier tests' heap does not count."""
    import torch

    if release_free_heap() is None:
        pytest.skip("the C library has no malloc_trim")
    blocks = [torch.ones(25_000) for _ in range(8_000)]  # 800 MB
    del blocks[::2]  # 400 MB freed, each hole between two live blocks
    released = release_free_heap()
    assert released > 200 * 1024**2, released
    assert len(blocks) == 4_000 and float(blocks[-1][0]) == 1.0  # the live blocks untouched


def test_the_release_runs_after_setup_and_each_save_and_says_so(built, capsys):
    from megatron.bridge.training.callbacks import Callback

    callback = make_heap_release_callback(rank=0)
    assert isinstance(callback, Callback)
    callback.on_train_start(None)
    assert "of heap freed during setup returned to the OS" in capsys.readouterr().out
    callback.on_checkpoint_save(None)  # quiet
    assert capsys.readouterr().out == ""
    make_heap_release_callback(rank=1).on_train_start(None)
    assert capsys.readouterr().out == ""


def test_the_sampler_keeps_the_node_s_use_at_its_start_apart_from_its_peak():
    sampler = _sampled([3.0, 9.0, 30.0, 12.0])
    assert sampler.start_bytes == int(3.0 * GIB)
    assert sampler.peak_bytes() == int(30.0 * GIB)


def test_the_summary_says_what_the_node_held_before_the_run(tmp_path):
    """The node's peak less what other processes held at the start is the run's share: the figure the plan's host
    peak per node is compared with (planner-auto-moe/ had to bound it from MemAvailable at launch)."""
    import json

    from mbridge_offload.runtime.metrics import format_summary, node_before_run_record, step_records_file, summarize

    before = node_before_run_record(int(5.5 * GIB), int(1.5 * GIB))
    assert before == {"node_host_used_before_run_gib": 4.0}
    assert node_before_run_record(None, int(1.5 * GIB)) == {}
    steps = [{"step": 1, "step_time_s": 2.0, "loss": 11.0, "node_host_used_peak_gib": 30.0, **before},
             {"step": 2, "step_time_s": 1.0, "loss": 10.9, "node_host_used_peak_gib": 31.0}]
    step_records_file(tmp_path, 0).write_text("".join(json.dumps(s) + "\n" for s in steps))
    summary = summarize(tmp_path)
    assert summary["peak_node_host_used_gib"] == 31.0
    assert summary["node_host_used_before_run_gib"] == 4.0
    assert "of which in use before the run" in format_summary(summary)
