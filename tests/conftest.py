"""The test suite runs with the disk tier of the compilation cache off, so
that compile counts do not depend on earlier runs (tests/test_disk_cache.py
turns it on in child processes, each with its own folder)."""

import os

os.environ.setdefault("TORCHTPU_CACHE_DIR", "")
