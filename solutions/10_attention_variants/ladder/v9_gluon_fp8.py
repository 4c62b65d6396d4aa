"""v9: v7's FP8 attention with FlashAttention-3's intra-warpgroup overlap, written in Gluon.

Lecture 10, section 7 (after v8). In v7 Triton waits for each Q K^T right after issuing it: it makes a dot
asynchronous only when the dot's result is an accumulator that the next iteration's dot takes back (P V's acc), and
S goes to the softmax instead. Issuing tile j + 1's Q K^T by hand before tile j's softmax (v7's AHEAD_S) compiles to
the same wait right after the issue. So in v7 a warpgroup's tensor cores idle while its softmax runs, and only the
other program on the SM fills them.

Gluon (Triton's lower-level language, ``triton.experimental.gluon``) leaves layouts, shared memory, barriers and
waits to the kernel: each ``warpgroup_mma`` is issued asynchronously and ``warpgroup_mma_wait(n)`` waits until at
most n groups are in flight. The key loop is FlashAttention-3's (Shah et al., 2024, section 3.2, "intra-warpgroup
overlapping"). For tile t = j + 1:

    issue S = Q K_t^T;  rescale acc by the last step's alpha * dv_{j-1} / dv_j;  issue acc += P_j V_j;
    wait until one group is left (S done);  softmax of S (P_t, row max and sum) while P_j V_j runs;
    wait for P_j V_j;  refill its slot

with the TMA loads of K and V^T issued by the same warpgroup STAGES tiles ahead (an mbarrier per slot) and each key
tile's descale record loaded a step ahead. The numerics are v7's: its quantised inputs (Q and K rotated, per-block
descales, V^T in operand order, one 16-byte record a key tile), P times 2^P_LOG2 in e4m3, acc in units of the last
tile's dv; P reaches the P V operand as a renaming of registers (v7's operand order; convert_layout asserts it).
Tiles: 64 query rows (one warpgroup, 4 warps), 128 keys, 3 stages, two programs an SM; D 64 or 128.

Measured on an H200 (benchmarks/results/2026-12-04_h200_step10_v9_gluon.txt): every check of the FP8 kind passed and
the output matches v7's to fp16 rounding, but it is no faster: 0.98x v7 on inputs in e4m3 (888-904 TFLOP/s on long
and at 16k non-causal, against 904-922), level on `large`. v7's two programs an SM already put one program's softmax
under the other's GEMMs; inside a warpgroup the overlap adds little and carries P across the step (242 registers
against 170).
The rescale under Q K^T (EARLY_RESCALE: 3% on `large`, within noise elsewhere) and the descales a step ahead
(AHEAD_RECORDS: 5-11%) are on; 128 query rows as two warpgroups in one program (BLOCK_M = 128, one program an SM)
lose 17-22%: they run in step, both in their softmax at once.

Needs a Hopper GPU (Gluon has no interpreter); on a CPU, compile_sass builds it for sm_90a (the tests read its SASS).
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.append(HERE)
import v7_fp8_fa3 as v7  # noqa: E402  (sets up the interpreter without a GPU; its quantisers)

import torch  # noqa: E402
import triton  # noqa: E402

from triton.experimental import gluon  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor  # noqa: E402
from triton.experimental.gluon.language.nvidia.hopper import (  # noqa: E402
    mbarrier, tma, warpgroup_mma, warpgroup_mma_wait)

from facourse.triton_setup import validate_triton_inputs  # noqa: E402

BLOCK_M, BLOCK_N = 64, 128                      # a warpgroup per 64 query rows
STAGES = 3                                      # K / V^T slots: Q 8 KiB + 3 x 32 KiB, two programs an SM
EARLY_RESCALE = True                            # acc rescaled while the next Q K^T runs (FA3's order)
AHEAD_RECORDS = True                            # the next key tile's descales loaded a tile ahead
P_LOG2 = v7.P_LOG2
causal_split_bounds = v7.causal_split_bounds
quantize_fp8 = v7.quantize_fp8                 # the kind's quantiser and V^T layout: v7's
transpose_v = v7.transpose_v


@gluon.constexpr_function
def mma_layout(m, n):
    """The WGMMA accumulator layout of m rows (a warpgroup per 64), N = n, e4m3 operands (k 32)."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[m // 16, 1], instr_shape=[16, n, 32])


