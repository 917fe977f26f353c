"""diagnose.py on real and realistic logs: which rule each failure maps to, the evidence lines, the fix
computed with the planner from a real run_config.yaml, the 'nothing recognised' path and the exit codes.
The committed logs of docs/benchmarks/ are real H200 runs; logs/ holds the formats no run here produced
(torchrun's ChildFailedError block, Slurm's labelled ranks, upstream tracebacks)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mbridge_offload.cli.diagnose import main
from mbridge_offload.diagnosis import diagnose
from mbridge_offload.diagnosis.config_source import load_run_config
from mbridge_offload.diagnosis.logs import strip_rank
from mbridge_offload.diagnosis.run_facts import OutOfMemory
from mbridge_offload.facts.environment import ALLOC_CONF_ENV, allocator_line
from mbridge_offload.facts.offload_engine import (ENGINE_MODES, STREAM_MOMENTS_HEADER, STREAM_MOMENTS_SAYS,
                                                  stream_host_bytes_per_param)
from mbridge_offload.facts.run_records import step_records_file
from mbridge_offload.planning import plan
from mbridge_offload.validation import RULES_BY_ID, rules_markdown

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "docs" / "benchmarks"
LOGS = Path(__file__).parent / "logs"
SAVED_CONFIG = BENCH / "resume-parity" / "saved-run_config.yaml"
TORCH_OOM = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.50 GiB. GPU 0 has a total capacity of "
             "79.19 GiB of which 812.00 MiB is free. Including non-PyTorch memory, this process has 78.39 GiB memory "
             "in use. Of the allocated memory 75.12 GiB is allocated by PyTorch, and 1.47 GiB is reserved by PyTorch "
             "but unallocated. If reserved but unallocated memory is large try setting "
             "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.")


def test_rank_prefixes_of_torchrun_slurm_and_mpirun():
    assert strip_rank("[rank3]: KeyError: x") == (3, "KeyError: x")
    assert strip_rank("12: [rank12]:[E1204 ProcessGroupNCCL.cpp:632] x") == (12, "[E1204 ProcessGroupNCCL.cpp:632] x")
    assert strip_rank("[1,5]<stderr>: Killed") == (5, "Killed")
    assert strip_rank("  optimizer offload: off") == (None, "  optimizer offload: off")


def test_oom_numbers_are_parsed_from_torchs_message():
    oom = OutOfMemory.parse(TORCH_OOM)
    assert (oom.requested_gib, oom.capacity_gib, oom.allocated_gib, oom.reserved_unallocated_gib) == (
        3.5, 79.19, 75.12, 1.47)
    assert oom.free_gib == pytest.approx(812 / 1024)
    assert oom.shortfall_gib == pytest.approx(3.5 - 812 / 1024)


def test_real_oom_log_and_its_failure_json(diag):
    """The 8B run on the H200 that ran out of memory at fraction 0 (docs/benchmarks/oom-8b)."""
    for path in (BENCH / "oom-8b/fraction-0/log.txt", BENCH / "oom-8b/fraction-0/failure.json"):
        finding = diag.only(path, "runtime/cuda-oom")
        assert "Tried to allocate 2.32 GiB" in finding.evidence[0].text
        assert finding.measured.startswith("tried to allocate 2.32 GiB, 1.01 GiB free of 139.80 GiB")
        assert finding.fix == RULES_BY_ID["runtime/cuda-oom"].fix(None)  # no config: the generic fix, and why
        assert "pass the run folder" in finding.fix_basis


def test_real_oom_log_gets_the_planners_fraction_from_its_command(built):
    """The log starts with the run_recipe.py command: the recipe and its overrides are rebuilt and planned."""
    [diagnosis] = diagnose([BENCH / "oom-8b/fraction-0/log.txt"])
    [finding] = diagnosis.findings
    fraction = float(finding.fix.split("optimizer.optimizer_offload_fraction=")[1].split()[0])
    assert finding.fix.startswith("optimizer.optimizer_cpu_offload=True") and 0 < fraction < 1
    assert "qwen3_8b_pretrain_config" in diagnosis.config_source
    # the same H200 run at 0.5 trained (docs/benchmarks/oom-8b/fraction-0.5): the fix must not ask for more
    assert fraction <= 0.5


def test_a_command_whose_override_run_recipe_refuses_says_which_not_that_no_command_was_found(built, diag):
    """The recipe builds, the override does not apply (a misspelt key): the fix's basis names the override and what
    run_recipe.py says of it, where it said 'no config of this run was found ... pass a log that starts with the
    run_recipe.py command'."""
    path = diag.write(["$ uv run scripts/run_recipe.py --recipe qwen3_1b_proxy_pretrain_config "
                       "optimizer.optimzer_offload_fraction=0.3", f"[rank0]: {TORCH_OOM}"])
    [finding] = diag.findings(path, build_config=True)
    assert finding.rule_id == "runtime/cuda-oom"
    assert finding.fix_basis.startswith("generic: the log's run_recipe.py command was found but could not be rebuilt: "
                                        "run_recipe.py refuses its override optimizer.optimzer_offload_fraction=0.3 (")
    assert "optimzer_offload_fraction" in finding.fix_basis and "starts with the run_recipe.py" not in finding.fix_basis


def _run_with_saved_config(tmp_path, fraction: float, log_text: str, **changes: str) -> Path:
    """A run folder with the real run_config.yaml (fraction and ``changes``, ``old=new`` lines, edited) and a log."""
    run = tmp_path / "run"
    run.mkdir()
    text = SAVED_CONFIG.read_text().replace("optimizer_offload_fraction: 1.0", f"optimizer_offload_fraction: {fraction}")
    for old, new in changes.items():
        assert text.count(f"  {old}\n") == 1
        text = text.replace(f"  {old}\n", f"  {new}\n")
    assert f"optimizer_offload_fraction: {fraction}" in text
    (run / "run_config.yaml").write_text(text)
    (run / "log.txt").write_text(log_text)
    return run


def test_saved_run_config_plans_like_the_recipe_it_was_saved_from(recipe):
    """The real run_config.yaml (dense proxy, 4 layers, fraction 1, deterministic: the unfused cross entropy, which
    the planner counts) read without Megatron plans byte for byte like the recipe with the run's overrides, as
    run_recipe.py --deterministic launched it: its keys and the environment it needs, which the saved env_vars record
    (without them the launch is refused, deterministic/nccl-algo, and so is its plan)."""
    from overrides import apply_overrides
    from mbridge_offload.facts.determinism import DETERMINISTIC_ENV, DETERMINISTIC_KEYS

    saved = load_run_config(SAVED_CONFIG)
    assert {name: str(saved.env_vars[name]) for name in DETERMINISTIC_ENV} == DETERMINISTIC_ENV
    cfg = apply_overrides(recipe("qwen3_1b_proxy_pretrain_config"), [
        "model.num_layers=4", "train.train_iters=10", "optimizer.optimizer_cpu_offload=True",
        "optimizer.optimizer_offload_fraction=1.0", *(f"{k}={v}" for k, v in DETERMINISTIC_KEYS.items()),
        *(f"++env_vars.{k}={v}" for k, v in DETERMINISTIC_ENV.items())])
    for fraction in (0.0, 0.5, 1.0):
        planned = plan(saved, 1, fraction=fraction)
        assert not planned.unplanned and planned.total_bytes_gpu > 0, planned.unplanned
        assert planned == plan(cfg, 1, fraction=fraction)


