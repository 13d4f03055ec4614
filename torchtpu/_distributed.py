"""torch.distributed on tpu: the c10d backend "tpu".

`dist.init_process_group()` (the tpu is the accelerator), `backend="tpu"`
or `"cpu:gloo,tpu:tpu"` make a TpuProcessGroup: one device per process, as
torchrun and torch.multiprocessing.spawn start them. The transport is chosen
by what the plugin can do; XLA's CPU plugins cannot run a program across
processes, so there a collective on tpu tensors is staged through the host
(a sync point: the ops before it run first, in every eager mode) and run by
torch's gloo. On XLA's CPU plugin a device buffer is host memory: gloo reads
and writes the tpu tensors' buffers where they lie (`_lend`), nothing is
copied. Elsewhere, or for a tensor that cannot be lent so, its value is read
back into a host copy and the result written back. CPU tensors go to the same
gloo group directly, so one group serves both devices.

The group is a Python ProcessGroup. What torch's Python functions call
(group.allreduce, group.all_gather_single, ...) reaches its methods; what
torch's C++ calls through the dispatcher (the `c10d::*` ops, for the methods
a Python group cannot override in torch 2.13: the functional collectives'
all_gather_into_tensor, reduce_scatter_tensor ...) reaches the same methods
through tpu kernels of those ops. Gloo lacks AVG and PREMUL_SUM: they are
SUM with a division after (integers truncated, as NCCL does) or a product
before. Every failure (a rank that died, a timeout, mismatched calls) is
raised naming the collective, the rank and the group.
"""

import datetime
import time
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future

from . import _C, _settings

_R = dist.ReduceOp.RedOpType
_NOT_IN_GLOO = (_R.AVG, _R.PREMUL_SUM)


def _done(result: Any) -> dist.Work:
    fut = torch.futures.Future()
    fut.set_result(result)
    return _create_work_from_future(fut)


_IN_PLACE = _settings.flag("TORCHTPU_COLLECTIVE_IN_PLACE")


def _lend(t: torch.Tensor) -> torch.Tensor | None:
    """A CPU tensor over t's device buffer itself, where the plugin's device
    memory is host memory (XLA's CPU plugin: _C.host_memory, a sync point):
    gloo reads and writes it in place. None where it is not lent: another
    plugin, a tensor over a mesh, a storage never written, an empty or
    non-contiguous tensor, TORCHTPU_COLLECTIVE_IN_PLACE=0. A collective
    lends its tensors after one flush of the recorded ops (_counted), so that
    no lent buffer is replaced before gloo is done with it, and waits for
    gloo's own end, its timeout included, before it returns."""
    if not _IN_PLACE or t.device.type != "tpu" or t.numel() == 0 or not t.is_contiguous():
        return None
    mem = _C.host_memory(t)
    if mem is None:
        return None
    try:
        h = torch.frombuffer(mem, dtype=torch.uint8).view(t.dtype)
        h = h.as_strided(t.shape, t.stride(), t.storage_offset())
    except (RuntimeError, ValueError):  # a buffer shorter than torch's storage, or of another itemsize
        return None
    h._tpu_lent = True
    return h


def _lent(h: torch.Tensor) -> bool:
    return getattr(h, "_tpu_lent", False)


def _host(t: torch.Tensor, lend: bool = True) -> torch.Tensor:
    """The tensor gloo reads: a tpu tensor's buffer lent in place, else its
    host copy (dense); a CPU tensor itself."""
    if t.device.type != "tpu":
        return t
    h = _lend(t) if lend else None
    return h if h is not None else t.cpu()


def _hosts(ts, lend: bool = True):
    return [_host(t, lend) for t in ts]


def _out(t: torch.Tensor, lend: bool = True) -> torch.Tensor:
    """Where gloo writes a collective's output: a tpu tensor's buffer lent in
    place, else a new host tensor (its old contents are overwritten, so they
    are not read back); a CPU tensor itself."""
    if t.device.type != "tpu":
        return t
    h = _lend(t) if lend else None
    return h if h is not None else torch.empty(t.shape, dtype=t.dtype)


def _outs(ts, lend: bool = True):
    return [_out(t, lend) for t in ts]


