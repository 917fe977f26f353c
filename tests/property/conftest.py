"""Shared by the property tests: one cache folder for the session, filled from the session's built recipes
(so the commands answer from it as they do for a user after a first run), and the real config's keys."""

from __future__ import annotations

import os
import tempfile

import pytest

SEED = "qwen3_30b_a3b_pretrain_config"  # as in cmdline_strategies.py
DENSE = "qwen3_1b_proxy_pretrain_config"

_CACHE = tempfile.mkdtemp(prefix="mbridge-offload-cache-")
os.environ["MBRIDGE_OFFLOAD_CACHE_DIR"] = _CACHE
os.environ.pop("WORLD_SIZE", None)


@pytest.fixture(scope="session")
def warm_cache(built):
    """The seed's and the dense proxy's built configs stored as a first run stores them."""
    from mbridge_offload.fast_check import store

    for name in (SEED, DENSE):
        store.store_base(name, built(name))
        assert store.load_base(name) is not None, "the snapshot of a built recipe must load"
    return _CACHE


@pytest.fixture(scope="session")
def config_keys(built):
    """Every settable leaf key of the seed's config (dataclass fields, four levels deep)."""
    from mbridge_offload.facts.config_tree import walk

    return sorted(key for key, _, is_section in walk(built(SEED), levels=4) if not is_section)
