"""The config a diagnosed run trained, for computing its fix with the planner: the ``run_config.yaml``
Megatron Bridge saved (in the run folder or a checkpoint beside it), else the recipe and overrides of the
command line its log starts with. NoRunConfig when neither gives one, with why (a saved file that is no training config,
a command whose recipe is unknown or whose override is refused): the fix then stays generic, and says so.

A saved run_config.yaml is read without Megatron, as nested mappings that the planner reads by attribute
(``cfg.model.num_layers``); dtypes saved as ``{_target_: torch.bfloat16}`` become their byte sizes.
"""

from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mbridge_offload.diagnosis.run_facts import Command
from mbridge_offload.facts.checkpoint_dir import RUN_CONFIG_FILE, latest_iteration_dir

_DTYPE_BYTES = {"float64": 8, "float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2, "uint8": 1,
                "int8": 1}


class SavedConfig(dict):
    """A run_config.yaml section: a mapping (config_tree's set_path edits it) read by attribute."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def __deepcopy__(self, memo):
        import copy

        return type(self)({key: copy.deepcopy(value, memo) for key, value in self.items()})


@dataclass(frozen=True)
class SavedDtype:
    """A dtype as run_config.yaml saves it; ``itemsize`` is what facts.dtypes.dtype_bytes reads."""

    name: str
    itemsize: int


def _convert(node: Any) -> Any:
    if isinstance(node, dict):
        target = node.get("_target_")
        if isinstance(target, str) and target.startswith("torch.") and target[6:] in _DTYPE_BYTES:
            return SavedDtype(target, _DTYPE_BYTES[target[6:]])
        return SavedConfig({key: _convert(value) for key, value in node.items()})
    if isinstance(node, list):
        return [_convert(value) for value in node]
    return node


def load_run_config(path: Path) -> SavedConfig | None:
    """A run_config.yaml as the planner reads it, or None when it cannot be read as a training config."""
    import yaml

    class _Loader(yaml.SafeLoader):
        """run_config.yaml may carry Python tags (dtypes, enums): read them as their text."""

    _Loader.add_multi_constructor("", lambda loader, suffix, node: (
        loader.construct_scalar(node) if isinstance(node, yaml.ScalarNode) else None))
    try:
        data = yaml.load(path.read_text(), Loader=_Loader)
    except (OSError, yaml.YAMLError):
        return None
    if not isinstance(data, dict) or not all(isinstance(data.get(k), dict) for k in ("model", "optimizer", "train")):
        return None
    cfg = _convert(data)
    cfg["model"] = _as_saved_class(cfg["model"])
    return cfg


def _as_saved_class(section: SavedConfig) -> SavedConfig:
    """The model section as an instance of a stand-in of the class its ``_target_`` names (saved_classes.py), so the
    planner tells what the provider builds as it does for a built config; a target whose source is not installed here
    keeps its name, with no method of its own."""
    from mbridge_offload.diagnosis.saved_classes import stand_in_class
    from mbridge_offload.planning.plannable import SNAPSHOT_DEFINES

    target = section.get("_target_")
    if not isinstance(target, str) or "." not in target:
        return section
    return stand_in_class(target, SavedConfig, SNAPSHOT_DEFINES, "provide")(section)


def find_run_config(run_dir: Path | None) -> Path | None:
    """run_config.yaml of the run: in its folder, or in the newest checkpoint under it (two levels deep)."""
    if run_dir is None or not run_dir.is_dir():
        return None
    if (run_dir / RUN_CONFIG_FILE).is_file():
        return run_dir / RUN_CONFIG_FILE
    candidates = [run_dir] + sorted(child for child in run_dir.iterdir() if child.is_dir())
    for folder in candidates:
        newest = latest_iteration_dir(folder)
        if newest is not None and (newest / RUN_CONFIG_FILE).is_file():
            return newest / RUN_CONFIG_FILE
    return None


class NotBuilt(Exception):
    """Why the recipe and overrides of a log's command give no config, in words for the report."""


_REFUSALS_SHOWN = 2  # a command's refused overrides named in the report; the rest counted


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0][:200] if text else ''}"


def build_from_command(command: Command) -> Any:
    """The recipe's config with the command's overrides (loads Megatron Bridge); NotBuilt says why there is none."""
    from overrides import apply_overrides
    from overrides.errors import OverrideErrors
    from recipes import registry

    try:
        recipe = registry.get(command.recipe)
    except KeyError as unknown:
        meant = getattr(unknown, "suggestions", None)
        raise NotBuilt(f"its recipe {command.recipe!r} is no recipe of this checkout"
                       + (f" (did you mean {' or '.join(meant)}?)" if meant else "")) from None
    with contextlib.redirect_stdout(io.StringIO()):
        try:
            cfg = recipe.build()
        except (ValueError, TypeError, AttributeError, KeyError) as error:
            raise NotBuilt(f"its recipe {command.recipe} did not build ({_first_line(error)})") from None
        try:
            return apply_overrides(cfg, [o for o in command.overrides if not o.endswith("=auto")])
        except OverrideErrors as refused:
            named = "; ".join(f"{e.text} ({e.message})" for e in refused.errors[:_REFUSALS_SHOWN])
            more = len(refused.errors) - _REFUSALS_SHOWN
            raise NotBuilt(f"run_recipe.py refuses {'its override' if len(refused.errors) == 1 else 'its overrides'} "
                           + named + (f" and {more} more" if more > 0 else "")) from None
        except (ValueError, TypeError, AttributeError, KeyError) as error:
            raise NotBuilt(f"its overrides could not be applied ({_first_line(error)})") from None


@dataclass(frozen=True)
class RunConfig:
    cfg: Any
    source: str  # in words, for the report


@dataclass(frozen=True)
class NoRunConfig:
    """Why the run has no config to plan with, in words for the report; "" where its output names none at all (no
    run folder with a saved config, no command)."""

    why: str = ""


def run_config(run_dir: Path | None, command: Command | None, build: bool = True) -> RunConfig | NoRunConfig:
    """The run's config from the best source there is, or why there is none."""
    saved = find_run_config(run_dir)
    whys = []
    if saved is not None:
        cfg = load_run_config(saved)
        if cfg is not None:
            return RunConfig(cfg, f"{saved}")
        whys.append(f"{saved} cannot be read as a training config")
    if command is not None and not build:
        whys.append(f"the recipe of the log's command ({command.recipe}) was not built (--no-build)")
    elif command is not None:
        try:
            cfg = build_from_command(command)
        except NotBuilt as why:
            whys.append(f"the log's run_recipe.py command was found but could not be rebuilt: {why}")
        else:
            return RunConfig(cfg, f"recipe {command.recipe} with the log's overrides ({len(command.overrides)})")
    return NoRunConfig("; ".join(whys))
