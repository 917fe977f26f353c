#!/usr/bin/env python3
"""Plan GPU and host memory of a recipe before queueing it, and pick the offload fraction.

    uv run scripts/plan_offload.py --recipe qwen3_30b_a3b_pretrain_config --num-gpus 16 --gpu-memory-gib 80
    uv run scripts/plan_offload.py --recipe qwen3_8b_pretrain_config --num-gpus 1 -tp 1 --json \\
        optimizer.optimizer_offload_fraction=auto

Exit codes: 0 the plan fits; 2 invalid arguments or overrides, or the plan does not fit
(GPU, host memory, or the --step-time-budget-s offload-time gate).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


from overrides.short_flags import SHORT_FLAGS, dest, to_overrides
from recipes import registry
from mbridge_offload.planning.memory import AUTO_OVERRIDE as AUTO
from mbridge_offload.planning.memory import add_plan_arguments
from mbridge_offload.facts.import_notices import quiet_import_notices


def compare_rows(sweep_dir: Path) -> list[dict]:
    """Planned vs measured peak GPU memory for every run of a sweep folder (same overrides)."""
    from overrides import apply_overrides
    from mbridge_offload.planning.memory import GIB, plan

    sweep = json.loads((sweep_dir / "sweep.json").read_text())
    cfg = apply_overrides(registry.get(sweep["recipe"]).build(), sweep["overrides"])
    rows = []
    for row in sweep["rows"]:
        planned = plan(cfg, 1, fraction=row["fraction"])
        measured, host = row["peak_allocated_gib"], row.get("peak_host_rss_gib")
        rows.append({"recipe": sweep["recipe"], "fraction": row["fraction"], "measured_gib": measured,
                     "planned_gib": planned.total_bytes_gpu / GIB, "planned_state_gib": planned.state_bytes_gpu / GIB,
                     "error": None if measured is None else planned.total_bytes_gpu / GIB / measured - 1,
                     "measured_host_rss_gib": host, "planned_host_gib": planned.host_bytes_per_node / GIB,
                     "host_error": None if host is None else planned.host_bytes_per_node / GIB / host - 1,
                     "planned_host_peak_gib": planned.host_peak_bytes_per_node / GIB,
                     "measured_node_peak_gib": row.get("peak_node_host_used_gib")})
    return rows


def _cell(value: float | None, fmt: str = ".2f") -> str:
    return "-" if value is None else format(value, fmt)


def compare_markdown(sweep_dirs: list[Path]) -> str:
    lines = ["| recipe | fraction | measured peak allocated (GiB) | planned total (GiB) | error |",
             "|---|---|---|---|---|"]
    for sweep_dir in sweep_dirs:
        for r in compare_rows(sweep_dir):
            measured = "-" if r["measured_gib"] is None else f"{r['measured_gib']:.2f}"
            error = "-" if r["error"] is None else f"{r['error']:+.1%}"
            lines.append(f"| {r['recipe']} | {r['fraction']:g} | {measured} | {r['planned_gib']:.2f} | {error} |")
    return "\n".join(lines)


def compare_host_markdown(sweep_dirs: list[Path]) -> str:
    """Planned vs measured host memory of the same runs (one rank per node)."""
    lines = ["| recipe | fraction | measured host RSS at step ends (GiB) | planned between steps (GiB) | error "
             "| planned peak in the first optimizer step (GiB) | measured node peak (GiB) |",
             "|---|---|---|---|---|---|---|"]
    for sweep_dir in sweep_dirs:
        for r in compare_rows(sweep_dir):
            lines.append(f"| {r['recipe']} | {r['fraction']:g} | {_cell(r['measured_host_rss_gib'])} "
                         f"| {r['planned_host_gib']:.2f} | {_cell(r['host_error'], '+.1%')} "
                         f"| {r['planned_host_peak_gib']:.2f} | {_cell(r['measured_node_peak_gib'])} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="plan_offload.py", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipe", metavar="NAME")
    parser.add_argument("--compare", type=Path, nargs="+", metavar="SWEEP_DIR",
                        help="compare the plan with the peak memory measured by sweep_offload.py runs "
                             "(markdown table) instead of planning one recipe")
    parser.add_argument("--num-gpus", type=int, metavar="N", help="default: the recipe's GPU count")
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    add_plan_arguments(parser)
    for flag in SHORT_FLAGS:
        parser.add_argument(*flag.flags, dest=dest(flag), type=flag.type, help=argparse.SUPPRESS)
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    args = parser.parse_intermixed_args(argv)
    if args.compare:
        quiet_import_notices()
        print(compare_markdown(args.compare) + "\n\n" + compare_host_markdown(args.compare))
        return 0
    if not args.recipe:
        parser.error("--recipe NAME is required (or --compare SWEEP_DIR ...)")
    recipe = registry.get_or_exit(parser, args.recipe)
    num_gpus = args.num_gpus or recipe.num_gpus

    quiet_import_notices()
    from overrides import OverrideErrors, apply_overrides
    from mbridge_offload.planning.memory import format_plan, plan_kwargs, plan_problems, plan_with_recommendation, smallest_fitting_fraction

    overrides = list(args.overrides) + to_overrides(vars(args), list(args.overrides))
    auto = AUTO in overrides
    try:
        cfg = apply_overrides(recipe.build(), [o for o in overrides if o != AUTO])
    except OverrideErrors as errors:
        print(errors.format(), file=sys.stderr)
        return 2
    kwargs = plan_kwargs(args)
    if auto:
        fraction, _ = smallest_fitting_fraction(cfg, num_gpus, **kwargs)
        if fraction is None:
            fraction = 1.0
    else:
        fraction = None
    result = plan_with_recommendation(cfg, num_gpus, fraction=fraction, **kwargs)
    problems = plan_problems(result, args.step_time_budget_s)
    if args.json:
        print(json.dumps({**result.to_json(), "problems": [dict(zip(("id", "key", "value", "rule", "fix", "severity"), p))
                                                            for p in problems]}, indent=2))
    else:
        print(f"Memory plan for {recipe.name} on {num_gpus} GPU{'s' if num_gpus != 1 else ''}"
              + (" (fraction=auto)" if auto else "") + ":")
        print(format_plan(result))
        for _, key, value, rule, fix, severity in problems:
            print(f"  {severity.upper()} {key} = {value}\n        rule: {rule}\n        fix:  {fix}")
    return 2 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