def _apart(ins, outs):
    """Lent inputs that share memory with a lent output are copied first:
    gloo reads its inputs while it writes its outputs (FSDP2 gathers a shard
    that is a slice of the gathered tensor)."""
    spans = [(o.data_ptr(), o.data_ptr() + o.numel() * o.element_size()) for o in outs if _lent(o)]

    def overlaps(i):
        lo, hi = i.data_ptr(), i.data_ptr() + i.numel() * i.element_size()
        return any(lo < b and a < hi for a, b in spans)

    return [i.clone() if _lent(i) and overlaps(i) else i for i in ins]


def _write_back(dsts, hosts) -> None:
    for d, h in zip(dsts, hosts):
        if d is not h and not _lent(h):
            d.copy_(h)


def _timeout(opts: Any) -> datetime.timedelta | None:
    t = getattr(opts, "timeout", None)
    return t if isinstance(t, datetime.timedelta) and t.total_seconds() > 0 else None


class _Reduce:
    """A reduce op as gloo can run it: AVG is SUM then a division by the
    group's size, PREMUL_SUM a product by its factor then SUM."""

    def __init__(self, op: Any, size: int) -> None:
        red = op.op if isinstance(op, dist.ReduceOp) else op
        self.red = red
        self.size = size
        self.factor = op.factor if red == _R.PREMUL_SUM else None
        self.gloo = dist.ReduceOp.SUM if red in _NOT_IN_GLOO else dist.ReduceOp(red)

    def options(self, cls: Any, opts: Any, **fields: Any) -> Any:
        """Options of class cls for gloo: this reduce op as gloo runs it, the
        caller's timeout, and fields."""
        g = cls()
        g.reduceOp = self.gloo
        g.timeout = opts.timeout
        for k, v in fields.items():
            setattr(g, k, v)
        return g

    def before(self, hosts) -> None:
        if self.red == _R.PREMUL_SUM:
            f = self.factor
            f = f.cpu() if isinstance(f, torch.Tensor) else f
            for h in hosts:
                h.mul_(f)

    def after(self, hosts) -> None:
        if self.red == _R.AVG:
            for h in hosts:
                if h.is_floating_point() or h.is_complex():
                    h.div_(self.size)
                elif h.dtype == torch.bool:
                    raise RuntimeError("all_reduce: ReduceOp.AVG is not defined for bool tensors")
                else:
                    h.copy_(torch.div(h, self.size, rounding_mode="trunc"))


def _staged_copies(hosts, tensors):
    """Host tensors that are CPU tensors of the caller get reduced in place;
    AVG and PREMUL_SUM must not change a caller's CPU input before the
    collective runs, so those are staged through a copy too."""
    return [h.clone() if h is t else h for h, t in zip(hosts, tensors)]


