"""Stock vs tuned optimizer offload against the floor this host allows, behind scripts/bench_offload.py.

It measures the host (mbridge_offload/cli/measure_host.py), trains the no-offload baseline and, for
each fraction, each configuration of ``configurations`` in a fresh process (run_recipe, started as
bench/sweep.py starts its runs), then compares every step time with the baseline and with the floor
of mbridge_offload/planning/cost_model.py, and checks the performance issue's goals (``GOALS``).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from overrides.grammar import key_of
from mbridge_offload.bench.progress import RunProgress
from mbridge_offload.bench.sweep import OWNED_KEYS, SEED_PARITY, baseline_parity, max_abs_delta, run_one, run_status
from mbridge_offload.facts.cores import available_cores
from mbridge_offload.facts.offload_engine import (COPY_AT_NEXT_STEP, COPY_PAUSE_KEY, COPY_WINDOW_KEY,
                                                  DELAYED_COPY_START_KEY, FETCH_AHEAD_KEY, STREAM_MOMENTS_KEY, ZERO_BY_REGION_KEY)
from mbridge_offload.runtime.run_outcome import recorded

OVERLAP_KEY = "optimizer.overlap_cpu_optimizer_d2h_h2d"
# config: {fraction: the slowdown an issue asks for}: tuned (the first performance issue), the engines (#16). A
# configuration that varies one of these (engine-delayed-one-piece, engine-exact-by-region-three-quarter-cores, ...)
# is held to the goal of the one it varies (``goal_of``); an opt-in mode that is not the same update has its own.
GOALS = {"tuned": {0.25: 1.05, 1.0: 1.25}, "engine-exact": {0.25: 1.05, 1.0: 1.30},
         "engine-stream": {0.25: 1.05, 1.0: 1.30}, "engine-delayed": {1.0: 1.10},
         "engine-stream-bf16-moments": {1.0: 1.10}}  # not the update without offload: an opt-in mode's goal
DEFAULT_ROUNDS = 3  # interleaved rounds, each with its own baseline (issue #16: slowdowns against the same run)
MIN_MEASURED_STEPS = 30  # steady-state steps per run that a speed figure needs (issue #16)
DEFAULT_CONFIGS = ("stock-all-cores", "stock-1-thread", "overlap-on", "overlap-chunked", "tuned")
MEASURE_HOST = ("-m", "mbridge_offload.cli.measure_host")  # run by module name, as RUN_RECIPE
DETERMINISTIC_ARG = "--deterministic"  # run_recipe.py's: bit-reproducible runs (mbridge_offload/facts/determinism.py)


def configurations(cores: int) -> dict[str, dict]:
    """name: how run_recipe.py is called for it (extra arguments, overrides), what it stands for, and, for
    the fixed ones, the settings it runs with on one rank (to know when tuned is the same run)."""
    from mbridge_offload.runtime.offload_tuning import TUNED_OVERLAP_CHUNKS

    stock = ["--offload-tuning", "stock"]
    chunks = str(TUNED_OVERLAP_CHUNKS)

    def fixed(threads: int, overlap: bool, overlap_chunks: int | None = None) -> dict:
        return {OVERLAP_KEY: overlap, "optimizer.pin_cpu_grads": True, "optimizer.pin_cpu_params": True,
                "threads": threads, "overlap_chunks": overlap_chunks}

    engines = {f"engine-{mode}": {"config": f"engine-{mode}",
                                  "args": ["--offload-tuning", "tuned", "--offload-engine", mode], "overrides": [],
                                  "means": f"tuned, with the streaming offload engine's {mode} mode "
                                           "(mbridge_offload/runtime/streaming_engine.py)"}
               for mode in ("exact", "stream", "delayed")}
    one_piece = {f"engine-{mode}-one-piece": {**engines[f"engine-{mode}"], "config": f"engine-{mode}-one-piece",
                                              "overrides": [f"++{COPY_WINDOW_KEY}=1"],
                                              "means": f"engine-{mode} with one piece of its copies in flight instead "
                                                       f"of two ({COPY_WINDOW_KEY}=1, mbridge_offload/runtime/"
                                                       "copy_pieces.py)"}
                 for mode in ("exact", "delayed")}
    # a rank's threads on three quarters of the cores (the engine's CPU Adam on one fewer: streaming_engine keeps
    # one for the launches), the rest left to the training thread and the copy threads, which run beside CPU Adam in
    # these modes: with all cores, CPU Adam's threads, the training thread and two copy threads outnumber the cores
    fewer = max(2, 3 * cores // 4)
    fewer_threads = {f"{name}-three-quarter-cores": {**config, "config": f"{name}-three-quarter-cores",
                                                     "args": [*config["args"], "--cpu-threads", str(fewer)],
                                                     "means": f"{name} with --cpu-threads {fewer} of the {cores} cores "
                                                              f"(CPU Adam on {fewer - 1} threads)"}
                     for name, config in {**engines, **one_piece}.items() if not name.startswith("engine-stream")}
    return {
        "stock-all-cores": {"config": "stock", "args": [*stock, "--cpu-threads", str(cores)],
                            "overrides": [f"{OVERLAP_KEY}=False"], "settings": fixed(cores, False),
                            "means": f"library defaults (overlap off), {cores} threads: one rank on the node"},
        "stock-1-thread": {"config": "stock", "args": [*stock, "--cpu-threads", "1"],
                           "overrides": [f"{OVERLAP_KEY}=False"], "settings": fixed(1, False),
                           "means": "library defaults, 1 thread: what torchrun gives each of several ranks"},
        "overlap-on": {"config": "overlap", "args": [*stock, "--cpu-threads", str(cores)],
                       "overrides": [f"{OVERLAP_KEY}=True"], "settings": fixed(cores, True),
                       "means": f"library defaults with D2H/H2D overlap on (one CPU optimizer per tensor), "
                                f"{cores} threads"},
        "overlap-chunked": {"config": "overlap", "args": [*stock, "--cpu-threads", str(cores), "--overlap-chunks",
                                                          chunks],
                            "overrides": [f"{OVERLAP_KEY}=True"], "settings": fixed(cores, True, TUNED_OVERLAP_CHUNKS),
                            "means": f"overlap on in {chunks} chunks (--overlap-chunks {chunks}), {cores} threads"},
        "tuned": {"config": "tuned", "args": ["--offload-tuning", "tuned"], "overrides": [],
                  "means": f"run_recipe.py's offload tuning (threads per rank, overlap in {chunks} chunks, "
                           "pinned buffers)"},
        **engines,
        **one_piece,
        **fewer_threads,
        **{f"engine-{mode}-by-region": {**engines[f"engine-{mode}"], "config": f"engine-{mode}-by-region",
                                        "overrides": [f"++{ZERO_BY_REGION_KEY}=on"],
                                        "means": f"engine-{mode} with the gradient buffers zeroed by region "
                                                 f"({ZERO_BY_REGION_KEY}=on, mbridge_offload/runtime/grad_regions.py)"}
           for mode in ("exact", "delayed")},
        "engine-delayed-copies-next-step": {**engines["engine-delayed"], "config": "engine-delayed-copies-next-step",
                                           "overrides": [f"++{DELAYED_COPY_START_KEY}={COPY_AT_NEXT_STEP}"],
                                           "means": "engine-delayed with each step's gradient copies started at the "
                                                    "next step's gradient zeroing, after the step's reads "
                                                    f"({DELAYED_COPY_START_KEY}={COPY_AT_NEXT_STEP})"},
        **{f"engine-{mode}-spaced": {**engines[f"engine-{mode}"], "config": f"engine-{mode}-spaced",
                                     "overrides": [f"++{COPY_PAUSE_KEY}=20"],
                                     "means": f"engine-{mode} with every piece of its copies enqueued at once, each "
                                              f"after a GPU-side pause of about 20 us ({COPY_PAUSE_KEY}=20)"}
           for mode in ("exact", "delayed")},
        "engine-delayed-copies-next-step-spaced": {
            **engines["engine-delayed"], "config": "engine-delayed-copies-next-step-spaced",
            "overrides": [f"++{DELAYED_COPY_START_KEY}={COPY_AT_NEXT_STEP}", f"++{COPY_PAUSE_KEY}=20"],
            "means": "engine-delayed with both: its copies from the next step's gradient zeroing, every piece enqueued "
                     "at once after a ~20 us GPU-side pause"},
        "engine-stream-fetch-ahead": {**engines["engine-stream"], "config": "engine-stream-fetch-ahead",
                                      "overrides": [f"++{FETCH_AHEAD_KEY}=on"],
                                      "means": "engine-stream with fetch-ahead on (mbridge_offload/runtime/"
                                               "fetch_ahead.py): the chunks after the ring's come up during the "
                                               "backward"},
        "engine-stream-bf16-moments": {**engines["engine-stream"], "config": "engine-stream-bf16-moments",
                                       "overrides": [f"++{STREAM_MOMENTS_KEY}=bf16"],
                                       "means": "engine-stream with Adam's moments in bf16 on the host and in the ring "
                                                "(MBRIDGE_OFFLOAD_STREAM_MOMENTS=bf16): half the bytes each way, not "
                                                "bit-identical"},
    }


def tuned_same_as(configs: dict[str, dict], ranks_on_node: int, cores: int) -> str | None:
    """The configuration tuned resolves to with one rank per node (it then gets every core), if any: one
    run serves both rows. With several ranks the tuning splits the cores, which no fixed one does."""
    from mbridge_offload.runtime.offload_tuning import TUNED_KEYS, TUNED_OVERLAP_CHUNKS

    if ranks_on_node != 1:
        return None
    tuned = {key: value for key, (value, _) in TUNED_KEYS.items()}
    tuned.update(threads=cores,
                 overlap_chunks=TUNED_OVERLAP_CHUNKS if tuned[OVERLAP_KEY] else None)
    return next((name for name, c in configs.items() if c.get("settings") == tuned), None)


def measure(out: Path, timeout_s: float | None) -> dict:
    path = out / "host.json"
    subprocess.run([sys.executable, *MEASURE_HOST, "--json", str(path)], check=True, timeout=timeout_s,
                   stdout=subprocess.DEVNULL)
    return json.loads(path.read_text())


def run(recipe: str, fraction: float, run_dir: Path, overrides: list[str], args: list[str],
        resume: bool, timeout_s: float | None, progress: RunProgress) -> dict:
    earlier = recorded(run_dir) if resume else {}
    if earlier:
        progress.kept(run_dir.name)
        return {"fraction": fraction, "dir": str(run_dir), "reused": True, **earlier}
    progress.starting(run_dir.name)
    result = run_one(recipe, fraction, run_dir, overrides, args, timeout_s)
    progress.finished(run_dir.name, run_status(result), result["wall_s"])
    return result


def build_rows(results: list[tuple[str, dict]], baselines: list[dict], host: dict | None,
               configs: dict[str, dict], deterministic: bool = False) -> tuple[list[dict], dict]:
    """One row per configuration and fraction; ``deterministic``: the runs ran with --deterministic, so
    loss parity is judged at the seed's criterion exactly (identical runs do not differ: no noise floor)."""
    from mbridge_offload.planning.cost_model import floor

    base = baselines[0].get("summary") if baselines else None
    baseline_step, spread = baseline_step_time(baselines)
    parity = {**baseline_parity(baselines, deterministic), "baseline_step_time_s": baseline_step,
              "baseline_step_time_spread": spread}
    tolerance = parity["tolerance_used"]
    rows = []
    for name, result in results:
        summary = result.get("summary")
        row = {"fraction": result["fraction"], "config": configs[name]["config"], "variant": name,
               "ok": summary is not None}
        if summary is None:
            row.update(step_time_s=None, slowdown_vs_baseline=None, floor_s=None, reason=result.get("reason"))
            rows.append(row)
            continue
        step = summary["step_time_s"]
        traffic = summary.get("offload_traffic")
        limits = floor(traffic, baseline_step, host) if (traffic and base and host and "d2h_gbps" in host) else {}
        deltas = ([max_abs_delta(base["losses"], losses) for losses in summary.get("repeat_losses", [summary["losses"]])]
                  if base else [])
        delta = max((d for d in deltas if d is not None), default=None)
        row.update(
            cpu_threads_per_rank=summary.get("cpu_threads_per_rank"),
            overlap=summary.get("overlap_cpu_optimizer_d2h_h2d"),
            step_time_s=step,
            slowdown_vs_baseline=step / baseline_step if base else None,
            floor_s=limits.get("floor_s"),
            floor_slowdown=limits.get("floor_slowdown"),
            adam_floor_s=limits.get("adam_floor_s"),
            over_floor_s=(step - limits["floor_s"]) if limits else None,
            breakdown=summary.get("offload_breakdown"),
            traffic=traffic,
            floor_parts=limits or None,
            peak_allocated_gib=summary["peak_allocated_gib"],
            max_abs_loss_delta=delta,
            loss_parity_noise_floor=None if delta is None else delta <= tolerance,
        )
        if result.get("same_run_as"):
            row["same_run_as"] = result["same_run_as"]
        if result.get("runs", 1) > 1:
            row.update(runs=result["runs"], step_time_spread=result["step_time_spread"])
            per_round = round_slowdowns(summary.get("round_step_times_s"), baselines)
            if per_round:
                row["round_slowdowns"] = per_round
        rows.append(row)
    return rows, parity


