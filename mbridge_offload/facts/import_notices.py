"""Silence the import-time notices of Megatron and its stack, which say nothing about the run (Apex is optional here,
and a machine without a GPU has no CUDA runtime to find)."""

import logging
import warnings

# loggers whose import-time lines say nothing to a user of this plugin: torch's "No CUDA runtime is found" on a
# machine without a GPU (torch.utils.cpp_extension, imported by Transformer Engine), and transformers' notice that
# a config's torch_dtype is now called dtype (Megatron Bridge's providers read it)
QUIET_LOGGERS = ("torch.utils.cpp_extension", "transformers.configuration_utils")


def quiet_import_notices() -> None:
    for message in ("Apex is not installed", "Triton is not supported", ".*is experimental",
                    ".*torch_dtype.*deprecated", ".*torch.jit.script.*deprecated"):
        warnings.filterwarnings("ignore", message=message)
    warnings.filterwarnings("ignore", category=SyntaxWarning)
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
