"""Shared fixtures. Megatron Bridge is imported once per session (it takes ~35 s); every recipe is
built once and handed out as a deep copy, so no test can change another's config."""

from __future__ import annotations

import copy
import functools
import os
import tempfile

import pytest

# The plugin must never reach the Hugging Face hub: make any attempt fail loudly.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
# The commands' cache and checking worker (mbridge_offload/fast_check) stay out of the user's cache folder,
# and no test leaves a worker behind: tests/scripts/test_warm_worker.py starts and stops its own.
os.environ.setdefault("MBRIDGE_OFFLOAD_CACHE_DIR", tempfile.mkdtemp(prefix="mbridge-offload-tests-"))
os.environ["MBRIDGE_OFFLOAD_NO_WORKER"] = "1"


def pytest_collection_modifyitems(config, items):
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except Exception:
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@functools.lru_cache(maxsize=None)
def _built(name: str):
    from recipes import registry

    return registry.get(name).build()


@pytest.fixture
def recipe():
    """recipe(name) -> a fresh deep copy of that recipe's config."""
    return lambda name: copy.deepcopy(_built(name))


@pytest.fixture(scope="session")
def built():
    """built(name) -> the shared, cached config (tests must not modify it)."""
    return _built
