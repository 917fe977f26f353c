"""The stream offload engine with several data-parallel ranks and across a checkpoint load, on the CPU: Megatron
Core's real DistributedDataParallel, get_megatron_optimizer (DistributedOptimizer over a HybridDeviceOptimizer),
the plugin's real install_resume_fix() and streaming_engine.install("stream") (the engine, its gates, its
all-gather gate, its deferred gradient zeroing), one process per rank on gloo. The GPU is the stand-in of
stream_cpu_device.py (what it replaces and what that hides: its docstring). Importing this module installs the
stand-in: stream_cpu_check.py runs it in a process of its own, for tests/runtime/test_stream_ranks.py and
tests/runtime/test_stream_resume.py.

The model: an "embedding" matrix, then blocks of a vector and two matrices (12.6M parameters: with 2 ranks each
rank's offloaded shards make 6 chunks of 2**20 elements, more than the ring's 3 slots), each tensor a module whose
forward adds sum(weight * c) to its input: the gradient of each weight is c, chosen so that every value and the
ranks' mean are exact in bf16 and fp32. Rank r's c is (r + 1) * c_k, so the reduce-scattered gradient differs
from each rank's own.

``main(["ranks"])`` / ``main(["resume"])`` print one line per scenario and return 0 only when every scenario ends
as it should: the correct ones pass, each broken one fails the check that names its bug.
"""

from __future__ import annotations

import copy
import datetime
import math
import os
import socket
import sys
import threading
import traceback
import types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import stream_cpu_device  # noqa: E402

stream_cpu_device.install()
try:  # Megatron Bridge's pretrain module (the engine's install patches it) imports it; the CPU venv has no wheel
    import nvidia_resiliency_ext.inprocess  # noqa: F401
except ImportError:
    _nvrx, _inprocess = types.ModuleType("nvidia_resiliency_ext"), types.ModuleType("nvidia_resiliency_ext.inprocess")
    _inprocess.CallWrapper = object  # only an annotation in megatron/bridge/training/pretrain.py
    _nvrx.inprocess = _inprocess
    sys.modules.update({"nvidia_resiliency_ext": _nvrx, "nvidia_resiliency_ext.inprocess": _inprocess})

import multiprocessing  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from mbridge_offload.runtime import streamed_states, streaming_engine  # noqa: E402
from mbridge_offload.runtime.resume_fix import install_resume_fix  # noqa: E402

# the engine under check: stream (ranks, resume) unless stream_cpu_check.py was asked for another's scenarios
ENGINE_UNDER_CHECK = os.environ.get("MBRIDGE_CPU_CHECK_ENGINE", "stream")
install_resume_fix()  # what launch.py installs with optimizer offload, in this order
streaming_engine.install(ENGINE_UNDER_CHECK, zero_by_region=os.environ.get("MBRIDGE_OFFLOAD_ZERO_BY_REGION") == "on",
                         copies_at_next_step=os.environ.get("MBRIDGE_OFFLOAD_DELAYED_COPY_START") == "next-step")

from megatron.core import parallel_state  # noqa: E402
from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig  # noqa: E402
from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer  # noqa: E402
from megatron.core.transformer import TransformerConfig  # noqa: E402
from megatron.core.transformer.module import MegatronModule  # noqa: E402

EMBED = (700, 701)
HIDDEN, FFN, BLOCKS = 1000, 1500, 4
MICRO_BATCHES, PIPELINE_SEQ = 4, 2  # the pipeline scenarios' schedule: micro batches per step, their length
EXPERT_FFN = 500  # the MoE scenarios' expert matrix of each block: a tensor of its own on each expert-parallel rank
BUCKET = 2_500_000  # elements: several buckets, each its own bucket group (each its own parameter all-gather)
OVERLAP_GRAD_REDUCE = True  # off: one bucket per buffer, reduced in finish_grad_sync (a by-region scenario)
LR, WEIGHT_DECAY, BETAS, EPS, CLIP = 0.05, 0.1, (0.9, 0.95), 1e-8, 1.0
SEEN: list = []  # (name, the weight a module's forward used, or None where the forward skipped it)
# step: the tensors whose layer that step's forward skips, so that they get no gradient and their DDP hook never runs
# (a by-region scenario; Megatron's DDP then needs overlap_grad_reduce off, or its finish_grad_sync raises)
SKIPPED: dict[int, set] = {}
ZEROED_TWICE: set = set()  # the steps that call zero_grad_buffer twice before their backward
# step: the rank whose gradient holds an inf that step, so that the optimizer's check skips the step on every rank
INF_AT: dict[int, int] = {}
INF_LAYER = "fc1_1"  # the tensor that holds it (in the dense optimizer)


class Weight(torch.nn.Module):
    def __init__(self, name: str, *shape: int, expert: bool = False) -> None:
        super().__init__()
        self.name = name
        self.weight = torch.nn.Parameter(
            torch.empty(*shape, device=torch.cuda.current_device(), dtype=torch.bfloat16).uniform_(-1, 1))
        if expert:
            self.weight.allreduce = False  # how Megatron marks an expert's parameter: its own buffers and optimizer

    def forward(self, x, coefficients):
        if self.name not in coefficients:  # skipped this step (SKIPPED)
            SEEN.append((self.name, None))
            return x
        SEEN.append((self.name, self.weight.detach().clone()))
        return x + (self.weight.float() * coefficients[self.name]).sum()


class Toy(MegatronModule):
    """The model, or with pipeline parallelism one stage of it: the embedding and its share of the blocks."""

    share_embeddings_and_output_weights = False  # read by Megatron's finalize_model_grads with several stages

    def __init__(self, config, experts: bool = False, stage: int = 0, stages: int = 1) -> None:
        super().__init__(config=config)
        layers = [Weight("embed", *EMBED)] if stage == 0 else []
        per_stage = BLOCKS // stages
        for i in range(stage * per_stage, (stage + 1) * per_stage):
            layers += [Weight(f"norm{i}", HIDDEN), Weight(f"fc1_{i}", FFN, HIDDEN), Weight(f"fc2_{i}", HIDDEN, FFN)]
            if experts:
                layers.append(Weight(f"exp{i}", EXPERT_FFN, HIDDEN, expert=True))
        self.layers = torch.nn.ModuleList(layers)
        self.pre_process, self.post_process = stage == 0, stage == stages - 1  # what the schedule reads
        self.input_tensor = None

    def set_input_tensor(self, tensor) -> None:
        """The pipeline schedule's hand-over of the previous stage's output."""
        self.input_tensor = tensor[0] if isinstance(tensor, (list, tuple)) else tensor

    def forward(self, coefficients, shape=()):
        """Each layer adds sum(weight * c) to every element of x: zeros of ``shape`` on the first stage, the
        previous stage's output on the others."""
        if self.pre_process:
            x = torch.zeros(shape, device=torch.cuda.current_device())
        else:
            x = self.input_tensor
        for layer in self.layers:
            x = layer(x, coefficients)
        return x


def _shapes(experts: bool = False) -> dict:
    out = {"embed": EMBED}
    for i in range(BLOCKS):
        out.update({f"norm{i}": (HIDDEN,), f"fc1_{i}": (FFN, HIDDEN), f"fc2_{i}": (HIDDEN, FFN)})
    if experts:  # after the others: their coefficients come after the others' from the same generator
        out.update({f"exp{i}": (EXPERT_FFN, HIDDEN) for i in range(BLOCKS)})
    return out


def base_coefficients(step: int) -> dict:
    """c_k: values (+-1..8)/8, exact in bf16; rank r uses (r + 1) * c_k."""
    generator = torch.Generator().manual_seed(1000 + step)
    out = {}
    for name, shape in _shapes(experts=True).items():
        magnitude = torch.randint(1, 9, shape, generator=generator).float() / 8
        sign = torch.randint(0, 2, shape, generator=generator).float() * 2 - 1
        out[name] = magnitude * sign * (name not in SKIPPED.get(step, ()))  # a skipped layer's gradient is 0
    return out


def rank_coefficients(step: int, rank: int) -> dict:
    out = {name: (c * (rank + 1)).cuda() for name, c in base_coefficients(step).items()
           if name not in SKIPPED.get(step, ())}
    if INF_AT.get(step) == rank:
        out[INF_LAYER].view(-1)[0] = float("inf")  # its gradient there: the reduce-scattered one is inf too
    return out


class Reference:
    """torch AdamW on the full fp32 tensors with the ranks' mean gradient, clipped by its global norm as Megatron
    clips (max_norm / (norm + 1e-6) when below 1)."""

    def __init__(self, initial: dict, hyper: dict, world: int, moments: str = "fp32") -> None:
        self.world = world
        self.moment_dtype = moments  # bf16: the moments are rounded to bf16 after each update, as the kernel stores them
        self.params = {name: value.cpu().float() for name, value in initial.items()}  # plain host tensors
        self.optimizer = torch.optim.AdamW(
            [{"params": [p], "lr": hyper[n][0], "weight_decay": hyper[n][1]} for n, p in self.params.items()],
            betas=BETAS, eps=EPS, foreach=False)

    def gradients(self, step: int) -> dict:
        """Each tensor's gradient after Megatron's reduce-scatter: the ranks' mean."""
        mean = (self.world + 1) / 2
        return {name: c * mean for name, c in base_coefficients(step).items() if name in self.params}

    def norm(self, step: int, grads: dict) -> float:
        """The global norm Megatron clips by: of every gradient of the model."""
        return math.sqrt(sum(float((g.double() ** 2).sum()) for g in grads.values()))

    def step(self, step: int) -> None:
        grads = self.gradients(step)
        norm = self.norm(step, grads)
        coefficient = CLIP / (norm + 1e-6)
        for name, param in self.params.items():
            param.grad = grads[name] * coefficient if coefficient < 1 else grads[name]
        self.optimizer.step()
        if self.moment_dtype == "bf16":
            for state in self.optimizer.state.values():
                for key in ("exp_avg", "exp_avg_sq"):
                    state[key].copy_(state[key].bfloat16())

    def moments(self, name: str):
        state = self.optimizer.state[self.params[name]]
        return state["exp_avg"], state["exp_avg_sq"]


class ExpertReference(Reference):
    """The reference of the model with experts, on one rank: the dense tensors as ``Reference``; this rank's experts,
    whose gradient is the sum over the ranks holding the same experts (their expert-data-parallel group) scaled by
    1 / world, as Megatron's DDP scales an expert's; the clipping norm over the dense gradients and every
    expert-parallel rank's experts."""

    def __init__(self, initial: dict, hyper: dict, run: "Run") -> None:
        super().__init__(initial, hyper, run.world)
        self.experts = run.experts
        self.my_group = tuple(run.replica_ranks(next(iter(run.experts))))
        everyone = [None] * run.world
        dist.all_gather_object(everyone, self.my_group)
        self.expert_groups = sorted(set(everyone))  # one per expert-parallel rank

    def _scale(self, group) -> float:
        return sum(r + 1 for r in group) / self.world

    def gradients(self, step: int) -> dict:
        base = base_coefficients(step)
        return {name: base[name] * (self._scale(self.my_group) if name in self.experts else (self.world + 1) / 2)
                for name in self.params}

    def norm(self, step: int, grads: dict) -> float:
        base = base_coefficients(step)
        squares = sum(float((g.double() ** 2).sum()) for name, g in grads.items() if name not in self.experts)
        for group in self.expert_groups:
            squares += sum(float(((base[name] * self._scale(group)).double() ** 2).sum()) for name in self.experts)
        return math.sqrt(squares)


