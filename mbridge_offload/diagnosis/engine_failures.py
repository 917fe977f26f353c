"""The plugin's own offload engine's failures, read from a run's log: every message that the streaming engine
(mbridge_offload/runtime/streaming_engine.py) and its stream mode (streamed_states.py) raise or print at run time,
what it means and the fix.

One source of truth: the engine formats each message from a template of facts/engine_messages.py, and the
signature here is built from that same template (its words escaped, each field a pattern), so the two cannot drift
apart; where the message names its fix (``... Fix: <fix>``) that is the fix given. A message that states a
configuration rule of the validator's table (an unknown engine name, the stream engine with another optimizer than
Adam) maps to that rule instead, as other configuration errors in a log do. Imports only facts and the validator's
names: no torch, no runtime module.

The message of a failed CPU optimizer step carries the worker thread's own error (``carries``): diagnose.py
reports that error's own finding where it has one (a host allocation that failed, the resume KeyError) as the
failure to fix, and the engine's as the wrapper around it.
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass, field

from mbridge_offload.facts import engine_messages as messages
from mbridge_offload.facts.offload_engine import ENGINE_KEY

LIBRARY_FIX = f"++{ENGINE_KEY}=library"
_FIX = ". Fix: "


@dataclass(frozen=True)
class EngineFailure:
    id: str
    message: str  # the engine's template (facts/engine_messages.py)
    key: str
    text: str  # what happened, in words
    confirm: str
    fix: str = ""  # "": the message's own fix (the words after "Fix: ")
    severity: str = "error"
    raised_as: str | None = "EngineError"  # the exception class that carries the message; None: a printed line
    fields: dict[str, str] = field(default_factory=dict)  # a field's pattern (default: any text)
    measured: str = ""  # what the log's line says, from the fields' values (str.format)
    carries: str = ""  # the field that holds another error's text ("kind: text")
    rule_id: str = ""  # a rule of the validator's table this message states: reported as that rule

    @property
    def pattern(self) -> re.Pattern:
        """The message as a regular expression: its words literally, each field a named group."""
        parts = [r"\b" + re.escape(self.raised_as) + ": " if self.raised_as else ""]
        for literal, name, _spec, _conversion in string.Formatter().parse(self.message):
            parts.append(re.escape(literal))
            if name is not None:
                parts.append(f"(?P<{name}>{self.fields.get(name, '.+?')})")
        return re.compile("".join(parts))

    @property
    def own_fix(self) -> str:
        return self.fix or self.message.split(_FIX, 1)[1]

    @property
    def reported_id(self) -> str:
        return self.rule_id or self.id


_CHECK_ENGINE = ("the engine the run used: its header names it, or env | grep MBRIDGE_OFFLOAD_ENGINE and the config's "
                 f"{ENGINE_KEY}")

FAILURES: tuple[EngineFailure, ...] = (
    EngineFailure(
        "engine/cpu-step-failed", messages.CPU_STEP_FAILED, ENGINE_KEY,
        "the offload engine's worker thread failed in the CPU optimizer step (the host's Adam on the offloaded share, "
        "which the exact and delayed engines run beside the next step's forward); the training thread raised the "
        "worker's error at the next point that waited for it",
        "the worker's own error and its traceback are printed just above this one (\"The above exception was the "
        f"direct cause\"); rerun with {LIBRARY_FIX}: the library's synchronous step raises it where it happens",
        fix=f"{LIBRARY_FIX}  (the library's own CPU step instead of the engine's worker thread)",
        fields={"kind": r"[\w.]+", "error": r".*"}, measured="the worker's error: {kind}: {error}", carries="error"),
    EngineFailure(
        "engine/worker-stopped", messages.WORKER_STOPPED, ENGINE_KEY,
        "the offload engine's worker thread, which runs the offloaded optimizer step, had stopped while the training "
        "thread waited for it: the engine hands its own errors to the training thread, so something else ended the "
        "thread or the process around it, and that is the failure to fix",
        "the first error above this one in the output, on any rank (a traceback, a kill, a stop signal)",
        fix=f"fix the first error above this one in the output (every rank's); with none there: {LIBRARY_FIX}",
        fields={"what": r".+"}, measured="waiting for {what}"),
    EngineFailure(
        "engine/delayed-fp32-weights", messages.DELAYED_FP32_WEIGHTS, ENGINE_KEY,
        "the delayed offload engine refused to start: offloaded parameters are fp32 in the model itself, so their fp32 "
        "copy is the live weight, and the update it delays by one step would overwrite it in the middle of the next "
        "step",
        "uv run scripts/run_recipe.py --recipe NAME --dry-run <the run's overrides> reports "
        "[offload-engine/delayed-low-precision-weights] when the model is neither bf16 nor fp16",
        fields={"count": r"\d+"}, measured="{count} offloaded parameter(s) in fp32"),
    EngineFailure(
        "engine/stream-outside-distributed-optimizer", messages.STREAM_OUTSIDE_DISTRIBUTED_OPTIMIZER,
        "optimizer.use_distributed_optimizer",
        "the stream offload engine met an offloaded optimizer step outside Megatron's distributed optimizer: it runs "
        "only inside one (it streams the moments of the distributed optimizer's fp32 shards)",
        "the run's config (its run_config.yaml or the log's command): ddp.use_distributed_optimizer and "
        "optimizer.use_distributed_optimizer"),
    EngineFailure(
        "engine/unknown-engine", messages.UNKNOWN_ENGINE, ENGINE_KEY, "", "", raised_as="ValueError",
        fields={"mode": r"'[^']*'|\"[^\"]*\"", "modes": r"[\w, ]+"}, measured="MBRIDGE_OFFLOAD_ENGINE={mode}",
        rule_id="offload-engine/known"),
    EngineFailure(
        "engine/stream-not-fp32", messages.STREAM_NOT_FP32, "optimizer.use_precision_aware_optimizer",
        "the stream offload engine refused the optimizer: it keeps fp32 main weights on the host, and this optimizer "
        "steps lower-precision ones (what Megatron's precision-aware optimizer keeps)",
        "the run's config: optimizer.use_precision_aware_optimizer (and its main_params_dtype)",
        fields={"dtypes": r"[\w., ]+"}, measured="the optimizer's weights: {dtypes}"),
    EngineFailure(
        "engine/stream-pin-failed", messages.STREAM_PIN_FAILED, ENGINE_KEY,
        "the stream offload engine could not pin (page-lock) its host buffers, Adam's moments and the fp32 weights of "
        "the offloaded share: the locked-memory limit (ulimit -l) or the node's free memory is too small",
        "ulimit -l (memlock; a container needs --ulimit memlock=-1) and free -g on the node",
        fields={"gib": r"[\d.]+", "status": r"[^)]*"}, measured="{gib} GiB, cudaHostRegister returned {status}"),
    EngineFailure(
        "engine/stream-fused-adam-import", messages.STREAM_FUSED_ADAM_IMPORT, ENGINE_KEY,
        "the stream offload engine updates with Transformer Engine's FusedAdam (the GPU optimizer without offload), "
        "and Transformer Engine does not import in this environment",
        "python -c 'from transformer_engine.pytorch.optimizers import FusedAdam' on the node shows why (the import "
        "error is also printed above this one)"),
    EngineFailure(
        "engine/stream-not-fused-adam", messages.STREAM_NOT_FUSED_ADAM, "optimizer.optimizer", "", "",
        fields={"optimizer": r"\S+"}, measured="this run's GPU optimizer: {optimizer}",
        rule_id="offload-engine/stream-adam"),
    EngineFailure(
        "engine/stream-not-main-weights", messages.STREAM_NOT_MAIN_WEIGHTS, ENGINE_KEY,
        "the stream offload engine found offloaded tensors that are not fp32 main weights of Megatron's distributed "
        "optimizer, which it cannot lay out in its host buffers",
        _CHECK_ENGINE + "; the same run with the library engine offloads them",
        fields={"count": r"\d+"}, measured="{count} offloaded tensor(s)"),
    EngineFailure(
        "engine/stream-step-counts", messages.STREAM_STEP_COUNTS, "checkpoint.load",
        "resuming with the stream offload engine: the checkpoint's offloaded optimizer states hold different step "
        "counts, so they were not all saved at the same step (the checkpoint is inconsistent)",
        "the checkpoint folder's iter_* folders: load an earlier one that a run saved whole",
        fix="checkpoint.load=<dir> checkpoint.ckpt_step=<an earlier saved iteration>  (or start without "
            "checkpoint.load)",
        fields={"steps": r"\[[^\]]*\]"}, measured="step counts {steps}"),
    EngineFailure(
        "engine/stream-pinned-cache-kept", messages.STREAM_NO_HOST_EMPTY_CACHE, ENGINE_KEY,
        "this torch cannot hand cached pinned memory back to the system (no torch._C._host_emptyCache): the library's "
        "pinned host copies of the weights, which the stream engine replaced with its own buffers, stay held, so the "
        "node uses more host memory than the plan counts",
        "python -c 'import torch; print(torch.__version__, hasattr(torch._C, \"_host_emptyCache\"))'",
        fix="a torch whose torch._C has _host_emptyCache, or more host headroom: plan_offload.py --host-margin-gib "
            f"<GiB>; or {LIBRARY_FIX}",
        severity="warning", raised_as=None),
)
FAILURES_BY_ID = {failure.id: failure for failure in FAILURES}
# the ids diagnose reports them under: their own, or the validator rule's a message states
REPORTED = {failure.reported_id: failure for failure in FAILURES}
_PATTERNS = [(failure, failure.pattern) for failure in FAILURES]


@dataclass(frozen=True)
class EngineMatch:
    failure: EngineFailure
    values: dict[str, str]

    @property
    def measured(self) -> str:
        return self.failure.measured.format(**self.values) if self.failure.measured else ""

    @property
    def carried(self) -> str:
        """The other error the message carries ("" if none): its text, as its own traceback's last line ends."""
        return self.values.get(self.failure.carries, "").strip() if self.failure.carries else ""


def engine_matches(text: str) -> list[EngineMatch]:
    """The engine's messages on one line of a log."""
    found = []
    for failure, pattern in _PATTERNS:
        if match := pattern.search(text):
            found.append(EngineMatch(failure, {k: v for k, v in match.groupdict().items() if v is not None}))
    return found
