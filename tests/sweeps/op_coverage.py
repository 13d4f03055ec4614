"""Op coverage against PyTorch's own OpInfo database.

    python -m tests.sweeps.op_coverage [--dtypes float32,bfloat16,int64,bool]
                                         [--ops NAME,...] [--jobs N]
                                         [--out docs/op_coverage] [--no-grad]
                                         [--no-errors | --errors-only]

For every entry of torch's OpInfo `op_db` and every requested dtype the op
supports on the CPU, each sample input runs on `tpu` and on the CPU and the
results are compared (values, dtypes, shapes); for samples that require
gradients, the gradients of every differentiable input through
`torch.autograd.grad` are compared too. A sample the CPU itself refuses is not
counted. Each (op, dtype) is classified:

    pass         every counted sample matched
    wrong        a result differs from the CPU's (value, dtype or shape)
    error        the tpu run raised something the CPU run did not
    not_lowered  an ATen overload it needs has no tpu lowering (named)
    crash        the worker process died (the op is named; the run goes on)
    timeout      a sample ran past the per-op time limit
    no_samples   the CPU refused every sample (nothing to compare)

An error-input pass runs each entry's OpInfo `error_inputs` (inputs PyTorch
documents as refused) on the CPU and on tpu, with aliasing kept (an out= that
is an input stays one), and counts those the CPU rejects: same exception type
on tpu, another type, or no error (--errors-only reruns just this pass and
keeps an existing report's forward results).

Ops run in worker processes, one op at a time, so a crash or a hang is
recorded against the op that caused it and the run continues. The report is
written as Markdown (a table per op and totals) and JSON.
"""

import argparse
import json
import os
import select
import sys
import time

from . import start_worker
from .op_samples import (
    DTYPES,
    ERRORS,
    PER_OP_SECONDS,
    RANDOM_IN_TRAINING,
    RANDOM_OPS,
    RESULT_TAG,
    TIE_INDEX_OPS,
    TOLERANCES,
    _worker,
    entry_name,
)

# ---------------------------------------------------------------------------
# The driver.


class _Worker:
    def __init__(self, env):
        self.proc = start_worker("op_coverage", env)
        self.job = None
        self.started = None
        self.ready = False

    def send(self, job):
        self.job = job
        self.started = time.time()
        self.proc.stdin.write("\t".join(job) + "\n")
        self.proc.stdin.flush()

    def kill(self):
        try:
            self.proc.kill()
            self.proc.wait(timeout=10)
        except Exception:
            pass


def _read_tagged(w):
    """One answer line from a worker, or None at EOF."""
    while True:
        line = w.proc.stdout.readline()
        if not line:
            return None
        if line.startswith(RESULT_TAG):
            return json.loads(line[len(RESULT_TAG) :])


def run(jobs, nworkers=1, grad=True, progress=None, per_op_seconds=PER_OP_SECONDS):
    """Run (entry name, dtype) jobs; returns {(name, dtype): result}."""
    env = dict(os.environ)
    env.setdefault("TORCHTPU_CPU_FALLBACK", "0")
    env["TORCHTPU_CPU_FALLBACK"] = "0"
    pending = list(jobs)
    results = {}
    workers = []
    total = len(pending)

    def start():
        w = _Worker(env)
        if _read_tagged(w) is None:
            raise RuntimeError("op_coverage: a worker could not start (does `import torchtpu` work?)")
        return w

    for _ in range(max(1, min(nworkers, len(pending)))):
        workers.append(start())
    idle = list(workers)
    busy = {}
    while pending or busy:
        while idle and pending:
            w = idle.pop()
            job = pending.pop(0)
            w.send((job[0], job[1], "1" if grad else "0"))
            busy[w.proc.stdout.fileno()] = w
        ready, _, _ = select.select(list(busy), [], [], 5.0)
        for fd in ready:
            w = busy.pop(fd)
            r = _read_tagged(w)
            job = (w.job[0], w.job[1])
            if r is None:
                code = w.proc.wait()
                results[job] = {
                    "status": "crash",
                    "detail": f"worker died (exit status {code})",
                    "samples": 0,
                    "grad": None,
                    "grad_detail": "",
                    "seconds": round(time.time() - w.started, 2),
                }
                w.kill()
                w = start()
            else:
                results[job] = r
            idle.append(w)
            if progress:
                progress(len(results), total, job, results[job])
        now = time.time()
        for fd, w in list(busy.items()):
            if now - w.started > per_op_seconds:
                busy.pop(fd)
                job = (w.job[0], w.job[1])
                w.kill()
                results[job] = {
                    "status": "timeout",
                    "detail": f"over {per_op_seconds} s",
                    "samples": 0,
                    "grad": None,
                    "grad_detail": "",
                    "seconds": round(now - w.started, 2),
                }
                idle.append(start())
                if progress:
                    progress(len(results), total, job, results[job])
    for w in idle:
        w.proc.stdin.close()
        w.kill()
    return results


