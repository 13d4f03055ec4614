"""The op table's shelves: csrc/lower/ops.def only includes ops_<family>.def
files, and the emitter of every row of ops_<family>.def is defined in
emit_<family>.c, so that a row's emitter is found by the row's file.
Exits 1, naming each row whose emitter is elsewhere (or nowhere)."""

import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
LOWER = ROOT / "csrc" / "lower"
ROW = re.compile(r'^TPU_OP\(\w+, "[^"]*", (\w+),')
INCLUDE = re.compile(r'^#include "(ops_(\w+)\.def)"')
# emitters defined one per line, or by emit_elementwise.c's TPU_CHLO_UNARY(op, name)
DEFINED = re.compile(r"^void (tpu_emit_\w+)\(tpu_lower \*L\) ?\{|^TPU_CHLO_UNARY\((\w+),", re.M)


def emitters(path):
    if not path.exists():
        return set()
    return {a or "tpu_emit_" + b for a, b in DEFINED.findall(path.read_text())}


def misplaced(lower=LOWER):
    bad = []
    for n, line in enumerate((lower / "ops.def").read_text().splitlines(), 1):
        if ROW.match(line.strip()):
            bad.append(f"ops.def:{n}: a row in ops.def itself (it only includes ops_<family>.def files)")
    for line in (lower / "ops.def").read_text().splitlines():
        m = INCLUDE.match(line.strip())
        if not m:
            continue
        table, family = m.groups()
        defined = emitters(lower / f"emit_{family}.c")
        for n, row in enumerate((lower / table).read_text().splitlines(), 1):
            r = ROW.match(row.strip())
            if r and r.group(1) not in defined:
                bad.append(f"{table}:{n}: {r.group(1)} is not defined in emit_{family}.c")
    return bad


def main():
    bad = misplaced()
    for b in bad:
        print(b)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
