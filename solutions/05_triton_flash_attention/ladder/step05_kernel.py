"""Step 05's one FlashAttention-2 forward kernel, shared by rungs v2-v6 (support file, no rung).

Every device helper is written once here: the online-softmax update, the mask, the K/V tile load,
the tile loop and the epilogue, each with ``tl.constexpr`` switches. A rung picks its switches,
its tiles and its launch (grid, fixed tiles, autotune configs or a measured table); Triton inlines
the helpers and compiles away the branches a rung does not take, so each rung's kernel holds only
what its switches select.

The switches (keyword arguments of ``attn_fwd``, alongside GROUP, D, CAUSAL, BLOCK_M, BLOCK_N):
- ``EXP2``: False: S is scaled by ``scale`` and exponentiated with exp (v2, v3); True: log2(e) is
  folded into ``qk_scale`` on the host and the update uses exp2, m in log2 units (v4-v6).
- ``CAUSAL_SPLIT``: False: one loop over every key tile, each masked (v2); True: the off-band
  tiles with no mask, then the on-band and ragged tiles masked, tiles above the diagonal skipped,
  causal query tiles launched longest first (v3-v6).
- ``DESC``: how tiles are read and O written. POINTERS: pointer arithmetic and masked loads
  (v2-v4); DEVICE_DESC: 2-D tensor descriptors built in the kernel per (batch, head) (v5, TMA);
  HOST_DESC: 4-D descriptors [B, H, S, D] built on the host and passed as Q, K, V, O (v6).
- ``F32_DOTS`` (default False): Q, K^T, P and V cast to fp32 before both dots, which Triton runs as TF32:
  one of the defects of step 13's slow kernel (solutions/13_profiling/ladder/v0_slow.py).

The host helpers (``prepare``, ``kernel_args``, ``launch_fixed``, ``autotuned``, ``launch_tuned``,
``tma_ready``, ``run_standalone``) are the parts of the wrappers every rung shares. Rung v1 (one tile only) keeps its
own kernel. ``causal_split_bounds`` is also step 08's (its dQ loop splits the key tiles the same way).
"""
import math
import os

import torch

from facourse.triton_setup import interpret_without_gpu

INTERPRET = interpret_without_gpu()  # before triton is imported

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453

# DESC: how the kernel reads tiles and writes O
POINTERS: tl.constexpr = tl.constexpr(0)
DEVICE_DESC: tl.constexpr = tl.constexpr(1)
HOST_DESC: tl.constexpr = tl.constexpr(2)


# ----------------------------------------------------------------------------- device helpers
@triton.jit
def program_heads(Hq, GROUP: tl.constexpr):
    """(bh, b, h, h_kv) of this program: grid axis 1 enumerates (batch, head); GQA: head h reads KV head
    h // group."""
    bh = tl.program_id(1)
    return bh, bh // Hq, bh % Hq, (bh % Hq) // GROUP


@triton.jit
def online_softmax_update(m_i, l_i, s, qk_scale, EXP2: tl.constexpr):
    """One step of the online softmax. s = Q_i K_j^T (unscaled, -inf where masked).

    Returns the new running max m, the new running sum l, the factor alpha that rescales the
    accumulator, and P_ij = exp(S_ij - m_new). EXP2: qk_scale = scale * log2(e), m in log2 units
    and exp2 (one MUFU.EX2 per element); else qk_scale = scale and exp.
    """
    if EXP2:
        m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
    else:
        s = s * qk_scale                                      # S_ij = scale * Q_i K_j^T
        m_new = tl.maximum(m_i, tl.max(s, 1))
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)     # a row that has seen no key yet
    if EXP2:
        alpha = tl.math.exp2(m_i - m_use)                     # alpha = exp(m_old - m_new)
        p = tl.math.exp2(s * qk_scale - m_use[:, None])       # P_ij = exp(S_ij - m_new)
    else:
        alpha = tl.exp(m_i - m_use)
        p = tl.exp(s - m_use[:, None])
    l_new = l_i * alpha + tl.sum(p, 1)                        # l = alpha * l + rowsum(P_ij)
    return m_new, l_new, alpha, p


