"""torch.compile(model, backend="tpu").

Dynamo captures the graphs, AOTAutograd splits each into a forward and a
backward graph of core ATen ops (with PyTorch's decompositions, inputs
functionalized: mutation and aliasing of inputs are handled by its
wrappers). Each graph runs in the fused eager mode: its nodes are recorded
through the same C lowering table as eager ops and become one StableHLO
program, compiled through the shared cache (memory and disk) and launched
asynchronously when the graph returns. That first call also keeps a plan:
which graph input, held tensor, constant or generator offset feeds each
program input, and where each program output goes. Later calls whose inputs
have the same layout run the program from the plan, without dispatching or
recording the graph's ops again: nothing recompiles, and the per-op cost of
Python and the recorder is paid once.

Registered lazily through the "torch_dynamo_backends" entry point.
"""
import os
import sys

import torch

from . import _C

_EXPLAIN = os.environ.get("TORCHTPU_EXPLAIN_RECOMPILES", "") not in ("", "0")

_MAX_PLANS = 8


def _run_fused(gm):
    """The graph's callable. The first call with a given input layout records
    the graph (fused mode) and keeps a plan of its program; later calls with
    that layout run the program straight from the plan (_C.graph_replay)."""
    plans = []
    state = {"why": None}

    def run(args):
        out = _C.graph_replay(plans, args)
        if out is not None:
            return out
        token = _C.graph_capture_begin()
        try:
            out = gm(*args)
        except BaseException:
            _C.graph_capture_end(token, (), ())  # runs what was recorded, restores the mode
            raise
        plan, why = _C.graph_capture_end(token, args, out if isinstance(out, (list, tuple)) else (out,))
        if plan is not None and isinstance(out, (list, tuple)) and len(plans) < _MAX_PLANS:
            plans.append(plan)
        if why is not None and state["why"] is None:
            state["why"] = why
            if _EXPLAIN:
                print(f"torchtpu: a compiled graph will be recorded on each call: {why}", file=sys.stderr)
        return out

    run._boxed_call = True
    run._torchtpu_plans = plans
    run._torchtpu_state = state
    return run


def _compiler(gm, example_inputs):
    return _run_fused(gm)


def backend(gm, example_inputs, **kwargs):
    from torch._decomp import core_aten_decompositions
    from torch._dynamo.backends.common import aot_autograd

    return aot_autograd(fw_compiler=_compiler, bw_compiler=_compiler, keep_inference_input_mutations=True,
                        decompositions=core_aten_decompositions())(gm, example_inputs, **kwargs)
