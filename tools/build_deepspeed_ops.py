"""Build DeepSpeed's CPU communication op once, before any test launches DeepSpeed.

DeepSpeed compiles it (ninja, g++) the first time a process initialises its communication on the CPU. Built
here, the test processes only load it: two ranks never race to compile it, and a run killed in a test never
interrupts a build. The build's lock file is removed afterwards: older torch releases treat an existing
lock file as a build in progress and wait for it forever.
"""

from __future__ import annotations

import glob
import os

from deepspeed.accelerator import get_accelerator
from torch.utils.cpp_extension import get_default_build_root

BUILDER = "ShareMemCommBuilder"  # deepspeed.comm's CPU op (deepspeed_shm_comm)


def main() -> None:
    get_accelerator().create_op_builder(BUILDER).load(verbose=False)
    root = os.environ.get("TORCH_EXTENSIONS_DIR", get_default_build_root())
    for lock in glob.glob(os.path.join(root, "**", "deepspeed_shm_comm", "lock"), recursive=True):
        os.remove(lock)
    print(f"DeepSpeed CPU communication op ready under {root}")


if __name__ == "__main__":
    main()
