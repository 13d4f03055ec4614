"""Running one OpInfo entry's samples on tpu and on the CPU and comparing
them (tests.sweeps.op_coverage's worker side): which ops are random, tie
their indices or decompose up to a sign or an order, the tolerances, the
comparison of results and gradients, the classification of errors, and the
worker process that runs one (op, dtype) job at a time."""

import json
import os
import re
import sys
import time
import traceback

DTYPES = ("float32", "bfloat16", "int64", "bool")

# Ops whose values are random or uninitialised: their results are compared for
# shape and dtype only (their statistics are tested in tests/test_random.py).
RANDOM_OPS = {
    "bernoulli",
    "normal",
    "normal.number_mean",
    "normal.in_place",
    "uniform",
    "multinomial",
    "nn.functional.dropout",
    "nn.functional.dropout2d",
    "nn.functional.dropout3d",
    "nn.functional.alpha_dropout",
    "nn.functional.feature_alpha_dropout.with_train",
    "nn.functional.feature_alpha_dropout.without_train",
    "nn.functional.rrelu",
    "rand_like",
    "randn_like",
    "randint_like",
    "randint",
    "empty",
    "empty_like",
    "new_empty",
    "new_empty_strided",
    "empty_strided",
    "empty_permuted",
    "exponential",
    "geometric",
    "log_normal",
    "cauchy",
    "torch.empty",
    "nn.functional.fractional_max_pool2d",
    "nn.functional.fractional_max_pool3d",
    "randperm",
    "cuda_rng_state",
}

# Entries whose samples are random only in training mode (dropout inside):
# those samples are compared for shape and dtype only, the others in full.
RANDOM_IN_TRAINING = {"nn.functional.multi_head_attention_forward"}
# Entries whose samples are random when their dropout_p is positive.
RANDOM_WITH_DROPOUT_P = {"nn.functional.scaled_dot_product_attention"}


# Ops whose returned indices are not specified when values tie (torch's CPU
# sorts are not stable by default; topk/kthvalue/median pick any of equal
# elements). Values are compared exactly; the indices are checked to point at
# elements equal to the ones the CPU's indices point at (unless the sample
# asks for a stable sort, then they must match exactly).
def _arg(sample, pos, name, default):
    if name in sample.kwargs:
        return sample.kwargs[name]
    return sample.args[pos] if len(sample.args) > pos else default


TIE_INDEX_OPS = {
    # entry: (sample -> dim or None, sample -> keepdim, index of the indices output or None if it is the output)
    "sort": (lambda s: _arg(s, 0, "dim", -1), lambda s: True, 1),
    "argsort": (lambda s: _arg(s, 0, "dim", -1), lambda s: True, None),
    "topk": (lambda s: _arg(s, 1, "dim", -1), lambda s: True, 1),
    "kthvalue": (lambda s: _arg(s, 1, "dim", -1), lambda s: _arg(s, 2, "keepdim", False), 1),
    "median": (lambda s: _arg(s, 0, "dim", None), lambda s: _arg(s, 1, "keepdim", False), 1),
    "nanmedian": (lambda s: _arg(s, 0, "dim", None), lambda s: _arg(s, 1, "keepdim", False), 1),
    "mode": (lambda s: _arg(s, 0, "dim", -1), lambda s: _arg(s, 1, "keepdim", False), 1),
}