def test_oom_at_partial_offload_gets_the_next_fraction_that_fits(tmp_path, diag):
    """A torch OOM at fraction 0.3 with the run's real run_config.yaml beside the log, on a GPU the planner
    says is too small at 0.3: the fix is the smallest larger fraction that fits and frees what was lacking."""
    saved = load_run_config(SAVED_CONFIG)
    failed = plan(saved, 1, fraction=0.3, expandable=False).total_bytes_gpu / 2 ** 30
    gpu = round(failed + 2.0, 2)  # the planner's 4 GiB margin does not fit at 0.3
    message = TORCH_OOM.replace("79.19 GiB", f"{gpu:.2f} GiB").replace("Tried to allocate 3.50 GiB",
                                                                        "Tried to allocate 1.50 GiB")
    shortfall = OutOfMemory.parse(message).shortfall_gib
    run = _run_with_saved_config(tmp_path, 0.3, f"[rank0]: {message}\n")
    finding = diag.only(run / "log.txt", "runtime/oom-partial-offload")
    fraction = float(finding.fix.split("optimizer.optimizer_offload_fraction=")[1].split()[0])

    def good(f):  # the log names no allocator setting: planned with fixed segments, as the fix is
        at = plan(saved, 1, fraction=f, gpu_memory_gib=gpu, expandable=False)
        return at.fits_gpu and failed - at.total_bytes_gpu / 2 ** 30 >= shortfall

    assert fraction > 0.3 and good(fraction)
    assert not any(good(round(f / 100, 2)) for f in range(35, int(round(fraction * 100)), 5))
    assert str(run / "run_config.yaml") in finding.fix_basis


def test_oom_fix_plans_with_the_allocator_setting_the_log_names(tmp_path, diag):
    """run_recipe.py's header names the allocator setting; the fix plans with that reserve. A log without the line
    was not launched by run_recipe.py, where a recipe's setting never reached the allocator: fixed segments. With
    TE's fused loss: the saved run's unfused one keeps an fp32 logits copy that sets both reserves alike. Deterministic
    mode off with it: deterministic mode refuses the fused loss (a launch the planner does not plan)."""
    fused = {"cross_entropy_loss_fusion: false": "cross_entropy_loss_fusion: true",
             "deterministic_mode: true": "deterministic_mode: false"}
    edited = tmp_path / "fused_run_config.yaml"
    text = SAVED_CONFIG.read_text()
    for old, new in fused.items():
        assert text.count(f"  {old}\n") == 1
        text = text.replace(f"  {old}\n", f"  {new}\n")
    edited.write_text(text)
    saved = load_run_config(edited)
    assert not plan(saved, 1, fraction=0.3).unplanned

    def next_fitting(gpu: float, expandable: bool) -> float | None:
        for f in range(35, 101, 5):
            if plan(saved, 1, fraction=f / 100, gpu_memory_gib=gpu, expandable=expandable).fits_gpu:
                return f / 100
        return None

    # a GPU size where the two reserves lead to different fractions, so that the fix shows which one it used
    failed = plan(saved, 1, fraction=0.3, expandable=False).total_bytes_gpu / 2 ** 30
    def differ(gpu: float) -> bool:
        expandable, fixed = next_fitting(gpu, True), next_fitting(gpu, False)
        return expandable is not None and fixed is not None and expandable != fixed

    gpu = next(g for g in (round(failed - i / 10, 2) for i in range(40)) if differ(g))
    message = TORCH_OOM.replace("79.19 GiB", f"{gpu:.2f} GiB").replace("Tried to allocate 3.50 GiB",
                                                                        "Tried to allocate 0.01 GiB")
    headers = {f"  {allocator_line((ALLOC_CONF_ENV, 'expandable_segments:True'))}\n": True,
               f"  {allocator_line(None)}\n": False,
               "": False}
    for i, (header, expandable) in enumerate(headers.items()):
        (tmp_path / str(i)).mkdir()
        run = _run_with_saved_config(tmp_path / str(i), 0.3, f"{header}[rank0]: {message}\n", **fused)
        finding = diag.only(run / "log.txt", "runtime/oom-partial-offload")
        fraction = float(finding.fix.split("optimizer.optimizer_offload_fraction=")[1].split()[0])
        assert fraction == next_fitting(gpu, expandable), header
        said = ("as the log's header says" if header else
                "assumed: neither the log nor a step record names the allocator setting")
        assert f"allocator: {'expandable' if expandable else 'fixed'} segments ({said})" in finding.fix_basis


def test_the_step_records_allocator_setting_outranks_the_header(tmp_path, diag):
    """The header says what run_recipe.py set; the step-1 record what the process's allocator held. Where they
    differ, the fix plans with the record and says where the setting came from."""
    message = TORCH_OOM.replace("Tried to allocate 3.50 GiB", "Tried to allocate 0.01 GiB")
    header = f"  {allocator_line((ALLOC_CONF_ENV, 'expandable_segments:True'))}\n"
    run = _run_with_saved_config(tmp_path, 0.3, f"{header}[rank0]: {message}\n")
    records = step_records_file(run, 0)
    records.write_text(json.dumps({"step": 1, "allocator_expandable_segments": False}) + "\n")
    finding = diag.only(run / "log.txt", "runtime/oom-partial-offload")
    assert f"allocator: fixed segments (as the run's step records say ({records}, step 1))" in finding.fix_basis


def test_an_allocation_outside_pytorch_is_planned_on_the_gpu_its_log_names(tmp_path, diag):
    """NCCL's failed calloc carries no sizes: the fix plans on the GPU size of the run's own plan line (139.801 GiB
    in the H200 log), where the failed fraction fits, so the GPU had less free than planned (docs/benchmarks/
    alloc-tight/: a ballast held the rest). It must not claim that no fraction fits."""
    run = _run_with_saved_config(tmp_path, 1.0, (LOGS / "nccl-calloc-oom.log").read_text())
    finding = diag.only(run / "log.txt", "runtime/oom-outside-pytorch")
    assert finding.fix.startswith("free the GPU of other processes")
    assert "the planner fits fraction 1 on 139.80 GiB" in finding.fix_basis
    # the communicators it failed to make cost less with fewer channels (alloc-tight/: 2.43 -> 1.02 GiB, dense)
    assert finding.fix.endswith("; or NCCL_MAX_NCHANNELS=4 in the launch environment")
    # 5: the saved run is deterministic, and Megatron's own loss adds the tensor-parallel group's communicator;
    # each goes from 194 pages of 2 MiB to 14 at 4 channels (NCCL's log), so 5 x 180 x 2 MiB = 1.76 GiB
    assert "NCCL's communicators: 5 on this run, 0.379 GiB each at 64 channels, 0.027 GiB at 4: 1.76 GiB" in finding.fix_basis
    assert "had less free than planned" in finding.fix_basis
    assert "no optimizer offload fraction fits" not in finding.fix_basis