class TpuProcessGroup(dist.ProcessGroup):
    """The c10d group of the "tpu" backend (see the module's docstring)."""

    def __init__(self, store: dist.Store, rank: int, size: int, timeout: datetime.timedelta) -> None:
        super().__init__(rank, size)
        self._gloo = dist.ProcessGroupGloo(store, rank, size, timeout)
        self._timeout = timeout
        self._group_name = ""
        self._group_desc = ""
        for dev in ("cpu", "tpu"):
            self._register_backend(torch.device(dev), dist.ProcessGroup.BackendType.GLOO, self._gloo)

    # --- names: DeviceMesh, FSDP2 and the functional collectives resolve
    # groups by name.
    def getBackendName(self) -> str:
        return "tpu"

    def name(self) -> str:
        return "tpu"

    def setGroupName(self, name: str) -> None:
        self._group_name = name

    def getGroupName(self) -> str:
        return self._group_name

    def setGroupDesc(self, desc: str) -> None:
        self._group_desc = desc

    def getGroupDesc(self) -> str:
        return self._group_desc

    @property
    def group_name(self) -> str:
        return self._group_name

    @property
    def group_desc(self) -> str:
        return self._group_desc

    # --- the transport
    def _run(self, what: str, work: dist.Work, opts: Any = None, hosts=()) -> None:
        """Waits for gloo's work. With a buffer lent to it (hosts), until
        gloo is done with it: its own timeout (the options') ends it, where
        a shorter wait would return while gloo may still write the buffer."""
        try:
            t = _timeout(opts)
            work.wait(t) if t is not None and not any(_lent(h) for h in hosts) else work.wait()
        except RuntimeError as e:
            raise type(e)(
                f"tpu {what} failed on rank {self.rank()} of {self.size()} (group {self._group_name!r}): {e}"
            ) from e

    def _reduce(self, op: Any) -> _Reduce:
        return _Reduce(op, self.size())

    # --- collectives
    def allreduce(self, tensors, opts: Any = None) -> dist.Work:
        opts = opts if opts is not None else dist.AllreduceOptions()
        if not isinstance(opts, dist.AllreduceOptions):  # allreduce(tensors, op)
            op, opts = opts, dist.AllreduceOptions()
            opts.reduceOp = op
        red = self._reduce(opts.reduceOp)
        hosts = _hosts(tensors)
        if red.red in _NOT_IN_GLOO:
            hosts = _staged_copies(hosts, tensors)
        red.before(hosts)
        self._run("all_reduce", self._gloo.allreduce(hosts, red.options(dist.AllreduceOptions, opts)), opts, hosts)
        red.after(hosts)
        _write_back(tensors, hosts)
        return _done(tensors)

    def allreduce_coalesced(self, tensors, opts: Any = None) -> dist.Work:
        o = dist.AllreduceOptions()
        if opts is not None:
            o.reduceOp = opts.reduceOp
            o.timeout = opts.timeout
        # one flat buffer per dtype: one collective, not one per tensor
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for t in tensors:
            by_dtype.setdefault(t.dtype, []).append(t)
        for ts in by_dtype.values():
            flat = torch.cat([t.reshape(-1) for t in ts])
            self.allreduce([flat], o)
            off = 0
            for t in ts:
                n = t.numel()
                t.copy_(flat[off : off + n].view(t.shape))
                off += n
        return _done(tensors)

    def broadcast(self, tensors, opts: Any = None) -> dist.Work:
        opts = opts if opts is not None else dist.BroadcastOptions()
        hosts = _hosts(tensors)
        self._run("broadcast", self._gloo.broadcast(hosts, opts), opts, hosts)
        _write_back(tensors, hosts)
        return _done(tensors)

    def reduce(self, tensors, opts: Any = None) -> dist.Work:
        opts = opts if opts is not None else dist.ReduceOptions()
        red = self._reduce(opts.reduceOp)
        # gloo may leave partial sums in a non-root rank's tensor: lent at the root only
        hosts = _hosts(tensors, lend=self.rank() == opts.rootRank)
        if red.red in _NOT_IN_GLOO:
            hosts = _staged_copies(hosts, tensors)
        red.before(hosts)
        g = red.options(dist.ReduceOptions, opts, rootRank=opts.rootRank, rootTensor=opts.rootTensor)
        self._run("reduce", self._gloo.reduce(hosts, g), opts, hosts)
        if self.rank() == opts.rootRank:
            red.after(hosts)
            _write_back(tensors, hosts)
        return _done(tensors)

    def allgather(self, output_tensors, input_tensors, opts: Any = None) -> dist.Work:
        opts = opts if opts is not None else dist.AllgatherOptions()
        outs = [_outs(o) for o in output_tensors]
        flat = [x for o in outs for x in o]
        ins = _apart(_hosts(input_tensors), flat)
        self._run("all_gather", self._gloo.allgather(outs, ins, opts), opts, flat + ins)
        for o, h in zip(output_tensors, outs):
            _write_back(o, h)
        return _done(output_tensors)

    def allgather_coalesced(self, output_lists, input_list, opts: Any = None) -> dist.Work:
        for outs, inp in zip(output_lists, input_list):
            self.allgather([outs], [inp], opts)
        return _done(output_lists)

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> dist.Work:
        opts = opts if opts is not None else dist.AllgatherOptions()
        out = _out(output)
        if not out.is_contiguous():
            out = out.contiguous()
        inp = _apart([_host(input).contiguous()], [out])[0]
        self._run("all_gather_into_tensor", self._gloo._allgather_base(out, inp, opts), opts, [out, inp])
        _write_back([output], [out])
        return _done(output)

    def all_gather_single_coalesced(self, outputs, inputs, opts: Any = None) -> dist.Work:
        for o, i in zip(outputs, inputs):
            self.all_gather_single(o, i, opts)
        return _done(outputs)

    def _reduce_scatter(self, what, outs, ins, opts, call) -> None:
        """outs and ins are lists of host tensors; call(outs, ins, gloo
        options) starts gloo's collective."""
        red = self._reduce(opts.reduceOp)
        if red.red == _R.PREMUL_SUM:
            ins = [i.clone() for i in ins]  # the product must not reach a caller's CPU input
        ins = _apart(ins, outs)
        red.before(ins)
        self._run(what, call(outs, ins, red.options(dist.ReduceScatterOptions, opts)), opts, outs + ins)
        red.after(outs)

    def reduce_scatter(self, output_tensors, input_tensors, opts: Any = None) -> dist.Work:
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        outs = _outs(output_tensors)
        ins = [_hosts(i) for i in input_tensors]
        flat = [x for i in ins for x in i]

        def call(o, i, g):
            it = iter(i)
            return self._gloo.reduce_scatter(o, [[next(it) for _ in row] for row in ins], g)

        self._reduce_scatter("reduce_scatter", outs, flat, opts, call)
        _write_back(output_tensors, outs)
        return _done(output_tensors)

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> dist.Work:
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        out = _out(output).contiguous()
        inp = _host(input).contiguous()
        self._reduce_scatter(
            "reduce_scatter_tensor", [out], [inp], opts, lambda o, i, g: self._gloo._reduce_scatter_base(o[0], i[0], g)
        )
        _write_back([output], [out])
        return _done(output)

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts: Any = None) -> dist.Work:
        for o, i in zip(outputs, inputs):
            self.reduce_scatter_single(o, i, opts)
        return _done(outputs)

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts: Any = None) -> dist.Work:
        opts = opts if opts is not None else dist.AllToAllOptions()
        out = _out(output).contiguous()
        inp = _apart([_host(input).contiguous()], [out])[0]
        self._run(
            "all_to_all_single",
            self._gloo.alltoall_base(out, inp, output_split_sizes, input_split_sizes, opts),
            opts,
            [out, inp],
        )
        _write_back([output], [out])
        return _done(output)

    def alltoall(self, output_tensors, input_tensors, opts: Any = None) -> dist.Work:
        opts = opts if opts is not None else dist.AllToAllOptions()
        outs = _outs(output_tensors)
        ins = _apart(_hosts(input_tensors), outs)
        self._run("all_to_all", self._gloo.alltoall(outs, ins, opts), opts, outs + ins)
        _write_back(output_tensors, outs)
        return _done(output_tensors)

    def scatter(self, output_tensors, input_tensors, opts: Any = None) -> dist.Work:
        opts = opts if opts is not None else dist.ScatterOptions()
        outs = _outs(output_tensors)
        ins = [_apart(_hosts(i), outs) for i in input_tensors]
        self._run("scatter", self._gloo.scatter(outs, ins, opts), opts, outs + [x for i in ins for x in i])
        _write_back(output_tensors, outs)
        return _done(output_tensors)

    def gather(self, output_tensors, input_tensors, opts: Any = None) -> dist.Work:
        opts = opts if opts is not None else dist.GatherOptions()
        outs = [_outs(o) for o in output_tensors]
        flat = [x for o in outs for x in o]
        ins = _apart(_hosts(input_tensors), flat)
        self._run("gather", self._gloo.gather(outs, ins, opts), opts, flat + ins)
        for o, h in zip(output_tensors, outs):
            _write_back(o, h)
        return _done(output_tensors)

    # Point to point: the transfer is started and the Work waits for it
    # (isend then irecv on both ranks must not block at the isend).
    def send(self, tensors, dst: int, tag: int = 0) -> dist.Work:
        hosts = _hosts(tensors, lend=False)  # copies, kept alive by the Work until the send is done
        return _Transfer(self, f"send to rank {dst}", self._gloo.send(hosts, dst, tag), hosts, None)

    def recv(self, tensors, src: int, tag: int = 0) -> dist.Work:
        hosts = _outs(tensors, lend=False)
        return _Transfer(self, f"recv from rank {src}", self._gloo.recv(hosts, src, tag), hosts, tensors)

    def recv_anysource(self, tensors, tag: int = 0) -> dist.Work:
        hosts = _outs(tensors, lend=False)
        return _Transfer(self, "recv", self._gloo.recv_anysource(hosts, tag), hosts, tensors)

    def barrier(self, opts: Any = None) -> dist.Work:
        opts = opts if opts is not None else dist.BarrierOptions()
        # the tpu's queued work is part of what a barrier waits for
        torch.tpu.synchronize()
        self._run("barrier", self._gloo.barrier(opts), opts)
        return _done(None)

    def shutdown(self) -> None:
        self._gloo.shutdown()

    def abort(self) -> None:
        self._gloo.abort()


