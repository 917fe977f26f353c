"""CPU check of the HDO resume path with megatron-core 0.19.2's real HybridDeviceOptimizer and the real
DistributedOptimizer methods (state_dict, load_state_dict, get_parameter_state_dp_reshardable,
load_parameter_state_from_dp_reshardable, _get/_set_main_param_and_optimizer_states) on a stand-in
DistributedOptimizer object. "GPU" tensors are CPU tensors that HDO is told to treat as device tensors;
CUDA streams are stubbed. The GPU sub-optimizer is a group-step Adam like TE FusedAdam.

Run by tests/runtime/test_resume_fix.py in a subprocess of its own (it stubs torch's CUDA streams and
pinning for the whole process). Prints one line per case and ALL OK or FAILED; exit 0 only when all pass.
The GPU evidence is docs/benchmarks/resume-parity/ (the real stack, the real checkpoint files).

usage: python resume_fix_cpu_check.py [--nofix] [--getonly] [--chunks K] [--cross] [--bridge] [--pao]
"""
import contextlib
import copy
import sys
import types

import torch

# ---- stubs: no CUDA here ----------------------------------------------------------------------------
class _Ev:
    def synchronize(self): pass
    def wait(self, *a): pass
class _St:
    def __init__(self, *a, **k): pass
    def wait_stream(self, *a): pass
    def record_event(self, *a): return _Ev()
torch.cuda.current_stream = lambda *a, **k: _St()
torch.cuda.Stream = _St
torch.cuda.stream = lambda *a, **k: contextlib.nullcontext()
torch.Tensor.pin_memory = lambda self, *a, **k: self

from megatron.core.optimizer.cpu_offloading import hybrid_optimizer as ho
from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer, Range

FAKE_CUDA = set()
PAO = "--pao" in sys.argv  # precision-aware: HDO params are the bf16 shards themselves  # ids of tensors that stand for GPU tensors


class TestHDO(ho.HybridDeviceOptimizer):
    def _get_sub_optimizer_param_groups(self, offload_fraction):  # upstream code, is_cuda -> FAKE_CUDA
        params = [p for g in self.param_groups for p in g["params"]]
        gpu_numel = sum(p.numel() for p in params if id(p) in FAKE_CUDA)
        threshold, offloaded = gpu_numel * offload_fraction, 0
        cpu_groups, gpu_groups, g2c, c2g, p2f = [], [], {}, {}, {}
        for group in self.param_groups:
            gg, cg = dict(group, params=[]), dict(group, params=[])
            for param in group["params"]:
                orig, cpu_copy = param, False
                if offloaded < threshold and id(param) in FAKE_CUDA:
                    param = param.detach().clone()
                    offloaded += param.numel(); cpu_copy = True
                if self.param_update_in_fp32 and param.dtype != torch.float32:
                    param = param.detach().clone().float(); p2f[orig] = param
                    if not cpu_copy: FAKE_CUDA.add(id(param))
                if cpu_copy:
                    g2c[orig] = param; c2g[param] = orig
                (gg if id(param) in FAKE_CUDA else cg)["params"].append(param)
            if gg["params"]: gpu_groups.append(gg)
            if cg["params"]: cpu_groups.append(cg)
        return cpu_groups, gpu_groups, g2c, c2g, p2f


class GroupStepAdam(torch.optim.Optimizer):
    """Like TE FusedAdam (adam_w_mode): step counter in param_groups, state exp_avg/exp_avg_sq."""
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, **kw):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        for g in self.param_groups:
            g["step"] = g.get("step", 0) + 1
            t, (b1, b2) = g["step"], g["betas"]
            for p in g["params"]:
                if p.grad is None: continue
                st = self.state[p]
                if "exp_avg" not in st:
                    st["exp_avg"], st["exp_avg_sq"] = torch.zeros_like(p), torch.zeros_like(p)
                p.mul_(1 - g["lr"] * g["weight_decay"])
                st["exp_avg"].lerp_(p.grad, 1 - b1)
                st["exp_avg_sq"].mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
                denom = (st["exp_avg_sq"] / (1 - b2 ** t)).sqrt_().add_(g["eps"])
                p.addcdiv_(st["exp_avg"], denom, value=-g["lr"] / (1 - b1 ** t))


SIZES = [(64,), (32, 8), (100,), (16, 16), (7,), (48,)]


