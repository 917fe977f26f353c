"""The offload engine's ``stream`` mode: Adam's moments live on the host, the update runs on the GPU.

Megatron Core's optimizer offload keeps the fp32 main weights on the GPU and moves Adam's two moments
(8 bytes per parameter) to the host, where torch's CPU AdamW updates them after backward. This mode keeps that
split of memory and moves the arithmetic back to where it runs without offload: at each step the moments stream
through a small ring of GPU buffers, chunk by chunk in the order the forward uses the parameters, the same
Transformer Engine FusedAdam that runs without offload updates the fp32 main weights, the chunk is cast into the
model's bf16 weights and its moments go back to the host. The CPU does no Adam and no copy of its own.

- **The update is the one without offload**: the same kernel on the same values (Adam is elementwise, so
  updating a chunk at a time changes no bit): loss bit-identical to no offload in deterministic mode.
- **Time**: 8 bytes per offloaded parameter go up and 8 come down per step, on their own copy streams, while the
  next step's forward waits per module (a forward pre-hook, on the GPU: the training thread never blocks) for
  the chunks holding its parameters. The first ``STREAM_RING_SLOTS`` chunks' moments come up at the end of the
  previous update, so the next update starts without waiting for a copy.
- **Moments in bf16** (opt-in, ``MBRIDGE_OFFLOAD_STREAM_MOMENTS=bf16``): the host buffers and the ring hold the
  moments in bf16 and FusedAdam is built with bf16 moments (it computes in fp32 and rounds them at each store):
  half the bytes each way and 8 bytes per offloaded parameter on the host, and an update that is no longer the one
  without offload (its deviation is measured, not assumed: docs/benchmarks/offload-engine/).
- **Host memory**: 12 bytes per offloaded parameter: the moments and the library's fp32 host copy of the
  weights (which the checkpoint saves as ``master_param``; refreshed from the GPU at every drain: checkpoint
  save and load, evaluation), in three flat buffers pinned in place (``cudaHostRegister``: no power-of-two
  rounding of the pinned allocator) and kept out of forked processes (``host_buffer``). No host gradients, and
  no host copies for the optimizer Megatron builds only to read its settings (streaming_engine.install).
- **GPU memory**: the library's, plus the ring: ``STREAM_RING_SLOTS`` chunks of the moments
  (mbridge_offload/facts/offload_engine.py, ``stream_ring_bytes``).

With several data-parallel ranks each rank updates its own shards; the parameter all-gather of a bucket group
waits on the GPU for the chunks holding this rank's shards in it (``gate_param_gather``). That path has not run
on several GPUs (the validator warns).

Which tensors are offloaded is the library's rule (a fraction of the elements) walked from the other end: the ones
the forward uses last (``last_used_first``), so the next forward meets them after the copies have had the most time.
The layout is fixed when the optimizer is built: the offloaded fp32 shards in the order of the model's parameters
(the order the forward meets them in a transformer), as one flat range cut into ``STREAM_CHUNKS`` chunks (a tensor may span
two). The checkpoint format is the library's: the CPU optimizers' states are views into the host buffers, and a
load that replaces them is copied back into the buffers before the next update (``_adopt_states``).
"""

from __future__ import annotations

import itertools
import os
import re
from dataclasses import dataclass

from mbridge_offload.facts.engine_messages import (STREAM_FUSED_ADAM_IMPORT, STREAM_MOMENTS_UNKNOWN,
                                                  STREAM_NO_HOST_EMPTY_CACHE, STREAM_NOT_FP32, STREAM_NOT_FUSED_ADAM,
                                                  STREAM_NOT_MAIN_WEIGHTS, STREAM_PIN_FAILED, STREAM_STEP_COUNTS)
from mbridge_offload.facts.offload_engine import (BF16_MOMENTS, MOMENT_BYTES, STREAM_MIN_CHUNK_NUMEL,
                                                  STREAM_MOMENTS_ENV, STREAM_RING_SLOTS, fetch_ahead_on,
                                                  last_used_first, stream_chunk_numel, stream_moments, stream_pacing)
from mbridge_offload.runtime.resume_fix import keep_state_dtypes_through_load
from mbridge_offload.runtime.streaming_engine import (_GROUP_PAIRS, EngineError, StreamingEngine, _model_shard_view,
                                                      _params_of, issue_deferred_zeros)

