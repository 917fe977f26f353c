"""Rules of what goes wrong once a run is launched: read from its log by ``scripts/diagnose.py``, never
checked on a config (they never apply in validation). Each has the log lines that show it
(``log_signatures``), the cause in words, the fix to paste, and how to confirm it (``CONFIRM``).

The plugin's own offload engine (mbridge_offload/runtime/streaming_engine.py, streamed_states.py) formats every
message it raises or prints from a template of ``facts/engine_messages.py``; its failures are rules here whose
signature is built from that same template (``ENGINE_MESSAGES``: its words escaped, each field a pattern), so the
engine and diagnose cannot drift apart, and whose fix is the one the message names where it names one.

Failures of configuration rules that show in a log (upstream's assertions, an import an APEX-only
setting needs, an engine message that states a rule of the validator's table) keep their own rule: upstream's
messages map through ``upstream.py``'s table, the rest through ``CONFIG_RULE_LOG_SIGNATURES`` here.
"""

from __future__ import annotations

import re
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property

from mbridge_offload.facts import engine_messages as messages
from mbridge_offload.facts.key_ranges import fixed
from mbridge_offload.facts.offload_engine import ENGINE_KEY, ENGINE_THREADS, FETCH_AHEAD_KEY, STREAM_MOMENTS_ENV
from mbridge_offload.validation.rule import RUNTIME, Context, Rule

# torch's caching allocator's out-of-memory: its message (every torch release), and the exception's name where
# a message follows it (a mention of the class, e.g. in a warning or an except clause, is no failure)
_OOM = (r"CUDA out of memory\. Tried to allocate", r"\b(torch\.(cuda\.)?)?OutOfMemoryError: \S")
# What shows a pinned (page-locked) host allocation near a failed CUDA allocation: the call in the traceback above
# it (a tensor's .pin_memory(), a factory's pin_memory=<a variable> as the traceback quotes the source, e.g. Megatron's
# hybrid optimizer's torch.empty(..., pin_memory=self.pin_cpu_grads), the DataLoader's pinning thread), the allocator in
# the C++ trace below it, NCCL's host-alloc warning. Not the settings a config dump or the run's header prints on every
# run (pin_memory=True, pin_cpu_grads, "pinned grads/params").
PINNED_ALLOCATION_NEAR = (r"\.pin_memory\(|\bpin_memory=(?!True\b|False\b)[A-Za-z_]|_utils/pin_memory\.py|[Hh]ostAlloc|"
                          r"host alloc|CachingHostAllocator|cudaHostRegister|pinned (host )?memory")
# Messages that say a device allocation outside PyTorch failed: NCCL's allocation warnings (also what torch
# prints under "Last error:" of an "unhandled cuda error"), NCCL's CUDA-call warning with the out-of-memory
# error, cuBLAS's / cuDNN's allocation statuses, and the CUDA runtime's / driver's out-of-memory error as torch,
# Transformer Engine and the driver API print it (PyTorch's own allocator raises OutOfMemoryError instead).
# A bare "unhandled cuda error" has other causes.
OOM_OUTSIDE_PYTORCH = (r"Failed to CUDA (calloc|malloc)\b", r"Cuda failure (\d+ )?'out of memory'",
                       r"CUBLAS_STATUS_ALLOC_FAILED", r"CUDNN_STATUS_ALLOC_FAILED",
                       r"CUDA (error|Error|driver error): out of memory", r"cudaErrorMemoryAllocation",
                       r"CUDA_ERROR_OUT_OF_MEMORY")
# ... and what near them says otherwise: a pinned host allocation (NCCL prints the same "Cuda failure 2 'out of
# memory'" before "Failed to CUDA host alloc"; torch's "CUDA error: out of memory" under pin_memory()), and an
# earlier fault that left CUDA without memory ("Failed to CUDA calloc" follows any)
OOM_OUTSIDE_PYTORCH_NOT_NEAR = (PINNED_ALLOCATION_NEAR,
                                r"illegal memory access|misaligned address|device-side assert triggered|unspecified launch failure")
# The stop a scheduler or a person sends to the whole job, each with what it was: Slurm's time limit, preemption or
# scancel, a stop signal torchrun's agent or a rank received (Python 3.11 on prints a signal as its number:
# "Received 15 death signal"), Megatron's and Megatron Bridge's exit after one, a Ctrl-C (KeyboardInterrupt ends the
# traceback), a container stopped. (A step Slurm cancels after one of its tasks failed, "*** STEP ... CANCELLED AT
# ... ***" without a reason, is that failure's consequence, not a stop.)
_SIGNALS = r"(?P<signal>1|2|10|12|15|SIGHUP|SIGINT|SIGUSR1|SIGUSR2|SIGTERM)"  # a stop signal, as a number or a name
STOP_KINDS: tuple[tuple[str, str], ...] = (
    (r"CANCELLED AT \S+ DUE TO TIME LIMIT", "Slurm's time limit"),
    (r"CANCELLED AT \S+ DUE TO PREEMPTION", "a preemption (Slurm)"),
    (r"\*\*\* JOB \S+ ON \S+ CANCELLED AT \S+ (BY \S+ )?\*\*\*", "scancel (the job cancelled)"),
    (r"Received (Signals\.)?" + _SIGNALS + r" death signal", "a stop signal to torchrun ({signal})"),
    (r"SignalException: Process \d+ got signal: " + _SIGNALS + r"\b", "a stop signal ({signal})"),
    (r"exiting program after receiving SIGTERM", "SIGTERM (Megatron saved and exited)"),
    (r"Received signal " + _SIGNALS + r", initiating graceful stop", "a stop signal ({signal}, Megatron Bridge's handler)"),
    (r"Termination requested\. Performing orderly shutdown\.", "SIGINT or SIGTERM (Megatron's shutdown handler)"),
    (r"^\s*KeyboardInterrupt\s*$", "Ctrl-C (KeyboardInterrupt)"),
    # a container stopped: docker compose's Ctrl-C, its "Stopping" line (v1: "Stopping NAME ...", v2:
    # "Container NAME  Stopping"), the kubelet's event; docker SIGKILLs what is left after its grace period
    (r"Gracefully stopping\.\.\. \(press Ctrl\+C again to force\)", "the container stopped (docker compose)"),
    (r"^\s*Stopping [\w.-]+\s+\.\.\.", "the container stopped (docker compose)"),
    (r"\bContainer [\w.-]+\s+Stopping\b", "the container stopped (docker compose)"),
    (r"\bStopping container [\w.-]+", "the container stopped (Kubernetes)"),
)
JOB_STOPPED = tuple(pattern for pattern, _ in STOP_KINDS)
# A rank that ended on a stop signal (SIGTERM, SIGINT, SIGHUP, SIGUSR1/2: what Slurm sends on preemption or ahead of
# its time limit, --signal): as torchrun, the shell and srun print it. The job's stop only where nothing else had
# ended a rank first (torchrun's agent SIGTERMs the other ranks after one failed; diagnose.py tells them apart)
STOP_SIGNAL_EXITS: tuple[tuple[str, str], ...] = (
    (r"exitcode\s*:\s*-(?P<signal>1|2|10|12|15)\b", "a stop signal ({signal})"),
    (r"\(exitcode: -(?P<signal>1|2|10|12|15)\)", "a stop signal ({signal})"),
    (r"Signal (?P<signal>1|2|10|12|15) \(SIG(HUP|INT|USR1|USR2|TERM)\)", "a stop signal ({signal})"),
    (r":\s*line \d+:\s+\d+ (?P<signal>Terminated|Hangup|User defined signal [12])\b", "a stop signal ({signal})"),
    (r"^\s*(?P<signal>Terminated|User defined signal [12])\s*$", "a stop signal ({signal})"),
    (r"srun: error: .*: tasks? [\d,\-]+: (?P<signal>Terminated|User defined signal [12])\s*$", "a stop signal ({signal})"),
)
SIGNAL_NAMES = {"1": "SIGHUP", "2": "SIGINT", "10": "SIGUSR1", "12": "SIGUSR2", "15": "SIGTERM", "Terminated": "SIGTERM",
                "Hangup": "SIGHUP", "User defined signal 1": "SIGUSR1", "User defined signal 2": "SIGUSR2"}
