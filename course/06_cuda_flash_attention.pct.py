# %% [markdown]
# # 06 — FlashAttention in CUDA C++: tensor cores, pipelines, swizzles
#
# **The math** is the one of steps 03-05. For a row block $Q_i$ ($B_r$ rows) and key tiles
# $K_j, V_j$ ($B_c$ keys), FlashAttention-2 (Dao, 2023, Algorithm 1) keeps $O_i, m_i, l_i$ on chip:
#
# $$S_{ij} = Q_i K_j^\top \cdot \text{scale},\qquad m_i' = \max(m_i, \operatorname{rowmax} S_{ij}),\qquad
#   P_{ij} = 2^{(S_{ij} - m_i')\log_2 e}$$
# $$l_i' = 2^{(m_i - m_i')\log_2 e}\, l_i + \operatorname{rowsum} P_{ij},\qquad
#   O_i' = 2^{(m_i - m_i')\log_2 e}\, O_i + P_{ij} V_j,\qquad
#   O = O_i / l_i,\ \mathrm{lse}_i = m_i + \log l_i .$$
#
# **What you will learn**: how one warp multiplies 16x16 by 16x8 tiles on tensor cores
# (`mma.sync.aligned.m16n8k16`), which lane holds which element (the *fragment layouts*), how
# `ldmatrix` loads those fragments from shared memory, why the result of $S = QK^\top$ can be fed to
# $PV$ without leaving the registers, how `cp.async` overlaps loads with math, how an XOR swizzle
# removes shared-memory bank conflicts, and which FlashAttention-3 ideas (Shah et al., 2024, sections
# 3.1-3.2: producer/consumer warp specialization, overlapping softmax with the matrix products) carry
# over to any sm_80+ GPU.
#
# Everything below runs on a CPU; the cells that need a GPU say so and skip. The kernels live in
# `solutions/06_cuda_flash_attention/ladder/` (instructors) and the exercise in
# `exercises/06_cuda_flash_attention/`.

# %%
import shutil
import sys
from pathlib import Path

import numpy as np

ROOT = Path.cwd().parent if Path.cwd().name == "course" else Path.cwd()
sys.path.insert(0, str(ROOT / "diagrams"))
import fragments as fr  # the index functions the figures are drawn from

from facourse import gpu_or_skip

# %% [markdown]
# ## 1. One warp, one `mma.sync.m16n8k16`
#
# A warp of 32 lanes computes $C_{16\times 8} \mathrel{+}= A_{16\times16} B_{16\times 8}$. No lane
# holds a whole row: with $g = \text{lane}/4$ and $t = \text{lane} \bmod 4$ (PTX ISA, "Matrix
# Fragments for mma.m16n8k16 with floating point type"), lane $(g, t)$ holds
# $A[g][2t..2t{+}1]$, $A[g{+}8][2t..2t{+}1]$, $A[g][2t{+}8..2t{+}9]$, $A[g{+}8][2t{+}8..2t{+}9]$ (four
# 32-bit registers of two fp16 each), $B[2t..2t{+}1][g]$ and $B[2t{+}8..2t{+}9][g]$, and the fp32
# accumulators $C[g][2t..2t{+}1]$, $C[g{+}8][2t..2t{+}1]$.
#
# ![mma m16n8k16 fragments](../diagrams/mma_m16n8k16_fragments.png)
#
# The emulation below scatters each lane's registers to the matrices with exactly these formulas
# and checks that the tensor-core product is an ordinary matmul.

# %%
rng = np.random.default_rng(0)
A, B = rng.standard_normal((16, 16)), rng.standard_normal((16, 8))
a = np.array([[A[fr.a_coords(lane, i)] for i in range(8)] for lane in range(32)])  # what each lane holds
b = np.array([[B[fr.b_coords(lane, i)] for i in range(4)] for lane in range(32)])
# the warp's product, rebuilt from the lanes' fragments
A2, B2 = np.zeros((16, 16)), np.zeros((16, 8))
for lane in range(32):
    for i in range(8):
        A2[fr.a_coords(lane, i)] = a[lane, i]
    for i in range(4):
        B2[fr.b_coords(lane, i)] = b[lane, i]
C = A2 @ B2
c = np.array([[C[fr.c_coords(lane, i)] for i in range(4)] for lane in range(32)])
print("fragments reproduce A @ B:", np.allclose(C, A @ B), "| lane 5 holds C entries",
      [fr.c_coords(5, i) for i in range(4)])

