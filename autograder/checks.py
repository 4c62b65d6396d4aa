"""The checks a hidden test runs, by name: the same code on both sides of the judge.

In the kernel (``autograder.judge_client``) each check runs under ``facourse.check.collecting()``
with the student's entry point wrapped in a recorder: it draws the inputs from the judge's seed
and calls the function exactly as the check always does, but verifies nothing. In the judge
(``autograder.judge``) the same check runs again on inputs regenerated from the same seed, with a
stand-in function that hands back the recorded outputs call by call; there it verifies, with the
course's one rule, and its message is the student's feedback. So the diagnosis is the one a
student gets from ``facourse`` while working, and no student code takes part in it.

Every check takes ``fn`` and keyword arguments only: ``seed`` and ``device`` from the judge, the
rest from the step's plan (``autograder/plans.py``), JSON values (dtypes as names).
"""
from __future__ import annotations

import torch

from facourse import (AttnConfig, check_all, check_attention, check_entry_point, check_merge_fn,
                      check_softmax_fn, get_config, make_inputs)
from facourse.backward import check_forward_backward, gradcheck_forward_backward
from facourse.check import is_collecting
from facourse.decode import check_paged_bad_inputs, check_paged_decode
from facourse.interchange import (check_definition, check_definition_reference, check_routing,
                                  check_traces)
from facourse.ring import check_merge_partials, check_ring
from facourse.tilelang_kernels import check_tilelang_cpu
from facourse.variants import check_block_mask, check_perf_variant, check_tile_lists, check_variant

from .guards import check_no_caching


def dtype_of(name):
    return None if name is None else getattr(torch, name)


def entry_point(fn, *, seed, device, config, dtype=None, **kw):
    check_entry_point(fn, config, seed=seed, device=device, dtype=dtype_of(dtype), **kw)


def no_caching(fn, *, seed, device, config, dtype=None, **kw):
    check_no_caching(fn, config, seed=seed, device=device, dtype=dtype_of(dtype), **kw)


def all_configs(fn, *, seed, device, dtypes, **kw):
    check_all(fn, seed=seed, device=device, dtypes=tuple(dtype_of(d) for d in dtypes), **kw)


def softmax(fn, *, seed, device, case, dtype=None, block_size=None):
    check_softmax_fn(fn, case, seed=seed, device=device, dtype=dtype_of(dtype), block_size=block_size)


def merge(fn, *, seed, device, case):
    check_merge_fn(fn, case, seed=seed, device=device)


def padded_strides(fn, *, seed, device, config="ragged"):
    """Inputs whose rows are 2·D apart with NaN in the gap: a kernel that assumes contiguity reads NaN."""
    cfg = get_config(config, device)
    q, k, v = (torch.cat([t, torch.full_like(t, float("nan"))], dim=-1)[..., :cfg.D]
               for t in make_inputs(cfg, seed, device, layout="bhsd"))
    o, lse = fn(q, k, v, causal=cfg.causal)
    check_attention(o, q, k, v, cfg.causal, lse=lse, config=f"{cfg.name}, row stride 2*D", seed=seed)


TILE_SKIP = AttnConfig("tile_skip", 1, 4, 2, 256, 256, 32, True)


