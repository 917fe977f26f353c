"""Launch Megatron Bridge training for a validated config, as one process or under torchrun.

Handles what a pip-installed stack breaks, for the user:
- ``initialize_megatron()`` runs ``make`` in megatron/core/datasets to build the dataset helper;
  the wheel ships the compiled helper but no Makefile, so ``make`` fails and Megatron calls
  ``sys.exit(1)``. ``use_prebuilt_dataset_helper()`` skips the build when the compiled helper imports.
- APEX-only settings (``gradient_accumulation_fusion``) are off in every recipe and refused by the
  validator when APEX is missing.

Several GPUs without a launcher (``--num-gpus N``): the config is prepared and validated once, here;
``relaunch_under_torchrun`` hands it to the ranks in a file of the run folder, and each rank
(mbridge_offload/runtime/rank_entry.py) trains it with ``train``, the same function one process runs.
"""

from __future__ import annotations

import os
import pickle
import socket
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from mbridge_offload.facts.cores import available_cores
from mbridge_offload.facts.environment import allocator_conf, allocator_line
from mbridge_offload.facts.offload_engine import (BF16_MOMENTS, COPY_PAUSE_ENV, COPY_WINDOW_ENV, DEFAULT_COPY_WINDOW,
                                                  DELAYED, DELAYED_COPY_START_HEADER, DELAYED_COPY_START_SAYS,
                                                  ENGINE_MODES, EXACT, FETCH_AHEAD_HEADER, FETCH_AHEAD_SAYS, STREAM,
                                                  STREAM_MOMENTS_HEADER, STREAM_MOMENTS_SAYS, copies_at_next_step,
                                                  copy_pause_us, copy_window, copy_window_setting, engine_mode,
                                                  fetch_ahead_on, stream_moments,
                                                  ZERO_BY_REGION_HEADER, ZERO_BY_REGION_SAYS, zero_by_region_on)
from mbridge_offload.facts.run_records import STEP_RECORDS_GLOB
from mbridge_offload.runtime.memory_history import write_on_failure  # a no-op unless it records
from mbridge_offload.runtime.stopping import how_it_ended, interrupt_as_terminate
from mbridge_offload.runtime.run_outcome import FAILURE_FILE, write_failure

EXIT_OK, EXIT_FAILED = 0, 1
HANDOFF_FILE = "prepared_run.pkl"  # in the run folder: the validated config for the ranks torchrun starts
RANK_ENTRY = "mbridge_offload.runtime.rank_entry"


@dataclass(frozen=True)
class LaunchSettings:
    """How to run a validated config, besides the config itself."""

    recipe_name: str
    num_gpus: int
    out_dir: Path
    cpu_threads: str | int  # "auto", "launcher" or a thread count (mbridge_offload/runtime/cpu_threads.py)
    tuning_lines: tuple[str, ...]  # what the offload tuning set, for the run's header
    run_lines: tuple[str, ...]  # what --deterministic and the clean stop set, for the run's header
    overlap_chunks: int | None  # the D2H/H2D overlap in this many chunks (None: the library's per tensor)
    topology: str  # the parallel layout in words, for the run's header
    offload_lines: tuple[str, ...]  # the offload settings in words, one line per mechanism
    warm_communicators: bool = False  # create the NCCL communicators before step 1 (runtime/communicators.py)
    memory_snapshot_steps: int = 0  # record the allocator's history of this many first steps (runtime/memory_history.py)


def use_prebuilt_dataset_helper() -> bool:
    """Make Megatron Bridge's initialisation skip ``make`` when the compiled dataset helper exists.

    Returns True when the skip is in place; False when the helper is missing, in which case
    Megatron's own build runs (and reports its own error if it cannot build).
    """
    import megatron.bridge.training.initialize as initialize

    try:
        from megatron.core.datasets import helpers_cpp  # noqa: F401  (the compiled helper)
    except ImportError:
        return False
    if getattr(initialize.compile_helpers, "__name__", "") != "_prebuilt_helper":
        def _prebuilt_helper() -> None:
            """The dataset helper is already compiled (pip wheel): nothing to build."""

        initialize.compile_helpers = _prebuilt_helper
    return True


