"""MBRIDGE_OFFLOAD_COPY_PIECES_IN_FLIGHT and MBRIDGE_OFFLOAD_COPY_PIECE_PAUSE_US as the exact and delayed engines' copy
threads read them (facts/offload_engine.py): the shell's value over the config's, the default where neither sets it,
and a refusal that names the value and the fix for anything but a whole number the engine allows."""

import pytest

from mbridge_offload.facts.offload_engine import (COPY_PAUSE_ENV, COPY_PAUSE_RANGE_US, COPY_WINDOW_ENV, COPY_WINDOWS,
                                                 DEFAULT_COPY_WINDOW, copy_pause_us, copy_window, copy_window_setting)
from mbridge_offload.runtime.copy_pieces import PIECES_IN_FLIGHT


def test_unset_is_the_default_the_engine_ran_with():
    assert copy_window(None, {}) == DEFAULT_COPY_WINDOW == PIECES_IN_FLIGHT == 2
    assert copy_window_setting({}, {}) is None


def test_the_shell_wins_over_the_config():
    assert copy_window({COPY_WINDOW_ENV: 3}, {}) == 3
    assert copy_window({COPY_WINDOW_ENV: 3}, {COPY_WINDOW_ENV: " 1 "}) == 1


def test_the_pause_between_pieces_is_unset_by_default_and_the_shell_wins():
    assert copy_pause_us(None, {}) is None
    assert copy_pause_us({COPY_PAUSE_ENV: "20"}, {}) == 20
    assert copy_pause_us({COPY_PAUSE_ENV: "20"}, {COPY_PAUSE_ENV: " 200 "}) == 200


@pytest.mark.parametrize("env, read, low, high, value", [
    *((COPY_WINDOW_ENV, copy_window, COPY_WINDOWS[0], COPY_WINDOWS[-1], value)
      for value in ["0", "5", "-1", "1.5", "two", "", "2 pieces"]),
    *((COPY_PAUSE_ENV, copy_pause_us, *COPY_PAUSE_RANGE_US, value) for value in ["0", "1001", "-5", "20.5", "20us", ""]),
])
def test_anything_else_is_refused_with_the_value_the_range_and_the_fix(env, read, low, high, value):
    with pytest.raises(ValueError) as refused:
        read(None, {env: value})
    text = str(refused.value)
    assert f"{env}={value.strip()!r}" in text
    assert f"a whole number from {low} to {high}" in text and "Fix: ++env_vars." in text
