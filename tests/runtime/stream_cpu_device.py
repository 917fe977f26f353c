"""A CPU stand-in for one CUDA device, so that the stream offload engine's CPU checks (stream_cpu_scenarios.py,
for tests/runtime/test_stream_ranks.py and test_stream_resume.py) run Megatron Core's real objects and the plugin's
real engine in a process without a GPU. ``install()`` changes torch for the whole process: use it only in a
process of its own, before anything imports Transformer Engine or Megatron.

What it replaces, and nothing else:

- **Device memory**: a tensor a factory puts on ``cuda`` (``device="cuda"``, ``device=0``, ``.cuda()``,
  ``.to("cuda")``) is a CPU tensor of the subclass ``DeviceTensor``, and so is everything computed from one
  (a view, a clone, a cast): it reports ``is_cuda`` and a ``torch.cuda.*`` type, as Megatron and the engine
  check. ``.cpu()``, ``.to("cpu")`` and ``pin_memory()`` give a plain host copy, as they do from a GPU. Results in
  an autograd graph (activations, the loss) stay plain tensors: wrapping them would put an alias node between a
  parameter and the gradient accumulator that Megatron's DDP hooks.
- **Streams and events** run nothing of their own: every copy and kernel runs when it is issued, in program
  order (the strictest order the engine's events can allow); a wait on something that is not an event is
  refused, as torch refuses it. ``record_stream`` does nothing.
- **Pinning** (``cudaHostRegister``, ``pin_memory=True``) succeeds without pinning.
- **An in-place all-gather over a group of one rank** (``all_gather_into_tensor``, Megatron's parameter all-gather
  of an expert-data-parallel group of one rank) does nothing, as NCCL's does. Gloo's stages it through a copy of the
  shard, taken and written back on its own thread: a write into the shard in between (the exact engine's cast of an
  update, which such an all-gather does not wait for: ``StreamingEngine.gate_param_gather``) would be undone.
- **Transformer Engine's CUDA kernels** that Megatron and the engine call (``multi_tensor_adam``,
  ``multi_tensor_l2norm``, ``multi_tensor_scale``): the same arithmetic in torch on the CPU (TE's ``FusedAdam``
  class, its Python part and its state handling are TE's own).

So the checks can see which tensor the engine reads and writes, the order of its work, its arithmetic and its
collectives (gloo); they cannot see overlap between streams, a missing or misplaced event wait (every wait is
satisfied at once), pinned-memory DMA, NCCL or the real kernels' rounding."""

from __future__ import annotations

import contextlib
import os
import sys

import torch
from torch.overrides import TorchFunctionMode

_IS_CUDA = torch._C.TensorBase.is_cuda
_PINNED = torch._C.TensorBase.is_pinned


def _is_device(device) -> bool:
    if device is None:
        return False
    if isinstance(device, int):
        return True
    return torch.device(device).type == "cuda"


def _host(tensor):
    """A plain host copy (``.cpu()`` of a GPU tensor)."""
    with torch._C.DisableTorchFunctionSubclass():
        return tensor.clone()


def _on_device(tensor):
    """``tensor`` as a ``DeviceTensor``: the same tensor (a new one keeps ``_base`` None, as Megatron checks; a
    view keeps its base). A result in an autograd graph (an activation) stays as it is: wrapping it would put an
    alias node in the graph, and Megatron's DDP finds each parameter's gradient accumulator through its graph."""
    if not isinstance(tensor, torch.Tensor) or isinstance(tensor, DeviceTensor) or tensor.requires_grad:
        return tensor
    if tensor._base is None:
        return torch.Tensor._make_subclass(DeviceTensor, tensor)
    return tensor.as_subclass(DeviceTensor)


def _all_on_device(value):
    if isinstance(value, torch.Tensor):
        return _on_device(value)
    if isinstance(value, (tuple, list)):
        return type(value)(_all_on_device(v) for v in value)
    return value


def _to_arguments(args, kwargs):
    """``Tensor.to``'s device and the arguments without it."""
    device, rest = kwargs.get("device"), []
    for arg in args[1:]:
        if isinstance(arg, (str, torch.device, int)) and not isinstance(arg, bool):
            device = arg
        else:
            rest.append(arg)
    return device, rest, {k: v for k, v in kwargs.items() if k != "device"}


