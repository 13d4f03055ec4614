"""torch.tpu: the device module, shaped like torch.cuda."""

import torch

from . import _C

_info = None


def _runtime():
    global _info
    if _info is None:
        _info = _C.info()
    return _info


def is_available():
    return True


def is_initialized():
    return True


def _is_in_bad_fork():
    return False


def device_count():
    # One device per process (torch's Python PrivateUse1 guard knows one).
    return 1


def current_device():
    return 0


def set_device(device):
    idx = torch.device(device).index if not isinstance(device, int) else device
    if idx not in (None, 0):
        raise ValueError(f"torchtpu uses one device per process; got device index {idx}")


def get_device_name(device=None):
    info = _runtime()
    platform = info["platform"]
    names = {"cpu": "XLA CPU", "cuda": "XLA CUDA", "tpu": "XLA TPU"}
    base = names.get(platform.lower(), f"XLA {platform}")
    kind = info.get("device_kind")
    return f"{base} ({kind})" if kind and kind.lower() != platform.lower() else base


def get_device_properties(device=None):
    return dict(_runtime())


def synchronize(device=None):
    """Waits for every launched computation (strict mode runs them
    asynchronously); raises the error of one that failed."""
    _C.synchronize()


def manual_seed(seed):
    _C.manual_seed(int(seed))


def manual_seed_all(seed):
    _C.manual_seed(int(seed))


def seed():
    import random

    manual_seed(random.getrandbits(63))


def initial_seed():
    return _C.rng_state()[0]


def get_rng_state(device=None):
    s, off = _C.rng_state()
    return torch.tensor([s & 0x7FFFFFFFFFFFFFFF, s >> 63, off], dtype=torch.int64)


def set_rng_state(state, device=None):
    s = int(state[0]) | (int(state[1]) << 63)
    _C.rng_state(s, int(state[2]))


def get_amp_supported_dtype():
    return [torch.bfloat16, torch.float16]



class device:
    """Context manager that selects a tpu device, like torch.cuda.device.
    One device per process, so it only checks the index."""

    def __init__(self, device):
        if device is not None and not isinstance(device, int):
            device = torch.device(device)
            if device.type != "tpu":
                raise ValueError(f"torch.tpu.device expects a tpu device, got {device}")
            device = device.index
        set_device(0 if device is None or device == -1 else device)
        self.idx = 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class device_of(device):
    """Selects the device of a tensor (a no-op for CPU tensors)."""

    def __init__(self, obj):
        super().__init__(obj.get_device() if obj.device.type == "tpu" else None)


# Memory. The runtime counts the bytes of every live device buffer (for any
# plugin); a plugin that keeps its own statistics (libtpu, XLA's CUDA plugin)
# also reports its in-use bytes and limit. Nothing is cached or reserved
# beyond the live buffers, so allocated and reserved are the same figure.


def memory_stats(device=None):
    m = _C.memory()
    out = {
        "allocated_bytes.all.current": m["allocated"],
        "allocated_bytes.all.peak": m["peak"],
        "reserved_bytes.all.current": m["allocated"],
        "reserved_bytes.all.peak": m["peak"],
    }
    if m["device_in_use"] >= 0:
        out["device_bytes_in_use"] = m["device_in_use"]
    if m["device_peak"] >= 0:
        out["device_peak_bytes_in_use"] = m["device_peak"]
    if m["device_limit"] >= 0:
        out["device_bytes_limit"] = m["device_limit"]
    return out


def memory_allocated(device=None):
    return _C.memory()["allocated"]


def max_memory_allocated(device=None):
    return _C.memory()["peak"]


def memory_reserved(device=None):
    return memory_allocated(device)


def max_memory_reserved(device=None):
    return max_memory_allocated(device)


def reset_peak_memory_stats(device=None):
    _C.memory(True)


def reset_max_memory_allocated(device=None):
    _C.memory(True)


def empty_cache():
    # Buffers are freed when their last tensor dies; nothing is cached.
    return None


def mem_get_info(device=None):
    """(free, total) bytes of the device. From the plugin where it reports a
    limit; on XLA's CPU plugin the device memory is the host's memory."""
    m = _C.memory()
    if m["device_limit"] > 0:
        used = m["device_in_use"] if m["device_in_use"] >= 0 else m["allocated"]
        return m["device_limit"] - used, m["device_limit"]
    if _runtime()["platform"].lower() == "cpu":
        import os

        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        free = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
        return free, total
    raise RuntimeError(f"torch.tpu.mem_get_info: the {_runtime()['platform']} PJRT plugin reports no memory limit")


def is_bf16_supported(including_emulation=True):
    return True


# Precision of float32 matmuls and convolutions, as XLA's operand precision:
# "highest" (full f32, PyTorch's default), "high" (3 passes of bfloat16 on a
# TPU), "medium" (one bfloat16 pass, the TPU's fastest). PyTorch's own knob,
# torch.set_float32_matmul_precision, sets it too. On XLA's CPU plugin every
# setting computes in full f32.
_PRECISIONS = ("medium", "high", "highest")


def set_matmul_precision(precision):
    if precision not in _PRECISIONS:
        raise ValueError(f"torch.tpu.set_matmul_precision: expected one of {_PRECISIONS}, got {precision!r}")
    _C.matmul_precision(_PRECISIONS.index(precision))


def get_matmul_precision():
    return _PRECISIONS[_C.matmul_precision()]
