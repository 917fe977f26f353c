"""The streaming offload engine: the CPU Adam of optimizer offload under GPU compute (issue #16).

Megatron Core's ``HybridDeviceOptimizer`` (HDO) runs the CPU Adam inside ``optimizer.step()``: after
backward, before the next step starts, so an offloaded step costs about forward + backward + CPU Adam.
This engine keeps the library's arithmetic (the same torch AdamW on the same tensors, the plugin's chunked
CPU optimizers) and moves *when* it runs (docs/design/streaming-offload-engine.md):

- ``exact``: ``optimizer.step()`` copies the clipped gradients to the host (D2H) and returns; a worker thread
  runs the CPU Adam chunk by chunk in the order the forward first uses the parameters; the weight copy thread copies
  each chunk's parameters back (H2D) and casts them into the model's bf16 weights. Each module's forward waits (a
  forward pre-hook) for its own parameters only. The update is the library's: gradients after the library's
  clipping, the learning rate of the same step, the same kernel.
- ``stream`` (mbridge_offload/runtime/streamed_states.py): no CPU Adam at all; Adam's moments stay on the host
  and stream through the GPU, where the optimizer without offload updates them during the next forward (the
  same update as without offload). It shares this module's gates, drains and gradient zeroing.
- ``delayed``: the one-step delayed parameter update of ZeRO-Offload. Step k's Adam runs during step k+1's
  forward and backward, which use the weights before it; the next ``optimizer.step()`` waits for it, then
  the library copies the weights as usual. Clipping is exact; the staleness is one step.

Both modes copy the gradients to the host from a thread of their own, in pieces (gradient_copies.py), and the updated
weights back from another (weight_copies.py), so that a small copy the training stream makes in either direction (a
read after the step, a micro batch's inputs) need not wait for the whole copy (copy_pieces.py: how far that holds).
They leave the gradient buffer to be zeroed on the copy stream after the D2H (the next step's forward does not touch
it; its backward waits for the zeroing), so the D2H overlaps the next forward. The delayed mode may also hand a step's
copies to the copy thread only at the next step's gradient zeroing (``copies_at_next_step``,
MBRIDGE_OFFLOAD_DELAYED_COPY_START=next-step): the step's reads of the loss and norms then find the copy engine free
(design sections 15-16); whatever waits for the copies (the zeroing, a drain) hands them over first.

What touches optimizer state or weights outside a training step drains the engine first: the next
``optimizer.step()``, checkpoint save and load, evaluation, the parameter-norm log, and any HDO step run
outside the training loop (the checkpoint loader's dummy step), which runs the library's own synchronous
step. In ``delayed`` mode a drain outside the training step also applies the pending update to the model's
weights, so a saved checkpoint holds one consistent state (the uninterrupted run does the same at a save).

A parameter that a parent module reads without calling its own module (a convolution's weight read by the
layer that holds it) has no hook of its own: the first step records which offloaded parameters' modules ran,
and exact mode waits for the others' chunks before the model's forward starts.

With several data-parallel ranks, exact mode makes each bucket group's parameter all-gather wait for this rank's
update of its shards in the group (``gate_param_gather``): with the all-gather overlapped with the forward
(``ddp.overlap_param_gather``) the CPU Adam stays under the forward, which Megatron's prefetch of the next group's
all-gather keeps about one bucket group behind the worker; without it the all-gather runs at the end of the step
and waits for the whole update. tests/runtime/test_exact_ranks.py runs this path on 2 gloo ranks; no GPU has.

With several data-parallel ranks the delayed mode's weights stay one step behind on every rank alike: each step's
copy to the model and its all-gather send the weights before the pending update. A drain outside a step that
applies the update writes only this rank's shards, so it applies it only where an all-gather that every rank makes
at the same point follows: the save's and the evaluation's (``drain_all`` then gathers, ``_gather_applied_weights``)
and Megatron Bridge's forced parameter sync (``prepare_model_params_for_param_sync``, before its all-gather). Other
drains outside a step (the optimizer's state dict and loads) complete the update in the optimizer's state only; the
next step's copy brings it to the weights, as in a run without the drain. tests/runtime/test_delayed_ranks.py runs
this on 2 gloo ranks; no GPU has.

Limits, refused by the validator (mbridge_offload/validation/offload_engine.py): both modes need the D2H/H2D overlap
streams, and bf16/fp32 parameters (no fp8/fp4 parameter gather, no precision-aware optimizer, no Megatron FSDP);
``delayed`` needs bf16/fp16 model weights (an fp32 weight is its own fp32 copy, which the delayed update would
overwrite mid-step: refused at start-up too).
``logger.log_params_norm`` reads the fp32 weights after every step, so the engine then waits each step (warned).
With MoE the dense and expert optimizers share one worker, in that order: the experts' update waits for the
dense one.
"""

from __future__ import annotations

import functools
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any

from mbridge_offload.facts.engine_messages import (CPU_STEP_FAILED, DELAYED_FP32_WEIGHTS,
                                                  STREAM_OUTSIDE_DISTRIBUTED_OPTIMIZER, UNKNOWN_ENGINE, WORKER_STOPPED)
from mbridge_offload.facts.offload_engine import (COPY_AT_NEXT_STEP, COPY_AT_STEP, DELAYED, DELAYED_COPY_START_ENV,
                                                  ENGINE_MODES, EXACT, GRADIENT_COPY_THREAD, LIBRARY, REGION_BYTES,
                                                  STREAM, WEIGHT_COPY_THREAD, WORKER_THREAD, ZERO_BY_REGION_ENV)
from mbridge_offload.runtime import grad_regions, gradient_copies, weight_copies
from mbridge_offload.runtime.gradient_copies import GradientCopies
from mbridge_offload.runtime.serial_thread import LazySerialThread, SerialThread
from mbridge_offload.runtime.weight_copies import ChunkUpload, UploadsEnd

