"""Does ``optimizer.optimizer_offload_fraction=auto`` hold on a GPU of a given size? Trainings of one
configuration, each in a fresh process beside a device ballast (bench/device_ballast.py) that leaves exactly
the device's size free: one at the fraction auto picks for that size (it must train), one at the next 0.05
below (it must run out of memory, or leave less free than the margin auto stated), and, when that one trained,
one 0.10 below, which decides the issue's goal: auto at most one step above the smallest fraction that trains.
Writes DIR/auto_check.json and .md. The device memory a run used is its own, from NVML (CUDA context and library
workspaces included).
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from mbridge_offload.bench.device_ballast import Ballast, BallastError
from mbridge_offload.bench.progress import RunProgress
from mbridge_offload.bench.sweep import run_one, run_status
from mbridge_offload.planning.fraction_search import AUTO_OVERRIDE, AUTO_STEP
from mbridge_offload.validation.registry import RULES_BY_ID
from mbridge_offload.validation.runtime_failures import log_shows

# run_recipe.py's line for auto (prepare.resolve_auto): the fraction, the planned total, the margin, the device
AUTO_LINE = re.compile(re.escape(AUTO_OVERRIDE) + r" -> ([0-9.]+) \(.*?: ([0-9.]+) GiB \+ ([0-9.]+) GiB margin of "
                       r"([0-9.]+) GiB\)")
# the GPU's out-of-memory failures as the rule table knows them: torch's own, and an allocation outside PyTorch
# (NCCL's communicator in the first step, docs/benchmarks/alloc-tight/) that found the device full
OUT_OF_MEMORY_RULES = (RULES_BY_ID["runtime/cuda-oom"], RULES_BY_ID["runtime/oom-outside-pytorch"])
# torch's out-of-memory message names every other process on the device and what it holds
OTHER_PROCESS = re.compile(r"Process (\d+) has ([0-9.]+) (GiB|MiB) memory in use")


@dataclass(frozen=True, kw_only=True)
class AutoChoice:
    """What run_recipe.py said auto chose."""

    fraction: float
    planned_total_gib: float
    margin_gib: float
    device_gib: float


@dataclass(frozen=True, kw_only=True)
class RunOutcome:
    """One of the two trainings."""

    fraction: float
    outcome: str  # "trained", "out of memory", "failed: <reason>" or "not valid: <why>"
    device_used_gib: float | None  # this process's peak whole-device use (NVML), None when it did not train
    headroom_gib: float | None  # the device's size minus that
    run_dir: str


def auto_choice(log_text: str) -> AutoChoice | None:
    match = AUTO_LINE.search(log_text)
    if match is None:
        return None
    fraction, total, margin, device = (float(g) for g in match.groups())
    return AutoChoice(fraction=fraction, planned_total_gib=total, margin_gib=margin, device_gib=device)


def strangers_in(text: str, ballast_pid: int) -> dict[int, float]:
    """Processes other than the ballast that torch's out-of-memory message says held device memory."""
    found = {}
    for pid, amount, unit in OTHER_PROCESS.findall(text):
        if int(pid) != ballast_pid:
            found[int(pid)] = float(amount) / (1024 if unit == "MiB" else 1)
    return found


def outcome_of(result: dict, device_gib: float, ballast_held_gib: float, ballast_pid: int,
               strangers_after: dict[int, float]) -> RunOutcome:
    """A run_one result as a RunOutcome: trained (with its device use), out of memory, or failed; not valid when
    another process than the ballast held device memory at the end or in the out-of-memory message."""
    log = Path(result["dir"]) / "log.txt"
    text = log.read_text(errors="replace") if log.exists() else ""
    strangers = {**strangers_in(text, ballast_pid), **strangers_after}
    if strangers:
        held = ", ".join(f"process {pid} {gib:.2f} GiB" for pid, gib in sorted(strangers.items()))
        return RunOutcome(fraction=result["fraction"], outcome=f"not valid: another process held the GPU ({held})",
                          device_used_gib=None, headroom_gib=None, run_dir=result["dir"])
    summary = result.get("summary")
    if summary is not None:
        own = summary.get("peak_device_process_used_gib")
        if own is None and summary.get("peak_device_used_gib") is not None:  # NVML blind: the device less the ballast
            own = summary["peak_device_used_gib"] - ballast_held_gib
        return RunOutcome(fraction=result["fraction"], outcome="trained", device_used_gib=own,
                          headroom_gib=None if own is None else device_gib - own, run_dir=result["dir"])
    reason = result.get("reason", "no summary and no failure recorded")
    lines = [reason, *text.splitlines()]
    outcome = "out of memory" if any(log_shows(rule, lines) for rule in OUT_OF_MEMORY_RULES) else f"failed: {reason}"
    return RunOutcome(fraction=result["fraction"], outcome=outcome, device_used_gib=None, headroom_gib=None,
                      run_dir=result["dir"])


