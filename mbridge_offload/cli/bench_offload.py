"""Stock vs tuned optimizer offload, against the floor this host allows, in one invocation.

Usage, the configurations and what it writes: scripts/bench_offload.py; the benchmark itself:
mbridge_offload/bench/overhead.py.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from overrides.grammar import key_of
from mbridge_offload.bench import overhead
from mbridge_offload.bench.sweep import parse_fractions
from mbridge_offload.cli.parsing import (CommandParser, at_least_one, check_writable, make_dir, not_negative,
                                         positive_seconds, read_json, readable_file, recipe_or_exit,
                                         refuse_bad_overrides)


def percent_above_zero(text: str) -> float:
    """An argparse type: a percentage above 0 and at most 100."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expects a percentage (a number), got {text!r}") from None
    if not 0 < value <= 100:
        raise argparse.ArgumentTypeError(f"expects a percentage above 0 and at most 100, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(prog="bench_offload.py", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipe", required=True, metavar="NAME")
    parser.add_argument("--out", required=True, type=Path, metavar="DIR")
    parser.add_argument("--fractions", type=parse_fractions, default=[0.25, 0.5, 0.75, 1.0], metavar="F,F,...",
                        help="optimizer offload fractions (default 0.25,0.5,0.75,1)")
    defaults = overhead.DEFAULT_CONFIGS
    parser.add_argument("--configs", default=",".join(defaults), metavar="NAME,...",
                        help=f"configurations to run (default {','.join(defaults)}; also: "
                             f"{', '.join(c for c in overhead.configurations(1) if c not in defaults)})")
    parser.add_argument("--num-gpus", type=at_least_one("GPU"), metavar="N",
                        help="GPUs (ranks on this node) for every run (default: the recipe's own count)")
    parser.add_argument("--baseline-runs", type=not_negative("run"), default=overhead.DEFAULT_ROUNDS, metavar="K",
                        help="identical no-offload runs, spread over the rounds: each slowdown's own baseline and "
                             f"the loss noise floor (default {overhead.DEFAULT_ROUNDS})")
    parser.add_argument("--repeats", type=at_least_one("run"), default=overhead.DEFAULT_ROUNDS, metavar="R",
                        help="run every configuration R times, in R interleaved rounds (baselines spread over "
                             "them; each round starts the configurations one place further on, so with R a multiple "
                             "of their number each takes every place equally often), and report the median over all "
                             "their steady-state steps with the spread of "
                             f"the runs (default {overhead.DEFAULT_ROUNDS}). Identical runs of the H200 differed by "
                             "up to 31%%: rounds tell a real difference from that")
    parser.add_argument("--short-runs", action="store_true",
                        help=f"allow runs of fewer than {overhead.MIN_MEASURED_STEPS} measured steps (a smoke test "
                             "of the bench, or reassembling a table measured that way; not a speed figure)")
    parser.add_argument("--deterministic", action="store_true",
                        help="every run, baselines and offloaded, with run_recipe.py --deterministic: identical "
                             "runs are then bit-identical, so a MoE routes its tokens alike in all of them (its "
                             "step time follows the routing, which otherwise diverges between runs); loss parity "
                             f"is then judged at the seed's {overhead.SEED_PARITY} exactly, without a noise floor")
    parser.add_argument("--host-json", type=readable_file, metavar="FILE",
                        help="host measurements from an earlier measure_host.py run (default: measure now)")
    parser.add_argument("--timeout", type=positive_seconds, default=None, metavar="S", help="per-run time limit in seconds")
    parser.add_argument("--resume", action="store_true", help="keep runs that already finished in DIR")
    parser.add_argument("--max-baseline-cv", type=percent_above_zero, default=None, metavar="P",
                        help="stop after the first baseline run when its steady-state steps vary more than P %% "
                             "(standard deviation over the median step): such a host cannot size a slowdown that "
                             "small (the H100s seen here ran 2-4 %% when quiet, 6-13 %% when noisy); exit code 3")
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_intermixed_args(argv)
    recipe = recipe_or_exit(parser, args.recipe)
    names = list(overhead.configurations(1))
    chosen = [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = [c for c in chosen if c not in names]
    if unknown or not chosen:
        parser.error(f"--configs: unknown {', '.join(unknown) or '(none given)'}; choose from {', '.join(names)}")
    if args.num_gpus is not None and args.num_gpus < 1:
        parser.error(f"--num-gpus expects at least 1 GPU, got {args.num_gpus}")
    if args.repeats < 1:
        parser.error(f"--repeats expects at least 1 run per configuration, got {args.repeats}")
    too_short = overhead.too_few_steps(args.overrides)
    if too_short and not args.short_runs:
        parser.error(too_short)
    if not any(key_of(o) == "train.train_iters" for o in args.overrides):
        args.overrides.append(f"train.train_iters={overhead.default_train_iters()}")
    owned = overhead.owned_overrides(args.overrides)
    if owned:
        parser.error(f"{', '.join(owned)}: set by the benchmark for each run (fractions with --fractions)")
    if args.max_baseline_cv is not None and args.baseline_runs == 0:
        parser.error(f"--max-baseline-cv {args.max_baseline_cv:g} checks the first baseline run's steps, and "
                     "--baseline-runs 0 runs none: give --baseline-runs 1 or more, or drop --max-baseline-cv")
    fractions = [f for f in args.fractions if f > 0]
    if not fractions:
        parser.error("--fractions: give at least one fraction above 0 (the baseline, 0, always runs)")
    check_writable(parser, "--out", args.out, resume=args.resume)
    host = read_json(parser, "--host-json", args.host_json) if args.host_json else None
    if args.host_json and not isinstance(host, dict):
        parser.error(f"--host-json {args.host_json}: expects a JSON object as measure_host.py writes it")
    other_mode = overhead.kept_runs_of_the_other_mode(args.out, args.deterministic) if args.resume else []
    if other_mode:
        kept_mode = "without" if args.deterministic else "with"
        parser.error(f"--resume: {', '.join(other_mode)} in {args.out} ran {kept_mode} --deterministic; resume "
                     f"{kept_mode} it, or delete those folders to run them again (baseline and offloaded runs "
                     "of one table run in one mode)")
    refuse_bad_overrides(parser, args.recipe, args.overrides)
    make_dir(parser, "--out", args.out, resume=args.resume)

    host = host if host is not None else overhead.measure(args.out, args.timeout)
    print(f"[bench] host: {json.dumps(host)}", flush=True)
    try:
        runs = overhead.run_benchmark(args.recipe, args.out, fractions, chosen, args.overrides, args.num_gpus,
                                      recipe.num_gpus, args.baseline_runs, args.repeats, host, args.resume,
                                      args.timeout, deterministic=args.deterministic,
                                      max_baseline_variation=None if args.max_baseline_cv is None
                                      else args.max_baseline_cv / 100)
    except overhead.NoisyHost as noisy:
        print(f"[bench] stopped: {noisy}", file=sys.stderr, flush=True)
        return 3
    rows, parity = overhead.build_rows(runs.results, runs.baselines, host, runs.configs,
                                       deterministic=runs.deterministic)
    verdicts = overhead.goals(rows, parity)
    # the command as given, --deterministic included: --resume with it reassembles the same table
    command = "uv run scripts/bench_offload.py " + " ".join(argv if argv is not None else sys.argv[1:])
    print(overhead.write_overhead(args.out, args.recipe, command, args.overrides, host, runs, rows, parity, verdicts))
    base = runs.baselines[0].get("summary") if runs.baselines else None
    return 0 if base and all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
