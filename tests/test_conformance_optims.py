"""PyTorch's own optimizer database (torch.testing._internal.common_optimizers.optim_db,
every optimizer with the settings torch tests it with) on tpu against CPU: the same
parameters (a matrix, a vector, a 0-d tensor) and the same gradients on both, three
steps of each setting (LBFGS: a quadratic's closure; Muon: the matrix only), in each implementation the optimizer has
(for-loop; foreach and fused where torch offers them). Parameters and state must
match; a setting one side refuses, the other must refuse with the same exception
type. Sparse-only optimizers (SparseAdam) are left to sparse support (refused on tpu).

Run on the framework the torch wheel ships: instantiate_device_type_tests makes
TestOptimsConformancePRIVATEUSE1 with tests named ..._tpu_float32."""

import pytest
import torch
from torch.testing._internal.common_device_type import instantiate_device_type_tests
from torch.testing._internal.common_optimizers import optim_db, optims
from torch.testing._internal.common_utils import TestCase

import torchtpu  # noqa: F401

TOL = dict(atol=1e-5, rtol=1e-5)
STEPS = 3


SHAPES = [(4, 3), (5,), ()]


def _shapes(optim_cls):
    return SHAPES[:1] if optim_cls.__name__ == "Muon" else SHAPES  # Muon takes matrices only


def _params(shapes, device):
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(s, generator=gen).to(device).requires_grad_() for s in shapes]


def _grads(shapes, step):
    gen = torch.Generator().manual_seed(100 + step)
    return [torch.randn(s, generator=gen) for s in shapes]


def _kwargs(kwargs, device):
    out = {}
    for k, v in kwargs.items():
        if isinstance(v, torch.Tensor):
            v = v.to(device)
        elif isinstance(v, tuple) and any(isinstance(x, torch.Tensor) for x in v):
            v = tuple(x.to(device) if isinstance(x, torch.Tensor) else x for x in v)
        out[k] = v
    return out


def _run(optim_cls, kwargs, device):
    """(params, state tensors) after STEPS steps, or the exception."""
    try:
        shapes = _shapes(optim_cls)
        ps = _params(shapes, device)
        opt = optim_cls(ps, **_kwargs(kwargs, device))
        lbfgs = optim_cls is torch.optim.LBFGS
        for s in range(STEPS):
            gs = _grads(shapes, 0 if lbfgs else s)  # LBFGS: one objective (its history is of that function)

            def closure(ps=ps, gs=gs):  # a quadratic: bounded below, for the line search
                opt.zero_grad()
                loss = sum(((p - g.to(device)) ** 2).sum() for p, g in zip(ps, gs))
                loss.backward()
                return loss

            if lbfgs:
                opt.step(closure)
            else:
                for p, g in zip(ps, gs):
                    p.grad = g.to(device)
                opt.step()
        state = []
        for p in ps:
            for k in sorted(opt.state[p]):
                v = opt.state[p][k]
                if isinstance(v, torch.Tensor):
                    state.append((k, v.detach().cpu()))
        return [p.detach().cpu() for p in ps], state, None
    except Exception as e:  # noqa: BLE001 - compared with the other side's
        return None, None, e


class TestOptimsConformance(TestCase):
    @optims([o for o in optim_db if o.optim_cls is not torch.optim.SparseAdam], dtypes=[torch.float32])
    def test_steps_match_cpu(self, device, dtype, optim_info):
        impls = [None] + [i for i in ("foreach", "fused") if i in optim_info.supported_impls]
        ran = 0
        for oi in optim_info.optim_inputs_func(device="cpu"):
            for impl in impls:
                kwargs = dict(oi.kwargs)
                if impl:
                    kwargs[impl] = True
                if impl == "fused" and kwargs.get("differentiable"):
                    continue
                pc, sc, ec = _run(optim_info.optim_cls, kwargs, "cpu")
                pt, st, et = _run(optim_info.optim_cls, kwargs, device)
                what = f"{oi.desc} {impl or 'for-loop'}"
                if ec is not None or et is not None:
                    assert ec is not None and et is not None, f"{what}: cpu {ec!r}, tpu {et!r}"
                    assert type(et) is type(ec), f"{what}: cpu {ec!r}, tpu {et!r}"
                    continue
                ran += 1
                for a, b in zip(pt, pc):
                    self.assertEqual(a, b, msg=what, **TOL)
                assert [k for k, _ in st] == [k for k, _ in sc], what
                # LBFGS's history (directions, steps) comes out of 20 inner iterations of
                # reductions: their rounding, summed in another order, shows at 1e-4
                tol = dict(atol=1e-3, rtol=1e-3) if optim_info.optim_cls is torch.optim.LBFGS else TOL
                for (k, a), (_, b) in zip(st, sc):
                    self.assertEqual(a, b, msg=f"{what}: state {k}", **tol)
        if not ran:
            pytest.fail("no setting ran on both devices")


instantiate_device_type_tests(TestOptimsConformance, globals(), only_for=("privateuse1",))
