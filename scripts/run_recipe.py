#!/usr/bin/env python3
"""Load a recipe, apply overrides, validate every offload constraint, and only then launch training.

    uv run scripts/run_recipe.py --list
    uv run scripts/run_recipe.py --recipe qwen3_30b_a3b_pretrain_config --dry-run \\
        optimizer.optimizer_offload_fraction=0.75 train.train_iters=20
    torchrun --nproc-per-node 8 scripts/run_recipe.py --recipe qwen3_8b_optimizer_offload_config -gb 64

Exit codes: 0 success (or a valid dry run), 2 invalid arguments, overrides or config (with a report),
1 a valid config that could not be launched here (no CUDA device, training failed).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path


from overrides.grammar import key_of
from overrides.short_flags import SHORT_FLAGS, dest, to_overrides
from recipes import registry
from mbridge_offload.planning.memory import AUTO_OVERRIDE as AUTO
from mbridge_offload.planning.memory import add_plan_arguments
from mbridge_offload.facts.import_notices import quiet_import_notices
from mbridge_offload.runtime.offload_tuning import TUNED_OVERLAP_CHUNKS, TUNINGS, chunks_line, tune_offload

EXIT_OK, EXIT_FAILED, EXIT_INVALID = 0, 1, 2


def _at_least_one(unit: str):
    """An argparse type: a whole number >= 1 of ``unit`` (e.g. 'GPU'), with errors that say which."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expects a whole number of {unit}s, got {text!r}") from None
        if value < 1:
            raise argparse.ArgumentTypeError(f"expects at least 1 {unit}, got {value}")
        return value

    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="run_recipe.py",
        description="Build an offload recipe, apply key=value overrides, validate, then train.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="overrides use Hydra grammar: key=value, +key=value (set what is unset), ++key=value,\n"
               "~key (reset to default), lists key=[a,b], null. Examples:\n"
               "  optimizer.optimizer_offload_fraction=0.5  model.cpu_offloading=True\n"
               "  'model.offload_modules=[expert_fc1,moe_act]'  ++env_vars.NVTE_CPU_OFFLOAD_V1=1\n"
               "A dotted override wins over a short flag of the same key.",
    )
    parser.add_argument("--recipe", metavar="NAME", help="recipe to run (see --list)")
    parser.add_argument("--list", action="store_true", help="list the recipes, one line each, and exit")
    parser.add_argument("--rules", action="store_true",
                        help="print the validation rule table (markdown) and exit")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the resolved offload settings, the changes and the validation report; "
                             "launch nothing")
    parser.add_argument("--num-gpus", type=_at_least_one("GPU"), metavar="N",
                        help="GPUs to validate for (default: WORLD_SIZE under a launcher, "
                             "else the recipe's own GPU count)")
    parser.add_argument("--cpu-threads", default=None, type=_cpu_threads, metavar="auto|launcher|N",
                        help="CPU optimizer threads per rank with optimizer offload: auto (the default when tuned: "
                             "the rank's share of the node's cores, pinned; an OMP_NUM_THREADS you set wins), "
                             "launcher (leave torchrun's setting; the default with --offload-tuning stock), or N")
    parser.add_argument("--offload-tuning", choices=TUNINGS, default="tuned",
                        help="tuned (default): for optimizer offload, CPU threads per rank, D2H/H2D overlap on in "
                             f"{TUNED_OVERLAP_CHUNKS} chunks (measured fastest), pinned host buffers, except keys you "
                             "set; stock: the config as the recipe and your overrides made it, threads as the "
                             "launcher set them (the library's behaviour)")
    parser.add_argument("--overlap-chunks", type=_at_least_one("chunk"), metavar="K",
                        help="with optimizer.overlap_cpu_optimizer_d2h_h2d=True: overlap in K chunks of about equal "
                             f"size instead of one CPU optimizer per tensor (default when tuned: "
                             f"{TUNED_OVERLAP_CHUNKS}; with --offload-tuning "
                             "stock: the library's per tensor; mbridge_offload/runtime/chunked_overlap.py)")
    parser.add_argument("--out", metavar="DIR", type=Path,
                        help="run folder for metrics and summary (default: runs/<recipe>)")
    add_plan_arguments(parser)
    short = parser.add_argument_group("short flags for common keys")
    for flag in SHORT_FLAGS:
        short.add_argument(*flag.flags, dest=dest(flag), type=flag.type, metavar="N" if flag.type is int else "X",
                           help=f"{flag.help} ({', '.join(flag.keys)})")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="Hydra-style overrides")
    return parser