# %% [markdown]
# ## 2. P never leaves the registers
#
# $S = Q_i K_j^\top$ comes out as C fragments, one per 8 keys. For $O \mathrel{+}= P V$ we need $P$ as an
# A fragment, 16 keys at a time. Compare the two tables: the C fragments of keys $16k..16k{+}7$ and
# $16k{+}8..16k{+}15$ are, lane by lane, the four registers of the A fragment of step $k$. The
# softmax is computed in place and converted to fp16 (`pack2`); no shared memory round trip.

# %%
same = all(fr.a_coords(lane, i) == (fr.c_coords(lane, ((i // 2) % 2) * 2 + i % 2)[0],
                                    fr.c_coords(lane, ((i // 2) % 2) * 2 + i % 2)[1] + 8 * (i // 4))
           for lane in range(32) for i in range(8))
print("C fragments of two 8-key blocks == A fragment of P:", same)

# %% [markdown]
# A row of $S$ lives in the four lanes of a quad (same $g$): the row max and row sum of the online
# softmax are two `__shfl_xor_sync` steps (offsets 1 and 2). FA2's trick: keep $l_i$ as a per-lane
# partial sum and add the four partials once, at the end.
#
# ## 3. `ldmatrix`: fragments straight from shared memory
#
# `ldmatrix.x4` loads four 8x8 matrices: lanes $8i..8i{+}7$ give the addresses of the 8 rows of matrix
# $i$, and register $i$ of lane $L$ receives row $L/4$, columns $2(L \bmod 4), 2(L \bmod 4){+}1$: the
# A/B fragment layout. For $K$ (stored `[key][d]`, which is B's "col" layout) no transpose is needed;
# for $V$ (stored `[key][d]`, row-major B) `.trans` delivers columns instead.
#
# ![ldmatrix](../diagrams/ldmatrix_x4.png)
#
# ## 4. Bank conflicts and the XOR swizzle
#
# Shared memory has 32 banks of 4 bytes. A row of a `[64][128]` fp16 tile is 256 bytes, so the 8 rows
# an `ldmatrix` phase reads at the same column all start in the same bank: an 8-way conflict. Padding
# each row by 16 bytes fixes it at the cost of memory; the XOR swizzle stores 16-byte chunk $c$ of row
# $r$ at chunk $c \oplus (r \bmod 8)$ and costs nothing.
#
# ![swizzle](../diagrams/swizzle_banks.png)

# %% swizzle
D = 128
def swz(r, c):
    return r * D + (((c >> 3) ^ (r & 7)) << 3) + (c & 7)
for name, f in (("row-major", lambda r, c: r * D + c), ("swizzled", swz)):
    groups = {(f(r, 0) * 2 // 16) % 8 for r in range(8)}   # 16-byte bank group of each row's chunk 0
    print(f"{name:10s}: 8 rows of one ldmatrix phase hit {len(groups)} distinct 16-byte bank groups of 8")

# %% [markdown]
# ## 5. The ladder
#
# | rung | idea | why |
# |---|---|---|
# | v1_scalar | K_j, V_j in shared memory, one warp per row, shuffles | correct baseline on CUDA cores |
# | v2_mma | `mma.sync` + `ldmatrix`, softmax in registers, P as A operand | tensor cores |
# | v3_cp_async | 2-stage `cp.async` ring, BLOCK_M = 128 (8 warps x 16 rows), Q in registers | hides HBM latency |
# | v4_swizzle | XOR swizzle, causal tile skipping = the exercise solution | no bank conflicts |
# | v5_warp_specialized | producer warp + mbarrier ring, softmax overlapped with the next $QK^\top$ (FA3 ideas) | section 6 |
# | v6_fa2_tiles_lazy | 4 warps x 32 rows, 2 CTAs per SM, conditional rescale (v5's kernel, another configuration) | section 7 |
#
# The measurements (the cell below) tell a story the "why" column alone does not: tensor cores (v2)
# bring 6.9x over CUDA cores on `large`, but the pipeline (v3) gains nothing while every `ldmatrix`
# read is an 8-way bank conflict; the swizzle (v4) is worth 4.7x. The bottleneck you do not remove
# hides the ones you did. Each figure comes from one device run (2026-11-22) against SDPA's
# FlashAttention-2 timed in the same process, shipped with the course in `results/measured.json`.
#
# Each file's header carries a one-line verdict and its measured figure (H100, `large`, fp16);
# the ladder runner, `PYTHONPATH=src:. python -m benchmarks.ladder 06`, builds, checks and times every
# rung against SDPA's FLASH_ATTENTION backend (and the solution against cuDNN too).

# %%
from facourse import results

R6 = results.load("06")   # what we measured on an H100 (course/results/measured.json), or None
if R6 is None:
    print("No step-06 results in course/results/measured.json.")
else:
    print(results.header(R6))
    print("\nEvery rung, fp16 (checks passed / run; TFLOP/s; t_reference / t_rung):")
    print(results.ladder_table(R6))
    print(f"\nThe solution ({R6['solution']}) against FA2 and cuDNN, fp16 and bf16 (min-max over the points):")
    print(results.bar_table(R6))

# %% [markdown]
# ## 6. FlashAttention-3 ideas on any sm_80+ (v5)
#
# FA3 (Shah et al., 2024) is built for Hopper's asynchronous WGMMA and TMA, but two of its ideas need
# neither. v5 (`ladder/v5_warp_specialized.cu`) does both with `mma.sync` and `cp.async`:
#
# ![v5: producer warp, mbarrier ring, consumer warps; the overlapped loop](../diagrams/sm80_ws_overlap.png)
#
# **Producer/consumer warp specialization** (FA3 section 3.1). Warp 7 only copies: for tile $j$ it
# waits until stage $j \bmod 3$ is free, issues the `cp.async` copies of $K_j$ and $V_j$ and arrives on
# that stage's *full* barrier with `cp.async.mbarrier.arrive.noinc`, an arrival that fires when its
# copies have landed. Warps 0-6 only compute: they wait on *full*, read the stage with `ldmatrix`,
# and arrive on *empty*. An mbarrier (sm_80+) is a 64-bit word in shared memory counting arrivals;
# when the count reaches zero the phase completes and its parity bit flips, so a wait names the
# parity it expects: $(j / 3) \bmod 2$ for the consumers, the one before for the producer. K and V
# have separate barriers, so $QK_j^\top$ can start before $V_j$ lands. No `__syncthreads` is left in
# the loop: warps drift apart, and while one does its softmax another keeps the tensor cores busy.
#
# Why 7 + 1 warps: the register file (64K registers) is split between the SM's four sub-partitions,
# and each warp lives in one of them. Without Hopper's `setmaxnreg` (step 07) every warp of a kernel
# gets the same count, so the producer warp costs as many registers as a consumer:

# %%
for warps in (4, 8, 9, 12, 16):
    per_partition = -(-warps // 4)                            # warps in the fullest sub-partition
    regs = min(255, 16384 // (32 * per_partition) // 8 * 8)  # 16K registers per sub-partition, 8-aligned
    print(f"{warps:2d} warps per SM -> at most {regs} registers per thread")

# %% [markdown]
# **Softmax overlapped with the next $QK^\top$** (FA3 section 3.2). The consumer's loop body is
#
#     wait K_{j+1};  S_next = Q_i K_{j+1}^T       // tensor cores
#                    P_j = softmax(S_cur)          // FMA, MUFU.EX2: no dependency on S_next
#     wait V_j;      O_i += P_j V_j;   S_cur = S_next
#
# `mma.sync` does not block: the warp keeps issuing until an instruction needs a result. ptxas
# interleaves the HMMAs of $S_{j+1}$ with the softmax of $S_j$, but only inside one basic block, so
# the loop is peeled (the last tile has no $S_{j+1}$) and compiled twice, with and without the causal
# mask, leaving no branch between the two. The price is a second $S$ in registers: with $O_i$ for
# 16 rows x 128 columns (64 registers) and $Q_i$ kept in registers (32), it fits; with 32-row warps
# (128 registers of $O_i$) it forces BLOCK_N = 32.
#
# Two helpers keep the integer work out of the loop. `copy_tile` gives each thread a fixed 16-byte
# chunk column, so its addresses advance by a constant; `LaneOffsets` turns every swizzled `ldmatrix`
# address into one XOR: the rows a lane points at all have $r \bmod 8 =$ lane $\bmod 8$, so chunk
# $2k + c_0$ is stored at $(2k) \oplus (c_0 \oplus \text{lane} \bmod 8)$ and the byte address of
# step $k$ is the lane's address at $k = 0$ XOR $32k$ (for a tile that starts on 256 bytes):

# %% swizzle-bytes
D = 128
def swz_bytes(r, c):                                          # swizzle<D>, in bytes
    return 2 * (r * D + (((c >> 3) ^ (r & 7)) << 3) + (c & 7))
ok = True
for lane in range(32):
    k0 = swz_bytes((lane & 7) + (lane >> 4) * 8, ((lane >> 3) & 1) * 8)          # K, B operand
    for kk in range(D // 16):
        for np_ in range(4):
            row, col = np_ * 16 + (lane & 7) + (lane >> 4) * 8, kk * 16 + ((lane >> 3) & 1) * 8
            ok &= (k0 ^ (kk << 5)) + np_ * 16 * D * 2 == swz_bytes(row, col)
print("ldmatrix address of step kk == (address at kk = 0) XOR (kk << 5):", ok)

# %% [markdown]
# **What it measured.** v5 is one template: consumer warps, 16-row m-tiles per warp, BLOCK_N,
# stages, producer or FA2-style loads, overlap, $Q_i$ in registers, conditional rescale.
# `ladder/v5_variants.py` builds its configurations with nvcc alone (no torch headers) and times
# each against FA2 in one process; two device runs (fp16, 12/12 checks for every variant). They were
# timed with the bench's older method, Python's enqueue inside the timed window (the timing probe of
# lecture 05 shows what that costs), so compare the variants with one another rather than with FA2:

# %%
V5 = results.load("06_v5_variants")   # the variants as measured (course/results/measured.json), or None
if V5 is None:
    print("No v5 variants in course/results/measured.json.")
else:
    print(results.variants_header(V5))
    yn = {True: "yes", False: "no"}
    print(f"\n{'variant':19s} {'run':>3s} {'warps':>5s} {'rows':>4s} {'BN':>3s} {'st':>2s} {'prod':>4s} {'ovl':>3s} "
          f"{'Qreg':>4s} {'lazy':>4s} {'CTA':>3s} " + " ".join(f"{p:>13s}" for p in V5["configs"]))
    for v in V5["variants"]:
        c = v["config"]
        desc = (f"{str(c['consumer_warps']) + ('+1' if c['producer'] else ''):>5s} {c['rows_per_warp']:4d} "
                f"{c['block_n']:3d} {c['stages']:2d} {yn[c['producer']]:>4s} {yn[c['overlap']]:>3s} "
                f"{yn[c['q_in_regs']]:>4s} {yn[c['lazy']]:>4s} {c['min_ctas_per_sm']:3d}"
                if c else f"{'(a harness)':>41s}")
        cells = [f"{v['tflops'][p]:3.0f} {v['ratio'][p]:.2f}x" if p in v["ratio"] else "-" for p in V5["configs"]]
        print(f"{v['name'][:19]:19s} {v['run']:3d} {desc} " + " ".join(f"{x:>13s}" for x in cells))
    for v in V5["variants"]:
        if v["harness"]:
            print(f"{v['name']}: {v['harness']}")
    print("TFLOP/s and t_FA2 / t_variant per configuration; CTA: the minimum CTAs per SM the kernel is compiled for")

# %% [markdown]
# Read it against the ideas (kernel times compared within one run where the two variants share one;
# SDPA's own time moved by up to 17 % between the variants' benches of one run, so ratio differences
# of a few percent are noise):
#
# - **The producer warp does not pay on `large`**: `fa2_like` (4 warps x 32 rows, FA2-style loads,
#   2 CTAs per SM) is 1.11-1.22x faster than `ws7x32` (7 + 1 warps x 32 rows, one CTA per SM) on
#   `large` and at 4k, and within 2 % at 8k-16k. (With one CTA per SM, each CTA's start-up is
#   also uncovered: a likely cause on the short causal rows of `large`, not profiled.)
# - **The overlap needs registers it does not have**: with 32-row warps the second $S$ forces
#   BLOCK_N = 32, which alone costs 1.12-1.31x (`fa2_n32`); the overlap wins back 0-14 %. With
#   16-row warps the effect is mixed (-8 % to +6 % between `ws7x16_q` and `ws7x16_ovl_q`, which ran
#   in different runs).
# - **32-row warps** beat 16-row warps by 1.10-1.28x (`v4_like_4w` against `fa2_like_lazy`), and
#   **two CTAs of 4 warps** beat one CTA of 8 by 1.10-1.24x (`fa2_8w_lazy`): two CTAs that never
#   wait for each other can interleave their softmax and MMA phases, the effect FA3's ping-pong
#   schedules on purpose (our reading; not profiled).
#
# v5's own configuration (7 + 1 warps x 16 rows, $Q_i$ in registers, overlap) measured 0.90x FA2 on
# `large` and 0.99-1.08x over 4k-16k (table of section 5, GPU time only). On Hopper the same two
# ideas are what step 07 is built on: there `setmaxnreg` moves registers from the producer to the
# consumers, and WGMMA is asynchronous by design.
#
# ## 7. What wins on `mma.sync` (v6)
#
# v6 (`ladder/v6_fa2_tiles_lazy.cu`) is v5's kernel in FlashAttention-2's own shape: 4 warps x 32
# rows, BLOCK_N = 64, 2 stages, every thread loading, 2 CTAs per SM. Each K/V fragment that
# `ldmatrix` reads feeds four MMAs instead of two. It adds FlashAttention-4's **conditional
# rescale**: keep the stale row max $m_i$ until the new max exceeds it by more than a threshold
# $\tau$ (log2 units), so $P \le 2^{\tau}$ and $O_i$, $l_i$ carry the same stale factor; $O / l$ is
# unchanged, and the 64 FMULs of $O_i \mathrel{*}= \alpha$ run only when some row of the 16-row
# m-tile moved its max (a warp vote). In float64 the result is exact and the rescales become rare:

# %%
rng = np.random.default_rng(1)
S, V = rng.standard_normal((16, 2048)) * 3, rng.standard_normal((2048, 32))
for tau in (0.0, 8.0):
    m, l, o, rescales = np.full(16, -np.inf), np.zeros(16), np.zeros((16, 32)), 0
    for n0 in range(0, S.shape[1], 64):
        s = S[:, n0:n0 + 64] * np.log2(np.e)
        m_new = np.maximum(m, s.max(1))
        m_new = np.where(m_new - m > tau, m_new, m)                 # keep the stale max within tau
        alpha = np.where(m_new == m, 1.0, np.exp2(m - m_new))
        p = np.exp2(s - m_new[:, None])
        l = alpha * l + p.sum(1)
        if (alpha != 1.0).any():                                    # the warp vote
            o *= alpha[:, None]
            rescales += 1
        o += p @ V[n0:n0 + 64]
        m = m_new
    P = np.exp(S - S.max(1, keepdims=True))
    err = np.abs(o / l[:, None] - (P / P.sum(1, keepdims=True)) @ V).max()
    print(f"tau = {tau}: O rescaled on {rescales} of {S.shape[1] // 64} tiles, max |O - softmax V| = {err:.1e}")

# %% [markdown]
# In fp16 and bf16 it is not free: $P$ is rounded to 16 bits before $PV$, and with $\tau > 0$ the
# largest weights are $2^\delta$ with a fractional $\delta$, which round, where the exact max gives
# $2^0 = 1$. fp16 (10 stored mantissa bits) stays inside the course's accuracy rule; bf16 (7) did not:
# with $\tau = 8$ a device run failed `mqa` in bf16, its error above the allowance (twice PyTorch's
# own error plus $10^{-3}$). v6 keeps $\tau = 8$ for fp16 and $\tau = 0$ for bf16, where only exact
# no-ops ($\alpha = 1$) are skipped. The rescale's own share of v6's speed is within the
# measurement spread; the warp shape and the two CTAs per SM are what matter.
#
# v6 measured 328 TFLOP/s on `large`, 1.08x FA2 (fp16), and 1.07-1.13x FA2 at every point of the
# 4k-16k sweep, causal and not, fp16 and bf16; 24/24 checks in fp16 and bf16; compute-sanitizer
# memcheck, racecheck and synccheck clean. The exercise's solution stays at 0.81x FA2 on `large`,
# 0.82x on `long` and 0.82-0.93x over 4k-16k (the `exercise` rung of section 5): its four
# functions fix 16-row warps with $Q_i$ in registers, and the two other harnesses measured with them
# were no faster (`solution_h64`, `solution_ws` above).
#
# ## 8. Compile without a GPU, run with one

# %%
stub = ROOT / "exercises" / "06_cuda_flash_attention" / "student_kernel.cu"
if shutil.which("nvcc") and stub.exists():
    from facourse.cuda_build import nvcc_compile_check
    rep = nvcc_compile_check(stub, "sm_80")
else:
    print("nvcc (or the exercise folder) is not here: the compile check is skipped.")

# %%
if gpu_or_skip("building and timing the step-06 kernels"):
    print("Run `PYTHONPATH=src:. python -m benchmarks.ladder 06` (every rung and the exercise's solution) and "
          "`solutions/06_cuda_flash_attention/ladder/v5_variants.py` (v5's configurations), or the exercise "
          "notebook: the first builds with facourse.cuda_build.load_cuda_extension, the second with nvcc alone.")
