"""Stopping cleanly: the signal handler is turned on only where there is a checkpoint to save, a setting the
user gave is kept, and the end of a run that stopped early says how to resume it."""

from __future__ import annotations

import os
import signal

from mbridge_offload.facts.config_tree import set_path
from mbridge_offload.runtime.stopping import (EXIT_SIGNAL_KEY, WORKERS_SIGNAL_KEY, how_it_ended, interrupt_as_terminate,
                                             with_clean_stop)

RECIPE = "qwen3_1b_proxy_optimizer_offload_config"


def test_no_checkpoint_no_change(recipe):
    cfg = recipe(RECIPE)
    new, line = with_clean_stop(cfg, set())
    assert line is None and new is cfg and not new.train.exit_signal_handler


def test_saving_runs_stop_cleanly_unless_the_user_said_otherwise(recipe):
    cfg = recipe(RECIPE)
    set_path(cfg, "checkpoint.save", "/ckpt")
    new, line = with_clean_stop(cfg, set())
    assert new.train.exit_signal_handler and not cfg.train.exit_signal_handler  # a new config, input untouched
    assert "checkpoint.load=/ckpt" in line
    kept, line = with_clean_stop(cfg, {EXIT_SIGNAL_KEY})
    assert not kept.train.exit_signal_handler and "without saving" in line


def test_data_loader_workers_outlive_a_signal_to_the_whole_job(recipe):
    # on the H200, SIGTERM to the job killed the workers and the rank failed before saving
    cfg = recipe(RECIPE)
    set_path(cfg, "checkpoint.save", "/ckpt")
    new, line = with_clean_stop(cfg, set())
    assert new.train.exit_signal_handler_for_dataloader and "as you set it" not in line
    set_path(cfg, "train.exit_signal_handler_for_dataloader", False)
    kept, line = with_clean_stop(cfg, {WORKERS_SIGNAL_KEY})
    assert not kept.train.exit_signal_handler_for_dataloader and "kills the data-loader workers" in line


def test_how_a_run_ended(recipe):
    cfg = recipe(RECIPE)
    set_path(cfg, "train.train_iters", 10)
    set_path(cfg, "checkpoint.save", "/ckpt")
    assert how_it_ended(cfg, 10) is None
    assert "stop signal" in how_it_ended(cfg, 7) and "checkpoint.load=/ckpt" in how_it_ended(cfg, 7)
    set_path(cfg, "train.exit_interval", 5)
    assert "train.exit_interval=5" in how_it_ended(cfg, 5)
    set_path(cfg, "checkpoint.save", None)
    assert "no checkpoint" in how_it_ended(cfg, 5)


def test_ctrl_c_becomes_sigterm():
    received = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: received.append(signum))
    previous_int = signal.getsignal(signal.SIGINT)
    try:
        interrupt_as_terminate()
        os.kill(os.getpid(), signal.SIGINT)
        assert received == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, previous_int)
