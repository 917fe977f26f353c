"""Does a stopped and resumed offloaded run continue the uninterrupted run? Three runs of one configuration,
each in a fresh process, in this order: a run that saves a checkpoint at step k and exits, the uninterrupted run
of 2k steps, and a run that resumes from that checkpoint to 2k. The resumed steps are compared with the same
iterations of the uninterrupted run: loss and learning rate, step by step.

The first part ends either at ``train.exit_interval=k`` (``stop_by="exit-interval"``) or as a preempted
or interrupted job does (``stop_by="sigterm"`` / ``"sigint"``): the signal goes to its whole process group
(data-loader workers included, as Slurm and a terminal's Ctrl-C deliver it) once it has finished step k,
with no periodic save, so the checkpoint it resumes from is the one the stop signal made (at the step
boundary after the signal, k or later). The resumed run saves nothing.

The first part runs first. With the delayed engine (its summary says so) a save changes the training itself: it
applies the pending update, so the step after it runs undelayed. The uninterrupted run then saves at the same
iteration too, as a job that saves periodically and is never stopped does (the model's weights only, into a folder
of its own, removed after it), and the resumed run is compared with that training.

In deterministic mode (``--deterministic``) the resumed run must equal the uninterrupted one bit for bit;
otherwise its loss must stay within the seed's parity bound. Writes DIR/resume_parity.json and .md.
The checkpoint is removed once compared (a checkpoint of a 3B-parameter proxy is ~56 GB) unless kept.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from overrides.grammar import text_override
from mbridge_offload.bench.progress import RunProgress
from mbridge_offload.bench.sweep import StopSignal, run_one, run_status
from mbridge_offload.facts.checkpoint_dir import saved_iteration
from mbridge_offload.facts.determinism import SEED_PARITY
from mbridge_offload.facts.offload_engine import DELAYED
from mbridge_offload.facts.run_records import read_steps, step_records_file

CHECKPOINT_FOLDER = "checkpoint"
UNINTERRUPTED_SAVE_FOLDER = "uninterrupted-checkpoint"
RUN_FOLDERS = ("first-part", "uninterrupted", "resumed")  # in the order they run
# how the first part stops: its own train.exit_interval, or a signal to its whole process group
STOP_SIGNALS = {"sigterm": "SIGTERM", "sigint": "SIGINT"}
STOP_BY = ("exit-interval", *STOP_SIGNALS)


def run_overrides(run: str, total_steps: int, save_at: int, checkpoint_dir: Path,
                  stop_by: str = "exit-interval", uninterrupted_saves_at: int | None = None) -> list[str]:
    """The overrides that make ``run`` (one of RUN_FOLDERS) out of the configuration. ``uninterrupted_saves_at``:
    the uninterrupted run saves the model's weights every that many steps, into UNINTERRUPTED_SAVE_FOLDER beside
    ``checkpoint_dir`` (the delayed engine: a save changes its training)."""
    common = [f"train.train_iters={total_steps}"]
    if run == "uninterrupted":
        if uninterrupted_saves_at is None:
            return common
        return common + [text_override("checkpoint.save", str(checkpoint_dir.parent / UNINTERRUPTED_SAVE_FOLDER)),
                         f"checkpoint.save_interval={uninterrupted_saves_at}", "checkpoint.save_optim=False",
                         "checkpoint.save_rng=False"]
    # stopped by a signal: no periodic save before the end, so only the signal's checkpoint can be resumed
    interval = save_at if stop_by == "exit-interval" else total_steps + 1
    saving = [text_override("checkpoint.save", str(checkpoint_dir)), f"checkpoint.save_interval={interval}"]
    if run == "first-part":
        return common + saving + ([f"train.exit_interval={save_at}"] if stop_by == "exit-interval" else [])
    # the resumed run saves nothing: a second checkpoint of a large proxy would not fit beside the first
    return common + [text_override("checkpoint.load", str(checkpoint_dir))]


def reached_iteration(run_dir: Path, iteration: int):
    """A condition: rank 0 of the run in ``run_dir`` has finished training iteration ``iteration``."""
    def reached() -> bool:
        path = step_records_file(run_dir, 0)
        if not path.is_file():
            return False
        for line in path.read_text().splitlines():
            try:
                if json.loads(line).get("iteration", 0) >= iteration:
                    return True
            except json.JSONDecodeError:  # a line being written
                continue
        return False
    return reached


def steps_by_iteration(run_dir: Path) -> dict[int, dict]:
    """Rank 0's step records of a run, by training iteration."""
    records = read_steps(run_dir).get(0, [])
    return {record["iteration"]: record for record in records if "iteration" in record}


