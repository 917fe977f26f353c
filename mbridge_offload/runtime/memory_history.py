"""The CUDA caching allocator's own record of a run's first steps (run_recipe ``--memory-snapshot STEPS``).

Why: the planner counts the allocator's reserve as at least the loss's largest tensor (planning/memory_plan.py),
because on some runs a block of that size stayed free in the allocator's segments beside the peak, and on others
it did not (docs/benchmarks/planner-auto-4/). What keeps it is in the allocator's history of allocations, frees and
segment mappings, which PyTorch records with each allocation's Python stack, and which PyTorch's viewer draws:
``python -m torch.cuda._memory_viz trace_plot FILE -o FILE.html`` (the page loads its script from a CDN, so open it
where there is a network, or drop the file on https://pytorch.org/memory_viz), and summarises as text:
``python -m torch.cuda._memory_viz stats FILE`` (each segment's allocated and free blocks when it was written).
Recording slows the steps it covers, so it stops after them. A run that fails while recording (out of memory
above all) writes what it recorded up to the failure.
"""

from __future__ import annotations

from pathlib import Path

SNAPSHOT_NAME = "memory_snapshot.rank{rank}.pickle"
# Allocator events kept (the oldest dropped first). A step of the 28-layer dense Qwen3 recipes makes tens of
# thousands; this keeps a few steps while bounding the file (each event carries its Python stack).
MAX_ENTRIES = 200_000

_recording = None  # this process's MemoryHistory while it records (for the failure path in launch.py)


def snapshot_path(out_dir: Path, rank: int) -> Path:
    return out_dir / SNAPSHOT_NAME.format(rank=rank)


def viewer_command(path: Path) -> str:
    return f"python -m torch.cuda._memory_viz trace_plot {path} -o {path}.html"


def header_line(out_dir: Path, steps: int) -> str:
    """The run header's line for ``--memory-snapshot``."""
    return (f"memory snapshot: the CUDA allocator's history of the first {steps} step(s), written to "
            f"{snapshot_path(out_dir, 0)} (rank 0; each rank its own) when they end or the run fails; slows those "
            "steps")


def write_on_failure(why: str) -> None:
    """Write what this process recorded so far, if it is recording: called where a run fails."""
    if _recording is not None:
        _recording.write(f"up to the failure ({why})")


def make_memory_history_callback(out_dir: Path, rank: int, steps: int):
    """A Megatron Bridge callback: record the allocator's history from the start of training, write it after
    ``steps`` training steps of this run (or when training ends, if it ends sooner), then stop recording."""
    import torch
    from megatron.bridge.training.callbacks import Callback

    path = snapshot_path(out_dir, rank)

    class MemoryHistory(Callback):
        def __init__(self) -> None:
            self.steps_done = 0  # steps this process trained since recording began (skipped iterations not counted)

        def on_train_start(self, context) -> None:
            global _recording
            torch.cuda.memory._record_memory_history(max_entries=MAX_ENTRIES, stacks="python")
            _recording = self

        def on_train_step_end(self, context) -> None:
            self.steps_done += 1
            if _recording is self and self.steps_done >= steps:
                self.write(f"steps 1-{self.steps_done} of this run")

        def on_train_end(self, context) -> None:
            if _recording is self:
                self.write(f"the {self.steps_done} step(s) this run trained" if self.steps_done else
                           "training's start; no step ran")

        def write(self, what: str) -> None:
            global _recording
            torch.cuda.memory._dump_snapshot(str(path))
            torch.cuda.memory._record_memory_history(enabled=None)
            _recording = None
            if rank == 0:
                size_mib = path.stat().st_size / 2**20
                print(f"memory snapshot: {what} in {path} ({size_mib:.1f} MiB); view it: {viewer_command(path)}",
                      flush=True)

    return MemoryHistory()
