"""The device tests (tests/test_device.py) again on tpu:1 of a process with two
devices: every tensor they make on "tpu" goes to the current device, tpu:1
(tests/conftest.py selects it)."""

import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def test_device_tests_pass_on_tpu_1():
    env = dict(os.environ, TORCHTPU_NUM_DEVICES="2", TORCHTPU_TEST_DEVICE="1")
    p = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", os.path.join(HERE, "test_device.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        cwd=os.path.dirname(HERE),
    )
    assert p.returncode == 0, p.stdout[-5000:] + p.stderr[-2000:]
    assert " passed" in p.stdout and " failed" not in p.stdout, p.stdout[-2000:]
