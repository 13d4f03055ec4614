"""The line budget of the C core: no C file outside csrc/lower/emit_*.c may pass
1,000 lines, no emitter file 2,000 (emitters are bags of independent
functions; everything else past 1,000 lines holds more than one concern).
Exits 1, naming each file over its budget."""

import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
BUDGET = 1000
EMITTER_BUDGET = 2000


def over_budget(root=ROOT):
    bad = []
    for path in sorted((root / "csrc").rglob("*")):
        if path.suffix not in (".c", ".h"):
            continue
        emitter = path.parent.name == "lower" and path.name.startswith("emit_") and path.suffix == ".c"
        limit = EMITTER_BUDGET if emitter else BUDGET
        n = len(path.read_text().splitlines())
        if n > limit:
            bad.append((path.relative_to(root), n, limit))
    return bad


def main():
    bad = over_budget()
    for path, n, limit in bad:
        print(f"{path}: {n} lines, over its budget of {limit}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