@gluon.jit
def load_tile(k_desc, v_desc, k_smem, v_smem, bars, t, k_row0, v_row0, STAGES: gl.constexpr,
              BLOCK_N: gl.constexpr):
    """Key tile t's K [BLOCK_N, D] and V^T [D, BLOCK_N] into slot t % STAGES, one barrier for both."""
    slot = t % STAGES
    bar = bars.index(slot)
    mbarrier.expect(bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(k_desc, [k_row0 + t * BLOCK_N, 0], bar, k_smem.index(slot))
    tma.async_copy_global_to_shared(v_desc, [v_row0, t * BLOCK_N], bar, v_smem.index(slot))


@gluon.jit
def softmax_tile(s, m_i, l_i, qk_scale, start_n, rows, Skv, off, masked, CAUSAL: gl.constexpr,
                 BLOCK_N: gl.constexpr, P_LAYOUT: gl.constexpr):
    """Tile start_n's S (fp32, the accumulator's layout) -> (P times 2^P_LOG2, fp32 in the P V operand's layout and
    v7's operand order, new row max, alpha, new row sum). masked: the tile holds keys past Skv or, causal, past a
    row's diagonal."""
    if masked:
        cols = start_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s.type.layout))
        keep = cols[None, :] < Skv
        if CAUSAL:
            keep = keep & (cols[None, :] <= rows[:, None] + off)
        s = gl.where(keep, s, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(s, axis=1) * qk_scale)
    m_use = gl.where(m_new == float("-inf"), 0.0, m_new)          # a row that has seen no key yet
    p = gl.exp2(s * qk_scale[:, None] - (m_use - P_LOG2)[:, None])
    alpha = gl.exp2(m_i - m_use)
    l_i = l_i * alpha + gl.sum(p, axis=1)
    R: gl.constexpr = p.shape[0]                                    # v7's operand_ordered: the lanes keep P
    p = p.reshape([R, BLOCK_N // 32, 2, 2, 4, 2]).permute([0, 1, 2, 4, 3, 5]).reshape([R, BLOCK_N])
    return gl.convert_layout(p, P_LAYOUT, assert_trivial=True), m_new, alpha, l_i


@gluon.jit
def fp8_fa3_fwd(q_desc, k_desc, v_desc, O, LSE, DQ, DKV, Hq, Hkv, Sq, Skv, NQ, NK, scale,
                CAUSAL: gl.constexpr, GROUP: gl.constexpr, Q_ROWS: gl.constexpr,
                D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                EARLY: gl.constexpr, AHEAD_REC: gl.constexpr):
    """One query tile of one (batch, head): q_desc over Q8 [B Hq Sq, D], k_desc over K8 [B Hkv Skv, D], v_desc over
    V^T [B Hkv D, keys]; DQ [B, Hq, NQ] (one per Q_ROWS query rows), DKV [B, Hkv, NK, 4] the (dk, dv, 1 / dv, -)
    records; O [B, Hq, Sq, D], LSE [B, Hq, Sq]."""
    S_L: gl.constexpr = mma_layout(BLOCK_M, BLOCK_N)
    O_L: gl.constexpr = mma_layout(BLOCK_M, D)
    P_L: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=O_L, k_width=4)
    ROW: gl.constexpr = gl.SliceLayout(1, S_L)

    pid_m = gl.program_id(0)
    if CAUSAL:                                                      # the longest tiles first
        pid_m = gl.cdiv(Sq, BLOCK_M) - 1 - pid_m
    bh = gl.program_id(1)
    b = bh // Hq
    h_kv = (bh % Hq) // GROUP
    kv_bh = b * Hkv + h_kv
    start_m = pid_m * BLOCK_M
    rows = start_m + gl.arange(0, BLOCK_M, layout=ROW)
    q_scale = scale * gl.load(DQ + bh * NQ + gl.minimum(rows, Sq - 1) // Q_ROWS) * 1.4426950408889634   # per row
    rec = DKV + kv_bh * NK * 4
    off = Skv - Sq
    end_free, hi = causal_split_bounds(start_m, off, Skv, BLOCK_M, BLOCK_N, CAUSAL)   # step 05's, as v5 and v7
    n_tiles = gl.maximum(gl.cdiv(hi, BLOCK_N), 1)                  # tile 0 even when no key is visible
    first_masked = end_free // BLOCK_N

    q_smem = gl.allocate_shared_memory(gl.float8e4nv, [BLOCK_M, D], q_desc.layout)
    k_smem = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, BLOCK_N, D], k_desc.layout)
    v_smem = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, D, BLOCK_N], v_desc.layout)
    bars = gl.allocate_shared_memory(gl.int64, [STAGES + 1, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES + 1):
        mbarrier.init(bars.index(i), count=1)
    q_bar = bars.index(STAGES)
    mbarrier.expect(q_bar, q_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [bh * Sq + start_m, 0], q_bar, q_smem)
    k_row0 = kv_bh * Skv
    v_row0 = kv_bh * D
    for first in gl.static_range(STAGES):
        if first < n_tiles:
            load_tile(k_desc, v_desc, k_smem, v_smem, bars, first, k_row0, v_row0, STAGES, BLOCK_N)

    mbarrier.wait(q_bar, 0)
    mbarrier.wait(bars.index(0), 0)
    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, ROW)
    l_i = gl.zeros([BLOCK_M], gl.float32, ROW)
    acc = gl.zeros([BLOCK_M, D], gl.float32, O_L)
    s = warpgroup_mma(q_smem, k_smem.index(0).permute((1, 0)), gl.zeros([BLOCK_M, BLOCK_N], gl.float32, S_L),
                      use_acc=False, is_async=True)
    s = warpgroup_mma_wait(num_outstanding=0, deps=[s])
    p, m_i, alpha, l_i = softmax_tile(s, m_i, l_i, q_scale * gl.load(rec), 0, rows, Skv, off, first_masked == 0,
                                      CAUSAL, BLOCK_N, P_L)
    dv_prev = gl.load(rec + 1)
    f = gl.full([BLOCK_M], 1.0, gl.float32, gl.SliceLayout(1, O_L))   # acc's factor before the next P V
    nxt = gl.minimum(1, n_tiles - 1) * 4                            # tile 1's record, a tile ahead
    dk, dv, inv_dv = gl.load(rec + nxt), gl.load(rec + nxt + 1), gl.load(rec + nxt + 2)

    for j in range(0, n_tiles - 1):
        t = j + 1
        if not AHEAD_REC:
            dk, dv, inv_dv = gl.load(rec + t * 4), gl.load(rec + t * 4 + 1), gl.load(rec + t * 4 + 2)
        mbarrier.wait(bars.index(t % STAGES), (t // STAGES) & 1)
        s = warpgroup_mma(q_smem, k_smem.index(t % STAGES).permute((1, 0)),
                          gl.zeros([BLOCK_M, BLOCK_N], gl.float32, S_L), use_acc=False, is_async=True)
        if EARLY:                                                   # under Q K^T, as FA3 rescales
            acc = acc * f[:, None]
        acc = warpgroup_mma(p.to(gl.float8e4nv), v_smem.index(j % STAGES).permute((1, 0)), acc, is_async=True)
        if AHEAD_REC:                                               # tile t + 1's record, used next time
            n2 = gl.minimum(t + 1, n_tiles - 1) * 4
            dk2, dv2, inv_dv2 = gl.load(rec + n2), gl.load(rec + n2 + 1), gl.load(rec + n2 + 2)
        s = warpgroup_mma_wait(num_outstanding=1, deps=[s])         # S of tile t done; P_j V_j may run on
        p, m_i, alpha, l_i = softmax_tile(s, m_i, l_i, q_scale * dk, t * BLOCK_N, rows, Skv, off,
                                          t >= first_masked, CAUSAL, BLOCK_N, P_L)
        f = gl.convert_layout(alpha * (dv_prev * inv_dv), gl.SliceLayout(1, O_L))
        dv_prev = dv
        acc = warpgroup_mma_wait(num_outstanding=0, deps=[acc])
        if j + STAGES < n_tiles:                                    # slot j % STAGES is free: tile j + STAGES
            load_tile(k_desc, v_desc, k_smem, v_smem, bars, j + STAGES, k_row0, v_row0, STAGES, BLOCK_N)
        if not EARLY:
            acc = acc * f[:, None]
            f = gl.full([BLOCK_M], 1.0, gl.float32, gl.SliceLayout(1, O_L))
        if AHEAD_REC:
            dk, dv, inv_dv = dk2, dv2, inv_dv2

    acc = acc * f[:, None]
    last = n_tiles - 1
    acc = warpgroup_mma(p.to(gl.float8e4nv), v_smem.index(last % STAGES).permute((1, 0)), acc, is_async=True)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=[acc])
    for i in gl.static_range(STAGES + 1):
        mbarrier.invalidate(bars.index(i))

    l_safe = gl.where(l_i == 0.0, 1.0, l_i)
    lse = gl.where(l_i == 0.0, float("-inf"), (m_i - P_LOG2 + gl.log2(l_safe)) * 0.6931471805599453)
    o = acc * gl.convert_layout(dv_prev / l_safe, gl.SliceLayout(1, O_L))[:, None]
    OUT_L: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [BLOCK_M // 16, 1], [1, 0])
    o = gl.convert_layout(o.to(O.dtype.element_ty), OUT_L)
    o_rows = start_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, OUT_L))
    o_cols = gl.arange(0, D, layout=gl.SliceLayout(0, OUT_L))
    gl.store(O + (bh.to(gl.int64) * Sq + o_rows[:, None]) * D + o_cols[None, :], o, mask=o_rows[:, None] < Sq)
    gl.store(LSE + bh.to(gl.int64) * Sq + rows, lse, mask=rows < Sq)