def _cpu_threads(text: str):
    from mbridge_offload.runtime.cpu_threads import parse_request

    try:
        return parse_request(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _num_gpus(args: argparse.Namespace, recipe: registry.Recipe) -> tuple[int, str]:
    if args.num_gpus is not None:
        return args.num_gpus, "--num-gpus"
    if os.environ.get("WORLD_SIZE"):
        return int(os.environ["WORLD_SIZE"]), "WORLD_SIZE"
    return recipe.num_gpus, "the recipe's GPU count; set --num-gpus N for another"


def _auto_fraction(cfg, num_gpus: int, plan_options: dict) -> float | None:
    """Resolve optimizer.optimizer_offload_fraction=auto, or say why nothing fits."""
    from mbridge_offload.planning.memory import GIB, largest_host_fitting_fraction, smallest_fitting_fraction, what_would_fit

    fraction, fitting = smallest_fitting_fraction(cfg, num_gpus, **plan_options)
    if fraction is None:
        options = what_would_fit(cfg, num_gpus, **plan_options)
        print(f"optimizer.optimizer_offload_fraction=auto: nothing fits: even with every optimizer state on the CPU "
              f"the plan needs {fitting.total_bytes_gpu / GIB:.1f} GiB + {fitting.margin_gib:g} GiB margin of "
              f"{fitting.gpu_memory_gib:g} GiB per GPU."
              + ("\n  What would fit: " + "\n  or ".join(options) if options else ""), file=sys.stderr)
        return None
    if fitting.fits_host is False:
        largest, _ = largest_host_fitting_fraction(cfg, num_gpus, **plan_options)
        print(f"optimizer.optimizer_offload_fraction=auto: nothing fits both: the GPU needs fraction {fraction:g} or "
              f"more, and the {fitting.host_memory_gib:.1f} GiB {fitting.host_memory_source} of host memory hold "
              + ("no optimizer offload at all" if largest is None else f"fraction {largest:g} at most")
              + f" (the first optimizer step's peak plus {fitting.host_margin_gib:g} GiB per rank). Fix: fewer ranks "
              "per node or more nodes, or more GPUs (less on each).", file=sys.stderr)
        return None
    print(f"optimizer.optimizer_offload_fraction=auto -> {fraction:g} (smallest fraction in steps of 0.05 "
          f"that fits: {fitting.total_bytes_gpu / GIB:.1f} GiB + {fitting.margin_gib:g} GiB margin of "
          f"{fitting.gpu_memory_gib:g} GiB)")
    return fraction


def _record_refusal(out_dir: Path, errors) -> None:
    reason = "refused before launch: " + "; ".join(
        f"[{p.rule_id or p.source}] {p.key} = {p.value}: {p.rule}" for p in errors)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "failure.json").write_text(json.dumps({"reason": reason}, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_intermixed_args(argv)
    if args.list:
        print(registry.listing())
        return EXIT_OK
    if args.rules:
        from mbridge_offload.validation.rules import rules_markdown

        print(rules_markdown())
        return EXIT_OK
    if not args.recipe:
        parser.error("--recipe NAME is required (see --list)")
    recipe = registry.get_or_exit(parser, args.recipe)
    num_gpus, gpus_from = _num_gpus(args, recipe)
    overrides = list(args.overrides) + to_overrides(vars(args), list(args.overrides))

    print(f"Building {recipe.name} (loading Megatron Bridge) ...", file=sys.stderr, flush=True)
    started = time.monotonic()
    quiet_import_notices()
    from overrides import OverrideErrors, apply_overrides
    from mbridge_offload.describe import config_diff, format_diff, offload_summary, topology
    from mbridge_offload.validation.validate import validate

    from mbridge_offload.planning.memory import format_plan, plan_kwargs, plan_problems, plan_with_recommendation
    from mbridge_offload.validation.problem import Problem, Report

    plan_options = plan_kwargs(args, launching=not args.dry_run)
    auto = AUTO in overrides
    overrides = [o for o in overrides if o != AUTO]
    base = recipe.build()
    try:
        cfg = apply_overrides(base, overrides)
        if auto:
            fraction = _auto_fraction(cfg, num_gpus, plan_options)
            if fraction is None:
                return EXIT_INVALID
            given = {key_of(o) for o in overrides}
            chosen = [f"optimizer.optimizer_offload_fraction={fraction:g}"]
            if "optimizer.optimizer_cpu_offload" not in given:
                chosen.append(f"optimizer.optimizer_cpu_offload={fraction > 0}")
            cfg = apply_overrides(base, overrides + chosen)
    except OverrideErrors as errors:
        print(errors.format(), file=sys.stderr)
        return EXIT_INVALID
    overlap_chunks = args.overlap_chunks
    tuning_lines = [chunks_line(overlap_chunks, "--overlap-chunks")] if overlap_chunks else []
    if args.offload_tuning == "tuned":
        cfg, tuning_lines, overlap_chunks = tune_offload(cfg, {key_of(o) for o in overrides}, overlap_chunks)
    cpu_threads = args.cpu_threads or ("auto" if args.offload_tuning == "tuned" else "launcher")
    if args.overlap_chunks and not (cfg.optimizer.optimizer_cpu_offload and cfg.optimizer.overlap_cpu_optimizer_d2h_h2d):
        print(f"--overlap-chunks {args.overlap_chunks}: chunks the D2H/H2D overlap of optimizer offload, which is off "
              f"(optimizer.optimizer_cpu_offload={cfg.optimizer.optimizer_cpu_offload}, "
              f"optimizer.overlap_cpu_optimizer_d2h_h2d={cfg.optimizer.overlap_cpu_optimizer_d2h_h2d}). Fix: add "
              "optimizer.optimizer_cpu_offload=True optimizer.overlap_cpu_optimizer_d2h_h2d=True, or drop --overlap-chunks",
              file=sys.stderr)
        return EXIT_INVALID
    report = validate(cfg, num_gpus)
    print(f"Recipe {recipe.name} ({topology(cfg, num_gpus)}; GPU count from {gpus_from})")
    print("Offload settings:")
    for line in offload_summary(cfg):
        print(f"  {line}")
    if tuning_lines:
        print("Offload speed tuning (--offload-tuning stock turns it off):" if args.offload_tuning == "tuned"
              else "Offload speed settings:")
        for line in tuning_lines:
            print(f"  {line}")
    diffs = format_diff(config_diff(base, cfg))
    print(f"Changed from the recipe ({len(diffs)}):" if diffs else "Changed from the recipe: nothing")
    for line in diffs:
        print(f"  {line}")
    memory = plan_with_recommendation(cfg, num_gpus, **plan_options)
    print("Memory plan (per GPU, worst rank):")
    print(format_plan(memory))
    report = Report(report.num_gpus, report.problems + tuple(
        Problem(key, value, rule, fix, severity, rule_id, "planner")
        for rule_id, key, value, rule, fix, severity in plan_problems(memory, args.step_time_budget_s)))
    print(report.format())
    print(f"(built and validated in {time.monotonic() - started:.1f} s)", file=sys.stderr)
    if not report.ok:
        if args.out and not args.dry_run:
            # a refused launch is a finished run for whoever launched it into --out (sweep_offload.py's
            # rows, --resume): say why there, in the report's words
            _record_refusal(args.out, report.errors)
        return EXIT_INVALID
    if args.dry_run:
        return EXIT_OK
    from mbridge_offload.runtime.launch import launch

    out_dir = args.out or Path("runs") / recipe.name
    return launch(cfg, recipe.name, num_gpus, out_dir.resolve(), argv, cpu_threads=cpu_threads,
                  tuning_lines=tuning_lines, overlap_chunks=overlap_chunks)


if __name__ == "__main__":
    sys.exit(main())