# Time in collectives, for torchtpu.metrics(): calls of the group's
# collectives (the outermost: a coalesced call counts once) and their wall
# time, staging included.
STATS = {"collectives": 0, "collective_seconds": 0.0}
_depth = [0]

# The collectives as torch.distributed names them, in a fixed order: the
# index is what ranks compare before each collective.
_NAMES = {
    "allreduce": "all_reduce",
    "allreduce_coalesced": "all_reduce_coalesced",
    "broadcast": "broadcast",
    "reduce": "reduce",
    "allgather": "all_gather",
    "allgather_coalesced": "all_gather_coalesced",
    "all_gather_single": "all_gather_into_tensor",
    "all_gather_single_coalesced": "all_gather_into_tensor (coalesced)",
    "reduce_scatter": "reduce_scatter",
    "reduce_scatter_single": "reduce_scatter_tensor",
    "reduce_scatter_single_coalesced": "reduce_scatter_tensor (coalesced)",
    "all_to_all_single": "all_to_all_single",
    "alltoall": "all_to_all",
    "scatter": "scatter",
    "gather": "gather",
    "barrier": "barrier",
}
_CODES = {n: i for i, n in enumerate(_NAMES)}
_CHECKS = _settings.flag("TORCHTPU_COLLECTIVE_CHECKS")  # read at import, as the other flags
# every dtype, in an order all processes of one torch share
_DTYPE_CODES = {
    d: i for i, d in enumerate(sorted({v for v in vars(torch).values() if isinstance(v, torch.dtype)}, key=str))
}
_UNEVEN = ("all_to_all_single", "alltoall")  # sizes may differ between ranks


