"""Attention of a query block against one bounded KV chunk, with its log-sum-exp.

Paged attention in the reference is a sum over KV chunks: each chunk is gathered from the
pool (a bounded copy, never the whole sequence), attended to, and merged into the running
result through the log-sum-exp of its scores, as flash attention does across tiles. On the
CPU the chunk goes through ATen's flash kernel (``_scaled_dot_product_flash_attention_for_cpu``,
the kernel behind ``scaled_dot_product_attention``, which also returns the LSE); elsewhere,
or when asked, through plain float32 matmuls.

Shapes: ``q`` is ``[H, Lq, D]``, ``k``/``v`` are ``[Tk, kv_heads, D]`` (views of gathered
blocks), ``visible`` is ``None`` (every row sees every key) or a bool ``[Lq, Tk]``.
Results are float32 ``out [H, Lq, D]`` and ``lse [H, Lq]``; a row that sees no key has
``lse = -inf`` and ``out = 0``.
"""

from __future__ import annotations

import os

import torch

# Rows of a float32 score matrix materialised at once by the matmul path
# (rows x keys x 4 bytes per KV head): bounds its memory to ~64 MiB per head.
_MATH_SCORE_ELEMS = 16 << 20

_flash_cpu = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def _use_flash(q: torch.Tensor) -> bool:
    # KERNELS_TORCH_MATH=1 forces the matmul path so tests can cover it on the CPU.
    return (
        _flash_cpu is not None
        and q.device.type == "cpu"
        and os.environ.get("KERNELS_TORCH_MATH") != "1"
    )


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    visible: torch.Tensor | None,
    causal: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``causal=True`` means row ``i`` sees keys ``0..i`` (top-left), with no mask tensor."""
    if _use_flash(q):
        return _attend_flash(q, k, v, scale, visible, causal)
    if causal:
        visible = _causal_mask(q.shape[1], k.shape[0], q.device)
    return _attend_math(q, k, v, scale, visible)


def _causal_mask(lq: int, tk: int, device: torch.device) -> torch.Tensor:
    return torch.arange(tk, device=device)[None, :] <= torch.arange(lq, device=device)[:, None]


def _attend_flash(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    visible: torch.Tensor | None,
    causal: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    op = _flash_cpu
    if op is None:  # _use_flash() checked; keeps the type checker honest
        raise RuntimeError("ATen's CPU flash attention is unavailable")
    h, lq, d = q.shape
    kvh = k.shape[1]
    group = h // kvh
    if visible is None and not causal:
        # Fold the query heads of a group into rows: one KV head serves g x Lq rows and
        # K/V are read in place (no repeat_kv copy).
        qf = q.reshape(kvh, group * lq, d).unsqueeze(0)
        out, lse = op(
            qf, _heads_first(k), _heads_first(v), 0.0, False, scale=scale
        )[:2]
        return out.reshape(h, lq, d).float(), lse.reshape(h, lq).float()
    # A mask is per row, so rows cannot be folded: expand KV to every query head.
    ke = _heads_first(k.repeat_interleave(group, dim=1))
    ve = _heads_first(v.repeat_interleave(group, dim=1))
    if causal or visible is None:
        out, lse = op(q.unsqueeze(0), ke, ve, 0.0, causal, scale=scale)[:2]
        return out[0].float(), lse[0].float()
    bias = torch.zeros(visible.shape, dtype=q.dtype, device=q.device)
    bias.masked_fill_(~visible, float("-inf"))
    out, lse = op(q.unsqueeze(0), ke, ve, 0.0, False, attn_mask=bias, scale=scale)[:2]
    out, lse = out[0].float(), lse[0].float()
    # ATen returns lse = 0 and out = 0 for a row whose keys are all masked; make it -inf so
    # the merge gives it no weight.
    empty = ~visible.any(dim=1)
    if bool(empty.any()):
        lse[:, empty] = float("-inf")
    return out, lse


def _attend_math(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    visible: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    h, lq, d = q.shape
    tk, kvh, _ = k.shape
    group = h // kvh
    kf = k.permute(1, 2, 0).float()  # [kvh, D, Tk]
    vf = v.permute(1, 0, 2).float()  # [kvh, Tk, D]
    out = torch.empty(h, lq, d, dtype=torch.float32, device=q.device)
    lse = torch.empty(h, lq, dtype=torch.float32, device=q.device)
    rows = max(1, _MATH_SCORE_ELEMS // max(1, tk * group))
    qg = q.reshape(kvh, group, lq, d)
    for r0 in range(0, lq, rows):
        r1 = min(lq, r0 + rows)
        qs = qg[:, :, r0:r1].float().reshape(kvh, group * (r1 - r0), d)
        s = torch.bmm(qs, kf).mul_(scale).view(kvh, group, r1 - r0, tk)
        if visible is not None:
            s.masked_fill_(~visible[r0:r1], float("-inf"))
        m = s.amax(dim=-1, keepdim=True)
        m = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
        p = torch.exp(s - m)
        denom = p.sum(dim=-1, keepdim=True)
        o = torch.bmm(p.view(kvh, -1, tk), vf).view(kvh, group, r1 - r0, d)
        o = o / torch.where(denom == 0, torch.ones_like(denom), denom)
        out[:, r0:r1] = o.reshape(h, r1 - r0, d)
        lse[:, r0:r1] = (m + torch.log(denom)).reshape(h, r1 - r0)
    return out, lse


def _heads_first(x: torch.Tensor) -> torch.Tensor:
    """``[T, heads, D]`` → ``[1, heads, T, D]`` as a view."""
    return x.permute(1, 0, 2).unsqueeze(0)


def attend_keys(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    valid: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch of single-position queries: ``q`` is ``[B, kv_heads, group, D]`` (each KV
    head's query heads as rows), ``k``/``v`` are ``[B, Tk, kv_heads, D]``, ``valid`` is
    ``None`` or a bool ``[B, Tk]`` shared by every row of a sequence. Returns float32
    ``out [B, kv_heads, group, D]`` and ``lse [B, kv_heads, group]``."""
    bias = empty = None
    if valid is not None:
        bias = torch.zeros(valid.shape, dtype=q.dtype, device=q.device)
        bias = bias.masked_fill_(~valid, float("-inf"))[:, None, None, :]
        none_seen = ~valid.any(dim=1)
        empty = none_seen if bool(none_seen.any()) else None
    return attend_keys_biased(q, k, v, scale, bias, empty)


