"""Hydra-grammar overrides for Megatron Bridge ConfigContainers: typed, did-you-mean for typos, every
error of a command reported together, input never mutated. (Ranges are rules of the validator.)"""

from overrides.errors import OverrideError, OverrideErrors

__all__ = ["apply_overrides", "OverrideError", "OverrideErrors"]


def __getattr__(name):  # keep ``import overrides`` light: the apply machinery loads on first use
    if name == "apply_overrides":
        from overrides.apply import apply_overrides

        return apply_overrides
    raise AttributeError(name)
