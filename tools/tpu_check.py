"""`make tpu-check`: runs the op tests (or the pytest arguments given) in this
process with every program also compiled for a TPU topology
(TORCHTPU_AOT_TOPOLOGY, default v5e:2x2; TORCHTPU_AOT_STRICT=0: a program the
TPU compiler refuses is counted, the test goes on), then prints how many
programs compiled for the TPU and the refusals grouped by error. Exit status:
1 when a program was refused (the tests' own failures are reported, not
counted). No TPU is needed: libtpu compiles for the topology on the host."""

import glob
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("TORCHTPU_AOT_TOPOLOGY", "v5e:2x2")
os.environ.setdefault("TORCHTPU_AOT_STRICT", "0")


def main(argv):
    import pytest

    args = argv or sorted(glob.glob(os.path.join(ROOT, "tests", "test_ops*.py")))
    t0 = time.monotonic()
    rc = pytest.main(["-q", "-p", "no:cacheprovider", *args])
    import torchtpu

    r = torchtpu.aot_report()
    m = torchtpu.metrics()
    print()
    print(r.summary(10))
    print(
        f"tpu-check: {len(r)} programs for TPU {r.topology}: {len(r) - len(r.failed)} compiled, "
        f"{len(r.failed)} refused ({m['aot_programs_too_big']} too big for HBM); "
        f"TPU compile {m['aot_compile_seconds']:.0f} s of {time.monotonic() - t0:.0f} s; pytest exit status {int(rc)}"
    )
    return 1 if r.failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
