"""Composable offload transforms: each takes a config and returns a new one with only its deltas.

Each transform sets the switches of its own mechanism and turns off what that mechanism cannot run
with (logged, never silent). It never touches another mechanism's keys, so transforms commute:
``with_optimizer_offload(with_activation_offload(cfg, ...), ...)`` equals the other order. Conflicts
between mechanisms are not resolved here: the validator reports them with the fix.
"""

from __future__ import annotations

from numbers import Integral, Real
from typing import Iterable

from recipes.derive import derive
from mbridge_offload.facts.key_ranges import range_violations
from mbridge_offload.facts.offload_engine import ENGINE_KEY, ENGINE_MODES, MOMENT_BYTES, STREAM_MOMENTS_KEY


def _number(name: str, value, whole: bool = False):
    kind = Integral if whole else Real  # numpy's scalars too
    if isinstance(value, bool) or not isinstance(value, kind):
        raise TypeError(f"{name} must be a {'whole number' if whole else 'number'}, got {value!r}")
    return int(value) if whole else value


def _flag(name: str, value) -> bool:
    """A switch: True or False only (``bool("false")`` is True, so a string is refused, not read); numpy's bools
    too (a mask or a comparison of arrays gives them)."""
    if isinstance(value, bool):
        return value
    if type(value).__module__ == "numpy" and type(value).__name__ in ("bool_", "bool"):
        return bool(value)
    raise TypeError(f"{name} must be True or False, got {value!r}")


def _derive_in_range(cfg, deltas, why):
    """derive(), refusing values outside a key's admissible range (the same ranges the validator checks)."""

    def check(new_cfg):
        broken = range_violations(new_cfg, deltas.keys())
        if broken:
            raise ValueError("; ".join(f"{key_range.key}={value}: {key_range.text}" for key_range, value, _ in broken))

    return derive(cfg, deltas, why, check=check)


def with_optimizer_offload(cfg, fraction: float = 1.0, overlap: bool = False):
    """Keep ``fraction`` of the optimizer states (and their Adam step) on the CPU.

    Runs Megatron Core's HybridDeviceOptimizer inside the distributed optimizer, which it needs.
    ``overlap`` overlaps the D2H gradient / H2D parameter copies with the CPU optimizer step. Off by
    default: the library's overlap (one CPU optimizer per tensor) measured slower than none in one
    H200 session; what pays is overlap in a few chunks, which run_recipe.py's tuning turns on at
    launch (mbridge_offload/runtime/offload_tuning.py, mbridge_offload/runtime/chunked_overlap.py).
    """
    fraction = float(_number("fraction", fraction))
    return _derive_in_range(cfg, {
        "optimizer.optimizer_cpu_offload": True,
        "optimizer.optimizer_offload_fraction": fraction,
        "optimizer.overlap_cpu_optimizer_d2h_h2d": _flag("overlap", overlap),
        "optimizer.use_distributed_optimizer": True,
        "ddp.use_distributed_optimizer": True,
    }, why=f"optimizer offload: {fraction:.0%} of optimizer states on the CPU")


def with_offload_engine(cfg, mode: str):
    """Run the offloaded optimizer step with ``mode``'s engine (mbridge_offload/runtime/streaming_engine.py):
    ``exact`` (the CPU Adam under the next forward, the same update), ``stream`` (Adam on the GPU with the moments
    streamed from the host: the update without offload), ``delayed`` (one-step delayed update),
    ``library`` (Megatron Core's step). Sets ``env_vars.MBRIDGE_OFFLOAD_ENGINE``; a value in the shell wins."""
    if not isinstance(mode, str):
        raise TypeError(f"mode must be the name of an offload engine, one of {', '.join(ENGINE_MODES)} (a string), "
                        f"got {mode!r}")
    if mode not in ENGINE_MODES:
        raise ValueError(f"offload engine must be one of {', '.join(ENGINE_MODES)}, got {mode!r}")
    return derive(cfg, {ENGINE_KEY: mode}, why=f"offload engine: {mode}")


def with_stream_moments(cfg, moments: str):
    """Keep the stream engine's Adam moments in ``moments`` (``fp32``, the default, or ``bf16``: 8 bytes per
    offloaded parameter on the host instead of 12 and half the bytes over the host link, at the price of moments
    rounded to bf16 at every step, so the training is not bit-identical to no offload). Sets
    ``env_vars.MBRIDGE_OFFLOAD_STREAM_MOMENTS``; a value in the shell wins. Only the stream engine reads it (the
    validator refuses bf16 with another engine)."""
    if not isinstance(moments, str) or moments not in MOMENT_BYTES:
        raise ValueError(f"moments ({STREAM_MOMENTS_KEY}) must be one of {', '.join(MOMENT_BYTES)} (a string), got "
                         f"{moments!r}")
    return derive(cfg, {STREAM_MOMENTS_KEY: moments}, why=f"stream engine's Adam moments in {moments}")


def without_optimizer_offload(cfg):
    """All optimizer states on the GPU (the baseline of an offload sweep)."""
    return derive(cfg, {
        "optimizer.optimizer_cpu_offload": False,
        "optimizer.optimizer_offload_fraction": 0.0,
        "optimizer.overlap_cpu_optimizer_d2h_h2d": False,
    }, why="optimizer offload off")


def with_activation_offload(cfg, num_layers: int, weights: bool = False, activations: bool = True,
                            double_buffering: bool = False):
    """Layer-level activation offload of ``num_layers`` transformer layers (TE offload context).

    Needs PP=1 (validated, not changed here: changing the topology is the user's call). Turns off
    activation recomputation and CUDA graphs, which this mechanism cannot run with.
    """
    num_layers = _number("num_layers", num_layers, whole=True)
    return _derive_in_range(cfg, {
        "model.cpu_offloading": True,
        "model.cpu_offloading_num_layers": num_layers,
        "model.cpu_offloading_activations": _flag("activations", activations),
        "model.cpu_offloading_weights": _flag("weights", weights),
        "model.cpu_offloading_double_buffering": _flag("double_buffering", double_buffering),
        "model.recompute_granularity": None,
        "model.recompute_method": None,
        "model.recompute_num_layers": None,
        "model.cuda_graph_impl": "none",
    }, why=f"activation offload of {num_layers} layers (no recompute, no CUDA graphs)")


def with_fine_grained_offload(cfg, modules: Iterable[str] = ("expert_fc1", "moe_act"),
                              fraction: float = 1.0):
    """Offload the inputs of chosen submodules (e.g. ``expert_fc1``, ``moe_act``); works with PP>1.

    Sets ``NVTE_CPU_OFFLOAD_V1=1`` in the recipe's environment, which Transformer Engine >= 2.10
    needs so that only activations are offloaded (a value set in the shell still wins).
    """
    if isinstance(modules, str):
        raise TypeError(f"modules must be a list of module names, got the string {modules!r}")
    modules = list(modules) if isinstance(modules, Iterable) else modules
    if not isinstance(modules, list) or not all(isinstance(m, str) for m in modules):
        raise TypeError(f"modules must be a list of module names (strings), got {modules!r}")
    modules = list(dict.fromkeys(modules))
    if not modules:
        raise ValueError("modules must name at least one module, e.g. ['expert_fc1', 'moe_act']")
    fraction = float(_number("fraction", fraction))
    return _derive_in_range(cfg, {
        "model.fine_grained_activation_offloading": True,
        "model.offload_modules": modules,
        "model.activation_offload_fraction": fraction,
        "env_vars.NVTE_CPU_OFFLOAD_V1": "1",
    }, why=f"fine-grained activation offload of {', '.join(modules)}")
