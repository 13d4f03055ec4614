"""A character-level GPT (token + position embeddings, pre-LayerNorm transformer
blocks with causal self-attention and a GELU MLP, LM head tied to the token
embedding) trained with AdamW on a small text file, plus greedy generation.

A normal PyTorch training script: the only device-specific thing is the device
string ("tpu" by default, `--device cpu` to run on the host).

    python examples/char_gpt.py --steps 20
    python examples/char_gpt.py --steps 20 --autocast      # bfloat16 autocast
    TORCHTPU_AOT_TOPOLOGY=v5e:2x2 python examples/char_gpt.py --steps 3
                     # also compile every program for a TPU v5e 2x2 slice; prints the report
"""

import argparse
import os
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

import torchtpu  # noqa: F401  registers the "tpu" device

CORPUS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "tiny_corpus.txt")


class CharTokenizer:
    def __init__(self, text):
        self.chars = sorted(set(text))
        self.stoi = {c: i for i, c in enumerate(self.chars)}

    @property
    def vocab_size(self):
        return len(self.chars)

    def encode(self, s):
        return torch.tensor([self.stoi[c] for c in s], dtype=torch.long)

    def decode(self, ids):
        return "".join(self.chars[i] for i in ids)


def load_corpus(path=CORPUS):
    """Returns (tokenizer, data): data is a 1-D int64 CPU tensor of token ids."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    tok = CharTokenizer(text)
    return tok, tok.encode(text)


@dataclass
class GPTConfig:
    vocab_size: int
    block_size: int = 32
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 64
    dropout: float = 0.0


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.n_head = cfg.n_head
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd)
        self.dropout = cfg.dropout
        self.resid_drop = nn.Dropout(cfg.dropout)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_drop(self.proj(y))


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.n_embd)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.n_embd)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.n_embd, 4 * cfg.n_embd),
            nn.GELU(),
            nn.Linear(4 * cfg.n_embd, cfg.n_embd),
            nn.Dropout(cfg.dropout),
        )

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.pos_emb = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList([Block(cfg) for _ in range(cfg.n_layer)])
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.tok_emb.weight  # weight tying
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, idx, targets=None):
        B, T = idx.shape
        pos = torch.arange(T, device=idx.device)
        x = self.drop(self.tok_emb(idx) + self.pos_emb(pos))
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss


def get_batch(data, batch_size, block_size, generator):
    """Random windows of the corpus, chosen on the CPU with `generator`."""
    ix = torch.randint(len(data) - block_size - 1, (batch_size,), generator=generator)
    x = torch.stack([data[i : i + block_size] for i in ix])
    y = torch.stack([data[i + 1 : i + 1 + block_size] for i in ix])
    return x, y


def make_model(vocab_size, seed=0, device="cpu", **cfg):
    torch.manual_seed(seed)
    return GPT(GPTConfig(vocab_size=vocab_size, **cfg)).to(device)


def make_optimizer(model, lr=3e-3, weight_decay=0.1, capturable=False):
    """AdamW with weight decay on the matrices only; capturable keeps its step
    count on the device (a torch.tpu.graph capture, a compiled step)."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=lr,
        betas=(0.9, 0.95),
        capturable=capturable,
    )


def train_step(model, optimizer, x, y, autocast=None):
    """One optimizer step on the batch (x, y) (already on the model's device);
    `autocast` is None or a dtype such as torch.bfloat16. Returns the loss."""
    device = x.device
    optimizer.zero_grad(set_to_none=True)
    if autocast is not None:
        with torch.autocast(device_type=device.type, dtype=autocast):
            _, loss = model(x, y)
    else:
        _, loss = model(x, y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    return loss.item()


def train(
    device,
    steps,
    seed=0,
    batch_size=16,
    block_size=32,
    lr=3e-3,
    autocast=None,
    dropout=0.0,
    return_state=False,
    log=None,
):
    """Trains `steps` steps on `device`; returns the per-step losses, or with
    return_state=True a dict with losses, model, optimizer, tokenizer, data and
    the batch generator (to continue training from where it stopped)."""
    device = torch.device(device)
    tok, data = load_corpus()
    model = make_model(tok.vocab_size, seed=seed, device=device, block_size=block_size, dropout=dropout)
    optimizer = make_optimizer(model, lr=lr)
    gen = torch.Generator().manual_seed(seed + 1)
    model.train()
    losses = []
    for step in range(steps):
        x, y = get_batch(data, batch_size, block_size, gen)
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        losses.append(train_step(model, optimizer, x, y, autocast=autocast))
        if log:
            log(f"step {step + 1:3d}  loss {losses[-1]:.4f}")
    if return_state:
        return dict(
            losses=losses,
            model=model,
            optimizer=optimizer,
            tokenizer=tok,
            data=data,
            generator=gen,
            batch_size=batch_size,
            block_size=block_size,
        )
    return losses


@torch.no_grad()
def generate(model, idx, max_new_tokens):
    """Greedy decoding: appends the argmax token `max_new_tokens` times to
    idx ([B, T] int64 on the model's device) and returns the longer tensor."""
    was_training = model.training
    model.eval()
    for _ in range(max_new_tokens):
        idx_cond = idx[:, -model.cfg.block_size :]
        logits, _ = model(idx_cond)
        next_id = logits[:, -1, :].argmax(dim=-1, keepdim=True)
        idx = torch.cat([idx, next_id], dim=1)
        # Each token read as it is made (as a streaming or stop-token loop
        # does): in fused mode a program per context length, where recording
        # the whole generation made one program of ~1,100 ops, which libtpu
        # could not compile for v5e in 21 GB (docs/tpu_aot.md).
        next_id.cpu()
    model.train(was_training)
    return idx


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="tpu")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dropout", type=float, default=0.0)
    parser.add_argument("--autocast", action="store_true", help="run forward and loss under bfloat16 autocast")
    parser.add_argument("--prompt", default="The train ")
    parser.add_argument("--tokens", type=int, default=40)
    args = parser.parse_args()
    state = train(
        args.device,
        args.steps,
        seed=args.seed,
        dropout=args.dropout,
        autocast=torch.bfloat16 if args.autocast else None,
        return_state=True,
        log=print,
    )
    losses, model, tok = state["losses"], state["model"], state["tokenizer"]
    print(f"first loss {losses[0]:.4f}  last loss {losses[-1]:.4f}")
    prompt = tok.encode(args.prompt).unsqueeze(0).to(args.device)
    out = generate(model, prompt, args.tokens)
    print(repr(tok.decode(out[0].tolist())))
    if os.environ.get("TORCHTPU_AOT_TOPOLOGY") and args.device.startswith("tpu"):
        # every program was also compiled for that TPU topology: did each compile, and fit in HBM?
        print(torchtpu.aot_report())


if __name__ == "__main__":
    main()
