"""The classes a saved run_config.yaml names only by ``_target_``, looked up in the installed source without importing it.

The planner decides what it can count by the class that defines a model provider's ``provide()`` (planning/plannable.py:
GPTModelProvider's builds the GPT model it counts; a vision-language, T5 or diffusion provider defines its own). A saved
config holds only the provider's qualified name, and importing Megatron Bridge to look at the class takes ~35-60 s,
longer than the whole diagnosis. So the class and its bases are read from their source files with ``ast``: which of them
defines ``provide``, in the order Python's method resolution would meet them (C3). The result is a chain of stand-in
classes with the same names and modules, each noting whether its original defines the method, as a cached config's
look-alike classes do (fast_check/snapshot.py), so the planner's check answers alike for the three kinds of config.
"""

from __future__ import annotations

import ast
import importlib.machinery
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

MAX_DEPTH = 32  # base classes followed at most (a cycle or a very deep tree ends the lookup)


@dataclass(frozen=True)
class SourceClass:
    """One class as its source file defines it."""

    qualified: str  # module.Class
    bases: tuple[str, ...]  # qualified names of its bases, in order (unresolved ones as written)
    defines: frozenset[str]  # the methods its own body defines


def _module_file(module: str) -> Path | None:
    """The source file of ``module``, found without running any package's ``__init__``."""
    parts = module.split(".")
    paths = None
    spec = None
    for i in range(len(parts)):
        spec = importlib.machinery.PathFinder.find_spec(".".join(parts[: i + 1]) if paths is None else parts[i], paths)
        if spec is None:
            return None
        paths = spec.submodule_search_locations
        if i < len(parts) - 1 and paths is None:
            return None
    origin = getattr(spec, "origin", None)
    return Path(origin) if origin and origin.endswith(".py") else None


@lru_cache(maxsize=None)
def _parsed(module: str) -> tuple[ast.Module, bool] | None:
    """The module's syntax tree and whether it is a package (its ``__init__``)."""
    path = _module_file(module)
    if path is None:
        return None
    try:
        return ast.parse(path.read_text(encoding="utf-8"), filename=str(path)), path.name == "__init__.py"
    except (OSError, SyntaxError, ValueError):
        return None


def _imports(tree: ast.Module, module: str, is_package: bool) -> dict[str, str]:
    """Names a module imports -> their qualified names (relative imports resolved from ``module``; a package's
    ``__init__`` is its own anchor)."""
    here = module.split(".") if is_package else module.split(".")[:-1]
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            anchor = here[: len(here) - node.level + 1] if node.level else []
            base = ".".join([*anchor, node.module] if node.module else anchor)
            for alias in node.names:
                names[alias.asname or alias.name] = f"{base}.{alias.name}" if base else alias.name
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    names[alias.asname] = alias.name
                else:
                    head = alias.name.split(".")[0]
                    names[head] = head
    return names


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return None if inner is None else f"{inner}.{node.attr}"
    if isinstance(node, ast.Subscript):  # Generic[T], a dataclass base with parameters
        return _dotted(node.value)
    return None


@lru_cache(maxsize=None)
def source_class(qualified: str, depth: int = 0) -> SourceClass | None:
    """``qualified`` (module.Class) as its source defines it; a name another module re-exports is followed there."""
    if depth > MAX_DEPTH or "." not in qualified:
        return None
    module, name = qualified.rsplit(".", 1)
    parsed = _parsed(module)
    if parsed is None:
        return None
    tree, is_package = parsed
    imports = _imports(tree, module, is_package)
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            bases = []
            for base in node.bases:
                written = _dotted(base)
                if written is None or written in ("object", "Generic", "Protocol", "ABC"):
                    continue
                head, _, rest = written.partition(".")
                if head in imports:
                    bases.append(imports[head] + (f".{rest}" if rest else ""))
                else:
                    bases.append(f"{module}.{written}")
            defines = frozenset(item.name for item in node.body
                                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)))
            return SourceClass(qualified=qualified, bases=tuple(bases), defines=defines)
    if name in imports and imports[name] != qualified:  # re-exported: follow it to where it is defined
        return source_class(imports[name], depth + 1)
    return None


def linearization(qualified: str) -> list[SourceClass] | None:
    """The classes of ``qualified``'s method resolution order (C3), as far as their source is found: None when
    ``qualified`` itself is not found; a base whose source is not found ends its branch there."""
    def merge(sequences: list[list[SourceClass]]) -> list[SourceClass] | None:
        result: list[SourceClass] = []
        sequences = [list(s) for s in sequences if s]
        while sequences:
            for sequence in sequences:
                head = sequence[0]
                if not any(head in other[1:] for other in sequences):
                    break
            else:
                return None  # no consistent order: Python would refuse the class too
            result.append(head)
            sequences = [[c for c in s if c != head] for s in sequences]
            sequences = [s for s in sequences if s]
        return result

    def order(name: str, depth: int) -> list[SourceClass] | None:
        klass = source_class(name)
        if klass is None or depth > MAX_DEPTH:
            return None
        found = [b for b in (source_class(base) for base in klass.bases) if b is not None]
        rest = merge([*(order(b.qualified, depth + 1) or [b] for b in found), found])
        return None if rest is None else [klass, *rest]

    return order(qualified, 0)


def stand_in_class(qualified: str, root: type, marker: str, method: str) -> type:
    """A class named like ``qualified`` (module, name) deriving from ``root``, whose MRO carries a stand-in of each
    base found in the source, each with ``marker`` = (``method``,) where its original defines ``method``. Where
    the class's source is not found (Megatron Bridge not installed here, or another version): then the class alone,
    its name kept, with no method of its own."""
    chain = linearization(qualified) or [SourceClass(qualified=qualified, bases=(), defines=frozenset())]
    made: type = root
    for klass in reversed(chain):  # the most basic first, each deriving from the one before (a single chain: the
        module, name = klass.qualified.rsplit(".", 1)  # MRO's order is what the planner's lookup reads)
        made = type(name, (made,), {"__module__": module, "__qualname__": name,
                                    marker: (method,) if method in klass.defines else ()})
    return made
