"""The CUDA caching allocator's own record of a run's first steps (run_recipe ``--memory-snapshot STEPS``).

Why: the planner counts the allocator's reserve as at least the loss's largest tensor (planning/memory_plan.py),
because on some runs a block of that size stayed free in the allocator's segments beside the peak, and on others
it did not (docs/benchmarks/planner-auto-4/). What keeps it is in the allocator's history of allocations, frees and
segment mappings, which PyTorch records with each one's Python stack, and which PyTorch's viewer draws:
``python -m torch.cuda._memory_viz trace_plot FILE -o FILE.html`` (or the file dropped on
https://pytorch.org/memory_viz). Recording slows the steps it covers, so it stops after them.
"""

from __future__ import annotations

from pathlib import Path

SNAPSHOT_NAME = "memory_snapshot.rank{rank}.pickle"
# Allocator events kept (oldest dropped first). A step of the 28-layer dense Qwen3 recipes makes tens of thousands;
# this keeps a few steps of them and the file within what one device call brings back.
MAX_ENTRIES = 300_000


def snapshot_path(out_dir: Path, rank: int) -> Path:
    return out_dir / SNAPSHOT_NAME.format(rank=rank)


def viewer_command(path: Path) -> str:
    return f"python -m torch.cuda._memory_viz trace_plot {path} -o {path}.html"


def header_line(out_dir: Path, steps: int) -> str:
    """The run header's line for ``--memory-snapshot``."""
    return (f"memory snapshot: the CUDA allocator's history of the first {steps} step(s), written to "
            f"{snapshot_path(out_dir, 0)} (rank 0; each rank its own) when they end; slows those steps")


def make_memory_history_callback(out_dir: Path, rank: int, steps: int):
    """A Megatron Bridge callback: record the allocator's history from the start of training, write it after
    ``steps`` steps of this run (or at the end of training, if the run is shorter), then stop recording."""
    import torch
    from megatron.bridge.training.callbacks import Callback

    path = snapshot_path(out_dir, rank)

    class MemoryHistory(Callback):
        def __init__(self) -> None:
            self.first_step = None  # the train state's step when training started (a resumed run starts past 0)
            self.written = False

        def on_train_start(self, context) -> None:
            self.first_step = context.state.train_state.step
            torch.cuda.memory._record_memory_history(max_entries=MAX_ENTRIES, stacks="python")

        def on_train_step_end(self, context) -> None:
            # the train state's step is bumped after the callbacks: this step is its value + 1
            if not self.written and context.state.train_state.step + 1 - self.first_step >= steps:
                self._write(context.state.train_state.step + 1 - self.first_step)

        def on_train_end(self, context) -> None:
            if not self.written and self.first_step is not None:
                self._write(context.state.train_state.step - self.first_step)

        def _write(self, steps_recorded: int) -> None:
            torch.cuda.memory._dump_snapshot(str(path))
            torch.cuda.memory._record_memory_history(enabled=None)
            self.written = True
            if rank == 0:
                size_mib = path.stat().st_size / 2**20
                print(f"memory snapshot: steps 1-{steps_recorded} of this run in {path} ({size_mib:.1f} MiB); "
                      f"view it: {viewer_command(path)}", flush=True)

    return MemoryHistory()
