#!/usr/bin/env python3
"""Sweep the optimizer offload fraction: one training per fraction, each in a fresh process with the
same seeds and data, then speed, memory and loss parity against the fraction-0 baseline.

    uv run scripts/sweep_offload.py --recipe qwen3_1b_proxy_pretrain_config --fractions 0,0.25,0.5,0.75,1 \\
        --out runs/sweep-1b train.train_iters=20
    uv run scripts/sweep_offload.py --recipe qwen3_1b_proxy_pretrain_config --out runs/s \\
        optimizer.optimizer_offload_fraction=0,0.5,1          # Hydra multirun syntax works too

The baseline runs twice (``--baseline-runs``, default 2) so that loss parity is judged against the
measured noise floor of two identical runs, next to the seed's criterion (max |delta| < 0.001).
Writes DIR/sweep.json, sweep.csv, sweep.md and sweep.png. A failed run (OOM, crash) is a row with
``ok: false`` and the reason; the sweep goes on.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path


from overrides.grammar import key_of

SEED_PARITY = 0.001  # the seed's criterion: max |loss delta| vs baseline
FRACTION_KEY = "optimizer.optimizer_offload_fraction"
OWNED_KEYS = ("optimizer.optimizer_cpu_offload", FRACTION_KEY)
RUN_RECIPE = Path(__file__).resolve().parent / "run_recipe.py"


def parse_fractions(text: str) -> list[float]:
    try:
        fractions = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"fractions must be numbers separated by commas, got {text!r}") from None
    bad = [f for f in fractions if not 0.0 <= f <= 1.0]
    if bad or not fractions:
        raise argparse.ArgumentTypeError(f"fractions must be from 0 to 1, got {text!r}")
    return sorted(set(fractions))


def split_overrides(overrides: list[str]) -> tuple[list[float] | None, list[str]]:
    """Take a Hydra multirun value of the fraction out of the overrides (a welcome alias)."""
    fractions, rest = None, []
    for text in overrides:
        key = key_of(text)
        if key == FRACTION_KEY and "," in text:
            fractions = parse_fractions(text.split("=", 1)[1])
        elif key in OWNED_KEYS:
            raise SystemExit(f"sweep_offload.py: {key} is set by the sweep for each run; "
                             f"give the fractions with --fractions or {FRACTION_KEY}=a,b,c")
        else:
            rest.append(text)
    return fractions, rest


def fraction_overrides(fraction: float) -> list[str]:
    if fraction == 0.0:  # the baseline: optimizer offload off altogether
        return ["optimizer.optimizer_cpu_offload=False", f"{FRACTION_KEY}=0.0"]
    return ["optimizer.optimizer_cpu_offload=True", f"{FRACTION_KEY}={fraction}"]


def recorded(run_dir: Path, succeeded: bool = True) -> dict:
    """What a finished run left: its summary (when it succeeded) or its failure reason; {} if neither."""
    summary, failure = run_dir / "summary.json", run_dir / "failure.json"
    if succeeded and summary.exists():
        return {"summary": json.loads(summary.read_text())}
    if failure.exists():
        return {"reason": json.loads(failure.read_text())["reason"]}
    return {}


def run_one(recipe: str, fraction: float, out_dir: Path, overrides: list[str], extra_args: list[str],
            timeout_s: float | None) -> dict:
    command = [sys.executable, str(RUN_RECIPE), "--recipe", recipe, "--out", str(out_dir), *extra_args,
               *overrides, *fraction_overrides(fraction)]
    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in ("summary.json", "failure.json"):  # an earlier run's results must not pass for this one's
        (out_dir / stale).unlink(missing_ok=True)
    started = time.monotonic()
    with (out_dir / "log.txt").open("w") as log:
        log.write(" ".join(command) + "\n")
        log.flush()
        try:
            code = subprocess.call(command, stdout=log, stderr=subprocess.STDOUT, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            code = "timeout"
    result = {"fraction": fraction, "dir": str(out_dir), "returncode": code,
              "wall_s": round(time.monotonic() - started, 1)}
    result.update(recorded(out_dir, succeeded=code == 0))
    if "summary" in result or "reason" in result:
        return result
    if code == "timeout":
        result["reason"] = f"timed out after {timeout_s:.0f} s"
    elif isinstance(code, int) and code < 0:
        result["reason"] = (f"killed by signal {-code}" + (" (SIGKILL: host memory exhausted?)" if code == -9 else ""))
    elif code == 2:
        result["reason"] = "invalid configuration (see log.txt)"
    else:
        tail = (out_dir / "log.txt").read_text().strip().splitlines()[-1:] or [""]
        result["reason"] = f"exit code {code}: {tail[0][:200]}"
    # run_recipe.py records the failures it sees; a killed or timed-out run cannot, so record it here:
    # --resume then keeps it like any other finished run instead of launching it again
    (out_dir / "failure.json").write_text(json.dumps({"reason": result["reason"]}, indent=2) + "\n")
    return result


def max_abs_delta(a: list, b: list) -> float | None:
    pairs = [(x, y) for x, y in zip(a, b) if x is not None and y is not None]
    return max((abs(x - y) for x, y in pairs), default=None)


def baseline_parity(baselines: list[dict]) -> dict:
    """The loss-parity tolerance from the baseline runs: the noise floor between identical runs (when two
    or more succeeded) or the seed's criterion, whichever is larger."""
    base = baselines[0].get("summary") if baselines else None
    noise = None
    if len(baselines) > 1 and all("summary" in b for b in baselines):
        noise = max(max_abs_delta(base["losses"], b["summary"]["losses"]) or 0.0 for b in baselines[1:])
    return {"seed_criterion_max_abs_delta": SEED_PARITY, "noise_floor_max_abs_delta": noise,
            "tolerance_used": max(SEED_PARITY, noise or 0.0), "baseline_runs": len(baselines)}


