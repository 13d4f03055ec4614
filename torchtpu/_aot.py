"""torchtpu.aot_report(): what the TPU compiler said of every program this
process compiled, when TORCHTPU_AOT_TOPOLOGY names a TPU topology (v5e:2x2,
v6e:2x2, v5p:2x2x1 ...). Programs run on the execution plugin (the CPU one
on a host without a TPU); each is also compiled for the topology's chips by
libtpu, which needs no chip to do it (csrc/runtime/aot.c). The numbers are
libtpu's: its cost analysis and the memory the program needs on one chip."""

import os
import warnings

from . import _C, _plugin, _settings


def libtpu_path():
    """The libtpu library found as the TPU plugin is, or None."""
    return next((c for c in _plugin._candidates("tpu") if os.path.exists(c)), None)


def setup():
    """Hands TORCHTPU_AOT_TOPOLOGY, TORCHTPU_AOT_STRICT and
    TORCHTPU_SPMD_COMPILE_ONLY to the engine (opened with the runtime, at the
    device's first use)."""
    topology = _settings.aot_topology()
    only = _settings.flag("TORCHTPU_SPMD_COMPILE_ONLY")
    if topology:
        _C.set_aot(libtpu_path(), topology, _settings.flag("TORCHTPU_AOT_STRICT"), only)
    elif only:
        warnings.warn(
            "torchtpu: TORCHTPU_SPMD_COMPILE_ONLY=1 compiles programs over a mesh for the TPU topology that "
            "TORCHTPU_AOT_TOPOLOGY names, and it is unset: meshes run on the local devices",
            stacklevel=2,
        )


def mesh_devices(local):
    """How many devices a mesh may span: the TPU topology's chips on a
    compile-only mesh (TORCHTPU_SPMD_COMPILE_ONLY), else the local ones."""
    if not _settings.aot_topology():
        return local
    _C.info()  # the runtime started: the target opens with it
    raw = _C.aot_report()
    return raw["devices"] if raw["mesh_compile_only"] else local


def _size(v):
    if v is None:
        return "-"
    for size, name in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if v >= size:
            return f"{v / size:.1f} {name}"
    return f"{v} B"


class AotProgram:
    """One program compiled for the topology. ok is False when libtpu refused
    it (error says why; error_kind is "out of memory" for a program larger
    than a chip's memory). runs: how many times its program was launched
    (on the execution plugin, or as a compile-only mesh's program). Numbers libtpu did not report are None (an
    optimal_seconds of None: no estimate). Memory numbers are per chip."""

    __slots__ = (
        "name",
        "ok",
        "error",
        "error_kind",
        "flops",
        "bytes_accessed",
        "transcendentals",
        "optimal_seconds",
        "argument_bytes",
        "output_bytes",
        "alias_bytes",
        "temp_bytes",
        "peak_bytes",
        "code_bytes",
        "hbm_limit_bytes",
        "serialized_bytes",
        "partitions",
        "fingerprint",
        "compile_seconds",
        "cached",
        "runs",
    )

    def __init__(self, d, hbm):
        for k, v in d.items():
            setattr(self, k, v)
        self.hbm_limit_bytes = hbm

    def as_dict(self):
        return {k: getattr(self, k) for k in self.__slots__}

    def __repr__(self):
        if not self.ok:
            return f"<AotProgram {self.name!r}: {self.error_kind}: {self.error}>"
        return (
            f"<AotProgram {self.name!r}: {self.flops:.0f} flops, peak {_size(self.peak_bytes)} "
            f"of {_size(self.hbm_limit_bytes)}, compiled in {self.compile_seconds:.2f} s>"
        )


class AotReport:
    """topology, kind (libtpu's device kind), devices (chips), hbm_bytes (per
    chip), strict, platform_version, programs: [AotProgram], in the order they
    were compiled. str() is a summary; summary(n) lists the n largest."""

    def __init__(self, raw):
        self.topology = raw["topology"]
        self.kind = raw["kind"]
        self.devices = raw["devices"]
        self.hbm_bytes = raw["hbm_bytes"]
        self.strict = raw["strict"]
        self.platform_version = raw["platform_version"]
        self.programs = [AotProgram(p, raw["hbm_bytes"]) for p in raw["programs"]]

    def __len__(self):
        return len(self.programs)

    def __iter__(self):
        return iter(self.programs)

    @property
    def failed(self):
        return [p for p in self.programs if not p.ok]

    @property
    def peak_bytes(self):
        """The largest per-chip peak of any program (None: none compiled)."""
        return max((p.peak_bytes for p in self.programs if p.ok and p.peak_bytes is not None), default=None)

    def summary(self, top=5):
        if not self.topology:
            return "torchtpu AOT: off (set TORCHTPU_AOT_TOPOLOGY=v5e:2x2, for one)"
        ok = [p for p in self.programs if p.ok]
        lines = [
            f"torchtpu AOT: {len(self.programs)} programs for TPU {self.topology} "
            f"({self.kind or 'not opened yet'}, {self.devices} chips, {_size(self.hbm_bytes)} HBM each): "
            f"{len(ok)} compiled, {len(self.failed)} refused"
            + (f", {sum(p.cached for p in self.programs)} from the disk cache" if any(p.cached for p in ok) else ""),
        ]
        if ok:
            flops = sum(p.flops or 0 for p in ok)
            secs = sum(p.compile_seconds for p in ok)
            peak = self.peak_bytes
            share = f" ({100 * peak / self.hbm_bytes:.2f}% of a chip)" if peak is not None and self.hbm_bytes else ""
            lines.append(
                f"  largest peak HBM {_size(peak)}{share}; {flops:.4g} flops in all; compile {secs:.1f} s in all"
            )
            lines.append(f"  {'program':<56} {'flops':>10} {'peak HBM':>10} {'temp':>10} {'exec size':>10} {'s':>6}")
            for p in sorted(ok, key=lambda p: p.peak_bytes or 0, reverse=True)[:top]:
                lines.append(
                    f"  {p.name[:56]:<56} {p.flops or 0:>10.3g} {_size(p.peak_bytes):>10} {_size(p.temp_bytes):>10} "
                    f"{_size(p.serialized_bytes):>10} {p.compile_seconds:>6.2f}"
                )
        groups = {}
        for p in self.failed:
            groups.setdefault((p.error_kind, p.error.split("\n")[0][:200]), []).append(p.name)
        for (kind, err), names in sorted(groups.items(), key=lambda g: -len(g[1])):
            lines.append(f"  refused ({kind}) x{len(names)}: {err}  [{', '.join(sorted(set(names))[:5])}]")
        return "\n".join(lines)

    def __str__(self):
        return self.summary()

    def __repr__(self):
        return f"<AotReport {self.topology}: {len(self.programs)} programs, {len(self.failed)} refused>"


def report():
    """The report, after running what fused mode has recorded (its programs
    are compiled when they run)."""
    if _C.initialized():
        _C.synchronize()
    return AotReport(_C.aot_report())
