"""Lightning on tpu (torchtpu/lightning.py): the "torchtpu" accelerator in the
registry, a Trainer fit of a small MLP on tpu under bf16 autocast (parameters
on the device and float32, a matmul's output bfloat16, the weights trained),
float16 autocast with a tpu GradScaler, and a float32 fit whose losses match
the same fit on CPU. Lightning is a test requirement (make setup installs it):
without it this file fails, it does not skip."""

import os
import subprocess
import sys
from types import SimpleNamespace

import lightning.pytorch as L
import pytest
import torch
from lightning.pytorch.accelerators import AcceleratorRegistry, XLAAccelerator
from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy
from torch.utils.data import DataLoader, TensorDataset

import torchtpu.lightning as tl

STEPS = 8

# num_workers=0 on purpose (tiny data): on a machine with more cores Lightning advises adding workers
pytestmark = pytest.mark.filterwarnings("ignore:The '.*dataloader' does not have many workers")


class MLP(L.LightningModule):
    """Two layers; records each step's loss and what the step saw."""

    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
        self.losses = []
        self.seen = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        hidden = self.net[0](x)  # a matmul (addmm) under the Trainer's autocast
        w = self.net[0].weight
        self.seen.append((hidden.dtype, w.dtype, w.device, torch.is_autocast_enabled("tpu")))
        out = self.net[2](self.net[1](hidden))
        loss = torch.nn.functional.mse_loss(out.float(), y)
        self.losses.append(loss.detach())
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _data():
    # one full batch of a smooth target: every step sees the same batch, so
    # the loss goes down step after step
    g = torch.Generator().manual_seed(0)
    x = torch.randn(32, 8, generator=g)
    y = torch.tanh(x[:, :4].sum(1, keepdim=True))
    return DataLoader(TensorDataset(x, y), batch_size=32, num_workers=0)


def _fit(tmp_path, accelerator, precision):
    torch.manual_seed(0)
    model = MLP()
    initial = [p.detach().clone() for p in model.parameters()]
    trainer = L.Trainer(
        accelerator=accelerator,
        devices=1,
        precision=precision,
        max_steps=STEPS,
        enable_checkpointing=False,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(model, _data())
    losses = [float(loss) for loss in model.losses]
    assert len(losses) == STEPS
    return model, trainer, initial, losses


def test_registry_and_devices():
    assert AcceleratorRegistry["torchtpu"]["accelerator"] is tl.TPUAccelerator
    assert isinstance(AcceleratorRegistry.get("torchtpu"), tl.TPUAccelerator)
    assert AcceleratorRegistry["tpu"]["accelerator"] is XLAAccelerator  # Lightning's own "tpu" is untouched
    A = tl.TPUAccelerator
    assert A.name() == "torchtpu"
    assert A.is_available() is True and A.is_available() == torch.tpu.is_available()
    assert A.auto_device_count() == torch.tpu.device_count() >= 1
    assert A.parse_devices(1) == [0] and A.parse_devices(-1) == list(range(torch.tpu.device_count()))
    assert A.get_parallel_devices(A.parse_devices("0,")) == [torch.device("tpu", 0)]
    n = torch.tpu.device_count()
    with pytest.raises(ValueError, match=f"devices={n + 1}, but there are {n} tpu device"):
        A.parse_devices(n + 1)
    with pytest.raises(ValueError, match="expected distinct device indices"):
        A.parse_devices([0, 0])
    with pytest.raises(ValueError, match="runs on tpu devices"):
        A().setup_device(torch.device("meta"))
    held = torch.ones(256, device="tpu")
    torch.tpu.synchronize()  # fused mode: the buffer exists once its program has run
    stats = A().get_device_stats(held.device)
    assert stats["allocated_bytes.all.current"] >= held.nbytes


def test_strategies_it_cannot_serve_are_refused_clearly():
    on_meta = SimpleNamespace(strategy=SingleDeviceStrategy(device="meta"))
    with pytest.raises(ValueError, match="runs on meta, not on a tpu device"):
        tl.TPUAccelerator().setup(on_meta)
    if not torch.cuda.is_available():
        ddp = SimpleNamespace(strategy=DDPStrategy(parallel_devices=[torch.device("tpu", 0)]))
        with pytest.raises(RuntimeError, match="DDPStrategy .* needs CUDA"):
            tl.TPUAccelerator().setup(ddp)


def test_importing_torchtpu_does_not_import_lightning():
    code = (
        "import sys, torch, torchtpu; torch.ones(1, device='tpu'); "
        "bad = [m for m in sys.modules if m.split('.')[0] in ('lightning', 'pytorch_lightning', 'lightning_fabric')]; "
        "assert not bad, bad"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=dict(os.environ))
    assert p.returncode == 0, p.stderr[-2000:]


def test_fit_bf16_mixed_on_tpu(tmp_path):
    model, trainer, initial, losses = _fit(tmp_path, "torchtpu", "bf16-mixed")
    assert isinstance(trainer.accelerator, tl.TPUAccelerator)
    assert trainer.strategy.root_device == torch.device("tpu", 0)
    assert trainer.precision_plugin.device == "tpu"
    for hidden_dtype, weight_dtype, weight_device, autocast_on in model.seen:
        assert weight_device.type == "tpu" and weight_dtype == torch.float32
        assert hidden_dtype == torch.bfloat16 and autocast_on
    assert losses[-1] < losses[0], losses
    final = list(model.parameters())  # Lightning moves the model back to the CPU after fit
    assert all(p.dtype == torch.float32 for p in final)
    assert not all(torch.equal(a, b.detach().cpu()) for a, b in zip(initial, final))


# Lightning makes CUDA's GradScaler for "16-mixed" when it builds the Trainer (a warning without CUDA);
# the accelerator replaces it with a tpu one at fit.
@pytest.mark.filterwarnings("ignore:torch.cuda.amp.GradScaler is enabled, but CUDA is not available")
def test_fit_16_mixed_scales_on_tpu(tmp_path):
    model, trainer, _, losses = _fit(tmp_path, tl.TPUAccelerator(), "16-mixed")
    scaler = trainer.precision_plugin.scaler
    assert trainer.precision_plugin.device == "tpu" and scaler.is_enabled() and scaler._device == "tpu"
    assert all(s[0] == torch.float16 and s[1] == torch.float32 and s[2].type == "tpu" for s in model.seen)
    assert losses[-1] < losses[0], losses


def test_fit_float32_matches_cpu(tmp_path):
    tpu_model, trainer, _, tpu_losses = _fit(tmp_path / "tpu", tl.TPUAccelerator(), "32-true")
    assert all(s[2].type == "tpu" and s[0] == torch.float32 and not s[3] for s in tpu_model.seen)
    cpu_model, _, _, cpu_losses = _fit(tmp_path / "cpu", "cpu", "32-true")
    assert all(s[2].type == "cpu" for s in cpu_model.seen)
    torch.testing.assert_close(tpu_losses, cpu_losses, rtol=1e-4, atol=1e-6)
    for a, b in zip(tpu_model.parameters(), cpu_model.parameters()):
        torch.testing.assert_close(a.detach().cpu(), b.detach(), rtol=1e-4, atol=1e-5)