class DeviceTensor(torch.Tensor):
    """A CPU tensor that stands for one on the GPU (see the module's docstring)."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__self__", None) is _IS_CUDA:
            return True
        if getattr(func, "__self__", None) is _PINNED or func is torch.Tensor.is_pinned:
            return False
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:
            with torch._C.DisableTorchFunctionSubclass():
                return args[0].type().replace("torch.", "torch.cuda.", 1)
        if func in (torch.Tensor.cpu, torch.Tensor.pin_memory):
            return _host(args[0])
        if func is torch.Tensor.cuda:
            return args[0]
        if func is torch.Tensor.to:
            device, rest, kw = _to_arguments(args, kwargs)
            if device is not None and not _is_device(device):  # to the host: always a copy, a plain tensor
                with torch._C.DisableTorchFunctionSubclass():
                    out = args[0].to(*rest, **kw)
                    return out.clone() if out.data_ptr() == args[0].data_ptr() else out
            args, kwargs = (args[0], *rest), kw
        with torch._C.DisableTorchFunctionSubclass():
            out = func(*args, **kwargs)
        if func in torch.overrides.get_default_nowrap_functions():
            return out
        if args and isinstance(args[0], torch.Tensor) and not isinstance(args[0], DeviceTensor):
            return out  # a host tensor's method (view_as, copy_ from the device): its result stays on the host
        return _all_on_device(out)


class _DeviceFactories(TorchFunctionMode):
    """Factories asked for ``cuda`` make ``DeviceTensor``s; host tensors moved to ``cuda`` become them; pinning
    is dropped (host memory is plain here)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func in (torch.Tensor.cuda,) and not isinstance(args[0], DeviceTensor):
            return _on_device(args[0].clone())
        if func is torch.Tensor.to and not isinstance(args[0], DeviceTensor):
            device, rest, kw = _to_arguments(args, kwargs)
            if _is_device(device):
                return _on_device(func(args[0], *rest, **kw).clone())
            return func(*args, **kwargs)
        if func is torch.Tensor.pin_memory and not isinstance(args[0], DeviceTensor):
            return args[0].clone()
        kwargs.pop("pin_memory", None)
        device = kwargs.get("device")
        if _is_device(device):
            kwargs["device"] = "cpu"
            out = func(*args, **kwargs)
            return _on_device(out) if isinstance(out, torch.Tensor) else out
        return func(*args, **kwargs)


class Event:
    def __init__(self, *args, **kwargs):
        pass

    def record(self, stream=None):
        return None

    def synchronize(self):
        return None

    def query(self):
        return True

    def wait(self, stream=None):
        return None

    def elapsed_time(self, other):
        return 0.0


class Stream:
    def __init__(self, *args, **kwargs):
        pass

    def wait_event(self, event):
        if not isinstance(event, Event):  # torch refuses it too (an update waited for before it was enqueued)
            raise TypeError(f"wait_event needs an event, got {type(event).__name__}")
        return None

    def wait_stream(self, stream):
        return None

    def record_event(self, event=None):
        return event or Event()

    def synchronize(self):
        return None

    def query(self):
        return True


_DEFAULT_STREAM = Stream()


class _Cudart:
    @staticmethod
    def cudaHostRegister(pointer, size, flags):
        return 0

    @staticmethod
    def cudaHostUnregister(pointer):
        return 0


# --- Transformer Engine's multi-tensor kernels, in torch on the CPU (the CUDA kernels' arithmetic, in fp32) ---
def multi_tensor_adam(chunk_size, noop_flag, tensor_lists, lr, beta1, beta2, eps, step, mode, bias_correction,
                      weight_decay, *rest):
    """transformer_engine/common/multi_tensor/adam.cu, ``AdamFunctor`` for fp32 [grads, params, exp_avgs,
    exp_avg_sqs]: mode 1 is AdamW (decoupled weight decay), mode 0 Adam with L2. The moments are fp32 or bf16 (both
    the same, as the kernel checks): read into fp32, updated and used in fp32, stored rounded to their dtype."""
    if rest or len(tensor_lists) != 4:
        raise NotImplementedError("the CPU stand-in covers fp32 parameters only")
    correction1 = 1 - beta1 ** step if bias_correction else 1.0
    correction2 = 1 - beta2 ** step if bias_correction else 1.0
    for grad, param, exp_avg, exp_avg_sq in zip(*tensor_lists):
        if param.dtype != torch.float32 or {exp_avg.dtype, exp_avg_sq.dtype} not in ({torch.float32},
                                                                                    {torch.bfloat16}):
            raise RuntimeError(f"the kernel takes fp32 parameters and fp32 or bf16 moments, both alike: got "
                               f"{param.dtype}, {exp_avg.dtype}, {exp_avg_sq.dtype}")
        grad = grad.float()
        if mode == 0:
            grad = grad + weight_decay * param
        m = exp_avg.float().mul(beta1).add_(grad, alpha=1 - beta1)
        v = exp_avg_sq.float().mul(beta2).addcmul_(grad, grad, value=1 - beta2)
        update = (m / correction1) / ((v / correction2).sqrt() + eps)
        if mode == 1:
            update = update + weight_decay * param
        param.sub_(lr * update)
        exp_avg.copy_(m)
        exp_avg_sq.copy_(v)