def _check_tie_indices(name, sample, expected, actual, dtype_name):
    """Compare an op's outputs where tied indices may differ; raises _Mismatch."""
    import torch

    dim_of, keep_of, pos = TIE_INDEX_OPS[name]
    dim = dim_of(sample)
    if pos is not None and not isinstance(expected, (tuple, list)):  # no indices returned
        _compare(expected, actual, dtype_name)
        return
    exp_i = expected if pos is None else expected[pos]
    act_i = actual if pos is None else actual[pos]
    if pos is not None:  # every other output exactly
        _compare(
            [e for i, e in enumerate(expected) if i != pos], [a for i, a in enumerate(actual) if i != pos], dtype_name
        )
    if (
        not isinstance(exp_i, torch.Tensor)
        or dim is None
        or (name == "sort" and sample.kwargs.get("stable"))
        or (name == "argsort" and sample.kwargs.get("stable"))
    ):
        _compare(exp_i, act_i, dtype_name, what="indices")
        return
    _compare(exp_i, act_i, dtype_name, values=False, what="indices")
    inp = sample.input
    if inp.dim() == 0:
        _compare(exp_i, act_i, dtype_name, what="indices")
        return
    e, a = exp_i, act_i.cpu()
    if not keep_of(sample) and e.dim() < inp.dim():
        e, a = e.unsqueeze(dim), a.unsqueeze(dim)
    if a.numel() and (a.min() < 0 or a.max() >= inp.shape[dim]):
        raise _Mismatch("indices: out of range")
    ge, ga = torch.gather(inp, dim, e), torch.gather(inp, dim, a)
    if not torch.equal(ge.isnan(), ga.isnan()) if ge.is_floating_point() else False:
        raise _Mismatch("indices: point at different elements")
    if not torch.equal(
        torch.nan_to_num(ge) if ge.is_floating_point() else ge, torch.nan_to_num(ga) if ga.is_floating_point() else ga
    ):
        raise _Mismatch("indices: point at elements that differ from the CPU's")


# Eigendecompositions: eigenvalues are a multiset (a QR algorithm's order need
# not be LAPACK's) and eigenvectors are defined up to a phase (a sign when real),
# so these entries are compared by what the math defines: the tpu eigenvalues,
# put in the CPU's order by nearest matching, equal the CPU's; every tpu
# eigenpair satisfies A v = w v and has unit norm; and the vector of an
# eigenvalue apart from the others equals the CPU's times a phase. Gradients go
# through the entry's own output_process_fn_grad (eigenvalues and |vectors|, as
# PyTorch's OpInfo tests do), in the CPU's order.
def _eig_match(e, a):
    """Per matrix, the permutation p (int64, e's shape) with a[..., p] nearest e:
    greedy over the globally closest remaining pairs."""
    import torch

    n = e.shape[-1]
    ef, af = e.detach().reshape(-1, n), a.detach().cpu().reshape(-1, n).to(e.dtype)
    perms = []
    for eb, ab in zip(ef, af):
        d = (eb[:, None] - ab[None, :]).abs()
        d = torch.where(torch.isnan(d), torch.full_like(d, float("inf")), d)
        p = [0] * n
        for _ in range(n):
            k = int(torch.argmin(d))
            i, j = divmod(k, n)
            p[i] = j
            d[i, :] = float("inf")
            d[:, j] = float("inf")
        perms.append(p)
    return torch.tensor(perms, dtype=torch.int64).reshape(e.shape)


def _eig_matrix(name, sample):
    """The matrix whose eigenpairs the entry computes (eigh reads one triangle)."""

    A = sample.input.detach()
    if name == "linalg.eigh":
        lower = str(_arg(sample, 0, "UPLO", "L")).upper() == "L"
        t = A.tril() if lower else A.triu()
        A = t + (t.tril(-1) if lower else t.triu(1)).mH
        A = A - 1j * A.diagonal(dim1=-2, dim2=-1).imag.diag_embed() if A.is_complex() else A
    return A


