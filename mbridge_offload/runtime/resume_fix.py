"""Resume fix for megatron-core 0.19.2 HybridDeviceOptimizer (optimizer CPU offload) + DistributedOptimizer.

``install_resume_fix()`` patches, idempotently and at runtime (no site-packages edits):

* ``HybridDeviceOptimizer`` load hooks: the stock post-hook rebuilds every CPU copy and sub-optimizer
  (``_init_sub_optimizers``) and then looks each state key up in ``param_to_fp32_param``, which is empty
  when the HDO params are already fp32 (the default, ``use_precision_aware_optimizer=False``):
  ``KeyError: tensor([...])``. The replacement keeps the CPU copies and sub-optimizers (the parameters
  are the same objects before and after a load), lets torch cast loaded state straight to the device of
  the tensor each sub-optimizer steps (CPU for offloaded params, so Adam state never lands on the GPU),
  re-points the sub-optimizer states at HDO's state, and sets the Adam step counters. On an HDO marked by
  ``keep_state_dtypes_through_load`` (the stream engine's bf16 moments) the states keep their dtype instead.
* ``HybridDeviceOptimizer._update_fp32_params_by_new_state``: ``.get`` instead of ``[]`` (upstream #5929).
* ``DistributedOptimizer._set_main_param_and_optimizer_states``: never copies ``step`` from the loaded
  param state (dp_reshardable keeps the *template's* step as a LocalNonpersistentObject: step reset to 1;
  fully_reshardable / fully_sharded_model_space leave it out: ``KeyError: 'step'``).
* ``DistributedOptimizer.load_state_dict``: afterwards copies the loaded fp32 master into the tensors the
  sub-optimizers step (CPU copies / fp32 copies), restores the step counter from the checkpoint's
  ``param_groups`` and marks the optimizer so that Bridge's
* ``sync_hybrid_device_optimizer_fp32_master_copies`` (called by Bridge 0.6.2 setup after *every* load)
  does not overwrite the just-loaded fp32 masters with the bf16 model weights on a full resume.
* torch safe globals: the sub-optimizer classes, so a fully_reshardable checkpoint's common state loads.

Call it before the optimizer is built (e.g. next to ``use_chunked_overlap``); calling it later works too:
existing HDO instances get their hooks swapped on their first load.
"""

from __future__ import annotations

from collections import defaultdict

import torch

_MARK = "_resume_fix_installed"
# set on a HybridDeviceOptimizer whose states keep their own dtype across a load (keep_state_dtypes_through_load)
KEEPS_STATE_DTYPES = "_mbridge_keeps_state_dtypes"
_LOADED = "_resume_fix_loaded_optimizer_state"
_originals: dict = {}


class _NoneForMissing(dict):
    def __missing__(self, key):
        return None


def _keeps_per_param_step(sub) -> bool:
    # torch.optim Adam/AdamW keep state['step'] per parameter; TE/apex FusedAdam keep group['step'].
    return isinstance(sub, (torch.optim.Adam, torch.optim.AdamW))


def _saved_step(param_groups):
    steps = {g["step"] for g in param_groups if g.get("step") is not None}
    if len(steps) > 1:
        raise ValueError(f"optimizer param_groups disagree on 'step': {steps}")
    return int(steps.pop()) if steps else None


def _rebind_sub_optimizer_state(hdo, step):
    """Make every sub-optimizer's state the HDO state of its parameter (shared dicts, as after a normal
    step), on the device of the tensor it steps (and in its dtype, unless the HDO keeps its states' own:
    ``KEEPS_STATE_DTYPES``), with master_param = that tensor and the step set."""
    keep_dtype = getattr(hdo, KEEPS_STATE_DTYPES, False)
    for sub in hdo.sub_optimizers:
        per_param_step = _keeps_per_param_step(sub)
        new_state = defaultdict(dict)
        for group in sub.param_groups:
            for inner in group["params"]:
                orig = hdo.inner_param_to_orig_param[inner]
                if orig not in hdo.state:
                    continue
                st = hdo.state[orig]
                for key, value in list(st.items()):
                    if key in ("master_param", "step") or not isinstance(value, torch.Tensor):
                        continue
                    dtype = value.dtype if keep_dtype else inner.dtype
                    if value.device != inner.device or value.dtype != dtype:
                        st[key] = value.to(device=inner.device, dtype=dtype)
                if hdo.param_update_in_fp32:
                    st["master_param"] = inner
                if step is not None:
                    if per_param_step:
                        st["step"] = torch.tensor(float(step), dtype=torch.float32, device=(
                            inner.device if group.get("fused") or group.get("capturable") else "cpu"))
                    else:
                        st.pop("step", None)
                new_state[inner] = st
        sub.state = new_state
        if step is not None and not per_param_step:
            for group in sub.param_groups:
                group["step"] = step