# (model parameters, their fp32 main shards): the distributed optimizer's parallel group lists
_GROUP_PAIRS = (("model_float16_groups", "shard_fp32_from_float16_groups"), ("model_fp32_groups", "shard_fp32_groups"))
_WAIT_LOCK = threading.Lock()  # an engine's wait_s: added to from the training thread and from autograd's
NEVER_STEPS = "_mbridge_never_steps"  # on a HybridDeviceOptimizer built only to be read (_install_stream_selection)
_STATE: dict[str, Any] = {"mode": None, "in_train_step": False, "engines": weakref.WeakSet(),
                          "by_region": False,  # the gradient buffers are zeroed by region (grad_regions.py)
                          # delayed: a step's gradient copies go to the copy thread at the next step's zeroing
                          "copies_at_next_step": False,
                          "kept_copies": [],  # those steps' GradientCopies, in the order the steps kept them
                          "building": None,  # the distributed optimizer whose __init__ is running
                          # delayed: a training step ran since the last all-gather of applied weights (set on every
                          # rank alike, so every rank makes the same all-gathers)
                          "delayed_steps_ungathered": False}


class EngineError(RuntimeError):
    """The engine's worker failed; raised on the training thread at the next point that waits for it."""


def _params_of(optimizer) -> list:
    return [p for group in optimizer.param_groups for p in group["params"]]


@dataclass
class _Job:
    """One optimizer step handed to the worker."""

    order: list[int]  # chunk indices, in the order the worker takes them
    ready: dict[int, threading.Event]  # chunk: its parameters are updated (exact: and cast to bf16)
    copies: GradientCopies  # the gradients' copies to the host, issued by the copy thread
    done_events: dict[int, Any] = field(default_factory=dict)  # chunk: CUDA event after its H2D (and cast)
    waited: set[int] = field(default_factory=set)  # chunks the training stream already waits for
    finished: threading.Event = field(default_factory=threading.Event)
    model_copied: threading.Event = field(default_factory=threading.Event)  # delayed: weights copied this step
    model_copied_event: Any = None
    error: BaseException | None = None