def _check_eig(name, sample, expected, actual, dtype_name):
    """Compare an eigendecomposition invariantly (see above); raises _Mismatch.
    Returns actual with its eigenpairs in the CPU's order (differentiable)."""
    import torch

    vectors = isinstance(expected, (tuple, list))
    ew, aw = (expected[0], actual[0]) if vectors else (expected, actual)
    _compare(expected, actual, dtype_name, values=False)
    if ew.numel() == 0:
        return actual
    p = _eig_match(ew, aw) if name != "linalg.eigh" else None
    if p is not None:
        aw = torch.gather(aw, -1, p.to(aw.device))
    _compare(ew, aw, dtype_name, what="eigenvalues")
    if not vectors:
        return aw
    ev, av = expected[1], actual[1]
    if p is not None:
        av = torch.gather(av, -1, p.to(av.device).unsqueeze(-2).expand(av.shape))
    A, V, w = _eig_matrix(name, sample), av.detach().cpu(), aw.detach().cpu()
    tol = TOLERANCES.get(dtype_name, dict(rtol=1e-4, atol=1e-5))
    cdt = V.dtype if V.is_complex() else torch.promote_types(V.dtype, torch.complex64)
    Ac, Vc, wc = A.to(cdt), V.to(cdt), w.to(cdt)
    scale = 1.0 + float(A.abs().amax()) if A.numel() else 1.0
    res = float((Ac @ Vc - Vc * wc.unsqueeze(-2)).abs().amax())
    if res > tol["atol"] + tol["rtol"] * scale * A.shape[-1]:
        raise _Mismatch(f"eigenvectors: |A v - w v| = {res:.3g}")
    nrm = float((Vc.abs().pow(2).sum(-2) - 1).abs().amax())
    if nrm > 10 * tol["rtol"]:
        raise _Mismatch(f"eigenvectors: norms differ from 1 by {nrm:.3g}")
    # the CPU's vectors, up to a phase, where the eigenvalue is apart from the others
    E = ev.detach().to(cdt)
    ph = (E.conj() * Vc).sum(-2)
    ph = torch.where(ph.abs() > 0, ph / ph.abs(), torch.ones_like(ph))
    # (0 * inf would be NaN off the diagonal: mask the diagonal instead)
    n = ew.shape[-1]
    gap = (ew.unsqueeze(-1) - ew.unsqueeze(-2)).abs().masked_fill(torch.eye(n, dtype=torch.bool), float("inf"))
    apart = gap.amin(-1) > 1e-3 * scale
    got = torch.where(apart.unsqueeze(-2), Vc * ph.conj().unsqueeze(-2), E)
    _compare(E, got, dtype_name, what="eigenvectors (up to a phase)")
    return type(actual)((aw, av)) if hasattr(actual, "_fields") else (aw, av)


INVARIANT_OPS = {"linalg.eig", "linalg.eigvals", "linalg.eigh"}


# Tolerances of the comparison, by dtype: XLA's transcendental functions and
# reduction orders differ from the CPU kernels' by a few ulps.
TOLERANCES = {
    "float32": dict(rtol=1e-4, atol=1e-5),
    "bfloat16": dict(rtol=2e-2, atol=2e-2),
    "float64": dict(rtol=1e-7, atol=1e-7),
}

# Tensor arguments that the op requires on the CPU (as PyTorch documents):
# entry name -> positions in sample.args that stay where the sample made them.
HOST_ARGS = {"tensor_split": (0,)}

PER_OP_SECONDS = 900
# The pseudo-dtype of a job that runs an entry's OpInfo error inputs.
ERRORS = "errors"
RESULT_TAG = "@@OPCOV "


def entry_name(op):
    return op.name + ("." + op.variant_test_name if op.variant_test_name else "")


# ---------------------------------------------------------------------------
# The worker: runs one (op, dtype) at a time.


class _Mismatch(Exception):
    pass


def _to_tpu(x):
    """The tpu twin of a sample tensor, with the same layout: a view or a
    non-contiguous tensor becomes the same view (sizes, strides, storage
    offset) of a tpu copy of its whole storage, so that ops see what they
    would see on the CPU."""
    import torch

    if not isinstance(x, torch.Tensor):
        return x
    plain = (
        x.layout != torch.strided
        or x.is_conj()
        or x.is_neg()
        or x.numel() == 0
        or (x.is_contiguous() and x.storage_offset() == 0 and x._base is None)
    )
    if plain:
        y = x.detach().to("tpu")
    else:
        n = x.untyped_storage().nbytes() // x.element_size()
        flat = torch.empty(0, dtype=x.dtype).set_(x.untyped_storage(), 0, [n], [1])
        y = flat.detach().to("tpu").as_strided(x.size(), x.stride(), x.storage_offset()).detach()
    if x.requires_grad:
        y.requires_grad_(True)
    return y


