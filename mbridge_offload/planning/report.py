"""A plan in words: the table ``format_plan`` prints, and the problems the plan refuses a launch for."""

from __future__ import annotations

import os

from mbridge_offload.facts.key_ranges import OFFLOAD_FRACTION_KEY as FRACTION_KEY
from mbridge_offload.facts.units import GIB
from mbridge_offload.facts.offload_engine import (BF16_MOMENTS, FP32_MOMENTS, MOMENT_BYTES, STREAM,
                                                  STREAM_MOMENTS_ENV, STREAM_MOMENTS_KEY, stream_host_bytes_per_param)
from mbridge_offload.facts.reserve_rule import FIRST_STEP, FULL_DEVICE
from mbridge_offload.planning.cost_model import HOST_BYTES_PER_OFFLOADED_PARAM
from mbridge_offload.planning.fraction_search import AUTO_OVERRIDE
from mbridge_offload.planning.memory_plan import Plan
from mbridge_offload.validation.problem import Problem



# Why the reserve may be planned high: the allocator kept a free block the size of the loss's tensor beside the peak
# on some held-out runs and not on others, and which is not predicted (docs/benchmarks/planner-auto-4/).
LOSS_TENSOR_RESERVE_NOTE = ("; the size of the loss's largest tensor of a micro batch, a block the allocator kept "
                            "free beside the peak on some measured runs and not on others: where it does not, this "
                            "plan is high by up to that much, and auto may pick a fraction one or more 0.05 steps "
                            "above what trains (docs/benchmarks/planner-auto-4/)")


FIRST_STEP_LOSS_TENSOR_NOTE = ("; the loss's largest tensor of a micro batch beside step 1's memory before the GPU "
                               "part's Adam moments (the first-step and full-device reserve rules: "
                               "docs/benchmarks/reserve-snapshot/)")


def _loss_tensor_note(p: Plan) -> str:
    if not p.allocator_reserve_is_loss_tensor:
        return ""
    return FIRST_STEP_LOSS_TENSOR_NOTE if p.reserve_rule in (FIRST_STEP, FULL_DEVICE) else LOSS_TENSOR_RESERVE_NOTE


def _gib(n: int) -> str:
    return f"{n / GIB:.2f} GiB"


