"""Where a sweep or benchmark is: run i of n, the outcome, and the time left from the finished runs' median."""

from __future__ import annotations

from mbridge_offload.bench.progress import RunProgress


def test_lines_count_the_runs_and_estimate_the_time_left(capsys):
    progress = RunProgress(label="[sweep]", total=4)
    progress.kept("fraction-0")
    progress.starting("fraction-0.5")
    progress.finished("fraction-0.5", "ok", 60.0)
    progress.starting("fraction-1")
    progress.finished("fraction-1", "FAILED: CUDA out of memory", 100.0)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "[sweep] run 1/4: fraction-0: kept from an earlier run (3 runs left, time left known after the first run)"
    assert lines[1] == "[sweep] run 2/4: fraction-0.5 ..."
    assert lines[2] == "[sweep] run 2/4: fraction-0.5: ok (60 s; 2 runs left, about 2 min 00 s)"
    # the median of 60 s and 100 s, for the one run left
    assert lines[4] == "[sweep] run 3/4: fraction-1: FAILED: CUDA out of memory (100 s; 1 run left, about 1 min 20 s)"
    progress.starting("fraction-1-repeat1")
    progress.finished("fraction-1-repeat1", "ok", 3700.0)
    assert capsys.readouterr().out.splitlines()[-1].endswith("(3700 s; all runs done)")
    long = RunProgress(label="[bench]", total=10, walls=[3600.0])
    assert long.time_left() == "10 runs left, about 10 h 00 min"