def launch_mode(num_gpus: int, visible_gpus: int, environ) -> str:
    """'launcher' (torchrun/Slurm started us), 'single', 'torchrun' (re-run under it), or why not."""
    if "WORLD_SIZE" in environ:
        world = int(environ["WORLD_SIZE"])
        if world != num_gpus:
            return (f"validated for {num_gpus} GPUs but the launcher started {world} processes: "
                    f"drop --num-gpus or make it {world}")
        return "launcher"
    if num_gpus > visible_gpus:
        return (f"this configuration needs {num_gpus} GPUs and this machine shows {visible_gpus}: launch it "
                f"across nodes with torchrun/Slurm, or pick a topology for {visible_gpus} (--num-gpus "
                f"{visible_gpus} with smaller -tp/-pp/-ep)")
    return "torchrun" if num_gpus > 1 else "single"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def single_process_env() -> None:
    """torch.distributed needs these even for one process; a launcher's values are kept."""
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(_free_port()))
    for name, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_WORLD_SIZE", "1")):
        os.environ.setdefault(name, value)


def offload_engine(cfg) -> str:
    """The engine this run's offloaded optimizer step runs with (the shell's MBRIDGE_OFFLOAD_ENGINE wins)."""
    return engine_mode(cfg.env_vars, os.environ)


def run_header(cfg, settings: LaunchSettings, threads_reason: str) -> str:
    import torch

    lines = [f"Training {settings.recipe_name} ({settings.topology}), {cfg.train.train_iters} steps, "
             f"global batch {cfg.train.global_batch_size}, micro batch {cfg.train.micro_batch_size}, "
             f"seq {cfg.model.seq_length}"]
    lines += [f"  {line}" for line in settings.offload_lines]
    lines += [f"  speed: {line}" for line in settings.tuning_lines]
    lines += [f"  {line}" for line in settings.run_lines]
    if cfg.optimizer.optimizer_cpu_offload:
        mode = offload_engine(cfg)
        lines.append(f"  offload engine: {mode}: {ENGINE_MODES[mode]}")
        if mode == STREAM and fetch_ahead_on(cfg.env_vars, os.environ):
            lines.append(f"  {FETCH_AHEAD_HEADER}: {FETCH_AHEAD_SAYS}")
        if mode == STREAM and stream_moments(cfg.env_vars, os.environ) == BF16_MOMENTS:
            lines.append(f"  {STREAM_MOMENTS_HEADER}: {STREAM_MOMENTS_SAYS}")
        if mode in (EXACT, DELAYED) and zero_by_region_on(cfg.env_vars, os.environ):
            lines.append(f"  {ZERO_BY_REGION_HEADER}: {ZERO_BY_REGION_SAYS}")
        if mode == DELAYED and copies_at_next_step(cfg.env_vars, os.environ):
            lines.append(f"  {DELAYED_COPY_START_HEADER}: {DELAYED_COPY_START_SAYS}")
        pause_us = copy_pause_us(cfg.env_vars, os.environ)
        if mode in (EXACT, DELAYED) and pause_us is not None:
            lines.append(f"  copies: every piece enqueued at once, each after a GPU-side pause of about {pause_us} us "
                         f"({COPY_PAUSE_ENV})")
        if mode in (EXACT, DELAYED) and copy_window_setting(cfg.env_vars, os.environ) is not None:
            lines.append(f"  copies: {copy_window(cfg.env_vars, os.environ)} piece(s) in flight ({COPY_WINDOW_ENV}; "
                         f"{DEFAULT_COPY_WINDOW} by default)")
    lines.append(f"  CPU threads per rank: {torch.get_num_threads()}: {threads_reason}")
    lines.append(f"  {allocator_line(allocator_conf(cfg.env_vars, os.environ))}")
    if settings.warm_communicators:
        lines.append("  NCCL communicators: all groups' created before step 1 (--warm-communicators, experimental: "
                     "0.38 GiB of the device each on the H200, also for groups the run never uses)")
    if settings.memory_snapshot_steps:
        from mbridge_offload.runtime.memory_history import header_line

        lines.append(f"  {header_line(settings.out_dir, settings.memory_snapshot_steps)}")
    warning = cpu_thread_warning(cfg, torch.get_num_threads(), int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
                                 len(available_cores()))
    if warning:
        lines.append(f"  WARNING: {warning}")
    lines.append(f"  metrics: {settings.out_dir}/{STEP_RECORDS_GLOB}, summary: {settings.out_dir}/summary.json")
    return "\n".join(lines)