def _first_tensor(x):
    if isinstance(x, torch.Tensor):
        return x
    if isinstance(x, (list, tuple)):
        for y in x:
            t = _first_tensor(y)
            if t is not None:
                return t
    return None


def _on_tpu(x) -> bool:
    if isinstance(x, torch.Tensor):
        return x.device.type == "tpu"
    return isinstance(x, (list, tuple)) and any(_on_tpu(y) for y in x)


def _opts_in(args):
    """The options object among a collective's arguments (None for a call
    made without one)."""
    return next((a for a in args if hasattr(a, "timeout") and not isinstance(a, torch.Tensor)), None)


def _fingerprint(name, args):
    """What every rank must agree on before a collective: which one, the
    dtype, the element count (where it must be equal), the reduce op and the
    root."""
    t = _first_tensor(args)
    opts = _opts_in(args)
    red = getattr(opts, "reduceOp", None)
    red = red.op if isinstance(red, dist.ReduceOp) else red
    return [
        _CODES[name],
        -1 if t is None else _DTYPE_CODES.get(t.dtype, -2),
        -1 if t is None or name in _UNEVEN else t.numel(),
        -1 if red is None else int(red),
        getattr(opts, "rootRank", -1),
    ]


def _describe(fp):
    name = _NAMES[list(_NAMES)[fp[0]]]
    dtypes = {v: k for k, v in _DTYPE_CODES.items()}
    parts = []
    if fp[1] >= 0:
        parts.append(str(dtypes.get(fp[1], "?")).replace("torch.", ""))
    if fp[2] >= 0:
        parts.append(f"{fp[2]} elements")
    if fp[3] >= 0:
        parts.append(f"ReduceOp.{_R(fp[3]).name}")
    if fp[4] >= 0:
        parts.append(f"root {fp[4]}")
    return f"{name}({', '.join(parts)})"