def build(fraction, overlap, seed):
    """Model params, fp32 main shards (HDO params), HDO and a stand-in DistributedOptimizer."""
    g = torch.Generator().manual_seed(seed)
    model = [torch.randn(*s, generator=g).bfloat16() for s in SIZES]
    mains = ([m.view(-1) for m in model] if PAO else [m.float().view(-1).clone() for m in model])
    for m in mains: FAKE_CUDA.add(id(m))
    groups = [dict(params=mains[:4], wd_mult=1.0, lr_mult=1.0, is_expert_parallel=False,
                   is_decoupled_lr=False, max_lr=1e-2, min_lr=1e-3, default_config=True),
              dict(params=mains[4:], wd_mult=0.0, lr_mult=1.0, is_expert_parallel=False,
                   is_decoupled_lr=False, max_lr=1e-2, min_lr=1e-3, default_config=False)]
    for grp in groups: grp["weight_decay"] = 0.1 * grp["wd_mult"]
    hdo = TestHDO(groups, offload_fraction=fraction, cpu_optimizer_cls=torch.optim.AdamW,
                  gpu_optimizer_cls=GroupStepAdam, overlap_cpu_optimizer_d2h_h2d=overlap,
                  param_update_in_fp32=True, pin_cpu_grads=False, lr=1e-2, weight_decay=0.1, betas=(0.9, 0.95), eps=1e-8,
                  bias_correction=True, fused=True)
    do = DistributedOptimizer.__new__(DistributedOptimizer)
    do.optimizer, do.grad_scaler = hdo, None
    do.ddp_config = types.SimpleNamespace(use_megatron_fsdp=False)
    do.config = types.SimpleNamespace(use_precision_aware_optimizer_no_fp8_or_ds_fp8=PAO, fp16=False)
    param_map, off, index_map = {}, 0, {}
    for i, mp in enumerate(model):
        n = mp.numel()
        param_map[mp] = {"gbuf_local": Range(off, off + n), "gbuf_world": Range(off, off + n),
                         "param": Range(0, n)}
        index_map[mp] = (0, i) if i < 4 else (1, i - 4)
        off += n
    do.gbuf_ranges = [{(torch.bfloat16, torch.float32): [{"param_map": param_map}]}]
    do.model_param_group_index_map = index_map
    do.per_bucket_numel = do.per_bucket_numel_unpadded = [{(torch.bfloat16, torch.float32): [off]}]
    return model, mains, hdo, do


def train(model, mains, hdo, start, stop):
    for it in range(start, stop):
        for g in hdo.param_groups:
            g["lr"] = 1e-2 * (0.97 ** it)
        for j, m in enumerate(mains):
            grad = torch.sin(torch.arange(m.numel(), dtype=torch.float32) * (it + 1) + j)
            if PAO:
                m.decoupled_grad = grad
            else:
                m.grad = grad
        hdo.step()
        hdo.zero_grad()
        if not PAO:
            for mp, m in zip(model, mains):
                mp.copy_(m.view_as(mp))  # DO: main -> model


def save(do):
    """dp_reshardable-like checkpoint: common state + clones of the per-param tensors (no 'step')."""
    common = copy.deepcopy(do.state_dict())
    ps = do.get_parameter_state_dp_reshardable()
    saved = [[{k: v.detach().clone() for k, v in t.items() if isinstance(v, torch.Tensor) and k != "step"}
              for t in bucket] for bucket in ps[0][(torch.bfloat16, torch.float32)]]
    return common, saved


def load(do, ckpt):
    common, saved = ckpt
    # 1. DistributedOptimizer.sharded_state_dict(is_loading=True): round trip + load template
    do.load_state_dict(do.state_dict())
    tmpl = do.get_parameter_state_dp_reshardable()
    # 2. dist_checkpointing fills the ShardedTensors; 'step' and 'padding' are LocalNonpersistentObjects
    for bucket_t, bucket_s in zip(tmpl[0][(torch.bfloat16, torch.float32)], saved):
        for t, s in zip(bucket_t, bucket_s):
            t.pop("gbuf_local_start"); t.pop("gbuf_local_end"); t["padding"] = False
            for k in s: t[k] = s[k].clone()
    # 3. Bridge: optimizer.load_state_dict(state_dict['optimizer'])
    with torch.no_grad():
        do.load_state_dict({**copy.deepcopy(common), "param_state": tmpl,
                            "param_state_sharding_type": "dp_reshardable"})


def snapshot(model, mains, hdo):
    out = {"model": [m.clone() for m in model], "main": [m.clone() for m in mains],
           "inner": [hdo.param_to_inner_param[m].clone() for m in mains], "state": {}, "gpu_steps": []}
    for i, m in enumerate(mains):
        st = hdo.state[m]
        out["state"][i] = {k: v.clone() for k, v in st.items() if k in ("exp_avg", "exp_avg_sq", "step")}
    if hdo.gpu_optimizer is not None:
        out["gpu_steps"] = [g.get("step") for g in hdo.gpu_optimizer.param_groups]
    return out


