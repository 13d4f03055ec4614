"""The line budget of the sources: no file may pass 1,000 lines, save the
emitters csrc/lower/emit_*.c, held to 2,000 (emitters are bags of independent
functions; everything else past 1,000 lines holds more than one concern and
is split by concern). Covered: the C and C++ of the core and its extension
(csrc/**/*.c, *.h, *.cpp, *.hpp) and the Python of the package and its
tools, benchmarks, examples and the long sweeps (torchtpu/**/*.py, tools/*.py,
bench/*.py, examples/**/*.py, tests/sweeps/*.py); not the tests themselves.

It also holds the package's Python to under PYTHON_SHARE of the package plus
the C core (torchtpu/**/*.py against csrc/**: .c, .h, .cpp, .hpp, .def): the
math, the graphs and the runtime live in C, Python only registers the device.
Exits 1, naming each file over its budget, or the share."""

import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
BUDGET = 1000
EMITTER_BUDGET = 2000
C_SUFFIXES = (".c", ".h", ".cpp", ".hpp")
# (folder, glob) of the Python held to the budget
PYTHON = (
    ("torchtpu", "**/*.py"),
    ("tools", "*.py"),
    ("bench", "*.py"),
    ("examples", "**/*.py"),
    ("tests/sweeps", "*.py"),
)
PYTHON_SHARE = 0.18
CORE_SUFFIXES = C_SUFFIXES + (".def",)


def budgeted(root=ROOT):
    """Every file the budget covers, sorted."""
    files = {p for p in (root / "csrc").rglob("*") if p.suffix in C_SUFFIXES and p.is_file()}
    for folder, pattern in PYTHON:
        files.update(p for p in (root / folder).glob(pattern) if p.is_file())
    return sorted(files)


def limit(path):
    emitter = path.parent.name == "lower" and path.name.startswith("emit_") and path.suffix == ".c"
    return EMITTER_BUDGET if emitter else BUDGET


def over_budget(root=ROOT):
    bad = []
    for path in budgeted(root):
        n = len(path.read_text().splitlines())
        if n > limit(path):
            bad.append((path.relative_to(root), n, limit(path)))
    return bad


def _lines(paths):
    return sum(len(p.read_text().splitlines()) for p in paths if p.is_file())


def python_share(root=ROOT):
    """(package Python lines, C core lines, Python's share of both)."""
    py = _lines((root / "torchtpu").rglob("*.py"))
    core = _lines(p for p in (root / "csrc").rglob("*") if p.suffix in CORE_SUFFIXES)
    return py, core, py / max(1, py + core)


def main():
    bad = over_budget()
    for path, n, lim in bad:
        print(f"{path}: {n} lines, over its budget of {lim}")
    py, core, share = python_share()
    if share >= PYTHON_SHARE:
        print(f"torchtpu/ is {py} lines of Python against {core} of C core: {share:.1%}, over {PYTHON_SHARE:.0%}")
        bad.append(("share", share, PYTHON_SHARE))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
