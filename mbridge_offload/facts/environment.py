"""The environment a launched run sees: the shell's value wins over the config's ``env_vars`` (Megatron Bridge
puts ``env_vars`` into the process with ``os.environ.setdefault``); the allocator settings it gets, and the header
line that names them (written by run_recipe.py, read back by diagnose)."""

from __future__ import annotations

from collections.abc import Mapping

ALLOC_CONF_ENV = "PYTORCH_CUDA_ALLOC_CONF"
ALLOC_CONF_FALLBACK_ENV = "PYTORCH_ALLOC_CONF"  # PyTorch reads it where PYTORCH_CUDA_ALLOC_CONF is unset
ALLOCATOR_LINE = "GPU memory allocator: "


def run_env(name: str, env_vars: Mapping[str, object] | None, environ: Mapping[str, str]) -> str | None:
    """Environment variable ``name`` as a launched run sees it, or None where neither sets it."""
    if name in environ:
        return environ[name]
    value = (env_vars or {}).get(name)
    return None if value is None else str(value)


def expandable_segments(setting: str | None) -> bool:
    """Whether a ``PYTORCH_CUDA_ALLOC_CONF`` value turns on expandable segments (off by PyTorch's default). As
    PyTorch's allocator reads it: whitespace anywhere is dropped, then comma-separated ``key:value`` options in order,
    so a repeated key's last value holds; only ``True`` turns it on (PyTorch refuses ``true``)."""
    on = False
    for option in "".join((setting or "").split()).split(","):
        key, _, value = option.partition(":")
        if key == "expandable_segments":
            on = value == "True"
    return on


def allocator_conf(env_vars: Mapping[str, object] | None, environ: Mapping[str, str]) -> tuple[str, str] | None:
    """(variable, value) of the allocator settings a run launched by run_recipe.py gets: the shell's
    PYTORCH_CUDA_ALLOC_CONF, else the recipe's (run_recipe.py applies it before the first allocation), else the
    shell's PYTORCH_ALLOC_CONF (which PyTorch reads itself); None: PyTorch's defaults."""
    value = run_env(ALLOC_CONF_ENV, env_vars, environ)
    if value:
        return ALLOC_CONF_ENV, value
    value = environ.get(ALLOC_CONF_FALLBACK_ENV)
    return (ALLOC_CONF_FALLBACK_ENV, value) if value else None


def allocator_line(conf: tuple[str, str] | None) -> str:
    """The run header's line naming the allocator settings (``allocator_conf``)."""
    return ALLOCATOR_LINE + (f"{conf[0]}={conf[1]}" if conf else f"PyTorch's defaults ({ALLOC_CONF_ENV} unset)")


def expandable_in_allocator_line(text: str) -> bool | None:
    """Whether a line written by ``allocator_line`` names expandable segments; None: ``text`` is no such line."""
    if not text.startswith(ALLOCATOR_LINE):
        return None
    _, named, value = text[len(ALLOCATOR_LINE):].partition("=")
    return expandable_segments(value if named else None)
