"""v7: FP8 (e4m3) attention as FlashAttention-3 quantises it: per-block scales, incoherent processing,
one fused quantisation kernel per tensor.

Lecture 10, section 7 (after v5). v5 keeps one scale per (batch, head): one outlier of magnitude 30
in a head of N(0, 1) entries sets the step of every other entry of that head, and most of them fall
into e4m3's coarse low binades. FlashAttention-3 (Shah et al., 2024, section 3.3) adds two things:

* **Block quantisation**: one scale per tile of rows, the tiles the attention kernel reads (BLOCK_M
  rows of Q, BLOCK_N rows of K and of V). An outlier then costs precision only in its own tile. The
  kernel multiplies S of tile (i, j) by scale * dq[i] * dk[j] (log2 units, one factor per tile as in
  v5) and each product P V_j by dv[j] before it joins the fp32 accumulator.
* **Incoherent processing**: Q and K are multiplied by the same orthogonal M = diag(signs) H_D /
  sqrt(D) (H_D the D x D Sylvester-Hadamard matrix of +-1, signs drawn from SIGN_SEED), so Q K^T =
  (Q M)(K M)^T is unchanged while each outlier is spread over all D coordinates of its row (its
  magnitude drops by about sqrt(D)): the block's amax, hence its step, shrinks.

The quantiser. ``quant_rows`` is one kernel for Q or K: per tile of rows it loads the fp16/bf16 tile,
multiplies it by diag(signs) H_D (entries +-1, exact in the input dtype) with one tl.dot (fp32
accumulation) and by 1/sqrt(D), takes the tile's amax, stores e4m3 and the tile's descale = amax /
448. ``quant_v`` quantises a tile of BLOCK_N keys of V and stores it transposed into [B, H, D, S] (the
layout v5's kernel reads, its rows padded to 16 bytes for TMA), with one descale per BLOCK_N keys. V is
not rotated (O = P V would come out rotated). The GPU path costs one read of q, k, v and one write of
their e4m3 copies, against v5's separate PyTorch passes (amax, divide, cast, transpose). All three in
one launch (ONE_LAUNCH) and several row tiles a program (QUANT_TILES) were measured and left off.

The accumulator and dv. acc is kept in units of the last tile's dv: before tile j it is rescaled by
alpha * dv[j-1] / dv[j] (alpha the online softmax's factor, already a per-row multiply), so P_j V8_j
still accumulates in place in the tensor cores' fp32 accumulator, and O takes the last dv once at the
end. This equals sum_j dv[j] P_j V8_j / l. P goes to e4m3 times 256 (P_LOG2: the exp2 subtracts m - 8,
no extra multiply); l sums the same scaled P, so O = acc / l is unchanged and lse takes the 8 back.

V^T in operand order. In e4m3 the S accumulator gives lane t of a quad columns 2t, 2t + 1 of every 8,
and the P V dot's A operand wants k = 4t..4t + 3 of every 16: Triton moves P between the quad's lanes
(SHFL, SEL and PRMT in the loop's chain). P V sums over keys in any order if V's rows follow, so
quant_v stores each group of 32 keys of V^T in the order the lanes already hold P (operand_ordered, the
same permutation on P in the kernel costs nothing), and the shuffles go. The descales come the same
way: one 16-byte record a key tile, (dk, dv, 1 / dv), one vector copy through Triton's pipeliner.
Together: 503 instructions a warp for a 128-key tile against 565, and 9-18% faster on an H200
(benchmarks/results/2026-12-04_h200_step10_fp8_operand_order.txt). V^T in key order remains for v8's
CUDA kernel (``operand_order=False``).

In Triton's interpreter (no GPU), the cast fp32 -> e4m3 is NumPy bit surgery that rounds ties away
from zero and loses the carry when rounding up crosses into an odd binade (1.96 * 2 becomes 2, not
4); with EXACT_ROUND the kernels first round to e4m3's grid in fp32 (round to nearest even, as the
GPU's cvt.rn does) so the cast is exact, and the dots run on fp32 copies of their operands (exact for
e4m3 and +-1 values; NumPy multiplies fp16 without BLAS). On a GPU EXACT_ROUND is off.

The kind's runner (facourse.fp8.bench_fp8) calls quantize_fp8 on q, k and v alike and transpose_v on
v8, outside the timing: quantize_fp8 gives one scale per BLOCK_N rows (a whole number of query tiles,
so run_kernel reads one q scale per Q_PER query tiles) and rotates nothing unless asked; the timing is
the same kernel (the descale records built from dk and dv inside it). flash_attention_fp8 runs
quantize_qkv (rotation, BLOCK_M-row blocks of Q, V transposed in operand order, the records).

The error, measured on a CPU with this kernel in the interpreter (``error_study``; the record is
benchmarks/results/2026-11-27_cpu_step10_fp8_error.txt, made by running this file): on FA3's
outlier inputs the rotation is what cuts the RMSE of O, per-block scales alone barely move it, as in
FA3's Table 3 ablation; on N(0, 1) all four quantisations give the same RMSE.

The tiles are v5's (TILES; ``tile_sweep`` tried the others on an H100, see TILE_SWEEP); causal calls of at most
2048 keys take them with 2 stages and a register cap, three programs an SM instead of two (SHORT_TILES). On a GPU
(benchmarks/results/2026-11-27_{h100,h200}_step10*.json) the end-to-end call runs 1.31-1.33x the fp16
solution on `long`: the quantisers read each input once, where v5's PyTorch passes made its end-to-end
call slower than fp16. Needs a GPU with FP8 tensor cores; on a CPU the entry points raise; ``run_end_to_end`` and ``run_kernel`` launch without
that check (the tests run them in the interpreter).
"""
import functools
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.append(HERE)
import v5_fp8 as v5  # noqa: E402  (sets up the interpreter without a GPU, before triton; its helpers)

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from facourse.triton_setup import validate_triton_inputs  # noqa: E402
from facourse.fp8 import fa3_outlier_inputs  # noqa: E402,F401  (the error study's inputs)

