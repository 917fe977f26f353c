"""Where the allocator's reserve beside the peak comes from, read from a run's allocator history (issue #15).

For every time the main stream's expandable segment grew by more than a quarter GiB, print what the segment held
just before: its mapped size, the bytes live in it, and its free bytes with the largest free gap. A segment grows
when no free gap fits the request; the gap left behind is the reserve the run shows beside its peak.

Of the free bytes, PyTorch can give back on a full device only whole pages: it maps an expandable segment of the
large pool in pages of 20 MiB (kLargeBuffer), and unmapping a free block keeps the parts of its first and last
page that it shares with live blocks (CUDACachingAllocator.cpp, ``unmap_block``). The rest stays reserved even at
an out-of-memory error: ``stuck`` below. ``gaps`` counts the free ranges, the one at the segment's mapped end
(``end_gap_gib``) included; that one is not stuck in fact: the growth maps new pages on after it, and the request
takes it with them.

    python docs/benchmarks/reserve-snapshot/holes.py docs/benchmarks/reserve-snapshot/*.pickle.gz

Where a run's log has NCCL's INIT lines with epoch timestamps (``snapshot_run`` in ../h200.sh sets
``NCCL_DEBUG_TIMESTAMP_LEVELS`` and ``NCCL_DEBUG_TIMESTAMP_FORMAT`` since the twenty-first session), the log beside
the history (``NAME.log`` for ``NAME.pickle.gz``) places each communicator's creation on the history's clock
(``time_us``, microseconds since the epoch): before or after the first-step Adam moments of the GPU part, and before
or after each growth of the segment. A communicator's memory is NCCL's own (cuMem), which PyTorch's cached memory
cannot become: a gap that forms before a communicator is made costs the device, one that forms after does not
(../alloc-tight/README.md).
"""

import gzip
import pickle
import re
import sys
from pathlib import Path

GIB = 2**30
PAGE = 20 * 2**20  # the large pool's expandable segment page (PyTorch's kLargeBuffer)


def main_segment(snapshot: dict) -> dict:
    """The default stream's large (expandable) segment at the end of the history."""
    return next(s for s in snapshot["segments"] if s["stream"] == 0 and s["segment_type"] == "large")


def live_at_start(snapshot: dict) -> dict[int, int]:
    """address -> size of the blocks allocated when the history started: those at its end, with its events undone."""
    live = {b["address"]: b["size"] for s in snapshot["segments"] for b in s["blocks"]
            if b["state"] == "active_allocated"}
    for event in reversed(snapshot["device_traces"][0]):
        if event["action"] == "alloc":
            live.pop(event["addr"], None)
        elif event["action"] == "free_completed":
            live[event["addr"]] = event["size"]
    return live


