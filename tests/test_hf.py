"""Hugging Face transformers on "tpu": tiny GPT-2 and Llama models, built from
configs with random weights (nothing is downloaded), are compared with the
same models on CPU: forward and backward (loss and every parameter gradient),
20 AdamW training steps, greedy `generate()` (with and without the KV cache),
and a few steps of transformers' `Trainer`, whose device is "tpu" without any
option (transformers finds the device through `torch.accelerator`)."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest
import torch

import torchtpu  # noqa: F401

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from transformers import (  # noqa: E402
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

VOCAB = 128
ARCHS = ["gpt2", "llama"]


def _build(arch, attn="sdpa"):
    """A tiny model, seeded, float32, every dropout 0."""
    torch.manual_seed(0)
    if arch == "gpt2":
        cfg = GPT2Config(
            n_layer=2,
            n_head=2,
            n_embd=64,
            vocab_size=VOCAB,
            n_positions=64,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            summary_first_dropout=0.0,
            bos_token_id=1,
            eos_token_id=1,
            attn_implementation=attn,
        )
        return GPT2LMHeadModel(cfg)
    cfg = LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=VOCAB,
        max_position_embeddings=64,
        attention_dropout=0.0,
        bos_token_id=1,
        eos_token_id=1,
        attn_implementation=attn,
    )
    return LlamaForCausalLM(cfg)


def _tokens(shape, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(2, VOCAB, shape, generator=g)


# ---------------------------------------------------------------- forward/backward


def _loss_and_grads(arch, attn, device):
    model = _build(arch, attn).to(device)
    ids = _tokens((2, 16)).to(device)
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    grads = {n: p.grad.cpu() for n, p in model.named_parameters()}
    return out.loss.item(), out.logits.detach().cpu(), grads


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("arch", ARCHS)
def test_forward_backward_matches_cpu(arch, attn):
    loss_c, logits_c, grads_c = _loss_and_grads(arch, attn, "cpu")
    loss_t, logits_t, grads_t = _loss_and_grads(arch, attn, "tpu")
    assert abs(loss_t - loss_c) <= 1e-5 * abs(loss_c), (loss_t, loss_c)
    torch.testing.assert_close(logits_t, logits_c, rtol=1e-4, atol=1e-5)
    assert grads_t.keys() == grads_c.keys()
    bad = [n for n in grads_c if not torch.allclose(grads_t[n], grads_c[n], rtol=1e-4, atol=1e-5)]
    assert not bad, {n: (grads_t[n] - grads_c[n]).abs().max().item() for n in bad}


def test_gpt2_tied_embedding_stays_tied_on_tpu():
    """GPT-2 ties lm_head.weight to transformer.wte.weight; model.to("tpu") must
    keep one Parameter, or the two halves of its gradient are split."""
    model = _build("gpt2")
    assert model.lm_head.weight is model.transformer.wte.weight
    model.to("tpu")
    assert model.lm_head.weight is model.transformer.wte.weight
    assert model.lm_head.weight.device.type == "tpu"


# ---------------------------------------------------------------- training


def _train(arch, device, steps=20):
    model = _build(arch).to(device)
    data = _tokens((steps, 2, 16))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for i in range(steps):
        ids = data[i].to(device)
        opt.zero_grad(set_to_none=True)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("arch", ARCHS)
def test_adamw_20_steps_matches_cpu(arch):
    cpu = _train(arch, "cpu")
    tpu = _train(arch, "tpu")
    assert len(tpu) == 20
    bad = [(i, a, b) for i, (a, b) in enumerate(zip(cpu, tpu)) if abs(a - b) > 1e-3 * abs(a)]
    assert not bad, bad


# ---------------------------------------------------------------- generate


def _generate(arch, device, use_cache):
    model = _build(arch).eval().to(device)
    prompt = _tokens((2, 6), seed=2)
    with torch.no_grad():
        out = model.generate(
            prompt.to(device),
            attention_mask=torch.ones_like(prompt).to(device),
            do_sample=False,
            max_new_tokens=10,
            pad_token_id=0,
            use_cache=use_cache,
        )
    return out.cpu()


@pytest.mark.parametrize("use_cache", [True, False])
@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_generate_matches_cpu(arch, use_cache):
    cpu = _generate(arch, "cpu", use_cache)
    tpu = _generate(arch, "tpu", use_cache)
    assert tpu.shape == cpu.shape, (tpu.shape, cpu.shape)
    assert torch.equal(tpu, cpu), (tpu.tolist(), cpu.tolist())


# ---------------------------------------------------------------- Trainer


class _Tokens(torch.utils.data.Dataset):
    def __init__(self, n=16, length=16):
        self.x = _tokens((n, length), seed=3)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"input_ids": self.x[i], "labels": self.x[i]}


class _Losses(TrainerCallback):
    def __init__(self):
        self.losses = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self.losses.append(float(logs["loss"]))


def test_static_cache_generate_compiles_with_the_tpu_backend():
    """cache_implementation="static" makes transformers torch.compile the
    decoding step with the backend named after the device: "tpu"."""
    torch._dynamo.reset()
    prompt = _tokens((1, 6), seed=3)
    outs = {}
    for device in ("cpu", "tpu"):
        model = _build("llama").eval().to(device)
        with torch.no_grad():
            outs[device] = model.generate(
                prompt.to(device), do_sample=False, max_new_tokens=6, pad_token_id=0, cache_implementation="static"
            ).cpu()
    torch._dynamo.reset()
    assert torch.equal(outs["tpu"], outs["cpu"]), (outs["tpu"].tolist(), outs["cpu"].tolist())


def _trainer_losses(arch, tmp_path, use_cpu):
    args = TrainingArguments(
        output_dir=str(tmp_path / ("cpu" if use_cpu else "tpu")),
        report_to="none",
        save_strategy="no",
        use_cpu=use_cpu,
        per_device_train_batch_size=4,
        max_steps=4,
        logging_steps=1,
        learning_rate=1e-3,
        seed=0,
        data_seed=0,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    rec = _Losses()
    trainer = Trainer(model=_build(arch), args=args, train_dataset=_Tokens(), callbacks=[rec])
    trainer.train()
    return args.device, next(trainer.model.parameters()).device, rec.losses


def test_trainer_picks_tpu(tmp_path):
    """No option needed: transformers' is_torch_tpu_available() is true when
    torch.accelerator.current_accelerator() is "tpu" (torchtpu registers it)."""
    args = TrainingArguments(output_dir=str(tmp_path), report_to="none", save_strategy="no")
    assert args.device.type == "tpu"
    assert (
        TrainingArguments(output_dir=str(tmp_path), report_to="none", save_strategy="no", use_cpu=True).device.type
        == "cpu"
    )


def test_trainer_on_cpu_with_torchtpu_loaded(tmp_path):
    """torchtpu is autoloaded at `import torch`, so a CPU Trainer run must keep
    working (Trainer.train calls accelerate's clear_device_cache, which calls
    torch.accelerator.empty_cache() for the current accelerator, "tpu")."""
    device, model_device, losses = _trainer_losses("llama", tmp_path, use_cpu=True)
    assert device.type == "cpu" and model_device.type == "cpu"
    assert len(losses) == 4


@pytest.mark.parametrize("arch", ARCHS)
def test_trainer_tpu_matches_cpu(arch, tmp_path):
    device, model_device, tpu = _trainer_losses(arch, tmp_path, use_cpu=False)
    assert device.type == "tpu" and model_device.type == "tpu"
    _, _, cpu = _trainer_losses(arch, tmp_path, use_cpu=True)
    assert len(tpu) == len(cpu) == 4
    bad = [(i, a, b) for i, (a, b) in enumerate(zip(cpu, tpu)) if abs(a - b) > 1e-3 * abs(a)]
    assert not bad, bad