vc = v5.vc
causal_split_bounds = v5.causal_split_bounds
E4M3_MAX = v5.E4M3_MAX
INTERPRET = v5.INTERPRET
EXACT_ROUND = INTERPRET
TILES = v5.TILES
INTERPRET_TILES = v5.INTERPRET_TILES
FORCE_TILES = None                           # (BLOCK_M, BLOCK_N, num_warps, num_stages) for a sweep
MAXNREG = 0                                  # with FORCE_TILES: ptxas's register cap (0: Triton's own)
# Causal attention over at most SHORT_KEYS keys: TILES with 2 stages and at most SHORT_MAXNREG registers (none spilled),
# three programs an SM where TILES fits two (181 registers causal, 105 KiB of shared memory); a row there is a few key
# tiles long, and a third program likely hides more of each one's prologue and epilogue. On an H200 (the course's
# bench): `large` about 5% faster, causal_1k 8%, causal_2k 1-2%; causal_4k 2% slower, causal_8k 5%, non-causal 0-5%
# (2026-12-04_h200_step10_fp8_three_programs.txt). The same BLOCK_N: the same descales.
SHORT_KEYS = 2048
SHORT_TILES = (64, 128, 4, 2)
SHORT_MAXNREG = 168
# P's exp2 on the FMA pipes (exp2_fma) instead of the MUFU unit, for the last 1/EXP2_FMA of each tile's columns
# (exp2_part; 0: none). All of them (1) passes every check and halves the speed (462 against 841 TFLOP/s at 16k
# non-causal on an H100, benchmarks/results/2026-11-27_h100_step10_fp8_exp2_fma.txt). An eighth (8), FlashAttention-4's
# way of sharing the exp2 out, still loses 20-27% on `long` and at 16k on an H200, a quarter (4) 23-30%
# (2026-12-03_h200_step10_fp8_exp2_part.txt): MUFU is less than half busy, the loop's time follows its instruction
# count, and each exp2 moved costs some ten instructions more (2026-12-03_cpu_step10_fp8_loop_sass.txt). Off. (P's row
# sums on the tensor cores, ROWSUM_MMA at commit 7df4a72, were measured in the same run: slower, less accurate. Removed.)
EXP2_FMA = 0
# LAZY_RESCALE (FlashAttention-4's conditional rescaling, in e4m3's range): acc is kept in units of the head's
# largest V descale (dv_max), each P V_j's dv[j] / dv_max folded into P's exp2 as a per-row offset, so no
# per-tile factor touches acc; a row's max moves only when it grows by more than LAZY_TAU (P then reaches
# 2^(P_LOG2 + LAZY_TAU) <= 448), and acc is rescaled only in a tile where some row's max moved. Off: its RMSE on
# FA3's outlier inputs is 1.10-1.13x v7's (2026-11-28_cpu_step10_fp8_lazy.txt) and it runs at 0.71-0.72x v7's
# speed on an H200 (606-626 against 851-870 TFLOP/s, 2026-11-28_h200_step10_fp8_lazy.txt).
LAZY_RESCALE = False
LAZY_TAU = tl.constexpr(0.75)
# ONE_LAUNCH: Q, K and V quantised by one launch of quant_qkv instead of three. On an H200 on `long` the host spends
# 293 us a call against 352, but the GPU 1.42 ms against 1.39: the course's bench reads 1.21x the fp16 solution against
# 1.23x, CUDA events without the spin 1.01-1.12x against 0.99-1.10x (2026-12-03_h200_step10_fp8_one_launch.txt). Off.
ONE_LAUNCH = False
# The one-tensor quantisers: QUANT_TILES consecutive row tiles a program (the rotation read once for all of them),
# QUANT_WARPS warps. On an H200 on `long` the three take 137 us a call at 1 and 4, 130 us at 4 and 4, no less with 8
# warps, and end to end the difference is within noise (2026-12-03_h200_step10_fp8_quantisers.txt).
QUANT_TILES = 1
QUANT_WARPS = 4
# PAIRED_DESCALES: each key tile's descales as one record (dk, dv, 1 / dv) that the K and V quantisers write, one
# 16-byte load a tile and the ratio dv_prev / dv[j] a multiply. OPERAND_ORDER: V^T's keys as operand_ordered puts them.
# Both on: 9-18% faster on an H200 (2026-12-04_h200_step10_fp8_operand_order.txt, with each alone and their SASS).
PAIRED_DESCALES = True
OPERAND_ORDER = True
# AHEAD_S: the unmasked key tiles write tile j + 1's Q K^T before tile j's softmax (block_tiles' AHEAD), FA3's
# intra-warpgroup overlap written in Triton. Triton makes a dot asynchronous only when its result is an accumulator
# the next iteration's dot takes back (P V's acc): the SASS waits for this S right after issuing it, the same loop
# as without the switch (tests/test_step10_v9_gluon_fp8.py). Off; v9_gluon_fp8 writes the waits itself.
AHEAD_S = False
# V_RESIDUAL: V's rounding error as a second e4m3 tensor in the same scale, r = e4m3(v / dv - e4m3(v / dv)), stored
# under V^T (V^T becomes [B, H, 2 D, keys]); the kernel adds P r_j to acc with one more dot per key tile, on the same
# P, at half as much more tensor-core work and a third ring of tiles in shared memory (two stages instead of three, to
# keep two programs an SM). On an H200 the RMSE on FA3's outlier inputs falls from 8.46-8.49e-3 to 6.90-6.93e-3 at 2048
# keys and from 9.45-9.51e-3 to 7.27-7.36e-3 at 8192, under FA3's 9.1e-3, but the speed falls 25-30%: 666-669 TFLOP/s
# at 16k non-causal against 890-932, 592 end to end on long against 833 (2026-12-04_h200_step10_fp8_v_residual.txt;
# emulated on a CPU over more seeds, with Q's error added back too: 2026-12-04_cpu_step10_fp8_residual.txt). Off.
V_RESIDUAL = False
# INT8_QK: Q and K (rotated) quantised to int8 with one scale per block (amax / 127) instead of e4m3, S = Q K^T on
# the tensor cores' s8 path with exact int32 sums, SageAttention's choice for Q K^T (Zhang et al., 2024); P and V
# stay e4m3. In e4m3 a value keeps 3 mantissa bits; in int8 a block's values share 7 bits of its largest, and after
# the rotation no value is far below the largest. The int32 S to fp32: 1 by a conversion (I2F), 2 as the bits of
# 1.5 * 2^23 + S (|S| <= 128 * 127^2 < 2^22; one integer add), the offset taken off the row max and the exp2's bias.
# On a CPU (emulated over eight heads, and the kernel in the interpreter) the RMSE on FA3's outlier inputs falls from
# 9.19e-3 to 6.38e-3 at 8192 keys (2026-12-05_cpu_step10_int8_qk_error.txt); the key loop issues 569-571 instructions a
# tile against 505, one conversion an element (2026-12-05_cpu_step10_int8_qk_sass.txt). Off until timed on a GPU.
INT8_QK = 0
MAGIC = tl.constexpr(12582912.0)
# P is cast to e4m3 times 2^P_LOG2: probabilities below 2^-6 fall into e4m3's subnormals (step 2^-9) and
# below 2^-10 to 0; 256 lifts them 8 binades and keeps the largest, 256, under e4m3's 448.
P_LOG2 = tl.constexpr(8.0)
# The random signs of the rotation: torch.Generator().manual_seed(SIGN_SEED), torch.randint(0, 2, (D,)).
SIGN_SEED = 20240711


def tiles():
    return FORCE_TILES or (INTERPRET_TILES if INTERPRET else TILES)


def launch_tiles(causal, Skv):
    """(BLOCK_M, BLOCK_N, num_warps, num_stages, maxnreg) of one call (maxnreg 0: Triton's own): SHORT_TILES for
    causal attention over at most SHORT_KEYS keys on a GPU, else tiles() (with MAXNREG when FORCE_TILES is set)."""
    if causal and Skv <= SHORT_KEYS and not (FORCE_TILES or INTERPRET):
        assert SHORT_TILES[:2] == TILES[:2], "the quantisers' blocks are TILES'"
        return (*SHORT_TILES, SHORT_MAXNREG)
    if V_RESIDUAL and not (FORCE_TILES or INTERPRET):   # a third ring (r_j): two stages keep two programs an SM
        return (*TILES[:3], 2, 0)
    return (*tiles(), MAXNREG if FORCE_TILES else 0)


# ----------------------------------------------------------------------------- the rotation
def hadamard(D):
    """The D x D Sylvester-Hadamard matrix of +-1 (D a power of two): H H^T = D I."""
    h = torch.ones(1, 1)
    while h.shape[0] < D:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    assert h.shape[0] == D, f"D = {D} is no power of two"
    return h


