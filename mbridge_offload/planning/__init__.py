"""The memory planner and the offload cost model: what a config needs of the GPU and the host, and the
offload fraction that fits, before anything is queued. Pure arithmetic on the config; importing it
does not import Megatron.

    tensors.py         the parameter tensors of one rank, per pipeline stage, in optimizer order
    activations.py     activation bytes per rank, with layer-level and fine-grained activation offload
    data_loader.py     the training data loader's host memory: its pinned batches, the batch being pinned
    memory_plan.py     Plan (and StagePlan per stage) and plan(): the worst rank's GPU and host memory
    fraction_search.py the smallest fraction the GPU fits, the largest the host holds, what else would fit
    report.py          format_plan, and plan_problems: what the plan refuses, as validation Problems
    arguments.py       the planner's command-line options and the plan() arguments they give
    capacity.py        the memory of the machine this runs on (the defaults of a plan made here)
    cost_model.py      the floor of optimizer offload: the least time a step's offload bytes take
"""

from mbridge_offload.facts.units import GIB
from mbridge_offload.planning.arguments import add_plan_arguments, plan_kwargs
from mbridge_offload.planning.fraction_search import (AUTO_OVERRIDE, largest_host_fitting_fraction,
                                                      plan_with_recommendation, recommend, smallest_fitting_fraction,
                                                      what_would_fit)
from mbridge_offload.planning.memory_plan import Plan, StagePlan, plan
from mbridge_offload.planning.report import format_plan, plan_problems

__all__ = ["AUTO_OVERRIDE", "GIB", "Plan", "StagePlan", "add_plan_arguments", "format_plan",
           "largest_host_fitting_fraction", "plan", "plan_kwargs", "plan_problems", "plan_with_recommendation",
           "recommend", "smallest_fitting_fraction", "what_would_fit"]
