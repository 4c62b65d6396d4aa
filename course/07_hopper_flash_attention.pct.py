# %% [markdown]
# # 07 — FlashAttention on Hopper: TMA, WGMMA, warpgroups
#
# **The math** is still the one of steps 03-06. For a query tile $Q_i$ ($B_r = 128$ rows) and key tiles
# $K_j, V_j$ ($B_c = 128$ keys), with $c = \text{scale}\cdot\log_2 e$:
#
# $$S_{ij} = Q_i K_j^\top,\qquad m_i' = \max\big(m_i,\ c\cdot\operatorname{rowmax} S_{ij}\big),\qquad
#   P_{ij} = 2^{\,c\,S_{ij} - m_i'},\qquad \alpha = 2^{\,m_i - m_i'}$$
# $$l_i' = \alpha\, l_i + \operatorname{rowsum} P_{ij},\qquad O_i' = \alpha\, O_i + P_{ij} V_j,\qquad
#   O_i = O_i / l_i,\quad \mathrm{lse}_i = (m_i + \log_2 l_i)\ln 2 .$$
#
# What changes is *who does what, when*. On Hopper (H100, H200: `sm_90a`) the tensor cores, the
# copy engine and the CUDA cores are three asynchronous machines, and a fast kernel keeps all three
# busy at once. FlashAttention-3 (Shah, Bikshandi, Zhang, Thakkar, Ramani, Dao, 2024,
# arXiv 2407.08608) is that kernel; this lecture follows its structure:
#
# | FA3 paper | idea | here |
# |---|---|---|
# | §2.2 | Hopper's asynchronous units: TMA, WGMMA, warpgroups, FP8 | sections 2-4 |
# | §3.1, Algorithm 1 | producer/consumer warp specialization, `setmaxnreg`, ping-pong between warpgroups | sections 5-6 |
# | §3.2, Algorithm 2 | overlapping the softmax with the GEMMs inside one warpgroup | section 6 |
# | §3.3 | FP8: layouts, block quantization, incoherent processing | section 11 |
# | §4.2 | ablation: each idea switched off in turn | section 9 |
#
# **What you will learn**: how a tensor map describes a tile to the Tensor Memory Accelerator and how
# `cp.async.bulk.tensor` signals an mbarrier with a transaction count; what a phase parity is; how
# `wgmma.mma_async` reads shared memory through a 64-bit descriptor, and why the output of
# $S = QK^\top$ can be the register operand of $O \mathrel{+}= PV$; why one warpgroup only loads and
# two only compute, and how they trade registers with `setmaxnreg`; how named barriers make two
# warpgroups take turns on the tensor cores; what a persistent tile scheduler buys and what it can
# cost; how to read the SASS to confirm all of it; and what FP8 changes.
#
# The kernel is split as FA3's `hopper/` code is, one job per piece: `hopper_primitives.cuh` (one small
# named device function per PTX instruction), `hopper_common.cuh` (tile shapes, shared-memory layout,
# barriers, tile scheduler, softmax helpers), `hopper_harness.cuh` (epilogue, the kernel's roles,
# the host launcher with its tensor maps) and the producer and consumer mainloop, which are what the
# exercise (`exercises/07_hopper_flash_attention/`) asks you to write. Its entry point is
# `flash_attention_hopper(q, k, v, causal=False, scale=None) -> (o, lse)`. The ladder
# (`solutions/07_hopper_flash_attention/ladder/v1_ws.cu ... v4_persistent.cu`, instructors) switches
# FA3's ideas on one at a time with a few `#define`s each.
#
# Everything below runs on a CPU. Cells that need an H100/H200 say so and skip; the compile and
# SASS cell needs only `nvcc`.

# %%
import importlib.util
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import torch

ROOT = Path.cwd().parent if Path.cwd().name == "course" else Path.cwd()
sys.path.insert(0, str(ROOT / "diagrams"))
import fragments as fr       # step 06's mma.sync fragment index functions
import hopper_figures as hf  # the warpgroup timeline model behind warpgroup_pingpong.png
# (both select matplotlib's file backend for drawing; the magic below restores inline plots)

from facourse import results
from facourse.hw import HardwareUnavailable, require_sm90a

# %matplotlib inline

HOPPER = ROOT / "solutions" / "07_hopper_flash_attention"  # not in the student bundle
LADDER = HOPPER / "ladder"
RUNGS = sorted(LADDER.glob("v[0-9]*_*.cu"), key=lambda p: int(re.match(r"v(\d+)", p.stem)[1]))   # v1 ... v14
R7 = results.load("07")   # the newest committed ladder run (course/results/measured.json), or None
print("ladder rungs here:", [p.stem for p in RUNGS] or "none (the solutions/ folder is not in this bundle)")

# %% [markdown]
# ## 1. Why FlashAttention-2-style code leaves a Hopper GPU idle
#
# | fact | number | source |
# |---|---|---|
# | H100 SXM5 dense FP16/BF16 tensor-core peak | 989 TFLOP/s (FP8: 1,979) | NVIDIA H100 datasheet and Hopper architecture whitepaper |
# | FlashAttention-2 forward on H100 | about 35% of that peak | FA3 paper, abstract and §1 |
# | FlashAttention-3 forward, FP16 | up to 740 TFLOP/s (75%) | FA3 paper, abstract and §4.1 |
# | FlashAttention-3 forward, FP8 | close to 1.2 PFLOP/s | FA3 paper, abstract and §4.1 |
# | special-function (exp2) throughput | 16 per clock per SM on compute capability 9.0 | CUDA C++ Programming Guide, "Arithmetic Instructions" throughput table |
#
# Our own measurement agrees with the second line: the cell reads what PyTorch's FLASH_ATTENTION backend
# (FlashAttention-2) measured next to this step's ladder, committed in `course/results/measured.json`.

# %%
PEAK_FP16 = 989.4  # TFLOP/s: 132 SMs x 4096 FLOP/clk x 1.83 GHz (H100 SXM5 datasheet value)
if R7:
    fa2 = sorted(r["tflops_ref"] for r in results.bench(R7, dtype="float16", backend="FLASH_ATTENTION")
                 if r["config"] not in ("small", "medium", "noncausal", "asymmetric"))
    print(f"SDPA FLASH_ATTENTION (FA2), D=128 fp16, {R7['env']['gpu']}: {fa2[0]:.0f}-{fa2[-1]:.0f} TFLOP/s over "
          f"{len(fa2)} timed runs (large, long, 4k-16k) = {fa2[0] / PEAK_FP16:.0%}-{fa2[-1] / PEAK_FP16:.0%} "
          "of the tensor-core peak")
else:
    print("No measurement is committed in course/results/measured.json.")

# %% [markdown]
# Three things hold FA2's structure back on this GPU:
#
# 1. **Synchronous tensor cores.** `mma.sync` is issued by one warp, on a 16x8x16 tile, with both
#    operands already in that warp's registers (loaded by `ldmatrix`). The warp waits for the result.
#    Hopper's tensor cores reach their peak through `wgmma.mma_async`: four warps issue one 64xNx16
#    product that reads its operands straight from shared memory and runs in the background.
# 2. **Loads cost instructions and registers.** `cp.async` moves 16 bytes per thread per instruction,
#    and every thread computes addresses. The Tensor Memory Accelerator moves a whole tile on one
#    instruction from one thread, with the address arithmetic (and the swizzle) done in hardware.
# 3. **The exponential is slow next to the matmuls.** The cell below redoes FA3's arithmetic (§1):
#    per score, the two GEMMs cost $4D$ FLOPs and the softmax one `exp2` on the special-function
#    units. If the two do not overlap, the softmax alone costs half the matmul time at $D = 128$.

# %%
D = 128
SMS, CLOCK_GHZ, EXP2_PER_CLK_PER_SM = 132, 1.83, 16
exp2_tops = SMS * EXP2_PER_CLK_PER_SM * CLOCK_GHZ / 1e3   # exp2 results per second, in T/s
t_matmul = 4 * D / PEAK_FP16                              # per score: S = QK^T (2D) + O += PV (2D)
t_exp = 1 / exp2_tops                                     # per score: one exp2
print(f"special-function units: {exp2_tops:.1f} T exp2/s, {PEAK_FP16 / exp2_tops:.0f}x fewer than tensor-core FLOP/s")
print(f"per score at D={D}: matmul {4 * D} FLOPs, 1 exp2 -> the exp2 alone takes {t_exp / t_matmul:.0%} "
      "of the matmul time")