def multi_tensor_l2norm(chunk_size, noop_flag, tensor_lists, per_tensor, *args):
    """Summed in fp64 (torch's fp32 vector_norm on the CPU is off by ~1e-3 over millions of elements; the kernel's
    blockwise fp32 sums are not), returned in fp32 as the kernel returns it."""
    norms = [torch.linalg.vector_norm(t.double()) for t in tensor_lists[0]]
    total = torch.linalg.vector_norm(torch.stack(norms)) if norms else torch.zeros((), dtype=torch.float64)
    per = _on_device(torch.stack(norms).float()) if per_tensor else None
    return _on_device(total.float().reshape(1)), per


def multi_tensor_scale(chunk_size, noop_flag, tensor_lists, scale):
    for src, dst in zip(tensor_lists[0], tensor_lists[1]):
        dst.copy_(src * scale)


def multi_tensor_scale_tensor(chunk_size, noop_flag, tensor_lists, scale):
    multi_tensor_scale(chunk_size, noop_flag, tensor_lists, scale)


class _DoneWork:
    """The handle of a collective that had nothing to do."""

    def wait(self, timeout=None):
        return True

    def is_completed(self):
        return True


def _nccl_like_all_gather(all_gather_into_tensor):
    """``all_gather_into_tensor`` that leaves an in-place all-gather over one rank alone, as NCCL does (gloo copies
    the shard out and back on its thread, racing with writes into it)."""
    import functools

    import torch.distributed as dist

    @functools.wraps(all_gather_into_tensor)
    def all_gather(output_tensor, input_tensor, group=None, async_op=False):
        if dist.get_world_size(group) == 1 and output_tensor.data_ptr() == input_tensor.data_ptr():
            return _DoneWork() if async_op else None
        return all_gather_into_tensor(output_tensor, input_tensor, group=group, async_op=async_op)

    return all_gather


_INSTALLED = []


def install() -> None:
    """Put the stand-in in place for this process (see the module's docstring)."""
    if _INSTALLED:
        return
    os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "1")
    cuda = torch.cuda
    cuda.current_device = lambda: 0
    cuda.device_count = lambda: 1
    cuda.set_device = lambda device: None
    cuda.Stream = Stream
    cuda.Event = Event
    cuda.current_stream = lambda device=None: _DEFAULT_STREAM
    cuda.default_stream = lambda device=None: _DEFAULT_STREAM
    cuda.stream = lambda stream=None: contextlib.nullcontext()
    cuda.synchronize = lambda device=None: None
    cuda.empty_cache = lambda: None
    cuda.cudart = lambda: _Cudart
    cuda.nvtx.range_push = lambda *args, **kwargs: None
    cuda.nvtx.range_pop = lambda *args, **kwargs: None
    torch._C._host_emptyCache = lambda: None
    torch.Tensor.record_stream = lambda self, stream: None  # its argument parser refuses the stand-in stream
    import transformer_engine.pytorch.optimizers as te_optimizers  # binds the kernels by name: replaced in both
    import transformer_engine_torch as tex

    if "megatron.core.optimizer.clip_grads" in sys.modules:
        raise RuntimeError("install() must run before Megatron imports Transformer Engine's kernels")
    for kernel in (multi_tensor_adam, multi_tensor_l2norm, multi_tensor_scale, multi_tensor_scale_tensor):
        setattr(tex, kernel.__name__, kernel)
        setattr(te_optimizers, kernel.__name__, kernel)
    torch.distributed.all_gather_into_tensor = _nccl_like_all_gather(torch.distributed.all_gather_into_tensor)
    torch.serialization.add_safe_globals([DeviceTensor])  # a checkpoint holds "device" tensors
    _DeviceFactories().__enter__()
    _INSTALLED.append(True)
