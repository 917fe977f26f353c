"""Fetch-ahead's rule (mbridge_offload/runtime/fetch_ahead.py): how much the backward's hooks may fetch, from the
previous window's intervals, the run's peak and the guard. The engines and the allocator are stand-ins that count:
the rule is arithmetic on what they report (the engine's own part runs in stream_cpu_scenarios.py's fetch-ahead
scenarios; the GPU's allocator in the h200.sh phase stream-fetch-ahead, docs/benchmarks/offload-engine/
stream-fetch-ahead/)."""

from __future__ import annotations

import gc

import torch

from mbridge_offload.runtime.fetch_ahead import (GUARD_FLOOR_BYTES, MAX_POINTS, FetchAhead, Window, allowed_held,
                                                 guard_bytes)

MIB = 1024**2


class Allocator:
    """The allocator as the rule sees it: the peak of the interval since the last reading."""

    def __init__(self, run_peak: int) -> None:
        self.peak = 0
        self.run = run_peak
        self.readings = 0

    def interval_peak(self) -> int:
        self.readings += 1
        peak, self.peak = self.peak, 0
        return peak

    def run_peak(self) -> int:
        return self.run


class Engine:
    """An engine with ``chunks`` chunks after the ring's, each of ``size`` bytes."""

    def __init__(self, chunks: int, size: int) -> None:
        self.chunks, self.size = chunks, size
        self.ahead: list[int] = []  # fetched for the next update
        self.step_ahead: list[int] = []  # fetched for the update being enqueued

    def awaits_next_update(self) -> bool:
        return True

    def next_ahead_bytes(self):
        return self.size if len(self.ahead) < self.chunks else None

    def fetch_next_ahead(self) -> None:
        self.ahead.append(self.size)

    def holds_ahead(self) -> bool:
        return bool(self.ahead or self.step_ahead)

    def unqueued(self) -> bool:
        return False  # the next forward enqueues the whole update before the next backward (see _step)


def _coordinator(allocator: Allocator, *engines: Engine) -> FetchAhead:
    coordinator = FetchAhead(memory=allocator)
    for engine in engines:
        coordinator.add(engine, [], minimum_numel=1)
    return coordinator


def _step(coordinator: FetchAhead, allocator: Allocator, engines: list[Engine], bases: list[int],
          forward: int = 0) -> list[int]:
    """One step: a backward hook per interval base in ``bases`` (the base is the allocator's peak of the interval
    that hook opens, the buffers held then added), the optimizer's step, and the next forward, which moves every
    buffer into its ring slot and then, its allocator's peak ``forward`` plus what is still held, enqueues the
    update's last chunk. The bytes held after each hook."""
    held_after = []
    for base in bases:
        coordinator.on_backward_hook()
        held_after.append(coordinator.held)
        allocator.peak = base + coordinator.held
    for engine in engines:
        engine.step_ahead, engine.ahead = engine.ahead, []
    for engine in engines:
        while engine.step_ahead:
            coordinator.released(engine.step_ahead.pop())
    allocator.peak = max(allocator.peak, forward + coordinator.held)
    coordinator.update_enqueued()
    return held_after


def test_nothing_is_fetched_until_a_step_after_the_first_has_been_measured():
    allocator = Allocator(run_peak=1000 * MIB)
    engine = Engine(chunks=8, size=50 * MIB)
    coordinator = _coordinator(allocator, engine)
    bases = [900 * MIB, 700 * MIB, 500 * MIB, 300 * MIB, 200 * MIB]
    assert _step(coordinator, allocator, [engine], bases) == [0] * 5  # step 1: the GPU's own Adam states are new
    assert _step(coordinator, allocator, [engine], bases) == [0] * 5  # step 2: measured, read by step 3
    held = _step(coordinator, allocator, [engine], bases)
    assert held[0] == 0  # no interval of this step compared yet
    # from hook h on, the buffers fit under the run's peak less the guard less the previous step's later bases
    for hook in range(1, 5):
        limit = 1000 * MIB - GUARD_FLOOR_BYTES - max(bases[hook:])
        assert held[hook] <= limit
        assert held[hook] > limit - 50 * MIB or held[hook] == 8 * 50 * MIB  # as many chunks as fit, or all of them
    assert coordinator.fetched == held[-1] // (50 * MIB) > 0
    assert coordinator.held == 0 and coordinator.current is None  # the next forward released them all


def test_a_step_whose_intervals_rise_widens_the_guard_and_fetches_less():
    allocator = Allocator(run_peak=1000 * MIB)
    engine = Engine(chunks=20, size=10 * MIB)
    coordinator = _coordinator(allocator, engine)
    steady = [900 * MIB, 600 * MIB, 400 * MIB, 300 * MIB]
    for _ in range(2):
        _step(coordinator, allocator, [engine], steady)
    calm = _step(coordinator, allocator, [engine], steady)
    # a step whose first interval is 150 MiB higher than the one before (a MoE layer's experts got more tokens)
    risen = _step(coordinator, allocator, [engine], [1050 * MIB, *steady[1:]])
    assert coordinator.largest_change >= 150 * MIB
    assert risen[1] < calm[1] and risen[1] <= 1000 * MIB - 2 * 150 * MIB - max(steady[1:])


