"""The engine's files as a stack: no call circle inside csrc/engine/.

Reads csrc/engine/*.c (comments and strings stripped), maps each function
definition to its file, and finds each file's uses (calls, pointers passed) of
functions another file defines, and its #includes of sibling headers, its own
header's too (x.h is x.c's header; engine.h, the public API every part
implements, and engine_impl.h, the composition of every part's state, belong
to no one file). A circle is a strongly connected component of more than one
file: named, exit 1. Otherwise prints the layers, bottom first, each file
using only files on the layers below it.

Usage: engine_graph.py [DIR] (default csrc/engine)."""

import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
SHARED = {"engine.h", "engine_impl.h"}
KEYWORDS = {"if", "for", "while", "switch", "return", "sizeof", "do", "else", "case"}

COMMENT_OR_STRING = re.compile(r'/\*.*?\*/|//[^\n]*|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', re.S)
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
# a definition: a name and its parameters at the start of a line (after its
# return type), then a body; a use: any name (a call, or a function passed as a
# pointer)
DEFINITION = re.compile(
    r"^[A-Za-z_][\w \t\*]*?\b([A-Za-z_]\w*)\s*\([^;{}]*\)\s*(?:__attribute__\(\(.*?\)\)\s*)?\{", re.M
)
NAME = re.compile(r"\b[A-Za-z_]\w*\b")


def strip(text):
    """The text without comments and string or character literals (newlines kept), and the
    sibling headers it includes (outside comments)."""

    def drop(kind):
        return lambda m: m.group(0) if m.group(0)[0] not in kind else "\n" * m.group(0).count("\n")

    code = COMMENT_OR_STRING.sub(drop("/"), text)
    return COMMENT_OR_STRING.sub(drop("\"'"), code), INCLUDE.findall(code)


def graph(folder):
    """{file: set of files it depends on} for the .c files of folder."""
    sources = {p.stem: strip(p.read_text()) for p in sorted(pathlib.Path(folder).glob("*.c"))}
    for h in sorted(pathlib.Path(folder).glob("*.h")):  # x.h's #includes are x.c's
        if h.stem in sources and h.name not in SHARED:
            sources[h.stem][1].extend(strip(h.read_text())[1])
    defined = {name: {m.group(1) for m in DEFINITION.finditer(bare)} - KEYWORDS for name, (bare, _) in sources.items()}
    owner = {f: name for name, fns in defined.items() for f in fns}
    edges = {name: set() for name in sources}
    for name, (bare, includes) in sources.items():
        for used in set(NAME.findall(bare)) - defined[name]:  # a file's own statics shadow others'
            if used in owner:
                edges[name].add(owner[used])
        for inc in includes:
            header = pathlib.PurePosixPath(inc)
            if header.name not in SHARED and header.suffix == ".h" and header.parent == pathlib.PurePosixPath("."):
                if header.stem in sources and header.stem != name:
                    edges[name].add(header.stem)
    return edges


def circles(edges):
    """The strongly connected components of more than one file (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def layers(edges):
    """Files by layer: a file's layer is one above the highest it depends on."""
    level = {}

    def depth(v):
        if v not in level:
            level[v] = 1 + max((depth(w) for w in edges[v]), default=-1)
        return level[v]

    rows = {}
    for v in edges:
        rows.setdefault(depth(v), []).append(v)
    return [sorted(rows[k]) for k in sorted(rows)]


def main(argv):
    folder = pathlib.Path(argv[1]) if len(argv) > 1 else ROOT / "csrc" / "engine"
    edges = graph(folder)
    bad = circles(edges)
    for comp in bad:
        inside = [f"{a} -> {b}" for a in comp for b in sorted(edges[a]) if b in comp]
        print(f"{folder}: a call circle between {', '.join(f + '.c' for f in comp)} ({'; '.join(inside)})")
    if bad:
        return 1
    for k, row in enumerate(layers(edges)):
        below = sorted({w for v in row for w in edges[v]})
        print(f"layer {k}: {' '.join(row)}" + (f"  (uses {' '.join(below)})" if below else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