def _aliasing_to_tpu():
    """A _to_tpu that keeps aliasing: tensors that share a CPU storage (the
    same tensor passed twice, an out= that is a view of an input) become
    views of one tpu copy of that storage, so the op sees the overlap the CPU
    sees. Tensors on other devices (meta) are left as they are."""
    import torch

    flats = {}

    def conv(x):
        if not isinstance(x, torch.Tensor) or x.device.type != "cpu":
            return x
        if x.layout != torch.strided or x.is_conj() or x.is_neg() or x.numel() == 0:
            return _to_tpu(x)
        st = x.untyped_storage()
        key = (st.data_ptr(), x.dtype)
        if key not in flats:
            n = st.nbytes() // x.element_size()
            flat = torch.empty(0, dtype=x.dtype).set_(st, 0, [n], [1])
            flats[key] = flat.detach().to("tpu")
        y = flats[key].as_strided(x.size(), x.stride(), x.storage_offset())
        if x.requires_grad:
            y = y.detach().requires_grad_(True)
        return y

    return conv


def _tree_map(fn, x):
    if isinstance(x, (list, tuple)):
        vals = [_tree_map(fn, v) for v in x]
        if hasattr(x, "_fields"):
            return type(x)(*vals)
        try:
            return type(x)(vals)
        except TypeError:
            return tuple(vals)
    if isinstance(x, dict):
        return {k: _tree_map(fn, v) for k, v in x.items()}
    return fn(x)


def _leaves(x, out):
    import torch

    if isinstance(x, torch.Tensor):
        out.append(x)
    elif isinstance(x, (list, tuple)):
        for v in x:
            _leaves(v, out)
    elif isinstance(x, dict):
        for v in x.values():
            _leaves(v, out)
    return out


def _compare(expected, actual, dtype_name, values=True, what="output"):
    """Raise _Mismatch naming what differs."""
    import torch

    el, al = _leaves(expected, []), _leaves(actual, [])
    if not isinstance(expected, torch.Tensor) and not el:
        if isinstance(actual, torch.Tensor):
            actual = actual.cpu().item() if actual.numel() == 1 else actual.cpu()
        if isinstance(expected, (int, float, bool)) and isinstance(actual, (int, float, bool)):
            if values and expected != actual and not (expected != expected and actual != actual):
                if abs(float(expected) - float(actual)) > 1e-4 * max(1.0, abs(float(expected))):
                    raise _Mismatch(f"{what}: {actual!r} != {expected!r}")
        return
    if len(el) != len(al):
        raise _Mismatch(f"{what}: {len(al)} tensors, expected {len(el)}")
    for i, (e, a) in enumerate(zip(el, al)):
        name = what if len(el) == 1 else f"{what}[{i}]"
        if a.device.type != e.device.type and not (e.device.type == "cpu" and a.device.type == "tpu"):
            raise _Mismatch(f"{name}: device {a.device}, expected {e.device}")
        if a.dtype != e.dtype:
            raise _Mismatch(f"{name}: dtype {a.dtype}, expected {e.dtype}")
        if tuple(a.shape) != tuple(e.shape):
            raise _Mismatch(f"{name}: shape {tuple(a.shape)}, expected {tuple(e.shape)}")
        if not values:
            continue
        ac = a.detach().cpu()
        ec = e.detach()
        if ec.is_complex() or ec.is_floating_point():
            tol = TOLERANCES.get(str(ec.dtype).replace("torch.", ""), dict(rtol=1e-4, atol=1e-5))
            if ec.dtype in (torch.bfloat16, torch.float16):
                tol = TOLERANCES["bfloat16"]
        else:
            tol = dict(rtol=0, atol=0)
        try:
            torch.testing.assert_close(ac, ec, equal_nan=True, check_stride=False, **tol)
        except AssertionError as err:
            msg = str(err).strip().splitlines()
            raise _Mismatch(f"{name}: " + " ".join(m.strip() for m in msg[:4])) from None


