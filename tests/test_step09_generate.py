"""Step 09 in use: solutions/09_decode_paged_kv/ladder/generate.py, a tiny transformer generating through
a paged KV cache (prefill by step 05's kernel, decode by step 09's), in Triton's interpreter.

One subprocess (TRITON_INTERPRET=1 set before triton is imported, whatever other test modules
imported first) runs the paged generation and the cache-free PyTorch loop in float32 on 3 prompts
of 5, 16 and 29 tokens, 8 new tokens, pages of 16: the first prompt stays inside its partly filled
page, the second fills its page exactly and crosses into a new one at the first decode step, the
third crosses at token 32 halfway through. The tokens must equal the reference's, token for token,
the logits agree to float32 rounding, and the top-1 margins of the reference be far above that
rounding (greedy decisions that are not knife-edge: the equality is not luck). The cache must give
distinct sequences distinct pages, take a page only when a sequence crosses into it, and the kernels
must have run (calls counted). The test can fail: a decode that forgets to count the new token in
seq_lens (a classic slip of the contract) changes the logits.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from conftest import ROOT

GENERATE = ROOT / "solutions" / "09_decode_paged_kv" / "ladder" / "generate.py"
LENGTHS, NEW_TOKENS, PAGE = (5, 16, 29), 8, 16

SCRIPT = f"""
    import importlib.util, json, sys, time
    spec = importlib.util.spec_from_file_location("step09_generate", {str(GENERATE)!r})
    gen = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = gen; spec.loader.exec_module(gen)
    import torch

    model = gen.TinyLM(seed=0)
    prompts = gen.random_prompts({LENGTHS!r}, model.cfg.vocab, seed=1)
    p05, d09 = gen.load_kernels()
    prefill, decode = gen.counted(p05), gen.counted(d09)
    t0 = time.time()
    run = gen.generate(model, prompts, {NEW_TOKENS}, page_size={PAGE}, prefill=prefill, decode=decode)
    t1 = time.time()
    ref = gen.reference_generate(model, prompts, {NEW_TOKENS})

    def forgets_new_token(q, k_cache, v_cache, block_table, seq_lens):
        return d09(q, k_cache, v_cache, block_table, seq_lens - 1)
    bad = gen.generate(model, prompts, {NEW_TOKENS}, page_size={PAGE}, prefill=p05, decode=forgets_new_token)

    c = run.cache
    print("RESULT " + json.dumps(dict(
        tokens=run.tokens, ref_tokens=ref.tokens, distinct=[len(set(t)) for t in ref.tokens],
        logit_err=float((run.logits - ref.logits).abs().max()), margin=gen.top1_margin(ref.logits),
        bad_logit_err=float((bad.logits - ref.logits).abs().max()),
        prefill_calls=prefill.calls, decode_calls=decode.calls, layers=model.cfg.layers,
        pages=c.pages, lens=c.lens, seq_lens=c.seq_lens.tolist(), block_table=c.block_table.tolist(),
        num_pages=c.num_pages, free=c.free, taken=c.taken, seconds=round(t1 - t0, 1))), flush=True)
    """


def test_paged_generation_matches_the_cache_free_loop():
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]))
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(SCRIPT)], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = json.loads(next(ln for ln in r.stdout.splitlines() if ln.startswith("RESULT "))[7:])

    # the paged run gives the reference's tokens, token for token, and its logits to rounding
    assert res["tokens"] == res["ref_tokens"], res
    assert all(len(t) == NEW_TOKENS for t in res["tokens"])
    assert res["logit_err"] < 1e-3, res["logit_err"]
    # greedy decisions that are not knife-edge: every top-1 margin of the reference is far above
    # the paged run's logit error (the model's head is scaled so that logits have std ~ 8; the
    # margin is what protects a decision, the scale only sets its unit)
    assert res["margin"] > 20 * res["logit_err"], (res["margin"], res["logit_err"])
    assert max(res["distinct"]) > 3, res["distinct"]      # not one token repeated: the sequences move

    # the kernels ran: step 05's once per prompt and layer, step 09's once per decode step and layer
    L = res["layers"]
    assert res["prefill_calls"] == len(LENGTHS) * L, res["prefill_calls"]
    assert res["decode_calls"] == (NEW_TOKENS - 1) * L, res["decode_calls"]

    # the cache: each sequence holds its prompt and every generated token but the last
    final = [n + NEW_TOKENS - 1 for n in LENGTHS]
    assert res["lens"] == final and res["seq_lens"] == final, (res["lens"], res["seq_lens"])
    pages = res["pages"]
    assert [len(p) for p in pages] == [-(-n // PAGE) for n in final], pages
    used = [p for ps in pages for p in ps]
    assert len(used) == len(set(used)), f"sequences share a page: {pages}"   # distinct pages
    assert all(0 <= p < res["num_pages"] for p in used) and not set(used) & set(res["free"])
    assert len(used) + len(res["free"]) == res["num_pages"]
    for b, ps in enumerate(pages):
        assert res["block_table"][b][:len(ps)] == ps, (b, res["block_table"][b], ps)
    # a page is taken only when its sequence crosses into it: the call that took page j of a
    # sequence wrote its token j * PAGE
    for b, j, start, end in res["taken"]:
        assert start <= j * PAGE < end, (b, j, start, end)
    in_decode = {(b, j) for b, j, start, end in res["taken"] if end - start == 1}
    assert in_decode == {(1, 1), (2, 2)}, res["taken"]     # 16 -> 17 at the first step, 29 -> 33 later

    # the comparison can fail: a decode that leaves the new token out of seq_lens is caught
    assert res["bad_logit_err"] > 100 * max(res["logit_err"], 1e-6), res["bad_logit_err"]