def _agree(group: "TpuProcessGroup", name: str, args, meanwhile=None) -> None:
    """Ranks compare what they are about to run (a small gloo all-gather)
    before running it: mismatched collectives are an error on every rank,
    not gloo's abort of the process or a silently wrong result. meanwhile()
    runs while the comparison is in flight (the device's sync point)."""
    mine = torch.tensor(_fingerprint(name, args), dtype=torch.int64)
    rows = [torch.empty_like(mine) for _ in range(group.size())]
    work = group._gloo.allgather([rows], [mine])
    if meanwhile is not None:
        meanwhile()  # should it raise, the comparison ends by itself: every rank posted it
    group._run(_NAMES[name], work, _opts_in(args))
    if any(not torch.equal(r, rows[0]) for r in rows):
        calls = "; ".join(f"rank {k}: {_describe(r.tolist())}" for k, r in enumerate(rows))
        raise RuntimeError(
            f"tpu collective mismatch on rank {group.rank()} of {group.size()} (group {group._group_name!r}): "
            f"the ranks called different collectives or with different arguments ({calls})"
        )


def _counted(fn):
    name = fn.__name__

    def method(self, *args, **kwargs):
        if _depth[0]:
            return fn(self, *args, **kwargs)
        if _C.whole_capturing():
            raise RuntimeError(
                f"torch.distributed {_NAMES[name]} inside a torch.tpu.graph capture: collectives are staged "
                f"through the host on this plugin and cannot be part of a captured program; call it "
                f"outside the capture (between replays)"
            )
        _depth[0] += 1
        t0 = time.perf_counter()
        try:
            # the recorded ops run once, before any buffer is lent (_lend)
            sync = _C.synchronize if _IN_PLACE and _on_tpu(args) else None
            if self.size() > 1 and _CHECKS:
                _agree(self, name, args, sync)
            elif sync is not None:
                sync()
            return fn(self, *args, **kwargs)
        finally:
            _depth[0] -= 1
            STATS["collectives"] += 1
            STATS["collective_seconds"] += time.perf_counter() - t0

    method.__name__, method.__doc__ = fn.__name__, fn.__doc__
    # a host round trip: torch.compile runs it as it is (a graph break), as
    # it runs a collective of torch's own backends
    return torch.compiler.disable(method, recursive=True)


_COLLECTIVES = (
    "allreduce allreduce_coalesced broadcast reduce allgather allgather_coalesced all_gather_single "
    "all_gather_single_coalesced reduce_scatter reduce_scatter_single reduce_scatter_single_coalesced "
    "all_to_all_single alltoall scatter gather barrier"
).split()
# torch's older names of the same methods (its Python calls either)
_ALIASES = (
    ("_allgather_base", "all_gather_single"),
    ("allgather_into_tensor_coalesced", "all_gather_single_coalesced"),
    ("_reduce_scatter_base", "reduce_scatter_single"),
    ("reduce_scatter_tensor_coalesced", "reduce_scatter_single_coalesced"),
    ("alltoall_base", "all_to_all_single"),
)
_wrapped = [False]


def _wrap_collectives() -> None:
    """Counts, checks and hides from torch.compile every collective of the
    group; done when the first group is made, not at import (it imports
    torch._dynamo, which a process that never uses torch.distributed should
    not pay for)."""
    if _wrapped[0]:
        return
    for name in _COLLECTIVES:
        assert name in _NAMES
        setattr(TpuProcessGroup, name, _counted(getattr(TpuProcessGroup, name)))
    for alias, name in _ALIASES:
        setattr(TpuProcessGroup, alias, getattr(TpuProcessGroup, name))
    _wrapped[0] = True


class _Transfer(dist.Work):
    """A send or receive in flight: wait() waits for gloo's transfer, then
    writes what was received into the tpu tensors."""

    def __init__(self, group: "TpuProcessGroup", what: str, work: dist.Work, hosts, dsts) -> None:
        super().__init__()
        self._group, self._what, self._work, self._hosts, self._dsts = group, what, work, hosts, dsts
        self._done = False

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        if not self._done:
            opts = dist.BarrierOptions()
            if timeout is not None:
                opts.timeout = timeout
            self._group._run(self._what, self._work, opts)
            if self._dsts is not None:
                _write_back(self._dsts, self._hosts)
            self._done = True
        return True

    def is_completed(self) -> bool:
        return self._done

    def is_success(self) -> bool:
        return self._done

    def get_future(self) -> torch.futures.Future:
        self.wait()
        fut = torch.futures.Future()
        fut.set_result(self._dsts if self._dsts is not None else self._hosts)
        return fut

    def source_rank(self) -> int:
        return self._work.source_rank()


