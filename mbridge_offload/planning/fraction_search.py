"""Searching the offload fraction: the smallest the GPU fits, the largest the host holds, and what else
would fit when no fraction does. Fractions are tried in steps of 0.05, each with a whole plan."""

from __future__ import annotations

import copy
import dataclasses
import functools

from mbridge_offload.facts.config_tree import set_path
from mbridge_offload.facts.units import GIB
from mbridge_offload.planning.memory_plan import Plan, plan
from mbridge_offload.planning.plannable import one_search, unplannable_text

AUTO_STEP = 0.05
AUTO_OVERRIDE = "optimizer.optimizer_offload_fraction=auto"  # resolved by the planner


def _fractions(descending: bool = False) -> list[float]:
    """0, 0.05, ..., 1 (rounded, so that they print as typed)."""
    steps = range(int(round(1 / AUTO_STEP)) + 1)
    return [round(i * AUTO_STEP, 2) for i in (reversed(steps) if descending else steps)]


def _searching(function):
    """``function`` with the rule table asked once per config it plans (plannable.one_search), not per fraction."""

    @functools.wraps(function)
    def searching(*args, **kwargs):
        with one_search():
            return function(*args, **kwargs)

    return searching


@_searching
def smallest_fitting_fraction(cfg, num_gpus: int, **kwargs) -> tuple[float | None, Plan]:
    """The smallest fraction (steps of 0.05) whose plan fits the GPU with the margin. A config the planner cannot
    model gives its empty plan at fraction 0 (``Plan.unplanned``: its problems refuse it, plan_problems); one whose
    launch is refused only with optimizer offload on (the distributed optimizer off, another optimizer) gives the
    empty plan of the first fraction that needs it: no fraction past it is a launch either."""
    last = None
    for fraction in _fractions():
        last = plan(cfg, num_gpus, fraction=fraction, **kwargs)
        if last.unplanned or last.fits_gpu:
            return fraction, last
    return None, last


@_searching
def largest_host_fitting_fraction(cfg, num_gpus: int, **kwargs) -> tuple[float | None, Plan | None]:
    """The largest fraction (steps of 0.05) whose host peak fits the node, with its plan, of the fractions whose
    launch the planner plans (optimizer offload refused by a rule leaves fraction 0)."""
    for fraction in _fractions(descending=True):
        candidate = plan(cfg, num_gpus, fraction=fraction, **kwargs)
        if candidate.unplanned:  # no launch, no host figure to fit
            continue
        if candidate.fits_host is not False:
            return candidate.fraction, candidate
    return None, None


def _rule_errors(cfg, num_gpus: int) -> set[str]:
    """The rule table's errors of ``cfg`` on ``num_gpus`` GPUs (validation.check_rules), by rule id."""
    from mbridge_offload.validation import Context, check_rules

    return {p.rule_id for p in check_rules(Context(cfg=cfg, num_gpus=num_gpus)) if p.severity == "error"}


