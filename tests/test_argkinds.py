"""The argument-kind alphabet (csrc/python/argkinds.def): every letter the
op registration gives a schema's argument is a kind the C parsers know, and
_C.kernel refuses one they do not."""

import os
import re

import pytest
import torch

from torchtpu import _C, _kernels

DEF = os.path.join(os.path.dirname(__file__), "..", "csrc", "python", "argkinds.def")


def test_arg_kinds_are_the_def_rows():
    with open(DEF) as f:
        rows = re.findall(r"^TPU_ARG_KIND\('(.)', \"([^\"]+)\"", f.read(), re.M)
    assert rows and _C.arg_kinds() == dict(rows)


def test_every_registered_schema_letter_is_a_kind():
    kinds = _C.arg_kinds()
    seen, unknown = set(), []
    for name, _op_id, _flags in _C.ops():
        if name.startswith("tpu::"):
            continue
        base, _, ov = name.partition(".")
        try:
            schema = getattr(getattr(torch.ops.aten, base), ov or "default")._schema
        except (AttributeError, RuntimeError):
            continue  # an overload this torch lacks: not registered
        for a in schema.arguments:
            try:
                k = _kernels._kind(a)
            except NotImplementedError:
                continue  # a schema type left to the fallback
            seen.add(k)
            if k not in kinds:
                unknown.append(f"{name}: {a.name} -> {k!r}")
    assert not unknown, unknown[:20]
    assert len(seen) > 10, seen


def test_kernel_refuses_an_unknown_kind():
    req = object()
    with pytest.raises(ValueError, match="unknown kind '\\?'"):
        _C.kernel(0, [("x", "?", req)], 1, req)
    with pytest.raises(ValueError, match="unknown kind 'TT'"):
        _C.kernel(0, [("x", "TT", req)], 1, req)