@triton.jit
def apply_mask(s, cols, offs_m, Skv, off, CAUSAL: tl.constexpr):
    """-inf where key column j is past Skv or, causal, above the diagonal: j > i + (Skv - Sq)."""
    keep = cols[None, :] < Skv
    if CAUSAL:
        keep = keep & (cols[None, :] <= offs_m[:, None] + off)    # j <= i + (Skv - Sq)
    return tl.where(keep, s, float("-inf"))


@triton.jit
def load_kv(k_ref, v_ref, b, h_kv, start_n, offs_n, stride_kn, stride_vn, Skv,
            BLOCK_N: tl.constexpr, D: tl.constexpr, MASKED: tl.constexpr, DESC: tl.constexpr):
    """K_j^T [D, BLOCK_N] and V_j [BLOCK_N, D] of the key tile at start_n. k_ref, v_ref: base
    pointers of this (batch, KV head) (POINTERS), its 2-D descriptors (DEVICE_DESC) or the
    tensors' 4-D ones (HOST_DESC). Descriptor loads fill rows past Skv with zeros; pointer loads
    are masked on MASKED tiles."""
    if DESC == HOST_DESC:
        k = k_ref.load([b, h_kv, start_n, 0]).reshape(BLOCK_N, D)   # K_j; rows past Skv read 0
        v = v_ref.load([b, h_kv, start_n, 0]).reshape(BLOCK_N, D)   # V_j
        kT = k.T
    elif DESC == DEVICE_DESC:
        k = k_ref.load([start_n, 0])                                 # K_j [BLOCK_N, D]
        v = v_ref.load([start_n, 0])                                 # V_j [BLOCK_N, D]
        kT = k.T
    else:
        cols = start_n + offs_n
        offs_d = tl.arange(0, D)
        k_ptrs = k_ref + cols[None, :] * stride_kn + offs_d[:, None]     # K_j^T, [D, BLOCK_N]
        v_ptrs = v_ref + cols[:, None] * stride_vn + offs_d[None, :]     # V_j, [BLOCK_N, D]
        if MASKED:
            kT = tl.load(k_ptrs, mask=cols[None, :] < Skv, other=0.0)
            v = tl.load(v_ptrs, mask=cols[:, None] < Skv, other=0.0)
        else:
            kT = tl.load(k_ptrs)
            v = tl.load(v_ptrs)
    return kT, v