class Run:
    """One rank's model and optimizer, built as Megatron Bridge builds them."""

    def __init__(self, rank: int, world: int, port: int, fraction: float, overlap_param_gather: bool,
                 overlap_d2h: bool, seed: int = 0, expert_parallel: int = 0, stages: int = 1,
                 loss_scale: float | None = None) -> None:
        """``expert_parallel``: 0 for the model without experts, else the expert-parallel size of the model with
        them (each expert-parallel rank holds other experts). ``stages``: pipeline-parallel stages, each trained
        through Megatron's 1F1B schedule in ``MICRO_BATCHES`` micro batches. ``loss_scale``: Megatron's constant
        loss scaler, whose check for an inf or a NaN in the gradients skips a step (an fp16 run's dynamic scaler
        skips the same way; the gradients here are not scaled, so 1.0 changes no value)."""
        self.rank, self.world, self.stages = rank, world, stages
        if not dist.is_initialized():
            dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                    timeout=datetime.timedelta(seconds=120))
            parallel_state.initialize_model_parallel(pipeline_model_parallel_size=stages,
                                                     expert_model_parallel_size=max(1, expert_parallel))
        self.dp_rank, self.dp_size = parallel_state.get_data_parallel_rank(), parallel_state.get_data_parallel_world_size()
        self.microbatches = MICRO_BATCHES if stages > 1 else 1
        torch.manual_seed(seed)
        config = TransformerConfig(num_layers=stages, hidden_size=8, num_attention_heads=1, bf16=True,
                                   params_dtype=torch.bfloat16, pipeline_model_parallel_size=stages,
                                   pipeline_dtype=torch.float32 if stages > 1 else None)
        ddp_config = DistributedDataParallelConfig(grad_reduce_in_fp32=True, overlap_grad_reduce=OVERLAP_GRAD_REDUCE,
                                                   overlap_param_gather=overlap_param_gather,
                                                   use_distributed_optimizer=True, bucket_size=BUCKET)
        stage = parallel_state.get_pipeline_model_parallel_rank()
        self.model = DistributedDataParallel(config, ddp_config, Toy(config, experts=bool(expert_parallel),
                                                                     stage=stage, stages=stages))
        if stages > 1:  # as Megatron Bridge sets them up for its pipeline schedules
            from megatron.core.distributed import finalize_model_grads

            config.finalize_model_grads_func = finalize_model_grads
            config.no_sync_func = self.model.no_sync
        optimizer_config = OptimizerConfig(
            optimizer="adam", lr=LR, weight_decay=WEIGHT_DECAY, adam_beta1=BETAS[0], adam_beta2=BETAS[1],
            adam_eps=EPS, bf16=True, params_dtype=torch.bfloat16, use_distributed_optimizer=True, clip_grad=CLIP,
            optimizer_cpu_offload=True, optimizer_offload_fraction=fraction,
            overlap_cpu_optimizer_d2h_h2d=overlap_d2h, loss_scale=loss_scale)
        optimizer = get_megatron_optimizer(optimizer_config, [self.model])
        self.optimizer = optimizer
        # the distributed optimizers: one, or the dense one and the experts' (each with its HybridDeviceOptimizer and
        # the engine of it)
        self.distopts = list(getattr(optimizer, "chained_optimizers", None) or [optimizer])
        self.distopt = self.distopts[0]
        self.hdo = self.distopt.optimizer
        self.engine = self.hdo._mbridge_offload_engine
        self.names = {layer.weight: layer.name for layer in self.model.module.layers}
        self.experts = {layer.name for layer in self.model.module.layers if not getattr(layer.weight, "allreduce", True)}
        self.params = {name: param for param, name in self.names.items()}
        self.enqueued: list[int] = []
        self.updated: bool | None = None  # whether the last optimizer step updated (False: skipped)
        if ENGINE_UNDER_CHECK == "stream":
            library_enqueue = self.engine._enqueue

            def enqueue(index: int) -> None:  # records the order the engine's chunks are enqueued in
                self.enqueued.append(index)
                library_enqueue(index)

            self.engine._enqueue = enqueue

    def hyper(self) -> dict:
        """Each tensor's lr and weight decay as the DistributedOptimizers group them, from every rank."""
        mine = {}
        for distopt in self.distopts:
            for param, (group, _) in distopt.model_param_group_index_map.items():
                settings = distopt.optimizer.param_groups[group]
                mine[self.names[param]] = (settings["lr"], settings["weight_decay"])
        everyone = [None] * self.world
        dist.all_gather_object(everyone, mine)
        return {k: v for part in everyone for k, v in part.items()}

    def weights(self) -> dict:
        return {name: param.detach().clone() for name, param in self.params.items()}

    def train_step(self, step: int) -> None:
        """Megatron Bridge's train_step, in order: zero the gradient buffers and the optimizer's gradients, the
        forward and backward (with stages: Megatron's 1F1B schedule, whose end reduce-scatters the gradients), the
        gradient reduce-scatter, the optimizer step (inside the engine's train step)."""
        self._step(rank_coefficients(step, self.dp_rank), forward_only=False, zero_twice=step in ZEROED_TWICE)

    def forward_only(self) -> None:
        """The same without the backward, the reduce-scatter and the optimizer step (under no_grad)."""
        self._step(rank_coefficients(0, self.dp_rank), forward_only=True)

    def _step(self, coefficients: dict, forward_only: bool, zero_twice: bool = False) -> None:
        streaming_engine._STATE["in_train_step"] = True
        try:
            self.model.zero_grad_buffer()
            kept = len(streaming_engine._STATE["kept_copies"])
            check(kept == 0, "copies-at-next-step",
                  f"rank {self.rank}: {kept} optimizers' gradient copies still kept after zero_grad_buffer")
            if zero_twice:
                self.model.zero_grad_buffer()
            self.optimizer.zero_grad()
            with torch.set_grad_enabled(not forward_only):
                if self.stages > 1:
                    self._pipeline(coefficients, forward_only)
                else:
                    loss = self.model(coefficients)
                    if not forward_only:
                        loss.backward()
                        self.model.finish_grad_sync()
            if not forward_only:
                self.updated = self.optimizer.step()[0]
        finally:
            streaming_engine._STATE["in_train_step"] = False

    def _pipeline(self, coefficients: dict, forward_only: bool) -> None:
        """Megatron's pipeline schedule over ``microbatches`` micro batches, each the same: the loss is the last
        stage's output's mean (the gradient of each weight is its coefficient after the schedule's division by
        the micro batches and their sum)."""
        from megatron.core.pipeline_parallel import get_forward_backward_func

        shape = (PIPELINE_SEQ, 1, self.model.config.hidden_size)

        def forward_step(data_iterator, model):
            output = model(coefficients, shape)
            return output, lambda out: (out.float().mean(), {"loss": out.detach().float().mean()})

        get_forward_backward_func()(forward_step_func=forward_step, data_iterator=iter(()), model=[self.model],
                                    num_microbatches=self.microbatches, seq_length=PIPELINE_SEQ, micro_batch_size=1,
                                    forward_only=forward_only)

    def shard_range(self, model_param):
        distopt = next(d for d in self.distopts if model_param in d.model_param_group_index_map)
        return distopt._get_model_param_range_map(model_param)["param"]

    def replica_ranks(self, name: str) -> list[int]:
        """The ranks holding the same tensor ``name`` (the data-parallel ranks; for an expert's, those of the same
        expert-parallel rank: its expert-data-parallel group)."""
        group = (parallel_state.get_expert_data_parallel_group() if name in self.experts
                 else parallel_state.get_data_parallel_group())
        return dist.get_process_group_ranks(group)


class CheckFailed(AssertionError):
    pass


def check(condition: bool, name: str, detail: str = "") -> None:
    if not condition:
        raise CheckFailed(f"{name}: {detail}")


def _close(a, b, rtol, atol):
    a, b = a.float().reshape(-1), b.float().reshape(-1)
    bad = ~torch.isclose(a, b, rtol=rtol, atol=atol)
    return int(bad.sum()), (float((a - b).abs().max()) if a.numel() else 0.0)


def check_seen_weights(run: Run, reference: Reference, after: int, weights: dict | None = None) -> None:
    """Every module's forward used the weights after ``after`` updates (the reference's now, or ``weights``), on
    every rank: the shards of the other ranks came through Megatron's all-gather after their update, this rank's
    through the engine's cast."""
    for name, used in SEEN:
        if used is None:
            continue
        bad, worst = _close(used, (weights or reference.params)[name], rtol=2 ** -7, atol=1e-5)
        check(bad == 0, "forward-weights", f"rank {run.rank}: the forward after update {after} used {name} with "
              f"{bad} of {used.numel()} elements off the reference (max {worst:.3g})")
    check(len(SEEN) == len(run.params) * run.microbatches, "forward-weights", f"{len(SEEN)} modules ran")
    SEEN.clear()


def check_layout(run: Run) -> dict:
    """This rank's offloaded shards, as the engine laid them out; returns them for the union over ranks."""
    engine, distopt = run.engine, run.distopt
    order = {p: i for i, p in enumerate(run.model.module.parameters())}
    owned = {}  # model param -> (start, stop) of this rank's shard
    for group in distopt.model_float16_groups + distopt.model_fp32_groups:
        for model in group:
            r = run.shard_range(model)
            owned[model] = (r.start, r.end)
    models = engine.models
    positions = [order[m] for m in models]
    check(positions == sorted(positions), "layout-order", f"offloaded tensors not in forward order: {positions}")
    check(len(set(positions)) == len(positions), "layout-order", "a tensor offloaded twice")
    # the offloaded ones are the ones the forward uses last: every owned tensor after the first offloaded one
    if models:
        first = positions[0]
        later = [order[m] for m in owned if order[m] >= first]
        check(sorted(later) == positions, "layout-last-used", f"owned {sorted(later)} vs offloaded {positions}")
    sizes = [m.numel() for m in engine.mains]
    total = sum(sizes)
    held = sum(hi - lo for lo, hi in owned.values())
    fraction = run.hdo.offload_fraction
    check(total >= fraction * held and (not sizes or total - sizes[0] < fraction * held), "layout-fraction",
          f"offloaded {total} of {held} at fraction {fraction}")
    for main, model in zip(engine.mains, models):
        lo, hi = owned[model]
        check(main.numel() == hi - lo, "layout-shard", f"{run.names[model]}: main {main.numel()} vs range {lo}:{hi}")
    # the chunks cover the flat buffers once, end to end, and each piece is where the tensor lies in them
    starts = streamed_states.starts_of(sizes)
    position = 0
    pieces_of: dict = {}
    for index, chunk in enumerate(engine.chunks):
        check(chunk.start == position and chunk.stop - chunk.start <= engine.numel, "layout-chunks", str(chunk))
        offset = chunk.start
        for piece in chunk.pieces:
            check(starts[piece.tensor] + piece.start == offset, "layout-chunks", f"piece {piece} at {offset}")
            check(piece.slot_offset == offset - chunk.start, "layout-chunks", f"piece {piece}")
            offset += piece.stop - piece.start
            pieces_of.setdefault(models[piece.tensor], set()).add(index)
        check(offset == chunk.stop, "layout-chunks", f"chunk {index} ends at {offset}")
        position = chunk.stop
    check(position == total, "layout-chunks", f"chunks end at {position} of {total}")
    check({m: tuple(sorted(c)) for m, c in pieces_of.items()} == dict(engine.chunk_of_model), "layout-chunk-of-model",
          "chunk_of_model disagrees with the pieces")
    # each model view is this rank's shard of the parameter, in the DDP parameter buffer the all-gather sends
    for model, view in zip(models, engine.model_views):
        lo, hi = owned[model]
        check(view.numel() == hi - lo and view.data_ptr() == model.data_ptr() + lo * model.element_size(),
              "shard-view", f"{run.names[model]}: the engine's model view is not the rank's shard {lo}:{hi}")
        bucket = next(b for b in run.model.buffers[0].buckets if model in b.params)
        base, n = bucket.param_data.data_ptr(), bucket.param_data.numel()
        check(base <= view.data_ptr() < base + n * 2, "shard-view", "not in the parameter's bucket")
    check_host_buffers(run)
    return {run.names[m]: (owned[m], m in set(models)) for m in owned}


