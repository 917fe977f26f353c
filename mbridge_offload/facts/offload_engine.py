"""Which engine runs the offloaded optimizer step, and what each one guarantees.

The engine is chosen by one environment variable, so that a recipe (``env_vars``), an override
(``+env_vars.MBRIDGE_OFFLOAD_ENGINE=exact``), ``run_recipe.py --offload-engine`` and the shell all name the
same thing, and the checkpoint's saved config records it. The shell wins over ``env_vars``, as for every
variable a run reads.
"""

from __future__ import annotations

from typing import Mapping

ENGINE_ENV = "MBRIDGE_OFFLOAD_ENGINE"
ENGINE_KEY = f"env_vars.{ENGINE_ENV}"
LIBRARY = "library"
EXACT = "exact"
DELAYED = "delayed"
DEFAULT_ENGINE = LIBRARY
# mode: what it does and what it guarantees, in the words of the run's header
ENGINE_MODES = {
    LIBRARY: "Megatron Core's HybridDeviceOptimizer step: the CPU Adam runs after backward, before the next "
             "step starts (exact)",
    EXACT: "the CPU Adam of step k runs while step k+1's forward starts; each layer's forward waits only for "
           "its own parameters' update (the same update as the library's path: bit-identical in "
           "deterministic mode)",
    DELAYED: "one-step delayed parameter update (ZeRO-Offload's DPU): step k's CPU Adam runs during step k+1, "
             "whose forward and backward use the parameters before it; gradient clipping stays exact; NOT the "
             "same training as without offload, the measured loss deviation is in the engine's benchmark",
}


def engine_mode(env_vars: Mapping[str, object] | None, environ: Mapping[str, str]) -> str:
    """The engine a run will use: the shell's MBRIDGE_OFFLOAD_ENGINE, else the config's, else the default.
    Unknown values come back as given (the validator names them)."""
    if ENGINE_ENV in environ:
        return environ[ENGINE_ENV]
    value = (env_vars or {}).get(ENGINE_ENV)
    return DEFAULT_ENGINE if value is None else str(value)
