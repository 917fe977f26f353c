"""run_recipe --warm-communicators: every NCCL group's communicator created before step 1, so that NCCL does not
allocate inside step 1 (docs/benchmarks/alloc-tight/). Each check runs in a process of its own: a process group
lives for the whole process."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from recipes import registry
from mbridge_offload.cli import run_recipe
from mbridge_offload.describe import offload_summary, topology
from mbridge_offload.runtime.launch import LaunchSettings, run_header


def _run(script: str) -> dict:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_groups_on_gloo_are_not_warmed_and_nccl_groups_would_be_found_by_backend():
    found = _run("""
        import json, socket
        import torch.distributed as dist
        from mbridge_offload.runtime.communicators import nccl_groups
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
        dist.new_group([0], group_desc="DATA_PARALLEL_GROUP_GLOO")
        print(json.dumps({"groups": len(nccl_groups())}))
    """)
    assert found == {"groups": 0}  # gloo groups also list CUDA among their devices: the backend decides


def test_the_flag_reaches_the_launch_and_the_run_header(tmp_path):
    args = run_recipe.build_parser().parse_args(["--recipe", "qwen3_1b_proxy_pretrain_config",
                                                 "--warm-communicators"])
    assert args.warm_communicators
    assert not run_recipe.build_parser().parse_args(["--recipe", "qwen3_1b_proxy_pretrain_config"]).warm_communicators
    cfg = registry.get("qwen3_1b_proxy_pretrain_config").build()

    def header(warm: bool) -> str:
        return run_header(cfg, LaunchSettings(
            recipe_name="qwen3_1b_proxy_pretrain_config", num_gpus=1, out_dir=tmp_path, cpu_threads="auto",
            tuning_lines=(), run_lines=(), overlap_chunks=None, topology=topology(cfg, 1),
            offload_lines=tuple(offload_summary(cfg)), warm_communicators=warm), "auto")

    assert "NCCL communicators: all groups' created before step 1" in header(True)
    assert "NCCL communicators" not in header(False)


@pytest.mark.gpu
def test_after_the_warm_up_the_first_collectives_allocate_nothing_outside_pytorch():
    measured = _run("""
        import json, socket
        import torch, torch.distributed as dist
        from mbridge_offload.runtime.communicators import warm_communicators

        def outside() -> int:  # device memory in use that PyTorch's allocator does not hold
            free, total = torch.cuda.mem_get_info()
            return total - free - torch.cuda.memory_reserved()

        def first_use(group) -> int:
            before = outside()
            shard = torch.empty(1, device="cuda")
            dist.reduce_scatter_tensor(shard, torch.ones(dist.get_world_size(group), device="cuda"), group=group)
            torch.cuda.synchronize()
            return outside() - before

        torch.cuda.set_device(0)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
        dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
        warmed_groups = [dist.new_group([0], group_desc=f"GROUP_{i}") for i in range(2)]
        warmed = warm_communicators()
        after_warm_up = [first_use(group) for group in warmed_groups]
        cold = first_use(dist.new_group([0], group_desc="CREATED_AFTER_THE_WARM_UP"))
        print(json.dumps({"groups": list(warmed.groups), "warm_up_bytes": warmed.device_bytes,
                          "after_warm_up": after_warm_up, "cold": cold}))
    """)
    assert measured["groups"][1:] == ["GROUP_0", "GROUP_1"]  # the default group first, then in creation order
    assert measured["cold"] > 0  # NCCL allocates at a group's first collective: what the warm-up moves earlier
    assert measured["warm_up_bytes"] >= measured["cold"]  # at least one communicator's worth, counted
    assert measured["after_warm_up"] == [0, 0]
