"""The long differential sweeps: the fuzzer (fuzz.py) and PyTorch's OpInfo
database (op_coverage.py). They are test code, kept out of the package; run
them from the repository root as `python -m tests.sweeps.fuzz` and
`python -m tests.sweeps.op_coverage` (or `make fuzz`, `make coverage`).
Short fixed runs of both are in `make test` (tests/test_fuzz.py,
tests/test_op_coverage.py)."""

import os
import pathlib
import sys

# The folder sys.path needs for this package to import under the name it was
# imported as here ("tests.sweeps" from the repository root, "sweeps" under
# pytest, which puts tests/ on the path).
_ROOT = pathlib.Path(__file__).resolve().parents[__name__.count(".") + 1]


def worker_command(module):
    """The command line of a worker process running this package's `module`."""
    return [sys.executable, "-m", f"{__name__}.{module}", "--worker"]


def worker_env(env=None):
    """env (default: this process's) with this package importable."""
    env = dict(os.environ if env is None else env)
    path = env.get("PYTHONPATH")
    env["PYTHONPATH"] = str(_ROOT) + (os.pathsep + path if path else "")
    return env
