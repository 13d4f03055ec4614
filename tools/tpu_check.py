"""`make tpu-check`: runs the op tests (or the pytest arguments given) with
every program also compiled for a TPU topology (TORCHTPU_AOT_TOPOLOGY,
default v5e:2x2; TORCHTPU_AOT_STRICT=0: a program the TPU compiler refuses is
counted, the test goes on), then prints how many programs compiled for the
TPU and the refusals grouped by error. No TPU is needed: libtpu compiles for
the topology on the host.

The tests are split into chunks run by worker processes side by side
(TPU_CHECK_JOBS, default the host's cores). Each chunk's result is written to
build/tpu-check/<topology>/ as it finishes, so an interrupted sweep keeps
what it did, and a rerun skips the chunks already done (TPU_CHECK_FRESH=1:
start over; so does a rebuilt extension or another libtpu). Exit status: 1
when a program was refused or a chunk did not finish (the tests' own
failures are reported, not counted)."""

import glob
import hashlib
import importlib.util
import json
import os
import re
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("TORCHTPU_AOT_TOPOLOGY", "v5e:2x2")
os.environ.setdefault("TORCHTPU_AOT_STRICT", "0")
CHUNK = int(os.environ.get("TPU_CHECK_CHUNK", "24"))
CHUNK_TIMEOUT = int(os.environ.get("TPU_CHECK_TIMEOUT", "2400"))


class _Outcomes:
    """Counts the tests' outcomes in a child."""

    def __init__(self):
        self.counts = {}

    def pytest_runtest_logreport(self, report):
        if report.when == "call" or report.outcome != "passed":
            key = "xfailed" if hasattr(report, "wasxfail") and report.skipped else report.outcome
            self.counts[key] = self.counts.get(key, 0) + 1


def child(out, ids):
    """Runs the tests named by ids in this process and writes the AOT report."""
    import pytest

    t0 = time.monotonic()
    outcomes = _Outcomes()
    rc = pytest.main(["-q", "-p", "no:cacheprovider", *ids], plugins=[outcomes])
    import torchtpu

    r = torchtpu.aot_report()
    m = torchtpu.metrics()
    result = {
        "topology": r.topology,
        "kind": r.kind,
        "programs": [p.as_dict() for p in r],
        "tests": outcomes.counts,
        "pytest_exit": int(rc),
        "aot_compile_seconds": m["aot_compile_seconds"],
        "seconds": time.monotonic() - t0,
    }
    with open(out + ".tmp", "w") as f:
        json.dump(result, f)
    os.replace(out + ".tmp", out)
    return 0


def collect(args):
    py = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    ids = [line for line in py.stdout.splitlines() if "::" in line]
    if not ids:
        sys.exit(f"tpu-check: no tests collected from {args}:\n{py.stdout[-2000:]}{py.stderr[-2000:]}")
    return ids


