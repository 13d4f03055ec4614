"""Lightning on the tpu device: an accelerator named "torchtpu".

In Lightning, accelerator="tpu" means torch_xla. This module adds one for
torchtpu's "tpu" device:

    import torchtpu.lightning  # registers "torchtpu" with Lightning's AcceleratorRegistry

    trainer = Trainer(accelerator="torchtpu", devices=1, precision="bf16-mixed")
    # or Trainer(accelerator=torchtpu.lightning.TPUAccelerator(), ...)

Importing torchtpu never imports Lightning: only this module does, and only a
user who has Lightning imports it. It serves the `lightning` package and the
standalone `pytorch_lightning` package, whichever are installed.

Lightning knows its own accelerators only: for one device of another one, it
picks a SingleDeviceStrategy on "cpu", and for "16-mixed"/"bf16-mixed" a
MixedPrecision plugin that autocasts on "cuda" (which does nothing to tpu
tensors). TPUAccelerator.setup(), which the Trainer calls before it moves the
model, points both at the tpu device. Thin by design: no math here.
"""

import importlib
import importlib.util
from typing import Any

import torch

import torchtpu  # noqa: F401  (registers the device, torch.tpu included, without the autoload)

_NAME = "torchtpu"


def _import_flavours() -> list:
    """The installed Lightning packages (lightning.pytorch, pytorch_lightning),
    imported; the first one is the class's real base, the others get it as a
    virtual subclass."""
    found = []
    for name in ("lightning.pytorch", "pytorch_lightning"):
        top = name.split(".")[0]
        if importlib.util.find_spec(top) is None:
            continue
        try:
            found.append(importlib.import_module(name))
        except ImportError:
            if not found:
                raise  # the only flavour is broken: say why
            # a second, broken flavour is not the one in use
    if not found:
        raise ModuleNotFoundError(
            "torchtpu.lightning needs PyTorch Lightning: pip install lightning (or pytorch-lightning)",
            name="lightning",
        )
    return found


_FLAVOURS = _import_flavours()
_pl = _FLAVOURS[0]
_Accelerator = importlib.import_module(_pl.__name__ + ".accelerators").Accelerator


def _classes(module: str, name: str) -> tuple:
    """A class of every flavour (module relative to the flavour's root)."""
    return tuple(getattr(importlib.import_module(f"{pl.__name__}.{module}"), name) for pl in _FLAVOURS)


def _device_count() -> int:
    return torch.tpu.device_count()


def _no_device_error() -> RuntimeError:
    return RuntimeError(
        "TPUAccelerator: no tpu device can be used (torch.tpu.device_count() is 0); torch.tpu.init() raises why"
    )


