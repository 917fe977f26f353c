"""The delayed engine with its gradient copies handed to the copy thread at the next step's gradient zeroing
(MBRIDGE_OFFLOAD_DELAYED_COPY_START=next-step, docs/design/streaming-offload-engine.md section 16), on the CPU.

stream_cpu_check.py delayed-next-step and delayed-next-step-by-region run delayed-ranks' and delayed-by-region's
scenarios (tests/runtime/test_delayed_ranks.py, test_zero_by_region.py: Megatron Core's real DistributedDataParallel
and distributed optimizer on 2-4 gloo ranks, the plugin's engine and its threads) with the setting on. Each step must
leave its copies unhanded (check ``copies-at-next-step``), and every forward's weights, every state, the saves' drains,
the resumes, the experts, the pipeline stages and the skipped steps must come out as without it: a path that waits for
the copies without handing them over first would hang there (the scenarios' time limit), and one that handed them over
before the gradients are final would change the update. The stand-in checks after each zero_grad_buffer that no
copies are still kept (the non-region kind would pass without that hand-over: the first forward's end hands them
over too). The broken variants stay caught, delayed-by-region's backward without its region waits too: with that
break the slow copy thread issues a region's memsets only after the backward reached the region, so the write they
should have preceded comes first however fast the copies run ahead of this small model's backward.
"""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("kind", ["delayed-next-step", "delayed-next-step-by-region"])
def test_copies_started_at_the_next_step_keep_every_delayed_scenario(stream_scenarios, kind):
    stream_scenarios.assert_all_ok(kind)
    # the setting reached the scenarios (this process does not import them: they install the CPU stand-in)
    assert "the delayed engine's gradient copies: handed over at the next step's zeroing" in \
        stream_scenarios.run(kind).stdout


def test_the_engine_refuses_copies_at_the_next_step_for_another_mode():
    import re

    from mbridge_offload.runtime.streaming_engine import install

    refusal = ("MBRIDGE_OFFLOAD_DELAYED_COPY_START=next-step is the delayed engine's (this run's: exact). "
               "Fix: ++env_vars.MBRIDGE_OFFLOAD_DELAYED_COPY_START=step")
    with pytest.raises(ValueError, match=re.escape(refusal)):
        install("exact", copies_at_next_step=True)
