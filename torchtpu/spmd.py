"""Tensors laid over a mesh of local devices, and programs over all of them.

A Mesh arranges the process's first N local devices (tpu:0 .. tpu:N-1; on
the CPU plugin TORCHTPU_NUM_DEVICES=N) in a grid with named axes. shard()
lays a tensor over it, in DTensor's vocabulary: one placement per mesh axis,
Shard(d) splits tensor dimension d over that axis, Replicate() copies the
tensor along it. The result is an ordinary tpu tensor of the same shape
(shown on tpu:0) whose storage holds one block per device. Every op that
reads such a tensor runs as one program over the whole mesh: XLA partitions
it and inserts the communication; in fused mode and in torch.tpu.graph
captures a whole training step is one such program. Values written by those
programs stay on the mesh (split like an input of the same shape, or
replicated); .cpu(), printing and .item() gather them.
"""

from collections.abc import Sequence

import torch

from . import _C, _aot

__all__ = ["Mesh", "Shard", "Replicate", "shard", "shard_", "constrain", "sharding", "set_partitioner"]


class Shard:
    """Split tensor dimension `dim` over a mesh axis."""

    def __init__(self, dim: int) -> None:
        self.dim = dim

    def __repr__(self) -> str:
        return f"Shard(dim={self.dim})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Shard) and other.dim == self.dim


class Replicate:
    """A whole copy of the tensor along a mesh axis."""

    def __repr__(self) -> str:
        return "Replicate()"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Replicate)


class Mesh:
    """A grid of the first prod(shape) local devices, numbered row-major
    (Mesh((2, 2), ("dp", "tp")): tpu:0 and tpu:1 form the first "tp" row)."""

    def __init__(self, shape: Sequence[int] | int, axis_names: Sequence[str] | None = None) -> None:
        shape = (shape,) if isinstance(shape, int) else tuple(int(s) for s in shape)
        if not 1 <= len(shape) <= 4 or any(s < 1 for s in shape):
            raise ValueError(f"a mesh has 1 to 4 axes of at least one device each, got {shape}")
        names = tuple(axis_names) if axis_names is not None else tuple(f"a{i}" for i in range(len(shape)))
        if len(names) != len(shape) or len(set(names)) != len(names):
            raise ValueError(f"mesh axis names {names} for a mesh of shape {shape}")
        n = 1
        for s in shape:
            n *= s
        have = torch.tpu.device_count()
        if n > have and n > _aot.mesh_devices(have):
            raise ValueError(
                f"a mesh of {n} devices; this process has {have} (set TORCHTPU_NUM_DEVICES={n} on the CPU plugin; "
                "TORCHTPU_SPMD_COMPILE_ONLY=1 compiles for the chips of TORCHTPU_AOT_TOPOLOGY without running)"
            )
        self.shape, self.axis_names, self.size = shape, names, n

    def __repr__(self) -> str:
        return f"Mesh({dict(zip(self.axis_names, self.shape))})"

    def _axis(self, name_or_index: str | int) -> int:
        if isinstance(name_or_index, int):
            return name_or_index
        return self.axis_names.index(name_or_index)


def _dim_axis(t: torch.Tensor, mesh: Mesh, placements: Sequence) -> list[int]:
    if len(placements) != len(mesh.shape):
        raise ValueError(f"{len(placements)} placements for a mesh of {len(mesh.shape)} axes; one per axis")
    dim_axis = [-1] * t.dim()
    for a, p in enumerate(placements):
        if isinstance(p, Replicate):
            continue
        if not isinstance(p, Shard):
            raise TypeError(f"placement {p!r}: expected Shard(dim) or Replicate()")
        d = p.dim + t.dim() if p.dim < 0 else p.dim
        if not 0 <= d < t.dim():
            raise IndexError(f"Shard({p.dim}) of a tensor of {t.dim()} dimensions")
        if dim_axis[d] != -1:
            raise ValueError(f"dimension {d} is split over two mesh axes; one axis per dimension is supported")
        dim_axis[d] = a
    return dim_axis


def _source(tensor: torch.Tensor) -> torch.Tensor:
    """What _C.shard lays out: a host tensor as it is (each device is sent its
    own block of it; nothing passes through tpu:0), a tpu tensor as a whole
    contiguous storage."""
    t = tensor.detach()
    if t.device.type == "cpu":
        return t
    if t.device.type != "tpu":
        return t.cpu()
    t = t.contiguous()
    if t.untyped_storage().nbytes() != t.numel() * t.element_size() or t.storage_offset() != 0:
        t = t.clone()
    return t


def shard(tensor: torch.Tensor, mesh: Mesh, placements: Sequence) -> torch.Tensor:
    """A tpu tensor of tensor's values laid over mesh (see the module's text).
    A dimension split over an axis must divide by the axis's size."""
    out = _C.shard(_source(tensor), list(mesh.shape), _dim_axis(tensor, mesh, placements))
    return out.requires_grad_(tensor.requires_grad) if tensor.is_leaf else out


def shard_(param: torch.Tensor, mesh: Mesh, placements: Sequence) -> torch.Tensor:
    """Lays a parameter (or any leaf tensor) over mesh in place: its .data."""
    if param.device.type != "tpu":
        raise ValueError(
            f"shard_: the tensor is on {param.device.type}; a tensor keeps its device in place: move it (or the "
            "module) to tpu first, or lay out a new tensor with spmd.shard"
        )
    with torch.no_grad():
        param.data = _C.shard(_source(param), list(mesh.shape), _dim_axis(param, mesh, placements))
    return param


_constraint = None


def _constraint_kernel():
    global _constraint
    if _constraint is None:
        from . import _kernels, _registry

        req = _kernels._REQUIRED
        _constraint = _C.kernel(
            _registry.INTERNAL["tpu::spmd_constraint"],
            [("self", "T", req), ("mesh", "I", req), ("dim_axis", "I", req)],
            1,
            req,
        )
    return _constraint


class _Constrain(torch.autograd.Function):
    @staticmethod
    def forward(ctx, t, mesh, dim_axis):
        return _constraint_kernel()(t, mesh, dim_axis)

    @staticmethod
    def backward(ctx, grad):
        return grad, None, None


def constrain(tensor: torch.Tensor, mesh: Mesh, placements: Sequence) -> torch.Tensor:
    """tensor's values laid out over mesh as placements say, inside the
    program that computes it: XLA's partitioner moves the data on the devices
    (no host round trip), and the result keeps that layout. The tensor must
    come from a program over mesh (one that reads a tensor laid over it);
    gradients pass through unchanged."""
    return _Constrain.apply(tensor, list(mesh.shape), _dim_axis(tensor, mesh, placements))


def sharding(tensor: torch.Tensor) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """(mesh shape, the mesh axis each dimension is split over or -1), or None
    for a tensor on one device."""
    if tensor.device.type != "tpu":
        return None
    return _C.sharding(tensor, True)  # a value still recorded (fused mode) runs first


def set_partitioner(name: str) -> None:
    """The partitioner of programs over a mesh: "shardy" (the default, XLA's
    current one) or "gspmd"."""
    _C.spmd_partitioner(name)