def check_host_buffers(run: Run) -> None:
    """The library's host copies of the weights (what a checkpoint saves as master_param) and the CPU optimizers'
    states (what it saves as exp_avg, exp_avg_sq, step) are the engine's host buffers, where its update reads and
    writes them."""
    engine = run.engine
    starts = streamed_states.starts_of([m.numel() for m in engine.mains])
    for main, (m, v), start in zip(engine.mains, engine.host_views, starts):
        copy = run.hdo.gpu_params_map_cpu_copy[main]
        check(copy.data_ptr() == engine.host_master.data_ptr() + 4 * start, "host-buffers",
              f"rank {run.rank}: a host copy of the weights is not in the engine's buffer")
        state = engine._state_of(main)
        check(state.get("exp_avg") is m and state.get("exp_avg_sq") is v and state.get("step") is engine.step_tensor,
              "host-buffers", f"rank {run.rank}: a CPU optimizer state is not the engine's host view")


def check_union(run: Run, mine: dict, fraction: float) -> None:
    """Over the ranks: every element of every parameter is held by exactly one rank; with fraction 1 every one is
    offloaded."""
    everyone = [None] * run.world
    dist.all_gather_object(everyone, mine)
    for name, shape in _shapes().items():
        ranges = sorted((lo, hi, off) for part in everyone for n, ((lo, hi), off) in part.items() if n == name)
        position = 0
        for lo, hi, off in ranges:
            check(lo == position and hi > lo, "union", f"{name}: ranges {ranges}")
            position = hi
            check(off or fraction < 1, "union", f"{name}: a shard not offloaded at fraction 1")
        check(position == math.prod(shape), "union", f"{name}: ranges {ranges} of {math.prod(shape)}")
    offloaded = sum(hi - lo for part in everyone for (lo, hi), off in part.values() if off)
    check(offloaded > 0, "union", "nothing offloaded")


def check_gather_gates(run: Run) -> None:
    """Each bucket group's all-gather waited for the chunks that hold this rank's offloaded shards of its
    parameters (and a group with none of them for none)."""
    engine = run.engine
    groups = run.model.bucket_groups
    check(len(groups) > 1, "gather-gate", f"{len(groups)} bucket group(s): the model should make several")
    for group in groups:
        expected = set()
        for index, chunk in enumerate(engine.chunks):
            if any(engine.models[p.tensor] in group.params for p in chunk.pieces):
                expected.add(index)
        got = engine._gather_chunks.get(group)
        check(got is not None and set(got) == expected, "gather-gate",
              f"rank {run.rank}: a bucket group's all-gather waited for {got}, its chunks are {sorted(expected)}")


def check_states(run: Run, reference: Reference) -> None:
    """After a drain (what a checkpoint save does): this rank's fp32 shards, the library's host copies of them,
    Adam's moments on the host and the step equal the reference's."""
    engine = run.engine
    check(not engine.pending, "drain", "the update is still pending after drain_all")
    for main, model, (m, v) in zip(engine.mains, engine.models, engine.host_views):
        name = run.names[model]
        r = run.shard_range(model)
        ref = reference.params[name].reshape(-1)[r.start:r.end]
        bad, worst = _close(main, ref, rtol=1e-5, atol=1e-6)
        check(bad == 0, "main-weights", f"rank {run.rank} {name}: {bad} elements off (max {worst:.3g})")
        check(torch.equal(run.hdo.gpu_params_map_cpu_copy[main].reshape(-1), main.reshape(-1)), "drain",
              f"{name}: the host copy of the weights was not refreshed")
        ref_m, ref_v = reference.moments(name)
        for got, want, what in ((m, ref_m, "exp_avg"), (v, ref_v, "exp_avg_sq")):
            bad, worst = _close(got, want.reshape(-1)[r.start:r.end], rtol=1e-5, atol=1e-9)
            check(bad == 0, "moments", f"rank {run.rank} {name} {what}: {bad} elements off (max {worst:.3g})")
    steps = {float(s["step"]) for s in run.hdo.state.values() if "step" in s}
    check(steps == {float(reference.optimizer.state[next(iter(reference.params.values()))]["step"])} or
          not engine.mains, "step", f"steps {steps}")
    # the rest of this rank's shards (kept on the GPU: FusedAdam, as without offload)
    kept = [p for g in run.hdo.param_groups for p in g["params"] if p not in set(engine.mains)]
    mains_to_models = streamed_states.main_to_model(run.distopt)
    for main in kept:
        model = mains_to_models[main]
        r = run.shard_range(model)
        bad, worst = _close(main, reference.params[run.names[model]].reshape(-1)[r.start:r.end], rtol=1e-5, atol=1e-6)
        check(bad == 0, "main-weights", f"rank {run.rank} {run.names[model]} (on the GPU): {bad} off ({worst:.3g})")


def check_enqueue_order(run: Run, expected: int) -> None:
    """The chunks enqueued since the last call: ``expected`` of them, in the layout's (forward) order, once each."""
    check(run.enqueued == list(range(expected)), "enqueue-order",
          f"rank {run.rank}: enqueued {run.enqueued}, expected chunks 0..{expected - 1} in order")
    run.enqueued.clear()


# --- the scenarios ---
RANKS_STEPS = 3


def ranks_case(rank: int, world: int, port: int, fraction: float, overlap_param_gather: bool,
               overlap_d2h: bool) -> None:
    run = Run(rank, world, port, fraction, overlap_param_gather, overlap_d2h)
    check(run.engine.mode == "stream" and run.model.bucket_groups[0].intra_distributed_optimizer_instance_size
          == world, "setup", "not the stream engine over the data-parallel ranks")
    check(len(run.engine.chunks) > run.engine.slots or world > 2, "setup",
          f"{len(run.engine.chunks)} chunks: the ring ({run.engine.slots} slots) should wrap")
    check_union(run, check_layout(run), fraction)
    reference = Reference(run.weights(), run.hyper(), world)
    chunks = len(run.engine.chunks)
    for step in range(1, RANKS_STEPS + 1):
        run.train_step(step)
        check_seen_weights(run, reference, step - 1)
        # without overlap the step's own all-gather enqueued its update (each bucket group's gate); with overlap
        # this step's forward enqueued the previous update (module gates, pacing, the all-gathers it started)
        check_enqueue_order(run, chunks if not overlap_param_gather or step > 1 else 0)
        check(run.engine.pending, "pending", "the step did not leave its update to the next forward")
        reference.step(step)
        if step == 1 and not overlap_param_gather:
            check_gather_gates(run)
    run.forward_only()  # the forward after the last update
    check_seen_weights(run, reference, RANKS_STEPS)
    check_enqueue_order(run, chunks if overlap_param_gather else 0)
    if overlap_param_gather:
        check_gather_gates(run)
    streaming_engine.drain_all(apply_delayed=True)  # what a checkpoint save or an evaluation does first
    check_states(run, reference)


class RoomyMemory:
    """fetch_ahead.py's allocator figures where there is no GPU: every interval far below the run's peak, so the rule
    lets every chunk after the ring's be fetched ahead (the arithmetic and the order are what these checks see)."""

    @staticmethod
    def interval_peak() -> int:
        return 0

    @staticmethod
    def run_peak() -> int:
        return 1 << 50


def _with_fetch_ahead(case, fetching_steps: int = 1):
    """``case`` with fetch-ahead on: from the third step's backward (the first two steps' windows are read, not
    used) every chunk after the ring's comes up into a buffer of its own, and the next forward (or a drain) moves it
    into its ring slot; ``case`` checks that every module still sees torch AdamW's weights and that the host's
    moments end as the reference's. Then: each of the ``fetching_steps`` steps fetched every chunk after the ring's
    of every engine, once, on some rank, and no buffer is left."""
    def run(rank: int, world: int, port: int, *args) -> None:
        from mbridge_offload.facts.offload_engine import FETCH_AHEAD_ENV
        from mbridge_offload.runtime import fetch_ahead

        os.environ[FETCH_AHEAD_ENV] = "on"
        fetch_ahead._PROCESS[:] = [fetch_ahead.FetchAhead(memory=RoomyMemory())]
        streamed_states.STREAM_MIN_CHUNK_NUMEL = 1  # a hook on every parameter of this small model
        case(rank, world, port, *args)
        coordinator = fetch_ahead._PROCESS[0]
        engines = coordinator.engines
        ahead = sum(len(e.chunks) - e.slots for e in engines)
        check(coordinator.fetched == ahead * fetching_steps, "fetch-ahead",
              f"rank {rank}: {coordinator.fetched} chunks fetched ahead, {ahead} x {fetching_steps} expected (every "
              f"chunk after the ring's of {len(engines)} engine(s), once a step from the third)")
        everyone = [None] * world
        dist.all_gather_object(everyone, ahead)
        check(sum(everyone) > 0, "fetch-ahead", f"no rank has chunks after the ring's: {everyone}")
        check(coordinator.held == 0 and not any(e.holds_ahead() for e in engines), "fetch-ahead",
              f"rank {rank}: {coordinator.held} bytes of buffers still held after the last forward and the drain")
    run.__name__ = f"fetch_ahead_{case.__name__}"
    return run


def _by_region(case, slow: bool = False, region_bytes: int | None = None, overlap_grad_reduce: bool = True,
               gaps: bool = False):
    """``case`` with the gradient buffers zeroed by region (stream_cpu_check.py's ``*-by-region`` kinds turn
    MBRIDGE_OFFLOAD_ZERO_BY_REGION on before the engine is installed); ``case`` checks every forward's weights and
    every state against torch AdamW's, so a gradient zeroed before its copy or after the backward's first write shows.
    ``slow``: the copy thread reports each region's copies ended only once the next step asked for the zeroing (or a
    drain waits for them), and 0.05 s late, so the backward reaches regions whose memsets are
    not issued yet and only its waits keep the gradients (the stand-in runs a memset when it is issued); with the
    break region-no-wait, only once the backward reached the region too (``_until_reached``).
    ``region_bytes``: regions cut inside the buckets too. ``overlap_grad_reduce`` off: one bucket per buffer, its
    reduce-scatter in finish_grad_sync. ``gaps``: steps whose forward skips some layers, so that whole regions get no
    gradient and no DDP hook waits for them (only the gradient sync does; the run needs ``overlap_grad_reduce`` off),
    and steps that call zero_grad_buffer twice before their backward. Then: regions were zeroed by region and the
    backward waited for some."""
    def run(rank: int, world: int, port: int, *args) -> None:
        import time

        from mbridge_offload.runtime import grad_regions

        check(streaming_engine._STATE["by_region"], "setup", "the zeroing by region is not on")
        counts = {"zeroed": 0, "waited": 0}
        library_zero, library_wait = grad_regions.BufferRegions.zero, grad_regions.RegionZeroing.wait

        def zero(self, region):
            counts["zeroed"] += 1
            library_zero(self, region)

        def wait(self, region):
            counts["waited"] += region not in self.waited
            library_wait(self, region)

        grad_regions.BufferRegions.zero, grad_regions.RegionZeroing.wait = zero, wait
        if slow:
            library_ended = grad_regions.RegionZeroing.copies_ended

            def copies_ended(self, region, event):
                _until_asked(self)
                _until_reached(self, region)
                time.sleep(0.05)
                library_ended(self, region, event)

            grad_regions.RegionZeroing.copies_ended = copies_ended
        if region_bytes is not None:
            streaming_engine.REGION_BYTES = region_bytes
        globals()["OVERLAP_GRAD_REDUCE"] = overlap_grad_reduce
        if gaps:
            check(not overlap_grad_reduce, "setup", "layers without a gradient need overlap_grad_reduce off")
            # with 1 MiB regions fc1_0, fc2_3 and the embedding (the last region the backward reaches) fill regions
            # of their own; norm2 shares one with another layer
            SKIPPED.update({2: {"fc1_0", "norm2", "embed"}, 3: {"fc2_3", "fc1_0"}})
            ZEROED_TWICE.add(3)
        case(rank, world, port, *args)
        check(counts["zeroed"] > 0 and counts["waited"] > 0, "by-region",
              f"rank {rank}: {counts['zeroed']} regions zeroed by region, {counts['waited']} waited for")
    run.__name__ = f"by_region_{case.__name__}"
    return run