def test_below_fraction_1_an_allocation_outside_pytorch_gets_no_made_up_fraction(tmp_path, diag):
    """NCCL's message measures nothing: where the plan fits the failed fraction, the fix asks to free the GPU and
    names no fraction step that no number supports."""
    run = _run_with_saved_config(tmp_path, 0.3, (LOGS / "nccl-calloc-oom.log").read_text())
    finding = diag.only(run / "log.txt", "runtime/oom-outside-pytorch")
    assert finding.fix.startswith("free the GPU of other processes")
    assert "optimizer_offload_fraction=" not in finding.fix and "lacked 0.00" not in finding.fix_basis
    assert "the planner fits fraction 0.3 on 139.80 GiB" in finding.fix_basis


def test_a_torch_oom_on_a_shared_gpu_names_the_other_processes(tmp_path, diag):
    """torch's message lists the other processes: where the plan fits the failed fraction, the fix says they held
    the memory the plan counted on."""
    message = (TORCH_OOM.replace("79.19 GiB", "139.80 GiB")
               + " Process 1234 has 118.00 GiB memory in use.")
    run = _run_with_saved_config(tmp_path, 0.3, f"[rank0]: {message}\n")
    finding = diag.only(run / "log.txt", "runtime/oom-partial-offload")
    assert "other processes held 118.00 GiB of it (torch's message)" in finding.fix_basis
    assert "NCCL_MAX_NCHANNELS" not in finding.fix  # a PyTorch allocation failed, not a communicator


def test_oom_with_layer_level_activation_offload_asks_for_optimizer_offload(tmp_path, diag):
    header = ("Training qwen3_1b_proxy_pretrain_config (1 GPU: TP1 PP1 CP1 DP1 EP1 ETP1), 10 steps\n"
              "  optimizer offload: off\n  activation offload (layer-level): ON, 3 of 4 layers\n"
              "  fine-grained activation offload: off\n")
    run = _run_with_saved_config(tmp_path, 0.0, header + TORCH_OOM + "\n", **{
        "optimizer_cpu_offload: true": "optimizer_cpu_offload: false", "cpu_offloading: false": "cpu_offloading: true",
        "cpu_offloading_num_layers: 0": "cpu_offloading_num_layers: 3"})
    finding = diag.only(run / "log.txt", "runtime/oom-with-activation-offload")
    assert finding.fix.startswith("optimizer.optimizer_cpu_offload=True")


@pytest.mark.parametrize("log, rule_id, ranks", [
    # the rank torchrun's failure block names ("rank : 1 (local_rank: 1)") beside its "exitcode : -9" row
    ("torchrun-sigkill.log", "runtime/host-memory-killed", {1}),
    ("megatron-pp-activation-offload.log", "activation-offload/pipeline-parallel", {0}),
    ("apex-fusion.log", "env/apex-gradient-accumulation-fusion", {0}),
    ("hf-offline.log", "runtime/hf-hub-unreachable", set()),
    ("dataset-make.log", "runtime/dataset-helper-makefile", set()),
    ("resume-keyerror.log", "runtime/resume-offload-keyerror", {0}),
    ("pinned-memory.log", "runtime/pinned-host-memory", {2}),
    # excerpt of the H200 run of docs/benchmarks/alloc-tight/ whose NCCL communicator found the device full
    ("nccl-calloc-oom.log", "runtime/oom-outside-pytorch", set()),
])
def test_each_failure_maps_to_its_rule_with_its_fix(log, rule_id, ranks, diag):
    finding = diag.only(LOGS / log, rule_id)
    rule = RULES_BY_ID[rule_id]
    assert (finding.what, finding.key, finding.severity) == (rule.text, rule.key, rule.severity)
    assert finding.fix == (rule.fix_text or rule.fix(None)) and finding.confirm
    assert finding.ranks == ranks and finding.evidence
    assert all(line.number >= 1 and line.text in (LOGS / log).read_text() for line in finding.evidence)


@pytest.mark.parametrize("message, rule_id", [
    ("CPU offloading does not work when activation recomputation is enabled", "activation-offload/recompute"),
    ("CUDA graphs not supported with CPU offloading.", "activation-offload/cuda-graphs"),
    ("fine_grained_activation_offloading cannot be enabled with cpu_offloading.",
     "activation-offload/not-with-fine-grained"),
    ("CPU offloading can be done only for layers less than 16", "activation-offload/num-layers-range"),
])
def test_upstream_assertions_map_through_the_upstream_table(tmp_path, message, rule_id, diag):
    log = tmp_path / "log.txt"
    log.write_text(f"[rank0]:     raise ValueError(\n[rank0]: ValueError: {message}\n")
    assert diag.ids(log) == [rule_id]
    log.write_text(f"the config summary mentions: {message}\n")  # no error raised: no finding
    assert diag.ids(log) == []


def test_torch_oom_is_not_an_allocation_outside_pytorch(tmp_path, diag):
    """torch's own OOM keeps its rule even where NCCL then fails too: only the NCCL allocation line is the other."""
    log = tmp_path / "log.txt"
    log.write_text(f"[rank0]: {TORCH_OOM}\n")
    assert diag.ids(log) == ["runtime/cuda-oom"]
    failed_allocation = (LOGS / "nccl-calloc-oom.log").read_text().splitlines()[-1]
    log.write_text(f"[rank0]: {TORCH_OOM}\n[rank1]: {failed_allocation}\n")
    assert diag.ids(log) == ["runtime/cuda-oom", "runtime/oom-outside-pytorch"]


@pytest.mark.parametrize("line", [
    "node1:4929:5001 [0] include/alloc.h:195 NCCL WARN Failed to CUDA malloc 6291456 bytes",
    "node1:4929:5001 [0] misc/cudawrap.cc:189 NCCL WARN Cuda failure 2 'out of memory'",
    "node1:4929:5001 [0] include/alloc.h:120 NCCL WARN Cuda failure 'out of memory'",
    "RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
    "RuntimeError: cuDNN error: CUDNN_STATUS_ALLOC_FAILED",
])
def test_library_allocation_failures_are_out_of_memory_outside_pytorch(tmp_path, line, diag):
    log = tmp_path / "log.txt"
    log.write_text(f"[rank0]: {line}\n")
    assert diag.ids(log) == ["runtime/oom-outside-pytorch"]


