"""The house rules that are checked by a tool, checked that they can fail: the engine's files
(csrc/engine/) form a stack with no call circle (tools/engine_graph.py). Reads files only
(no torch)."""

import os
import subprocess
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
TOOL = os.path.join(ROOT, "tools", "engine_graph.py")


def run(folder=None):
    args = [sys.executable, TOOL] + ([str(folder)] if folder else [])
    return subprocess.run(args, capture_output=True, text=True, timeout=60)


def test_the_engine_is_a_stack():
    r = run()
    assert r.returncode == 0, r.stdout + r.stderr
    layers = [line.split(":")[1].split("(")[0].split() for line in r.stdout.splitlines()]
    assert layers[-1] == ["engine"]  # the facade, on top
    assert "msgs" in layers[0] and "record" in layers[0]


def test_a_call_circle_is_reported(tmp_path):
    (tmp_path / "low.c").write_text(
        '#include "low.h"\n/* high_fn( in a comment is no call */\n'
        'int low_fn(int x) {\n  return x ? high_fn(x - 1) : 0; /* the circle */\n}\n'
    )
    (tmp_path / "high.c").write_text(
        '#include "low.h"\nstatic const char *s = "low_fn(";\n\nint high_fn(int x) {\n  return low_fn(x);\n}\n'
    )
    (tmp_path / "top.c").write_text("int top_fn(void) {\n  return high_fn(2);\n}\n")
    r = run(tmp_path)
    assert r.returncode == 1
    assert "high.c, low.c" in r.stdout and "top.c" not in r.stdout, r.stdout


def test_an_include_closes_a_circle_and_comments_and_strings_do_not(tmp_path):
    (tmp_path / "low.c").write_text('#include "high.h"\n/* high_fn() */\nint low_fn(void) {\n  return 1;\n}\n')
    (tmp_path / "high.c").write_text('int high_fn(void) {\n  return low_fn() + (int)sizeof "high_fn()";\n}\n')
    assert run(tmp_path).returncode == 1
    (tmp_path / "low.c").write_text(
        '/* high_fn()\n#include "high.h" */\nint low_fn(void) {\n  return (int)sizeof "high_fn()";\n}\n'
    )
    r = run(tmp_path)
    assert r.returncode == 0, r.stdout
    assert r.stdout.splitlines() == ["layer 0: low", "layer 1: high  (uses low)"]