class TPUAccelerator(_Accelerator):
    """Lightning accelerator for torchtpu's "tpu" device (registered as "torchtpu")."""

    def setup_device(self, device: torch.device) -> None:
        device = torch.device(device)
        if device.type == "cpu":
            # Lightning's automatic strategy for one device of an accelerator it
            # does not know is a SingleDeviceStrategy on the CPU: setup() below,
            # which the Trainer calls before it moves the model, moves it to the tpu.
            return
        if device.type != "tpu":
            raise ValueError(f"TPUAccelerator runs on tpu devices, but the strategy chose {device}")
        torch.tpu.set_device(torch.tpu.current_device() if device.index is None else device.index)

    def setup(self, trainer: Any) -> None:
        strategy = trainer.strategy
        if isinstance(strategy, _classes("strategies", "SingleDeviceStrategy")) and strategy.root_device.type == "cpu":
            # No public setter: the strategy keeps its device in _root_device.
            strategy._root_device = _chosen_device(trainer)
            self.setup_device(strategy.root_device)
        if strategy.root_device.type != "tpu":
            raise ValueError(
                f"TPUAccelerator: the strategy {type(strategy).__name__} runs on {strategy.root_device}, not on a tpu "
                "device; leave the strategy to the Trainer (one device) or give it tpu devices"
            )
        if isinstance(strategy, _classes("strategies", "DDPStrategy")) and not torch.cuda.is_available():
            # Lightning's DDPStrategy builds DistributedDataParallel under a
            # torch.cuda stream for every device but the CPU; without CUDA that
            # fails with "torch.cuda.Stream requires CUDA support".
            raise RuntimeError(
                f"TPUAccelerator: Lightning's {type(strategy).__name__} (the Trainer's choice for devices > 1) needs "
                "CUDA for a device other than the CPU; train on one tpu device (devices=1), or run torch's "
                "DistributedDataParallel under torchrun without Lightning (torchtpu's docs/distributed.md)"
            )
        plugin = strategy.precision_plugin
        if isinstance(plugin, _classes("plugins.precision", "MixedPrecision")) and plugin.device != "tpu":
            # Lightning autocasts on "cuda" for accelerators it does not know.
            plugin.device = "tpu"
            if plugin.scaler is not None and getattr(plugin.scaler, "_device", "tpu") != "tpu":
                # "16-mixed": the scaler Lightning made is CUDA's (disabled without CUDA)
                plugin.scaler = torch.amp.GradScaler("tpu")

    def teardown(self) -> None:
        torch.tpu.empty_cache()

    def get_device_stats(self, device: Any) -> dict[str, Any]:
        """torch.tpu.memory_stats of the device (bytes allocated and peak, and
        the plugin's own figures where it reports them)."""
        stats = getattr(torch.tpu, "memory_stats", None)
        return dict(stats(device)) if stats is not None else {}

    @staticmethod
    def parse_devices(devices: Any) -> list[int]:
        """The local device indices that Trainer(devices=...) names: a number
        of devices (-1: all), a list of indices, or a string of either ("2",
        "-1", "0,1", "1," for index 1 alone)."""
        given = devices
        if isinstance(devices, str):
            text = devices.strip()
            try:
                if text == "auto":
                    devices = -1
                elif "," in text:
                    devices = [int(part) for part in text.split(",") if part.strip()]
                else:
                    devices = int(text)
            except ValueError:
                raise ValueError(
                    f"TPUAccelerator: devices={given!r} is not a number of devices, -1 (all) or a list of indices "
                    "like '0,1'"
                ) from None
        count = _device_count()
        if count == 0:
            raise _no_device_error()
        if isinstance(devices, int) and not isinstance(devices, bool):
            n = count if devices == -1 else devices
            if n < 1:
                raise ValueError(f"TPUAccelerator: devices={given!r}: give a positive number of devices, or -1 for all")
            if n > count:
                raise ValueError(
                    f"TPUAccelerator: devices={given!r}, but there are {count} tpu device(s) "
                    "(TORCHTPU_NUM_DEVICES sets the number on the CPU plugin)"
                )
            return list(range(n))
        if isinstance(devices, (list, tuple)):
            idx = list(devices)
            bad = [i for i in idx if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < count]
            if not idx or bad or len(set(idx)) != len(idx):
                raise ValueError(
                    f"TPUAccelerator: devices={given!r}: expected distinct device indices in [0, {count}) "
                    f"({count} tpu device(s) here)"
                )
            return idx
        raise TypeError(
            f"TPUAccelerator: devices={given!r}: expected an int, a list of device indices or a string, "
            f"not {type(given).__name__}"
        )

    @staticmethod
    def get_parallel_devices(devices: Any) -> list[torch.device]:
        indices = range(devices) if isinstance(devices, int) else devices
        return [torch.device("tpu", i) for i in indices]

    @staticmethod
    def auto_device_count() -> int:
        return _device_count()

    @staticmethod
    def is_available() -> bool:
        # a plugin was found (found at import; it is loaded at the device's first use)
        return torch.tpu.is_available()

    @staticmethod
    def name() -> str:
        return _NAME

    @classmethod
    def register_accelerators(cls, accelerator_registry: Any) -> None:
        accelerator_registry.register(cls.name(), cls, description="torchtpu's tpu device (torch.tpu)", override=True)


def _chosen_device(trainer: Any) -> torch.device:
    """The tpu device the Trainer's devices= chose: the connector's parallel
    devices (Lightning keeps no public copy for one device), else the current
    tpu device."""
    chosen = getattr(getattr(trainer, "_accelerator_connector", None), "_parallel_devices", None) or []
    for device in chosen:
        if isinstance(device, torch.device) and device.type == "tpu":
            return device
    return torch.device("tpu", torch.tpu.current_device())


for _flavour in _FLAVOURS:
    _base = importlib.import_module(_flavour.__name__ + ".accelerators")
    if not issubclass(TPUAccelerator, _base.Accelerator):
        _base.Accelerator.register(TPUAccelerator)  # an ABC: isinstance() holds in that flavour too
    TPUAccelerator.register_accelerators(_base.AcceleratorRegistry)

__all__ = ["TPUAccelerator"]
