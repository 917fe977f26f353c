"""What each part of the delayed engine's step costs: the delayed mode at fraction 1 with its CPU Adam, its gradients'
copies to the host or its weights' copies back skipped (patch/sitecustomize.py, MBRIDGE_BENCH_ABLATE: timing only,
the weights train wrong), beside the full delayed mode and the baseline without offload, in interleaved rounds, each
run a fresh process (mbridge_offload.bench.sweep.run_one, as bench_offload.py runs them).

    python3 docs/benchmarks/offload-engine/delayed-ablation/ablation.py --out DIR [--rounds 2] [--resume] \
        [--recipe qwen3_1b_proxy_pretrain_config] [OVERRIDES...]
    python3 docs/benchmarks/offload-engine/delayed-ablation/ablation.py --out DIR --profile [--stacks] --runs NAME,...
        [--resume]

Writes DIR/ablation.json and DIR/ablation.md: each run's median step (the warm-up steps excluded) against its round's
baseline, and the training thread's wait for the engine. With --profile, each named run instead runs once for 13
steps with PyTorch's profiler on steps 10-12 (Megatron Bridge's schedule traces 10-11), read by
mbridge_offload.bench.gpu_trace into DIR/NAME-gpu_trace.md (the trace itself is not kept); --stacks records Python
stacks too, so that the report names the Python function that launched the work after each gap."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

PATCH = Path(__file__).resolve().parent / "patch"
ABLATE_ENV = "MBRIDGE_BENCH_ABLATE"
# name: (what is skipped, or None for the baseline without offload; what the run shows)
RUNS = {
    "baseline": (None, "no offload"),
    "delayed": ("", "the delayed mode, whole"),
    "no-adam": ("adam", "the copies both ways, no CPU Adam"),
    "no-copies": ("gradient-copies,weight-copies", "CPU Adam on the host buffers, no copy either way"),
    "neither": ("adam,gradient-copies,weight-copies", "the engine's hooks, threads and events only"),
    "d2h-only": ("adam,weight-copies", "the gradients' copy to the host alone"),
    "h2d-only": ("adam,gradient-copies", "the weights' copy back alone"),
}
DEFAULT_RUNS = ("baseline", "delayed", "no-adam", "no-copies", "neither")  # what the first ablation ran
STACKS_OVERRIDE = "profiling.pytorch_profiler_collect_callstack=True"
PROFILE_OVERRIDES = ["train.train_iters=13", "profiling.use_pytorch_profiler=True", "profiling.profile_step_start=10",
                     "profiling.profile_step_end=12"]  # as h200.sh's profiled_run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--recipe", default="qwen3_1b_proxy_pretrain_config")
    parser.add_argument("--runs", default=",".join(DEFAULT_RUNS), help="which of " + ", ".join(RUNS))
    parser.add_argument("--resume", action="store_true", help="keep the runs a summary exists for")
    parser.add_argument("--profile", action="store_true",
                        help="one profiled 13-step run of each (no rounds, no ratios): DIR/NAME-gpu_trace.md")
    parser.add_argument("--stacks", action="store_true", help="with --profile: Python stacks in the trace")
    args, overrides = parser.parse_known_args(argv)
    names = args.runs.split(",")
    unknown = [n for n in names if n not in RUNS]
    if unknown:
        parser.error(f"--runs: unknown {unknown}; the runs are {', '.join(RUNS)}")
    if args.stacks and not args.profile:
        parser.error("--stacks is a --profile option")
    if args.profile:
        if args.rounds != parser.get_default("rounds"):
            parser.error("--profile runs each named run once: --rounds does not apply")
        if overrides:
            parser.error(f"--profile sets its own overrides ({' '.join(PROFILE_OVERRIDES)}); got {overrides}")
        return _profile(args, names, PROFILE_OVERRIDES + ([STACKS_OVERRIDE] if args.stacks else []))
    overrides = overrides or ["train.train_iters=33"]

    from mbridge_offload.bench.progress import RunProgress
    from mbridge_offload.bench.sweep import run_status
    from mbridge_offload.runtime.metrics import summarize
    from mbridge_offload.runtime.run_outcome import recorded

    progress = RunProgress(label="[ablation]", total=args.rounds * len(names))
    rows = []
    for round_number in range(1, args.rounds + 1):
        for name in names:
            skipped, means = RUNS[name]
            out = args.out / f"round-{round_number}" / name
            label = f"round {round_number}, {name}"
            if args.resume and (out / "summary.json").is_file():
                progress.kept(label)
            else:
                progress.starting(label)
                result = _run(args.recipe, name, out, overrides)
                progress.finished(label, run_status(result), result["wall_s"])
            outcome = recorded(out)
            summary, waits, marked = {}, [], None
            if "summary" in outcome:  # a failed or cut run has step records too: it measures nothing
                try:
                    summary = summarize(out)
                    skip = summary.get("warmup_steps_excluded", 0)
                    waits = [s["engine_wait_s"] for s in _steps(out)[skip:] if s.get("engine_wait_s") is not None]
                except ValueError as error:  # a torn record line
                    outcome = {"reason": f"unreadable step records: {error}"}
                marked = _skip_marked(out)
            rows.append({"round": round_number, "run": name, "skipped": skipped, "means": means,
                         "status": "ok" if "summary" in outcome else f"FAILED: {outcome.get('reason')}",
                         # a run with parts to skip that does not say so in its log skipped nothing
                         "skip_confirmed": marked if skipped else None,
                         "step_time_s": summary.get("step_time_s"),
                         "engine_wait_median_s": statistics.median(waits) if waits else None})
    for row in rows:
        base = next((r["step_time_s"] for r in rows if r["round"] == row["round"] and r["run"] == "baseline"), None)
        row["vs_baseline"] = row["step_time_s"] / base if base and row["step_time_s"] else None
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "ablation.json").write_text(json.dumps(rows, indent=1) + "\n")
    lines = ["| round | run | skipped | median step (s) | against the round's baseline | engine wait, median (ms) "
             "| status |", "|---|---|---|---|---|---|---|"]
    for row in rows:
        step = "-" if row["step_time_s"] is None else f"{row['step_time_s']:.3f}"
        ratio = "-" if row["vs_baseline"] is None else f"{row['vs_baseline']:.2f}x"
        wait = "-" if row["engine_wait_median_s"] is None else f"{1000 * row['engine_wait_median_s']:.1f}"
        status = row["status"] if row["skip_confirmed"] is not False else "NOT SKIPPED: no mark in the run's log"
        lines.append(f"| {row['round']} | {row['run']} ({row['means']}) | {row['skipped'] or '-'} | {step} | {ratio} "
                     f"| {wait} | {status} |")
    (args.out / "ablation.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


def _run(recipe: str, name: str, out: Path, overrides: list[str]) -> dict:
    """One run of the table RUNS in a fresh process, with the patch on its path and its parts to skip."""
    from mbridge_offload.bench.sweep import run_one

    skipped = RUNS[name][0]
    env = dict(os.environ)
    try:
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PATCH), os.environ.get("PYTHONPATH")]))
        os.environ.pop(ABLATE_ENV, None)
        if skipped:
            os.environ[ABLATE_ENV] = skipped
        extra = [] if skipped is None else ["--offload-engine", "delayed"]
        # the fraction sets the offload keys (sweep.fraction_overrides)
        return run_one(recipe, 1 if skipped is not None else 0, out, overrides, extra, timeout_s=900)
    finally:
        os.environ.clear()
        os.environ.update(env)


def _profile(args, names: list[str], overrides: list[str]) -> int:
    """Each named run once under the profiler; its trace read into DIR/NAME-gpu_trace.md, then deleted. With
    --resume, a run with its report is kept, and a run that trained but whose trace was not read yet is only read."""
    import shutil

    from mbridge_offload.bench import gpu_trace
    from mbridge_offload.bench.progress import RunProgress
    from mbridge_offload.bench.sweep import run_status

    progress = RunProgress(label="[ablation profile]", total=len(names))
    failed = []
    for name in names:
        out, report = args.out / name, args.out / f"{name}-gpu_trace.md"
        trace = out / "torch_profile" / "rank-0.json.gz"
        if args.resume and (report.is_file() or ((out / "summary.json").is_file() and trace.is_file())):
            progress.kept(name)
        else:
            progress.starting(name)
            result = _run(args.recipe, name, out, overrides)
            progress.finished(name, run_status(result), result["wall_s"])
            if "summary" not in result:
                failed.append(f"{name}: {result.get('reason')}")
                continue
        if RUNS[name][0] and not _skip_marked(out):  # a run with parts to skip that does not say so skipped nothing
            failed.append(f"{name}: NOT SKIPPED: no [{ABLATE_ENV}] mark in its log")
            continue
        if report.is_file():
            continue
        if not trace.is_file():
            failed.append(f"{name}: no trace written ({trace})")
            continue
        try:
            gpu_trace.main([str(trace), "--out", str(report)])
        except Exception as error:  # noqa: BLE001  (the next run's profile is still wanted)
            failed.append(f"{name}: its trace could not be read: {type(error).__name__}: {error}")
            continue
        shutil.rmtree(out / "torch_profile")
    for line in failed:
        print(f"[ablation profile] FAILED {line}")
    return 1 if failed else 0


def _skip_marked(out: Path) -> bool:
    """Whether the run's log says the patch skipped its parts."""
    log = out / "log.txt"
    return f"[{ABLATE_ENV}]" in (log.read_text(errors="replace") if log.is_file() else "")


def _steps(out: Path) -> list[dict]:
    from mbridge_offload.facts.run_records import read_steps

    ranks = read_steps(out)
    return ranks[min(ranks)] if ranks else []


if __name__ == "__main__":
    sys.exit(main())