def keep_state_dtypes_through_load(hdo) -> None:
    """Make ``hdo``'s loads keep each state tensor's dtype where it differs from its parameter's (the stream engine's
    bf16 moments). torch's Optimizer.load_state_dict casts each state to its parameter's dtype
    (_process_value_according_to_param_policy), and the rebinding after it to the CPU copy's: with bf16 moments that is
    a new fp32 copy of every moment, 8 bytes per offloaded parameter more on the host at each load. Megatron's load
    passes the states themselves (the engine's bf16 buffers) and then copies the checkpoint into whatever the states
    are: kept, the copy goes straight into those buffers. The load hooks below do it; this marks the HDO."""
    setattr(hdo, KEEPS_STATE_DTYPES, True)


class _Uncast:
    """A state tensor passed through torch's load_state_dict as it is: torch copies what is not a tensor uncast."""

    __slots__ = ("tensor",)

    def __init__(self, tensor) -> None:
        self.tensor = tensor


def _uncast(name, value):
    low = (isinstance(value, torch.Tensor) and name != "step" and value.is_floating_point()
           and value.dtype != torch.float32)
    return _Uncast(value) if low else value


def _pre_load_hook(hdo, state_dict):
    # Let torch cast the loaded state to the dtype *and device* of the tensor each sub-optimizer steps (its dtype not
    # where the HDO keeps the states' own: keep_state_dtypes_through_load).
    to_inner = hdo.param_to_inner_param
    hdo.state = defaultdict(dict, {to_inner.get(p, p): v for p, v in hdo.state.items()})
    for group in hdo.param_groups:
        group["params"] = [to_inner.get(p, p) for p in group["params"]]
    if getattr(hdo, KEEPS_STATE_DTYPES, False):
        # new dicts (torch copied only the outer one): Megatron passes the optimizer's own states, which keep theirs
        state_dict["state"] = {key: {name: _uncast(name, value) for name, value in state.items()}
                               if isinstance(state, dict) else state for key, state in state_dict["state"].items()}
    return state_dict


def _post_load_hook(hdo):
    to_orig = hdo.inner_param_to_orig_param
    hdo.state = defaultdict(dict, {to_orig.get(p, p): v for p, v in hdo.state.items()})
    for state in hdo.state.values():
        for name, value in list(state.items()):
            if isinstance(value, _Uncast):
                state[name] = value.tensor
    for group in hdo.param_groups:
        group["params"] = [to_orig.get(p, p) for p in group["params"]]
    # The step lives in the sub-optimizers; a 'step' left in HDO's groups would be copied into the GPU
    # FusedAdam's groups at every step() and freeze its bias correction.
    step = _saved_step(hdo.param_groups)
    for group in hdo.param_groups:
        group.pop("step", None)
    params = [p for g in hdo.param_groups for p in g["params"]]
    if len(params) != len(hdo.param_to_inner_param) or any(p not in hdo.param_to_inner_param for p in params):
        hdo._init_sub_optimizers()  # parameters really changed: rebuild, as upstream does
    hdo._sync_hdo_param_groups_to_sub_optimizers()
    _rebind_sub_optimizer_state(hdo, step)


def _install_hooks(hdo):
    if hdo.__dict__.get("_resume_fix_hooks"):
        return
    hdo._optimizer_load_state_dict_pre_hooks.clear()
    hdo._optimizer_load_state_dict_post_hooks.clear()
    hdo.register_load_state_dict_pre_hook(_pre_load_hook)
    hdo.register_load_state_dict_post_hook(_post_load_hook)
    hdo._resume_fix_hooks = True


def _update_fp32_params_by_new_state(self):
    if not self.param_update_in_fp32:
        return
    for param, v in self.state.items():
        fp32_param = self.param_to_fp32_param.get(param)  # absent for params that are already fp32
        master = v.get("master_param")
        if fp32_param is not None and master is not None and master is not fp32_param:
            fp32_param.data.copy_(master)