HDO_GROUP = "_mbridge_hdo_group"  # in a chunk optimizer's param group: the HybridDeviceOptimizer group it follows


@dataclass(frozen=True)
class Piece:
    """The part of one offloaded tensor that lies in a chunk."""

    tensor: int  # index in the layout's tensor order
    start: int  # element range within that tensor
    stop: int
    slot_offset: int  # where it starts in the chunk's GPU buffer


@dataclass(frozen=True)
class Chunk:
    start: int  # element range in the flat host buffers
    stop: int
    pieces: tuple[Piece, ...]


def chunks_of(params, chunk_of_model: dict) -> tuple[int, ...]:
    """The chunks holding this rank's offloaded shards of ``params``."""
    return tuple(sorted({c for p in params for c in chunk_of_model.get(p, ())}))


def starts_of(sizes: list[int]) -> list[int]:
    """Where each of tensors of ``sizes`` elements starts when they lie end to end, and (last) where they end."""
    return [0, *itertools.accumulate(sizes)]


def chunk_layout(sizes: list[int], numel: int) -> list[Chunk]:
    """Tensors of ``sizes`` elements laid end to end, cut into chunks of ``numel`` (the last one shorter)."""
    if numel < 1:
        raise ValueError(f"chunk size must be >= 1 element, got {numel}")
    total = sum(sizes)
    starts = starts_of(sizes)
    chunks, tensor = [], 0
    for begin in range(0, total, numel):
        end = min(begin + numel, total)
        pieces = []
        while tensor < len(sizes) and starts[tensor] < end:
            lo, hi = max(begin, starts[tensor]), min(end, starts[tensor + 1])
            if hi > lo:
                pieces.append(Piece(tensor=tensor, start=lo - starts[tensor], stop=hi - starts[tensor],
                                    slot_offset=lo - begin))
            if starts[tensor + 1] <= end:
                tensor += 1
            else:
                break
        chunks.append(Chunk(start=begin, stop=end, pieces=tuple(pieces)))
    return chunks


def main_to_model(owner) -> dict:
    """The distributed optimizer ``owner``'s fp32 main shards -> their model parameters."""
    pairs = {}
    for model_name, main_name in _GROUP_PAIRS:
        for model_group, main_group in zip(getattr(owner, model_name), getattr(owner, main_name)):
            pairs.update({main: model for model, main in zip(model_group, main_group)})
    return pairs


def forward_positions(owner) -> dict:
    """Each fp32 main shard of ``owner``: the place of its model parameter in the model's parameter order (the
    order the forward meets them in a transformer); shards of no model parameter come last."""
    order = {param: i for i, param in enumerate(p for chunk in owner.model_chunks for p in chunk.parameters())}
    return {main: order.get(model, len(order)) for main, model in main_to_model(owner).items()}


def streamed_param_groups(hdo, positions: dict, offload_fraction: float):
    """``HybridDeviceOptimizer._get_sub_optimizer_param_groups`` for the stream mode: the same five results, with
    two changes. The offloaded tensors are the ones the forward uses last (``last_used_first``), and their host
    copies are views of one flat buffer in forward order (``hdo._mbridge_host_master``, which the engine's
    layout adopts) instead of one pinned allocation each, rounded up to a power of two."""
    import torch

    on_gpu = [p for group in hdo.param_groups for p in group["params"] if p.is_cuda]
    chosen = [on_gpu[i] for i in last_used_first([p.numel() for p in on_gpu],
                                                 [positions.get(p, -1) for p in on_gpu], offload_fraction)]
    not_fp32 = sorted({str(p.dtype) for p in chosen if p.dtype != torch.float32})
    if not_fp32:
        raise EngineError(STREAM_NOT_FP32.format(dtypes=", ".join(not_fp32)))
    chosen.sort(key=lambda p: positions.get(p, -1))
    sizes = [p.numel() for p in chosen]
    host = host_buffer(sum(sizes))
    copies, starts = {}, starts_of(sizes)
    for param, start, stop in zip(chosen, starts, starts[1:]):
        copies[param] = host[start:stop].view_as(param)
        copies[param].copy_(param.detach())
    hdo._mbridge_host_master = host
    cpu_groups, gpu_groups, to_fp32 = [], [], {}
    for group in hdo.param_groups:
        cpu, gpu = [], []
        for param in group["params"]:
            inner = copies.get(param, param)
            if hdo.param_update_in_fp32 and inner.dtype != torch.float32:
                inner = to_fp32[param] = inner.detach().clone().float()
            (gpu if inner.is_cuda else cpu).append(inner)
        cpu_groups += [{**group, "params": cpu}] if cpu else []
        gpu_groups += [{**group, "params": gpu}] if gpu else []
    return cpu_groups, gpu_groups, copies, {copy: param for param, copy in copies.items()}, to_fp32


