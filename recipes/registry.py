"""Recipes by name. Importing this module is cheap (no Megatron): ``--list`` and argument errors
answer at once; a recipe's module is imported only when that recipe is built."""

from __future__ import annotations

import difflib
import importlib
import re
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Recipe:
    name: str
    module: str
    num_gpus: int  # the GPU count the recipe's topology is written for (validation default)
    summary: str

    def function(self) -> Callable:
        return getattr(importlib.import_module(self.module), self.name)

    def build(self):
        return self.function()()


_DENSE = "recipes.qwen3_dense"
_MOE = "recipes.qwen3_moe"

RECIPES: tuple[Recipe, ...] = (
    Recipe("qwen3_30b_a3b_pretrain_config", _MOE, 16,
           "Qwen3-30B-A3B MoE, TP2 PP2 EP4, optimizer offload 0.5"),
    Recipe("qwen3_30b_a3b_fine_grained_offload_config", _MOE, 16,
           "Qwen3-30B-A3B MoE, TP2 PP2 EP4, fine-grained offload of expert_fc1 + moe_act"),
    Recipe("qwen3_30b_a3b_proxy_pretrain_config", _MOE, 1,
           "Qwen3-30B-A3B shape, 4 layers, 128 experts, EP1, optimizer offload 0.5 (one GPU)"),
    Recipe("qwen3_30b_a3b_proxy_fine_grained_offload_config", _MOE, 1,
           "Qwen3-30B-A3B shape, 4 layers, fine-grained offload of expert_fc1 + moe_act (one GPU)"),
    Recipe("qwen3_0p6b_pretrain_config", _DENSE, 1, "Qwen3-0.6B, no offload"),
    Recipe("qwen3_0p6b_activation_offload_config", _DENSE, 1, "Qwen3-0.6B, activation offload 14/28 layers"),
    Recipe("qwen3_0p6b_optimizer_offload_config", _DENSE, 1, "Qwen3-0.6B, optimizer offload 0.5"),
    Recipe("qwen3_1p7b_pretrain_config", _DENSE, 1, "Qwen3-1.7B, no offload"),
    Recipe("qwen3_1p7b_activation_offload_config", _DENSE, 1, "Qwen3-1.7B, activation offload 14/28 layers"),
    Recipe("qwen3_1p7b_optimizer_offload_config", _DENSE, 1, "Qwen3-1.7B, optimizer offload 0.5"),
    Recipe("qwen3_4b_pretrain_config", _DENSE, 2, "Qwen3-4B, TP2, no offload"),
    Recipe("qwen3_4b_activation_offload_config", _DENSE, 2, "Qwen3-4B, TP2, activation offload 18/36 layers"),
    Recipe("qwen3_4b_optimizer_offload_config", _DENSE, 2, "Qwen3-4B, TP2, optimizer offload 0.5"),
    Recipe("qwen3_8b_pretrain_config", _DENSE, 4, "Qwen3-8B, TP4, no offload"),
    Recipe("qwen3_8b_activation_offload_config", _DENSE, 4, "Qwen3-8B, TP4, activation offload 18/36 layers"),
    Recipe("qwen3_8b_optimizer_offload_config", _DENSE, 4, "Qwen3-8B, TP4, optimizer offload 0.5"),
    Recipe("qwen3_1b_proxy_pretrain_config", _DENSE, 1,
           "~1.1B Qwen3-shaped proxy (1.7B widths, 16 layers, seq 2048), no offload (one GPU)"),
    Recipe("qwen3_1b_proxy_optimizer_offload_config", _DENSE, 1,
           "~1.1B proxy, optimizer offload 1.0 (one GPU)"),
    Recipe("qwen3_1b_proxy_activation_offload_config", _DENSE, 1,
           "~1.1B proxy, activation offload 8/16 layers (one GPU)"),
)

_BY_NAME = {recipe.name: recipe for recipe in RECIPES}


class UnknownRecipe(KeyError):
    """A name that is no registered recipe, with the names meant: one written in other case, the function named at
    the end of a file or module path (``recipes/qwen3_dense.py``, ``recipes.qwen3_dense:fn``), else the closest."""

    def __init__(self, name: str):
        super().__init__(name)
        self.name = name
        text = str(name).strip()
        # a path or a module reference instead of a name: what it ends with may be the recipe meant
        self.is_path = any(c in text for c in "/\\:") or text.endswith(".py") or "." in text
        tail = re.split(r"[/\\:.]", text.removesuffix(".py"))[-1] if self.is_path else text
        exact = [n for n in _BY_NAME if n.lower() in (text.lower(), tail.lower())]
        self.suggestions = exact or difflib.get_close_matches(tail or text, list(_BY_NAME), n=3, cutoff=0.5)

    def __str__(self) -> str:
        hint = f" Did you mean: {', '.join(self.suggestions)}?" if self.suggestions else ""
        path = (" --recipe takes the name of a registered recipe, not a file or a module path (a recipe of your own: "
                "register it in recipes/registry.py, or compose it in Python: recipes/README.md)."
                if self.is_path else "")
        return f"unknown recipe {self.name!r}.{hint}{path} See --list for all recipes."


def get(name: str) -> Recipe:
    try:
        return _BY_NAME[name]
    except KeyError:
        raise UnknownRecipe(name) from None


def listing() -> str:
    width = max(len(r.name) for r in RECIPES)
    return "\n".join(f"{r.name:<{width}}  {r.num_gpus:>2} GPU{'s' if r.num_gpus > 1 else ' '}  {r.summary}"
                     for r in RECIPES)


def markdown() -> str:
    """The README's recipe table (a test keeps the README in sync with this registry)."""
    rows = ["| recipe | GPUs | what |", "|---|---|---|"]
    rows += [f"| `{r.name}` | {r.num_gpus} | {r.summary} |" for r in RECIPES]
    return "\n".join(rows)