@triton.jit
def causal_split_bounds(start_m, off, Skv, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    """(end_free, hi) of the query tile at start_m: key tiles [0, end_free) need no mask, [end_free, hi)
    are the on-band and ragged ones, past hi nothing is visible. off = Skv - Sq (bottom-right)."""
    full_n = (Skv // BLOCK_N) * BLOCK_N                       # tiles with no ragged columns
    if CAUSAL:
        # keys every row of the tile sees: j <= start_m + off; the tile's last row sees up to hi
        end_free = tl.maximum(start_m + off + 1, 0) // BLOCK_N * BLOCK_N
        end_free = tl.minimum(end_free, full_n)
        hi = tl.minimum(tl.maximum(start_m + BLOCK_M + off, 0), Skv)
    else:
        end_free = full_n
        hi = Skv
    return end_free, hi


@triton.jit
def attn_tiles(acc, m_i, l_i, q, k_ref, v_ref, b, h_kv, stride_kn, stride_vn, offs_m, lo, hi, Skv,
               qk_scale, off, BLOCK_N: tl.constexpr, D: tl.constexpr, MASKED: tl.constexpr,
               CAUSAL: tl.constexpr, EXP2: tl.constexpr, DESC: tl.constexpr, F32_DOTS: tl.constexpr):
    """Visit key tiles [lo, hi) of one query tile. MASKED tiles check bounds and the diagonal."""
    offs_n = tl.arange(0, BLOCK_N)
    for start_n in tl.range(lo, hi, BLOCK_N):
        kT, v = load_kv(k_ref, v_ref, b, h_kv, start_n, offs_n, stride_kn, stride_vn, Skv,
                        BLOCK_N, D, MASKED, DESC)
        if F32_DOTS:
            s = tl.dot(q.to(tl.float32), kT.to(tl.float32))               # TF32 on the tensor cores
        else:
            s = tl.dot(q, kT)                                              # S_ij = Q_i K_j^T
        if MASKED:
            s = apply_mask(s, start_n + offs_n, offs_m, Skv, off, CAUSAL)
        m_i, l_i, alpha, p = online_softmax_update(m_i, l_i, s, qk_scale, EXP2)
        acc = acc * alpha[:, None]
        if F32_DOTS:
            acc = tl.dot(p, v.to(tl.float32), acc)
        else:
            acc = tl.dot(p.to(v.dtype), v, acc)                            # O_i += P_ij V_j
    return acc, m_i, l_i


# ----------------------------------------------------------------------------- kernel
@triton.jit
def attn_fwd(Q, K, V, O, LSE,
             sqb, sqh, sqs, skb, skh, sks, svb, svh, svs, sob, soh, sos,
             Hq, Sq, Skv, qk_scale,
             GROUP: tl.constexpr, D: tl.constexpr, CAUSAL: tl.constexpr,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
             EXP2: tl.constexpr, CAUSAL_SPLIT: tl.constexpr, DESC: tl.constexpr,
             F32_DOTS: tl.constexpr = False):
    """One query tile Q_i of one (batch, query head). Q, K, V, O: tensors (POINTERS, DEVICE_DESC;
    strides s?b batch, s?h head, s?s sequence) or 4-D descriptors (HOST_DESC; strides unused)."""
    # program ids: axis 0 = query tile (longest first when causal and split), axis 1 = (batch, head)
    num_m = tl.cdiv(Sq, BLOCK_M)
    pid_m = tl.program_id(0)
    if CAUSAL_SPLIT:
        if CAUSAL:
            pid_m = num_m - 1 - pid_m
    bh, b, h, h_kv = program_heads(Hq, GROUP)

    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    if DESC == HOST_DESC:
        q = Q.load([b, h, start_m, 0]).reshape(BLOCK_M, D)   # Q_i; rows past Sq read 0
        k_ref = K
        v_ref = V
    else:
        q_base = Q + b.to(tl.int64) * sqb + h.to(tl.int64) * sqh
        k_ref = K + b.to(tl.int64) * skb + h_kv.to(tl.int64) * skh
        v_ref = V + b.to(tl.int64) * svb + h_kv.to(tl.int64) * svh
        if DESC == DEVICE_DESC:
            # one 2-D descriptor per (batch, head): [S, D] with the row stride read from the tensor.
            # The TMA unit fetches whole tiles, fills rows past the end with zeros and clips stores.
            q_desc = tl.make_tensor_descriptor(q_base, [Sq, D], [sqs, 1], [BLOCK_M, D])
            k_ref = tl.make_tensor_descriptor(k_ref, [Skv, D], [sks, 1], [BLOCK_N, D])
            v_ref = tl.make_tensor_descriptor(v_ref, [Skv, D], [svs, 1], [BLOCK_N, D])
            q = q_desc.load([start_m, 0])
        else:
            offs_d = tl.arange(0, D)
            q = tl.load(q_base + offs_m[:, None] * sqs + offs_d[None, :], mask=offs_m[:, None] < Sq,
                        other=0.0)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)

    off = Skv - Sq                                            # bottom-right alignment
    if CAUSAL_SPLIT:
        end_free, hi = causal_split_bounds(start_m, off, Skv, BLOCK_M, BLOCK_N, CAUSAL)
        # stage 1: off-band tiles, no mask
        acc, m_i, l_i = attn_tiles(acc, m_i, l_i, q, k_ref, v_ref, b, h_kv, sks, svs, offs_m,
                                   0, end_free, Skv, qk_scale, off, BLOCK_N, D, False, CAUSAL,
                                   EXP2, DESC, F32_DOTS)
        # stage 2: on-band (diagonal) and ragged tiles, masked
        acc, m_i, l_i = attn_tiles(acc, m_i, l_i, q, k_ref, v_ref, b, h_kv, sks, svs, offs_m,
                                   end_free, hi, Skv, qk_scale, off, BLOCK_N, D, True, CAUSAL,
                                   EXP2, DESC, F32_DOTS)
    else:
        # every key tile, every one masked (causal: the tiles above the diagonal too)
        acc, m_i, l_i = attn_tiles(acc, m_i, l_i, q, k_ref, v_ref, b, h_kv, sks, svs, offs_m,
                                   0, Skv, Skv, qk_scale, off, BLOCK_N, D, True, CAUSAL,
                                   EXP2, DESC, F32_DOTS)

    # epilogue: O_i = acc / l_i; lse_i = m_i + ln l_i (natural log); empty rows give 0 and -inf
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    o = acc / l_safe[:, None]
    if EXP2:
        lse = tl.where(l_i == 0.0, float("-inf"), (m_i + tl.math.log2(l_safe)) * 0.6931471805599453)
    else:
        lse = tl.where(l_i == 0.0, float("-inf"), m_i + tl.log(l_safe))
    if DESC == HOST_DESC:
        O.store([b, h, start_m, 0], o.to(O.dtype).reshape(1, 1, BLOCK_M, D))  # rows past Sq clipped
    else:
        o_base = O + b.to(tl.int64) * sob + h.to(tl.int64) * soh
        if DESC == DEVICE_DESC:
            o_desc = tl.make_tensor_descriptor(o_base, [Sq, D], [sos, 1], [BLOCK_M, D])
            o_desc.store([start_m, 0], o.to(O.dtype.element_ty))          # rows past Sq clipped
        else:
            offs_d = tl.arange(0, D)
            tl.store(o_base + offs_m[:, None] * sos + offs_d[None, :], o.to(O.dtype.element_ty),
                     mask=offs_m[:, None] < Sq)
    tl.store(LSE + bh.to(tl.int64) * Sq + offs_m, lse, mask=offs_m < Sq)


# ----------------------------------------------------------------------------- host helpers
def interpreting() -> bool:
    """True when kernels run in Triton's interpreter (read at call time: tests may switch it)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def tma_ready(t):
    """TMA needs a 16-byte aligned base and 16-byte multiples for every stride but the last."""
    es = t.element_size()
    return t.data_ptr() % 16 == 0 and all((st * es) % 16 == 0 for st in t.stride()[:-1])


def prepare(q, k, v, scale, tma=False):
    """The wrapper's common start: the contract's checks, the default scale, inputs TMA can read
    (copied when ``tma`` and a stride or the base is not 16-byte aligned), o and lse allocated.
    Returns (q, k, v, o, lse, scale)."""
    B, Hq, Sq, D = q.shape
    Hkv = k.shape[1]
    assert k.shape == v.shape and Hq % Hkv == 0 and D in (16, 32, 64, 128, 256)
    assert q.stride(-1) == k.stride(-1) == v.stride(-1) == 1
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    if tma:
        q, k, v = (t if tma_ready(t) else t.clone(memory_format=torch.contiguous_format) for t in (q, k, v))
    o = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty((B, Hq, Sq), device=q.device, dtype=torch.float32)
    return q, k, v, o, lse, scale


def kernel_args(q, k, v, o, lse, scale, causal, switches, refs=None):
    """(positional args, keyword args) of ``attn_fwd`` for one call: ``refs`` replaces Q, K, V, O
    (the host-side descriptors of HOST_DESC); the strides are always the tensors'."""
    B, Hq, Sq, D = q.shape
    Hkv, Skv = k.shape[1], k.shape[2]
    qk_scale = scale * LOG2E if switches["EXP2"] else scale
    Q, K, V, O = refs if refs is not None else (q, k, v, o)
    args = (Q, K, V, O, lse, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *o.stride()[:3],
            Hq, Sq, Skv, qk_scale)
    return args, dict(GROUP=Hq // Hkv, D=D, CAUSAL=bool(causal), **switches)


def launch_fixed(q, k, v, causal, scale, switches, config, launch):
    """The wrapper of a rung with fixed tiles: ``attn_fwd`` with ``config`` (BLOCK_M, BLOCK_N) and, on a
    GPU, ``launch`` (num_warps, num_stages). Returns (o, lse)."""
    q, k, v, o, lse, scale = prepare(q, k, v, scale)
    B, Hq, Sq, _ = q.shape
    if Sq == 0:
        return o, lse
    args, meta = kernel_args(q, k, v, o, lse, scale, causal, switches)
    grid = (triton.cdiv(Sq, config["BLOCK_M"]), B * Hq)
    attn_fwd[grid](*args, **meta, **config, **({} if interpreting() else launch))
    return o, lse


def autotuned(tiles, prune=None):
    """``attn_fwd`` under ``triton.autotune``, trying each (BLOCK_M, BLOCK_N, num_warps, num_stages) of
    ``tiles`` once per shape and causal flag; ``prune(configs, named_args)`` may narrow them per call."""
    configs = [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s) for bm, bn, w, s in tiles]
    extra = {} if prune is None else {"prune_configs_by": {"early_config_prune": prune}}
    return triton.autotune(configs, key=["Sq", "Skv", "D", "CAUSAL"], **extra)(attn_fwd)


INTERPRET_CONFIG = {"BLOCK_M": 128, "BLOCK_N": 128}   # the interpreter cannot autotune


def tma_scratch(size, alignment, stream):
    """Triton's allocator for device-side descriptors: they live in a small global scratch buffer."""
    return torch.empty(size, device="cuda", dtype=torch.int8)


def launch_tuned(q, k, v, causal, scale, switches, tuned, tma=False):
    """The wrapper of an autotuned rung: ``tuned`` (``triton.autotune`` of ``attn_fwd``) on a GPU,
    INTERPRET_CONFIG in the interpreter. ``tma``: inputs TMA can read, and the descriptors' scratch
    allocator set. Returns (o, lse)."""
    q, k, v, o, lse, scale = prepare(q, k, v, scale, tma=tma)
    B, Hq, Sq, _ = q.shape
    if Sq == 0:
        return o, lse
    args, meta = kernel_args(q, k, v, o, lse, scale, causal, switches)
    if interpreting():
        grid = (triton.cdiv(Sq, INTERPRET_CONFIG["BLOCK_M"]), B * Hq)
        attn_fwd[grid](*args, **meta, **INTERPRET_CONFIG)
    else:
        if tma:
            triton.set_allocator(tma_scratch)
        tuned[lambda c: (triton.cdiv(Sq, c["BLOCK_M"]), B * Hq)](*args, **meta)
    return o, lse


def reference(q, k, v, causal=False, scale=None):
    """(o, lse) in float32 with bottom-right causal masking and GQA (facourse has the checked one)."""
    from facourse import reference_attention
    return reference_attention(q, k, v, causal, scale)


def run_standalone(fn, argv):
    """``python vN_....py``: the five configurations and every edge case, then `large` and `long`
    timed on a GPU (skipped with --no-bench)."""
    from facourse import bench_attention, check_all
    check_all(fn, expect_lse=True)
    if torch.cuda.is_available() and "--no-bench" not in argv:
        for name in ["large", "long"]:
            print(bench_attention(fn, name).summary())
