"""The environment a launched run sees: the shell's value wins over the config's ``env_vars`` (Megatron Bridge
puts ``env_vars`` into the process with ``os.environ.setdefault``)."""

from __future__ import annotations

from collections.abc import Mapping

ALLOC_CONF_ENV = "PYTORCH_CUDA_ALLOC_CONF"


def run_env(name: str, env_vars: Mapping[str, object] | None, environ: Mapping[str, str]) -> str | None:
    """Environment variable ``name`` as a launched run sees it, or None where neither sets it."""
    if name in environ:
        return environ[name]
    value = (env_vars or {}).get(name)
    return None if value is None else str(value)


def expandable_segments(setting: str | None) -> bool:
    """Whether a ``PYTORCH_CUDA_ALLOC_CONF`` value turns on expandable segments (off by PyTorch's default). The
    allocator reads the comma-separated ``key:value`` options in order, so a repeated key's last value holds."""
    on = False
    for option in (setting or "").split(","):
        key, _, value = option.partition(":")
        if key.strip() == "expandable_segments":
            on = value.strip() == "True"
    return on
