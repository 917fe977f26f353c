"""Timing only, never training: with MBRIDGE_BENCH_ABLATE set in a process's environment (a comma list of adam,
gradient-copies, weight-copies), the exact and delayed engines skip those parts of their step, so that a run
shows what each part costs the step. The weights then train wrong; ablation.py runs it, next to runs without it.

Put on PYTHONPATH before the repository (ablation.py does), it is imported by every Python process at start; it
runs the interpreter's own sitecustomize, which it shadows, and patches nothing where the variable is unset. The
parts are read at each call, so one import serves every run."""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
for _entry in sys.path:  # the sitecustomize this one shadows, if any
    _candidate = os.path.join(_entry or os.getcwd(), "sitecustomize.py")
    if os.path.abspath(os.path.dirname(_candidate)) != _HERE and os.path.isfile(_candidate):
        with open(_candidate) as _file:
            exec(compile(_file.read(), _candidate, "exec"), {"__name__": "sitecustomize", "__file__": _candidate})
        break

ABLATE_ENV = "MBRIDGE_BENCH_ABLATE"
PARTS = ("adam", "gradient-copies", "weight-copies")


def _skipped(part: str) -> bool:
    return part in os.environ.get(ABLATE_ENV, "").split(",")


def _install() -> None:
    unknown = set(filter(None, os.environ.get(ABLATE_ENV, "").split(","))) - set(PARTS)
    if unknown:
        raise SystemExit(f"{ABLATE_ENV}={os.environ[ABLATE_ENV]!r}: unknown part(s) {sorted(unknown)}; "
                         f"the parts are {', '.join(PARTS)}")
    from mbridge_offload.runtime import gradient_copies, weight_copies

    library_adam, library_gradients, library_weights = (weight_copies.step_without_copy_back,
                                                         gradient_copies.copy_in_pieces, weight_copies.copy_in_pieces)
    zeroed: set = set()

    def step_without_copy_back(optimizer):
        if not _skipped("adam"):
            library_adam(optimizer)

    def gradients_in_pieces(pairs, *, tensor_done=lambda copied: None, **kwargs):
        if not _skipped("gradient-copies"):
            return library_gradients(pairs, tensor_done=tensor_done, **kwargs)
        for index, (destination, _) in enumerate(pairs):
            if destination.data_ptr() not in zeroed:  # Adam then reads zeros, not the uninitialised host buffer
                zeroed.add(destination.data_ptr())
                destination.zero_()
            tensor_done(index + 1)

    def weights_in_pieces(pairs, **kwargs):
        if not _skipped("weight-copies"):
            library_weights(pairs, **kwargs)

    weight_copies.step_without_copy_back = step_without_copy_back
    gradient_copies.copy_in_pieces = gradients_in_pieces
    weight_copies.copy_in_pieces = weights_in_pieces
    print(f"[{ABLATE_ENV}] timing only, the weights train wrong: skipping {os.environ[ABLATE_ENV]}", file=sys.stderr,
          flush=True)


if os.environ.get(ABLATE_ENV):
    try:
        _install()
    except ImportError as error:  # a process without the plugin on its path (a helper) skips nothing: said so
        print(f"[{ABLATE_ENV} not installed] {error}", file=sys.stderr, flush=True)