def attend_keys_biased(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    bias: torch.Tensor | None,
    empty: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``attend_keys`` with its mask already made: ``bias`` is ``None`` or the additive
    ``[B, 1, 1, Tk]`` mask in ``q``'s dtype (``-inf`` where a key is hidden), ``empty`` is
    ``None`` or the bool ``[B]`` of sequences that see no key at all."""
    kh, vh = k.permute(0, 2, 1, 3), v.permute(0, 2, 1, 3)  # [B, kv_heads, Tk, D] views
    if _use_flash(q) and _flash_cpu is not None:
        out, lse = _flash_cpu(q, kh, vh, 0.0, False, attn_mask=bias, scale=scale)[:2]
        out, lse = out.float(), lse.float()
    else:
        s = torch.matmul(q.float(), kh.float().transpose(-1, -2)).mul_(scale)
        if bias is not None:
            s = s + bias.float()
        m = s.amax(dim=-1, keepdim=True)
        m = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
        p = torch.exp(s - m)
        denom = p.sum(dim=-1, keepdim=True)
        out = torch.matmul(p, vh.float()) / torch.where(denom == 0, 1.0, denom)
        lse = (m + torch.log(denom)).squeeze(-1)
    if empty is not None:
        # A sequence with no valid key in this chunk gets no weight in the merge.
        lse[empty] = float("-inf")
        out[empty] = 0.0
    return out, lse


def merge(
    acc: tuple[torch.Tensor, torch.Tensor] | None, part: tuple[torch.Tensor, torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Combine two partial softmax results over disjoint key sets."""
    if acc is None:
        return part
    o1, l1 = acc
    o2, l2 = part
    lse = torch.logaddexp(l1, l2)
    finite = ~torch.isneginf(lse)
    w1 = torch.where(finite, torch.exp(l1 - lse), torch.zeros_like(lse))
    w2 = torch.where(finite, torch.exp(l2 - lse), torch.zeros_like(lse))
    return o1 * w1[..., None] + o2 * w2[..., None], lse
