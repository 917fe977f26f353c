"""diagnose.py on the plugin's own offload engine's run-time errors (mbridge_offload/runtime/streaming_engine.py,
streamed_states.py), as a rank prints them: each traceback is written by engine_tracebacks.py, which raises the real
EngineError (through the engine's own worker thread and drain where a CPU allows it), and the lines carry torchrun's
rank prefixes. The messages, the engine's templates and diagnose's signatures are one source
(facts/engine_messages.py); the failures are diagnose-only rules of the validator's table
(validation/runtime_failures.py)."""

from __future__ import annotations

import json
import string
import subprocess
import sys
from pathlib import Path

import pytest

from mbridge_offload.cli.diagnose import main
from mbridge_offload.diagnosis import format_diagnosis
from mbridge_offload.facts import engine_messages
from mbridge_offload.validation import RULES_BY_ID
from mbridge_offload.validation.runtime_failures import ENGINE_MESSAGES, LIBRARY_FIX

REPO = Path(__file__).resolve().parents[2]
RUNTIME = REPO / "mbridge_offload" / "runtime"
TIMEOUT = ("[rank{r}]:[E1204 10:22:12.527415338 ProcessGroupNCCL.cpp:632] [Rank {r}] Watchdog caught collective "
           "operation timeout: WorkNCCL(SeqNum=1412, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran "
           "for 600043 milliseconds before timing out.")


@pytest.fixture(scope="module")
def printed(tmp_path_factory) -> dict[str, list[str]]:
    """Scenario name: the lines the engine's error prints (engine_tracebacks.py, in a process of its own)."""
    out = tmp_path_factory.mktemp("engine-tracebacks")
    subprocess.run([sys.executable, str(Path(__file__).with_name("engine_tracebacks.py")), str(out)], check=True,
                   cwd=REPO, timeout=300)
    return {path.stem: path.read_text().splitlines() for path in out.glob("*.txt")}


def ranked(lines: list[str], rank: int) -> list[str]:
    return [f"[rank{rank}]: {line}" for line in lines]


# every message of the engine: the scenario that prints it, the rule diagnose reports, the fix
MESSAGES = [
    ("cpu-step-keyerror", "engine/cpu-step-failed", LIBRARY_FIX),
    ("worker-stopped", "engine/worker-stopped", "fix the first error above this one"),
    ("copy-thread-stopped", "engine/worker-stopped", "fix the first error above this one"),
    ("weight-copy-thread-stopped", "engine/worker-stopped", "fix the first error above this one"),
    ("delayed-fp32-weights", "engine/delayed-fp32-weights", "++env_vars.MBRIDGE_OFFLOAD_ENGINE=exact (or library), "
                                                            "or bf16 model parameters"),
    ("stream-outside-distributed-optimizer", "engine/stream-outside-distributed-optimizer",
     "ddp.use_distributed_optimizer=True optimizer.use_distributed_optimizer=True, or " + LIBRARY_FIX),
    ("unknown-engine", "offload-engine/known", "++env_vars.MBRIDGE_OFFLOAD_ENGINE=exact"),
    ("stream-not-fp32", "engine/stream-not-fp32", "optimizer.use_precision_aware_optimizer=False, or " + LIBRARY_FIX),
    ("stream-pin-failed", "engine/stream-pin-failed", "raise ulimit -l, or " + LIBRARY_FIX),
    ("stream-fused-adam-import", "engine/stream-fused-adam-import", "++env_vars.MBRIDGE_OFFLOAD_ENGINE=exact"),
    ("stream-not-fused-adam", "offload-engine/stream-adam", "optimizer.optimizer=adam"),
    ("stream-not-main-weights", "engine/stream-not-main-weights", LIBRARY_FIX),
    ("stream-step-counts", "engine/stream-step-counts", "checkpoint.load=<dir> checkpoint.ckpt_step="),
    ("stream-moments-unknown", "offload-engine/stream-moments-known", "++env_vars.MBRIDGE_OFFLOAD_STREAM_MOMENTS=bf16"),
    ("stream-pinned-cache-kept", "engine/stream-pinned-cache-kept", "a torch whose torch._C has _host_emptyCache"),
]


