"""v4: v3's block-mask kernel tuned for the H100: TMA loads, exp2 folded into the scale, a tile table.

The semantics are v3's (the listed partial tiles with the score modifier, the mask and the bounds,
then the listed full tiles with the score modifier; exactly the listed tiles). What changes, and why:

- Q, K, V and O through host-side 4-D tensor descriptors (step 05's v6): the TMA unit fetches whole
  tiles and fills rows past Sq or Skv with zeros, so no load needs a mask and the addresses are not
  computed per element.
- exp2 with log2(e) folded into the scale: without a score modifier the logits are never formed in
  natural units, S is scaled once inside the exp2's argument (one FMA per element); with one, the
  score modifier gets scale * q . k and its result is scaled by log2(e).
- The bounds check (key j < Skv) is compiled in only when Skv is not a multiple of BLOCK_N.
- Query tiles launched last first: the course's masks (causal, prefix-LM, documents) give later query
  tiles more key tiles, so the longest programs start first and the short ones fill the tail.
- Full tiles that form one run (most query tiles of a window, causal, prefix-LM) go through a counted
  loop over that run, which Triton's pipeliner issues stages ahead as in step 05; other lists through
  index loads. Measured on an H100 with the block mask given: 1024 window at 8k 234 -> 279 TFLOP/s,
  causal 8k 361 -> 452 (128 x 64 tiles, 8 warps, 3 stages).
- Tiles, warps and stages from a table (the block mask's tiles decide BLOCK_M x BLOCK_N when one is
  given); FORCE_TILES overrides it for a sweep.
"""
import os
import sys

sys.path.append(os.path.dirname(os.path.abspath(__file__)))
import variants_common as vc  # noqa: E402  (sets up the interpreter without a GPU, before triton)

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: E402

INTERPRET = vc.interpret_without_gpu()

# (BLOCK_M, BLOCK_N) -> (num_warps, num_stages), for the block mask's tiles; DEFAULT_TILES when the
# kernel builds its own block mask. Measured on an H100 (fp16, D = 128, block mask given; 2026-11-23):
# 128 x 64 with 8 warps and 3 stages was the best of 128 x 64 (2, 3 stages), 128 x 128 (1 stage; 2 and
# 3 run out of shared memory with two pipelined loops) and 64 x 64 (4 warps) on a 1024 window at 8k
# and 16k and on causal at 8k.
LAUNCH = {(128, 64): (8, 3), (128, 128): (8, 1), (64, 64): (4, 3), (64, 128): (4, 2)}
DEFAULT_TILES = (128, 64)
PORTABLE_TILES = (64, 64)                    # before Hopper (less shared memory), and D > 128
INTERPRET_TILES = (64, 64)
FORCE_TILES = None                           # (BLOCK_M, BLOCK_N, num_warps, num_stages) for a sweep


@triton.jit
def attend_tile(acc, m_i, l_i, q, k_desc, v_desc, b, h, h_kv, start_n, i, Sq, Skv, scale,
                MASK_INTS, MASK_FLOATS, SCORE_INTS, SCORE_FLOATS, mask: tl.constexpr, score_mod: tl.constexpr,
                PARTIAL: tl.constexpr, HAS_SCORE_MOD: tl.constexpr, EVEN_N: tl.constexpr,
                D: tl.constexpr, BLOCK_N: tl.constexpr):
    """One key tile: S, score_mod, (partial tiles:) the mask, the base-2 online-softmax update."""
    k = k_desc.load([b, h_kv, start_n, 0]).reshape(BLOCK_N, D)      # rows past Skv read 0
    v = v_desc.load([b, h_kv, start_n, 0]).reshape(BLOCK_N, D)
    s = tl.dot(q, k.T)
    j = start_n + tl.arange(0, BLOCK_N)[None, :]
    if HAS_SCORE_MOD:
        s = score_mod(s * scale, b, h, i, j, Sq, Skv, SCORE_INTS, SCORE_FLOATS)
        qk_scale = 1.4426950408889634                               # natural units -> log2 units
    else:
        qk_scale = scale * 1.4426950408889634                       # scale and log2(e) in one factor
    if PARTIAL:
        keep = mask(b, h, i, j, Sq, Skv, MASK_INTS, MASK_FLOATS)
        if not EVEN_N:
            keep = keep & (j < Skv)
        s = tl.where(keep, s, float("-inf"))
    elif not EVEN_N:                                                # a ragged tile listed as full
        s = tl.where(j < Skv, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)            # a row that has seen no key yet
    p = tl.math.exp2(s * qk_scale - m_use[:, None])
    alpha = tl.math.exp2(m_i - m_use)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
    return acc, m_new, l_i


