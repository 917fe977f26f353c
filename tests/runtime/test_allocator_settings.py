"""The recipe's allocator settings reach PyTorch's allocator (torch's own parser, no GPU needed)."""

import pytest

from mbridge_offload.facts.environment import run_env
from mbridge_offload.runtime.allocator_settings import AllocatorSettingsError, apply_allocator_settings


def test_the_shell_wins_over_env_vars():
    assert run_env("X", {"X": "recipe"}, {"X": "shell"}) == "shell"
    assert run_env("X", {"X": 1}, {}) == "1"
    assert run_env("X", None, {}) is None


def test_applies_the_recipe_value_and_says_so():
    assert apply_allocator_settings({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}, {}) == \
        "expandable_segments:True"
    assert apply_allocator_settings({}, {}) is None
    apply_allocator_settings({}, {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False"})  # the default, for later tests


def test_a_refused_value_names_its_source_and_the_fix():
    with pytest.raises(AllocatorSettingsError) as raised:
        apply_allocator_settings({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segmentz:True"}, {})
    message = str(raised.value)
    assert "PYTORCH_CUDA_ALLOC_CONF=expandable_segmentz:True (from the recipe's env_vars)" in message
    assert "expandable_segmentz" in message and "Fix: export PYTORCH_CUDA_ALLOC_CONF=" in message