def layouts(D):
    """The shared-memory layouts of a Q, a K and a V^T tile (TMA's and WGMMA's: 128-byte swizzle)."""
    return tuple(gl.NVMMASharedLayout.get_default_for(shape, gl.float8e4nv)
                 for shape in ([BLOCK_M, D], [BLOCK_N, D], [D, BLOCK_N]))


def run_kernel(q8, k8, v8t, descale_q, descale_k, descale_v, causal, scale, out_dtype):
    """v7.run_kernel's contract (v7's quantisers' outputs; descale_q one per query tile or per key tile)."""
    B, Hq, Sq, D = q8.shape
    Hkv, Skv = k8.shape[1], k8.shape[2]
    assert v8t.shape[-1] == v7.vt_keys(Skv, True), "V^T in v7's operand order (quantize_v_transposed, transpose_v)"
    scale, o, lse = v7.v5.outputs(q8, k8, v8t[..., :Skv], scale, out_dtype)
    if Sq == 0 or Skv == 0:
        return o, lse
    assert BLOCK_N == v7.TILES[1], "v7's quantisation blocks"
    nq, nk = descale_q.shape[-1], triton.cdiv(Skv, BLOCK_N)
    q_rows = next((n for n in (v7.TILES[0], BLOCK_N) if triton.cdiv(Sq, n) == nq), None)
    assert q_rows and descale_k.shape == descale_v.shape == (B, Hkv, nk)
    q8, k8 = q8.contiguous(), k8.contiguous()
    if v8t.stride(2) % 16 or v8t.stride(1) != D * v8t.stride(2) or v8t.stride(0) != Hkv * v8t.stride(1):
        v8t = v7.v5.padded_for_tma(v8t.contiguous())
    lq, lk, lv = layouts(D)
    q_desc = TensorDescriptor(q8, [B * Hq * Sq, D], [D, 1], [BLOCK_M, D], lq)
    k_desc = TensorDescriptor(k8, [B * Hkv * Skv, D], [D, 1], [BLOCK_N, D], lk)
    v_desc = TensorDescriptor(v8t, [B * Hkv * D, v8t.shape[-1]], [v8t.stride(2), 1], [D, BLOCK_N], lv)
    records = v7.records_of(descale_k, descale_v)                  # a [B, Hkv, NK] view of the 4-float records
    fp8_fa3_fwd[(triton.cdiv(Sq, BLOCK_M), B * Hq)](
        q_desc, k_desc, v_desc, o, lse, descale_q.float().contiguous(), records, Hq, Hkv, Sq, Skv, nq, nk, scale,
        bool(causal), Hq // Hkv, q_rows, D, BLOCK_M, BLOCK_N, STAGES, EARLY_RESCALE, AHEAD_RECORDS,
        num_warps=BLOCK_M // 16)
    return o, lse


def flash_attention_fp8_prequantized(q8, k8, v8t, descale_q, descale_k, descale_v, causal=True, scale=None,
                                     out_dtype=torch.float16):
    """The kernel on inputs already quantised (v7's quantize_fp8 or quantize_qkv): see run_kernel."""
    v7.v5.require_fp8_gpu(q8, "v9_gluon_fp8", hopper=True)
    return run_kernel(q8, k8, v8t, descale_q, descale_k, descale_v, causal, scale, out_dtype)


def flash_attention_fp8(q, k, v, causal=True, scale=None):
    """v7's contract: q [B, Hq, Sq, D], k and v [B, Hkv, Skv, D] in fp16 or bf16, quantised by v7's fused kernels,
    then this kernel. Returns (o in q's dtype, lse fp32)."""
    v7.v5.require_fp8_gpu(q, "v9_gluon_fp8", hopper=True)
    validate_triton_inputs(q, k, v, scale)
    q8, dq, k8, dk, v8t, dv = v7.quantize_qkv(q, k, v)
    return run_kernel(q8, k8, v8t, dq, dk, dv, causal, scale, q.dtype)


def compile_sass(D=128, causal=False, out="fp16", group=4):
    """On a CPU: the kernel compiled for sm_90a (no GPU), GQA with `group` query heads a KV head; returns Triton's
    CompiledKernel (asm: ttgir, ptx, cubin)."""
    from facourse.triton_setup import compile_for
    desc = lambda r, c, layout: f"tensordesc<fp8e4nv[{r}, {c}],{layout!r}>"  # noqa: E731
    lq, lk, lv = layouts(D)
    types = {"q_desc": desc(BLOCK_M, D, lq), "k_desc": desc(BLOCK_N, D, lk), "v_desc": desc(D, BLOCK_N, lv),
             "O": f"*{out}", "LSE": "*fp32", "DQ": "*fp32", "DKV": "*fp32", "scale": "fp32"}
    const = {"CAUSAL": causal, "GROUP": group, "Q_ROWS": 128, "D": D, "BLOCK_M": BLOCK_M, "BLOCK_N": BLOCK_N,
             "STAGES": STAGES, "EARLY": EARLY_RESCALE, "AHEAD_REC": AHEAD_RECORDS}
    return compile_for(fp8_fa3_fwd, types, const, 90, num_warps=BLOCK_M // 16)
