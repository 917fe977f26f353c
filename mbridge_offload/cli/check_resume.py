"""Check that an offloaded run stopped at step k and resumed continues the uninterrupted run.

    uv run scripts/check_resume.py --recipe qwen3_1b_proxy_pretrain_config --fractions 0.5,1 --save-at 5 \\
        --deterministic --out runs/resume model.num_layers=4

For each fraction, three trainings in fresh processes: a run that saves at step k and exits (or is stopped there
by SIGTERM or Ctrl-C: --stop-by sigterm|sigint), the uninterrupted run of 2k steps, and a run that resumes from that
checkpoint to 2k. With the delayed offload engine the uninterrupted run saves its weights where the first run saved
(a save applies the pending update, so the step after it runs undelayed). Rows of DIR/resume_parity.json:
fraction, mode, max_abs_loss_delta, bit_identical, ok. With --deterministic the resumed steps must equal
the uninterrupted run's bit for bit; otherwise within the seed's 0.001. Exit 0 when every row is ok, 1 if not.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from mbridge_offload.bench.progress import RunProgress
from mbridge_offload.bench.resume_parity import RUN_FOLDERS, STOP_BY, check_resume, markdown, write_results
from mbridge_offload.bench.sweep import parse_fractions
from mbridge_offload.cli.parsing import (MAX_COUNT, CommandParser, at_least_one, parse_single_fraction_command,
                                         positive_seconds)


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(prog="check_resume.py", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipe", required=True, metavar="NAME")
    parser.add_argument("--out", required=True, type=Path, metavar="DIR")
    parser.add_argument("--fractions", type=parse_fractions, default=[0.5, 1.0], metavar="F,F,...",
                        help="optimizer offload fractions to check (default 0.5,1; 0 checks a run without offload)")
    parser.add_argument("--save-at", type=at_least_one("step", MAX_COUNT // 2), default=5, metavar="K", help="the step the first run saves at and "
                        "stops (default 5); the runs train 2K steps")
    parser.add_argument("--deterministic", action="store_true",
                        help="run_recipe.py --deterministic for every run; then the resumed run must be bit-identical")
    parser.add_argument("--offload-tuning", choices=("tuned", "stock"), default="tuned",
                        help="run_recipe.py's --offload-tuning for every run (default tuned: overlap in chunks)")
    parser.add_argument("--stop-by", choices=STOP_BY, default="exit-interval",
                        help="how the first run stops at step K: exit-interval (train.exit_interval=K, the default), "
                        "sigterm (SIGTERM to its whole process group after step K, as a Slurm preemption) or sigint "
                        "(as Ctrl-C in a terminal); it saves at the next step boundary and the resumed run "
                        "continues from there")
    parser.add_argument("--keep-checkpoints", action="store_true",
                        help="keep each fraction's checkpoint (removed once compared by default: they are large)")
    parser.add_argument("--timeout", type=positive_seconds, default=None, metavar="S", help="per-run time limit in seconds")
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, overrides = parse_single_fraction_command(
        parser, argv, "give the fractions with --fractions, not as a multirun override")
    extra = ["--offload-tuning", args.offload_tuning] + (["--deterministic"] if args.deterministic else [])
    rows = []
    progress = RunProgress(label="[resume parity]", total=len(RUN_FOLDERS) * len(args.fractions))
    for fraction in args.fractions:
        rows.append(check_resume(args.recipe, fraction, args.out / f"fraction-{fraction:g}", args.save_at, overrides,
                                 extra, args.deterministic, args.timeout, args.stop_by, args.keep_checkpoints,
                                 progress))
        write_results(args.out, args.recipe, rows)
    print(markdown(rows, args.recipe))
    return 0 if all(row["ok"] for row in rows) else 1
