"""Installs a built wheel into a fresh virtual environment with the tested
torch and runs the README's quick start there, from an empty folder (not the
checkout): it must print its result, leave stderr empty, and `import torch`
must stay intact. `make wheel-check` runs it on the wheel `make wheel` made.

Usage: python tools/wheel_check.py dist/torchtpu-*.whl"""

import os
import subprocess
import sys
import tempfile

TORCH = "torch==2.13.0"  # the Makefile's pin: an unpinned torch is the CUDA build

QUICK_START = """
import torch  # torchtpu is autoloaded through torch's "torch.backends" entry point

x = torch.randn(64, 64, device="tpu")
w = torch.randn(64, 10).to("tpu")
print((x @ w).relu().sum().item())
print(torch.tpu.get_device_name())
"""


def run(cmd, **kw):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=1200, **kw)
    if p.returncode != 0:
        sys.exit(f"failed ({p.returncode}): {' '.join(cmd)}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return p


def main():
    if len(sys.argv) != 2 or not sys.argv[1].endswith(".whl"):
        sys.exit(__doc__)
    wheel = os.path.abspath(sys.argv[1])
    with tempfile.TemporaryDirectory() as tmp:
        venv = os.path.join(tmp, "venv")
        run([sys.executable, "-m", "venv", venv])
        py = os.path.join(venv, "bin", "python")
        run([py, "-m", "pip", "install", "--quiet", TORCH, wheel])
        run([py, "-m", "pip", "check"])
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHTPU_", "PYTHON"))}
        plain = run([py, "-c", "import torch; print(torch.__version__, torch.ones(3).sum().item())"], cwd=tmp, env=env)
        quick = run([py, "-c", QUICK_START], cwd=tmp, env=env)
        lines = quick.stdout.split()
        if quick.stderr:
            sys.exit(f"the quick start wrote to stderr:\n{quick.stderr}")
        if "XLA CPU" not in quick.stdout or not lines:
            sys.exit(f"the quick start printed no result:\n{quick.stdout}")
        where = run([py, "-c", "import torchtpu, os; print(os.path.dirname(torchtpu.__file__))"], cwd=tmp, env=env)
        if not where.stdout.strip().startswith(venv):
            sys.exit(f"torchtpu was imported from {where.stdout.strip()}, not from the wheel's install")
        print(
            f"wheel ok: {os.path.basename(wheel)}; import torch {plain.stdout.strip()}; quick start: "
            f"{' '.join(quick.stdout.split())}; stderr empty"
        )


if __name__ == "__main__":
    main()