def tile_skipping(fn, *, seed, device, blocks=((64, 64), (32, 64), (64, 32))):
    """Causal tiles entirely above the diagonal are skipped: the matmul FLOPs of each call (counted
    with PyTorch's FLOP counter where the function ran, reported as ``fn.last_flops``) must be
    those of an FA2 loop that stops at the diagonal."""
    cfg = TILE_SKIP
    q, k, v = make_inputs(cfg, seed, device, layout="bshd")
    for bm, bn in blocks:
        o, lse = fn(q, k, v, causal=True, block_m=bm, block_n=bn)
        check_attention(o, q, k, v, True, lse=lse, config=f"tile_skip, block_m={bm}, block_n={bn}", seed=seed)
        if is_collecting():
            continue
        # FA2 with tile skipping: Q tile [i0, i1) multiplies keys 0 .. (its visible key tiles) * block_n
        need = sum(4 * cfg.B * cfg.Hq * cfg.D * (min(i0 + bm, cfg.Sq) - i0)
                   * min(cfg.Skv, -(-min(i0 + bm, cfg.Sq) // bn) * bn) for i0 in range(0, cfg.Sq, bm))
        full = 4 * cfg.B * cfg.Hq * cfg.D * cfg.Sq * cfg.Skv
        got = float(getattr(fn, "last_flops", None) or 0)
        print(f"block_m={bm}, block_n={bn}: matmul FLOPs {got:.3g}; skipping needs {need:.3g}, all tiles {full:.3g}")
        if got < 0.5 * need:
            raise AssertionError(
                f"[tile_skip] the FLOP counter saw only {got:.3g} matmul FLOPs of the {need:.3g} a causal FA2 "
                "loop needs: compute S = Q K^T and P V with torch.matmul (or @) so that this test can count them")
        if got > 1.1 * need:
            raise AssertionError(
                f"[tile_skip] your matmuls did {got / full:.0%} of the work of all tiles, where skipping the tiles "
                f"entirely above the diagonal needs {need / full:.0%}.\n  likely cause: key tiles above the "
                "causal diagonal are computed and then masked; stop the inner loop at min(Skv, i1 + Skv - Sq) and "
                "mask elements only in the tiles the diagonal crosses")


def perf_correctness(fn, *, seed, device, config, dtype="float16", **kw):
    """The correctness half of a perf test: the result at the timed configuration's full size."""
    check_entry_point(fn, get_config(config, device), seed=seed, device=device, dtype=dtype_of(dtype),
                      expect_lse=True, **kw)


# Step 08: ``fn`` is ``facourse.backward.forward_backward`` of the training entry point (plans' ``train``).
def gradients(fn, *, seed, device, config, dtype=None, **kw):
    check_forward_backward(fn, config, seed=seed, device=device, dtype=dtype_of(dtype), **kw)


def gradcheck(fn, *, seed, device):
    gradcheck_forward_backward(fn, seed=seed, device=device)


def perf_gradients(fn, *, seed, device, config, dtype="float16"):
    """The correctness half of a step-08 perf test: o and the gradients at the timed full size."""
    check_forward_backward(fn, get_config(config, device), seed=seed, device=device, dtype=dtype_of(dtype))


# Step 09: ``fn`` is ``paged_decode(q, k_cache, v_cache, block_table, seq_lens, scale=None)``.
def paged(fn, *, seed, device, case, dtype=None, **kw):
    check_paged_decode(fn, case, seed=seed, device=device, dtype=dtype_of(dtype), **kw)


def paged_bad_inputs(fn, *, seed, device):
    check_paged_bad_inputs(fn, seed=seed, device=device)


# Step 10: ``fn`` is ``flex_attention_triton(q, k, v, mask=, score_mod=, scale=, block_mask=)``, or for
# ``block_mask`` the builder ``build_block_mask(mask, B, H, Sq, Skv, BLOCK_M, BLOCK_N, device)``.
def variant(fn, *, seed, device, case, dtype=None, **kw):
    check_variant(fn, case, seed=seed, device=device, dtype=dtype_of(dtype), **kw)


def block_mask(fn, *, seed, device, case):
    check_block_mask(fn, case, seed=seed, device=device)


def tile_lists(fn, *, seed, device, case):
    check_tile_lists(fn, case, seed=seed, device=device)


def perf_variant(fn, *, seed, device, case):
    check_perf_variant(fn, case, seed=seed, device=device)


# Step 12: ``fn`` is the ring attention already run on the case's ranks (plans' ``ring``): a function of
# the global q, k, v whose result is (o, lse), and with ``traffic`` the bytes each rank moved.
def ring(fn, *, seed, device, case, dtype=None, scale=None, traffic=False):
    check_ring(fn, case, seed=seed, dtype=dtype_of(dtype), scale=scale, traffic=traffic, distributed=False)


def ring_merge(fn, *, seed, device):
    check_merge_partials(fn, seed=seed)


# Step 11: ``fn`` is the student's function as plans' ``interchange`` wraps it in the kernel
# (judge_client._wrap): the definition as JSON text, its reference's run, the traces as JSON texts, the
# deployed attention (deployed on facourse.interchange.routing_trace_set of this check's seed).
def definition(fn, *, seed, device):
    check_definition(fn())


def definition_reference(fn, *, seed, device):
    check_definition_reference(fn, seed=seed)


def traces(fn, *, seed, device):
    check_traces(fn, seed=seed)


def routing(fn, *, seed, device, workloads):
    check_routing(fn, seed=seed, workloads=tuple(workloads))


def tilelang_cpu(fn, *, seed, device, cases):
    """The TileLang program on the CPU stand-in (on CPU tensors on any grading machine, GPU or not)."""
    check_tilelang_cpu(fn, seed=seed, cases=cases)


CHECKS = {f.__name__: f for f in (entry_point, no_caching, all_configs, softmax, merge, padded_strides,
                                  tile_skipping, perf_correctness, gradients, gradcheck, perf_gradients,
                                  paged, paged_bad_inputs, variant, block_mask, tile_lists, perf_variant,
                                  ring, ring_merge, definition, definition_reference, traces, routing,
                                  tilelang_cpu)}
