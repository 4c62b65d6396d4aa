"""The ring kind (step 12): ``ring_attention(q, k, v, causal=, scale=, group=)``, one rank's part of attention
over a sequence split across ranks (facourse.ring). A rung runs in a world of ``world`` ranks
(benchmarks/ring_world.py): checked on the shapes of facourse.ring.RING_CASES (rank 0 checks the gathered
rows with the one rule), timed on long causal sequences against the same block kernel on one GPU; rows
add the speedup, the efficiency and, per rank, the compute and the wait for the next shard after it."""
from __future__ import annotations

from ..configs import AttnConfig
from .base import DTYPES, Kind

#: What a ring rung is timed on: causal fp16, B 1, Hq = Hkv = 16, D 128, the sequence over 2 GPUs.
CONFIGS = {c.name: c for c in (AttnConfig("ring_causal_64k", 1, 16, 16, 65536, 65536, 128, True),
                               AttnConfig("ring_causal_128k", 1, 16, 16, 131072, 131072, 128, True))}
#: --cpu-smoke: the same path on CPU ranks (gloo, facourse.ring.block_attention), at sizes a test affords.
SMOKE_CONFIGS = {c.name: c for c in (AttnConfig("smoke_causal_256", 1, 2, 2, 256, 256, 64, True),
                                     AttnConfig("smoke_causal_512", 1, 2, 2, 512, 512, 64, True))}
#: NVLink multicast (NVLS) off in every rank: set before the ranks are spawned, which inherit it.
ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
ITERS = {"gpu": (3, 20, 3), "cpu": (1, 3, 1)}       # (warm-up calls, timed calls, probed calls)
TIMING = ("benchmarks.ladder ring: every rank passes a barrier, then CUDA events around its call (the host "
          "clock on CPU ranks); a call's step time is the slower rank's; median of {timed} calls after {warmup} "
          "discarded; the L2 not flushed (a shard is larger than it). The one-GPU reference: the same block "
          "kernel over the whole sequence on rank 0's GPU, median of {timed}. Phases (compute, then the wait for "
          "the next shard) from events at the rung's marks over {probed} further calls, median per step")
#: What a ring row keeps besides the rate (facourse.results.compact).
ROW_KEYS = ("world", "ms", "ms_ref", "efficiency", "compute_ms", "wait_ms", "transfer_ms")


class Ring(Kind):
    name = "ring"
    label = " (ring)"
    world = 2
    table = "ring_table"
    note = "; speedup = t_one_GPU / t_step, efficiency = speedup / ranks"
    extra_row_keys = ROW_KEYS
    bench_keys = ("world", "ms", "rank_ms", "compute_ms", "wait_ms", "transfer_ms", "shard_mb")

    def plan(self, quick: bool, smoke: bool, checks: list[str] | None = None) -> tuple[list, list]:
        """(checks [(case, dtype)], timed configuration names) of a ring rung. On the GPUs: the shapes of
        every case of facourse.ring.RING_CASES, run on the ranks (ragged lengths, GQA, MQA, 7 rows over
        4 zigzag chunks), fp16 and bf16, then CONFIGS. --quick: the cases of this world in fp16, the 64k
        configuration; --cpu-smoke: the cases of this world in fp16, SMOKE_CONFIGS. Cases of several rings
        (``groups``) are the CPU check's only."""
        from ..ring import RING_CASES
        if checks is None:
            # a case of rings over subgroups checks the contract's group on CPU ranks; the runner's world is one ring
            ones = {c: rc for c, rc in RING_CASES.items() if rc.groups is None}
            mine = [c for c, rc in ones.items() if rc.world == self.world]
            checks = mine if quick or smoke else list(ones)
        dtypes = DTYPES[:1] if quick or smoke else DTYPES
        configs = list(SMOKE_CONFIGS if smoke else CONFIGS)
        return [(c, dt) for dt in dtypes for c in checks], configs[:1] if quick and not smoke else configs

    def ratios(self, d: dict) -> None:
        """Each bench row against the one-GPU time of its configuration: TFLOP/s of the causal visible
        pairs, ratio = speedup = t_one_GPU / t_step, efficiency = speedup / world."""
        configs = {**CONFIGS, **SMOKE_CONFIGS}
        for r in d["rows"]:
            one = d["one_gpu"].get(r["config"])
            if r["kind"] != "bench" or one is None or "ratio" in r:
                continue
            flops = configs[r["config"]].flops()
            r.update(ref_backend=d["reference"], ms_ref=one["ms"], tflops=round(flops / r["ms"] / 1e9, 2),
                     tflops_ref=round(flops / one["ms"] / 1e9, 2), ratio=round(one["ms"] / r["ms"], 4),
                     efficiency=round(one["ms"] / r["ms"] / r["world"], 4))

    def summary_lines(self, d: dict) -> list[str]:
        """The step against one GPU, and per rank the compute and the wait after it."""
        rows = [r for r in d["rows"] if r["kind"] == "bench"]
        if not rows:
            return []
        out = [f"{'rung':>22} {'config':>17} {'step ms':>8} {'1 GPU ms':>8} {'speedup':>7} {'eff.':>5} {'TFLOP/s':>7}  "
               "per rank: compute ms / wait ms after it; one shard's transfer alone"]
        for r in rows:
            one = d["one_gpu"].get(r["config"], {}).get("ms")
            ranks = ", ".join(f"{c:.2f} / {w:.2f}" for c, w in zip(r["compute_ms"], r["wait_ms"]))
            out.append(f"{r['rung']:>22} {r['config']:>17} {r['ms']:8.2f} {one or float('nan'):8.2f} "
                       f"{r.get('ratio', float('nan')):6.2f}x {r.get('efficiency', float('nan')):5.0%} "
                       f"{r.get('tflops', float('nan')):7.0f}  {ranks}; "
                       f"{r['transfer_ms']:.2f} ms ({r['shard_mb']:.0f} MB)")
        return out


KIND = Ring()
