"""The planning package's public names, and that importing it stays light (scripts import it to build
their parser before the slow Megatron import)."""

from __future__ import annotations

import subprocess
import sys


def test_the_public_names_come_from_the_package():
    import mbridge_offload.planning as planning

    for name in ("plan", "Plan", "smallest_fitting_fraction", "largest_host_fitting_fraction", "what_would_fit",
                 "plan_with_recommendation", "format_plan", "plan_problems", "add_plan_arguments", "plan_kwargs",
                 "AUTO_OVERRIDE", "GIB"):
        assert name in planning.__all__ and hasattr(planning, name), name


def test_importing_the_planner_loads_neither_megatron_nor_torch():
    code = ("import sys, mbridge_offload.planning, mbridge_offload.planning.cost_model; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'megatron', 'torch', 'transformer_engine'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