def host_buffer(numel: int, dtype=None):
    """A zeroed host tensor (fp32 unless ``dtype``) in a mapping of its own that forked processes do not inherit.

    The data loader's workers are forked after the optimizer is built. Linux copies a page that is pinned
    for DMA into the child at fork, instead of sharing it copy-on-write: on the H200 the node held about two more
    copies of the moments than the process did, as two workers would (docs/benchmarks/offload-engine/). The
    workers never read optimizer state, so the mapping is left out of them (MADV_DONTFORK)."""
    import mmap

    import torch

    dtype = dtype or torch.float32
    if numel == 0:
        return torch.empty(0, dtype=dtype)
    region = mmap.mmap(-1, numel * dtype.itemsize)  # anonymous: zero-filled, page-aligned
    region.madvise(mmap.MADV_DONTFORK)
    return torch.frombuffer(region, dtype=dtype, count=numel)  # keeps the mapping alive


def _pinned_in_place(numel: int, dtype=None):
    """A zeroed host tensor (``host_buffer``) pinned where it lies: no rounding up to a power of two."""
    tensor = host_buffer(numel, dtype)
    _register(tensor)
    return tensor


def _register(tensor) -> None:
    """Pin ``tensor``'s memory where it lies (cudaHostRegister)."""
    import torch

    nbytes = tensor.numel() * tensor.element_size()
    if nbytes:
        status = torch.cuda.cudart().cudaHostRegister(tensor.data_ptr(), nbytes, 0)
        if int(status) != 0:
            raise EngineError(STREAM_PIN_FAILED.format(gib=nbytes / 2**30, status=status))


RELEASE_EVERY_BYTES = 1 << 30  # give the pinned allocator's freed blocks back this often while moving copies


def move_into(tensors: list, flat, release, release_every: int = RELEASE_EVERY_BYTES) -> int:
    """Move each of ``tensors`` (fp32, on the host) into consecutive views of ``flat``: copy the values, then make
    the tensor itself use the view (``.data``), so that every reference to it sees the new memory and its old
    storage is freed. ``release()`` runs each ``release_every`` bytes moved and at the end, so the old storage
    goes back to the system while the new fills up. Returns the elements moved."""
    offset = moved = 0
    for tensor in tensors:
        n = tensor.numel()
        view = flat[offset:offset + n].view_as(tensor)
        if tensor.data_ptr() != view.data_ptr():
            view.copy_(tensor)
            tensor.data = view
            moved += n
        offset += n
        if moved * 4 >= release_every:
            release()
            moved = 0
    release()
    return offset


def release_pinned_cache() -> None:
    """Return the pinned blocks torch's host allocator keeps cached to the system."""
    import sys

    import torch

    empty = getattr(torch._C, "_host_emptyCache", None)
    if empty is None:  # the memory stays usable by torch: the host holds more than planned, said once
        if not getattr(release_pinned_cache, "warned", False):
            release_pinned_cache.warned = True
            print(STREAM_NO_HOST_EMPTY_CACHE, file=sys.stderr)
        return
    empty()


