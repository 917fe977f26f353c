"""Zeroing the gradient buffers region by region (the exact and delayed engines, MBRIDGE_OFFLOAD_ZERO_BY_REGION;
docs/design/streaming-offload-engine.md section 12).

The engines copy a step's offloaded gradients to the host while the next step has begun, so the gradient buffers
they read may be zeroed only after those copies. Zeroed as a whole, a buffer waits for the whole D2H, and micro
batch 1's backward, which writes it, waits too. Here each buffer is cut into regions (at its buckets' bounds, and at a
parameter's start once a region holds ``REGION_BYTES``); each region is zeroed on a stream of its own as soon as both
the step's ``zero_grad_buffer`` asked for it and the copies that read it are enqueued; and the backward waits, per
region, only before it first writes there: in DDP's post-hook of each parameter, before its ``main_grad.add_``, and
before a bucket group's gradient sync (a region whose parameters got no gradient, the buffer's padding).

The values are the library's: the same memsets of the same memory, after the same copies; only when each runs, and
what waits for it, change.
"""

from __future__ import annotations

import bisect
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

REGIONS_ATTR = "_mbridge_offload_regions"  # on a gradient buffer: its BufferRegions
PENDING_ATTR = "_mbridge_offload_zeroing_pending"  # on a gradient buffer: the RegionZeroing its next zeroing takes
ACTIVE_ATTR = "_mbridge_offload_zeroing_active"  # on a gradient buffer: the RegionZeroing of this step's backward
BUFFER_ATTR = "_mbridge_offload_grad_buffer"  # on a parameter: the gradient buffer that holds its main_grad


def cut_regions(total: int, bucket_bounds: list[tuple[int, int]], param_starts: list[int], cap: int
                ) -> list[tuple[int, int]]:
    """The regions of a buffer of ``total`` elements: cut at every bucket's start and, inside a bucket, at a
    parameter's start once the region begun holds ``cap`` elements or more, so that each parameter lies in one
    region. The regions cover ``[0, total)`` once, in order (the last one takes the buffer's padding)."""
    if cap < 1:
        raise ValueError(f"a region holds at least one element, got a cap of {cap}")
    cuts = {start for start, _ in bucket_bounds if 0 < start < total}
    bucket_starts = sorted({0, *cuts})
    begun = 0
    for start in sorted(set(param_starts)):
        if not 0 < start < total:
            continue
        bucket_start = bucket_starts[bisect.bisect_right(bucket_starts, start) - 1]
        begun = max(begun, bucket_start)
        if start - begun >= cap:
            cuts.add(start)
            begun = start
    bounds = [0, *sorted(cuts), total]
    return [(a, b) for a, b in zip(bounds, bounds[1:]) if b > a]