def round_slowdowns(step_times: list[float] | None, baselines: list[dict]) -> list[float] | None:
    """Each round's step time over the baseline of the same round (the k-th baseline ran in round k), when
    every round has exactly one baseline that finished; else None."""
    if not step_times or len(baselines) != len(step_times) or any("summary" not in b for b in baselines):
        return None
    return [step / b["summary"]["step_time_s"] for step, b in zip(step_times, baselines)]


def merge_repeats(runs: list[dict]) -> dict:
    """One result for a configuration's repeated runs: the median over all their steady-state steps (as
    for the baseline), the spread of the runs' own medians, the per-part medians of the breakdown, the
    worst loss and memory. A failed repeat fails the configuration, with its reason."""
    import statistics

    if len(runs) == 1:
        return runs[0]
    failed = next((k for k, r in enumerate(runs) if "summary" not in r), None)
    if failed is not None:
        return {"fraction": runs[0]["fraction"], "reason": f"run {failed + 1} of {len(runs)}: "
                                                           f"{runs[failed].get('reason', 'unknown')}"}
    summaries = [r["summary"] for r in runs]
    step, spread = baseline_step_time(runs)
    parts = [s.get("offload_breakdown") or {} for s in summaries]
    breakdown = {key: statistics.median(p[key] for p in parts if key in p) for key in parts[0]} or None
    merged = {**summaries[0], "step_time_s": step, "offload_breakdown": breakdown,
              "peak_allocated_gib": max(s["peak_allocated_gib"] for s in summaries),
              "repeat_losses": [s["losses"] for s in summaries],
              "round_step_times_s": [s["step_time_s"] for s in summaries]}
    return {"fraction": runs[0]["fraction"], "summary": merged, "runs": len(runs), "step_time_spread": spread}