def all_jobs(dtypes=DTYPES, names=None, errors=False):
    import torch
    from torch.testing._internal.common_methods_invocations import op_db

    jobs, unsupported = [], []
    for op in op_db:
        name = entry_name(op)
        if names is not None and name not in names:
            continue
        if errors:
            jobs.append((name, ERRORS))
        supported = op.supported_dtypes("cpu")
        for d in dtypes:
            if getattr(torch, d) in supported:
                jobs.append((name, d))
            else:
                unsupported.append((name, d))
    return jobs, unsupported


def decomposed_ops():
    """ATen overloads torchtpu runs through torch._decomp decompositions."""
    try:
        from torchtpu import _registry

        return sorted(getattr(_registry, "DECOMPOSED", ()))
    except Exception:
        return []


def summarize(results):
    by_dtype = {}
    for (name, d), r in results.items():
        if d == ERRORS:
            continue
        s = by_dtype.setdefault(d, {"entries": 0, "status": {}, "grad_entries": 0, "grad_pass": 0, "grad_status": {}})
        s["entries"] += 1
        s["status"][r["status"]] = s["status"].get(r["status"], 0) + 1
        if r.get("grad") is not None:
            s["grad_entries"] += 1
            s["grad_status"][r["grad"]] = s["grad_status"].get(r["grad"], 0) + 1
            s["grad_pass"] += r["grad"] == "pass"
    return by_dtype


def summarize_errors(results):
    """Totals of the error-input pass: inputs the CPU rejects, and of those how
    many tpu rejects with the same type, another type, or not at all; entries
    whose worker crashed or timed out (their inputs are not counted)."""
    t = {
        "entries": 0,
        "with_inputs": 0,
        "cpu_rejects": 0,
        "same": 0,
        "other": 0,
        "none": 0,
        "cpu_none": 0,
        "crash": 0,
        "timeout": 0,
    }
    for (name, d), r in results.items():
        if d != ERRORS:
            continue
        t["entries"] += 1
        if r["status"] in ("crash", "timeout", "error"):
            t["crash" if r["status"] != "timeout" else "timeout"] += 1
            continue
        n = r.get("same", 0) + r.get("other", 0) + r.get("none", 0)
        t["with_inputs"] += (n + r.get("cpu_none", 0)) > 0
        t["cpu_rejects"] += n
        for k in ("same", "other", "none", "cpu_none"):
            t[k] += r.get(k, 0)
    return t


def missing_overloads(results):
    counts = {}
    for r in results.values():
        for key in ("status", "grad"):
            if r.get(key) == "not_lowered":
                ov = r["detail"] if key == "status" else r["grad_detail"]
                counts[ov] = counts.get(ov, 0) + 1
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))


def _fmt_pct(n, d):
    return f"{100.0 * n / d:.1f}%" if d else "n/a"