def _grad_inputs(sample):
    import torch

    return [
        t
        for t in _leaves([sample.input, list(sample.args), dict(sample.kwargs)], [])
        if isinstance(t, torch.Tensor) and t.requires_grad
    ]


# Singular vectors are defined up to a sign per pair (u_j, v_j), and the
# columns past min(m, n) of a full U or V only as a basis of what the others
# leave: S is compared as it is; each tpu pair, turned to the CPU's sign, is
# compared with the CPU's where its singular value is apart from the others;
# U and V must be orthonormal. Gradients go through the entry's own
# output_process_fn_grad (|U|, S, |Vh|, U Vh), as PyTorch's OpInfo tests do.
SVD_OPS = {"svd", "linalg.svd"}


def _check_svd(name, expected, actual, dtype_name):
    import torch

    _compare(expected, actual, dtype_name, values=False)
    eu, es, ev = expected
    au, as_, av = (t.detach().cpu() for t in actual)
    _compare(es, as_, dtype_name, what="S")
    k = es.shape[-1]
    if name == "linalg.svd":  # Vh -> V
        ev, av = ev.mH, av.mH
    if k == 0 or eu.numel() == 0:
        return
    tol = TOLERANCES.get(dtype_name, dict(rtol=1e-4, atol=1e-5))
    for what, x in (("U", au), ("V", av)):
        err = float((x.mH @ x - torch.eye(x.shape[-1], dtype=x.dtype)).abs().amax())
        if err > 10 * tol["rtol"]:
            raise _Mismatch(f"{what}: not orthonormal (|{what}^T {what} - I| = {err:.3g})")
    eu, au, ev, av = eu[..., :k].detach(), au[..., :k], ev[..., :k].detach(), av[..., :k]
    sg = torch.where((eu * au).sum(-2) < 0, -1.0, 1.0).to(au.dtype).unsqueeze(-2)
    gap = (es.unsqueeze(-1) - es.unsqueeze(-2)).abs().masked_fill(torch.eye(k, dtype=torch.bool), float("inf"))
    apart = (gap.amin(-1) > 1e-3 * (1.0 + float(es.abs().amax()))).unsqueeze(-2)
    _compare(eu, torch.where(apart, au * sg, eu), dtype_name, what="U (up to signs)")
    _compare(ev, torch.where(apart, av * sg, ev), dtype_name, what="V (up to signs)")


def _run_sample(op, sample, dtype_name, values, grad):
    """Compare one sample; returns 'pass', 'skip' (the CPU refused it), or
    raises (_Mismatch or the tpu error)."""
    import torch

    try:
        expected = op(sample.input, *sample.args, **sample.kwargs)
    except Exception:
        return "skip"
    tsample = sample.transform(_to_tpu)
    targs = list(tsample.args)
    for i in HOST_ARGS.get(entry_name(op), ()):
        if i < len(targs):
            targs[i] = sample.args[i]
    tsample.args = tuple(targs)
    actual = op(tsample.input, *tsample.args, **tsample.kwargs)
    name = entry_name(op)
    if name in TIE_INDEX_OPS and values:
        _check_tie_indices(name, sample, expected, actual, dtype_name)
    elif name in INVARIANT_OPS and values:
        actual = _check_eig(name, sample, expected, actual, dtype_name)
    elif name in SVD_OPS and values:
        _check_svd(name, expected, actual, dtype_name)
    else:
        _compare(expected, actual, dtype_name, values)
    if not grad:
        return "pass"
    if name in INVARIANT_OPS or name in SVD_OPS:
        expected, actual = sample.output_process_fn_grad(expected), sample.output_process_fn_grad(actual)
    cin, tin = _grad_inputs(sample), _grad_inputs(tsample)
    couts = [t for t in _leaves(expected, []) if t.requires_grad and t.grad_fn is not None]
    touts = [t for t in _leaves(actual, []) if t.requires_grad and t.grad_fn is not None]
    if not cin or not couts:
        return "pass"
    if len(touts) != len(couts):
        raise _Mismatch(f"gradient: {len(touts)} differentiable outputs, expected {len(couts)}")
    gen = torch.Generator().manual_seed(0)
    gos = [
        torch.randn(o.shape, generator=gen, dtype=o.dtype) if o.is_floating_point() else torch.ones_like(o)
        for o in couts
    ]
    try:
        cgrads = torch.autograd.grad(couts, cin, gos, allow_unused=True)
    except Exception:
        return "pass"
    tgrads = torch.autograd.grad(touts, tin, [g.to(o.device) for g, o in zip(gos, touts)], allow_unused=True)
    for i, (cg, tg) in enumerate(zip(cgrads, tgrads)):
        if cg is None and tg is None:
            continue
        if cg is None:
            cg = torch.zeros_like(cin[i])
        if tg is None:
            tg = torch.zeros_like(tin[i])
        _compare(cg, tg, dtype_name, values, what=f"grad[{i}]")
    return "grad"


