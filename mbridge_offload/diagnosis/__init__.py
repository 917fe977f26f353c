"""Troubleshooting a run from its output: each failure the rule table knows, the lines that show it, how to
confirm it, and the fix (computed by the planner where the run's config is found). Importing it loads
neither Megatron nor torch.

    logs.py           a run's output as numbered lines, rank prefixes of torchrun / Slurm / mpirun stripped
    run_facts.py      what the output says: command, offload settings, threads, step times, OOM numbers
    config_source.py  the run's config: a saved run_config.yaml, else the recipe and overrides of its command
    fixes.py          fixes computed with the planner (next fraction after an OOM, host-fitting fraction, ...)
    engine.py         diagnose(), diagnose_each() (each LOG on its own), Diagnosis, UnreadableLog, Finding,
                      format_diagnosis
"""

from mbridge_offload.diagnosis.engine import (Diagnosis, Finding, UnreadableLog, diagnose, diagnose_each,
                                              format_diagnosis)
from mbridge_offload.diagnosis.logs import LogError

__all__ = ["Diagnosis", "Finding", "LogError", "UnreadableLog", "diagnose", "diagnose_each", "format_diagnosis"]
