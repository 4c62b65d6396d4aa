"""The course's FlashAttention-2 forward in TileLang (step 11, interchangeable kernels: its TileLang solution).

tilelang_fa verdict: 456 TFLOP/s on large (1.48x SDPA's FA2, 307) and 586 on long (1.60x, 365), fp16,
H100 (2026-11-23, gpu_try.py; bf16 1.49x and 1.64x); 44/44 checks in fp16 and bf16. A third stage: 466 on
large, 583 on long; 128 x 64 tiles 1.34-1.41x; without fast math 1.30x on large.

The same algorithm as step 05's Triton solution, written a level lower: TileLang names the tiles and
where they live (shared memory, register fragments), and its compiler lowers the copies and products to
Hopper's TMA and WGMMA, splits the block into a producer warpgroup and consumer warpgroups (warp
specialisation, with setmaxnreg moving registers to the consumers) and pipelines the K/V loads through
mbarriers. One program (a CUDA block) computes one query tile Q_i (BLOCK_M rows of one query head):

    Q_i -> shared (TMA, once)
    for each K_j, V_j tile it can see (pipelined: the producer loads tile j + 1 while the consumers work on j):
        S = Q_i K_j^T                       WGMMA, both operands in shared memory, fp32 accumulator
        mask S (only on the tiles that need it: the ragged last tile, and causal tiles on the diagonal)
        m_new = max(m, rowmax(S));  alpha = 2^((m - m_new) * c);  P = 2^(S * c - m_new * c)
        l = alpha * l + rowsum(P);  O = alpha * O + P V_j   (WGMMA, P from registers)
    O / l -> shared -> global (TMA store; rows past Sq clipped by the TMA unit);  lse = m * scale + ln l

with c = scale * log2(e) folded on the host (exp2, one FFMA per score: step 05's EXP2 switch). The
contract is the course's (docs/DESIGN.md; facourse.reference): q [B, Hq, Sq, D], k, v [B, Hkv, Skv, D],
query head h reads KV head h // (Hq // Hkv) (GQA), causal bottom-right aligned (key j visible to
query i iff j <= i + Skv - Sq), (o in q's dtype, lse float32 natural log). Lengths need not be
multiples of the tiles: the TMA unit zero-fills a tile's rows past Sq or Skv, the mask sets the
scores of keys past Skv to -inf, and stores past Sq are clipped (O) or guarded (lse). A row that sees
no key keeps m = -inf: its exponentials use 0 in place of m (2^-inf = 0, never inf - inf = NaN), its
l stays 0, and the epilogue writes o = 0 and lse = -inf.

The causal stage split (step 05's v3) is here a bound and a test: the loop stops at the last tile
that any row of Q_i sees (tiles above the diagonal are never loaded), and only the tiles from the
first one that crosses the diagonal (or is ragged) on are masked; the tiles before run unmasked.
Causal query tiles run longest first (blockIdx.x = 0 takes the last tile), as in step 05.

One kernel serves every shape: B, Hq, Hkv, Sq and Skv are symbolic (T.dynamic), so a kernel is
compiled once per (dtype, D, causal, tiles), not per shape; the scale is a kernel argument.

Tiles (TILES below), chosen for the H100 and to be confirmed by gpu_try.py's sweep: BLOCK_M = BLOCK_N =
128 with two consumer warpgroups (threads=256; TileLang adds the producer warpgroup: 384 threads),
each warpgroup owning 64 query rows, the shape of one m64n128k16 WGMMA per 16 columns of D
(GemmWarpPolicy.FullRow: every warpgroup a full row band, so row max and sum stay inside it). Shared
memory for D = 128: Q 32 KB (reused for O's staging) + 2 stages x (K 32 KB + V 32 KB) = 160 KB, one
block per SM (3 stages: 224 KB, just inside the 227 KB an H100 block may have; in the sweep). D = 64
takes 3 stages: 16 + 3 x 32 = 112 KB. Registers per consumer thread: O 64 fp32 + S 64 fp32 + P 32
(fp16 pairs), within the 240 that setmaxnreg gives the consumers (ptxas, sm_90a: 168 at launch, no
spills, for every tile set below). fast_math (nvcc --use_fast_math) leaves one MUFU.EX2 per score and
no exp2f range fix-ups: the D = 128 causal kernel is 1,536 SASS instructions against 2,856 without
it; the division by l (once per row) and the log of lse are the approximate ones then, far inside
the check's tolerance.

What this kernel does not do that FlashAttention-3 does: overlap the softmax of one tile with the
products of the next inside a warpgroup (asynchronous WGMMA with a one-deep wait), and ping-pong
the two consumer warpgroups. Here the tensor cores idle during one warpgroup's softmax unless the
other warpgroup has a product to issue, as in step 05's Triton kernel on Hopper.

Needs tilelang (0.1.15; pip install tilelang==0.1.15: see tools/carry_tilelang.py for the GPU
machine) and, to run, an sm_90 GPU and CUDA's nvcc (TileLang compiles the generated CUDA with it).
``hopper_source`` lowers the kernel for sm_90a and returns the CUDA source without any GPU.
"""

