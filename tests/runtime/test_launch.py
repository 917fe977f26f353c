"""The torchrun relaunch on CPU: run_recipe prepares once and hands the validated config to the ranks
in a file; torchrun starts the rank entry point by module name, and each rank trains that config."""

from __future__ import annotations

import pytest

from recipes import registry
from mbridge_offload.describe import config_diff, offload_summary, topology
from mbridge_offload.runtime import launch, rank_entry
from mbridge_offload.runtime.launch import (HANDOFF_FILE, RANK_ENTRY, LaunchSettings, read_handoff, torchrun_command,
                                            write_handoff)


def _settings(cfg, out_dir, num_gpus=2) -> LaunchSettings:
    return LaunchSettings(recipe_name="qwen3_1b_proxy_optimizer_offload_config", num_gpus=num_gpus, out_dir=out_dir,
                          cpu_threads="auto", tuning_lines=("D2H/H2D overlap in 8 chunks",), run_lines=(),
                          overlap_chunks=8,
                          topology=topology(cfg, num_gpus), offload_lines=tuple(offload_summary(cfg)))


@pytest.mark.parametrize("name", [recipe.name for recipe in registry.RECIPES])
def test_the_handoff_file_round_trips_a_real_config(name, built, tmp_path):
    cfg = built(name)
    settings = _settings(cfg, tmp_path / "run")
    path = write_handoff(cfg, settings)
    assert path == tmp_path / "run" / HANDOFF_FILE
    loaded, loaded_settings = read_handoff(path)
    assert loaded_settings == settings
    assert type(loaded) is type(cfg) and loaded is not cfg
    assert config_diff(cfg, loaded) == []


def test_the_handoff_keeps_what_prepare_changed(tmp_path):
    from mbridge_offload.prepare import prepare

    prepared = prepare(registry.get("qwen3_1b_proxy_pretrain_config"),
                       ["optimizer.optimizer_cpu_offload=True", "optimizer.optimizer_offload_fraction=0.5"],
                       num_gpus=2, num_gpus_from="--num-gpus", plan_options={"gpu_memory_gib": 80.0})
    assert prepared.cfg.optimizer.overlap_cpu_optimizer_d2h_h2d  # the tuning's change
    loaded, _ = read_handoff(write_handoff(prepared.cfg, _settings(prepared.cfg, tmp_path)))
    assert config_diff(prepared.base_cfg, loaded) == config_diff(prepared.base_cfg, prepared.cfg) != []


def test_torchrun_starts_the_rank_entry_by_module_name(tmp_path):
    from torch.distributed.run import get_args_parser

    handoff = tmp_path / HANDOFF_FILE
    command = torchrun_command(handoff, 4)
    assert command[1:3] == ["-m", "torch.distributed.run"]
    parsed = get_args_parser().parse_args(command[3:])  # torchrun's own reading of the command
    assert parsed.module and parsed.standalone and parsed.nproc_per_node == "4"
    assert parsed.training_script == RANK_ENTRY == "mbridge_offload.runtime.rank_entry"
    assert parsed.training_script_args == [str(handoff)]
    assert not any(part.endswith(".py") for part in command[1:])  # no file path: an installed package works


def test_the_relaunch_writes_the_config_and_runs_torchrun(built, tmp_path, monkeypatch):
    cfg = built("qwen3_1b_proxy_optimizer_offload_config")
    started = {}

    def fake_call(command, env):
        started.update(command=command, env=env)
        return 0

    monkeypatch.setattr(launch.subprocess, "call", fake_call)
    monkeypatch.setenv("OMP_NUM_THREADS", "6")
    assert launch.relaunch_under_torchrun(cfg, _settings(cfg, tmp_path)) == 0
    assert started["command"] == torchrun_command(tmp_path / HANDOFF_FILE, 2)
    assert started["env"]["MBRIDGE_OFFLOAD_USER_OMP_NUM_THREADS"] == "6"
    assert config_diff(cfg, read_handoff(tmp_path / HANDOFF_FILE)[0]) == []