def built():
    """What a chunk's result depends on besides its tests: the extension's
    bytes (the lowering) and libtpu's (the compiler). A rebuild starts over."""
    h = hashlib.sha256()
    for path in sorted(glob.glob(os.path.join(ROOT, "torchtpu", "_C*.so"))):
        with open(path, "rb") as f:
            h.update(f.read())
    spec = importlib.util.find_spec("libtpu")
    for d in spec.submodule_search_locations if spec and spec.submodule_search_locations else []:
        for path in sorted(glob.glob(os.path.join(d, "*.so"))):
            st = os.stat(path)
            h.update(f"{path}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest() + "\n"


def chunks(ids):
    """Consecutive runs of at most CHUNK tests of one file."""
    out, cur = [], []
    for i in ids:
        if cur and (len(cur) >= CHUNK or cur[0].split("::")[0] != i.split("::")[0]):
            out.append(cur)
            cur = []
        cur.append(i)
    return out + [cur] if cur else out


def run(args):
    topology = os.environ["TORCHTPU_AOT_TOPOLOGY"]
    outdir = os.path.join(ROOT, "build", "tpu-check", topology.replace(":", "_"))
    os.makedirs(outdir, exist_ok=True)
    jobs = int(os.environ.get("TPU_CHECK_JOBS", str(os.cpu_count() or 1)))
    todo = []
    build = built()
    for c in chunks(collect(args)):
        path = os.path.join(outdir, hashlib.sha256((build + "\n".join(c)).encode()).hexdigest()[:16] + ".json")
        if os.environ.get("TPU_CHECK_FRESH") == "1" and os.path.exists(path):
            os.remove(path)
        todo.append((c, path))
    pending = [t for t in todo if not os.path.exists(t[1])]
    print(
        f"tpu-check: {sum(len(c) for c, _ in todo)} tests in {len(todo)} chunks for TPU {topology}; "
        f"{len(todo) - len(pending)} chunks done before, {len(pending)} to run, {jobs} at a time",
        flush=True,
    )
    t0 = time.monotonic()
    running, unfinished = [], []
    try:
        while pending or running:
            while pending and len(running) < jobs:
                c, path = pending.pop(0)
                log = open(path[:-5] + ".log", "w")
                p = subprocess.Popen(
                    [sys.executable, os.path.abspath(__file__), "--child", path, *c],
                    cwd=ROOT,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
                running.append((p, c, path, log, time.monotonic()))
            time.sleep(0.5)
            for entry in list(running):
                p, c, path, log, start = entry
                if p.poll() is None and time.monotonic() - start < CHUNK_TIMEOUT:
                    continue
                if p.poll() is None:
                    p.kill()
                    p.wait()
                log.close()
                running.remove(entry)
                done = len(todo) - len(pending) - len(running)
                if os.path.exists(path):
                    with open(path) as f:
                        res = json.load(f)
                    bad = sum(not q["ok"] for q in res["programs"])
                    print(
                        f"[{done}/{len(todo)} {time.monotonic() - t0:.0f} s] {c[0].split('::')[0]} "
                        f"({len(c)} tests): {len(res['programs'])} programs, {bad} refused, "
                        f"{res['aot_compile_seconds']:.0f} s TPU compile of {res['seconds']:.0f} s",
                        flush=True,
                    )
                else:
                    unfinished.append((c, path[:-5] + ".log", p.returncode))
                    print(f"[{done}/{len(todo)}] {c[0]} ...: no result (exit {p.returncode})", flush=True)
    finally:
        for p, *_ in running:
            p.kill()
    return summarize(topology, [t[1] for t in todo], unfinished, time.monotonic() - t0)


def summarize(topology, paths, unfinished, wall):
    results = []
    for path in paths:
        if os.path.exists(path):
            with open(path) as f:
                results.append(json.load(f))
    programs = [p for r in results for p in r["programs"]]
    ok = [p for p in programs if p["ok"]]
    refused = [p for p in programs if not p["ok"]]
    tests = {}
    for r in results:
        for k, v in r["tests"].items():
            tests[k] = tests.get(k, 0) + v
    distinct = len({p["fingerprint"] for p in ok if p["fingerprint"]})
    oom = sum(p["error_kind"] == "out of memory" for p in refused)
    slow = sorted(ok, key=lambda p: -(p["compile_seconds"] or 0))[:10]
    print()
    print(f"slowest TPU compiles ({topology}):")
    for p in slow:
        print(f"  {p['compile_seconds']:8.2f} s  {p['name'][:100]}")
    groups = {}
    for p in refused:  # one group per cause: the error's first line without shapes, names and metadata
        err = (p["error"] or "").split("\n")[0].split(", metadata=")[0]
        err = re.sub(r"%[\w.-]+", "%_", re.sub(r"\{[0-9,_x=a-z ]*\}", "{..}", re.sub(r"\[[0-9,]*\]", "[..]", err)))
        groups.setdefault((p["error_kind"], err[:300]), set()).add(p["name"])
    for (kind, err), names in sorted(groups.items(), key=lambda g: -len(g[1])):
        print(f"refused ({kind}) x{len(names)}: {err}\n    [{', '.join(sorted(names)[:8])}]")
    for c, log, rc in unfinished:
        print(f"unfinished chunk (exit {rc}, log {os.path.relpath(log, ROOT)}): {c[0]} ... ({len(c)} tests)")
    print(
        f"tpu-check: {len(programs)} programs ({distinct} distinct executables) for TPU {topology}: "
        f"{len(ok)} compiled, {len(refused)} refused ({oom} too big for HBM); "
        f"{sum(p['cached'] for p in programs)} TPU results from the disk cache; "
        f"TPU compile {sum(r['aot_compile_seconds'] for r in results):.0f} s; "
        f"tests {', '.join(f'{v} {k}' for k, v in sorted(tests.items()))}; "
        f"{len(results)} of {len(paths)} chunks, {wall:.0f} s wall"
    )
    return 1 if refused or unfinished else 0


def main(argv):
    if argv[:1] == ["--child"]:
        return child(argv[1], argv[2:])
    args = argv or sorted(glob.glob(os.path.join(ROOT, "tests", "test_ops*.py")))
    return run(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