def stuck_bytes(lo: int, hi: int) -> int:
    """The bytes of the free range [lo, hi) (offsets in its segment) that unmapping cannot give back: the parts of
    its first and last 20 MiB page outside the whole pages it covers."""
    first_whole, last_whole = -(-lo // PAGE) * PAGE, hi // PAGE * PAGE
    return (hi - lo) - max(0, last_whole - first_whole)


def growths(snapshot: dict, least: int = GIB // 4) -> list[dict]:
    """Each growth of the main segment by at least ``least`` bytes, with the segment's state just before it."""
    segment = main_segment(snapshot)
    start, end_size = segment["address"], segment["total_size"]
    inside = lambda address: start <= address < start + end_size  # noqa: E731
    trace = snapshot["device_traces"][0]
    mapped = end_size - sum(e["size"] for e in trace if e["action"] == "segment_map" and inside(e["addr"]))
    live, found = live_at_start(snapshot), []
    for i, event in enumerate(trace):
        if event["action"] == "segment_map" and inside(event["addr"]):
            blocks = sorted((a, n) for a, n in live.items() if inside(a))
            gaps, cursor = [], start
            for address, size in blocks:
                gaps.append((cursor, max(cursor, address)))
                cursor = max(cursor, address + size)
            gaps.append((cursor, start + mapped))
            sizes = [hi - lo for lo, hi in gaps]
            if event["size"] >= least:
                request = next((e["size"] for e in trace[i + 1:] if e["action"] == "alloc"), 0)
                found.append(dict(seconds=(event["time_us"] - trace[0]["time_us"]) / 1e6, grown_gib=event["size"] / GIB,
                                  request_gib=request / GIB, mapped_gib=mapped / GIB,
                                  live_gib=sum(n for _, n in blocks) / GIB, free_gib=sum(sizes) / GIB,
                                  largest_gap_gib=max(sizes) / GIB,
                                  stuck_gib=sum(stuck_bytes(lo - start, hi - start) for lo, hi in gaps) / GIB,
                                  gaps=sum(1 for n in sizes if n), end_gap_gib=sizes[-1] / GIB))
            mapped += event["size"]
        if event["action"] == "alloc":
            live[event["addr"]] = event["size"]
        elif event["action"] == "free_completed":
            live.pop(event["addr"], None)
    return found


# NCCL's INIT line for a communicator, with the epoch timestamp NCCL_DEBUG_TIMESTAMP_FORMAT='[%s.%6f] ' prepends
NCCL_INIT = re.compile(r"\[(?P<epoch>\d{9,}\.\d+)\]\s+\S+:\d+:\d+\s+\[\d+\]\s+NCCL INFO (?:ncclCommInit\w*|ncclCommSplit\w*)"
                       r"(?:\s+comm)?\s+(?P<comm>0x[0-9a-f]+)\b.*?Init (?P<stage>START|COMPLETE)")


def communicators(log_text: str) -> list[dict]:
    """Each communicator the log shows made: its address and the epoch seconds of its Init START and COMPLETE
    lines (None where the log lacks one). Lines without NCCL's timestamp are not counted: they cannot be placed."""
    found: dict[str, dict] = {}
    for match in NCCL_INIT.finditer(log_text):
        entry = found.setdefault(match["comm"], {"comm": match["comm"], "start": None, "complete": None})
        entry["start" if match["stage"] == "START" else "complete"] = float(match["epoch"])
    return sorted(found.values(), key=lambda c: c["start"] if c["start"] is not None else c["complete"])


def first_moments_alloc_us(snapshot: dict) -> tuple[int, int] | None:
    """(first, last) ``time_us`` of the allocations made under the optimizer's ``_initialize_state``: the GPU part's
    Adam moments, made in step 1's optimizer step. None where the history has none (everything offloaded)."""
    times = [e["time_us"] for e in snapshot["device_traces"][0] if e["action"] == "alloc"
             and any("_initialize_state" in frame["name"] for frame in e.get("frames", []))]
    return (times[0], times[-1]) if times else None


def order_of_events(snapshot: dict, log_text: str, least: int = GIB // 4) -> list[tuple[float, str]]:
    """(seconds from the history's first event, what happened) for the segment's growths of at least ``least``
    bytes, the GPU part's Adam moments and each communicator's creation, in time order. A communicator made before
    the history began has a negative time."""
    trace = snapshot["device_traces"][0]
    origin = trace[0]["time_us"]
    events = [(g["seconds"], f"segment grew by {g['grown_gib']:.2f} GiB for a {g['request_gib']:.2f} GiB request "
                             f"({g['free_gib']:.2f} GiB free in it, {g['stuck_gib']:.3f} of it in partial pages)")
              for g in growths(snapshot, least)]
    moments = first_moments_alloc_us(snapshot)
    if moments is not None:
        events.append(((moments[0] - origin) / 1e6, "the GPU part's Adam moments: first allocation"))
        events.append(((moments[1] - origin) / 1e6, "the GPU part's Adam moments: last allocation"))
    for c in communicators(log_text):
        for stage in ("start", "complete"):
            if c[stage] is not None:
                events.append((c[stage] - origin / 1e6, f"NCCL communicator {c['comm']}: Init {stage.upper()}"))
    return sorted(events)


def _log_beside(history: str) -> Path:
    return Path(re.sub(r"\.pickle(\.gz)?$", ".log", history))


if __name__ == "__main__":
    for path in sys.argv[1:]:
        with (gzip.open if path.endswith(".gz") else open)(path, "rb") as f:
            snapshot = pickle.load(f)
        print(path)
        for g in growths(snapshot):
            print(f"  {g['seconds']:6.2f} s: +{g['grown_gib']:.2f} GiB for a {g['request_gib']:.2f} GiB request; the "
                  f"segment held {g['mapped_gib']:.2f} mapped, {g['live_gib']:.2f} live, {g['free_gib']:.2f} free, "
                  f"largest free gap {g['largest_gap_gib']:.2f}, of it in pages shared with live blocks (stuck) "
                  f"{g['stuck_gib']:.3f}; in {g['gaps']} gaps, {g['end_gap_gib'] * 1024:.1f} MiB of it at the mapped "
                  f"end (the growth extends that one)")
        log = _log_beside(path)
        if log.exists() and communicators(log.read_text(errors="replace")):
            print("  in time order, from the history's first event:")
            for seconds, what in order_of_events(snapshot, log.read_text(errors="replace")):
                print(f"  {seconds:8.3f} s  {what}")
