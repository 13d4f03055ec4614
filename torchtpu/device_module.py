"""torch.tpu: the device module, shaped like torch.cuda."""

import os
import struct
from typing import Any, NoReturn, Union

import torch

from . import _C

# What the functions below accept as a device, as torch.cuda's do.
_Device = Union[torch.device, str, int, None]

# TORCHTPU_NUM_DEVICES on the CPU plugin, set at import (no plugin load)
_num_devices_setting = 1

_info = None


def _runtime():
    global _info
    if _info is None:
        _info = _C.info()
    return _info


_setup_error = None  # why the plugin cannot be used, found at import without loading it


def is_available() -> bool:
    """Whether a plugin was found (the platform's package is installed); it
    is loaded at the device's first use."""
    return _setup_error is None


def is_initialized() -> bool:
    """Whether the runtime has started: the plugin is loaded at the device's
    first use (a tensor on it, init(), get_device_properties()), not at import."""
    return _C.initialized()


def __getattr__(name: str) -> Any:
    # torch.utils.checkpoint saves the device's generator for the recomputed
    # forward only when the device module's `_initialized` is true (as
    # torch.cuda keeps it); without it a checkpointed dropout recomputes with
    # another mask and the gradients are wrong.
    if name == "_initialized":
        return _C.initialized()
    if name == "default_generators":
        return _default_generators()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def init() -> None:
    """Starts the runtime now (loads the plugin, makes its client), as
    torch.cuda.init() does; raises what is wrong with the plugin."""
    _runtime()


def _is_in_bad_fork():
    # torch skips seeding a device its process cannot use
    return _C.in_bad_fork()


def device_count() -> int:
    """The local devices: TORCHTPU_NUM_DEVICES on the CPU plugin (known
    without loading it), the devices the plugin reports otherwise; 0 when no
    plugin can be used."""
    if _setup_error is not None:
        return 0
    if not _C.initialized() and _platform_setting == "cpu":
        return _num_devices_setting
    try:
        return _C.device_count()
    except RuntimeError:
        return 0


_platform_setting = None  # the plugin's platform as found at import


def current_device() -> int:
    return _C.current_device()


def _index(device: _Device) -> int:
    """A device argument as a local device index (None: the current one)."""
    if device is None:
        return current_device()
    if isinstance(device, int):
        idx = device
    else:
        d = torch.device(device)
        if d.type != "tpu":
            raise ValueError(f"Expected a tpu device, but got: {d}")
        idx = current_device() if d.index is None else d.index
    return current_device() if idx == -1 else idx


def _checked(device: _Device) -> int:
    """_index, and a RuntimeError for an index this process has no device of
    (torch.cuda's queries raise on one too). In a process of one device, the
    process's LOCAL_RANK also names it: torchrun gives each process one
    device, and DeviceMesh, like training scripts, names it by LOCAL_RANK."""
    idx = _index(device)
    local = os.environ.get("LOCAL_RANK", "")
    if idx != 0 and local.isdigit() and idx == int(local) and device_count() == 1:
        idx = 0
    if idx < 0 or idx >= device_count():
        raise RuntimeError(f"tpu:{idx}: invalid device ordinal ({device_count()} local devices)")
    return idx


def set_device(device: _Device) -> None:
    """Selects the device that tensors made without a device index go to
    (torch.cuda.set_device; LOCAL_RANK as _checked says)."""
    idx = _checked(device)
    if idx != current_device():
        _C.current_device(idx)


def get_device_name(device: _Device = None) -> str:
    info = _runtime()
    platform = info["platform"]
    names = {"cpu": "XLA CPU", "cuda": "XLA CUDA", "tpu": "XLA TPU"}
    base = names.get(platform.lower(), f"XLA {platform}")
    kind = info.get("device_kind")
    return f"{base} ({kind})" if kind and kind.lower() != platform.lower() else base


def get_device_properties(device: _Device = None) -> dict[str, Any]:
    return dict(_runtime())