def format_plan(p: Plan) -> str:
    if p.unplanned:
        broken = ", ".join(f"{q.key} = {q.value}" for q in p.unplanned_problems) or p.unplanned
        return (f"  not planned: the plan cannot model {broken} (each problem below names its rule and fix; no "
                "number is given for a run that cannot start as configured)")
    rows = [
        ("optimizer offload fraction", f"{p.fraction:g} ({p.offloaded_params_per_rank / 1e9:.3f}B of "
                                       f"{p.optimizer_params_per_rank / 1e9:.3f}B sharded parameters offloaded)"),
        ("parameters on the worst rank", f"{p.params_per_rank / 1e9:.3f}B"),
        ("GPU: weights + grads + optimizer", f"{_gib(p.weights_bytes_gpu)} + {_gib(p.grads_bytes_gpu)} + "
                                             f"{_gib(p.optimizer_bytes_gpu)} = {_gib(p.state_bytes_gpu)}"),
        ("GPU: activations (peak)", _gib(p.activation_bytes_gpu)),
        ("GPU: whole device", f"{_gib(p.allocated_bytes_gpu)} allocated by PyTorch (with workspaces) + "
                              f"{_gib(p.allocator_reserve_bytes_gpu)} its allocator's reserve ("
                              f"{'expandable' if p.allocator_expandable_segments else 'fixed'} segments"
                              f"{_loss_tensor_note(p)}) + "
                              f"{_gib(p.outside_pytorch_bytes_gpu)} outside PyTorch (CUDA context and libraries, "
                              f"{p.nccl_communicators} NCCL communicators of {_gib(p.nccl_communicator_bytes_gpu)}) = "
                              f"{_gib(p.total_bytes_gpu)}"),
        ("GPU: fit", f"{_gib(p.total_bytes_gpu)} + {p.margin_gib:.2f} GiB margin ({p.margin_source}) of "
                     f"{p.gpu_memory_gib:g} GiB: {'fits' if p.fits_gpu else 'DOES NOT FIT'}"),
        ("host: offloaded per rank", f"{_gib(p.offloaded_bytes_host_per_rank)} "
                                     f"({_gib(p.pinned_bytes_host_per_rank)} pinned)"),
        ("host: per node", f"{_host_peak_text(p)}, for {p.ranks_per_node} rank(s)"
                           + ("" if p.fits_host is None else
                              f" of {p.host_memory_gib:g} GiB, margin {p.host_margin_gib:g} GiB per rank: "
                              f"{'fits' if p.fits_host else 'DOES NOT FIT'}")),
        ("host link per step", f"{p.transfer_bytes_per_step / 1e9:.2f} GB, >= {p.transfer_time_lower_bound_s:.3f} s "
                               f"at {p.host_link_gbps:g} GB/s"),
        ("offload time per step", f">= {p.offload_time_lower_bound_s:.3f} s, bound by {p.offload_time_bound_by} " + (
            f"(offload engine stream: Adam on the GPU, {2 * MOMENT_BYTES[p.stream_moments]} B of moments "
            f"({p.stream_moments}) per offloaded parameter up and as many down "
            f"at {p.host_link_gbps:g} GB/s per link, after the backward; the next forward hides them only until it "
            "reaches a layer whose chunks are not back: on the 4-layer MoE proxy it waited at every MoE layer, "
            "docs/benchmarks/offload-engine/stream-moe-profile/; no CPU Adam)"
            if p.offload_engine == STREAM else
            f"({HOST_BYTES_PER_OFFLOADED_PARAM} B of CPU Adam per offloaded parameter x "
            f"{p.ranks_per_node} rank(s) through the cores' {p.host_memory_gbps:g} GB/s of host "
            f"memory, and with the copies through {p.host_memory_total_gbps:g} GB/s in all; "
            f"copies at {p.host_link_gbps:g} GB/s per link)")),
        ("recommendation", p.recommendation),
    ]
    if len(p.stages) > 1:
        rows.insert(5, ("GPU per pipeline stage", ", ".join(
            f"stage {s.stage}: {s.total_bytes_gpu / GIB:.1f} GiB" for s in p.stages)))
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"  {name:<{width}}  {value}" for name, value in rows + [("note", n) for n in p.notes])


def _host_peak_text(p: Plan) -> str:
    """The node's host memory between steps and at the first optimizer step's peak: the same figure where the plan
    adds no first-step transient (dense models, the stream engine, nothing offloaded: memory_plan.py) and the data
    loader's batch being pinned adds nothing (no workers, data_loader.py)."""
    loader = p.data_loader_transient_bytes_host_per_rank * p.ranks_per_node
    if p.host_peak_bytes_per_node == p.host_bytes_per_node:
        return (f"{_gib(p.host_bytes_per_node)} between steps and at the first optimizer step's peak (no first-step "
                f"transient planned: measured on MoE models with a CPU optimizer only)")
    if p.host_peak_bytes_per_node == p.host_bytes_per_node + loader:
        return (f"{_gib(p.host_bytes_per_node)} between steps, {_gib(p.host_peak_bytes_per_node)} at the peak "
                f"(the data loader's batch being pinned; no first-step transient planned: measured on MoE models "
                f"with a CPU optimizer only)")
    return (f"{_gib(p.host_bytes_per_node)} between steps, {_gib(p.host_peak_bytes_per_node)} at the first optimizer "
            f"step's peak (the MoE models' first-step growth, which the node held outside the processes' RSS until "
            f"training ended where it was measured, and the data loader's batch being pinned)")