def build_rows(results: list[dict], baselines: list[dict]) -> tuple[list[dict], dict]:
    base = baselines[0].get("summary") if baselines else None
    parity = baseline_parity(baselines)
    tolerance = parity["tolerance_used"]
    rows = []
    for result in results:
        summary = result.get("summary")
        row = {"fraction": result["fraction"], "ok": summary is not None}
        if summary is None:
            row.update(step_time_s=None, slowdown_vs_baseline=None, peak_allocated_gib=None,
                       memory_saved_gib=None, final_loss=None, max_abs_loss_delta=None,
                       reason=result.get("reason", "unknown"))
        else:
            delta = max_abs_delta(base["losses"], summary["losses"]) if base else None
            row.update(
                step_time_s=summary["step_time_s"],
                slowdown_vs_baseline=(summary["step_time_s"] / base["step_time_s"]) if base else None,
                peak_allocated_gib=summary["peak_allocated_gib"],
                memory_saved_gib=(base["peak_allocated_gib"] - summary["peak_allocated_gib"]) if base else None,
                final_loss=summary["final_loss"],
                max_abs_loss_delta=delta,
                peak_host_rss_gib=summary["peak_host_rss_gib"],
                peak_pinned_host_gib=summary["peak_pinned_host_gib"],
                # inside-step peaks, where the host runs out (mbridge_offload/runtime/host_memory.py); older runs lack them
                peak_node_host_used_gib=summary.get("peak_node_host_used_gib"),
                loss_parity_seed=None if delta is None else delta < SEED_PARITY,
                loss_parity_noise_floor=None if delta is None else delta <= tolerance,
            )
        rows.append(row)
    return rows, parity


def _fmt(value, digits=3) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _short(reason: str) -> str:
    """The first sentence of a failure reason, for the table (sweep.json keeps all of it)."""
    head = reason.split(". ", 2)
    text = ". ".join(head[:2]) if reason.startswith("CUDA out of memory") else head[0]
    return text[:120].replace("|", "/")


