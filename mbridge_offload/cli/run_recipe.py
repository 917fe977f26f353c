"""The run_recipe command: build a recipe, apply the overrides, resolve auto, tune, validate and plan
(mbridge_offload/prepare.py), print what that gave, then launch (mbridge_offload/runtime/launch.py).

Usage, examples and exit codes: scripts/run_recipe.py.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from overrides.short_flags import SHORT_FLAGS, dest, to_overrides
from recipes import registry
from mbridge_offload.cli.parsing import (CommandParser, announce_unparsable, at_least_one, check_writable, recipe_or_exit,
                                         refuse)
from mbridge_offload.facts.import_notices import quiet_import_notices
from mbridge_offload.planning import add_plan_arguments
from mbridge_offload.facts.offload_engine import ENGINE_ENV, ENGINE_MODES
from mbridge_offload.runtime.offload_tuning import TUNED_OVERLAP_CHUNKS, TUNINGS

EXIT_OK, EXIT_FAILED, EXIT_INVALID = 0, 1, 2


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(
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
    parser.add_argument("--deterministic", action="store_true",
                        help="bit-reproducible training: model.deterministic_mode=True, the unfused cross entropy, "
                             "NCCL_ALGO=Ring, NVTE_ALLOW_NONDETERMINISTIC_ALGO=0, CUBLAS_WORKSPACE_CONFIG=:4096:8 "
                             "(the run's first lines list them)")
    parser.add_argument("--num-gpus", type=at_least_one("GPU"), metavar="N",
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
    parser.add_argument("--overlap-chunks", type=at_least_one("chunk"), metavar="K",
                        help="with optimizer.overlap_cpu_optimizer_d2h_h2d=True: overlap in K chunks of about equal "
                             f"size instead of one CPU optimizer per tensor (default when tuned: "
                             f"{TUNED_OVERLAP_CHUNKS}; with --offload-tuning "
                             "stock: the library's per tensor; mbridge_offload/runtime/chunked_overlap.py)")
    parser.add_argument("--offload-engine", choices=tuple(ENGINE_MODES), default=None,
                        help="what runs the offloaded optimizer step: library (Megatron Core's: the CPU Adam after "
                             "backward), exact (the CPU Adam under the next forward, the same update), stream (Adam "
                             "on the GPU with the moments streamed from the host, the update without offload), delayed "
                             "(one-step delayed update, not the same training). Default: the recipe's "
                             f"env_vars.{ENGINE_ENV}, else library (mbridge_offload/runtime/streaming_engine.py)")
    parser.add_argument("--warm-communicators", action="store_true",
                        help="experimental: create every NCCL group's communicator before step 1 (one small "
                             "collective per group), so that NCCL allocates before PyTorch's cache has grown. It "
                             "costs device memory: each communicator took 0.38 GiB on the H200, and one GPU has 21 "
                             "groups, of which a run uses 4 (+6.5 GiB measured; docs/benchmarks/alloc-tight/). "
                             "Without it PyTorch creates the communicators a run uses at their first collective")
    parser.add_argument("--memory-snapshot", type=at_least_one("step"), default=0, metavar="STEPS",
                        help="record the CUDA allocator's history (every allocation, free and segment mapping, with "
                             "its Python stack) for the first STEPS steps and write it to the run folder, for "
                             "PyTorch's viewer (python -m torch.cuda._memory_viz trace_plot FILE -o FILE.html): "
                             "what the allocator reserved beyond the peak, and why (mbridge_offload/runtime/"
                             "memory_history.py). Slows the steps it records")
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


def _num_gpus(parser: argparse.ArgumentParser, args: argparse.Namespace,
              recipe: registry.Recipe) -> tuple[int, str]:
    if args.num_gpus is not None:
        return args.num_gpus, "--num-gpus"
    if os.environ.get("WORLD_SIZE"):
        text = os.environ["WORLD_SIZE"]
        try:
            return at_least_one("GPU")(text), "WORLD_SIZE"
        except argparse.ArgumentTypeError as error:
            parser.error(f"WORLD_SIZE (environment) {error}; unset it or give --num-gpus N")
    return recipe.num_gpus, "the recipe's GPU count; set --num-gpus N for another"


def refusal_reason(errors) -> str:
    """Why a launch was refused, in the report's words (for the run folder's failure.json)."""
    return "refused before launch: " + "; ".join(
        f"[{p.rule_id or p.source}] {p.key} = {p.value}: {p.rule}" for p in errors)


def show_prepared(prepared) -> None:
    """What run_recipe found: the settings in force, what changed from the recipe, the plan, the report."""
    from mbridge_offload.describe import config_diff, format_diff, offload_summary, topology
    from mbridge_offload.planning import format_plan

    cfg = prepared.cfg
    if prepared.auto_line:
        print(prepared.auto_line)
    print(f"Recipe {prepared.recipe_name} ({topology(cfg, prepared.num_gpus)}; "
          f"GPU count from {prepared.num_gpus_from})")
    print("Offload settings:")
    for line in offload_summary(cfg):
        print(f"  {line}")
    if prepared.tuning_lines:
        print("Offload speed tuning (--offload-tuning stock turns it off):" if prepared.offload_tuning == "tuned"
              else "Offload speed settings:")
        for line in prepared.tuning_lines:
            print(f"  {line}")
    if prepared.run_lines:
        print("Run settings:")
        for line in prepared.run_lines:
            print(f"  {line}")
    diffs = format_diff(config_diff(prepared.base_cfg, cfg))
    print(f"Changed from the recipe ({len(diffs)}):" if diffs else "Changed from the recipe: nothing")
    for line in diffs:
        print(f"  {line}")
    print("Memory plan (per GPU, worst rank):")
    print(format_plan(prepared.memory))
    print(prepared.report.format())


def _refused(prepared, args: argparse.Namespace) -> int:
    """A prepared config that breaks a rule: say why in --out when launching (not in a dry run), exit 2."""
    if args.out and not args.dry_run:
        # a refused launch is a finished run for whoever launched it into --out (sweep_offload.py's
        # rows, --resume): say why there, in the report's words
        from mbridge_offload.runtime.run_outcome import write_failure

        write_failure(args.out, refusal_reason(prepared.report.errors))
    return EXIT_INVALID


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_intermixed_args(argv)
    if args.list:
        print(registry.listing())
        return EXIT_OK
    if args.rules:
        from mbridge_offload.validation import rules_markdown

        print(rules_markdown())
        return EXIT_OK
    if not args.recipe:
        parser.error("--recipe NAME is required (see --list)")
    recipe = recipe_or_exit(parser, args.recipe)
    num_gpus, gpus_from = _num_gpus(parser, args, recipe)
    if not args.dry_run:  # a dry run writes nothing; a launch writes its run folder
        check_writable(parser, "--out", args.out or Path("runs") / recipe.name)
        if args.gpu_memory_gib is not None:
            from mbridge_offload.planning.arguments import launch_gpu_memory_problem
            from mbridge_offload.planning.capacity import gpu_memory_gib_here

            problem = launch_gpu_memory_problem(args.gpu_memory_gib, gpu_memory_gib_here())
            if problem:
                parser.error(problem)
    overrides = list(args.overrides) + to_overrides(vars(args), list(args.overrides))
    from mbridge_offload.planning import plan_kwargs

    options = dict(num_gpus=num_gpus, num_gpus_from=gpus_from,
                   plan_options=plan_kwargs(args, launching=not args.dry_run),
                   offload_tuning=args.offload_tuning, overlap_chunks=args.overlap_chunks,
                   cpu_threads=args.cpu_threads, step_time_budget_s=args.step_time_budget_s,
                   deterministic=args.deterministic, offload_engine=args.offload_engine)
    started = time.monotonic()

    # From the cache of this recipe, when it can answer exactly: refusals, and dry runs validated before.
    from mbridge_offload import fast_check

    fast = fast_check.prepare_fast(recipe, overrides, **options)
    if fast is not None and (fast.refusal is not None or not fast.prepared.report.ok or args.dry_run):
        note = "" if fast.complete else fast_check.PARTIAL_NOTE.format(seconds=time.monotonic() - started)
        if fast.refusal is not None:
            if fast.refusal.auto_line:
                print(fast.refusal.auto_line)
            print(fast.refusal.message, file=sys.stderr)
            if note:
                print(note, file=sys.stderr)
            return EXIT_INVALID
        show_prepared(fast.prepared)
        print(note or f"(answered from the cache of this recipe in {time.monotonic() - started:.1f} s)",
              file=sys.stderr)
        return _refused(fast.prepared, args) if not fast.prepared.report.ok else EXIT_OK

    if args.dry_run:  # a worker that has Megatron Bridge loaded answers in seconds (fast_check/warm_worker.py)
        from mbridge_offload.fast_check import warm_worker

        code = warm_worker.ask("run_recipe", argv)
        if code is not None:
            return code
    announce_unparsable(overrides)
    print(f"Building {recipe.name} (loading Megatron Bridge) ...", file=sys.stderr, flush=True)
    quiet_import_notices()
    from mbridge_offload.prepare import NotPrepared, prepare

    try:
        with fast_check.recording(recipe) as building:
            prepared = prepare(building, overrides, validator=building.validator, **options)
    except NotPrepared as refusal:
        if refusal.auto_line:
            print(refusal.auto_line)
        print(refusal.message, file=sys.stderr)
        if building.validator.partial:
            print(fast_check.SLOW_PARTIAL_NOTE, file=sys.stderr)
        return EXIT_INVALID
    show_prepared(prepared)
    print(f"(built and validated in {time.monotonic() - started:.1f} s)", file=sys.stderr)
    if building.validator.partial and not prepared.report.ok:
        print(fast_check.SLOW_PARTIAL_NOTE, file=sys.stderr)
    if not prepared.report.ok:
        return _refused(prepared, args)
    profiling = getattr(prepared.cfg, "profiling", None)
    if args.memory_snapshot and profiling is not None and getattr(profiling, "record_memory_history", False):
        # one recorder per process: whichever stops first ends the other's history
        return refuse(f"{parser.prog}: error: --memory-snapshot {args.memory_snapshot} with "
                      "profiling.record_memory_history=True: both record the CUDA allocator's history and the first "
                      "to stop ends the other's. Drop one: profiling.record_memory_history=False, or no "
                      "--memory-snapshot")
    if args.dry_run:
        return EXIT_OK
    from mbridge_offload.describe import offload_summary, topology
    from mbridge_offload.runtime.launch import LaunchSettings, launch

    out_dir = (args.out or Path("runs") / recipe.name).resolve()
    return launch(prepared.cfg, LaunchSettings(
        recipe_name=recipe.name, num_gpus=num_gpus, out_dir=out_dir, cpu_threads=prepared.cpu_threads,
        tuning_lines=prepared.tuning_lines, run_lines=prepared.run_lines, overlap_chunks=prepared.overlap_chunks,
        topology=topology(prepared.cfg, num_gpus), offload_lines=tuple(offload_summary(prepared.cfg)),
        warm_communicators=args.warm_communicators, memory_snapshot_steps=args.memory_snapshot))


if __name__ == "__main__":
    sys.exit(main())
