"""The environment a run sees, and the allocator setting read from it."""

from __future__ import annotations

import pytest

from mbridge_offload.facts.environment import ALLOC_CONF_ENV, expandable_segments, run_env


@pytest.mark.parametrize("setting, on", [
    ("expandable_segments:True", True),
    ("max_split_size_mb:128,expandable_segments:True", True),
    (" expandable_segments : True ", True),
    ("expandable_segments:Tr ue", True),  # PyTorch drops whitespace anywhere
    ("max_split_size_mb:128, expandable_segments:True", True),
    ("expandable_segments:true", False),  # PyTorch refuses it (the run stops before training)
    ("expandable_segments:False", False),
    ("expandable_segments:True,expandable_segments:False", False),  # the allocator reads the options in order
    ("max_split_size_mb:128", False),
    ("", False),
    (None, False),
])
def test_expandable_segments_is_read_as_pytorchs_allocator_reads_it(setting, on):
    assert expandable_segments(setting) is on


def test_the_shells_value_wins_over_the_recipes():
    recipe = {ALLOC_CONF_ENV: "expandable_segments:True"}
    assert run_env(ALLOC_CONF_ENV, recipe, {}) == "expandable_segments:True"
    assert run_env(ALLOC_CONF_ENV, recipe, {ALLOC_CONF_ENV: "expandable_segments:False"}) == "expandable_segments:False"
    assert run_env(ALLOC_CONF_ENV, None, {}) is None