def evaluations_between_steps_case(rank: int, world: int, port: int, fraction: float, overlap_param_gather: bool,
                                   overlap_d2h: bool) -> None:
    """Five steps with an evaluation (the drain of apply_delayed, then a forward without backward) after the second
    and the third: each forward uses the weights after every earlier update, and after the last drain the shards,
    host copies and moments are the reference's."""
    run = Run(rank, world, port, fraction, overlap_param_gather, overlap_d2h)
    reference = Reference(run.weights(), run.hyper(), world)
    steps = 5
    for step in range(1, steps + 1):
        run.train_step(step)
        check_seen_weights(run, reference, step - 1)
        reference.step(step)
        if step in (2, 3):
            streaming_engine.drain_all(apply_delayed=True)  # what Megatron Bridge's evaluate_and_print_results does
            run.forward_only()
            check_seen_weights(run, reference, step)
    run.forward_only()
    check_seen_weights(run, reference, steps)
    streaming_engine.drain_all(apply_delayed=True)
    check_states(run, reference)


def check_exact_gather_gates(run: Run) -> None:
    """Each bucket group's all-gather waited for the exact engine's chunks holding this rank's offloaded shards of
    its parameters (and a group with none of them for none)."""
    engine = run.engine
    groups = run.model.bucket_groups
    check(len(groups) > 1, "gather-gate", f"{len(groups)} bucket group(s): the model should make several")
    waited_for_some = False
    for group in groups:
        expected = {engine.chunk_of_model[p] for p in group.params if p in engine.chunk_of_model}
        got = engine._gather_chunks.get(group)
        check(got is not None and set(got) == expected, "gather-gate",
              f"rank {run.rank}: a bucket group's all-gather waited for {got}, its chunks are {sorted(expected)}")
        waited_for_some |= bool(expected)
    check(waited_for_some, "gather-gate", f"rank {run.rank}: no all-gather waited for any chunk")


def exact_ranks_case(rank: int, world: int, port: int, fraction: float, overlap_param_gather: bool) -> None:
    """The exact engine (CPU Adam on a worker thread, each forward waiting for its own chunks) on several
    data-parallel ranks: every forward on every rank uses the weights after all earlier updates (the other ranks'
    shards came through Megatron's all-gather, which waited for their update), and after a drain every shard, host
    copy and moment equals torch AdamW's on the full tensors."""
    run = Run(rank, world, port, fraction, overlap_param_gather, overlap_d2h=True)
    check(run.engine.mode == "exact" and run.model.bucket_groups[0].intra_distributed_optimizer_instance_size
          == world, "setup", "not the exact engine over the data-parallel ranks")

    def settle(run: Run) -> None:
        check_exact_gather_gates(run)
        drain(run)

    train_and_check_any_engine(run, Reference(run.weights(), run.hyper(), world), settle)


def check_full_weights(run: Run, reference: Reference, after: int, what: str) -> None:
    """Every parameter, whole, as this rank holds it (its own shards and the other ranks' from the all-gathers),
    equals the reference's after ``after`` updates within bf16's rounding."""
    for name, param in run.params.items():
        bad, worst = _close(param.detach(), reference.params[name], rtol=2 ** -7, atol=1e-5)
        check(bad == 0, "applied-weights", f"rank {run.rank}: after {what}, {name} has {bad} of {param.numel()} "
              f"elements off the weights after update {after} (max {worst:.3g})")


def offloaded_elements(run: Run) -> dict:
    """Each parameter's elements whose shard its owning rank offloaded (a flat mask, the same on the ranks that
    hold the tensor)."""
    mine = []
    for distopt in run.distopts:
        models_of = streamed_states.main_to_model(distopt)
        for main in distopt.optimizer.gpu_params_map_cpu_copy:
            model = models_of[main]
            r = run.shard_range(model)
            mine.append((run.names[model], r.start, r.end))
    everyone = [None] * run.world
    dist.all_gather_object(everyone, mine)
    masks = {name: torch.zeros(param.numel(), dtype=torch.bool) for name, param in run.params.items()}
    for rank, part in enumerate(everyone):
        for name, start, end in part:
            if name in masks and rank in run.replica_ranks(name):  # another stage's tensors are not this rank's
                masks[name][start:end] = True
    return masks


def delayed_weights(history: list, masks: dict, step: int) -> dict:
    """The weights the forward of ``step`` uses with the delayed engine: the offloaded elements after update
    step - 2 (their update runs during the step after it), the rest (updated on the GPU in their step) after
    step - 1."""
    late, current = history[max(0, step - 2)], history[max(0, step - 1)]
    return {name: torch.where(masks[name], late[name].reshape(-1), current[name].reshape(-1)).reshape(current[name].shape)
            for name in masks}  # this rank's tensors (another pipeline stage's are not)


def delayed_ranks_case(rank: int, world: int, port: int, fraction: float, overlap_param_gather: bool,
                       through: str) -> None:
    """The delayed engine (step k's CPU Adam during step k+1, whose forward uses the weights before it) on several
    data-parallel ranks: the forward of step k uses the weights after update k-2 on every rank; what a save or an
    evaluation does first (``through``: ``drain`` for the plugin's wrapper of save_checkpoint_and_time and
    evaluate_and_print_results, which drains and all-gathers; ``param-sync`` for Megatron Bridge's
    disable_forward_pre_hook with its parameter sync, which the evaluation calls first with the overlapped
    all-gather) leaves every rank with the whole weights after the last update; the next step's forward uses them;
    every shard, host copy and moment equals torch AdamW's on the full tensors."""
    from megatron.bridge.training.train import disable_forward_pre_hook, enable_forward_pre_hook

    run = Run(rank, world, port, fraction, overlap_param_gather, overlap_d2h=True)
    check(run.engine.mode == "delayed" and run.model.bucket_groups[0].intra_distributed_optimizer_instance_size
          == world, "setup", "not the delayed engine over the data-parallel ranks")
    reference = Reference(run.weights(), run.hyper(), world)
    masks = offloaded_elements(run)
    check(all(m.all() for m in masks.values()) if fraction == 1 else any(m.any() for m in masks.values()) and not
          all(m.all() for m in masks.values()), "setup", f"the offloaded elements do not fit fraction {fraction}")

    def settle(run: Run) -> None:
        if through == "drain":
            drain(run)
        else:
            disable_forward_pre_hook([run.model], optimizer=run.optimizer)
            enable_forward_pre_hook([run.model])

    train_and_check_any_engine(run, reference, settle)
    run.train_step(RANKS_STEPS + 1)  # as after a save: the forward uses the update the drain applied
    check_seen_weights(run, reference, RANKS_STEPS)
    reference.step(RANKS_STEPS + 1)
    drain(run)
    check_full_weights(run, reference, RANKS_STEPS + 1, "the next step and its drain")
    check_optimizers_states(run, reference)


def check_optimizers_states(run: Run, reference: Reference) -> None:
    """After a drain, for the dense and the experts' optimizer alike and any engine: every fp32 shard of this rank
    and its Adam moments equal the reference's; each offloaded shard's host copy (what a checkpoint saves) equals
    it."""
    for distopt in run.distopts:
        hdo = distopt.optimizer
        check(hdo._mbridge_offload_engine.job is None, "drain", "the update is still pending after drain_all")
        hdo._sync_sub_optimizers_state_to_hdo()  # the HybridDeviceOptimizer's view of its sub-optimizers' states
        models_of = streamed_states.main_to_model(distopt)
        offloaded = 0
        for main in (p for g in hdo.param_groups for p in g["params"]):
            model = models_of[main]
            name, r = run.names[model], run.shard_range(model)
            bad, worst = _close(main, reference.params[name].reshape(-1)[r.start:r.end], rtol=1e-5, atol=1e-6)
            check(bad == 0, "main-weights", f"rank {run.rank} {name}: {bad} elements off (max {worst:.3g})")
            for key, want in zip(("exp_avg", "exp_avg_sq"), reference.moments(name)):
                bad, worst = _close(hdo.state[main][key], want.reshape(-1)[r.start:r.end], rtol=1e-5, atol=1e-9)
                check(bad == 0, "moments", f"rank {run.rank} {name} {key}: {bad} elements off (max {worst:.3g})")
            if main in hdo.gpu_params_map_cpu_copy:
                offloaded += 1
                check(torch.equal(hdo.gpu_params_map_cpu_copy[main].reshape(-1), main.reshape(-1)), "host-copy",
                      f"rank {run.rank} {name}: the host copy of the weights is not the drained shard")
        check(offloaded > 0, "setup", f"rank {run.rank}: nothing of an optimizer offloaded")


def drain(run: Run) -> None:
    """What a save or an evaluation does first: the plugin's drain, which all-gathers the applied weights."""
    streaming_engine.drain_all(apply_delayed=True)


def train_and_check_any_engine(run: Run, reference: Reference, settle=drain) -> None:
    """RANKS_STEPS steps, each leaving its update pending in every optimizer's engine, and the forward after them,
    each forward's weights as the engine under check promises them (exact, stream: after every earlier update;
    delayed: the offloaded elements one update behind, the rest current); then ``settle(run)`` (what a save or an
    evaluation does first: the drain by default; it may check more before): every rank holds the weights after the
    last update, and every optimizer's shards, moments and host copies equal the reference's."""
    history = [{name: value.clone() for name, value in reference.params.items()}]  # the weights after i updates
    delayed = ENGINE_UNDER_CHECK == "delayed"
    masks = offloaded_elements(run) if delayed else None
    for step in range(1, RANKS_STEPS + 2):  # the last: the forward after the last step
        if step > RANKS_STEPS:
            run.forward_only()
        else:
            run.train_step(step)
        expected = delayed_weights(history, masks, step) if delayed else history[step - 1]
        check_seen_weights(run, reference, max(0, step - (2 if delayed else 1)), expected)
        if step > RANKS_STEPS:
            break
        check(all(d.optimizer._mbridge_offload_engine.job is not None for d in run.distopts), "pending",
              f"rank {run.rank}: step {step} did not leave its update pending")
        if streaming_engine._STATE["copies_at_next_step"]:
            kept = len(streaming_engine._STATE["kept_copies"])
            check(kept == len(run.distopts), "copies-at-next-step",
                  f"rank {run.rank}: step {step} kept {kept} optimizers' gradient copies for the next step, not "
                  f"{len(run.distopts)}")
        reference.step(step)
        history.append({name: value.clone() for name, value in reference.params.items()})
    settle(run)
    check_full_weights(run, reference, RANKS_STEPS, "the drain of a save or an evaluation")
    check_optimizers_states(run, reference)


SKIP_STEPS, SKIPPED_STEP = 5, 3  # skipped_step_case: the steps, and the one whose gradients hold an inf