class StreamingEngine:
    """The engine of one HybridDeviceOptimizer (one per distributed optimizer: dense, expert)."""

    def __init__(self, hdo, owner, mode: str) -> None:
        import torch

        self.hdo = hdo
        self._owner = weakref.ref(owner)
        self.mode = mode
        self.job: _Job | None = None
        self.first_use: list[int] = []  # chunks in the order the forward first used them
        self.wait_s = 0.0  # training thread blocked on the engine, since the metrics last read it
        self.step_s = 0.0  # training thread inside the engine's optimizer step (its enqueueing), likewise
        self.grads_free_event = None  # the gradient buffers may be zeroed after this event
        self.copies_to_take: GradientCopies | None = None  # the pending step's copies, until enqueue_all takes them
        self.seen_params: set = set()  # model parameters whose own module's forward ran before the first step
        self.unseen_chunks: set[int] = set()
        self._maps_for = None
        self._device = torch.cuda.current_device()
        self._worker_stream = None
        self._zero_stream = None  # the zeroing by region's memsets (grad_regions.py)
        self._threads = max(1, torch.get_num_threads() - 1)  # one core stays free to launch GPU work
        _STATE["engines"].add(self)

    # --- which chunk each parameter is in (rebuilt when the HDO rebuilds its CPU optimizers) ---
    def _maps(self) -> None:
        hdo = self.hdo
        if self._maps_for is hdo.cpu_optimizers:
            return
        chunk_of_cpu = {cpu: i for i, opt in enumerate(hdo.cpu_optimizers) for cpu in _params_of(opt)}
        chunk_of_main = {main: chunk_of_cpu[cpu] for main, cpu in hdo.gpu_params_map_cpu_copy.items()
                         if cpu in chunk_of_cpu}
        owner = self._owner()
        self.chunk_of_model: dict[Any, int] = {}
        self.casts: dict[int, list] = {i: [] for i in range(len(hdo.cpu_optimizers))}
        self.library_groups: dict[str, list] = {}  # the owner's groups without the offloaded parameters
        for model_name, main_name in _GROUP_PAIRS:
            kept_model, kept_main = [], []
            for model_group, main_group in zip(getattr(owner, model_name), getattr(owner, main_name)):
                kept_model.append([])
                kept_main.append([])
                for model_param, main in zip(model_group, main_group):
                    chunk = chunk_of_main.get(main)
                    if chunk is None:
                        kept_model[-1].append(model_param)
                        kept_main[-1].append(main)
                        continue
                    self.chunk_of_model[model_param] = chunk
                    self.casts[chunk].append((main, _model_shard_view(owner, model_param)))
            self.library_groups[model_name], self.library_groups[main_name] = kept_model, kept_main
        self._maps_for = hdo.cpu_optimizers
        self._gather_chunks: dict = {}  # bucket group -> the chunks its all-gather waits for (several ranks)
        fp32_owned = sum(1 for group in owner.shard_fp32_groups for main in group if main in chunk_of_main)
        if self.mode == DELAYED and fp32_owned:
            raise EngineError(DELAYED_FP32_WEIGHTS.format(count=fp32_owned))

    @property
    def zero_stream(self):
        """The stream the gradient buffers are zeroed on, after ``grads_free_event``."""
        return self.hdo._d2h_stream

    def order(self) -> list[int]:
        return processing_order(self.first_use, len(self.hdo.cpu_optimizers))

    # --- the step ---
    def step(self, closure=None) -> None:
        import torch

        self.drain()
        hdo = self.hdo
        self._maps()
        if self.mode == EXACT:
            self.unseen_chunks = {c for p, c in self.chunk_of_model.items() if p not in self.seen_params}
        hdo._sync_hdo_param_groups_to_sub_optimizers()  # this step's lr and weight decay, as the library does
        order = self.order()
        hdo._d2h_stream.wait_stream(torch.cuda.current_stream())  # the copies follow the clipping
        library_order = hdo.cpu_optimizers
        with torch.cuda.stream(hdo._d2h_stream):
            hdo.cpu_optimizers = []  # the library's call then sets only the gradients of what the GPU updates
            try:
                hdo._set_sub_optimizer_grads()
            finally:
                hdo.cpu_optimizers = library_order
            # on the copy stream: a gradient made contiguous here is written before the copy thread reads it
            chunks = [(i, self._gradient_pairs(library_order[i])) for i in order]
            prepared = hdo._d2h_stream.record_event() if _STATE["by_region"] else None
        if _STATE["by_region"]:
            copies = self._copies_by_region(chunks, prepared)
            if self.mode == DELAYED:  # the worker takes the chunks as their copies end
                order = list(dict.fromkeys(chunk for chunk, _ in reversed(copies.chunks)))[::-1]
        else:
            copies = GradientCopies(stream=hdo._d2h_stream, chunks=chunks)
        try:
            self._hand_over(copies, order, closure)
        except BaseException as error:
            for zeroing in copies.zeroings:  # the next zeroing must not wait for copies that will never run
                zeroing.fail(error)
            raise

    def _hand_over(self, copies: GradientCopies, order: list[int], closure) -> None:
        """The GPU's share of the step, then the copies to the copy thread and the step to the worker."""
        hdo = self.hdo
        for _, pairs in copies.chunks:
            for _, grad in pairs:
                # with bf16 gradients the main gradient is a temporary that optimizer.zero_grad() frees before the
                # copy may have read it: the copy thread holds it until its copy is enqueued, and the allocator
                # must not hand its memory out before the copy stream is done
                grad.record_stream(hdo._d2h_stream)
        if hdo.gpu_optimizer:
            hdo.gpu_optimizer.step(closure)
        job = _Job(order=order, ready={i: threading.Event() for i in order}, copies=copies)
        self.job = job
        self.copies_to_take = copies
        if self.mode == DELAYED and _STATE["copies_at_next_step"]:
            # after the step's reads of the loss and norms, which would wait behind the copy (submit_kept_copies)
            _STATE["kept_copies"].append(copies)
            gradient_copies.start()  # the worker's wait for the copies asks whether the thread runs
        else:
            gradient_copies.submit(copies)
        weight_copies.start()
        _WORKER.submit((self, job))

    def _gradient_pairs(self, cpu_optimizer) -> list:
        """What the library's ``_set_sub_optimizer_grads`` (megatron-core 0.19.2) does for one CPU optimizer, less the
        copies: each host parameter's ``.grad`` is its host gradient buffer (made at the first step, pinned where
        ``pin_cpu_grads`` says so), and the (host buffer, GPU gradient) pairs the copy thread fills it from.

        One difference: a parameter without a GPU gradient gets no ``.grad``, so its Adam skips it; the library
        leaves its last step's host gradient there. Megatron's distributed optimizer gives every offloaded shard a
        gradient, so this does not arise under it."""
        import torch

        hdo = self.hdo
        pairs = []
        for param in _params_of(cpu_optimizer):
            gpu_param = hdo.cpu_copys_map_gpu_param[param]
            grad = getattr(gpu_param, "decoupled_grad", gpu_param.grad)
            param.requires_grad = False
            if grad is None:
                param.grad = None
                continue
            if param not in hdo.cpu_copy_map_grad:
                hdo.cpu_copy_map_grad[param] = torch.empty(param.shape, dtype=param.dtype,
                                                           pin_memory=hdo.pin_cpu_grads, device="cpu")
            param.grad = hdo.cpu_copy_map_grad[param]
            # the copy thread copies flat slices; a distributed optimizer's gradient shards are contiguous already
            pairs.append((param.grad, grad if grad.is_contiguous() else grad.contiguous()))
        return pairs

    def _copies_by_region(self, chunks: list, prepared) -> GradientCopies:
        """The step's copies with the zeroing by region (grad_regions.py): each gradient buffer's regions that the
        copies read are zeroed after their last copy. In the delayed mode the pairs go in the order the next backward
        writes the buffers (the last layers first: Megatron lays its buffers out in reverse parameter order, and the
        last model chunk's backward comes first), so the regions it needs first are copied first; a chunk may then
        come in several runs. The exact mode keeps the worker's order, which its forward's gates need."""
        import torch

        owner = self._owner()
        model_chunk_of = {}
        for index, ddp in enumerate(getattr(owner, "model_chunks", ())):
            for buffer in ddp.buffers + ddp.expert_parallel_buffers:
                model_chunk_of[id(buffer)] = index
        regions = [grad_regions.regions_of_buffer(buffer, REGION_BYTES) for buffer in owner.buffers]
        located = []  # (chunk, pair, its buffer's regions or None, the regions it reads)
        for chunk, pairs in chunks:
            for pair in pairs:
                where = next(((buffer, read) for buffer in regions if (read := buffer.regions_of(pair[1]))),
                             (None, []))
                located.append((chunk, pair, *where))
        if self.mode == DELAYED:
            def backward_position(item):
                buffer, read = item[2], item[3]
                if buffer is None:
                    return (float("-inf"), 0.0)  # a temporary: no zeroing waits for it, so it can go first
                start = buffer.bounds[read[0]][0]
                return (-model_chunk_of.get(id(buffer.buffer), 0), start / max(1, buffer.bounds[-1][1]))
            located.sort(key=backward_position)
            runs: list[tuple[int, list]] = []
            for chunk, pair, _, _ in located:
                if not runs or runs[-1][0] != chunk:
                    runs.append((chunk, []))
                runs[-1][1].append(pair)
            seen = {chunk for chunk, _ in runs}
            runs.extend((chunk, []) for chunk, _ in chunks if chunk not in seen)  # a chunk without gradients
        else:
            runs = chunks
        last_reader: dict[tuple[int, int], int] = {}  # (buffer, region): pairs enqueued after its last copy
        for position, (_, _, buffer, read) in enumerate(located, start=1):
            for region in read:
                last_reader[(id(buffer), region)] = position
        if self._zero_stream is None:
            self._zero_stream = torch.cuda.Stream()
        zeronings, region_ends = {}, []
        for buffer in regions:
            reading = {region for (key, region) in last_reader if key == id(buffer)}
            if reading:
                zeronings[id(buffer)] = grad_regions.expect(buffer, self._zero_stream, reading, self._wait_copy,
                                                            _failure)
                zeronings[id(buffer)].after = prepared
        for (key, region), position in sorted(last_reader.items(), key=lambda item: item[1]):
            region_ends.append((position, functools.partial(zeronings[key].copies_ended, region)))
        return GradientCopies(stream=self.hdo._d2h_stream, chunks=runs, region_ends=region_ends,
                              zeroings=list(zeronings.values()))

    def _wait_copy(self, event: threading.Event, what: str) -> None:
        """The backward's wait for a gradient region's zeroing (grad_regions.RegionZeroing.wait)."""
        self._wait_counted(event, what, (GRADIENT_COPY_THREAD,))

    def run(self, job: _Job) -> None:
        """The worker's part of a step (worker thread): each chunk's Adam once its gradients are on the host, then its
        weights handed to the weight copy thread, which marks the chunk ready (``_uploaded``). The job ends on that
        thread too, after every upload handed to it (``UploadsEnd``), also when a chunk failed: nothing of the job is
        still enqueued once the training thread sees it finished."""
        import torch

        hdo = self.hdo
        try:
            if self._worker_stream is None:
                torch.cuda.set_device(self._device)
                torch.set_num_threads(self._threads)  # OpenMP's thread count is per thread: set it here
                self._worker_stream = torch.cuda.Stream()
            with torch.cuda.stream(self._worker_stream):
                for position, chunk in enumerate(job.order):
                    if job.error is not None:  # an upload failed: the training thread raises it; update no further
                        break
                    _wait(job.copies.copied[chunk], f"the gradients' copy of chunk {chunk}", (GRADIENT_COPY_THREAD,))
                    job.copies.raise_if_failed()
                    job.copies.events[chunk].synchronize()
                    if self.mode == DELAYED and position == 0:
                        # the GPU fp32 weights may be overwritten only after this step's copy to the model
                        _wait(job.model_copied, "the training thread's copy of the weights", ())
                        if job.model_copied_event is not None:
                            hdo._h2d_stream.wait_event(job.model_copied_event)
                    optimizer = hdo.cpu_optimizers[chunk]
                    weight_copies.step_without_copy_back(optimizer)  # Adam; its copies back are the thread's
                    weight_copies.submit(ChunkUpload(
                        stream=hdo._h2d_stream,
                        pairs=[(hdo.cpu_copys_map_gpu_param[param], param) for param in _params_of(optimizer)],
                        casts=self.casts[chunk] if self.mode == EXACT else [],
                        done=functools.partial(_uploaded, job, chunk), failed=functools.partial(_job_failed, job)))
        except BaseException as error:  # noqa: BLE001  (handed to the training thread, which raises it)
            _job_failed(job, error)
        finally:
            try:
                weight_copies.submit(UploadsEnd(done=job.finished.set))
            except BaseException as error:  # noqa: BLE001  (no thread would end the job otherwise)
                _job_failed(job, error)
                job.finished.set()

    # --- waiting for it ---
    def gate(self, model_params) -> None:
        """Before a module's forward (exact mode): wait for the update of its own parameters."""
        import torch

        chunks = {self.chunk_of_model[p] for p in model_params if p in self.chunk_of_model}
        job = self.job
        if job is None:
            if _STATE["in_train_step"]:
                self.first_use.extend(c for c in sorted(chunks) if c not in self.first_use)
                self.seen_params.update(model_params)
            return
        self._wait_chunks(job, chunks)

    def _wait_chunks(self, job: _Job, chunks) -> None:
        import torch

        for chunk in set(chunks) - job.waited:
            self._wait_counted(job.ready[chunk], f"the update of chunk {chunk}")
            self._raise_if_failed(job)
            torch.cuda.current_stream().wait_event(job.done_events[chunk])
            job.waited.add(chunk)

    def gate_param_gather(self, bucket_group) -> None:
        """Before a bucket group's parameter all-gather (several data-parallel ranks): the all-gather sends this
        rank's shards, so it waits for the chunks of the pending update that hold them (exact: the training thread
        until the worker has stepped them, the training stream for their copies; stream: the training stream, which
        the collective follows). The delayed mode sends the weights before its pending update by design: nothing to
        wait for.

        A group of one rank sends nothing and each module's forward waits for its own chunks, so its all-gather
        does not wait either. Megatron still runs it, in place on the bucket's parameter buffer, while the exact
        engine's worker may be casting the update into this rank's shard of that buffer: safe because NCCL leaves an
        in-place all-gather's own shard untouched (over one rank it does nothing). Gloo's in-place all-gather goes
        through a copy of the shard, written back on its own thread, that races with the cast: the CPU stand-in
        (tests/runtime/stream_cpu_device.py) makes an in-place all-gather over one rank do nothing, as NCCL's does
        (an expert-data-parallel group of one rank in its EP 2 scenarios)."""
        job = self.job
        if (job is None or self.mode == DELAYED
                or getattr(bucket_group, "intra_distributed_optimizer_instance_size", None) == 1):
            return
        self._maps()
        chunks = self._gather_chunks.get(bucket_group)
        if chunks is None:
            chunks = self._gather_chunks[bucket_group] = self._chunks_of(bucket_group.params)
        self._wait_chunks(job, chunks)

    def _chunks_of(self, params) -> frozenset[int]:
        """The chunks holding this rank's offloaded shards of ``params`` (one chunk per parameter here)."""
        return frozenset(self.chunk_of_model[p] for p in params if p in self.chunk_of_model)

    def gate_unseen(self) -> None:
        """Before the model's forward (exact mode): wait for the chunks of parameters whose own module's forward
        never ran in the first step (a parent module reads them directly, e.g. a convolution's weight): no
        module hook would wait for them."""
        job = self.job
        if job is not None and self.unseen_chunks:
            self._wait_chunks(job, self.unseen_chunks)

    def drain(self, apply_delayed: bool = False) -> None:
        """Wait for the pending update; afterwards the optimizer state is complete and the GPU fp32 weights
        (and in exact mode the model's weights) hold it. ``apply_delayed``: in delayed mode, also copy it
        into the model's weights (what a save or an evaluation needs)."""
        import torch

        job = self.job
        if job is None:
            return
        job.model_copied.set()  # no copy to the model is coming before this drain: nothing to wait for
        self.enqueue_all()
        self._wait_counted(job.finished, "the offloaded optimizer step")
        self.job = None
        self._raise_if_failed(job)
        if job.done_events:
            torch.cuda.current_stream().wait_event(job.done_events[job.order[-1]])  # the H2D stream is serial
        self.hdo._sync_sub_optimizers_state_to_hdo()
        if self.mode == DELAYED and apply_delayed:
            self._owner()._copy_main_params_to_model_params()

    def applies_without_gather(self) -> bool:
        """Whether a drain outside a step with no all-gather after it may apply the pending update (``drain``'s
        ``apply_delayed``): the delayed mode's writes this rank's shards of the model's weights, which the other
        ranks see only through an all-gather, so there only with one data-parallel rank in this optimizer's group.
        The other modes' weights are current already (their ``apply_delayed`` only brings host copies home)."""
        if self.mode != DELAYED:
            return True
        group = getattr(self._owner(), "data_parallel_group", None)
        return group is None or group.size() == 1

    @staticmethod
    def _raise_if_failed(job: _Job) -> None:
        if job.error is not None:
            raise _failure(job.error) from job.error

    def unqueued(self) -> bool:
        """Whether work of the pending update may still be unenqueued, so the gradient buffers' zeroing waits (the
        stream mode enqueues its update during the next forward; exact and delayed their gradients' copies, on the
        copy thread, until ``enqueue_all`` has taken their end)."""
        return self.copies_to_take is not None

    def advance(self) -> None:
        """A module's forward is about to start (the stream mode enqueues its next chunks)."""

    def enqueue_all(self) -> None:
        """Make sure the pending update's gradient copies are all enqueued (the training thread waits for the copy
        thread if need be); the gradient buffers may then be zeroed after the last one."""
        copies = self.copies_to_take
        if copies is None:
            return
        submit_kept_copies(through=copies)
        self._wait_counted(copies.all_enqueued, "the gradients' copies", (GRADIENT_COPY_THREAD,))
        self.copies_to_take = None
        if copies.error is not None:
            raise _failure(copies.error) from copies.error
        self.grads_free_event = copies.last_event
        issue_deferred_zeros()

    def _wait_counted(self, event: threading.Event, what: str, threads: tuple[str, ...] | None = None) -> None:
        """``_wait`` for ``event`` (set by ``threads``, default the worker and the weight copy thread) unless it is
        set already, its time added to ``wait_s`` (under a lock: the backward's waits for a region's zeroing may run
        on autograd's thread, the others on the training thread)."""
        if event.is_set():
            return
        started = time.perf_counter()
        _wait(event, what, _STEP_THREADS if threads is None else threads)
        with _WAIT_LOCK:
            self.wait_s += time.perf_counter() - started

    def take_wait_s(self) -> float:
        with _WAIT_LOCK:
            value, self.wait_s = self.wait_s, 0.0
        return value

    def take_step_s(self) -> float:
        value, self.step_s = self.step_s, 0.0
        return value


