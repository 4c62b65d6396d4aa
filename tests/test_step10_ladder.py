"""Step 10, attention variants: the rungs of solutions/10_attention_variants/ladder in Triton's interpreter.

One subprocess (TRITON_INTERPRET=1 set before triton is imported; one import of torch and triton for
the whole file) loads the rungs by path and reports every check; the tests below read its reports.

* v1-v4 (``flex_attention_triton``) against facourse.variants.variant_reference (float64) on every
  variant: causal, sliding windows of 16, 1 and one longer than the sequence, ALiBi + causal, softcap,
  softcap + ALiBi with a window, documents (some of length 1) + ALiBi, prefix-LM, no mask, and
  Sq != Skv (48 x 80, 80 x 48) with causal and a window; float32, and float16 on a subset. Lengths
  are no multiples of the tiles; rows that see no key must give o = 0 exactly and lse = -inf.
* build_block_mask's classes against a direct PyTorch classification, its lists (sorted, counted) and
  its batch and head extents.
* Block masks with tiles removed and relabelled (a partial tile as full, a ragged tile as full, a full
  tile dropped, one head only, junk past the counts): v3 and v4 must equal
  variant_reference(visible=visible_pairs(...)), which differs from the unmodified reference (so a
  kernel ignoring the lists fails).
* v5 (FP8): its kernel, run in the interpreter through run_kernel, with the quantised values held in
  fp16 (the logic exactly: descales, the transposed V, causal split, empty rows) and in e4m3 (loosely);
  its entry points refuse a CPU.
"""
from __future__ import annotations

import pytest

from conftest import ROOT
from ladder_helpers import one_result, run_in_interpreter

LADDER = ROOT / "solutions" / "10_attention_variants" / "ladder"
RUNGS = ["v1_dense_mask", "v2_mask_fn", "v3_block_mask", "v4_tuned"]

# name: (B, Sq, Skv, mask, score_mod) as Python expressions of facourse.variants (V) and torch
VARIANTS = {
    "causal": (1, 130, 130, "V.causal(Sq, Skv)", "None"),
    "window16": (1, 130, 130, "V.sliding_window(16, Sq, Skv)", "None"),
    "window1": (1, 100, 100, "V.sliding_window(1, Sq, Skv)", "None"),
    "window_longer_than_seq": (1, 100, 100, "V.sliding_window(500, Sq, Skv)", "None"),
    "alibi_causal": (1, 130, 130, "V.causal(Sq, Skv)", "V.alibi(Hq, Sq, Skv)"),
    "softcap": (1, 100, 100, "None", "V.softcap(2.0)"),
    "softcap_alibi_window": (1, 130, 130, "V.sliding_window(16, Sq, Skv)", "V.softcap_alibi(2.0, Hq, Sq, Skv)"),
    "documents_alibi": (2, 130, 130, "V.documents(DOCS)", "V.alibi(Hq, Sq, Skv)"),
    "prefix_lm": (2, 130, 130, "V.prefix_lm(torch.tensor([40, 3]), Sq, Skv)", "None"),
    "no_mask": (1, 100, 100, "None", "None"),
    "causal_48x80": (1, 48, 80, "V.causal(Sq, Skv)", "None"),
    "causal_80x48": (1, 80, 48, "V.causal(Sq, Skv)", "None"),
    "window_48x80": (1, 48, 80, "V.sliding_window(16, Sq, Skv)", "None"),
    "window_80x48": (1, 80, 48, "V.sliding_window(16, Sq, Skv)", "None"),
}
FP16 = ["causal_80x48", "softcap_alibi_window", "documents_alibi"]
CHECKS = [(r, name, "float32") for r in RUNGS for name in VARIANTS] + \
         [(r, name, "float16") for r in RUNGS[2:] for name in FP16]
TAMPERED = ["partial_as_full", "ragged_as_full", "full_dropped", "one_head", "junk_past_counts"]

