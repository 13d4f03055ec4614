"""PyTorch's own module database (torch.testing._internal.common_modules.module_db,
every nn module with the sample inputs torch tests it with) on tpu against CPU:
each module is built once on the CPU, copied to tpu, and both copies run the
same samples, float32, in training and eval mode. Forward outputs, the
gradients of the parameters and of the inputs (backward of the sum of the
floating outputs) must match; an error on one side must be the other's
(same exception type). Modules that draw random numbers in their forward
pass (FractionalMaxPool, dropout in training, RReLU in training) are compared
by shape, dtype and device only.

Run on the framework the torch wheel ships: instantiate_device_type_tests makes
TestModulesConformancePRIVATEUSE1 with tests named ..._tpu_float32."""

import copy

import pytest
import torch
from torch.testing._internal.common_device_type import instantiate_device_type_tests
from torch.testing._internal.common_modules import module_db, modules
from torch.testing._internal.common_utils import TestCase
from torch.utils._pytree import tree_flatten, tree_map

import torchtpu  # noqa: F401

SAMPLES = 2  # the first samples of each module: the others repeat their code paths with other sizes
RANDOM_FORWARD = ("FractionalMaxPool", "Dropout", "RReLU")
TOL = dict(atol=1e-4, rtol=1e-4)

# Known differences, each with its reason; a module listed here that starts to
# pass is reported (strict xfail), so the list stays true.
KNOWN = {}


def _to(x, device):
    def move(t):
        if isinstance(t, torch.Tensor):
            c = t.detach().to(device)
            return c.requires_grad_(t.requires_grad)
        return t

    return tree_map(move, x)


def _run(module, args, kwargs):
    try:
        return module(*args, **kwargs), None
    except Exception as e:  # noqa: BLE001 - compared with the other side's
        return None, e


def _floats(out):
    return [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor) and t.is_floating_point()]


def _materialized(module_info, mi, training):
    """The module built from the sample's constructor arguments, its lazy
    parameters made by a first CPU call (so that both copies start equal)."""
    torch.manual_seed(0)
    m = module_info.module_cls(*mi.constructor_input.args, **mi.constructor_input.kwargs)
    m.train(training)
    if any(isinstance(p, torch.nn.parameter.UninitializedParameter) for p in m.parameters()):
        with torch.no_grad():
            m(*_to(mi.forward_input.args, "cpu"), **_to(mi.forward_input.kwargs, "cpu"))
    return m


class TestModulesConformance(TestCase):
    @modules(module_db, allowed_dtypes=(torch.float32,))
    def test_forward_and_backward_match_cpu(self, device, dtype, module_info, training):
        name = module_info.formatted_name
        if name in KNOWN:
            pytest.xfail(KNOWN[name])
        random = any(r in name for r in RANDOM_FORWARD) and (training or "Fractional" in name)
        samples = module_info.module_inputs_func(
            module_info, device="cpu", dtype=dtype, requires_grad=True, training=training
        )
        ran = 0
        for mi in samples:
            if mi.forward_input is None or ran == SAMPLES:
                continue
            ran += 1
            cpu = _materialized(module_info, mi, training)
            tpu = copy.deepcopy(cpu).to(device)
            ca, ck = _to(mi.forward_input.args, "cpu"), _to(mi.forward_input.kwargs, "cpu")
            ta, tk = _to(mi.forward_input.args, device), _to(mi.forward_input.kwargs, device)
            out_c, err_c = _run(cpu, ca, ck)
            out_t, err_t = _run(tpu, ta, tk)
            if err_c is not None or err_t is not None:
                assert err_c is not None and err_t is not None, f"cpu: {err_c!r}, tpu: {err_t!r}"
                assert type(err_t) is type(err_c), f"cpu: {err_c!r}, tpu: {err_t!r}"
                continue
            fc, ft = _floats(out_c), _floats(out_t)
            assert len(fc) == len(ft)
            for c, t in zip(fc, ft):
                assert t.device.type == "tpu" and t.shape == c.shape and t.dtype == c.dtype
            if random:
                continue
            self.assertEqual(out_t, out_c, exact_device=False, **TOL)
            # backward of the sum of the floating outputs that carry a gradient
            lc = [x.sum() for x in fc if x.requires_grad]
            if not lc:
                continue
            lt = [x.sum() for x in ft if x.requires_grad]
            sum(lc).backward()
            sum(lt).backward()
            for (n, pc), (_, pt) in zip(cpu.named_parameters(), tpu.named_parameters()):
                assert (pc.grad is None) == (pt.grad is None), n
                if pc.grad is not None:
                    self.assertEqual(pt.grad, pc.grad, exact_device=False, msg=n, **TOL)
            for xc, xt in zip(tree_flatten((ca, ck))[0], tree_flatten((ta, tk))[0]):
                if isinstance(xc, torch.Tensor) and xc.requires_grad:
                    assert (xc.grad is None) == (xt.grad is None)
                    if xc.grad is not None:
                        self.assertEqual(xt.grad, xc.grad, exact_device=False, **TOL)
        assert ran or not samples, "no sample ran"


instantiate_device_type_tests(TestModulesConformance, globals(), only_for=("privateuse1",))
