"""The test suite runs with the disk tier of the compilation cache off, so
that compile counts do not depend on earlier runs (tests/test_disk_cache.py
turns it on in child processes, each with its own folder)."""

import os

os.environ.setdefault("TORCHTPU_CACHE_DIR", "")

# TORCHTPU_TEST_DEVICE=i (with TORCHTPU_NUM_DEVICES > i) runs the tests on
# tpu:i: it becomes the current device, which every tensor made on "tpu"
# without an index goes to (tests/test_other_device.py runs the device tests
# so on tpu:1).
_index = os.environ.get("TORCHTPU_TEST_DEVICE", "")
if _index:
    import torch

    import torchtpu  # noqa: F401

    torch.tpu.set_device(int(_index))
