"""CPU optimizer threads per local rank: torchrun's 1-thread default replaced, the user's choice kept."""

from __future__ import annotations

import pytest

from mbridge_offload.runtime.cpu_threads import USER_OMP_ENV, parse_request, plan_threads, user_omp_num_threads

CORES = list(range(16))
TORCHRUN_8 = {"TORCHELASTIC_RUN_ID": "x", "LOCAL_WORLD_SIZE": "8", "OMP_NUM_THREADS": "1"}


def test_auto_gives_each_rank_its_share_and_its_own_cores():
    plans = [plan_threads("auto", TORCHRUN_8, CORES, rank, 8) for rank in range(8)]
    assert {p.threads for p in plans} == {2}
    assert [p.cores for p in plans][:2] == [(0, 1), (2, 3)]
    assert len({c for p in plans for c in p.cores}) == 16  # disjoint, all cores used


def test_single_rank_uses_every_core():
    plan = plan_threads("auto", {}, CORES, 0, 1)
    assert plan.threads == 16 and plan.cores == ()


def test_the_users_omp_num_threads_wins():
    assert plan_threads("auto", {"OMP_NUM_THREADS": "4"}, CORES, 0, 1).threads == 4
    # run_recipe records the user's value before spawning torchrun (which would set 1):
    assert plan_threads("auto", {**TORCHRUN_8, USER_OMP_ENV: "3"}, CORES, 0, 8).threads == 3
    assert user_omp_num_threads({**TORCHRUN_8, USER_OMP_ENV: ""}) is None
    assert user_omp_num_threads(TORCHRUN_8) is None  # torchrun's own default, not a user choice


def test_explicit_and_launcher_requests():
    assert plan_threads(6, TORCHRUN_8, CORES, 0, 8).threads == 6
    assert plan_threads("launcher", TORCHRUN_8, CORES, 0, 8).threads is None
    assert parse_request("auto") == "auto" and parse_request("12") == 12
    for bad in ("0", "many", "-2"):
        with pytest.raises(ValueError):
            parse_request(bad)
