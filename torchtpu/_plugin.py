"""Where the PJRT plugin is: TORCHTPU_PJRT_PLUGIN (a path), else
TORCHTPU_PLATFORM=cpu|tpu|cuda, else the TPU plugin when libtpu is installed and
a TPU is present, else XLA's CPU plugin. Finding installed packages is
Python's business; loading and checking the plugin is the C runtime's."""

import glob
import importlib.util
import mmap
import os
import struct

try:
    from . import _settings
except ImportError:  # loaded without torchtpu (the Makefile, tests/test_aot.py): its sibling by path
    _spec = importlib.util.spec_from_file_location(
        "_tpu_settings", os.path.join(os.path.dirname(os.path.abspath(__file__)), "_settings.py")
    )
    _settings = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_settings)

_INSTALL = {
    "cpu": "pip install xla-cpu-pjrt` (or, for a newer XLA, `pip install --no-deps lammps-jax-pjrt-cpu",
    "tpu": "pip install libtpu",
    "cuda": "pip install jax-cuda13-pjrt",
}


def _package_dir(name):
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return list(spec.submodule_search_locations)[0]


def _candidates(platform):
    if platform == "cpu":
        # The newer XLA first (faster programs); xla-cpu-pjrt (2025-11) after.
        d = _package_dir("lammps_jax_pjrt_cpu")
        if d:
            yield os.path.join(d, "pjrt_c_api_cpu_plugin.so")
        d = _package_dir("xla_plugins.xla_cpu_pjrt")
        if d:
            yield os.path.join(d, "xla_cpu_pjrt.so")
    elif platform == "tpu":
        d = _package_dir("libtpu")
        if d:
            yield os.path.join(d, "libtpu.so")
    elif platform == "cuda":
        for pkg in ("jax_plugins.xla_cuda13", "jax_plugins.xla_cuda12"):
            d = _package_dir(pkg)
            if d:
                yield from sorted(glob.glob(os.path.join(d, "xla_cuda_plugin*.so")))


