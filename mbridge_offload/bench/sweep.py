"""The optimizer offload sweep behind scripts/sweep_offload.py: one training per fraction, each in a
fresh process with the same seeds and data, then speed, memory and loss parity against the fraction-0
baseline.

The baseline runs twice by default so that loss parity is judged against the measured noise floor of
two identical runs, next to the seed's criterion (max |delta| < 0.001). Writes DIR/sweep.json,
sweep.csv, sweep.md and sweep.png. A failed run (OOM, crash) is a row with ``ok: false`` and the
reason; the sweep goes on. bench/overhead.py starts its runs and judges parity the same way.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from overrides.grammar import key_of, value_text_of
from mbridge_offload.facts.key_ranges import OFFLOAD_FRACTION_KEY as FRACTION_KEY
from mbridge_offload.facts.key_ranges import OFFLOAD_SWITCH_KEY
from mbridge_offload.facts.determinism import SEED_PARITY  # the seed's criterion: max |loss delta| vs baseline
from mbridge_offload.bench.progress import RunProgress
from mbridge_offload.planning.fraction_search import AUTO_OVERRIDE
from mbridge_offload.runtime.run_outcome import forget_outcome, recorded, write_failure

OWNED_KEYS = (OFFLOAD_SWITCH_KEY, FRACTION_KEY)
# how a run starts: the interpreter runs run_recipe by module name, so an installed package works too
RUN_RECIPE = ("-m", "mbridge_offload.cli.run_recipe")


def parse_fractions(text: str) -> list[float]:
    try:
        fractions = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"fractions must be numbers separated by commas, got {text!r}") from None
    bad = [f for f in fractions if not 0.0 <= f <= 1.0]
    if bad or not fractions:
        raise argparse.ArgumentTypeError(f"fractions must be from 0 to 1, got {text!r}")
    # a nonzero number below the smallest float reads as 0: it would run the baseline under another name
    vanished = [x.strip() for x in text.split(",") if x.strip() and float(x) == 0.0
                and any(c in "123456789" for c in x.lower().split("e")[0])]
    if vanished:
        raise argparse.ArgumentTypeError(f"fraction {vanished[0]} is too small to tell from 0 (a float reads it as 0); "
                                         "give 0 for no offload or a fraction of at least 0.001")
    repeated = sorted({f for f in fractions if fractions.count(f) > 1})
    if repeated:
        raise argparse.ArgumentTypeError(f"fraction {repeated[0]:g} is given twice in {text!r}: each fraction runs "
                                         "once; for repeated runs of one fraction use bench_offload.py --repeats N")
    return sorted(fractions)


# what the sweeping commands tell a user who set a key they set for each run
SWEEP_OWNED_FIX = f"give the fractions with --fractions a,b,c or {FRACTION_KEY}=a,b,c"


def split_overrides(overrides: list[str], owned_fix: str = SWEEP_OWNED_FIX) -> tuple[list[float] | None, list[str]]:
    """Take a Hydra multirun value of the fraction (``key=a,b,c``, a welcome alias) out of the overrides; refuse
    the keys the command sets for each run, with ``owned_fix`` (SystemExit naming the override)."""
    fractions, rest = None, []
    for text in overrides:
        key = key_of(text)
        if key not in OWNED_KEYS:
            rest.append(text)
            continue
        prefix, value = text[:len(text) - len(text.lstrip("+~"))], value_text_of(text)
        if key == FRACTION_KEY and prefix in ("", "++") and value and "," in value:
            fractions = parse_fractions(value)
            continue
        if prefix not in ("", "++"):
            raise SystemExit(f"sweep_offload.py: {text!r}: '{prefix}' would add or delete {key}, which every recipe "
                             f"has and the command sets for each run; {owned_fix}")
        if not value:
            raise SystemExit(f"sweep_offload.py: {text!r} gives no value; {owned_fix}")
        raise SystemExit(f"sweep_offload.py: {text!r}: {key} is set by the command for each of its runs; {owned_fix}")
    return fractions, rest


def fraction_overrides(fraction: float | str) -> list[str]:
    """The overrides of one fraction; "auto" leaves the choice to the planner (it sets the switch too)."""
    if fraction == "auto":
        return [AUTO_OVERRIDE]
    if fraction == 0.0:  # the baseline: optimizer offload off altogether
        return ["optimizer.optimizer_cpu_offload=False", f"{FRACTION_KEY}=0.0"]
    return ["optimizer.optimizer_cpu_offload=True", f"{FRACTION_KEY}={fraction}"]


@dataclass(frozen=True)
class StopSignal:
    """Stop a run as a preempted (SIGTERM) or interrupted (SIGINT) job is stopped: ``signal_name`` to its
    whole process group once ``when()`` is true."""

    when: Callable[[], bool]
    signal_name: str = "SIGTERM"


def call_logged(command: list[str], log, timeout_s: float | None, stop: StopSignal | None = None) -> int | str:
    """Run ``command`` with its output in ``log``; its exit code, or "timeout". With ``stop``, the command's
    process group gets the stop signal once its condition holds, and the run goes on until it exits itself."""
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    pending = stop
    # a SIGTERM to this process (a job's time limit) ends it through the cleanup below, as a Ctrl-C does
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm) if threading.current_thread() is threading.main_thread() else None
    try:
        while True:
            try:
                return process.wait(timeout=0.5)
            except subprocess.TimeoutExpired:
                pass
            if pending is not None and pending.when():
                os.killpg(process.pid, getattr(signal, pending.signal_name))
                pending = None
            if deadline is not None and time.monotonic() > deadline:
                _kill_group(process)
                return "timeout"
    except BaseException:
        # the run is in a session of its own: a Ctrl-C or a job's time limit reaching this process would leave it
        # training (and holding the GPU) behind the next command
        _kill_group(process)
        raise
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _exit_on_sigterm(signum, frame) -> None:
    raise SystemExit(128 + signum)


def _kill_group(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()


def run_recipe_command(recipe: str, fraction: float | str, out_dir: Path, overrides: list[str],
                       extra_args: list[str]) -> list[str]:
    """The command run_one starts for one training (its log.txt begins with it)."""
    return [sys.executable, *RUN_RECIPE, "--recipe", recipe, "--out", str(out_dir), *extra_args,
            *overrides, *fraction_overrides(fraction)]


def run_one(recipe: str, fraction: float | str, out_dir: Path, overrides: list[str], extra_args: list[str],
            timeout_s: float | None, stop: StopSignal | None = None) -> dict:
    """One training in a fresh process: its summary, or the reason it failed. ``stop``: see call_logged."""
    command = run_recipe_command(recipe, fraction, out_dir, overrides, extra_args)
    out_dir.mkdir(parents=True, exist_ok=True)
    forget_outcome(out_dir)
    started = time.monotonic()
    with (out_dir / "log.txt").open("w") as log:
        log.write(" ".join(command) + "\n")
        log.flush()
        code = call_logged(command, log, timeout_s, stop)
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
    write_failure(out_dir, result["reason"])
    return result


def run_status(result: dict) -> str:
    return "ok" if "summary" in result else f"FAILED: {result.get('reason')}"


def max_abs_delta(a: list, b: list) -> float | None:
    pairs = [(x, y) for x, y in zip(a, b) if x is not None and y is not None]
    return max((abs(x - y) for x, y in pairs), default=None)


def baseline_parity(baselines: list[dict], deterministic: bool = False) -> dict:
    """The loss-parity tolerance from the baseline runs: the noise floor between identical runs (when two
    or more succeeded) or the seed's criterion, whichever is larger; with deterministic runs (where identical
    runs do not differ) the seed's criterion exactly.

    The noise floor is the largest difference between any two of them, not only from the first: an offloaded run
    is compared with the first, and it may lie as far from it as two baselines lie from each other."""
    noise = None
    if len(baselines) > 1 and all("summary" in b for b in baselines):
        noise = max(max_abs_delta(a["summary"]["losses"], b["summary"]["losses"]) or 0.0
                    for a, b in itertools.combinations(baselines, 2))
    if deterministic:
        return {"seed_criterion_max_abs_delta": SEED_PARITY, "noise_floor_max_abs_delta": noise,
                "tolerance_used": SEED_PARITY, "baseline_runs": len(baselines), "deterministic": True}
    return {"seed_criterion_max_abs_delta": SEED_PARITY, "noise_floor_max_abs_delta": noise,
            "tolerance_used": max(SEED_PARITY, noise or 0.0), "baseline_runs": len(baselines)}


def build_rows(results: list[dict], baselines: list[dict], deterministic: bool = False) -> tuple[list[dict], dict]:
    base = baselines[0].get("summary") if baselines else None
    parity = baseline_parity(baselines, deterministic)
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
    if parity.get("deterministic"):
        lines += ["", f"Deterministic runs (--deterministic): parity is judged at the seed's {SEED_PARITY} exactly; "
                  f"identical baseline runs differed by {'-' if noise is None else f'{noise:.3g}'}."]
    elif noise is None:
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


def run_sweep(recipe: str, fractions: list[float], out: Path, overrides: list[str], extra_args: list[str],
              baseline_runs: int, timeout_s: float | None, resume: bool) -> tuple[list[dict], list[dict]]:
    """Every fraction's run (the baseline's ``baseline_runs`` times), in order: (one result per fraction,
    the baseline's results). With ``resume``, a run that already finished in its folder is kept."""
    results, baselines = [], []
    progress = RunProgress(label="[sweep]", total=sum(baseline_runs if f == 0.0 else 1 for f in fractions))
    for fraction in fractions:
        runs = baseline_runs if fraction == 0.0 else 1
        for repeat in range(runs):
            name = f"fraction-{fraction:g}" + (f"-repeat{repeat}" if repeat else "")
            run_dir = out / name
            earlier = recorded(run_dir) if resume else {}
            if earlier:
                result = {"fraction": fraction, "dir": str(run_dir), "wall_s": 0.0, "reused": True, **earlier}
                progress.kept(name)
            else:
                progress.starting(name)
                result = run_one(recipe, fraction, run_dir, overrides, extra_args, timeout_s)
                progress.finished(name, run_status(result), result["wall_s"])
            if fraction == 0.0:
                baselines.append(result)
            if repeat == 0:
                results.append(result)
    return results, baselines


def write_sweep(out: Path, recipe: str, command: str, fractions: list[float], overrides: list[str],
                rows: list[dict], parity: dict) -> str:
    """DIR/sweep.json, sweep.csv, sweep.md and sweep.png; returns the markdown table."""
    title = f"{recipe}: optimizer offload sweep"
    (out / "sweep.json").write_text(json.dumps(
        {"recipe": recipe, "command": command, "fractions": fractions, "overrides": overrides,
         "parity": parity, "rows": rows,
         "host": {"cpu_count": os.cpu_count()}}, indent=2) + "\n")
    with (out / "sweep.csv").open("w", newline="") as f:
        keys = list(dict.fromkeys(k for r in rows for k in r))
        writer = csv.DictWriter(f, fieldnames=keys)
        writer.writeheader()
        writer.writerows(rows)
    table = markdown(rows, parity, title)
    (out / "sweep.md").write_text(f"Command: `{command}`\n\n{table}")
    plot(rows, out / "sweep.png", title)
    return table