# A rank that ended on its own before the stop, as srun and torchrun print it: an error exit code, or a signal that is
# no stop signal (a segmentation fault, an abort, a kill)
RANK_FAILED = (r"srun: error: .*: tasks? [\d,\-]+: (?!Terminated|User defined signal)\S|"
               r"exitcode\s*:\s*(?!-(1|2|10|12|15)\b)-?[1-9]|\(exitcode: (?!-(1|2|10|12|15)\))-?[1-9]")
# A kill that names the out-of-memory killer (unlike a bare SIGKILL, which a scheduler's stop also ends with)
OOM_KILLER = (r"Out of memory: Kill(ed)? process", r"invoked oom-killer", r"oom[-_]kill event", r"Memory cgroup out of memory",
              r"srun: error: .*: tasks? [\d,\-]+: Out Of Memory", r"DataLoader worker .* is killed by signal: Killed",
              r"Reason:\s+OOMKilled\b")  # Kubernetes: the container's memory limit
# A process's exit status 137 (128 + SIGKILL) as launchers and Python word it: docker's "exited with code 137", srun's
# "Exited with exit code 137", subprocess's "returned non-zero exit status 137.", torchrun's block "exitcode : 137",
# Kubernetes' "Exit Code: 137", a CI runner's "exit code 137", docker ps's "Exited (137)"; the words in any case (the
# "exit" spelt out, not in (?i:...), so that line_search.py still finds the lines that may hold it), the number
# standing alone (not 1370, 137.5, nor "137 steps" after another exit code)
EXIT_CODE_137 = (r"(?:Exit|exit|EXIT)(?i:ed with (?:exit )?(?:code|status)|ed \(|[ _]?(?:code|status))"
                 r"\s*[:=]?\s*137(?!\d|\.\d)")
# A rank's SIGBUS, as the shell, Python's faulthandler, torchrun and srun print it: shared memory (/dev/shm) that
# ran out under a mapping when one of these lines is near, else a crash like a segmentation fault
SIGBUS = (r"\bBus error \(core dumped\)", r"^\s*Bus error\s*$", r":\s*line \d+:\s+\d+ Bus error\b",
          r"Fatal Python error: Bus error", r"Signal 7 \(SIGBUS\)", r"exitcode\s*:\s*-7\b", r"\(exitcode: -7\)",
          r"Signals\.SIGBUS", r"srun: error: .*: tasks? [\d,\-]+: Bus error")
SHARED_MEMORY_NEAR = r"/dev/shm|shared memory|\bshm\b|--shm-size"
# A rank's SIGABRT, as C++'s std::terminate, Python's faulthandler, torchrun, srun, the shell and absl print it
SIGABRT = (r"terminate called after throwing an instance of '", r"Fatal Python error: Aborted", r"Signal 6 \(SIGABRT\)",
           r"exitcode\s*:\s*-6\b", r"\(exitcode: -6\)", r"Signals\.SIGABRT", r"\bAborted \(core dumped\)",
           r"^\s*Aborted\s*$", r":\s*line \d+:\s+\d+ Aborted\b", r"srun: error: .*: tasks? [\d,\-]+: Aborted",
           r"\*\*\* SIGABRT received at time=")
# The C++ exception std::terminate reports before the abort: its type, and on a line below, its what()
ABORT_EXCEPTION = r"terminate called after throwing an instance of '(?P<type>[^']+)'"
ABORT_WHAT = r"^\s*what\(\):\s+(?P<what>\S.*)"
# Settings of a run to turn off one at a time where a crash inside the run may come from offloading (the rules'
# fixes name them; diagnose.py names those the run had on)
OFFLOAD_BISECT = ("optimizer.optimizer_cpu_offload=False", "model.cpu_offloading=False",
                  "model.fine_grained_activation_offloading=False", "++env_vars.MBRIDGE_OFFLOAD_ENGINE=library")
BISECT_WORDS = "; if it only fails with offload, rerun with one of these at a time to find which: "
_BISECT = BISECT_WORDS + ", ".join(OFFLOAD_BISECT)
# How to go on after a stop from outside (diagnose.py fills in the run's own folder and fraction where its log
# states them): the plugin's resume rules with optimizer offload (README "Stopping, resuming and exact parity")
RESUME_WORDS = "resume with the same command plus checkpoint.load="
RESUME_OFFLOAD = ("with optimizer offload keep optimizer.optimizer_cpu_offload, optimizer.optimizer_offload_fraction "
                  "and optimizer.use_precision_aware_optimizer as saved (rules checkpoint/* refuse another before the "
                  "launch) and launch through run_recipe.py (its resume fix loads the offloaded optimizer states)")
RESUME_SAVE_FIRST = ("run_recipe.py with checkpoint.save=<dir> checkpoint.save_interval=<steps> saves at the next step "
                     "boundary on SIGTERM or Ctrl-C before it exits")
RESUME_SIGNAL_AHEAD = "under Slurm ask for the signal ahead of the kill (#SBATCH --signal=TERM@120) so that the save has time"
RESUME_TIME_LIMIT = "for a time limit: a longer --time, or fewer train.train_iters per job"
RESUME_FIX = (f"{RESUME_WORDS}<the checkpoint.save folder>; {RESUME_OFFLOAD}; without checkpoint.save nothing was "
              f"saved: {RESUME_SAVE_FIRST}; {RESUME_SIGNAL_AHEAD}; {RESUME_TIME_LIMIT}")
LOG_NEAR_LINES = 40  # lines either side of a signature's match searched for what tells its causes apart
# How to go on from the checkpoints a run wrote: the last save that finished, which the save folder's tracker file
# names (a save that failed or was cut short leaves an iter_* folder the tracker does not name)
CHECKPOINT_RESUME = ("resume from the last save that finished: checkpoint.load=<the checkpoint.save folder> (its "
                     "latest_train_state.pt, or latest_checkpointed_iteration.txt, names that iteration; move away an "
                     f"iter_* folder a failed save left past it); {RESUME_OFFLOAD}")
_OOM_FIX = ("optimizer.optimizer_cpu_offload=True optimizer.optimizer_offload_fraction=<larger>  (diagnose.py computes "
            "it from the run's config; or activation offload, train.micro_batch_size=1, more GPUs)")
# the same, for a run whose optimizer states were all on the host already (no larger fraction exists), where no config
# lets the planner compute the change that fits
OOM_FIX_AT_FULL_OFFLOAD = ("fewer activations or more GPUs: train.micro_batch_size=1, model.recompute_granularity=full "
                           "model.recompute_method=uniform model.recompute_num_layers=1, activation offload "
                           "(model.cpu_offloading=True, PP 1), model.context_parallel_size=2 or more GPUs (--num-gpus)  "
                           "(optimizer offload is at fraction 1 already; plan_offload.py with the run's overrides "
                           "names the cheapest that fits)")


def never(ctx: Context) -> bool:
    """Runtime failures are read from logs: no config breaks them before a launch."""
    return False


def _rule(id: str, key: str, text: str, fix: str, signatures: tuple[str, ...], severity: str = "error",
          not_near: tuple[str, ...] = ()) -> Rule:
    return Rule(id=id, mechanism=RUNTIME, key=key, text=text, applies=never, holds=lambda ctx: True, fix=fixed(fix),
                severity=severity, log_signatures=signatures, log_not_near=not_near)


def near(lines: Sequence[str], index: int, pattern: str, seen: dict[int, bool] | None = None) -> bool:
    """Whether a line within LOG_NEAR_LINES of ``lines[index]`` matches ``pattern``. ``seen``: each line's answer
    for ``pattern``, kept across calls (a log of many matching lines asks about the same lines again and again)."""
    regex = re.compile(pattern)
    for j in range(max(0, index - LOG_NEAR_LINES), min(len(lines), index + LOG_NEAR_LINES)):
        hit = None if seen is None else seen.get(j)
        if hit is None:
            hit = regex.search(lines[j]) is not None
            if seen is not None:
                seen[j] = hit
        if hit:
            return True
    return False


def is_this_cause(rule: Rule, lines: Sequence[str], index: int,
                  seen: dict[str, dict[int, bool]] | None = None) -> bool:
    """Whether the signature matched at ``lines[index]`` shows ``rule``: no line near it names another cause.
    ``seen``: per pattern, ``near``'s answers kept for this log."""
    return not any(near(lines, index, pattern, None if seen is None else seen.setdefault(pattern, {}))
                   for pattern in rule.log_not_near)


