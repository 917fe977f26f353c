"""diagnose.py on a long run's log: each pattern is searched only on the lines that may hold it, and finds what
searching every line finds."""

from __future__ import annotations

import re
import time
from pathlib import Path

from mbridge_offload.diagnosis import diagnose
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
    texts += ["Killed", "  MemoryError", "exitcode  : -9 (pid: 1)", ITERATION.format(n=1, s=64), OOM, ""]
    search = LineSearch(texts)
    for pattern in PATTERNS:
        regex = re.compile(pattern)
        assert search.matching(pattern, regex) == [i for i, t in enumerate(texts) if regex.search(t)], pattern


def test_a_200k_line_log_is_diagnosed_in_seconds(tmp_path):
    """Every pattern on every line took ~18 s for 200,000 iteration lines before the OOM at the end."""
    path = tmp_path / "long.log"
    path.write_text("\n".join(ITERATION.format(n=n, s=64 * n) for n in range(1, 200_001)) + "\n" + OOM + "\n")
    start = time.perf_counter()
    [diagnosis] = diagnose([path], build_config=False)
    elapsed = time.perf_counter() - start
    assert [f.rule_id for f in diagnosis.findings] == ["runtime/cuda-oom"]
    assert diagnosis.findings[0].evidence[0].number == 200_001 and diagnosis.findings[0].ranks == {5}
    assert elapsed < 8.0, f"{elapsed:.1f} s"