@torch.no_grad()
def _finalize_after_load(hdo, step):
    for orig, inner in hdo.param_to_inner_param.items():
        if inner is orig or orig not in hdo.state:
            continue
        if orig.dtype == inner.dtype:  # fp32 main param on GPU -> its CPU copy
            inner.copy_(orig)
        else:  # precision-aware: bf16 shard; the fp32 master was loaded into state['master_param']
            master = hdo.state[orig].get("master_param")
            if isinstance(master, torch.Tensor) and master is not inner:
                inner.copy_(master)
    _rebind_sub_optimizer_state(hdo, step)


def install_resume_fix() -> None:
    from megatron.core.optimizer.cpu_offloading.hybrid_optimizer import HybridDeviceOptimizer as HDO
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer as DO

    if getattr(HDO, _MARK, False):
        return
    _originals.update(
        hdo_register=HDO._register_load_state_dict_hooks,
        do_load=DO.load_state_dict,
        do_set=DO._set_main_param_and_optimizer_states,
    )

    def _register_load_state_dict_hooks(self):
        _install_hooks(self)

    def _set_main_param_and_optimizer_states(self, model_param, tensors):
        if isinstance(self.optimizer, HDO):
            tensors = _NoneForMissing(tensors)
            tensors["step"] = None  # restored from param_groups in load_state_dict below
        return _originals["do_set"](self, model_param, tensors)

    def load_state_dict(self, state_dict):
        hdo = self.optimizer
        if not isinstance(hdo, HDO) or self.ddp_config.use_megatron_fsdp:
            return _originals["do_load"](self, state_dict)
        _install_hooks(hdo)
        _originals["do_load"](self, state_dict)
        _finalize_after_load(hdo, _saved_step(state_dict["optimizer"]["param_groups"]))
        if "param_state" in state_dict:
            setattr(self, _LOADED, True)

    HDO._register_load_state_dict_hooks = _register_load_state_dict_hooks
    HDO._update_fp32_params_by_new_state = _update_fp32_params_by_new_state
    DO._set_main_param_and_optimizer_states = _set_main_param_and_optimizer_states
    DO.load_state_dict = load_state_dict
    _patch_bridge_sync()
    _allow_optimizer_classes_in_common_state()
    setattr(HDO, _MARK, True)


def _allow_optimizer_classes_in_common_state() -> None:
    """HDO's defaults (cpu_optimizer_cls / gpu_optimizer_cls: classes) end up in param_groups. With
    dist_ckpt_optim_fully_reshardable=True they are saved in the common state, which dist_checkpointing
    reads with torch.load(weights_only=True): UnpicklingError on resume. (dp_reshardable, the default,
    stores them in a ShardedObject read with weights_only=False.)"""
    classes = [torch.optim.AdamW, torch.optim.Adam, torch.optim.SGD]
    try:
        from transformer_engine.pytorch.optimizers import FusedAdam, FusedSGD
        classes += [FusedAdam, FusedSGD]
    except ImportError:
        pass
    torch.serialization.add_safe_globals(classes)


def _patch_bridge_sync() -> None:
    """Bridge 0.6.2 setup() calls sync_hybrid_device_optimizer_fp32_master_copies after every checkpoint
    load; on a full resume it would overwrite the loaded fp32 masters with bf16(model). Skip it for
    DistributedOptimizers that just loaded their optimizer state; keep it for model-only loads."""
    try:
        import megatron.bridge.training.optim as b_optim
        import megatron.bridge.training.setup as b_setup
    except ImportError:
        return
    original = b_optim.sync_hybrid_device_optimizer_fp32_master_copies
    if getattr(original, "_resume_fix", False):
        return

    def sync_hybrid_device_optimizer_fp32_master_copies(optimizer):
        subs = getattr(optimizer, "chained_optimizers", None) or [optimizer]
        if any([s.__dict__.pop(_LOADED, False) for s in subs if s is not None]):
            return False  # full resume: the fp32 masters (and CPU copies) came from the checkpoint
        return original(optimizer)

    sync_hybrid_device_optimizer_fp32_master_copies._resume_fix = True
    b_optim.sync_hybrid_device_optimizer_fp32_master_copies = sync_hybrid_device_optimizer_fp32_master_copies
    b_setup.sync_hybrid_device_optimizer_fp32_master_copies = sync_hybrid_device_optimizer_fp32_master_copies
