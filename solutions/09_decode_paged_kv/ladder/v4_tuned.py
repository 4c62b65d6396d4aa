"""v4: v3 tuned for memory bandwidth on an H100 (sm_90): autotuned tiles and warps, more splits
where the grid is small, page-aware tiles, unmasked tiles away from the sequence's end, and no
merge at all when one split suffices.

v4 verdict: 2945-2992 GB/s at 64 x 8k and 16 x 32k, pages of 16 and 64 (98-99% of a 3.0 TB/s
copy; 0.97-1.00x cuDNN, 0.99-1.11x FA2), 2699-2711 GB/s at 1 x 128k (90%; 1.03-1.04x FA2, 7.3x cuDNN)
(H100, fp16, benchmarks/results/2026-11-23_h100_step09.json).

Decode reads every key and value once and does ~2 FLOPs per byte: its time is the bytes of K and V
divided by the bandwidth the kernel reaches, so every choice below is about keeping enough loads in
flight on every SM, and issuing as few instructions per byte as possible.

* Autotuned (GPU only) over 8 configurations (CONFIGS: BLOCK_N 32/64/128, num_warps 2/4,
  num_stages 1-4), keyed on the page size, D, the packed rows (ROWS >= G * Sq), DIRECT and the split
  length rounded up to a power of two, so that a new batch of the same kind reuses its tuning; a
  new key costs a few seconds (compiling the 8 variants, then ~1 s of timing). This is the choice
  that matters most (see the sweep below): with 16 packed rows (GQA 32/8 pads 4 rows to 16) the
  tensor-core work is tiny, and 64 keys with 2 warps and 2-3 stages of loads in flight beat v3's
  fixed 4 warps by 20% at 64 x 8k, most likely because more programs then share an SM. num_stages 1 (no shared-memory pipeline; latency hidden by occupancy alone)
  wins some long single-sequence shapes. The interpreter runs one configuration
  (INTERPRET_CONFIG), no tuning; FORCE_CONFIG skips the tuner (for sweeps).
* Splits (common.split_plan, WAVES = 4): about 4 * SMs programs over the B * Hkv groups (GQA-packed,
  as in v3), rounded, at most 64 splits. B = 1, Hkv = 8 at 128k: 61 splits of 2176 keys (the
  table is one page wider than 128k), 488 programs, several per SM at once, so each SM has loads outstanding while its other programs
  compute; B = 16 at 32k (128 groups): 4 splits; B = 64 at 8k (512 groups, already ~4 per SM): 1.
* No merge when num_splits == 1 (DIRECT): the split kernel normalises and writes o and lse itself,
  saving a launch and the float32 partial states (the large-batch cases). Otherwise the partial
  states go to the exercise's merge kernel (common.merge: the same as v2's and v3's).
* Split boundaries are multiples of 128 keys (GRANULE, the largest BLOCK_N), so that the autotuner
  can pick any BLOCK_N without changing the split plan, and a tile never straddles a split.
* Page-aware tiles when page_size is a power of two (PAGE, a constexpr). A tile starts at a multiple
  of BLOCK_N, so with page_size >= BLOCK_N it lies inside one page: one table entry (a scalar load)
  gives the page and its rows are consecutive, a base plus a stride. With page_size < BLOCK_N each
  key still names its entry (key >> log2(page_size), row = key & (page_size - 1): a shift and a mask,
  not a division), and the page_size keys of a page read the same entry, which the load unit
  broadcasts. A page size that is no power of two (48) keeps v3's division per key. (Building the
  tile from BLOCK_N / page_size entries and a tl.reshape of [pages, page_size] offsets was tried:
  15% slower at pages of 16 on an H100, the reshape costs a layout conversion per tile.)
* Unmasked tiles: a tile entirely below both the split's end and seq_len - Sq + 1 is visible to
  every row: its table and K/V loads carry no mask and its scores no causal `where` or -inf guard.
  Only the last one or two tiles of a split (the sequence's end, the Sq - 1 causal keys) are
  masked. Loads are still never issued past seq_len: NaN rows stay unread.
* exp2 with the scale folded in: scores are multiplied once by scale * log2(e), and the online
  softmax and the partial LSE are in base 2 (one ex2 per element, no extra multiply).

What tuning showed (an exploratory sweep on the H100 while this rung was written; the kept figures
are the runner's, in the verdict): the tile configuration is what matters (64 keys with 2 warps and
2-3 stages of loads in flight, against v3's fixed 64 keys with 4 warps: 2963 GB/s against 2427 on
64 x 8k with pages of 16 in the committed run), the number of splits matters little between 2 and 8
waves, and page-aware tiles read no faster than the per-key lookup: the table is small and cached,
the bytes of K and V are all that count.

Run on its own:  python v4_tuned.py   (TRITON_INTERPRET=1 on a machine without a GPU)
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import decode_common as common  # noqa: E402 (sets up the interpreter without a GPU, before triton is imported)

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

WAVES = 4              # programs per SM the split plan aims for
MAX_SPLITS = 64
GRANULE = 128          # split boundaries: multiples of the largest BLOCK_N

CONFIGS = [triton.Config({"BLOCK_N": n}, num_warps=w, num_stages=s) for n, w, s in (
    (32, 2, 3), (32, 2, 4), (64, 2, 1), (64, 2, 2), (64, 2, 3), (64, 4, 1), (64, 4, 2), (128, 4, 3))]
INTERPRET_CONFIG = {"BLOCK_N": 128}     # fewer, larger NumPy operations in the interpreter
TUNE_KEY = ["PAGE", "D", "ROWS", "DIRECT", "split_bucket"]
FORCE_CONFIG = None    # a dict {"BLOCK_N", "num_warps", "num_stages"}: skip the autotuner (tuning scripts)
PAGE_AWARE = True      # False: v3's per-key gather for every page size (for comparison)


@triton.jit
def _tile(q, m_i, l_i, acc, K, V, TABLE, tb, n0, end, L, kvh, tok,
          skp, skr, skh, svp, svr, svh, page_size, qk_scale,
          PAGE: tl.constexpr, SQ: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr,
          MASKED: tl.constexpr):
    """One tile of keys [n0, n0 + BLOCK_N) into the online softmax of the packed rows (base 2).
    MASKED=False: the caller guarantees every key is < end <= L and visible to every row."""
    offs_n = n0 + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    inside = offs_n < end
    if PAGE >= BLOCK_N:                 # the tile lies in one page: one entry, consecutive rows
        page = tl.load(TABLE + tb + n0 // PAGE).to(tl.int64)   # n0 < end <= L: a page of the sequence
        row = n0 % PAGE + tl.arange(0, BLOCK_N)
    else:                               # one entry per key: PAGE keys read the same entry (broadcast)
        if PAGE == 0:                   # no power of two: a division per key
            ent = offs_n // page_size
            row = offs_n % page_size
        else:                           # a power of two: a shift and a mask per key
            ent = offs_n // PAGE
            row = offs_n % PAGE
        if MASKED:
            page = tl.load(TABLE + tb + ent, mask=inside, other=0).to(tl.int64)
        else:
            page = tl.load(TABLE + tb + ent).to(tl.int64)
    k_off = page * skp + row * skr
    v_off = page * svp + row * svr
    k_ptr = K + k_off[:, None] + kvh * skh + offs_d[None, :]
    v_ptr = V + v_off[:, None] + kvh * svh + offs_d[None, :]
    if MASKED:
        k = tl.load(k_ptr, mask=inside[:, None], other=0.0)
        v = tl.load(v_ptr, mask=inside[:, None], other=0.0)
    else:
        k = tl.load(k_ptr)
        v = tl.load(v_ptr)
    s = tl.dot(q, tl.trans(k)) * qk_scale
    if MASKED:
        keep = inside[None, :] & (offs_n[None, :] <= tok[:, None] + L - SQ)    # bottom-right causal
        s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)                 # a row with no key yet
    else:
        m_new = tl.maximum(m_i, tl.max(s, 1))                                # finite: every key visible
        m_use = m_new
    alpha = tl.math.exp2(m_i - m_use)
    p = tl.math.exp2(s - m_use[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
    return m_new, l_i, acc


@triton.jit
def split_kv_kernel(Q, K, V, TABLE, LENS, O_PART, LSE_PART, O, LSE,
                    sqb, sqh, sqs, skp, skr, skh, svp, svr, svh, stb, sob, soh, sos,
                    Hq, Sq, page_size, split_len, num_splits, qk_scale, split_bucket,
                    G: tl.constexpr, SQ: tl.constexpr, ROWS: tl.constexpr, D: tl.constexpr,
                    PAGE: tl.constexpr, DIRECT: tl.constexpr, BLOCK_N: tl.constexpr):
    split = tl.program_id(0)
    b = tl.program_id(1) // (Hq // G)
    kvh = tl.program_id(1) % (Hq // G)
    L = tl.load(LENS + b).to(tl.int32)
    rows = tl.arange(0, ROWS)
    head = kvh * G + rows // SQ
    tok = rows % SQ
    live = rows < G * SQ
    offs_d = tl.arange(0, D)
    q = tl.load(Q + b.to(tl.int64) * sqb + head[:, None] * sqh + tok[:, None] * sqs + offs_d[None, :],
                mask=live[:, None], other=0.0)
    tb = b.to(tl.int64) * stb
    start = split * split_len
    end = tl.minimum(start + split_len, L)
    # tiles [start, full_end) are below end and below L - SQ + 1 (visible to every row): no masks
    full_end = start + tl.maximum(tl.minimum(end, L - SQ + 1) - start, 0) // BLOCK_N * BLOCK_N
    m_i = tl.full([ROWS], float("-inf"), tl.float32)
    l_i = tl.zeros([ROWS], tl.float32)
    acc = tl.zeros([ROWS, D], tl.float32)
    for n0 in range(start, full_end, BLOCK_N):
        m_i, l_i, acc = _tile(q, m_i, l_i, acc, K, V, TABLE, tb, n0, end, L, kvh, tok,
                              skp, skr, skh, svp, svr, svh, page_size, qk_scale,
                              PAGE=PAGE, SQ=SQ, D=D, BLOCK_N=BLOCK_N, MASKED=False)
    for n0 in range(full_end, end, BLOCK_N):
        m_i, l_i, acc = _tile(q, m_i, l_i, acc, K, V, TABLE, tb, n0, end, L, kvh, tok,
                              skp, skr, skh, svp, svr, svh, page_size, qk_scale,
                              PAGE=PAGE, SQ=SQ, D=D, BLOCK_N=BLOCK_N, MASKED=True)
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    lse2 = tl.where(l_i == 0.0, float("-inf"), m_i + tl.math.log2(l_safe))
    if DIRECT:                          # one split: the final o and lse (natural log), no merge
        tl.store(O + b.to(tl.int64) * sob + head[:, None] * soh + tok[:, None] * sos + offs_d[None, :],
                 (acc / l_safe[:, None]).to(O.dtype.element_ty), mask=live[:, None])
        tl.store(LSE + (b * Hq + head).to(tl.int64) * Sq + tok, lse2 * 0.6931471805599453, mask=live)
    else:                               # the merge's layout: [B, Hq, Sq, num_splits], base 2
        part = ((b * Hq + head).to(tl.int64) * Sq + tok) * num_splits + split
        tl.store(O_PART + part[:, None] * D + offs_d[None, :], acc / l_safe[:, None], mask=live[:, None])
        tl.store(LSE_PART + part, lse2, mask=live)


split_kv_tuned = None if common.INTERPRET else triton.autotune(configs=CONFIGS, key=TUNE_KEY)(split_kv_kernel)
merge_partials = common.merge           # (o_part, lse_part, o, lse, num_splits): the exercise's merge


def paged_decode(q, k_cache, v_cache, block_table, seq_lens, scale=None):
    """(o, lse) of the last Sq tokens of each sequence against its paged keys and values: v3's packed
    GQA groups, tuned tiles, and one pass with no merge when a single split fills the GPU."""
    o, lse, scale = common.prepare(q, k_cache, v_cache, block_table, seq_lens, scale)
    B, Hq, Sq, D = q.shape
    page_size, Hkv = k_cache.shape[1], k_cache.shape[2]
    G = Hq // Hkv
    if B * Hq * Sq == 0:
        return o, lse
    num_splits, split_len = common.split_plan(block_table.shape[1] * page_size, B * Hkv,
                                              WAVES * common.sm_count(q.device), GRANULE, MAX_SPLITS)
    direct = num_splits == 1
    if direct:
        o_part = lse_part = o           # not read: DIRECT writes o and lse
    else:
        o_part = torch.empty((B, Hq, Sq, num_splits, D), device=q.device, dtype=torch.float32)
        lse_part = torch.empty((B, Hq, Sq, num_splits), device=q.device, dtype=torch.float32)
    args = (q, k_cache, v_cache, block_table, seq_lens, o_part, lse_part, o, lse, *q.stride()[:3],
            *k_cache.stride()[:3], *v_cache.stride()[:3], block_table.stride(0), *o.stride()[:3],
            Hq, Sq, page_size, split_len, num_splits, scale * common.LOG2E, triton.next_power_of_2(split_len))
    meta = dict(G=G, SQ=Sq, ROWS=max(16, triton.next_power_of_2(G * Sq)), D=D, DIRECT=direct,
                PAGE=page_size if PAGE_AWARE and page_size & (page_size - 1) == 0 else 0)
    grid = (num_splits, B * Hkv)
    if split_kv_tuned is None or FORCE_CONFIG is not None:
        split_kv_kernel[grid](*args, **meta, **(FORCE_CONFIG or INTERPRET_CONFIG))
    else:
        split_kv_tuned[grid](*args, **meta)
    if not direct:
        merge_partials(o_part, lse_part, o, lse, num_splits)
    return o, lse


if __name__ == "__main__":
    from facourse.decode import check_paged_decode
    for case in ("mixed", "page64", "page48", "prefix", "mqa", "spec", "d64"):
        check_paged_decode(paged_decode, case, seed=0)
