"""scaled_dot_product_attention as one op: the kernels registered for it
and for aten's overrideable fused attention and its backward, served by the
internal rows tpu::sdpa and tpu::sdpa_backward (csrc/lower/emit_attention.c)."""

import torch

from . import _C
from ._kernels import _REQUIRED


def kernels(sdpa_row, backward_row, fused, math):
    """scaled_dot_product_attention as one op (csrc/lower/emit_attention.c).
    torch picks an attention kernel per device only for its own devices; for
    this one it would run its math composition, some 15 ops each way. The
    kernel registered for scaled_dot_product_attention (PrivateUse1 and its
    autograd key) routes the common case to aten's overrideable fused
    attention, whose autograd formula calls its backward, both served by
    tpu::sdpa and tpu::sdpa_backward; dropout, grouped-query attention,
    mixed dtypes and other ranks keep the math composition (which also
    raises torch's errors for bad arguments), and so do graphs traced with
    symbolic sizes, whose shape buckets mask the padding op by op (_bucket.py)."""
    fwd = _C.kernel(
        sdpa_row,
        [
            ("query", "T", _REQUIRED),
            ("key", "T", _REQUIRED),
            ("value", "T", _REQUIRED),
            ("attn_mask", "t", None),
            ("is_causal", "b", False),
            ("scale", "g", None),
            ("out_order", "I", []),
        ],
        2,
        _REQUIRED,
    )
    bwd = _C.kernel(
        backward_row,
        [
            ("grad_out", "T", _REQUIRED),
            ("query", "T", _REQUIRED),
            ("key", "T", _REQUIRED),
            ("value", "T", _REQUIRED),
            ("attn_mask", "t", None),
            ("out", "T", _REQUIRED),
            ("logsumexp", "T", _REQUIRED),
            ("is_causal", "b", False),
            ("scale", "g", None),
            ("grad_mask", "b", False),
            ("query_order", "I", []),
            ("key_order", "I", []),
            ("value_order", "I", []),
        ],
        4,
        _REQUIRED,
    )

    def sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        dt = query.dtype
        if (
            dropout_p == 0.0
            and not enable_gqa
            and query.dim() in (3, 4)
            and key.dim() == query.dim()
            and value.dim() == query.dim()
            and key.dtype == dt
            and value.dtype == dt
            and dt.is_floating_point
            and query.shape[:-2] == key.shape[:-2] == value.shape[:-2]
            and key.shape[-2] == value.shape[-2]
            and key.shape[-1] == query.shape[-1]
            and not any(isinstance(n, torch.SymInt) for n in (*query.shape, *key.shape[-2:], value.shape[-1]))
            and (
                attn_mask is None
                or (not is_causal and attn_mask.device == query.device and attn_mask.dtype in (torch.bool, dt))
            )
        ):
            return fused(query, key, value, attn_mask, 0.0, is_causal, False, scale=scale)[0]
        return math(query, key, value, attn_mask, dropout_p, is_causal, None, scale=scale, enable_gqa=enable_gqa)[0]

    def empty_long(device):
        return _C.empty([], torch.int64, None, device.index)

    def laid_out(v, o):
        """A result the kernel wrote in the dim order o, as a view in logical order."""
        return v.permute([o.index(d) for d in range(len(o))]) if o else v

    def fused_attention(
        query, key, value, attn_bias=None, dropout_p=0.0, is_causal=False, return_debug_mask=False, *, scale=None
    ):
        if dropout_p != 0.0 or return_debug_mask:
            raise NotImplementedError(
                "torchtpu: aten::_scaled_dot_product_fused_attention_overrideable with dropout "
                "or a debug mask is not lowered; call scaled_dot_product_attention"
            )
        o = _C.stride_order(query)  # the layout of torch's meta kernels' outputs (empty_like(query))
        out, lse = fwd(query, key, value, attn_bias, is_causal, scale, o)
        out = laid_out(out, o)
        if query.dim() == 3:
            lse = lse.unsqueeze(0)  # (1, H, L), the shape of aten's meta kernel
        return (
            out,
            lse,
            None,
            None,
            query.shape[-2],
            key.shape[-2],
            empty_long(query.device),
            empty_long(query.device),
            None,
        )

    def fused_attention_backward(
        grad_out,
        query,
        key,
        value,
        attn_bias,
        grad_input_mask,
        out,
        logsumexp,
        cum_seq_q,
        cum_seq_k,
        max_q,
        max_k,
        dropout_p,
        is_causal,
        philox_seed,
        philox_offset,
        *,
        scale=None,
    ):
        if query.dim() == 3:
            logsumexp = logsumexp.squeeze(0)
        want_bias = attn_bias is not None and attn_bias.dtype != torch.bool and bool(grad_input_mask[3])
        o = [_C.stride_order(query), _C.stride_order(key), _C.stride_order(value)]
        grads = bwd(grad_out, query, key, value, attn_bias, out, logsumexp, is_causal, scale, want_bias, *o)
        # a gradient the mask turns off is None, as torch's kernels return it
        qkv = tuple(laid_out(grads[i], o[i]) if grad_input_mask[i] else None for i in range(3))
        return (*qkv, grads[3] if want_bias else None)

    return {"sdpa": sdpa, "fused": fused_attention, "backward": fused_attention_backward}