def markdown(rows: list[dict], parity: dict, title: str) -> str:
    lines = [f"### {title}", "",
             "| fraction | step time (s) | slowdown | peak allocated (GiB) | saved (GiB) | final loss | "
             "max abs loss delta | parity (noise floor) | ok |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        slowdown = r["slowdown_vs_baseline"]
        lines.append(f"| {r['fraction']:g} | {_fmt(r['step_time_s'])} | "
                     f"{'-' if slowdown is None else f'{slowdown:.2f}x'} | "
                     f"{_fmt(r['peak_allocated_gib'], 2)} | {_fmt(r['memory_saved_gib'], 2)} | "
                     f"{_fmt(r['final_loss'], 4)} | {_fmt(r['max_abs_loss_delta'], 4)} | "
                     f"{_fmt(r.get('loss_parity_noise_floor'))} | "
                     f"{'yes' if r['ok'] else 'no: ' + _short(r.get('reason', ''))} |")
    noise = parity["noise_floor_max_abs_delta"]
    if noise is None:
        lines += ["", f"Noise floor: not measured (needs two successful baseline runs); parity is judged at "
                  f"the seed's {SEED_PARITY}."]
    else:
        lines += ["", f"Noise floor (max |loss delta| between {parity['baseline_runs']} identical baseline runs): "
                  f"{noise:.4f}; parity is judged at max(seed's {SEED_PARITY}, noise floor) = "
                  f"{parity['tolerance_used']:.4f}."]
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], path: Path, title: str) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    done = [r for r in rows if r["ok"] and r["slowdown_vs_baseline"] is not None]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([r["slowdown_vs_baseline"] for r in done], [r["memory_saved_gib"] for r in done], "o-")
    for r in done:
        ax.annotate(f"{r['fraction']:g}", (r["slowdown_vs_baseline"], r["memory_saved_gib"]),
                    textcoords="offset points", xytext=(5, 5))
    ax.set_xlabel("slowdown vs no offload (x)")
    ax.set_ylabel("peak GPU memory saved (GiB)")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sweep_offload.py", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipe", required=True, metavar="NAME")
    parser.add_argument("--fractions", type=parse_fractions, metavar="F,F,...",
                        help="optimizer offload fractions (default 0,0.25,0.5,0.75,1)")
    parser.add_argument("--out", required=True, type=Path, metavar="DIR")
    parser.add_argument("--num-gpus", type=int, metavar="N")
    parser.add_argument("--baseline-runs", type=int, default=2, metavar="K",
                        help="identical fraction-0 runs for the noise floor (default 2)")
    parser.add_argument("--timeout", type=float, default=None, metavar="S", help="per-run time limit in seconds")
    parser.add_argument("--resume", action="store_true",
                        help="keep runs that already finished in DIR (summary.json, or failure.json for a "
                             "failed run, killed and timed-out runs included): an interrupted sweep goes on where "
                             "it stopped; delete a run's folder to run it again")
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    args = parser.parse_intermixed_args(argv)

    from recipes import registry

    registry.get_or_exit(parser, args.recipe)
    multirun, overrides = split_overrides(args.overrides)
    if multirun and args.fractions and multirun != args.fractions:
        parser.error(f"--fractions and {FRACTION_KEY}=... disagree; give one")
    fractions = multirun or args.fractions or [0.0, 0.25, 0.5, 0.75, 1.0]
    if 0.0 not in fractions:
        fractions = [0.0, *fractions]  # parity and savings are measured against the baseline
    extra = ["--num-gpus", str(args.num_gpus)] if args.num_gpus else []
    args.out.mkdir(parents=True, exist_ok=True)

    results, baselines = [], []
    for fraction in fractions:
        runs = args.baseline_runs if fraction == 0.0 else 1
        for repeat in range(runs):
            name = f"fraction-{fraction:g}" + (f"-repeat{repeat}" if repeat else "")
            run_dir = args.out / name
            earlier = recorded(run_dir) if args.resume else {}
            if earlier:
                result = {"fraction": fraction, "dir": str(run_dir), "wall_s": 0.0, "reused": True, **earlier}
                print(f"[sweep] {name}: kept from an earlier run", flush=True)
            else:
                print(f"[sweep] {name} ...", flush=True)
                result = run_one(args.recipe, fraction, run_dir, overrides, extra, args.timeout)
            if not result.get("reused"):
                status = ("ok" if "summary" in result else f"FAILED: {result.get('reason')}")
                print(f"[sweep] {name}: {status} ({result['wall_s']} s)", flush=True)
            if fraction == 0.0:
                baselines.append(result)
            if repeat == 0:
                results.append(result)

    rows, parity = build_rows(results, baselines)
    title = f"{args.recipe}: optimizer offload sweep"
    command = "uv run scripts/sweep_offload.py " + " ".join(argv if argv is not None else sys.argv[1:])
    (args.out / "sweep.json").write_text(json.dumps(
        {"recipe": args.recipe, "command": command, "fractions": fractions, "overrides": overrides,
         "parity": parity, "rows": rows,
         "host": {"cpu_count": os.cpu_count()}}, indent=2) + "\n")
    with (args.out / "sweep.csv").open("w", newline="") as f:
        keys = list(dict.fromkeys(k for r in rows for k in r))
        writer = csv.DictWriter(f, fieldnames=keys)
        writer.writeheader()
        writer.writerows(rows)
    table = markdown(rows, parity, title)
    (args.out / "sweep.md").write_text(f"Command: `{command}`\n\n{table}")
    plot(rows, args.out / "sweep.png", title)
    print(table)
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