# %% [markdown]
# So a Hopper kernel must (a) feed WGMMA from shared memory with TMA while (b) the softmax of one
# block runs *during* the matrix products of another. Everything in this lecture serves those two.
#
# ## 2. The shape of the kernel
#
# One CTA (thread block) computes one 128-row tile $O_i$ with three warpgroups of 128 threads:
#
# ![One CTA of the Hopper kernel: tensor maps, TMA into a two-stage K/V ring with full/empty mbarriers, two consumer warpgroups running WGMMA, the epilogue](../diagrams/hopper_pipeline.png)
#
# - **Producer** (warpgroup 0; one thread does the work): loads $Q_i$ once, then $K_j$ and $V_j$ into a
#   2-stage ring of shared-memory slots with TMA. Each slot has a *full* barrier (the tile has landed)
#   and an *empty* barrier (every consumer is done with it).
# - **Consumers** (warpgroups 1 and 2, 64 query rows each): $S = Q_i K_j^\top$ by WGMMA from shared
#   memory, the online softmax in registers, $O_i \mathrel{+}= P V_j$ by WGMMA with $P$ taken from registers.
# - **Epilogue**: $O_i / l_i$ and the logsumexp, written once. **Tile scheduler**: which tile this CTA does
#   (next).
#
# Shared memory holds $Q_i$ (128x128 fp16 = 32 KB) and two stages of $K_j$ and $V_j$ (4 x 32 KB):
# 160 KB of the 227 KB one block may use (H100 whitepaper). The keys are visited right to left, so the
# one or two blocks that need a mask (the causal diagonal, a ragged end) come first.
#
# ## 3. The Tensor Memory Accelerator
#
# ### Tensor maps
#
# TMA copies a *box* of a tensor of up to five dimensions. The host describes the tensor once, in a
# 128-byte `CUtensorMap` built by the driver's `cuTensorMapEncodeTiled`: element type, rank, base
# address, sizes and byte strides (innermost first), box size, swizzle mode, what to do out of
# bounds. The map travels to the kernel as a `const __grid_constant__ CUtensorMap` parameter. The
# driver API documents the rules (CUDA Driver API, "Tensor Map Object Management"): base address
# 16-byte aligned, every stride a multiple of 16 bytes and below $2^{40}$, each box side at most 256
# elements, and with a swizzle the box's inner side may not be wider than the swizzle span. With
# `SWIZZLE_128B` and 16-bit elements that is 64 columns, so a $128 \times 128$ tile is loaded as two
# boxes ("panels") of $128 \times 64$.
#
# Our maps are 4-D, $(d, s, h, b)$ innermost first. The head is its own dimension, so a box at the
# end of one head's sequence never reads the next head: rows past $S$ arrive as zeros. Zeros are not
# $-\infty$, so the ragged-end mask is still needed. The function below builds the arguments
# `make_tensor_map` (in `hopper_harness.cuh`) passes, and checks them against those rules.