class StateStreamingEngine(StreamingEngine):
    """``stream`` mode for one HybridDeviceOptimizer (one per distributed optimizer: dense, expert)."""

    def __init__(self, hdo, owner, mode: str) -> None:
        import torch

        super().__init__(hdo, owner, mode)
        try:
            from transformer_engine.pytorch.optimizers import FusedAdam
        except ImportError as error:
            raise EngineError(STREAM_FUSED_ADAM_IMPORT) from error
        if not (isinstance(hdo.gpu_optimizer_cls, type) and issubclass(hdo.gpu_optimizer_cls, FusedAdam)):
            raise EngineError(STREAM_NOT_FUSED_ADAM.format(
                optimizer=getattr(hdo.gpu_optimizer_cls, "__name__", hdo.gpu_optimizer_cls)))
        self._fused_adam = hdo.gpu_optimizer_cls
        self.moments = stream_moments(None, os.environ)
        if self.moments not in MOMENT_BYTES:
            raise EngineError(STREAM_MOMENTS_UNKNOWN.format(value=self.moments, values=", ".join(MOMENT_BYTES)))
        self.moment_dtype = torch.bfloat16 if self.moments == BF16_MOMENTS else torch.float32
        self.pending = False
        self.prefetched = False  # the first chunks' moments are in the ring already (see the end of step)
        self.waited: set[int] = set()
        self.updated_event = None  # after the last chunk's update
        self.moments_home_event = None  # after the last chunk's moments are back on the host
        self.h2d_stream = torch.cuda.Stream()
        self.update_stream = torch.cuda.Stream()
        self.d2h_stream = torch.cuda.Stream()
        self.ahead: dict = {}  # chunk -> its moments fetched during a backward for the next update (fetch_ahead.py)
        self.step_ahead: dict = {}  # the same, for the update being enqueued
        self._layout()
        self.fetch_ahead = None
        if fetch_ahead_on(None, os.environ) and len(self.chunks) > self.slots:
            from mbridge_offload.runtime.fetch_ahead import process_fetch_ahead

            self.fetch_ahead = process_fetch_ahead()
            self.fetch_ahead.add(self, self._owner().model_chunks, STREAM_MIN_CHUNK_NUMEL)

    @property
    def zero_stream(self):
        return self.update_stream

    def _maps(self) -> None:
        """The library's part (``library_groups``) once: the layout does not follow the CPU optimizers, which a
        checkpoint load rebuilds."""
        if not hasattr(self, "library_groups"):
            super()._maps()

    # --- the layout, fixed at build time ---
    def _layout(self) -> None:
        import torch

        hdo, owner = self.hdo, self._owner()
        self._maps()  # library_groups: what the library still copies into the model itself
        models_of = main_to_model(owner)
        positions = forward_positions(owner)
        offloaded = [main for main in hdo.gpu_params_map_cpu_copy if main in models_of]
        missing = len(hdo.gpu_params_map_cpu_copy) - len(offloaded)
        if missing:
            raise EngineError(STREAM_NOT_MAIN_WEIGHTS.format(count=missing))
        self.mains = sorted(offloaded, key=positions.get)
        self.models = [models_of[main] for main in self.mains]
        self._say_what_is_offloaded(owner)
        self.group_of = {p: i for i, group in enumerate(hdo.param_groups) for p in group["params"]}
        sizes = [main.numel() for main in self.mains]
        total = sum(sizes)
        self.numel = stream_chunk_numel(total) if total else 0
        self.chunks = chunk_layout(sizes, self.numel) if total else []
        self.starts = starts_of(sizes)  # each offloaded tensor's place in the flat host buffers
        self.slots = min(STREAM_RING_SLOTS, len(self.chunks))
        # the host copies are already in one buffer when this engine chose them (streamed_param_groups); a copy
        # made elsewhere moves in before the moments are allocated, so the node's peak holds one of each
        built = getattr(hdo, "_mbridge_host_master", None)
        self.host_master = built if built is not None and built.numel() == total else host_buffer(total)
        self._adopt_masters()
        _register(self.host_master)
        self.host_m, self.host_v = (_pinned_in_place(total, self.moment_dtype) for _ in range(2))
        self.host_views = [(self.host_m[a:b].view_as(main), self.host_v[a:b].view_as(main))
                           for main, a, b in zip(self.mains, self.starts, self.starts[1:])]
        self.step_tensor = torch.zeros((), dtype=torch.float32)  # torch AdamW's step, one tensor shared by all
        device = torch.cuda.current_device()
        self.ring = [torch.empty(2 * self.numel, dtype=self.moment_dtype, device=device) for _ in range(self.slots)]
        self.model_views = [_model_shard_view(owner, model) for model in self.models]
        # chunk -> (its FusedAdam over views of the main weights, [(main piece view, piece, tensor index)])
        self.chunk_optimizers = []
        chunks_of_model: dict = {}
        for index, chunk in enumerate(self.chunks):
            slot = self.ring[index % self.slots]
            moment, second = slot[:self.numel], slot[self.numel:]
            groups: dict[int, list] = {}
            pieces = []
            for piece in chunk.pieces:
                main = self.mains[piece.tensor]
                view = main.detach().view(-1)[piece.start:piece.stop]
                pieces.append((view, piece))
                groups.setdefault(self.group_of[main], []).append(view)
                chunks_of_model.setdefault(self.models[piece.tensor], []).append(index)
            optimizer = self._chunk_optimizer([{**self._hyper(g), "params": views, HDO_GROUP: g}
                                               for g, views in groups.items()])
            for view, piece in pieces:
                n = piece.stop - piece.start
                optimizer.state[view]["exp_avg"] = moment[piece.slot_offset:piece.slot_offset + n]
                optimizer.state[view]["exp_avg_sq"] = second[piece.slot_offset:piece.slot_offset + n]
                if self.moment_dtype != torch.float32:  # FusedAdam keeps a scale per low-precision state; bf16 uses none
                    optimizer._scales[view] = {name: torch.ones(1, dtype=torch.float32, device=device)
                                               for name in ("exp_avg", "exp_avg_sq")}
            self.chunk_optimizers.append((optimizer, pieces))
        self.chunk_of_model = {model: tuple(chunks) for model, chunks in chunks_of_model.items()}
        self.slot_free: list = [None] * self.slots
        self.ready: list = [None] * len(self.chunks)  # chunk: CUDA event after its update and cast
        self._adopt_states()
        if self.moment_dtype != torch.float32:  # a load then goes into the bf16 buffers, with no fp32 copy of them
            keep_state_dtypes_through_load(hdo)

    def _chunk_optimizer(self, groups):
        """A chunk's FusedAdam: the GPU optimizer's class with its moments in the ring's dtype (fp32, or bf16: the
        kernel computes in fp32 and rounds the moments at each store)."""
        import torch

        if self.moment_dtype == torch.float32:
            return self._fused_adam(groups)
        return self._fused_adam(groups, exp_avg_dtype=self.moment_dtype, exp_avg_sq_dtype=self.moment_dtype)

    def _say_what_is_offloaded(self, owner) -> None:
        """One line on the first rank: how much of this optimizer's shard is on the host and which parameters."""
        import torch

        if not self.models or (torch.distributed.is_initialized() and torch.distributed.get_rank() != 0):
            return
        names = {param: re.sub(r"^(module\.)+", "", name)  # the wrappers' prefixes say nothing to a user
                 for chunk in owner.model_chunks for name, param in chunk.named_parameters()}
        held = sum(main.numel() for group in self.hdo.param_groups for main in group["params"])
        offloaded = sum(main.numel() for main in self.mains)
        print(f"stream offload engine: {offloaded / 1e6:.1f}M of this optimizer's {held / 1e6:.1f}M parameters on the "
              f"host, the {len(self.models)} tensors the forward uses last, from {names.get(self.models[0], '?')} "
              f"to {names.get(self.models[-1], '?')}; moments in {self.moments}", flush=True)

    def _adopt_masters(self) -> bool:
        """Make the library's host copies of the offloaded weights views of ``host_master`` (a checkpoint load
        rebuilds them in pinned memory of their own). Returns True when any moved."""
        copies = [self.hdo.gpu_params_map_cpu_copy[main] for main in self.mains]
        base = self.host_master.data_ptr()
        size = self.host_master.element_size()
        if all(c.data_ptr() == base + size * a for c, a in zip(copies, self.starts)):
            return False
        move_into(copies, self.host_master, release_pinned_cache)
        return True

    def _hyper(self, group_index: int) -> dict:
        return {k: v for k, v in self.hdo.param_groups[group_index].items() if k not in ("params", "step", HDO_GROUP)}

    def _state_of(self, main) -> dict:
        """The CPU optimizer's state of ``main``'s host copy: what the checkpoint reads and writes."""
        hdo = self.hdo
        if self._states_for is not hdo.cpu_optimizers:
            self._optimizer_of = {cpu: opt for opt in hdo.cpu_optimizers for cpu in _params_of(opt)}
            self._states_for = hdo.cpu_optimizers
        cpu = hdo.gpu_params_map_cpu_copy[main]
        return self._optimizer_of[cpu].state[cpu]

    _states_for = None

    def _adopt_states(self) -> bool:
        """Make every CPU optimizer state a view of the host buffers, copying in what a load put elsewhere.
        Returns True when something was copied."""
        copied = rebound = self._adopt_masters()
        steps = set()
        for main, (moment, second) in zip(self.mains, self.host_views):
            state = self._state_of(main)
            for key, view in (("exp_avg", moment), ("exp_avg_sq", second)):
                held = state.get(key)
                if held is view:
                    continue
                if held is not None and held.data_ptr() != view.data_ptr():
                    view.copy_(held.reshape(view.shape))
                    copied = True
                state[key] = view
                rebound = True
            step = state.get("step")
            if step is not self.step_tensor:
                if step is not None:
                    steps.add(float(step))
                state["step"] = self.step_tensor
                rebound = True
        if len(steps) > 1:
            raise EngineError(STREAM_STEP_COUNTS.format(steps=sorted(steps)))
        if steps:
            self.step_tensor.fill_(steps.pop())
        if rebound:
            self.hdo._sync_sub_optimizers_state_to_hdo()
        return copied

    # --- the step ---
    def _fetch(self, index: int, moments=None) -> None:
        """Copy chunk ``index``'s moments into its ring slot, once the slot's last copy down is done: from the host,
        or from ``moments`` (its m and v, fetched ahead onto the GPU)."""
        import torch

        chunk, slot = self.chunks[index], index % self.slots
        buffer, n = self.ring[slot], chunk.stop - chunk.start
        m, v = moments or (self.host_m[chunk.start:chunk.stop], self.host_v[chunk.start:chunk.stop])
        if self.slot_free[slot] is not None:
            self.h2d_stream.wait_event(self.slot_free[slot])
        with torch.cuda.stream(self.h2d_stream):
            buffer[:n].copy_(m, non_blocking=True)
            buffer[self.numel:self.numel + n].copy_(v, non_blocking=True)

    # --- fetch-ahead (runtime/fetch_ahead.py decides when and how much) ---
    def awaits_next_update(self) -> bool:
        """Whether a backward's hook may fetch chunks for the next update: chunks after the ring's exist."""
        return len(self.chunks) > self.slots

    def next_ahead_bytes(self) -> int | None:
        """The bytes of the next chunk to fetch ahead (its two moments), or None when none is left. None too
        while the previous update is not all enqueued: its last copies down, which the fetch waits for, are not
        issued yet, so the host's moments would be a step old."""
        index = self.slots + len(self.ahead)
        if index >= len(self.chunks) or self.unqueued():
            return None
        chunk = self.chunks[index]
        return 2 * self.ring[0].element_size() * (chunk.stop - chunk.start)

    def fetch_next_ahead(self) -> None:
        """Copy the next chunk's moments up into a buffer of its own, allocated on the training stream (the backward's
        freed blocks are in its pool), after the previous update's last copy down (the moments are then home)."""
        import torch

        index = self.slots + len(self.ahead)
        chunk = self.chunks[index]
        n = chunk.stop - chunk.start
        current = torch.cuda.current_stream()
        buffer = self.ring[0].new_empty(2 * n)  # on the ring's device, from the current (training) stream's pool
        self.h2d_stream.wait_stream(current)  # the block may be one the backward's kernels still use
        if self.moments_home_event is not None:
            self.h2d_stream.wait_event(self.moments_home_event)
        with torch.cuda.stream(self.h2d_stream):
            buffer[:n].copy_(self.host_m[chunk.start:chunk.stop], non_blocking=True)
            buffer[n:].copy_(self.host_v[chunk.start:chunk.stop], non_blocking=True)
        buffer.record_stream(self.h2d_stream)
        self.ahead[index] = buffer

    def holds_ahead(self) -> bool:
        return bool(self.ahead or self.step_ahead)

    def _fill_from_ahead(self, index: int) -> None:
        """Chunk ``index``'s moments into its ring slot from the buffer they were fetched into (a copy on the GPU);
        the buffer is then released."""
        buffer = self.step_ahead.pop(index)
        n, nbytes = buffer.numel() // 2, buffer.numel() * buffer.element_size()
        self._fetch(index, (buffer[:n], buffer[n:]))
        del buffer  # its block is reused once the copies above are done (record_stream at the fetch)
        self.fetch_ahead.released(nbytes)

    def _drop_ahead(self) -> None:
        """Give up the buffers fetched ahead: the host's moments are replaced (a load) or may be (a drain)."""
        dropped = sum(b.numel() * b.element_size() for b in (*self.ahead.values(), *self.step_ahead.values()))
        self.ahead, self.step_ahead = {}, {}
        if dropped and self.fetch_ahead is not None:
            self.fetch_ahead.dropped(dropped)

    def step(self, closure=None) -> None:
        """Set up this step's update of the offloaded chunks. Their copies and kernels are enqueued while the next
        forward runs (``advance``, from its modules' pre-hooks): enqueued here, they kept the training stream idle
        while the training thread issued them (18-24 ms a step at 25% on the H200, stream-profile/)."""
        import torch

        self.enqueue_all()  # a previous update not enqueued yet (no forward in between): it comes first
        hdo = self.hdo
        if self._adopt_states():
            self.prefetched = False  # a load put new moments on the host
            self._drop_ahead()
        hdo._sync_hdo_param_groups_to_sub_optimizers()  # the non-offloaded part's lr and weight decay
        current = torch.cuda.current_stream()
        grads_ready = current.record_event()  # clipped gradients: the library clipped them on this stream
        if hdo.gpu_optimizer:
            hdo.gpu_optimizer.step(closure)
        self.step_tensor += 1
        self.update_stream.wait_event(grads_ready)
        if len(self.seen_params) != self._unseen_for:  # the set changes only in forwards before the first step
            self._unseen, self._unseen_for = self.unseen(), len(self.seen_params)
        self.unseen_chunks = self._unseen
        self.step_hyper = [self._hyper(g) for g in range(len(hdo.param_groups))]
        # the next step's optimizer.zero_grad() sets the main weights' gradients to None before the forward that
        # enqueues the chunks: the update keeps this step's (the buffer itself is zeroed after the last chunk)
        self.step_grads = [main.grad for main in self.mains]
        self.step_prefetched, self.prefetched = self.prefetched, False
        self.step_ahead, self.ahead = self.ahead, {}
        self.enqueued = self._calls = 0
        self.grads_free_event = None  # the gradient buffers are zeroed after the last chunk (issue_deferred_zeros)
        self.waited = set()
        self.pending = True
        self.job = self  # the library's copy into the model skips the offloaded weights (streaming_engine.install)
        if not self.chunks:  # nothing of this optimizer is offloaded: its update is the GPU optimizer's, above
            self._enqueued_last()

    def unqueued(self) -> bool:
        """Whether chunks of the pending update are still to be enqueued."""
        return self.pending and self.enqueued < len(self.chunks)

    def advance(self) -> None:
        """A module's forward is about to start: enqueue the next chunks of the pending update, paced so that the
        last is enqueued about when the forward reaches the first offloaded module (``pace``)."""
        if not self.unqueued():
            return
        self._calls += 1
        if self._calls % self.calls_per_chunk == 0:
            self.enqueue_through(self.enqueued + self.chunks_per_call - 1)

    def enqueue_all(self) -> None:
        self.enqueue_through(len(self.chunks) - 1)

    def enqueue_through(self, last: int) -> None:
        """Enqueue the pending update's chunks up to ``last`` (those not enqueued yet)."""
        import time

        if not self.unqueued() or last < self.enqueued:
            return
        started = time.perf_counter()
        stop = min(last + 1, len(self.chunks))
        for index in range(self.enqueued, stop):
            self._enqueue(index)
            self.enqueued = index + 1  # per chunk: after a failure, none is enqueued twice
        if stop == len(self.chunks):
            self._enqueued_last()
        self.step_s += time.perf_counter() - started

    def _enqueue(self, index: int) -> None:
        """Chunk ``index``: its moments up (unless prefetched), FusedAdam and the cast into the model's weights on
        the update stream, its moments back down."""
        import torch

        chunk, (optimizer, pieces) = self.chunks[index], self.chunk_optimizers[index]
        slot, n = index % self.slots, chunk.stop - chunk.start
        buffer = self.ring[slot]
        if index in self.step_ahead:
            self._fill_from_ahead(index)
        elif not (self.step_prefetched and index < self.slots):
            self._fetch(index)
        self.update_stream.wait_stream(self.h2d_stream)
        step = int(self.step_tensor)
        with torch.cuda.stream(self.update_stream):
            for view, piece in pieces:
                grad = self.step_grads[piece.tensor]
                view.grad = None if grad is None else grad.view(-1)[piece.start:piece.stop]
                if grad is not None and grad._base is None:
                    grad.record_stream(self.update_stream)  # a bf16 gradient's fp32 copy is a temporary
            for group in optimizer.param_groups:
                group.update(self.step_hyper[group[HDO_GROUP]])  # this step's lr and weight decay
                group["step"] = step - 1  # FusedAdam adds one before it updates
            optimizer.step()
            for view, piece in pieces:
                self.model_views[piece.tensor].view(-1)[piece.start:piece.stop].copy_(view)
                view.grad = None
            ready = self.update_stream.record_event()
        self.ready[index] = ready
        self.d2h_stream.wait_event(ready)
        with torch.cuda.stream(self.d2h_stream):
            self.host_m[chunk.start:chunk.stop].copy_(buffer[:n], non_blocking=True)
            self.host_v[chunk.start:chunk.stop].copy_(buffer[self.numel:self.numel + n], non_blocking=True)
        self.slot_free[slot] = self.d2h_stream.record_event()

    def _enqueued_last(self) -> None:
        self.updated_event = self.update_stream.record_event()
        self.grads_free_event = self.updated_event
        self.moments_home_event = self.d2h_stream.record_event()
        # the next step's first chunks come up while this forward runs: the update then starts without a copy
        # in front of it (their moments are home: each slot's fetch waits for the slot's last copy down)
        for index in range(self.slots):
            self._fetch(index)
        self.prefetched = True
        self.step_grads = []
        issue_deferred_zeros()
        if self.fetch_ahead is not None:  # the buffers fetched ahead for this update are all released
            self.fetch_ahead.update_enqueued()

    def pace(self, modules_before_first_gate: int) -> None:
        """Spread the enqueueing over the ``modules_before_first_gate`` module pre-hooks the forward calls before
        it needs an offloaded chunk (the gates enqueue what is left)."""
        self.calls_per_chunk, self.chunks_per_call = stream_pacing(len(self.chunks), modules_before_first_gate)

    _calls = 0
    calls_per_chunk = 1
    chunks_per_call = 1
    enqueued = 0
    _unseen: set = frozenset()
    _unseen_for = -1

    # --- waiting for it: on the GPU, the training thread never blocks ---
    def gate(self, model_params) -> None:
        if not self.pending:
            from mbridge_offload.runtime.streaming_engine import _STATE

            if _STATE["in_train_step"]:
                self.seen_params.update(model_params)
            return
        self._wait_chunks(None, {c for p in model_params for c in self.chunk_of_model.get(p, ())})

    def _wait_chunks(self, job, chunks) -> None:
        import torch

        needed = set(chunks) - self.waited
        if needed:
            self.enqueue_through(max(needed))
        current = torch.cuda.current_stream()
        for chunk in needed:
            current.wait_event(self.ready[chunk])
            self.waited.add(chunk)

    def _chunks_of(self, params) -> tuple[int, ...]:
        """The chunks holding this rank's offloaded shards of ``params`` (gate_param_gather: a parameter's shard
        may span several chunks here)."""
        return chunks_of(params, self.chunk_of_model)

    def unseen(self) -> set[int]:
        return {c for p, chunks in self.chunk_of_model.items() if p not in self.seen_params for c in chunks}

    def gate_unseen(self) -> None:
        if self.pending:
            self._wait_chunks(None, self.unseen_chunks)

    def drain(self, apply_delayed: bool = False) -> None:
        """The training stream waits for the update (GPU side). ``apply_delayed`` (a checkpoint, a load, an
        evaluation: the host is read or written next): also wait on the host for the moments to be home and
        refresh the library's host copy of the weights, which the checkpoint saves."""
        import torch

        if not self.pending:
            return
        self.enqueue_all()
        torch.cuda.current_stream().wait_event(self.updated_event)
        self.waited = set(range(len(self.chunks)))
        if not apply_delayed:
            return
        self.moments_home_event.synchronize()
        self.prefetched = False  # the host's moments may be written next (a load): fetched again at the next step
        self._drop_ahead()
        for main, cpu in self.hdo.gpu_params_map_cpu_copy.items():
            cpu.copy_(main)
        self.pending = False
        self.job = None
        self.hdo._sync_sub_optimizers_state_to_hdo()