def _uploaded(job: _Job, chunk: int, event) -> None:
    """The weight copy thread enqueued ``chunk``'s copies back (and casts): the training stream may wait on
    ``event``."""
    job.done_events[chunk] = event
    job.ready[chunk].set()


def _job_failed(job: _Job, error: BaseException) -> None:
    """The worker's or the weight copy thread's error: kept for the training thread, whose waits for a chunk return
    (and raise it). The job still ends on the weight copy thread, after what was handed to it."""
    if job.error is None:
        job.error = error
    for ready in job.ready.values():
        ready.set()


def processing_order(first_use: list[int], chunks: int) -> list[int]:
    """The order the worker takes the chunks in: by first use in the forward, then those the forward never
    used, highest first (the library fills its buffers in reverse parameter order, so the highest chunk
    holds the first layers)."""
    seen = list(dict.fromkeys(c for c in first_use if 0 <= c < chunks))
    return seen + [c for c in reversed(range(chunks)) if c not in seen]


def _model_shard_view(owner, model_param):
    """The slice of the DDP parameter buffer that holds ``model_param``'s shard: where the library's
    ``_copy_main_params_to_model_params`` writes it."""
    world_range = owner._get_model_param_range_map(model_param)["gbuf_world_in_bucket"]
    gbuf_index, _, bucket_id = owner.model_param_gbuf_map[model_param]
    return owner.buffers[gbuf_index].buckets[bucket_id].param_data.view(-1)[world_range.start:world_range.end]