def log_shows(rule: Rule, lines: Sequence[str]) -> bool:
    """Whether a log's lines show ``rule`` broken, by its signatures and what is near them (diagnose.py reads the
    run's facts too; this is the log alone, for a tool that only needs to know what failed)."""
    return any(re.search(signature, line) and is_this_cause(rule, lines, i)
               for i, line in enumerate(lines) for signature in rule.log_signatures)


LIBRARY_FIX = f"++{ENGINE_KEY}=library"
_FIX = ". Fix: "


@dataclass(frozen=True)
class EngineMessage:
    """A message of the offload engine as a log shows it: the template the engine formats it from."""

    template: str  # facts/engine_messages.py
    raised_as: str | None = "EngineError"  # the exception class that carries the message; None: a printed line
    fields: Mapping[str, str] = field(default_factory=dict)  # a field's pattern (default: any text)
    measured: str = ""  # what the log's line says, from the fields' values (str.format)
    carries: str = ""  # the field that holds another error's text ("kind: text")

    @cached_property
    def signature(self) -> str:
        """The message as a regular expression: its words literally, each field a named group, anchored on the
        exception's line (a traceback's quote of the raising source is no failure)."""
        parts = [r"\b" + re.escape(self.raised_as) + ": " if self.raised_as else ""]
        for literal, name, _spec, _conversion in string.Formatter().parse(self.template):
            parts.append(re.escape(literal))
            if name is not None:
                parts.append(f"(?P<{name}>{self.fields.get(name, '.+?')})")
        return "".join(parts)

    @property
    def own_fix(self) -> str:
        """The fix the message names (the words after "Fix: "), "" where it names none."""
        return self.template.split(_FIX, 1)[1] if _FIX in self.template else ""

    def values(self, match: re.Match[str]) -> dict[str, str]:
        """The fields' values in a match of this message's ``signature`` (the fields the line holds)."""
        return {k: v for k, v in match.groupdict().items() if v is not None}

    def measured_from(self, values: Mapping[str, str]) -> str:
        return self.measured.format(**values) if self.measured else ""

    def carried_from(self, values: Mapping[str, str]) -> str:
        """The other error the message carries ("" if none): its text, as its own traceback's last line ends."""
        return values.get(self.carries, "").strip() if self.carries else ""


# Every message of the engine, by the rule it shows: the engine's own failures (engine/..., rules below) and the
# two that state a configuration rule of the validator's table (CONFIG_RULE_LOG_SIGNATURES)
ENGINE_MESSAGES: dict[str, EngineMessage] = {
    "engine/cpu-step-failed": EngineMessage(
        messages.CPU_STEP_FAILED, fields={"kind": r"[\w.]+", "error": r".*"},
        measured="the worker's error: {kind}: {error}", carries="error"),
    "engine/worker-stopped": EngineMessage(messages.WORKER_STOPPED,
                                           fields={"thread": "|".join(ENGINE_THREADS), "what": r".+"},
                                           measured="the {thread} thread, waiting for {what}"),
    "engine/delayed-fp32-weights": EngineMessage(messages.DELAYED_FP32_WEIGHTS, fields={"count": r"\d+"},
                                                 measured="{count} offloaded parameter(s) in fp32"),
    "engine/stream-outside-distributed-optimizer": EngineMessage(messages.STREAM_OUTSIDE_DISTRIBUTED_OPTIMIZER),
    "engine/stream-not-fp32": EngineMessage(messages.STREAM_NOT_FP32, fields={"dtypes": r"[\w., ]+"},
                                            measured="the optimizer's weights: {dtypes}"),
    "engine/stream-pin-failed": EngineMessage(messages.STREAM_PIN_FAILED,
                                              fields={"gib": r"[\d.]+", "status": r"[^)]*"},
                                              measured="{gib} GiB, cudaHostRegister returned {status}"),
    "engine/stream-fused-adam-import": EngineMessage(messages.STREAM_FUSED_ADAM_IMPORT),
    "engine/stream-not-main-weights": EngineMessage(messages.STREAM_NOT_MAIN_WEIGHTS, fields={"count": r"\d+"},
                                                    measured="{count} offloaded tensor(s)"),
    "engine/stream-step-counts": EngineMessage(messages.STREAM_STEP_COUNTS, fields={"steps": r"\[[^\]]*\]"},
                                               measured="step counts {steps}"),
    "engine/stream-pinned-cache-kept": EngineMessage(messages.STREAM_NO_HOST_EMPTY_CACHE, raised_as=None),
    "offload-engine/known": EngineMessage(messages.UNKNOWN_ENGINE, raised_as="ValueError",
                                          fields={"mode": r"'[^']*'|\"[^\"]*\"", "modes": r"[\w, ]+"},
                                          measured="MBRIDGE_OFFLOAD_ENGINE={mode}"),
    "offload-engine/stream-adam": EngineMessage(messages.STREAM_NOT_FUSED_ADAM, fields={"optimizer": r"\S+"},
                                                measured="this run's GPU optimizer: {optimizer}"),
    "offload-engine/stream-moments-known": EngineMessage(messages.STREAM_MOMENTS_UNKNOWN,
                                                         fields={"value": r"'[^']*'|\"[^\"]*\"", "values": r"[\w, ]+"},
                                                         measured=f"{STREAM_MOMENTS_ENV}={{value}}"),
}


def _engine_rule(id: str, key: str, text: str, fix: str = "", severity: str = "error") -> Rule:
    """A failure of the offload engine: its signature built from its message's template (ENGINE_MESSAGES), its fix
    the one the message names unless ``fix`` says otherwise."""
    message = ENGINE_MESSAGES[id]
    return _rule(id, key, text, fix or message.own_fix, (message.signature,), severity)