def judge(choice: AutoChoice | None, at_auto: RunOutcome | None, below: RunOutcome | None) -> tuple[bool, str]:
    """(ok, why): auto's run trained, and the run one step below ran out of memory or left less than the margin."""
    if choice is None or at_auto is None:
        return False, "auto chose no fraction (see the auto run's log)"
    for run in (at_auto, below):
        if run is not None and run.outcome.startswith("not valid"):
            return False, f"the run at {run.fraction:g} is {run.outcome}: run the pair again on a free GPU"
    if at_auto.outcome != "trained":
        return False, f"the run at auto's fraction {choice.fraction:g} did not train: {at_auto.outcome}"
    if below is None:
        return True, "auto chose no offload (fraction 0): nothing below it"
    if below.outcome == "out of memory":
        return True, f"{below.fraction:g} runs out of memory"
    if below.outcome != "trained":
        return False, f"the run at {below.fraction:g} failed for another reason: {below.outcome}"
    if below.headroom_gib is None:
        return False, f"the run at {below.fraction:g} trained and its device use was not recorded"
    if below.headroom_gib < choice.margin_gib:
        return True, (f"{below.fraction:g} trains with {below.headroom_gib:.2f} GiB free, less than the "
                      f"{choice.margin_gib:.2f} GiB margin")
    return False, (f"{below.fraction:g} trains with {below.headroom_gib:.2f} GiB free, more than the "
                   f"{choice.margin_gib:.2f} GiB margin: auto could have chosen it")


def goal_of(choice: AutoChoice | None, at_auto: RunOutcome | None, below: RunOutcome | None,
            two_below: RunOutcome | None) -> str:
    """The issue's goal for auto, as these runs decide it: auto trains and is at most one 0.05 step above the
    smallest fraction that trains. Less GPU memory per run at each step up, so the first step down that does not
    train bounds it: one below (auto is the smallest) or two below (auto is one above)."""
    if choice is None or at_auto is None or at_auto.outcome != "trained":
        return "not met: auto's run did not train" if at_auto is not None else "not decided: auto chose nothing"
    if below is None:
        return "met: auto chose no offload"
    if below.outcome == "out of memory":
        return f"met: auto ({choice.fraction:g}) is the smallest fraction that trains"
    if below.outcome != "trained":
        return f"not decided: the run at {below.fraction:g} failed for another reason"
    if two_below is None:
        return (f"met: {below.fraction:g} trains and nothing is below it" if below.fraction <= 0 else
                f"not decided: {below.fraction:g} trains, {round(below.fraction - AUTO_STEP, 2):g} was not run")
    if two_below.outcome == "out of memory":
        return f"met: {below.fraction:g} is the smallest that trains, one step below auto"
    if two_below.outcome == "trained":
        return f"not met: {two_below.fraction:g} trains too, two steps below auto"
    return f"not decided: the run at {two_below.fraction:g} failed for another reason"


def launch_arguments(device_gib: float) -> list[str]:
    """run_recipe.py's options for each run of the check. The ballast shapes one device, so each run is one GPU
    whatever the recipe's own GPU count: a recipe whose parallel sizes need more is refused by run_recipe.py's
    validation, which names the sizes to change."""
    return ["--num-gpus", "1", "--gpu-memory-gib", f"{device_gib:g}"]


