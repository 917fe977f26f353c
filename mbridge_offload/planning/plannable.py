"""What the planner cannot model, said as the validator says it: each key, its value, the rule and the fix.

The plan divides by the parallel grid and counts over layers, heads and experts. Where the config breaks a
rule those counts depend on (a size out of its range, a GPU count TP x PP x CP does not divide, layers a stage
or a model chunk cannot split evenly, heads or experts a parallel size does not divide, a global batch that is
no whole number of micro batches, two sequence lengths), the run cannot start as configured and any number the
planner gave would be made up: it answers with these problems instead (memory_plan.plan's empty plan, refused by
report.plan_problems). The rules are the validator's own (validation/parallelism.py, facts/key_ranges.py), so a
dry run reports each once (validation.Report drops the repeat).
"""

from __future__ import annotations

from typing import Any

from mbridge_offload.facts.key_ranges import KEY_RANGES, OFFLOAD_FRACTION_KEY, is_count, is_number
from mbridge_offload.validation.problem import Problem

# The validator's rules whose breach leaves the planner's arithmetic without meaning, after the key ranges.
GRID_RULES_THE_PLAN_NEEDS = (
    "parallel/world-size",  # the data-parallel size: optimizer shards, micro batches per step
    "parallel/layers-per-stage",  # the layers of each pipeline stage
    "parallel/layers-per-virtual-stage",  # the layers of each model chunk of the interleaved schedule
    "parallel/global-batch",  # micro batches per step: how many a pipeline stage holds
    "parallel/interleaved-micro-batches",  # the interleaved schedule's micro batches in flight
    "parallel/heads-per-query-group",  # heads per key/value group
    "parallel/heads-per-tp",  # heads and query groups per rank
    "parallel/ffn-per-tp",  # the MLP's width per rank
    "parallel/expert-ffn-per-etp",  # an expert's width per rank
    "parallel/vocab-per-tp",  # the embedding's and output layer's rows per rank
    "parallel/experts-per-ep",  # experts per rank
    "parallel/expert-grid",  # the expert-data-parallel group: expert optimizer shards
    "parallel/seq-length-match",  # one sequence length for the activations and the data loader
    "parallel/seq-length-cp",  # positions per rank under context parallelism
)

PLANNER_SOURCE = "planner"


def _gpu_count_problem(num_gpus: Any) -> Problem:
    return Problem(key="--num-gpus", value=repr(num_gpus), rule="the GPU count must be a whole number >= 1",
                   fix="--num-gpus 1  (or the GPUs the run will have)", rule_id="memory/gpu-count",
                   source=PLANNER_SOURCE)


def _fraction_problem(fraction: Any) -> Problem:
    return Problem(key=OFFLOAD_FRACTION_KEY, value=repr(fraction),
                   rule="must be a number from 0 to 1: the share of optimizer states (and their Adam step) moved to "
                        "the CPU", fix=f"{OFFLOAD_FRACTION_KEY}=0.5  (or auto)",
                   rule_id="optimizer-offload/fraction-range", source=PLANNER_SOURCE)


def unplannable_problems(cfg: Any, num_gpus: Any, fraction: Any = None) -> tuple[Problem, ...]:
    """Why ``cfg`` on ``num_gpus`` GPUs at offload ``fraction`` cannot be planned, as problems naming each key, its
    value, the rule and the fix (empty when it can be planned)."""
    from mbridge_offload.validation.checks import breaches
    from mbridge_offload.validation.registry import RULES_BY_ID
    from mbridge_offload.validation.rule import Context

    if not is_count(num_gpus, 1):
        return (_gpu_count_problem(num_gpus),)
    problems = [] if fraction is None or (is_number(fraction) and 0 <= fraction <= 1) else [_fraction_problem(fraction)]
    ctx = Context(cfg=cfg, num_gpus=num_gpus, environ={})
    try:
        rules = [RULES_BY_ID[r.id] for r in KEY_RANGES] + [RULES_BY_ID[i] for i in GRID_RULES_THE_PLAN_NEEDS]
        # one by one: a rule that raises keeps the problems found before it
        problems.extend(breaches(rules, ctx, severity="error", source=PLANNER_SOURCE))
    except Exception as error:  # noqa: BLE001 - the rules are guarded; a config they cannot read is no config to plan
        problems.append(Problem(key="(the config)", value=f"{type(error).__name__}: {error}"[:200],
                                rule="the planner reads the model, parallel and batch sizes of a Megatron Bridge "
                                     "ConfigContainer", fix="build the config from a recipe (run_recipe.py --list)",
                                rule_id="memory/config-readable", source=PLANNER_SOURCE))
    return tuple(_once(problems))


def _once(problems: list[Problem]) -> list[Problem]:
    """Each (rule, key, value) once: a fraction argument out of range and the config's own may say the same."""
    seen, kept = set(), []
    for p in problems:
        if (p.rule_id, p.key, p.value) not in seen:
            seen.add((p.rule_id, p.key, p.value))
            kept.append(p)
    return kept


def unplannable_text(problems: tuple[Problem, ...]) -> str:
    """The problems in one line each: key = value: rule (fix: ...)."""
    return "; ".join(f"{p.key} = {p.value}: {p.rule} (fix: {p.fix})" for p in problems)
