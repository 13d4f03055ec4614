"""torch.autocast("tpu"): PyTorch's autocast op policy for the tpu device.

PyTorch implements autocast as kernels under a per-device dispatch key; for
PrivateUse1 it ships none, so every op would fail under the key. Here every
op falls through the key except the ops of the policy, whose kernels cast
their floating-point tpu arguments and call the op again below the key, as
PyTorch's CUDA autocast kernels do (same lists, same rules):

- lower precision: matmuls, convolutions, linear, attention run in the
  autocast dtype (bfloat16 by default, or float16);
- float32: pointwise ops that lose range, norms, losses, softmax, sums and
  products run in float32 (where the op takes a dtype, it is passed instead);
- promote: ops mixing their inputs run in the widest input dtype.

float64 tensors, integer tensors and CPU tensors are never cast. PyTorch
caches casts of leaf weights inside an autocast region; this does not (the
results are the same, each cast is one more small program).
"""

import torch

_KEY = torch._C.DispatchKey.AutocastPrivateUse1

LOWER = [
    "_convolution",
    "_convolution.deprecated",
    "conv1d",
    "conv2d",
    "conv3d",
    "conv1d.padding",
    "conv2d.padding",
    "conv3d.padding",
    "conv_tbc",
    "conv_transpose1d",
    "conv_transpose2d.input",
    "conv_transpose3d.input",
    "convolution",
    "prelu",
    "addmm",
    "addmv",
    "addr",
    "matmul",
    "einsum",
    "mm",
    "mv",
    "linalg_vecdot",
    "linear",
    "addbmm",
    "baddbmm",
    "bmm",
    "chain_matmul",
    "linalg_multi_dot",
    "lstm_cell",
    "gru_cell",
    "rnn_tanh_cell",
    "rnn_relu_cell",
    "scaled_dot_product_attention",
]

FP32 = [
    "acos",
    "asin",
    "cosh",
    "erfinv",
    "exp",
    "expm1",
    "log",
    "log10",
    "log2",
    "log1p",
    "reciprocal",
    "rsqrt",
    "sinh",
    "tan",
    "pow.Tensor_Scalar",
    "pow.Tensor_Tensor",
    "pow.Scalar",
    "softplus",
    "layer_norm",
    "native_layer_norm",
    "group_norm",
    "rms_norm",
    "frobenius_norm.dim",
    "nuclear_norm",
    "nuclear_norm.dim",
    "cosine_similarity",
    "poisson_nll_loss",
    "cosine_embedding_loss",
    "nll_loss",
    "nll_loss2d",
    "hinge_embedding_loss",
    "kl_div",
    "l1_loss",
    "smooth_l1_loss",
    "huber_loss",
    "mse_loss",
    "margin_ranking_loss",
    "multilabel_margin_loss",
    "soft_margin_loss",
    "triplet_margin_loss",
    "multi_margin_loss",
    "binary_cross_entropy_with_logits",
    "cross_entropy_loss",
    "dist",
    "pdist",
    "cdist",
    "renorm",
    "logsumexp",
    "upsample_nearest1d",
    "upsample_nearest2d",
    "upsample_nearest3d",
    "upsample_linear1d",
    "upsample_bilinear2d",
    "upsample_trilinear3d",
    "upsample_bicubic2d",
]

# float32 through the op's dtype argument (when the caller gave none).
FP32_DTYPE = [
    "prod",
    "prod.dim_int",
    "softmax.int",
    "log_softmax.int",
    "cumprod",
    "cumsum",
    "linalg_vector_norm",
    "linalg_matrix_norm",
    "sum",
    "sum.dim_IntList",
]

PROMOTE = [
    "addcdiv",
    "addcmul",
    "atan2",
    "bilinear",
    "cross",
    "dot",
    "vdot",
    "grid_sampler",
    "index_put",
    "tensordot",
    "scatter_add",
    "stack",
    "cat",
]

_LIB = None


def _eligible(x):
    return isinstance(x, torch.Tensor) and x.device.type == "tpu" and x.is_floating_point() and x.dtype != torch.float64


def _cast(x, dtype):
    if _eligible(x) and x.dtype != dtype:
        return x.to(dtype)
    if isinstance(x, (list, tuple)) and any(_eligible(v) for v in x):
        return type(x)(_cast(v, dtype) for v in x)
    return x


def _widest(args, kwargs):
    widest = None
    for x in list(args) + list(kwargs.values()):
        for t in x if isinstance(x, (list, tuple)) else (x,):
            if _eligible(t):
                widest = t.dtype if widest is None else torch.promote_types(widest, t.dtype)
    return widest


def _kernel(op, policy):
    excluded = torch._C.DispatchKeySet(_KEY)
    names = [a.name for a in op._schema.arguments]
    dtype_pos = names.index("dtype") if "dtype" in names else -1

    def run(*args, **kwargs):
        if policy == "lower":
            dtype = torch.get_autocast_dtype("tpu")
        elif policy == "promote":
            dtype = _widest(args, kwargs)
        else:
            dtype = torch.float32
        with torch._C._ExcludeDispatchKeyGuard(excluded):
            if policy == "fp32_dtype" and dtype_pos >= 0:
                first = args[0] if args else None
                given = kwargs.get("dtype") if len(args) <= dtype_pos else args[dtype_pos]
                if _eligible(first) and given is None:
                    if len(args) > dtype_pos:
                        args = args[:dtype_pos] + (torch.float32,) + args[dtype_pos + 1 :]
                    else:
                        kwargs["dtype"] = torch.float32
                return op(*args, **kwargs)
            if dtype is not None:
                args = tuple(_cast(a, dtype) for a in args)
                kwargs = {k: _cast(v, dtype) for k, v in kwargs.items()}
            return op(*args, **kwargs)

    return run


def _overload(name):
    base, _, ov = name.partition(".")
    packet = getattr(torch.ops.aten, base, None)
    if packet is None or (ov or "default") not in packet.overloads():
        return None
    return getattr(packet, ov or "default")


def setup():
    global _LIB
    _LIB = torch.library.Library("aten", "IMPL")
    fall = torch.library.Library("_", "IMPL")
    fall.fallback(torch.library.fallthrough_kernel, dispatch_key="AutocastPrivateUse1")
    for policy, names in (("lower", LOWER), ("fp32", FP32), ("fp32_dtype", FP32_DTYPE), ("promote", PROMOTE)):
        for name in names:
            op = _overload(name)
            if op is not None:
                _LIB.impl(name, _kernel(op, policy), "AutocastPrivateUse1")
    _LIB._fallthrough = fall  # kept alive with the registrations
    # torch.autocast("tpu") without a dtype: bfloat16, the TPU's own 16-bit type (as PyTorch/XLA);
    # torch's default for a PrivateUse1 device is float16. dtype=torch.float16 still gives float16.
    torch.set_autocast_dtype("tpu", torch.bfloat16)
