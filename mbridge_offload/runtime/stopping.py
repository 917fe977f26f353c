"""Stopping a run cleanly: SIGTERM (a Slurm preemption, ``kill``) or Ctrl-C saves a checkpoint at the next
step boundary and exits, when ``checkpoint.save`` is set. Megatron Bridge does the saving
(``train.exit_signal_handler``, for SIGTERM); this module turns it on, makes Ctrl-C (SIGINT) take the same
path, and says afterwards how the run ended and how to resume it.

A preemption signals every process of the job, data-loader workers included; torch's workers die on a
SIGTERM that is not their parent's, and the rank then fails with "DataLoader worker ... is killed by signal:
Terminated" before it can save (seen on the H200). Megatron Bridge's
``train.exit_signal_handler_for_dataloader`` gives the workers the same handler, so they outlive the signal."""

from __future__ import annotations

import os
import signal
from typing import Any, Collection

from overrides.grammar import text_override

EXIT_SIGNAL_KEY = "train.exit_signal_handler"
WORKERS_SIGNAL_KEY = "train.exit_signal_handler_for_dataloader"


def with_clean_stop(cfg: Any, given_keys: Collection[str]) -> tuple[Any, str | None]:
    """``cfg`` with Megatron Bridge's signal handler on when it saves checkpoints (unless the command line
    set the key), and the line that tells the user; ``(cfg, None)`` when there is nothing to save to."""
    save = cfg.checkpoint.save
    if not save:
        return cfg, None
    deltas = {key: True for key in (EXIT_SIGNAL_KEY, WORKERS_SIGNAL_KEY)
              if key not in given_keys and not getattr(cfg.train, key.split(".")[1])}
    if deltas:
        from recipes.derive import derive

        cfg = derive(cfg, deltas, why="save a checkpoint when stopped by SIGTERM or Ctrl-C")
    if not cfg.train.exit_signal_handler:
        return cfg, (f"stop: {EXIT_SIGNAL_KEY}=False as you set it: SIGTERM or Ctrl-C end the run without saving "
                     f"(checkpoints in {save} every checkpoint.save_interval steps)")
    line = (f"stop: SIGTERM or Ctrl-C saves a checkpoint in {save} at the next step boundary and exits; "
            f"resume with the same command plus {text_override('checkpoint.load', save)}")
    if not cfg.train.exit_signal_handler_for_dataloader:
        line += (f"; {WORKERS_SIGNAL_KEY}=False as you set it: a SIGTERM sent to the whole job (a Slurm "
                 "preemption) kills the data-loader workers and the run fails before saving")
    return cfg, line


def interrupt_as_terminate() -> None:
    """Ctrl-C (SIGINT) becomes SIGTERM, which Megatron Bridge's handler turns into save-and-exit."""
    signal.signal(signal.SIGINT, lambda signum, frame: os.kill(os.getpid(), signal.SIGTERM))


def how_it_ended(cfg: Any, last_iteration: int | None) -> str | None:
    """A line for a run that ended before train.train_iters, or None when it ran to the end."""
    train, save = cfg.train, cfg.checkpoint.save
    if last_iteration is None or last_iteration >= train.train_iters:
        return None
    if train.exit_interval and last_iteration % train.exit_interval == 0:
        cause = f"train.exit_interval={train.exit_interval}"
    else:
        cause = "a stop signal (SIGTERM or Ctrl-C)"
    where = (f"checkpoint of iteration {last_iteration} in {save}; resume with the same command plus "
             f"{text_override('checkpoint.load', save)}") if save else "no checkpoint (checkpoint.save is not set)"
    return f"stopped at iteration {last_iteration} of {train.train_iters} by {cause}: {where}"