def test_a_load_voids_the_windows():
    allocator = Allocator(run_peak=1000 * MIB)
    engine = Engine(chunks=4, size=10 * MIB)
    coordinator = _coordinator(allocator, engine)
    bases = [900 * MIB, 500 * MIB, 200 * MIB]
    for _ in range(2):
        _step(coordinator, allocator, [engine], bases)
    coordinator.on_backward_hook()
    allocator.peak = bases[0]
    coordinator.on_backward_hook()
    assert coordinator.held > 0
    coordinator.dropped(coordinator.held)  # the engine gave its buffers up: a checkpoint load came
    engine.ahead = []
    assert coordinator.previous is None and coordinator.current is None and coordinator.windows == 0


def test_two_engines_take_turns_within_one_room():
    allocator = Allocator(run_peak=1000 * MIB)
    dense, experts = Engine(chunks=10, size=30 * MIB), Engine(chunks=10, size=30 * MIB)
    coordinator = _coordinator(allocator, dense, experts)
    bases = [950 * MIB, 700 * MIB, 700 * MIB]
    for _ in range(2):
        _step(coordinator, allocator, [dense, experts], bases)
    coordinator.on_backward_hook()
    allocator.peak = bases[0]
    coordinator.on_backward_hook()
    room = 1000 * MIB - GUARD_FLOOR_BYTES - 700 * MIB
    assert coordinator.held == (room // (30 * MIB)) * 30 * MIB  # the two engines share one room
    assert abs(len(dense.ahead) - len(experts.ahead)) <= 1  # in turns


def test_the_rule_on_numbers():
    previous = Window(bases=[90, 60, 40, 70], hooks=3)
    assert allowed_held(previous, 1, run_peak=100, guard=5) == 100 - 5 - 70  # the tail's interval counts too
    assert allowed_held(previous, 4, run_peak=100, guard=5) == 0
    assert allowed_held(previous, 0, run_peak=80, guard=5) == 0  # never negative
    assert guard_bytes(100 * MIB) == 200 * MIB
    assert guard_bytes(0) == GUARD_FLOOR_BYTES


def test_the_next_forward_counts_before_the_buffers_are_released_even_in_a_window_that_held_none():
    """A step's buffers are held into the next forward, whose activations grow until the update's last chunk is
    enqueued (at fraction < 1 the offloaded modules are the forward's last). The window measured by the step before
    must cover that stretch even when that step held no buffer, or the next step fetches as if the forward were
    free."""
    allocator = Allocator(run_peak=1000 * MIB)
    engine = Engine(chunks=20, size=10 * MIB)
    coordinator = _coordinator(allocator, engine)
    bases = [900 * MIB, 700 * MIB, 500 * MIB, 300 * MIB]
    forward = 980 * MIB  # the next forward's peak before the update's last chunk is enqueued
    for _ in range(2):
        assert _step(coordinator, allocator, [engine], bases, forward=forward) == [0] * 4
    assert coordinator.previous.bases[-1] == forward  # the window reaches into the next forward
    # step 3: the forward after it leaves no room, at any hook
    assert _step(coordinator, allocator, [engine], bases, forward=forward) == [0] * 4
    # a forward with room lets the later hooks fetch, below it
    _step(coordinator, allocator, [engine], bases, forward=600 * MIB)
    held = _step(coordinator, allocator, [engine], bases, forward=600 * MIB)
    assert held[0] == 0 and held[-1] > 0
    for hook in range(1, 4):
        assert held[hook] + max(*bases[hook:], 600 * MIB) <= 1000 * MIB - GUARD_FLOOR_BYTES


def test_a_backward_of_thousands_of_hooks_reads_the_allocator_at_most_max_points_times_a_window():
    """A MoE's backward has a hook per expert weight and micro batch: each point reads and resets the allocator's
    peak, so a window keeps to MAX_POINTS points (every stride-th hook), and the rule still fetches at them."""
    allocator = Allocator(run_peak=1000 * MIB)
    engine = Engine(chunks=40, size=10 * MIB)
    coordinator = _coordinator(allocator, engine)
    hooks = 20 * MAX_POINTS
    bases = [900 * MIB - i * (600 * MIB // hooks) for i in range(hooks)]  # the backward frees as it goes
    readings = []
    for _ in range(3):
        before, fetched = allocator.readings, coordinator.fetched
        held = _step(coordinator, allocator, [engine], bases)
        releases = coordinator.fetched - fetched  # each release closes an interval too
        readings.append(allocator.readings - before - releases)
    assert readings[0] == hooks + 1  # the first window: a point at every hook (its hook count is not known yet)
    assert all(r <= MAX_POINTS + 1 for r in readings[1:]), readings  # the points and the window's end
    assert coordinator.previous.raw_hooks == hooks and coordinator.previous.stride == 20
    assert 0 < held[-1] <= 1000 * MIB - GUARD_FLOOR_BYTES - bases[-1]


def test_a_rebuilt_model_gets_the_hooks_and_a_dropped_engine_is_forgotten():
    """An in-process restart builds a new model and new engines: the new model's parameters get the hook, and the
    old engine (with its ring) is not kept alive or asked for chunks."""
    allocator = Allocator(run_peak=1000 * MIB)
    coordinator = FetchAhead(memory=allocator)
    old_model, old_engine = torch.nn.Linear(4, 4), Engine(chunks=4, size=MIB)
    coordinator.add(old_engine, [old_model], minimum_numel=1)
    del old_engine
    gc.collect()
    model, engine = torch.nn.Linear(4, 4), Engine(chunks=4, size=MIB)
    coordinator.add(engine, [model], minimum_numel=1)
    assert coordinator.engines == [engine]
    model(torch.ones(2, 4)).sum().backward()
    assert coordinator.current is not None and coordinator.current.raw_hooks == 2  # weight and bias