RULES: tuple[Rule, ...] = (
    _rule("runtime/cuda-oom", "optimizer.optimizer_offload_fraction",
          "the GPU ran out of memory: weights, gradients, the GPU share of the optimizer states and the activations "
          "exceed what PyTorch's allocator could get", _OOM_FIX, _OOM),
    _rule("runtime/oom-partial-offload", "optimizer.optimizer_offload_fraction",
          "out of GPU memory with part of the optimizer states offloaded: the share left on the GPU plus the "
          "activations still does not fit",
          "optimizer.optimizer_offload_fraction=<the next fraction that fits>  (diagnose.py asks the planner)", _OOM),
    _rule("runtime/oom-with-activation-offload", "optimizer.optimizer_cpu_offload",
          "out of GPU memory with layer-level activation offload: it moves activations only, and on a large model "
          "the weights, gradients and optimizer states fill the GPU",
          "optimizer.optimizer_cpu_offload=True optimizer.optimizer_offload_fraction=<what fits>  (add optimizer "
          "offload; or more GPUs / TP / PP)", _OOM),
    _rule("runtime/oom-with-fetch-ahead", FETCH_AHEAD_KEY,
          "out of GPU memory with the stream engine's fetch-ahead on: its buffers come up during the backward and are "
          "memory the plan does not count (on the 4-layer MoE proxy the peak allocated stayed put but the reserved "
          "memory grew by the 2.9 GiB they held, docs/benchmarks/offload-engine/stream-fetch-ahead)",
          f"++{FETCH_AHEAD_KEY}=off  (the default; a value in the launch shell wins: unset it there)", _OOM),
    _rule("runtime/oom-outside-pytorch", "optimizer.optimizer_offload_fraction",
          "a CUDA allocation outside PyTorch found the GPU full: NCCL's communicator buffers (made at a process "
          "group's first collective, often inside the first step) or a cuBLAS / cuDNN workspace. PyTorch's caching "
          "allocator held the rest, the free memory it caches included (it does not hand that to other "
          "allocators), or another process did", _OOM_FIX, OOM_OUTSIDE_PYTORCH, not_near=OOM_OUTSIDE_PYTORCH_NOT_NEAR),
    _rule("runtime/host-memory-killed", "optimizer.optimizer_offload_fraction",
          "a rank was killed with SIGKILL (signal 9), the kernel's answer to a node out of host memory: offloaded "
          "optimizer states and pinned buffers live there, and the node's use peaks inside the first optimizer step",
          "a smaller optimizer.optimizer_offload_fraction (the largest the host holds), fewer ranks per node or more "
          "nodes; plan with more headroom: --host-margin-gib",
          (*OOM_KILLER, r"exitcode\s*:\s*-9\b", r"Signal 9 \(SIGKILL\)", r"Signals\.SIGKILL", r"killed by signal 9\b",
           r"^Killed\s*$", r":\s*line \d+:\s+\d+ Killed\b", r"srun: error: .*: tasks? [\d,\-]+: Killed",
           EXIT_CODE_137)),
    _rule("runtime/host-allocation-failed", "optimizer.optimizer_offload_fraction",
          "a host memory allocation failed (ENOMEM: the node, or the job's cgroup or container limit, had no memory "
          "left): offloaded optimizer states and pinned buffers live in host memory, and the node's use peaks inside "
          "the first optimizer step",
          "a smaller optimizer.optimizer_offload_fraction (the largest the host holds), fewer ranks per node or more "
          "nodes, or a larger job memory limit (Slurm --mem, the container's); plan with more headroom: "
          "--host-margin-gib",
          (r"Cannot allocate memory", r"DefaultCPUAllocator: (not enough memory|can't allocate memory)",
           r"std::bad_alloc", r"^\s*MemoryError\b"),
          not_near=(r"ibv_reg_mr|ibv_\w+ failed",)),
    _rule("runtime/pinned-host-memory", "optimizer.pin_cpu_grads",
          "allocating pinned (page-locked) host memory failed: the offload copies use pinned buffers, bounded by the "
          "node's free memory and the memlock limit (ulimit -l)",
          "a smaller optimizer.optimizer_offload_fraction, or optimizer.pin_cpu_grads=False "
          "optimizer.pin_cpu_params=False (slower copies); in a container raise memlock (--ulimit memlock=-1)",
          (r"cudaHostAlloc", r"CachingHostAllocator.*(fail|error|out of memory)",
           r"pin_memory.*(fail|error|out of memory)", r"CUDA (error|Error|driver error): out of memory",
           r"cudaErrorMemoryAllocation", r"Failed to CUDA host alloc",
           r"ibv_reg_mr.*(Cannot allocate memory|failed)")),
    _rule("runtime/nccl-timeout", "dist.distributed_timeout_minutes",
          "a collective waited past the NCCL timeout: another rank had stopped (killed, out of memory, an exception) "
          "or was far slower (a long CPU optimizer step)",
          # ranks print out of order and a rank's own log may be another file: the failure it waited on can stand
          # above the timeout, below it, or in no line of this output
          "fix the rank that failed first (its error may stand above or below the timeout, or only in that rank's own "
          "log); if every rank was only slow: dist.distributed_timeout_minutes=30",
          (r"Watchdog caught collective operation timeout", r"ProcessGroupNCCL.*[Tt]imeout",
           r"NCCL.*(timed out|Timeout\(ms\)=)")),
    _rule("runtime/nccl-error", "(launch)",
          "an NCCL call failed: a peer rank exited in the middle of a collective (its own error, above or below this "
          "one or only in its own log, is the cause) or the network between the ranks failed",
          "fix the rank that failed first (its error may stand above or below this one, or only in that rank's own "
          "log); if none did: rerun with NCCL_DEBUG=INFO and check the network NCCL picked (NCCL_SOCKET_IFNAME, "
          "NCCL_IB_HCA)",
          (r"ncclRemoteError", r"ncclSystemError", r"ncclInternalError",
           r"remote process exited or there was a network error", r"NCCL error in: .*unhandled system error",
           r"NCCL communicator was aborted")),
    _rule("runtime/job-stopped", "checkpoint.save",
          "the job was stopped from outside (Slurm's time limit, a preemption, scancel, a stop signal: SIGTERM, "
          "SIGINT/Ctrl-C, SIGHUP, SIGUSR1; or its container stopped: docker stop, compose down or Ctrl-C, a pod "
          "deleted): the run itself did not fail, and ranks killed after the stop are its consequence (docker's exit "
          "code 137 after a stop is its SIGKILL at the end of the grace period, not the out-of-memory killer)",
          RESUME_FIX, (*JOB_STOPPED, *(pattern for pattern, _ in STOP_SIGNAL_EXITS)), severity="warning"),
    _rule("runtime/shared-memory", "dataset.num_workers",
          "shared memory (/dev/shm) ran out: the data-loader workers hand batches to the rank there, and NCCL's "
          "shared-memory transport between the GPUs of a node keeps its buffers there; a container's default is 64 MB "
          "(a rank's SIGBUS near /dev/shm is the same: a page of a shared mapping that could not be backed)",
          "give the container more shared memory (docker run --shm-size=16g or --ipc=host; Kubernetes: an emptyDir "
          "with medium Memory on /dev/shm), or dataset.num_workers=0 (batches built in the rank, no shared memory); "
          "for NCCL's segments only: NCCL_SHM_DISABLE=1 (slower between the GPUs of a node)",
          (r"bus error encountered in worker\. This might be caused by insufficient shared memory",
           r"is killed by signal: Bus error", r"unable to write to file </torch_\d+_\d+(_\d+)?>",
           r"NCCL WARN Error while creating shared memory segment", r"NCCL WARN Error: failed to extend /dev/shm/",
           r"NCCL WARN Call to posix_fallocate failed", *SIGBUS)),
    _rule("runtime/hydra-override", "(override)",
          "a command-line override Megatron Bridge applies with Hydra's parser was refused before the run started: a "
          "key the config does not have ('Could not override'), or an override Hydra cannot parse",
          "correct the override the message names: a key the config has (uv run scripts/run_recipe.py --recipe NAME "
          "--dry-run <overrides> names the nearest one), +key=value to add a key the config lacks, quotes around a "
          "value holding = , [ ] or spaces ('key=\"a,b\"')",
          (r"Failed to parse Hydra overrides: ", r"ConfigCompositionException: Could not override '",
           r"OverrideParseException: ", r"Error parsing override '")),
    _rule("runtime/nan-loss-or-grad", "optimizer.lr",
          "the loss or the gradients became NaN or Inf (Megatron's iteration line counts a NaN iteration, or its check "
          "of the loss or of a gradient bucket's norm stopped the run): training diverged (learning rate, warm-up, a "
          "bad batch), not a memory failure; an offload setting takes part only where it changes the update (the "
          "delayed engine; the stream engine's bf16 moments, which diagnose names where the run had them)",
          "resume from the last checkpoint before it (checkpoint.load=<dir>) with a lower optimizer.lr, a longer "
          "scheduler.lr_warmup_iters or a smaller optimizer.clip_grad; the same iteration failing again on other GPUs "
          "points at the data",
          (r"found (NaN|Inf) in local (grad norm|forward loss calculation)", r"number of nan iterations:\s*[1-9]",
           r"\| grad norm: (nan|inf) \|")),
    _rule("runtime/gpu-hardware-fault", "(node)",
          "a GPU or its node failed (an uncorrectable ECC error, the GPU fell off the bus, an NVLink error: the "
          "driver's Xid 48, 74, 79, 94, 95; Slurm's NODE FAILURE): the hardware, not the run's settings",
          "rerun on other GPUs: drain the node or leave it out (Slurm: --exclude=<node>), then resume from the last "
          "checkpoint (checkpoint.load=<dir>); report the GPU to the cluster's admins",
          (r"uncorrectable ECC error encountered", r"cudaErrorECCUncorrectable", r"CUDA_ERROR_ECC_UNCORRECTABLE",
           r"GPU has fallen off the bus", r"NVRM: Xid \([^)]*\): (48|74|79|94|95)\b",
           r"srun: error: Node failure on ", r"CANCELLED AT \S+ DUE TO NODE FAIL")),
    _rule("runtime/cuda-illegal-address", "(kernel)",
          "a GPU kernel read or wrote memory outside what it was given (cudaErrorIllegalAddress, CUDA error 700; or a "
          "misaligned address), or a kernel failed to run (CUDA's 'unspecified launch failure', error 719; cuBLAS's "
          "CUBLAS_STATUS_EXECUTION_FAILED, its GEMM kernel failing): a bug in a kernel or in the tensors handed to it "
          "(a stale pointer, a wrong size or stride), not a lack of memory; a fault that only one node or GPU shows "
          "again is its hardware (the driver's Xid in dmesg). CUDA reports it at a later call, so the traceback's line "
          "and the allocation failures that follow it are not the cause, and the CUDA context is lost for the process",
          "rerun with CUDA_LAUNCH_BLOCKING=1 (the traceback then names the kernel), or under compute-sanitizer "
          "--tool memcheck (the kernel and the address)" + _BISECT,
          (r"an illegal memory access was encountered", r"cudaErrorIllegalAddress", r"CUDA_ERROR_ILLEGAL_ADDRESS",
           r"Cuda failure 700\b", r"\berr(or)? 700 != CUDA_SUCCESS",
           r"CUDA (error|Error): misaligned address", r"cudaErrorMisalignedAddress",
           r"CUBLAS_STATUS_EXECUTION_FAILED", r"CUDA (error|Error): unspecified launch failure",
           r"cudaErrorLaunchFailure", r"CUDA_ERROR_LAUNCH_FAILED")),
    _rule("runtime/device-side-assert", "(data)",
          "a GPU kernel's own check failed (a device-side assert): most often an index out of range, a token id at or "
          "above the model's vocabulary size (data tokenized with another tokenizer, or a tokenizer larger than the "
          "model's vocabulary) or a label outside the loss's classes; the kernel's line ('Assertion ... failed', "
          "printed before the traceback) names the check. CUDA reports it at a later call, and the process's CUDA "
          "context is lost",
          "compare the data's largest token id with the model's vocabulary (tokenizer.vocab_size, the padded "
          "vocabulary is a multiple of model.make_vocab_size_divisible_by x TP) and fix the data or the tokenizer; "
          "CUDA_LAUNCH_BLOCKING=1 makes the traceback stop at the operation that asserted",
          (r"CUDA error: device-side assert triggered", r"cudaErrorAssert\b", r"CUDA_ERROR_ASSERT\b",
           r"block: \[\d+,\d+,\d+\], thread: \[\d+,\d+,\d+\] Assertion `.+` failed")),
    _rule("runtime/rank-crashed", "(launch)",
          "a rank's process crashed in native code (SIGSEGV, a segmentation fault; or a SIGBUS away from shared "
          "memory): a C++/CUDA extension, a library built against another torch or CUDA (Transformer Engine, Apex), "
          "or a fault of the node's memory. Python raised nothing, so the other ranks only see it leave",
          "rerun with PYTHONFAULTHANDLER=1 (Python prints each thread's stack at the crash: 'Current thread' is where "
          "it crashed) and ulimit -c unlimited (gdb python core, then bt, names the library); check that torch, "
          "Transformer Engine and Apex were built for each other (python -c 'import transformer_engine.pytorch')"
          + _BISECT,
          (r"Fatal Python error: Segmentation fault", r"\bSegmentation fault \(core dumped\)", r"^\s*Segmentation fault\s*$",
           r":\s*line \d+:\s+\d+ Segmentation fault\b", r"Signal 11 \(SIGSEGV\)", r"exitcode\s*:\s*-11\b",
           r"\(exitcode: -11\)", r"Signals\.SIGSEGV", r"srun: error: .*: tasks? [\d,\-]+: Segmentation fault",
           r"is killed by signal: Segmentation fault", *SIGBUS)),
    _rule("runtime/rendezvous-timeout", "(launch)",
          "the ranks never all met at the start: a node or rank did not join the rendezvous (it never started, "
          "failed before it, or waits on another address), MASTER_ADDR / MASTER_PORT (--rdzv-endpoint) is wrong or "
          "not reachable from every node (a firewall, the wrong network interface, a port in use), or the first node "
          "started much later than the others. This is the start-up's store, not a collective of training "
          "(runtime/nccl-timeout)",
          "start every node with the same reachable MASTER_ADDR and MASTER_PORT (Slurm: MASTER_ADDR=$(scontrol show "
          "hostnames $SLURM_JOB_NODELIST | head -n 1)) and the same --nnodes; open the port between the nodes; fix "
          "the node that did not join (its own log); if the nodes only start far apart: a longer --rdzv-conf "
          "timeout=<seconds> or dist.distributed_timeout_minutes",
          (r"^(?!\s*raise\b).*\bRendezvous(Timeout|Connection)Error(:|\s*$)",  # raised, not the source line
           r"Timed out after \d+ seconds waiting for (clients|workers)",
           r"DistStoreError: Socket Timeout", r"^\s*RuntimeError: Socket Timeout\s*$",
           r"The client socket has timed out after \S+ while trying to connect to",
           r"The client socket has failed to connect to any network address", r"connect\(\) timed out\. Original timeout",
           r"retrieving ncclUniqueIds? from \S+ via (c10d key-value store|TCPStore) by key '[^']*', but store->get\('[^']*'\) got "
           r"error")),
    _rule("runtime/rank-aborted", "(launch)",
          "a rank's process aborted (SIGABRT): C++ ended it on an exception nothing caught ('terminate called after "
          "throwing an instance of ...'; its what() line says which) or a library called abort(). Where the what() "
          "line or an earlier line names a failure of this table (an NCCL watchdog timeout, an illegal address), that "
          "one is the cause and the abort only how the process ended",
          "read the exception's what() line (diagnose.py names it); rerun with PYTHONFAULTHANDLER=1 (the Python stack "
          "at the abort) and ulimit -c unlimited (gdb python core, then bt)" + _BISECT, SIGABRT),
    _rule("runtime/path-not-writable", "checkpoint.save",
          "the run could not create or write a file or folder (permission denied, or a read-only file system): the "
          "checkpoint folder, the log or TensorBoard folder, a cache; the message names the path",
          "checkpoint.save=<a folder the job's user can write> (likewise logger.tensorboard_dir, or HF_HOME for a "
          "cache), or give that user write access to the path the message names",
          (r"PermissionError: \[Errno 13\] Permission denied", r"\[Errno 13\] Permission denied: '",
           r"\[Errno 30\] Read-only file system")),
    _rule("runtime/checkpoint-unreadable", "checkpoint.load",
          "the checkpoint being loaded is incomplete or damaged: a file cut short (a save that was killed or ran out "
          "of disk, a copy not finished) or a checkpoint folder without the files every one has (dist-checkpointing's "
          "metadata.json, torch's .metadata, common.pt)",
          "checkpoint.load=<dir> checkpoint.ckpt_step=<an earlier iteration saved whole>, or move the broken iter_* "
          "folder away and write the previous iteration into latest_checkpointed_iteration.txt",
          (r"PytorchStreamReader failed reading (zip archive|file)", r"is not a distributed checkpoint",
           r"No such file or directory: '[^']*/(\.metadata|metadata\.json|common\.pt)'",
           r"CheckpointingException: .*([Cc]orrupt|[Tt]runcated|incomplete)")),
    _rule("runtime/checkpoint-not-found", "checkpoint.load",
          "the checkpoint to load is not there: checkpoint.load (or checkpoint.pretrained_checkpoint) names a folder "
          "without a checkpoint, checkpoint.ckpt_step an iteration that was never saved, or the iter_* folder the "
          "tracker file names is gone (moved, deleted by most_recent_k, another file system on this node)",
          "checkpoint.load=<the folder checkpoint.save wrote: it holds latest_train_state.pt or "
          "latest_checkpointed_iteration.txt, and iter_* folders> with checkpoint.ckpt_step=<an iteration ls "
          "<dir>/iter_* lists> or without checkpoint.ckpt_step (the latest); or start from scratch without "
          f"checkpoint.load; {RESUME_OFFLOAD}",
          (r"(Error|Exception): No checkpoint found in load directory or pretrained directory",
           r"ckpt_step=\d+ specified but checkpoint directory does not exist: ",
           r"CheckpointingException: Checkpoint directory \S+ does not exist")),
    _rule("runtime/checkpoint-model-mismatch", "checkpoint.load",
          "the checkpoint holds another model than the one this run built: other layers or sizes (another recipe, "
          "num_layers, hidden or vocabulary size), or a checkpoint in the legacy torch format loaded with another "
          "TP or PP (only the distributed format, torch_dist, reshards on load)",
          "build the model the checkpoint was saved with (its run_config.yaml beside it); to change TP or PP save "
          "with checkpoint.ckpt_format=torch_dist; to start from its weights alone: checkpoint.pretrained_checkpoint="
          "<dir> without checkpoint.load",
          (r"Error\(s\) in loading state_dict for ", r"size mismatch for \S+: copying a param with shape",
           r"(Unexpected|Missing) key\(s\) in state_dict: ", r"Missing key in checkpoint state_dict: ",
           # Megatron's dist-checkpointing: a tensor's global shape, or keys the model and the checkpoint do not share
           r"Global shape mismatch for loaded \(.*\) and expected \(.*\) tensor for key ",
           r"Some keys found in the checkpoint are missing in the provided sharded state dict",
           r"Unexpected keys \(not found in the checkpoint\) encountered in the provided sharded state dict")),
    _rule("runtime/cuda-driver-too-old", "(node)",
          "the node's NVIDIA driver is older than the CUDA runtime torch was built with, so no CUDA call can run",
          "run on nodes whose driver supports this CUDA (nvidia-smi's 'CUDA Version' at least torch.version.cuda), "
          "or install the torch built for the driver's CUDA (or use the container's CUDA forward-compatibility "
          "package)",
          (r"CUDA driver version is insufficient for CUDA runtime version", r"cudaErrorInsufficientDriver",
           r"The NVIDIA driver on your system is too old")),
    _rule("runtime/no-gpu-visible", "(node)",
          "the process saw no GPU: CUDA_VISIBLE_DEVICES empty or naming GPUs that are not there, a container started "
          "without GPUs, a Slurm job without a GPU allocation, or no NVIDIA driver on the node",
          "give the job its GPUs: srun/sbatch --gpus-per-node=N, docker run --gpus all, Kubernetes nvidia.com/gpu; "
          "unset CUDA_VISIBLE_DEVICES or set it to the node's GPUs (0,1,...)",
          (r"No CUDA GPUs are available", r"no CUDA-capable device is detected", r"cudaErrorNoDevice\b",
           r"CUDA_ERROR_NO_DEVICE\b", r"Found no NVIDIA driver on your system")),
    _rule("runtime/gpu-arch-unsupported", "(environment)",
          "a CUDA library or extension of this environment holds no kernel built for this GPU's architecture (torch, "
          "Transformer Engine, Apex or another extension compiled for other GPUs, e.g. without sm_90 for an H100)",
          "install builds that include this GPU's compute capability (python -c 'import torch; print(torch.cuda."
          "get_arch_list())'); rebuild an extension with TORCH_CUDA_ARCH_LIST=<the GPU's, e.g. 9.0>",
          (r"no kernel image is available for execution on the device", r"cudaErrorNoKernelImageForDevice",
           r"CUDA_ERROR_NO_BINARY_FOR_GPU")),
    _rule("runtime/cuda-library-missing", "(environment)",
          "a CUDA library torch or an extension loads (libcudart, libnccl, libcublas, libcudnn, ...) is not on the "
          "library path: a torch or extension built for another CUDA, or a container or module that does not ship it",
          "install the torch (and extensions) built for this environment's CUDA, or put the library's folder on "
          "LD_LIBRARY_PATH (pip's nvidia-*-cu12 packages, module load cuda)",
          (r"(ImportError|OSError): lib(cudart|nccl|cublas(Lt)?|cudnn\w*|cusparse\w*|cufft|curand|cusolver|nvrtc|"
           r"nvJitLink|cuda)\.so[.\d]*: cannot open shared object file",)),
    _rule("runtime/library-version-mismatch", "(environment)",
          "installed libraries that were not built or released for each other: a compiled extension (flash-attn's "
          "flash_attn_2_cuda, Apex's, another .so) built against another torch, so a C++ symbol of torch it needs is "
          "not there ('undefined symbol'); Transformer Engine's packages at different versions (transformer-engine, "
          "its core library and its torch extension); a Transformer Engine older than a setting of the run needs "
          "(megatron-core's 'requires Transformer Engine >= ...'), or a cuDNN or torch older than it needs",
          "install versions built for each other: the extension rebuilt for the installed torch (pip install "
          "--no-build-isolation --force-reinstall --no-deps <it>), Transformer Engine's packages at one version "
          "(pip3 install --no-build-isolation transformer-engine[pytorch]==<the version>, as its message says), or the "
          "Transformer Engine the message asks for (or that setting off); in this project uv sync builds them for "
          "the locked torch",
          # the exception's line, not a traceback's quote of the source that raises it; Transformer Engine's own
          # extension failing to load is env/transformer-engine (CONFIG_RULE_LOG_SIGNATURES)
          (r"ImportError: (?!\S*transformer_engine)\S+\.so(\.\d+)*: undefined symbol: ",
           r"(Error|Exception): Transformer Engine package version mismatch\. Found",
           r"(Error|Exception): Transformer Engine requires cuDNN \S+ or later, but the cuDNN runtime is ",
           r"(Error|Exception): .*\brequires Transformer Engine (>= ?)?\d",
           r"(Error|Exception): .*(Please install TE >= ?\d|Only TE >= ?\d\S* supports|Must have at least TE version \d)",
           r"(Error|Exception): Minimum torch version \S+ required\. Found ")),
    _rule("runtime/nccl-network", "(network)",
          "the network between the nodes failed under NCCL: an InfiniBand/RoCE transfer completed with an error "
          "(status 12: retries exhausted; a link, a switch or a port), or NCCL's socket to a peer was reset or closed. "
          "A peer that died first gives the same lines: its own error, earlier, is then the cause",
          "fix the first rank that failed if one did; else check the links (ibstat, ibv_devinfo: State Active) and "
          "rerun with NCCL_DEBUG=INFO; pick the right interfaces (NCCL_IB_HCA, NCCL_SOCKET_IFNAME) and, for a flaky "
          "fabric, a longer NCCL_IB_TIMEOUT; drain a node whose link fails again (--exclude=<node>)",
          (r"NET/IBP? ?: ?Got completion from peer \S+ with (error|status)",
           r"NCCL WARN (NET/Socket|Net) ?: .*(failed|reset|refused|closed)",
           r"NCCL WARN socketProgress\w*: .*(reset by peer|closed by remote peer)")),
    _rule("runtime/python-exception", "(code)",
          "a Python exception no rule of this table names ended the run; where it was raised is the traceback's last "
          "frame (diagnose.py names its file, line and function): the run's own script, a dataset, a callback or a "
          "library. Nothing in the log points at memory or offloading",
          "fix the code at the traceback's last frame (or what it was given: the data, a key of a sample, an "
          "attribute the callback expects); if that frame is in mbridge_offload, report it with the log",
          (r"^Traceback \(most recent call last\):",)),
    _rule("runtime/dataset-helper-makefile", "(launch)",
          "Megatron's initialisation ran make to build the dataset helper, and the pip wheel ships no Makefile",
          "launch through scripts/run_recipe.py: it uses the wheel's compiled helper instead of make",
          (r"make: \*\*\* No targets specified and no makefile found",)),
    _rule("runtime/resume-offload-keyerror", "checkpoint.load",
          "resuming with optimizer offload failed in HybridDeviceOptimizer._update_fp32_params_by_new_state "
          "(KeyError: tensor(...)): upstream cannot load its own offloaded checkpoint",
          "launch through scripts/run_recipe.py (or python -m mbridge_offload.cli.run_recipe): it installs the "
          "resume fix of mbridge_offload/runtime/resume_fix.py", (r"KeyError: tensor\(", r"KeyError: Parameter containing:")),
    _rule("runtime/cpu-threads", "--cpu-threads",
          "the CPU optimizer ran with too few threads per rank (torchrun gives each rank OMP_NUM_THREADS=1 when a "
          "node runs several): 100% offload ran 4.3x slower than no offload with 1 thread, 1.85x with 16 (H200)",
          "--cpu-threads auto  (run_recipe.py's default; or export OMP_NUM_THREADS=<cores / ranks per node>)",
          (r"WARNING: the CPU optimizer runs on \d+ thread", r"CPU threads per rank: 1\b",
           r"Setting OMP_NUM_THREADS environment variable for each process to be 1"), severity="warning"),
    _rule("runtime/full-offload-slowdown", "optimizer.optimizer_offload_fraction",
          "at optimizer offload fraction 1 a step took more than 4x the step without offload: every Adam step runs "
          "on the CPU and every gradient and parameter crosses the host link each step",
          "optimizer.optimizer_offload_fraction=<the smallest that fits> optimizer.overlap_cpu_optimizer_d2h_h2d=True "
          "--cpu-threads auto  (bench_offload.py shows the host's floor)",
          (r"elapsed time per iteration \(ms\)",), severity="warning"),
    _rule("runtime/fine-grained-warmup", "model.fine_grained_activation_offloading",
          "the first step with fine-grained activation offload is much slower than the rest: it allocates the pinned "
          "host buffers and records the offload order, which later steps reuse",
          "nothing to fix: judge speed after warm-up (summary.json's step_time_s excludes the warm-up steps)",
          (r"elapsed time per iteration \(ms\)",), severity="warning"),
    _rule("runtime/checkpoint-write-failed", "checkpoint.save",
          "writing the checkpoint failed: the file writer stopped mid-file ('unexpected pos'), what a full disk gives "
          "(with optimizer offload a checkpoint takes ~18 bytes per parameter)",
          "free disk space, or checkpoint.save=<a folder on a larger disk> checkpoint.most_recent_k=1; then "
          f"{CHECKPOINT_RESUME}",
          (r"No space left on device", r"unexpected pos \d+ vs \d+", r"Disk quota exceeded",
           # the errno alone where the message is cut short or translated: ENOSPC, EDQUOT (Linux)
           r"\[Errno (28|122)\]",
           # torch.save's writer when a write() fails (a full disk, a quota): the message names no errno
           r"PytorchStreamWriter failed writing file .*: file write failed")),
    _rule("runtime/stop-killed-data-loader-workers", "train.exit_signal_handler_for_dataloader",
          "a stop signal sent to the whole job (a Slurm preemption, scancel, Ctrl-C) killed the data-loader workers: "
          "torch's workers die on a SIGTERM that is not their parent's, and the rank failed before it could save",
          "train.exit_signal_handler_for_dataloader=True train.exit_signal_handler=True  (run_recipe.py sets both "
          "when checkpoint.save is set)",
          (r"DataLoader worker \(pid\(?s?\)? ?[\d, ]+\)? is killed by signal: Terminated",)),
    _rule("runtime/hf-hub-unreachable", "tokenizer.tokenizer_type",
          "the run tried to reach the Hugging Face hub and could not (an offline node, or HF_HUB_OFFLINE=1)",
          "use a recipe of this project (NullTokenizer and mock data, built without the hub), or download on a "
          "connected host and run with HF_HOME=<that cache> HF_HUB_OFFLINE=1",
          (r"We couldn't connect to 'https://huggingface\.co'", r"LocalEntryNotFoundError", r"OfflineModeIsEnabled",
           r"huggingface_hub.*(ConnectionError|ConnectTimeout|MaxRetryError|NameResolutionError)",
           r"Max retries exceeded with url: .*huggingface\.co")),
    # the plugin's offload engine (its messages: ENGINE_MESSAGES)
    _engine_rule("engine/cpu-step-failed", ENGINE_KEY,
                 "the offload engine's worker thread failed in the CPU optimizer step (the host's Adam on the "
                 "offloaded share, which the exact and delayed engines run beside the next step's forward), or one of "
                 "its copy threads (the gradients to the host, the updated weights back); the training thread raised "
                 "that thread's error at the next point that waited for it",
                 fix=f"{LIBRARY_FIX}  (the library's own CPU step instead of the engine's worker thread)"),
    _engine_rule("engine/worker-stopped", ENGINE_KEY,
                 "the offload engine's worker thread, which runs the offloaded optimizer step, or one of its copy "
                 "threads (the gradients to the host, the updated weights back) had stopped while the training "
                 "thread waited for it: the engine hands its own errors to the training thread, so something else "
                 "ended the thread or the process around it, and that is the failure to fix",
                 fix=f"fix the first error above this one in the output (every rank's); with none there: {LIBRARY_FIX}"),
    _engine_rule("engine/delayed-fp32-weights", ENGINE_KEY,
                 "the delayed offload engine refused to start: offloaded parameters are fp32 in the model itself, so "
                 "their fp32 copy is the live weight, and the update it delays by one step would overwrite it in the "
                 "middle of the next step"),
    _engine_rule("engine/stream-outside-distributed-optimizer", "optimizer.use_distributed_optimizer",
                 "the stream offload engine met an offloaded optimizer step outside Megatron's distributed optimizer: "
                 "it runs only inside one (it streams the moments of the distributed optimizer's fp32 shards)"),
    _engine_rule("engine/stream-not-fp32", "optimizer.use_precision_aware_optimizer",
                 "the stream offload engine refused the optimizer: it keeps fp32 main weights on the host, and this "
                 "optimizer steps lower-precision ones (what Megatron's precision-aware optimizer keeps)"),
    _engine_rule("engine/stream-pin-failed", ENGINE_KEY,
                 "the stream offload engine could not pin (page-lock) its host buffers, Adam's moments and the fp32 "
                 "weights of the offloaded share: the locked-memory limit (ulimit -l) or the node's free memory is "
                 "too small"),
    _engine_rule("engine/stream-fused-adam-import", ENGINE_KEY,
                 "the stream offload engine updates with Transformer Engine's FusedAdam (the GPU optimizer without "
                 "offload), and Transformer Engine does not import in this environment"),
    _engine_rule("engine/stream-not-main-weights", ENGINE_KEY,
                 "the stream offload engine found offloaded tensors that are not fp32 main weights of Megatron's "
                 "distributed optimizer, which it cannot lay out in its host buffers"),
    _engine_rule("engine/stream-step-counts", "checkpoint.load",
                 "resuming with the stream offload engine: the checkpoint's offloaded optimizer states hold different "
                 "step counts, so they were not all saved at the same step (the checkpoint is inconsistent)",
                 fix="checkpoint.load=<dir> checkpoint.ckpt_step=<an earlier saved iteration>  (or start without "
                     "checkpoint.load)"),
    _engine_rule("engine/stream-pinned-cache-kept", ENGINE_KEY,
                 "this torch cannot hand cached pinned memory back to the system (no torch._C._host_emptyCache): the "
                 "library's pinned host copies of the weights, which the stream engine replaced with its own buffers, "
                 "stay held, so the node uses more host memory than the plan counts",
                 fix="a torch whose torch._C has _host_emptyCache, or more host headroom: plan_offload.py "
                     f"--host-margin-gib <GiB>; or {LIBRARY_FIX}", severity="warning"),
)