def _classify(exc):
    msg = f"{type(exc).__name__}: {exc}".strip().splitlines()[0][:300]
    if isinstance(exc, _Mismatch):
        return "wrong", str(exc)[:300]
    text = str(exc)
    if isinstance(exc, NotImplementedError) and "is not lowered" in text:
        overload = text.split("torchtpu: ", 1)[-1].split(" is not lowered", 1)[0]
        return "not_lowered", overload
    # torch's own dispatcher: no kernel for the tpu key (a sparse layout, or an
    # op torch routes to an "_overrideable" hook for out-of-tree devices)
    if isinstance(exc, NotImplementedError):
        m = re.search(r"Could not run '(aten::[\w.]+)'", text) or re.search(
            r"^(\w+_overrideable) not implemented", text
        )
        if m:
            name = m.group(1)
            return "not_lowered", name if name.startswith("aten::") else "aten::" + name
    return "error", msg


def _values(name, sample, values):
    """Whether this sample's values are compared (not random)."""
    if name in RANDOM_IN_TRAINING and sample.kwargs.get("training", False):
        return False
    if name in RANDOM_WITH_DROPOUT_P and sample.kwargs.get("dropout_p", 0.0) > 0:
        return False
    return values


def run_entry(op, dtype_name, grad=True):
    """Run every sample of one OpInfo entry for one dtype. Returns a dict:
    status, detail, samples counted, grad (status of the gradient check, or
    None when the op has no gradient for this dtype)."""
    import torch

    dtype = getattr(torch, dtype_name)
    name = entry_name(op)
    values = name not in RANDOM_OPS
    want_grad = grad and op.supports_autograd and dtype_name == "float32"
    res = {"status": "pass", "detail": "", "samples": 0, "grad": None, "grad_detail": ""}
    try:
        samples = list(op.sample_inputs("cpu", dtype, requires_grad=False))
    except Exception as e:
        return dict(res, status="no_samples", detail=f"sample_inputs: {type(e).__name__}: {e}"[:300])
    for s in samples:
        torch.manual_seed(0)
        try:
            r = _run_sample(op, s, dtype_name, _values(name, s, values), grad=False)
        except Exception as e:
            st, detail = _classify(e)
            return dict(res, status=st, detail=detail)
        if r != "skip":
            res["samples"] += 1
    if res["samples"] == 0:
        res["status"] = "no_samples"
        res["detail"] = "the CPU refused every sample"
    if not want_grad or res["status"] != "pass":
        return res
    res["grad"] = "pass"
    try:
        gsamples = list(op.sample_inputs("cpu", dtype, requires_grad=True))
    except Exception as e:
        res["grad"], res["grad_detail"] = "no_samples", f"sample_inputs: {e}"[:300]
        return res
    checked = 0
    for s in gsamples:
        torch.manual_seed(0)
        try:
            r = _run_sample(op, s, dtype_name, _values(name, s, values), grad=True)
        except Exception as e:
            res["grad"], res["grad_detail"] = _classify(e)
            return res
        checked += r == "grad"
    if checked == 0:
        res["grad"] = "no_samples"
        res["grad_detail"] = "no sample with a differentiable output"
    return res


