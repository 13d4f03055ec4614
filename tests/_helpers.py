"""Shared by the per-family op tests: seeded inputs and comparison with CPU
PyTorch (dtype, shape, then values)."""

import torch


def make(shape, dtype=torch.float32, seed=0):
    """A seeded CPU tensor: normal floats, integers in [-3, 3], random bools."""
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype)
    return torch.randint(-3, 4, shape, generator=g).to(dtype)


def close(got, want, tol=1e-4):
    """got (any device) matches the CPU result want: dtype and shape exactly,
    values within tol (half types within 2e-2/5e-2, integers exactly)."""
    got = got.cpu()
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, want.dtype, got.shape, want.shape)
    if want.dtype in (torch.bfloat16, torch.float16):
        torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=5e-2, equal_nan=True)
    elif want.dtype.is_floating_point or want.dtype.is_complex:
        torch.testing.assert_close(got, want, rtol=tol, atol=tol, equal_nan=True)
    else:
        assert torch.equal(got, want)