def _tpu_present():
    return bool(glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"))


def find():
    """Returns (plugin path, platform name). Raises RuntimeError naming what
    to install when no plugin is found."""
    path = _settings.pjrt_plugin()
    platform = _settings.platform()
    if path:
        if not os.path.exists(path):
            raise RuntimeError(f"TORCHTPU_PJRT_PLUGIN={path!r}: no such file")
        return path, platform or "cpu"
    if platform and platform not in _INSTALL:
        raise RuntimeError(f"TORCHTPU_PLATFORM={platform!r}: expected one of cpu, tpu, cuda")
    if not platform:
        tpu = next(_candidates("tpu"), None)
        platform = "tpu" if tpu and os.path.exists(tpu) and _tpu_present() else "cpu"
    for cand in _candidates(platform):
        if os.path.exists(cand):
            if platform == "tpu" and not _tpu_present():
                # no chip here: libtpu would ask the cloud metadata server
                # for the host's TPU for minutes before failing (JAX does the same)
                os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
            return cand, platform
    raise RuntimeError(
        f"torchtpu: no PJRT plugin for platform {platform!r} was found. "
        f"Install it with `{_INSTALL[platform]}`, or point TORCHTPU_PJRT_PLUGIN at a plugin library."
    )


# ---- checks made without loading the plugin ---------------------------------
# torch.tpu.is_available() must not load a plugin (that takes seconds and
# starts its threads), so the file is read as an ELF image: its header, its
# section table, its dynamic symbols. Python's struct does it in a few lines,
# and only Python knows at import whether the device can be used.


def _sections(f):
    """(struct byte order, {section name: (type, offset, size, link)}, the section
    rows) of a 64-bit ELF shared library; raises ValueError saying why f is not one."""
    head = f.read(64)
    if head[:4] != b"\x7fELF":
        raise ValueError("it is not an ELF file")
    if head[4] != 2:
        raise ValueError("it is not a 64-bit ELF file")
    end = "<" if head[5] == 1 else ">"
    (e_type,) = struct.unpack_from(end + "H", head, 16)
    if e_type != 3:
        raise ValueError("it is not a shared library (ELF type %d)" % e_type)
    (shoff,) = struct.unpack_from(end + "Q", head, 40)
    shentsize, shnum, shstrndx = struct.unpack_from(end + "HHH", head, 58)
    if shentsize < 64 or not 0 < shnum < 1 << 16 or shstrndx >= shnum:
        raise ValueError("its ELF section table is unreadable")
    f.seek(shoff)
    table = f.read(shentsize * shnum)
    if len(table) < shentsize * shnum:
        raise ValueError("it is truncated")
    rows = [struct.unpack_from(end + "IIQQQQIIQQ", table, i * shentsize) for i in range(shnum)]
    # (name, type, flags, addr, offset, size, link, info, addralign, entsize)
    names = _read(f, rows[shstrndx][4], rows[shstrndx][5])
    by_name = {}
    for r in rows:
        name = names[r[0] : names.find(b"\0", r[0])].decode("latin-1")
        by_name[name] = (r[1], r[4], r[5], r[6])
    return end, by_name, rows


def _read(f, offset, size):
    f.seek(offset)
    data = f.read(size)
    if len(data) < size:
        raise ValueError("it is truncated")
    return data


def check(path):
    """None when path is a 64-bit ELF shared library whose dynamic symbols
    define GetPjrtApi (what every PJRT plugin exports); else why not."""
    try:
        with open(path, "rb") as f:
            end, by_name, rows = _sections(f)
            dynsym = by_name.get(".dynsym")
            if dynsym is None or dynsym[0] != 11:
                return f"{path} is not a PJRT plugin: it has no dynamic symbol table"
            strtab = rows[dynsym[3]]
            names = _read(f, strtab[4], strtab[5])
            at = names.find(b"\0GetPjrtApi\0")
            if at >= 0:
                want = at + 1
                syms = _read(f, dynsym[1], dynsym[2])
                for st_name, _info, _other, shndx, _value, _size in struct.iter_unpack(end + "IBBHQQ", syms):
                    if st_name == want and shndx != 0:
                        return None
            return f"{path} is not a PJRT plugin: it exports no GetPjrtApi"
    except OSError as e:
        return f"{path} cannot be read: {e.strerror or e}"
    except (ValueError, struct.error) as e:
        return f"{path} is not a PJRT plugin: {e}"


# The plugin parses XLA_FLAGS when its client is made, and an unknown flag
# there ends the process (a fatal log, no error returned through PJRT). The
# flags a plugin knows are string literals in its read-only data, so a flag
# whose name is nowhere in that data is unknown to it.


def _xla_flag_names(text):
    """The flag names in an XLA_FLAGS text, read as the plugin reads it: flags
    start with '-' and are separated by white space, a value after '=' may be
    quoted, and reading stops at the first word that does not start with '-'."""
    names, i, n = [], 0, len(text)
    while True:
        while i < n and text[i].isspace():
            i += 1
        if i == n or text[i] != "-":
            return names
        j = i
        while j < n and (text[j] in "-_" or (text[j].isascii() and text[j].isalnum())):
            j += 1
        names.append(text[i:j].lstrip("-"))
        if text[j : j + 1] == "=" and text[j + 1 : j + 2] in ("'", '"'):
            quote, j = text[j + 1], j + 2
            while j < n and text[j] != quote:
                j += 2 if quote == '"' and text[j] == "\\" else 1
            j += 1
        while j < n and not text[j].isspace():
            j += 1
        i = j


def check_xla_flags(path, text):
    """None, or why the plugin at path would end the process on XLA_FLAGS=text."""
    stripped = text.strip()
    if not stripped:
        return None
    if not stripped.startswith("-"):
        # the plugin reads the flags from the file of that name, and ends the process if there is none
        try:
            with open(stripped, encoding="utf-8", errors="replace") as f:
                text = f.read()
        except OSError as e:
            return (
                f"XLA_FLAGS={text!r}: XLA reads a value that does not start with '-' as a file of flags, "
                f"and this one cannot be read ({e.strerror or e})"
            )
    names = _xla_flag_names(text)
    if not names:
        return None
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            _, by_name, _ = _sections(f)
            # the string literals: .rodata (and the large-model .lrodata), PROGBITS
            spans = [
                (off, off + size)
                for name, (kind, off, size, _) in by_name.items()
                if kind == 1 and name.split(".")[1:2] in (["rodata"], ["lrodata"])
            ]
            unknown = [n for n in names if not n or not any(m.find(n.encode() + b"\0", a, b) >= 0 for a, b in spans)]
    except (OSError, ValueError, struct.error):
        return None  # check() reports a plugin that cannot be read
    if not unknown or not spans:
        return None
    return (
        f"XLA_FLAGS names {'flags' if len(unknown) > 1 else 'a flag'} that the plugin {path} does not know: "
        + ", ".join("--" + n for n in unknown)
        + " (the plugin would end the process on it)"
    )
