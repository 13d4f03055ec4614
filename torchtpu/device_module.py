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
    # Debug eager mode runs every op to completion before returning.
    return None


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