def cpu_thread_warning(cfg, threads: int, ranks_on_node: int, cores: int | None) -> str | None:
    """Optimizer offload runs Adam on the CPU: one thread per rank (torchrun's default when a node
    runs several ranks) made 100% offload 4.3x slower than no offload on the H200, 16 threads 1.85x. More threads
    than the node's cores make the ranks' CPU Adam threads take turns on them instead."""
    if not cfg.optimizer.optimizer_cpu_offload or not cores:
        return None
    ranks_on_node = max(1, ranks_on_node)
    fair_share = max(1, cores // ranks_on_node)
    if threads * ranks_on_node > cores:
        return (f"the CPU optimizer runs on {threads} thread(s) per rank x {ranks_on_node} rank(s) = "
                f"{threads * ranks_on_node} threads on this node's {cores} cores: the ranks' threads contend for "
                f"the cores during every CPU Adam step; use --cpu-threads auto or {fair_share}")
    if threads * 2 > fair_share or fair_share == 1:
        return None
    return (f"the CPU optimizer runs on {threads} thread(s) per rank while this node has {cores} cores for "
            f"{ranks_on_node} rank(s): use --cpu-threads auto or {fair_share} "
            "(H200, 1.1B proxy, 100% offload: 4.3x slower than no offload with 1 thread, 1.85x with 16)")


def _wait_for_ranks(out_dir: Path, world: int, timeout_s: float = 60.0) -> None:
    """Rank 0 summarises once every rank's metrics file has the same number of steps."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        files = list(out_dir.glob(STEP_RECORDS_GLOB))
        counts = {len(f.read_text().splitlines()) for f in files}
        if len(files) >= world and len(counts) == 1:
            return
        time.sleep(0.5)


def _first_line(error: BaseException) -> str:
    return str(error).splitlines()[0] if str(error) else ""


def tune_cpu_threads(cfg, request) -> str:
    """Threads (and cores) for this rank's CPU optimizer; returns the reason shown to the user."""
    from mbridge_offload.runtime.cpu_threads import apply_threads, plan_threads

    if not cfg.optimizer.optimizer_cpu_offload and not isinstance(request, int):
        return "unchanged (no optimizer offload)"
    plan = plan_threads(request, os.environ, available_cores(), int(os.environ.get("LOCAL_RANK", "0")),
                        int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    apply_threads(plan)
    return plan.reason


def write_handoff(cfg, settings: LaunchSettings) -> Path:
    """The validated config and its launch settings, in a file of the run folder for the ranks to load."""
    settings.out_dir.mkdir(parents=True, exist_ok=True)
    path = settings.out_dir / HANDOFF_FILE
    with path.open("wb") as f:
        pickle.dump({"cfg": cfg, "settings": settings}, f)
    return path


def read_handoff(path: Path):
    """(config, LaunchSettings) as ``write_handoff`` left them."""
    with Path(path).open("rb") as f:
        handoff = pickle.load(f)
    return handoff["cfg"], handoff["settings"]


def torchrun_command(handoff: Path, num_gpus: int) -> list[str]:
    """torchrun, one process per GPU, each starting the rank entry point on the handed-off config."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={num_gpus}",
            "-m", RANK_ENTRY, str(handoff)]


def relaunch_under_torchrun(cfg, settings: LaunchSettings) -> int:
    """One command for N GPUs: the ranks train the config validated here, without preparing it again."""
    from mbridge_offload.runtime.cpu_threads import USER_OMP_ENV

    command = torchrun_command(write_handoff(cfg, settings), settings.num_gpus)
    print("launching: " + " ".join(command), flush=True)
    # torchrun sets OMP_NUM_THREADS=1 when it is unset: tell the ranks what the user had set.
    env = {**os.environ, USER_OMP_ENV: os.environ.get("OMP_NUM_THREADS", "")}
    return subprocess.call(command, env=env)


def launch(cfg, settings: LaunchSettings) -> int:
    """Train ``cfg`` here: as this one process, as this rank of a launcher, or under torchrun."""
    import torch

    if not torch.cuda.is_available():
        print("no CUDA device on this machine: the configuration above is valid, but training needs a GPU. "
              "Run the same command on a GPU node (under torchrun for several GPUs), or add --dry-run.",
              file=sys.stderr)
        return EXIT_FAILED
    how = launch_mode(settings.num_gpus, torch.cuda.device_count(), os.environ)
    if how not in ("single", "torchrun", "launcher"):
        print(how, file=sys.stderr)
        return EXIT_FAILED
    if how == "torchrun":
        return relaunch_under_torchrun(cfg, settings)
    return train(cfg, settings)


def train(cfg, settings: LaunchSettings) -> int:
    """This process's part of the training: the whole of it alone, or one rank's under a launcher."""
    import torch

    out_dir = settings.out_dir
    single_process_env()
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    use_prebuilt_dataset_helper()
    from mbridge_offload.runtime.allocator_settings import AllocatorSettingsError, apply_allocator_settings

    try:
        apply_allocator_settings(cfg.env_vars, os.environ)  # before the model's first allocation
    except AllocatorSettingsError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_FAILED
    threads_reason = tune_cpu_threads(cfg, settings.cpu_threads)
    if settings.overlap_chunks:
        from mbridge_offload.runtime.chunked_overlap import use_chunked_overlap

        use_chunked_overlap(settings.overlap_chunks)  # described in tuning_lines
    if cfg.optimizer.optimizer_cpu_offload:
        from mbridge_offload.runtime.resume_fix import install_resume_fix
        from mbridge_offload.runtime.streaming_engine import install

        install_resume_fix()  # upstream's HybridDeviceOptimizer cannot load its own checkpoints (resume_fix.py)
        # the validator refused what the engine cannot run
        install(offload_engine(cfg), zero_by_region=zero_by_region_on(cfg.env_vars, os.environ),
                copies_at_next_step=copies_at_next_step(cfg.env_vars, os.environ))
    if cfg.train.exit_signal_handler:
        interrupt_as_terminate()
    from recipes.derive import derive
    from mbridge_offload.runtime.metrics import format_summary, make_callback, write_summary

    cfg = derive(cfg, {"logger.tensorboard_dir": str(out_dir / "tb")}, why="run output folder")
    if rank == 0:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / FAILURE_FILE).unlink(missing_ok=True)
        print(run_header(cfg, settings, threads_reason), flush=True)

    from megatron.bridge.training.gpt_step import forward_step
    from megatron.bridge.training.pretrain import pretrain

    from mbridge_offload.runtime.host_memory import make_heap_release_callback

    metrics = make_callback(out_dir, rank)
    callbacks = [make_heap_release_callback(rank), metrics]
    if settings.warm_communicators:
        from mbridge_offload.runtime.communicators import make_warm_up_callback

        callbacks.insert(0, make_warm_up_callback(rank))
    if settings.memory_snapshot_steps:
        from mbridge_offload.runtime.memory_history import make_memory_history_callback

        callbacks.append(make_memory_history_callback(out_dir, rank, settings.memory_snapshot_steps))
    from mbridge_offload.runtime.streaming_engine import drain_all

    try:
        try:
            pretrain(cfg, forward_step, callbacks=callbacks)
        except SystemExit as stop:
            if stop.code in (0, None):
                drain_all(apply_delayed=False)  # the last update: its errors surface, no thread dies mid-step
            raise
        drain_all(apply_delayed=False)
    except SystemExit as stop:
        # Megatron Bridge ends a run at train.exit_interval and after a stop signal (checkpoint saved) with
        # sys.exit(0): a run that ended as asked, summarised below; any other code is a failure
        if stop.code not in (0, None):
            write_failure(out_dir, f"exited with code {stop.code}")
            raise
    except torch.OutOfMemoryError as error:
        first_line = _first_line(error)
        reason = first_line if first_line.startswith("CUDA out of memory") else f"CUDA out of memory: {first_line}"
        write_failure(out_dir, reason)
        write_on_failure("CUDA out of memory")  # with --memory-snapshot: the history up to the failure
        print(f"rank {rank}: {reason}\n  Try a larger optimizer.optimizer_offload_fraction, activation offload, "
              "a smaller micro batch or more GPUs.", file=sys.stderr)
        return EXIT_FAILED
    except Exception as error:  # noqa: BLE001  (record why, then let the user see the traceback)
        write_failure(out_dir, f"{type(error).__name__}: {_first_line(error)}")
        write_on_failure(type(error).__name__)
        traceback.print_exc()
        return EXIT_FAILED
    if rank == 0:
        _wait_for_ranks(out_dir, world)
        summary = write_summary(out_dir, {
            "recipe": settings.recipe_name, "num_gpus": settings.num_gpus,
            "cpu_threads_per_rank": torch.get_num_threads(),
            "optimizer_cpu_offload": cfg.optimizer.optimizer_cpu_offload,
            "optimizer_offload_fraction": cfg.optimizer.optimizer_offload_fraction,
            "overlap_cpu_optimizer_d2h_h2d": cfg.optimizer.overlap_cpu_optimizer_d2h_h2d,
            "overlap_chunks": settings.overlap_chunks,
            "offload_engine": offload_engine(cfg) if cfg.optimizer.optimizer_cpu_offload else None})
        print(f"Run summary ({out_dir}):\n{format_summary(summary)}", flush=True)
        ended = how_it_ended(cfg, metrics.last_iteration)
        if ended:
            print(ended, flush=True)
    return EXIT_OK