def steady_steps(summary: dict) -> list[float]:
    """A run's step times after the warm-up its summary excludes."""
    return summary["step_times_s"][summary.get("warmup_steps_excluded", 0):]


def baseline_step_time(baselines: list[dict]) -> tuple[float | None, float | None]:
    """Median steady-state step time over every baseline run's steps pooled, and how far the runs'
    own medians lie apart (relative): identical runs differ, and slowdowns are no finer than that."""
    done = [b["summary"] for b in baselines if "summary" in b]
    pooled = [t for s in done for t in steady_steps(s)]
    if not pooled:
        return None, None
    step = statistics.median(pooled)
    medians = [s["step_time_s"] for s in done]
    return step, (max(medians) - min(medians)) / step if len(medians) > 1 else None


def goal_of(config: str) -> dict[float, float]:
    """{fraction: slowdown} a configuration is held to: its own ``GOALS`` entry, else that of the longest name in
    ``GOALS`` it extends by ``-...``; none for the others (stock, overlap-on, ...)."""
    extended = [name for name in GOALS if config == name or config.startswith(f"{name}-")]
    return GOALS[max(extended, key=len)] if extended else {}


def goals(rows: list[dict], parity: dict | None = None) -> list[dict]:
    """The issues' goals for the tuned and engine runs (``goal_of``), with what the floor says is possible.

    ``undecided_because`` says why a measured slowdown does not settle its goal, or is None: the configuration's
    rounds, each against its own baseline, fall on both sides of the goal; or, without rounds, the goal lies within
    the baseline's run-to-run spread (``parity``'s ``baseline_step_time_spread``: how far identical baselines' medians
    lie apart) of the slowdown. ``met``: every round at or under the goal where the rounds settle it, else the pooled
    slowdown's side of it."""
    spread = (parity or {}).get("baseline_step_time_spread")
    verdicts = []
    for config in dict.fromkeys(row["config"] for row in rows):
        for fraction, goal in goal_of(config).items():
            row = next((r for r in rows if r["fraction"] == fraction and r["config"] == config and r["ok"]), None)
            if row is None:
                continue
            # the floor prices the library's placement (the update after backward), which the engines leave
            floor_slowdown = None if config.startswith("engine-") else row.get("floor_slowdown")
            # no slowdown where no baseline trained (e.g. the validator refused it): the goal is not measured
            met = None if row["slowdown_vs_baseline"] is None else row["slowdown_vs_baseline"] <= goal
            rounds = row.get("round_slowdowns") or []
            undecided_because = None if met is None else _undecided_because(row, rounds, goal, spread)
            settled_by_rounds = met is not None and len(rounds) > 1 and undecided_because is None
            if settled_by_rounds:
                met = max(rounds) <= goal
            possible = None if floor_slowdown is None else floor_slowdown <= goal
            verdicts.append({"fraction": fraction, "config": config, "goal_slowdown": goal,
                             "tuned_slowdown": row["slowdown_vs_baseline"], "floor_slowdown": floor_slowdown,
                             "met": met, "possible_on_this_host": possible, "undecided_because": undecided_because,
                             "deciding_rounds": rounds if settled_by_rounds else None})
    return verdicts