@pytest.mark.parametrize("scenario, rule_id, fix", MESSAGES)
def test_each_engine_message_in_a_ranks_traceback_is_recognised_with_its_fix(printed, scenario, rule_id, fix, diag):
    lines = ranked(printed[scenario], 2)
    diagnosis = diag(diag.write(lines))
    [finding] = diagnosis.findings
    assert (finding.rule_id, finding.ranks) == (rule_id, {2})
    assert finding.fix.startswith(fix) and finding.what and finding.confirm
    assert finding.evidence[0].number == len(lines)  # the exception's own line, the traceback's last
    rule = RULES_BY_ID[rule_id]  # every message is a rule of the table: the validator's words and fix
    assert (finding.what, finding.fix) == (rule.text, rule.fix(None))
    if scenario != "stream-pinned-cache-kept":
        assert diagnosis.first_failure is finding and finding.severity == "error"


def test_every_message_of_the_engine_has_a_failure_and_the_engine_formats_it_from_there():
    """One source: each template of facts/engine_messages.py has its entry, and the runtime modules hold none of
    their words (a retyped copy would drift from what diagnose reads)."""
    templates = {value for name, value in vars(engine_messages).items() if name.isupper() and isinstance(value, str)}
    assert templates == {message.template for message in ENGINE_MESSAGES.values()}
    assert all(rule_id in RULES_BY_ID for rule_id in ENGINE_MESSAGES)
    source = "\n".join(path.read_text() for path in (RUNTIME / "streaming_engine.py", RUNTIME / "streamed_states.py"))
    for template in templates:
        words = max((literal for literal, *_ in string.Formatter().parse(template)), key=len)[:40]
        assert words not in source, words


def test_the_engines_failures_are_diagnose_only_rules_of_the_table():
    """One rule table feeds the validator, the README's table and diagnose: each engine failure is a rule read
    from logs only, whose signature is its message's template."""
    from mbridge_offload.validation import rules_markdown
    from mbridge_offload.validation.rule import RUNTIME
    from mbridge_offload.validation.runtime_failures import CONFIG_RULE_LOG_SIGNATURES, CONFIRM

    table = rules_markdown()
    for rule_id, message in ENGINE_MESSAGES.items():
        rule = RULES_BY_ID[rule_id]
        if rule_id.startswith("engine/"):
            assert (rule.mechanism, rule.applies(None), rule.log_signatures) == (RUNTIME, False, (message.signature,))
            assert rule.text in table and CONFIRM[rule_id]
            assert not message.own_fix or rule.fix(None) == message.own_fix  # the fix the message names
        else:  # a configuration rule the message states
            assert (message.signature, rule_id) in CONFIG_RULE_LOG_SIGNATURES


def test_a_source_line_that_quotes_a_message_is_no_failure(printed, diag):
    """A traceback shows the raising statement's source: an engine from before the shared templates had the
    message's words there. Only the exception's line is the failure."""
    quoted = [
        '  File "/opt/venv/lib/python3.12/site-packages/mbridge_offload/runtime/streaming_engine.py", line 381, in '
        "_wait",
        '    raise EngineError(f"the streaming offload engine\'s worker thread stopped while waiting for {what}")',
        '    raise EngineError(f"the streaming offload engine\'s CPU optimizer step failed: "',
        "the delayed offload engine cannot run with 2 offloaded parameter(s) kept in fp32 (quoted in a note)"]
    lines = [*quoted, printed["worker-stopped"][-1]]
    [finding] = diag(diag.write(lines)).findings
    assert finding.rule_id == "engine/worker-stopped"
    assert [line.number for line in finding.evidence] == [len(lines)]


def test_a_failed_pin_of_the_stream_engine_with_fp32_moments_offers_bf16_ones(printed, diag):
    """The engine could not pin its host buffers (its own message, raised for real) in a run whose header names the
    stream engine and no bf16 moments: the message's fix, then bf16 moments (fewer bytes to pin per offloaded
    parameter, not bit-identical). With the header's bf16 line the message's fix alone; so without a header, where
    the moments are not known."""
    from mbridge_offload.facts.offload_engine import (ENGINE_MODES, STREAM_MOMENTS_HEADER, STREAM_MOMENTS_SAYS,
                                                      stream_host_bytes_per_param)

    header = ["Training x (1 GPU: TP1 PP1 CP1 DP1 EP1 ETP1), 33 steps, global batch 8, micro batch 1, seq 4096",
              "  optimizer offload: ON, 100% of optimizer states on the CPU, D2H/H2D overlap on",
              f"  offload engine: stream: {ENGINE_MODES['stream']}"]
    failed = ranked(printed["stream-pin-failed"], 0)
    own_fix = RULES_BY_ID["engine/stream-pin-failed"].fix(None)
    [finding] = diag(diag.write([*header, *failed])).findings
    assert finding.fix.startswith(f"{own_fix}; or ++env_vars.MBRIDGE_OFFLOAD_STREAM_MOMENTS=bf16  (")
    assert (f"{stream_host_bytes_per_param('fp32')} -> {stream_host_bytes_per_param('bf16')} bytes per offloaded "
            "parameter; NOT bit-identical") in finding.fix
    assert finding.fix_basis.startswith("the fix the engine's message names; the stream engine kept fp32 moments")
    for lines in ([*header, f"  {STREAM_MOMENTS_HEADER}: {STREAM_MOMENTS_SAYS}", *failed], failed):
        [finding] = diag(diag.write(lines)).findings
        assert (finding.rule_id, finding.fix) == ("engine/stream-pin-failed", own_fix)


