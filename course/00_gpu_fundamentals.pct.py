# %% [markdown]
# # Lecture 00 — GPU fundamentals: memory, compute, and the roofline
#
# A kernel that performs $F$ floating-point operations and moves $Q$ bytes between HBM and the chip
# has **arithmetic intensity** $I = F / Q$ (FLOP per byte). On a GPU with peak compute $\pi$
# (FLOP/s) and memory bandwidth $\beta$ (byte/s) it can run no faster than
#
# $$P(I) = \min(\pi,\ \beta \cdot I), \qquad \text{ridge point } I^* = \pi / \beta.$$
#
# Below the ridge a kernel is **memory-bound** (faster memory traffic would help, faster math
# would not); above it, **compute-bound**. FlashAttention is the story of moving attention from the
# left of the ridge to the right without changing its result.
#
# **What you will learn**
# - the memory hierarchy (registers, shared memory, L2, HBM): sizes and bandwidths on A100, H100, H200;
# - the compute hierarchy (thread, warp, warpgroup, block, cluster) and which memory each level shares;
# - arithmetic intensity, the roofline, and where vanilla and flash attention sit for growing $N$,
#   computed from byte and FLOP counts;
# - a roofline measured on the machine in front of you.
#
# **Paper sections followed.** FlashAttention (Dao et al. 2022), §2.1 "Hardware performance"
# (memory hierarchy, compute- vs memory-bound, kernel fusion); Williams, Waterman & Patterson,
# *Roofline: an insightful visual performance model* (CACM 2009). Hardware numbers: NVIDIA A100 and
# H100 architecture whitepapers; A100, H100 and H200 datasheets.

# %%
import math
import time

import torch

# %% [markdown]
# ## 1. The memory hierarchy
#
# ![GPU memory hierarchy](../diagrams/memory_hierarchy.png)
#
# | level | where | who sees it | managed by |
# |---|---|---|---|
# | registers | in each SM | one thread | the compiler (spills go to "local memory", i.e. HBM via L1/L2) |
# | shared memory (SMEM) | in each SM, carved out of the same SRAM as L1 | one block (a cluster on Hopper) | the programmer |
# | L2 cache | on chip, shared by all SMs | the whole GPU | hardware |
# | HBM (global memory) | off chip, stacked next to the die | the whole GPU and the host | the programmer (`cudaMalloc`, tensors) |
#
# The numbers below are the ones the figure draws (sources in `diagrams/draw.py`). Per-SM sizes
# multiply to the whole chip; compare each level's total size with the $N \times N$ score matrix of
# one head at $N = 8192$ in fp16: 128 MiB.

# %%
GPUS = {  # from NVIDIA whitepapers / datasheets (SXM parts); smem = max shared memory per SM
    "A100": dict(sms=108, reg_kb=256, smem_kb=164, l2_mb=40, hbm_gb=80, hbm_tbs=2.039, fp16_tflops=312),
    "H100": dict(sms=132, reg_kb=256, smem_kb=228, l2_mb=50, hbm_gb=80, hbm_tbs=3.35, fp16_tflops=989),
    "H200": dict(sms=132, reg_kb=256, smem_kb=228, l2_mb=50, hbm_gb=141, hbm_tbs=4.8, fp16_tflops=989),
}
S_bytes = 8192 * 8192 * 2
print(f"{'GPU':5s} {'regs total':>11s} {'SMEM total':>11s} {'L2':>6s} {'HBM':>7s}   S (N=8192, one head) fits in")
for name, g in GPUS.items():
    regs, smem = g["sms"] * g["reg_kb"] / 1024, g["sms"] * g["smem_kb"] / 1024
    fits = [lvl for lvl, size_mb in (("regs", regs), ("SMEM", smem), ("L2", g["l2_mb"]),
                                     ("HBM", g["hbm_gb"] * 1024)) if size_mb * 2**20 >= S_bytes]
    print(f"{name:5s} {regs:8.1f} MB {smem:8.1f} MB {g['l2_mb']:3d} MB {g['hbm_gb']:4d} GB   {', '.join(fits)}")