def skipped_step_case(rank: int, world: int, port: int, fraction: float, overlap_param_gather: bool) -> None:
    """A step that the optimizer skips (an inf in one rank's gradient: Megatron's check, all-reduced, returns before
    the HybridDeviceOptimizer's step on every rank, as an fp16 run's loss scaler does on an overflow), with the
    engine under check (exact, stream, delayed; zeroing by region where stream_cpu_check.py's kind turns it on).
    Every step reports whether it updated: only the skipped one did not. Every forward uses the weights the engine
    promises, counted in updates, not steps: after every earlier update (exact, stream), the offloaded elements one
    update behind (delayed), so the update still pending at the skip stays pending through it and the skip's
    gradients reach nothing. After the drain every rank holds the weights after the last update, and every shard,
    moment, Adam step count and host copy equals torch AdamW's that skipped the same step."""
    run = Run(rank, world, port, fraction, overlap_param_gather, overlap_d2h=True, loss_scale=1.0)
    check(run.engine.mode == ENGINE_UNDER_CHECK, "setup", f"not the {ENGINE_UNDER_CHECK} engine")
    reference = Reference(run.weights(), run.hyper(), world)
    delayed = ENGINE_UNDER_CHECK == "delayed"
    masks = offloaded_elements(run) if delayed else None
    INF_AT[SKIPPED_STEP] = world - 1
    updates = [{name: value.clone() for name, value in reference.params.items()}]  # the weights after i updates
    for step in range(1, SKIP_STEPS + 2):  # the last: the forward after the last step
        pending = [getattr(d.optimizer._mbridge_offload_engine, "job", None) for d in run.distopts]
        if step > SKIP_STEPS:
            run.forward_only()
        else:
            run.train_step(step)
        done = len(updates) - 1
        expected = delayed_weights(updates, masks, done + 1) if delayed else updates[done]
        check_seen_weights(run, reference, max(0, done - 1) if delayed else done, expected)
        if step > SKIP_STEPS:
            break
        check(run.updated == (step != SKIPPED_STEP), "skipped-steps",
              f"rank {rank}: step {step} {'updated' if run.updated else 'was skipped'}")
        if step == SKIPPED_STEP:
            after = [getattr(d.optimizer._mbridge_offload_engine, "job", None) for d in run.distopts]
            check(all(a is b for a, b in zip(after, pending)), "skipped-steps",
                  f"rank {rank}: the skipped step changed the engine's pending update")
            continue
        reference.step(step)
        updates.append({name: value.clone() for name, value in reference.params.items()})
    drain(run)
    check_full_weights(run, reference, len(updates) - 1, "the drain after a skipped step")
    check_optimizers_states(run, reference)
    for distopt in run.distopts:
        steps = {int(s["step"]) for s in distopt.optimizer.state.values() if "step" in s}
        check(steps == {len(updates) - 1}, "skipped-steps",
              f"rank {rank}: Adam's step counts {sorted(steps)} after {len(updates) - 1} updates")


def _zeroing_only_after_an_update() -> None:
    """by region: a zero_grad_buffer with no step's copies pending on the buffer zeroes nothing (as if every step
    updated), so a skipped step's gradients stay in the buffer."""
    from mbridge_offload.runtime import grad_regions

    library_zero_buffer = grad_regions.zero_buffer

    def zero_buffer(buffer, event):
        if getattr(buffer, grad_regions.PENDING_ATTR, None) is None:
            active = getattr(buffer, grad_regions.ACTIVE_ATTR, None)
            if active is not None:
                active.wait_all()
                setattr(buffer, grad_regions.ACTIVE_ATTR, None)
            return
        library_zero_buffer(buffer, event)

    grad_regions.zero_buffer = zero_buffer


# (label, ranks, case arguments, break or None, the check it must fail)
SKIPPED_STEP_SCENARIOS = [
    ("2 ranks, fraction 0.6, overlapped all-gather, a skipped step", 2, (0.6, True), None, None),
    ("2 ranks, fraction 1, all-gather in the step, a skipped step", 2, (1.0, False), None, None),
]
BY_REGION_SKIPPED_STEP_SCENARIOS = [
    *((f"{label}, by region", *rest) for label, *rest in SKIPPED_STEP_SCENARIOS),
    ("2 ranks, broken: region-zero-only-after-update", 2, (1.0, True), "region-zero-only-after-update",
     "skipped-steps"),
]


