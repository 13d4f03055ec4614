"""A differential fuzzer: random programs run on tpu in every eager mode and
compared with the CPU.

    python -m tests.sweeps.fuzz --minutes N --seed S [--programs K]
                                  [--modes debug,strict,fused] [--out DIR]
                                  [--ops NAME,...] [--quiet]

A program is a list of steps over a pool of named tensors: random inputs
(ranks 0-4, sizes 0-5, some non-contiguous: a transpose, a strided slice or an
offset narrow of a larger tensor; float32, bfloat16, int64, int32, bool;
normal values with NaN and Inf sprinkled in, small integers, valid index
tensors), then elementwise ops (broadcasting and type promotion), reductions,
matmuls, indexing, views and in-place ops through views. Each step is a line
of Python, generated from a seeded random.Random while the CPU runs it (so
that operands fit and no step depends on a value check: out-of-range indices
and integer division by zero are not generated).

The same lines run on the CPU and on tpu in each mode, in a worker process (a
crash or a hang is counted, the run goes on). Compared, for every tensor of
the pool at the end (bases written through views included): dtype, shape and
values (integers and bool exactly; float32 with rtol 1e-5, bfloat16 with rtol
1.6e-2; NaN and Inf at the same places), and per step whether it raised (the
same exception type as the CPU, or nothing where the CPU raised nothing).
Values that are only approximately computable on either side (a comparison,
floor or argmax of a float that a transcendental, a reduction or bfloat16
arithmetic produced) are compared for dtype and shape only.

A failure is minimized (steps dropped, input shapes shrunk, values and
constants simplified, while it fails the same way) and printed as a
standalone Python reproducer, also written under --out. Counts at the end:
programs, mismatches, error mismatches, crashes, timeouts; the exit status is
1 if anything failed.
"""

import argparse
import json
import os
import select
import sys
import time
import traceback

from . import start_worker
from .fuzz_gen import generate
from .fuzz_program import (
    DTYPES,
    MODES,
    PER_PROGRAM_SECONDS,
    RESULT_TAG,
    check_program,
    defined_names,
    program_lines,
    run_lines,
)

# ---------------------------------------------------------------------------
# Minimization (in the driver): candidates run in the worker.


def _drop_steps(prog, drop):
    """prog without the steps at positions drop, nor those that use their
    names; unused inputs removed."""
    gone = set()
    steps = []
    for i, s in enumerate(prog["steps"]):
        if i in drop or any(a in gone for a in s["args"]):
            if s["out"]:
                gone.add(s["out"])
            continue
        steps.append(s)
    used = {a for s in steps for a in s["args"]}
    order = [n for n in prog["order"] if n in used or not steps]
    if not order and prog["order"]:
        order = prog["order"][:1]
    return dict(prog, steps=steps, order=order, inputs={n: prog["inputs"][n] for n in order})


