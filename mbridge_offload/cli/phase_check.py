"""A dry check, on the CPU, of the commands a GPU session would run: every phase of docs/benchmarks/h200.sh and
every step of docs/benchmarks/multi-gpu/run.sh, before device time is spent on a command the plugin refuses.

    python -m mbridge_offload.cli.phase_check                     # every h200.sh phase and multi-gpu/run.sh 4 and 2
    python -m mbridge_offload.cli.phase_check not-run-yet multi-gpu
    python -m mbridge_offload.cli.phase_check planner-auto-6 delayed-bench --host-memory-gib 120

TARGET: an h200.sh phase, ``all`` (every phase), ``not-run-yet`` (the phases docs/benchmarks/README.md lists under
"Not run yet") or ``multi-gpu`` (run.sh with 4 and with 2 GPUs; ``--gpus`` picks).

**Collecting.** Each phase runs for real under bash, with ``PYTHON`` set to a recorder (both scripts and
case_runner.sh call ``$py``, ``py=${PYTHON:-python3}``) that writes its argv and the environment that decides a run
(MBRIDGE_*, NCCL_*, PYTORCH_*, WORLD_SIZE, ...) as one JSON line and exits 0 at once; ``sleep`` and ``nvidia-smi`` are
no-ops on its PATH, ``$RUNS`` is a temporary folder, ``$OUT`` unset and CASES, WAVES, PARTS, STEPS, ... unset, so
each phase collects its default set. Lines that read what an earlier command wrote find nothing, harmlessly.
Not collected: what a phase's own Python runner starts itself (alloc-tight/run.py, smallest-trains/run.py start
their runs with run_one beside a device ballast); they are listed as skipped.

**Checking.** A call of scripts/run_recipe.py (also under ``-m torch.distributed.run``: WORLD_SIZE from
--nproc-per-node) is parsed by run_recipe's own parser and prepared as ``run_recipe.py --dry-run`` prepares it
(mbridge_offload/prepare.py: overrides, auto, tuning, validation for its GPU count, the memory plan), with an
H200's 139.801 GiB per GPU unless the command gives --gpu-memory-gib; the host is checked only with
``--host-memory-gib`` (as a dry run: a launch checks this node's MemAvailable). sweep_offload, bench_offload,
check_auto and check_resume are parsed by their own parsers and expanded into the run_recipe commands they would
start, built by their own functions (bench/sweep.run_recipe_command, overhead.configurations, ...); each distinct
one is prepared. check_auto's runs below auto are those at auto's fraction - 0.05 and - 0.10. plan_offload's
--compare folders must be made by an earlier command of the phase; engine_parity's folders likewise. Errors are
findings; warnings are counted. measure_host, pytest, gpu_trace and inline ``-c`` code are not checked.

Exit 0 when nothing is refused, 1 when a command is, 2 on a bad command line. Megatron Bridge is imported once
(~35 s), then each configuration takes a fraction of a second.

A command of its own among the commands it checks: it uses their parsers and prepare.py.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

ROOT = Path(__file__).resolve().parents[2]
H200_SCRIPT = Path("docs/benchmarks/h200.sh")
MULTI_GPU_SCRIPT = Path("docs/benchmarks/multi-gpu/run.sh")
BENCH_README = Path("docs/benchmarks/README.md")
H200_GPU_GIB = 139.801  # an H200's memory as torch reports it (every run folder of docs/benchmarks/ says so)
H200_HOST_CORES = 16  # the project's H200 host, where a bench gets no --host-json to say
# the environment a recorded call keeps (what validation and the planner read) and the check applies
ENV_PREFIXES = ("MBRIDGE_", "NCCL_", "PYTORCH_", "NVTE_", "CUBLAS_", "CUDA_", "OMP_", "TORCH_")
ENV_NAMES = ("WORLD_SIZE",)
KEEP_HERE = ("MBRIDGE_OFFLOAD_NO_WORKER", "MBRIDGE_OFFLOAD_CACHE_DIR")  # this process's own, never a run's
# the phases' knobs: unset, so each phase collects its default set
PHASE_KNOBS = ("OUT", "CASES", "WAVES", "PARTS", "STEPS", "FRACTIONS", "DETERMINISTIC", "LAYERS", "MB", "DEST")
TORCHRUN_FLAGS = ("--standalone", "--no-python", "--run-path", "--redirects-none")  # options without a value
COMMANDS = ("run_recipe", "sweep_offload", "bench_offload", "check_auto", "check_resume", "plan_offload",
            "measure_host")

RECORDER = """#!{python} -SE
import json, os, sys
keep = {prefixes!r}
env = {{k: v for k, v in os.environ.items() if k.startswith(keep) or k in {names!r}}}
line = json.dumps({{"argv": sys.argv[1:], "env": env, "cwd": os.getcwd()}}) + "\\n"
fd = os.open(os.environ["PHASE_CHECK_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
os.write(fd, line.encode())
os.close(fd)
"""


@dataclass(frozen=True)
class ExpectedRefusal:
    """A command a script runs to see it refused (exit 2): its errors are the point, no errors the finding."""

    source: str  # "multi-gpu" or an h200.sh phase
    recipe: str
    token: str  # an argument the command has
    why: str
    run: str = ""  # the run of a sweep or bench that is refused ("": the command's own)
    host: bool = False  # refused by the host check: expected only when the check is given --host-memory-gib


EXPECTED_REFUSALS = (
    ExpectedRefusal("multi-gpu", "qwen3_1b_proxy_activation_offload_config", "model.pipeline_model_parallel_size=2",
                    "step 4: activation offload must be refused with PP>1 (exit 2)"),
    ExpectedRefusal("moe-sweep-deep", "qwen3_30b_a3b_proxy_pretrain_config", "model.num_layers=8",
                    "fraction 1 of the 8-layer MoE proxy is refused by the host check (the phase's comment)",
                    run="fraction-1", host=True),
    ExpectedRefusal("host-peak", "qwen3_30b_a3b_proxy_pretrain_config", "model.num_layers=8",
                    "the 8-layer MoE proxy at fraction 1 is refused by the host check (the phase's comment)", host=True),
)


@dataclass
class Call:
    """One ``$py ...`` of a script, as the recorder saw it."""

    argv: list[str]
    env: dict[str, str]

    def text(self) -> str:
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items()))
        return (env + " " if env else "") + "python3 " + shlex.join(self.argv)


@dataclass
class Checked:
    """What the check found for one call."""

    call: Call
    status: str  # "ok", "refused", "expected refusal", "skipped"
    problems: list[dict] = field(default_factory=list)  # errors (and, for the record, warnings)
    notes: list[str] = field(default_factory=list)
    runs: int = 0  # configurations prepared for it

    @property
    def errors(self) -> list[dict]:
        return [p for p in self.problems if p["severity"] == "error"]

    @property
    def warnings(self) -> list[dict]:
        return [p for p in self.problems if p["severity"] != "error"]

    def to_json(self) -> dict:
        return {"command": self.call.text(), "argv": self.call.argv, "env": self.call.env, "status": self.status,
                "problems": self.problems, "notes": self.notes, "runs": self.runs}


@dataclass
class Source:
    """A phase of h200.sh or run.sh with a GPU count: what ran, what it called, what the check found."""

    name: str
    script: Path
    args: list[str]
    calls: list[Call] = field(default_factory=list)
    exit_code: int | None = None
    stderr: str = ""
    checked: list[Checked] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(c.status != "refused" for c in self.checked)


# ---------------------------------------------------------------------------------------------- collecting

def h200_phases(root: Path = ROOT) -> list[str]:
    """The phases h200.sh knows, in its order (the labels of its ``case $phase in``)."""
    text = (root / H200_SCRIPT).read_text()
    body = text[text.index("case $phase in"):]
    return [m for m in re.findall(r"^    ([a-z0-9][a-z0-9-]*)\)", body, flags=re.M)]


def not_run_yet(root: Path = ROOT) -> list[str]:
    """The h200.sh phases docs/benchmarks/README.md names under "Not run yet" (its older items included)."""
    text = (root / BENCH_README).read_text()
    start = text.index("## Not run yet")
    end = text.find("\n## ", start + 1)
    section = text[start:end if end > 0 else len(text)]
    known = h200_phases(root)
    named = re.findall(r"`(?:bash docs/benchmarks/h200\.sh )?([a-z0-9][a-z0-9-]*)`", section)
    return [p for p in known if p in named]


COLLECT_TIMEOUT_S = 120.0  # a phase script's own run with the recorder standing in for python: seconds at most


def _tools(folder: Path) -> dict[str, str]:
    """The recorder and the no-op tools in ``folder``; the environment a phase runs with."""
    recorder = folder / "python-recorder"
    recorder.write_text(RECORDER.format(python=sys.executable, prefixes=ENV_PREFIXES, names=ENV_NAMES))
    shims = folder / "bin"
    shims.mkdir()
    for tool in ("sleep", "nvidia-smi"):
        (shims / tool).write_text("#!/bin/sh\nexit 0\n")
    for path in (recorder, *shims.iterdir()):
        path.chmod(0o755)
    env = {k: v for k, v in os.environ.items()
           if not (k.startswith(ENV_PREFIXES) or k in ENV_NAMES or k in PHASE_KNOBS or k == "PYTHONPATH")}
    env.update(PYTHON=str(recorder), PATH=f"{shims}:{env.get('PATH', '/usr/bin:/bin')}")
    return env


def collect(source: Source, root: Path = ROOT, timeout_s: float = COLLECT_TIMEOUT_S) -> Source:
    """Run ``source``'s script with the recorder as its python; its calls, in order, into ``source.calls``."""
    return collect_all([source], root, workers=1, timeout_s=timeout_s)[0]


def _collect_in(source: Source, folder: Path, env: dict[str, str], root: Path, timeout_s: float) -> Source:
    """One source's run, with its recorder and tools already written in ``folder`` (``env`` from ``_tools``)."""
    env = dict(env)
    log = folder / "calls.jsonl"
    env.update(PHASE_CHECK_LOG=str(log), RUNS=str(folder / "runs"))
    try:
        done = subprocess.run(["bash", str(source.script), *source.args], cwd=root, env=env, timeout=timeout_s,
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True, start_new_session=True)
        source.exit_code, source.stderr = done.returncode, done.stderr
    except subprocess.TimeoutExpired as expired:
        source.exit_code, source.stderr = None, f"did not finish in {timeout_s:g} s: {expired.stderr or ''}"
    lines = log.read_text().splitlines() if log.exists() else []
    runs = str(folder / "runs")  # shown as the scripts name it
    source.calls = [Call(argv=[a.replace(runs, "$RUNS") for a in d["argv"]], env=d["env"])
                    for d in map(json.loads, lines)]
    source.stderr = source.stderr.replace(runs, "$RUNS")
    return source


def collect_all(found: list[Source], root: Path = ROOT, workers: int = 8,
                timeout_s: float = COLLECT_TIMEOUT_S) -> list[Source]:
    """``collect`` on every source, side by side. Every recorder is written before any script starts: a recorder
    written while another thread forks stays open for writing in that child until it execs, and running it then
    fails with "Text file busy" (a phase lost its first command that way)."""
    with tempfile.TemporaryDirectory(prefix="phase-check-") as tmp:
        folders = [Path(tmp) / str(i) for i in range(len(found))]
        envs = []
        for folder in folders:
            folder.mkdir()
            envs.append(_tools(folder))
        with ThreadPoolExecutor(max_workers=workers) as pool:
            list(pool.map(lambda i: _collect_in(found[i], folders[i], envs[i], root, timeout_s), range(len(found))))
    return found


def sources(targets: list[str], gpus: list[int], root: Path = ROOT) -> list[Source]:
    """The phases and run.sh calls that ``targets`` name (see the module's usage), each once, in order."""
    phases = h200_phases(root)
    wanted: list[Source] = []
    for target in targets:
        if target == "all":
            names = phases
        elif target == "not-run-yet":
            names = not_run_yet(root)
        elif target == "multi-gpu":
            wanted += [Source(f"multi-gpu/run.sh {n}", MULTI_GPU_SCRIPT, [str(n)]) for n in gpus]
            continue
        elif target in phases:
            names = [target]
        else:
            raise ValueError(f"unknown target {target!r}: an h200.sh phase, all, not-run-yet or multi-gpu")
        wanted += [Source(name, H200_SCRIPT, [name]) for name in names]
    seen, unique = set(), []
    for s in wanted:
        if s.name not in seen:
            seen.add(s.name)
            unique.append(s)
    return unique


# ---------------------------------------------------------------------------------------------- checking

def _problem(rule: str, value: str = "", key: str = "(command line)", fix: str = "", rule_id: str = "",
             severity: str = "error") -> dict:
    return {"id": rule_id, "key": key, "value": value, "rule": rule, "fix": fix, "severity": severity}


@contextlib.contextmanager
def _environment(env: dict[str, str]) -> Iterator[None]:
    """os.environ as the call had it for what decides a run (validation and the planner read it)."""
    saved = dict(os.environ)
    for key in list(os.environ):
        if (key.startswith(ENV_PREFIXES) or key in ENV_NAMES) and key not in KEEP_HERE:
            del os.environ[key]
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _lenient(parser: argparse.ArgumentParser, missing: list[str]) -> argparse.ArgumentParser:
    """``parser`` with its must-exist file and folder types taking any path: those are made on the GPU host by an
    earlier command (a missing one is noted in ``missing``)."""
    from mbridge_offload.cli.parsing import readable_dir, readable_file

    def any_path(text: str) -> Path:
        if not Path(text).exists():
            missing.append(text)
        return Path(text)

    for action in parser._actions:  # noqa: SLF001  (argparse keeps them there)
        if action.type in (readable_file, readable_dir):
            action.type = any_path
    return parser


def _parse(parser: argparse.ArgumentParser, argv: list[str]) -> tuple[argparse.Namespace | None, str | None]:
    """The parsed arguments, or the parser's refusal in its words."""
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said), contextlib.redirect_stdout(io.StringIO()):
            return parser.parse_intermixed_args(argv), None
    except SystemExit as stop:
        return None, said.getvalue().strip() or f"exit {stop.code}"


def _arg_value(argv: list[str], flag: str) -> str | None:
    for k, token in enumerate(argv):
        if token == flag and k + 1 < len(argv):
            return argv[k + 1]
        if token.startswith(flag + "="):
            return token.split("=", 1)[1]
    return None


def _without_out(argv: list[str]) -> tuple[str, ...]:
    """argv without ``--out DIR`` (runs that differ only there are the same configuration)."""
    out, skip = [], False
    for token in argv:
        if skip:
            skip = False
        elif token == "--out":
            skip = True
        elif not token.startswith("--out="):
            out.append(token)
    return tuple(out)


@dataclass
class Prepared:
    """What preparing one run_recipe command gave: its problems and auto's fraction."""

    problems: list[dict]
    auto_fraction: float | None = None


class Checker:
    """Checks calls; a run_recipe configuration met before (the same arguments but --out, the same environment)
    is answered from the first answer."""

    def __init__(self, gpu_memory_gib: float = H200_GPU_GIB, host_memory_gib: float | None = None):
        self.gpu_memory_gib = gpu_memory_gib
        self.host_memory_gib = host_memory_gib
        self._prepared: dict[tuple, Prepared] = {}

    # -- one training
    def prepare_run(self, argv: list[str], env: dict[str, str]) -> Prepared:
        key = (_without_out(argv), tuple(sorted(env.items())))
        if key not in self._prepared:
            self._prepared[key] = self._prepare_run(argv, env)
        return self._prepared[key]

    def _prepare_run(self, argv: list[str], env: dict[str, str]) -> Prepared:
        from overrides.short_flags import to_overrides
        from recipes import registry
        from mbridge_offload.cli import run_recipe
        from mbridge_offload.cli.parsing import problem_json
        from mbridge_offload.facts.import_notices import quiet_import_notices
        from mbridge_offload.planning import plan_kwargs

        missing: list[str] = []
        parser = _lenient(run_recipe.build_parser(), missing)
        args, refusal = _parse(parser, argv)
        if args is None:
            return Prepared([_problem(refusal, " ".join(argv), fix="see run_recipe.py --help",
                                      rule_id="arguments")])
        if args.list or args.rules:
            return Prepared([])
        if not args.recipe:
            return Prepared([_problem("--recipe NAME is required", fix="see run_recipe.py --list",
                                      rule_id="arguments")])
        try:
            recipe = registry.get(args.recipe)
        except registry.UnknownRecipe as unknown:
            return Prepared([_problem(str(unknown), args.recipe, "--recipe", rule_id="recipe/unknown",
                                      fix=" or ".join(unknown.suggestions) or "run_recipe.py --list")])
        quiet_import_notices()
        from mbridge_offload.prepare import NotPrepared, prepare
        from mbridge_offload.validation import validate

        with _environment(env):
            num_gpus, gpus_from = run_recipe._num_gpus(parser, args, recipe)  # noqa: SLF001  (run_recipe's own rule)
            overrides = list(args.overrides) + to_overrides(vars(args), list(args.overrides))
            if args.gpu_memory_gib is None:
                args.gpu_memory_gib = self.gpu_memory_gib
            if args.host_memory_gib is None:
                args.host_memory_gib = self.host_memory_gib
            try:
                with contextlib.redirect_stdout(io.StringIO()):
                    prepared = prepare(recipe, overrides, num_gpus=num_gpus, num_gpus_from=gpus_from,
                                       plan_options=plan_kwargs(args, launching=False),
                                       offload_tuning=args.offload_tuning, overlap_chunks=args.overlap_chunks,
                                       cpu_threads=args.cpu_threads, step_time_budget_s=args.step_time_budget_s,
                                       deterministic=args.deterministic, offload_engine=args.offload_engine,
                                       validator=validate)
            except NotPrepared as refused:
                return Prepared([_problem(refused.message.strip(), rule_id="refused")])
        problems = [problem_json(p) for p in prepared.report.problems]
        profiling = getattr(prepared.cfg, "profiling", None)
        if args.memory_snapshot and getattr(profiling, "record_memory_history", False):
            problems.append(_problem("--memory-snapshot with profiling.record_memory_history=True: both record the "
                                     "allocator's history", key="--memory-snapshot", value=str(args.memory_snapshot),
                                     fix="drop one of them", rule_id="arguments"))
        return Prepared(problems, prepared.auto_fraction)

    # -- one call of a script
    def check(self, call: Call, source_name: str = "", made: set[str] | None = None) -> Checked:
        """``made``: the folders earlier calls of the same source write (--out), for the calls that read them."""
        command, argv, env = _command(call)
        checked = Checked(call, "ok")
        if command is None:
            checked.status = "skipped"
            checked.notes.append(argv)  # the reason
            return checked
        handler = getattr(self, f"_check_{command}")
        runs = handler(argv, env, checked, made if made is not None else set())
        for label, run_argv in runs:
            prepared = self.prepare_run(run_argv, env)
            checked.runs += 1
            for problem in prepared.problems:
                checked.problems.append({**problem, "run": label} if label else problem)
            if label == "auto" and prepared.auto_fraction is not None:
                checked.notes.append(f"auto -> {prepared.auto_fraction:g}")
                self._auto_below(run_argv, env, prepared.auto_fraction, checked)
        expected = next((e for e in EXPECTED_REFUSALS if source_name.startswith(e.source)
                         and _arg_value(argv, "--recipe") == e.recipe and e.token in argv
                         and (not e.host or self.host_memory_gib is not None)), None)
        if expected is not None:
            meant = [p for p in checked.errors if p.get("run", "") == expected.run]
            if meant:
                checked.notes.append(expected.why)
                for p in meant:
                    p["expected"] = True
            else:
                checked.problems.append(_problem(f"expected a refusal ({expected.why}); the check found none",
                                                 rule_id="expected-refusal"))
        unexpected = [p for p in checked.errors if not p.get("expected")]
        checked.status = "refused" if unexpected else ("expected refusal" if checked.errors else "ok")
        return checked

    def _auto_below(self, auto_argv: list[str], env: dict[str, str], fraction: float, checked: Checked) -> None:
        """check_auto's runs 0.05 and 0.10 below auto's pick (the second runs only if the first trains)."""
        from mbridge_offload.bench.sweep import fraction_overrides
        from mbridge_offload.planning.fraction_search import AUTO_OVERRIDE, AUTO_STEP

        base = [a for a in auto_argv if a != AUTO_OVERRIDE]
        for steps in (1, 2):
            below = round(fraction - steps * AUTO_STEP, 2)
            if below < 0:
                break
            prepared = self.prepare_run([*base, *fraction_overrides(below)], env)
            checked.runs += 1
            checked.problems += [{**p, "run": f"fraction-{below:g}"} for p in prepared.problems]

    # -- the commands; each returns the run_recipe commands it would start, as (label, argv)
    def _parsed(self, module: str, argv: list[str], checked: Checked):
        import importlib

        parser = _lenient(importlib.import_module(f"mbridge_offload.cli.{module}").build_parser(), missing := [])
        args, refusal = _parse(parser, argv)
        if args is None:
            checked.problems.append(_problem(refusal, " ".join(argv), fix=f"see {module}.py --help",
                                             rule_id="arguments"))
        for path in missing:
            checked.notes.append(f"{path}: not here (made on the GPU host by an earlier command)")
        return args

    def _recipe_known(self, args, checked: Checked) -> bool:
        from recipes import registry

        try:
            registry.get(args.recipe)
            return True
        except registry.UnknownRecipe as unknown:
            checked.problems.append(_problem(str(unknown), args.recipe, "--recipe", rule_id="recipe/unknown"))
            return False

    def _check_run_recipe(self, argv, env, checked, made):
        return [("", argv)]

    def _split(self, args, checked: Checked, owned_fix: str | None = None):
        from mbridge_offload.bench.sweep import SWEEP_OWNED_FIX, split_overrides

        try:
            return split_overrides(list(args.overrides), owned_fix or SWEEP_OWNED_FIX)
        except (argparse.ArgumentTypeError, SystemExit) as error:
            text = str(error.code if isinstance(error, SystemExit) else error)
            checked.problems.append(_problem(text, rule_id="arguments"))
            return None, None

    def _check_sweep_offload(self, argv, env, checked, made):
        from mbridge_offload.bench.sweep import RUN_RECIPE, run_recipe_command

        args = self._parsed("sweep_offload", argv, checked)
        if args is None or not self._recipe_known(args, checked):
            return []
        multirun, overrides = self._split(args, checked)
        if overrides is None:
            return []
        if multirun and args.fractions and multirun != args.fractions:
            checked.problems.append(_problem("--fractions and optimizer.optimizer_offload_fraction=... disagree",
                                             rule_id="arguments", fix="give one"))
        fractions = multirun or args.fractions or [0.0, 0.25, 0.5, 0.75, 1.0]
        if 0.0 not in fractions:
            fractions = [0.0, *fractions]
        extra = (["--num-gpus", str(args.num_gpus)] if args.num_gpus else []) + (
            ["--deterministic"] if args.deterministic else [])
        made.add(str(args.out))
        checked.notes.append(f"{sum(args.baseline_runs if f == 0.0 else 1 for f in fractions)} trainings")
        skip = 1 + len(RUN_RECIPE)  # the interpreter and -m module
        return [(f"fraction-{f:g}", run_recipe_command(args.recipe, f, args.out / f"fraction-{f:g}", overrides,
                                                       extra)[skip:])
                for f in fractions if not (f == 0.0 and args.baseline_runs == 0)]

    def _check_bench_offload(self, argv, env, checked, made):
        from overrides.grammar import key_of
        from recipes import registry
        from mbridge_offload.bench import overhead
        from mbridge_offload.bench.sweep import RUN_RECIPE, run_recipe_command

        args = self._parsed("bench_offload", argv, checked)
        if args is None or not self._recipe_known(args, checked):
            return []
        refuse = lambda text: checked.problems.append(_problem(text, rule_id="arguments"))  # noqa: E731
        names = list(overhead.configurations(1))
        chosen = [c.strip() for c in args.configs.split(",") if c.strip()]
        unknown = [c for c in chosen if c not in names]
        if unknown or not chosen:
            refuse(f"--configs: unknown {', '.join(unknown) or '(none given)'}; choose from {', '.join(names)}")
            return []
        overrides = list(args.overrides)
        too_short = overhead.too_few_steps(overrides)
        if too_short and not args.short_runs:
            refuse(too_short)
        if not any(key_of(o) == "train.train_iters" for o in overrides):
            overrides.append(f"train.train_iters={overhead.default_train_iters()}")
        owned = overhead.owned_overrides(overrides)
        if owned:
            refuse(f"{', '.join(owned)}: set by the benchmark for each run (fractions with --fractions)")
        fractions = [f for f in args.fractions if f > 0]
        if not fractions:
            refuse("--fractions: give at least one fraction above 0 (the baseline, 0, always runs)")
        host = None
        if args.host_json and Path(args.host_json).is_file():
            try:
                host = json.loads(Path(args.host_json).read_text())
            except ValueError as error:
                refuse(f"--host-json {args.host_json}: not JSON ({error})")
        cores = (host or {}).get("cores") or H200_HOST_CORES
        configs = overhead.configurations(cores)
        every_run = overhead.every_run_args(args.num_gpus, args.deterministic)
        recipe_gpus = registry.get(args.recipe).num_gpus
        same = overhead.tuned_same_as(configs, args.num_gpus or recipe_gpus, cores) if "tuned" in chosen else None
        shared = same in chosen
        made.add(str(args.out))
        per_round = len(fractions) * sum(1 for name in chosen if not (name == "tuned" and shared))
        checked.notes.append(f"{args.baseline_runs + args.repeats * per_round} trainings ({args.repeats} round(s))")
        skip = 1 + len(RUN_RECIPE)
        runs = []
        if args.baseline_runs:
            runs.append(("baseline", run_recipe_command(args.recipe, 0.0, args.out / "baseline", overrides,
                                                        every_run)[skip:]))
        for fraction in fractions:
            for name in chosen:
                if name == "tuned" and shared:
                    continue
                config = configs[name]
                label = f"fraction-{fraction:g}-{name}"
                runs.append((label, run_recipe_command(args.recipe, fraction, args.out / label,
                                                       [*overrides, *config["overrides"]],
                                                       [*every_run, *config["args"]])[skip:]))
        return runs

    def _check_check_auto(self, argv, env, checked, made):
        from mbridge_offload.bench.auto_check import launch_arguments
        from mbridge_offload.bench.sweep import RUN_RECIPE, run_recipe_command

        args = self._parsed("check_auto", argv, checked)
        if args is None or not self._recipe_known(args, checked):
            return []
        multirun, overrides = self._split(args, checked, "the fraction is auto's to choose: drop "
                                                         "optimizer.optimizer_offload_fraction")
        if overrides is None:
            return []
        if multirun:
            checked.problems.append(_problem("the fraction is auto's to choose", rule_id="arguments",
                                             fix="drop optimizer.optimizer_offload_fraction"))
        made.add(str(args.out))
        common = [*overrides, f"train.train_iters={args.steps}"]
        return [("auto", run_recipe_command(args.recipe, "auto", args.out / "auto", common,
                                            launch_arguments(args.device_gib))[1 + len(RUN_RECIPE):])]

    def _check_check_resume(self, argv, env, checked, made):
        from mbridge_offload.bench.resume_parity import CHECKPOINT_FOLDER, RUN_FOLDERS, run_overrides
        from mbridge_offload.bench.sweep import RUN_RECIPE, run_recipe_command

        args = self._parsed("check_resume", argv, checked)
        if args is None or not self._recipe_known(args, checked):
            return []
        multirun, overrides = self._split(args, checked, "give the fractions with --fractions, not as a multirun "
                                                         "override")
        if overrides is None:
            return []
        if multirun:
            checked.problems.append(_problem("give the fractions with --fractions, not as a multirun override",
                                             rule_id="arguments"))
        extra = ["--offload-tuning", args.offload_tuning] + (["--deterministic"] if args.deterministic else [])
        made.add(str(args.out))
        runs = []
        for fraction in args.fractions:
            out = args.out / f"fraction-{fraction:g}"
            for name in RUN_FOLDERS:
                more = run_overrides(name, 2 * args.save_at, args.save_at, out / CHECKPOINT_FOLDER, args.stop_by)
                runs.append((f"fraction-{fraction:g}/{name}", run_recipe_command(
                    args.recipe, fraction, out / name, [*overrides, *more], extra)[1 + len(RUN_RECIPE):]))
        return runs

    def _check_plan_offload(self, argv, env, checked, made):
        args = self._parsed("plan_offload", argv, checked)
        if args is None:
            return []
        for folder in args.compare or []:
            if str(folder) not in made:
                checked.problems.append(_problem("no earlier command of this phase writes this folder",
                                                 str(folder), "--compare", rule_id="phase/unmade-folder",
                                                 fix="compare a folder an earlier command's --out makes"))
        if args.recipe and not args.compare:
            checked.notes.append("a plan only (plan_offload validates nothing): not prepared here")
        return []

    def _check_measure_host(self, argv, env, checked, made):
        checked.notes.append("measure_host: arguments not checked (its parser is built inside main)")
        return []

    def _check_engine_parity(self, argv, env, checked, made):
        from mbridge_offload.bench.engine_parity import _comparison

        out = _arg_value(argv, "--out")
        if out is None:
            checked.problems.append(_problem("--out DIR is required", rule_id="arguments"))
        for token in [a for a in argv if not a.startswith("--") and a != out]:
            try:
                _, reference, candidate = _comparison(token)
            except argparse.ArgumentTypeError as error:
                checked.problems.append(_problem(str(error), token, rule_id="arguments"))
                continue
            for folder in (reference, candidate):
                if str(folder) not in made:
                    checked.problems.append(_problem("no earlier command of this phase writes this folder",
                                                     str(folder), "comparison", rule_id="phase/unmade-folder",
                                                     fix="compare folders the phase's runs make (their --out)"))
        return []

    def _check_gpu_trace(self, argv, env, checked, made):
        traces = [a for a in argv if not a.startswith("-") and a != _arg_value(argv, "--out")]
        if len(traces) != 1:
            checked.problems.append(_problem("expects one trace", " ".join(argv), rule_id="arguments"))
        for trace in traces:
            if not _made_by(trace, made):
                checked.problems.append(_problem("no earlier command of this phase writes this trace's folder", trace,
                                                 "trace", rule_id="phase/unmade-folder",
                                                 fix="read a trace under an earlier run's --out"))
        return []

    def _check_pytest(self, argv, env, checked, made):
        files = [a.split("::")[0] for a in argv if a.endswith(".py") or "::" in a]
        for path in files:
            if not (ROOT / path).is_file():
                checked.problems.append(_problem("no such test file", path, "pytest", rule_id="arguments"))
        checked.notes.append(f"pytest: {len(files)} test file(s) found; the tests themselves need the GPU")
        return []


def _made_by(path: str, made: set[str]) -> bool:
    """Whether ``path`` lies in a folder an earlier command writes."""
    return any(path == folder or path.startswith(folder.rstrip("/") + "/") for folder in made)


def _command(call: Call) -> tuple[str | None, list[str] | str, dict[str, str]]:
    """(command, its arguments, environment) of a call; (None, why it is not checked, env) for the others."""
    argv, env = list(call.argv), dict(call.env)
    if argv[:2] in (["-m", "torch.distributed.run"], ["-m", "torch.distributed.launch"]):
        rest, sizes = argv[2:], {"--nproc-per-node": 1, "--nnodes": 1}
        while rest and rest[0].startswith("-"):
            token = rest.pop(0)
            if token in ("-m", "--module"):
                rest.insert(0, "-m")
                break
            name, has_value, value = token.partition("=")
            name = name.replace("_", "-")
            if name in TORCHRUN_FLAGS:
                continue
            if not has_value:
                value = rest.pop(0) if rest else ""
            if name in sizes:
                sizes[name] = int(value) if value.isdigit() else 1
        env.setdefault("WORLD_SIZE", str(sizes["--nproc-per-node"] * sizes["--nnodes"]))
        argv = rest
    if argv[:1] == ["-c"]:
        return None, "inline python (-c): not checked", env
    if argv[:1] == ["-m"] and len(argv) > 1:
        module = argv[1]
        if module.startswith("mbridge_offload.cli.") and module.rsplit(".", 1)[1] in COMMANDS:
            return module.rsplit(".", 1)[1], argv[2:], env
        if module in ("mbridge_offload.bench.engine_parity", "mbridge_offload.bench.gpu_trace", "pytest"):
            return module.rsplit(".", 1)[-1], argv[2:], env
        return None, f"-m {module}: not a training command, not checked", env
    if argv and argv[0].endswith(".py"):
        path = Path(argv[0])
        if path.parent.name == "scripts" and path.stem in COMMANDS:
            return path.stem, argv[1:], env
        return None, f"{argv[0]}: a runner that starts its runs itself (with run_one): its runs are not collected", env
    return None, "not a python script or module: not checked", env


def check_sources(targets: list[str], gpus: list[int] = (4, 2), checker: Checker | None = None,
                  root: Path = ROOT, workers: int = 8) -> list[Source]:
    """Collect every source ``targets`` name (side by side), then check each call in order."""
    checker = checker or Checker()
    found = sources(list(targets), list(gpus), root)
    collect_all(found, root, workers)
    for source in found:
        made: set[str] = set()
        for call in source.calls:
            checked = checker.check(call, source.name, made)
            out = _arg_value(call.argv, "--out")
            if out:
                made.add(out)
            source.checked.append(checked)
    return found


# ---------------------------------------------------------------------------------------------- printing

def _problem_lines(p: dict) -> list[str]:
    run = f" (run {p['run']})" if p.get("run") else ""
    head = f"{p['severity'].upper()} [{p['id'] or '-'}]{run} {p['key']} = {p['value']}"
    return [head, f"    rule: {' '.join(str(p['rule']).split())}", f"    fix:  {p['fix'] or '-'}"]


def report(found: list[Source], warnings: bool = False) -> str:
    lines = []
    for source in found:
        refused = sum(c.status == "refused" for c in source.checked)
        lines.append(f"=== {source.name}: {len(source.calls)} command(s), "
                     + ("OK" if not refused else f"{refused} REFUSED")
                     + ("" if source.exit_code == 0 else " (the script under the recorder: "
                        + (f"exit {source.exit_code})" if source.exit_code is not None else "cut: " + source.stderr)))
        if not source.calls:
            lines.append("  (no python call: nothing to check)")
        for k, c in enumerate(source.checked, 1):
            lines.append(f"[{k}] {c.call.text()}")
            if c.status == "skipped":
                lines.append(f"    skipped: {'; '.join(c.notes)}")
                continue
            shown = c.problems if warnings else c.errors
            warned = sorted({p["id"] or p["key"] for p in c.warnings})
            summary = {"ok": "OK", "refused": "REFUSED",
                       "expected refusal": "REFUSED where expected, nothing else"}[c.status]
            extra = [f"{c.runs} configuration(s)", *c.notes]
            if warned and not warnings:
                extra.append(f"warnings: {', '.join(warned)}")
            lines.append(f"    {summary} ({'; '.join(extra)})")
            for p in shown:
                if p.get("expected"):
                    continue
                lines += ["    " + line for line in _problem_lines(p)]
    refused = [(s.name, k) for s in found for k, c in enumerate(s.checked, 1) if c.status == "refused"]
    lines.append("")
    lines.append(f"{len(found)} source(s), {sum(len(s.calls) for s in found)} command(s): "
                 + ("nothing refused" if not refused else
                    f"{len(refused)} refused: " + ", ".join(f"{n} [{k}]" for n, k in refused)))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mbridge_offload.cli.phase_check",
                                     description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("targets", nargs="*", metavar="TARGET",
                        help="h200.sh phases, all, not-run-yet or multi-gpu (default: all multi-gpu)")
    parser.add_argument("--gpus", default="4,2", metavar="N,N", help="multi-gpu/run.sh's GPU counts (default 4,2)")
    parser.add_argument("--gpu-memory-gib", type=float, default=H200_GPU_GIB, metavar="G",
                        help=f"GPU memory for commands that do not give it (default {H200_GPU_GIB}, an H200)")
    parser.add_argument("--host-memory-gib", type=float, default=None, metavar="H",
                        help="check the host too, against H GiB per node (default: not checked, as a dry run)")
    parser.add_argument("--warnings", action="store_true", help="print every warning too")
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write what was found to FILE")
    args = parser.parse_args(argv)
    try:
        gpus = [int(n) for n in args.gpus.split(",") if n.strip()]
        targets = args.targets or ["all", "multi-gpu"]
        sources(targets, gpus)  # refuse an unknown target before the slow import
    except ValueError as error:
        parser.error(str(error))
    started = time.monotonic()
    found = check_sources(targets, gpus, Checker(args.gpu_memory_gib, args.host_memory_gib))
    print(report(found, args.warnings))
    print(f"(checked in {time.monotonic() - started:.0f} s)", file=sys.stderr)
    if args.json:
        args.json.write_text(json.dumps([{"source": s.name, "exit": s.exit_code,
                                          "calls": [c.to_json() for c in s.checked]} for s in found], indent=2) + "\n")
    return 0 if all(s.ok for s in found) else 1


if __name__ == "__main__":
    sys.exit(main())