def test_each_rank_trains_the_handed_off_config(built, tmp_path, monkeypatch, capsys):
    cfg = built("qwen3_1b_proxy_optimizer_offload_config")
    settings = _settings(cfg, tmp_path)
    trained = {}
    monkeypatch.setattr(rank_entry, "train", lambda c, s: trained.update(cfg=c, settings=s) or 0)
    assert rank_entry.main([str(write_handoff(cfg, settings))]) == 0
    assert trained["settings"] == settings and config_diff(cfg, trained["cfg"]) == []
    assert rank_entry.main([]) == 2 and "usage: python -m mbridge_offload.runtime.rank_entry" in capsys.readouterr().err



# (overrides, the launch shell's variables, whether the header says bf16 moments)
MOMENTS_HEADER_CASES = [
    (["++env_vars.MBRIDGE_OFFLOAD_ENGINE=stream", "++env_vars.MBRIDGE_OFFLOAD_STREAM_MOMENTS=bf16"], {}, True),
    (["++env_vars.MBRIDGE_OFFLOAD_ENGINE=stream", "++env_vars.MBRIDGE_OFFLOAD_STREAM_MOMENTS=fp32"],
     {"MBRIDGE_OFFLOAD_STREAM_MOMENTS": "bf16"}, True),  # the launch shell's value wins, as the engine reads it
    (["++env_vars.MBRIDGE_OFFLOAD_ENGINE=stream", "++env_vars.MBRIDGE_OFFLOAD_STREAM_MOMENTS=bf16"],
     {"MBRIDGE_OFFLOAD_STREAM_MOMENTS": "fp32"}, False),
    (["++env_vars.MBRIDGE_OFFLOAD_ENGINE=stream"], {}, False),  # fp32, the default
    (["++env_vars.MBRIDGE_OFFLOAD_ENGINE=exact", "++env_vars.MBRIDGE_OFFLOAD_STREAM_MOMENTS=bf16"], {}, False),
    (["++env_vars.MBRIDGE_OFFLOAD_ENGINE=stream", "++env_vars.MBRIDGE_OFFLOAD_STREAM_MOMENTS=bf16",
      "optimizer.optimizer_cpu_offload=False", "optimizer.optimizer_offload_fraction=0.0"], {}, False),
]


def test_the_header_says_bf16_moments_where_the_stream_engine_runs_with_them(recipe, tmp_path, monkeypatch):
    """One header line, what the run's training is not (bit-identical to no offload), where optimizer offload is on,
    the engine is stream and its moments bf16 as the run reads them (the shell's value wins); none elsewhere.
    diagnose reads it (tests/diagnosis)."""
    from overrides import apply_overrides
    from mbridge_offload.facts.offload_engine import STREAM_MOMENTS_HEADER, STREAM_MOMENTS_SAYS

    base = recipe("qwen3_1b_proxy_optimizer_offload_config")
    for overrides, shell, said in MOMENTS_HEADER_CASES:
        with monkeypatch.context() as env:
            env.delenv("MBRIDGE_OFFLOAD_ENGINE", raising=False)
            env.delenv("MBRIDGE_OFFLOAD_STREAM_MOMENTS", raising=False)
            for name, value in shell.items():
                env.setenv(name, value)
            cfg = apply_overrides(base, overrides)
            lines = launch.run_header(cfg, _settings(cfg, tmp_path, num_gpus=1), "test").splitlines()
        moments = [line for line in lines if STREAM_MOMENTS_HEADER in line]
        assert moments == ([f"  {STREAM_MOMENTS_HEADER}: {STREAM_MOMENTS_SAYS}"] if said else []), (overrides, shell)
        if said:  # below the engine's own line, which it qualifies (fetch-ahead, off here, would come between)
            engine = next(i for i, line in enumerate(lines) if line.startswith("  offload engine: stream: "))
            assert lines[engine + 1] == moments[0]
