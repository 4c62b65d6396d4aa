"""The visible feedback of the exercises: a fast set of named cases per step, chosen to catch the
classic bugs before grading.

    from facourse import check_visible
    check_visible(tiled_attention, "04")

Each case is one call of the course's one check (``check_entry_point``, ``check_softmax_fn`` or
``check_merge_fn``) on a named configuration, with a fixed seed, so a re-run gives the same result.
The first failure stops the run with the check's own message (the case, the wrong rows, the likely
cause); a pass prints one line per case. The cases are picked so that each classic bug of the step
fails one of them, in the interpreter's tile sizes as in a GPU's:

* 02: overflow-sized logits (no max subtraction), fully -inf rows (no -inf guard), dims other than
  the last (ignoring ``dim``);
* 03: rows no multiple of the block size (the last, partial block), blocks whose entries are all
  -inf, several blocks per row whose max grows (alpha), empty states in the merge;
* 14: the polynomial over every fraction and for x < 0, -inf and underflow (exp2_poly); maxima that
  grow by less than, exactly and more than the threshold, threshold 0, rows with no score yet;
* 04, 05: several key tiles (alpha), Sq != Skv (top-left causal, the causal offset), ragged
  lengths (the last partial query or key tile, the launch grid), rows that see no key, decode,
  MQA, overflow-sized logits, a scale argument.

The hidden tests stay the graded truth: they run more configurations with seeds you never see.
"""
from __future__ import annotations

import time

from .check import check_entry_point
from .fa4 import check_exp2_fn, check_rescale_fn
from .softmax_check import check_merge_fn, check_softmax_fn

#: step -> [(case, options, what it catches)]
VISIBLE_CASES: dict[str, list[tuple[str, dict, str]]] = {
    "02": [
        ("small", {}, "attention scores with -inf entries (causal)"),
        ("overflow", {}, "logits in the hundreds: exp() overflows without subtracting the max"),
        ("all_masked", {}, "fully -inf rows: their softmax is 0, not NaN"),
        ("other_dims", {}, "softmax along dim 0, 1 and -2: the dim argument"),
        ("ragged", {}, "rows of many lengths"),
        ("masked", {}, "rows with runs of -inf"),
        ("half", {}, "float16 inputs"),
    ],
    "03": [
        ("small", {"block_size": 32}, "causal scores, 4 blocks per row: the alpha rescale"),
        ("ragged", {"block_size": 64}, "rows no multiple of the block size: the last, shorter block"),
        ("overflow", {"block_size": 48}, "logits in the hundreds, a partial last block"),
        ("masked", {"block_size": 50}, "rows whose first blocks are all -inf"),
        ("all_masked", {"block_size": 64}, "fully -inf rows and blocks"),
        ("half", {"block_size": 64}, "float16 inputs"),
    ],
    "03_merge": [
        ("random", {}, "two random states"),
        ("empty", {}, "empty states (m = -inf, l = 0) on one side or both"),
        ("large", {}, "maxima in the thousands"),
        ("chain", {}, "many blocks merged left to right and as a tree"),
    ],
    "04": [
        ("small", {}, "causal, GQA, 2 key tiles of 64"),
        ("small", {"scale": 0.05}, "a scale argument"),
        ("asymmetric", {}, "Sq = 128 against Skv = 2048: bottom-right causal, many key tiles"),
        ("ragged", {}, "Sq = 200, Skv = 333: the last, partial query and key tiles"),
        ("ragged", {"bind": {"block_m": 16, "block_n": 32}}, "the same with other tile sizes"),
        ("empty_rows", {}, "Sq > Skv: rows that see no key give o = 0, lse = -inf"),
        ("decode", {}, "Sq = 1 against a KV cache"),
        ("mqa", {}, "one KV head for all query heads"),
        ("overflow", {}, "logits in the hundreds"),
    ],
    "05": [   # `small` (and a scale argument) is the graded visible test's; the interpreter is slow
        ("ragged", {}, "Sq = 200, Skv = 333: several key tiles (the interpreter's are 128 wide), "
                       "Sq != Skv, a partial last query tile"),
        ("ragged_noncausal", {}, "non-causal, several key tiles"),
        ("empty_rows", {}, "Sq > Skv: rows that see no key give o = 0, lse = -inf"),
        ("decode", {}, "Sq = 1 against a KV cache"),
        ("d64", {}, "D = 64"),
        ("overflow", {}, "logits in the hundreds"),
    ],
    "14_exp2": [
        ("grid", {}, "every fraction f in [0, 1) at n from -24 to 8: the polynomial's accuracy, floor for x < 0"),
        ("edges", {}, "-inf (masked scores), x below -126, whole numbers"),
    ],
    "14_rescale": [
        ("growing", {}, "maxima that grow by less than, exactly, and more than the threshold; thresholds 8 and 2"),
        ("eager", {}, "threshold 0: the online softmax of steps 03-05"),
        ("masked", {}, "rows with no finite score yet: m = -inf"),
    ],
}


def visible_cases(step: str) -> list[tuple[str, dict, str]]:
    step = str(step)
    if step not in VISIBLE_CASES:
        raise KeyError(f"no visible cases for step {step!r}; known: {', '.join(VISIBLE_CASES)}")
    return VISIBLE_CASES[step]


def _bound(fn, bind: dict):
    if not bind:
        return fn

    def call(q, k, v, **kwargs):
        return fn(q, k, v, **kwargs, **bind)
    return call


def check_visible(fn, step: str, *, device=None, verbose: bool = True) -> None:
    """Run step ``step``'s visible cases on ``fn``; stop at the first failure with its message.

    ``step`` is "02" (``safe_softmax``), "03" (``online_softmax``), "03_merge"
    (``merge_softmax_states``), "04" (``tiled_attention``), "05" (``flash_attention_triton``), "14_exp2"
    (``exp2_poly``) or "14_rescale" (``lazy_rescale_update``).
    Returns nothing (nbgrader reads a cell's displayed value as partial credit).
    """
    cases = visible_cases(step)
    t0 = time.perf_counter()
    for i, (case, opts, what) in enumerate(cases):
        if verbose:
            print(f"{case}{'' if not opts else ' ' + str(opts)}: {what}", flush=True)
        seed = 1000 + i
        if step in ("02", "03"):
            check_softmax_fn(fn, case, block_size=opts.get("block_size"), seed=seed, device=device,
                             verbose=verbose)
        elif step == "03_merge":
            check_merge_fn(fn, case, seed=seed, device=device, verbose=verbose)
        elif step == "14_exp2":
            check_exp2_fn(fn, case, seed=seed, device=device, verbose=verbose)
        elif step == "14_rescale":
            check_rescale_fn(fn, case, seed=seed, device=device, verbose=verbose)
        else:
            check_entry_point(_bound(fn, opts.get("bind")), case, seed=seed, device=device,
                              expect_lse=True, scale=opts.get("scale"), verbose=verbose)
    if verbose:
        print(f"all {len(cases)} visible cases passed ({time.perf_counter() - t0:.1f} s). The hidden "
              "tests run more configurations, with seeds you do not see.")
