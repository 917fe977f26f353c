"""From a run's output to what went wrong: each failure the rule table knows, the lines that show it, how
to confirm it and the fix. Only what the output shows is reported: a rule needs its log signature (and,
where the signature alone is not enough, the run facts that tell it apart); nothing is guessed.

The words and fixes come from the validator's rule table: runtime failures are its diagnose-only rules
(validation/runtime_failures.py); configuration errors in a log map to the rule that states them
(upstream.py's table of upstream messages, the validator's own report lines, the imports a setting needs). The
plugin's offload engine's own errors are diagnose-only rules too, their signatures built from the engine's message
templates (runtime_failures.ENGINE_MESSAGES), which also say what a message measures and which error it carries.
Where the run's config is found, the planner computes the fix (fixes.py).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from mbridge_offload.diagnosis.config_source import NoRunConfig, RunConfig, run_config
from mbridge_offload.diagnosis.line_search import LineSearch
from mbridge_offload.diagnosis.log_text import LogError
from mbridge_offload.diagnosis.logs import Line, read_lines, run_folder, stated_ranks
from mbridge_offload.diagnosis.run_facts import OutOfMemory, RunFacts, read_summary, run_facts, run_segments
from mbridge_offload.facts.offload_engine import (BF16_MOMENTS, BF16_MOMENTS_FIX, ENGINE_ENV, FP32_MOMENTS,
                                                  FP32_MOMENTS_FIX, MOMENT_BYTES, STREAM, STREAM_MOMENTS_ENV,
                                                  STREAM_MOMENTS_KEY, engine_mode, fetch_ahead_on, stream_moments)
from mbridge_offload.validation.offload_engine import BF16_MOMENTS_HOST_WORDS, FP32_MOMENTS_SUSPECT_WORDS
from mbridge_offload.validation.registry import RULES, RULES_BY_ID
from mbridge_offload.validation.runtime_failures import (ABORT_EXCEPTION, ABORT_WHAT, BISECT_WORDS,
                                                         CONFIG_RULE_LOG_SIGNATURES, CONFIRM, ENGINE_MESSAGES,
                                                         JOB_STOPPED, OFFLOAD_BISECT, OOM_FIX_AT_FULL_OFFLOAD,
                                                         OOM_KILLER, RANK_FAILED,
                                                         RESUME_OFFLOAD, RESUME_SAVE_FIRST, RESUME_SIGNAL_AHEAD,
                                                         RESUME_TIME_LIMIT, RESUME_WORDS, SIGNAL_NAMES,
                                                         STOP_KINDS, STOP_SIGNAL_EXITS, PINNED_ALLOCATION_NEAR,
                                                         SHARED_MEMORY_NEAR, SIGBUS, is_this_cause, near)
from mbridge_offload.validation.upstream import _UPSTREAM_KEYS, _UPSTREAM_TO_RULE

SLOWDOWN_LIMIT = 4.0  # the seed's ">4x at full optimizer offload"
WARMUP_LIMIT = 3.0  # a first step this many times the steady step is the warm-up the rule describes
MAX_EVIDENCE = 3
# torch's own out-of-memory message: one signature, the variant told by the run's offload settings
_FETCH_AHEAD_OOM_ID = "runtime/oom-with-fetch-ahead"
_PLANNED_OOM_IDS = ("runtime/cuda-oom", "runtime/oom-partial-offload", "runtime/oom-with-activation-offload")
_TORCH_OOM_IDS = (*_PLANNED_OOM_IDS, _FETCH_AHEAD_OOM_ID)
# the rules whose fix is the planner's OOM fix: torch's, and a device allocation outside PyTorch that failed (not
# fetch-ahead's: its buffers are outside the plan, so the fix is to turn it off)
_OOM_FIX_IDS = (*_PLANNED_OOM_IDS, "runtime/oom-outside-pytorch")
# the rules whose fix is the planner's host fix: the node's memory ran out, by a kill or a failed allocation
_HOST_FIX_IDS = ("runtime/host-memory-killed", "runtime/host-allocation-failed")
# the host's memory ran out (a kill, a failed allocation, a failed pin): with the stream engine's fp32 moments, bf16
# ones hold less of it
_HOST_OOM_IDS = (*_HOST_FIX_IDS, "runtime/pinned-host-memory", "engine/stream-pin-failed")
# the loss or the gradients went NaN or Inf: with the stream engine's bf16 moments, those are a suspect
_NAN_ID = "runtime/nan-loss-or-grad"
# the crashes inside the run whose fix bisects the offload settings the run had on
_BISECT_FIX_IDS = ("runtime/cuda-illegal-address", "runtime/rank-crashed", "runtime/rank-aborted")
# What other failures bring about: a collective that waited on, or lost, a rank that had failed, and the launcher
# stopping after it. After an earlier error these are its consequences, and the report says so.
# The offload engine's worker thread found stopped is likewise what an earlier failure left.
_STOP_ID = "runtime/job-stopped"
_WORKERS_KILLED_ID = "runtime/stop-killed-data-loader-workers"  # a stop that failed a rank: its own finding says so
# A rank that could not reach the store or a peer's NCCL id at the start, after another rank failed, waited on that rank.
# A rank's abort is how its process ended after an exception C++ did not catch: where that exception (its what() line,
# just below) or an earlier line is a failure of the table, that one is the cause. A network error between the nodes
# is also what a rank sees of a peer that died.
_ABORT_ID = "runtime/rank-aborted"
_NETWORK_ID = "runtime/nccl-network"
_CONSEQUENCE_IDS = ("runtime/nccl-timeout", "runtime/nccl-error", "runtime/job-stopped", "engine/worker-stopped",
                    "runtime/rendezvous-timeout", _ABORT_ID, _NETWORK_ID)
# what follows from a failed network link when nothing failed before it: NCCL's error, the watchdog, the abort
_AFTER_NETWORK = ("runtime/nccl-error", "runtime/nccl-timeout", _ABORT_ID)
# A rank's NCCL error that it lost a peer (the peer's process exited, its socket closed) is printed the moment the peer
# is gone, while the peer's own end is printed later by someone else: torchrun's failure block, srun, Slurm's oom-kill
# line, the kernel's log pasted below. So these follow a failure later in the log too, where that failure is another
# rank's or one that ends a process which never prints it itself. (Not the watchdog's timeout: a rank still stuck after
# it is killed by the launcher's stop, and that kill follows the timeout.)
_PEER_LOST = ("runtime/nccl-error", _NETWORK_ID)
_ENDS_UNSAID = ("runtime/host-memory-killed", "runtime/rank-crashed", "runtime/gpu-hardware-fault")
# A collective's timeout waits on a rank that had failed, whose error the output may hold below the timeout: ranks
# print out of order (the watchdog's line is flushed at once, a rank's traceback when its process ends) and a log put
# together from per-rank files holds each rank's lines in turn. So a timeout follows a failure printed after it too:
# one the failed rank prints itself, unless it is only the timed-out ranks' own; a kill or crash only where it names
# other ranks (one naming no rank, or the timed-out ones, is the launcher's stop of a rank still stuck after it).
_TIMEOUT_ID = "runtime/nccl-timeout"
ABORT_WHAT_LINES = 3  # how far below 'terminate called after throwing' its what() line stands
# A Python traceback no rule names: reported only where no other error is, with its last frame
_EXCEPTION_ID = "runtime/python-exception"
_FRAME = re.compile(r'^\s+File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<function>\S+)')
_TRACEBACK_LINES = 400  # the longest traceback read
_TRACEBACK = RULES_BY_ID[_EXCEPTION_ID].log_signatures[0]
_NOT_AN_ERROR = re.compile(r"(SystemExit|KeyboardInterrupt|GeneratorExit)\b")  # an exit, a Ctrl-C: no failure of code
CARRIED_WITHIN_LINES = 400  # how far above a message that carries another error its own traceback may end
OVERRIDE_MECHANISM = "run_recipe.py override"
# run_recipe.py's report of overrides it could not apply (overrides/errors.py): the head, then per override its text
# (indent 2), "key: what is wrong" (indent 6) and an optional "fix: ..." (indent 6)
_OVERRIDES_HEAD = re.compile(r"^Invalid overrides? \((\d+)\):\s*$")
_OVERRIDE_TEXT = re.compile(r"^  (\S.*)$")
_OVERRIDE_MESSAGE = re.compile(r"^      (?!fix: )(\S[^:]*): (.+)$")
_OVERRIDE_FIX = re.compile(r"^      fix: (.+)$")
_VALIDATOR_LINE = re.compile(r"^\s*(ERROR)\s+\[([\w./-]+)\]")  # a refusal of the validator (its warnings ran)
_EXCEPTION_LINE = re.compile(r"^\s*(AssertionError|ValueError)\b:?\s*(.*)")
_RAISED = re.compile(r"\b\w*(Error|Exception)\b|upstream|\bassert\b")
RUN_FOLDER_HINT = ("for a computed fix, pass the run folder (DIR with run_config.yaml, or a checkpoint's iter_* "
                   "folder beside the log)")
PRECISE_HINT = f"{RUN_FOLDER_HINT} or a log that starts with the run_recipe.py command"


@dataclass
class Finding:
    rule_id: str
    mechanism: str
    severity: str
    key: str
    what: str
    evidence: list[Line] = field(default_factory=list)
    ranks: set[int] = field(default_factory=set)
    first_index: int = 0  # where in the log's lines its first evidence stands (the order the failures came in)
    measured: str = ""
    confirm: str = ""
    fix: str = ""
    fix_basis: str = ""  # how the fix was computed, or why it is the generic one
    consequence_of: str = ""  # the earlier failure this one most likely follows from, in words
    carries: str = ""  # the error this one only carries (the engine's CPU step: the worker's), in words

    @property
    def label(self) -> str:
        """The rule's id, or what said it where no rule of the table does (upstream's validate(), an override)."""
        return self.rule_id or ("override" if self.mechanism == OVERRIDE_MECHANISM else "upstream")

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        del data["first_index"]
        data["evidence"] = [{"file": str(l.path), "line": l.number, "rank": l.rank, "text": l.text}
                            for l in self.evidence]
        data["ranks"] = sorted(self.ranks)
        return data


@dataclass
class Diagnosis:
    log: Path
    lines: int
    findings: list[Finding]
    config_source: str = ""
    part: tuple[int, int] | None = None  # (this run, the runs in the log) where the log holds several
    first_line: int | None = None  # where this run's lines begin, where the log holds several
    notes: list[str] = field(default_factory=list)  # what reading the LOG had to tell (a .gz cut short), one line each

    @property
    def where(self) -> str:
        """The log, and which of its runs where it holds several."""
        if self.part is None:
            return f"{self.log} ({self.lines} line{'s' if self.lines != 1 else ''})"
        return f"{self.log} (run {self.part[0]} of {self.part[1]} in it: lines {self.first_line}-{self.lines})"

    @property
    def first_failure(self) -> Finding | None:
        """The error that came first in the output: the one to fix, where the others follow from it."""
        errors = [f for f in self.findings if f.severity == "error" and f.evidence]
        errors = [f for f in errors if not f.carries] or errors  # an error a finding carries is the one to fix
        causes = [f for f in errors if not f.consequence_of]
        if errors and not causes:  # every error followed the scheduler's stop: the stop is what happened first
            causes = [f for f in self.findings if f.rule_id == _STOP_ID and f.evidence] or errors
        return min(causes, key=lambda f: f.first_index) if causes else None

    def to_json(self) -> dict[str, Any]:
        first = self.first_failure
        return {"log": str(self.log), "lines": self.lines, "config": self.config_source or None,
                "run_in_log": None if self.part is None else {"run": self.part[0], "of": self.part[1],
                                                               "first_line": self.first_line},
                "recognised": bool(self.findings), "first_failure": first.rule_id or first.key if first else None,
                "findings": [f.to_json() for f in self.findings], "notes": list(self.notes), "unreadable": None}


@dataclass(frozen=True)
class UnreadableLog:
    """A LOG argument that could not be read, and why (LogError's words: the file, what is wrong, what to give)."""

    log: Path
    reason: str

    def to_json(self) -> dict[str, Any]:
        """A report with the keys a Diagnosis has, no findings, and the reason it has none."""
        return {"log": str(self.log), "lines": 0, "config": None, "run_in_log": None, "recognised": False,
                "first_failure": None, "findings": [], "notes": [], "unreadable": self.reason}


def _raised(lines: list[Line], index: int) -> bool:
    """An error is raised (or the validator reports one) at this line or the three before it."""
    return any(_RAISED.search(line.text) for line in lines[max(0, index - 3): index + 1])


class _Run:
    """One run of a LOG argument (a log that holds several runs, one after another, gives one each): its lines,
    facts, and its config once a finding asks for it. ``part`` is (this run, the runs in the log) where there are
    several; only the last has the run folder (its summary, step records and saved config are the last run's)."""

    def __init__(self, path: Path, build_config: bool, lines: list[Line], run_dir: Path | None,
                 part: tuple[int, int] | None = None, notes: list[str] | None = None):
        self.path = path
        self.part = part
        self.notes = list(notes or ())
        self.lines = lines
        self.texts = [line.text for line in self.lines]
        self.facts: RunFacts = run_facts(self.lines, run_dir)
        self.search = LineSearch(self.texts, _SEARCHED)
        self._near: dict[str, dict[int, bool]] = {}  # a pattern: whether each line read so far matches it
        self._agent_stops: list[tuple[int, str]] | None = None
        self._rendezvous: set[int] | None = None
        self._ranks_failed: list[int] | None = None
        # the first line that shows the job stopped from outside: a scheduler's or a person's stop, or a rank that
        # ended on a stop signal before anything else had ended one
        self.first_stop: int | None = min(
            [i for p in JOB_STOPPED for i in self.search.matching(p)[:1]]
            + [i for p, _ in STOP_SIGNAL_EXITS for i in self.search.matching(p)[:1] if _signal_from_outside(self, i)],
            default=None)
        self._build = build_config
        self._config: RunConfig | None | str = "unread"
        self.no_config = NoRunConfig()  # why the run has no config, once read and there is none

    def near(self, index: int, pattern: str) -> bool:
        """runtime_failures.near on this log, each line searched once per pattern however many signatures ask
        about the lines around them."""
        return near(self.texts, index, pattern, self._near.setdefault(pattern, {}))

    def is_this_cause(self, rule_id: str, index: int) -> bool:
        """runtime_failures.is_this_cause on this log: no line near ``index`` names another cause."""
        return is_this_cause(RULES_BY_ID[rule_id], self.texts, index, self._near)

    def ranks_failed(self) -> list[int]:
        """The lines where srun or torchrun report a rank that exited with an error code of its own."""
        if self._ranks_failed is None:
            self._ranks_failed = self.search.matching(RANK_FAILED)
        return self._ranks_failed

    def rendezvous_lines(self) -> set[int]:
        """The lines a signature of the start-up's store (runtime/rendezvous-timeout) matches."""
        if self._rendezvous is None:
            self._rendezvous = {i for p in RULES_BY_ID["runtime/rendezvous-timeout"].log_signatures
                                for i in self.search.matching(p)}
        return self._rendezvous

    def agent_stops(self) -> list[tuple[int, str]]:
        """(line index, pid) of each stop torchrun's agent sent to a rank."""
        if self._agent_stops is None:
            self._agent_stops = [(i, match.group(1)) for i, match in self.search.matches(_AGENT_STOP)]
        return self._agent_stops

    @property
    def config(self) -> RunConfig | None:
        if self._config == "unread":
            found = run_config(self.facts.run_dir, self.facts.command, build=self._build)
            if isinstance(found, NoRunConfig):
                self._config, self.no_config = None, found
            else:
                self._config = found
                self._fill_facts(found.cfg, found.source)
        return self._config  # type: ignore[return-value]

    def _fill_facts(self, cfg: Any, source: str) -> None:
        facts = self.facts
        if facts.optimizer_offload is None:
            facts.optimizer_offload = bool(cfg.optimizer.optimizer_cpu_offload)
            facts.fraction = float(cfg.optimizer.optimizer_offload_fraction or 0.0) if facts.optimizer_offload else 0.0
        if facts.activation_offload is None:
            facts.activation_offload = bool(cfg.model.cpu_offloading)
        if facts.fine_grained is None:
            facts.fine_grained = bool(getattr(cfg.model, "fine_grained_activation_offloading", False))
        if facts.fetch_ahead is None:  # the config's env_vars (the launch shell's, which win, are not known here)
            env_vars = getattr(cfg, "env_vars", None)
            facts.fetch_ahead = bool(facts.optimizer_offload and engine_mode(env_vars, {}) == STREAM
                                     and fetch_ahead_on(env_vars, {}))
        if facts.engine is None and facts.optimizer_offload:  # the config's env_vars too
            env_vars = getattr(cfg, "env_vars", None)
            facts.engine = engine_mode(env_vars, {})
            moments = stream_moments(env_vars, {})
            if facts.engine == STREAM and moments in MOMENT_BYTES:
                given = (env_vars or {}).get(STREAM_MOMENTS_ENV) is not None
                facts.stream_moments = moments
                setting = f"sets {STREAM_MOMENTS_KEY}={moments}" if given else f"leaves {STREAM_MOMENTS_KEY} unset"
                facts.stream_moments_from = (f"the run's config ({source}) names the stream engine and {setting}; a "
                                             "value in the launch shell, which wins, is not in the log")

    def knows(self, name: str) -> Any:
        """A fact from the output, else from the run's config (read on first need)."""
        value = getattr(self.facts, name)
        if value is None and self.config is not None:
            value = getattr(self.facts, name)
        return value

    @property
    def num_gpus(self) -> int:
        if self.facts.num_gpus:
            return self.facts.num_gpus
        ranks = {line.rank for line in self.lines if line.rank is not None}
        if ranks:
            return max(ranks) + 1
        m = self.config.cfg.model if self.config else None
        return (m.tensor_model_parallel_size * m.pipeline_model_parallel_size * m.context_parallel_size) if m else 1


def _oom_variant(run: _Run) -> str:
    # the one share of the device the plan does not count comes first; it runs inside the stream engine, which only
    # optimizer offload starts, so an output that says both (two runs' lines, an edited log) is not blamed on it
    if run.knows("fetch_ahead") and run.knows("optimizer_offload") is not False:
        return _FETCH_AHEAD_OOM_ID
    if run.knows("activation_offload"):
        return "runtime/oom-with-activation-offload"
    fraction = run.knows("fraction")
    if run.knows("optimizer_offload") and fraction is not None and 0.0 < fraction < 1.0:
        return "runtime/oom-partial-offload"
    return "runtime/cuda-oom"


# Signatures that alone do not tell the cause: what else the log (or the run) must show, besides what the rule's
# own log_not_near rules out
def _stopped_before(run: _Run, index: int) -> bool:
    """Whether the job was stopped from outside (time limit, preemption, scancel) before ``lines[index]``."""
    return run.first_stop is not None and run.first_stop < index


_AGENT_STOP = r"Sending process (\d+) closing signal SIG\w+"  # torchrun's agent stopping a rank
_KILLED_PID = re.compile(r"\(pid: (\d+)\)|received by PID (\d+)")  # the process its failure lines name


def _signal_from_outside(run: _Run, index: int) -> bool:
    """Whether a rank's end on a stop signal at ``lines[index]`` is the job's stop: neither torchrun's agent (which
    SIGTERMs the other ranks once one failed) nor a rank's own failure came before it."""
    agent, failed = run.agent_stops(), run.ranks_failed()  # both ascending
    return (not agent or index < agent[0][0]) and (not failed or index < failed[0])


def _agent_stopped_before(run: _Run, index: int) -> bool:
    """Whether torchrun's agent had sent its stop to the process ``lines[index]`` names, before that line."""
    pid = _KILLED_PID.search(run.texts[index])
    if pid is None:
        return False
    return (pid.group(1) or pid.group(2)) in {stopped for j, stopped in run.agent_stops() if j < index}


_CONDITIONS: dict[tuple[str, str], Callable[[_Run, int], bool]] = {
    # the CUDA runtime's out-of-memory is pinned host memory where a pinned allocation is near, else the device's
    **{("runtime/pinned-host-memory", pattern): lambda run, i: run.near(i, PINNED_ALLOCATION_NEAR)
       for pattern in (r"CUDA (error|Error|driver error): out of memory", r"cudaErrorMemoryAllocation")},
    # a full shared-memory folder (DataLoader workers' tensors) is not the checkpoint's disk
    ("runtime/checkpoint-write-failed", r"No space left on device"):
        lambda run, i: not re.search(r"</?torch_\d|/dev/shm|shared memory", run.texts[i]),
    # a SIGKILL is the host's out-of-memory killer unless the job had been stopped from outside before it (a
    # scheduler sends SIGKILL to what is left after its stop signal); the kernel's own words are the killer anyway
    # nor where torchrun's agent had sent that process its stop after another rank failed (it SIGKILLs a rank that
    # outlives the grace period)
    **{("runtime/host-memory-killed", pattern): lambda run, i: not _stopped_before(run, i)
       and not _agent_stopped_before(run, i)
       for pattern in RULES_BY_ID["runtime/host-memory-killed"].log_signatures if pattern not in OOM_KILLER},
    **{("runtime/resume-offload-keyerror", pattern):
       lambda run, i: run.near(i, r"_update_fp32_params_by_new_state|hybrid_optimizer")
       for pattern in RULES_BY_ID["runtime/resume-offload-keyerror"].log_signatures},
    # a SIGBUS is shared memory (/dev/shm) that ran out under a mapping where the lines near it name it; else a crash
    **{("runtime/shared-memory", pattern): lambda run, i: run.near(i, SHARED_MEMORY_NEAR) for pattern in SIGBUS},
    **{("runtime/rank-crashed", pattern): lambda run, i: not run.near(i, SHARED_MEMORY_NEAR) for pattern in SIGBUS},
    # the start-up's store timing out is the rendezvous, not a collective of training, even where NCCL's words are on
    # its line (a rank fetching NCCL's id from the store)
    **{("runtime/nccl-timeout", pattern): lambda run, i: i not in run.rendezvous_lines()
       for pattern in RULES_BY_ID["runtime/nccl-timeout"].log_signatures},
    **{("runtime/job-stopped", pattern): _signal_from_outside for pattern, _ in STOP_SIGNAL_EXITS},
    ("runtime/cpu-threads", r"CPU threads per rank: 1\b"): lambda run, i: bool(run.knows("optimizer_offload")),
    ("runtime/cpu-threads", r"Setting OMP_NUM_THREADS environment variable for each process to be 1"):
        lambda run, i: bool(run.knows("optimizer_offload")),
}
_NUMERIC = {"runtime/full-offload-slowdown", "runtime/fine-grained-warmup"}  # judged on step times, below
_SIGNATURES = [(rule.id, pattern, re.compile(pattern)) for rule in RULES if rule.id not in _NUMERIC
               for pattern in rule.log_signatures]


# every pattern searched on a log's lines: their lines are found together, in one pass (line_search.py)
_SEARCHED = (*(pattern for _, pattern, _ in _SIGNATURES), *JOB_STOPPED, _AGENT_STOP, RANK_FAILED,
             *(pattern for pattern, _ in CONFIG_RULE_LOG_SIGNATURES), *(pattern for pattern, _ in _UPSTREAM_TO_RULE),
             ABORT_EXCEPTION, _VALIDATOR_LINE.pattern, _EXCEPTION_LINE.pattern)

_Match = tuple[str, int, str, "re.Match[str] | None"]  # (rule id, line index, upstream's fix, the signature's match)


def _matches(run: _Run) -> list[_Match]:
    """(rule id, line index, upstream's fix, the signature's match where a rule's signature matched) for every line
    that shows a rule broken, in the order of the lines (and on one line, of the tables). Each pattern is searched
    only on the lines that may hold it (line_search.py)."""
    # (line index, the pattern's place in the tables, rule id, fix, match)
    found: list[tuple[int, int, str, str, re.Match[str] | None]] = []
    search = run.search
    for order, (rule_id, pattern, regex) in enumerate(_SIGNATURES):
        condition = _CONDITIONS.get((rule_id, pattern))
        for i, match in search.matches(pattern, regex):
            if (condition is None or condition(run, i)) and run.is_this_cause(rule_id, i):
                found.append((i, order, rule_id, "", match))
    order = len(_SIGNATURES)
    for i, validator in search.matches(_VALIDATOR_LINE.pattern, _VALIDATOR_LINE):
        if validator.group(2) in RULES_BY_ID:
            found.append((i, order, validator.group(2), "", None))
    for order, (pattern, rule_id) in enumerate(CONFIG_RULE_LOG_SIGNATURES, order + 1):
        found += [(i, order, rule_id, "", match) for i, match in search.matches(pattern)]
    for order, (pattern, rule_id) in enumerate(_UPSTREAM_TO_RULE, order + 1):
        # upstream's messages, where an error is raised or reported
        found += [(i, order, rule_id, "", None) for i in search.matching(pattern) if _raised(run.lines, i)]
    order += 1
    upstream = {i for pattern, _ in _UPSTREAM_TO_RULE for i in search.matching(pattern)}  # upstream's messages' lines
    for i, _ in search.matches(_EXCEPTION_LINE.pattern, _EXCEPTION_LINE):
        text = run.texts[i]
        if i not in upstream:
            for pattern, key, fix in _UPSTREAM_KEYS:
                if re.search(pattern, text):
                    found.append((i, order, f"upstream:{key}", fix, None))
                    break
    found.sort(key=lambda match: match[:2])
    return [(rule_id, i, fix, match) for i, _, rule_id, fix, match in found]


def _finding(rule_id: str) -> Finding:
    rule = RULES_BY_ID[rule_id]
    fix = rule.fix_text or rule.fix(None)  # type: ignore[arg-type]  # runtime and constant fixes ignore ctx
    confirm = CONFIRM.get(rule_id) or ("uv run scripts/run_recipe.py --recipe NAME --dry-run <the run's overrides> "
                                       f"reports [{rule_id}]")
    message = ENGINE_MESSAGES.get(rule_id)
    basis = ("the fix the engine's message names" if message is not None and fix == message.own_fix
             else "the rule table's fix")
    return Finding(rule_id=rule_id, mechanism=rule.mechanism, severity=rule.severity, key=rule.key, what=rule.text,
                   confirm=confirm, fix=fix, fix_basis=basis)


def _override_findings(run: _Run) -> list[Finding]:
    """One finding per override run_recipe.py refused, with the key, what was wrong and the fix it printed."""
    found: list[Finding] = []
    for i, line in enumerate(run.lines):
        head = _OVERRIDES_HEAD.match(line.text)
        if not head:
            continue
        override, j = None, i + 1
        while j < len(run.lines) and len(found) < 50:
            text = run.lines[j].text.rstrip()
            if message := _OVERRIDE_MESSAGE.match(text):
                found.append(Finding(
                    rule_id="", mechanism=OVERRIDE_MECHANISM, severity="error", key=message.group(1),
                    what=f"run_recipe.py refused the override {override or message.group(1)}: {message.group(2)}",
                    evidence=[run.lines[j]], ranks=set(stated_ranks(run.lines, j)), first_index=j,
                    confirm="uv run scripts/run_recipe.py --recipe NAME --dry-run <the corrected overrides> applies "
                            "them before any launch",
                    fix="correct or remove the override", fix_basis="run_recipe.py's report"))
            elif (fix := _OVERRIDE_FIX.match(text)) and found and found[-1].first_index > i:
                found[-1].fix = fix.group(1)
            elif override_text := _OVERRIDE_TEXT.match(text):
                override = override_text.group(1)
            else:
                break
            j += 1
    return found


def _step_findings(run: _Run, baseline_s: float | None) -> list[Finding]:
    facts, found = run.facts, []
    steady = _steady(facts)
    if not steady or len(facts.step_times_s) < 2:
        return found
    source = facts.step_times_from
    if baseline_s and run.knows("optimizer_offload") and run.knows("fraction") == 1.0 \
            and steady / baseline_s > SLOWDOWN_LIMIT:
        finding = _finding("runtime/full-offload-slowdown")
        finding.measured = (f"{steady:.3f} s per step at fraction 1 against {baseline_s:.3f} s without offload: "
                            f"{steady / baseline_s:.2f}x (step times from {source})")
        found.append(finding)
    first = facts.step_times_s[0]
    if run.knows("fine_grained") and first > WARMUP_LIMIT * steady:
        finding = _finding("runtime/fine-grained-warmup")
        finding.measured = (f"first step {first:.2f} s, then {steady:.2f} s per step ({first / steady:.1f}x; "
                            f"step times from {source})")
        found.append(finding)
    iteration_lines = [l for l in run.lines if "elapsed time per iteration (ms)" in l.text and l.rank in (None, 0)]
    for finding in found:
        finding.evidence = iteration_lines[:2]
        finding.first_index = run.lines.index(iteration_lines[0]) if iteration_lines else 0
    return found


def _compute_fix(run: _Run, finding: Finding, oom: OutOfMemory | None) -> None:
    from mbridge_offload.diagnosis import fixes  # the planner: only once a fix is computed

    if finding.rule_id in _BISECT_FIX_IDS:
        _bisect_fix(run, finding)
        return
    if finding.rule_id not in (*_OOM_FIX_IDS, *_HOST_FIX_IDS, "runtime/full-offload-slowdown"):
        return
    config = run.config
    if config is None:
        finding.fix_basis = f"generic: {_no_config_words(run)}"
        # torch's own OOM (a communicator's failed allocation says nothing of activations)
        if (finding.rule_id == "runtime/cuda-oom" and run.knows("optimizer_offload")
                and (run.knows("fraction") or 0.0) >= 1.0):
            finding.fix = OOM_FIX_AT_FULL_OFFLOAD
            finding.fix_basis = ("optimizer offload was at fraction 1 already (the log's header, else the run's "
                                 f"summary); {finding.fix_basis}")
        return
    cfg, gpus = _as_the_run_had(config.cfg, run), run.num_gpus
    # The allocator setting the run had, as its step records or its header say. A run with neither was not
    # launched by run_recipe.py, and there a recipe's env_vars reach the allocator too late
    # (docs/benchmarks/alloc-conf/): fixed segments, unless its shell set them, which the log does not say; their
    # larger reserve is the safe side.
    expandable = bool(run.facts.expandable_segments)
    allocator = (f"allocator: {'expandable' if expandable else 'fixed'} segments "
                 + (f"({run.facts.expandable_segments_from})" if run.facts.expandable_segments is not None else
                    "(assumed: neither the log nor a step record names the allocator setting)"))
    try:
        if finding.rule_id in _OOM_FIX_IDS:
            # torch's numbers (from any rank of this run) size the GPU and the shortfall for every OOM finding,
            # so that a torch OOM and an NCCL allocation failure of one run get one fix
            computed = fixes.oom_fix(cfg, gpus, oom, expandable, planned_gpu_gib=run.facts.gpu_memory_gib)
            channels = fixes.fewer_nccl_channels(cfg) if finding.rule_id == "runtime/oom-outside-pytorch" else None
            if channels is not None:
                computed = (f"{computed[0]}; or {channels[0]}", f"{computed[1]}; {channels[1]}")
        elif finding.rule_id in _HOST_FIX_IDS:
            if run.facts.host_memory_gib is None:
                finding.fix_basis = ("generic: the log does not say the node's memory (run_recipe.py prints it in "
                                     "its plan: 'host: per node ... of N GiB'); plan_offload.py --host-memory-gib N "
                                     "optimizer.optimizer_offload_fraction=auto computes it")
                return
            computed = fixes.host_fix(cfg, gpus, run.facts.host_memory_gib, run.facts.gpu_memory_gib, expandable)
        else:
            computed = fixes.slowdown_fix(cfg, gpus, run.facts.gpu_memory_gib, expandable)
    except (AttributeError, KeyError, TypeError, ValueError, ZeroDivisionError) as error:
        finding.fix_basis = f"generic: the planner could not read this config ({type(error).__name__}: {error})"
        return
    if computed is not None:
        finding.fix, finding.fix_basis = computed[0], f"{computed[1]}; {allocator}; config: {config.source}"


def _no_config_words(run: _Run) -> str:
    """Why the run has no config to plan with, and what would give one: a command that is there but could not be
    read or rebuilt is named as such (asking for a log that starts with the command would be wrong there)."""
    if run.no_config.why:
        return f"{run.no_config.why}; {RUN_FOLDER_HINT}"
    if run.facts.command_unread:
        return f"{run.facts.command_unread}; {RUN_FOLDER_HINT}"
    return f"no config of this run was found; {PRECISE_HINT}"


def _as_the_run_had(cfg: Any, run: "_Run") -> Any:
    """``cfg`` with the offload engine and the stream engine's moments the run had where its output says them (the
    header: a launch shell's value, which wins over the config's, shows there): the planner's host, ring and link
    figures follow them. The config's own where the output says nothing."""
    import copy

    had = {ENGINE_ENV: run.facts.engine, STREAM_MOMENTS_ENV: run.facts.stream_moments}
    env_vars = dict(getattr(cfg, "env_vars", None) or {})
    changed = {name: value for name, value in had.items() if value is not None and env_vars.get(name) != value}
    if not changed:
        return cfg
    cfg = copy.copy(cfg)
    cfg.env_vars = {**env_vars, **changed}
    return cfg


def _fetch_ahead_basis(facts: RunFacts, oom: OutOfMemory | None) -> str:
    """What fetch-ahead's buffers held against what the failed allocation lacked."""
    gib, unread = facts.fetch_ahead_gib, facts.fetch_ahead_unread
    garbled = f"rank 0's 'stream fetch-ahead' line gives its buffers' size as '{unread}', not a number (a garbled line)"
    if gib is None and unread:
        held = f"{garbled}, so how much they held is not known"
    elif gib is None:
        held = ("the log has no rank-0 'stream fetch-ahead: N chunks (X GiB)' line, so how much its buffers held is "
                "not known (the line comes once a step's window is complete: the run failed before)")
    else:
        held = (f"fetch-ahead's buffers held up to {gib:.2f} GiB in a step (rank 0's 'stream fetch-ahead' lines), "
                "reserved memory the plan does not count")
        if unread:  # the most the readable lines show is only a floor
            held = held.replace("held up to", "held at least") + f"; {garbled}"
    shortfall = oom.shortfall_gib if oom is not None else None
    if shortfall is None or gib is None:
        return held
    if shortfall <= gib:
        return f"{held}; the failed allocation lacked {shortfall:.2f} GiB, less than that"
    if unread:
        return f"{held}; the failed allocation lacked {shortfall:.2f} GiB, more than the lines it could read show"
    return (f"{held}; the failed allocation lacked {shortfall:.2f} GiB, more than that: with it off, plan the "
            "fraction too (plan_offload.py ... optimizer.optimizer_offload_fraction=auto)")


def _stream_moments(run: _Run) -> tuple[str, str] | None:
    """(the moments, what says so) of a run whose offloaded optimizer step the stream engine ran, as its header says,
    else its config; None where optimizer offload was off, the engine was another, or neither says."""
    if run.knows("optimizer_offload") is False or run.knows("engine") != STREAM:
        return None
    moments = run.knows("stream_moments")
    return (moments, run.facts.stream_moments_from) if moments in MOMENT_BYTES else None


def _moments_fix(run: _Run, finding: Finding) -> None:
    """The stream engine's moments in the fix: a NaN or Inf with bf16 ones names them as a suspect, fp32 first; a host
    out of memory with fp32 ones offers bf16 ones, which hold less of it."""
    read = _stream_moments(run) if finding.rule_id in (_NAN_ID, *_HOST_OOM_IDS) else None
    if read is None:
        return
    moments, said = read
    if finding.rule_id == _NAN_ID and moments == BF16_MOMENTS:
        finding.fix = f"{FP32_MOMENTS_FIX}  ({FP32_MOMENTS_SUSPECT_WORDS}; if it diverges again: {finding.fix})"
        finding.fix_basis = f"bf16 moments were on: {said}; then {finding.fix_basis}"
    elif finding.rule_id in _HOST_OOM_IDS and moments == FP32_MOMENTS:
        finding.fix = f"{finding.fix}; or {BF16_MOMENTS_FIX}  ({BF16_MOMENTS_HOST_WORDS})"
        finding.fix_basis = f"{finding.fix_basis}; the stream engine kept fp32 moments: {said}"


def _bisect_fix(run: _Run, finding: Finding) -> None:
    """A crash inside the run: the rule's fix, its bisection narrowed to the offload settings the run had on (from
    its header, else its config), where the run says which."""
    on = {OFFLOAD_BISECT[0]: run.knows("optimizer_offload"), OFFLOAD_BISECT[1]: run.knows("activation_offload"),
          OFFLOAD_BISECT[2]: run.knows("fine_grained")}
    if any(value is None for value in on.values()):
        finding.fix_basis = ("the rule table's fix: the log does not say which offload settings the run had (run_recipe.py's "
                             "header does), so it names each")
        return
    head = finding.fix.split(BISECT_WORDS, 1)[0]
    settings = [setting for setting, value in on.items() if value]
    if not settings:
        finding.fix = head + "; the run had no offload on, so offloading is not the cause"
    else:
        if on[OFFLOAD_BISECT[0]]:
            settings.append(OFFLOAD_BISECT[3])  # the offload engine runs only with optimizer offload
        finding.fix = head + BISECT_WORDS + ", ".join(settings)
    finding.fix_basis = "the offload settings the run had on, as its header (or config) says"


def _recipe(facts: RunFacts) -> str | None:
    return facts.command.recipe if facts.command else (facts.summary or {}).get("recipe")


def _steady(facts: RunFacts) -> float | None:
    return (facts.summary or {}).get("step_time_s") or facts.steady_step_s


def _baseline_step(runs: list[_Run]) -> list[float | None]:
    """Each run's step time without offload: a sibling baseline run folder (a sweep's fraction-0, a
    benchmark's baseline), else a run of the same recipe without offload given alongside it."""
    result = []
    for run in runs:
        baseline = None
        if run.facts.run_dir is not None:
            for name in ("baseline", "fraction-0"):
                summary = read_summary(run.facts.run_dir.parent / name)
                if summary and summary.get("step_time_s") and summary.get("recipe") in (None, _recipe(run.facts)):
                    baseline = float(summary["step_time_s"])
                    break
        if baseline is None:
            baseline = next((_steady(other.facts) for other in runs if other is not run
                             and other.facts.optimizer_offload is False and _steady(other.facts)
                             and _recipe(other.facts) is not None and _recipe(other.facts) == _recipe(run.facts)),
                            None)
        result.append(baseline)
    return result


def diagnose_run(run: _Run, baseline_s: float | None) -> Diagnosis:
    by_rule: dict[str, Finding] = {}
    at_line: dict[int, list[str]] = {}  # line index: the findings' rule ids matched there
    first_match: dict[str, re.Match[str]] = {}  # rule id: its signature's match on its first evidence line
    oom = None
    matches = _matches(run)
    named = {i for rule_id, i, _, _ in matches if rule_id != _ABORT_ID}
    for rule_id, i, upstream_fix, match in matches:
        if rule_id == _ABORT_ID and i in named:
            continue  # the exception std::terminate names on this line is that rule's failure (std::bad_alloc)
        line = run.lines[i]
        if rule_id in _TORCH_OOM_IDS:
            rule_id = _oom_variant(run)
            oom = oom or OutOfMemory.parse(line.text)
        at_line.setdefault(i, []).append(rule_id)
        if rule_id not in by_rule:
            if rule_id.startswith("upstream:"):
                key = rule_id.split(":", 1)[1]
                by_rule[rule_id] = Finding(rule_id="", mechanism="upstream ConfigContainer.validate()",
                                           severity="error", key=key, what=f"upstream: {line.text.strip()}",
                                           confirm="uv run scripts/run_recipe.py --recipe NAME --dry-run <the run's "
                                                   "overrides> reports it before any launch",
                                           fix=upstream_fix, fix_basis="upstream.py's table")
            else:
                by_rule[rule_id] = _finding(rule_id)
        finding = by_rule[rule_id]
        if not finding.evidence:
            finding.first_index = i
            if match is not None:
                first_match[rule_id] = match
        finding.ranks.update(stated_ranks(run.lines, i))
        if len(finding.evidence) < MAX_EVIDENCE and all(e.text != line.text for e in finding.evidence):
            finding.evidence.append(line)
    findings = list(by_rule.values()) + _override_findings(run) + _step_findings(run, baseline_s)
    if _EXCEPTION_ID in by_rule:
        # a traceback is a failure of its own only where nothing else is: not one that ends in a named failure's line,
        # nor one beside an error that is no consequence (that error is the one to fix)
        exception = by_rule[_EXCEPTION_ID]
        raised = _exception_details(run, exception)
        named = [r for r in at_line.get(exception.first_index, ()) if r != _EXCEPTION_ID]
        # nor one raised after the job was stopped from outside (a rank's exception in the middle of its shutdown)
        if not raised or named or _stopped_before(run, exception.first_index) or any(
                f.severity == "error" and f.rule_id not in (_EXCEPTION_ID, *_CONSEQUENCE_IDS) for f in findings):
            findings.remove(exception)
    if _ABORT_ID in by_rule:
        _abort_details(run, by_rule[_ABORT_ID])
    if _STOP_ID in by_rule and _WORKERS_KILLED_ID in by_rule:
        findings.remove(by_rule.pop(_STOP_ID))  # that rule is the stop's own failure: it states the stop
    if _STOP_ID in by_rule:
        _stop_details(run, by_rule[_STOP_ID])
    for finding in findings:
        if finding.rule_id in _TORCH_OOM_IDS and oom is not None:
            finding.measured = oom.words()
        if finding.rule_id == _FETCH_AHEAD_OOM_ID:
            finding.fix_basis = _fetch_ahead_basis(run.facts, oom)
        _compute_fix(run, finding, oom)
        _moments_fix(run, finding)
    _engine_details(run, by_rule, at_line, first_match)
    findings.sort(key=lambda f: (f.severity != "error", f.first_index))
    _mark_consequences(findings)
    config = run._config if isinstance(run._config, RunConfig) else None
    return Diagnosis(log=run.path, lines=max((line.number for line in run.lines), default=0), findings=findings,
                     config_source=config.source if config else "", part=run.part,
                     first_line=run.lines[0].number if run.part and run.lines else None, notes=run.notes)


def _engine_details(run: _Run, by_rule: dict[str, Finding], at_line: dict[int, list[str]],
                    first_match: dict[str, re.Match[str]]) -> None:
    """The offload engine's findings: what their first line says (measured, from the fields the message's signature
    matched there), and where the message carries the worker's own error (a failed CPU optimizer step), that error's
    own finding as the failure to fix: the one matched on the message's line or on the line its own traceback ended
    with, just above it. A finding whose first line is no match of the message (the validator's report of the rule)
    has no fields to read."""
    for rule_id, finding in by_rule.items():
        message = ENGINE_MESSAGES.get(rule_id)
        match = first_match.get(rule_id)
        if message is None or match is None or match.re.pattern != message.signature:
            continue
        i = finding.first_index
        values = message.values(match)
        measured = message.measured_from(values)
        finding.measured = measured[:240] + ("..." if len(measured) > 240 else "")
        carried = message.carried_from(values)[:160]
        if not carried:
            continue
        rank = run.lines[i].rank
        for j in (*range(i - 1, max(-1, i - CARRIED_WITHIN_LINES), -1), i):  # its own traceback's line first
            same_rank = rank is None or run.lines[j].rank in (None, rank)
            if j != i and not (same_rank and carried in run.texts[j]):
                continue
            inner = [by_rule[r] for r in at_line.get(j, ()) if r in by_rule and r not in ENGINE_MESSAGES
                     and r not in _CONSEQUENCE_IDS and by_rule[r].severity == "error"]
            if inner:
                cause, line = inner[0], run.lines[j]
                where = _rank_words({line.rank} if line.rank is not None else set())
                finding.carries = (f"the worker's own error, [{cause.label}]" + (f" on {where}" if where else "")
                                   + f" ({line.path.name}:{line.number}): fix that one")
                finding.fix, finding.fix_basis = cause.fix, f"the fix of [{cause.label}], the error it carries"
                break


def _abort_details(run: _Run, finding: Finding) -> None:
    """What a rank's abort reports as its reason: the C++ exception std::terminate names and its what() line."""
    for i, match in run.search.matches(ABORT_EXCEPTION):
        for j in range(i + 1, min(len(run.texts), i + 1 + ABORT_WHAT_LINES)):
            if what := re.match(ABORT_WHAT, run.texts[j]):
                text = what.group("what").strip()
                finding.measured = (f"the exception: {match.group('type')}: {text[:240]}"
                                    + ("..." if len(text) > 240 else ""))
                return
        finding.measured = f"the exception: {match.group('type')} (no what() line follows it)"
        return


_STOP_WORDS = [(re.compile(pattern), words) for pattern, words in (*STOP_KINDS, *STOP_SIGNAL_EXITS)]


def _stop_details(run: _Run, finding: Finding) -> None:
    """What stopped the job (its first line: the time limit, a preemption, which signal), and how to go on: where
    the log's command names its checkpoint.save folder, the resume command, with the offload the run had."""
    text = run.texts[finding.first_index]
    words = next((words.format(signal=SIGNAL_NAMES.get(m.group("signal"), m.group("signal"))
                               if "signal" in m.groupdict() else "")
                  for regex, words in _STOP_WORDS if (m := regex.search(text))), "")
    finding.measured = f"stopped by {words}" if words else ""
    command = run.facts.command
    if command is None:
        finding.fix_basis = ("the rule table's fix: " + (run.facts.command_unread or "the log does not start with "
                                                         "the run_recipe.py command")
                             + ", so its checkpoint.save folder is not known")
        return
    save = next((value for key, _, value in (o.partition("=") for o in command.overrides)
                 if key.lstrip("+") == "checkpoint.save" and value), None)
    if save:
        steps = [f"{RESUME_WORDS}{save}"]
        offload, fraction = run.facts.optimizer_offload, run.facts.fraction
        if offload:
            steps.append(("the run had optimizer offload on" + (f" at fraction {fraction:g}" if fraction is not None
                                                                  else "") + f": {RESUME_OFFLOAD}"))
        elif offload is None:
            steps.append(RESUME_OFFLOAD)
    else:
        steps = [f"nothing was saved (the command sets no checkpoint.save): {RESUME_SAVE_FIRST}"]
    steps.append(RESUME_TIME_LIMIT if "time limit" in words else RESUME_SIGNAL_AHEAD)
    finding.fix = "; ".join(steps)
    finding.fix_basis = "the log's command (its checkpoint.save) and header (its optimizer offload)"


def _raised_at(run: _Run, start: int) -> tuple[int, re.Match[str] | None] | None:
    """The line index of the exception the traceback starting at ``start`` ends in, and its last frame, read on the
    lines of its rank; None where it ends in no error: an exit (SystemExit), a Ctrl-C (KeyboardInterrupt), or a log
    cut inside it."""
    rank, frame = run.lines[start].rank, None
    for j in range(start + 1, min(len(run.lines), start + _TRACEBACK_LINES)):
        line = run.lines[j]
        if line.rank != rank:
            continue
        if found := _FRAME.match(line.text):
            frame = found
        elif line.text.strip() and not line.text[:1].isspace():
            if _NOT_AN_ERROR.match(line.text) or line.text.startswith("Traceback"):
                return None
            return j, frame
    return None


def _exception_details(run: _Run, finding: Finding) -> bool:
    """A traceback no rule names: its evidence becomes the exception's line (and the same exception's line on other
    ranks), and what it measured the last frame of the first traceback that ends in an error (the file, line and
    function that raised it). False where no traceback ends in one."""
    raised = [found for start in run.search.matching(_TRACEBACK) if (found := _raised_at(run, start))]
    if not raised:
        return False
    (first, frame), text = raised[0], run.texts[raised[0][0]]
    same = [j for j, _ in raised if run.texts[j] == text]
    finding.evidence = [run.lines[j] for j in same[:MAX_EVIDENCE]]
    finding.first_index = first
    finding.ranks = {rank for j in same for rank in stated_ranks(run.lines, j)}
    where = (f" in {frame.group('file')}:{frame.group('line')}, in {frame.group('function')} (the traceback's last "
             "frame)") if frame else " (the traceback names no frame)"
    finding.measured = text.strip()[:240] + where
    return True


def _rank_words(ranks: set[int]) -> str:
    if not ranks:
        return ""
    return f"rank {min(ranks)}" if len(ranks) == 1 else f"ranks {', '.join(map(str, sorted(ranks)))}"


def _mark_consequences(findings: list[Finding]) -> None:
    """A timeout, a lost NCCL peer or the launcher's stop that came after another error: most likely that error's
    consequence (torchrun and NCCL stop the other ranks once one fails). The first error stays the one to fix."""
    # the causes: errors, and the scheduler's stop (a warning: the run did not fail), which the ranks' lost NCCL
    # peers and the launcher's kills after it follow from
    causes = [f for f in findings if f.evidence and ((f.severity == "error" and f.rule_id not in _CONSEQUENCE_IDS
                                                      and not f.carries) or f.rule_id == _STOP_ID)]
    roots: dict[int, Finding] = {}  # id() of a consequence: the failure it follows from
    for finding in findings:
        if finding.rule_id not in _CONSEQUENCE_IDS or not finding.evidence:
            continue
        at = finding.first_index
        earlier = [f for f in causes if f.first_index < at]
        if not earlier and finding.rule_id in _AFTER_NETWORK:
            earlier = [f for f in findings if f.rule_id == _NETWORK_ID and f.evidence and f.first_index <= at]
        if not earlier and finding.rule_id == _ABORT_ID:  # an error before the abort, or the one its what() names
            earlier = [f for f in findings if f is not finding and f.severity == "error" and f.evidence
                       and f.first_index <= at + ABORT_WHAT_LINES]
        if not earlier and finding.rule_id in _PEER_LOST:
            earlier = [f for f in causes if f.rule_id != _STOP_ID and _lost_peer(finding, f)]
        if not earlier and finding.rule_id == _TIMEOUT_ID:
            earlier = [f for f in causes if f.rule_id != _STOP_ID and _waited_on(finding, f)]
        if earlier:
            cause = min(earlier, key=lambda f: f.first_index)
            while id(cause) in roots:  # the cause is itself another's consequence: name the failure at the root
                cause = roots[id(cause)]
            roots[id(finding)] = cause
            where = _rank_words(cause.ranks)
            below = ", printed below this one" if cause.first_index > finding.first_index else ""
            finding.consequence_of = (f"most likely a consequence of [{cause.label}]"
                                      + (f" on {where}" if where else "")
                                      + f", which failed first ({cause.evidence[0].path.name}:"
                                      f"{cause.evidence[0].number}{below}): fix that one")
    # a consequence of a failure printed after it stands right below that failure, so the report starts with the cause
    def after_its_cause(f: Finding) -> bool:
        return id(f) in roots and roots[id(f)].first_index > f.first_index

    findings.sort(key=lambda f: (f.severity != "error",
                                 roots[id(f)].first_index if after_its_cause(f) else f.first_index, after_its_cause(f)))


def _lost_peer(finding: Finding, cause: Finding) -> bool:
    """Whether ``cause``, printed after ``finding`` (a rank's NCCL error of a lost peer), may be the peer it lost:
    another rank's failure, or a kill, crash or node failure, which the process that ended never prints itself."""
    if cause.first_index <= finding.first_index:
        return False
    if cause.rule_id in _ENDS_UNSAID and not (cause.ranks and finding.ranks):
        return True  # the kernel's or Slurm's kill, which names no rank, or a log of the lost peer's ranks alone
    # a kill of the ranks that reported the lost peer too is the launcher's stop after it (srun's "tasks 0-7: Killed")
    return bool(cause.ranks and finding.ranks and not cause.ranks & finding.ranks)


def _waited_on(finding: Finding, cause: Finding) -> bool:
    """Whether ``cause``, printed after ``finding`` (a collective's timeout), may be the failure it waited on:
    another rank's error, or one that names no rank (a log of one rank's lines after another's); a kill or crash only
    where it names ranks other than the timed-out ones (_TIMEOUT_ID's comment)."""
    if cause.first_index <= finding.first_index:
        return False
    if cause.rule_id in _ENDS_UNSAID:
        return bool(cause.ranks and finding.ranks and not cause.ranks & finding.ranks)
    return not (cause.ranks and finding.ranks and cause.ranks <= finding.ranks)


def diagnose(paths: list[Path], build_config: bool = True) -> list[Diagnosis]:
    """Every failure each LOG shows. LogError (naming the file) when a LOG cannot be read; ``build_config``
    False never loads Megatron (fixes then come from a saved run_config.yaml or stay generic)."""
    reports = diagnose_each(paths, build_config)
    for report in reports:
        if isinstance(report, UnreadableLog):
            raise LogError(report.reason)
    return reports  # type: ignore[return-value]


def diagnose_each(paths: list[Path], build_config: bool = True) -> list[Diagnosis | UnreadableLog]:
    """diagnose, each LOG read on its own: one that cannot be read (empty, missing, a folder without a run's files,
    not text) is an UnreadableLog in its place, and the others are diagnosed all the same (torchrun's --log-dir
    leaves an empty file for each rank that printed nothing)."""
    read: list[list[_Run] | UnreadableLog] = []
    for path in map(Path, paths):
        try:
            read.append(_runs_of(path, build_config))
        except LogError as error:
            read.append(UnreadableLog(path, str(error)))
    runs = [run for item in read if not isinstance(item, UnreadableLog) for run in item]
    diagnosed = iter([diagnose_run(run, baseline) for run, baseline in zip(runs, _baseline_step(runs))])
    reports: list[Diagnosis | UnreadableLog] = []
    for item in read:  # in the order the LOGs were given
        reports += [item] if isinstance(item, UnreadableLog) else [next(diagnosed) for _ in item]
    return reports


def _runs_of(path: Path, build_config: bool) -> list[_Run]:
    """The runs LOG holds (run_segments): each diagnosed on its own lines and facts, so that a restart's header does
    not describe the run before it, nor a stop end the runs after it."""
    notes: list[str] = []
    lines = read_lines(path, notes)
    segments = run_segments(lines)
    last = len(segments) - 1
    return [_Run(path, build_config, lines[segment.start:segment.stop], run_folder(path) if k == last else None,
                 part=(k + 1, len(segments)) if last else None, notes=notes)
            for k, segment in enumerate(segments)]


def format_diagnosis(diagnosis: Diagnosis) -> str:
    head = diagnosis.where
    notes = [f"  note: {note}" for note in diagnosis.notes]
    if not diagnosis.findings:
        return "\n".join([f"{head}: nothing recognised. No line matches a failure of the rule table; nothing is "
                          "guessed. (diagnose.py --list shows what it recognises.)", *notes])
    count = len(diagnosis.findings)
    first = diagnosis.first_failure
    first_words = ""
    if not any(f.severity == "error" for f in diagnosis.findings) and any(
            f.rule_id == _STOP_ID and f.evidence for f in diagnosis.findings):
        first_words = "; nothing failed: the job was stopped from outside"
    if first is not None and count > 1:
        where = _rank_words(first.ranks)
        first_words = (f"; the first failure: [{first.label}]" + (f" on {where}" if where else "")
                       + f" at {first.evidence[0].path.name}:{first.evidence[0].number}")
    out = [f"{head}: {count} finding{'s' if count != 1 else ''}{first_words}", *notes]
    for f in diagnosis.findings:
        ranks = f" ({_rank_words(f.ranks)})" if f.ranks else ""
        out.append(f"  {f.severity.upper():7} [{f.label}] {f.key}{ranks}")
        out.append(f"        what:     {f.what}")
        if f.carries:
            out.append(f"        carries:  {f.carries}")
        if f.consequence_of:
            out.append(f"        after:    {f.consequence_of}")
        for line in f.evidence:
            text = line.text.strip()
            out.append(f"        evidence: {line.path.name}:{line.number}: {text[:240]}{'...' if len(text) > 240 else ''}")
        if f.measured:
            out.append(f"        measured: {f.measured}")
        out.append(f"        confirm:  {f.confirm}")
        out.append(f"        fix:      {f.fix}")
        if f.fix_basis:
            out.append(f"                  ({f.fix_basis})")
    return "\n".join(out)
