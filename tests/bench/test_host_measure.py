"""Measuring the host the floor model prices (CPU side; the copies need a GPU)."""

from __future__ import annotations

from mbridge_offload.bench.host_measure import measure_host


def test_measure_host_reports_the_cpu_side_without_a_gpu():
    import torch

    host = measure_host([1], size_mib=8)
    assert host["cores"] >= 1 and set(host["host_memory_gbps"]) >= {"1"}
    assert all(v > 0 for v in [*host["host_memory_gbps"].values(), *host["cpu_adam_gbps"].values()])
    assert ("d2h_gbps" in host) == torch.cuda.is_available()