def _undecided_because(row: dict, rounds: list[float], goal: float, spread: float | None) -> str | None:
    """Why a row's slowdown does not settle ``goal`` (see ``goals``), or None."""
    if len(rounds) > 1:
        if min(rounds) <= goal < max(rounds):
            return f"its {len(rounds)} rounds ran {_ratio_range(rounds)} against their own baselines, on both sides of the goal"
        return None
    slowdown = row["slowdown_vs_baseline"]
    if spread and abs(slowdown - goal) <= slowdown * spread:
        return (f"the goal lies within the baseline's run-to-run spread ({100 * spread:.0f}% between identical runs) "
                f"of the {slowdown:.2f}x measured")
    return None


def _ratio_range(ratios: list[float]) -> str:
    return f"{min(ratios):.2f}-{max(ratios):.2f}x"


def _floor_alone(verdict: dict) -> str:
    return f"the floor alone is {verdict['floor_slowdown']:.2f}x on this host"


def _f(value, digits: int = 3, suffix: str = "") -> str:
    return "-" if value is None else f"{value:.{digits}f}{suffix}"


def _runs_note(row: dict) -> str:
    """After a repeated configuration's step time: how many runs, how far apart their medians lie."""
    if row.get("runs", 1) <= 1:
        return ""
    return f" ({row['runs']} runs, {_f(100 * row['step_time_spread'], 0, '%')} apart)"