# %%
def tensor_map_args(t: torch.Tensor, box_rows: int, swizzle_bytes: int = 128):
    """cuTensorMapEncodeTiled's arguments for a [B, H, S, D] tensor, and the rules they break."""
    B, H, S, Dh = t.shape
    es = t.element_size()
    dims = (Dh, S, H, B)                                                      # innermost first
    strides = tuple(st * es for st in (t.stride(2), t.stride(1), t.stride(0)))  # bytes, dims 1..3
    box = (swizzle_bytes // es, box_rows, 1, 1)                               # one panel of rows
    broken = []
    if t.stride(3) != 1:
        broken.append("the last dimension is not contiguous")
    if t.data_ptr() % 16:
        broken.append("the base address is not 16-byte aligned")
    broken += [f"stride {st} B is not a multiple of 16" for st in strides if st % 16]
    broken += [f"box side {b} > 256" for b in box if b > 256]
    if Dh % box[0]:
        broken.append(f"D = {Dh} is not a whole number of {box[0]}-column panels")
    return dict(dims=dims, strides_bytes=strides, box=box, swizzle=f"SWIZZLE_{swizzle_bytes}B"), broken


examples = {
    "contiguous [2, 8, 1000, 128]": torch.empty(2, 8, 1000, 128, dtype=torch.float16),
    "view of [B, S, H, D] storage": torch.empty(2, 1000, 8, 128, dtype=torch.float16).transpose(1, 2),
    "rows padded to 132 elements": torch.empty(2, 8, 1000, 132, dtype=torch.float16)[..., :128],
}
for name, t in examples.items():
    args, broken = tensor_map_args(t, box_rows=128)
    print(f"{name:30s} {args}\n{'':30s} -> {'OK' if not broken else 'REJECTED: ' + '; '.join(broken)}")

# %% [markdown]
# The third tensor is a legal PyTorch view that TMA cannot describe (264-byte rows); the binding copies
# such a tensor to a contiguous one first, which is correct but costs a pass over memory.
#
# ### `cp.async.bulk.tensor` and the mbarrier
#
# One thread issues
#
# ```
# cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [smem], [map, {d, s, h, b}], [bar];
# ```
#
# and moves on. When the bytes land, the copy engine *decrements the transaction count* of the
# mbarrier `bar` by the number of bytes it wrote. An mbarrier is a 64-bit object in shared memory
# (PTX ISA, "mbarrier") that completes a **phase** when two counts reach zero: the pending
# *arrivals* (set by `mbarrier.init`) and the pending *transaction bytes* (raised by
# `mbarrier.arrive.expect_tx`). On completion it flips to the next phase and re-arms. The producer
# therefore does, for a 32 KB tile: `arrive.expect_tx(full, 32768)` (its one arrival, announcing the
# bytes), then two TMA copies of 16 KB that complete on `full`.
#
# Waiters never name a phase number, only its **parity**: `mbarrier.try_wait.parity` with parity $p$
# returns true once the phase with parity $p$ has completed. For slot $s$ of a ring of `STAGES`
# slots, use number $it$ (counting every tile ever loaded) has phase parity $(it / \text{STAGES}) \bmod 2$.
# Consumers wait on `full[s]` with that parity; the producer waits on `empty[s]` with the opposite
# one, and a fresh barrier (phase 0) counts its "previous" phase, parity 1, as complete, so the
# producer's first pass over the ring does not block. The simulation below runs that protocol.

# %%
class MBarrier:
    """The state the PTX ISA describes: current phase, pending arrivals, pending transaction bytes."""

    def __init__(self, arrivals):
        self.expected, self.pending, self.tx, self.phase = arrivals, arrivals, 0, 0

    def arrive(self, expect_tx=0):        # mbarrier.arrive[.expect_tx]
        self.tx += expect_tx
        self.pending -= 1
        self._maybe_complete()

    def complete_tx(self, nbytes):        # what TMA does when nbytes have landed
        self.tx -= nbytes
        self._maybe_complete()

    def _maybe_complete(self):
        if self.pending == 0 and self.tx == 0:
            self.phase, self.pending = self.phase + 1, self.expected

    def try_wait(self, parity):           # mbarrier.try_wait.parity
        return (self.phase & 1) != parity


STAGES, TILE_BYTES = 2, 128 * 128 * 2
full = [MBarrier(1) for _ in range(STAGES)]   # 1 arrival: the producer's expect_tx
empty = [MBarrier(1) for _ in range(STAGES)]  # the kernel expects 8 (one lane per consumer warp); 1 here


def parity(it):
    return (it // STAGES) & 1


produced = consumed = 0
while consumed < 6:
    # the producer runs ahead while the slot it needs has been released
    while produced < 6 and empty[produced % STAGES].try_wait(parity(produced) ^ 1):
        s = produced % STAGES
        full[s].arrive(expect_tx=TILE_BYTES)
        landed_before = full[s].try_wait(parity(produced))   # issued, bytes not here yet
        for _ in range(2):                                    # two 64-column boxes land
            full[s].complete_tx(TILE_BYTES // 2)
        print(f"producer  it={produced} slot {s}: empty parity {parity(produced) ^ 1} passed; full[{s}] "
              f"complete before the bytes? {landed_before}; after: phase {full[s].phase}")
        produced += 1
    s = consumed % STAGES
    assert full[s].try_wait(parity(consumed)), "a consumer would wait forever"
    empty[s].arrive()
    print(f"consumer  it={consumed} slot {s}: full parity {parity(consumed)} passed; released slot {s}")
    consumed += 1

fresh = MBarrier(1)
print("\na fresh barrier: try_wait(parity 0) =", fresh.try_wait(0), "| try_wait(parity 1) =", fresh.try_wait(1),
      "-> a producer that waits on empty with parity(it) instead of parity(it) ^ 1 hangs on its first tile")

# %% [markdown]
# The producer ran two tiles ahead, then stalled on `empty[0]` until the consumer released slot 0:
# that is the whole flow control. Note what the barrier does *not* do: it cannot tell which round a
# phase belongs to, only its parity. A producer that gets two rounds ahead of a slot's consumers
# would see "complete" for the wrong phase. The ring protocol makes that impossible (the producer
# waits on `empty` before it reuses a slot); a hand-made protocol must too.
#
# ## 4. WGMMA: tensor cores fed from shared memory
#
# A **warpgroup** is four consecutive warps (128 threads, the first warp's index a multiple of 4).
# Together they issue
#
# ```
# wgmma.mma_async.sync.aligned.m64nNk16.f32.f16.f16  {d0..d(N/2-1)}, a, b-desc, p, 1, 1[, 0, 0 | , 1];
# ```
#
# a $64 \times N \times 16$ product, $N$ a multiple of 8 up to 256 (PTX ISA, "Asynchronous Warpgroup Level
# Matrix Multiply-Accumulate"). $B$ always comes from shared memory through a 64-bit *matrix
# descriptor*; $A$ comes either from shared memory too (the **SS** form) or from registers (the **RS**
# form). The call returns at once. The protocol is:
#
# | PTX | SASS | meaning |
# |---|---|---|
# | `wgmma.fence.sync.aligned` | `WARPGROUP.ARRIVE` | the accumulator registers are ready to be read by the tensor cores |
# | `wgmma.mma_async ...` (several) | `HGMMA` | queue the products |
# | `wgmma.commit_group.sync.aligned` | | close a group of products |
# | `wgmma.wait_group.sync.aligned N` | `WARPGROUP.DEPBAR.LE` | wait until at most N groups are still running |
#
# Until the wait, the accumulator (and a register $A$ operand) belong to the tensor cores: the
# kernel may not read them, and must stop the compiler from moving them (`pin_registers` in
# `hopper_primitives.cuh`, an empty `asm volatile` that claims to modify them).
#
# In our kernel a consumer warpgroup computes its 64 rows of $S = Q_i K_j^\top$ as $D/16 = 8$ SS
# products of $64 \times 128 \times 16$ (**GEMM0**), and $O_i \mathrel{+}= P V_j$ as $B_c/16 = 8$ RS products of
# $64 \times D \times 16$ (**GEMM1**).
#
# ### Shared-memory descriptors and the 128-byte swizzle
#
# The descriptor tells the tensor cores where a $64\times16$ or $16\times N$ operand sits and how it is
# laid out (PTX ISA, "Matrix Descriptor Format"): bits 0-13 the start address $\gg 4$, bits 16-29 the
# *leading-dimension byte offset* $\gg 4$, bits 32-45 the *stride-dimension byte offset* $\gg 4$,
# bits 49-51 a base offset, bits 62-63 the swizzle mode (0 none, 1 128-byte, 2 64-byte, 3 32-byte).
#
# TMA's `SWIZZLE_128B` stores a panel in 1024-byte atoms of 8 rows of 128 bytes and moves 16-byte
# chunk $c$ of row $r$ to chunk $c \oplus (r \bmod 8)$: step 06's XOR swizzle, done by hardware.
# WGMMA undoes it on the fly by XOR-ing address bits 4-6 with bits 7-9. That is why a panel must
# start on a 1024-byte boundary (the kernel aligns its shared memory), and why stepping along
# $K$ inside a panel is just "start address + 32 bytes" per $k16$ step: the hardware applies the XOR to
# the final address. The cell checks that claim for every element of a panel, then encodes the
# descriptors the kernel builds.

# %%
def tma_swizzle128(row, col_bytes):
    """Where TMA (SWIZZLE_128B) puts byte col_bytes of row `row` inside a 64-column panel."""
    chunk, within = divmod(col_bytes, 16)
    return row * 128 + ((chunk ^ (row % 8)) * 16) + within


def wgmma_address(base, row, col_bytes):
    """The address WGMMA reads for (row, col): base + linear offset, bits 4-6 XOR bits 7-9."""
    a = base + row * 128 + col_bytes
    return a ^ (((a >> 7) & 7) << 4)


for base in (0x0400, 0x0600):
    same = all(wgmma_address(base, r, cb) == base + tma_swizzle128(r, cb) for r in range(128) for cb in range(0, 128, 2))
    print(f"panel at shared address {base:#06x} ({'1024-byte aligned' if base % 1024 == 0 else 'not aligned'}): "
          f"WGMMA reads what TMA wrote: {same}")


def smem_desc(addr, lead_bytes, stride_bytes, swizzle=1):
    return ((addr >> 4) & 0x3FFF) | (((lead_bytes >> 4) & 0x3FFF) << 16) | \
           (((stride_bytes >> 4) & 0x3FFF) << 32) | (swizzle << 62)


def decode(desc):
    return dict(start=(desc & 0x3FFF) << 4, lead=((desc >> 16) & 0x3FFF) << 4,
                stride=((desc >> 32) & 0x3FFF) << 4, swizzle={0: "none", 1: "128B", 2: "64B", 3: "32B"}[desc >> 62])


BLOCK_M = BLOCK_N = 128
q_base, k_base, v_base = 0x0400, 0x0400 + 32768, 0x0400 + 3 * 32768   # SmemLayout: Q, K ring, V ring
print("\nGEMM0, S = Q K^T: A = Q and B = K, both K-major (D contiguous); 16 columns of D per step")
for kk in (0, 1, 4):
    off = (kk // 4) * BLOCK_M * 128 + (kk % 4) * 32    # panel kk/4, 32 bytes per k16 step inside it
    dq = smem_desc(q_base + off, 16, 1024)
    print(f"  k-step {kk}: Q desc {dq:#018x} -> {decode(dq)}")
print("GEMM1, O += P V: B = V is MN-major (D contiguous, keys strided): 'transpose B' = 1; 16 keys per step")
for kk in (0, 1):
    dv = smem_desc(v_base + kk * 16 * 128, BLOCK_N * 128, 1024)
    print(f"  k-step {kk}: V desc {dv:#018x} -> {decode(dv)}")

# %% [markdown]
# Read the two layouts:
#
# - **K-major** ($Q$ and $K$ in GEMM0: the reduction dimension $D$ is contiguous). An 8-row group of
#   a swizzled panel is one 1024-byte atom, so the *stride* offset is 1024; the *leading* offset is
#   not used with the 128-byte swizzle for K-major operands (by convention 1, i.e. 16 bytes).
# - **MN-major** ($V$ in GEMM1: $O = PV$ reduces over keys, but $V$ is stored `[key][d]`, so $N = d$ is the
#   contiguous dimension). WGMMA reads it with the *transpose-B* immediate set to 1. Here the
#   *leading* offset is the distance between the two 64-column panels of $D$ (128 keys x 128 B =
#   16 KB) and the *stride* offset the distance between groups of 8 keys (1024). The transpose
#   immediates exist for 16-bit types only; section 11 returns to that.
#
# ### Accumulators are `mma.sync` fragments, stacked
#
# The $64 \times N$ fp32 accumulator is spread over the 128 threads: warp $w$ owns rows $16w \ldots 16w{+}15$,
# and within a warp the layout is step 06's $16\times 8$ C fragment repeated $N/8$ times along the
# columns. Thread (warp $w$, lane $l$) holds `d[4j + 2h + e]` = row $16w + l/4 + 8h$, column
# $8j + 2(l \bmod 4) + e$: $N/2$ floats, 64 for $N = 128$.
#
# ![mma.sync m16n8k16 fragments (step 06): a WGMMA accumulator is the C fragment stacked along N, one 16-row slice per warp](../diagrams/mma_m16n8k16_fragments.png)
#
# The register $A$ operand of the RS form is, per warp, exactly the `mma.sync` A fragment of its 16
# rows. So, as in step 06, the softmax output $P$ never leaves the registers: the fp32 values of columns
# $16k \ldots 16k{+}15$ of $S$, converted in pairs to fp16, *are* the four A registers of k-step $k$ of
# GEMM1. The cell checks both statements with step 06's index functions.

# %%
def wgmma_acc_coords(warp, lane, i):
    """(row, col) of accumulator register i of thread (warp, lane) for a m64nNk16 WGMMA."""
    g, t = lane >> 2, lane & 3
    return 16 * warp + g + 8 * ((i >> 1) & 1), 8 * (i >> 2) + 2 * t + (i & 1)


N = 128
stacked = all(wgmma_acc_coords(w, l, i) == (16 * w + fr.c_coords(l, i % 4)[0], 8 * (i // 4) + fr.c_coords(l, i % 4)[1])
              for w in range(4) for l in range(32) for i in range(N // 2))
cover = {wgmma_acc_coords(w, l, i) for w in range(4) for l in range(32) for i in range(N // 2)}
print(f"accumulator = C fragment stacked along N: {stacked}; covers all 64 x {N} entries once: {len(cover) == 64 * N}")

# convert_p in hopper_common.cuh: A register e of k-step k packs accumulator values s[8k + 2e] and s[8k + 2e + 1]
p_is_a = all(
    tuple(wgmma_acc_coords(0, l, 8 * k + 2 * e + half)) == (fr.a_coords(l, 2 * e + half)[0], 16 * k + fr.a_coords(l, 2 * e + half)[1])
    for l in range(32) for k in range(N // 16) for e in range(4) for half in range(2))
print("S accumulator of columns 16k..16k+15 == A operand of k-step k of O += P V:", p_is_a)

# %% [markdown]
# ## 5. Warp specialization and `setmaxnreg`
#
# FA3 §3.1 splits the CTA by role: the producer warpgroup only issues TMA, the consumer warpgroups
# only compute. The two sides talk through the full/empty barriers of section 3 and never wait for
# each other otherwise, so loads of $K_{j+1}, V_{j+1}$ run under the math of block $j$.
#
# The roles need very different register counts. A consumer thread holds its share of $O_i$
# (64 fp32 for $D = 128$), of $S$ (64), of $P$ (32 registers of two fp16), its running $m, l$ and
# addresses. The producer thread holds a loop counter and a few coordinates. But a kernel is compiled
# for one count: with `__launch_bounds__(384, 1)` every thread gets at most $65536/384$, rounded
# down to a multiple of 8, that is 168. `setmaxnreg.dec.sync.aligned.u32 40` (producer) and
# `setmaxnreg.inc.sync.aligned.u32 232` (consumers), executed warpgroup-wide at the start, move
# registers from one role to the other; `ptxas` allocates the consumer code against the raised limit.
# FA3's code uses 24 / 240 for this three-warpgroup shape (40 / 232 when its producer loads with
# `cp.async` instead of TMA). The budget is the CTA's launch allocation, 168 x 384 = 64,512 registers,
# not the 65,536 of the register file: step 08's backward tried 32 / 240 (65,536 in all) and every
# launch failed (`2026-11-28_h200_step08_v4_probes.txt`).

# %%
REGFILE, THREADS = 65536, 3 * 128
at_launch = REGFILE // THREADS // 8 * 8
print(f"registers per thread at launch: {at_launch}")
for prod, cons in ((40, 232), (24, 240), (32, 240)):
    total = 128 * prod + 2 * 128 * cons
    print(f"producer {prod:3d}, consumers {cons}: {total:6d} of {at_launch * THREADS} registers allocated at "
          f"launch -> {'fits' if total <= at_launch * THREADS else 'does not fit: the launch fails'}")
live = dict(O=D // 2, S=BLOCK_N // 2, P=BLOCK_N // 16 * 4, m_l_alpha=6)
print("consumer live state at the peak of the loop, registers per thread:", live, "=", sum(live.values()),
      "+ addresses and indices")

Q_BYTES, KV_BYTES, LIMIT = BLOCK_M * D * 2, BLOCK_N * D * 2, 227 * 1024
for stages in (2, 3):
    used = Q_BYTES + 2 * stages * KV_BYTES + 128 + 1024   # + barriers + alignment slack (SmemLayout)
    print(f"shared memory with {stages} K/V stages: {used / 1024:.1f} KB of {LIMIT // 1024} KB")

# %% [markdown]
# ## 6. Ping-pong between warpgroups, and overlap inside one
#
# Within one consumer warpgroup, key block after key block, the work is GEMM0 (tensor cores),
# softmax (CUDA cores and special-function units), GEMM1 (tensor cores). The kernel is software
# pipelined as FA3's Algorithm 2: iteration $j$ issues GEMM0 of block $j$ and GEMM1 of the
# previous block back to back, then runs the softmax of block $j$.
#
# ```
# S = Q K_last^T; softmax(S) -> P                         # prologue
# for j in the remaining key blocks:
#     wait full(K_j);  [ping-pong: bar.sync my turn]
#     S = Q K_j^T      (wgmma SS, commit)                 # GEMM0
#     wait full(V_prev);  O += P V_prev  (wgmma RS, commit)   # GEMM1
#     [ping-pong: bar.arrive the other warpgroup's turn]
#     wait_group<1> (overlap) or <0>;  release K_j        # S is ready
#     mask; softmax(S): m, l, alpha, P_new                # CUDA cores, while GEMM1 may still run
#     wait_group<0>;  release V_prev;  O *= alpha;  P = P_new
# O += P V_first; epilogue
# ```
#
# Two knobs decide what overlaps with what:
#
# - **Ping-pong** (FA3 §3.1; `HFA_PINGPONG`, rung v2). Two named barriers (`bar.sync id, 256` /
#   `bar.arrive id, 256`: ids 1 and 2, both consumer warpgroups counted) make the warpgroups take
#   turns issuing their GEMMs: warpgroup 1 issues, then lets warpgroup 2 issue while it runs its own
#   softmax. Without it, both issue at once, the tensor cores interleave their products, both finish
#   late and both then sit in softmax while the tensor cores idle.
# - **Intra-warpgroup overlap** (FA3 §3.2; `HFA_OVERLAP`, rung v3). Wait for GEMM0 only
#   (`wgmma.wait_group 1`) and start the softmax while GEMM1 still runs. The price: $P$ of the previous
#   block and $S$ of this one are alive at the same time, and the registers of $P$ may not be
#   overwritten until GEMM1 is done.
#
# ![Timelines of the model: v1 lockstep, v2 ping-pong, one warpgroup without and with the intra-warpgroup overlap](../diagrams/warpgroup_pingpong.png)
#
# The figure is drawn from a deliberately simple model (`diagrams/hopper_figures.py`): each GEMM of
# one warpgroup takes one unit on the tensor cores, which run one WGMMA at a time; a softmax takes
# $s$ units and never waits for the other warpgroup's; loads take half a unit. The cell prints the
# model's tensor-core utilisation over a long run for several softmax costs. Section 1 estimated the
# `exp2` alone at about one unit (half of the two GEMMs); the rest of the softmax (max, scale,
# sum, rescaling $O$, conversions) adds to it.

# %%
modes = [("lockstep", "v1: no order"), ("pingpong", "v2: ping-pong"), ("overlap", "v3: ping-pong + overlap"),
         ("single", "1 warpgroup"), ("single_overlap", "1 warpgroup + overlap")]
costs = (0.5, 1.0, 1.5, 2.0, 2.5, 3.0)
print(f"{'softmax / GEMM':24s}" + "".join(f"{s:>7.1f}" for s in costs))
for mode, label in modes:
    print(f"{label:24s}" + "".join(f"{hf.tensor_core_busy(hf.schedule(mode, 64, 1.0, s)):7.0%}" for s in costs))

# %% [markdown]
# In the model, ping-pong hides a softmax up to as long as the other warpgroup's two GEMMs, and the
# intra-warpgroup overlap stretches that by one more GEMM. For a single warpgroup the overlap is
# the only way to hide anything, which is FA3's Algorithm 2 on its own. What the model leaves out is
# what the measurements (section 9) contain: issue-slot and register pressure, the scheduling the
# hardware does on its own, and the barrier traffic.
#
# ## 7. A persistent tile scheduler
#
# Without one, the grid has one CTA per tile and the hardware launches a new CTA whenever an SM
# frees up. A **persistent** kernel launches one CTA per SM (132) and each CTA loops over tiles. That
# saves the launch and prologue of every CTA (barrier init, tensor-map prefetch) and lets a CTA's
# producer load the next tile while its consumers finish the last one. It also hands the
# *load balance* to the kernel. In causal attention, row block $m$ of a head visits $m+1$ key blocks
# (square case), so tiles differ in cost up to 16x on `large` and 128x at 16k.
#
# Two ways to hand out tiles: a **static** stride (CTA $c$ takes tiles $c, c + 132, c + 264, \ldots$)
# and a **dynamic** counter (a CTA that finishes takes the next tile from a global `atomicAdd`). In
# both, tiles are numbered longest first within a head. FA3's code uses the static one for
# non-causal attention and the dynamic one for causal. The cell models the two (work = key blocks
# visited; one CTA per SM) and prints the makespan against a perfect split.

# %%
def tile_costs(B, H, S, causal, bm=128, bn=128):
    mb = S // bm  # tiles of one head, numbered longest first (TileScheduler, hopper_common.cuh)
    return [(((mb - 1 - t % mb) + 1) * bm - 1) // bn + 1 if causal else S // bn for t in range(mb * B * H)]


def static_makespan(work, sms=132):
    per_cta = [0] * sms
    for t, w in enumerate(work):
        per_cta[t % sms] += w
    return max(per_cta)


def dynamic_makespan(work, sms=132):   # also what the hardware does for a non-persistent grid
    free = [0.0] * sms
    for w in work:
        i = min(range(sms), key=free.__getitem__)
        free[i] += w
    return max(free)


def lpt_sections(work, mb, section):   # v11's order: in each section of heads, every head's longest block first
    heads, out = len(work) // mb, []
    for s0 in range(0, heads, section):
        width = min(section, heads - s0)
        out += [work[(s0 + h) * mb + r] for r in range(mb) for h in range(width)]
    return out


from facourse.configs import CONFIGS, SWEEP   # the benchmarks' shapes, one definition

SHAPES = {"large": CONFIGS["large"], **{n: SWEEP[n] for n in ("causal_4k", "causal_8k", "causal_16k", "noncausal_16k")}}
MODEL = {}
print(f"{'config':14s} {'tiles':>6s} {'static / ideal':>15s} {'dynamic / ideal':>16s} {'dynamic, sections':>18s}")
for name, cfg in SHAPES.items():
    w = tile_costs(cfg.B, cfg.Hq, cfg.Sq, cfg.causal)
    ideal = sum(w) / 132
    heads_per_section = min(max(1, (16 << 20) // (4 * cfg.Skv * cfg.D)) * (cfg.Hq // cfg.Hkv), cfg.B * cfg.Hq)  # 16 MB of K, V
    MODEL[name] = (static_makespan(w) / ideal, dynamic_makespan(w) / ideal,
                   dynamic_makespan(lpt_sections(w, cfg.Sq // 128, heads_per_section)) / ideal)
    print(f"{name:14s} {len(w):6d} {MODEL[name][0]:15.3f} {MODEL[name][1]:16.3f} {MODEL[name][2]:18.3f}")

# %% [markdown]
# The static stride is only as balanced as the numbering lets it be. With 16 row blocks per head
# and 132 CTAs ($132 \equiv 4 \pmod{16}$), CTA $c$ gets tiles whose index is $c, c+4, c+8, c+12 \pmod{16}$
# over and over: the CTAs that drew the long residues do 40 key blocks of work per 4 tiles, those
# with the short ones 28. At 16k (128 row
# blocks per head) it gets worse. The dynamic counter, like the hardware's own CTA launcher, stays
# within a few percent. In `v4_persistent` the producer takes the next tile number from a global
# counter (`atomicAdd`) and hands it to its consumers through a two-slot ring in shared memory
# (`TileScheduler` in `hopper_common.cuh`); section 9 puts the measurements next to this table.
#
# "Within a few percent" is still a few percent. Numbered head after head, the last tiles handed out
# include a head's longest, and the other SMs idle while it finishes. The last column numbers the
# tiles as `v11_lpt_sections` does (longest first, greedy: LPT scheduling): every head's longest row
# block first, then every head's next, within sections of heads whose K and V fit in 16 MB of L2 so
# that the tiles in flight still share them. The kernel then ends on the shortest tiles.
#
# ## 8. Reading the SASS
#
# The compiler's output says whether the Hopper instructions are really there. The cell compiles
# every rung with `nvcc -gencode=arch=compute_90a,code=sm_90a -cubin` (the arch-specific target:
# `wgmma` and `setmaxnreg` do not exist in plain `sm_90`), disassembles it with `cuobjdump --dump-sass`
# and counts, in the fp16 $D = 128$ kernel: `HGMMA` (wgmma), `UTMALDG` (TMA loads), `SYNCS.*`
# (mbarrier operations), `USETMAXREG` (setmaxnreg), `BAR.SYNC`/`BAR.ARV` (named barriers),
# `WARPGROUP.*` (wgmma fence and wait) and `MUFU.EX2` (exp2). It needs `nvcc` and `cuobjdump` only,
# no GPU. That kernel is the only one it builds: the harness's switch `-DHFA_FP16_D128_ONLY` leaves
# out the other three instances (bf16, $D = 64$), three quarters of the compile time.

# %%
def find_tool(name):
    """On PATH, beside nvcc, or in a pip wheel (nvidia-cuda-cuobjdump, or Triton's bundled copy)."""
    cands = [shutil.which(name)]
    if shutil.which("nvcc"):
        cands.append(str(Path(shutil.which("nvcc")).resolve().parent / name))
    for pkg, sub in (("nvidia", "cu13/bin"), ("nvidia", "cuda_cuobjdump/bin"), ("triton", "backends/nvidia/bin")):
        spec = importlib.util.find_spec(pkg)
        for loc in (spec.submodule_search_locations or []) if spec else []:
            cands.append(str(Path(loc) / sub / name))
    return next((c for c in cands if c and os.path.isfile(c) and os.access(c, os.X_OK)), None)


OPS = {"HGMMA": "HGMMA", "UTMALDG": "UTMALDG", "SYNCS (mbarrier)": "SYNCS", "USETMAXREG": "USETMAXREG",
       "BAR.SYNC": "BAR.SYNC", "BAR.ARV": "BAR.ARV", "WARPGROUP.*": "WARPGROUP", "MUFU.EX2": "MUFU.EX2"}
INSN = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_.]*)")


def sass_profile(cu: Path, nvcc: str, cuobjdump: str):
    from facourse.cuda_build import gencode_flag, parse_ptxas
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "k.cubin"
        inc = [f"-I{d}" for d in (cu.parent, HOPPER, ROOT / "solutions" / "06_cuda_flash_attention")]
        r = subprocess.run([nvcc, "-cubin", gencode_flag("sm_90a"), "-std=c++17", "-O3", "-Xptxas", "-v", *inc,
                            "-DHFA_FP16_D128_ONLY", str(cu), "-o", str(cubin)],
                           capture_output=True, text=True, timeout=600)
        if r.returncode:
            return {"error": (r.stderr.strip().splitlines() or ["nvcc failed"])[-1][:200]}
        sass = subprocess.run([cuobjdump, "--dump-sass", str(cubin)], capture_output=True, text=True).stdout
    funcs = re.split(r"\n\s*Function : ", sass)[1:]
    body = next((f for f in funcs if "6__half" in f.split("\n", 1)[0] and "Li128" in f.split("\n", 1)[0]),
                funcs[0] if funcs else "")
    ops = INSN.findall(body)
    out = {label: sum(o.startswith(p) for o in ops) for label, p in OPS.items()}
    kern = [k for k in parse_ptxas(r.stderr + r.stdout) if "__half" in k.name and "128" in k.name]
    if kern:
        out["regs at launch"], out["spilled bytes"] = kern[0].registers, kern[0].spills
    out["highest register"] = max((int(x) for x in re.findall(r"\bR(\d+)\b", body)), default=0)
    return out


nvcc, cuobjdump = shutil.which("nvcc"), find_tool("cuobjdump")
if not RUNGS:
    print("No ladder kernels in this bundle (solutions/07_hopper_flash_attention/ladder): nothing to disassemble.")
elif not nvcc or not cuobjdump:
    print(f"Skipped: this machine lacks {'nvcc' if not nvcc else 'cuobjdump'} (the CUDA toolkit, or the "
          "nvidia-cuda-cuobjdump wheel), so the SASS cannot be produced here.")
else:
    with ThreadPoolExecutor(max_workers=4) as pool:
        prof = dict(zip([p.stem for p in RUNGS], pool.map(lambda p: sass_profile(p, nvcc, cuobjdump), RUNGS)))
    rows = [k for k in [*OPS, "regs at launch", "spilled bytes", "highest register"]
            if any(k in v for v in prof.values())]
    heads = {k: k.replace(" (mbarrier)", "").replace("highest register", "top reg").replace("regs at launch", "regs")
             .replace("spilled bytes", "spilled") for k in rows}   # one rung a line (SYNCS: the mbarrier ops)
    print(f"{'fp16, D=128 kernel':20s}" + "".join(f"{h:>12s}" for h in heads.values()))
    for v in prof:
        print(f"{v:20s}" + "".join(f"{str(prof[v].get(k, '-')):>12s}" for k in rows))
    for v, p in prof.items():
        if "error" in p:
            print(f"{v}: nvcc failed: {p['error']}")

# %% [markdown]
# What to look for: `HGMMA` and `UTMALDG` present in every rung (no silent fallback to `mma.sync`,
# which would show as `HMMA`); `BAR.ARV` appearing from v2 on (the ping-pong hand-over; the one
# `BAR.SYNC` of v1 is the `__syncthreads` after the barriers are initialised);
# `USETMAXREG` in pairs (one dealloc, one alloc path); no spilled bytes; and a highest register
# index *above* the launch count, the consumer code using what `setmaxnreg` gave it.
#
# ## 9. The ladder, measured
#
# | rung | adds | FA3 section |
# |---|---|---|
# | `v1_ws` | TMA + mbarrier ring, WGMMA (SS for $QK^\top$, RS for $PV$), producer/consumer warpgroups, `setmaxnreg` | §3.1 |
# | `v2_pingpong` | named barriers: the consumer warpgroups take turns on the tensor cores | §3.1 |
# | `v3_overlap` | softmax of block $j$ while $PV$ of the previous block runs (`wait_group 1`) | §3.2 |
# | `v4_persistent` | one CTA per SM; its producer takes tiles (longest first) from a global counter | §3.1 (and FA3's code) |
# | `v5_stages3` | a K/V ring three blocks deep instead of two | (did not pay) |
# | `v6_block_n176` | key blocks of 176 instead of 128 | FA3's code (its tile for $D = 128$) |
# | `v7_rescale_in_turn` | $O$ rescaled under the $QK^\top$ GEMM, inside the turn | FA3's code (did not pay) |
# | `v8_trim_first` | each warpgroup's rightmost key block only as wide as its rows need | (did not pay) |
# | `v9_prefetch_q` | the next tile's $Q$ fetched into L2 early, its first $K$ before its $Q$ | (did not pay) |
# | `v10_wide_stores` | the epilogue's stores of $O$ 16 bytes a lane (a transpose within each quad first) | FA3's code stages $O$ for a TMA store |
# | `v11_lpt_sections` | causal tiles longest first within sections of heads | FA3's code (its LPT scheduler) |
# | `v12_overlap_tiles` | two $Q$ slots; the next tile's first $S$ issued under this tile's epilogue | (did not pay) |
# | `v13_uniform_wg` | v11 with a warp-uniform warpgroup index (no copies of descriptors a key block) | FA3's code (CUTLASS's `canonical_warp_group_idx`) |
# | `v14_desc_add` | v13 with each k-step's descriptor built as the first plus an offset: the ladder's solution | CUTLASS's descriptor iterator |
#
# FA3's own ablation (§4.2, Table 2; non-causal, head dimension 128, about 8k tokens) measured
# 661 TFLOP/s for the full kernel, 582 without the softmax/GEMM pipelining and 570 without warp
# specialization. The cells below read our measurements from `course/results/measured.json` (the
# instructors' `benchmarks/ladder.py` measured them: the solution checked on the five configurations
# and every edge case in fp16 and bf16, every other rung once, each rung then timed against SDPA's
# CUDNN_ATTENTION and FLASH_ATTENTION backends with `facourse.bench_attention` in the same process),
# with each rung's verdict as the step's manifest states it.

# %%
if not R7:
    print("No step-07 measurement is committed (course/results/measured.json): nothing to show.")
else:
    print(f"{R7['source']}: {results.header(R7)}")
    rungs = sorted(R7["rungs"], key=lambda n: int(re.match(r"v(\d+)", n)[1]))   # ladder order (the run lists its solution first)
    configs = list(dict.fromkeys(r["config"] for r in results.bench(R7, rungs[-1], dtype="float16")))
    configs = [c for c in configs if all(results.bench(R7, n, c, "float16") for n in rungs)]

    def med(rung, cfg):  # our TFLOP/s: the median over the pairings with each reference
        vals = [r["tflops"] for r in results.bench(R7, rung, cfg, "float16")]
        return float(np.median(vals)) if vals else None

    refs = {(c, b): [r["tflops_ref"] for r in results.bench(R7, None, c, "float16", b)]
            for c in configs for b in ("CUDNN_ATTENTION", "FLASH_ATTENTION")}
    print(f"\n{'rung':16s} {'checks':>7s} " + " ".join(f"{c:>13s}" for c in configs) + "   (TFLOP/s, fp16)")
    for n in rungs:
        ok, total = R7["checks"].get(n, (0, 0))
        print(f"{n:16s} {ok:3d}/{total:<3d} " + " ".join(f"{med(n, c):13.0f}" for c in configs))
        print(f"{'':16s} verdict: {R7['rungs'][n]['verdict']}")
    for b in ("CUDNN_ATTENTION", "FLASH_ATTENTION"):
        print(f"{'SDPA ' + b[:11]:16s} {'':7s} " + " ".join(f"{np.median(refs[(c, b)]):13.0f}" for c in configs))

# %%
if R7:
    fig, ax = plt.subplots(figsize=(12, 4.2))
    series = {n: [med(n, c) for c in configs] for n in rungs}
    for b in ("CUDNN_ATTENTION", "FLASH_ATTENTION"):
        series[f"SDPA {b}"] = [float(np.median(refs[(c, b)])) for c in configs]
    width = 0.8 / len(series)
    for i, (name, ys) in enumerate(series.items()):
        ax.bar(np.arange(len(configs)) + (i - (len(series) - 1) / 2) * width, ys, width, label=name,
               color=None if not name.startswith("SDPA") else ("#555555" if "CUDNN" in name else "#aaaaaa"))
    ax.axhline(PEAK_FP16, color="#d9534f", lw=1, ls="--")
    ax.text(len(configs) - 0.5, PEAK_FP16 - 40, "dense fp16 peak", ha="right", color="#d9534f", fontsize=8)
    ax.set_xticks(range(len(configs)), configs)
    ax.set_ylabel("TFLOP/s (fp16, D = 128)")
    ax.set_title(f"Step 07 ladder on {R7['env']['gpu']}, {R7['env']['date']} (GPU time, L2 flushed, median of 25)")
    ax.set_ylim(0, 1200)
    ax.legend(ncol=3, fontsize=8, loc="upper left", frameon=False)
    plt.show()

# %% [markdown]
# Each rung against the rung it builds on (v2-v4 on the one before; v5 and v6 on v4; v7-v10 on v6;
# v11 on v10; v12 and v13 on v11; v14 on v13), and the solution against the two references, as ratios of times (> 1: faster). The
# last table is about tile scheduling: v4 against v3 (whose CTAs the hardware hands out as they
# finish, like a dynamic counter), next to section 7's model of a static stride against a dynamic
# counter. A static-stride v4 was measured once too, slower than the
# dynamic counter on `large` and far slower at causal 16k, the loss the model predicts (that run's
# figures are not among the committed results).

# %%
if R7:
    BASE = {"v5_stages3": "v4_persistent", "v6_block_n176": "v4_persistent", "v7_rescale_in_turn": "v6_block_n176",
            "v8_trim_first": "v6_block_n176", "v9_prefetch_q": "v6_block_n176", "v10_wide_stores": "v6_block_n176",
            "v11_lpt_sections": "v10_wide_stores", "v12_overlap_tiles": "v11_lpt_sections",
            "v13_uniform_wg": "v11_lpt_sections", "v14_desc_add": "v13_uniform_wg"}   # each rung's file says what it adds to which
    for prev, cur in zip(rungs, rungs[1:]):
        prev = BASE.get(cur, prev)
        r = {c: med(cur, c) / med(prev, c) for c in configs}
        print(f"{cur:14s} / {prev:14s}: {min(r.values()):.2f}x - {max(r.values()):.2f}x over {len(r)} configs "
              f"({', '.join(f'{c} {x:.2f}x' for c, x in r.items())})")
    best = R7["solution"]
    for b in ("CUDNN_ATTENTION", "FLASH_ATTENTION"):
        r = [x["ratio"] for x in results.bench(R7, best, dtype="float16", backend=b) if x["config"] in configs]
        print(f"{best} against SDPA {b}, paired in the same rounds: {min(r):.2f}x - {max(r):.2f}x")
    print(f"\n{'config':14s} {'t(v3) / t(v4)':>14s} {'model: static / dynamic':>24s}")
    for c in configs:
        if c in MODEL:
            print(f"{c:14s} {med('v4_persistent', c) / med('v3_overlap', c):14.2f} {MODEL[c][0] / MODEL[c][1]:24.2f}")

# %% [markdown]
# How to read the last table. The model's column is what a static stride would lose to load
# imbalance alone; on the causal rows it is large, on the non-causal row nothing. The first column
# says whether persistence pays for itself once the balance is right: it saves CTA
# launches and prologues, but a CTA's next $Q_i$ can only load once both consumer warpgroups are done
# with the current one. A rung keeps its idea only if the numbers say so.
#
# **Wider key blocks.** Every step of a warpgroup's loop pays for more than its two GEMMs: the row
# maximum and the row sum across the four lanes of a quad, the 64 multiplies that rescale $O$, the
# waits on the ring and the turn's two barriers. None of that grows with the number of keys in a
# block, so a wider block shares it among more keys. `v6_block_n176` is `v4_persistent` with
# `HFA_BLOCK_N` 176, FA3's width for $D = 128$: $S$ is 88 accumulators a thread instead of 64, $P$ 44
# registers instead of 32, still no spill at 232, and the ring takes 2 x 2 x 44 KB + 32 KB of Q = 208 KB.
# Alternating with v4 in one process on an H200 it took 0.91-0.99x v4's time at every point, and 160
# or 192 keys ran within 1 % of 176 (`benchmarks/results/2026-11-28_h200_step07_block_n.txt`). The
# exercise keeps 128 (its harness, its CPU emulator and their messages count in 128-key blocks); the
# ladder's solution, v14, is five defines away from yours. Step 10's window kernel keeps 128 too: a
# 1024-key window is 9 blocks of 128 per tile, and at 176 it lost 3 % (same file, section 3).
#
# **FA3's rescale position.** FA3's mainloop rescales $O$ after issuing $QK^\top$ and before issuing
# $PV$, so the multiplies run while the tensor cores work on $S$. `v7_rescale_in_turn` does the same
# (a register pin keeps ptxas from hoisting the multiplies above the issue; the SASS shows them between
# the two GEMMs). It ran at 0.93-0.96x v6's speed alternating in one process (same file, section 2).
# Our reading: with ping-pong the multiplies now sit inside the warpgroup's turn, and the other
# warpgroup waits for the turn, not for the tensor cores; our loop's place for them, after the wait
# for $PV$ and before the turn, is already hidden behind the other warpgroup's GEMMs. The rung stays
# in the ladder because it did not pay.
#
# **Fewer FLOPs that cost time.** A tile's keys end at its last row's diagonal (or at $S_{kv}$), and
# with 176-key blocks that end seldom falls on a block boundary: causal at 2k, the GEMMs compute 1.14
# query-key pairs per visible pair, against 1.06 with 128-key blocks. `v8_trim_first` runs each
# warpgroup's rightmost block only as wide as its rows need there (`trim_width`: $S$ at 128 columns,
# $PV$ over 64 or 128 keys), 5 % less work on `large`. It ran slower: 0.92x cuDNN on `large` against
# v6's 0.94x on an H100 in one run of the whole ladder (`benchmarks/results/2026-11-28_h100_step07.json`),
# and 0.92-0.98x v6's speed alternating on an H200 (`benchmarks/results/2026-11-28_h200_step07_trim_first.txt`).
# The SASS says why. WGMMA takes its operand descriptors from uniform registers, which v6's loop computes
# on the uniform datapath (129 instructions a step). With a branch on the trimmed width, a value of the
# warpgroup and so of `threadIdx`, ptxas computes them per thread instead and moves them over before the
# HGMMAs: 100 `R2UR` a step against 16, 1301 instructions against 1065. Peeling the first step out of the
# loop left 54. A saving in the first block costs every block after it, and the first way to write the
# idea down is seldom the last: a 64-column $S$ made ptxas serialise the kernel's WGMMAs (its
# warning C7511 at `-Xptxas -v`).
#
# **Between tiles.** On `large` a tile averages 6.6 key blocks of 176, so what happens once per tile
# counts. Nsight Compute's source counters sample where each warp stalls, instruction by instruction;
# summed over regions of v6's SASS, the consumer warps spent 15.4 % of their samples in the epilogue
# and the start of the next tile, most of them waiting on a full store queue, and the SMs were active
# 95.8 % of the kernel's cycles (`benchmarks/results/2026-11-28_h200_step07_tile_boundary.txt`,
# section 1). Three rungs followed. `v9_prefetch_q` suspected the next $Q$, read from HBM once per tile
# into a slot that frees only after the tile's last $S$: it fetches $Q$ into L2 as soon as the producer
# has the tile's number and loads the first $K$ before $Q$. Nothing moved (same file, section 2), and
# the profile agrees: 2.4 % of the samples wait for the next tile's number, $Q$ and $K$ together.
# `v10_wide_stores` is about the stores. In the accumulator layout a lane holds 2 adjacent columns of
# every 8, so v6 stores $O$ 4 bytes at a time: 32 stores a thread, and each warp's store touches 8 rows.
# Two rounds of `__shfl_xor_sync` transpose the 4 x 4 pieces of a quad (lane $q$ ends with columns
# $8q..8q+7$ of each group of 32), and each lane stores 16 bytes: a quarter of the instructions, whole
# sectors. The epilogue's share fell to 8.0 % of the samples (measured in v11, which has it), `large`
# went from 0.93x to 0.98x cuDNN in one ladder run on an H200 (`benchmarks/results/2026-11-28_h200_step07_v11.json`),
# and step 10's window kernel, whose tiles are 9 blocks long, from 393-400 to 416-424 TFLOP/s
# alternating in one process. `v11_lpt_sections` is section 7's last column: causal tiles longest first
# within 16 MB sections of heads (FA3's causal scheduler does the same with 32 MB; 48 MB ran slower here).
# The SMs were then active 98.1 % of the cycles, and `large` reached 1.00x cuDNN (1.00x by do_bench and
# 1.02x by events in a second run, `benchmarks/results/2026-11-28_h200_step07_methods.json`), causal
# 1.07-1.11x at 4k-16k. Non-causal tiles are all alike and stay at 1.00-1.03x: what remains there is
# in the loop itself.
#
# `v12_overlap_tiles` tried the tile's other end. A consumer issues the next tile's first $S$ in the same
# turn as this tile's last $PV$, so that it runs under the epilogue, and two $Q$ slots let the producer
# load that $Q$ while the tile runs (its producer and loop are in `ladder/overlap_tiles.cuh`; two slots
# and 176-key blocks would need 240 KB of shared memory, so its blocks are 160 wide). In one runner call
# it ran 500 TFLOP/s on `large` (0.94x cuDNN) against v11's 532 (`benchmarks/results/2026-11-28_h200_step07_overlap_tiles.json`):
# the turn that carries the next $S$ is longer, and the other warpgroup waits for that turn. Step 10's
# window kernel, whose tiles are short, ran 421-427 TFLOP/s with this loop against 418-423 as built
# (`benchmarks/results/2026-11-28_h200_step07_overlap_probes.txt`), too little to keep.
#
# `v13_uniform_wg` came from the backward (step 08). WGMMA reads its shared-memory descriptors from
# the uniform registers, one copy for the whole warp, and nvcc puts a value there only when it can see
# that every lane holds the same one. The warpgroup index `threadIdx.x / 128 - 1` is the same in
# all 32 lanes of a warp, but nvcc does not prove it, so the descriptors built from it were computed
# in each thread's registers and copied over (`R2UR`), 16 copies in every masked key block. Taken
# through `__shfl_sync` from lane 0, which the compiler does know is uniform, the index keeps them on
# the uniform datapath (`consumer_index` in the harness, switch `HFA_UNIFORM_WG`). A small gain:
# alternating with v11 in one process on an H200, it was faster at every point but one
# (`benchmarks/results/2026-12-02_h200_step07_uniform_wg_probes.txt`).
#
# `v14_desc_add` came from a profile of FlashAttention-4's Hopper forward beside v13 on `noncausal_8k`:
# the same softmax instructions, but 21 % more instructions in all in v13, half of the extra ones building
# WGMMA descriptors on the uniform datapath (`benchmarks/results/2026-12-03_h200_step07_fa4_ncu.txt`). A
# descriptor packs bits 4-17 of a shared-memory address with the layout's fields; v13 packs every
# k-step's from scratch. v14 builds the block's first one and adds each k-step's byte offset, shifted
# right by 4, to it, as CUTLASS's descriptor iterator does (`smem_desc_add`, switch `HFA_DESC_ADD`): the
# key-block loop goes from 1007 instructions to 958. In the ladder run above it reads 1.01x cuDNN on
# `large` and 1.08-1.12x causal at 4k-16k, ahead of v13 at six of the seven points and even at the
# seventh (`benchmarks/results/2026-12-03_h200_step07_v14.json`); in a second run 1.01x on `large` by
# `do_bench` and 1.03x by events (`benchmarks/results/2026-12-03_h200_step07_methods.json`). Without a
# causal mask it stays at 1.01-1.05x.
#
# Part of what is missing there is the last wave. Every point of the sweep has 2048 query tiles of 128
# rows, 15.5 for each of the 132 SMs, so the last round of tiles leaves half of the SMs idle (the wave
# efficiency of lecture 09). At lengths whose tiles fill whole waves, 4224, 8448 and 16896 keys (the
# lengths FlashAttention-3's paper took for its FP8 charts), v14 runs 3-5% more TFLOP/s and cuDNN 2-4%
# more: the ratio gains up to three points and still stays under 1.08x
# (`benchmarks/results/2026-12-03_h200_step07_whole_waves.txt`). Splitting the last wave's tiles
# would not close the gap alone.
#
# The keys waste a little too: 4096 keys are 23 blocks of 176 and a 24th holding 48. Blocks of 128
# keys divide every length of the sweep, but they lose 3.6-8.4% of v14's TFLOP/s on it, 4k included:
# at 128 keys ptxas builds each WGMMA descriptor in thread registers and copies it over, 48 times a
# key block. Dropping the deadlock trap from the mbarrier waits (no clock read when a first try misses)
# changes nothing measurable either
# (`benchmarks/results/2026-12-03_h200_step07_wait_spin_block128.txt`).
#
# FlashAttention-4's Hopper forward, faster than `v13` on `noncausal_8k`, launches one CTA per tile
# with 128-key blocks. Without persistent CTAs, `v14`'s loop has no register copies at 128 keys either,
# yet neither width beats `v14` anywhere: at 176 keys the non-causal sweep is level at 16k and up to
# 2.6% behind at 4k and 8k, and `large` loses 9-14%, most likely because each CTA's first loads are
# no longer hidden under the previous tile (`benchmarks/results/2026-12-03_h200_step07_not_persistent.txt`).
#
# An older rung did not pay either: `v5_stages3` makes the K/V ring three
# blocks deep instead of two (224 KB of the 227 KB of shared memory at $D = 128$), so the producer
# runs one block further ahead. It changes nothing the consumers wait on in the long loops, and on
# the short ones it was meant for (step 10's 1024-token window, 9 key blocks per tile) it did not help
# either: 487 TFLOP/s on `large` against v4's 495, and on the window 391-399 TFLOP/s against 396-401,
# each pair alternating in one run on an H100 (`benchmarks/results/2026-11-27_h100_step07_v5_stages3.txt`,
# a text record; in the table above, a later run on an H200, v5's ratio to cuDNN is again at or under v4's).
#
# Why does `v3_overlap` buy nothing? Its PTX is right: the softmax of $S_j$ sits between
# `wgmma.wait_group 1` ($S_j$ ready) and `wgmma.wait_group 0` ($PV_{j+1}$ done). But ptxas, which
# schedules the SASS, moves the second wait above the softmax: between the two waits of the compiled
# loop stand the mask's instructions and none of the 66 `MUFU` (the exponentials), so the softmax runs
# after the product, not under it. A wait made conditional on the softmax's row sums stays below it
# and puts the overlap back into the SASS, and v4 built that way ran no faster on an H200: 0.90-1.00x
# cuDNN on the 4k-16k sweep against 0.93-1.03x without it, in two runs of one day
# (`benchmarks/results/2026-11-27_h200_step10_v8_probes.txt`, section 4). At fp16's GEMM cost the
# ping-pong between warpgroups already hides the softmax. In e4m3 the GEMMs take half the time and it
# no longer does: step 10's `v8_hopper_fp8` is this kernel in FP8, and there the softmax sets the pace.
#
# **Against FlashAttention-3 itself.** The paper's margin over cuDNN was measured on an H100 against
# the cuDNN of 2024. Its authors' own Hopper kernel, in the CuTe DSL port that ships as
# FlashAttention-4's sm_90 path (128 x 128 tiles, intra-warpgroup overlap), was timed on the 4k-16k
# sweep and on `large`, in one process with `v11_lpt_sections`, against cuDNN 9.19 on an H200.
# It reads 1.02-1.03x cuDNN on large, 1.06-1.09x without a causal mask and 1.09-1.14x with one;
# v11, in the same process, 0.995-1.00x, 1.00-1.03x and 1.07-1.12x
# (`benchmarks/results/2026-12-02_h200_fa4_reference.txt`, two timing methods). So the authors'
# kernel is a few percent ahead of this ladder, most of all without a mask, and its own margin over
# today's cuDNN without a mask is at the low end of the paper's at 16k keys and below it at 4k. (This
# is the port, not FA3's C++ build, which was not measured here.)

# %% [markdown]
# ## 10. Run it on a Hopper GPU
#
# On an H100 or H200, where the ladder's sources are present (an instructor's checkout), the cell
# builds each rung for `sm_90a` with `facourse.cuda_build.load_cuda_extension`, checks it with the
# shared `facourse.check_entry_point` on `large` and two edge cases, and times it on `large` against
# cuDNN with the shared `facourse.bench_attention`. Anywhere else it says why it skips. The full run
# (both dtypes, every edge case, the 4k-16k sweep, each rung in its own process so that a hang costs
# one rung) is `PYTHONPATH=src:. python -m benchmarks.ladder 07`.

# %%
try:
    require_sm90a("building and timing the Hopper ladder")
    if not RUNGS:
        print("Skipped: the ladder's sources (solutions/) are not in this bundle.")
    else:
        from facourse import bench_attention, check_entry_point, validate_inputs
        from facourse.cuda_build import load_cuda_extension
        for path in RUNGS:
            ext = load_cuda_extension(f"lecture07_{path.stem}", [path, HOPPER / "fa_binding.cpp"], arch="sm_90a",
                                      include_dirs=[LADDER, HOPPER])

            def fn(q, k, v, causal=False, scale=None, ext=ext):
                validate_inputs(q, k, v, scale)
                return tuple(ext.forward(q, k, v, bool(causal), float(q.shape[-1] ** -0.5 if scale is None else scale)))

            for cfg in ("large", "ragged", "empty_rows"):
                check_entry_point(fn, cfg, device="cuda", dtype=torch.float16, expect_lse=True)
            print(path.stem, "|", bench_attention(fn, "large", backend="CUDNN_ATTENTION").summary())
except HardwareUnavailable as e:
    print(f"Skipped: {e}")

# %% [markdown]
# ## 11. FP8
#
# Hopper's tensor cores also multiply 8-bit floats at twice the 16-bit rate (1,979 dense TFLOP/s on
# an H100 SXM5, datasheet). Two formats exist (`torch.float8_e4m3fn`, `torch.float8_e5m2`): **e4m3**
# has 3 mantissa bits and a largest value of 448 (no infinities), **e5m2** has 2 mantissa bits and
# reaches 57,344. Attention's forward pass uses e4m3 for its precision. FA3 §3.3 names what changes:
#
# - **Layouts.** FP8 WGMMA is `m64nNk32`, and the transpose immediates exist for 16-bit types only:
#   both shared-memory operands must be K-major. For $O = PV$ the reduction runs over keys, but $V$ is
#   stored `[key][d]`; it must be transposed to `[d][key]` in shared memory (FA3 does it in the kernel
#   after the TMA load, with `ldmatrix`/`stmatrix`) or before the kernel. And the fp32 accumulator
#   layout of $S$ no longer matches the 8-bit A-operand layout of a k32 step, so $P$ needs a few
#   byte permutes in registers before GEMM1.
# - **Block quantization.** One scale per tile ($B_r \times D$ of $Q$, $B_c \times D$ of $K$ and $V$) instead of one
#   per tensor: an outlier only coarsens its own tile. The scales fold into the softmax scale and
#   the output, so they cost nothing inside the loop.
# - **Incoherent processing.** Multiply $Q$ and $K$ by the same random orthogonal $M$ (FA3: random $\pm1$
#   signs times a Hadamard matrix, $O(D \log D)$ to apply). Since $MM^\top = I$, $(QM)(KM)^\top = QK^\top$
#   exactly, but an outlier in one coordinate is spread over all $D$ of them before rounding.
#
# FA3 §4.3 reports, on inputs with a small fraction of large outliers, an RMSE of 9.1e-3 for its FP8
# kernel against 2.4e-2 for per-tensor FP8 (2.6x lower). The cell runs the same kind of experiment
# on the CPU (no kernel: quantize, dequantize, compute attention in float64), with e4m3 and
# 0.1% of the entries of $Q, K, V$ drawn 10x larger.

# %%
if not hasattr(torch, "float8_e4m3fn"):
    print("This PyTorch has no float8 dtypes: the FP8 demonstration is skipped.")
else:
    F8 = torch.float8_e4m3fn
    gen = torch.Generator().manual_seed(0)
    Nq, Dh = 1024, 128

    def with_outliers(*shape):
        x = torch.randn(*shape, generator=gen, dtype=torch.float64)
        big = torch.rand(*shape, generator=gen) < 1e-3
        return torch.where(big, 10 * torch.randn(*shape, generator=gen, dtype=torch.float64), x)

    def fp8(x, block=None):
        """Quantize to e4m3 with one scale per tensor or per block of rows; return the dequantized value."""
        xb = x.reshape(-1, block or x.shape[0], x.shape[-1])
        scale = xb.abs().amax(dim=(1, 2), keepdim=True) / torch.finfo(F8).max
        return ((xb / scale).to(F8).to(torch.float64) * scale).reshape(x.shape)

    def hadamard(n):
        H = torch.ones(1, 1, dtype=torch.float64)
        while H.shape[0] < n:
            H = torch.cat([torch.cat([H, H], 1), torch.cat([H, -H], 1)], 0)
        return H / math.sqrt(n)

    q, k, v = (with_outliers(Nq, Dh) for _ in range(3))
    M = torch.diag(torch.where(torch.rand(Dh, generator=gen) < 0.5, -1.0, 1.0).double()) @ hadamard(Dh)
    assert torch.allclose(M @ M.T, torch.eye(Dh, dtype=torch.float64))

    def attention(q, k, v):
        s = q @ k.T / math.sqrt(Dh)
        return s, torch.softmax(s, -1) @ v

    s_ref, o_ref = attention(q, k, v)
    top = s_ref.abs() >= s_ref.abs().flatten().kthvalue(int(0.999 * s_ref.numel())).values
    rms = lambda e: float(e.pow(2).mean().sqrt())
    variants = {"fp16 (for scale)": (q.half().double(), k.half().double(), v.half().double()),
                "fp8 per tensor": (fp8(q), fp8(k), fp8(v)),
                "fp8 per 64-row block": (fp8(q, 64), fp8(k, 64), fp8(v, 64)),
                "fp8 block + incoherent": (fp8(q @ M, 64), fp8(k @ M, 64), fp8(v, 64))}
    print(f"{'inputs':24s} {'RMSE of S':>10s} {'RMSE, top 0.1% of |S|':>22s} {'RMSE of O':>10s}")
    for name, (qq, kk, vv) in variants.items():
        s, o = attention(qq, kk, vv)
        print(f"{name:24s} {rms(s - s_ref):10.2e} {rms((s - s_ref)[top]):22.2e} {rms(o - o_ref):10.2e}")

# %% [markdown]
# The rotation leaves the average error of $S$ where it was: e4m3 has the same *relative* precision
# everywhere, so spreading an outlier does not make the typical product more exact. What it changes
# is the error on the largest scores. Such a score is dominated by one outlier coordinate, whose
# rounding error is then one large term; after the rotation the same score is a sum of $D$ terms of
# similar size with independent errors, about $\sqrt{D}$ times smaller together. The softmax is
# decided by exactly those largest scores, so the output error drops. Block scaling helps here too,
# though less: with 0.1% outliers most 64-row blocks still contain one.
#
# ## What can go wrong (and what it looks like)
#
# - **Wrong parity** on a wait: the kernel hangs on its first tile (producer) or reads a tile before
#   it lands (consumer): a silent wrong answer on some blocks.
# - **A panel not on a 1024-byte boundary**: WGMMA reads a different swizzle than TMA wrote; rows
#   come out permuted within groups of 8.
# - **Touching an accumulator before `wgmma.wait_group`**, or letting the compiler move it: wrong
#   values that change with the optimisation level. Fence, commit, wait, and pin the registers.
# - **`-arch=sm_90a`** instead of `-gencode=arch=compute_90a,code=sm_90a`: `wgmma` fails to assemble;
#   plain `sm_90` rejects `wgmma` and `setmaxnreg`.
# - **`setmaxnreg` counts that do not fit the register file**: `setmaxnreg.inc` waits until enough
#   registers are free, i.e. forever. (The counts must also be multiples of 8 from 24 to 256; `ptxas`
#   checks that part.)
# - **A TMA box that crosses heads** in a flattened 2-D map: the last tile of one head reads the
#   first rows of the next. A 4-D map (or masking) avoids it.