@_searching
def what_would_fit(cfg, num_gpus: int, **kwargs) -> list[str]:
    """Changes that make a plan fit when no offload fraction does (each checked with the planner, and none that breaks
    a rule of the validator's table the config did not break already)."""

    def what_if(deltas: dict):  # a changed copy, not logged: nothing is applied to the user's config
        changed = copy.deepcopy(cfg)
        for key, value in deltas.items():
            set_path(changed, key, value)
        return changed

    m = cfg.model
    options = []
    tries = [
        (f"{num_gpus * 2} GPUs (--num-gpus {num_gpus * 2}, twice the data parallelism)", cfg, num_gpus * 2),
    ]
    if m.num_layers % (m.pipeline_model_parallel_size * 2) == 0:
        deeper = {"model.pipeline_model_parallel_size": m.pipeline_model_parallel_size * 2}
        if m.cpu_offloading:  # layer-level activation offload needs one stage (activation-offload/pipeline-parallel)
            deeper["model.cpu_offloading"] = False
        tries.append((" ".join(f"{key}={value}" for key, value in deeper.items()) + f" with --num-gpus {num_gpus * 2}",
                      what_if(deeper), num_gpus * 2))
    if cfg.train.micro_batch_size > 1:
        tries.append(("train.micro_batch_size=1", what_if({"train.micro_batch_size": 1}),
                      num_gpus))
    if m.recompute_granularity != "full":  # every layer's activations recomputed: its input kept, nothing else
        full = {"model.recompute_granularity": "full", "model.recompute_method": "uniform",
                "model.recompute_num_layers": 1}
        if m.cpu_offloading:  # layer-level activation offload refuses recompute (activation-offload/recompute)
            full["model.cpu_offloading"] = False
        tries.append((" ".join(f"{key}={value}" for key, value in full.items()), what_if(full), num_gpus))
    if m.context_parallel_size == 1:  # each GPU holds half of every sequence's activations
        tries.append((f"model.context_parallel_size=2 with --num-gpus {num_gpus * 2}",
                      what_if({"model.context_parallel_size": 2}), num_gpus * 2))
    if m.pipeline_model_parallel_size == 1 and not m.cpu_offloading and not m.fine_grained_activation_offloading:
        tries.append((f"activation offload: model.cpu_offloading=True model.cpu_offloading_num_layers={m.num_layers - 1}",
                      what_if({"model.cpu_offloading": True, "model.cpu_offloading_num_layers": m.num_layers - 1}),
                      num_gpus))
    already = _rule_errors(cfg, num_gpus)
    for text, candidate, gpus in tries:
        if _rule_errors(candidate, gpus) - already:  # the change breaks a rule (activation offload with recompute...)
            continue
        fraction, fitting = smallest_fitting_fraction(candidate, gpus, **kwargs)
        if fraction is not None and not fitting.unplanned:  # a change the run could not have is no option
            options.append(f"{text} (then fits at fraction {fraction:g})")
    return options


@_searching
def recommend(cfg, num_gpus: int, **kwargs) -> str:
    """The smallest fitting fraction in words, or what would fit when none does, or what refuses the launch at the
    fraction the GPU needs."""
    fraction, fitting = smallest_fitting_fraction(cfg, num_gpus, **kwargs)
    if fitting.unplanned:
        return (f"the GPU needs optimizer offload fraction {fraction:g} or more, and that launch is refused: "
                + unplannable_text(fitting.unplanned_problems))
    if fraction is None:
        options = what_would_fit(cfg, num_gpus, **kwargs)
        return ("does not fit even with all optimizer states on the CPU"
                + (": try " + "; or ".join(options) if options else ""))
    if fraction == 0.0 and fitting.fits_host is False:
        return ("the GPU fits without optimizer offload, and the host does not hold even that "
                "(see memory/host-fit)")
    if fraction == 0.0:
        return "fits without optimizer offload"
    if fitting.fits_host is False:
        return (f"the GPU needs optimizer offload fraction {fraction:g} or more, and the host holds less "
                "(see memory/host-fit)")
    return (f"smallest optimizer offload fraction that fits: {fraction:g} "
            f"({fitting.total_bytes_gpu / GIB:.1f} GiB of {fitting.gpu_memory_gib:g} GiB with "
            f"{fitting.margin_gib:.2f} GiB margin)")


@_searching
def plan_with_recommendation(cfg, num_gpus: int, fraction: float | None = None, **kwargs) -> Plan:
    """plan() plus its recommendation (the smallest fitting fraction, or what would fit), and, where the
    host does not fit, the largest fraction it holds."""
    result = plan(cfg, num_gpus, fraction=fraction, **kwargs)
    if result.unplanned:
        return result
    result = dataclasses.replace(result, recommendation=recommend(cfg, num_gpus, **kwargs))
    if result.fits_host is False:
        largest, at_largest = largest_host_fitting_fraction(cfg, num_gpus, **kwargs)
        result = dataclasses.replace(
            result, host_fit_searched=True, host_fitting_fraction=largest,
            host_fitting_fraction_fits_gpu=None if at_largest is None else at_largest.fits_gpu)
    return result
