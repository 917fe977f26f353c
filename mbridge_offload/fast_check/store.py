"""The cache of the fast path: per recipe, the snapshot of its built config; per validated config, the
validator's problems. Everything is keyed by what could change the answer, so a stale answer is never
given: the installed versions of the stack, the plugin's own sources (recipes, overrides, validation,
facts, planning, this package), the Python version; a validation also by every value of the config, the
GPU count, the environment, the keys the command line gave and what the validator reads from the machine (its
GPUs, their driver, the packages importable). A change of any of them is a new key (a new
folder): the old entries are simply not read again.

Where: ``$MBRIDGE_OFFLOAD_CACHE_DIR``, else ``$XDG_CACHE_HOME/mbridge-offload``, else
``~/.cache/mbridge-offload``. ``MBRIDGE_OFFLOAD_NO_CACHE=1`` turns the fast path off. A cache that cannot be
read or written is ignored (the slow path answers).
"""

from __future__ import annotations

import functools
import hashlib
import os
import pickle
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterable, Mapping

from mbridge_offload.fast_check import snapshot

ROOT = Path(__file__).resolve().parents[2]
# What a cached answer depends on, besides the installed packages: the code that builds, overrides,
# validates and plans a config, and this package's own format.
SOURCES = ("recipes", "overrides", "mbridge_offload/validation", "mbridge_offload/facts", "mbridge_offload/planning",
           "mbridge_offload/fast_check", "mbridge_offload/prepare.py", "mbridge_offload/runtime/offload_tuning.py",
           "mbridge_offload/runtime/stopping.py")
PACKAGES = ("megatron-bridge", "megatron-core", "transformer-engine", "transformer-engine-torch", "torch",
            "transformers", "hydra-core", "omegaconf")
# Environment variables that say nothing about a run (the shell's bookkeeping): left out of the key.
VOLATILE_ENV = frozenset({"_", "OLDPWD", "PWD", "SHLVL", "COLUMNS", "LINES", "TERM", "TERM_PROGRAM",
                          "TERM_PROGRAM_VERSION", "TERM_SESSION_ID", "SSH_CLIENT", "SSH_CONNECTION", "SSH_TTY",
                          "DISPLAY", "WINDOWID", "TMUX", "TMUX_PANE", "STY", "PS1", "PS2", "PROMPT_COMMAND",
                          "HISTFILE", "LS_COLORS", "VIRTUAL_ENV_PROMPT", "MBRIDGE_OFFLOAD_CACHE_DIR"})


# The environment as the command was started with, before any import (Megatron's and Transformer Engine's
# imports set variables of their own): what a validation is keyed by when it reads the process environment.
START_ENVIRON = dict(os.environ)


def enabled() -> bool:
    return os.environ.get("MBRIDGE_OFFLOAD_NO_CACHE", "") in ("", "0")


