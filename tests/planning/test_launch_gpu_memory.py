"""run_recipe.py --gpu-memory-gib on a launch: never more than the GPU it trains on (planning/arguments.py)."""

from __future__ import annotations

from mbridge_offload.planning.arguments import launch_gpu_memory_problem

H100_GIB = 79.1787109375  # torch's total memory of an "80GB" H100 (docs/benchmarks/planner-auto-moe/, device_total_gib)


def test_the_makers_gigabytes_are_refused_on_an_h100():
    problem = launch_gpu_memory_problem(80, H100_GIB)
    assert problem and "--gpu-memory-gib 80 " in problem and "79.18" in problem and "leave --gpu-memory-gib out" in problem


def test_less_than_the_gpu_or_no_gpu_or_no_value_is_fine():
    assert launch_gpu_memory_problem(40.36, H100_GIB) is None  # check_auto's device beside a ballast
    assert launch_gpu_memory_problem(H100_GIB, H100_GIB) is None
    assert launch_gpu_memory_problem(141, None) is None  # no GPU here: the launch itself will say so
    assert launch_gpu_memory_problem(None, H100_GIB) is None