def compare(reference: dict[int, dict], candidate: dict[int, dict], field: str) -> tuple[float | None, bool]:
    """Largest |difference| of ``field`` over the iterations ``candidate`` ran, and whether all are equal.
    An iteration the reference lacks counts as a difference (None)."""
    deltas = []
    for iteration, record in candidate.items():
        other = reference.get(iteration)
        if other is None or record.get(field) is None or other.get(field) is None:
            return None, False
        deltas.append(abs(record[field] - other[field]))
    if not deltas:
        return None, False
    return max(deltas), all(d == 0 for d in deltas)


def parity_row(fraction: float, deterministic: bool, saved_at: int | None, total_steps: int,
               runs: dict[str, Path], failures: dict[str, str], stop_by: str = "exit-interval") -> dict:
    """The row of one configuration; ``saved_at`` is the iteration of the checkpoint the resumed run loaded."""
    row = {"fraction": fraction, "mode": "deterministic" if deterministic else "non-deterministic",
           "stop_by": stop_by, "save_at": saved_at, "steps": total_steps}
    if not failures and saved_at is None:
        failures = {"first-part": "left no checkpoint"}
    if failures:
        row.update(ok=False, max_abs_loss_delta=None, bit_identical=False,
                   reason="; ".join(f"{name}: {why}" for name, why in failures.items()))
        return row
    full = steps_by_iteration(runs["uninterrupted"])
    first = steps_by_iteration(runs["first-part"])
    resumed = steps_by_iteration(runs["resumed"])
    loss_delta, loss_equal = compare(full, resumed, "loss")
    lr_delta, lr_equal = compare(full, resumed, "lr")
    first_delta, _ = compare(full, first, "loss")
    expected = set(range(saved_at + 1, total_steps + 1))
    continued = set(resumed) == expected
    bound = 0.0 if deterministic else SEED_PARITY
    row.update(
        resumed_iterations=f"{min(resumed, default=0)}-{max(resumed, default=0)}",
        max_abs_loss_delta=loss_delta, bit_identical=loss_equal and lr_equal and continued,
        max_abs_lr_delta=lr_delta, first_part_max_abs_loss_delta=first_delta,
        ok=continued and loss_delta is not None and loss_delta <= bound and lr_equal,
    )
    if not row["ok"]:
        row["reason"] = ("resumed run did not continue at iteration " + str(saved_at + 1) if not continued
                         else f"loss differs by {loss_delta} (bound {bound})" if loss_delta is None or loss_delta > bound
                         else f"learning rate differs by {lr_delta}")
    return row


def _run_says(name: str, total_steps: int, save_at: int, stop_by: str, saved_at: int | None,
              uninterrupted_saves_at: int | None) -> str:
    """What the progress line says of run ``name``."""
    if name == "first-part":
        return f"{save_at} steps, stopped by {stop_by}"
    if name == "resumed":
        return f"from iteration {saved_at} to {total_steps}"
    saving = f", saving its weights at {uninterrupted_saves_at} (delayed engine)" if uninterrupted_saves_at else ""
    return f"{total_steps} steps{saving}"