def _failure(error: BaseException) -> EngineError:
    """The engine's error on the training thread for an error of its worker or copy thread."""
    return EngineError(CPU_STEP_FAILED.format(kind=type(error).__name__, error=error))


_STEP_THREADS = (WORKER_THREAD, WEIGHT_COPY_THREAD)  # what finishes a chunk of the update: its Adam, its copy back


def _alive(thread: str) -> bool:
    if thread == GRADIENT_COPY_THREAD:
        return gradient_copies.alive()
    if thread == WEIGHT_COPY_THREAD:
        return weight_copies.alive()
    return _WORKER.alive()


def _wait(event: threading.Event, what: str, threads: tuple[str, ...] = _STEP_THREADS) -> None:
    """Wait for ``event``, which ``threads`` (the worker, the gradient or the weight copy thread) set, raising if one
    of them is gone (it would never set it)."""
    while not event.wait(5.0):
        stopped = next((thread for thread in threads if not _alive(thread)), None)
        if stopped is not None:
            raise EngineError(WORKER_STOPPED.format(thread=stopped, what=what))


# one thread per process runs the engines' jobs in the order they were handed over (run catches everything itself
# and always sets the job's events)
_WORKER = LazySerialThread(lambda: SerialThread(name="mbridge-offload-engine",
                                                handle=lambda item: item[0].run(item[1])))


def submit_kept_copies(through: GradientCopies | None = None) -> None:
    """Hand the gradient copies that the delayed mode kept for the next step's zeroing (``copies_at_next_step``) to
    the copy thread, in the order the steps kept them: the worker takes the jobs in that order (a MoE's dense
    optimizer's, then its experts'). Whatever waits for the copies calls this first. ``through``: only up to those
    copies, where one engine waits for its own (a MoE's expert optimizer drains its last job in its step, after the
    dense optimizer kept this step's copies, which must stay kept)."""
    kept = _STATE["kept_copies"]
    if through is not None and not any(copies is through for copies in kept):
        return
    while kept:
        copies = kept.pop(0)
        gradient_copies.submit(copies)
        if copies is through:
            return


def engines() -> list[StreamingEngine]:
    return list(_STATE["engines"])