def _bf16_moments_fix(p: Plan) -> str:
    """The stream engine's bf16 moments where they would make this fraction fit the host ("" where they would not, or
    where the plan is not the stream engine's with fp32 moments): 4 bytes less per offloaded parameter."""
    if p.offload_engine != STREAM or p.stream_moments != FP32_MOMENTS or p.host_memory_gib is None:
        return ""
    saved = (stream_host_bytes_per_param(FP32_MOMENTS) - stream_host_bytes_per_param(BF16_MOMENTS)) * \
        p.offloaded_params_per_rank * p.ranks_per_node
    peak = p.host_peak_bytes_per_node - saved
    if peak + p.ranks_per_node * p.host_margin_gib * GIB > p.host_memory_gib * GIB:
        return ""
    # a value in the launch shell wins over the config's: the override would change nothing there
    setting = (f"{STREAM_MOMENTS_ENV}={BF16_MOMENTS} in the launch shell (its {FP32_MOMENTS} wins over the config)"
               if STREAM_MOMENTS_ENV in os.environ else f"++{STREAM_MOMENTS_KEY}={BF16_MOMENTS}")
    return (f"{setting} at this fraction (the node's peak {_gib(peak)}: Adam's moments in bf16 on the host, not "
            "bit-identical to no offload); or ")


def _host_fit_fix(p: Plan) -> str:
    return _bf16_moments_fix(p) + _fraction_fix(p)


def _fraction_fix(p: Plan) -> str:
    more = ("fewer ranks per node or more nodes; free host memory if other processes hold it "
            "(--host-margin-gib to change the margin)")
    largest = p.host_fitting_fraction
    if not p.host_fit_searched:  # a plan made without plan_with_recommendation's search
        return f"a smaller {FRACTION_KEY}, {more}"
    if largest is None:
        return f"not even without optimizer offload does this host fit: {more}, or less activation offload"
    if p.host_fitting_fraction_fits_gpu:
        return (f"{FRACTION_KEY}={largest:g} (the largest that fits this host; the GPU "
                f"fits too), or {more}")
    return (f"no fraction fits both: this host holds at most {FRACTION_KEY}={largest:g} and "
            f"the GPU needs more; {more}, or more GPUs (less on each)")


def plan_problems(p: Plan, step_time_budget_s: float | None) -> list[Problem]:
    """What the plan refuses, as problems of source "planner": host overflow and the offload-time budget
    are errors; a predicted GPU overflow is a warning (a prediction, within ~10% of measurements)."""
    if p.unplanned:  # what the planner cannot model (plannable.py), each an error naming key, value, rule and fix
        return list(p.unplanned_problems)
    problems = []
    if p.fits_host is False:
        problems.append(Problem(
            rule_id="memory/host-fit", key=FRACTION_KEY,
            value=(f"{p.fraction:g} ({p.host_peak_bytes_per_node / GIB:.1f} GiB per node at the first optimizer "
                   + (f"step's peak, {p.host_bytes_per_node / GIB:.1f} GiB between steps)"
                      if p.host_peak_bytes_per_node != p.host_bytes_per_node else "step's peak, as between steps)")),
            rule=(f"the node's peak host memory plus {p.host_margin_gib:g} GiB margin per rank must fit the "
                  f"{p.host_memory_gib:.1f} GiB {p.host_memory_source} (the kernel kills the job otherwise)"),
            fix=_host_fit_fix(p), severity="error", source="planner"))
    if step_time_budget_s is not None and p.offload_time_lower_bound_s > step_time_budget_s:
        problems.append(Problem(
            rule_id="memory/offload-time-budget", key=FRACTION_KEY,
            value=f"{p.fraction:g} ({p.offloaded_params_per_rank / 1e9:.3f}B parameters offloaded per rank)",
            rule=(f"the offload work needs at least {p.offload_time_lower_bound_s:.3f} s per step, bound by "
                  f"{p.offload_time_bound_by} ({p.host_link_gbps:g} GB/s link, {p.host_memory_gbps:g} GB/s host "
                  f"memory for {p.ranks_per_node} rank(s)), over the {step_time_budget_s:g} s budget"),
            fix=f"a smaller {FRACTION_KEY}, fewer ranks per node, or a larger --step-time-budget-s",
            severity="error", source="planner"))
    if not p.fits_gpu:
        problems.append(Problem(
            rule_id="memory/gpu-fit", key=FRACTION_KEY,
            value=f"{p.fraction:g} ({p.total_bytes_gpu / GIB:.1f} GiB predicted)",
            rule=f"predicted GPU memory plus {p.margin_gib:.2f} GiB margin exceeds {p.gpu_memory_gib:g} GiB",
            fix=p.recommendation or AUTO_OVERRIDE, severity="warning", source="planner"))
    return problems
