"""v1: the attention backward in plain PyTorch, tiled in FlashAttention-2's order; the slow,
obviously-correct rung every kernel below is read against.

v1 verdict: correctness only (fp32 accumulation, float64 agreement on the CPU); not timed: it is PyTorch loops over tiles.

The backward of O = softmax(scale * Q K^T + mask) V from the forward's O(N) state (q, k, v, o and
the row logsumexp lse), never from a stored Sq x Skv matrix (Dao, 2023, Algorithm 2):

    D_i   = rowsum(dO_i * O_i)                       (= rowsum(P_ij * dP_ij) summed over all j)
    P_ij  = exp(scale * Q_i K_j^T - lse_i)           rebuilt tile by tile from lse
    dV_j += P_ij^T dO_i
    dP_ij = dO_i V_j^T
    dS_ij = P_ij * (dP_ij - D_i)                     the softmax's Jacobian, row by row
    dK_j += scale * dS_ij^T Q_i
    dQ_i += scale * dS_ij K_j                        accumulated across key tiles

FA2's loop order: the outer loop runs over key tiles j (dK_j, dV_j stay in "registers" for the
whole inner loop), the inner loop over query tiles i; dQ_i is the one output touched by every
outer step (the GPU kernels either accumulate it atomically or compute it in a second pass, v2).
Grouped-query attention: every query head of a group adds into its KV head's dK, dV.
Rows that see no key (causal, Sq > Skv) have lse = -inf: they are given P = 0, hence zero
gradients, instead of exp(s + inf) = inf.

Run on its own:  python v1_pytorch_tiled.py
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from facourse.reference import default_scale  # noqa: E402
import common  # noqa: E402  (the forward, the autograd.Function factory)


def attention_backward(q, k, v, o, lse, do, causal=False, scale=None, block_m=64, block_n=64):
    """(dq, dk, dv) in the inputs' dtype. q, o, do [B,Hq,Sq,D]; k, v [B,Hkv,Skv,D]; lse [B,Hq,Sq]."""
    B, Hq, Sq, D = q.shape
    Hkv, Skv = k.shape[1], k.shape[2]
    G = Hq // Hkv
    scale = default_scale(D, scale)
    f32 = torch.float32
    # the query heads of one KV head side by side: [B, Hkv, G, S, D]
    qf = q.to(f32).reshape(B, Hkv, G, Sq, D)
    of = o.to(f32).reshape(B, Hkv, G, Sq, D)
    dof = do.to(f32).reshape(B, Hkv, G, Sq, D)
    kf, vf = k.to(f32)[:, :, None], v.to(f32)[:, :, None]             # [B, Hkv, 1, Skv, D]
    lse = lse.to(f32).reshape(B, Hkv, G, Sq)
    lse = torch.where(lse == float("-inf"), float("inf"), lse)         # empty rows: P = 0
    delta = (dof * of).sum(-1)                                         # D_i = rowsum(dO_i * O_i)

    dq = torch.zeros_like(qf)
    dk = torch.zeros(B, Hkv, Skv, D, dtype=f32, device=q.device)
    dv = torch.zeros_like(dk)
    rows_all = torch.arange(Sq, device=q.device)
    cols_all = torch.arange(Skv, device=q.device)
    for j0 in range(0, Skv, block_n):                                  # outer: key tiles
        j1 = min(j0 + block_n, Skv)
        kj, vj = kf[:, :, :, j0:j1], vf[:, :, :, j0:j1]
        dk_j = torch.zeros(B, Hkv, G, j1 - j0, D, dtype=f32, device=q.device)
        dv_j = torch.zeros_like(dk_j)
        # causal: query i sees key j iff j <= i + (Skv - Sq); the first query that sees key j0
        i_lo = max(j0 - (Skv - Sq), 0) if causal else 0
        for i0 in range(i_lo // block_m * block_m, Sq, block_m):       # inner: query tiles
            i1 = min(i0 + block_m, Sq)
            qi, doi = qf[:, :, :, i0:i1], dof[:, :, :, i0:i1]
            s = scale * qi @ kj.transpose(-1, -2)                      # S_ij
            p = torch.exp(s - lse[:, :, :, i0:i1, None])               # P_ij, rebuilt from lse
            if causal:
                visible = cols_all[None, j0:j1] <= rows_all[i0:i1, None] + (Skv - Sq)
                p = p * visible
            dv_j += p.transpose(-1, -2) @ doi                          # dV_j += P^T dO
            dp = doi @ vj.transpose(-1, -2)                            # dP = dO V^T
            ds = p * (dp - delta[:, :, :, i0:i1, None])                # dS = P * (dP - D)
            dk_j += scale * ds.transpose(-1, -2) @ qi                  # dK_j += scale dS^T Q
            dq[:, :, :, i0:i1] += scale * ds @ kj                      # dQ_i += scale dS K
        dk[:, :, j0:j1] = dk_j.sum(2)                                  # GQA: sum over the group
        dv[:, :, j0:j1] = dv_j.sum(2)
    return dq.reshape(B, Hq, Sq, D).to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


flash_attention_train = common.make_train_fn(attention_backward, "FlashAttentionTrainV1")


# ----------------------------------------------------------------------------- test
if __name__ == "__main__":
    from facourse.backward import check_gradients
    for name in ("ragged", "empty_rows", "mqa", "decode", "ragged_noncausal"):
        check_gradients(flash_attention_train, name)