def drain_all(apply_delayed: bool = True) -> None:
    """Wait for every engine's pending update (a save, an evaluation, the run's end). ``apply_delayed``: the delayed
    mode's update also reaches the model's weights on every rank (an all-gather with several ranks: every rank must
    call this at the same point, as it calls the save and the evaluation)."""
    for engine in engines():
        engine.drain(apply_delayed=apply_delayed)
    if apply_delayed:
        _gather_applied_weights()


def _gather_applied_weights() -> None:
    """delayed, several data-parallel ranks: the drain wrote this rank's shards of the applied update into the
    parameter buffers; every bucket group's all-gather brings the other ranks' (once per training step since the
    last one: the flag is set alike on every rank, so the ranks make the same collectives)."""
    if not _STATE["delayed_steps_ungathered"]:
        return
    _STATE["delayed_steps_ungathered"] = False
    chunks: dict[int, Any] = {}  # the model chunks in their list's order: the same on every rank
    for engine in engines():
        owner = engine._owner()
        for chunk in getattr(owner, "model_chunks", ()):
            chunks.setdefault(id(chunk), chunk)
    for chunk in chunks.values():
        groups = list(chunk.bucket_groups) + list(getattr(chunk, "expert_parallel_bucket_groups", []))
        if any(getattr(g, "intra_distributed_optimizer_instance_size", 1) > 1 for g in groups):
            chunk.start_param_sync(force_sync=True)


def take_wait_s() -> float | None:
    """Seconds the training thread waited for the engine since the last call (None: no engine runs)."""
    running = engines()
    return round(sum(e.take_wait_s() for e in running), 6) if running else None


def take_step_s() -> float | None:
    """Seconds the training thread spent inside the engines' optimizer steps since the last call: the time
    it was not launching the next forward (None: no engine runs)."""
    running = engines()
    return round(sum(e.take_step_s() for e in running), 6) if running else None


def installed_mode() -> str | None:
    return _STATE["mode"]


def _engine_of(distributed_optimizer) -> StreamingEngine | None:
    return getattr(getattr(distributed_optimizer, "optimizer", None), "_mbridge_offload_engine", None)


def install(mode: str, zero_by_region: bool = False, copies_at_next_step: bool = False) -> None:
    """Run every optimizer-offload step of this process with ``mode``'s engine (``library``: change nothing).
    Class attributes, set before the optimizer and the model are built; no file under site-packages changes.
    ``zero_by_region``: the exact and delayed engines zero the gradient buffers by region (grad_regions.py).
    ``copies_at_next_step``: the delayed engine hands each step's gradient copies to its copy thread at the next
    step's gradient zeroing instead of in the step (MBRIDGE_OFFLOAD_DELAYED_COPY_START)."""
    if mode not in ENGINE_MODES:
        raise ValueError(UNKNOWN_ENGINE.format(mode=mode, modes=", ".join(ENGINE_MODES)))
    if copies_at_next_step and mode != DELAYED:
        raise ValueError(f"{DELAYED_COPY_START_ENV}={COPY_AT_NEXT_STEP} is the delayed engine's (this run's: {mode}). "
                         f"Fix: ++env_vars.{DELAYED_COPY_START_ENV}={COPY_AT_STEP}")
    if mode == LIBRARY or _STATE["mode"] is not None:
        return
    import torch
    import megatron.bridge.training.checkpointing as bridge_checkpointing
    import megatron.bridge.training.pretrain as bridge_pretrain
    import megatron.bridge.training.train as bridge_train
    from megatron.core.distributed import DistributedDataParallel
    from megatron.core.optimizer.cpu_offloading.hybrid_optimizer import HybridDeviceOptimizer
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    if zero_by_region and mode not in (EXACT, DELAYED):
        raise ValueError(f"{ZERO_BY_REGION_ENV}=on is the exact and delayed engines' (this run's: {mode}). Fix: "
                         f"++env_vars.{ZERO_BY_REGION_ENV}=off")
    _STATE["mode"] = mode
    _STATE["by_region"] = zero_by_region
    _STATE["copies_at_next_step"] = copies_at_next_step
    library_step = HybridDeviceOptimizer.step

    def step(self, closure=None):
        engine = getattr(self, "_mbridge_offload_engine", None)
        if engine is None:
            if self.__dict__.get(NEVER_STEPS):
                raise EngineError(STREAM_OUTSIDE_DISTRIBUTED_OPTIMIZER)
            return library_step(self, closure)
        started = time.perf_counter()
        if engine.mode == DELAYED and _STATE["in_train_step"]:
            _STATE["delayed_steps_ungathered"] = True
        try:
            if engine.mode == STREAM:
                engine.step(closure)
                if not _STATE["in_train_step"]:  # e.g. the checkpoint loader's dummy step: finished before it returns
                    engine.drain(apply_delayed=True)
                return None
            if not (_STATE["in_train_step"] and self.cpu_optimizers):
                engine.drain(apply_delayed=engine.applies_without_gather())
                return library_step(self, closure)  # e.g. the checkpoint loader's dummy step: synchronous
            return engine.step(closure)
        finally:
            engine.step_s += time.perf_counter() - started

    HybridDeviceOptimizer.step = step

    library_init = DistributedOptimizer.__init__

    def init(self, *args, **kwargs):
        _STATE["building"] = self  # the HybridDeviceOptimizer built inside reads the model's order from it
        try:
            library_init(self, *args, **kwargs)
        finally:
            _STATE["building"] = None
        if isinstance(getattr(self, "optimizer", None), HybridDeviceOptimizer):
            _DEFERRED_ZEROS.clear()  # a previous model's (an in-process restart): its engines are not this one's
            submit_kept_copies()  # likewise: they would hold the previous model's gradients until the next zeroing
            if mode == STREAM:
                from mbridge_offload.runtime.streamed_states import StateStreamingEngine

                engine = StateStreamingEngine(self.optimizer, self, mode)
            else:
                engine = StreamingEngine(self.optimizer, self, mode)
            engine._maps()  # refuses here, before training, what the mode cannot run
            self.optimizer._mbridge_offload_engine = engine
            if mode in (EXACT, STREAM):
                _install_gates(engine, self.model_chunks)

    DistributedOptimizer.__init__ = init
    if mode == STREAM:
        _install_stream_selection(HybridDeviceOptimizer)

    library_copy = DistributedOptimizer._copy_main_params_to_model_params

    def copy_main_params_to_model_params(self):
        engine = _engine_of(self)
        job = engine.job if engine is not None else None
        if job is None:
            return library_copy(self)
        if engine.mode == DELAYED:
            library_copy(self)
            job.model_copied_event = torch.cuda.current_stream().record_event()
            job.model_copied.set()
            return None
        # exact, stream: the engine casts the offloaded parameters chunk by chunk; the library copies the rest
        saved = {name: getattr(self, name) for name in engine.library_groups}
        try:
            for name, groups in engine.library_groups.items():
                setattr(self, name, groups)
            return library_copy(self)
        finally:
            for name, value in saved.items():
                setattr(self, name, value)

    DistributedOptimizer._copy_main_params_to_model_params = copy_main_params_to_model_params

    for name in ("state_dict", "sharded_state_dict", "load_state_dict", "save_parameter_state",
                 "load_parameter_state", "get_parameter_state_dp_zero", "get_parameter_state_dp_reshardable",
                 "reload_model_params", "prepare_model_params_for_param_sync"):
        if hasattr(DistributedOptimizer, name):
            # Megatron Bridge all-gathers the parameters right after prepare_model_params_for_param_sync (its save's
            # and evaluation's forced sync, on every rank): a delayed update applied there reaches every rank
            gathered = name == "prepare_model_params_for_param_sync"
            setattr(DistributedOptimizer, name, _draining_method(getattr(DistributedOptimizer, name), gathered))
    for module in (bridge_train, bridge_pretrain):
        for name in ("save_checkpoint_and_time", "evaluate_and_print_results"):
            if hasattr(module, name):
                setattr(module, name, _draining_function(getattr(module, name)))
    # a load that writes the model's weights before the optimizer's state-dict methods drain (a model-only load,
    # checkpoint.load_optim=False; Python that loads mid-run) would race with the exact engine's pending cast; Bridge's
    # setup loads before any step, and its loads with the optimizer drain in its sharded_state_dict first
    bridge_checkpointing.load_checkpoint = _draining_function(bridge_checkpointing.load_checkpoint)
    # the norm reads the fp32 weights: wait for the update, but leave the delayed update delayed
    bridge_train.calc_params_l2_norm = _draining_function(bridge_train.calc_params_l2_norm, apply_delayed=False)
    library_train_step = bridge_train.train_step

    def train_step(*args, **kwargs):
        _STATE["in_train_step"] = True
        try:
            return library_train_step(*args, **kwargs)
        finally:
            _STATE["in_train_step"] = False

    bridge_train.train_step = train_step
    _install_grad_zeroing(DistributedDataParallel)
    if _STATE["by_region"]:
        _install_region_waits(DistributedDataParallel)
    if mode in (EXACT, STREAM):
        _install_param_gather_gate()


