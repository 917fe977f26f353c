"""diagnose.py on logs as users paste them, each written here for a failure the earlier tests did not show: the
formats a log arrives in (colours, CRLF, progress bars, compressed, UTF-16, pasted on stdin, cut short, empty or
not text), the spellings of torch's out-of-memory message across releases, failures outside PyTorch's allocator and
on the host, a scheduler's stop, NCCL's errors, and multi-rank logs where one rank failed first and the others
followed."""

from __future__ import annotations

import bz2
import gzip
import io
import json
import random
import sys
from pathlib import Path

import pytest

from mbridge_offload.cli.diagnose import main
from mbridge_offload.diagnosis import diagnose, format_diagnosis
from mbridge_offload.diagnosis import log_text
from mbridge_offload.diagnosis.logs import read_lines, strip_rank
from mbridge_offload.diagnosis.run_facts import OutOfMemory
from mbridge_offload.facts.environment import ALLOC_CONF_ENV, allocator_line
from mbridge_offload.planning import plan

REPO = Path(__file__).resolve().parents[2]
SAVED_CONFIG = REPO / "docs" / "benchmarks" / "resume-parity" / "saved-run_config.yaml"

TRACEBACK = [
    "Traceback (most recent call last):",
    '  File "/opt/venv/lib/python3.12/site-packages/megatron/bridge/training/train.py", line 268, in train',
    "    ) = train_step(",
    '  File "/opt/venv/lib/python3.12/site-packages/megatron/core/pipeline_parallel/schedules.py", line 417, in '
    "forward_step",
    "    output_tensor, loss_func = forward_step_func(data_iterator, model)",
]
OOM = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 896.00 MiB. GPU 3 has a total capacity of "
       "79.10 GiB of which 412.50 MiB is free. Including non-PyTorch memory, this process has 78.68 GiB memory in use. "
       "Of the allocated memory 74.21 GiB is allocated by PyTorch, and 2.93 GiB is reserved by PyTorch but "
       "unallocated. If reserved but unallocated memory is large try setting "
       "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.")
CUDA_ERROR_TAIL = [
    "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be "
    "incorrect.",
    "For debugging consider passing CUDA_LAUNCH_BLOCKING=1",
    "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.",
]
HEADER = [
    "/opt/venv/bin/python scripts/run_recipe.py --recipe qwen3_8b_pretrain_config --num-gpus 8 "
    "optimizer.optimizer_cpu_offload=True optimizer.optimizer_offload_fraction=0.5",
    "Training qwen3_8b_pretrain_config (8 GPUs: TP1 PP1 CP1 DP8 EP1 ETP1), 100 steps, global batch 64, micro batch 2",
    "  optimizer offload: ON, 50% of optimizer states on the CPU, D2H/H2D overlap on, pinned grads/params on/on",
    "  activation offload (layer-level): off",
    "  fine-grained activation offload: off",
    "  speed: optimizer.pin_cpu_grads=True (already)",
    "Starting training loop at iteration 0",
]


# --- the formats a log arrives in -----------------------------------------------------------------------------

def _oom_log() -> list[str]:
    return [f"[rank2]: {line}" for line in (*TRACEBACK, OOM)]


def _as_plain(lines: list[str]) -> bytes:
    return ("\n".join(lines) + "\n").encode()


def _with_colours(lines: list[str]) -> bytes:  # a logger's colours around the whole line, prefix included
    return ("\n".join(f"\x1b[31m{line}\x1b[0m" for line in lines) + "\n").encode()


def _with_crlf(lines: list[str]) -> bytes:
    return ("\r\n".join(lines) + "\r\n").encode()


def _with_progress_bar(lines: list[str]) -> bytes:  # tqdm redraws its line with carriage returns
    return ("Loading checkpoint shards:  10%\rLoading checkpoint shards: 100%\n" + "\n".join(lines) + "\n").encode()


@pytest.mark.parametrize("name, encode, offset", [
    ("log.txt", _as_plain, 0),
    ("coloured.log", _with_colours, 0),
    ("windows.log", _with_crlf, 0),
    ("progress.log", _with_progress_bar, 1),
    ("log.txt.gz", lambda lines: gzip.compress(_as_plain(lines)), 0),
    ("log.txt.bz2", lambda lines: bz2.compress(_as_plain(lines)), 0),
    ("powershell.log", lambda lines: ("\r\n".join(lines) + "\r\n").encode("utf-16"), 0),  # `> log` in PowerShell
])
def test_every_format_gives_the_same_finding_line_and_rank(tmp_path, name, encode, offset, diag):
    """The OOM is the 6th line of the text (one more after the progress bar's line, whose redraws are one line in an
    editor): each format must give that line number, rank 2 and the message's numbers."""
    lines = _oom_log()
    path = tmp_path / name
    path.write_bytes(encode(lines))
    [finding] = diag.findings(path)
    assert finding.rule_id == "runtime/cuda-oom"
    assert finding.evidence[0].number == len(lines) + offset and finding.ranks == {2}
    assert finding.evidence[0].text == OOM
    assert finding.measured.startswith("tried to allocate 896.00 MiB, 412.50 MiB free of 79.10 GiB")


