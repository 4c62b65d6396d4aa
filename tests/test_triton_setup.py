"""facourse.triton_setup's changes to Triton's interpreter (the CPU tier runs every Triton kernel there).

The interpreter swaps triton.language's functions at every call of a ``@triton.jit`` helper; the
course swaps them once per launch and module instead. A kernel calling helpers (its own, and
triton.language's standard ones such as tl.sum) in a loop must give the same result with and without
that change, swap each module at most once per launch with it, and leave triton.language as it found it
after each launch. Its lighter frontend (a tuple's type worked out when first read, NumPy dtypes from one
table, block types and tensor shapes worked out once per shape, no overflow checks that cannot fire)
must give the same results, types, dtypes and shapes as Triton's own.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from conftest import ROOT

SCRIPT = textwrap.dedent("""
    import json, os, sys
    os.environ["TRITON_INTERPRET"] = "1"
    import triton.runtime.interpreter as interp
    if sys.argv[1] == "triton":                       # Triton's own behaviour: the course's change off
        interp._patch_lang.once_per_launch = True
    from facourse.triton_setup import interpret_without_gpu
    interpret_without_gpu()
    import torch
    import triton
    import triton.language as tl

    swaps = []
    core = interp._patch_lang_core
    interp._patch_lang_core = lambda lang, scope: (swaps.append(lang.__name__), core(lang, scope))[1]

    @triton.jit
    def relu2(x):
        return tl.maximum(x, 0.0) * 2.0

    @triton.jit
    def kernel(X, Y, N: tl.constexpr):
        pid = tl.program_id(0)
        for i in range(4):
            offs = (pid * 4 + i) * N + tl.arange(0, N)
            x = tl.load(X + offs)
            tl.store(Y + offs, relu2(x) + tl.sum(x, 0))

    load = tl.load
    x = torch.randn(3 * 4 * 16, generator=torch.Generator().manual_seed(0))
    out = []
    for launch in range(2):
        y = torch.empty_like(x)
        kernel[(3,)](x, y, 16)
        out.append(y.tolist())
    want = (torch.relu(x) * 2 + x.view(12, 16).sum(1).repeat_interleave(16)).tolist()
    print(json.dumps({"swaps": len(swaps), "out": out, "want": want, "restored": tl.load is load}))
""")


def _run(mode: str, script: str = SCRIPT) -> dict:
    """The JSON ``script`` prints last, run with the course's changes ("course") or Triton's own ("triton")."""
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "-c", script, mode], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_helpers_swap_the_language_once_per_launch():
    course, triton_own = _run("course"), _run("triton")
    for res in (course, triton_own):
        for y in res["out"]:
            assert max(abs(a - b) for a, b in zip(y, res["want"])) < 1e-4
        assert res["restored"], "triton.language was left swapped after a launch"
    assert course["out"] == triton_own["out"]
    # two launches: the kernel's triton.language, then a standard helper's modules (tl.sum's
    # triton.language.core and triton.language), each swapped once per launch
    assert course["swaps"] <= 2 * 3, course["swaps"]
    # Triton alone swaps again at each helper call: 3 programs x 4 iterations x (relu2, tl.sum, ...)
    assert triton_own["swaps"] >= 3 * 4 * 2 * 2, triton_own["swaps"]


FRONTEND = textwrap.dedent("""
    import json, os, sys
    os.environ["TRITON_INTERPRET"] = "1"
    import triton.language as tl
    import triton.runtime.interpreter as interp
    orig_np_dtype = interp._get_np_dtype
    if sys.argv[1] == "triton":                       # Triton's own behaviour: the course's change off
        tl.core.tuple.__init__.lazy_type = True
    from facourse.triton_setup import interpret_without_gpu
    interpret_without_gpu()
    import torch
    import triton

    @triton.jit
    def stats(x):
        return tl.max(x, 0), tl.sum(x, 0)

    @triton.jit
    def kernel(X, Y, N: tl.constexpr):
        pid = tl.program_id(0)
        x = tl.load(X + pid * N + tl.arange(0, N))
        tl.static_assert(x.shape[0] == N)
        pair = stats(x)
        m, s = pair
        both = (m, s) + (pair[1],)
        tl.store(Y + pid * N + tl.arange(0, N), x * both[0] - both[1] + both[2])

    x = torch.randn(3 * 16, generator=torch.Generator().manual_seed(0))
    y = torch.empty_like(x)
    kernel[(3,)](x, y, 16)
    t = tl.tuple([tl.constexpr(4), tl.constexpr(8)])
    lazy = "type" not in t.__dict__
    named = tl.tuple([tl.constexpr(1)], tl.core.tuple_type([tl.core.constexpr_type(1)], ["a"]))
    kinds = [tl.int1, tl.int8, tl.uint8, tl.int16, tl.int32, tl.uint32, tl.int64, tl.float16, tl.bfloat16,
             tl.float32, tl.float64, tl.float8e4nv, tl.float8e5]
    kinds += [tl.block_type(k, [16, 4]) for k in kinds] + [tl.pointer_type(tl.float16),
                                                            tl.block_type(tl.pointer_type(tl.float32), [8])]
    dtypes = [str(interp._get_np_dtype(k)) == str(orig_np_dtype(k)) for k in kinds]
    facts = []
    for _ in range(2):                                # the second time from the course's caches
        bt = [tl.block_type(tl.float32, [16, 4]), tl.block_type(tl.float32, [tl.constexpr(16), 4]),
              tl.block_type(tl.pointer_type(tl.float16), [8]), tl.block_type(tl.pointer_type(tl.float16, const=True), [8])]
        ts = [tl.core.tensor(None, b) for b in bt] + [tl.core.tensor(None, tl.float32)]
        facts += [[str(b), b.numel, list(b.shape), str(b.element_ty)] for b in bt]
        facts += [[f"{type(x.shape).__module__}.{type(x.shape).__name__}", repr(x.numel), [repr(s) for s in x.shape],
                   str(x.dtype)] for x in ts]
        facts.append(ts[0].shape is not ts[1].shape)
        for bad in ([3], [0]):
            try:
                tl.block_type(tl.float32, bad)
            except (TypeError, ValueError) as e:
                facts.append(type(e).__name__ + ": " + str(e))
    print(json.dumps({"out": y.tolist(), "lazy": lazy, "type": str(t.type), "named": str(named.type),
                      "dtypes": all(dtypes), "facts": facts}))