def synchronize(device: _Device = None) -> None:
    """Waits for every launched computation (strict mode runs them
    asynchronously); raises the error of one that failed."""
    _checked(device)
    _C.synchronize()


# ---- streams and events --------------------------------------------------
# A tpu device has one stream: every computation runs in the order it was
# launched (strict mode) or recorded (fused mode), so waits between streams
# are no-ops and every Stream object is that one stream.


class Stream:
    """The device's stream (torch.cuda.Stream's interface)."""

    def __init__(self, device: _Device = None, priority: int = 0, **kwargs: Any) -> None:
        self.priority = priority

    @property
    def device(self) -> torch.device:
        return torch.device("tpu", current_device())

    def synchronize(self) -> None:
        synchronize()

    def query(self) -> bool:
        """True when all work launched so far has finished (does not wait)."""
        return _C.idle()

    def wait_stream(self, stream: "Stream") -> None:
        pass  # one stream: already in order

    def wait_event(self, event: "Event") -> None:
        pass

    def record_event(self, event: "Event | None" = None) -> "Event":
        event = Event() if event is None else event
        event.record(self)
        return event

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Stream)

    def __hash__(self) -> int:
        return hash(("tpu", 0))

    def __repr__(self) -> str:
        return "<torch.tpu.Stream device=tpu:0 (the device's one stream)>"


_STREAM = Stream()


def current_stream(device: _Device = None) -> Stream:
    return _STREAM


def default_stream(device: _Device = None) -> Stream:
    return _STREAM


def set_stream(stream: Stream) -> None:
    pass


class stream:
    """Context manager selecting a stream; there is one, so it only checks
    its argument (torch.cuda.stream's interface; None is allowed)."""

    def __init__(self, stream: Stream | None) -> None:
        if stream is not None and not isinstance(stream, Stream):
            raise TypeError(f"torch.tpu.stream: expected a torch.tpu.Stream, got {type(stream).__name__}")
        self.stream = stream

    def __enter__(self) -> Stream | None:
        return self.stream

    def __exit__(self, *exc: object) -> bool:
        return False


# torch.cuda.stream(s) makes a torch.cuda.StreamContext; code written against
# either name works.
StreamContext = stream


class Event:
    """torch.cuda.Event's interface. record() launches the ops recorded so
    far (fused mode) without waiting; synchronize() waits for them (and for
    anything launched after: one stream). PJRT gives no device timestamps, so
    an event made with enable_timing=True waits for the work launched before
    it when recorded and takes the host's clock: elapsed_time() is the wall
    time between two drained points, in milliseconds."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> None:
        if interprocess:
            raise NotImplementedError("torch.tpu.Event: interprocess events are not supported")
        self.enable_timing = enable_timing
        self.blocking = blocking
        self._recorded = False
        self._time = None

    def record(self, stream: Stream | None = None) -> None:
        if self.enable_timing:
            synchronize()
            import time

            self._time = time.perf_counter()
        else:
            _C.flush()
        self._recorded = True

    def query(self) -> bool:
        return not self._recorded or _C.idle()

    def synchronize(self) -> None:
        if self._recorded:
            synchronize()

    def wait(self, stream: Stream | None = None) -> None:
        pass  # one stream: already in order

    def elapsed_time(self, end_event: "Event") -> float:
        if not (self.enable_timing and end_event.enable_timing):
            raise RuntimeError("Both events must be created with argument 'enable_timing=True'.")
        if self._time is None or end_event._time is None:
            raise RuntimeError("Both events must be recorded before calculating elapsed time.")
        return (end_event._time - self._time) * 1000.0

    def __repr__(self) -> str:
        return f"<torch.tpu.Event enable_timing={self.enable_timing} recorded={self._recorded}>"


def manual_seed(seed: int) -> None:
    _C.manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    _C.manual_seed(int(seed))


def seed() -> None:
    import random as pyrandom

    manual_seed(pyrandom.getrandbits(63))


def seed_all() -> None:
    """A random seed for every device (they share one generator: seed())."""
    seed()


def initial_seed() -> int:
    return _C.rng_state()[0]


def get_rng_state(device: _Device = None) -> torch.Tensor:
    """The generator's state as torch.cuda gives it: 16 bytes (uint8), the
    seed then the offset, each a little-endian uint64. DTensor's random ops
    read and move the offset in place (torch.distributed.tensor._random), so
    the layout is CUDA's Philox state, not one of our own."""
    _checked(device)
    s, off = _C.rng_state()
    return torch.frombuffer(bytearray(struct.pack("<QQ", s, off)), dtype=torch.uint8)