# %% [markdown]
# Only HBM holds $S$. The whole game of this course is to keep $S$ and $P$ in registers and shared
# memory one **tile** at a time, so that HBM only sees $Q$, $K$, $V$ and $O$.
#
# Bandwidth falls as size grows. Shared memory delivers 128 bytes per clock per SM (whitepapers),
# about 19 TB/s over A100's 108 SMs and about 31 TB/s over H100's 132: roughly ten times HBM's
# 2–5 TB/s. Registers are faster still (operands for every instruction, every cycle). NVIDIA does not
# publish H100's L2 bandwidth; A100's whitepaper gives 5120 bytes/clock (about 7 TB/s).
#
# ## 2. The compute hierarchy
#
# | level | size | shares | example use in this course |
# |---|---|---|---|
# | thread | 1 | its registers (up to 255 × 32-bit) | one lane of a tile |
# | warp | 32 threads, one instruction stream (SIMT) | shuffles (`__shfl_sync`), `mma.sync` fragments | a 16 × 8 MMA tile (lecture 06) |
# | warpgroup (Hopper) | 4 consecutive warps = 128 threads | WGMMA operands | a 64-row slice of $Q_i$ (lecture 07) |
# | block (CTA) | up to 1024 threads, runs on one SM | shared memory, `__syncthreads()` | one $Q_i$ tile: one Triton program |
# | cluster (Hopper) | up to 8 blocks (16 non-portable) on neighbouring SMs | distributed shared memory, TMA multicast | sharing $K_j, V_j$ loads |
# | grid | all blocks of a launch | HBM, L2 | all $(Q_i, \text{batch}, \text{head})$ programs |
#
# An SM holds several blocks at once (up to 2048 threads = 64 warps, 65 536 registers, its shared
# memory). When a warp waits for memory, the SM's schedulers issue from another warp: this is how a
# GPU hides HBM latency, and why a kernel's register and shared-memory use (its *occupancy*)
# matters. FlashAttention-2's change of loop order (lecture 04) exists to give the GPU enough blocks:
# one per $(Q_i, \text{batch}, \text{head})$ rather than one per $(\text{batch}, \text{head})$.

# %% [markdown]
# ## 3. Arithmetic intensity, computed
#
# A few kernels, counted by hand (fp16, 2 bytes per element):
#
# - vector add $z = x + y$ of length $n$: $n$ FLOPs, $3 \cdot 2n$ bytes;
# - softmax over $n$ elements: about $5n$ FLOPs (max, subtract, exp, sum, divide), $2 \cdot 2n$ bytes at best;
# - matrix multiply $n \times n$ by $n \times n$: $2n^3$ FLOPs, $3 \cdot 2n^2$ bytes at best.

# %%
def ridge(g):
    return g["fp16_tflops"] * 1e12 / (g["hbm_tbs"] * 1e12)


n = 8192
kernels = {"vector add": (n, 6 * n), "softmax row": (5 * n, 4 * n), "GEMM 8192^3": (2 * n**3, 6 * n**2)}
print("ridge points (FLOP/byte):", {k: round(ridge(g)) for k, g in GPUS.items()})
for name, (flops, nbytes) in kernels.items():
    I = flops / nbytes
    side = "compute-bound" if I > ridge(GPUS["H100"]) else "memory-bound"
    print(f"{name:12s}: I = {I:9.2f} FLOP/B -> {side} on H100")

# %% [markdown]
# ### Attention
#
# One head, $S_q = S_{kv} = N$, head dimension $d$, fp16. The FLOPs are the two matmuls,
# $QK^\top$ and $PV$: $2 \cdot 2N^2 d = 4N^2 d$ (the softmax adds $O(N^2)$, negligible next to
# $4N^2 d$ at $d = 128$). The bytes depend on the algorithm:
#
# - **vanilla** (three kernels, lecture 01): read $Q, K$; write $S$; read $S$; write $P$; read $P, V$;
#   write $O$: $(4Nd + 4N^2)$ elements. For large $N$, $I \to 4N^2 d / 8N^2 = d/2$: **a constant**.
# - **flash** (one fused kernel): read $Q, K, V$, write $O$: $4Nd$ elements, $I = N/2$: **grows with $N$**.
# - **flash without cache reuse**: $K, V$ read once per $Q_i$ tile of $B_r$ rows: $I \to B_r$ for large $N$.

# %%
def attention_intensity(N, d=128, kind="vanilla", Br=128, bytes_per=2):
    flops = 4 * N * N * d                                   # QK^T and PV
    elems = {"vanilla": 4 * N * d + 4 * N * N,              # Q,K in; S out; S in; P out; P,V in; O out
             "flash": 4 * N * d,                            # Q, K, V in; O out
             "flash, no L2": 2 * N * d + 2 * N * d * math.ceil(N / Br)}[kind]
    return flops / (elems * bytes_per)


