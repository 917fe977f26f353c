"""The environment a run sees, and the allocator setting read from it."""

from __future__ import annotations

import pytest

from mbridge_offload.facts.environment import (ALLOC_CONF_ENV, ALLOC_CONF_FALLBACK_ENV, allocator_conf, allocator_line,
                                              expandable_in_allocator_line, expandable_segments)


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


def test_the_allocator_conf_a_run_gets():
    """The shell's PYTORCH_CUDA_ALLOC_CONF, else the recipe's, else the shell's PYTORCH_ALLOC_CONF; the header line
    written for each reads back as the setting it names."""
    recipe = {ALLOC_CONF_ENV: "expandable_segments:True"}
    fallback = {ALLOC_CONF_FALLBACK_ENV: "expandable_segments:False"}
    assert allocator_conf(recipe, {ALLOC_CONF_ENV: "max_split_size_mb:64"}) == (ALLOC_CONF_ENV, "max_split_size_mb:64")
    assert allocator_conf(recipe, fallback) == (ALLOC_CONF_ENV, "expandable_segments:True")
    assert allocator_conf({}, fallback) == (ALLOC_CONF_FALLBACK_ENV, "expandable_segments:False")
    assert allocator_conf(None, {}) is None
    for conf, on in (((ALLOC_CONF_ENV, "expandable_segments:True"), True),
                     ((ALLOC_CONF_FALLBACK_ENV, "expandable_segments:True"), True), (None, False)):
        assert expandable_in_allocator_line(allocator_line(conf)) is on
    assert expandable_in_allocator_line("CPU threads per rank: 4") is None