""")


def test_the_frontend_is_lighter_and_computes_the_same():
    course, triton_own = _run("course", FRONTEND), _run("triton", FRONTEND)
    assert course["out"] == triton_own["out"]
    assert course["type"] == triton_own["type"], "a tuple's type read later differs from the one Triton makes"
    assert course["named"] == triton_own["named"] == "[a:constexpr_type[1]]", "a tuple lost the type it was given"
    assert course["dtypes"], "a NumPy dtype differs from Triton's"
    assert course["facts"] == triton_own["facts"], "a block type or a tensor's shape differs from Triton's"
    assert course["lazy"] and not triton_own["lazy"], "the tuple's type was worked out when it was made"


OVERFLOW = textwrap.dedent("""
    import json, os, sys
    os.environ["TRITON_INTERPRET"] = "1"
    import triton.runtime.interpreter as interp
    from triton.language.semantic import TritonSemantic
    if sys.argv[1] == "triton":                       # Triton's own behaviour: the course's change off
        interp.InterpreterBuilder.__init__.no_dead_checks = True
    from facourse.triton_setup import interpret_without_gpu
    interpret_without_gpu()
    import torch
    import triton
    import triton.language as tl

    asserts = []
    orig = TritonSemantic.device_assert
    TritonSemantic.device_assert = lambda self, *a: (asserts.append(1), orig(self, *a))[1]

    @triton.jit
    def kernel(X, Y, N: tl.constexpr):
        pid = tl.program_id(0)
        offs = pid * N + tl.arange(0, N)
        x = tl.load(X + offs)
        tl.store(Y + offs, x * 1000003 + 7 - pid)     # wraps around in int32 for large x

    x = torch.randint(-2**31, 2**31 - 1, (4 * 16,), dtype=torch.int32, generator=torch.Generator().manual_seed(0))
    y = torch.empty_like(x)
    kernel[(4,)](x, y, 16)
    print(json.dumps({"out": y.tolist(), "asserts": len(asserts)}))
""")


def test_overflow_checks_that_cannot_fire_are_skipped_and_values_are_the_same():
    """Without ``debug`` the interpreter's overflow checks end in a ``device_assert`` that does nothing:
    the course skips them. The kernel's values (int32 wrapping around included) are Triton's."""
    course, triton_own = _run("course", OVERFLOW), _run("triton", OVERFLOW)
    assert course["out"] == triton_own["out"]
    assert triton_own["asserts"] > 0, "Triton's own interpreter no longer checks overflow: drop the course's change"
    assert course["asserts"] == 0, "the interpreter still computes overflow checks that cannot fire"
