"""Fixes computed with the planner from the run's config and what its log measured: the next optimizer
offload fraction after a CUDA OOM, the largest the host holds after a SIGKILL, the smallest that fits when
full offload is slow. Each returns the override text and how it was computed, or None when it cannot say."""

from __future__ import annotations

import os
from typing import Any

from mbridge_offload.diagnosis.run_facts import OutOfMemory
from mbridge_offload.facts.reserve_rule import FIRST_STEP, FULL_DEVICE, RESERVE_RULE_ENV, SUB_PAGE_GAPS_GIB
from mbridge_offload.facts.units import GIB
from mbridge_offload.planning import largest_host_fitting_fraction, plan, smallest_fitting_fraction, what_would_fit
from mbridge_offload.planning.capacity import H100_80GB_GIB
from mbridge_offload.planning.fraction_search import AUTO_STEP
from mbridge_offload.planning.outside_pytorch import communicator_bytes, communicators, nccl_channels

def current_fraction(cfg: Any) -> float:
    opt = cfg.optimizer
    return float(opt.optimizer_offload_fraction or 0.0) if opt.optimizer_cpu_offload else 0.0


def _switch(fraction: float) -> str:
    return (f"optimizer.optimizer_cpu_offload=True optimizer.optimizer_offload_fraction={fraction:g}" if fraction
            else "optimizer.optimizer_cpu_offload=False")


def _cheapest(options: list[str]) -> list[str]:
    """what_would_fit's options, those that need no more GPUs first."""
    return sorted(options, key=lambda option: "--num-gpus" in option)


def _why_less_free(oom: OutOfMemory | None, expandable: bool, reserve_rule: str) -> str:
    if oom is not None and oom.other_processes_gib:
        return f"other processes held {oom.other_processes_gib:.2f} GiB of it (torch's message)"
    if oom is not None and oom.reserved_unallocated_gib and oom.reserved_unallocated_gib >= oom.requested_gib:
        # the remedy for fragmentation is expandable segments; a run that had them already needs no such advice
        return (f"PyTorch held {oom.reserved_unallocated_gib:.2f} GiB reserved but unallocated, more than the failed "
                "request: fragmentation" + (" despite expandable segments" if expandable else
                                            " (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True is the remedy)"))
    held = oom.reserved_unallocated_gib if oom is not None else None
    if reserve_rule == FULL_DEVICE and held is not None and held > SUB_PAGE_GAPS_GIB:
        # the gaps are remainders of the configuration's tensor sizes, which the rule does not predict
        return (f"PyTorch held {held:.2f} GiB reserved but unallocated, more than the {FULL_DEVICE} reserve rule's "
                f"{SUB_PAGE_GAPS_GIB:g} GiB allowance for the gaps a full device keeps "
                f"({RESERVE_RULE_ENV}={FIRST_STEP} plans more room)")
    return "another process on it (nvidia-smi), or memory outside PyTorch above the plan's"


def _free_the_gpu(larger_fraction: bool) -> str:
    return ("free the GPU of other processes; if it had none, "
            + ("a larger optimizer.optimizer_offload_fraction, " if larger_fraction else "")
            + "a smaller train.micro_batch_size or sequence, or activation offload (plan_offload.py --gpu-memory-gib "
            "<what was free> shows which fits)")


def oom_fix(cfg: Any, num_gpus: int, oom: OutOfMemory | None, expandable: bool,
            planned_gpu_gib: float | None = None) -> tuple[str, str]:
    """The smallest larger fraction that the planner fits on this GPU (with its margin) and that frees at least
    what the failed allocation lacked (the measured part of the need); else the cheapest change that fits.
    ``expandable``: whether the run's allocator had expandable segments (the reserve the plan counts).
    ``planned_gpu_gib``: the GPU size the run's own plan names, used where torch's message does not say it (an
    allocation outside PyTorch failed). When the plan fits the failed run, the GPU had less free than planned:
    the fix says why where the message tells, and with no measured shortfall it asks to free the GPU rather than
    pick a fraction that no number supports."""
    failed = current_fraction(cfg)
    gpu_gib = (oom.capacity_gib if oom and oom.capacity_gib else None) or planned_gpu_gib or H100_80GB_GIB
    shortfall = oom.shortfall_gib if oom else None
    at_failure = plan(cfg, num_gpus, fraction=failed, gpu_memory_gib=gpu_gib, expandable=expandable)
    less_free = ""
    if at_failure.fits_gpu:
        planned = at_failure.total_bytes_gpu / GIB
        less_free = (f"the planner fits fraction {failed:g} on {gpu_gib:.2f} GiB ({planned:.1f} "
                     f"GiB planned, {at_failure.margin_gib:.2f} GiB margin), so the GPU had less free than planned: "
                     + _why_less_free(oom, expandable, at_failure.reserve_rule))
        if shortfall is None:
            return _free_the_gpu(larger_fraction=failed < 1.0), less_free
    lacked = (f"the failed allocation lacked {shortfall:.2f} GiB" if shortfall is not None
              else "how much the failed allocation lacked is not in the log")
    steps = int(round(1 / AUTO_STEP))
    for i in range(1, steps + 1):
        fraction = round(i * AUTO_STEP, 2)
        if fraction <= failed:
            continue
        candidate = plan(cfg, num_gpus, fraction=fraction, gpu_memory_gib=gpu_gib, expandable=expandable)
        freed = (at_failure.total_bytes_gpu - candidate.total_bytes_gpu) / GIB
        if candidate.fits_gpu and freed >= (shortfall or 0.0):
            return _switch(fraction), (
                (f"{less_free}; " if less_free else "")
                + f"planner, {num_gpus} GPU(s) of {gpu_gib:.2f} GiB: fraction {fraction:g} frees {freed:.1f} GiB "
                f"against fraction {failed:g} ({lacked}) and plans {candidate.total_bytes_gpu / GIB:.1f} GiB with "
                f"{candidate.margin_gib:.2f} GiB margin")
    if less_free:
        return _free_the_gpu(larger_fraction=False), less_free
    options = _cheapest(what_would_fit(cfg, num_gpus, gpu_memory_gib=gpu_gib, expandable=expandable))
    if options:
        return options[0], (f"planner: no optimizer offload fraction fits {gpu_gib:.2f} GiB; the cheapest change "
                            f"that does" + (f" (others: {'; '.join(options[1:])})" if options[1:] else ""))
    return ("more GPUs (--num-gpus), or a smaller model/sequence",
            f"planner: neither a fraction nor the usual changes fit {gpu_gib:.2f} GiB")