def same(a, b, path=""):
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and torch.equal(a.float(), b.float()) or print("DIFF", path, a.flatten()[:3], b.flatten()[:3])
    if isinstance(a, dict):
        return all([same(a[k], b[k], f"{path}.{k}") for k in a]) and a.keys() == b.keys() or print("KEYS", path)
    if isinstance(a, list):
        return len(a) == len(b) and all([same(x, y, f"{path}[{i}]") for i, (x, y) in enumerate(zip(a, b))])
    return a == b or print("DIFF", path, a, b)


def cross(save_fraction, load_fraction, n=5):
    """Save with one offload fraction, load with another: the loaded state must equal the saved one."""
    FAKE_CUDA.clear()
    a = build(save_fraction, True, seed=0)
    train(*a[:3], 0, n)
    want = snapshot(*a[:3]); want["gpu_steps"] = None
    ckpt = save(a[3])
    b = build(load_fraction, True, seed=1)
    load(b[3], ckpt)
    for mp, ms in zip(b[0], a[0]):
        mp.copy_(ms)  # model weights come from the checkpoint's model part
    got = snapshot(*b[:3]); got["gpu_steps"] = None
    for st in list(want["state"].values()) + list(got["state"].values()):
        st.pop("step", None)  # per-param only where torch AdamW holds the param
    ok = bool(same(want, got))
    steps = {int(s["step"]) for s in b[2].state.values() if "step" in s}
    gsteps = [g.get("step") for g in b[2].gpu_optimizer.param_groups] if b[2].gpu_optimizer else []
    print(f"save fraction={save_fraction} -> load fraction={load_fraction}: state equal={ok} "
          f"cpu_step={steps} gpu_group_step={gsteps}")
    return ok


def case(fraction, overlap, n=5, m=4):
    FAKE_CUDA.clear()
    ref = build(fraction, overlap, seed=0)
    train(*ref[:3], 0, n + m)
    want = snapshot(*ref[:3])
    a = build(fraction, overlap, seed=0)
    train(*a[:3], 0, n)
    ckpt = save(a[3])
    b = build(fraction, overlap, seed=1)  # a fresh process: different init
    load(b[3], ckpt)
    for mp, ms in zip(b[0], a[0]):
        mp.copy_(ms)  # model weights from the checkpoint's model part
    train(*b[:3], n, n + m)
    got = snapshot(*b[:3])
    ok = same(want, got)
    cpu_steps = {int(s["step"]) for s in got["state"].values() if "step" in s}
    print(f"fraction={fraction} overlap={overlap}: bit-exact={bool(ok)} cpu_step={cpu_steps} "
          f"gpu_group_step={got['gpu_steps']}")
    return bool(ok)


if __name__ == "__main__":
    if "--chunks" in sys.argv:
        from mbridge_offload.runtime.chunked_overlap import use_chunked_overlap
        use_chunked_overlap(int(sys.argv[sys.argv.index("--chunks") + 1]))
    if "--getonly" in sys.argv:  # only upstream #5929's .get(): no KeyError, but is it right?
        from mbridge_offload.runtime import resume_fix
        ho.HybridDeviceOptimizer._update_fp32_params_by_new_state = resume_fix._update_fp32_params_by_new_state
    elif "--nofix" not in sys.argv:
        from mbridge_offload.runtime.resume_fix import install_resume_fix
        install_resume_fix(); install_resume_fix()  # idempotent
    results = []
    for fraction in (0.5, 1.0):
        for overlap in (False, True):
            try:
                results.append(case(fraction, overlap))
            except Exception as e:
                print(f"fraction={fraction} overlap={overlap}: {type(e).__name__}: {str(e)[:120]}")
                results.append(False)
    if "--cross" in sys.argv:
        results += [cross(0.5, 1.0), cross(1.0, 0.5), cross(1.0, 0.25)]
    if "--bridge" in sys.argv:
        import megatron.bridge.training.setup as b_setup
        FAKE_CUDA.clear()
        a = build(0.5, True, seed=0); train(*a[:3], 0, 2); ckpt = save(a[3])
        b = build(0.5, True, seed=1); load(b[3], ckpt)
        flagged = b[3].__dict__.get("_resume_fix_loaded_optimizer_state")
        skipped = b_setup.sync_hybrid_device_optimizer_fp32_master_copies(b[3]) is False
        print(f"bridge sync: flagged={flagged} skipped={skipped} flag_cleared="
              f"{'_resume_fix_loaded_optimizer_state' not in b[3].__dict__}")
        results.append(bool(flagged and skipped))
    print("ALL OK" if all(results) else "FAILED")
    sys.exit(0 if all(results) else 1)