def check_auto(recipe: str, device_gib: float, out: Path, overrides: list[str], steps: int,
               timeout_s: float | None) -> dict:
    """The trainings and their verdict, as one row, written to DIR/auto_check.* after each run as far as it goes."""
    common = [*overrides, f"train.train_iters={steps}"]
    memory = launch_arguments(device_gib)
    progress = RunProgress(label="[auto check]", total=3)

    def train(fraction: float | str, name: str) -> tuple[dict, Ballast, dict[int, float]]:
        """One training beside the ballast: its result, the ballast, the other processes on the GPU at its end."""
        what = f"{name} on a {device_gib:g} GiB device"
        with Ballast(device_gib, out / f"ballast-{name}.log") as ballast:
            progress.starting(what)
            result = run_one(recipe, fraction, out / name, common, memory, timeout_s)
            strangers = ballast.strangers()
        progress.finished(what, run_status(result), result["wall_s"])
        return result, ballast, strangers

    def outcome(trained: tuple[dict, Ballast, dict[int, float]], fraction: float) -> RunOutcome:
        result, ballast, strangers = trained
        return outcome_of({**result, "fraction": fraction}, device_gib, ballast.state["held_gib"], ballast.process.pid,
                          strangers)

    def written_so_far(last_run: str, *runs: RunOutcome | None) -> None:
        """The row as far as it goes, in DIR/auto_check.*: what stays if the check is cut in a later run."""
        write_results(out, [check_row(recipe, overrides, device_gib, steps, choice, *runs, stopped_after=last_run)])

    at_auto_run = train("auto", "auto")
    choice = auto_choice((out / "auto" / "log.txt").read_text(errors="replace"))
    at_auto = None if choice is None else outcome(at_auto_run, choice.fraction)
    below = None
    if choice is not None and choice.fraction > 0:
        written_so_far("the run at auto's fraction", at_auto, None, None)
        fraction = round(choice.fraction - AUTO_STEP, 2)
        below = outcome(train(fraction, f"fraction-{fraction:g}"), fraction)
    else:
        progress.skipped("the run 0.05 below auto", "auto chose no fraction" if choice is None else "auto chose 0")
    # the goal (at most one step above the smallest that trains) needs the next step down when one below trained
    two_below = None
    if below is not None and below.outcome == "trained" and below.fraction > 0:
        written_so_far(f"the run at {below.fraction:g}", at_auto, below, None)
        fraction = round(below.fraction - AUTO_STEP, 2)
        two_below = outcome(train(fraction, f"fraction-{fraction:g}"), fraction)
    else:
        progress.skipped("the run 0.10 below auto", "the run 0.05 below did not train" if below else "nothing below")
    return check_row(recipe, overrides, device_gib, steps, choice, at_auto, below, two_below)


def check_row(recipe: str, overrides: list[str], device_gib: float, steps: int, choice: AutoChoice | None,
              at_auto: RunOutcome | None, below: RunOutcome | None, two_below: RunOutcome | None,
              stopped_after: str | None = None) -> dict:
    """The check's row. ``stopped_after`` (the last run that finished) marks a row written while runs were still
    to come: if the check is cut there, the row that stays says what was measured and that nothing was judged."""
    if stopped_after is None:
        ok, why = judge(choice, at_auto, below)
        goal = goal_of(choice, at_auto, below, two_below)
    else:
        ok, why = None, f"not judged: the check stopped after {stopped_after} (cut, or still running)"
        goal = f"not decided: the check stopped after {stopped_after}"
    return {"recipe": recipe, "overrides": overrides, "device_gib": device_gib, "steps": steps,
            "auto": None if choice is None else asdict(choice), "at_auto": None if at_auto is None else asdict(at_auto),
            "below": None if below is None else asdict(below),
            "two_below": None if two_below is None else asdict(two_below), "ok": ok, "verdict": why, "goal": goal}


def _gib(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


JUDGED = {True: "yes", False: "NO", None: "-"}  # a row's ok: None while runs are still to come


def markdown(rows: list[dict]) -> str:
    lines = ["| recipe | overrides | device (GiB) | auto | planned total + margin (GiB) | at auto: outcome, used, free "
             "(GiB) | 0.05 below: outcome, used, free (GiB) | 0.10 below | ok | verdict | goal: at most one step "
             "above the smallest that trains |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]

    def run_text(run: dict | None, with_fraction: bool) -> str:
        if run is None:
            return "-"
        return (f"{run['fraction']:g}: " if with_fraction else "") + (
            f"{run['outcome']}, {_gib(run['device_used_gib'])}, {_gib(run['headroom_gib'])}")

    for r in rows:
        auto = r["auto"]
        chosen = "-" if auto is None else f"{auto['fraction']:g}"
        planned = "-" if auto is None else f"{auto['planned_total_gib']:.1f} + {auto['margin_gib']:.2f}"
        # rows written before the second step down have neither it nor the goal
        lines.append(f"| {r['recipe']} | {' '.join(r['overrides'])} | {r['device_gib']:g} | {chosen} | {planned} | "
                     f"{run_text(r['at_auto'], False)} | {run_text(r['below'], True)} | "
                     f"{run_text(r.get('two_below'), True)} | {JUDGED[r['ok']]} | {r['verdict']} | "
                     f"{r.get('goal', '-')} |")
    return "\n".join(lines)


def write_results(out: Path, rows: list[dict]) -> None:
    (out / "auto_check.json").write_text(json.dumps(rows, indent=2) + "\n")
    (out / "auto_check.md").write_text(markdown(rows) + "\n")
