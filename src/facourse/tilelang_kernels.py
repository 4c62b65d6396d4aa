"""TileLang attention programs: their tiles, running one (compiled by TileLang on a Hopper GPU, on the
CPU stand-in of ``facourse.tilelang_cpu`` elsewhere), its Hopper source without a GPU, and the CPU
check of exercise 11's TileLang kernel.

A program is a function ``program(T, dtype, D, causal, tiles, **options) -> prim_func`` of the
language module ``T`` (``tilelang.language``, or ``facourse.tilelang_cpu``), whose prim_func takes
``(Q, K, V, O, LSE, qk_scale)`` in the course's contract: Q ``[B, Hq, Sq, D]``, K and V
``[B, Hkv, Skv, D]``, contiguous, O like Q, LSE ``[B, Hq, Sq]`` float32 in natural log, and
``qk_scale = scale * log2(e)`` (the softmax runs in base 2: one FFMA and one exp2 per score).
The course's own is ``solutions/11_interchangeable_kernels/ladder/tilelang_fa.py``; exercise 11 asks
for one. :func:`run_attention` is the host side both share: inputs checked, outputs allocated, the
cases with no work answered on the host (no query, no key), the scale folded, the kernel launched.

TileLang compiles one kernel per (program, dtype, D, causal, tiles): sizes are symbolic, so a kernel
serves every B, H, Sq and Skv. The target is sm_90a (Hopper with wgmma and setmaxnreg; plain sm_90
fails TileLang's warp-specialised code) on an sm_90 GPU and where there is no GPU (nvcc builds it all
the same); TileLang's own pick on other GPUs.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from .configs import AttnConfig

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
HEAD_DIMS = (64, 128)                     # what the GPU kernels are compiled for
GPU_DTYPES = {torch.float16: "float16", torch.bfloat16: "bfloat16"}
CPU_DTYPES = {torch.float16: "float16", torch.float32: "float32"}   # NumPy has no bfloat16

#: The target when no GPU names one: Hopper with its arch-specific features (wgmma, setmaxnreg).
HOPPER = {"kind": "cuda", "arch": "sm_90a"}


@dataclass(frozen=True)
class Tiles:
    block_m: int = 128      # query rows per program
    block_n: int = 128      # keys per K/V tile
    num_stages: int = 2     # K/V tiles in flight (shared-memory ring of the TMA pipeline)
    threads: int = 256      # consumer threads (2 warpgroups); TileLang adds a producer warpgroup
    fast_math: bool = True  # nvcc --use_fast_math: exp2 -> ex2.approx.ftz

    def label(self) -> str:
        return (f"{self.block_m}x{self.block_n}, {self.num_stages} stages, {self.threads // 128} consumer WG"
                f"{'' if self.fast_math else ', no fast math'}")


#: Tiles by head dimension on an H100 (tilelang_fa.py's sweep settled them): 128 x 128, two consumer
#: warpgroups; D = 64 takes a third stage (its tiles are half the bytes).
TILES = {64: Tiles(128, 128, 3, 256), 128: Tiles(128, 128, 2, 256)}

#: Tiles the CPU stand-in runs programs with: small (it runs one element at a time), and of three
#: shapes, so that a program that assumes block_m == block_n, or a multiple of 64, shows it.
CPU_TILES = (Tiles(16, 16, 2, 128), Tiles(16, 32, 2, 128), Tiles(32, 16, 2, 128))


def pass_configs(tiles: Tiles) -> dict:
    return {"tl.enable_fast_math": bool(tiles.fast_math)}


def _language():
    try:
        import tilelang
        import tilelang.language as T
    except ImportError as err:
        raise ImportError(f"TileLang is not installed here ({err}): pip install tilelang==0.1.15 (the course's "
                          "pin), or run the program on the CPU stand-in (CPU tensors)") from None
    return tilelang, T


def _built(program, T, dtype, D, causal, tiles, options):
    func = program(T, dtype, D, causal, tiles, **dict(options))
    name = getattr(program, "__name__", "the program")
    if func is None:
        raise TypeError(f"{name} returned None: return the @T.prim_func it defines")
    if getattr(T, "__name__", "") == "facourse.tilelang_cpu" and not isinstance(func, T.Program):
        raise TypeError(f"{name} returned {type(func).__name__}, not a @T.prim_func of the language it was given")
    return func


@functools.lru_cache(maxsize=None)
def compile_program(program, dtype: str, D: int, causal: bool, tiles: Tiles, options: tuple = ()):
    """The compiled kernel (TileLang's JITKernel: its CUDA built by nvcc), cached per process.

    TileLang also caches builds on disk (TILELANG_CACHE_DIR, default ~/.tilelang/cache), keyed by the
    program, the target, the pass configs and TileLang's libraries, not by the machine: a cache filled
    on a CPU machine with nvcc (tools/carry_tilelang.py) is loaded on the GPU machine.
    """
    tilelang, T = _language()
    from tvm.target import Target

    cap = torch.cuda.get_device_capability() if torch.cuda.is_available() else None
    target = Target(HOPPER) if cap in (None, (9, 0)) else "auto"
    return tilelang.compile(_built(program, T, dtype, D, causal, tiles, options), target=target,
                            execution_backend="tvm_ffi", pass_configs=pass_configs(tiles))


def hopper_source(program, dtype: str = "float16", D: int = 128, causal: bool = True, tiles: Tiles | None = None,
                  options: tuple = ()) -> str:
    """The program lowered for sm_90a, as CUDA source: needs tilelang, no GPU and no nvcc (a dozen
    seconds on a CPU). TileLang's own errors (a shape its layouts cannot place, an operation it has
    not got) come from here as they would on a GPU."""
    tilelang, T = _language()
    from tvm.target import Target

    tiles = tiles or TILES[D]
    target = Target(HOPPER)
    with target, tilelang.transform.PassContext(config=pass_configs(tiles)):
        artifact = tilelang.lower(_built(program, T, dtype, D, causal, tiles, options), target=target)
    return artifact.kernel_source


def run_attention(program, q, k, v, causal=False, scale=None, tiles: Tiles | None = None):
    """Attention by a TileLang ``program``: on a GPU compiled by TileLang, on CPU tensors run on the CPU
    stand-in. q ``[B, Hq, Sq, D]``, k and v ``[B, Hkv, Skv, D]``, any strides (copied to contiguous
    ``[B, H, S, D]``, what the TMA descriptors take). Returns (o in q's dtype, lse float32, natural log).
    """
    from . import tilelang_cpu
    from .reference import AttentionInputError, default_scale, validate_inputs

    gpu = q.device.type == "cuda"
    validate_inputs(q, k, v, scale, head_dims=HEAD_DIMS if gpu else None)
    dtypes = GPU_DTYPES if gpu else CPU_DTYPES
    if q.dtype not in dtypes:
        where = "TileLang's kernels" if gpu else "the CPU stand-in (NumPy has no bfloat16)"
        raise AttentionInputError(f"{where} take {' or '.join(str(d) for d in dtypes)}, got {q.dtype}")
    B, Hq, Sq, D = q.shape
    Skv = k.shape[2]
    o = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty((B, Hq, Sq), dtype=torch.float32, device=q.device)
    if not gpu:
        o.fill_(float("nan")), lse.fill_(float("nan"))        # a row the program never writes shows
    if Sq == 0 or B == 0:
        return o, lse
    if Skv == 0:                                              # no key at all: every row is empty
        return o.zero_(), lse.fill_(float("-inf"))
    qk_scale = default_scale(D, scale) * LOG2E
    tiles = tiles or (TILES[D] if gpu else CPU_TILES[0])

    def ready(t):                   # contiguous, 16-byte aligned base (TMA descriptors need both)
        t = t.contiguous()
        return t if t.data_ptr() % 16 == 0 else t.clone()

    args = (ready(q), ready(k), ready(v), o, lse, qk_scale)
    if gpu:
        compile_program(program, dtypes[q.dtype], D, bool(causal), tiles)(*args)
    else:
        _built(program, tilelang_cpu, dtypes[q.dtype], D, bool(causal), tiles, ())(*args)
    return o, lse


# ----------------------------------------------------------------------------- exercise 11's CPU check
def _case(name, B, Hq, Hkv, Sq, Skv, causal, **kw):
    return AttnConfig(f"tilelang_{name}", B, Hq, Hkv, Sq, Skv, 32, causal, **kw)


#: The kinds of the five configurations and the edge cases, at sizes the CPU stand-in runs in well
#: under a second each (D = 32; 16- and 32-wide tiles): causal ones and the others, graded apart.
CPU_CASES: dict[str, tuple[AttnConfig, ...]] = {
    "causal": (
        _case("square", 1, 4, 2, 48, 48, True),                 # the diagonal crosses three query tiles
        _case("asymmetric", 1, 4, 1, 20, 70, True),             # Sq < Skv: bottom-right, ragged K/V tile
        _case("ragged", 2, 2, 1, 37, 53, True),                 # neither length a multiple of a tile
        _case("empty_rows", 1, 2, 1, 50, 19, True),             # Sq > Skv: the first 31 rows see no key
        _case("decode", 1, 4, 1, 1, 45, True),                  # one query row
    ),
    "other": (
        _case("noncausal", 1, 4, 2, 40, 56, False),
        _case("mqa", 1, 4, 1, 33, 33, False),                   # one KV head for every query head
        _case("overflow", 1, 2, 1, 32, 48, False, logit_scale=64.0),   # logits in the hundreds
    ),
}


def check_tilelang_cpu(fn, *, seed: int, cases: str = "causal", verbose: bool = True) -> None:
    """Exercise 11's CPU check: ``fn(q, k, v, causal=..., tiles=...)`` (the program bound to
    :func:`run_attention`) on CPU_CASES[cases], fp16, each case with the next tile shape of CPU_TILES;
    the course's check with its diagnosis. Raises AttentionCheckError on the first case that fails."""
    from .check import AttentionCheckError, check_entry_point

    for i, cfg in enumerate(CPU_CASES[cases]):
        tiles = CPU_TILES[i % len(CPU_TILES)]
        try:
            check_entry_point(functools.partial(fn, tiles=tiles), cfg, seed=(seed + i) % 2**31, device="cpu",
                              dtype=torch.float16, expect_lse=True, verbose=verbose)
        except AttentionCheckError as err:
            raise AttentionCheckError(f"{err}\n  (on the CPU stand-in of TileLang, tiles block_m = {tiles.block_m}, "
                                      f"block_n = {tiles.block_n})") from None