# How to confirm each runtime failure before changing anything.
CONFIRM: dict[str, str] = {
    "runtime/cuda-oom": "plan it: uv run scripts/plan_offload.py --recipe NAME --num-gpus N <your overrides> "
                        "--gpu-memory-gib <the GPU's>; it shows the GPU bytes and the smallest fraction that fits",
    "runtime/oom-partial-offload": "uv run scripts/plan_offload.py ... optimizer.optimizer_offload_fraction=auto "
                                   "prints the smallest fraction the GPU fits",
    "runtime/oom-with-activation-offload": "uv run scripts/plan_offload.py ... shows weights + grads + optimizer "
                                           "against activations: activation offload only reduces the latter",
    "runtime/oom-with-fetch-ahead": "the run's header line 'fetch-ahead: on (MBRIDGE_OFFLOAD_STREAM_FETCH_AHEAD)' "
                                    "and rank 0's 'stream fetch-ahead: N chunks (X GiB)' lines; a run that got past "
                                    "step 3 records peak_reserved_gib in metrics.rank0.jsonl: compare it with the "
                                    "same run with fetch-ahead off",
    "runtime/oom-outside-pytorch": "nvidia-smi for other processes on the GPU; rerun with NCCL_DEBUG=INFO: NCCL's "
                                   "WARN lines name the allocation that failed. A run that got past step 1 records "
                                   "device_outside_pytorch_gib and peak_reserved_gib - peak_allocated_gib (the "
                                   "allocator's reserve) in metrics.rank0.jsonl; plan_offload.py's 'GPU: whole "
                                   "device' line counts both against the GPU",
    "runtime/host-memory-killed": "dmesg | grep -i -E 'killed process|oom' on the node, or Slurm's 'oom-kill event'; "
                                  "summary.json/metrics: peak_node_host_used_gib near the node's memory",
    "runtime/host-allocation-failed": "free -g on the node and the job's memory limit (sacct -j JOBID -o MaxRSS,ReqMem; "
                                      "a container's --memory); summary.json/metrics: peak_node_host_used_gib",
    "runtime/nccl-error": "search every rank's output for the first error before this one; with none, rerun with "
                          "NCCL_DEBUG=INFO: its WARN lines name the connection that failed",
    "runtime/job-stopped": "sacct -j JOBID -o State,Elapsed,Timelimit (TIMEOUT, PREEMPTED, CANCELLED); the last "
                           "iteration line before the stop",
    "runtime/pinned-host-memory": "ulimit -l (memlock) and free -g on the node; the run's pinned_host_gib in "
                                  "metrics.rank*.jsonl",
    "runtime/nccl-timeout": "search every rank's output for the first error or 'Killed' before this timeout; "
                            "compare step times across ranks",
    "runtime/shared-memory": "df -h /dev/shm inside the container (64M is Docker's default)",
    "runtime/cuda-illegal-address": "the first rank that printed it (the others' NCCL errors and allocation failures "
                                    "follow it); CUDA_LAUNCH_BLOCKING=1 makes the traceback stop in the kernel that "
                                    "faulted, and the same run on other GPUs fails there too (a hardware fault would "
                                    "not follow the run)",
    "runtime/device-side-assert": "the 'Assertion ... failed' line above the traceback names the kernel and its "
                                  "check (srcIndex < srcSelectDimSize: an embedding index, a token id, out of range); "
                                  "CUDA_LAUNCH_BLOCKING=1 shows the operation",
    "runtime/rank-crashed": "the rank's own output just before it (Python's 'Fatal Python error' block, with "
                            "PYTHONFAULTHANDLER=1); dmesg on the node: 'segfault at ... in libNAME.so' names the "
                            "library",
    "runtime/rendezvous-timeout": "from every node: nc -zv MASTER_ADDR MASTER_PORT (and getent hosts MASTER_ADDR); "
                                  "'N/M clients joined' counts who came; each node's log shows whether it started "
                                  "and which address it used",
    "runtime/rank-aborted": "the 'what():' line under 'terminate called after throwing an instance of' (the exception and "
                            "its message); the rank's output just before it; dmesg on the node for a core dump",
    "runtime/path-not-writable": "ls -ld <the path in the message> and its parents, and id on the node (the user the job "
                                 "runs as); mount | grep ' ro,' for a read-only file system",
    "runtime/checkpoint-unreadable": "ls -la <checkpoint.load>/iter_*: the last folder lacks metadata.json or .metadata, "
                                     "or a file is smaller than the same file of the folder before",
    "runtime/checkpoint-not-found": "ls <checkpoint.load> and ls <checkpoint.load>/iter_* on the node that failed: the "
                                    "iteration the message names against those saved",
    "runtime/checkpoint-model-mismatch": "the run_config.yaml saved beside the checkpoint against this run's config "
                                         "(model sizes, TP/PP, checkpoint.ckpt_format)",
    "runtime/cuda-driver-too-old": "nvidia-smi ('CUDA Version', the newest the driver runs) against python -c 'import torch; "
                                   "print(torch.version.cuda)'",
    "runtime/no-gpu-visible": "nvidia-smi -L and echo $CUDA_VISIBLE_DEVICES inside the job (the container, the Slurm step)",
    "runtime/gpu-arch-unsupported": "python -c 'import torch; print(torch.cuda.get_device_capability(), "
                                    "torch.cuda.get_arch_list())': the GPU's sm_XY is not in the list",
    "runtime/cuda-library-missing": "ldd on the .so that failed to import (or python -c 'import torch') shows 'not found' "
                                    "beside the library",
    "runtime/library-version-mismatch": "pip list | grep -i -E 'torch|transformer.engine|flash.attn|apex|megatron' (the "
                                         "versions side by side); the failing import alone (python -c 'import "
                                         "flash_attn' or 'import transformer_engine.pytorch') shows the same error",
    "runtime/nccl-network": "every rank's output for an error before it (a peer that died gives the same lines); "
                            "ibstat / ibv_devinfo on both nodes; nccl-tests all_reduce_perf across the same nodes",
    "runtime/python-exception": "the traceback's last frame, the file and line diagnose.py names; rerun the failing part "
                                "alone (the dataset's __getitem__, the callback) on the same input",
    "runtime/hydra-override": "the lines below the message: Hydra's own words (the key, or where the parse failed); "
                              "the config's keys: uv run scripts/run_recipe.py --recipe NAME --dry-run",
    "runtime/nan-loss-or-grad": "the iteration lines before it: lm loss and grad norm rising, or the first "
                                "'number of nan iterations' above 0; rerun from the checkpoint before it",
    "runtime/gpu-hardware-fault": "nvidia-smi -q -d ECC,ROW_REMAPPER on the node, and dmesg | grep -i xid (the Xid "
                                  "code names the fault); the same run on other GPUs passes the step that failed",
    "runtime/dataset-helper-makefile": "python -c 'from megatron.core.datasets import helpers_cpp' imports: the "
                                       "compiled helper is there and only the build step failed",
    "runtime/resume-offload-keyerror": "the traceback passes through hybrid_optimizer.py "
                                       "_update_fp32_params_by_new_state while loading checkpoint.load",
    "runtime/cpu-threads": "the run's header line 'CPU threads per rank: N'; summary.json offload_breakdown: "
                           "cpu_optimizer_s dominates the step",
    "runtime/full-offload-slowdown": "summary.json step_time_s of this run against the run without offload; "
                                     "offload_breakdown shows D2H, CPU Adam and H2D",
    "runtime/fine-grained-warmup": "step_times_s in summary.json: only the first step(s) are slow",
    "runtime/checkpoint-write-failed": "df -h and quota -s (lfs quota -h -u $USER <dir> on Lustre) for the checkpoint "
                                       "folder's disk",
    "runtime/stop-killed-data-loader-workers": "the log shows the stop signal's arrival ('Received signal 15') "
                                               "or the job's preemption just before; no iter_* folder was written",
    "runtime/hf-hub-unreachable": "env | grep HF_; curl -sI https://huggingface.co from the node",
    "engine/cpu-step-failed": "the worker's own error and its traceback are printed just above this one (\"The above "
                              f"exception was the direct cause\"); rerun with {LIBRARY_FIX}: the library's synchronous "
                              "step raises it where it happens",
    "engine/worker-stopped": "the first error above this one in the output, on any rank (a traceback, a kill, a stop "
                             "signal)",
    "engine/delayed-fp32-weights": "uv run scripts/run_recipe.py --recipe NAME --dry-run <the run's overrides> reports "
                                   "[offload-engine/delayed-low-precision-weights] when the model is neither bf16 "
                                   "nor fp16",
    "engine/stream-outside-distributed-optimizer": "the run's config (its run_config.yaml or the log's command): "
                                                   "ddp.use_distributed_optimizer and "
                                                   "optimizer.use_distributed_optimizer",
    "engine/stream-not-fp32": "the run's config: optimizer.use_precision_aware_optimizer (and its main_params_dtype)",
    "engine/stream-pin-failed": "ulimit -l (memlock; a container needs --ulimit memlock=-1) and free -g on the node",
    "engine/stream-fused-adam-import": "python -c 'from transformer_engine.pytorch.optimizers import FusedAdam' on the "
                                       "node shows why (the import error is also printed above this one)",
    "engine/stream-not-main-weights": "the engine the run used: its header names it, or env | grep "
                                      f"MBRIDGE_OFFLOAD_ENGINE and the config's {ENGINE_KEY}; the same run with the "
                                      "library engine offloads them",
    "engine/stream-step-counts": "the checkpoint folder's iter_* folders: load an earlier one that a run saved whole",
    "engine/stream-pinned-cache-kept": "python -c 'import torch; print(torch.__version__, hasattr(torch._C, "
                                       "\"_host_emptyCache\"))'",
}

