"""What each rank runs when run_recipe relaunches itself under torchrun (``--num-gpus N`` outside a
launcher): ``python -m torch.distributed.run ... -m mbridge_offload.runtime.rank_entry RUN_DIR/prepared_run.pkl``.

The file holds the config that run_recipe prepared and validated once, before the relaunch, and its
launch settings (mbridge_offload/runtime/launch.py, ``write_handoff``); each rank trains it as one
process would, without building, overriding, validating or planning it again.
"""

from __future__ import annotations

import sys
from pathlib import Path

from mbridge_offload.facts.import_notices import quiet_import_notices
from mbridge_offload.runtime.launch import HANDOFF_FILE, RANK_ENTRY, read_handoff, train


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print(f"usage: python -m {RANK_ENTRY} RUN_DIR/{HANDOFF_FILE} (started by run_recipe under torchrun)",
              file=sys.stderr)
        return 2
    quiet_import_notices()  # loading the config imports Megatron
    cfg, settings = read_handoff(Path(args[0]))
    return train(cfg, settings)


if __name__ == "__main__":
    sys.exit(main())
