"""The differential fuzzer (python -m tests.sweeps.fuzz; the long run is
`make fuzz`): a short fixed-seed run through the same entry point, the
generator's reach, and the minimizer against a deliberately wrong op."""

import json
import os

from sweeps import fuzz, fuzz_gen

SEED = 7
PROGRAMS = 40

# Failures of the fixed-seed run that are open bugs of the core, by
# signature (what `fuzz` groups failures by). Each is printed with its
# minimized reproducer when the test runs with -s. Remove an entry once its
# bug is fixed; any other failure fails the test.
KNOWN_OPEN = set()  # the fixed-seed run meets no open failure


def test_fixed_seed_run(tmp_path, capsys):
    s = fuzz.fuzz(programs=PROGRAMS, seed=SEED, out=str(tmp_path), quiet=True, minimize_budget_s=20.0)
    assert s["counts"]["programs"] == PROGRAMS
    new = [d for d in s["distinct"] if d["sig"] not in KNOWN_OPEN]
    with capsys.disabled():
        for d in s["distinct"]:
            print(f"\n{d['sig']} ({d['count']}x)\n{d['reproducer']}")
    assert not new, "\n\n".join(f"{d['sig']} ({d['count']}x):\n{d['reproducer']}" for d in new)
    assert s["counts"]["crashes"] == 0 and s["counts"]["timeouts"] == 0 and s["counts"]["harness"] == 0
    with open(tmp_path / "summary.json") as f:
        assert json.load(f)["counts"]["programs"] == PROGRAMS


def test_generator_reach():
    """Programs are deterministic in their seed and cover every op family,
    0-size and non-contiguous inputs, every dtype and NaN/Inf values."""
    assert fuzz.generate(123) == fuzz.generate(123)
    ops, dtypes, layouts = set(), set(), set()
    zero = special = views_written = 0
    for seed in range(150):
        p = fuzz.generate(seed)
        ops |= {s["op"] for s in p["steps"]}
        for spec in p["inputs"].values():
            dtypes.add(spec["dtype"])
            layouts.add(spec["layout"])
            zero += 0 in spec["shape"]
            special += bool(spec["special"])
        views = {s["out"] for s in p["steps"] if s.get("view")}
        views_written += any(s["out"] is None and s["args"][0] in views for s in p["steps"])
    for fam in fuzz_gen.FAMILIES:
        assert ops & set(fam[2]) | ({fam[1]} & ops) or fam[1] == "index" and ops & {"index_put_", "index_put_acc"}, fam[
            1
        ]
    for op in (
        "mm",
        "bmm",
        "matmul",
        "gather",
        "index_select",
        "getitem",
        "index_put_",
        "expand",
        "select",
        "narrow",
        "slice",
        "add_",
        "copy_",
        "fill_",
        "zero_",
        "sum",
        "argmax",
        "prod",
    ):
        assert op in ops, op
    assert dtypes == set(fuzz.DTYPES)
    assert layouts == {"contig", "t", "step", "offset"}
    assert zero > 5 and special > 20 and views_written > 20


def test_minimizer_finds_a_planted_bug(tmp_path):
    """torch.abs made wrong on tpu (1 added to its results of more than one
    element) in the worker: the run reports it, and the minimized
    reproducer is one abs step over a small input that still fails."""
    env = dict(os.environ, TORCHTPU_FUZZ_INJECT="abs")
    s = fuzz.fuzz(
        programs=6,
        seed=3,
        modes=["strict"],
        ops=["abs"],
        quiet=True,
        env=env,
        out=str(tmp_path),
        minimize_budget_s=60.0,
    )
    planted = [d for d in s["distinct"] if d["sig"].startswith("mismatch|abs:")]
    assert planted, s["distinct"]
    d = planted[0]
    assert d["still_fails"]
    small = d["program"]
    assert [st["op"] for st in small["steps"]] == ["abs"]
    assert sum(fuzz._numel(spec["shape"]) for spec in small["inputs"].values()) <= 4
    assert "torch.abs(" in d["reproducer"] and 'torchtpu.eager_mode("strict")' in d["reproducer"]
    assert os.path.exists(d["file"])
    # the reproducer is a standalone script: it compiles, and shows the CPU and tpu values
    compile(d["reproducer"], "repro.py", "exec")
    assert s["failed"] >= 1
