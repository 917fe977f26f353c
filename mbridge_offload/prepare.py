"""From a recipe and a command line to a config ready to plan or launch, the same way for every command:

    recipe -> overrides -> optimizer.optimizer_offload_fraction=auto -> offload tuning -> validation -> memory plan

``prepare`` changes nothing outside the config it returns and prints nothing: the command that called
it says what it found (run_recipe prints all of it, plan_offload the plan). A command line that makes
no config to plan (an override that cannot be applied, ``auto`` where nothing fits) raises ``NotPrepared``
with the words for the user; for overrides that cannot be applied, those words include the validation of
the config the command's other overrides make, so every problem of a command shows in one run. A config
that is made but breaks a rule (a value out of its range included: the validator checks ranges, on the
final values) is prepared, with the problems in its report.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from overrides.grammar import given_keys, key_of
from recipes.registry import Recipe
from mbridge_offload.planning import (AUTO_OVERRIDE, GIB, Plan, largest_host_fitting_fraction, plan, plan_problems,
                                      plan_with_recommendation, smallest_fitting_fraction, what_would_fit)
from mbridge_offload.facts.key_ranges import OFFLOAD_FRACTION_KEY as FRACTION_KEY
from mbridge_offload.facts.key_ranges import OFFLOAD_SWITCH_KEY as SWITCH_KEY
from mbridge_offload.facts.determinism import DETERMINISTIC_ENV, DETERMINISTIC_KEYS
from mbridge_offload.facts.offload_engine import ENGINE_KEY
from mbridge_offload.runtime.offload_tuning import chunks_line, tune_offload
from mbridge_offload.runtime.stopping import with_clean_stop
from mbridge_offload.validation import Report, validate



class NotPrepared(Exception):
    """The command line makes no config to plan or launch; ``message`` says why, for the user.
    ``auto_line`` is what ``auto`` resolved to when the refusal came after it (run_recipe shows it).
    ``override_errors``: the overrides that cannot be applied, each with its key and fix, when those are the reason
    (the JSON refusals list them)."""

    def __init__(self, message: str, auto_line: str | None = None, override_errors: tuple = ()):
        super().__init__(message)
        self.message = message
        self.auto_line = auto_line
        self.override_errors = tuple(override_errors)


@dataclass(frozen=True)
class Prepared:
    recipe_name: str
    base_cfg: Any  # the recipe as built
    cfg: Any  # after the overrides, auto and the offload tuning: what is validated, planned and launched
    num_gpus: int
    num_gpus_from: str  # where the GPU count came from, in words
    overrides: tuple[str, ...]  # as given, without optimizer.optimizer_offload_fraction=auto
    auto_fraction: float | None  # what optimizer.optimizer_offload_fraction=auto resolved to; None: not asked
    auto_line: str | None  # that resolution in words
    offload_tuning: str  # "tuned" or "stock" (mbridge_offload/runtime/offload_tuning.py)
    tuning_lines: tuple[str, ...]  # what the tuning set or kept, or the chunks asked for
    run_lines: tuple[str, ...]  # what --deterministic and the clean stop set, in words
    overlap_chunks: int | None  # the D2H/H2D overlap in this many chunks (None: the library's per tensor)
    cpu_threads: str | int  # "auto", "launcher" or a thread count, per rank
    memory: Plan  # the memory plan of cfg, with its recommendation
    report: Report  # the validation's problems (none when not validated), then the planner's


def resolve_auto(cfg: Any, num_gpus: int, plan_options: Mapping[str, Any]) -> tuple[float | None, str]:
    """``optimizer.optimizer_offload_fraction=auto``: the smallest fraction (steps of 0.05) that fits the
    GPU and the host, with a line saying so; NotPrepared, with what would fit, when none does. A configuration the
    planner cannot model gets no fraction (None) and a line saying why: the report that follows names each problem
    (planning/plannable.py), and a fraction chosen from no plan would claim a fit nobody computed. Where only
    optimizer offload is refused (the distributed optimizer off, another optimizer), the report that follows is of the
    run without offload, which has no such error: the line itself names the refusal."""
    fraction, fitting = smallest_fitting_fraction(cfg, num_gpus, **plan_options)
    if fitting.unplanned and fraction:  # fraction 0 was planned and does not fit; every offload launch is refused
        without = plan(cfg, num_gpus, fraction=0.0, **plan_options)
        return None, (f"{AUTO_OVERRIDE}: no fraction chosen: without optimizer offload the plan needs "
                      f"{without.total_bytes_gpu / GIB:.1f} GiB + {without.margin_gib:.2f} GiB margin of "
                      f"{without.gpu_memory_gib:g} GiB per GPU, and optimizer offload (fraction {fraction:g} or more) "
                      f"is a launch run_recipe.py refuses: {fitting.unplanned}")
    if fitting.unplanned:
        return None, (f"{AUTO_OVERRIDE}: no fraction chosen: the planner cannot model this configuration (the "
                      "errors below name each problem and its fix)")
    if fraction is None:
        options = what_would_fit(cfg, num_gpus, **plan_options)
        raise NotPrepared(
            f"{AUTO_OVERRIDE}: nothing fits: even with every optimizer state on the CPU the plan needs "
            f"{fitting.total_bytes_gpu / GIB:.1f} GiB + {fitting.margin_gib:.2f} GiB margin of "
            f"{fitting.gpu_memory_gib:g} GiB per GPU."
            + ("\n  What would fit: " + "\n  or ".join(options) if options else ""))
    if fitting.fits_host is False:
        largest, _ = largest_host_fitting_fraction(cfg, num_gpus, **plan_options)
        if largest is None:  # not even the run without optimizer offload: the host, not the fraction, is short
            without = fitting if fraction == 0 else plan(cfg, num_gpus, fraction=0.0, **plan_options)
            raise NotPrepared(
                f"{AUTO_OVERRIDE}: nothing fits: the {fitting.host_memory_gib:.1f} GiB {fitting.host_memory_source} "
                f"of host memory cannot hold even the run without optimizer offload ("
                f"{without.host_peak_bytes_per_node / GIB:.1f} GiB per node at its peak, for "
                f"{without.ranks_per_node} rank(s)). Fix: more host memory per node (fewer ranks per node), or "
                "--host-memory-gib if that figure is not this node's.")
        raise NotPrepared(
            f"{AUTO_OVERRIDE}: nothing fits both: the GPU needs fraction {fraction:g} or more, and the "
            f"{fitting.host_memory_gib:.1f} GiB {fitting.host_memory_source} of host memory hold "
            + ("no optimizer offload at all" if largest is None else f"fraction {largest:g} at most")
            + f" (the first optimizer step's peak plus {fitting.host_margin_gib:g} GiB per rank). Fix: fewer ranks "
            "per node or more nodes, or more GPUs (less on each).")
    return fraction, (f"{AUTO_OVERRIDE} -> {fraction:g} (smallest fraction in steps of 0.05 that fits: "
                      f"{fitting.total_bytes_gpu / GIB:.1f} GiB + {fitting.margin_gib:.2f} GiB margin of "
                      f"{fitting.gpu_memory_gib:g} GiB)")


def _apply_auto(cfg: Any, overrides: Sequence[str], fraction: float) -> Any:
    """``cfg`` (the overrides already applied) with the fraction auto chose, and offload switched to match
    unless the command line set the switch."""
    from overrides import OverrideError, OverrideErrors, apply_overrides

    chosen = [f"{FRACTION_KEY}={fraction:g}"]
    given = {key_of(o): o for o in reversed(overrides)}  # the first override of each key
    if FRACTION_KEY in given:  # auto and a value for the same key: the overrides' own words for that
        raise OverrideErrors([OverrideError(chosen[0], FRACTION_KEY, f"given twice (first: {given[FRACTION_KEY]})",
                                            "give each key once")])
    if SWITCH_KEY not in given:
        chosen.append(f"{SWITCH_KEY}={fraction > 0}")
    return apply_overrides(cfg, chosen)


def _deterministic(cfg: Any, given: set[str], auto_line: str | None) -> tuple[Any, str]:
    """``--deterministic``: every key and environment variable it needs, refusing a command line that sets
    one of them otherwise."""
    from recipes.determinism import with_deterministic_mode

    owned = [*DETERMINISTIC_KEYS, *(f"env_vars.{name}" for name in DETERMINISTIC_ENV)]
    clashes = [key for key in owned if key in given]
    if clashes:
        raise NotPrepared(f"--deterministic sets {', '.join(clashes)} itself; drop "
                          f"{'that override' if len(clashes) == 1 else 'those overrides'} or --deterministic",
                          auto_line)
    settings = [f"{key}={value}" for key, value in DETERMINISTIC_KEYS.items()]
    settings += [f"{name}={value}" for name, value in DETERMINISTIC_ENV.items()]
    return with_deterministic_mode(cfg), "deterministic: " + " ".join(settings) + " (bit-reproducible runs)"


def _offload_engine(cfg: Any, mode: str, given: set[str], auto_line: str | None) -> Any:
    """``--offload-engine MODE``, refusing a command line that also sets the engine's key."""
    from recipes.offload import with_offload_engine

    if ENGINE_KEY in given:
        raise NotPrepared(f"--offload-engine {mode} sets {ENGINE_KEY} itself; drop that override or --offload-engine",
                          auto_line)
    return with_offload_engine(cfg, mode)


