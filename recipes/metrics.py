"""Per-step metrics of a training run and its summary.

Every rank writes ``metrics.rank<R>.jsonl`` (one JSON object per step: step time, loss where the
rank has it, GPU memory allocated/reserved current and peak, host RSS, pinned host memory). Rank 0
then writes ``summary.json``: median steady-state step time (warm-up excluded), peak memory over
all ranks, final loss. ``format_summary`` renders it as the table users read in the terminal.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any

GIB = 1024**3


def host_rss_bytes() -> int:
    """Resident set size of this process (Linux /proc; 0 where unavailable)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def pinned_host_bytes() -> int | None:
    """Bytes held by PyTorch's pinned host allocator (what offload pins), or None if not reported."""
    import torch

    stats_fn = getattr(torch.cuda, "host_memory_stats", None)
    if stats_fn is None:
        return None
    stats = stats_fn()
    for key in ("allocated_bytes.current", "allocated_bytes.all.current", "reserved_bytes.current"):
        if key in stats:
            return int(stats[key])
    return None


def _loss_value(loss_dict: dict | None) -> float | None:
    if not loss_dict:
        return None
    value = loss_dict.get("lm loss", next(iter(loss_dict.values())))
    if hasattr(value, "numel"):
        value = value.float()
        value = (value[0] / value[1]) if value.numel() == 2 else value.reshape(-1)[0]
        return float(value.item())
    return float(value)


def step_record(step: int, step_time_s: float, loss: float | None, grad_norm: float | None) -> dict[str, Any]:
    import torch

    pinned = pinned_host_bytes()
    return {
        "step": step,
        "step_time_s": round(step_time_s, 6),
        "loss": loss,
        "grad_norm": None if grad_norm is None else float(grad_norm),
        "allocated_gib": torch.cuda.memory_allocated() / GIB,
        "reserved_gib": torch.cuda.memory_reserved() / GIB,
        "peak_allocated_gib": torch.cuda.max_memory_allocated() / GIB,
        "peak_reserved_gib": torch.cuda.max_memory_reserved() / GIB,
        "host_rss_gib": host_rss_bytes() / GIB,
        "pinned_host_gib": None if pinned is None else pinned / GIB,
    }


def make_callback(out_dir: Path, rank: int):
    """A Megatron Bridge training callback that writes this rank's per-step metrics."""
    import torch
    from megatron.bridge.training.callbacks import Callback

    class StepMetrics(Callback):
        def __init__(self) -> None:
            out_dir.mkdir(parents=True, exist_ok=True)
            self.path = out_dir / f"metrics.rank{rank}.jsonl"
            self.file = self.path.open("w")
            self.started = 0.0
            self.step = 0

        def on_train_step_start(self, context) -> None:
            torch.cuda.synchronize()  # time the step itself, not work queued before it
            self.started = time.perf_counter()

        def on_train_step_end(self, context) -> None:
            torch.cuda.synchronize()
            elapsed = time.perf_counter() - self.started
            self.step += 1
            record = step_record(self.step, elapsed, _loss_value(context.loss_dict), context.grad_norm)
            record["skipped"] = bool(context.skipped_iter)
            self.file.write(json.dumps(record) + "\n")
            self.file.flush()

        def on_train_end(self, context) -> None:
            self.file.close()

    return StepMetrics()


def read_steps(out_dir: Path) -> dict[int, list[dict]]:
    """Per-rank step records of a run folder."""
    runs = {}
    for path in sorted(Path(out_dir).glob("metrics.rank*.jsonl")):
        rank = int(path.name.removeprefix("metrics.rank").removesuffix(".jsonl"))
        runs[rank] = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return runs


def warmup_steps(n_steps: int) -> int:
    """Steps excluded from the steady state: the first 3 (first third of a short run)."""
    return min(3, n_steps // 3)


def summarize(out_dir: Path) -> dict[str, Any]:
    ranks = read_steps(out_dir)
    if not ranks or not any(ranks.values()):
        raise ValueError(f"no step metrics under {out_dir}")
    steps0 = ranks[min(ranks)]
    skip = warmup_steps(len(steps0))
    # A step ends when its slowest rank ends: take the per-step maximum over ranks.
    per_step = [max(r[i]["step_time_s"] for r in ranks.values() if i < len(r)) for i in range(len(steps0))]
    losses = next((([s["loss"] for s in r]) for _, r in sorted(ranks.items(), reverse=True)
                   if any(s["loss"] is not None for s in r)), [])

    def peak(field: str) -> float | None:
        values = [s[field] for r in ranks.values() for s in r if s.get(field) is not None]
        return max(values) if values else None

    return {
        "steps": len(steps0),
        "warmup_steps_excluded": skip,
        "step_time_s": statistics.median(per_step[skip:]) if per_step[skip:] else None,
        "step_times_s": per_step,
        "peak_allocated_gib": peak("peak_allocated_gib"),
        "peak_reserved_gib": peak("peak_reserved_gib"),
        "peak_host_rss_gib": peak("host_rss_gib"),
        "peak_pinned_host_gib": peak("pinned_host_gib"),
        "final_loss": next((x for x in reversed(losses) if x is not None), None),
        "losses": losses,
        "ranks": len(ranks),
    }


def write_summary(out_dir: Path, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    summary = {**summarize(out_dir), **(extra or {})}
    (Path(out_dir) / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def _gib(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f} GiB"


def format_summary(summary: dict[str, Any]) -> str:
    step = summary["step_time_s"]
    rows = [
        ("steps", f"{summary['steps']} ({summary['warmup_steps_excluded']} warm-up excluded)"),
        ("median step time", "n/a" if step is None else f"{step:.3f} s"),
        ("peak GPU allocated", _gib(summary["peak_allocated_gib"])),
        ("peak GPU reserved", _gib(summary["peak_reserved_gib"])),
        ("peak host RSS", _gib(summary["peak_host_rss_gib"])),
        ("peak pinned host", _gib(summary["peak_pinned_host_gib"])),
        ("final loss", "n/a" if summary["final_loss"] is None else f"{summary['final_loss']:.4f}"),
    ]
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"  {name:<{width}}  {value}" for name, value in rows)
