"""torch.compile(model, backend="tpu").

Dynamo captures the graphs, AOTAutograd splits each into a forward and a
backward graph of core ATen ops (with PyTorch's decompositions, inputs
functionalized: mutation and aliasing of inputs are handled by its
wrappers). Each graph runs in the fused eager mode: its nodes are recorded
through the same C lowering table as eager ops and become one StableHLO
program, compiled through the shared cache (memory and disk) and launched
asynchronously when the graph returns. A repeated call records the same ops,
so it finds the same program: nothing recompiles.

Registered lazily through the "torch_dynamo_backends" entry point.
"""
import torch

from . import _C

_FUSED = 2


def _run_fused(gm):
    def run(args):
        previous = _C.eager_mode()
        if previous != _FUSED:
            _C.eager_mode(_FUSED, False)
        try:
            out = gm(*args)
        finally:
            if previous != _FUSED:
                _C.eager_mode(previous, False)  # launches the graph's program, does not wait
        return out

    run._boxed_call = True
    return run


def _compiler(gm, example_inputs):
    return _run_fused(gm)


def backend(gm, example_inputs, **kwargs):
    from torch._decomp import core_aten_decompositions
    from torch._dynamo.backends.common import aot_autograd

    return aot_autograd(fw_compiler=_compiler, bw_compiler=_compiler,
                        decompositions=core_aten_decompositions())(gm, example_inputs, **kwargs)