def check_resume(recipe: str, fraction: float, out_dir: Path, save_at: int, overrides: list[str],
                 extra_args: list[str], deterministic: bool, timeout_s: float | None,
                 stop_by: str = "exit-interval", keep_checkpoint: bool = False,
                 progress: RunProgress | None = None) -> dict:
    """Run the three runs of one configuration and return its row."""
    progress = progress or RunProgress(label="[resume parity]", total=len(RUN_FOLDERS))
    total_steps = 2 * save_at
    checkpoint_dir = (out_dir / CHECKPOINT_FOLDER).resolve()
    shutil.rmtree(checkpoint_dir, ignore_errors=True)  # a resumed run must load this check's checkpoint only
    uninterrupted_checkpoint = checkpoint_dir.parent / UNINTERRUPTED_SAVE_FOLDER
    shutil.rmtree(uninterrupted_checkpoint, ignore_errors=True)
    runs, failures, saved_at, uninterrupted_saves_at = {}, {}, None, None
    for name in RUN_FOLDERS:
        runs[name] = out_dir / name
        says = _run_says(name, total_steps, save_at, stop_by, saved_at, uninterrupted_saves_at)
        what = f"fraction {fraction:g}, {name} run ({says})"
        if failures:
            progress.skipped(what, "an earlier run of this fraction failed")
            continue
        progress.starting(what)
        stop = None
        if name == "first-part" and stop_by in STOP_SIGNALS:
            stop = StopSignal(when=reached_iteration(runs[name], save_at), signal_name=STOP_SIGNALS[stop_by])
        try:
            result = run_one(recipe, fraction, runs[name],
                             overrides + run_overrides(name, total_steps, save_at, checkpoint_dir, stop_by,
                                                       uninterrupted_saves_at),
                             extra_args, timeout_s, stop=stop)
        finally:
            shutil.rmtree(uninterrupted_checkpoint, ignore_errors=True)  # its save only changed its training
        progress.finished(what, run_status(result), result["wall_s"])
        if "summary" not in result:
            failures[name] = result.get("reason", "no summary")
        elif name == "first-part":
            saved_at = saved_iteration(checkpoint_dir)
            if saved_at is None:
                failures[name] = f"no checkpoint in {checkpoint_dir} after the run stopped"
            elif result["summary"].get("offload_engine") == DELAYED:  # its save changes the training
                uninterrupted_saves_at = saved_at
    row = parity_row(fraction, deterministic, saved_at, total_steps, runs, failures, stop_by)
    row["uninterrupted_saved_at"] = uninterrupted_saves_at
    if not keep_checkpoint:
        shutil.rmtree(checkpoint_dir, ignore_errors=True)
    return row


def markdown(rows: list[dict], recipe: str) -> str:
    lines = [f"Resume parity of `{recipe}`: stop at step k, resume to the end, compared with the uninterrupted run.",
             "", "| fraction | mode | stopped by | saved at | steps | max abs loss delta | bit identical | ok |",
             "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        delta = "-" if row["max_abs_loss_delta"] is None else f"{row['max_abs_loss_delta']:.3g}"
        lines.append(f"| {row['fraction']:g} | {row['mode']} | {row.get('stop_by', 'exit-interval')} | "
                     f"{row['save_at'] if row['save_at'] is not None else '-'} | {row['steps']} | {delta} | "
                     f"{'yes' if row['bit_identical'] else 'no'} | {'yes' if row['ok'] else 'no: ' + row['reason']} |")
    saved = sorted({row["uninterrupted_saved_at"] for row in rows if row.get("uninterrupted_saved_at") is not None})
    if saved:
        lines += ["", f"With the delayed engine the uninterrupted run saved its weights at iteration "
                  f"{', '.join(map(str, saved))} too: a save applies the pending update, so the step after it runs "
                  "undelayed, in any run that saves there."]
    return "\n".join(lines) + "\n"


def write_results(out_dir: Path, recipe: str, rows: list[dict]) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "resume_parity.json").write_text(json.dumps({"recipe": recipe, "rows": rows}, indent=2) + "\n")
    (out_dir / "resume_parity.md").write_text(markdown(rows, recipe))