def test_a_cpu_step_that_failed_on_a_host_allocation_is_the_host_memory_finding(printed, diag):
    """The worker's error was the host out of memory (torch's DefaultCPUAllocator, raised on the worker thread):
    that is the failure to fix, with the host fix; the engine's error only carries it."""
    lines = ranked(printed["cpu-step-host-oom"], 0)
    inner = next(i for i, line in enumerate(lines, 1) if "RuntimeError: [enforce fail at alloc_cpu" in line)
    diagnosis = diag(diag.write(lines))
    found = {f.rule_id: f for f in diagnosis.findings}
    assert list(found) == ["runtime/host-allocation-failed", "engine/cpu-step-failed"]
    host, engine = found["runtime/host-allocation-failed"], found["engine/cpu-step-failed"]
    assert diagnosis.first_failure is host and host.evidence[0].number == inner and host.ranks == {0}
    assert engine.carries == f"the worker's own error, [runtime/host-allocation-failed] on rank 0 (log.txt:{inner}): " \
                             "fix that one"
    assert engine.fix == host.fix and "optimizer_offload_fraction" in engine.fix
    assert engine.measured.startswith("the worker's error: RuntimeError: [enforce fail at alloc_cpu.cpp")
    text = format_diagnosis(diagnosis)
    assert f"the first failure: [runtime/host-allocation-failed] on rank 0 at log.txt:{inner}" in text
    assert "carries:  the worker's own error, [runtime/host-allocation-failed]" in text


def test_a_cpu_step_that_failed_in_the_librarys_hook_after_a_load_is_the_resume_keyerror(printed, diag):
    """The worker's error was the library's hook missing a host copy (KeyError: tensor(...) in hybrid_optimizer.py):
    the resume rule's finding, with its fix, is the one to fix."""
    lines = ranked(printed["cpu-step-resume-keyerror"], 0)
    diagnosis = diag(diag.write(lines))
    found = {f.rule_id: f for f in diagnosis.findings}
    assert list(found) == ["runtime/resume-offload-keyerror", "engine/cpu-step-failed"]
    assert diagnosis.first_failure is found["runtime/resume-offload-keyerror"]
    engine = found["engine/cpu-step-failed"]
    assert engine.carries.startswith("the worker's own error, [runtime/resume-offload-keyerror]")
    assert engine.fix == found["runtime/resume-offload-keyerror"].fix


def test_the_failure_record_of_a_cpu_step_that_failed_on_a_host_allocation(printed, tmp_path, diag):
    """failure.json holds one line, "EngineError: <message>" (runtime/launch.py): the host finding still comes
    first, the engine's carries it from the same line."""
    qualified, _, message = printed["cpu-step-host-oom"][-1].partition(": ")
    path = tmp_path / "failure.json"
    path.write_text(json.dumps({"reason": f"{qualified.rsplit('.', 1)[-1]}: {message}"}))
    diagnosis = diag(path)
    assert [f.rule_id for f in diagnosis.findings] == ["runtime/host-allocation-failed", "engine/cpu-step-failed"]
    assert diagnosis.first_failure.rule_id == "runtime/host-allocation-failed"
    assert diagnosis.findings[1].carries.endswith("(failure.json:1): fix that one")


@pytest.mark.parametrize("scenario, first", [("cpu-step-keyerror", "engine/cpu-step-failed"),
                                             ("cpu-step-host-oom", "runtime/host-allocation-failed")])
