"""Cases that run in one child process (several local devices need their own
process; a start costs seconds, so one child runs every case of a file). The
child's code is run after PRELUDE: each case is a function decorated with
@case, whose outcome goes into `results` (name -> "ok" or the traceback),
printed last as one line, "RESULTS <json>"; an `after_case()` the code
defines runs after each case; same(got, want, tol) compares a tpu tensor
with a CPU one."""

import json
import os
import subprocess
import sys
import textwrap

PRELUDE = textwrap.dedent("""
    import json, traceback

    import torch

    results = {}

    def case(fn):
        try:
            fn()
            results[fn.__name__] = "ok"
        except BaseException:
            results[fn.__name__] = traceback.format_exc()
        finally:
            globals().get("after_case", lambda: None)()
        return fn

    def same(got, want, tol=0.0):
        got = got.cpu()
        assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape, want.dtype, want.shape)
        assert torch.allclose(got, want, atol=tol, rtol=tol) if tol else torch.equal(got, want), (got, want)
""")
EPILOGUE = '\nprint("RESULTS " + json.dumps(results))\n'


class ChildCases:
    def __init__(self, code, env, timeout=900):
        self.code, self.env, self.timeout = PRELUDE + code + EPILOGUE, env, timeout
        self._results = None

    def results(self):
        if self._results is None:
            p = subprocess.run(
                [sys.executable, "-c", self.code],
                env=dict(os.environ, **self.env),
                capture_output=True,
                text=True,
                timeout=self.timeout,
            )
            line = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULTS ")]
            assert line, f"the child failed (exit {p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
            self._results = json.loads(line[-1][len("RESULTS ") :])
        return self._results

    def check(self, name):
        r = self.results()
        assert name in r, f"case {name} did not run: {sorted(r)}"
        assert r[name] == "ok", r[name]

    def check_listed(self, names):
        """Every case the child ran is one of names, and the other way round."""
        assert sorted(self.results()) == sorted(names)
