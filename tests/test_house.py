"""The house rules that are checked by a tool, checked that they can fail: the engine's files
(csrc/engine/) form a stack with no call circle (tools/engine_graph.py); no file past its line
budget and the package's Python a small share of the code (tools/line_budget.py). Reads files only
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


def _line_budget():
    import importlib.util

    spec = importlib.util.spec_from_file_location("line_budget", os.path.join(ROOT, "tools", "line_budget.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_package_python_share_is_counted_and_can_fail(tmp_path):
    lb = _line_budget()
    py, core, share = lb.python_share()
    assert py > 0 and core > 0 and share < lb.PYTHON_SHARE, (py, core, share)
    # a synthetic tree: 30 lines of Python against 70 of C (a .def counts as core)
    (tmp_path / "torchtpu" / "sub").mkdir(parents=True)
    (tmp_path / "csrc").mkdir()
    (tmp_path / "torchtpu" / "sub" / "a.py").write_text("x = 1\n" * 30)
    (tmp_path / "csrc" / "a.c").write_text("int x;\n" * 50)
    (tmp_path / "csrc" / "ops.def").write_text("ROW(x)\n" * 20)
    (tmp_path / "csrc" / "notes.md").write_text("not code\n" * 99)
    assert lb.python_share(tmp_path) == (30, 70, 0.3)
    # a file over its budget is named; the sweeps under tests/ are held to it too
    (tmp_path / "tests" / "sweeps").mkdir(parents=True)
    (tmp_path / "tests" / "sweeps" / "big.py").write_text("x = 1\n" * 1001)
    (tmp_path / "tests" / "test_big.py").write_text("x = 1\n" * 1001)
    assert [str(p) for p, _, _ in lb.over_budget(tmp_path)] == [os.path.join("tests", "sweeps", "big.py")]
