"""Bad input never ends the process or gives a silently wrong answer: each
case behaves as CPU torch does (the same exception type, or the same
values)."""
import pytest
import torch

import torchtpu  # noqa: F401

HUGE = 2 ** 62


def _same_error(fn):
    """fn(device) raises on the CPU; on the tpu it raises the same type."""
    with pytest.raises(Exception) as want:
        fn("cpu")
    with pytest.raises(type(want.value)):
        fn("tpu")
    return want.value


@pytest.mark.parametrize("make", [
    lambda d: torch.empty(HUGE, device=d),
    lambda d: torch.empty(2 ** 61, device=d),
    lambda d: torch.zeros(HUGE, device=d),
    lambda d: torch.ones(HUGE, 2, device=d),
    lambda d: torch.full((HUGE,), 1.0, device=d),
    lambda d: torch.randn(HUGE, device=d),
    lambda d: torch.empty_strided((HUGE,), (1,), device=d),
    lambda d: torch.empty_strided((2, HUGE), (HUGE, 1), device=d),
    lambda d: torch.empty_strided((2,), (-1,), device=d),
    lambda d: torch.empty(0, HUGE, HUGE, device=d),
    lambda d: torch.ones(2, device=d).new_empty(HUGE),
    lambda d: torch.ones(2, device=d).resize_(HUGE),
    lambda d: torch.ones(2, device=d).repeat(HUGE),
    lambda d: torch.ones(2, device=d).repeat(2 ** 31, 2 ** 31),
], ids=lambda f: "")
def test_overflowing_sizes_raise_as_on_cpu(make):
    e = _same_error(make)
    assert isinstance(e, RuntimeError)
    assert torch.ones(2, device="tpu").add(1).cpu().tolist() == [2.0, 2.0]  # the process goes on