def test_nccls_pinned_host_allocation_is_host_memory_and_a_calloc_after_a_fault_is_not_called_oom(tmp_path, diag):
    """NCCL warns "Cuda failure 2 'out of memory'" for its pinned host buffers too (then "Failed to CUDA host
    alloc"): more offload would make that worse. And its calloc fails after any earlier fault."""
    log = tmp_path / "log.txt"
    log.write_text("[rank0]: node1:4929:5001 [0] misc/cudawrap.cc:189 NCCL WARN Cuda failure 2 'out of memory'\n"
                   "[rank0]: node1:4929:5001 [0] include/alloc.h:48 NCCL WARN Failed to CUDA host alloc 4194304 bytes\n")
    assert diag.ids(log) == ["runtime/pinned-host-memory"]
    log.write_text("[rank0]: RuntimeError: CUDA error: an illegal memory access was encountered\n"
                   "[rank0]: Failed to CUDA calloc async 4 bytes\n")
    assert "runtime/oom-outside-pytorch" not in diag.ids(log)


def test_unhandled_cuda_error_alone_is_not_called_out_of_memory(tmp_path, diag):
    """NCCL's 'unhandled cuda error' has other causes (a kernel fault, a driver error): only the line under it that
    names a failed allocation makes it the out-of-memory rule."""
    lines = [line for line in (LOGS / "nccl-calloc-oom.log").read_text().splitlines()
             if "Failed to CUDA calloc" not in line]
    assert any("unhandled cuda error" in line for line in lines)
    log = tmp_path / "log.txt"
    log.write_text("\n".join(lines) + "\n")
    assert diag.ids(log) == []


def test_cuda_error_outside_pinning_is_not_called_pinned_memory(diag):
    """The CUDA runtime's out-of-memory in a GEMM, no pinned allocation near: a device allocation outside PyTorch's
    allocator (which raises OutOfMemoryError instead), not pinned host memory."""
    assert diag.ids(LOGS / "kernel-error.log") == ["runtime/oom-outside-pytorch"]


def test_real_one_thread_run_is_slow_and_says_why():
    """The H200 benchmark's 100% offload with 1 CPU thread: 4.1x its sibling baseline (the log's warning and
    summary.json's step times)."""
    [diagnosis] = diagnose([BENCH / "offload-overhead/dense-1b/fraction-1-stock-1-thread/log.txt"], build_config=False)
    found = {f.rule_id: f for f in diagnosis.findings}
    assert set(found) == {"runtime/cpu-threads", "runtime/full-offload-slowdown"}
    assert "CPU threads per rank: 1" in found["runtime/cpu-threads"].evidence[0].text
    assert "2.326 s per step at fraction 1 against 0.562 s without offload: 4.14x" in \
        found["runtime/full-offload-slowdown"].measured


def test_all_cores_run_is_not_reported_slow(diag):
    """The same benchmark with 16 threads: 1.85x, below the 4x of the rule."""
    assert diag.ids(BENCH / "offload-overhead/dense-1b/fraction-1-stock-all-cores/log.txt") == []


def test_real_fine_grained_run_has_a_slow_warmup_step(built):
    """docs/benchmarks/fine-grained: the MoE proxy with fine-grained offload, first step 20.9 s then 1.87 s."""
    [diagnosis] = diagnose([BENCH / "fine-grained"])
    [finding] = diagnosis.findings
    assert finding.rule_id == "runtime/fine-grained-warmup" and finding.severity == "warning"
    assert finding.measured.startswith("first step 20.89 s, then 1.87 s per step")


def test_real_checkpoint_write_failure(diag):
    finding = diag.only(BENCH / "resume-parity/moe-disk-full/first-part-error.txt", "runtime/checkpoint-write-failed")
    assert "unexpected pos 704 vs 598" in finding.evidence[0].text and finding.evidence[0].number == 11


def test_real_stop_signal_that_killed_the_data_loader_workers(diag):
    # the H200 run stopped by SIGTERM to its process group before run_recipe.py set the workers' handler
    log = BENCH / "resume-parity/signal-workers-killed/fraction-0.5/first-part/log.txt"
    finding = diag.only(log, "runtime/stop-killed-data-loader-workers")
    assert "is killed by signal: Terminated" in finding.evidence[0].text
    assert "train.exit_signal_handler_for_dataloader=True" in RULES_BY_ID[finding.rule_id].fix(None)


def test_validator_refusal_in_a_log_maps_to_its_rule(tmp_path, diag):
    log = tmp_path / "log.txt"
    log.write_text("Validation for 1 GPU: FAILED (1 error, 0 warnings)\n"
                   "  ERROR   [activation-offload/recompute] model.recompute_granularity = full\n")
    assert diag.ids(log) == ["activation-offload/recompute"]


def test_a_clean_run_recognises_nothing(capsys):
    log = BENCH / "dense-1b-sweep/fraction-0.5/log.txt"
    assert main(["--no-build", str(log)]) == 0
    out = capsys.readouterr().out
    assert "nothing recognised" in out and "nothing is guessed" in out


def test_json_output(capsys):
    clean = BENCH / "dense-1b-sweep/fraction-0.5/log.txt"
    assert main(["--no-build", "--json", str(LOGS / "slurm-nccl-timeout.out"), str(clean)]) == 0
    first, second = json.loads(capsys.readouterr().out)
    assert first["findings"][0]["rule_id"] == "runtime/nccl-timeout"
    assert first["findings"][0]["ranks"] == [3, 5] and first["findings"][0]["evidence"][0]["line"] == 7
    assert second["recognised"] is False and second["findings"] == []


