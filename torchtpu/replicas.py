"""Replica-mode collectives over the local devices of one process.

Each function takes a list whose tensor ``i`` is on ``tpu:i`` (all of one
dtype and shape) and returns a new list whose tensor ``i`` is on ``tpu:i``.
The collective runs as one program of ``len(tensors)`` replicas (StableHLO
``all_reduce``, ``all_gather``, ``reduce_scatter``, ``all_to_all``,
``collective_permute``), the transport a multi-process backend uses inside its
programs. Reduce ops: ``"sum"``, ``"prod"``, ``"min"``, ``"max"``, ``"avg"``
(sum, then divided by the number of tensors; floating-point and complex
dtypes only, as gloo has no integer average). Inputs are never modified.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from . import _C

__all__ = ["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "permute", "broadcast"]

# tpu_coll_kind and tpu_red_op, by name (the rows of csrc/engine/collectives.def)
_KINDS = _C.collective_kinds()
_ALL_REDUCE, _ALL_GATHER, _REDUCE_SCATTER = _KINDS["all_reduce"], _KINDS["all_gather"], _KINDS["reduce_scatter"]
_ALL_TO_ALL, _PERMUTE, _BROADCAST = _KINDS["all_to_all"], _KINDS["permute"], _KINDS["broadcast"]
_OPS = _C.reduce_ops()


def _op(op: str) -> int:
    if not isinstance(op, str):
        raise TypeError(f"op must be one of {sorted(_OPS)} (a str), not {type(op).__name__}")
    try:
        return _OPS[op.lower()]
    except KeyError:
        raise ValueError(f"unknown reduce op {op!r}: expected one of {sorted(_OPS)}") from None


def _whole(t: torch.Tensor) -> torch.Tensor:
    """t as a contiguous tensor that is its storage, whole, and whose device
    buffer has the shape a storage made for t has (one program takes every
    replica's buffer)."""
    t = t.resolve_conj().resolve_neg().contiguous()
    if (
        t.storage_offset() != 0
        or t.untyped_storage().nbytes() != t.numel() * t.element_size()
        or _C.storage_shape(t) != _C.buffer_shape(t.shape)
    ):
        t = t.clone()
    return t


def _inputs(name: str, tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    if isinstance(tensors, torch.Tensor) or not isinstance(tensors, (list, tuple)):
        raise TypeError(f"{name}: expected a list of tensors (tensor i on tpu:i), got {type(tensors).__name__}")
    if not tensors:
        raise ValueError(f"{name}: the list of tensors is empty")
    count = _C.device_count()
    if len(tensors) > count:
        raise ValueError(f"{name}: {len(tensors)} tensors for {count} local tpu devices")
    first = tensors[0]
    for i, t in enumerate(tensors):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: item {i} is a {type(t).__name__}, not a tensor")
        if t.device.type != "tpu" or t.device.index != i:
            raise ValueError(f"{name}: tensor {i} is on {t.device}; tensor i of the list must be on tpu:i")
        if t.dtype != first.dtype:
            raise TypeError(f"{name}: tensor {i} has dtype {t.dtype}, tensor 0 has {first.dtype}")
        if t.shape != first.shape:
            raise ValueError(f"{name}: tensor {i} has shape {tuple(t.shape)}, tensor 0 has {tuple(first.shape)}")
    return [_whole(t) for t in tensors]


def _split_dim0(name: str, ts: list[torch.Tensor]) -> None:
    n = len(ts)
    if ts[0].dim() == 0:
        raise ValueError(f"{name}: needs tensors of at least one dimension")
    if ts[0].shape[0] % n:
        raise ValueError(f"{name}: dimension 0 ({ts[0].shape[0]}) is not divisible by the {n} tensors")


def _run(ts: list[torch.Tensor], kind: int, op: int = 0, pairs=None, src: int = 0, shape=None) -> list[torch.Tensor]:
    if ts[0].numel() == 0:  # nothing moves: empty results of the output shape
        shape = ts[0].shape if shape is None else shape
        return [torch.empty(shape, dtype=t.dtype, device=t.device) for t in ts]
    return _C.replica_collective(ts, kind, op, pairs, src)


def all_reduce(tensors: Sequence[torch.Tensor], op: str = "sum") -> list[torch.Tensor]:
    """Every output is the reduction of all inputs, elementwise."""
    code = _op(op)
    return _run(_inputs("all_reduce", tensors), _ALL_REDUCE, code)


def all_gather(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Every output is the inputs concatenated along dim 0 (0-d inputs: stacked into shape [n])."""
    ts = _inputs("all_gather", tensors)
    s = ts[0].shape
    shape = (len(ts),) if not s else (s[0] * len(ts), *s[1:])
    return _run(ts, _ALL_GATHER, shape=shape)


def reduce_scatter(tensors: Sequence[torch.Tensor], op: str = "sum") -> list[torch.Tensor]:
    """Output i is chunk i (dim 0 split in n) of the reduction of all inputs."""
    code = _op(op)
    ts = _inputs("reduce_scatter", tensors)
    _split_dim0("reduce_scatter", ts)
    s = ts[0].shape
    return _run(ts, _REDUCE_SCATTER, code, shape=(s[0] // len(ts), *s[1:]))


def all_to_all(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Dim 0 split in n chunks: output i is chunk i of every input, concatenated in input order."""
    ts = _inputs("all_to_all", tensors)
    _split_dim0("all_to_all", ts)
    return _run(ts, _ALL_TO_ALL)


def permute(tensors: Sequence[torch.Tensor], pairs: Sequence[tuple[int, int]]) -> list[torch.Tensor]:
    """Output t is input s for each pair (s, t); an output no pair targets is zeros."""
    ts = _inputs("permute", tensors)
    n = len(ts)
    try:
        pl = [(int(s), int(t)) for s, t in pairs]
    except (TypeError, ValueError):
        raise TypeError(f"permute: pairs must be (source, target) pairs of ints, got {pairs!r}") from None
    for s, t in pl:
        if not (0 <= s < n and 0 <= t < n):
            raise ValueError(f"permute: pair ({s}, {t}) names a tensor outside 0..{n - 1}")
    if len({s for s, _ in pl}) != len(pl) or len({t for _, t in pl}) != len(pl):
        raise ValueError(f"permute: a tensor is the source or the target of two pairs: {pl}")
    if ts[0].numel() == 0:
        return _run(ts, _PERMUTE)
    return _C.replica_collective(ts, _PERMUTE, 0, pl, 0)


def broadcast(tensors: Sequence[torch.Tensor], src: int = 0) -> list[torch.Tensor]:
    """Every output is input src."""
    ts = _inputs("broadcast", tensors)
    if not isinstance(src, int) or isinstance(src, bool):
        raise TypeError(f"broadcast: src must be an int, not {type(src).__name__}")
    if not 0 <= src < len(ts):
        raise ValueError(f"broadcast: src {src} is outside 0..{len(ts) - 1}")
    return _run(ts, _BROADCAST, src=src)
