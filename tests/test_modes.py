"""Eager modes: fused (the default: ops recorded and run as one program at a
sync point, tests/test_fused.py), strict (asynchronous, one program per op)
and debug (synchronous) give the same results; the mode is set by TORCHTPU_EAGER or
torchtpu.eager_mode, globally or for a block."""

import os
import subprocess
import sys

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torchtpu


def _train(steps=8):
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).to("tpu")
    opt = torch.optim.AdamW(m.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(steps):
        x, y = torch.randn(8, 16, generator=g).to("tpu"), torch.randint(0, 4, (8,), generator=g).to("tpu")
        opt.zero_grad()
        loss = F.cross_entropy(m(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    torch.tpu.synchronize()
    return [l.item() for l in losses]


def test_fused_is_the_default_and_matches_strict_and_debug():
    assert torchtpu.get_eager_mode() == "fused"
    fused = _train()
    with torchtpu.eager_mode("strict"):
        strict = _train()
    with torchtpu.eager_mode("debug"):
        assert torchtpu.get_eager_mode() == "debug"
        debug = _train()
    assert torchtpu.get_eager_mode() == "fused"
    assert strict == debug
    torch.testing.assert_close(fused, strict, rtol=1e-5, atol=1e-6)


def test_global_setter_and_bad_modes():
    torchtpu.eager_mode("debug")
    try:
        assert torchtpu.get_eager_mode() == "debug"
        assert (torch.ones(3, device="tpu") * 2).cpu().tolist() == [2, 2, 2]
    finally:
        torchtpu.eager_mode("fused")
    with pytest.raises(ValueError, match="expected 'debug', 'strict' or 'fused'"):
        torchtpu.eager_mode("lazy")
    assert torchtpu.get_eager_mode() == "fused"


def test_environment_variable():
    code = "import torch, torchtpu; print(torchtpu.get_eager_mode())"
    for value, want in (
        ("debug", "debug"),
        ("strict", "strict"),
        ("fused", "fused"),
        ("", "fused"),
        ("lazy", "fused"),
    ):
        p = subprocess.run(
            [sys.executable, "-c", code],
            env=dict(os.environ, TORCHTPU_EAGER=value),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert p.returncode == 0, p.stderr[-2000:]
        assert p.stdout.strip() == want
        if value == "lazy":
            assert "TORCHTPU_EAGER='lazy' is not one of debug, strict, fused" in p.stderr


def test_strict_mode_keeps_many_launches_in_flight():
    with torchtpu.eager_mode("strict"):
        x = torch.ones(64, 64, device="tpu")
        for _ in range(600):  # more than the in-flight ring holds
            x = x * 1.0
        torch.tpu.synchronize()
    assert x.sum().item() == 64 * 64


@pytest.mark.parametrize("mode", ["debug", "strict", "fused"])
def test_device_out_of_memory_is_an_error_not_a_crash(mode):
    with torchtpu.eager_mode(mode):
        with pytest.raises(MemoryError) as e:
            x = torch.ones(2**36, dtype=torch.uint8, device="tpu")  # 64 GiB
            x[:4].cpu()
        msg = str(e.value)
        assert "Out of memory" in msg
        assert "aten::fill_" in msg  # fused: the op that makes the program's largest value
        assert "fused program" in msg if mode == "fused" else True
        assert "(64.0 GiB)" in msg  # the plugin's size in bytes, also in binary units
        if mode == "fused":  # the value's size, and the Python line that made it
            assert "its largest value, 64.0 GiB" in msg and "test_modes.py" in msg
        assert (torch.ones(3, device="tpu") * 2).cpu().tolist() == [2.0, 2.0, 2.0]