def set_rng_state(state: torch.Tensor, device: _Device = None) -> None:
    _checked(device)
    if not isinstance(state, torch.Tensor) or state.dtype != torch.uint8 or state.numel() != 16:
        what = f"{state.dtype} tensor of {state.numel()} elements" if isinstance(state, torch.Tensor) else type(state)
        raise ValueError(
            f"torch.tpu.set_rng_state expects the 16-byte uint8 tensor of torch.tpu.get_rng_state(), got a {what}"
        )
    s, off = struct.unpack("<QQ", bytes(state.detach().cpu().reshape(-1).tolist()))
    _C.rng_state(s, off)


def get_rng_state_all() -> list[torch.Tensor]:
    """A state per local device, as torch.cuda.get_rng_state_all gives them
    (checkpoints of accelerate and the HF Trainer save this list). The tpu
    devices of a process share one generator: every entry is its state."""
    return [get_rng_state(i) for i in range(device_count())]


def set_rng_state_all(new_states) -> None:
    """Restores get_rng_state_all()'s list. The devices share one generator,
    so the states must be equal (a list saved by get_rng_state_all is); a
    list of different states raises ValueError rather than dropping some."""
    states = list(new_states)
    if not states:
        raise ValueError("torch.tpu.set_rng_state_all expects the list of torch.tpu.get_rng_state_all(), got none")
    for i, st in enumerate(states):
        if not isinstance(st, torch.Tensor) or st.dtype != torch.uint8 or st.numel() != 16:
            set_rng_state(st)  # raises the same error as for one state
        if i and not torch.equal(st.detach().cpu().reshape(-1), states[0].detach().cpu().reshape(-1)):
            raise ValueError(
                f"torch.tpu.set_rng_state_all: the states of device 0 and device {i} differ, but the tpu devices "
                "of a process share one generator (torch.tpu.get_rng_state_all gives equal states)"
            )
    set_rng_state(states[0])


def _default_generators() -> tuple[torch.Generator, ...]:
    """torch.tpu.default_generators: a torch.Generator per local device, as
    torch.cuda.default_generators. The devices share one generator, so every
    one of them reads and sets the same state (torch.tpu.manual_seed's);
    torch.Generator(device="tpu") makes a generator of its own."""
    from . import _native

    if not _native.GENERATORS:
        raise RuntimeError(
            "torch.tpu.default_generators needs torchtpu's C++ extension (torchtpu._device_guard), "
            "which was not built or not loaded"
        )
    return tuple(_native._GUARD.default_generator(i) for i in range(device_count()))


def get_amp_supported_dtype() -> list[torch.dtype]:
    return [torch.bfloat16, torch.float16]


class device:
    """Context manager that selects a tpu device, like torch.cuda.device:
    inside it, tensors made without a device index go to that device."""

    def __init__(self, device: _Device) -> None:
        if device is not None and not isinstance(device, int):
            device = torch.device(device)
            if device.type != "tpu":
                raise ValueError(f"torch.tpu.device expects a tpu device, got {device}")
            device = device.index
        self.idx = -1 if device is None else device
        self.prev = -1

    def __enter__(self) -> "device":
        if self.idx >= 0:
            self.prev = current_device()
            set_device(self.idx)
        return self

    def __exit__(self, *exc: object) -> bool:
        if self.prev >= 0:
            set_device(self.prev)
        return False


