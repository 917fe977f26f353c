"""diagnose.py on a long run's log: each pattern is searched only on the lines that may hold it, and finds what
searching every line finds."""

from __future__ import annotations

import re
from pathlib import Path

from mbridge_offload.diagnosis.line_search import LineSearch, required_strings
from mbridge_offload.validation.registry import RULES
from mbridge_offload.validation.runtime_failures import CONFIG_RULE_LOG_SIGNATURES, JOB_STOPPED
from mbridge_offload.validation.upstream import _UPSTREAM_KEYS, _UPSTREAM_TO_RULE

LOGS = Path(__file__).parent / "logs"
PATTERNS = sorted({*(p for rule in RULES for p in rule.log_signatures), *(p for p, _ in CONFIG_RULE_LOG_SIGNATURES),
                   *(p for p, _ in _UPSTREAM_TO_RULE), *(k[0] for k in _UPSTREAM_KEYS), *JOB_STOPPED})
ITERATION = (" [2026-12-05 03:12:22] iteration {n:8d}/  200000 | consumed samples: {s:12d} | elapsed time per "
             "iteration (ms): 1834.2 | learning rate: 2.999E-04 | global batch size:    64 | lm loss: 7.131E+00 | "
             "loss scale: 1.0 | grad norm: 1.512 | number of skipped iterations:   0 | number of nan iterations:   0 |")
OOM = ("[rank5]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.32 GiB. GPU 5 has a total capacity of "
       "139.81 GiB of which 1.07 GiB is free. Including non-PyTorch memory, this process has 138.72 GiB memory in use. "
       "Of the allocated memory 131.04 GiB is allocated by PyTorch, and 5.11 GiB is reserved by PyTorch but "
       "unallocated.")


def test_required_strings_are_in_every_match():
    assert required_strings(r"CUDA (error|Error|driver error): out of memory") == (": out of memory",)
    strings = required_strings(r"ncclRemoteError|ncclSystemError")  # the parser factors out "nccl"
    assert strings and all(any(s in error for s in strings) for error in ("ncclRemoteError", "ncclSystemError"))
    assert required_strings(r"(?i)killed") == () and required_strings(r"\d+\s*$") == ()


def test_each_pattern_finds_on_the_candidate_lines_what_it_finds_on_every_line():
    texts = [line for path in sorted(LOGS.iterdir()) for line in path.read_text().splitlines()]
    texts += ["Killed", "  MemoryError", "exitcode  : -9 (pid: 1)", ITERATION.format(n=1, s=64), OOM, "",
              "srun: error: node1: task 0: Exited with exit code 137", "    Exit Code:    137", "EXIT STATUS 137",
              "subprocess.CalledProcessError: Command 'x' returned non-zero exit status 137."]
    search = LineSearch(texts)
    for pattern in PATTERNS:
        regex = re.compile(pattern)
        assert search.matching(pattern, regex) == [i for i, t in enumerate(texts) if regex.search(t)], pattern


def test_a_long_log_is_searched_only_on_the_lines_a_pattern_may_match(tmp_path):
    """Every pattern on every line took ~18 s for 200,000 iteration lines before the OOM at the end. What made it fast
    is counted, not timed: a wall-clock bound flaked on a loaded machine (8.9 s against 8 s for 200,000 lines) and
    still passed a several-fold regression on a fast one. Each pattern's regular expression may run only on the lines
    that hold one of its required strings (or on every line where it has none): on an iteration line that is the
    NaN count's and the grad norm's, so the searches stay within that many per line, where searching every line
    with every pattern makes them len(PATTERNS) per line. Finding the candidate lines is one pass over the log's
    distinct lines for all patterns together: a pass per required string (~170 over the whole text) took half of the
    ~12 s of 200,000 lines."""
    from mbridge_offload.diagnosis.engine import _runs_of, diagnose_run

    lines = 50_000
    path = tmp_path / "long.log"
    path.write_text("\n".join(ITERATION.format(n=n, s=64 * n) for n in range(1, lines + 1)) + "\n" + OOM + "\n")
    [run] = _runs_of(path, build_config=False)
    diagnosis = diagnose_run(run, None)
    assert [f.rule_id for f in diagnosis.findings] == ["runtime/cuda-oom"]
    assert diagnosis.findings[0].evidence[0].number == lines + 1 and diagnosis.findings[0].ranks == {5}
    iteration = ITERATION.format(n=1, s=64)
    on_iteration_lines = [p for p in PATTERNS
                          if not required_strings(p) or any(s in iteration for s in required_strings(p))]
    assert 10 * len(on_iteration_lines) < len(PATTERNS)  # the bound below is far from every pattern on every line
    assert run.search.searches <= len(on_iteration_lines) * lines + len(PATTERNS)
    assert run.search.passes == 1


def test_the_candidate_lines_of_every_pattern_come_from_one_pass_that_finds_overlapping_strings():
    """One pass finds every required string of every pattern on each line, where they overlap (one inside another,
    one starting inside another, one a prefix of another) and where a line differs from another in its digits only;
    a pattern given later costs a pass of its own."""
    patterns = [r"abcd", r"bc", r"cdef", r"ab\d", r"Cuda failure 700\b", r"x{3,}"]
    texts = ["..abcdef..", "ab7", "Cuda failure 700", "Cuda failure 701", "Cuda failure 7000", "zzz", "xxxx"]
    search = LineSearch(texts, patterns)
    assert search.passes == 1
    assert {p: search.matching(p) for p in patterns} == {
        r"abcd": [0], r"bc": [0], r"cdef": [0], r"ab\d": [1], r"Cuda failure 700\b": [2], r"x{3,}": [6]}
    assert search.passes == 1
    assert search.matching(r"zz+") == [5] and search.passes == 2