# Log lines of configuration rules that upstream's validate() does not raise (upstream.py maps those):
# an import a setting needs, failing inside the run.
CONFIG_RULE_LOG_SIGNATURES: tuple[tuple[str, str], ...] = (
    (r"gradient_accumulation_fusion set to True but the custom CUDA extension fused_weight_gradient_mlp_cuda|"
     r"(ModuleNotFoundError|ImportError): No module named '(apex|fused_weight_gradient_mlp_cuda)[.']",
     "env/apex-gradient-accumulation-fusion"),
    (r"(ModuleNotFoundError|ImportError): No module named 'nvidia_resiliency_ext'", "env/nvidia-resiliency-ext"),
    (r"(ModuleNotFoundError|ImportError): No module named 'fast_hadamard_transform'", "env/fast-hadamard-transform"),
    # Transformer Engine absent, its compiled part absent, or built against another torch (an undefined symbol)
    (r"(ModuleNotFoundError|ImportError): No module named 'transformer_engine(_torch)?[.']|"
     r"ImportError: .*transformer_engine\S*: (undefined symbol|cannot open shared object)", "env/transformer-engine"),
    # the offload engine's messages that state a rule of the validator's table (an unknown engine name, the stream
    # engine with another optimizer than Adam)
    (ENGINE_MESSAGES["offload-engine/known"].signature, "offload-engine/known"),
    (ENGINE_MESSAGES["offload-engine/stream-adam"].signature, "offload-engine/stream-adam"),
    (ENGINE_MESSAGES["offload-engine/stream-moments-known"].signature, "offload-engine/stream-moments-known"),
)