SCRIPT = f"""
    import facourse.variants as V

    sys.path.insert(0, str(LADDER))

    def attempt(fn, **kw):
        t0 = time.time()
        try:
            fn()
            err = None
        except Exception:
            err = traceback.format_exc()[-2500:]
        report(error=err, seconds=round(time.time() - t0, 2), **kw)

    rungs = {{name: load(name) for name in {RUNGS!r}}}
    vc = sys.modules["variants_common"]
    v5 = load("v5_fp8")
    Hq, Hkv, D = 2, 1, 64
    # documents of lengths 1, 40, 1, 1, 87 (row 0) and 130 (row 1)
    DOCS = torch.tensor([[0] + [1] * 40 + [2, 3] + [4] * 87, [0] * 130])
    gen = torch.Generator().manual_seed(10)

    def inputs(B, Sq, Skv, dtype, Hq=Hq, Hkv=Hkv):
        q = torch.randn(B, Hq, Sq, D, generator=gen).to(dtype)
        k, v = (torch.randn(B, Hkv, Skv, D, generator=gen).to(dtype) for _ in range(2))
        return q, k, v

    def close(o, lse, o_ref, lse_ref, atol):
        empty = lse_ref == -math.inf
        assert torch.equal(lse == -math.inf, empty), "rows with no key differ"
        assert bool((o[empty] == 0).all()), "a row with no key has o != 0"
        assert not torch.isnan(o).any() and not torch.isnan(lse).any(), "NaN"
        err_o = (o.double() - o_ref).abs().max().item()
        err_l = (lse - lse_ref)[~empty].abs().max().item() if (~empty).any() else 0.0
        assert err_o < atol and err_l < atol, f"max |o - ref| {{err_o:.2e}}, max |lse - ref| {{err_l:.2e}}"

    # ------------------------------------------------------------------ every rung, every variant
    for rung, name, dtype in {CHECKS!r}:
        B, Sq, Skv, mask_src, score_src = {VARIANTS!r}[name]
        def check():
            mask, score_mod = eval(mask_src), eval(score_src)
            q, k, v = inputs(B, Sq, Skv, getattr(torch, dtype))
            o, lse = rungs[rung].flex_attention_triton(q, k, v, mask, score_mod)
            assert o.dtype == q.dtype and lse.dtype == torch.float32
            close(o, lse, *V.variant_reference(q, k, v, mask, score_mod), 2e-5 if dtype == "float32" else 4e-3)
        attempt(check, kind="variant", rung=rung, case=name, dtype=dtype)

    # ------------------------------------------------------------------ build_block_mask
    def direct_classes(mask, B, H, Sq, Skv, BM, BN):
        Tq, Tk = -(-Sq // BM), -(-Skv // BN)
        vis = torch.zeros(B, H, Tq * BM, Tk * BN, dtype=torch.bool)
        vis[..., :Sq, :Skv] = V.mask_values(mask, B, H, Sq, Skv)
        vis = vis.view(B, H, Tq, BM, Tk, BN)
        return torch.where(vis.all(5).all(3), 2, torch.where(vis.any(5).any(3), 1, 0))

    def classes_from_lists(bm, B, H):
        Tk = bm.partial_idx.shape[-1]
        cls = torch.zeros(*bm.partial_idx.shape, dtype=torch.long)
        for value, num, idx in ((1, bm.partial_num, bm.partial_idx), (2, bm.full_num, bm.full_idx)):
            counted = torch.arange(Tk) < num[..., None].long()
            assert bool((idx.diff(dim=-1)[..., :] > 0)[counted[..., 1:]].all()), "listed tiles not increasing"
            cls.scatter_add_(-1, idx.long().where(counted, 0), counted.long() * value)
        assert int(cls.max()) <= 2, "a tile listed twice"
        return cls.expand(B, H, *cls.shape[2:])

    for name, (B, Sq, Skv, mask_src), BM, BN, extent in [
            ("causal", (1, 130, 130, "V.causal(Sq, Skv)"), 32, 16, (1, 1)),
            ("window16_80x48", (1, 80, 48, "V.sliding_window(16, Sq, Skv)"), 16, 32, (1, 1)),
            ("documents", (2, 130, 130, "V.documents(DOCS)"), 32, 32, (2, 1)),
            ("prefix_lm", (2, 130, 130, "V.prefix_lm(torch.tensor([40, 3]), Sq, Skv)"), 64, 16, (2, 1)),
            ("no_mask", (1, 100, 70, "None"), 64, 64, (1, 1))]:
        def check():
            mask = eval(mask_src)
            bm = vc.build_block_mask(mask, B, Hq, Sq, Skv, BM, BN)
            assert tuple(bm.partial_num.shape[:2]) == extent, (tuple(bm.partial_num.shape), extent)
            for t in (bm.partial_num, bm.partial_idx, bm.full_num, bm.full_idx):
                assert t.dtype == torch.int32
            want = direct_classes(mask, B, Hq, Sq, Skv, BM, BN)
            assert torch.equal(classes_from_lists(bm, B, Hq), want), "classes differ from the direct ones"
            assert int((want == 2).sum()) > 0 or name == "window16_80x48", "no full tile: a weak case"
        attempt(check, kind="classes", case=name)

    # ------------------------------------------------------------------ tampered block masks
    def tampered(how, B, Sq, Skv, BM, BN):
        \"\"\"A causal block mask for 130 x 130 (tiles 32 x 32), changed: its classes [Bm, Hm, Tq, Tk].\"\"\"
        cls = direct_classes(V.causal(Sq, Skv), 1, 1, Sq, Skv, BM, BN).clone()
        Tq, Tk = cls.shape[2:]
        if how == "partial_as_full":          # the diagonal tiles: their upper triangles come in
            cls[..., 1, 1] = 2
            cls[..., 3, 3] = 2
        elif how == "ragged_as_full":         # the last key tile reaches past Skv: bounds still apply
            cls[..., Tq - 1, Tk - 1] = 2
        elif how == "full_dropped":           # a full tile and a partial tile left out
            cls[..., 2, 0] = 0
            cls[..., 3, 3] = 0
        elif how == "one_head":               # head 1 only: the block mask has Hm = Hq
            cls = cls.expand(1, Hq, Tq, Tk).clone()
            cls[:, 1, 2, 1] = 0
            cls[:, 1, 1, 1] = 2
        return cls

    def block_mask_of(cls, Sq, Skv, BM, BN, junk=False):
        pn, pi, fn, fi = V.lists_of(cls, BM, BN, Sq, Skv)[:4]
        if junk:                               # entries past the counts are anything: make them harmful
            Tk = cls.shape[-1]
            noise = torch.randint(0, Tk, pi.shape, generator=gen, dtype=torch.int32)
            past = torch.arange(Tk) >= pn[..., None]
            pi = torch.where(past, noise, pi)
            fi = torch.where(torch.arange(Tk) >= fn[..., None], noise.flip(-1), fi)
        return V.BlockMask(pn, pi, fn, fi, BM, BN, Sq, Skv)

    for how in {TAMPERED!r}:
        for rung in ("v3_block_mask", "v4_tuned"):
            def check():
                B, Sq, Skv, BM, BN = 1, 130, 130, 32, 32
                mask = V.causal(Sq, Skv)
                cls = tampered("full_dropped" if how == "junk_past_counts" else how, B, Sq, Skv, BM, BN)
                bm = block_mask_of(cls, Sq, Skv, BM, BN, junk=how == "junk_past_counts")
                visible = V.visible_pairs(bm, mask, B, Hq)
                q, k, v = inputs(B, Sq, Skv, torch.float32)
                o, lse = rungs[rung].flex_attention_triton(q, k, v, mask, V.alibi(Hq, Sq, Skv), block_mask=bm)
                ref = V.variant_reference(q, k, v, mask, V.alibi(Hq, Sq, Skv), visible=visible)
                close(o, lse, *ref, 2e-5)
                plain = V.variant_reference(q, k, v, mask, V.alibi(Hq, Sq, Skv))
                assert (plain[0] - ref[0]).abs().max() > 1e-2, "the change made no difference: a weak case"
            attempt(check, kind="tampered", rung=rung, case=how)

    # ------------------------------------------------------------------ v5, FP8
    for name, (B, Hq5, Hkv5, Sq, Skv, causal) in {{"causal_gqa_80x48": (1, 4, 2, 80, 48, True),
                                                   "causal_48x80": (1, 2, 1, 48, 80, True),
                                                   "full_70x100": (2, 2, 2, 70, 100, False)}}.items():
        def check():
            q, k, v = inputs(B, Sq, Skv, torch.float16, Hq5, Hkv5)
            (q8, dq), (k8, dk), (v8, dv) = (v5.quantize_fp8(t) for t in (q, k, v))
            assert q8.dtype == torch.float8_e4m3fn and dq.shape == (B, Hq5) and dk.shape == (B, Hkv5)
            deq = [x8.double() * d[..., None, None] for x8, d in ((q8, dq), (k8, dk), (v8, dv))]
            o_ref, lse_ref = V.variant_reference(*deq, V.causal(Sq, Skv) if causal else None)
            # the quantised values held in fp16 (exact): everything but P's rounding to e4m3
            args = (q8.half(), k8.half(), v8.half().transpose(-1, -2).contiguous(), dq, dk, dv, causal, None)
            close(*v5.run_kernel(*args, torch.float16), o_ref, lse_ref, 4e-3)
            # e4m3 throughout: P's rounding costs a few percent of o (the interpreter's casts are not
            # the GPU's round-to-nearest)
            o8, lse8 = v5.run_kernel(q8, k8, v8.transpose(-1, -2).contiguous(), dq, dk, dv, causal, None,
                                     torch.float16)
            assert o8.dtype == torch.float16 and torch.equal(lse8 == -math.inf, lse_ref == -math.inf)
            rel = ((o8.double() - o_ref).norm() / o_ref.norm()).item()
            assert rel < 0.15, f"e4m3: relative error {{rel:.3f}}"
            assert (lse8 - lse_ref)[lse_ref > -math.inf].abs().max() < 1e-3
        attempt(check, kind="fp8", case=name)

    def refuses_cpu():
        q = torch.randn(1, 1, 16, 64, dtype=torch.float16)
        try:
            v5.flash_attention_fp8(q, q, q)
        except RuntimeError as e:
            assert "sm_89" in str(e), e
        else:
            raise AssertionError("flash_attention_fp8 ran on a CPU")
    attempt(refuses_cpu, kind="fp8", case="refuses_cpu")
"""


@pytest.fixture(scope="module")
def results():
    return run_in_interpreter(LADDER, "ladder10_", SCRIPT)


@pytest.mark.parametrize("rung,case,dtype", CHECKS)
def test_variant_matches_reference(results, rung, case, dtype):
    one_result(results, kind="variant", rung=rung, case=case, dtype=dtype)


@pytest.mark.parametrize("case", ["causal", "window16_80x48", "documents", "prefix_lm", "no_mask"])
def test_build_block_mask_classes(results, case):
    one_result(results, kind="classes", case=case)


@pytest.mark.parametrize("rung", ["v3_block_mask", "v4_tuned"])
@pytest.mark.parametrize("case", TAMPERED)
def test_visits_exactly_the_listed_tiles(results, rung, case):
    one_result(results, kind="tampered", rung=rung, case=case)


@pytest.mark.parametrize("case", ["causal_gqa_80x48", "causal_48x80", "full_70x100", "refuses_cpu"])
def test_fp8(results, case):
    one_result(results, kind="fp8", case=case)
