"""The example training scripts in examples/ (plain PyTorch, the device is a
string) give the same per-step losses on tpu as on CPU, learn, and (char_gpt)
generate the same text, resume from a torch.save checkpoint of tpu tensors on
either device, and train under bfloat16 autocast."""

import importlib.util
import os

import pytest
import torch

import torchtpu  # noqa: F401

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")
STEPS = 20


def _load(name):
    spec = importlib.util.spec_from_file_location(f"examples_{name}", os.path.join(EXAMPLES, f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


mlp_mnist = _load("mlp_mnist")
resnet_cifar = _load("resnet_cifar")
char_gpt = _load("char_gpt")


def _assert_losses_match(cpu, tpu, rel):
    assert len(cpu) == len(tpu) == STEPS
    bad = [(i, c, t) for i, (c, t) in enumerate(zip(cpu, tpu)) if not abs(c - t) <= rel * abs(c)]
    assert not bad, f"steps whose tpu loss differs from CPU by more than {rel} relative: {bad}"


def _assert_falls(losses):
    assert losses[-1] < losses[0] or sum(losses[-5:]) / 5 < sum(losses[:5]) / 5, losses


@pytest.fixture(scope="module")
def gpt_runs():
    """The 20-step char_gpt runs on CPU and tpu (shared by two tests)."""
    return {dev: char_gpt.train(dev, STEPS, seed=0, return_state=True) for dev in ("cpu", "tpu")}


@pytest.mark.parametrize("example", [mlp_mnist, resnet_cifar], ids=["mlp_mnist", "resnet_cifar"])
def test_example_matches_cpu_and_learns(example):
    cpu = example.train("cpu", STEPS, seed=0)
    tpu = example.train("tpu", STEPS, seed=0)
    _assert_losses_match(cpu, tpu, 1e-3)
    _assert_falls(tpu)


def test_char_gpt_matches_cpu_and_learns(gpt_runs):
    cpu, tpu = gpt_runs["cpu"]["losses"], gpt_runs["tpu"]["losses"]
    _assert_losses_match(cpu, tpu, 1e-3)
    _assert_falls(tpu)


def test_char_gpt_generate_matches_cpu(gpt_runs):
    tok = gpt_runs["cpu"]["tokenizer"]
    prompt = tok.encode("The morning train to the coast leaves ").unsqueeze(0)
    assert prompt.shape[1] >= 32  # a full window: every decoding step has the same shape
    outs, logits = {}, {}
    for dev, run in gpt_runs.items():
        model = run["model"]
        outs[dev] = char_gpt.generate(model, prompt.to(dev), 20).cpu()
        with torch.no_grad():
            model.eval()
            logits[dev] = model(outs[dev][:, -32:].to(dev))[0].cpu()
            model.train()
    assert outs["tpu"].shape == (1, prompt.shape[1] + 20)
    assert outs["tpu"].tolist() == outs["cpu"].tolist(), (
        tok.decode(outs["cpu"][0].tolist()),
        tok.decode(outs["tpu"][0].tolist()),
    )
    torch.testing.assert_close(logits["tpu"], logits["cpu"], rtol=1e-3, atol=1e-3)


def _resume(model, optimizer, batches):
    dev = next(model.parameters()).device
    return [char_gpt.train_step(model, optimizer, x.to(dev), y.to(dev)) for x, y in batches]


def _tensors(obj):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _tensors(v)


def test_char_gpt_checkpoint_resume(tmp_path):
    run = char_gpt.train("tpu", 5, seed=0, return_state=True)
    model, opt, tok = run["model"], run["optimizer"], run["tokenizer"]
    path = tmp_path / "ckpt.pt"
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, path)
    # the next two batches: the second step's loss depends on the restored AdamW moments
    batches = [
        char_gpt.get_batch(run["data"], run["batch_size"], run["block_size"], run["generator"]) for _ in range(2)
    ]

    # (a) onto the CPU
    ck_cpu = torch.load(path, map_location="cpu")
    assert all(t.device.type == "cpu" for t in _tensors(ck_cpu["model"]))
    assert any(t.device.type == "cpu" for t in _tensors(ck_cpu["optimizer"]["state"]))
    m_cpu = char_gpt.make_model(tok.vocab_size, seed=123, device="cpu")
    m_cpu.load_state_dict(ck_cpu["model"])
    o_cpu = char_gpt.make_optimizer(m_cpu)
    o_cpu.load_state_dict(ck_cpu["optimizer"])

    # (b) back onto the tpu (no map_location: tensors come back where they were saved)
    ck_tpu = torch.load(path)
    assert all(t.device.type == "tpu" for t in _tensors(ck_tpu["model"]))
    for name, t in model.state_dict().items():
        assert torch.equal(ck_tpu["model"][name].cpu(), t.cpu()), name
    m_tpu = char_gpt.make_model(tok.vocab_size, seed=123, device="tpu")
    m_tpu.load_state_dict(ck_tpu["model"])
    o_tpu = char_gpt.make_optimizer(m_tpu)
    o_tpu.load_state_dict(ck_tpu["optimizer"])
    assert m_tpu.lm_head.weight is m_tpu.tok_emb.weight  # tying survives load_state_dict

    orig = _resume(model, opt, batches)
    res_tpu = _resume(m_tpu, o_tpu, batches)
    res_cpu = _resume(m_cpu, o_cpu, batches)
    for a, b in zip(orig, res_tpu):
        assert abs(a - b) <= 1e-6 * abs(a), (orig, res_tpu)
    for a, c in zip(orig, res_cpu):
        assert abs(a - c) <= 1e-4 * abs(a), (orig, res_cpu)


def test_char_gpt_bf16_autocast():
    cpu = char_gpt.train("cpu", 1, seed=0, autocast=torch.bfloat16)
    tpu = char_gpt.train("tpu", STEPS, seed=0, autocast=torch.bfloat16)
    assert len(tpu) == STEPS
    _assert_falls(tpu)
    assert abs(tpu[0] - cpu[0]) <= 0.02 * abs(cpu[0]), (tpu[0], cpu[0])


def test_char_gpt_generate_untrained_model_matches_cpu():
    # Random weights decode varied text, so every greedy step is a real check.
    tok, _ = char_gpt.load_corpus()
    prompt = tok.encode("The morning train to the coast leaves ").unsqueeze(0)[:, :32]
    outs = {}
    for dev in ("cpu", "tpu"):
        model = char_gpt.make_model(tok.vocab_size, seed=5, device=dev)
        model.eval()
        outs[dev] = char_gpt.generate(model, prompt.to(dev), 24).cpu()
    assert outs["tpu"].tolist() == outs["cpu"].tolist()
    assert len(set(outs["cpu"][0, 32:].tolist())) >= 2
