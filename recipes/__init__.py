"""Offload-enabled Megatron Bridge recipes and the pure transforms they are made of.

    from recipes import get_recipe, with_optimizer_offload
    cfg = with_optimizer_offload(get_recipe("qwen3_1b_proxy_pretrain_config").build(), fraction=0.25)

Importing this package is cheap; Megatron loads when a recipe or transform is first used.
"""

# (``derive`` shares its module's name, so it is imported from the module: ``from recipes.derive import
# derive``. The validator and its rule table sit above recipes: ``from mbridge_offload.validation import
# validate, RULES``.)
_LAZY = {
    "with_optimizer_offload": "recipes.offload",
    "without_optimizer_offload": "recipes.offload",
    "with_activation_offload": "recipes.offload",
    "with_fine_grained_offload": "recipes.offload",
    "with_offload_engine": "recipes.offload",
    "with_stream_moments": "recipes.offload",
}

__all__ = [*_LAZY, "get_recipe", "RECIPES"]

from recipes.registry import RECIPES  # noqa: E402
from recipes.registry import get as get_recipe  # noqa: E402


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'recipes' has no attribute {name!r}")