def _force(x):
    """Bring every tensor of a result to the host, so that an error the
    device would report late is raised here."""
    import torch

    for t in _leaves(x, []):
        if isinstance(t, torch.Tensor) and t.device.type != "cpu":
            t.detach().cpu()


def _describe_error_input(e):
    s = e.sample_input

    def d(x):
        import torch

        if isinstance(x, torch.Tensor):
            return f"{str(x.dtype).replace('torch.', '')}{list(x.shape)}"
        if isinstance(x, (list, tuple)):
            return "(" + ", ".join(d(v) for v in x) + ")"
        return repr(x)[:40]

    parts = [d(s.input)] + [d(a) for a in s.args] + [f"{k}={d(v)}" for k, v in s.kwargs.items()]
    return ", ".join(parts)[:200]


def run_error_entry(op):
    """Run every OpInfo error input of one entry on the CPU and on tpu.
    Returns counts: same (both raise the same exception type), other (tpu
    raises another type), none (tpu raises nothing), cpu_none (the CPU raises
    nothing either: not counted), and the details of those that differ."""
    import torch

    res = {"status": "errors", "same": 0, "other": 0, "none": 0, "cpu_none": 0, "details": []}
    if getattr(op, "error_inputs_func", None) is None:  # the entry documents no error inputs
        res["status"], res["detail"] = "no_error_inputs", ""
        return res
    try:
        errs = list(op.error_inputs("cpu"))
    except Exception as e:
        res["status"] = "no_error_inputs"
        res["detail"] = f"error_inputs: {type(e).__name__}: {e}"[:300]
        return res
    for e in errs:
        s = e.sample_input
        torch.manual_seed(0)
        try:
            _force(op(s.input, *s.args, **s.kwargs))
            res["cpu_none"] += 1
            continue
        except Exception as exc:
            cpu_exc = exc
        torch.manual_seed(0)
        try:
            ts = s.transform(_aliasing_to_tpu())
            _force(op(ts.input, *ts.args, **ts.kwargs))
            tpu_exc = None
        except Exception as exc:
            tpu_exc = exc
        what = _describe_error_input(e)
        cpu_t = type(cpu_exc).__name__
        if tpu_exc is None:
            res["none"] += 1
            res["details"].append({"kind": "none", "input": what, "cpu": f"{cpu_t}: {str(cpu_exc)[:150]}"})
        elif type(tpu_exc) is type(cpu_exc):
            res["same"] += 1
        else:
            res["other"] += 1
            res["details"].append(
                {
                    "kind": "other",
                    "input": what,
                    "cpu": f"{cpu_t}: {str(cpu_exc)[:150]}",
                    "tpu": f"{type(tpu_exc).__name__}: {str(tpu_exc)[:150]}",
                }
            )
    return res


def _worker():
    """Read 'name<TAB>dtype<TAB>grad' lines, answer one tagged JSON line each."""
    import warnings

    warnings.filterwarnings("ignore")
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # anything an op prints goes to stderr, not into the answers
    import torch  # noqa: F401
    from torch.testing._internal.common_methods_invocations import op_db

    import torchtpu  # noqa: F401

    by_name = {entry_name(o): o for o in op_db}
    out.write(RESULT_TAG + json.dumps({"ready": True}) + "\n")
    out.flush()
    for line in sys.stdin:
        name, dtype_name, grad = line.rstrip("\n").split("\t")
        t0 = time.time()
        try:
            if dtype_name == ERRORS:
                r = run_error_entry(by_name[name])
            else:
                r = run_entry(by_name[name], dtype_name, grad == "1")
        except Exception:  # a bug of the harness itself, reported as such
            r = {
                "status": "error",
                "detail": "harness: " + traceback.format_exc(limit=2)[-300:],
                "samples": 0,
                "grad": None,
                "grad_detail": "",
            }
        r["seconds"] = round(time.time() - t0, 2)
        out.write(RESULT_TAG + json.dumps(r) + "\n")
        out.flush()
