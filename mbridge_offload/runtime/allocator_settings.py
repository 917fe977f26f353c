"""The recipe's PyTorch allocator settings, put in effect before the model's first allocation.

PyTorch's caching allocator reads ``PYTORCH_CUDA_ALLOC_CONF`` once, when CUDA starts in the process. Importing
Megatron Bridge and Transformer Engine starts it, and Megatron Bridge puts a recipe's ``env_vars`` into the
environment only later, inside ``pretrain``. So a recipe's ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``
(every Megatron Bridge recipe sets it: ``COMMON_RECIPE_ENV_VARS``) did nothing: on the H200 a run of the MoE proxy
held 633 fixed segments and 2.04 GiB reserved beyond its peak; with the value in the shell, 4 expandable segments
and 1.09 GiB (docs/benchmarks/alloc-conf/). ``apply_allocator_settings`` hands the value to the allocator itself.
"""

from __future__ import annotations

from collections.abc import Mapping

from mbridge_offload.facts.environment import ALLOC_CONF_ENV, run_env


class AllocatorSettingsError(RuntimeError):
    """The allocator refused the settings: raised before training, with the fix."""


def apply_allocator_settings(env_vars: Mapping[str, object] | None, environ: Mapping[str, str]) -> str | None:
    """Give the allocator this run's settings now (the shell's value, else the recipe's); returns them (None:
    PyTorch's defaults)."""
    setting = run_env(ALLOC_CONF_ENV, env_vars, environ)
    if not setting:
        return None
    import torch

    apply = getattr(torch._C, "_accelerator_setAllocatorSettings", None) or torch.cuda.memory._set_allocator_settings
    try:
        apply(setting)
    except (RuntimeError, ValueError) as error:
        source = "the shell" if environ.get(ALLOC_CONF_ENV) else "the recipe's env_vars"
        raise AllocatorSettingsError(
            f"{ALLOC_CONF_ENV}={setting} (from {source}) was refused by PyTorch's allocator: {error}. Fix: "
            f"export {ALLOC_CONF_ENV}={setting} in the shell before the run starts, or "
            f"++env_vars.{ALLOC_CONF_ENV}=expandable_segments:False to keep PyTorch's defaults") from error
    return setting