def _create(store: dist.Store, rank: int, size: int, timeout: datetime.timedelta) -> TpuProcessGroup:
    if not 0 <= rank < size:
        # what gloo would refuse, in words (a RuntimeError, as gloo's)
        raise RuntimeError(f"the tpu backend needs 0 <= rank < world_size, got rank {rank} and world_size {size}")
    from . import _patches

    _patches.apply_distributed()  # FSDP2's storage frees (see _patches._patch_fsdp_storage)
    _wrap_collectives()
    return TpuProcessGroup(store, rank, size, timeout)


# --- c10d dispatcher ops on tpu tensors. torch's C++ reaches these for the
# methods a Python group cannot override (see the module's docstring); each
# kernel hands the call to the group's method.


def _group(pg: Any) -> TpuProcessGroup:
    g = dist.ProcessGroup.unbox(pg)
    if not isinstance(g, TpuProcessGroup):
        raise RuntimeError(
            f"a collective on tpu tensors needs a group of the 'tpu' backend, got {g.getBackendName()!r}: "
            f"init_process_group() or init_process_group('cpu:gloo,tpu:tpu')"
        )
    return g


def _red(op: Any) -> Any:
    """The RedOpType of a dispatcher ReduceOp (a TorchBind object); its
    PREMUL_SUM factor is not readable there."""
    red = _R(op.op())
    if red == _R.PREMUL_SUM:
        raise RuntimeError(
            "ReduceOp.PREMUL_SUM reached a tpu collective through the dispatcher, which does not carry "
            "its factor: call torch.distributed's functions (all_reduce, reduce_scatter_tensor) instead"
        )
    return dist.ReduceOp(red)


def _ms(timeout: int) -> datetime.timedelta:
    return datetime.timedelta(milliseconds=timeout) if timeout > 0 else datetime.timedelta(0)


def _opts(cls: Any, timeout: int, **fields: Any) -> Any:
    o = cls()
    for k, v in fields.items():
        setattr(o, k, v)
    if timeout > 0:
        o.timeout = _ms(timeout)
    return o


def _k_allreduce(tensors, pg, reduce_op, sparse_indices=None, async_op=True, timeout=-1):
    w = _group(pg).allreduce(tensors, _opts(dist.AllreduceOptions, timeout, reduceOp=_red(reduce_op)))
    return tensors, w.boxed()


def _k_allreduce_coalesced(tensors, pg, reduce_op, async_op=True, timeout=-1):
    o = _opts(dist.AllreduceCoalescedOptions, timeout, reduceOp=_red(reduce_op))
    return _group(pg).allreduce_coalesced(tensors, o).boxed()


def _k_broadcast(tensors, pg, root_rank, root_tensor, async_op=True, timeout=-1):
    o = _opts(dist.BroadcastOptions, timeout, rootRank=root_rank, rootTensor=root_tensor)
    return tensors, _group(pg).broadcast(tensors, o).boxed()


def _k_reduce(tensors, pg, reduce_op, root_rank, root_tensor, async_op=True, timeout=-1):
    o = _opts(dist.ReduceOptions, timeout, reduceOp=_red(reduce_op), rootRank=root_rank, rootTensor=root_tensor)
    return _group(pg).reduce(tensors, o).boxed()


def _k_allgather(output_tensors, input_tensors, pg, async_op=True, timeout=-1):
    w = _group(pg).allgather(output_tensors, input_tensors, _opts(dist.AllgatherOptions, timeout))
    return output_tensors, w.boxed()


def _k_allgather_base(output_tensor, input_tensor, pg, async_op=True, timeout=-1):
    w = _group(pg).all_gather_single(output_tensor, input_tensor, _opts(dist.AllgatherOptions, timeout))
    return output_tensor, w.boxed()


def _k_allgather_coalesced(output_lists, input_list, pg, async_op=True):
    return _group(pg).allgather_coalesced(output_lists, input_list).boxed()


def _k_allgather_into_tensor_coalesced(outputs, inputs, pg, async_op=True):
    return _group(pg).all_gather_single_coalesced(outputs, inputs).boxed()