class device_of(device):
    """Selects the device of a tensor (a no-op for CPU tensors)."""

    def __init__(self, obj: torch.Tensor) -> None:
        super().__init__(obj.get_device() if obj.device.type == "tpu" else None)


# Memory. The runtime counts the bytes of every live device buffer (for any
# plugin); a plugin that keeps its own statistics (libtpu, XLA's CUDA plugin)
# also reports its in-use bytes and limit. Nothing is cached or reserved
# beyond the live buffers, so allocated and reserved are the same figure.


def _memory(device: _Device = None, reset: bool = False) -> dict[str, int]:
    return _C.memory(reset, _checked(device))


def memory_stats(device: _Device = None) -> dict[str, int]:
    m = _memory(device)
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


def memory_summary(device: _Device = None, abbreviated: bool = False) -> str:
    """A short text report of memory_stats() (torch.cuda.memory_summary's
    role; torchtpu caches nothing, so allocated and reserved coincide)."""
    lines = [f"torch.tpu memory summary (tpu:{_index(device)})"]
    for k, v in memory_stats(device).items():
        lines.append(f"  {k:<32} {v / 2**20:12.2f} MiB")
    return "\n".join(lines) + "\n"


def memory_allocated(device: _Device = None) -> int:
    """Bytes of the live buffers on the device (the current one by default)."""
    return _memory(device)["allocated"]


def max_memory_allocated(device: _Device = None) -> int:
    return _memory(device)["peak"]


def memory_reserved(device: _Device = None) -> int:
    return memory_allocated(device)


def max_memory_reserved(device: _Device = None) -> int:
    return max_memory_allocated(device)


def reset_peak_memory_stats(device: _Device = None) -> None:
    _C.memory(True, _checked(device))


def reset_max_memory_allocated(device: _Device = None) -> None:
    reset_peak_memory_stats(device)


def empty_cache() -> None:
    # Buffers are freed when their last tensor dies; nothing is cached.
    return None


def mem_get_info(device: _Device = None) -> tuple[int, int]:
    """(free, total) bytes of the device. From the plugin where it reports a
    limit; on XLA's CPU plugin the device memory is the host's memory."""
    m = _memory(device)
    if m["device_limit"] > 0:
        used = m["device_in_use"] if m["device_in_use"] >= 0 else m["allocated"]
        return m["device_limit"] - used, m["device_limit"]
    if _runtime()["platform"].lower() == "cpu":
        import os

        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        free = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
        return free, total
    raise RuntimeError(f"torch.tpu.mem_get_info: the {_runtime()['platform']} PJRT plugin reports no memory limit")


def is_bf16_supported(including_emulation: bool = True) -> bool:
    return True


# Precision of float32 matmuls and convolutions, as XLA's operand precision:
# "highest" (full f32, PyTorch's default), "high" (3 passes of bfloat16 on a
# TPU), "medium" (one bfloat16 pass, the TPU's fastest). PyTorch's own knob,
# torch.set_float32_matmul_precision, sets it too. On XLA's CPU plugin every
# setting computes in full f32.
_PRECISIONS = ("medium", "high", "highest")


def set_matmul_precision(precision: str) -> None:
    if precision not in _PRECISIONS:
        raise ValueError(f"torch.tpu.set_matmul_precision: expected one of {_PRECISIONS}, got {precision!r}")
    _C.matmul_precision(_PRECISIONS.index(precision))


def get_matmul_precision() -> str:
    return _PRECISIONS[_C.matmul_precision()]


# ---- graphs: torch.cuda.graph's interface -------------------------------------------------
#
# A capture records every tpu op of the code inside it (in fused mode) into
# one program and runs none of them; replay() runs that program on the
# current contents of the tensors it reads, and writes its results into the
# tensors the code wrote or made, as CUDA graphs do: new inputs are copied
# into the captured input tensors (static_x.copy_(x)), and the captured loss,
# gradients and parameters hold the replay's values. As with CUDA graphs,
# Python code inside the capture runs only once, values fixed at capture
# (Python numbers, a learning rate) stay fixed, a sync point inside the
# capture (.item(), printing) is an error, and lazily made state (optimizer
# moments) should be made by a few warm-up steps before capturing. Dropout
# draws new random numbers at each replay. torch.compile'd code inside a
# capture joins it.


