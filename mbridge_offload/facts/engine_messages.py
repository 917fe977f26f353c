"""What the plugin's offload engine raises or prints at run time, word for word: the engine
(mbridge_offload/runtime/streaming_engine.py, streamed_states.py) formats these with ``str.format``, and the
rule table's diagnose-only rules (mbridge_offload/validation/runtime_failures.py, ENGINE_MESSAGES) build their log
signatures from them, so diagnose.py reads back exactly what the engine printed. The words after ``Fix: `` are the
fix diagnose.py gives.
"""

from __future__ import annotations

from mbridge_offload.facts import offload_engine

# --- streaming_engine.py ------------------------------------------------------------------------------------------
# The worker's or a copy thread's error (job.error, copies.error), raised on the training thread at the next point
# that waits for that thread;
# ``kind`` is the error's class name, ``error`` its text (raised ``from`` it, so its own traceback comes first).
CPU_STEP_FAILED = "the streaming offload engine's CPU optimizer step failed: {kind}: {error}"
# ``thread``: one of offload_engine.ENGINE_THREADS; ``what``: "the offloaded optimizer step", "the update of chunk N", "the
# gradients' copy of chunk N", ...
WORKER_STOPPED = "the streaming offload engine's {thread} thread stopped while waiting for {what}"
DELAYED_FP32_WEIGHTS = ("the delayed offload engine cannot run with {count} offloaded parameter(s) kept in fp32 in "
                        "the model: their fp32 copy is the live weight, which the delayed update would overwrite "
                        "during the next step. Fix: ++env_vars.MBRIDGE_OFFLOAD_ENGINE=exact (or library), or bf16 "
                        "model parameters")
STREAM_OUTSIDE_DISTRIBUTED_OPTIMIZER = (
    "the stream offload engine runs inside Megatron's distributed optimizer; this offloaded optimizer was built "
    "outside one. Fix: ddp.use_distributed_optimizer=True optimizer.use_distributed_optimizer=True, or "
    "++env_vars.MBRIDGE_OFFLOAD_ENGINE=library")
# a ValueError of install(); ``mode`` is formatted with repr, ``modes`` the known ones joined by ", "
UNKNOWN_ENGINE = "unknown offload engine {mode!r}; one of {modes}"

# --- streamed_states.py (the stream mode) -------------------------------------------------------------------------
STREAM_NOT_FP32 = ("the stream offload engine keeps fp32 main weights on the host; this optimizer steps {dtypes} "
                   "ones. Fix: optimizer.use_precision_aware_optimizer=False, or "
                   "++env_vars.MBRIDGE_OFFLOAD_ENGINE=library")
STREAM_MOMENTS_UNKNOWN = (f"{offload_engine.STREAM_MOMENTS_ENV}={{value!r}}: the stream offload engine keeps Adam's "
                          f"moments in one of {{values}}. Fix: {offload_engine.STREAM_MOMENTS_KNOWN_FIX}")
STREAM_PIN_FAILED = ("the stream offload engine could not pin {gib:.2f} GiB of host memory (cudaHostRegister "
                     "returned {status}): the locked-memory limit (ulimit -l) or the host's free memory is too small. "
                     "Fix: raise ulimit -l, or ++env_vars.MBRIDGE_OFFLOAD_ENGINE=library")
STREAM_NO_HOST_EMPTY_CACHE = ("WARNING: this torch has no torch._C._host_emptyCache: the library's pinned weight "
                              "copies that the stream engine replaced stay cached by torch (host memory above its "
                              "plan)")
STREAM_FUSED_ADAM_IMPORT = ("the stream offload engine runs Transformer Engine's FusedAdam (the GPU optimizer without "
                            "offload), which does not import here. Fix: ++env_vars.MBRIDGE_OFFLOAD_ENGINE=exact")
STREAM_NOT_FUSED_ADAM = ("the stream offload engine runs Transformer Engine's FusedAdam, the GPU optimizer without "
                         "offload; this run's is {optimizer} (only optimizer.optimizer=adam is supported). Fix: "
                         "optimizer.optimizer=adam, or ++env_vars.MBRIDGE_OFFLOAD_ENGINE=exact")
STREAM_NOT_MAIN_WEIGHTS = ("the stream offload engine found {count} offloaded tensor(s) that are not main weights of "
                           "the distributed optimizer. Fix: ++env_vars.MBRIDGE_OFFLOAD_ENGINE=library")
STREAM_STEP_COUNTS = ("the offloaded optimizer states hold different step counts {steps}: the checkpoint is "
                      "inconsistent")