def _k_reduce_scatter(output_tensors, input_tensors, pg, reduce_op, async_op=True, timeout=-1):
    o = _opts(dist.ReduceScatterOptions, timeout, reduceOp=_red(reduce_op))
    return output_tensors, _group(pg).reduce_scatter(output_tensors, input_tensors, o).boxed()


def _k_reduce_scatter_base(output_tensor, input_tensor, pg, reduce_op, async_op=True, timeout=-1):
    o = _opts(dist.ReduceScatterOptions, timeout, reduceOp=_red(reduce_op))
    return output_tensor, _group(pg).reduce_scatter_single(output_tensor, input_tensor, o).boxed()


def _k_reduce_scatter_tensor_coalesced(outputs, inputs, pg, reduce_op, async_op=True, timeout=-1):
    o = _opts(dist.ReduceScatterOptions, timeout, reduceOp=_red(reduce_op))
    return _group(pg).reduce_scatter_single_coalesced(outputs, inputs, o).boxed()


def _k_alltoall_base(output, input, pg, output_split_sizes, input_split_sizes, async_op=True, timeout=-1):
    o = _opts(dist.AllToAllOptions, timeout)
    return _group(pg).all_to_all_single(output, input, output_split_sizes, input_split_sizes, o).boxed()


def _k_alltoall(output_tensors, input_tensors, pg, async_op=True, timeout=-1):
    w = _group(pg).alltoall(output_tensors, input_tensors, _opts(dist.AllToAllOptions, timeout))
    return output_tensors, w.boxed()


def _k_scatter(output_tensors, input_tensors, pg, root_rank, async_op=True, timeout=-1):
    o = _opts(dist.ScatterOptions, timeout, rootRank=root_rank)
    return output_tensors, _group(pg).scatter(output_tensors, input_tensors, o).boxed()


def _k_gather(output_tensors, input_tensors, pg, root_rank, async_op=True, timeout=-1):
    o = _opts(dist.GatherOptions, timeout, rootRank=root_rank)
    return _group(pg).gather(output_tensors, input_tensors, o).boxed()


def _k_send(tensors, pg, dst, tag):
    return _group(pg).send(tensors, dst, tag).boxed()


def _k_recv(tensors, pg, src, tag):
    return _group(pg).recv(tensors, src, tag).boxed()


def _k_recv_any_source(tensors, pg, tag):
    return _group(pg).recv_anysource(tensors, tag).boxed()


def _k_barrier(tensor, pg, device_ids, async_op=True, timeout=-1):
    return _group(pg).barrier(_opts(dist.BarrierOptions, timeout)).boxed()


KERNELS = {
    "allreduce_": _k_allreduce,
    "allreduce_coalesced_": _k_allreduce_coalesced,
    "broadcast_": _k_broadcast,
    "reduce_": _k_reduce,
    "allgather_": _k_allgather,
    "_allgather_base_": _k_allgather_base,
    "allgather_coalesced_": _k_allgather_coalesced,
    "allgather_into_tensor_coalesced_": _k_allgather_into_tensor_coalesced,
    "reduce_scatter_": _k_reduce_scatter,
    "_reduce_scatter_base_": _k_reduce_scatter_base,
    "reduce_scatter_tensor_coalesced_": _k_reduce_scatter_tensor_coalesced,
    "alltoall_base_": _k_alltoall_base,
    "alltoall_": _k_alltoall,
    "scatter_": _k_scatter,
    "gather_": _k_gather,
    "send": _k_send,
    "recv_": _k_recv,
    "recv_any_source_": _k_recv_any_source,
    "barrier": _k_barrier,
}

_LIB = None


def setup() -> None:
    """Registers the "tpu" backend with c10d (tpu and CPU tensors) and the tpu
    kernels of the c10d ops. Called once, at import."""
    global _LIB
    if not dist.is_available() or _LIB is not None:
        return
    import warnings

    dist.Backend.register_backend("tpu", _create, devices=["cpu", "tpu"])
    _LIB = torch.library.Library("c10d", "IMPL")  # noqa: TOR901
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Overriding a previously registered kernel": c10d's own forwarder
        for name, fn in KERNELS.items():
            _LIB.impl(name, fn, "PrivateUse1")