h100 = GPUS["H100"]
print(f"H100 ridge: {ridge(h100):.0f} FLOP/B\n")
print(f"{'N':>7s}" + "".join(f"{k:>16s}" for k in ("vanilla", "flash", "flash, no L2")) + "   vanilla time bound")
for N in (512, 1024, 2048, 4096, 8192, 16384, 65536):
    Is = [attention_intensity(N, kind=k) for k in ("vanilla", "flash", "flash, no L2")]
    t_mem = (4 * 128 * N + 4 * N * N) * 2 / (h100["hbm_tbs"] * 1e12)   # vanilla bytes / bandwidth
    t_cmp = 4 * N * N * 128 / (h100["fp16_tflops"] * 1e12)            # FLOPs / peak
    print(f"{N:7d}" + "".join(f"{I:16.1f}" for I in Is) + f"   memory {t_mem / t_cmp:4.1f}x compute")

# %% [markdown]
# ![roofline](../diagrams/roofline.png)
#
# Vanilla attention's intensity saturates near $d/2 = 64$ FLOP/B: below every ridge in the table, so
# it runs at most at $64 \times 3.35 \approx 215$ TFLOP/s on H100 whatever $N$, and in practice much
# lower (the softmax kernels are pure traffic). The fused kernel crosses the H100 ridge at
# $N \approx 2 \cdot 295 \approx 600$ and is compute-bound beyond. Without L2 reuse the re-read
# $K, V$ would cap it at about $B_r$ FLOP/B, below the ridge: one reason why programs of the same
# head are scheduled together (lecture 05).
#
# ## 4. A roofline you can measure
#
# The same two limits exist on this CPU. A large vector add measures the memory roof; a large matrix
# multiply the compute roof. Their ratio is this machine's ridge point.

# %%
def best_time(f, reps=3):
    f()
    best = math.inf
    for _ in range(reps):
        t0 = time.perf_counter()
        f()
        best = min(best, time.perf_counter() - t0)
    return best


x, y, z = (torch.randn(2**24) for _ in range(3))                 # 3 x 64 MiB of fp32
t_add = best_time(lambda: torch.add(x, y, out=z))
bw = 3 * x.numel() * 4 / t_add                                   # bytes / s
a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
t_mm = best_time(lambda: a @ b)
peak = 2 * 1024**3 / t_mm                                        # FLOP / s
print(f"memory roof : {bw / 1e9:6.1f} GB/s   (vector add, I = {1 / 12:.3f} FLOP/B)")
print(f"compute roof: {peak / 1e9:6.1f} GFLOP/s (1024^3 fp32 matmul, I = {2 * 1024**3 / (3 * 1024**2 * 4):.0f} FLOP/B)")
print(f"ridge point : {peak / bw:6.1f} FLOP/B on this CPU, vs {ridge(h100):.0f} on H100 (fp16 tensor cores)")

# %% [markdown]
# On a GPU the same measurement, with the peak from a large fp16 matrix multiply and the bandwidth
# from a large copy (CUDA events; the cell skips on a CPU). On an H100 80GB HBM3 (SXM) it printed
# 3.01-3.02 TB/s copy, 729-757 TFLOP/s fp16 GEMM, ridge 242-251 FLOP/B over three runs
# (`benchmarks/results/2026-11-27_h100_lectures_00_02.txt`): about nine tenths of the datasheet's
# 3.35 TB/s and three quarters of its 989 TFLOP/s, which is typical of what real kernels reach.

# %%
from facourse import gpu_or_skip

if gpu_or_skip("the GPU roofline measurement"):
    def cuda_time(f, reps=10):
        f()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(reps):
            f()
        e.record()
        torch.cuda.synchronize()
        return s.elapsed_time(e) / 1e3 / reps

    src = torch.empty(2**30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    gbw = 2 * src.numel() / cuda_time(lambda: dst.copy_(src))
    A, Bm = (torch.randn(8192, 8192, device="cuda", dtype=torch.float16) for _ in range(2))
    gpeak = 2 * 8192**3 / cuda_time(lambda: A @ Bm)
    print(f"{torch.cuda.get_device_name()}: {gbw / 1e12:.2f} TB/s copy, {gpeak / 1e12:.0f} TFLOP/s fp16 GEMM,"
          f" ridge {gpeak / gbw:.0f} FLOP/B")

# %% [markdown]
# ## Summary
#
# - Registers and shared memory are small (hundreds of KB per SM) and fast; HBM is large (80–141 GB)
#   and about ten times slower. $S$ for one head at $N = 8192$ only fits in HBM.
# - Threads form warps (32), warpgroups (128, Hopper), blocks (one SM, shared memory), clusters
#   (Hopper) and a grid; the SM hides latency by switching warps, so it needs many blocks.
# - $I = F/Q$ decides the bound: the H100 ridge is about 295 FLOP/B (fp16 dense, HBM3).
#   Vanilla attention stays near $d/2$ FLOP/B, memory-bound at every $N$; fused attention's intensity
#   grows as $N/2$.
#
# **Next:** lecture 01 measures vanilla attention's $O(N^2)$ memory and counts its six HBM trips.