def _with_the_rest_validated(errors: Any, num_gpus: int, validated: bool, validator: Callable[..., Report],
                             given: frozenset[str]) -> str:
    """The override errors of a command and, in the same words as a prepared config's report, the problems
    of the config that the command's other overrides make (so a command shows all of its problems at once:
    fixing the overrides does not reveal new ones), validated with the keys those gave."""
    text = errors.format()
    if not validated or errors.applied is None:
        return text
    report = validator(errors.applied, num_gpus, given_keys=given - {error.key for error in errors.errors})
    n = len(errors.errors)
    return (f"{text}\n\nAnd the configuration the other overrides make (the recipe with every override but "
            f"{'that one' if n == 1 else f'those {n}'}):\n{report.format()}")


def prepare(recipe: Recipe, overrides: Sequence[str], *, num_gpus: int, num_gpus_from: str,
            plan_options: Mapping[str, Any], offload_tuning: str = "tuned", overlap_chunks: int | None = None,
            cpu_threads: str | int | None = None, step_time_budget_s: float | None = None,
            validated: bool = True, deterministic: bool = False, offload_engine: str | None = None,
            validator: Callable[..., Report] = validate) -> Prepared:
    """``recipe`` built, with ``overrides`` (Hydra grammar, ``optimizer.optimizer_offload_fraction=auto``
    allowed), tuned for offload speed unless ``offload_tuning="stock"``, validated for ``num_gpus`` GPUs
    (unless ``validated=False``) and planned with ``plan_options`` (planning.plan_kwargs).
    ``deterministic`` sets what bit-reproducible runs need (recipes/determinism.py). ``offload_engine``:
    run_recipe's --offload-engine (recipes/offload.with_offload_engine; refused beside an override of the
    same key). ``validator``: what
    validates (validation.validate; the cached one of mbridge_offload/fast_check), given ``given_keys=`` the keys
    the overrides give (overrides.grammar.given_keys).

    ``overlap_chunks`` and ``cpu_threads`` are run_recipe's --overlap-chunks and --cpu-threads (None:
    the tuning's choice); ``step_time_budget_s`` is the planner's offload-time gate.
    """
    from overrides import OverrideErrors, apply_overrides

    auto = AUTO_OVERRIDE in overrides
    overrides = tuple(o for o in overrides if o != AUTO_OVERRIDE)
    base = recipe.build()
    auto_fraction = auto_line = None
    try:
        cfg = apply_overrides(base, overrides)
        if auto:
            auto_fraction, auto_line = resolve_auto(cfg, num_gpus, plan_options)
            if auto_fraction is not None:
                cfg = _apply_auto(cfg, overrides, auto_fraction)
    except OverrideErrors as errors:
        raise NotPrepared(_with_the_rest_validated(errors, num_gpus, validated, validator, given_keys(overrides)),
                          auto_line, override_errors=errors.errors) from None
    given = {key_of(o) for o in overrides}
    run_lines = []
    if deterministic:
        cfg, line = _deterministic(cfg, given, auto_line)
        run_lines.append(line)
    if offload_engine is not None:
        cfg = _offload_engine(cfg, offload_engine, given, auto_line)
    cfg, stop_line = with_clean_stop(cfg, given)
    if stop_line:
        run_lines.append(stop_line)
    tuning_lines = [chunks_line(overlap_chunks, "--overlap-chunks")] if overlap_chunks else []
    chunks = overlap_chunks
    if offload_tuning == "tuned":
        cfg, tuning_lines, chunks = tune_offload(cfg, {key_of(o) for o in overrides}, overlap_chunks)
    opt = cfg.optimizer
    if overlap_chunks and not (opt.optimizer_cpu_offload and opt.overlap_cpu_optimizer_d2h_h2d):
        raise NotPrepared(
            f"--overlap-chunks {overlap_chunks}: chunks the D2H/H2D overlap of optimizer offload, which is off "
            f"({SWITCH_KEY}={opt.optimizer_cpu_offload}, "
            f"optimizer.overlap_cpu_optimizer_d2h_h2d={opt.overlap_cpu_optimizer_d2h_h2d}). Fix: add "
            f"{SWITCH_KEY}=True optimizer.overlap_cpu_optimizer_d2h_h2d=True, or drop --overlap-chunks", auto_line)
    # the keys the command line gave: a value given at its default is the user's too (validation's Context.given_keys)
    problems = validator(cfg, num_gpus, given_keys=given_keys(overrides)).problems if validated else ()
    memory = plan_with_recommendation(cfg, num_gpus, **plan_options)
    report = Report(num_gpus=num_gpus, problems=tuple(problems) + tuple(plan_problems(memory, step_time_budget_s)))
    return Prepared(
        recipe_name=recipe.name, base_cfg=base, cfg=cfg, num_gpus=num_gpus, num_gpus_from=num_gpus_from,
        overrides=overrides, auto_fraction=auto_fraction, auto_line=auto_line, offload_tuning=offload_tuning,
        tuning_lines=tuple(tuning_lines), run_lines=tuple(run_lines), overlap_chunks=chunks,
        cpu_threads=cpu_threads or ("auto" if offload_tuning == "tuned" else "launcher"), memory=memory,
        report=report)