import torch

from facourse.tilelang_kernels import LN2, LOG2E, TILES, Tiles, compile_program
from facourse.tilelang_kernels import hopper_source as _hopper_source

HEAD_DIMS = (64, 128)
DTYPES = {torch.float16: "float16", torch.bfloat16: "bfloat16"}

#: Tiles by head dimension: facourse.tilelang_kernels.TILES (H100; D = 64 takes a third stage: its tiles
#: are half the bytes, 16 + 3 x 32 = 112 KB, and half the work). FORCE_TILES, when set, overrides the
#: table (gpu_try.py's sweep).
FORCE_TILES: Tiles | None = None

#: The candidates gpu_try.py times on `large` and `long` (fp16, D = 128) to settle TILES[128]: the
#: table's pick; a third stage (224 KB of shared memory); 64-key tiles (half of S's registers, twice
#: the loop trips) with 2 and 3 stages; the table's pick without fast math (exp2f's exact sequence).
#: All build for sm_90a without spills (ptxas: 168 registers at launch, 240 per consumer thread).
SWEEP_TILES = (Tiles(128, 128, 2, 256), Tiles(128, 128, 3, 256), Tiles(128, 64, 2, 256), Tiles(128, 64, 3, 256),
               Tiles(128, 128, 2, 256, fast_math=False))


#: Head dims whose [B, S, H, D] storage the kernel reads in place (a kernel of its own per layout);
#: other head dims copy such inputs to [B, H, S, D] first.
BSHD_DIMS = (128,)


def planned_kernels(sweep: bool = True) -> list[tuple]:
    """Every (dtype, D, causal, tiles[, layout]) gpu_try.py and the step's traces run: the table's tiles
    for both dtypes, both head dims, causal and not, in the course's layout and (D = 128) in [B, S, H, D];
    the sweep's for fp16, D = 128 (tools/carry_tilelang.py builds them ahead)."""
    ks = [(dt, D, c, TILES[D]) for dt in DTYPES.values() for D in HEAD_DIMS for c in (True, False)]
    ks += [(dt, D, c, TILES[D], "bshd") for dt in DTYPES.values() for D in BSHD_DIMS for c in (True, False)]
    if sweep:
        ks += [("float16", 128, c, t) for t in SWEEP_TILES for c in (True, False) if t != TILES[128]]
    return ks


def pick_tiles(D: int) -> Tiles:
    return FORCE_TILES if FORCE_TILES is not None else TILES[D]


