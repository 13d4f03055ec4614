"""The long differential sweeps: the fuzzer (fuzz.py) and PyTorch's OpInfo
database (op_coverage.py). They are test code, kept out of the package; run
them from the repository root as `python -m tests.sweeps.fuzz` and
`python -m tests.sweeps.op_coverage` (or `make fuzz`, `make coverage`).
Short fixed runs of both are in `make test` (tests/test_fuzz.py,
tests/test_op_coverage.py)."""

import os
import pathlib
import subprocess
import sys

# The folder sys.path needs for this package to import under the name it was
# imported as here ("tests.sweeps" from the repository root, "sweeps" under
# pytest, which puts tests/ on the path).
_ROOT = pathlib.Path(__file__).resolve().parents[__name__.count(".") + 1]


def start_worker(module, env=None):
    """A worker process running this package's `module` with --worker, its
    stdin and stdout text pipes (stderr dropped), env (default: this
    process's) with this package importable."""
    env = dict(os.environ if env is None else env)
    path = env.get("PYTHONPATH")
    env["PYTHONPATH"] = str(_ROOT) + (os.pathsep + path if path else "")
    return subprocess.Popen(
        [sys.executable, "-m", f"{__name__}.{module}", "--worker"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