def fewer_nccl_channels(cfg: Any) -> tuple[str, str] | None:
    """After an allocation outside PyTorch failed: what NCCL_MAX_NCHANNELS=4 would give back, from the planner's
    model of a communicator (planning/outside_pytorch.py); None where the run already has that few channels or NCCL
    allocates through cudaMalloc (no page model there)."""
    env_vars = getattr(cfg, "env_vars", None)
    now = communicator_bytes(env_vars, os.environ)
    fewer = communicator_bytes(env_vars, {**os.environ, "NCCL_MAX_NCHANNELS": "4"})  # the same without cuMem
    if fewer >= now:
        return None
    count = communicators(cfg)
    return ("NCCL_MAX_NCHANNELS=4 in the launch environment",
            f"NCCL's communicators: {count} on this run, {now / GIB:.3f} GiB each at "
            f"{nccl_channels(env_vars, os.environ)} channels, {fewer / GIB:.3f} GiB at 4: "
            f"{count * (now - fewer) / GIB:.2f} GiB less outside PyTorch (measured on one H200: 2.43 -> 1.02 GiB on "
            "the dense proxy); with several GPUs fewer channels also mean less bandwidth between them")


def host_fix(cfg: Any, num_gpus: int, host_gib: float, gpu_gib: float | None,
             expandable: bool) -> tuple[str, str] | None:
    """After a SIGKILL or a failed host allocation: the largest fraction whose first-step host peak fits the node,
    where that is below the fraction that failed. Where the plan fits the failed fraction, the node had less free
    than planned: the fix says so and asks for less host memory, never for more offload than what was killed."""
    failed = current_fraction(cfg)
    fraction, at = largest_host_fitting_fraction(cfg, num_gpus, host_memory_gib=host_gib,
                                                 gpu_memory_gib=gpu_gib or H100_80GB_GIB, expandable=expandable)
    if fraction is None or at is None:
        return None
    if fraction >= failed:
        at_failure = plan(cfg, num_gpus, fraction=failed, host_memory_gib=host_gib,
                          gpu_memory_gib=gpu_gib or H100_80GB_GIB, expandable=expandable)
        smaller = f"a smaller optimizer.optimizer_offload_fraction than {failed:g}, " if failed > 0 else ""
        return ("free the node's memory of other processes; if it had none, " + smaller
                + "fewer ranks per node or more nodes (plan_offload.py --host-memory-gib <what was free> shows "
                "which fits)",
                f"the planner fits fraction {failed:g}'s first-step host peak "
                f"({at_failure.host_peak_bytes_per_node / GIB:.1f} GiB per node) in {host_gib:g} GiB, so the node had "
                "less free than planned: other processes, or this stack's peak above the plan's (raise "
                "--host-margin-gib)")
    gpu_note = "" if at.fits_gpu else "; the GPU does not fit at that fraction: more nodes or GPUs too"
    return _switch(fraction), (f"planner: the largest fraction whose first-step host peak "
                               f"({at.host_peak_bytes_per_node / GIB:.1f} GiB per node) fits {host_gib:g} GiB, below "
                               f"the {failed:g} that failed" + gpu_note)


def slowdown_fix(cfg: Any, num_gpus: int, gpu_gib: float | None, expandable: bool) -> tuple[str, str] | None:
    """After a slow fraction-1 run: the smallest fraction the GPU fits, with the overlap on."""
    gpu = gpu_gib or H100_80GB_GIB
    fraction, fitting = smallest_fitting_fraction(cfg, num_gpus, gpu_memory_gib=gpu, expandable=expandable)
    if fraction is None or fraction >= 1.0:
        return None
    return (_switch(fraction) + (" optimizer.overlap_cpu_optimizer_d2h_h2d=True" if fraction else "")
            + " --cpu-threads auto",
            f"planner: the smallest fraction that fits {gpu:g} GiB"
            + ("" if gpu_gib else " (the planner's default GPU size; the log does not say)")
            + f" plans {fitting.total_bytes_gpu / GIB:.1f} GiB")
