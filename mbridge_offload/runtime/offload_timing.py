"""Where an offloaded optimizer step spends its time: D2H, CPU optimizer, H2D, per training step.

Megatron Core's ``HybridDeviceOptimizer`` (optimizer offload) copies the gradients of its offloaded
parameters to pinned host memory (D2H), runs Adam on the CPU, and copies the updated parameters back
(H2D). ``OffloadTimer`` measures each part without adding a synchronisation to the step:

- D2H and H2D: CUDA events recorded on the copy streams right around the copies (GPU time the copies
  took, after whatever they had to wait for);
- CPU optimizer: wall time inside the CPU sub-optimizers' ``step`` (the Adam arithmetic);
- GPU optimizer: CUDA events around the GPU sub-optimizer (the part that is not offloaded);
- the hybrid step: wall time of ``HybridDeviceOptimizer.step`` as the training loop sees it.

The events are read after the metrics callback has synchronised at the end of the step. It also
counts the bytes each step must move and touch, which the floor model (``offload_floor``) prices.
"""

from __future__ import annotations

import time
from typing import Any, Iterator

from mbridge_offload.facts.offload_bytes import traffic_of

BREAKDOWN_FIELDS = ("offload_d2h_s", "offload_cpu_optimizer_s", "offload_h2d_s", "offload_gpu_optimizer_s",
                    "offload_optimizer_step_s")


def hybrid_optimizers(optimizer) -> Iterator[Any]:
    """The HybridDeviceOptimizers inside a Megatron optimizer (chained / distributed / plain)."""
    from megatron.core.optimizer.cpu_offloading import HybridDeviceOptimizer

    seen, stack = set(), [optimizer]
    while stack:
        current = stack.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, HybridDeviceOptimizer):
            yield current
            continue
        stack.extend(getattr(current, "chained_optimizers", None) or [])
        stack.append(getattr(current, "optimizer", None))


class _Step:
    """Timings of one hybrid optimizer step; CUDA event pairs are read once the step is done."""

    def __init__(self) -> None:
        self.d2h: list = []
        self.h2d: list = []
        self.gpu: list = []
        self.cpu_optimizer_s = 0.0
        self.optimizer_step_s = 0.0

    def seconds(self) -> dict[str, float]:
        def total(pairs) -> float:
            return sum(start.elapsed_time(end) for start, end in pairs) / 1000.0

        return {"offload_d2h_s": total(self.d2h), "offload_cpu_optimizer_s": self.cpu_optimizer_s,
                "offload_h2d_s": total(self.h2d), "offload_gpu_optimizer_s": total(self.gpu),
                "offload_optimizer_step_s": self.optimizer_step_s}


class OffloadTimer:
    """Instruments the HybridDeviceOptimizers of a training run (see the module docstring)."""

    def __init__(self, optimizer) -> None:
        self.hybrids = list(hybrid_optimizers(optimizer))
        self.steps: list[_Step] = []
        self._current: _Step | None = None
        for hybrid in self.hybrids:
            self._instrument(hybrid)

    @property
    def active(self) -> bool:
        return bool(self.hybrids)

    def _event_pair(self):
        import torch

        return torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def _instrument(self, hybrid) -> None:
        import torch

        timer = self
        step, set_grads = hybrid.step, hybrid._set_sub_optimizer_grads

        def timed_set_grads():
            # HybridDeviceOptimizer calls this inside `with torch.cuda.stream(d2h_stream)`, after the
            # D2H stream waited for the backward pass: the events bracket the copies alone.
            start, end = timer._event_pair()
            start.record()
            set_grads()
            end.record()
            if timer._current is not None:
                timer._current.d2h.append((start, end))

        def timed_step(closure=None):
            timer._wrap_sub_optimizers(hybrid)
            timer._current = _Step()
            started = time.perf_counter()
            try:
                return step(closure)
            finally:
                timer._current.optimizer_step_s = time.perf_counter() - started
                timer.steps.append(timer._current)
                timer._current = None

        hybrid._set_sub_optimizer_grads = timed_set_grads
        hybrid.step = timed_step
        self._torch = torch

    def _wrap_sub_optimizers(self, hybrid) -> None:
        """(Re)wrap the sub-optimizers: HybridDeviceOptimizer rebuilds them when a checkpoint loads."""
        torch = self._torch
        timer = self
        for sub in hybrid.sub_optimizers:
            if getattr(sub, "_mbridge_offload_timed", False):
                continue
            sub._mbridge_offload_timed = True
            if sub is hybrid.gpu_optimizer:
                pair: list = []

                def gpu_pre(optimizer, args, kwargs, pair=pair):
                    pair[:] = timer._event_pair()
                    pair[0].record()

                def gpu_post(optimizer, args, kwargs, pair=pair):
                    pair[1].record()
                    if timer._current is not None:
                        timer._current.gpu.append(tuple(pair))

                sub.register_step_pre_hook(gpu_pre)
                sub.register_step_post_hook(gpu_post)
                continue
            started = [0.0]

            def cpu_pre(optimizer, args, kwargs, started=started):
                started[0] = time.perf_counter()

            sub.register_step_pre_hook(cpu_pre)
            # HybridDeviceOptimizer's own post hook issues the H2D copies: time around it.
            hooks = sub._optimizer_step_post_hooks
            for handle_id, copy_back in list(hooks.items()):
                def timed_copy_back(optimizer, args, kwargs, copy_back=copy_back, started=started):
                    if timer._current is not None:
                        timer._current.cpu_optimizer_s += time.perf_counter() - started[0]
                    stream = hybrid._h2d_stream
                    stream.wait_stream(torch.cuda.current_stream())  # the copies wait for this too
                    start, end = timer._event_pair()
                    start.record(stream)
                    copy_back(optimizer, args, kwargs)
                    end.record(stream)
                    if timer._current is not None:
                        timer._current.h2d.append((start, end))

                hooks[handle_id] = timed_copy_back

    def collect(self) -> dict[str, float] | None:
        """The finished steps' breakdown summed since the last call (None when no hybrid step ran).

        Call after a CUDA synchronisation (the metrics callback makes one at the end of each step).
        """
        if not self.steps:
            return None
        totals = dict.fromkeys(BREAKDOWN_FIELDS, 0.0)
        for step in self.steps:
            for key, value in step.seconds().items():
                totals[key] += value
        self.steps = []
        return {key: round(value, 6) for key, value in totals.items()}

    def traffic(self) -> dict[str, int]:
        """Bytes per step of the offloaded parameters (HybridDeviceOptimizer keeps their CPU copies in fp32)."""
        return traffic_of(sum(p.numel() for hybrid in self.hybrids for p in hybrid.cpu_copys_map_gpu_param))
