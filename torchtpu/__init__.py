"""torchtpu: a native PyTorch device, "tpu", run by XLA through a PJRT plugin.

Importing this package (or only torch, through the torch.backends entry point)
registers the device. The work is done by the C core in torchtpu._C; this
package only wires it into PyTorch.
"""

import os as _os

import torch

from . import _plugin, _registry
from . import device_module as _device_module
from ._C import metrics as _metrics

__version__ = "0.1.0"

_registry.setup(_device_module)


def metrics():
    """Counters of the core: ops dispatched, programs compiled, cache hits and
    misses, compile and execute seconds, host<->device bytes, live buffers."""
    return _metrics()


def metrics_report():
    """The counters of metrics() as an aligned text table."""
    m = metrics()
    width = max(len(k) for k in m)
    lines = ["torchtpu metrics"]
    for k, v in m.items():
        lines.append(f"  {k:<{width}}  {v:.3f}" if isinstance(v, float) else f"  {k:<{width}}  {v}")
    return "\n".join(lines)


def _report_at_exit():
    import sys

    print(metrics_report(), file=sys.stderr)


if _os.environ.get("TORCHTPU_METRICS", "") not in ("", "0"):
    import atexit

    atexit.register(_report_at_exit)


def runtime_info():
    """The PJRT platform, plugin path and versions in use."""
    return _registry.runtime_info()


__all__ = ["metrics", "metrics_report", "runtime_info", "__version__"]