def _yes_no(value: bool | None) -> str:
    return "-" if value is None else ("yes" if value else "no")


def markdown(rows: list[dict], parity: dict, verdicts: list[dict], title: str) -> str:
    spread = parity.get("baseline_step_time_spread")
    runs = parity["baseline_runs"]
    how = (f"median of the steady-state steps of {runs} identical runs; their own medians differ by "
           f"{_f(spread and 100 * spread, 1, '%')}" if runs > 1 else
           "median of the steady-state steps of 1 run; the run-to-run spread was not measured")
    lines = [f"### {title}", "",
             f"Baseline (no offload): {_f(parity.get('baseline_step_time_s'))} s per step ({how}).", "",
             "| fraction | config | threads | overlap | step (s) | slowdown | floor (s) | floor slowdown | "
             "over floor (s) | D2H (s) | CPU Adam (s) | H2D (s) | offloaded step (s) | max abs loss delta | parity | ok |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        b = r.get("breakdown") or {}
        lines.append(
            f"| {r['fraction']:g} | {r['variant']}{' (= ' + r['same_run_as'] + ' run)' if r.get('same_run_as') else ''} | "
            f"{r.get('cpu_threads_per_rank', '-')} | "
            f"{'-' if r.get('overlap') is None else ('on' if r['overlap'] else 'off')} | {_f(r['step_time_s'])}"
            f"{_runs_note(r)} | "
            f"{_f(r['slowdown_vs_baseline'], 2, 'x')} | {_f(r.get('floor_s'))} | {_f(r.get('floor_slowdown'), 2, 'x')} | "
            f"{_f(r.get('over_floor_s'))} | {_f(b.get('d2h_s'))} | {_f(b.get('cpu_optimizer_s'))} | "
            f"{_f(b.get('h2d_s'))} | {_f(b.get('optimizer_step_s'))} | {_f(r.get('max_abs_loss_delta'), 4)} | "
            f"{_yes_no(r.get('loss_parity_noise_floor'))} | {'yes' if r['ok'] else 'no: ' + str(r.get('reason', ''))[:100]} |")
    for r in rows:
        if r.get("round_slowdowns"):
            ratios = r["round_slowdowns"]
            lines += ["", f"{r['variant']} at {r['fraction']:g}, each round against its own baseline: "
                          + ", ".join(f"{x:.2f}x" for x in ratios)
                          + f" (median {statistics.median(ratios):.2f}x, {_ratio_range(ratios)})."]
    noise = parity["noise_floor_max_abs_delta"]
    if parity.get("deterministic"):  # identical runs are bit-identical: a loss that differs is the offload's
        lines += ["", f"Loss parity tolerance: the seed's {SEED_PARITY} exactly: every run deterministic "
                      f"({DETERMINISTIC_ARG}); the identical baseline runs differed by "
                      f"{'not measured' if noise is None else f'{noise:.4g}'}."]
    else:
        lines += ["", f"Loss parity tolerance: max(seed's {SEED_PARITY}, noise floor "
                      f"{'not measured' if noise is None else f'{noise:.4f}'}) = {parity['tolerance_used']:.4f}."]
    for v in verdicts:
        if v["met"] is None:
            verdict = "not measured: no baseline run trained (its folder's failure.json says why)"
        elif v.get("undecided_because"):
            verdict = (f"undecided: {v['undecided_because']}; run more rounds, on a host whose baseline is steady "
                       "(--max-baseline-cv stops a bench on one that is not)")
            if v["possible_on_this_host"] is False:
                verdict += f" ({_floor_alone(v)})"
        elif v.get("deciding_rounds") and v["met"] != (v["tuned_slowdown"] <= v["goal_slowdown"]):
            verdict = (f"{'met' if v['met'] else 'not met'}: every round ({_ratio_range(v['deciding_rounds'])}) "
                       f"{'at or under' if v['met'] else 'over'} the goal, whatever the pooled median")
        elif v["met"] and v["possible_on_this_host"] is False:
            verdict = (f"met, and faster than the floor model's {v['floor_slowdown']:.2f}x: inside the run-to-run "
                       f"spread of the baseline's step time ({_f(spread and 100 * spread, 0, '%')} between identical runs)"
                       if spread else f"met, and faster than the floor model's {v['floor_slowdown']:.2f}x: the "
                       "baseline's run-to-run spread (not measured: one baseline run) is the likely reason")
        elif v["met"]:
            verdict = "met"
        elif v["floor_slowdown"] is None:
            verdict = "not met"
        elif v["possible_on_this_host"] is False:
            verdict = f"not met: {_floor_alone(v)}"
        else:
            verdict = f"not met; the floor allows {_f(v['floor_slowdown'], 2, 'x')}"
        lines.append(f"Goal at fraction {v['fraction']:g}: {v.get('config', 'tuned')} <= {v['goal_slowdown']:.2f}x; measured "
                     f"{_f(v['tuned_slowdown'], 2, 'x')}, floor {_f(v['floor_slowdown'], 2, 'x')}: {verdict}.")
    return "\n".join(lines) + "\n"


def default_train_iters() -> int:
    """The fewest steps that leave MIN_MEASURED_STEPS after the warm-up the summary excludes."""
    from mbridge_offload.runtime.metrics import warmup_steps

    steps = MIN_MEASURED_STEPS
    while steps - warmup_steps(steps) < MIN_MEASURED_STEPS:
        steps += 1
    return steps


def too_few_steps(overrides: list[str]) -> str | None:
    """Why ``train.train_iters`` in ``overrides`` is too short for a speed figure, or None."""
    from mbridge_offload.runtime.metrics import warmup_steps

    given = [o.split("=", 1)[1] for o in overrides if key_of(o) == "train.train_iters" and "=" in o]
    if not given:
        return None
    try:
        steps = int(given[-1])
    except ValueError:
        return None  # the override's own check names it
    measured = steps - warmup_steps(steps)
    if measured >= MIN_MEASURED_STEPS:
        return None
    return (f"train.train_iters={steps} leaves {measured} measured steps (the first {warmup_steps(steps)} are "
            f"warm-up); a speed figure needs {MIN_MEASURED_STEPS} or more: train.train_iters={default_train_iters()} "
            "or more, or --short-runs for a smoke test")


def owned_overrides(overrides: list[str]) -> list[str]:
    """The overrides of keys the benchmark sets for each run itself (refused on its command line)."""
    return [o for o in overrides if key_of(o) in (*OWNED_KEYS, OVERLAP_KEY)]


def every_run_args(num_gpus: int | None, deterministic: bool) -> list[str]:
    """The run_recipe.py arguments every run gets, baselines and offloaded alike (a configuration adds its own):
    a slowdown or a loss delta compares runs that differ only in the offload."""
    return (["--num-gpus", str(num_gpus)] if num_gpus else []) + ([DETERMINISTIC_ARG] if deterministic else [])


def kept_runs_of_the_other_mode(out: Path, deterministic: bool) -> list[str]:
    """The finished runs in ``out`` (those --resume keeps) started with --deterministic when ``deterministic``
    is false, or without it when true, as the command their log.txt begins with says: kept, they would be
    judged at the wrong parity tolerance, and their routing (MoE) would differ from the new runs'."""
    other = []
    for run_dir in sorted(p for p in out.iterdir() if p.is_dir()) if out.is_dir() else []:
        log = run_dir / "log.txt"
        if not log.is_file() or not recorded(run_dir):
            continue  # not kept (it runs again), or no command to tell
        with log.open() as f:
            launched = f.readline().split()
        if (DETERMINISTIC_ARG in launched) != deterministic:
            other.append(run_dir.name)
    return other


@dataclass(frozen=True)
class BenchRuns:
    results: list[tuple[str, dict]]  # (configuration, its runs merged) per fraction, in ``order``
    baselines: list[dict]
    configs: dict[str, dict]  # the configurations as run on this host's cores
    order: list[str]  # the configurations chosen, in the order they ran
    deterministic: bool = False  # every run with run_recipe.py --deterministic


class NoisyHost(Exception):
    """The first baseline a bench ran varied more than ``--max-baseline-cv`` allows: it stops before the rest."""


def step_variation(summary: dict) -> float | None:
    """How much a run's steady-state steps vary: their standard deviation over their median (a fraction); None
    with fewer than two."""
    steps = steady_steps(summary)
    return statistics.pstdev(steps) / statistics.median(steps) if len(steps) > 1 else None


def check_steady(baseline: dict, max_variation: float, progress: RunProgress) -> None:
    """Raise NoisyHost when ``baseline``'s steps vary more than ``max_variation``; say so when it cannot tell."""
    summary = baseline.get("summary")
    variation = None if summary is None else step_variation(summary)
    if variation is None:
        print(f"{progress.label} --max-baseline-cv: {baseline.get('dir')} "
              f"{'did not train' if summary is None else 'has fewer than 2 steady steps'}, so the host's noise was "
              "not checked; the other runs go on", flush=True)
        return
    if variation > max_variation:
        raise NoisyHost(
            f"--max-baseline-cv {100 * max_variation:g}: the first baseline this bench ran ({baseline.get('dir')}) "
            f"varied {100 * variation:.1f}% from step to step (standard deviation over its median step, "
            f"{summary['step_time_s']:.3f} s), more than the limit: a host that noisy cannot tell slowdowns of a few "
            "percent from its own noise, so the other runs did not start. Run on a quieter host (nothing else on "
            "its GPU or cores), or raise the limit; --resume keeps the finished runs and checks the first baseline "
            "it runs anew")


def run_benchmark(recipe: str, out: Path, fractions: list[float], chosen: list[str], overrides: list[str],
                  num_gpus: int | None, recipe_gpus: int, baseline_runs: int, repeats: int, host: dict,
                  resume: bool, timeout_s: float | None, deterministic: bool = False,
                  max_baseline_variation: float | None = None) -> BenchRuns:
    """Every run of the chosen configurations at every fraction, and the baselines, in ``repeats``
    interleaved rounds, each starting the configurations one place further on than the round before (balanced
    when ``repeats`` is a multiple of their number; the fractions keep their order) (``--resume``: runs that
    finished in ``out`` are kept). ``deterministic``: every run
    with run_recipe.py --deterministic (identical runs are then bit-identical: a MoE's routing, and with it
    its step time, is the same in the baseline and the offloaded runs). ``max_baseline_variation``: stop with
    NoisyHost after the first baseline this call runs when its steps vary more (``check_steady``)."""
    cores = host.get("cores") or len(available_cores())  # the host the runs ran on (a reassembly may run elsewhere)
    configs = configurations(cores)
    every_run = every_run_args(num_gpus, deterministic)
    chosen = list(chosen)
    same = tuned_same_as(configs, num_gpus or recipe_gpus, cores) if "tuned" in chosen else None
    shared = same in chosen
    if shared:  # that configuration first in the first round: the tuned row reuses it
        chosen.remove(same)
        chosen.insert(0, same)
    baselines, runs = [], {}  # runs: (fraction, name) -> that configuration's runs, one per round
    checked = False  # whether the first baseline this call ran was checked against max_baseline_variation
    runnable = [name for name in chosen if not (name == "tuned" and shared)]
    progress = RunProgress(label="[bench]", total=baseline_runs + repeats * len(fractions) * len(runnable))
    if repeats > 1 and len(runnable) > 1 and repeats % len(runnable):
        print(f"{progress.label} {repeats} rounds of {len(runnable)} configurations: each round starts one "
              "configuration further on, so every configuration takes every place in its round equally often only "
              f"when the rounds are a multiple of {len(runnable)} (--repeats); here a host that drifts through the "
              "bench can still favour the configurations that run later more often", flush=True)
    for k in range(repeats):  # rounds interleave the configurations, so slow drift of the machine hits all alike
        for b in range(k, baseline_runs, repeats):
            baseline = run(recipe, 0.0, out / ("baseline" + (f"-repeat{b}" if b else "")), overrides, every_run,
                           resume, timeout_s, progress)
            baselines.append(baseline)
            # the host under check is this call's: a baseline kept from an earlier call (--resume) says nothing of it
            if max_baseline_variation is not None and not checked and not baseline.get("reused"):
                checked = True
                check_steady(baseline, max_baseline_variation, progress)
        # each round starts one configuration further on: with one order in every round, a host that speeds up or
        # slows down through the bench would favour the configurations that always run later (the fractions keep
        # their order: each fraction's configurations run together)
        in_round = runnable[k % len(runnable):] + runnable[:k % len(runnable)] if runnable else []
        for fraction in fractions:
            for name in in_round:
                config = configs[name]
                run_dir = out / (f"fraction-{fraction:g}-{name}" + (f"-repeat{k}" if k else ""))
                runs.setdefault((fraction, name), []).append(
                    run(recipe, fraction, run_dir, [*overrides, *config["overrides"]],
                        [*every_run, *config["args"]], resume, timeout_s, progress))
    results = []
    for fraction in fractions:
        for name in chosen:
            if name == "tuned" and shared:
                results.append((name, {**merge_repeats(runs[(fraction, same)]), "same_run_as": same}))
            else:
                results.append((name, merge_repeats(runs[(fraction, name)])))
    return BenchRuns(results=results, baselines=baselines, configs=configs, order=chosen,
                     deterministic=deterministic)


def write_overhead(out: Path, recipe: str, command: str, overrides: list[str], host: dict, runs: BenchRuns,
                   rows: list[dict], parity: dict, verdicts: list[dict]) -> str:
    """DIR/offload_overhead.json and offload_overhead.md; returns the markdown table."""
    base = runs.baselines[0].get("summary") if runs.baselines else None
    (out / "offload_overhead.json").write_text(json.dumps({
        "recipe": recipe, "command": command, "overrides": overrides, "host": host,
        "baseline": {"step_time_s": parity["baseline_step_time_s"],
                     "step_time_spread": parity["baseline_step_time_spread"],
                     "peak_allocated_gib": base and base["peak_allocated_gib"]},
        "configs": {name: runs.configs[name]["means"] for name in runs.order}, "parity": parity, "goals": verdicts,
        "rows": rows}, indent=2) + "\n")
    table = markdown(rows, parity, verdicts, f"{recipe}: optimizer offload, stock vs tuned")
    (out / "offload_overhead.md").write_text(f"Command: `{command}`\n\n{table}")
    return table