def _install_region_waits(ddp_class) -> None:
    """The zeroing by region (grad_regions.py): the backward waits for a region's memsets in DDP's post-hook of each
    parameter, before the hook adds its gradient into the buffer (every recipe, and the validator, keep gradient-
    accumulation fusion off, so that add is the first write); a bucket group's gradient sync, which reads and writes
    its buckets whole (the regions of parameters whose hook did not run), waits for all of its regions."""
    from megatron.core.distributed.param_and_grad_buffer import _ParamAndGradBucketGroup

    library_make_hook = ddp_class._make_backward_post_hook

    def make_backward_post_hook(self, param):
        hook = library_make_hook(self, param)

        def waiting_hook(*args, **kwargs):
            grad_regions.wait_before_write(param)
            return hook(*args, **kwargs)

        return waiting_hook

    ddp_class._make_backward_post_hook = make_backward_post_hook
    for name in ("start_grad_sync", "finish_grad_sync"):
        library = getattr(_ParamAndGradBucketGroup, name)

        def waiting(self, *args, _library=library, **kwargs):
            grad_regions.wait_before_sync(self.params)
            return _library(self, *args, **kwargs)

        waiting.__wrapped__ = library
        setattr(_ParamAndGradBucketGroup, name, waiting)


def _install_stream_selection(hdo_class) -> None:
    """The stream mode chooses which tensors to offload and where their host copies live
    (streamed_states.streamed_param_groups) for the HybridDeviceOptimizer a distributed optimizer builds on its fp32
    shards. The choice is kept on the optimizer, so a rebuild after a checkpoint load makes the same one.

    Megatron first builds one on the model's weights, reads only its parameter groups and settings, and builds the
    one that steps inside the distributed optimizer. The library's split would give that first one a host copy of
    every offloaded weight (pinned bf16 and pageable fp32) for nothing. Dropping them later is not enough: a freed
    copy of a tensor under glibc's mmap threshold (at most 32 MiB: a MoE's experts) stays in the process, the
    likely cause of the ~4 B per parameter beyond the 12 of the stream mode that the 8-layer MoE proxy held on the
    H200. So it gets no sub-optimizers at all (the runs that measured this emptied them before the distributed
    optimizer read it), and a step of it is refused."""
    from mbridge_offload.runtime.streamed_states import forward_positions, streamed_param_groups

    def sub_optimizer_param_groups(self, offload_fraction: float):
        positions = self.__dict__.get("_mbridge_forward_positions")
        if positions is None:
            if _STATE["building"] is None:
                setattr(self, NEVER_STEPS, True)
                return [], [], {}, {}, {}
            positions = self._mbridge_forward_positions = forward_positions(_STATE["building"])
        return streamed_param_groups(self, positions, offload_fraction)

    hdo_class._get_sub_optimizer_param_groups = sub_optimizer_param_groups


def _install_param_gather_gate() -> None:
    """With several data-parallel ranks, a bucket group's parameter all-gather sends this rank's shards: it waits
    for the exact or stream engine's update of them (``gate_param_gather``)."""
    from megatron.core.distributed.param_and_grad_buffer import _ParamAndGradBucketGroup

    library_start = _ParamAndGradBucketGroup.start_param_sync

    def start_param_sync(self, force_sync: bool = False):
        for engine in engines():
            engine.gate_param_gather(self)
        return library_start(self, force_sync)

    _ParamAndGradBucketGroup.start_param_sync = start_param_sync


