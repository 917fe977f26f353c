"""Silence Megatron's import-time notices, which say nothing about the run (Apex is optional here)."""

import warnings


def quiet_import_notices() -> None:
    for message in ("Apex is not installed", "Triton is not supported", ".*is experimental",
                    ".*torch_dtype.*deprecated", ".*torch.jit.script.*deprecated"):
        warnings.filterwarnings("ignore", message=message)
    warnings.filterwarnings("ignore", category=SyntaxWarning)