def test_a_compressed_log_cut_short_still_gives_its_lines(tmp_path, diag):
    """A .gz copied while the run still wrote it: the lines it holds are read, not refused."""
    whole = gzip.compress(_as_plain(["Killed"] * 2000 + _oom_log()))
    path = tmp_path / "slurm-991234.out.gz"
    path.write_bytes(whole[: len(whole) // 2])
    assert diag.ids(path) == ["runtime/host-memory-killed"]


def test_a_log_larger_than_the_limit_is_read_from_its_head_and_tail_with_true_line_numbers(monkeypatch, diag):
    """Past MAX_LOG_BYTES only the head (the command) and the tail (the failure) are read; line numbers still
    count from the file's start, as grep -n and an editor count them."""
    monkeypatch.setattr(log_text, "MAX_LOG_BYTES", 2000)
    monkeypatch.setattr(log_text, "HEAD_BYTES", 300)
    iteration = ("[rank0]:  [2026-12-04 10:02:11] iteration {i:>8}/    5000 | consumed samples: {s:>12} | "
                 "elapsed time per iteration (ms): 2211.7 |")
    lines = HEADER + [iteration.format(i=i, s=i * 64) for i in range(1, 200)] + _oom_log()
    path = diag.write(lines)
    [finding] = diag.findings(path)
    assert finding.evidence[0].number == len(lines) and finding.evidence[0].text == OOM
    read = read_lines(path)
    assert read[0].text == HEADER[0]  # the head: the command the fix is computed from
    text = path.read_text().split("\n")
    assert all(text[line.number - 1].endswith(line.text) for line in read)


def test_a_log_pasted_on_standard_input(monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(_as_plain(_oom_log()))))
    assert main(["--no-build", "-"]) == 0
    out = capsys.readouterr().out
    assert "[runtime/cuda-oom]" in out and f"-:{len(_oom_log())}:" in out


@pytest.mark.parametrize("name, content, problem", [
    ("empty.log", b"", "is empty"),
    ("blank.log", b"\n  \n\r\n", "is empty"),
    ("model_optim_rng.pt", bytes(range(256)) * 64, "is not a text log"),
    ("log.txt.gz", b"\x1f\x8b\x08\x00" + b"\xff" * 64, "cannot be decompressed"),
])
def test_a_log_that_holds_nothing_to_read_exits_2_with_one_line_naming_it(tmp_path, capsys, name, content, problem):
    path = tmp_path / name
    path.write_bytes(content)
    assert main(["--no-build", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and len(captured.err.strip().splitlines()) == 1
    assert str(path) in captured.err and problem in captured.err and "Traceback" not in captured.err


def test_rank_prefixes_nested_three_deep_and_behind_a_timestamp():
    """srun's label around torchrun's --tee prefix around its rank prefix: the innermost is the process's rank; a
    container log's timestamp before the prefix names none."""
    assert strip_rank("1: [default3]:[rank11]: torch.OutOfMemoryError: x") == (11, "torch.OutOfMemoryError: x")
    assert strip_rank("2026-12-04T10:12:12.527415338Z [rank5]: Killed") == (5, "Killed")


# --- torch's out-of-memory message across releases --------------------------------------------------------------

def test_torch_2_1_message_with_its_typo_is_measured_and_its_process_list_is_not_other_processes():
    """torch 2.1 wrote "total capacty" and listed this process as "Process N has ..." (2.2 on: "this process has")."""
    message = ("torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total "
               "capacty of 79.15 GiB of which 7.25 MiB is free. Process 12873 has 79.14 GiB memory in use. Of the "
               "allocated memory 77.51 GiB is allocated by PyTorch, and 1.10 GiB is reserved by PyTorch but "
               "unallocated.")
    oom = OutOfMemory.parse(message)
    assert (oom.capacity_gib, oom.allocated_gib, oom.reserved_unallocated_gib) == (79.15, 77.51, 1.10)
    assert oom.free_gib == pytest.approx(7.25 / 1024) and oom.other_processes_gib is None


def test_torch_1_message_in_parentheses_is_measured():
    message = ("RuntimeError: CUDA out of memory. Tried to allocate 512.00 KiB (GPU 1; 79.35 GiB total capacity; "
               "76.51 GiB already allocated; 13.19 MiB free; 77.20 GiB reserved in total by PyTorch) If reserved "
               "memory is >> allocated memory try setting max_split_size_mb to avoid fragmentation.")
    oom = OutOfMemory.parse(message)
    assert oom.requested_gib == pytest.approx(512 / 1024 ** 2) and oom.capacity_gib == 79.35
    assert oom.free_gib == pytest.approx(13.19 / 1024) and oom.allocated_gib == 76.51
    assert oom.reserved_unallocated_gib == pytest.approx(77.20 - 76.51)
    assert oom.words().startswith("tried to allocate 512.00 KiB, 13.19 MiB free of 79.35 GiB")


def test_sizes_in_bytes_are_measured_and_written_as_torch_writes_them():
    message = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 512 bytes. GPU 0 has a total capacity "
               "of 139.80 GiB of which 0 bytes is free. Including non-PyTorch memory, this process has 139.79 GiB "
               "memory in use.")
    oom = OutOfMemory.parse(message)
    assert oom.requested_gib == pytest.approx(512 / 1024 ** 3) and oom.free_gib == 0.0
    assert oom.words().startswith("tried to allocate 512 bytes, 0 bytes free of 139.80 GiB")


def test_a_mention_of_the_out_of_memory_class_is_no_failure(diag):
    """A warning or a traceback's source line that names the class is not the error."""
    path = diag.write([
        *HEADER,
        "/opt/venv/lib/python3.12/site-packages/megatron/core/utils.py:1021: UserWarning: torch.cuda.OutOfMemoryError "
        "is caught and retried with a smaller chunk",
        '  File "/opt/venv/lib/python3.12/site-packages/megatron/core/utils.py", line 1030, in retry',
        "    except torch.OutOfMemoryError:",
        "Note: a 'CUDA out of memory' error means the configuration does not fit",
        "[2026-12-04 10:02:11] iteration        1/      10 | elapsed time per iteration (ms): 2211.7 |",
    ])
    assert diag.ids(path) == []


# --- failures outside PyTorch's allocator, and on the host -----------------------------------------------------

@pytest.mark.parametrize("error", [
    "RuntimeError: CUDA error: out of memory",
    "RuntimeError: Transformer Engine error: /workspace/TransformerEngine/transformer_engine/common/util/"
    "cuda_runtime.cpp:40 in function sm_count: CUDA Error: out of memory",
    "RuntimeError: cudaErrorMemoryAllocation: out of memory",
    "RuntimeError: CUDA driver error: out of memory",
])
def test_the_cuda_runtimes_out_of_memory_after_the_header_is_the_device_not_pinned_memory(error, diag):
    """Inside a forward pass, a few lines after a header that names the pinned grads/params settings, followed by
    torch's boilerplate that mentions "device-side assertions": a device allocation outside PyTorch."""
    path = diag.write(HEADER + [f"[rank5]: {line}" for line in (*TRACEBACK, error, *CUDA_ERROR_TAIL)])
    [finding] = diag.findings(path)
    assert finding.rule_id == "runtime/oom-outside-pytorch" and finding.ranks == {5}
    assert finding.evidence[0].number == len(HEADER) + len(TRACEBACK) + 1


def test_a_real_device_fault_is_still_not_called_out_of_memory(diag):
    path = diag.write([f"[rank0]: {line}" for line in (
        *TRACEBACK, "RuntimeError: CUDA error: an illegal memory access was encountered", *CUDA_ERROR_TAIL,
        "Failed to CUDA calloc async 4 bytes")])
    assert diag.ids(path) == ["runtime/cuda-illegal-address"]


@pytest.mark.parametrize("error", [
    "OSError: [Errno 12] Cannot allocate memory",
    "RuntimeError: [enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: not enough memory: you tried to "
    "allocate 3221225472 bytes.",
    "terminate called after throwing an instance of 'std::bad_alloc'",
    "MemoryError",
])
def test_a_failed_host_allocation_is_host_memory(error, diag):
    path = diag.write([f"[rank2]: {line}" for line in (*TRACEBACK, error)])
    [finding] = diag.findings(path)
    assert finding.rule_id == "runtime/host-allocation-failed" and finding.ranks == {2}
    assert "optimizer.optimizer_offload_fraction" in finding.fix


def test_infiniband_memory_registration_is_the_memlock_limit_not_host_memory(diag):
    path = diag.write(["[rank2]: node-04:48211:48300 [2] NCCL WARN NET/IB : ibv_reg_mr failed: Cannot "
                            "allocate memory"])
    assert diag.ids(path) == ["runtime/pinned-host-memory"]


def test_the_shells_kill_report_is_a_host_kill(diag):
    path = diag.write(["Starting training loop at iteration 0",
                            "/var/spool/slurm/d/job991234/slurm_script: line 12: 48211 Killed                  "
                            "python scripts/run_recipe.py --recipe qwen3_30b_a3b_optimizer_offload_config"])
    assert diag.ids(path) == ["runtime/host-memory-killed"]


def test_a_full_shared_memory_folder_is_not_the_checkpoint_disk(diag):
    path = diag.write(["[rank0]: RuntimeError: unable to write to file </torch_48211_1398523741_0>: No space "
                            "left on device (28)"])
    assert diag.ids(path) == ["runtime/shared-memory"]
    path = diag.write(["[rank0]: OSError: [Errno 28] No space left on device: "
                            "'/ckpt/iter_0000500/__0_0.distcp'"])
    assert diag.ids(path) == ["runtime/checkpoint-write-failed"]


@pytest.mark.parametrize("error", [
    "ModuleNotFoundError: No module named 'transformer_engine_torch'",
    "ModuleNotFoundError: No module named 'transformer_engine.pytorch'",
    "ImportError: /opt/venv/lib/python3.12/site-packages/transformer_engine_torch.cpython-312-x86_64-linux-gnu.so: "
    "undefined symbol: _ZN3c104cuda9SetDeviceEi",
])
def test_a_broken_transformer_engine_install_is_the_transformer_engine_rule(error, diag):
    assert diag.ids(diag.write(["Traceback (most recent call last):", error])) == ["env/transformer-engine"]


# --- a stop from outside, and what follows a first failure -----------------------------------------------------

def test_a_time_limit_kill_is_the_schedulers_stop_not_host_memory(diag):
    """Slurm's time limit ends with SIGKILL (after KillWait): the kill follows the stop and is not the OOM killer."""
    stop = "slurmstepd: error: *** JOB 991234 ON node-03 CANCELLED AT 2026-12-04T12:00:00 DUE TO TIME LIMIT ***"
    kill = ["srun: error: node-03: task 0: Killed",
            "E1204 12:00:33.541000 140211 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: -9) "
            "local_rank: 0 (pid: 2813) of binary: /opt/venv/bin/python3"]
    iteration = "0: [2026-12-04 11:59:11] iteration       51/     100 | elapsed time per iteration (ms): 4821.7 |"
    assert diag.ids(diag.write([iteration, stop, *kill])) == ["runtime/job-stopped"]
    # a kill before any stop is the host's; the kernel's own words are the OOM killer wherever they stand
    assert diag.ids(diag.write([iteration, *kill, stop]))[0] == "runtime/host-memory-killed"
    oom_kill = "slurmstepd: error: Detected 1 oom-kill event(s) in StepId=991234.0."
    assert "runtime/host-memory-killed" in diag.ids(diag.write([iteration, stop, oom_kill]))


def test_a_step_slurm_cancels_after_a_task_failed_is_not_a_stop(diag):
    path = diag.write([f"5: {line}" for line in (*TRACEBACK, OOM)] + [
        "srun: error: node-07: task 5: Exited with exit code 1",
        "0: slurmstepd: error: *** STEP 991234.0 ON node-07 CANCELLED AT 2026-12-04T10:13:00 ***"])
    assert diag.ids(path) == ["runtime/cuda-oom"]


def test_one_rank_fails_first_and_the_others_time_out_after_it(diag):
    """torchrun's output of 4 ranks: rank 3 runs out of memory, the other ranks' collectives time out and one loses
    its NCCL peer. The report names rank 3's OOM as the first failure and the rest as its consequences."""
    timeout = ("[rank{r}]:[E1204 10:12:12.527415338 ProcessGroupNCCL.cpp:632] [Rank {r}] Watchdog caught collective "
               "operation timeout: WorkNCCL(SeqNum=412, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) "
               "ran for 600043 milliseconds before timing out.")
    lines = ([f"[rank{r}]: > initialized rank {r}" for r in range(4)]
             + [f"[rank3]: {line}" for line in (*TRACEBACK, OOM)]
             + [timeout.format(r=r) for r in (0, 1)]
             + ["[rank2]: ncclRemoteError: A call failed possibly due to a network error or a remote process exiting "
                "prematurely."])
    path = diag.write(lines)
    diagnosis = diag(path)
    found = {f.rule_id: f for f in diagnosis.findings}
    assert list(found) == ["runtime/cuda-oom", "runtime/nccl-timeout", "runtime/nccl-error"]
    oom_line = 4 + len(TRACEBACK) + 1
    assert diagnosis.first_failure is found["runtime/cuda-oom"] and found["runtime/cuda-oom"].ranks == {3}
    assert not found["runtime/cuda-oom"].consequence_of
    for rule_id in ("runtime/nccl-timeout", "runtime/nccl-error"):
        assert f"[runtime/cuda-oom] on rank 3, which failed first (log.txt:{oom_line})" in found[rule_id].consequence_of
    assert f"the first failure: [runtime/cuda-oom] on rank 3 at log.txt:{oom_line}" in format_diagnosis(diagnosis)


def test_an_nccl_error_alone_is_reported_without_a_cause_it_cannot_see(diag):
    path = diag.write([
        "[rank0]: torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
        "ProcessGroupNCCL.cpp:1970, unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.20.5",
        "[rank0]: ncclSystemError: System call (e.g. socket, malloc) or external library call failed or device error.",
    ])
    [finding] = diag.findings(path)
    assert finding.rule_id == "runtime/nccl-error" and not finding.consequence_of and finding.ranks == {0}


def test_ranks_named_by_the_launchers_own_lines(diag):
    """Lines without a rank prefix that name the rank: srun's task list and torchrun's failure block."""
    path = diag.write(["slurmstepd: error: Detected 1 oom-kill event(s) in StepId=991234.0.",
                            "srun: error: node-03: tasks 2,6-7: Out Of Memory"])
    assert diag.findings(path)[0].ranks == {2, 6, 7}
    path = diag.write(["Root Cause (first observed failure):", "[0]:", "  time      : 2026-12-04_10:04:01",
                            "  host      : node-03", "  rank      : 6 (local_rank: 2)", "  exitcode  : -9 (pid: 2813)",
                            "  error_file: <N/A>", "  traceback : Signal 9 (SIGKILL) received by PID 2813"])
    assert diag.findings(path)[0].ranks == {6}


# --- the fix -------------------------------------------------------------------------------------------------------

def test_fragmentation_advice_is_not_the_setting_the_run_already_had(tmp_path, diag):
    """Where the plan fits and PyTorch held more reserved-but-unused memory than the request, the fix blames
    fragmentation; it suggests expandable segments only to a run that did not have them."""
    saved = SAVED_CONFIG.read_text().replace("optimizer_offload_fraction: 1.0", "optimizer_offload_fraction: 0.3")
    message = OOM.replace("79.10 GiB", "139.80 GiB")
    # the saved run at 0.3 fits 139.80 GiB with either reserve: the branch that explains why the GPU had less free
    from mbridge_offload.diagnosis.config_source import load_run_config

    (tmp_path / "run_config.yaml").write_text(saved)
    assert all(plan(load_run_config(tmp_path / "run_config.yaml"), 1, fraction=0.3, gpu_memory_gib=139.80,
                    expandable=expandable).fits_gpu for expandable in (True, False))
    for i, header in enumerate((f"  {allocator_line((ALLOC_CONF_ENV, 'expandable_segments:True'))}", "")):
        run = tmp_path / str(i)
        run.mkdir()
        (run / "run_config.yaml").write_text(saved)
        (run / "log.txt").write_text(f"{header}\n[rank0]: {message}\n")
        [finding] = diag.findings(run / "log.txt")
        assert "fragmentation" in finding.fix_basis
        remedy = "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True is the remedy"
        assert (remedy in finding.fix_basis) is (header == ""), finding.fix_basis


def test_run_facts_read_the_nodes_memory_from_the_plan_line_of_either_format():
    """The host plan line of today's runs says "for 1 rank(s) of 123.627 GiB", older ones "for 1 ranks of 124.791
    GiB": both give the node's memory that the host fix after a kill plans against."""
    from mbridge_offload.diagnosis.run_facts import run_facts

    benchmarks = REPO / "docs" / "benchmarks"
    new = benchmarks / "planner-heldout" / "moe-proxy-6-sl2048-mb2" / "fraction-0" / "log.txt"
    old = benchmarks / "offload-overhead" / "dense-1b-chunked" / "fraction-1-stock-all-cores" / "log.txt"
    assert "for 1 rank(s) of 123.627 GiB" in new.read_text() and "for 1 ranks of 124.791 GiB" in old.read_text()
    assert run_facts(read_lines(new), None).host_memory_gib == 123.627
    assert run_facts(read_lines(old), None).host_memory_gib == 124.791


def test_a_torchrun_agents_line_under_an_srun_label_names_no_rank(diag):
    """srun launching one torchrun per node labels the agent's lines with the node's task number, not a rank."""
    path = diag.write(["1: E1204 10:04:03.541000 140211 torch/distributed/elastic/multiprocessing/api.py:869] "
                            "failed (exitcode: -9) local_rank: 2 (pid: 2813) of binary: /opt/venv/bin/python3"])
    [finding] = diag.findings(path)
    assert finding.rule_id == "runtime/host-memory-killed" and finding.ranks == set()


def _host_killed_run(tmp_path: Path, fraction: float, host_gib: float) -> Path:
    """A run folder with the real run_config.yaml at ``fraction``, and a log whose plan names the node's memory and
    whose rank was then killed by the OOM killer."""
    run = tmp_path / f"run-{fraction}-{host_gib}"
    run.mkdir()
    (run / "run_config.yaml").write_text(SAVED_CONFIG.read_text().replace(
        "optimizer_offload_fraction: 1.0", f"optimizer_offload_fraction: {fraction}"))
    (run / "log.txt").write_text("\n".join([
        f"  host: per node                    9.99 GiB between steps, 9.99 GiB at the first optimizer step's peak, "
        f"for 1 rank(s) of {host_gib} GiB, margin 4 GiB per rank: fits",
        "[2026-12-04 10:02:11] iteration        1/      20 | elapsed time per iteration (ms): 31544.2 |",
        "[1234567.890] Out of memory: Killed process 48211 (python) total-vm:812345678kB, anon-rss:501234567kB",
    ]) + "\n")
    return run / "log.txt"


def test_after_a_host_kill_the_fix_never_asks_for_more_offload_than_was_killed(tmp_path, diag):
    """Killed at fraction 1 on a node where the plan fits fraction 1: the node had less free than planned, and the
    fix asks for less host memory, not for fraction 1 again (it once answered with the largest fitting fraction,
    whatever the failed one)."""
    from mbridge_offload.diagnosis.config_source import load_run_config
    from mbridge_offload.planning import largest_host_fitting_fraction

    log = _host_killed_run(tmp_path, 1.0, 123.627)
    saved = load_run_config(log.parent / "run_config.yaml")
    assert largest_host_fitting_fraction(saved, 1, host_memory_gib=123.627, gpu_memory_gib=80.0)[0] == 1.0
    [finding] = diag.findings(log)
    assert finding.rule_id == "runtime/host-memory-killed"
    assert "optimizer_offload_fraction=" not in finding.fix and "smaller optimizer.optimizer_offload_fraction than 1" \
        in finding.fix
    assert "so the node had less free than planned" in finding.fix_basis


def test_after_a_host_kill_on_a_node_the_plan_overfills_the_fix_is_a_smaller_fraction(tmp_path, diag):
    """On a node whose memory the plan fills at fraction 1 but not at a smaller one, the fix is that smaller one."""
    from mbridge_offload.diagnosis.config_source import load_run_config
    from mbridge_offload.planning import largest_host_fitting_fraction

    saved = load_run_config(SAVED_CONFIG)
    host_gib = next(h / 4 for h in range(4, 400)
                    if 0 < (largest_host_fitting_fraction(saved, 1, host_memory_gib=h / 4, gpu_memory_gib=80.0,
                                                          expandable=False)[0] or 0) < 1)
    largest = largest_host_fitting_fraction(saved, 1, host_memory_gib=host_gib, gpu_memory_gib=80.0,
                                            expandable=False)[0]
    [finding] = diag.findings(_host_killed_run(tmp_path, 1.0, host_gib))
    assert finding.fix == f"optimizer.optimizer_cpu_offload=True optimizer.optimizer_offload_fraction={largest:g}"
    assert "below the 1 that failed" in finding.fix_basis


def test_overrides_run_recipe_refused_are_reported_with_their_key_and_fix(diag):
    """run_recipe.py's own report of overrides it could not apply (a typo'd key, a value of the wrong type): each is
    a finding naming the key, what was wrong and the fix the report printed, not 'nothing recognised'."""
    path = diag.write([
        "Building qwen3_1b_proxy_pretrain_config (loading Megatron Bridge) ...",
        "Invalid overrides (2):",
        "  optimizer.optimizer_offload_fraction=abc",
        "      optimizer.optimizer_offload_fraction: expects a float (a number), got 'abc'",
        "      fix: optimizer.optimizer_offload_fraction=<a number, e.g. 0.5 or 1e-4>",
        "  model.optimizer_offload_fraction=0.5",
        "      model.optimizer_offload_fraction: unknown key: GPTModelProvider has no 'optimizer_offload_fraction'",
        "      fix: did you mean model.activation_offload_fraction or optimizer.optimizer_offload_fraction?",
        "",
        "And the configuration the other overrides make (the recipe with every override but those 2):",
        "Validation for 1 GPU: OK (0 errors, 0 warnings)",
    ])
    diagnosis = diag(path)
    assert [(f.label, f.key, f.evidence[0].number) for f in diagnosis.findings] == [
        ("override", "optimizer.optimizer_offload_fraction", 4), ("override", "model.optimizer_offload_fraction", 7)]
    first, second = diagnosis.findings
    assert first.fix == "optimizer.optimizer_offload_fraction=<a number, e.g. 0.5 or 1e-4>"
    assert "model.optimizer_offload_fraction=0.5" in second.what and "unknown key" in second.what
    assert second.fix == "did you mean model.activation_offload_fraction or optimizer.optimizer_offload_fraction?"


LOGS = Path(__file__).parent / "logs"


def test_torch_save_on_a_full_disk_is_the_checkpoint_write(diag):
    """torch.save's writer on a full disk raises 'PytorchStreamWriter failed writing file data/N: file write failed'
    with no errno in the message (the 'unexpected pos' variant is the other): the checkpoint write, not nothing."""
    [finding] = diag.findings(LOGS / "ckpt-file-write-failed.log")
    assert finding.rule_id == "runtime/checkpoint-write-failed" and finding.ranks == {0}
    assert finding.evidence[0].number == 5


@pytest.mark.parametrize("log, line, ranks", [("ecc-uncorrectable.log", 10, {6}), ("xid-79.log", 1, set())])
def test_a_gpu_hardware_fault_is_named_with_the_node_to_drain(log, line, ranks, diag):
    """An uncorrectable ECC error (torch's CUDA error) or the driver's Xid for a GPU fallen off the bus: a fault of
    the GPU itself, not of the run's settings, and nothing recognised before."""
    [finding] = diag.findings(LOGS / log)
    assert finding.rule_id == "runtime/gpu-hardware-fault" and finding.severity == "error"
    assert finding.evidence[0].number == line and finding.ranks == ranks
    assert "--exclude" in finding.fix


def test_an_illegal_memory_access_is_not_called_a_hardware_fault_nor_out_of_memory(diag):
    path = diag.write(["[rank1]: RuntimeError: CUDA error: an illegal memory access was encountered",
                            "gpu-node-07:18241:18290 [1] include/alloc.h:125 NCCL WARN Failed to CUDA calloc 6291456 bytes"])
    assert diag.ids(path) == ["runtime/cuda-illegal-address"]


def test_nan_in_the_loss_or_gradients_is_named_where_the_run_first_showed_it(diag):
    """Megatron's iteration line counting a NaN iteration, then its check raising 'found NaN in local grad norm':
    a diverged run, which was 'nothing recognised'."""
    [finding] = diag.findings(LOGS / "nan-grad-norm.log")
    assert finding.rule_id == "runtime/nan-loss-or-grad" and finding.severity == "error"
    assert [line.number for line in finding.evidence] == [2, 12] and finding.ranks == {3}
    assert "optimizer.lr" in finding.fix


def test_a_run_without_nan_iterations_is_not_called_diverged(diag):
    path = diag.write([" iteration        3/    1000 | grad norm: 1.512 | number of skipped iterations:   1 | "
                            "number of nan iterations:   0 |", "  check_for_nan_in_loss_and_grad ....... True"])
    assert diag.ids(path) == []


@pytest.mark.parametrize("log, line", [("hydra-override.log", 6), ("hydra-override-syntax.log", 4)])
def test_a_hydra_override_megatron_bridge_could_not_apply_is_named(log, line, diag):
    """Megatron Bridge's scripts apply command-line overrides with Hydra's parser: a key the config lacks ('Could not
    override') or a malformed override ('Error parsing override') stops the launch. It was 'nothing recognised'."""
    [finding] = diag.findings(LOGS / log)
    assert finding.rule_id == "runtime/hydra-override" and finding.evidence[0].number == line
    assert "+key=value" in finding.fix


def test_a_sigkill_torchruns_agent_sent_after_another_rank_failed_is_not_the_host_killer(diag):
    """torchrun's agent stops the other ranks once one fails ('Sending process 18243 closing signal SIGTERM'), and
    SIGKILLs one that outlives the grace period: that rank's exitcode -9 is the agent's, not the kernel's."""
    assert diag.ids(LOGS / "oom-then-agent-kill.log") == ["runtime/cuda-oom"]


def test_a_sigkill_of_a_rank_the_agent_did_not_stop_is_still_the_host_killer(diag):
    path = diag.write([
        "W1205 03:24:58.201000 18200 torch/distributed/elastic/multiprocessing/api.py:897] Sending process 18243 "
        "closing signal SIGTERM",
        "E1205 03:25:03.330000 18200 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: -9) "
        "local_rank: 2 (pid: 18242) of binary: /opt/venv/bin/python",
        "  exitcode  : -9 (pid: 18242)", "  traceback : Signal 9 (SIGKILL) received by PID 18242"])
    assert diag.ids(path) == ["runtime/host-memory-killed"]


def test_nccl_errors_after_the_schedulers_stop_are_its_consequence_and_the_stop_comes_first(diag):
    """Slurm's time limit stopped the job; a rank's NCCL then lost its peers (ncclRemoteError). That is the stop's
    consequence, not a failure to fix: it was named the first failure, with the stop a mere warning below it."""
    diagnosis = diag(LOGS / "timelimit-then-nccl.out")
    by_id = {f.rule_id: f for f in diagnosis.findings}
    assert set(by_id) == {"runtime/job-stopped", "runtime/nccl-error"}
    assert "[runtime/job-stopped]" in by_id["runtime/nccl-error"].consequence_of
    assert diagnosis.first_failure is by_id["runtime/job-stopped"]
    assert diagnosis.to_json()["first_failure"] == "runtime/job-stopped"


@pytest.mark.parametrize("lines", [
    ["[rank0]: RuntimeError: DataLoader worker (pid 22011) is killed by signal: Bus error. It is possible that "
     "dataloader's workers are out of shared memory. Please try to raise your shared memory limit."],
    ["[rank1]: RuntimeError: unable to write to file </torch_18692_1954506624_0>: No space left on device (28)"],
])
def test_the_data_loaders_shared_memory_running_out_is_named(lines, diag):
    """A container's small /dev/shm (Docker's 64 MB): the data-loader workers' bus error or their full shared-memory
    file. It was 'nothing recognised' (the full /dev/shm is rightly not the checkpoint's disk)."""
    assert diag.ids(diag.write(lines)) == ["runtime/shared-memory"]
    assert diag.ids(LOGS / "shm-bus-error.log") == ["runtime/shared-memory"]


@pytest.mark.parametrize("padding", ["end", "middle"])
def test_a_log_with_blocks_of_nul_bytes_is_read_as_text(tmp_path, padding, diag):
    """A node that crashed or rebooted leaves its log's unwritten blocks as NUL bytes (the file's size was set, its
    data never reached the disk): the log was refused as 'not a text log'. Its text is read, its lines numbered as
    `grep -a -n` numbers them."""
    text = _as_plain(_oom_log())
    path = tmp_path / "log.txt"
    cut = text.index(b"\n") + 1
    path.write_bytes(text + b"\x00" * 8192 if padding == "end" else text[:cut] + b"\x00" * 4096 + text[cut:])
    [finding] = diag.findings(path)
    assert finding.rule_id == "runtime/cuda-oom" and finding.evidence[0].number == len(_oom_log())


def test_the_resume_keyerror_on_a_parameter_is_the_resume_rule(diag):
    """The same failed lookup in _update_fp32_params_by_new_state where the key is an nn.Parameter: Python prints
    'KeyError: Parameter containing:' and the tensor on the lines below it."""
    [finding] = diag.findings(LOGS / "resume-keyerror-parameter.log")
    assert finding.rule_id == "runtime/resume-offload-keyerror" and finding.evidence[0].number == 7
    assert finding.ranks == {1}


@pytest.mark.parametrize("log, lines, line", [
    ("k8s-oomkilled.txt", None, 7),  # kubectl describe pod: the container's last state
    ("compose.log", ["qwen3-train-1 exited with code 137"], 1),  # docker compose: 128 + SIGKILL
])
def test_a_containers_kill_for_memory_is_the_host_kill(log, lines, line, diag):
    path = diag.write(lines, log) if lines else LOGS / log
    [finding] = diag.findings(path)
    assert finding.rule_id == "runtime/host-memory-killed" and finding.evidence[0].number == line


def test_slurms_node_failure_is_the_hardware_not_nothing(diag):
    """Slurm cancels a job whose node failed ('Node failure on', 'DUE TO NODE FAILURE'): the node, not the run."""
    [finding] = diag.findings(LOGS / "slurm-node-failure.out")
    assert finding.rule_id == "runtime/gpu-hardware-fault" and finding.evidence[0].number == 2


# --- crashes, start-up and stops that were 'nothing recognised' or blamed on memory ---------------------------------

def names_the_first_failure(diagnosis, found: list[str], line: int, ranks: set[int]) -> None:
    """The rules found, in order; the first at the line and ranks where it first shows, with its words; every error
    after it marked as a consequence."""
    assert [f.rule_id for f in diagnosis.findings] == found
    first = diagnosis.findings[0]
    assert (first.evidence[0].number, first.ranks) == (line, ranks)
    assert all(f.consequence_of for f in diagnosis.findings[1:] if f.severity == "error")
    stopped = first.rule_id == "runtime/job-stopped"  # stopped from outside: nothing of the run failed
    assert diagnosis.first_failure is (None if stopped else first)
    assert first.fix and first.confirm and first.what


@pytest.mark.parametrize("log, found, line, ranks", [
    # torchrun, 4 ranks, warnings first: rank 3's illegal address, NCCL's calloc after it, the others' watchdog
    # (rank 3's SIGABRT after it, torchrun's exitcode -6, is how its process ended: a consequence)
    ("illegal-address-torchrun.log", ["runtime/cuda-illegal-address", "runtime/nccl-timeout", "runtime/rank-aborted"],
     29, {3}),
    # NCCL's own words ("Cuda failure 700"), under srun --label; Slurm cancels the step after it: no stop
    ("illegal-address-nccl.out", ["runtime/cuda-illegal-address"], 2, {1}),
    # Transformer Engine's cuDNN call ("err 700 != CUDA_SUCCESS"), colours and CRLF
    ("illegal-address-te.log", ["runtime/cuda-illegal-address"], 9, {5}),
    ("device-side-assert.log", ["runtime/device-side-assert"], 1, {1}),
    # Python's faulthandler, torchrun's "exitcode: -11" and its failure block, behind torchrun's --tee prefix
    ("segfault-torchrun.log", ["runtime/rank-crashed"], 2, {0}),
    ("segfault-srun.out", ["runtime/rank-crashed"], 2, {5}),
    # a SIGBUS with nothing of shared memory near: a crash, not /dev/shm
    ("sigbus-rank.log", ["runtime/rank-crashed"], 2, {2}),
    # NCCL's shared-memory segment in a container's 64 MB /dev/shm, docker compose's column before each line
    ("nccl-shm-compose.log", ["runtime/shared-memory", "runtime/nccl-error"], 2, set()),
    ("rendezvous-master.log", ["runtime/rendezvous-timeout"], 10, {0}),
    ("rendezvous-client.out", ["runtime/rendezvous-timeout"], 1, {1}),
    ("rendezvous-timeout.log", ["runtime/rendezvous-timeout"], 6, set()),
    # docker compose stopped (Ctrl-C, v2; "Stopping NAME ...", v1): the 137 that follows is docker's SIGKILL
    ("compose-stop.log", ["runtime/job-stopped"], 2, set()),
    ("compose-v1-stop.log", ["runtime/job-stopped"], 2, set()),
    # a copy cut inside torch's message, CRLF, no final newline: the OOM with the numbers it kept
    ("oom-cut-short.log", ["runtime/cuda-oom"], 3, {3}),
])
def test_unseen_failure_logs_name_the_failure_where_it_first_shows(diag, log, found, line, ranks):
    names_the_first_failure(diag(LOGS / log), found, line, ranks)


def test_an_illegal_address_is_not_out_of_memory_whatever_follows_it():
    """After an illegal address NCCL's allocations fail too ('Failed to CUDA calloc'): no OOM finding, so no fix that
    asks for more offload."""
    ids = [f.rule_id for f in diagnose([LOGS / "illegal-address-torchrun.log"], build_config=False)[0].findings]
    assert not {"runtime/oom-outside-pytorch", "runtime/cuda-oom", "runtime/gpu-hardware-fault"} & set(ids)


def test_a_crash_fix_bisects_only_the_offload_settings_the_run_had_on(diag):
    """The header says optimizer offload on, activation offload off: the bisection names the optimizer offload and the
    engine, never a setting the run did not have."""
    [finding] = diag.findings(LOGS / "illegal-address-te.log")
    assert finding.fix.startswith("rerun with CUDA_LAUNCH_BLOCKING=1")
    bisect = finding.fix.split("to find which: ")[1]
    assert bisect == "optimizer.optimizer_cpu_offload=False, ++env_vars.MBRIDGE_OFFLOAD_ENGINE=library"
    assert "header" in finding.fix_basis
    off = diag.write(HEADER[:1] + ["  optimizer offload: off", "  activation offload (layer-level): off",
                                   "  fine-grained activation offload: off", "Segmentation fault (core dumped)"])
    [crash] = diag.findings(off)
    assert crash.rule_id == "runtime/rank-crashed" and "had no offload on" in crash.fix


def test_a_sigbus_near_dev_shm_is_shared_memory_not_a_crash(diag):
    lines = ["[rank1]: RuntimeError: unable to mmap 65536 bytes from file </dev/shm/torch_18692_1954506624_0>",
             "Fatal Python error: Bus error", "  traceback : Signal 7 (SIGBUS) received by PID 18692"]
    assert diag.ids(diag.write(lines)) == ["runtime/shared-memory"]


def test_the_start_ups_store_is_no_collective_timeout(diag):
    """A rank fetching NCCL's id from the store after the first rank died names NCCL and a timeout on one line: the
    rendezvous, after the first failure, not the watchdog's collective timeout."""
    path = diag.write([f"[rank0]: {line}" for line in (*TRACEBACK, OOM)] + [
        "[rank1]: torch.distributed.DistBackendError: [1] is setting up NCCL communicator and retrieving ncclUniqueId "
        "from [0] via c10d key-value store by key '0', but store->get('0') got error: Socket Timeout",
        "[rank2]: torch.distributed.DistBackendError: [2] is setting up NCCL communicator and retrieving ncclUniqueId "
        "from [0] via c10d key-value store by key '0', but store->get('0') got error: NCCL timed out"])
    diagnosis = diag(path)
    assert [f.rule_id for f in diagnosis.findings] == ["runtime/cuda-oom", "runtime/rendezvous-timeout"]
    assert "[runtime/cuda-oom] on rank 0" in diagnosis.findings[1].consequence_of


def test_a_docker_137_without_a_stop_is_still_the_host_kill_and_compose_columns_name_no_rank(diag):
    path = diag.write(["train-1  | [rank0]: iteration 3", "train-1 exited with code 137"])
    assert diag.ids(path) == ["runtime/host-memory-killed"]
    assert strip_rank("train-1  | [rank3]: Killed") == (3, "Killed")
    assert strip_rank("qwen3_train_1  | Killed") == (None, "Killed")


# --- aborts, checkpoints, the node's CUDA, the network, the user's code, a clean stop ------------------------------

@pytest.mark.parametrize("log, found, line, ranks", [
    # C++'s terminate on an exception no rule names (its what() is the measured reason), torchrun's exitcode -6
    ("abort-c10-error.log", ["runtime/rank-aborted"], 3, {1}),
    # the shell's "Aborted (core dumped)" of a batch script, and srun's task line
    ("aborted-core-dumped.out", ["runtime/rank-aborted"], 5, {0}),
    # a full disk ([Errno 28]) or a quota ([Errno 122]) while torch's distributed checkpoint writes its files
    ("disk-full-errno28.log", ["runtime/checkpoint-write-failed"], 6, {0}),
    ("quota-exceeded.log", ["runtime/checkpoint-write-failed"], 4, {2}),
    ("permission-denied-ckpt.log", ["runtime/path-not-writable"], 8, {0}),
    # a checkpoint cut short (torch.load's zip reader), without dist-checkpointing's metadata.json, without .metadata
    ("ckpt-zip-corrupt.log", ["runtime/checkpoint-unreadable"], 9, {0}),
    ("ckpt-not-distributed.log", ["runtime/checkpoint-unreadable"], 5, {1}),
    ("ckpt-dcp-metadata-missing.log", ["runtime/checkpoint-unreadable"], 6, {0}),
    ("ckpt-shape-mismatch.log", ["runtime/checkpoint-model-mismatch"], 6, {0}),
    # dist-checkpointing's own check of a tensor's global shape (another vocabulary padding, another model)
    ("ckpt-dist-shape-mismatch.log", ["runtime/checkpoint-model-mismatch"], 5, {1}),
    ("cuda-driver-old.log", ["runtime/cuda-driver-too-old"], 6, {0}),
    ("no-gpu.log", ["runtime/no-gpu-visible"], 4, {0}),
    ("no-device-detected.log", ["runtime/no-gpu-visible"], 1, {1}),
    ("no-kernel-image.log", ["runtime/gpu-arch-unsupported"], 3, {0}),
    ("libcudart-missing.log", ["runtime/cuda-library-missing"], 6, set()),
    ("libnccl-missing.log", ["runtime/cuda-library-missing"], 6, set()),
    ("te-undefined-symbol.log", ["env/transformer-engine"], 6, set()),
    # NCCL's own warning of the failed link comes first; torch's ncclRemoteError / ncclSystemError follows from it
    ("nccl-ib-completion.log", ["runtime/nccl-network", "runtime/nccl-error"], 1, {12}),
    ("nccl-socket-reset.log", ["runtime/nccl-network", "runtime/nccl-error"], 1, set()),
    # 337 normal iterations, then one whose loss is NaN (the skipped and the NaN counters both 1)
    ("nan-after-300.log", ["runtime/nan-loss-or-grad"], 338, {0}),
])
def test_more_unseen_failure_logs_name_the_failure_where_it_first_shows(diag, log, found, line, ranks):
    names_the_first_failure(diag(LOGS / log), found, line, ranks)


@pytest.mark.parametrize("log, found, ranks", [
    ("abort-watchdog.log", ["runtime/nccl-timeout", "runtime/rank-aborted"], {3}),  # the timeout is on the what() line
    ("slurm-nccl-timeout.out", ["runtime/nccl-timeout", "runtime/rank-aborted"], {3, 5}),  # srun: "tasks 3,5: Aborted"
])
def test_an_abort_after_a_named_failure_is_its_consequence(diag, log, found, ranks):
    """The NCCL watchdog's timeout takes the process down with SIGABRT (C++'s terminate, torchrun's exitcode -6): the
    timeout is the failure, the abort how the rank ended."""
    diagnosis = diag(LOGS / log)
    assert [f.rule_id for f in diagnosis.findings] == found
    timeout, abort = diagnosis.findings
    assert diagnosis.first_failure is timeout and timeout.ranks == ranks and not timeout.consequence_of
    assert "[runtime/nccl-timeout]" in abort.consequence_of


def test_an_abort_says_the_exception_it_ended_on_and_bisects_the_offload_it_had(diag):
    [abort] = diag.findings(LOGS / "abort-c10-error.log")
    assert abort.measured == "the exception: c10::Error: invalid device pointer: 0x7f1c2a000000"
    [abort] = diag.findings(LOGS / "aborted-core-dumped.out")  # its header: optimizer offload on, the others off
    assert abort.fix.split("to find which: ")[1] == ("optimizer.optimizer_cpu_offload=False, "
                                                      "++env_vars.MBRIDGE_OFFLOAD_ENGINE=library")


def test_an_exception_terminate_names_is_that_failure_and_the_abort_its_consequence(diag):
    """terminate's line names std::bad_alloc, a failed host allocation: that line is the allocation's finding, not a
    second one of the abort; the shell's "Aborted" below it is how the process ended."""
    path = diag.write(["terminate called after throwing an instance of 'std::bad_alloc'", "  what():  std::bad_alloc",
                       "Aborted (core dumped)"])
    allocation, abort = diag.findings(path)
    assert allocation.rule_id == "runtime/host-allocation-failed" and not allocation.consequence_of
    assert abort.rule_id == "runtime/rank-aborted" and [line.number for line in abort.evidence] == [3]
    assert "[runtime/host-allocation-failed]" in abort.consequence_of


@pytest.mark.parametrize("log, line, exception, frame", [
    ("user-keyerror-dataset.log", 13, "KeyError: 'input_ids'", "/home/ana/sft_data.py:41, in __getitem__"),
    ("user-attributeerror-callback.log", 7, "AttributeError: 'TrainState' object has no attribute 'consumed_tokens'",
     "/home/li/callbacks/wandb_extra.py:27, in on_train_step_end"),
])
def test_an_exception_in_the_users_code_is_named_with_its_last_frame_not_blamed_on_offload(diag, log, line, exception,
                                                                                           frame):
    finding = diag.only(LOGS / log, "runtime/python-exception")
    assert finding.evidence[0].number == line and finding.evidence[0].text == exception and finding.ranks == {0}
    assert finding.measured == f"{exception} in {frame} (the traceback's last frame)"
    assert "offload" not in finding.fix.split("if that frame is in mbridge_offload")[0]


def test_a_traceback_of_a_named_failure_is_that_failure_only(diag):
    assert diag.ids(diag.write([f"[rank2]: {line}" for line in (*TRACEBACK, OOM)])) == ["runtime/cuda-oom"]


def test_a_run_stopped_at_its_time_limit_without_an_error_says_nothing_failed(diag):
    diagnosis = diag(LOGS / "timelimit-clean.out")
    assert [f.rule_id for f in diagnosis.findings] == ["runtime/job-stopped"] and diagnosis.first_failure is None
    assert "nothing failed: the job was stopped from outside" in format_diagnosis(diagnosis).split("\n")[0]


@pytest.mark.parametrize("end", ["SystemExit: 0", ""])
def test_a_traceback_that_ends_in_an_exit_or_nothing_is_no_failure_of_code(diag, end):
    """Megatron exits with SystemExit after its SIGTERM handler saved; a log cut inside a traceback shows no
    exception: neither names a failure."""
    lines = [f"[rank0]: {line}" for line in (*TRACEBACK, end)] if end else TRACEBACK
    assert diag.ids(diag.write(lines)) == []


def test_a_traceback_that_ends_in_a_ctrl_c_is_the_jobs_stop_not_a_failure_of_code(diag):
    diagnosis = diag(diag.write([f"[rank0]: {line}" for line in (*TRACEBACK, "KeyboardInterrupt")]))
    assert [f.rule_id for f in diagnosis.findings] == ["runtime/job-stopped"] and diagnosis.first_failure is None
    assert diagnosis.findings[0].measured == "stopped by Ctrl-C (KeyboardInterrupt)"


@pytest.mark.parametrize("line", [
    "gpu-server320 [5] misc/socket.cc:46 NCCL WARN socketProgressOpt: Call to send to 10.44.137.149<52905> failed : "
    "Connection reset by peer",
    "ubuntu:39964:40044 [0] misc/socket.cc:49 NCCL WARN socketProgress: Connection closed by remote peer node1<57557>",
    "H100-2:19989:20082 [1] transport/net_ib.cc:1295 NCCL WARN NET/IB : Got completion from peer "
    "fe80::966d:ae03:8b:df78%ib0<53249> with error 4, opcode 32564, len 32564, vendor err 81 (Send)",
])
def test_nccls_socket_and_infiniband_warnings_are_the_network(line, diag):
    assert diag.ids(diag.write([line])) == ["runtime/nccl-network"]


def test_a_network_warning_after_a_rank_failed_is_that_failures_consequence(diag):
    """A peer that died leaves the others' links failing: the OOM before is the cause."""
    path = diag.write([f"[rank0]: {line}" for line in (*TRACEBACK, OOM)] + [
        "node1:248281:248334 [2] misc/socket.cc:518 NCCL WARN Net : Call to recv from 172.17.0.2<40537> failed : "
        "Connection reset by peer"])
    oom, network = diag.findings(path)
    assert oom.rule_id == "runtime/cuda-oom" and "[runtime/cuda-oom] on rank 0" in network.consequence_of


def test_the_same_exception_on_several_ranks_is_one_finding_naming_each_rank(diag):
    frame = '  File "/home/ana/sft_data.py", line 41, in __getitem__'
    path = diag.write([f"[rank{r}]: {line}" for r in (1, 3) for line in
                       ("Traceback (most recent call last):", frame, "KeyError: 'input_ids'")])
    finding = diag.only(path, "runtime/python-exception")
    assert finding.ranks == {1, 3} and [line.number for line in finding.evidence] == [3, 6]


# --- stops from outside, and libraries not built for each other (Qwen3 dense and MoE runs) ---------------------------

@pytest.mark.parametrize("log, found, line, ranks, measured", [
    # a Slurm preemption reaches torchrun's agent (Python 3.12 prints the signal as 15); its workers' -15 follow it
    ("preempt-torchrun-sigterm.log", ["runtime/job-stopped"], 21, set(), "stopped by a stop signal to torchrun (SIGTERM)"),
    # Ctrl-C: CRLF, tqdm's redraws, the traceback ends in KeyboardInterrupt
    ("ctrl-c-single-gpu.log", ["runtime/job-stopped"], 16, set(), "stopped by Ctrl-C (KeyboardInterrupt)"),
    # Slurm's --signal=USR1 to a batch script without a handler
    ("slurm-usr1.out", ["runtime/job-stopped"], 3, set(range(8)), "stopped by a stop signal (SIGUSR1)"),
])
def test_a_stop_from_outside_reads_as_a_stop_with_what_sent_it(diag, log, found, line, ranks, measured):
    diagnosis = diag(LOGS / log)
    names_the_first_failure(diagnosis, found, line, ranks)
    assert diagnosis.findings[0].measured == measured
    assert "nothing failed: the job was stopped from outside" in format_diagnosis(diagnosis).split("\n")[0]


def test_a_preemption_says_how_to_resume_the_run_with_its_offload(diag):
    """The log's command saved to /lustre/ck/qwen3-30b-a3b with 75% of the optimizer offloaded: the fix is that
    folder's resume, keeping the offload as saved; a time limit adds a longer --time, a run without
    checkpoint.save has nothing to resume."""
    [stop] = diag.findings(LOGS / "preempt-torchrun-sigterm.log")
    assert stop.fix.startswith("resume with the same command plus checkpoint.load=/lustre/ck/qwen3-30b-a3b; ")
    assert "optimizer offload on at fraction 0.75" in stop.fix and "rules checkpoint/*" in stop.fix
    assert "--signal=TERM@120" in stop.fix and "header" in stop.fix_basis
    command = "python scripts/run_recipe.py --recipe qwen3_8b_pretrain_config --num-gpus 8"
    timeout = "slurmstepd: error: *** JOB 4242 ON gpu-node-03 CANCELLED AT 2026-12-04T11:00:03 DUE TO TIME LIMIT ***"
    [stop] = diag.findings(diag.write([command, timeout]))
    assert stop.fix.startswith("nothing was saved (the command sets no checkpoint.save)") and "--time" in stop.fix


def test_a_rank_that_ends_on_sigterm_after_another_failed_is_no_stop(diag):
    """srun SIGTERMs the other tasks once one crashed; torchrun's agent SIGTERMs its workers once one failed."""
    path = diag.write(["srun: error: gpu-node-12: task 5: Segmentation fault (core dumped)",
                       "srun: error: gpu-node-12: tasks 0-4,6-7: Terminated"])
    assert diag.ids(path) == ["runtime/rank-crashed"]
    assert diag.ids(diag.write(["srun: error: gpu-node-12: tasks 0-7: Terminated"])) == ["runtime/job-stopped"]


@pytest.mark.parametrize("log, line, ranks", [
    # flash-attn built against another torch, four ranks interleaved; torchrun's ChildFailedError after it
    ("flash-attn-undefined-symbol.log", 6, {0, 1, 2, 3}),
    # Transformer Engine's packages at different versions; the copy cut inside its last line
    ("te-package-mismatch.log", 6, {0}),
    # Qwen3 MoE's fused grouped MLP on a Transformer Engine older than it needs; the agent's SIGTERM after it
    ("moe-te-too-old.log", 7, {0, 1}),
])
def test_libraries_not_built_for_each_other_are_named_before_their_tracebacks(diag, log, line, ranks):
    names_the_first_failure(diag(LOGS / log), ["runtime/library-version-mismatch"], line, ranks)



# --- days-long offloaded runs: the failure a peer's NCCL error printed ahead of ------------------------------------

@pytest.mark.parametrize("log, line, ranks", [
    # torchrun: ranks 1, 3, 6 print that their peer exited; torchrun's failure block for rank 5's SIGKILL comes after
    ("oom-kill-after-peer-errors.log", 104, {5}),
    # srun: the peers' errors, then srun's 'Out Of Memory' for task 5 and slurmstepd's oom-kill event (CRLF)
    ("oom-kill-slurm-after-peer-errors.out", 103, {5}),
    # only the kernel's own words, pasted below the output: they name a PID, no rank
    ("oom-kill-dmesg-pasted.log", 100, set()),
])
def test_a_kill_printed_after_the_peers_nccl_errors_is_the_failure_they_follow(diag, log, line, ranks):
    """The killed rank prints nothing; the ranks that lost it print NCCL's 'remote process exited' at once, and the kill
    shows only later (the launcher, Slurm, dmesg). The host's kill is the failure, the NCCL errors its consequence, and
    the report starts with the kill."""
    diagnosis = diag(LOGS / log)
    names_the_first_failure(diagnosis, ["runtime/host-memory-killed", "runtime/nccl-error"], line, ranks)
    assert "[runtime/host-memory-killed]" in diagnosis.findings[1].consequence_of


def test_a_kill_of_the_ranks_that_reported_the_lost_peer_is_no_earlier_failure(diag):
    """srun killing every task after rank 0 and 2 lost their peer includes those ranks: the launcher's stop after the
    NCCL error, not the peer they lost, so the NCCL error stays the first failure."""
    path = diag.write([line.replace("[rank1]", "[rank0]").replace("Rank 1", "Rank 0") for line in (
        "[rank1]: ncclRemoteError: A call failed possibly due to a network error or a remote process exiting "
        "prematurely.",)] + ["[rank2]: ncclRemoteError: A call failed possibly due to a network error or a remote "
                             "process exiting prematurely.", "srun: error: gpu-node-12: tasks 0-7: Killed"])
    assert diag(path).first_failure.rule_id == "runtime/nccl-error"


@pytest.mark.parametrize("log, found, line, ranks", [
    # cuBLAS's GEMM kernel failed to run after 80 healthy steps; the copy's last line cut short
    ("cublas-execution-failed.log", ["runtime/cuda-illegal-address", "runtime/nccl-error"], 98, {2}),
    ("unspecified-launch-failure.log", ["runtime/cuda-illegal-address", "runtime/nccl-error"], 96, {4}),
    # Megatron's hybrid optimizer allocating its pinned grads (torch.empty(..., pin_memory=self.pin_cpu_grads))
    ("pinned-hybrid-optimizer-init.log", ["runtime/pinned-host-memory"], 16, {5}),
    # a checkpoint to load that is not there: Megatron Bridge's and dist-checkpointing's words
    ("ckpt-load-not-found.log", ["runtime/checkpoint-not-found"], 12, {0}),
    ("ckpt-step-not-found.log", ["runtime/checkpoint-not-found"], 11, {0}),
    ("ckpt-iter-dir-missing.log", ["runtime/checkpoint-not-found"], 11, {3}),
    # a save that ran out of disk, the copy cut inside the message: the errno says it
    ("disk-full-save-cut.log", ["runtime/checkpoint-write-failed"], 101, {0}),
])
def test_long_run_failures_are_named_not_read_as_a_python_exception(diag, log, found, line, ranks):
    names_the_first_failure(diag(LOGS / log), found, line, ranks)


def test_a_pinned_allocation_is_host_memory_not_the_gpus(diag):
    """The CUDA runtime's 'out of memory' under the hybrid optimizer's pinned allocation asks for no more GPU offload."""
    ids = diag.ids(LOGS / "pinned-hybrid-optimizer-init.log")
    assert "runtime/oom-outside-pytorch" not in ids and "runtime/cuda-oom" not in ids


def test_checkpoint_failures_say_how_to_resume(diag):
    """A failed save resumes from the last save that finished, a load that found nothing names checkpoint.load; with
    optimizer offload both keep its settings as saved."""
    write = diag.only(LOGS / "disk-full-save-cut.log", "runtime/checkpoint-write-failed")
    assert write.key == "checkpoint.save" and "checkpoint.load=<the checkpoint.save folder>" in write.fix
    load = diag.only(LOGS / "ckpt-step-not-found.log", "runtime/checkpoint-not-found")
    assert load.key == "checkpoint.load" and "checkpoint.ckpt_step=" in load.fix
    assert all("optimizer.optimizer_offload_fraction" in f.fix for f in (write, load))


def test_thousands_of_healthy_steps_before_a_kill_change_nothing_but_its_line(diag):
    """5,000 more iteration lines (coloured, as Megatron's logger prints them) ahead of the failure: the same finding,
    5,000 lines further down."""
    lines = (LOGS / "oom-kill-after-peer-errors.log").read_bytes().decode().split("\n")  # tqdm's \r redraws stay one line
    iteration = ("[rank0]: \x1b[32m [2026-12-03 02:11:{s:02d}] iteration {i:>8}/  200000 | consumed samples: {c:>12} | "
                 "elapsed time per iteration (ms): 9211.{s} | lm loss: 2.31{s}E+00 | grad norm: 0.4{s} | number of "
                 "skipped iterations:   0 | number of nan iterations:   0 |\x1b[0m")
    extra = [iteration.format(i=i, c=i * 512, s=i % 60) for i in range(15001, 20001)]
    path = diag.write(lines[:7] + extra + lines[7:])
    names_the_first_failure(diag(path), ["runtime/host-memory-killed", "runtime/nccl-error"], 104 + 5000, {5})


# --- what a probe of diagnose.py found: 137 in each launcher's words, LOGs read one by one, a timeout printed above the
# failure it waited on, a command that cannot be rebuilt, what reading a file has to tell -----------------------------

@pytest.mark.parametrize("line", [
    "srun: error: node1: task 0: Exited with exit code 137",
    "subprocess.CalledProcessError: Command '['python', 'scripts/run_recipe.py']' returned non-zero exit status 137.",
    "  exitcode  : 137 (pid: 2813)",  # torchrun's failure block, a rank that was a shell around python
    "    Exit Code:    137",  # kubectl describe pod
    "ERROR: Job failed: exit code 137",  # a CI runner
    "qwen3-train-1 Exited (137) 5 seconds ago",  # docker ps
    "EXIT CODE: 137",
])
def test_exit_status_137_in_each_launchers_words_is_the_host_kill(line, diag):
    """128 + SIGKILL, as srun, subprocess, Kubernetes and CI runners print it: only docker compose's lower-case
    'exited with code 137' was matched, so srun's and subprocess's were 'nothing recognised'."""
    [finding] = diag.findings(diag.write(["Starting training loop at iteration 0", line]))
    assert finding.rule_id == "runtime/host-memory-killed" and finding.evidence[0].number == 2


@pytest.mark.parametrize("line", [
    "srun: error: node1: task 0: Exited with exit code 1370",
    "exit status 137.5",
    "qwen3-train-1 exited with code 0 after 137 steps",
    "[2026-12-04 10:02:11] iteration      137/    1000 | elapsed time per iteration (ms): 2211.7 |",
])
def test_137_that_is_no_exit_status_is_no_kill(line, diag):
    assert "runtime/host-memory-killed" not in diag.ids(diag.write([line]))


def test_each_log_is_read_on_its_own_and_each_unreadable_one_is_named_on_a_line(tmp_path, capsys):
    """torchrun's --log-dir leaves an empty file for each rank that printed nothing: `diagnose.py logs/*/*` printed
    only the first empty file's refusal and exit 2, and the failed rank's report was lost. Each LOG is read on its
    own; one that cannot be read is named with why on a line of stderr; exit 2 only when none can be read."""
    good = tmp_path / "rank2.log"
    good.write_bytes(_as_plain(_oom_log()))
    empty, binary, folder, missing = (tmp_path / "rank0.log", tmp_path / "model_optim_rng.pt",
                                      tmp_path / "attempt_0", tmp_path / "rank9.log")
    empty.write_bytes(b"")
    binary.write_bytes(bytes(range(256)) * 64)
    folder.mkdir()
    assert main(["--no-build", str(empty), str(good), str(folder), str(binary), str(missing)]) == 0
    out, err = capsys.readouterr()
    assert out.startswith(f"{good} ({len(_oom_log())} lines): 1 finding") and "[runtime/cuda-oom]" in out
    said = err.strip().splitlines()
    assert len(said) == 4
    for path, why in ((empty, "is empty"), (folder, "is a folder without"), (binary, "is not a text log"),
                      (missing, "no such file")):
        assert [line for line in said if str(path) in line and why in line], (path, said)
    # JSON: one report per LOG in the order given, an unreadable one with why and no findings
    assert main(["--no-build", "--json", str(empty), str(good)]) == 0
    first, second = json.loads(capsys.readouterr().out)
    assert first["log"] == str(empty) and "is empty" in first["unreadable"] and first["findings"] == []
    assert second["unreadable"] is None and second["first_failure"] == "runtime/cuda-oom"
    # none can be read: exit 2, each named, then the refusal
    assert main(["--no-build", str(empty), str(missing)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.strip().splitlines()[-1] == "diagnose.py: none of the 2 LOGs could be read"
    assert len(err.strip().splitlines()) == 3


TIMEOUT = ("[rank1]:[E1208 01:00:00.000000 ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught collective operation "
           "timeout: WorkNCCL(SeqNum=12, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600012 "
           "milliseconds before timing out.")


def test_a_timeout_printed_above_the_oom_it_waited_on_follows_that_oom(diag):
    """The watchdog's line is flushed at once, the failed rank's traceback when its process ends (or the log is two
    ranks' files one after the other): the OOM below the timeout is the failure to fix. The timeout was reported as
    the first failure, its fix saying the error 'is above the timeout'."""
    diagnosis = diag(diag.write([TIMEOUT] + [f"[rank0]: {line}" for line in (*TRACEBACK, OOM)]))
    oom_line = 1 + len(TRACEBACK) + 1
    assert [f.rule_id for f in diagnosis.findings] == ["runtime/cuda-oom", "runtime/nccl-timeout"]
    oom, timeout = diagnosis.findings
    assert diagnosis.first_failure is oom and not oom.consequence_of
    assert (f"[runtime/cuda-oom] on rank 0, which failed first (log.txt:{oom_line}, printed below this one)"
            in timeout.consequence_of)
    report = format_diagnosis(diagnosis)
    assert f"the first failure: [runtime/cuda-oom] on rank 0 at log.txt:{oom_line}" in report
    assert "is above the timeout" not in report and "above or below the timeout" in timeout.fix


@pytest.mark.parametrize("after", [
    "Killed",  # a kill that names no rank: the launcher's stop of a rank still stuck after its timeout
    "srun: error: node-03: tasks 0-1: Killed",  # srun's kill of the timed-out rank too
    "[rank1]: RuntimeError: the timed-out rank's own exception",
])
def test_what_follows_a_timeout_on_its_own_rank_or_unnamed_is_not_what_it_waited_on(after, diag):
    diagnosis = diag(diag.write([TIMEOUT, after]))
    timeout = diagnosis.findings[0]
    assert timeout.rule_id == "runtime/nccl-timeout" and not timeout.consequence_of


@pytest.mark.parametrize("command, why", [
    ("uv run scripts/run_recipe.py --recipe qwen3_nonexistent_config -of 0.3",
     "its recipe 'qwen3_nonexistent_config' is no recipe of this checkout"),
    ("uv run scripts/run_recipe.py --recipe qwen3_1b_proxy_pretrain_config 'model.offload_modules=[core_attn",
     "(log.txt:1) could not be read: its words cannot be split as the shell splits them (No closing quotation)"),
])
def test_a_command_that_cannot_be_rebuilt_says_so_and_why(command, why, diag):
    """The log starts with the run_recipe.py command: the fix's basis asked for 'a log that starts with the
    run_recipe.py command' all the same. It says the command was found, and why it gives no config. (Neither case
    loads Megatron: the recipe is unknown, or the line is not split.)"""
    [finding] = diag.findings(diag.write([command, f"[rank0]: {OOM}"]), build_config=True)
    assert finding.rule_id == "runtime/cuda-oom" and why in finding.fix_basis
    assert "no config of this run was found" not in finding.fix_basis
    assert "starts with the run_recipe.py command" not in finding.fix_basis


def test_a_command_not_built_under_no_build_says_so(diag):
    [finding] = diag.findings(diag.write([HEADER[0], f"[rank0]: {OOM}"]))  # build_config=False: --no-build
    assert "the recipe of the log's command (qwen3_8b_pretrain_config) was not built (--no-build)" in finding.fix_basis


def test_a_one_line_log_says_1_line(diag):
    diagnosis = diag(diag.write([f"[rank0]: {OOM}"]))
    assert format_diagnosis(diagnosis).startswith(f"{diagnosis.log} (1 line): 1 finding")


def _noisy_steps(count: int) -> list[str]:
    """Lines that compress little, so that a compressed log spans many of its format's blocks."""
    noise = random.Random(0)
    return [f"[rank0]: step {i} {noise.getrandbits(256):064x}" for i in range(count)]


@pytest.mark.parametrize("compress, name", [(gzip.compress, "gzip"), (lambda data: bz2.compress(data, 1), "bzip2")])
def test_a_compressed_log_cut_short_says_so_beside_what_it_holds(tmp_path, compress, name, diag):
    """A copy made while the run still wrote it was read without a word: its end, where a failure is printed, is
    missing, and the report says so."""
    whole = compress(_as_plain(_oom_log() + _noisy_steps(20_000)))
    path = tmp_path / "slurm-991234.out.gz"
    path.write_bytes(whole[: len(whole) * 3 // 4])
    diagnosis = diag(path)
    assert [f.rule_id for f in diagnosis.findings][0] == "runtime/cuda-oom"
    [note] = diagnosis.notes
    assert note.startswith(f"{path} is a {name} file cut short")
    assert f"  note: {note}" in format_diagnosis(diagnosis) and diagnosis.to_json()["notes"] == [note]


def test_a_compressed_log_damaged_part_way_gives_the_text_before_the_damage(tmp_path, diag):
    """Bytes overwritten in the middle of a .gz: the lines before the damage are diagnosed (they were refused as a
    file that 'cannot be decompressed'), with a note that says so."""
    whole = bytearray(gzip.compress(_as_plain(_oom_log() + _noisy_steps(20_000))))
    middle = len(whole) // 2
    whole[middle: middle + 64] = b"\xff" * 64
    path = tmp_path / "log.txt.gz"
    path.write_bytes(bytes(whole))
    diagnosis = diag(path)
    assert diagnosis.findings[0].rule_id == "runtime/cuda-oom"
    assert diagnosis.notes and "damaged part-way" in diagnosis.notes[0]


@pytest.mark.parametrize("text, why", [
    ('{"reason": "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.", ', "is not valid JSON"),
    ('{"error": "CUDA out of memory. Tried to allocate 2.00 GiB."}', 'holds no "reason" text'),
])
def test_a_failure_json_that_is_no_failure_record_says_so(tmp_path, text, why, diag):
    """A run's own failure record that cannot be read (a disk that filled while it was written) was read as plain
    text without a word."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "failure.json").write_text(text)
    diagnosis = diag(run)
    assert [f.rule_id for f in diagnosis.findings] == ["runtime/cuda-oom"]
    [note] = diagnosis.notes
    assert note.startswith(f"{run / 'failure.json'} {why}") and "read as plain text" in note
    assert f"  note: {note}" in format_diagnosis(diagnosis)
