"""torchtpu: a native PyTorch device, "tpu", run by XLA through a PJRT plugin.

Importing this package (or only torch, through the torch.backends entry point)
registers the device. The work is done by the C core in torchtpu._C; this
package only wires it into PyTorch.
"""

import os as _os
import weakref as _weakref
from typing import Any as _Any

import torch

from . import _C, _distributed, _registry, _settings
from . import device_module as _device_module
from . import replicas as replicas
from ._C import metrics as _metrics
from ._jax import jax_op, stablehlo_op

__version__ = "0.1.0"

# The plugins log through absl (TensorFlow's C++ logging): unless the user
# chose a level, INFO lines (the CPU plugin's device count, absl's line about
# logging before its start) are not printed on every process's stderr;
# warnings and errors are. Set before a plugin is loaded (at the device's
# first use), as PyTorch/XLA does.
_os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")


OutOfMemoryError = _device_module.OutOfMemoryError


_registry.setup(_device_module)
_distributed.setup()


def metrics() -> dict[str, int | float]:
    """Counters of the core: ops dispatched, programs compiled, cache hits and
    misses, compile and execute seconds, host<->device bytes, live buffers;
    ops_not_registered: lowered ATen overloads this torch lacks; and
    collectives, collective_seconds: calls of torch.distributed collectives
    on the tpu backend and their wall time; profiler_records: what the core
    recorded for torch.profiler (none while no profile runs)."""
    m = _metrics()
    m["ops_not_registered"] = len(_registry.NOT_REGISTERED)
    m.update(_distributed.STATS)
    return m


def get_eager_mode() -> str:
    """The current eager mode: "debug", "strict" or "fused"."""
    return _C.eager_mode()


class eager_mode:
    """Sets the eager mode: torchtpu.eager_mode("debug") for the rest of the
    process, or `with torchtpu.eager_mode("debug"):` for a block.

    - "fused" (the default): ops are recorded, not run, and every recorded op
      whose result is still needed runs as one XLA program at the next sync
      point (.cpu(), .item(), printing, torch.tpu.synchronize(), torch.save,
      an op whose output size depends on data, a copy into a tensor the
      recorded ops use, or TORCHTPU_FUSED_MAX_OPS ops). A training loop
      settles into one cached program per step. A failed value check is
      raised at the sync point, naming the op and the lines that called it.
    - "strict": ops return once launched and run asynchronously, one program
      per op; a failure is raised at the next sync point, naming the op.
    - "debug": every op runs to completion before it returns; an error names
      the op that failed, where it was called.
    """

    def __init__(self, mode: str) -> None:
        self.previous = get_eager_mode()
        self.mode = mode
        _C.eager_mode(mode)  # raises ValueError for an unknown mode

    def __enter__(self) -> "eager_mode":
        return self

    def __exit__(self, *exc: object) -> bool:
        _C.eager_mode(self.previous)
        return False


_backward_passes_seen = _weakref.WeakKeyDictionary()  # optimizer -> _C.backward_passes() at its last step
_backward_passes_any = 0  # at the last step of any optimizer (an optimizer's first step compares with it)


def _after_optimizer_step(optimizer, args, kwargs):
    """An optimizer step ends a training step: in fused mode the ops recorded
    so far are launched then, as one program, without waiting for it. A loop
    that never reads a value back still runs one program per step (not one
    per TORCHTPU_FUSED_MAX_OPS ops, cut anywhere), and the host records the
    next step while the program runs (at most two steps in flight).

    Where a backward pass began since this optimizer's last step (or, for its
    first step, since any optimizer's last step), the
    backward pass is the step's boundary instead: its first op launched what
    was recorded before it (the rest of the last step and this forward pass),
    and the ops recorded from there on (backward, clipping, this optimizer
    step) stay recorded until the next one. The program then runs while the
    host records, and the loop still runs one program per step. With the
    step's boundary at the optimizer (TORCHTPU_STEP_BOUNDARY) the first op
    after the optimizer steps launches the whole step instead (the C side).
    No-op in the other modes and inside torch.compile (a compiled optimizer
    step is a graph of its own)."""
    if torch.compiler.is_compiling():
        return
    if _C.optimizer_step(False):
        return  # the step's program ends here: the next op launches it (TORCHTPU_STEP_BOUNDARY)
    global _backward_passes_any
    passes = _C.backward_passes()
    last = _backward_passes_seen.get(optimizer, _backward_passes_any)
    _backward_passes_seen[optimizer] = _backward_passes_any = passes
    if passes > last:
        return
    _C.flush(True)


def _before_optimizer_step(optimizer, args, kwargs):
    """Inside a torch.tpu.graph capture, an optimizer that keeps its step count
    on the host would bake this step's bias correction into the graph (as
    CUDA graphs would): it must be made with capturable=True."""
    if torch.compiler.is_compiling():
        return
    _C.optimizer_step(True)
    if not _C.whole_capturing():
        return
    for group in optimizer.param_groups:
        if group.get("capturable") is False and any(p.device.type == "tpu" for p in group["params"]):
            raise RuntimeError(
                f"{type(optimizer).__name__}.step() inside a torch.tpu.graph capture needs capturable=True "
                f"(its step count and bias correction are otherwise host values, fixed at capture)"
            )


from torch.optim.optimizer import register_optimizer_step_post_hook as _register_post_hook  # noqa: E402
from torch.optim.optimizer import register_optimizer_step_pre_hook as _register_pre_hook  # noqa: E402

_register_pre_hook(_before_optimizer_step)

_register_post_hook(_after_optimizer_step)


def metrics_report() -> str:
    """metrics() as text: grouped (ops, programs, disk cache, execution,
    memory and transfers, torch.distributed, what launched the fused
    programs), each with what it counts and its unit."""
    from . import _report

    return _report.report(metrics())


def _report_at_exit():
    import sys

    print(metrics_report(), file=sys.stderr)


if _settings.flag("TORCHTPU_METRICS"):
    import atexit

    atexit.register(_report_at_exit)


def aot_report():
    """What the TPU compiler said of every program compiled in this process,
    when TORCHTPU_AOT_TOPOLOGY names a TPU topology (v5e:2x2 ...): an
    AotReport (print it for a summary) whose .programs are AotPrograms, each
    with its name, ok or error, flops, bytes accessed, transcendentals,
    optimal_seconds, the HBM it needs per chip (argument, output, temp, peak,
    code), the chip's HBM, its serialized size and compile time."""
    from . import _aot

    return _aot.report()


def runtime_info() -> dict[str, _Any]:
    """The PJRT platform, plugin path and versions in use."""
    return _registry.runtime_info()


__all__ = [
    "aot_report",
    "jax_op",
    "stablehlo_op",
    "eager_mode",
    "get_eager_mode",
    "metrics",
    "metrics_report",
    "runtime_info",
    "__version__",
]