class BufferRegions:
    """One gradient buffer's regions: which region each of its parameters and each gradient tensor lies in."""

    def __init__(self, buffer, cap_bytes: int) -> None:
        self.buffer = buffer
        grad_data = buffer.grad_data
        element = grad_data.element_size()
        starts = {param: start for param, (start, _, _) in buffer.param_index_map.items()}
        self.bounds = cut_regions(grad_data.numel(), list(buffer.bucket_indices), list(starts.values()),
                                  max(1, cap_bytes // element))
        self._starts = [a for a, _ in self.bounds]
        self.region_of_param = {param: self.region_at(start) for param, start in starts.items()}
        self._base, self._element = grad_data.data_ptr(), element
        self._numel = grad_data.numel()
        # a parameter whose main_grad the library promoted to fp32 outside the buffer: zeroed with its region
        self.extra: dict[int, list] = {}
        self._extra_ranges: list[tuple[int, int, int]] = []  # (first byte, end byte, region)
        for param in starts:
            if getattr(param, "main_grad_copy_in_grad_buffer", None) is not None:
                region = self.region_of_param[param]
                self.extra.setdefault(region, []).append(param.main_grad)
                first = param.main_grad.data_ptr()
                self._extra_ranges.append((first, first + param.main_grad.numel() * param.main_grad.element_size(),
                                           region))
        for param in starts:
            setattr(param, BUFFER_ATTR, buffer)

    def region_at(self, element: int) -> int:
        return bisect.bisect_right(self._starts, element) - 1

    def regions_of(self, tensor) -> list[int]:
        """The regions a gradient tensor reads (a view of the buffer, or a promoted main_grad), none for another
        tensor (a temporary the library made, which the zeroing need not wait for)."""
        first = tensor.data_ptr()
        end = first + tensor.numel() * tensor.element_size()
        for extra_first, extra_end, region in self._extra_ranges:
            if extra_first <= first < extra_end:
                return [region]
        buffer_end = self._base + self._numel * self._element
        if not (self._base <= first < buffer_end) or tensor.numel() == 0:
            return []
        start = (first - self._base) // self._element
        stop = min(self._numel, (end - self._base + self._element - 1) // self._element)
        return list(range(self.region_at(start), self.region_at(stop - 1) + 1))

    def zero(self, region: int) -> None:
        """The region's memsets, on the current stream."""
        start, stop = self.bounds[region]
        self.buffer.grad_data[start:stop].zero_()
        for grad in self.extra.get(region, ()):
            grad.zero_()


def regions_of_buffer(buffer, cap_bytes: int) -> BufferRegions:
    regions = getattr(buffer, REGIONS_ATTR, None)
    if regions is None or regions._base != buffer.grad_data.data_ptr():
        regions = BufferRegions(buffer, cap_bytes)
        setattr(buffer, REGIONS_ATTR, regions)
    return regions


@dataclass
class RegionZeroing:
    """One buffer's zeroing after one step's copies. Each region's memsets go on ``stream`` once ``ask`` (the next
    step's ``zero_grad_buffer``, training thread) gave the event they follow and the copies that read the region are
    enqueued (``copies_ended``, copy thread); whichever comes last issues them. ``wait`` makes the current stream wait
    for a region's memsets (the backward, before its first write there)."""

    regions: BufferRegions
    stream: Any  # the zero stream
    reading: set[int]  # regions that pending copies read
    wait_for: Callable[[threading.Event, str], None]  # blocks until the event is set, raising if its thread is gone
    failure: Callable[[BaseException], BaseException] = lambda error: error  # what the waits raise for its error
    lock: threading.Lock = field(default_factory=threading.Lock)
    asked: Any = None  # CUDA event: where zero_grad_buffer was called
    ends: dict[int, Any] = field(default_factory=dict)  # region: CUDA event after its copies
    issued: list[threading.Event] = field(default_factory=list)
    zeroed: dict[int, Any] = field(default_factory=dict)  # region: CUDA event after its memsets
    # (region, stream): the streams that already wait for a region's memsets (a weight gradient made on a side
    # stream, e.g. a MoE's shared experts overlapped with the routed ones, is added into the buffer on its own stream)
    waited: set = field(default_factory=set)
    after: Any = None  # CUDA event on the copy stream after the step's gradients were prepared there (the zeroing
    # also follows reads of the buffer that no pair names: a gradient made contiguous, or cast, on that stream)
    error: BaseException | None = None

    def __post_init__(self) -> None:
        self.reading = set(self.reading)
        self.issued = [threading.Event() for _ in self.regions.bounds]

    def copies_ended(self, region: int, event) -> None:
        """The copy thread enqueued the last copy that reads ``region``; ``event`` follows it."""
        with self.lock:
            self.ends[region] = event
            self.reading.discard(region)
            if self.asked is not None:
                self._issue(region)

    def fail(self, error: BaseException) -> None:
        """The copy thread failed: the regions still read by copies never end; their waits raise ``error``."""
        with self.lock:
            if self.error is None:
                self.error = error
            for issued in self.issued:
                issued.set()

    def ask(self, event) -> None:
        """``zero_grad_buffer`` was called where ``event`` was recorded: each region not read by a copy still to be
        enqueued is zeroed now, the others as their copies end."""
        with self.lock:
            self.asked = event
            # the regions no copy reads first: on the one zero stream they would wait behind the others' copies
            unread = [region for region in range(len(self.issued)) if region not in self.reading
                      and region not in self.ends]
            for region in unread + sorted(self.ends):
                self._issue(region)

    def _issue(self, region: int) -> None:
        import torch

        if self.issued[region].is_set():
            return
        self.stream.wait_event(self.asked)
        if self.after is not None:
            self.stream.wait_event(self.after)
        if region in self.ends:
            self.stream.wait_event(self.ends[region])
        with torch.cuda.stream(self.stream):
            self.regions.zero(region)
            self.zeroed[region] = self.stream.record_event()
        self.issued[region].set()

    def wait(self, region: int) -> None:
        """The current stream waits for ``region``'s memsets (the caller's thread first for their issue)."""
        import torch

        stream = torch.cuda.current_stream()
        if (region, stream) in self.waited:
            return
        self.wait_for(self.issued[region], f"the gradients' copy that region {region} of a gradient buffer waits for")
        if self.error is not None:
            raise self.failure(self.error) from self.error
        stream.wait_event(self.zeroed[region])
        self.waited.add((region, stream))

    def wait_all(self) -> None:
        for region in range(len(self.issued)):
            self.wait(region)


def expect(regions: BufferRegions, stream, reading: set[int], wait_for,
           failure: Callable[[BaseException], BaseException] = lambda error: error) -> RegionZeroing:
    """A step's copies will read ``reading`` of this buffer's regions: its next zeroing waits for them. A zeroing
    still pending from an earlier step that nobody asked for (no ``zero_grad_buffer`` between two optimizer steps:
    the gradients accumulate, as in the library) is replaced: the step drained its engine first, so the earlier
    copies are all enqueued."""
    zeroing = RegionZeroing(regions=regions, stream=stream, reading=reading, wait_for=wait_for, failure=failure)
    setattr(regions.buffer, PENDING_ATTR, zeroing)
    return zeroing


def zero_buffer(buffer, event) -> None:
    """``zero_grad_buffer``'s memsets of one buffer, asked where ``event`` was recorded: by region after the copies
    that read it, or at once on the current stream where no copy reads it."""
    active = getattr(buffer, ACTIVE_ATTR, None)
    if active is not None:
        active.wait_all()  # a second zeroing in one step (or a step without an optimizer step): after the first
        setattr(buffer, ACTIVE_ATTR, None)
    pending = getattr(buffer, PENDING_ATTR, None)
    if pending is None:
        buffer.reset()
        return
    setattr(buffer, PENDING_ATTR, None)
    setattr(buffer, ACTIVE_ATTR, pending)
    pending.ask(event)


def _active_region(param) -> tuple[RegionZeroing | None, int | None]:
    """This step's zeroing of the buffer that holds ``param``'s gradient, and ``param``'s region in it (None, None
    where its buffer is not zeroed by region this step)."""
    buffer = getattr(param, BUFFER_ATTR, None)
    active = getattr(buffer, ACTIVE_ATTR, None) if buffer is not None else None
    if active is None:
        return None, None
    return active, active.regions.region_of_param.get(param)


def wait_before_write(param) -> None:
    """Before the backward's first write of ``param``'s gradient in a step: the current stream waits for its region's
    memsets."""
    active, region = _active_region(param)
    if region is None:
        return
    if getattr(param, "grad_added_to_main_grad", False) and not any(r == region for r, _ in active.waited):
        raise RuntimeError("a parameter's gradient was written into the gradient buffer before the wait for its "
                           "region's zeroing (gradient-accumulation fusion or a delayed weight-gradient writes it "
                           "inside the backward's kernels): zeroing by region cannot run with them. Fix: "
                           "++env_vars.MBRIDGE_OFFLOAD_ZERO_BY_REGION=off")
    active.wait(region)


def wait_before_sync(params) -> None:
    """Before a bucket group's gradient sync, which reads and writes its buckets whole: every region of them."""
    for param in params:
        active, region = _active_region(param)
        if region is not None:
            active.wait(region)