@triton.jit
def flex_fwd_tuned(Q, K, V, O, LSE, PARTIAL_NUM, PARTIAL_IDX, FULL_NUM, FULL_IDX, Bm, Hm,
                   MASK_INTS, MASK_FLOATS, SCORE_INTS, SCORE_FLOATS, Hq, Sq, Skv, scale,
                   mask: tl.constexpr, score_mod: tl.constexpr, HAS_SCORE_MOD: tl.constexpr,
                   EVEN_N: tl.constexpr, GROUP: tl.constexpr, D: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Q, K, V, O: 4-D descriptors [B, H, S, D] with [1, 1, BLOCK, D] tiles."""
    Tq = tl.cdiv(Sq, BLOCK_M)
    pid_m = Tq - 1 - tl.program_id(0)                               # last query tile first
    bh, b, h, h_kv, start_m, i = vc.query_tile(pid_m, Hq, GROUP, BLOCK_M)
    q = Q.load([b, h, start_m, 0]).reshape(BLOCK_M, D)

    row = ((b % Bm) * Hm + h % Hm) * Tq + pid_m
    Tk = tl.cdiv(Skv, BLOCK_N)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    for t in range(0, tl.load(PARTIAL_NUM + row)):
        start_n = tl.load(PARTIAL_IDX + row * Tk + t) * BLOCK_N
        acc, m_i, l_i = attend_tile(acc, m_i, l_i, q, K, V, b, h, h_kv, start_n, i, Sq, Skv, scale,
                                    MASK_INTS, MASK_FLOATS, SCORE_INTS, SCORE_FLOATS, mask, score_mod,
                                    True, HAS_SCORE_MOD, EVEN_N, D, BLOCK_N)
    n_full = tl.load(FULL_NUM + row)
    first = tl.load(FULL_IDX + row * Tk)
    last = tl.load(FULL_IDX + row * Tk + tl.maximum(n_full - 1, 0))
    if last - first == n_full - 1:
        # the full tiles are one run (the lists are ascending, without repeats): a counted loop whose
        # loads the pipeliner can issue stages ahead, as step 05's; no index load in its way
        for start_n in tl.range(first * BLOCK_N, (first + n_full) * BLOCK_N, BLOCK_N):
            acc, m_i, l_i = attend_tile(acc, m_i, l_i, q, K, V, b, h, h_kv, start_n, i, Sq, Skv, scale,
                                        MASK_INTS, MASK_FLOATS, SCORE_INTS, SCORE_FLOATS, mask, score_mod,
                                        False, HAS_SCORE_MOD, EVEN_N, D, BLOCK_N)
    else:
        for t in range(0, n_full):
            start_n = tl.load(FULL_IDX + row * Tk + t) * BLOCK_N
            acc, m_i, l_i = attend_tile(acc, m_i, l_i, q, K, V, b, h, h_kv, start_n, i, Sq, Skv, scale,
                                        MASK_INTS, MASK_FLOATS, SCORE_INTS, SCORE_FLOATS, mask, score_mod,
                                        False, HAS_SCORE_MOD, EVEN_N, D, BLOCK_N)

    o, lse = vc.finish(acc, m_i, l_i)
    O.store([b, h, start_m, 0], o.to(O.dtype).reshape(1, 1, BLOCK_M, D))   # rows past Sq clipped
    tl.store(LSE + bh.to(tl.int64) * Sq + i, lse[:, None], mask=i < Sq)


def pick_tiles(D, block_mask):
    """(BLOCK_M, BLOCK_N, num_warps, num_stages): the block mask's tiles when given, else the table's."""
    if FORCE_TILES is not None:
        return FORCE_TILES
    if block_mask is not None:
        tiles = (block_mask.BLOCK_M, block_mask.BLOCK_N)
    elif INTERPRET:
        tiles = INTERPRET_TILES
    elif D > 128 or torch.cuda.get_device_capability()[0] < 9:
        tiles = PORTABLE_TILES
    else:
        tiles = DEFAULT_TILES
    return (*tiles, *LAUNCH.get(tiles, (4, 2)))


def flex_attention_triton(q, k, v, mask=None, score_mod=None, scale=None, block_mask=None):
    """Attention with a mask and a score modifier (facourse.variants.Mod, or None) that visits only
    the tiles ``block_mask`` lists (built from ``mask`` when None). q [B, Hq, Sq, D], k and v
    [B, Hkv, Skv, D]. Returns (o, lse)."""
    has_score_mod = score_mod is not None
    o, lse, scale, mask, score_mod = vc.prepare(q, k, v, scale, mask, score_mod)
    B, Hq, Sq, D = q.shape
    Hkv, Skv = k.shape[1], k.shape[2]
    if Sq == 0 or Skv == 0:
        return o, lse
    BLOCK_M, BLOCK_N, num_warps, num_stages = pick_tiles(D, block_mask)
    if block_mask is None:
        block_mask = vc.build_block_mask(mask, B, Hq, Sq, Skv, BLOCK_M, BLOCK_N, q.device)
    assert (block_mask.Sq, block_mask.Skv, block_mask.BLOCK_M, block_mask.BLOCK_N) == (Sq, Skv, BLOCK_M, BLOCK_N), \
        "the block mask was built for other lengths or tiles"
    q, k, v = (t if vc.tma_ready(t) else t.clone(memory_format=torch.contiguous_format) for t in (q, k, v))
    descs = tuple(TensorDescriptor(t, list(t.shape), list(t.stride()), [1, 1, rows, D])
                  for t, rows in ((q, BLOCK_M), (k, BLOCK_N), (v, BLOCK_N), (o, BLOCK_M)))
    launch = {} if INTERPRET else dict(num_warps=num_warps, num_stages=num_stages)
    grid = (triton.cdiv(Sq, BLOCK_M), B * Hq)
    flex_fwd_tuned[grid](*descs, lse, *block_mask.kernel_args(B, Hq, Sq, Skv), *vc.mod_args(mask, score_mod, q.device),
                         Hq, Sq, Skv, scale, mask.fn, score_mod.fn, has_score_mod, Skv % BLOCK_N == 0,
                         Hq // Hkv, D, BLOCK_M, BLOCK_N, **launch)
    return o, lse