class TPUGraph:
    """torch.cuda.CUDAGraph's interface: capture_begin/capture_end (or the
    torch.tpu.graph context manager), replay(), reset()."""

    def __init__(self, keep_graph: bool = False) -> None:
        self._plan = None
        self._token = None

    def capture_begin(self, pool: Any = None, capture_error_mode: str = "global") -> None:
        if self._token is not None:
            raise RuntimeError("TPUGraph.capture_begin: this graph is already capturing")
        self.reset()
        self._token = _C.graph_capture_begin(True)

    def capture_end(self, _keep: bool = True) -> None:
        if self._token is None:
            raise RuntimeError("TPUGraph.capture_end: capture_begin was not called")
        token, self._token = self._token, None
        self._plan = _C.whole_end(token, _keep)

    def instantiate(self) -> None:
        pass

    def replay(self) -> None:
        if self._token is not None:
            raise RuntimeError("TPUGraph.replay: the graph is still capturing")
        if self._plan is not None:
            _C.whole_replay(self._plan)

    def reset(self) -> None:
        self._plan = None

    def pool(self) -> tuple[int, int]:
        return graph_pool_handle()

    def __repr__(self) -> str:
        return f"torch.tpu.TPUGraph(captured={self._plan is not None})"


_pool_ids = iter(range(1, 1 << 62))


def graph_pool_handle() -> tuple[int, int]:
    """An opaque memory-pool handle (buffers are not pooled per graph here)."""
    return (0, next(_pool_ids))


def is_current_stream_capturing() -> bool:
    return _C.whole_capturing()


class graph:
    """Captures the code inside it into tpu_graph (torch.cuda.graph's
    interface). An exception inside drops the capture."""

    def __init__(
        self, tpu_graph: TPUGraph, pool: Any = None, stream: Stream | None = None, capture_error_mode: str = "global"
    ) -> None:
        if not isinstance(tpu_graph, TPUGraph):
            raise TypeError(f"torch.tpu.graph: expected a torch.tpu.TPUGraph, got {type(tpu_graph).__name__}")
        self.tpu_graph = tpu_graph

    def __enter__(self) -> "graph":
        synchronize()
        self.tpu_graph.capture_begin()
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> bool:
        self.tpu_graph.capture_end(_keep=exc_type is None)
        return False


def make_graphed_callables(
    callables: Any,
    sample_args: Any,
    num_warmup_iters: int = 3,
    allow_unused_input: bool = False,
    pool: Any = None,
) -> NoReturn:
    raise NotImplementedError(
        "torch.tpu.make_graphed_callables is not supported yet: capture the whole training step with "
        "torch.tpu.graph (forward, backward and optimizer step in one graph) instead"
    )


class OutOfMemoryError(torch.OutOfMemoryError, MemoryError):
    """The tpu ran out of memory (the message names the op or program that
    asked for it). A torch.OutOfMemoryError, as CUDA raises, and a
    MemoryError; torch.tpu.OutOfMemoryError and torchtpu.OutOfMemoryError."""


def _random_module():
    """torch.tpu.random, as torch.cuda.random: the generator's functions
    (the HF Trainer restores checkpoints through device_module.random)."""
    import types

    m = types.ModuleType("torch.tpu.random", "The tpu generator's functions (torch.cuda.random's names).")
    for name in (
        "manual_seed",
        "manual_seed_all",
        "seed",
        "seed_all",
        "initial_seed",
        "get_rng_state",
        "set_rng_state",
        "get_rng_state_all",
        "set_rng_state_all",
    ):
        setattr(m, name, globals()[name])
    return m


random = _random_module()