def _ceildiv(a, b):
    return -(-a // b)


def tile_range(row0, Sq, Skv, causal: bool, BM: int, BN: int,
               mn=min, mx=max, cdiv=_ceildiv, fdiv=lambda a, b: a // b):
    """(n_end, n_full) of the query tile whose first row is ``row0``: its K/V loop runs over tiles
    0 .. n_end - 1 and masks tiles n_full .. n_end - 1.

    n_end: one past the last tile that any row of the query tile sees (at least 1: a query tile whose
    rows see no key loads one tile, all masked, and writes o = 0, lse = -inf). n_full: the tiles
    before it are wholly visible to every row of the query tile and hold no key past Skv; it is at
    most n_end. Called with Python's integer operations by the CPU test (tests/test_step11_tilelang.py)
    and with TileLang's (T.min, T.max, T.ceildiv, T.floordiv) on symbolic values inside the kernel.
    """
    n_kv = cdiv(Skv, BN)
    if not causal:
        return n_kv, fdiv(Skv, BN)
    off = Skv - Sq                                  # bottom-right: key j visible to row i iff j <= i + off
    n_end = mx(mn(n_kv, cdiv(row0 + BM + off, BN)), 1)
    n_full = mn(fdiv(row0 + off + 1, BN), fdiv(Skv, BN))   # tile t wholly visible: t*BN + BN - 1 <= row0 + off
    return n_end, n_full


def fa_forward_program(T, dtype: str, D: int, causal: bool, tiles: Tiles, layout: str = "bhsd"):
    """The TileLang program (a TIR PrimFunc) of the forward for one dtype, head dim and causal flag.

    Arguments: Q, K, V, O, LSE, qk_scale (= scale * log2 e); shapes symbolic. ``layout``: how Q, K, V
    and O are stored, contiguous: "bhsd" ([B, H, S, D], the course's) or "bshd" ([B, S, H, D], the
    layout of FlashInfer's definitions and of most models). Only the TMA boxes' place differs: a tile
    of BM rows of one head is rows row0.. of [S, D] in one, every H-th row of [S*H, D] in the other.
    ``T`` is the language: tilelang.language, or facourse.tilelang_cpu (the CPU stand-in that runs it
    on CPU tensors: tests/test_step11_tilelang.py).
    """
    BM, BN, stages, threads = tiles.block_m, tiles.block_n, tiles.num_stages, tiles.threads
    acc = "float32"
    B, Hq, Hkv, Sq, Skv = T.dynamic("B, Hq, Hkv, Sq, Skv")
    NEG_INF = -T.infinity(acc)
    bshd = {"bhsd": False, "bshd": True}[layout]
    q_shape, kv_shape = ([B, Sq, Hq, D], [B, Skv, Hkv, D]) if bshd else ([B, Hq, Sq, D], [B, Hkv, Skv, D])

    def rows(X, b, h, r0, n):           # rows r0 .. r0 + n - 1 of head h (a TMA box), in either layout
        return X[b, r0:r0 + n, h, :] if bshd else X[b, h, r0:r0 + n, :]

    @T.prim_func
    def fa_fwd(Q: T.Tensor(q_shape, dtype), K: T.Tensor(kv_shape, dtype), V: T.Tensor(kv_shape, dtype),
               O: T.Tensor(q_shape, dtype), LSE: T.Tensor([B, Hq, Sq], acc), qk_scale: T.float32):
        with T.Kernel(T.ceildiv(Sq, BM), Hq, B, threads=threads) as (bx, h, b):
            q_s = T.alloc_shared([BM, D], dtype)
            k_s = T.alloc_shared([BN, D], dtype)
            v_s = T.alloc_shared([BN, D], dtype)
            o_s = T.alloc_shared([BM, D], dtype)
            s = T.alloc_fragment([BM, BN], acc)         # scores, then probabilities (fp32)
            p = T.alloc_fragment([BM, BN], dtype)       # probabilities in the input dtype, for P V
            o = T.alloc_fragment([BM, D], acc)          # output accumulator
            m = T.alloc_fragment([BM], acc)             # running row max (unscaled scores)
            m_prev = T.alloc_fragment([BM], acc)
            m_c = T.alloc_fragment([BM], acc)           # m * c, or 0 while the row has seen no key
            alpha = T.alloc_fragment([BM], acc)         # 2^((m_old - m_new) * c): rescales l and O
            row_sum = T.alloc_fragment([BM], acc)
            l = T.alloc_fragment([BM], acc)             # running row sum of P

            kvh = h // (Hq // Hkv)                                  # GQA: the KV head of query head h
            tile = (T.ceildiv(Sq, BM) - 1 - bx) if causal else bx  # causal: longest tiles first
            row0 = tile * BM
            off = Skv - Sq                                          # bottom-right: j <= i + off
            n_end, n_full = tile_range(row0, Sq, Skv, causal, BM, BN, T.min, T.max, T.ceildiv, T.floordiv)
            T.copy(rows(Q, b, h, row0, BM), q_s)
            T.fill(o, 0)
            T.fill(l, 0)
            T.fill(m, NEG_INF)
            for j in T.Pipelined(n_end, num_stages=stages):
                T.copy(rows(K, b, kvh, j * BN, BN), k_s)
                T.gemm(q_s, k_s, s, transpose_B=True, clear_accum=True, policy=T.GemmWarpPolicy.FullRow)
                if j >= n_full:                                     # ragged or on the diagonal
                    for r, c in T.Parallel(BM, BN):
                        key = j * BN + c
                        visible = (key < Skv) and (key <= row0 + r + off) if causal else key < Skv
                        s[r, c] = T.if_then_else(visible, s[r, c], NEG_INF)
                T.copy(m, m_prev)
                T.reduce_max(s, m, dim=1, clear=False)              # m = max(m_prev, rowmax(S))
                for r in T.Parallel(BM):
                    m_c[r] = T.if_then_else(m[r] == NEG_INF, 0, m[r] * qk_scale)
                    alpha[r] = T.exp2(m_prev[r] * qk_scale - m_c[r])
                for r, c in T.Parallel(BM, BN):
                    s[r, c] = T.exp2(s[r, c] * qk_scale - m_c[r])  # P = exp(scale * S - scale * m)
                T.reduce_sum(s, row_sum, dim=1)
                for r in T.Parallel(BM):
                    l[r] = l[r] * alpha[r] + row_sum[r]
                T.copy(s, p)
                for r, c in T.Parallel(BM, D):
                    o[r, c] *= alpha[r]
                T.copy(rows(V, b, kvh, j * BN, BN), v_s)
                T.gemm(p, v_s, o, policy=T.GemmWarpPolicy.FullRow)
            for r, c in T.Parallel(BM, D):
                o[r, c] = T.if_then_else(l[r] > 0, o[r, c] / l[r], 0)  # a row with no key: 0
            T.copy(o, o_s)
            T.copy(o_s, rows(O, b, h, row0, BM))                     # TMA store: rows >= Sq clipped
            for r in T.Parallel(BM):
                if row0 + r < Sq:
                    LSE[b, h, row0 + r] = T.if_then_else(l[r] > 0, m[r] * qk_scale * LN2 + T.log(l[r]), NEG_INF)

    return fa_fwd


def compile_kernel(dtype: str, D: int, causal: bool, tiles: Tiles, layout: str = "bhsd"):
    """The compiled kernel (facourse.tilelang_kernels.compile_program: cached per process and on disk)."""
    return compile_program(fa_forward_program, dtype, D, causal, tiles, (("layout", layout),))


compile_kernel.cache_clear = compile_program.cache_clear


def hopper_source(dtype: str = "float16", D: int = 128, causal: bool = True, tiles: Tiles | None = None,
                  layout: str = "bhsd") -> str:
    """The kernel lowered for sm_90a, as CUDA source; needs tilelang, no GPU and no nvcc."""
    return _hopper_source(fa_forward_program, dtype, D, causal, tiles, (("layout", layout),))


def _tma_ready(t: torch.Tensor) -> torch.Tensor:
    """Contiguous [B, H, S, D] with a 16-byte aligned base: what the TMA descriptors need."""
    t = t.contiguous()
    return t if t.data_ptr() % 16 == 0 else t.clone()


def _bshd_storage(*ts: torch.Tensor) -> bool:
    """Whether every [B, H, S, D] tensor is a view of contiguous [B, S, H, D] storage (the layout of
    FlashInfer's definitions and of most models), 16-byte aligned, and not also contiguous as is."""
    return (all(t.transpose(1, 2).is_contiguous() and t.data_ptr() % 16 == 0 for t in ts)
            and not all(t.is_contiguous() for t in ts))


def flash_attention_tilelang(q, k, v, causal=False, scale=None):
    """FlashAttention-2 forward in TileLang. q [B,Hq,Sq,D], k/v [B,Hkv,Skv,D] (fp16/bf16, D 64 or 128).

    Returns (o in q's dtype, lse float32 [B, Hq, Sq], natural log). Any strides: views of contiguous
    [B, S, H, D] storage are read in place for D in BSHD_DIMS (o is then such a view too); other
    non-contiguous inputs are copied to contiguous [B, H, S, D] first.
    """
    from facourse.reference import AttentionInputError, default_scale, validate_inputs

    validate_inputs(q, k, v, scale, head_dims=HEAD_DIMS)
    if q.dtype not in DTYPES:
        raise AttentionInputError(f"the TileLang kernel takes fp16 or bf16, got {q.dtype}")
    if q.device.type != "cuda":
        raise AttentionInputError("the TileLang kernel runs on an NVIDIA GPU (sm_90); q is on "
                                  f"{q.device}. hopper_source() shows its code on a CPU")
    B, Hq, Sq, D = q.shape
    Skv = k.shape[2]
    bshd = D in BSHD_DIMS and _bshd_storage(q, k, v)
    o = torch.empty((B, Sq, Hq, D) if bshd else (B, Hq, Sq, D), dtype=q.dtype, device=q.device)
    lse = torch.empty((B, Hq, Sq), dtype=torch.float32, device=q.device)
    if bshd:
        o = o.transpose(1, 2)                     # [B, Hq, Sq, D], a view of [B, Sq, Hq, D] storage
    if Sq == 0 or B == 0:
        return o, lse
    if Skv == 0:                                  # no key at all: every row is empty
        return o.zero_(), lse.fill_(float("-inf"))
    qk_scale = default_scale(D, scale) * LOG2E
    if bshd:
        kernel = compile_kernel(DTYPES[q.dtype], D, bool(causal), pick_tiles(D), "bshd")
        kernel(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), o.transpose(1, 2), lse, qk_scale)
        return o, lse
    kernel = compile_kernel(DTYPES[q.dtype], D, bool(causal), pick_tiles(D))
    kernel(_tma_ready(q), _tma_ready(k), _tma_ready(v), o, lse, qk_scale)
    return o, lse


if __name__ == "__main__":
    import sys

    D = int(sys.argv[1]) if len(sys.argv) > 1 else 128
    src = hopper_source("float16", D, causal=True)
    print(src)
    print(f"// {len(src.splitlines())} lines; D = {D}, causal, fp16, tiles {TILES[D].label()}", file=sys.stderr)