def write_report(results, out_prefix, dtypes, meta):
    import torch

    summary = summarize(results)
    data = {
        "torch": torch.__version__,
        "meta": meta,
        "summary": summary,
        "decomposed": decomposed_ops(),
        "missing_overloads": missing_overloads(results),
        "error_inputs": summarize_errors(results),
        "results": {f"{n}|{d}": r for (n, d), r in sorted(results.items())},
    }
    os.makedirs(os.path.dirname(out_prefix) or ".", exist_ok=True)
    with open(out_prefix + ".json", "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
    lines = [
        "# Op coverage",
        "",
        "Generated by `python -m tests.sweeps.op_coverage` (`make coverage`): every entry of "
        f"PyTorch's OpInfo `op_db` (torch {torch.__version__}), each sample input run on `tpu` and on "
        "the CPU and compared (values, dtypes, shapes), and for float32 the gradients of every "
        "differentiable input through `torch.autograd.grad`. Samples the CPU itself refuses are "
        "not counted. Ops with random or uninitialised results (listed below) are compared for "
        "shape and dtype only. Nothing is skipped by a list: every entry is run.",
        "",
        f"Tolerances: float32 rtol {TOLERANCES['float32']['rtol']}, atol {TOLERANCES['float32']['atol']}; "
        f"bfloat16 rtol {TOLERANCES['bfloat16']['rtol']}, atol {TOLERANCES['bfloat16']['atol']}; "
        "integers and bool exact.",
        "",
        (
            "Runs: "
            + ", ".join(f"{'error inputs' if d == ERRORS else d} {v}" for d, v in meta["dates"].items())
            + f"; platform {meta.get('platform', '')}."
            if meta.get("dates")
            else f"Run: {meta.get('date', '')}, {meta.get('seconds', 0):.0f} s, platform {meta.get('platform', '')}."
        ),
        "",
        "## Totals",
        "",
        "| dtype | entries | pass | wrong | error | not lowered | crash | timeout | no samples | forward pass rate "
        "| with gradients | gradients pass | gradient pass rate |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for d in dtypes:
        if d not in summary:
            continue
        s = summary[d]
        st = s["status"]
        counted = s["entries"] - st.get("no_samples", 0)
        gcounted = s["grad_entries"] - s["grad_status"].get("no_samples", 0)
        lines.append(
            f"| {d} | {s['entries']} | {st.get('pass', 0)} | {st.get('wrong', 0)} | {st.get('error', 0)} | "
            f"{st.get('not_lowered', 0)} | {st.get('crash', 0)} | {st.get('timeout', 0)} | "
            f"{st.get('no_samples', 0)} | {_fmt_pct(st.get('pass', 0), counted)} | {s['grad_entries']} | "
            f"{s['grad_pass']} | {_fmt_pct(s['grad_pass'], gcounted)} |"
        )
    lines += [
        "",
        "Pass rates are over entries with at least one sample the CPU accepts. A gradient is "
        "checked only for float32 entries whose forward passes and whose OpInfo says they support "
        "autograd.",
        "",
    ]
    dec = data["decomposed"]
    lines += [
        "## Decompositions",
        "",
        f"{len(dec)} ATen overloads run through `torch._decomp` decompositions in Python instead of a "
        "C lowering: " + (", ".join(f"`{x}`" for x in dec) if dec else "none") + ".",
        "",
    ]
    miss = data["missing_overloads"]
    lines += [
        "## Missing lowerings",
        "",
        "ATen overloads that stopped an entry (forward or gradient), with how many (entry, dtype) pairs each stopped:",
        "",
    ]
    lines += [", ".join(f"`{ov}` ({n})" for ov, n in miss) if miss else "none", ""]
    lines += [
        "## Random and uninitialised ops (compared for shape and dtype only)",
        "",
        ", ".join(f"`{x}`" for x in sorted(RANDOM_OPS)),
        "",
        "Indices of equal elements are unspecified for "
        + ", ".join(f"`{x}`" for x in sorted(TIE_INDEX_OPS))
        + ": their values are compared exactly, and their indices must point at elements equal to those "
        "the CPU's indices point at (exactly equal indices when the sample asks for a stable sort).",
        "",
        "Compared in full except for their samples in training mode (dropout inside): "
        + ", ".join(f"`{x}`" for x in sorted(RANDOM_IN_TRAINING))
        + ".",
        "",
    ]
    et = data["error_inputs"]
    if et["entries"]:
        lines += [
            "## Error inputs",
            "",
            "Each entry's OpInfo `error_inputs` (inputs PyTorch documents as refused), run on the CPU and "
            "on `tpu` (forced to the host, so a late error counts). An input counts when the CPU rejects "
            "it; it matches when `tpu` rejects it with the same exception type."
            + (f" Run: {meta['errors_date']}, {meta['errors_seconds']:.0f} s." if meta.get("errors_date") else ""),
            "",
            "| entries | with error inputs | CPU rejects | same type | other type | no error | "
            "crash (entries) | timeout (entries) | CPU accepts (not counted) |",
            "|---|---|---|---|---|---|---|---|---|",
            f"| {et['entries']} | {et['with_inputs']} | {et['cpu_rejects']} | {et['same']} | {et['other']} | "
            f"{et['none']} | {et['crash']} | {et['timeout']} | {et['cpu_none']} |",
            "",
        ]
        diff = []
        for (n, d), r in sorted(results.items()):
            if d != ERRORS:
                continue
            if r["status"] in ("crash", "timeout", "error"):
                diff.append(f"| {n} | - | {r['status']}: {_md(r.get('detail', ''))} | |")
            for x in r.get("details", []):
                diff.append(f"| {n} | {_md(x['input'])} | {_md(x['cpu'])} | {_md(x.get('tpu', 'no error'))} |")
        if diff:
            lines += (
                [
                    "Error inputs `tpu` does not reject as the CPU does:",
                    "",
                    "| entry | input | CPU | tpu |",
                    "|---|---|---|---|",
                ]
                + diff
                + [""]
            )
    lines += [
        "## Per op",
        "",
        "| op | " + " | ".join(dtypes) + " | gradient (float32) |",
        "|---|" + "---|" * (len(dtypes) + 1),
    ]
    names = sorted({n for n, _ in results} | {n for n, _ in meta.get("unsupported", [])})
    for n in names:
        cells = []
        for d in dtypes:
            r = results.get((n, d))
            if r is None:
                cells.append("-")
            elif r["status"] == "pass":
                cells.append("pass")
            else:
                cells.append(f"{r['status']}: {_md(r['detail'])}")
        r = results.get((n, "float32"))
        g = r.get("grad") if r else None
        gcell = "-" if g is None else ("pass" if g == "pass" else f"{g}: {_md(r.get('grad_detail', ''))}")
        lines.append(f"| {n} | " + " | ".join(cells) + f" | {gcell} |")
    lines += ["", "`-`: the op does not support that dtype on the CPU (or no gradient applies).", ""]
    with open(out_prefix + ".md", "w") as f:
        f.write("\n".join(lines))
    return summary


def _md(s):
    s = s.replace("|", "\\|").replace("\n", " ")
    return s[:160] + ("..." if len(s) > 160 else "")


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m tests.sweeps.op_coverage", description=__doc__.split("\n\n")[0])
    p.add_argument("--dtypes", default=",".join(DTYPES))
    p.add_argument("--ops", default=None, help="comma-separated OpInfo entry names (default: all)")
    p.add_argument("--jobs", type=int, default=max(1, min(2, os.cpu_count() or 1)))
    p.add_argument("--out", default="docs/op_coverage")
    p.add_argument("--no-grad", action="store_true")
    p.add_argument("--no-errors", action="store_true", help="skip the error-input pass")
    p.add_argument(
        "--errors-only",
        action="store_true",
        help="run only the error-input pass; the forward results of an existing report at --out are kept",
    )
    p.add_argument(
        "--merge",
        action="store_true",
        help="keep the existing report's results at --out for the dtypes (and the error pass) not run now; "
        "the report gives each its own date",
    )
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--quiet", action="store_true")
    a = p.parse_args(argv)
    if a.worker:
        return _worker()
    dtypes = [d.strip() for d in a.dtypes.split(",") if d.strip()]
    bad = [d for d in dtypes if d not in DTYPES]
    if bad:
        p.error(f"unknown dtype(s) {bad}; choose from {DTYPES}")
    names = set(x.strip() for x in a.ops.split(",")) if a.ops else None
    jobs, unsupported = all_jobs([] if a.errors_only else dtypes, names, errors=not a.no_errors)
    kept, old_meta = {}, None
    if a.errors_only and os.path.exists(a.out + ".json"):
        with open(a.out + ".json") as f:
            old = json.load(f)
        for k, r in old.get("results", {}).items():
            n, d = k.rsplit("|", 1)
            if d != ERRORS:
                kept[(n, d)] = r
        unsupported = [tuple(x) for x in old.get("meta", {}).get("unsupported", [])]
        old_meta = old.get("meta", {})
    merged_dates = {}
    if a.merge and not a.errors_only and os.path.exists(a.out + ".json"):
        with open(a.out + ".json") as f:
            old = json.load(f)
        om = old.get("meta", {})
        old_dates = om.get("dates") or dict(
            {d: om.get("date", "") for d in om.get("dtypes", [])}, **{ERRORS: om.get("errors_date", om.get("date", ""))}
        )
        for k, r in old.get("results", {}).items():
            n, d = k.rsplit("|", 1)
            if (d == ERRORS and a.no_errors) or (d != ERRORS and d not in dtypes):
                kept[(n, d)] = r
                merged_dates[d] = old_dates.get(d, "")
        unsupported = sorted(set(unsupported) | {tuple(x) for x in om.get("unsupported", []) if x[1] not in dtypes})
    if names:
        known = {n for n, _ in jobs} | {n for n, _ in unsupported}
        unknown = names - known
        if unknown:
            p.error(f"no OpInfo entry named {sorted(unknown)}")
    t0 = time.time()

    def progress(done, total, job, r):
        if a.quiet:
            return
        if job[1] == ERRORS and r["status"] == "errors":
            print(
                f"[{done}/{total}] {job[0]} error inputs: same {r['same']} other {r['other']} none {r['none']} "
                f"({r.get('seconds', 0)} s)",
                flush=True,
            )
            return
        g = "" if r.get("grad") in (None,) else f" grad={r['grad']}"
        det = "" if r["status"] == "pass" else f"  {r['detail'][:120]}"
        gd = f"  [{r['grad_detail'][:100]}]" if r.get("grad") not in (None, "pass") else ""
        print(f"[{done}/{total}] {job[0]} {job[1]}: {r['status']}{g} ({r.get('seconds', 0)} s){det}{gd}", flush=True)

    results = run(jobs, a.jobs, grad=not a.no_grad, progress=progress)
    results.update({k: v for k, v in kept.items() if k not in results})
    import torch  # noqa: F401

    platform = ""
    try:
        import torchtpu

        platform = torchtpu.runtime_info().get("platform", "")
    except Exception:
        pass
    meta = {
        "date": time.strftime("%Y-%m-%d"),
        "seconds": time.time() - t0,
        "platform": platform,
        "unsupported": unsupported,
        "dtypes": dtypes,
    }
    if merged_dates:  # each dtype (and the error pass) with the date of the run that made it
        today = meta["date"]
        meta["dates"] = dict(merged_dates, **{d: today for d in dtypes}, **({} if a.no_errors else {ERRORS: today}))
        meta["dtypes"] = dtypes = [d for d in DTYPES if d in meta["dates"]]
    if old_meta and kept and not merged_dates:  # the forward results are the old run's: so are its date and time
        meta = dict(old_meta, unsupported=unsupported, errors_date=meta["date"], errors_seconds=meta["seconds"])
    summary = write_report(results, a.out, dtypes, meta)
    for d in dtypes:
        if d in summary:
            s = summary[d]
            print(
                f"{d}: {s['status'].get('pass', 0)}/{s['entries']} pass {s['status']}; "
                f"gradients {s['grad_pass']}/{s['grad_entries']} {s['grad_status']}"
            )
    et = summarize_errors(results)
    if et["entries"]:
        print(
            f"error inputs: {et['cpu_rejects']} the CPU rejects: same type {et['same']}, other type "
            f"{et['other']}, no error {et['none']}; crashed entries {et['crash']}, timeouts {et['timeout']}"
        )
    print(f"report: {a.out}.md, {a.out}.json ({time.time() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