@functools.lru_cache(maxsize=None)
def _signs_hadamard(D):
    g = torch.Generator().manual_seed(SIGN_SEED)
    signs = torch.randint(0, 2, (D,), generator=g).float() * 2 - 1
    return signs[:, None] * hadamard(D)


@functools.lru_cache(maxsize=None)
def signed_hadamard(D, dtype=torch.float32, device="cpu"):
    """diag(signs) H_D, entries +-1; M = signed_hadamard(D) / sqrt(D) is orthogonal. Kept per device: a
    copy from the host on every call would wait for the GPU's queue (a pageable copy) and stall the launch."""
    return _signs_hadamard(D).to(device=device, dtype=dtype)


# ----------------------------------------------------------------------------- device helpers
@triton.jit
def e4m3_grid(x):
    """x (fp32, |x| <= 448) rounded to the nearest e4m3 value, ties to even, still in fp32: the step
    of x's binade (2^(e-3), subnormals sharing the smallest binade's 2^-9) times an integer rounded
    by the 1.5 * 2^23 trick (exact for |x / step| < 2^22)."""
    a = tl.abs(x)
    e = tl.maximum(((a.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127, -6)
    step = ((e + 124) << 23).to(tl.float32, bitcast=True)        # 2^(e - 3)
    r = ((a / step + 12582912.0) - 12582912.0) * step
    sign = x.to(tl.uint32, bitcast=True) & 0x80000000              # x's sign bit, so -tiny gives -0 as cvt.rn does
    return (r.to(tl.uint32, bitcast=True) | sign).to(tl.float32, bitcast=True)


@triton.jit
def to_e4m3(x, EXACT: tl.constexpr):
    if EXACT:
        x = e4m3_grid(x)
    return x.to(tl.float8e4nv)


@triton.jit
def exp2_fma(x):
    """2^x without the MUFU unit (FlashAttention-4's software exp2): x = j + f with j = round(x) by the
    1.5 * 2^23 trick (j lands in the low mantissa bits), 2^f on [-1/2, 1/2] by a cubic (relative error
    under 1e-3, far below e4m3's step), 2^j added to the exponent as an integer; below 2^-126: 0."""
    xc = tl.maximum(x, -126.0)
    t = xc + 12582912.0
    f = xc - (t - 12582912.0)
    p = 1.0 + f * (0.6931472 + f * (0.2402265 + f * 0.0555041))
    j = t.to(tl.int32, bitcast=True) - 0x4B400000
    r = (p.to(tl.int32, bitcast=True) + (j << 23)).to(tl.float32, bitcast=True)
    return tl.where(x < -126.0, 0.0, r)


@triton.jit
def halves(x):
    """x [M, N] as its columns below N / 2 and from N / 2 on: in the tensor cores' accumulator layout a
    thread holds columns of both halves, so the split moves no data between threads."""
    return tl.split(x.reshape(x.shape[0], 2, x.shape[1] // 2).permute(0, 2, 1))


@triton.jit
def joined(a, b):
    """The inverse of halves: [M, N / 2] twice back into [M, N]."""
    return tl.join(a, b).permute(0, 2, 1).reshape(a.shape[0], 2 * a.shape[1])


@triton.jit
def exp2_part(x, PART: tl.constexpr):
    """2^x with the last 1/PART of x's columns on the FMA pipes (exp2_fma), the rest on the MUFU unit
    (PART 0: all on MUFU; 1: all on the FMA pipes; 2, 4, 8: a half, quarter, eighth)."""
    if PART == 0:
        r = tl.math.exp2(x)
    elif PART == 1:
        r = exp2_fma(x)
    elif PART == 2:
        a, b = halves(x)
        r = joined(tl.math.exp2(a), exp2_fma(b))
    elif PART == 4:
        a, b = halves(x)
        b0, b1 = halves(b)
        r = joined(tl.math.exp2(a), joined(tl.math.exp2(b0), exp2_fma(b1)))
    else:
        tl.static_assert(PART == 8, "PART: 0, 1, 2, 4 or 8")
        a, b = halves(x)
        b0, b1 = halves(b)
        c0, c1 = halves(b1)
        r = joined(tl.math.exp2(a), joined(tl.math.exp2(b0), joined(tl.math.exp2(c0), exp2_fma(c1))))
    return r


@triton.jit
def operand_ordered(x, R: tl.constexpr, N: tl.constexpr):
    """x [R, N] with each group of 32 columns c = 16 a1 + 8 a0 + 2 t + b moved to 16 a1 + 4 t + 2 a0 + b: a lane t of
    a quad holds columns 2t, 2t + 1 of every 8 in the fp32 accumulator and k = 4t..4t + 3 of every 16 in the e4m3 A
    operand, so P in this order is the operand in the registers it already has."""
    return x.reshape(R, N // 32, 2, 2, 4, 2).permute(0, 1, 2, 4, 3, 5).reshape(R, N)


@triton.jit
def dot(a, b, acc, EXACT: tl.constexpr):
    """tl.dot(a, b, acc); in the interpreter on fp32 copies (exact for e4m3 and +-1 operands): NumPy
    multiplies fp16 (and fp8, which it widens to fp16) without BLAS, some 50x slower."""
    if EXACT:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    return tl.dot(a, b, acc)


@triton.jit
def rotation(R, D: tl.constexpr, ROTATE: tl.constexpr):
    """R [D, D] loaded once for a program's tiles (zeros when nothing is rotated)."""
    if ROTATE:
        r = tl.load(R + tl.arange(0, D)[:, None] * D + tl.arange(0, D)[None, :])
    else:
        r = tl.zeros([D, D], R.dtype.element_ty)
    return r


@triton.jit
def rows_tile(X, X8, DESCALE, r, pid, bh, S, H, sxb, sxh, sxs, inv_sqrt_d,
              ROTATE: tl.constexpr, EXACT: tl.constexpr, D: tl.constexpr, BLOCK: tl.constexpr,
              DSTRIDE: tl.constexpr = 1, INT8: tl.constexpr = False):
    """Tile pid of BLOCK rows of (batch x head) bh of X [B, H, S, D] (strides sxb, sxh, sxs, 1):
    rotated by r / sqrt(D) (r = diag(signs) H_D, [D, D] in X's dtype, from rotation) when ROTATE,
    stored e4m3 (INT8: int8, amax at 127) into X8 [B, H, S, D] (contiguous) with its descale into DESCALE
    [B, H, cdiv(S, BLOCK)]; a tile past S stores nothing."""
    b, h = bh // H, bh % H
    rows = pid * BLOCK + tl.arange(0, BLOCK)[:, None]
    cols = tl.arange(0, D)[None, :]
    x = tl.load(X + b.to(tl.int64) * sxb + h * sxh + rows * sxs + cols, mask=rows < S, other=0.0)
    if ROTATE:
        x = dot(x, r, tl.zeros([BLOCK, D], tl.float32), EXACT) * inv_sqrt_d   # +-1 products exact, fp32 sums
    else:
        x = x.to(tl.float32)
    amax = tl.max(tl.max(tl.abs(x), 1), 0)
    if INT8:
        descale = tl.where(amax > 0, amax / 127.0, 1.0)
        x8 = ((x / descale + MAGIC) - MAGIC).to(tl.int8)             # rounded to the nearest integer, ties to even
    else:
        descale = tl.where(amax > 0, amax / 448.0, 1.0)             # an all-zero tile keeps 1
        x8 = to_e4m3(x / descale, EXACT)
    tl.store(X8 + bh.to(tl.int64) * S * D + rows * D + cols, x8, mask=rows < S)
    tl.store(DESCALE + (bh * tl.cdiv(S, BLOCK) + pid) * DSTRIDE, descale, mask=pid < tl.cdiv(S, BLOCK))


@triton.jit
def v_tile(V, VT8, DESCALE, pid, bh, S, H, svb, svh, svs, S_PAD, EXACT: tl.constexpr, D: tl.constexpr,
           BLOCK_N: tl.constexpr, DSTRIDE: tl.constexpr = 1, ORDER: tl.constexpr = False, RESID: tl.constexpr = False):
    """Tile pid of BLOCK_N keys of (batch x head) bh of V [B, H, S, D] (strides svb, svh, svs, 1),
    stored e4m3 transposed into VT8 [B, H, D, S_PAD] (keys contiguous), its descale into DESCALE
    [B, H, cdiv(S, BLOCK_N)]; a tile past S stores nothing. RESID: VT8 is [B, H, 2 D, S_PAD], its rows D..2D-1
    V's rounding error in the same scale (V_RESIDUAL)."""
    b, h = bh // H, bh % H
    keys = pid * BLOCK_N + tl.arange(0, BLOCK_N)[:, None]
    cols = tl.arange(0, D)[None, :]
    v = tl.load(V + b.to(tl.int64) * svb + h * svh + keys * svs + cols, mask=keys < S, other=0.0).to(tl.float32)
    amax = tl.max(tl.max(tl.abs(v), 1), 0)
    descale = tl.where(amax > 0, amax / 448.0, 1.0)
    vs = tl.trans(v / descale)
    v8t = to_e4m3(vs, EXACT)                                        # [D, BLOCK_N]
    keys_t = pid * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    if ORDER:                                                       # whole groups of 32, zeros past S
        stored = keys_t < tl.cdiv(S, 32) * 32
    else:
        stored = keys_t < S
    rows = 2 * D if RESID else D
    at_v = VT8 + bh.to(tl.int64) * rows * S_PAD + tl.arange(0, D)[:, None] * S_PAD + keys_t
    if RESID:                                                       # r = e4m3(v / dv - e4m3(v / dv)), same scale
        r8t = to_e4m3(vs - v8t.to(tl.float32), EXACT)
        if ORDER:
            r8t = operand_ordered(r8t, D, BLOCK_N)
        tl.store(at_v + D * S_PAD, r8t, mask=stored)
    if ORDER:
        v8t = operand_ordered(v8t, D, BLOCK_N)
    tl.store(at_v, v8t, mask=stored)
    at = (bh * tl.cdiv(S, BLOCK_N) + pid) * DSTRIDE
    tl.store(DESCALE + at, descale, mask=pid < tl.cdiv(S, BLOCK_N))
    if DSTRIDE == 4:                                                # the paired record's 1 / dv
        tl.store(DESCALE + at + 1, 1.0 / descale, mask=pid < tl.cdiv(S, BLOCK_N))


@triton.jit
def quant_rows(X, X8, DESCALE, R, S, H, sxb, sxh, sxs, inv_sqrt_d,
               ROTATE: tl.constexpr, EXACT: tl.constexpr, D: tl.constexpr, BLOCK: tl.constexpr,
               TILES: tl.constexpr, DSTRIDE: tl.constexpr = 1, INT8: tl.constexpr = False):
    """Q or K alone: grid (cdiv(S, TILES * BLOCK), B * H), TILES consecutive rows_tile each, R read once."""
    r = rotation(R, D, ROTATE)
    for g in tl.static_range(TILES):
        rows_tile(X, X8, DESCALE, r, tl.program_id(0) * TILES + g, tl.program_id(1), S, H, sxb, sxh, sxs,
                  inv_sqrt_d, ROTATE, EXACT, D, BLOCK, DSTRIDE, INT8)


@triton.jit
def quant_v(V, VT8, DESCALE, S, H, svb, svh, svs, S_PAD, EXACT: tl.constexpr, D: tl.constexpr,
            BLOCK_N: tl.constexpr, TILES: tl.constexpr, DSTRIDE: tl.constexpr = 1, ORDER: tl.constexpr = False,
            RESID: tl.constexpr = False):
    """V alone: grid (cdiv(S, TILES * BLOCK_N), B * H), TILES consecutive v_tile each."""
    for g in tl.static_range(TILES):
        v_tile(V, VT8, DESCALE, tl.program_id(0) * TILES + g, tl.program_id(1), S, H, svb, svh, svs, S_PAD, EXACT,
               D, BLOCK_N, DSTRIDE, ORDER, RESID)


@triton.jit
def quant_qkv(Q, K, V, Q8, K8, VT8, DQ, DK, DV, R, Sq, Skv, Hq, Hkv, NQ, NKV,
              sqb, sqh, sqs, skb, skh, sks, svb, svh, svs, S_PAD, inv_sqrt_d,
              EXACT: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              DSTRIDE: tl.constexpr, ORDER: tl.constexpr):
    """Q, K and V in one launch (quantize_qkv with ONE_LAUNCH, off: see there): a 1-D grid whose first
    NQ = B Hq cdiv(Sq, BLOCK_M) programs take Q's tiles (rotated), the next NKV = B Hkv cdiv(Skv,
    BLOCK_N) K's (rotated), the last NKV V's (transposed)."""
    pid = tl.program_id(0)
    if pid < NQ:
        nt = tl.cdiv(Sq, BLOCK_M)
        rows_tile(Q, Q8, DQ, rotation(R, D, True), pid % nt, pid // nt, Sq, Hq, sqb, sqh, sqs, inv_sqrt_d, True,
                  EXACT, D, BLOCK_M)
    else:
        nt = tl.cdiv(Skv, BLOCK_N)
        p = pid - NQ
        if p < NKV:
            rows_tile(K, K8, DK, rotation(R, D, True), p % nt, p // nt, Skv, Hkv, skb, skh, sks, inv_sqrt_d, True,
                      EXACT, D, BLOCK_N, DSTRIDE)
        else:
            p -= NKV
            v_tile(V, VT8, DV, p % nt, p // nt, Skv, Hkv, svb, svh, svs, S_PAD, EXACT, D, BLOCK_N, DSTRIDE, ORDER)


@triton.jit
def qk_dot(q, k, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, EXACT: tl.constexpr, INT8: tl.constexpr):
    """S = Q K^T of one tile in fp32; INT8 (int8 Q and K): the int32 sums converted (1), or MAGIC + S (2)."""
    if INT8 == 0:
        s = dot(q, k.T, tl.zeros([BLOCK_M, BLOCK_N], tl.float32), EXACT)
    else:
        if EXACT:
            si = dot(q, k.T, tl.zeros([BLOCK_M, BLOCK_N], tl.float32), EXACT).to(tl.int32)   # exact integers
        else:
            si = tl.dot(q, k.T, out_dtype=tl.int32)
        if INT8 == 1:
            s = si.to(tl.float32)
        else:
            s = (si + 0x4B400000).to(tl.float32, bitcast=True)
    return s


@triton.jit
def block_tiles(acc, m_i, l_i, dv_prev, q, K, VT, DK, DV, b, h_kv, kv_row, i, lo, hi, Skv, off, q_scale,
                MASKED: tl.constexpr, CAUSAL: tl.constexpr, EXACT: tl.constexpr, D: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, FMA_EXP2: tl.constexpr, LAZY: tl.constexpr,
                PAIRED: tl.constexpr, ORDER: tl.constexpr, AHEAD: tl.constexpr = False, RESID: tl.constexpr = False,
                INT8: tl.constexpr = 0):
    """Key tiles [lo, hi) of one query tile, each with its own dk and dv (kv_row: this (batch, KV
    head)'s first descale). acc is in units of dv_prev, the last tile's dv (LAZY: the head's dv_max).
    AHEAD: each tile's Q K^T written a tile early, before the previous tile's softmax (AHEAD_S).
    RESID: V's rounding error, rows D..2D-1 of V^T, added by a second P V dot (V_RESIDUAL). INT8: q and K in int8
    (INT8_QK's conversion)."""
    OFFSET: tl.constexpr = MAGIC if INT8 == 2 else 0.0
    if AHEAD:
        s_next = dot(q, K.load([b, h_kv, lo, 0]).reshape(BLOCK_N, D).T, tl.zeros([BLOCK_M, BLOCK_N], tl.float32),
                     EXACT)
    for start_n in tl.range(lo, hi, BLOCK_N):
        j = start_n // BLOCK_N
        if AHEAD:                                                   # past the row: TMA's zeros, unused
            s = s_next
            k = K.load([b, h_kv, start_n + BLOCK_N, 0]).reshape(BLOCK_N, D)
            s_next = dot(q, k.T, tl.zeros([BLOCK_M, BLOCK_N], tl.float32), EXACT)
        else:
            k = K.load([b, h_kv, start_n, 0]).reshape(BLOCK_N, D)
        vT = VT.load([b, h_kv, 0, start_n]).reshape(D, BLOCK_N)
        # tl.load: the pipeliner copies dk a step ahead; a plain load ran 5-9% slower (2026-12-03_h200_step10_fp8_plain_descales.txt)
        if PAIRED:                                                  # (dk, dv, 1 / dv, unused), one load
            dk_inv, dv_pad = tl.split(tl.load(DK + (kv_row + j) * 4 + tl.arange(0, 4)).reshape(2, 2))
            dk, inv_dv = tl.split(dk_inv)
            dv, _ = tl.split(dv_pad)
            ratio = dv_prev * inv_dv
        else:
            dk = tl.load(DK + kv_row + j)
            dv = tl.load(DV + kv_row + j)
            ratio = dv_prev / dv
        qk_scale = q_scale * dk                                     # scale * dq[i] * dk[j] * log2(e)
        if not AHEAD:
            s = qk_dot(q, k, BLOCK_M, BLOCK_N, EXACT, INT8)
        s, m_new, m_use = v5.masked_max(s, m_i, qk_scale, start_n, i, Skv, off, MASKED, CAUSAL, BLOCK_N, OFFSET)
        if LAZY:   # keep a row's max unless it grew by more than LAZY_TAU; P V_j's dv / dv_max rides the exp2
            m_new = tl.where(m_new > m_i + LAZY_TAU, m_new, m_i)
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
            x = s * qk_scale - (m_use - P_LOG2 - tl.math.log2(dv / dv_prev))[:, None]
        else:
            x = s * qk_scale - (m_use - P_LOG2 + OFFSET * qk_scale)[:, None]
        p = exp2_part(x, FMA_EXP2)                                   # P times 2^P_LOG2, in [0, 256]
        alpha = tl.math.exp2(m_i - m_use)
        if LAZY:
            l_i = l_i * alpha + tl.sum(p, 1) * (dv_prev / dv)
        else:
            l_i = l_i * alpha + tl.sum(p, 1)
        if vT.dtype == tl.float8e4nv:
            p = to_e4m3(p, EXACT)
        else:
            p = p.to(vT.dtype)                                      # the tests' quantised values held in fp16
        if ORDER:                                                   # V^T's keys in operand_ordered's order
            p = operand_ordered(p, BLOCK_M, BLOCK_N)
        if LAZY:
            if tl.min(alpha, 0) < 1.0:                              # some row's max moved: rescale this tile only
                acc = acc * alpha[:, None]
            acc = dot(p, vT.T, acc, EXACT)
        else:
            acc = dot(p, vT.T, acc * (alpha * ratio)[:, None], EXACT)
            if RESID:                                               # + P r_j: V's rounding error, same scale
                acc = dot(p, VT.load([b, h_kv, D, start_n]).reshape(D, BLOCK_N).T, acc, EXACT)
            dv_prev = dv
        m_i = m_new
    return acc, m_i, l_i, dv_prev


@triton.jit
def fp8_block_fwd(Q, K, VT, O, LSE, DQ, DK, DV, Hq, Hkv, Sq, Skv, NQ, NK, scale,
                  CAUSAL: tl.constexpr, GROUP: tl.constexpr, Q_PER: tl.constexpr, EXACT: tl.constexpr,
                  D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, FMA_EXP2: tl.constexpr,
                  LAZY: tl.constexpr, PAIRED: tl.constexpr = False, ORDER: tl.constexpr = False,
                  AHEAD: tl.constexpr = False, RESID: tl.constexpr = False, INT8: tl.constexpr = 0):
    """v5's forward (descriptors, causal split) with per-block descales: DQ [B, Hq, NQ] (one per Q_PER
    query tiles), DK and DV [B, Hkv, NK] (one per key tile)."""
    pid_m = tl.program_id(0)
    if CAUSAL:
        pid_m = tl.cdiv(Sq, BLOCK_M) - 1 - pid_m
    bh, b, h, h_kv, start_m, i = vc.query_tile(pid_m, Hq, GROUP, BLOCK_M)
    q = Q.load([b, h, start_m, 0]).reshape(BLOCK_M, D)
    q_scale = scale * tl.load(DQ + bh * NQ + pid_m // Q_PER) * 1.4426950408889634
    kv_row = (b * Hkv + h_kv) * NK

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    dv_prev = tl.load(DK + kv_row * 4 + 1) if PAIRED else tl.load(DV + kv_row)   # the first tile's: ratio 1
    if LAZY:                                                        # the head's largest: every ratio <= 1
        for t in tl.range(0, NK, 128):
            jj = t + tl.arange(0, 128)
            at = DK + (kv_row + jj) * 4 + 1 if PAIRED else DV + kv_row + jj
            dv_prev = tl.maximum(dv_prev, tl.max(tl.load(at, mask=jj < NK, other=0.0), 0))
    off = Skv - Sq
    end_free, hi = causal_split_bounds(start_m, off, Skv, BLOCK_M, BLOCK_N, CAUSAL)
    acc, m_i, l_i, dv_prev = block_tiles(acc, m_i, l_i, dv_prev, q, K, VT, DK, DV, b, h_kv, kv_row, i, 0, end_free,
                                         Skv, off, q_scale, False, CAUSAL, EXACT, D, BLOCK_M, BLOCK_N, FMA_EXP2, LAZY,
                                         PAIRED, ORDER, AHEAD, RESID, INT8)
    acc, m_i, l_i, dv_prev = block_tiles(acc, m_i, l_i, dv_prev, q, K, VT, DK, DV, b, h_kv, kv_row, i, end_free, hi,
                                         Skv, off, q_scale, True, CAUSAL, EXACT, D, BLOCK_M, BLOCK_N, FMA_EXP2, LAZY,
                                         PAIRED, ORDER, False, RESID, INT8)

    o, lse = vc.finish(acc, m_i - P_LOG2, l_i)                     # l carries P's 2^P_LOG2 like acc: O keeps it out
    o = o * dv_prev                                                 # acc was in units of the last dv (LAZY: dv_max)
    O.store([b, h, start_m, 0], o.to(O.dtype).reshape(1, 1, BLOCK_M, D))
    tl.store(LSE + bh.to(tl.int64) * Sq + i, lse[:, None], mask=i < Sq)


# ----------------------------------------------------------------------------- host
def quant_launch():
    return {} if INTERPRET else dict(num_warps=QUANT_WARPS)


def rows_out(x, block, int8=False):
    """(x8, descale) as rows_tile writes them for x [B, H, S, D]: e4m3 (int8) [B, H, S, D], fp32 [B, H, cdiv(S, block)]."""
    B, H, S, D = x.shape
    return (torch.empty((B, H, S, D), device=x.device, dtype=torch.int8 if int8 else torch.float8_e4m3fn),
            torch.empty((B, H, triton.cdiv(S, block)), device=x.device, dtype=torch.float32))


def v_out(v, block, order):
    """(v8t, descale, s_pad) as v_tile writes them for v [B, H, S, D]: e4m3 V^T, fp32 descales [B, H,
    cdiv(S, block)]. In key order V^T is [B, H, D, S], its rows padded to s_pad (16 bytes) underneath so
    that TMA reads it in place; in operand order [B, H, D, vt_keys(S)], whole groups of 32 keys."""
    B, H, S, D = v.shape
    s_pad = vt_keys(S, True) if order else -(-S // 16) * 16
    rows = 2 * D if V_RESIDUAL else D                               # V's rounding error under V^T
    return (torch.empty((B, H, rows, s_pad), device=v.device, dtype=torch.float8_e4m3fn)[..., :vt_keys(S, order)],
            torch.empty((B, H, triton.cdiv(S, block)), device=v.device, dtype=torch.float32), s_pad)


def vt_keys(S, order):
    """V^T's last dimension for S keys: S in key order, whole groups of 32 in operand order (the last group's
    keys lie anywhere in it; the rest of it zeros)."""
    return -(-S // 32) * 32 if order else S


def quantize_rows(x, block, rotate, descale=None, int8=False):
    """(x8, descale): x [B, H, S, D] (stride(-1) == 1) in e4m3 [B, H, S, D] with one scale per block
    of rows, descale fp32 [B, H, cdiv(S, block)] (or into the given one, its last stride 1 or 4);
    rotated by diag(signs) H_D / sqrt(D) when rotate; int8 (amax at 127) when int8. One launch of quant_rows."""
    assert x.stride(-1) == 1
    B, H, S, D = x.shape
    x8, own = rows_out(x, block, int8)
    descale = own if descale is None else descale
    if S and B * H:
        r = signed_hadamard(D, x.dtype, x.device)
        quant_rows[(triton.cdiv(S, QUANT_TILES * block), B * H)](
            x, x8, descale, r, S, H, x.stride(0), x.stride(1), x.stride(2), 1.0 / math.sqrt(D), bool(rotate),
            EXACT_ROUND, D, block, QUANT_TILES, descale.stride(-1), bool(int8), **quant_launch())
    return x8, descale


def quantize_v_transposed(v, block, descale=None, operand_order=None):
    """(v8t, descale): v [B, H, S, D] as e4m3 V^T (keys contiguous; see v_out) with one scale per block
    keys, descale fp32 [B, H, cdiv(S, block)] (or into the given one: last stride 4 also writes 1 /
    descale after each). Keys in operand order (operand_ordered) when operand_order (default
    OPERAND_ORDER). One launch of quant_v."""
    assert v.stride(-1) == 1
    order = OPERAND_ORDER if operand_order is None else operand_order
    B, H, S, D = v.shape
    v8t, own, s_pad = v_out(v, block, order)
    descale = own if descale is None else descale
    if S and B * H:
        quant_v[(triton.cdiv(S, QUANT_TILES * block), B * H)](v, v8t, descale, S, H, v.stride(0), v.stride(1),
                                                              v.stride(2), s_pad, EXACT_ROUND, D, block, QUANT_TILES,
                                                              descale.stride(-1), order, V_RESIDUAL, **quant_launch())
    return v8t, descale


def transpose_v(v8, operand_order=None):
    """V^T as the kernel reads it (quantize_v_transposed's layout), from v8 [B, H, S, D]: keys contiguous, in
    operand order (operand_ordered) when operand_order (default OPERAND_ORDER)."""
    if V_RESIDUAL:      # v8 alone has no rounding error to add: zeros under V^T, the layout for the timing
        vt = transpose_v_rows(v8, operand_order)
        return torch.cat([vt, torch.zeros_like(vt)], dim=-2)
    return transpose_v_rows(v8, operand_order)


def transpose_v_rows(v8, operand_order=None):
    """transpose_v without V_RESIDUAL's rows."""
    if not (OPERAND_ORDER if operand_order is None else operand_order):
        return v8.transpose(-1, -2).contiguous()
    B, H, S, D = v8.shape
    n = vt_keys(S, True)
    vt = torch.zeros((B, H, D, n), device=v8.device, dtype=v8.dtype)
    vt[..., :S] = v8.transpose(-1, -2)
    return vt.view(B, H, D, n // 32, 2, 2, 4, 2).permute(0, 1, 2, 3, 4, 6, 5, 7).reshape(B, H, D, n)


def quantize_fp8(x, rotate=False):
    """The kind's one-tensor quantiser (facourse.fp8.bench_fp8 calls it on q, k and v alike): x
    [B, H, S, D] in e4m3 with one scale per BLOCK_N rows (the kernel's key tile, a multiple of its
    query tile), descale fp32 [B, H, cdiv(S, BLOCK_N)]. rotate applies M (Q and K only, both or
    neither: Q K^T is unchanged)."""
    return quantize_rows(x, tiles()[1], rotate)


def quantize_qkv(q, k, v, operand_order=None, paired=None):
    """The end-to-end path's quantisation: q per BLOCK_M rows and k per BLOCK_N rows, both rotated; v
    transposed per BLOCK_N keys, in operand order when operand_order (default OPERAND_ORDER); dk and dv
    written into descale_records when paired (default PAIRED_DESCALES), as views of them. Three launches
    (quantize_rows twice, quantize_v_transposed), or one of quant_qkv with ONE_LAUNCH, which writes the
    same bytes. Returns q8, dq, k8, dk, v8t, dv."""
    BLOCK_M, BLOCK_N = tiles()[:2]
    order = OPERAND_ORDER if operand_order is None else operand_order
    rec = descale_records(k) if (PAIRED_DESCALES if paired is None else paired) else None
    if not ONE_LAUNCH or V_RESIDUAL or INT8_QK:                      # (quant_qkv writes neither)
        q8, dq = quantize_rows(q, BLOCK_M, True, int8=bool(INT8_QK))
        k8, dk = quantize_rows(k, BLOCK_N, True, None if rec is None else rec[..., 0], int8=bool(INT8_QK))
        v8t, dv = quantize_v_transposed(v, BLOCK_N, None if rec is None else rec[..., 1], order)
        return q8, dq, k8, dk, v8t, dv
    assert q.stride(-1) == k.stride(-1) == v.stride(-1) == 1
    B, Hq, Sq, D = q.shape
    Hkv, Skv = k.shape[1], k.shape[2]
    (q8, dq), (k8, dk) = rows_out(q, BLOCK_M), rows_out(k, BLOCK_N)
    v8t, dv, s_pad = v_out(v, BLOCK_N, order)
    if rec is not None:
        dk, dv = rec[..., 0], rec[..., 1]
    nq, nkv = B * Hq * triton.cdiv(Sq, BLOCK_M), B * Hkv * triton.cdiv(Skv, BLOCK_N)
    if nq + nkv:
        quant_qkv[(nq + 2 * nkv,)](q, k, v, q8, k8, v8t, dq, dk, dv, signed_hadamard(D, q.dtype, q.device), Sq, Skv,
                                   Hq, Hkv, nq, nkv, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], s_pad,
                                   1.0 / math.sqrt(D), EXACT_ROUND, D, BLOCK_M, BLOCK_N, dk.stride(-1), order)
    return q8, dq, k8, dk, v8t, dv


def descale_records(k):
    """The key tiles' descale records for k [B, H, S, D]: fp32 [B, H, cdiv(S, BLOCK_N), 4], (dk, dv, 1 / dv, unused)
    a tile, one 16-byte load each in the kernel (PAIRED_DESCALES)."""
    B, H, S, _ = k.shape
    return torch.empty((B, H, triton.cdiv(S, tiles()[1]), 4), device=k.device, dtype=torch.float32)


def records_of(dk, dv):
    """The records fp8_block_fwd reads with PAIRED: their buffer where quantize_qkv wrote dk and dv into one, else
    built from the two (the prequantised path)."""
    if dk.stride(-1) == 4 and dv.stride(-1) == 4 and dv.data_ptr() == dk.data_ptr() + 4:
        return dk
    dv = dv.float()
    return torch.stack((dk.float(), dv, 1.0 / dv, dv), -1)


def run_kernel(q8, k8, v8t, descale_q, descale_k, descale_v, causal, scale, out_dtype, operand_order=None):
    """The launch, with no device check. q8 [B, Hq, Sq, D], k8 [B, Hkv, Skv, D], v8t [B, Hkv, D, vt_keys(Skv,
    operand_order)] (stride(-1) == 1; keys in operand order when operand_order, default OPERAND_ORDER: from
    quantize_v_transposed or transpose_v); descale_q [B, Hq, cdiv(Sq, n * BLOCK_M)] (one per n query tiles,
    n >= 1), descale_k and descale_v [B, Hkv, cdiv(Skv, BLOCK_N)]. Returns (o, lse)."""
    B, Hq, Sq, D = q8.shape
    Hkv, Skv = k8.shape[1], k8.shape[2]
    order = OPERAND_ORDER if operand_order is None else operand_order
    assert v8t.shape[-1] == vt_keys(Skv, order), f"v8t {tuple(v8t.shape)}: {vt_keys(Skv, order)} keys (order {order})"
    assert v8t.shape[-2] == (2 * D if V_RESIDUAL else D), f"v8t {tuple(v8t.shape)}: V_RESIDUAL {V_RESIDUAL}"
    scale, o, lse = v5.outputs(q8, k8, v8t[..., :D, :Skv], scale, out_dtype)
    if Sq == 0 or Skv == 0:
        return o, lse
    BLOCK_M, BLOCK_N, num_warps, num_stages, maxnreg = launch_tiles(causal, Skv)
    nq, nk = descale_q.shape[-1], triton.cdiv(Skv, BLOCK_N)
    q_per = next((n for n in (1, max(1, BLOCK_N // BLOCK_M)) if triton.cdiv(Sq, n * BLOCK_M) == nq), None)
    assert q_per and descale_q.shape == (B, Hq, nq), \
        f"descale_q {tuple(descale_q.shape)}: one per query tile or per key tile"
    assert descale_k.shape == descale_v.shape == (B, Hkv, nk), "descale_k, descale_v: one per key tile"
    int8 = (INT8_QK or 2) if q8.dtype == torch.int8 else 0         # int8 Q and K: INT8_QK's conversion
    assert (k8.dtype == torch.int8) == bool(int8) and not (int8 and AHEAD_S), "q8 and k8 both int8, without AHEAD_S"
    descs = v5.descriptors(q8, k8, v8t, o, BLOCK_M, BLOCK_N)
    launch = {} if INTERPRET else dict(num_warps=num_warps, num_stages=num_stages)
    if maxnreg and not INTERPRET:
        launch["maxnreg"] = maxnreg
    if PAIRED_DESCALES:
        descales = (descale_q.float().contiguous(), records_of(descale_k, descale_v), descale_v)
    else:
        descales = (t.float().contiguous() for t in (descale_q, descale_k, descale_v))
    fp8_block_fwd[(triton.cdiv(Sq, BLOCK_M), B * Hq)](
        *descs, lse, *descales, Hq, Hkv, Sq, Skv, nq, nk, scale, bool(causal), Hq // Hkv, q_per, EXACT_ROUND, D,
        BLOCK_M, BLOCK_N, EXP2_FMA, LAZY_RESCALE, PAIRED_DESCALES, order, AHEAD_S, V_RESIDUAL, int8, **launch)
    return o, lse


def run_end_to_end(q, k, v, causal=True, scale=None):
    """flash_attention_fp8 without the device check: the fused quantisers, then the kernel."""
    validate_triton_inputs(q, k, v, scale)
    q8, dq, k8, dk, v8t, dv = quantize_qkv(q, k, v)
    return run_kernel(q8, k8, v8t, dq, dk, dv, causal, scale, q.dtype)


def flash_attention_fp8_prequantized(q8, k8, v8t, descale_q, descale_k, descale_v, causal=True, scale=None,
                                     out_dtype=torch.float16):
    """The FP8 kernel on inputs already quantised (quantize_fp8 or quantize_qkv): see run_kernel."""
    v5.require_fp8_gpu(q8, "v7_fp8_fa3")
    return run_kernel(q8, k8, v8t, descale_q, descale_k, descale_v, causal, scale, out_dtype)


def flash_attention_fp8(q, k, v, causal=True, scale=None):
    """FP8 attention: q [B, Hq, Sq, D], k and v [B, Hkv, Skv, D] in fp16 or bf16, quantised by the
    fused kernels (rotation, per-block scales, V transposed). Returns (o in q's dtype, lse fp32)."""
    v5.require_fp8_gpu(q, "v7_fp8_fa3")
    return run_end_to_end(q, k, v, causal, scale)


# ----------------------------------------------------------------------------- the error study
def rotate_reference(x):
    """x M in fp32, M = diag(signs) H_D / sqrt(D): the rotation quant_rows applies, in PyTorch."""
    return (x.float() @ signed_hadamard(x.shape[-1])) * (1.0 / math.sqrt(x.shape[-1]))


def quantized_by(q, k, v, how):
    """(q8, dq, k8, dk, v8t, dv) as the kernel takes them. how: "per_tensor" (v5's quantize_fp8, its
    per-(batch, head) descales repeated for every tile), "per_tensor_rotated" (the same after Q M and K
    M), "per_block" (this rung's kernels without the rotation) or "per_block_rotated" (quantize_qkv)."""
    BLOCK_M, BLOCK_N = tiles()[:2]
    if how.startswith("per_tensor"):
        rot = how.endswith("rotated")
        (q8, dq), (k8, dk), (v8, dv) = (v5.quantize_fp8(rotate_reference(t) if rot and t is not v else t)
                                        for t in (q, k, v))
        nq, nk = triton.cdiv(q.shape[2], BLOCK_M), triton.cdiv(k.shape[2], BLOCK_N)
        return (q8, dq[..., None].expand(-1, -1, nq), k8, dk[..., None].expand(-1, -1, nk),
                transpose_v(v8), dv[..., None].expand(-1, -1, nk))
    if how == "per_block":
        (q8, dq), (k8, dk) = quantize_rows(q, BLOCK_M, False), quantize_rows(k, BLOCK_N, False)
        return (q8, dq, k8, dk, *quantize_v_transposed(v, BLOCK_N))
    assert how == "per_block_rotated", how
    return quantize_qkv(q, k, v)


HOWS = ("per_tensor", "per_tensor_rotated", "per_block", "per_block_rotated")


def rmse_of(q, k, v, how, causal=False):
    """RMSE of O (fp16, this kernel on the quantised inputs) against float64 attention of q, k, v."""
    from facourse.reference import reference_attention
    q8, dq, k8, dk, v8t, dv = quantized_by(q, k, v, how)
    o, _ = run_kernel(q8, k8, v8t, dq, dk, dv, causal, None, q.dtype)
    ref, _ = reference_attention(q.double(), k.double(), v.double(), causal)
    return float((o.double() - ref).pow(2).mean().sqrt())


def error_study(B=1, H=4, S=2048, D=128, seeds=(0, 1), kinds=("outliers", "gaussian"), causal=False):
    """The results file's text: RMSE of O per quantisation, on FA3's outlier inputs and on N(0, 1), with
    the GPU's tiles (TILES: the quantisation blocks the GPU path uses)."""
    import datetime
    import platform
    import time

    import numpy
    global FORCE_TILES
    FORCE_TILES = TILES
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")),
               platform.machine())
    lines = [
        f"# FP8 attention error measured on a CPU (no GPU), step 10 rung v7_fp8_fa3; {datetime.date.today()}",
        f"# device: CPU ({cpu}, {platform.machine()}), Triton's interpreter (TRITON_INTERPRET=1); no timing. "
        f"Python {platform.python_version()}, torch {torch.__version__}, triton {triton.__version__}, "
        f"numpy {numpy.__version__}",
        f"# shape: B {B}, H {H}, Sq = Skv = {S}, D {D}, {'causal' if causal else 'non-causal'}, fp16 inputs; "
        f"tiles BLOCK_M x BLOCK_N = {tiles()[0]} x {tiles()[1]} (the GPU's; per-block scales: {tiles()[0]} rows of Q, "
        f"{tiles()[1]} of K and V)",
        "# inputs: fa3_outlier_inputs(B, H, S, D, seed): each entry N(0,1) + N(0,100) * Bernoulli(0.001) (outliers) "
        f"or N(0,1) (gaussian), q, k, v drawn in that order from torch.Generator().manual_seed(seed); seeds "
        f"{list(seeds)}; rotation signs from SIGN_SEED {SIGN_SEED}",
        "# method: O from this rung's kernel (fp8_block_fwd) run in the interpreter, e4m3 rounded to nearest even "
        "as on a GPU (EXACT_ROUND), P times 2^P_LOG2 = 256 cast to e4m3, fp32 accumulation; "
        "RMSE = sqrt(mean((O - O_ref)^2)), "
        "O_ref float64 attention of the fp16 inputs. per_tensor: v5's quantize_fp8 (one scale per (batch, head)) "
        "through this kernel; per_block: one scale per tile of rows; _rotated: Q and K times diag(signs) H_D / "
        "sqrt(D) first (per_block_rotated is flash_attention_fp8's path).",
        "# inputs    seed  " + "  ".join(f"{h:>19}" for h in HOWS),
    ]
    try:
        for kind in kinds:
            for seed in seeds:
                q, k, v = fa3_outlier_inputs(B, H, S, D, seed, kind == "outliers")
                t0 = time.time()
                errs = [rmse_of(q, k, v, how, causal) for how in HOWS]
                lines.append(f"{kind:<9} {seed:>5}  " + "  ".join(f"{e:>19.3e}" for e in errs)
                             + f"   # {time.time() - t0:.0f} s")
    finally:
        FORCE_TILES = None
    return "\n".join(lines) + "\n"


#: Tiles (BLOCK_M, BLOCK_N, num_warps, num_stages) the GPU sweep tries; TILES is the one the ladder runs.
TILE_SWEEP = [(64, 128, 4, 3), (64, 128, 4, 2), (64, 64, 4, 3), (128, 128, 8, 3), (128, 256, 8, 2)]
#: measured on an H100 (2026-11-27, prequantised, noncausal_16k / long / large): (64, 128, 4, 3) 876 / 854 / 527
#: TFLOP/s, (64, 128, 4, 4) 594 / 580 / 348, (64, 64, 4, 4) 727 / 705 / 532, (128, 128, 8, 2) 569 / 550 / 403,
#: (128, 128, 8, 3) 657 / 636 / 444, (64, 256, 4, 2) 556 / 550 / 314, (128, 256, 8, 2) 725 / 687 / 421.
#: Again on an H200 after V^T in operand order and the descale records (2026-12-04_h200_step10_fp8_tile_sweep.txt): the
#: committed tiles 926-927 TFLOP/s at 16k non-causal, every other 800 or less.
#: Triton 3.6's warp-specialised loop (tl.range(..., warp_specialize=True)) does not compile this kernel for
#: sm_90 (its NVGPUWarpSpecialization pass fails; seen on a CPU with the compile test's set-up).


def tile_sweep(configs=("noncausal_16k", "long", "large"), backend="CUDNN_ATTENTION"):
    """Lines: each TILE_SWEEP entry timed prequantised (facourse.fp8.bench_fp8) on ``configs``."""
    from facourse.fp8 import bench_fp8
    global FORCE_TILES
    lines = [f"# v7_fp8_fa3 tile sweep, prequantised e4m3, against SDPA {backend} (fp16); facourse.bench.time_calls"]
    try:
        for t in TILE_SWEEP:
            FORCE_TILES = t
            for c in configs:
                try:
                    r = bench_fp8(flash_attention_fp8_prequantized, quantize_fp8, c, backend=backend,
                                  transpose_v=transpose_v)
                    lines.append(f"{str(t):>20} {c:>14} {r.tflops_student:6.0f} TFLOP/s  ref {r.tflops_ref:4.0f}  "
                                 f"x{r.ratio:.2f}")
                except Exception as e:  # noqa: BLE001 (a tile that does not fit shared memory: say so, go on)
                    lines.append(f"{str(t):>20} {c:>14} {type(e).__name__}: {str(e)[:120]}")
                print(lines[-1], flush=True)
    finally:
        FORCE_TILES = None
    return lines


if __name__ == "__main__":
    if sys.argv[1:] == ["--tiles"]:          # on a GPU: python v7_fp8_fa3.py --tiles
        tile_sweep()
        sys.exit(0)
    # the committed record: python solutions/10_attention_variants/ladder/v7_fp8_fa3.py > FILE
    print(error_study(), end="")
    print(error_study(H=1, S=8192, seeds=(0,), kinds=("outliers",)), end="")