def test_rank_1s_worker_fails_first_and_the_other_ranks_time_out_after_it(printed, scenario, first, diag):
    """torchrun's output of 4 ranks: rank 1's CPU optimizer step fails on its worker thread, the other ranks wait in
    the next collective until NCCL's watchdog stops them, and torchrun reports the ranks' exits. The first failure is
    rank 1's (the worker's own error where diagnose knows it), the timeouts its consequences."""
    lines = ([f"[rank{r}]: > initialized rank {r}" for r in range(4)]
             + ["[rank0]: [2026-12-04 10:11:58] iteration       41/     100 | elapsed time per iteration (ms): "
                "2411.3 |"]
             + ranked(printed[scenario], 1)
             + [TIMEOUT.format(r=r) for r in (0, 2, 3)]
             + ["W1204 10:22:14.118000 140211 torch/distributed/elastic/multiprocessing/api.py:908] Sending process "
                "2811 closing signal SIGTERM",
                "E1204 10:22:15.541000 140211 torch/distributed/elastic/multiprocessing/api.py:882] failed (exitcode: "
                "1) local_rank: 1 (pid: 2812) of binary: /opt/venv/bin/python3",
                "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
                "Root Cause (first observed failure):", "[0]:", "  time      : 2026-12-04_10:12:01",
                "  host      : h200-node-03", "  rank      : 1 (local_rank: 1)", "  exitcode  : 1 (pid: 2812)",
                "  error_file: <N/A>",
                "  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html"])
    diagnosis = diag(diag.write(lines))
    found = {f.rule_id: f for f in diagnosis.findings}
    assert set(found) == {first, "engine/cpu-step-failed", "runtime/nccl-timeout"}
    cause = found[first]
    assert diagnosis.first_failure is cause and cause.ranks == {1} and not cause.consequence_of
    at = cause.evidence[0].number
    assert found["runtime/nccl-timeout"].ranks == {0, 2, 3}
    assert f"[{first}] on rank 1, which failed first (log.txt:{at})" in found["runtime/nccl-timeout"].consequence_of
    assert f"the first failure: [{first}] on rank 1 at log.txt:{at}" in format_diagnosis(diagnosis)
    engine = found["engine/cpu-step-failed"]
    assert engine.ranks == {1} and bool(engine.carries) == (first != "engine/cpu-step-failed")
    assert engine.fix == (LIBRARY_FIX + "  (the library's own CPU step instead of the engine's worker thread)"
                          if first == "engine/cpu-step-failed" else cause.fix)


def test_a_worker_thread_found_stopped_after_another_error_is_its_consequence(printed, diag):
    oom_kill = "slurmstepd: error: Detected 1 oom-kill event(s) in StepId=991234.0."
    diagnosis = diag(diag.write([oom_kill, *ranked(printed["worker-stopped"], 0)]))
    found = {f.rule_id: f for f in diagnosis.findings}
    assert diagnosis.first_failure is found["runtime/host-memory-killed"]
    stopped = found["engine/worker-stopped"]
    assert "[runtime/host-memory-killed], which failed first (log.txt:1)" in stopped.consequence_of
    assert stopped.measured == "the worker thread, waiting for the offloaded optimizer step"


def test_a_gradient_copy_thread_found_stopped_is_named_as_such(printed, diag):
    [finding] = diag(diag.write(printed["copy-thread-stopped"])).findings
    assert finding.rule_id == "engine/worker-stopped"
    assert finding.measured == "the gradient copy thread, waiting for the gradients' copies"


def test_a_weight_copy_thread_found_stopped_is_named_as_such(printed, diag):
    [finding] = diag(diag.write(printed["weight-copy-thread-stopped"])).findings
    assert finding.rule_id == "engine/worker-stopped"
    assert finding.measured == "the weight copy thread, waiting for the offloaded optimizer step"


def test_json_and_the_engine_failures_own_words(printed, capsys, diag):
    path = diag.write(ranked(printed["cpu-step-host-oom"], 3))
    assert main(["--no-build", "--json", str(path)]) == 0
    [report] = json.loads(capsys.readouterr().out)
    assert report["first_failure"] == "runtime/host-allocation-failed"
    engine = report["findings"][1]
    assert engine["rule_id"] == "engine/cpu-step-failed" and engine["ranks"] == [3]
    assert engine["carries"].startswith("the worker's own error, [runtime/host-allocation-failed] on rank 3")
    assert engine["what"] == RULES_BY_ID["engine/cpu-step-failed"].text


def test_diagnose_list_names_the_engines_own_failures():
    """``diagnose.py --list`` prints the failures it recognises: the engine's own (diagnose-only rules of the
    validator's table) among them."""
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    listed = subprocess.run([sys.executable, str(repo / "scripts" / "diagnose.py"), "--list"], capture_output=True,
                            text=True, cwd=repo, timeout=300).stdout
    own = [rule_id for rule_id in ENGINE_MESSAGES if rule_id.startswith("engine/")]
    assert own and all(f"{failure_id}: " in listed for failure_id in own), listed[-2000:]