def experts_case(rank: int, world: int, port: int, fraction: float, overlap_param_gather: bool,
                 expert_parallel: int) -> None:
    """The engine under check on the model with experts, over several data-parallel ranks: a dense and an experts'
    distributed optimizer, each with its HybridDeviceOptimizer and its engine, both on the one worker thread, the
    experts' sharded over their own (smaller) expert-data-parallel group. Every forward, on every rank, uses the
    weights the engine promises (exact, stream: after every earlier update; delayed: the offloaded elements one
    update behind), each rank its own experts; after the drain of a save or an evaluation every rank holds the
    weights after the last update, and every shard, host copy and moment of both optimizers equals torch AdamW's on
    the full tensors."""
    run = Run(rank, world, port, fraction, overlap_param_gather, overlap_d2h=True, expert_parallel=expert_parallel)
    engines = [d.optimizer._mbridge_offload_engine for d in run.distopts]
    sizes = sorted({g.intra_distributed_optimizer_instance_size
                    for g in run.model.bucket_groups + run.model.expert_parallel_bucket_groups})
    check(len(engines) == 2 and all(e is not None and e.mode == ENGINE_UNDER_CHECK for e in engines)
          and sizes == sorted({world, world // expert_parallel}), "setup",
          f"not two {ENGINE_UNDER_CHECK} engines over {world} data-parallel and {world // expert_parallel} "
          f"expert-data-parallel ranks: {len(engines)} engines, groups of {sizes}")
    reference = ExpertReference(run.weights(), run.hyper(), run)
    train_and_check_any_engine(run, reference)


def pipeline_case(rank: int, world: int, port: int, fraction: float, overlap_param_gather: bool) -> None:
    """The engine under check with two pipeline stages, each its own distributed optimizer and engine, trained by
    Megatron's 1F1B schedule in several micro batches: every micro batch's forward, on every rank, uses the weights
    the engine promises (exact, stream: after every earlier update; delayed: the offloaded elements one update
    behind); after the drain of a save or an evaluation every rank holds its stage's weights after the last update,
    and every shard, host copy and moment equals torch AdamW's on the full tensors, clipped by the norm over both
    stages."""
    run = Run(rank, world, port, fraction, overlap_param_gather, overlap_d2h=True, stages=2)
    check(run.engine.mode == ENGINE_UNDER_CHECK and parallel_state.get_pipeline_model_parallel_world_size() == 2
          and run.model.bucket_groups[0].intra_distributed_optimizer_instance_size == run.dp_size, "setup",
          f"not the {ENGINE_UNDER_CHECK} engine on 2 stages of {run.dp_size} data-parallel rank(s)")
    everyone = [None] * world
    dist.all_gather_object(everyone, {name: weight.cpu() for name, weight in run.weights().items()})
    initial = {name: weight for stage_weights in everyone for name, weight in stage_weights.items()}
    check(len(initial) == len(_shapes()), "setup", f"the stages hold {len(initial)} of {len(_shapes())} tensors")
    reference = Reference(initial, run.hyper(), run.dp_size)  # the whole model: the clipping norm is over both stages
    train_and_check_any_engine(run, reference)


# Each stage over 2 data-parallel ranks: a stage of one rank all-gathers its parameters in place without waiting
# for the exact engine's cast into them, safe with NCCL but not with gloo (streaming_engine's gate_param_gather).
PIPELINE_SCENARIOS = [("4 ranks, 2 pipeline stages x DP 2, fraction 0.6, overlapped all-gather", 4, (0.6, True), None,
                       None)]
EXPERT_SCENARIOS = [("2 ranks, EP 2 (experts on one rank each), fraction 0.6, overlapped all-gather", 2, (0.6, True, 2),
                     None, None),
                    ("4 ranks, EP 2 (experts on two ranks each), fraction 1, all-gather in the step", 4,
                     (1.0, False, 2), None, None)]


RESUME_SAVE_AT, RESUME_STEPS = 2, 2
SHARDING = {"distrib_optim_sharding_type": "dp_reshardable", "singleton_local_shards": False,
            "chained_optim_avoid_prefix": True}  # what Megatron Bridge's checkpointing asks for (its default)


def save_checkpoint(run: Run, directory: str) -> dict:
    """Megatron Bridge's save_checkpoint_and_time: the plugin's drain (it wraps that function), Bridge's
    force_param_sync (overlapped all-gather: every rank's weights complete), then the optimizer's sharded state
    dict in Bridge's format (dp_reshardable) through dist_checkpointing. Returns the model's weights, which Bridge
    saves from the data-parallel rank 0."""
    from megatron.bridge.training.train import force_param_sync
    from megatron.core import dist_checkpointing

    streaming_engine.drain_all(apply_delayed=True)
    force_param_sync([run.model], optimizer=run.optimizer)
    state = {"optimizer": run.optimizer.sharded_state_dict({}, is_loading=False, metadata=SHARDING)}
    dist_checkpointing.save(state, directory, content_metadata=SHARDING, async_strategy=None)
    return run.weights()


def train_and_save(run: Run, reference: Reference, directory: str) -> dict:
    """RESUME_SAVE_AT steps (the reference's too), then ``save_checkpoint``: the model's weights it saved."""
    for step in range(1, RESUME_SAVE_AT + 1):
        run.train_step(step)
        SEEN.clear()
        reference.step(step)
    return save_checkpoint(run, directory)


def load_checkpoint(run: Run, directory: str, weights: dict) -> None:
    """Megatron Bridge's checkpoint load (torch_dist), in its order: the plugin's drain (it wraps that function), the
    optimizer's sharded state dict for loading (which loads the optimizer's own state into itself first; the plugin
    drains there too), dist_checkpointing.load, the model's weights, optimizer.load_state_dict."""
    from megatron.bridge.training import checkpointing
    from megatron.core import dist_checkpointing

    check(hasattr(checkpointing.load_checkpoint, "__wrapped__"), "setup",
          "the engine's install did not wrap Megatron Bridge's load_checkpoint in its drain")
    streaming_engine.drain_all(apply_delayed=True)
    state = {"optimizer": run.optimizer.sharded_state_dict({}, is_loading=True, metadata=SHARDING)}
    loaded = dist_checkpointing.load(state, directory)
    with torch.no_grad():
        for name, param in run.params.items():
            param.copy_(weights[name])
    run.optimizer.load_state_dict(loaded["optimizer"])


def forwards_after(run: Run, first_step: int) -> list:
    """RESUME_STEPS steps from ``first_step``, then what a save or an evaluation does first (the drain, which applies
    a delayed update, and the forced all-gather): the weights each forward used, and last the weights after the last
    update."""
    from megatron.bridge.training.train import force_param_sync

    seen = []
    for step in range(first_step, first_step + RESUME_STEPS):
        run.train_step(step)
        seen.append(list(SEEN))
        SEEN.clear()
    streaming_engine.drain_all(apply_delayed=True)
    force_param_sync([run.model], optimizer=run.optimizer)
    seen.append(list(run.weights().items()))
    return seen


def continue_training(run: Run, first_step: int) -> dict:
    """``forwards_after``'s weights, then this rank's fp32 shards, Adam's moments on the host and the step."""
    seen = forwards_after(run, first_step)
    engine = run.engine
    return {"seen": seen, "mains": [m.detach().clone() for m in engine.mains],
            "moments": [(m.clone(), v.clone()) for m, v in engine.host_views],
            "shards": [p.detach().clone() for g in run.hdo.param_groups for p in g["params"]],
            "step": float(engine.step_tensor)}


def check_alike(run: Run, uninterrupted: dict, resumed: dict, weights: tuple[str, ...]) -> None:
    """The resumed run's weights in every forward and after its last update, its ``weights`` (lists of tensors) and
    its moments equal the uninterrupted run's bit for bit."""
    for what in ("seen", "moments", *weights):
        check(len(uninterrupted[what]) == len(resumed[what]) > 0, "resume-setup",
              f"rank {run.rank}: {len(uninterrupted[what])} and {len(resumed[what])} of {what} to compare")
    for i, (first, second) in enumerate(zip(uninterrupted["seen"], resumed["seen"])):
        for (name, a), (_, b) in zip(first, second):
            check(torch.equal(a, b), "resume-forward-weights",
                  f"rank {run.rank}: {'forward ' + str(i + 1) if i < RESUME_STEPS else 'the last update'} after the "
                  f"load gave another {name} ({int((a != b).sum())} of {a.numel()} elements differ)")
    for what in weights:
        for i, (a, b) in enumerate(zip(uninterrupted[what], resumed[what])):
            check(torch.equal(a, b), "resume-main-weights", f"rank {run.rank}: {what} {i} differs")
    for i, ((a, b), (c, d)) in enumerate(zip(uninterrupted["moments"], resumed["moments"])):
        check(torch.equal(a, c) and torch.equal(b, d), "resume-moments",
              f"rank {run.rank}: tensor {i}'s moments differ")


def check_resumed(run: Run, uninterrupted: dict, resumed: dict, reference: Reference) -> None:
    """The resumed run's weights in every forward, fp32 shards, moments and step equal the uninterrupted run's bit
    for bit, and the reference's (torch AdamW on the full tensors) within rounding."""
    check_alike(run, uninterrupted, resumed, ("mains", "shards"))
    check(uninterrupted["step"] == resumed["step"] == RESUME_SAVE_AT + RESUME_STEPS, "resume-step",
          f"steps {uninterrupted['step']} and {resumed['step']}")
    check_host_buffers(run)  # the states the load put elsewhere are the engine's buffers again
    check_states(run, reference)


def resume_case(rank: int, world: int, port: int, directory: str, fresh: bool, through: str,
                adopt_after_build: bool) -> None:
    """Train RESUME_SAVE_AT steps, save, train on (the uninterrupted run), then load the checkpoint (``fresh``: into
    a newly built model and optimizer, as a restarted job does; else into the same ones, whose host buffers hold
    the later state) and train the same steps again. ``through``: ``megatron``, Megatron Bridge's load (the
    moments are copied into the optimizer's state tensors, the engine's buffers, where they are; the step is
    replaced); ``torch``: the HybridDeviceOptimizer's own torch load_state_dict (every state tensor replaced by the
    loaded one), the fp32 shards copied in as Megatron's load does."""
    run = Run(rank, world, port, 1.0, True, False)
    reference = Reference(run.weights(), run.hyper(), world)
    weights = train_and_save(run, reference, directory)
    torch_state = copy.deepcopy(run.hdo.state_dict())
    shards = [p.detach().clone() for g in run.hdo.param_groups for p in g["params"]]
    dist.barrier()
    uninterrupted = continue_training(run, RESUME_SAVE_AT + 1)
    for step in range(RESUME_SAVE_AT + 1, RESUME_SAVE_AT + RESUME_STEPS + 1):
        reference.step(step)
    check_states(run, reference)
    if fresh:
        run = Run(rank, world, port, 1.0, True, False, seed=1)  # other initial weights: the load must bring them
    if not adopt_after_build:
        run.engine._adopt_states = lambda: False  # broken on purpose: a load's states stay where it put them
    if through == "megatron":
        load_checkpoint(run, directory, weights)
    else:
        with torch.no_grad():
            for name, param in run.params.items():
                param.copy_(weights[name])
            for main, saved in zip((p for g in run.hdo.param_groups for p in g["params"]), shards):
                main.copy_(saved)
        run.hdo.load_state_dict(copy.deepcopy(torch_state))
        main = run.engine.mains[0]
        check(run.engine._state_of(main)["exp_avg"] is not run.engine.host_views[0][0], "setup",
              "the torch load left the moments in the engine's buffers: nothing to adopt")
    check_resumed(run, uninterrupted, continue_training(run, RESUME_SAVE_AT + 1), reference)


def optimizer_snapshot(run: Run) -> dict:
    """After a drain, every optimizer's fp32 shards, Adam's moments and step as the HybridDeviceOptimizer holds them
    (the library's states: the exact and delayed engines keep them where the library does), and each offloaded
    shard's host copy of the weights."""
    shards, moments, steps, host = [], [], [], []
    for distopt in run.distopts:
        hdo = distopt.optimizer
        hdo._sync_sub_optimizers_state_to_hdo()
        for main in (p for g in hdo.param_groups for p in g["params"]):
            state = hdo.state[main]
            shards.append(main.detach().clone())
            moments.append((state["exp_avg"].clone(), state["exp_avg_sq"].clone()))
            steps.append(float(state["step"]))
            if main in hdo.gpu_params_map_cpu_copy:
                host.append(hdo.gpu_params_map_cpu_copy[main].clone())
    return {"shards": shards, "moments": moments, "steps": steps, "host": host}


def continue_any_engine(run: Run, first_step: int) -> dict:
    """``forwards_after``'s weights with the exact or the delayed engine, then the optimizers' snapshot."""
    return {"seen": forwards_after(run, first_step), **optimizer_snapshot(run)}


def engine_resume_case(rank: int, world: int, port: int, directory: str, into: str) -> None:
    """The exact or the delayed engine (with or without the zeroing by region) across a checkpoint: train
    RESUME_SAVE_AT steps, save as Megatron Bridge does (the drain applies a delayed update first), train on (the
    uninterrupted run), then load through Megatron Bridge's load and train the same steps again. ``into``: ``new``,
    a newly built model and optimizer with other initial weights (a restarted job); ``running``, the running ones,
    whose states hold the later steps; ``pending``, the running ones one step later, with that step's update still
    on the worker (the load's drain must end it before the load writes anything). Every forward's weights, the
    weights after the last update, every fp32 shard, moment, step and host copy equal the uninterrupted run's bit
    for bit, and torch AdamW's on the full tensors within rounding. (torch's own load_state_dict of the
    HybridDeviceOptimizer, which the stream engine's resume scenarios also run, is no path of Bridge's: it loads no
    weights into the library's host copies, which these engines step.)"""
    run = Run(rank, world, port, 1.0, True, overlap_d2h=True)
    check(run.engine.mode == ENGINE_UNDER_CHECK, "setup", f"not the {ENGINE_UNDER_CHECK} engine")
    reference = Reference(run.weights(), run.hyper(), world)
    weights = train_and_save(run, reference, directory)
    dist.barrier()
    uninterrupted = continue_any_engine(run, RESUME_SAVE_AT + 1)
    for step in range(RESUME_SAVE_AT + 1, RESUME_SAVE_AT + RESUME_STEPS + 1):
        reference.step(step)
    check_optimizers_states(run, reference)
    if into == "new":
        run = Run(rank, world, port, 1.0, True, overlap_d2h=True, seed=1)  # other initial weights: the load brings them
    elif into == "pending":
        run.train_step(RESUME_SAVE_AT + RESUME_STEPS + 1)
        SEEN.clear()
        check(run.engine.job is not None, "setup", "no update pending at the load")
    load_checkpoint(run, directory, weights)
    resumed = continue_any_engine(run, RESUME_SAVE_AT + 1)
    check_alike(run, uninterrupted, resumed, ("shards", "host"))
    check(uninterrupted["steps"] == resumed["steps"] and set(resumed["steps"]) == {RESUME_SAVE_AT + RESUME_STEPS},
          "resume-step", f"steps {sorted(set(uninterrupted['steps']))} and {sorted(set(resumed['steps']))}")
    check_optimizers_states(run, reference)


def _no_load() -> None:
    """Broken on purpose: the load does nothing, so the new model and optimizer train on from their own weights."""
    globals()["load_checkpoint"] = lambda run, directory, weights: None


# (label, case arguments after the directory, break or None, the check the break must fail)
ENGINE_RESUME_SCENARIOS = [
    ("2 ranks, fraction 1, Megatron's load into a new model and optimizer", ("new",), None, None),
    ("2 ranks, fraction 1, Megatron's load into the running optimizer", ("running",), None, None),
    ("2 ranks, fraction 1, Megatron's load into the running optimizer, an update pending", ("pending",), None, None),
    ("2 ranks, broken: no-load", ("new",), "no-load", "resume-forward-weights"),
]
BY_REGION_RESUME_SCENARIOS = [(f"{label}, by region", *rest) for label, *rest in ENGINE_RESUME_SCENARIOS
                              if rest[1] is None]


def share_checkpoint_results_queue() -> None:
    """dist_checkpointing's save keeps one results queue per process, served by a process it starts with spawn,
    which imports torch when the first result arrives (~15 s here): made once, in the process that forks the ranks,
    they share it."""
    from megatron.core.dist_checkpointing.strategies.filesystem_async import get_write_results_queue

    get_write_results_queue()


def run_resume_scenarios(case, scenarios) -> bool:
    """Each (label, case arguments after the checkpoint's directory, break or None, the check it must fail or None)
    on 2 ranks with a checkpoint folder of its own; one line per scenario, as run_scenarios."""
    import tempfile

    share_checkpoint_results_queue()
    ok = True
    for label, args, broken, expected in scenarios:
        with tempfile.TemporaryDirectory() as directory:
            ok &= run_scenarios(case, [(label, 2, (directory, *args), broken, expected)])
    return ok


# --- bf16 moments (MBRIDGE_OFFLOAD_STREAM_MOMENTS=bf16) ---
BF16_STEPS = 4


def _moments_env(moments: str) -> None:
    os.environ[streamed_states.STREAM_MOMENTS_ENV] = moments


def check_moment_buffers(run: Run, moments: str) -> None:
    """The host buffers, their views in the CPU optimizers' states and the ring hold the moments in ``moments``'s
    dtype; the library's host copy of the weights stays fp32."""
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[moments]
    engine = run.engine
    for what, tensor in (("host exp_avg", engine.host_m), ("host exp_avg_sq", engine.host_v),
                         *((f"ring slot {i}", slot) for i, slot in enumerate(engine.ring))):
        check(tensor.dtype == dtype, "moments-dtype", f"rank {run.rank}: {what} is {tensor.dtype}, not {dtype}")
    check(engine.host_master.dtype == torch.float32, "moments-dtype", "the host copy of the weights is not fp32")
    for main in engine.mains:
        state = engine._state_of(main)
        check(state["exp_avg"].dtype == dtype and state["exp_avg_sq"].dtype == dtype, "moments-dtype",
              f"rank {run.rank}: a CPU optimizer's state is {state['exp_avg'].dtype}")


def _off(a, b, *, rtol: float, atol: float) -> tuple[int, int]:
    """(elements of ``a`` off ``b``, elements)."""
    return _close(a, b, rtol, atol)[0], a.numel()


def deviation(run: Run, reference: Reference) -> dict:
    """This rank's offloaded fp32 shards and host moments against ``reference``'s: the elements off by more than
    fp32 rounding, of all."""
    engine = run.engine
    off = {"weights": [0, 0], "moments": [0, 0]}
    for main, model, (m, v) in zip(engine.mains, engine.models, engine.host_views):
        name, r = run.names[model], run.shard_range(model)
        for what, got, want, atol in (("weights", main, reference.params[name], 1e-6),
                                      ("moments", m, reference.moments(name)[0], 1e-12),
                                      ("moments", v, reference.moments(name)[1], 1e-12)):
            bad, total = _off(got, want.reshape(-1)[r.start:r.end], rtol=1e-5, atol=atol)
            off[what][0] += bad
            off[what][1] += total
    return off


def bf16_moments_case(rank: int, world: int, port: int, fraction: float, overlap_param_gather: bool) -> None:
    """The stream engine with bf16 moments trains BF16_STEPS steps: its buffers hold bf16, and its fp32 shards and
    moments follow AdamW whose moments are rounded to bf16 after each update (the kernel's arithmetic), not fp32
    AdamW: at most 1 in 10^4 elements off the first (where a last-bit difference of the gradient's clipping rounds
    a moment the other way), at least 1 in 10 off the second."""
    _moments_env("bf16")
    run = Run(rank, world, port, fraction, overlap_param_gather, False)
    check_moment_buffers(run, "bf16")
    check_union(run, check_layout(run), fraction)
    hyper = run.hyper()
    rounded = Reference(run.weights(), hyper, world, moments="bf16")
    full = Reference(run.weights(), hyper, world)
    for step in range(1, BF16_STEPS + 1):
        run.train_step(step)
        SEEN.clear()
        rounded.step(step)
        full.step(step)
    streaming_engine.drain_all(apply_delayed=True)
    check_moment_buffers(run, "bf16")
    check_host_buffers(run)
    near, far = deviation(run, rounded), deviation(run, full)
    print(f"rank {rank}: off AdamW with bf16 moments: weights {near['weights'][0]} and moments {near['moments'][0]} "
          f"of {near['weights'][1]} and {near['moments'][1]} elements; off fp32 AdamW: weights {far['weights'][0]}, "
          f"moments {far['moments'][0]}", flush=True)
    for what in ("weights", "moments"):
        check(near[what][0] * 10 ** 4 <= near[what][1], "bf16-arithmetic",
              f"rank {rank}: {near[what][0]} of {near[what][1]} {what} off AdamW with bf16 moments")
        check(far[what][0] * 10 >= far[what][1], "bf16-arithmetic",
              f"rank {rank}: only {far[what][0]} of {far[what][1]} {what} off fp32 AdamW: are the moments rounded?")


def bf16_resume_case(rank: int, world: int, port: int, directory: str, saved: str, loaded: str) -> None:
    """Save with moments in ``saved``'s dtype, load into a new model and optimizer whose engine keeps them in
    ``loaded``'s, through Megatron Bridge's load: the weights, fp32 shards and step come back as saved, the moments
    as saved cast to the new dtype (bit for bit when the dtype is the same), into the engine's buffers; then a step
    trains."""
    _moments_env(saved)
    run = Run(rank, world, port, 1.0, True, False)
    for step in range(1, RESUME_SAVE_AT + 1):
        run.train_step(step)
        SEEN.clear()
    weights = save_checkpoint(run, directory)
    moments = [(m.clone(), v.clone()) for m, v in run.engine.host_views]
    mains = [m.detach().clone() for m in run.engine.mains]
    dist.barrier()
    _moments_env(loaded)
    run = Run(rank, world, port, 1.0, True, False, seed=1)
    check_moment_buffers(run, loaded)
    load_checkpoint(run, directory, weights)
    engine = run.engine
    # the load went into the engine's buffers: the states are still its views, with no fp32 copy of the moments
    # (torch's Optimizer.load_state_dict casts each state to its parameter's dtype unless the engine keeps it)
    for i, (main, (m, v)) in enumerate(zip(engine.mains, engine.host_views)):
        state = engine._state_of(main)
        check(state["exp_avg"] is m and state["exp_avg_sq"] is v, "resume-in-place",
              f"rank {rank}: after the load tensor {i}'s moments are {state['exp_avg'].dtype} tensors of their own, "
              f"not the engine's {m.dtype} buffers")
    for i, ((m, v), (want_m, want_v)) in enumerate(zip(engine.host_views, moments)):
        check(torch.equal(m, want_m.to(m.dtype)) and torch.equal(v, want_v.to(v.dtype)), "resume-moments",
              f"rank {rank}: tensor {i}'s moments are not the saved {saved} ones as {loaded}")
    for i, (main, want) in enumerate(zip(engine.mains, mains)):
        check(torch.equal(main, want), "resume-main-weights", f"rank {rank}: fp32 shard {i} is not the saved one")
    run.train_step(RESUME_SAVE_AT + 1)
    SEEN.clear()
    streaming_engine.drain_all(apply_delayed=True)
    check_moment_buffers(run, loaded)
    check_host_buffers(run)
    check(float(engine.step_tensor) == RESUME_SAVE_AT + 1, "resume-step", f"step {float(engine.step_tensor)}")
    check(all(bool(torch.isfinite(m.float()).all()) for pair in engine.host_views for m in pair), "resume-moments",
          f"rank {rank}: a moment is not finite after the step")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(target, rank, world, port, args, results):
    try:
        target(rank, world, port, *args)
        results.put((rank, "ok", ""))
    except CheckFailed as failure:
        results.put((rank, "check", str(failure)))
    except BaseException:  # noqa: BLE001
        results.put((rank, "error", traceback.format_exc()[-3000:]))
    finally:
        try:
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001
            pass


# (case, its scenarios) with fetch-ahead on: the ranks' scenarios and a broken one; the dense and the experts' engines
# sharing one room; two pipeline stages of 4 micro batches (a hook per parameter per micro batch); evaluations between
# steps (their drains end a window and release its buffers)
FETCH_AHEAD_SCENARIOS = [
    (_with_fetch_ahead(ranks_case), [
        ("2 ranks, fraction 1, fetch-ahead, overlapped all-gather", 2, (1.0, True, False), None, None),
        ("2 ranks, fraction 0.6, fetch-ahead, all-gather in the step", 2, (0.6, False, False), None, None),
        ("2 ranks, broken: fetch-ahead-no-fill", 2, (1.0, True, False), "fetch-ahead-no-fill", "forward-weights")]),
    (_with_fetch_ahead(experts_case), [
        ("2 ranks, EP 2, fraction 1, fetch-ahead, overlapped all-gather", 2, (1.0, True, 2), None, None)]),
    (_with_fetch_ahead(pipeline_case), [
        ("4 ranks, 2 pipeline stages x DP 2, fraction 1, fetch-ahead, overlapped all-gather", 4, (1.0, True), None,
         None)]),
    (_with_fetch_ahead(evaluations_between_steps_case, fetching_steps=3), [
        ("2 ranks, fraction 1, fetch-ahead, evaluations between steps", 2, (1.0, True, False), None, None)]),
]


BF16_SCENARIOS = [
    ("2 ranks, bf16 moments, fraction 1, overlapped all-gather", 2, (1.0, True), None, None),
    ("2 ranks, bf16 moments, fraction 0.6, all-gather in the step", 2, (0.6, False), None, None),
    ("2 ranks, broken: bf16-fp32-host", 2, (1.0, True), "bf16-fp32-host", "moments-dtype"),
]
BF16_FETCH_AHEAD_SCENARIOS = [
    ("2 ranks, bf16 moments, fetch-ahead, fraction 1, overlapped all-gather", 2, (1.0, True), None, None),
]
# (label, the moments' dtype at the save, at the load)
BF16_RESUME_SCENARIOS = [
    ("2 ranks, saved with bf16 moments, loaded with bf16", "bf16", "bf16"),
    ("2 ranks, saved with bf16 moments, loaded with fp32", "bf16", "fp32"),
    ("2 ranks, saved with fp32 moments, loaded with bf16", "fp32", "bf16"),
]
BF16_RESUME_BROKEN = [  # (label, saved, loaded, break, the check it must fail)
    ("2 ranks, broken: bf16-load-cast", "bf16", "bf16", "bf16-load-cast", "resume-in-place"),
]


def run_ranks(target, world: int, args: tuple, timeout: float = 240) -> list:
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    port = _free_port()
    processes = [context.Process(target=_rank_main, args=(target, r, world, port, args, results)) for r in range(world)]
    for p in processes:
        p.start()
    out = []
    for _ in range(world):
        failed = any(kind != "ok" for _, kind, _ in out)  # the others may wait in a collective for it: not long
        try:
            out.append(results.get(timeout=20 if failed else timeout))
        except Exception:  # noqa: BLE001
            out.append((-1, "error", "a rank did not report (hung, or waiting for a rank that failed)"))
            break
    for p in processes:
        p.join(timeout=5)
        if p.is_alive():
            p.kill()
    return sorted(out)


def outcome(results: list) -> str:
    if all(kind == "ok" for _, kind, _ in results):
        return "passed"
    failed = [f"rank {r}: {kind}: {text}" for r, kind, text in results if kind != "ok"]
    return "failed: " + " | ".join(failed)


def _slow_worker_without_gather_gate() -> None:
    """exact: the all-gathers no longer wait, and each of the worker's CPU optimizer steps starts 0.2 s late, so
    that an all-gather that does not wait surely sends shards before their update (without the delay whether it
    does would depend on timing)."""
    import time

    streaming_engine.StreamingEngine.gate_param_gather = lambda self, bucket_group: None
    library_run = streaming_engine.StreamingEngine.run

    def run(self, job):
        for optimizer in self.hdo.cpu_optimizers:
            if "step" not in optimizer.__dict__:
                def slow_step(*args, _step=optimizer.step, **kwargs):
                    time.sleep(0.2)
                    return _step(*args, **kwargs)
                optimizer.step = slow_step
        library_run(self, job)

    streaming_engine.StreamingEngine.run = run


BREAKS = {
    # delayed: the drain of a save or an evaluation applies this rank's shards and gathers nobody's
    "delayed-no-gather": lambda: setattr(streaming_engine, "_gather_applied_weights", lambda: None),
    # the all-gather of a bucket group no longer waits for this rank's update of its shards
    "no-gather-gate": lambda: setattr(streamed_states.StateStreamingEngine, "gate_param_gather",
                                      lambda self, bucket_group: None),
    "exact-no-gather-gate": _slow_worker_without_gather_gate,
    # a chunk fetched ahead is released without going into its ring slot: the update reads the slot's old moments
    "fetch-ahead-no-fill": lambda: setattr(streamed_states.StateStreamingEngine, "_fill_from_ahead",
                                           lambda self, index: self.fetch_ahead.released(
                                               self.step_ahead.pop(index).numel() * 4)),
    # bf16 moments whose load goes through torch's cast: an fp32 copy of every moment until the next step
    "bf16-load-cast": lambda: setattr(streamed_states, "keep_state_dtypes_through_load", lambda hdo: None),
    # bf16 moments with the host buffers left in fp32: the update is the same, the host saves nothing
    "bf16-fp32-host": lambda: setattr(streamed_states, "_pinned_in_place",
                                      lambda numel, dtype=None, pin=streamed_states._pinned_in_place: pin(numel)),
}


_DRAINING = threading.Event()  # an engine's drain waits for the copies: the copy thread's holds below let go


def _releasing_drains() -> None:
    """Each engine's drain sets ``_DRAINING`` while it runs (a drain after the last step waits for copies that no
    later zero_grad_buffer will ask for)."""
    library_drain = streaming_engine.StreamingEngine.drain
    if getattr(library_drain, "releases", False):
        return

    def drain(self, *args, **kwargs):
        _DRAINING.set()
        try:
            return library_drain(self, *args, **kwargs)
        finally:
            _DRAINING.clear()

    drain.releases = True
    streaming_engine.StreamingEngine.drain = drain


def _until_asked(zeroing, timeout: float = 60.0) -> None:
    """Until the next step's zero_grad_buffer asked for ``zeroing``, or a drain waits for the copies."""
    import time

    _releasing_drains()
    ends = time.monotonic() + timeout
    while zeroing.asked is None and not _DRAINING.is_set() and time.monotonic() < ends:
        time.sleep(0.005)


# by region, broken without waits: the (zeroing, region) pairs the backward reached, for _until_reached
_REACHED: dict | None = None


def _zeroing_without_waits() -> None:
    """by region: the backward no longer waits for a region's memsets. It records where it got to instead, and the
    slow copy thread (``_by_region``'s ``slow``) issues a region's memsets only after the backward reached it, so the
    write they should have come before always comes first: the break shows however fast or slow the backward runs
    (with a fixed delay alone, a backward slower than the delay let it pass)."""
    from mbridge_offload.runtime import grad_regions

    global _REACHED
    _REACHED = {"seen": set(), "alive": [], "changed": threading.Condition()}

    def reached(params) -> None:
        with _REACHED["changed"]:
            for param in params:
                active, region = grad_regions._active_region(param)
                if region is not None:
                    _REACHED["seen"].add((id(active), region))
                    _REACHED["alive"].append(active)  # no later zeroing takes its id while the pair is recorded
            _REACHED["changed"].notify_all()

    grad_regions.wait_before_write = lambda param: reached([param])
    grad_regions.wait_before_sync = reached


def _until_reached(zeroing, region: int, timeout: float = 30.0) -> None:
    """With the break region-no-wait: until the backward reached ``region`` of ``zeroing``, or a drain waits for the
    copies (no backward comes then). Without it: at once."""
    import time

    if _REACHED is None:
        return
    ends = time.monotonic() + timeout
    with _REACHED["changed"]:
        while ((id(zeroing), region) not in _REACHED["seen"] and not _DRAINING.is_set()
               and time.monotonic() < ends):
            _REACHED["changed"].wait(0.005)


def _zeroing_before_copies() -> None:
    """by region: each region is zeroed where zero_grad_buffer asks for it, before the copies that read it (which the
    copy thread enqueues only once the zeroing was asked for)."""
    from mbridge_offload.runtime import gradient_copies, grad_regions

    library_ask, library_issue = grad_regions.RegionZeroing.ask, gradient_copies.GradientCopies.issue

    def ask(self, event):
        self.reading = set()
        library_ask(self, event)

    def issue(self, *args, **kwargs):
        for zeroing in self.zeroings:
            _until_asked(zeroing)
        library_issue(self, *args, **kwargs)

    grad_regions.RegionZeroing.ask, gradient_copies.GradientCopies.issue = ask, issue


BREAKS["region-no-wait"] = _zeroing_without_waits
BREAKS["region-zero-before-copies"] = _zeroing_before_copies
BREAKS["no-load"] = _no_load
BREAKS["region-zero-only-after-update"] = _zeroing_only_after_an_update


def _broken(name, target):
    def run(*args):
        BREAKS[name]()
        target(*args)
    return run


def gap_scenarios(args: tuple, ranks: str = "2 ranks") -> list:
    """by region, layers without a gradient in some steps and a second zero_grad_buffer (``_by_region``'s gaps), one
    bucket per buffer: the regions those layers fill alone are waited for only by the gradient sync. (No broken
    variant: without that wait the sync would read such a region before its memsets, but on the stand-in the step's
    drain issues every memset before the norm and the copies read it, and the region is zero either way.)"""
    return [(f"{ranks}, fraction 1, layers without a gradient, zeroed twice, one bucket, by region, slow copies", 2,
             args, None, None)]


def run_scenarios(case, scenarios) -> bool:
    """Each (label, ranks, case arguments, break or None, the check it must fail or None) as its own set of rank
    processes; one line per scenario. True when every correct one passed and every broken one failed its check
    (broken by a BREAKS entry, or by its case arguments where the break is None and a check is named)."""
    import time

    ok = True
    for label, world, args, broken, expected in scenarios:
        started = time.time()
        target = _broken(broken, case) if broken else case
        result = outcome(run_ranks(target, world, args))
        good = result == "passed" if expected is None else (result != "passed" and f"{expected}:" in result)
        ok &= good
        print(f"{'OK' if good else 'WRONG'} [{time.time() - started:.1f}s] {label}: {result}", flush=True)
    return ok


COPIES_AT_NEXT_STEP_LINE = "the delayed engine's gradient copies: handed over at the next step's zeroing"


def main(argv: list[str]) -> int:
    what = argv[0] if argv else "ranks"
    ok = True
    if streaming_engine._STATE["copies_at_next_step"]:  # every rank's steps check it (train_and_check_any_engine)
        print(COPIES_AT_NEXT_STEP_LINE, flush=True)
    if what == "ranks":
        scenarios = [("2 ranks, fraction 0.6, overlapped all-gather", 2, (0.6, True, True), None, None),
                     ("2 ranks, fraction 1, all-gather in the step", 2, (1.0, False, False), None, None),
                     ("4 ranks, fraction 1, overlapped all-gather", 4, (1.0, True, False), None, None),
                     ("2 ranks, broken: no-gather-gate", 2, (1.0, True, False), "no-gather-gate", "forward-weights")]
        ok &= run_scenarios(ranks_case, scenarios)
        ok &= run_scenarios(experts_case, EXPERT_SCENARIOS)
        ok &= run_scenarios(pipeline_case, PIPELINE_SCENARIOS)
        ok &= run_scenarios(skipped_step_case, SKIPPED_STEP_SCENARIOS)
    if what in ("ranks", "fetch-ahead"):
        for case, scenarios in FETCH_AHEAD_SCENARIOS:
            ok &= run_scenarios(case, scenarios)
    if what == "exact-ranks":
        scenarios = [("2 ranks, fraction 0.6, overlapped all-gather", 2, (0.6, True), None, None),
                     ("2 ranks, fraction 1, all-gather in the step", 2, (1.0, False), None, None),
                     ("2 ranks, broken: no-gather-gate, slow worker", 2, (1.0, True), "exact-no-gather-gate",
                      "forward-weights")]
        ok &= run_scenarios(exact_ranks_case, scenarios)
        ok &= run_scenarios(experts_case, EXPERT_SCENARIOS)
        ok &= run_scenarios(pipeline_case, PIPELINE_SCENARIOS)
        ok &= run_scenarios(skipped_step_case, SKIPPED_STEP_SCENARIOS)
        ok &= run_resume_scenarios(engine_resume_case, ENGINE_RESUME_SCENARIOS)
    if what == "delayed-ranks":
        scenarios = [("2 ranks, fraction 0.6, overlapped all-gather, drained", 2, (0.6, True, "drain"), None, None),
                     ("2 ranks, fraction 1, all-gather in the step, drained", 2, (1.0, False, "drain"), None, None),
                     ("2 ranks, fraction 1, overlapped all-gather, Bridge's parameter sync", 2,
                      (1.0, True, "param-sync"), None, None),
                     ("2 ranks, broken: no-gather", 2, (1.0, False, "drain"), "delayed-no-gather", "applied-weights")]
        ok &= run_scenarios(delayed_ranks_case, scenarios)
        ok &= run_scenarios(experts_case, EXPERT_SCENARIOS)
        ok &= run_scenarios(pipeline_case, PIPELINE_SCENARIOS)
        ok &= run_scenarios(skipped_step_case, SKIPPED_STEP_SCENARIOS)
        ok &= run_resume_scenarios(engine_resume_case, ENGINE_RESUME_SCENARIOS)
    if what == "exact-by-region":
        # slow copies only with the all-gather overlapped with the forward: with it in the step, the step waits for
        # this rank's update, which waits for its copies, which the slow copy thread holds until the next step
        ok &= run_scenarios(_by_region(exact_ranks_case), [
            ("2 ranks, fraction 0.6, overlapped all-gather, by region", 2, (0.6, True), None, None),
            ("2 ranks, fraction 1, all-gather in the step, by region", 2, (1.0, False), None, None)])
        ok &= run_scenarios(_by_region(exact_ranks_case, slow=True), [
            ("2 ranks, fraction 1, overlapped all-gather, by region, slow copies", 2, (1.0, True), None, None),
            # (no break without the backward's waits here: the forward's gates wait for every chunk's update, which
            # follows its copies, so the memsets before the last region's are issued before the backward anyway)
            ("2 ranks, broken: region-zero-before-copies", 2, (1.0, True), "region-zero-before-copies",
             "forward-weights")])
        ok &= run_scenarios(_by_region(exact_ranks_case, slow=True, region_bytes=2**20), [
            ("2 ranks, fraction 1, regions inside the buckets, slow copies", 2, (1.0, True), None, None)])
        # (exact_ranks_case checks the all-gather gates of several bucket groups: one bucket here, so the experts')
        ok &= run_scenarios(_by_region(experts_case, slow=True, region_bytes=2**20, overlap_grad_reduce=False), [
            ("2 ranks, EP 2, fraction 1, one bucket reduced at the end, slow copies", 2, (1.0, True, 2), None, None)])
        ok &= run_scenarios(_by_region(experts_case, slow=True), [
            (f"{label}, by region, slow copies", *rest) for label, *rest in EXPERT_SCENARIOS if rest[1][1]])
        ok &= run_scenarios(_by_region(experts_case), [
            (f"{label}, by region", *rest) for label, *rest in EXPERT_SCENARIOS if not rest[1][1]])
        ok &= run_scenarios(_by_region(pipeline_case, slow=True), [
            (f"{label}, by region, slow copies", *rest) for label, *rest in PIPELINE_SCENARIOS])
        # (the experts' case: exact_ranks_case checks the all-gather gates of several bucket groups)
        ok &= run_scenarios(_by_region(experts_case, slow=True, region_bytes=2**20, overlap_grad_reduce=False,
                                       gaps=True), gap_scenarios((1.0, True, 2), "2 ranks, EP 2"))
        ok &= run_scenarios(_by_region(skipped_step_case), BY_REGION_SKIPPED_STEP_SCENARIOS)
        ok &= run_resume_scenarios(_by_region(engine_resume_case), BY_REGION_RESUME_SCENARIOS)
    if what == "delayed-by-region":
        ok &= run_scenarios(_by_region(delayed_ranks_case), [
            ("2 ranks, fraction 0.6, overlapped all-gather, drained, by region", 2, (0.6, True, "drain"), None,
             None)])
        ok &= run_scenarios(_by_region(delayed_ranks_case, slow=True), [
            ("2 ranks, fraction 1, all-gather in the step, drained, by region, slow copies", 2, (1.0, False, "drain"),
             None, None),
            ("2 ranks, broken: region-no-wait", 2, (1.0, False, "drain"), "region-no-wait", "forward-weights"),
            ("2 ranks, broken: region-zero-before-copies", 2, (1.0, False, "drain"), "region-zero-before-copies",
             "forward-weights")])
        ok &= run_scenarios(_by_region(delayed_ranks_case, slow=True, region_bytes=2**20), [
            ("2 ranks, fraction 1, regions inside the buckets, slow copies", 2, (1.0, True, "param-sync"), None,
             None)])
        ok &= run_scenarios(_by_region(delayed_ranks_case, slow=True, region_bytes=2**20, overlap_grad_reduce=False),
                            [("2 ranks, fraction 1, one bucket reduced at the end, slow copies", 2, (1.0, False, "drain"),
                              None, None)])
        ok &= run_scenarios(_by_region(experts_case, slow=True), [
            (f"{label}, by region, slow copies", *rest) for label, *rest in EXPERT_SCENARIOS])
        ok &= run_scenarios(_by_region(pipeline_case, slow=True), [
            (f"{label}, by region, slow copies", *rest) for label, *rest in PIPELINE_SCENARIOS])
        ok &= run_scenarios(_by_region(delayed_ranks_case, slow=True, region_bytes=2**20, overlap_grad_reduce=False,
                                       gaps=True), gap_scenarios((1.0, False, "drain")))
        ok &= run_scenarios(_by_region(skipped_step_case), BY_REGION_SKIPPED_STEP_SCENARIOS)
        ok &= run_resume_scenarios(_by_region(engine_resume_case), BY_REGION_RESUME_SCENARIOS)
    if what == "bf16-moments":
        ok &= run_scenarios(bf16_moments_case, BF16_SCENARIOS)
        ok &= run_scenarios(_with_fetch_ahead(bf16_moments_case, fetching_steps=BF16_STEPS - 2),
                             BF16_FETCH_AHEAD_SCENARIOS)
        ok &= run_resume_scenarios(bf16_resume_case, [
            *((label, (saved, loaded), None, None) for label, saved, loaded in BF16_RESUME_SCENARIOS),
            *((label, (saved, loaded), broken, expected)
              for label, saved, loaded, broken, expected in BF16_RESUME_BROKEN)])
    if what == "resume":
        # the broken ones are broken by their arguments (the adoption disabled after the build)
        ok &= run_resume_scenarios(resume_case, [
            ("2 ranks, Megatron's load into a new model and optimizer", (True, "megatron", True), None, None),
            ("2 ranks, Megatron's load into the running optimizer", (False, "megatron", True), None, None),
            ("2 ranks, torch's load_state_dict into a new optimizer", (True, "torch", True), None, None),
            ("2 ranks, broken: no adoption after Megatron's load", (True, "megatron", False), None,
             "resume-forward-weights"),
            ("2 ranks, broken: no adoption after torch's load", (True, "torch", False), None,
             "resume-forward-weights")])
    print("ALL OK" if ok else "FAILED", flush=True)
    return 0 if ok else 1

