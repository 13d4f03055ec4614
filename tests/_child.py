"""Cases that run in one child process (several local devices need their own
process; a start costs seconds, so one child runs every case of a file). The
child's code records each case's outcome in a dict `results` (name -> "ok" or
the traceback) and prints it last as one line, "RESULTS <json>"."""

import json
import os
import subprocess
import sys


class ChildCases:
    def __init__(self, code, env, timeout=900):
        self.code, self.env, self.timeout = code, env, timeout
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
