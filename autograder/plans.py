"""What each graded cell is judged on: the judge's side of the hidden tests.

A hidden cell only says ``judge("test_large", tiled_attention)``; what that test checks lives
here, where the kernel cannot change it. Each test is a list of checks (``autograder/checks.py``,
by name, with their keyword arguments; the judge adds a fresh secret seed to each), plus:

* ``guard``: the entry point runs inside ``forbid_framework_attention`` (``{"exponentials": True}``: inside
  ``forbid_exponentials`` instead, step 14's exp2_poly) (in the kernel: its
  finding is evidence the judge receives); ``{"allow_softmax": True}`` for step 01; None for the
  softmax steps, whose functions are not attention;
* ``needs``: ``"gpu"`` (sm_80+) or ``"sm90a"``: without it the test scores 0 and says why;
* ``bind``: keyword arguments bound to the entry point for one check (block sizes of step 04);
* ``count_flops``: the kernel reports each call's matmul FLOPs (step 04's tile skipping);
* ``perf``: a timing cell: the check is the correctness half, the kernel's timing is the other;
* ``sass``: the judge compiles the submitted ``student_kernel.cu`` itself and reads its SASS;
* ``perf``'s ``"mode"`` names the step kind (``facourse.kinds``) that times and counts it: none, the
  forward; ``"backward"`` (step 08); ``"decode"`` (step 09: GB/s of K and V read); ``"variant"``
  (step 10: against compiled FlexAttention on the same mask, TFLOP/s on visible pairs);
* ``train``: the entry point is a training one (step 08): the check calls it through
  ``facourse.backward.forward_backward`` (one forward, one backward: o, dq, dk, dv and the state
  the forward kept), inside the guard, so the guard covers the backward too.
* ``ring`` (step 12): the entry point runs on the ranks of the check's case, forked processes in a
  ``gloo`` group (``facourse.ring.on_ring``, its keyword arguments: the time limit of one call);
  what the check calls and the kernel records is the result gathered in global order, and with
  the check's ``traffic`` the bytes each rank moved point to point and through collectives.
* ``interchange`` (step 11): what the student's function is reduced to in the kernel before the
  check sees it (``facourse.interchange``): ``"definition"`` (``make_definition()`` as JSON text),
  ``"reference"`` (the ``run`` of that definition's reference source), ``"traces"`` (the list
  ``trace_solutions`` returns, as JSON texts), ``"deploy"`` (the attention that ``deploy(root)``
  gives on the routing trace set of the check's seed, deployed at its first call), ``"tilelang"``
  (the TileLang program as an attention function: ``facourse.tilelang_kernels.run_attention`` bound to
  it, which runs it on the CPU stand-in for CPU tensors and compiled by TileLang for GPU ones; the perf
  tests time that function too).

A test passes when every check passes in the judge; a perf test then earns what
``thresholds.toml`` gives its measured ratio. Tests are all-or-nothing otherwise. One test, one
cause: no two tests of a plan run the same check with the same arguments, so a mistake that breaks
one case costs the points of one test (tests/test_one_cause.py).
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field, replace


@dataclass(frozen=True)
class Check:
    name: str
    kwargs: dict = field(default_factory=dict)
    bind: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Test:
    checks: tuple = ()
    guard: dict | None = None
    needs: str | None = None
    count_flops: bool = False
    perf: dict | None = None
    sass: bool = False
    train: bool = False
    ring: dict | None = None
    interchange: str | None = None


def _attn(*configs, **kw) -> tuple:
    return tuple(Check("entry_point", {"config": c, **kw}) for c in configs)


def _attention_step(expect_lse: bool, guard: dict, needs: str | None = None) -> dict[str, Test]:
    """The tests every attention step shares: the five configurations and the edge cases."""
    lse = {"expect_lse": True} if expect_lse else {}

    def t(*checks, **kw):
        return Test(tuple(checks), guard=guard, needs=needs, **kw)

    return {
        "test_small": t(*_attn("small", **lse), Check("entry_point", {"config": "small", "scale": 0.05, **lse})),
        "test_medium": t(Check("no_caching", {"config": "medium", **lse})),
        "test_large": t(*_attn("large", **lse)),
        "test_noncausal": t(*_attn("noncausal", **lse)),
        "test_asymmetric": t(*_attn("asymmetric", **lse)),
        "test_edge_ragged": t(*_attn("ragged", "ragged_noncausal", **lse)),
        "test_edge_empty_rows": t(*_attn("empty_rows", **lse)),
    }


def _each(check: str, key: str, cases, *, guard: dict | None, needs: str | None = None, train: bool = False,
          **kw) -> Test:
    """One test running ``check`` on each case (passed as ``key``) with the same other arguments."""
    return Test(tuple(Check(check, {key: c, **kw}) for c in cases), guard=guard, needs=needs, train=train)


def _on_cases(check: str, guard: dict, *cases, needs: str | None = None, **kw) -> Test:
    """``_each`` on named cases (steps 09 and 10)."""
    return _each(check, "case", cases, guard=guard, needs=needs, **kw)


def _perf(step: str, capability=None, needs="gpu", *, check: str = "perf_correctness", key: str = "config",
          cases=("large", "long"), mode: str | None = None, train: bool = False, **kw) -> dict[str, Test]:
    """The perf tests of a step: one per graded configuration, timed by the kind ``mode`` (default forward)."""
    extra = {} if mode is None else {"mode": mode}
    return {f"perf_{c}": Test((Check(check, {key: c, **kw}),), guard=None, needs=needs, train=train,
                              perf={"step": step, "config": c, "capability": capability, **extra})
            for c in cases}


#: the kernels of steps 08-10 and 15 compute their products with tl.dot, no softmax over a whole row, in Triton
_TRITON_KERNEL = {"allow_softmax": False, "forbid_matmul": True, "require_triton": 3}


def _step01() -> dict[str, Test]:
    return _attention_step(False, {"allow_softmax": True})


def _step02() -> dict[str, Test]:
    def sm(*cases):
        return Test(tuple(Check("softmax", c if isinstance(c, dict) else {"case": c}) for c in cases))

    return {
        "test_small": sm("small"),
        "test_configs": sm("medium", "large", "noncausal", "asymmetric"),
        "test_ragged": sm("ragged"),
        "test_overflow": sm("overflow", {"case": "overflow", "dtype": "float16"}),
        "test_masked": sm("masked"),
        "test_all_masked": sm("all_masked"),
        "test_half": sm("half", {"case": "small", "dtype": "float16"}),
        "test_other_dims": sm("other_dims"),
    }


def _step03() -> dict[str, Test]:
    def online(*cases, **kw):
        return Test(tuple(Check("softmax", {"case": c, "block_size": b, **({"dtype": d} if d else {}), **kw})
                          for c, b, d in cases))

    def merge(case):
        return Test((Check("merge", {"case": case}),))

    return {
        "test_merge_random": merge("random"),
        "test_small": online(("small", 32, None)),
        "test_merge_empty": merge("empty"),
        "test_merge_large": merge("large"),
        "test_merge_chain": merge("chain"),
        "test_configs": online(("medium", 64, None), ("large", 128, None), ("noncausal", 64, None),
                               ("asymmetric", 256, None)),
        "test_ragged": online(("ragged", 16, None), ("ragged", 64, None), ("ragged", 100, None)),
        # the online loop's own handling of large and of -inf logits, with the course's merge: a merge that
        # exponentiates the maxima is test_merge_large's mistake alone, one that NaNs on empty states test_merge_empty's
        "test_overflow": online(("overflow", 64, None), ("overflow", 32, "float16"),
                                course_merge_for="merge_softmax_states"),
        "test_masked": online(("masked", 50, None), ("masked", 128, None), ("all_masked", 64, None),
                              course_merge_for="merge_softmax_states"),
        "test_half": online(("half", 64, None), ("small", 16, "float16")),
    }


def _step04() -> dict[str, Test]:
    guard = {"allow_softmax": False}
    lse = {"expect_lse": True}
    tests = _attention_step(True, guard)
    tests.update({
        "test_edge_decode": Test(_attn("decode", **lse), guard=guard),
        "test_edge_d64": Test(_attn("d64", **lse), guard=guard),
        "test_edge_mqa": Test(_attn("mqa", **lse), guard=guard),
        "test_edge_overflow": Test(_attn("overflow", **lse), guard=guard),
        "test_edge_strides": Test((Check("entry_point", {"config": "small", "layout": "bhsd", **lse}),
                                   Check("padded_strides", {"config": "ragged"})), guard=guard),
        "test_block_sizes": Test(tuple(Check("entry_point", {"config": c, **lse}, bind={"block_m": bm, "block_n": bn})
                                       for bm, bn in ((16, 32), (64, 64), (128, 16)) for c in ("ragged", "empty_rows")),
                                 guard=guard),
        "test_tile_skipping": Test((Check("tile_skipping"),), guard=guard, count_flops=True),
    })
    return tests


def _step05() -> dict[str, Test]:
    guard = {"allow_softmax": False, "forbid_kv_copies": True, "require_triton": 3}
    lse = {"expect_lse": True}
    tests = _attention_step(True, guard)
    tests.update({
        "test_edge_decode": Test(_attn("decode", **lse), guard=guard),
        "test_edge_d64_mqa": Test(_attn("d64", "mqa", **lse), guard=guard),
        "test_edge_overflow": Test(_attn("overflow", **lse), guard=guard),
        **_perf("05_triton_flash_attention"),
    })
    return tests


def _cuda_step(step: str, needs: str, capability) -> dict[str, Test]:
    guard = {"allow_softmax": False}
    lse = {"expect_lse": True}
    tests = _attention_step(True, guard, needs=needs)
    tests["test_edge_other"] = Test(_attn("decode", "d64", "mqa", "overflow", **lse), guard=guard, needs=needs)
    tests.update(_perf(step, capability, needs))
    return tests


def _step06() -> dict[str, Test]:
    tests = _cuda_step("06_cuda_flash_attention", "gpu", None)
    tests["test_bf16"] = Test(_attn("medium", "ragged", "empty_rows", expect_lse=True, dtype="bfloat16"),
                              guard={"allow_softmax": False}, needs="gpu")
    return tests


def _step07() -> dict[str, Test]:
    tests = _cuda_step("07_hopper_flash_attention", "sm90a", [9, 0])
    tests["test_bf16"] = Test((Check("all_configs", {"dtypes": ["bfloat16"], "expect_lse": True}),),
                              guard={"allow_softmax": False}, needs="sm90a")
    tests["test_structure"] = Test(sass=True)
    return tests


def _step08() -> dict[str, Test]:
    guard = {**_TRITON_KERNEL, "require_triton": 4}        # the backward's kernels read dO

    def t(*configs, needs=None, **kw):
        return _each("gradients", "config", configs, guard=guard, needs=needs, train=True, **kw)

    tests = {
        "test_small": Test((Check("gradients", {"config": "small"}),
                            Check("gradients", {"config": "small", "scale": 0.05, "layout": "bhsd"})),
                           guard=guard, train=True),
        "test_medium": t("medium"),
        "test_large": t("large"),
        "test_noncausal": t("noncausal"),
        "test_asymmetric": t("asymmetric"),
        "test_edge_ragged": t("ragged", "ragged_noncausal"),
        "test_edge_decode": t("decode"),
        "test_edge_empty_rows": t("empty_rows"),
        "test_edge_d64_mqa": t("d64", "mqa"),
        "test_edge_overflow": t("overflow"),
        "test_gradcheck": Test((Check("gradcheck"),), guard=guard, train=True),
        "test_bf16": t("medium", "ragged", "empty_rows", needs="gpu", dtype="bfloat16"),
    }
    tests.update(_perf("08_backward", check="perf_gradients", mode="backward", train=True))
    return tests


def _step09() -> dict[str, Test]:
    guard = {**_TRITON_KERNEL, "key_lengths": (4, "lengths")}      # seq_lens: a softmax over its keys is a whole row
    t = functools.partial(_on_cases, "paged", guard)
    tests = {
        "test_mixed": t("mixed"),           # the speculative case is test_spec's alone: one mistake, one test
        # the same pages with logits in the hundreds: a merge of the splits must subtract the max lse
        "test_page64": Test((Check("paged", {"case": "page64"}), Check("paged", {"case": "page64", "logit_scale": 64.0})),
                            guard=guard),
        "test_page48": t("page48"),
        "test_prefix": t("prefix"),
        "test_mqa": t("mqa"),
        # Sq = 4 and 8 new tokens (the contract's most), the one check with int64 seq_lens
        "test_spec": Test((Check("paged", {"case": "spec"}), Check("paged", {"case": "spec", "scale": 0.05}),
                           Check("paged", {"case": "spec", "Sq": 8, "lens_dtype": "int64"})), guard=guard),
        "test_d64": t("d64"),
        "test_bf16": t("mixed", "spec", "page48", needs="gpu", dtype="bfloat16"),
        "test_bad_inputs": Test((Check("paged_bad_inputs"),), guard=guard),
    }
    tests.update(_perf("09_decode_paged_kv", check="paged", key="case", mode="decode",
                       cases=("b64_8k_p16", "b16_32k_p64"), dtype="float16"))
    return tests


def _step10() -> dict[str, Test]:
    guard = _TRITON_KERNEL
    t = functools.partial(_on_cases, "variant", guard)
    tests = {
        "test_causal": Test((Check("variant", {"case": "causal"}), Check("variant", {"case": "causal", "scale": 0.05}),
                             Check("variant", {"case": "causal_asymmetric"})), guard=guard),
        "test_window": t("window", "window_ragged"),
        "test_window_edges": t("window_1", "window_beyond", "window_empty_rows"),
        "test_alibi": t("alibi"),
        "test_softcap": t("softcap", "window_softcap", "softcap_alibi_window", "softcap_ragged"),
        "test_documents": t("documents_alibi", "documents_short", "d64_documents"),
        "test_prefix": t("prefix", "mqa_window"),
        "test_block_mask": _each("block_mask", "case", ("window_ragged", "documents_alibi", "prefix", "softcap_ragged"),
                                 guard=guard),
        "test_tile_lists": _each("tile_lists", "case", ("window", "documents_alibi"), guard=guard),
        "test_bf16": t("window", "documents_alibi", "softcap_alibi_window", needs="gpu", dtype="bfloat16"),
    }
    tests.update(_perf("10_attention_variants", check="perf_variant", key="case", mode="variant",
                       cases=("window1024_8k", "window1024_16k")))
    return tests


def _step12() -> dict[str, Test]:
    # The time limit of one ring call (CPU, gloo ranks): the cases take about a second; a deadlocked
    # ring fails its test after this, and the notebook goes on. FACOURSE_RING_TIMEOUT (seconds), in
    # the grading process's environment, changes it (a slow machine; the course's tests of deadlocks).
    ring = {"timeout": float(os.environ.get("FACOURSE_RING_TIMEOUT", "30"))}

    # Every ring check also checks the traffic: K/V passed point to point, not gathered (the design of
    # lecture 12's all-gather demo, a correct attention that is not the ring this exercise asks for).
    def t(*cases, **kw):
        return Test(tuple(Check("ring", {"case": c, "traffic": True, **kw}) for c in cases), ring=ring)

    return {
        "test_merge": Test((Check("ring_merge"),)),
        "test_noncausal": Test((Check("ring", {"case": "w2_noncausal", "traffic": True}),
                                Check("ring", {"case": "w4_noncausal", "scale": 0.05, "traffic": True})), ring=ring),
        # with logits in the hundreds (a merge must subtract the larger lse) and a scale given
        "test_causal": Test((Check("ring", {"case": "w2_causal", "traffic": True}),
                             Check("ring", {"case": "w4_causal", "traffic": True}),
                             Check("ring", {"case": "w2_causal", "traffic": True, "logit_scale": 64.0}),
                             Check("ring", {"case": "w4_causal", "traffic": True, "scale": 0.05})), ring=ring),
        "test_ragged": t("w3_ragged", "w3_ragged_noncausal"),
        # the contract's edges: MQA, a chunk of 0 rows, and two rings at once over subgroups of a world of 4
        "test_gqa_edges": t("w2_mqa", "w4_short", "w4_two_rings"),
        "test_bf16": t("w2_causal", dtype="bfloat16"),
    }


def _step11() -> dict[str, Test]:
    guard = {"allow_softmax": False}

    def t(check, what):
        return Test((Check(check),), interchange=what)

    return {
        "test_definition": t("definition", "definition"),
        "test_definition_reference": t("definition_reference", "reference"),
        "test_traces": t("traces", "traces"),
        "test_routing": Test((Check("routing", {"workloads": ["A", "B"]}),), interchange="deploy"),
        "test_fallback": Test((Check("routing", {"workloads": ["C"]}),), interchange="deploy"),
        # the TileLang program: on the CPU stand-in (any grading machine), then compiled on an H100/H200
        "test_tilelang_causal": Test((Check("tilelang_cpu", {"cases": "causal"}),), guard=guard,
                                     interchange="tilelang"),
        "test_tilelang_other": Test((Check("tilelang_cpu", {"cases": "other"}),), guard=guard,
                                    interchange="tilelang"),
        "test_tilelang_gpu": Test((Check("all_configs", {"dtypes": ["float16", "bfloat16"], "expect_lse": True}),),
                                  guard=guard, needs="sm90a", interchange="tilelang"),
        **{name: replace(t, interchange="tilelang")
           for name, t in _perf("11_interchangeable_kernels", [9, 0], "sm90a").items()},
    }


def _step13() -> dict[str, Test]:
    # the answers are numbers: each case's inputs come from the committed ncu run or the seed, on the CPU
    return {f"test_{fn}_{case}": Test((Check(fn, {"case": case}),))
            for fn in ("occupancy", "roofline") for case in ("records", "random", "edges")}


def _step14() -> dict[str, Test]:
    # exp2_poly may not reach PyTorch's exponentials (the guard); the update may (it uses exp2 as the kernel does)
    exp2 = {case: Test((Check("exp2", {"case": case}),), guard={"exponentials": True})
            for case in ("softmax", "grid", "edges")}
    rescale = {case: Test((Check("rescale", {"case": case}),)) for case in ("random", "growing", "eager", "masked")}
    return {**{f"test_exp2_{c}": t for c, t in exp2.items()}, **{f"test_rescale_{c}": t for c, t in rescale.items()}}


def _step15() -> dict[str, Test]:
    guard = {**_TRITON_KERNEL, "key_lengths": (4, "offsets")}      # cu_seqlens_k: a softmax over its keys is a whole row
    paged = {**_TRITON_KERNEL, "key_lengths": (5, "lengths")}
    v = functools.partial(_on_cases, "varlen", guard)
    p = functools.partial(_on_cases, "paged_prefill", paged)
    return {
        # the same batch with logits in the hundreds: an exponential that skips the running max overflows
        "test_packed": Test((Check("varlen", {"case": "packed"}), Check("varlen", {"case": "packed", "logit_scale": 64.0}),
                             Check("varlen", {"case": "packed", "scale": 0.05})), guard=guard),
        "test_noncausal": v("noncausal"),
        "test_prefix": v("prefix"),
        "test_empty_rows": v("empty_rows"),
        "test_gqa_d64": v("mqa", "d64"),
        "test_chunks": Test((Check("paged_prefill", {"case": "chunks"}),
                             Check("paged_prefill", {"case": "chunks", "scale": 0.05})), guard=paged),
        "test_page48": p("page48"),
        "test_shared_prefix": p("shared_prefix"),
        "test_paged_d64": p("paged_d64"),
        "test_bf16": v("packed", "prefix", needs="gpu", dtype="bfloat16"),
        "test_paged_bf16": p("chunks", "page48", needs="gpu", dtype="bfloat16"),
    }


PLANS = {
    "01_vanilla_attention": _step01,
    "02_safe_softmax": _step02,
    "03_online_softmax": _step03,
    "04_tiled_attention": _step04,
    "05_triton_flash_attention": _step05,
    "06_cuda_flash_attention": _step06,
    "07_hopper_flash_attention": _step07,
    "08_backward": _step08,
    "09_decode_paged_kv": _step09,
    "10_attention_variants": _step10,
    "11_interchangeable_kernels": _step11,
    "12_ring_attention": _step12,
    "13_profiling": _step13,
    "14_after_hopper": _step14,
    "15_serving": _step15,
}


def plan_of(assignment: str) -> dict[str, Test]:
    """The judge's plan of ``assignment``: grade_id -> Test."""
    try:
        return PLANS[assignment]()
    except KeyError:
        raise KeyError(f"no judge plan for {assignment!r}: add one to autograder/plans.py") from None
