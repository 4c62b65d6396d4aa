"""The checks a hidden test runs, by name: the same code on both sides of the judge.

In the kernel (``autograder.judge_client``) each check runs under ``facourse.check.collecting()``
with the student's entry point wrapped in a recorder: it draws the inputs from the judge's seed
and calls the function exactly as the check always does, but verifies nothing. In the judge
(``autograder.judge``) the same check runs again on inputs regenerated from the same seed, with a
stand-in function that hands back the recorded outputs call by call; there it verifies, with the
course's one rule, and its message is the student's feedback. So the diagnosis is the one a
student gets from ``facourse`` while working, and no student code takes part in it.

Every check takes ``fn`` and keyword arguments only: ``seed`` and ``device`` from the judge, the
rest from the step's plan (``autograder/plans.py``), JSON values (dtypes as names). Most are a step
module's check as it is (``adapt``: the JSON values converted); the few below say what they add.
"""
from __future__ import annotations

import torch

from facourse import (AttnConfig, check_all, check_attention, check_entry_point, check_merge_fn,
                      check_softmax_fn, get_config, make_inputs)
from facourse.backward import check_forward_backward, gradcheck_forward_backward
from facourse.check import is_collecting
from facourse.decode import check_paged_bad_inputs, check_paged_decode
from facourse.fa4 import check_exp2_fn, check_rescale_fn
from facourse.profiling import check_occupancy_fn, check_roofline_fn
from facourse.interchange import (check_definition, check_definition_reference, check_routing,
                                  check_traces)
from facourse.ring import check_merge_partials, check_ring
from facourse.serving import check_paged_prefill, check_varlen
from facourse.tilelang_kernels import check_tilelang_cpu
from facourse.variants import check_block_mask, check_perf_variant, check_tile_lists, check_variant

from .guards import check_no_caching


def dtype_of(name):
    return None if name is None else getattr(torch, name)


#: How a plan's JSON values become a check's arguments (dtypes by name; sequences as tuples).
_ARGUMENTS = {"dtype": dtype_of, "dtypes": lambda names: tuple(dtype_of(d) for d in names), "workloads": tuple}


def adapt(check, *, device: bool = True, **fixed):
    """``check(fn, seed=, device=, **kwargs)`` as the judge calls every check: the plan's JSON values
    converted (``_ARGUMENTS``), ``device`` left out for a check that runs where its own inputs live (on
    the CPU: forked ranks, the TileLang stand-in, FlashInfer-Bench's objects), ``fixed`` added."""
    def run(fn, *, seed, device=None, **kw):
        kw = {k: _ARGUMENTS[k](v) if k in _ARGUMENTS and v is not None else v for k, v in kw.items()}
        return check(fn, seed=seed, **({"device": device} if passes_device else {}), **fixed, **kw)

    passes_device = device
    run.__name__ = getattr(check, "__name__", "check")
    run.__doc__ = check.__doc__
    return run


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
    with ``guards.MatmulFlops`` where the function ran, reported as ``fn.last_flops``) must be
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


def perf_gradients(fn, *, seed, device, config, dtype="float16"):
    """The correctness half of a step-08 perf test: o and the gradients at the timed full size."""
    check_forward_backward(fn, get_config(config, device), seed=seed, device=device, dtype=dtype_of(dtype))


# Step 11: ``fn`` is the student's function as plans' ``interchange`` wraps it in the kernel
# (judge_client._wrap): the definition as JSON text, its reference's run, the traces as JSON texts, the
# deployed attention (deployed on facourse.interchange.routing_trace_set of this check's seed).
def definition(fn, *, seed, device):
    check_definition(fn())


# Step 08's checks get facourse.backward.forward_backward of the training entry point (plans' ``train``);
# step 12's ``ring`` the ring already run on the case's ranks (plans' ``ring``): a function of the global
# q, k, v whose result is (o, lse), and with ``traffic`` the bytes each rank moved.
CHECKS = {
    "entry_point": adapt(check_entry_point),
    "no_caching": adapt(check_no_caching),
    "all_configs": adapt(check_all),
    "softmax": adapt(check_softmax_fn),
    "merge": adapt(check_merge_fn),
    "padded_strides": padded_strides,
    "tile_skipping": tile_skipping,
    "perf_correctness": perf_correctness,
    "gradients": adapt(check_forward_backward),
    "gradcheck": adapt(gradcheck_forward_backward),
    "perf_gradients": perf_gradients,
    "paged": adapt(check_paged_decode),
    "varlen": adapt(check_varlen),
    "paged_prefill": adapt(check_paged_prefill),
    "paged_bad_inputs": adapt(check_paged_bad_inputs),
    "variant": adapt(check_variant),
    "block_mask": adapt(check_block_mask),
    "tile_lists": adapt(check_tile_lists),
    "perf_variant": adapt(check_perf_variant),
    "ring": adapt(check_ring, device=False, distributed=False),
    "ring_merge": adapt(check_merge_partials, device=False),
    "definition": definition,
    "definition_reference": adapt(check_definition_reference, device=False),
    "traces": adapt(check_traces, device=False),
    "routing": adapt(check_routing, device=False),
    "tilelang_cpu": adapt(check_tilelang_cpu, device=False),
    "occupancy": adapt(check_occupancy_fn),
    "roofline": adapt(check_roofline_fn),
    "exp2": adapt(check_exp2_fn),
    "rescale": adapt(check_rescale_fn),
}
