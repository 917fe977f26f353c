"""What a Megatron Bridge checkpoint folder says about the run that saved it (its ``run_config.yaml``),
read without Megatron: enough to refuse a resume that cannot work before anything is launched."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

RUN_CONFIG_FILE = "run_config.yaml"  # written by Megatron Bridge into every iter_* folder
_ITERATION_FOLDER = re.compile(r"^iter_(\d+)$")


def latest_iteration_dir(load_dir: str | Path | None) -> Path | None:
    """The newest ``iter_*`` folder of ``load_dir`` (or ``load_dir`` itself when it is one), or None."""
    if not load_dir:
        return None
    path = Path(load_dir)
    if _ITERATION_FOLDER.match(path.name) and path.is_dir():
        return path
    if not path.is_dir():
        return None
    found = [(int(m.group(1)), child) for child in path.iterdir()
             if child.is_dir() and (m := _ITERATION_FOLDER.match(child.name))]
    return max(found)[1] if found else None


def saved_iteration(load_dir: str | Path | None) -> int | None:
    """The training iteration of the newest checkpoint of ``load_dir``, or None when there is none."""
    folder = latest_iteration_dir(load_dir)
    return None if folder is None else int(_ITERATION_FOLDER.match(folder.name).group(1))


def saved_run_config(load_dir: str | Path | None) -> dict[str, Any] | None:
    """The run configuration saved with the newest checkpoint of ``load_dir``, or None when there is none."""
    folder = latest_iteration_dir(load_dir)
    if folder is None or not (folder / RUN_CONFIG_FILE).is_file():
        return None
    import yaml

    class _Loader(yaml.SafeLoader):
        """run_config.yaml may carry Python tags (dtypes, enums): read them as their text."""

    _Loader.add_multi_constructor("", lambda loader, suffix, node: (
        loader.construct_scalar(node) if isinstance(node, yaml.ScalarNode) else None))
    try:
        data = yaml.load((folder / RUN_CONFIG_FILE).read_text(), Loader=_Loader)
    except (OSError, yaml.YAMLError):
        return None
    return data if isinstance(data, dict) else None