def _variants(prog):
    """Smaller or simpler versions of prog, most promising first."""
    n = len(prog["steps"])
    # drop chunks of steps, then single steps
    size = n // 2
    while size >= 1:
        for start in range(0, n, size):
            yield _drop_steps(prog, set(range(start, min(n, start + size))))
        size //= 2
    # a value computed by a step becomes an input of its dtype and shape
    for i, s in enumerate(prog["steps"]):
        out = s["out"]
        if out and not s.get("view") and out in prog.get("shapes", {}) and prog["dtypes"].get(out) in DTYPES:
            spec = {
                "shape": prog["shapes"][out],
                "dtype": prog["dtypes"][out],
                "kind": "normal",
                "seed": 0,
                "layout": "contig",
                "bound": 0,
                "special": 0.0,
            }
            yield dict(
                prog,
                steps=prog["steps"][:i] + prog["steps"][i + 1 :],
                order=prog["order"] + [out],
                inputs=dict(prog["inputs"], **{out: spec}),
            )
    # inputs: fewer elements, simpler layout and values
    for name in prog["order"]:
        spec = prog["inputs"][name]
        for d, s in enumerate(spec["shape"]):
            for new in sorted({1, s - 1, s // 2}):
                if 0 < new < s:
                    yield _with_input(prog, name, shape=spec["shape"][:d] + [new] + spec["shape"][d + 1 :])
        if spec.get("layout", "contig") != "contig":
            yield _with_input(prog, name, layout="contig")
        if spec.get("special"):
            yield _with_input(prog, name, special=0.0)
        for seed in (0, 1, 2):
            if spec["seed"] > 2:
                yield _with_input(prog, name, seed=seed)
    # constants
    for i, s in enumerate(prog["steps"]):
        for j in s.get("simp", ()):
            for c in ("0", "1", "2", "1.5"):
                if s["consts"][j] != c and len(s["consts"][j]) >= len(c) and s["consts"][j] not in ("0", "1"):
                    steps = list(prog["steps"])
                    consts = list(s["consts"])
                    consts[j] = c
                    steps[i] = dict(s, consts=consts)
                    yield dict(prog, steps=steps)


def _with_input(prog, name, **kw):
    inputs = dict(prog["inputs"])
    inputs[name] = dict(inputs[name], **kw)
    return dict(prog, inputs=inputs)


def _size(prog):
    return (
        len(prog["steps"]),
        len(prog["order"]),
        sum(_numel(s["shape"]) for s in prog["inputs"].values()),
        sum(s.get("layout", "contig") != "contig" for s in prog["inputs"].values()),
        sum(bool(s.get("special")) for s in prog["inputs"].values()),
        sum(s["seed"] for s in prog["inputs"].values()),
        sum(len(c) for s in prog["steps"] for c in s["consts"]),
    )


def _numel(shape):
    n = 1
    for s in shape:
        n *= s
    return n


def minimize(prog, sig, mode, check, budget_s=120.0, max_tries=400):
    """Shrink prog while check(candidate, mode) still fails with signature
    sig. Returns the smallest program found."""
    t0 = time.time()
    tries = 0
    best = prog
    improved = True
    while improved and time.time() - t0 < budget_s and tries < max_tries:
        improved = False
        for cand in _variants(best):
            if time.time() - t0 > budget_s or tries >= max_tries:
                break
            if _size(cand) >= _size(best):
                continue
            tries += 1
            try:
                cand_lines = program_lines(cand)  # noqa: F841  (a shrunk input must still build)
            except Exception:  # noqa: BLE001
                continue
            if sig in check(cand, mode):
                best = cand
                improved = True
                break
    return best


def reproducer(prog, mode, detail=""):
    """A standalone Python script that shows the failure."""
    import torch  # noqa: F401

    lines = program_lines(prog)
    cpu_ns, cpu_exc = run_lines(lines, "cpu")
    body = []
    for i, line in enumerate(lines):
        if cpu_exc[i] is not None:
            body += [
                "    try:",
                f"        {line}",
                "    except Exception as e:",
                f"        print(dev, 'raises', type(e).__name__)  # the CPU raises {type(cpu_exc[i]).__name__}",
            ]
        else:
            body.append(f"    {line}")
    names = [n for n in defined_names(prog) if n in cpu_ns]
    out = [
        f"# torchtpu fuzz: {detail}" if detail else "# torchtpu fuzz reproducer",
        "import torch",
        "import torchtpu",
        "",
        f'torchtpu.eager_mode("{mode}")',
        "nan, inf = float('nan'), float('inf')",
        "",
        "",
        "def run(dev):",
    ]
    out += body
    out += [
        f"    return [{', '.join(names)}]",
        "",
        "",
        "for c, t in zip(run(\"cpu\"), run(\"tpu\")):",
        "    print('cpu', c)",
        "    print('tpu', t.cpu())",
    ]
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------
# The worker and the driver.


def _worker():
    import warnings

    warnings.filterwarnings("ignore")
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    import torch  # noqa: F401

    import torchtpu  # noqa: F401

    inject = os.environ.get("TORCHTPU_FUZZ_INJECT") or None
    out.write(RESULT_TAG + json.dumps({"ready": True}) + "\n")
    out.flush()
    for line in sys.stdin:
        job = json.loads(line)
        try:
            fails = check_program(job["prog"], job["modes"], inject)
        except Exception:  # noqa: BLE001  (a bug of the harness itself)
            fails = [{"kind": "harness", "mode": "", "sig": "harness", "detail": traceback.format_exc(limit=3)[-600:]}]
        out.write(RESULT_TAG + json.dumps({"failures": fails}) + "\n")
        out.flush()


class Runner:
    """One worker process; run(prog, modes) returns failures, counting a
    dead worker as a crash and a slow one as a timeout."""

    def __init__(self, timeout=PER_PROGRAM_SECONDS, env=None):
        self.timeout = timeout
        self.env = dict(os.environ if env is None else env)
        self.env["TORCHTPU_CPU_FALLBACK"] = "0"
        self.proc = None

    def start(self):
        self.proc = start_worker("fuzz", self.env)
        r = self._read(300)
        if not r or not r.get("ready"):
            raise RuntimeError("fuzz: a worker could not start (does `import torchtpu` work?)")

    def _read(self, timeout):
        end = time.time() + timeout
        while True:
            left = end - time.time()
            if left <= 0:
                return "timeout"
            ready, _, _ = select.select([self.proc.stdout], [], [], left)
            if not ready:
                return "timeout"
            line = self.proc.stdout.readline()
            if not line:
                return None
            if line.startswith(RESULT_TAG):
                return json.loads(line[len(RESULT_TAG) :])

    def run(self, prog, modes):
        if self.proc is None:
            self.start()
        try:
            self.proc.stdin.write(json.dumps({"prog": prog, "modes": list(modes)}) + "\n")
            self.proc.stdin.flush()
            r = self._read(self.timeout)
        except (BrokenPipeError, OSError):
            r = None
        if r is None or r == "timeout":
            code = self.kill()
            if r is None:
                return [
                    {
                        "kind": "crash",
                        "mode": ",".join(modes),
                        "sig": "crash",
                        "detail": f"the worker died (exit status {code})",
                    }
                ]
            return [{"kind": "timeout", "mode": ",".join(modes), "sig": "timeout", "detail": f"over {self.timeout} s"}]
        return r["failures"]

    def kill(self):
        code = None
        if self.proc is not None:
            try:
                self.proc.kill()
                code = self.proc.wait(timeout=10)
            except Exception:  # noqa: BLE001
                pass
            self.proc = None
        return code

    def close(self):
        if self.proc is not None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=10)
            except Exception:  # noqa: BLE001
                self.kill()
            self.proc = None


def _mode_of(f, modes):
    m = f["mode"]
    return [m] if m in MODES else list(modes)


def _minimize_failure(runner, prog, f, fails, pseed, modes, budget_s):
    sig = f["sig"]
    first_mode = _mode_of(f, modes)

    def check(cand, mode):
        return {x["sig"] for x in runner.run(cand, mode)}

    small = minimize(prog, sig, first_mode, check, budget_s=budget_s)
    again = runner.run(small, first_mode)
    detail = next((x["detail"] for x in again if x["sig"] == sig), f["detail"])
    mode = first_mode[0] if len(first_mode) == 1 else "strict"
    head = f"{f['kind']} ({sig}) in {f['mode']} mode: {detail}"[:400].replace("\n", " ")
    return {
        "sig": sig,
        "kind": f["kind"],
        "count": 1,
        "modes": {x["mode"] for x in fails if x["sig"] == sig},
        "seed": pseed,
        "detail": detail,
        "steps": len(small["steps"]),
        "reproducer": reproducer(small, mode, head),
        "program": small,
        "still_fails": any(x["sig"] == sig for x in again),
    }


def fuzz(
    minutes=None,
    seed=0,
    programs=None,
    modes=MODES,
    out=None,
    ops=None,
    quiet=False,
    minimize_budget_s=120.0,
    timeout=PER_PROGRAM_SECONDS,
    env=None,
    log=print,
):
    """Run the fuzzer; returns a summary dict (counts and the distinct
    failures with their reproducers)."""
    t0 = time.time()
    deadline = None if minutes is None else t0 + 60.0 * minutes
    runner = Runner(timeout, env)
    counts = {"programs": 0, "mismatches": 0, "error_mismatches": 0, "crashes": 0, "timeouts": 0, "harness": 0}
    key = {
        "mismatch": "mismatches",
        "error": "error_mismatches",
        "crash": "crashes",
        "timeout": "timeouts",
        "harness": "harness",
    }
    distinct = {}
    if out:
        os.makedirs(out, exist_ok=True)
    i = 0
    try:
        while True:
            if programs is not None and i >= programs:
                break
            if deadline is not None and time.time() > deadline:
                break
            if programs is None and deadline is None:
                break
            pseed = seed * 1_000_003 + i
            prog = generate(pseed, ops)
            i += 1
            fails = runner.run(prog, modes)
            counts["programs"] += 1
            if not fails:
                if not quiet and counts["programs"] % 25 == 0:
                    log(f"[{counts['programs']} programs, {time.time() - t0:.0f} s] ok", flush=True)
                continue
            counts[key[fails[0]["kind"]]] += 1
            for f in fails:
                if not quiet or f is fails[0]:
                    log(f"program {i - 1} (seed {pseed}): {f['kind']} in {f['mode']}: {f['detail'][:300]}", flush=True)
            seen = set()
            for f in fails:
                sig = f["sig"]
                if sig in seen:
                    continue
                seen.add(sig)
                if sig in distinct:
                    distinct[sig]["count"] += 1
                    distinct[sig]["modes"].update(x["mode"] for x in fails if x["sig"] == sig)
                    continue
                d = _minimize_failure(runner, prog, f, fails, pseed, modes, minimize_budget_s)
                distinct[sig] = d
                if not quiet:
                    log(f"--- minimized reproducer ({sig}, {d['steps']} steps) ---\n{d['reproducer']}---", flush=True)
                if out:
                    fname = os.path.join(out, "repro_%03d.py" % len(distinct))
                    with open(fname, "w") as fh:
                        fh.write(d["reproducer"])
                    d["file"] = fname
    finally:
        runner.close()
    failed = sum(counts[k] for k in ("mismatches", "error_mismatches", "crashes", "timeouts", "harness"))
    summary = {
        "counts": counts,
        "failed": failed,
        "seconds": round(time.time() - t0, 1),
        "distinct": list(distinct.values()),
    }
    if out:
        with open(os.path.join(out, "summary.json"), "w") as fh:
            json.dump(
                {
                    **summary,
                    "distinct": [
                        {k: (sorted(v) if isinstance(v, set) else v) for k, v in d.items()} for d in distinct.values()
                    ],
                },
                fh,
                indent=1,
            )
    return summary


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m tests.sweeps.fuzz", description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--programs", type=int, default=None)
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--out", default=None, help="a folder for the reproducers and summary.json")
    p.add_argument("--ops", default=None, help="only these ops (comma-separated names)")
    p.add_argument("--timeout", type=float, default=PER_PROGRAM_SECONDS, help="seconds per program")
    p.add_argument("--minimize-seconds", type=float, default=120.0)
    p.add_argument("--show", type=int, default=None, help="print the program of this seed and exit")
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker:
        return _worker()
    ops = [o.strip() for o in a.ops.split(",")] if a.ops else None
    if a.show is not None:
        print("\n".join(program_lines(generate(a.show, ops))))
        return 0
    modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in MODES]
    if bad:
        p.error(f"unknown mode(s) {bad}; choose from {MODES}")
    if a.minutes is None and a.programs is None:
        a.minutes = 1.0
    s = fuzz(a.minutes, a.seed, a.programs, modes, a.out, ops, a.quiet, a.minimize_seconds, a.timeout)
    c = s["counts"]
    print(
        f"programs {c['programs']}, mismatches {c['mismatches']}, error mismatches {c['error_mismatches']}, "
        f"crashes {c['crashes']}, timeouts {c['timeouts']}"
        + (f", harness errors {c['harness']}" if c["harness"] else "")
        + f" ({s['seconds']:.0f} s); distinct failures {len(s['distinct'])}"
    )
    for d in s["distinct"]:
        print(
            f"  {d['sig']}: {d['count']}x, modes {','.join(sorted(d['modes']))}, first seed {d['seed']}, "
            f"minimized to {d['steps']} steps" + (f" ({d['file']})" if d.get("file") else "")
        )
    return 1 if s["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