def cache_root() -> Path:
    if os.environ.get("MBRIDGE_OFFLOAD_CACHE_DIR"):
        return Path(os.environ["MBRIDGE_OFFLOAD_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "mbridge-offload"


def _versions() -> list[str]:
    from importlib.metadata import PackageNotFoundError, version

    out = []
    for name in PACKAGES:
        try:
            out.append(f"{name}=={version(name)}")
        except PackageNotFoundError:
            out.append(f"{name}: none")
    return out


def _source_files() -> list[Path]:
    files = []
    for item in SOURCES:
        path = ROOT / item
        files += sorted(path.rglob("*.py")) if path.is_dir() else [path]
    return files


@functools.lru_cache(maxsize=None)
def stack_key() -> str:
    """The key of everything installed and every source a cached answer depends on."""
    digest = hashlib.sha256()
    digest.update(f"format {snapshot.FORMAT}; python {sys.version}".encode())
    for line in _versions():
        digest.update(line.encode() + b"\n")
    for path in _source_files():
        try:
            digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
        except OSError:
            digest.update(str(path).encode() + b" unreadable\0")
    return digest.hexdigest()[:24]


def _folder() -> Path:
    return cache_root() / stack_key()


def _read(path: Path) -> Any | None:
    try:
        with path.open("rb") as handle:
            return pickle.load(handle)
    except Exception:  # noqa: BLE001 - missing, unreadable or half-written: not in the cache
        return None


def _write(path: Path, value: Any) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("wb", dir=path.parent, delete=False, suffix=".tmp") as handle:
            pickle.dump(value, handle, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(handle.name, path)  # atomic: a reader never sees half a file
    except Exception:  # noqa: BLE001 - a cache that cannot be written is no cache
        try:
            os.unlink(handle.name)  # type: ignore[possibly-undefined]
        except Exception:  # noqa: BLE001
            pass


def load_base(recipe_name: str) -> tuple[Any, dict | None] | None:
    """The look-alike of ``recipe_name``'s built config with the mixed-precision presets, or None when not
    cached (or the cache is off)."""
    if not enabled():
        return None
    data = _read(_folder() / "recipes" / f"{recipe_name}.pkl")
    if data is None:
        return None
    try:
        return snapshot.load_with_presets(data)
    except Exception:  # noqa: BLE001
        return None


def _presets() -> dict[str, Any] | None:
    """Megatron Bridge's mixed-precision presets, built (called where Megatron is loaded already)."""
    try:
        from megatron.bridge.training.mixed_precision import MIXED_PRECISION_RECIPES

        return {name: make() for name, make in MIXED_PRECISION_RECIPES.items()}
    except Exception:  # noqa: BLE001
        return None


def store_base(recipe_name: str, cfg: Any) -> None:
    if not enabled():
        return
    try:
        data = snapshot.dump(cfg, _presets())
    except Exception:  # noqa: BLE001 - a config this snapshot cannot hold: no fast path for it
        return
    _write(_folder() / "recipes" / f"{recipe_name}.pkl", data)


def _env_key(environ: Mapping[str, str]) -> str:
    return repr(sorted((k, v) for k, v in environ.items() if k not in VOLATILE_ENV))


def reads_files(cfg: Any) -> bool:
    """Whether validating ``cfg`` reads files that may change between two runs (a checkpoint to resume, data
    or tokenizer files): such a validation is never cached."""
    ckpt = getattr(cfg, "checkpoint", None)
    if any(getattr(ckpt, name, None) for name in ("load", "pretrained_checkpoint")):
        return True
    for section in ("dataset", "tokenizer"):
        node = getattr(cfg, section, None)
        if node is None:
            continue
        for name in dir(node) if not hasattr(node, "__dataclass_fields__") else node.__dataclass_fields__:
            if any(word in name for word in ("path", "blend", "file", "model")) and name != "tokenizer_type":
                value = getattr(node, name, None)
                if value not in (None, "", [], (), {}, False) and not isinstance(value, (int, float)):
                    return True
    return False


def validation_key(cfg: Any, num_gpus: int, environ: Mapping[str, str], given_keys: Iterable[str] = frozenset(),
                   machine: Any = None) -> str | None:
    """The key of a validation: the config's values, the GPU count, the environment, the keys the command line
    gave (validation's Context.given_keys: the same values given by another command line may be another answer)
    and what the validator reads from the machine (``machine``: validation.installed.machine_facts(), read here
    when not given: the GPUs, their driver, the packages importable), so that a cache in a home directory shared by
    a login node and a GPU node never answers one with the other's result."""
    if not enabled() or reads_files(cfg):
        return None
    try:
        values = snapshot.fingerprint(cfg)
    except Exception:  # noqa: BLE001
        return None
    if machine is None:
        from mbridge_offload.validation.installed import machine_facts

        machine = machine_facts()
    given = sorted(given_keys)
    return hashlib.sha256(f"{values}|{num_gpus}|{_env_key(environ)}|{given}|{machine!r}".encode()).hexdigest()[:32]


def load_validation(key: str | None) -> tuple | None:
    if key is None:
        return None
    return _read(_folder() / "validations" / f"{key}.pkl")


def store_validation(key: str | None, problems: tuple) -> None:
    if key is not None:
        _write(_folder() / "validations" / f"{key}.pkl", tuple(problems))