def test_missing_or_unreadable_log_exits_2_naming_the_file(tmp_path, capsys):
    missing = tmp_path / "nope.log"
    assert main([str(missing)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(missing) in err
    empty_dir = tmp_path / "empty"
    empty_dir.mkdir()
    assert main([str(empty_dir)]) == 2
    assert str(empty_dir) in capsys.readouterr().err


def test_help_is_fast_and_does_not_import_megatron():
    started = time.monotonic()
    result = subprocess.run([sys.executable, str(REPO / "scripts/diagnose.py"), "--help"], capture_output=True,
                            text=True, check=True)
    assert "LOG" in result.stdout and time.monotonic() - started < 10
    probe = ("import sys; from mbridge_offload.cli.diagnose import main; main(['--no-build', '" +
             str(LOGS / "torchrun-sigkill.log") + "']); print('megatron' in sys.modules, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip().endswith("False False")


def test_runtime_rules_are_in_the_readme_table_and_never_apply_to_a_config(built):
    from mbridge_offload.validation import Context, check_rules
    from mbridge_offload.validation.rule import RUNTIME

    runtime = [rule for rule in RULES_BY_ID.values() if rule.mechanism == RUNTIME]  # runtime/... and engine/...
    assert {"runtime/cuda-oom", "engine/cpu-step-failed"} <= {rule.id for rule in runtime}
    assert all(rule.log_signatures for rule in runtime)
    assert all(rule.text in rules_markdown() for rule in runtime)
    problems = check_rules(Context(built("qwen3_1b_proxy_optimizer_offload_config"), 1, environ={}))
    assert not [p for p in problems if RULES_BY_ID.get(p.rule_id) in runtime]


def test_run_facts_read_the_gpu_size_from_the_plan_line_of_either_format():
    """The plan's fit line ("GPU: fit ... of 32 GiB", as the auto checks' runs printed it) and the line of runs
    from before the whole-device plan ("GPU: total (+0.5 GiB context) ... of 139.801 GiB")."""
    from mbridge_offload.diagnosis.logs import read_lines
    from mbridge_offload.diagnosis.run_facts import run_facts

    benchmarks = Path(__file__).resolve().parents[2] / "docs" / "benchmarks"
    new = benchmarks / "planner-auto" / "1p7b-sl2048" / "auto" / "log.txt"
    old = benchmarks / "planner-heldout" / "moe-proxy-3" / "fraction-0" / "log.txt"
    assert run_facts(read_lines(new), None).gpu_memory_gib == 32.0
    assert run_facts(read_lines(old), None).gpu_memory_gib == 139.801


def test_fewer_channels_is_not_offered_where_it_gives_nothing_back(built, monkeypatch):
    """Without cuMem NCCL allocates through cudaMalloc, where the page model says nothing of channels; with 4 or
    fewer channels already there is nothing to give back."""
    from mbridge_offload.diagnosis.fixes import fewer_nccl_channels

    monkeypatch.delenv("NCCL_MAX_NCHANNELS", raising=False)
    monkeypatch.delenv("NCCL_CUMEM_ENABLE", raising=False)
    cfg = built("qwen3_1b_proxy_pretrain_config")
    assert fewer_nccl_channels(cfg) is not None
    monkeypatch.setenv("NCCL_CUMEM_ENABLE", "0")
    assert fewer_nccl_channels(cfg) is None
    monkeypatch.delenv("NCCL_CUMEM_ENABLE")
    monkeypatch.setenv("NCCL_MAX_NCHANNELS", "2")
    assert fewer_nccl_channels(cfg) is None


def test_a_shared_expert_with_a_bias_names_the_validators_rule(diag):
    """Megatron Core's SharedExpertMLP asserts add_bias_linear is False when the model is built, after the launch's
    setup: the log names moe/shared-expert-bias, the rule run_recipe.py refuses the launch with, and its fix."""
    path = diag.write([
        "[rank0]: Traceback (most recent call last):",
        '[rank0]:   File "/opt/venv/lib/python3.12/site-packages/megatron/core/transformer/moe/shared_experts.py", '
        "line 124, in __init__",
        '[rank0]:     assert config.add_bias_linear == False, "bias is not supported in the shared experts, "',
        "[rank0]: AssertionError: bias is not supported in the shared experts, ",
    ])
    finding = diag.only(path, "moe/shared-expert-bias")
    assert "model.add_bias_linear=False" in finding.fix


FETCH_AHEAD_RUNS = BENCH / "offload-engine" / "stream-fetch-ahead"


def _log_head_with_oom(run: Path, tmp_path: Path, through: str) -> Path:
    """A GPU run's own log (docs/benchmarks/offload-engine/stream-fetch-ahead/) up to its first line holding
    ``through``, then torch's out-of-memory message on rank 0."""
    lines = (FETCH_AHEAD_RUNS / run / "log.txt").read_text().splitlines(keepends=True)
    end = next(i for i, line in enumerate(lines) if through in line) + 1
    log = tmp_path / run / "log.txt"
    log.parent.mkdir(parents=True)
    log.write_text("".join(lines[:end]) + f"[rank0]: {TORCH_OOM}\n")
    return log


def test_an_oom_with_fetch_ahead_on_turns_it_off_first(tmp_path, diag):
    """The H100 run with fetch-ahead on, cut after rank 0 said its buffers held 2.90 GiB, then an OOM: the finding is
    fetch-ahead's (its buffers are reserved memory outside the plan), its fix turns it off, and its basis sets what
    they held against what the allocation lacked (3.50 GiB asked, 812 MiB free: 2.71 GiB)."""
    log = _log_head_with_oom("fraction-1-engine-stream-fetch-ahead", tmp_path, "stream fetch-ahead: 4 chunks")
    finding = diag.only(log, "runtime/oom-with-fetch-ahead")
    assert finding.fix.startswith("++env_vars.MBRIDGE_OFFLOAD_STREAM_FETCH_AHEAD=off")
    assert "fetch-ahead's buffers held up to 2.90 GiB in a step" in finding.fix_basis
    assert "lacked 2.71 GiB, less than that" in finding.fix_basis
    assert "tried to allocate 3.50 GiB" in finding.measured
    # cut before rank 0's first count: on, but how much its buffers held is not known
    log = _log_head_with_oom("fraction-1-engine-stream-fetch-ahead", tmp_path / "early", "iteration        1/")
    finding = diag.only(log, "runtime/oom-with-fetch-ahead")
    assert "how much its buffers held is not known" in finding.fix_basis


def test_an_oom_of_the_stream_run_without_fetch_ahead_is_not_blamed_on_it(tmp_path, diag):
    """The same phase's stream run with fetch-ahead off, cut at the same step: torch's OOM at fraction 1."""
    log = _log_head_with_oom("fraction-1-engine-stream", tmp_path, "iteration        3/")
    finding = diag.only(log, "runtime/cuda-oom")
    assert "FETCH_AHEAD" not in finding.fix


def test_fetch_ahead_in_the_saved_config_tells_the_oom_where_the_log_does_not(tmp_path, diag):
    """A log with no header (not launched by run_recipe.py): the run's saved config says the stream engine and
    fetch-ahead were on. With the stream engine alone it is torch's OOM at fraction 1."""
    engine = "  MBRIDGE_OFFLOAD_ENGINE: stream"
    for name, extra, expected in (("on", "\n  MBRIDGE_OFFLOAD_STREAM_FETCH_AHEAD: 'on'", "runtime/oom-with-fetch-ahead"),
                                  ("off", "", "runtime/cuda-oom")):
        (tmp_path / name).mkdir()
        run = _run_with_saved_config(tmp_path / name, 1.0, f"[rank0]: {TORCH_OOM}\n",
                                     **{"NCCL_ALGO: Ring": f"NCCL_ALGO: Ring\n{engine}{extra}"})
        assert diag.only(run / "log.txt", expected).rule_id == expected


def test_a_header_without_fetch_ahead_outranks_the_saved_config_and_an_earlier_run(tmp_path, diag):
    """The header says fetch-ahead whenever it is on, the launch shell's value included, which the saved config does not
    know: the H100 stream run's header (engine stream, no fetch-ahead line) in a folder whose config says on, and the
    fetch-ahead run's log followed by that run's in one file (a log appended to), both end in torch's OOM at fraction 1."""
    stream = _log_head_with_oom("fraction-1-engine-stream", tmp_path / "head", "iteration        3/").read_text()
    engine = "  MBRIDGE_OFFLOAD_ENGINE: stream"
    run = _run_with_saved_config(tmp_path, 1.0, stream, **{
        "NCCL_ALGO: Ring": f"NCCL_ALGO: Ring\n{engine}\n  MBRIDGE_OFFLOAD_STREAM_FETCH_AHEAD: 'on'"})
    assert "  offload engine: stream: " in stream and "fetch-ahead: on" not in stream
    diag.only(run / "log.txt", "runtime/cuda-oom")
    ahead = (FETCH_AHEAD_RUNS / "fraction-1-engine-stream-fetch-ahead" / "log.txt").read_text()
    assert "stream fetch-ahead: 4 chunks" in ahead
    earlier, last = diag.runs(diag.write([ahead + stream], "appended.txt"))
    assert earlier.part == (1, 2) and last.part == (2, 2)
    assert not any("oom" in finding.rule_id for finding in earlier.findings)
    [finding] = last.findings
    assert finding.rule_id == "runtime/cuda-oom" and "FETCH_AHEAD" not in finding.fix


def test_a_fetch_ahead_line_with_optimizer_offload_off_is_not_blamed(diag):
    """Fetch-ahead runs inside the stream engine, which only optimizer offload starts: a header that says optimizer
    offload off and fetch-ahead on (lines of two runs, an edited log) gets torch's OOM without offload."""
    log = diag.write(["Training x (1 GPU: TP1 PP1 CP1 DP1 EP1 ETP1), 33 steps, global batch 8, micro batch 1, seq 4096",
                      "  optimizer offload: off", "  activation offload (layer-level): off",
                      "  fine-grained activation offload: off",
                      "  fetch-ahead: on (MBRIDGE_OFFLOAD_STREAM_FETCH_AHEAD): the chunks ...",
                      f"[rank0]: {TORCH_OOM}"])
    finding = diag.only(log, "runtime/cuda-oom")
    assert finding.fix.startswith("optimizer.optimizer_cpu_offload=True")


def test_garbled_numbers_in_the_fetch_ahead_and_iteration_lines_read_as_not_stated(tmp_path, diag):
    """Interleaved output can garble a number ("2.9.0"): diagnose names what it could not read instead of failing
    on it, and still reads the line as fetch-ahead having run."""
    log = _log_head_with_oom("fraction-1-engine-stream-fetch-ahead", tmp_path, "stream fetch-ahead: 4 chunks")
    text = log.read_text()
    assert text.count("(2.90 GiB)") == 1 and text.count("elapsed time per iteration (ms): 2041.1") == 1
    log.write_text(text.replace("(2.90 GiB)", "(2.9.0 GiB)").replace("(ms): 2041.1", "(ms): 20.41.1"))
    finding = diag.only(log, "runtime/oom-with-fetch-ahead")
    # the window-2 line's 0.00 GiB is only a floor of what the buffers held, not the most
    assert "held at least 0.00 GiB" in finding.fix_basis and "'2.9.0', not a number" in finding.fix_basis
    assert "more than the lines it could read show" in finding.fix_basis
    # only the garbled line: not known
    log.write_text(log.read_text().replace("0 chunks (0.00 GiB)", "0 chunks (0.0.0 GiB)"))
    finding = diag.only(log, "runtime/oom-with-fetch-ahead")
    assert "'0.0.0', not a number (a garbled line), so how much they held is not known" in finding.fix_basis


BF16_MOMENTS_LINE = f"  {STREAM_MOMENTS_HEADER}: {STREAM_MOMENTS_SAYS}"  # as launch.py's run_header prints it
NAN = (LOGS / "nan-grad-norm.log").read_text().splitlines()  # an iteration counting a NaN, then Megatron's check
HOST_KILL = ("E1202 19:26:03.541000 140211 torch/distributed/elastic/multiprocessing/api.py:882] failed (exitcode: -9) "
             "local_rank: 0 (pid: 2812) of binary: /opt/torch/.venv/bin/python3")
MOMENTS_ENV = "env_vars.MBRIDGE_OFFLOAD_STREAM_MOMENTS"


def _stream_run_head(moments_line: bool = False, engine: str = "stream") -> list[str]:
    """The H100 stream run's log (docs/benchmarks/offload-engine/stream-fetch-ahead/) up to step 3; with its header
    saying bf16 moments below the engine's line, or naming another engine, as run_header prints either."""
    lines = (FETCH_AHEAD_RUNS / "fraction-1-engine-stream" / "log.txt").read_text().splitlines()
    lines = lines[:next(i for i, line in enumerate(lines) if "iteration        3/" in line) + 1]
    at = next(i for i, line in enumerate(lines) if line.startswith("  offload engine: stream: "))
    lines[at] = f"  offload engine: {engine}: {ENGINE_MODES[engine]}"
    return lines[:at + 1] + ([BF16_MOMENTS_LINE] if moments_line else []) + lines[at + 1:]


def test_a_nan_with_bf16_moments_names_them_as_the_suspect_first(diag):
    """The stream run's header saying bf16 moments, then a NaN in the gradients: fp32 moments first (moments
    rounded to bf16 at every step are the plugin's own suspect), the rule's own fix after, and the basis names the
    header's line. The same run with fp32 moments (no such line) gets the rule's fix alone; so does a header that says
    optimizer offload off and bf16 moments (lines of two runs, an edited log): they run inside the stream engine, which
    only optimizer offload starts."""
    finding = diag.only(diag.write(_stream_run_head(moments_line=True) + NAN), "runtime/nan-loss-or-grad")
    rule_fix = RULES_BY_ID["runtime/nan-loss-or-grad"].fix(None)
    assert finding.fix.startswith(f"++{MOMENTS_ENV}=fp32  (") and finding.fix.endswith(f"{rule_fix})")
    assert "bf16" in finding.fix and f"'{STREAM_MOMENTS_HEADER}'" in finding.fix_basis
    finding = diag.only(diag.write(_stream_run_head() + NAN), "runtime/nan-loss-or-grad")
    assert finding.fix == rule_fix and "MOMENTS" not in finding.fix_basis
    off = ["Training x (1 GPU: TP1 PP1 CP1 DP1 EP1 ETP1), 33 steps, global batch 8, micro batch 1, seq 4096",
           "  optimizer offload: off", BF16_MOMENTS_LINE]
    assert diag.only(diag.write(off + NAN), "runtime/nan-loss-or-grad").fix == rule_fix


def test_a_nan_with_bf16_moments_in_the_saved_config_names_them_where_the_log_does_not(tmp_path, diag):
    """A log with no header (not launched by run_recipe.py) in a run folder whose saved config says the stream engine
    and bf16 moments: named, the basis saying the config (whose value a launch shell's would override). With another
    engine the setting did nothing (the validator refuses it): not named."""
    for engine, named in (("stream", True), ("exact", False)):
        (tmp_path / engine).mkdir()
        run = _run_with_saved_config(tmp_path / engine, 1.0, "\n".join(NAN) + "\n", **{
            "NCCL_ALGO: Ring": f"NCCL_ALGO: Ring\n  MBRIDGE_OFFLOAD_ENGINE: {engine}\n  MBRIDGE_OFFLOAD_STREAM_MOMENTS: bf16"})
        finding = diag.only(run / "log.txt", "runtime/nan-loss-or-grad")
        assert finding.fix.startswith(f"++{MOMENTS_ENV}=fp32") is named, engine
        if named:
            assert f"the run's config ({run / 'run_config.yaml'})" in finding.fix_basis
            assert f"sets {MOMENTS_ENV}=bf16" in finding.fix_basis and "launch shell" in finding.fix_basis


def _bf16_host_offer() -> str:
    return (f"; or ++{MOMENTS_ENV}=bf16  (Adam's moments in bf16 on the host: "
            f"{stream_host_bytes_per_param('fp32')} -> {stream_host_bytes_per_param('bf16')} bytes per offloaded "
            "parameter; NOT bit-identical to no offload")


def test_a_host_kill_of_a_stream_run_with_fp32_moments_offers_bf16_ones(diag):
    """The stream run (fp32 moments: its header names the engine and no bf16 line), then torchrun's SIGKILL of a
    rank: the rule's host fix, then bf16 moments as a way to hold less of the host, saying they are not
    bit-identical. Not with bf16 moments already on, nor with another engine's header, nor where nothing says the
    engine (a log with no header and no config)."""
    finding = diag.only(diag.write(_stream_run_head() + [HOST_KILL]), "runtime/host-memory-killed")
    rule_fix = RULES_BY_ID["runtime/host-memory-killed"].fix(None)
    assert finding.fix.startswith(rule_fix + _bf16_host_offer())
    assert "the stream engine kept fp32 moments: the run's header names the stream engine" in finding.fix_basis
    for lines in (_stream_run_head(moments_line=True), _stream_run_head(engine="exact"),
                  _stream_run_head(engine="library"), []):
        finding = diag.only(diag.write([*lines, HOST_KILL]), "runtime/host-memory-killed")
        assert finding.fix == rule_fix, lines[:1]


@pytest.mark.parametrize("failure, rule_id", [
    ("[rank0]: RuntimeError: [enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: not enough memory: you "
     "tried to allocate 4294967296 bytes.", "runtime/host-allocation-failed"),
    ((LOGS / "pinned-memory.log").read_text(), "runtime/pinned-host-memory"),
])
def test_a_host_allocation_of_a_stream_run_with_fp32_moments_offers_bf16_ones(failure, rule_id, diag):
    finding = diag.only(diag.write([*_stream_run_head(), *failure.splitlines()]), rule_id)
    assert _bf16_host_offer() in finding.fix and finding.fix.startswith(RULES_BY_ID[rule_id].fix(None))
    finding = diag.only(diag.write([*_stream_run_head(engine="delayed"), *failure.splitlines()]), rule_id)
    assert finding.fix == RULES_BY_ID[rule_id].fix(None)


def test_a_host_kill_with_fp32_moments_in_the_saved_config_offers_bf16_with_the_planners_fix(tmp_path, diag):
    """No header, the saved config (stream engine, moments unset: fp32) and the node's memory from the plan's line:
    the planner's host fix, then bf16 moments; the basis says the config left the moments unset."""
    plan_line = ("  host: per node                    37.47 GiB between steps, 37.49 GiB at the peak, for 1 rank(s) of "
                 "124.016 GiB, margin 4 GiB per rank: fits")
    run = _run_with_saved_config(tmp_path, 1.0, f"{plan_line}\n{HOST_KILL}\n",
                                 **{"NCCL_ALGO: Ring": "NCCL_ALGO: Ring\n  MBRIDGE_OFFLOAD_ENGINE: stream"})
    finding = diag.only(run / "log.txt", "runtime/host-memory-killed")
    assert _bf16_host_offer() in finding.fix
    assert f"leaves {MOMENTS_ENV} unset" in finding.fix_basis and "config: " in finding.fix_basis


def test_the_host_fix_is_planned_with_the_moments_the_run_had_not_the_configs(tmp_path, diag):
    """The saved config says bf16 moments, but the run's header names the stream engine with no bf16 line: its launch
    shell set fp32, which wins. The planner's host fix then plans the host at fp32 moments' 12 bytes per offloaded
    parameter, the peak the run had, not the config's 8; and bf16 moments are offered (they were not on)."""
    from mbridge_offload.planning import GIB, plan

    plan_line = ("  host: per node                    37.47 GiB between steps, 37.49 GiB at the peak, for 1 rank(s) of "
                 "124.016 GiB, margin 4 GiB per rank: fits")
    run = _run_with_saved_config(tmp_path, 1.0, "\n".join([*_stream_run_head(), plan_line, HOST_KILL]) + "\n", **{
        "NCCL_ALGO: Ring": "NCCL_ALGO: Ring\n  MBRIDGE_OFFLOAD_ENGINE: stream\n  MBRIDGE_OFFLOAD_STREAM_MOMENTS: bf16"})
    finding = diag.only(run / "log.txt", "runtime/host-memory-killed")
    saved = load_run_config(run / "run_config.yaml")
    peaks = {}
    for moments in ("fp32", "bf16"):
        saved.env_vars["MBRIDGE_OFFLOAD_STREAM_MOMENTS"] = moments
        peaks[moments] = plan(saved, 1, fraction=1.0, host_memory_gib=124.016).host_peak_bytes_per_node / GIB
    assert peaks["fp32"] - peaks["bf16"] > 0.1  # the two are told apart at the basis's one decimal
    assert f"({peaks['fp32']:.1f} GiB per node)" in finding.fix_basis, finding.fix_basis
    assert _bf16_host_offer() in finding.fix


def _header(fraction_percent: int, gpus: int = 1) -> list[str]:
    """run_recipe.py's header lines for the dense proxy at an optimizer offload fraction (as launch.py prints them)."""
    plural = "s" if gpus > 1 else ""
    return [f"Recipe qwen3_1b_proxy_pretrain_config ({gpus} GPU{plural}: TP1 PP1 CP1 DP{gpus} EP1 ETP1; GPU count from "
            "--num-gpus)",
            "Offload settings:",
            f"  optimizer offload: ON, {fraction_percent}% of optimizer states on the CPU, D2H/H2D overlap on",
            "  activation offload (layer-level): off", "  fine-grained activation offload: off"]


def _iteration(n: int) -> str:
    return (f" [2026-12-05 16:21:12] iteration {n:>8}/      33 | consumed samples: {8 * n:>12} | elapsed time per "
            "iteration (ms): 2041.1 | learning rate: 9.000000E-05 | global batch size:     8 | lm loss: 1.223031E+01 |")


PREEMPTED = "slurmstepd: error: *** JOB 4242 ON node7 CANCELLED AT 2026-12-05T03:14:15 DUE TO PREEMPTION ***"


def test_a_log_appended_across_a_restart_is_diagnosed_run_by_run(tmp_path, diag):
    """A job requeued after a preemption appends its second run to the same log: the H100 stream run (stopped by
    the preemption after step 3), then the fetch-ahead run from its command line on (an OOM after rank 0's count).
    Each run is its own diagnosis: the first was stopped from outside, the second ran out of memory with fetch-ahead
    on; the stop does not make the second run's OOM its consequence, nor does the first run's header describe it."""
    stream = (FETCH_AHEAD_RUNS / "fraction-1-engine-stream" / "log.txt").read_text().splitlines()
    end = next(i for i, line in enumerate(stream) if "iteration        3/" in line) + 1
    ahead = _log_head_with_oom("fraction-1-engine-stream-fetch-ahead", tmp_path, "stream fetch-ahead: 4 chunks")
    log = diag.write([*stream[:end], PREEMPTED, *ahead.read_text().splitlines()], "appended.txt")
    first, second = diag.runs(log)
    assert [f.rule_id for f in first.findings] == ["runtime/job-stopped"]
    [oom] = second.findings
    assert oom.rule_id == "runtime/oom-with-fetch-ahead" and not oom.consequence_of
    # the second run begins at its command line, the line before its own header
    assert second.first_line == end + 2 and "--recipe" in log.read_text().splitlines()[end + 1]
    assert "run 2 of 2 in it: lines" in second.where and second.to_json()["run_in_log"]["run"] == 2


def test_each_run_of_an_appended_log_has_its_own_offload_settings(diag):
    """An OOM at 50 % offload, then a relaunch at 100 % that trains: the OOM is the partial-offload one (its own
    run's header), not torch's OOM at the fraction the log's last header states."""
    log = diag.write([*_header(50), _iteration(1), f"[rank0]: {TORCH_OOM}",
                      *_header(100), _iteration(1), _iteration(2)])
    first, second = diag.runs(log)
    assert [f.rule_id for f in first.findings] == ["runtime/oom-partial-offload"] and second.findings == []


def test_the_headers_every_rank_prints_at_the_start_of_one_run_stay_one_run(diag):
    """Under torchrun each rank's run_recipe.py prints its header before training starts: that is one run."""
    log = diag.write([*_header(50, gpus=2), *_header(50, gpus=2), _iteration(1), f"[rank1]: {TORCH_OOM}"])
    [diagnosis] = diag.runs(log)
    assert diagnosis.part is None and [f.rule_id for f in diagnosis.findings] == ["runtime/oom-partial-offload"]


def test_an_oom_at_full_offload_without_a_config_asks_for_fewer_activations(diag):
    """No config to plan with: at fraction 1 (the header says so) no larger fraction exists, so the generic fix names
    what reduces the rest; below it, and without offload, the fix is the rule table's."""
    at_full = diag.only(diag.write([*_header(100), _iteration(1), f"[rank0]: {TORCH_OOM}"]), "runtime/cuda-oom")
    assert at_full.fix.startswith("fewer activations or more GPUs: train.micro_batch_size=1")
    assert "optimizer_offload_fraction=<larger>" not in at_full.fix
    assert at_full.fix_basis.startswith("optimizer offload was at fraction 1 already")
    partial = diag.only(diag.write([*_header(50), _iteration(1), f"[rank0]: {TORCH_OOM}"]), "runtime/oom-partial-offload")
    assert partial.fix.startswith("optimizer.optimizer_offload_fraction=<the next fraction that fits>")
    header_off = [line.replace("ON, 100% of optimizer states on the CPU, D2H/H2D overlap on", "off") for line in _header(100)]
    without = diag.only(diag.write([*header_off, _iteration(1), f"[rank0]: {TORCH_OOM}"]), "runtime/cuda-oom")
    assert without.fix.startswith("optimizer.optimizer_cpu_offload=True optimizer.optimizer_offload_fraction=<larger>")


def test_an_out_of_memory_error_the_full_device_plan_fits_names_the_gaps_beyond_its_allowance(built, monkeypatch):
    """The default rule counts 0.55 GiB for the sub-page gaps a full device keeps; a configuration whose tensor sizes
    leave more fails where its plan fits. The fix's basis names that (torch's message: reserved but unallocated, less
    than the request, so not fragmentation) and the rule that plans more room; with first-step the plan does not fit
    the failed run, so there is nothing to explain."""
    from overrides import apply_overrides
    from mbridge_offload.diagnosis.fixes import oom_fix
    from mbridge_offload.facts.reserve_rule import RESERVE_RULE_ENV
    from mbridge_offload.planning import GIB

    # planner-auto-8/'s 4B widths at 8192 tokens (24 layers) on its 69.91 GiB device, where 0.6 trained with 0.58 GiB
    # of gaps: the same run with 0.62 GiB of them
    cfg = apply_overrides(built("qwen3_4b_pretrain_config"), [
        "model.tensor_model_parallel_size=1", "model.num_layers=24", "model.seq_length=8192", "dataset.seq_length=8192",
        "train.micro_batch_size=1", "train.global_batch_size=1", "optimizer.optimizer_cpu_offload=True",
        "optimizer.optimizer_offload_fraction=0.6"])
    oom = OutOfMemory(requested_gib=2.32, capacity_gib=69.91, free_gib=0.11, allocated_gib=64.7,
                      reserved_unallocated_gib=0.62)
    monkeypatch.delenv(RESERVE_RULE_ENV, raising=False)
    fix, basis = oom_fix(cfg, 1, oom, expandable=True)
    # the fix is the smallest larger fraction whose plan frees what the failed allocation lacked (requested - free)
    fraction = float(fix.split("optimizer.optimizer_offload_fraction=")[1])
    at = {f: plan(cfg, 1, fraction=f, gpu_memory_gib=69.91, expandable=True).total_bytes_gpu / GIB
          for f in (0.6, round(fraction - 0.05, 2), fraction)}
    assert at[0.6] - at[fraction] >= 2.32 - 0.11 > at[0.6] - at[round(fraction - 0.05, 2)]
    assert ("PyTorch held 0.62 GiB reserved but unallocated, more than the full-device reserve rule's 0.55 GiB "
            "allowance for the gaps a full device keeps (MBRIDGE_OFFLOAD_RESERVE_RULE=first-step plans more room)"
            in basis)
    monkeypatch.setenv(RESERVE_RULE_ENV, "first-step")
    assert "allowance" not in oom_fix(cfg, 1, oom, expandable=True)[1]