def _draining_method(method, gathered: bool = False):
    """``method`` after the drain of its optimizer's engine; ``gathered``: an all-gather of the parameters follows
    on every rank, so the delayed update may be applied with several ranks too."""
    def drained(self, *args, **kwargs):
        engine = _engine_of(self)
        if engine is not None:
            engine.drain(apply_delayed=gathered or engine.applies_without_gather())
        return method(self, *args, **kwargs)

    drained.__wrapped__ = method
    return drained


def _draining_function(function, apply_delayed: bool = True):
    def drained(*args, **kwargs):
        drain_all(apply_delayed=apply_delayed)
        return function(*args, **kwargs)

    drained.__wrapped__ = function
    return drained


def _install_gates(engine: StreamingEngine, model_chunks) -> None:
    """A forward pre-hook on every module that holds offloaded parameters, run before the library's own
    (which may start the parameter all-gather). The stream mode also enqueues its pending update from the
    pre-hooks of the modules with parameters of their own (``advance``), paced over those the forward meets
    before its first offloaded one."""
    engine._maps()
    before_first_gate, gated = 0, False
    for chunk in model_chunks:
        for module in chunk.modules():
            own = list(module.parameters(recurse=False))
            owned = [p for p in own if p in engine.chunk_of_model]
            if owned:
                module.register_forward_pre_hook(lambda _module, _args, owned=owned: engine.gate(owned),
                                                 prepend=True)
                gated = True
            elif own and engine.mode == STREAM:
                module.register_forward_pre_hook(lambda _module, _args: engine.advance(), prepend=True)
                if not gated:
                    before_first_gate += 1
    if engine.mode == STREAM:
        engine.pace(before_first_gate)


_DEFERRED_ZEROS: list = []  # DDP modules whose gradient memsets wait for an update still to be enqueued


def _reset_grad_bookkeeping(ddp) -> None:
    """The CPU part of megatron-core 0.19.2's ``DistributedDataParallel.zero_grad_buffer``
    (distributed_data_parallel.py:603): the parameters' accumulation flags and the bucket groups' state. It runs at
    the step's start even when the memsets wait: the schedule's no_sync window for the first micro batches relies on
    ``bucket_group.reset()`` having run before it opens."""
    if getattr(ddp.config, "cuda_graph_impl", "none") != "transformer_engine":
        for param in ddp.params_with_grad:
            param.grad_added_to_main_grad = False
    for bucket_group in ddp.bucket_groups + ddp.expert_parallel_bucket_groups:
        bucket_group.reset()


def _zero_grad_memory(ddp) -> None:
    """The memory part of ``zero_grad_buffer``: each gradient buffer's memsets."""
    for buffer in ddp.buffers + ddp.expert_parallel_buffers:
        buffer.reset()


def _zero_after_updates(ddp, zero) -> None:
    """``zero(ddp)`` on the engines' zero stream once every pending update has read the gradients (directly when
    none is pending); the first forward's end makes the backward wait for it (``_mbridge_offload_zeroed``)."""
    import torch

    pending = [e for e in engines() if e.grads_free_event is not None]
    # a deferred zeroing follows the training stream where it was asked for, not where it is issued (the end of the
    # first forward, which does not touch the gradient buffers): its memsets then run under that forward
    asked = ddp.__dict__.pop("_mbridge_offload_zero_asked", None)
    if not pending:
        zero(ddp)
        return
    stream = pending[0].zero_stream
    if asked is not None:
        stream.wait_event(asked)
    else:
        stream.wait_stream(torch.cuda.current_stream())
    for engine in pending:
        stream.wait_event(engine.grads_free_event)
    with torch.cuda.stream(stream):
        zero(ddp)
    ddp._mbridge_offload_zeroed = stream.record_event()


def issue_deferred_zeros() -> None:
    """A stream engine enqueued its update's last chunk: zero the gradient buffers that waited for it, once no
    engine has chunks left to enqueue (the dense and the expert optimizer of a MoE each have one)."""
    if any(e.unqueued() for e in engines()):
        return
    while _DEFERRED_ZEROS:
        _zero_after_updates(_DEFERRED_ZEROS[0], _zero_grad_memory)
        _DEFERRED_ZEROS.pop(0)


def _install_grad_zeroing(ddp_class) -> None:
    """Zero the gradient buffers on the copy stream after the D2H instead of on the training stream before
    the next forward: the forward then runs while the copies finish, and the backward waits for the zeroing."""
    import torch

    library_zero = ddp_class.zero_grad_buffer
    library_forward = ddp_class.forward

    def zero_grad_buffer(self):
        submit_kept_copies()  # the step's reads are done: its copies may start (copies_at_next_step)
        if _STATE["by_region"]:
            # each region after the copies that read it; the backward waits per region (_install_region_waits)
            _reset_grad_bookkeeping(self)
            asked = torch.cuda.current_stream().record_event()
            for buffer in self.buffers + self.expert_parallel_buffers:
                grad_regions.zero_buffer(buffer, asked)
            return None
        if any(e.unqueued() for e in engines()):
            # the update still to be enqueued reads these gradients: their memsets after its last chunk
            _reset_grad_bookkeeping(self)
            if not getattr(self.ddp_config, "reuse_grad_buf_for_mxfp8_param_ag", False):
                # the memsets may run under the first forward, which then leaves the gradient buffer alone (with
                # that option the forward's parameter all-gather is staged in it: they wait for the forward)
                self._mbridge_offload_zero_asked = torch.cuda.current_stream().record_event()
            if self not in _DEFERRED_ZEROS:
                _DEFERRED_ZEROS.append(self)
            return None
        _zero_after_updates(self, library_zero)
        return None

    def forward(self, *args, **kwargs):
        for engine in engines():
            engine.gate_unseen()
        output = library_forward(self, *args, **kwargs)
        if self in _DEFERRED_ZEROS:  # the backward writes the gradient buffer: its zeroing must be enqueued
            for engine in engines():
                engine.enqueue_all()
        zeroed = getattr(self, "_mbridge_offload_zeroed", None)
        if zeroed is not None:
            torch.cuda.current_stream().wait_event(zeroed)  # the backward writes the gradient buffer
            self._mbridge_offload_zeroed = None
        return output

    ddp_class.zero_grad_buffer = zero_grad_buffer
    ddp_class.forward = forward
