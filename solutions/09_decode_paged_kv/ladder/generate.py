"""Step 09 in use: a tiny language model generates text through a paged KV cache.

What it shows. The kernels of steps 05 and 09 are the two halves of an inference engine's
attention. A small decoder-only transformer (2 layers, grouped-query attention with Hq = 4 query
heads over Hkv = 2 KV heads of D = 64, rotary position embedding, RMSNorm, a SiLU-gated MLP;
randomly initialised from a seed, plain PyTorch, no weights to download) generates greedily for a
batch of prompts of different lengths:

* prefill: each prompt goes through the model once, its attention computed by step 05's Triton
  FlashAttention kernel (the ladder's solution rung, causal), and the keys and values of each
  layer are written into the prompt's pages of the cache;
* decode: then one token per step for all sequences at once: each layer writes the new token's K/V
  into its sequence's current page (taking a page from the free list only when the sequence
  crosses into it) and calls step 09's ``paged_decode`` (v3, the exercise's solution) with
  ``seq_lens`` counting the new token.

The cache is what an engine keeps: per layer a pool ``k_cache, v_cache [num_pages, page_size,
Hkv, D]`` shared by every sequence, a free list of pages, a block table ``[B, max_pages]`` (int32)
and ``seq_lens [B]`` (int32). A sequence's pages are wherever the free list had them: they
interleave as the sequences grow. Rows no token has written yet hold NaN (a reused page holds stale
data): a kernel that read past a sequence's length would show it.

The check is the end-to-end one: ``reference_generate`` recomputes every sequence from scratch at
every step with PyTorch's ``scaled_dot_product_attention(is_causal=True)`` (no cache, GQA heads
expanded), and the paged generation must produce the same tokens, token for token, with logits
close to the reference's. tests/test_step09_generate.py runs it in Triton's interpreter (float32).

Run:  python solutions/09_decode_paged_kv/ladder/generate.py   (a support file of the ladder, no rung)
On a CPU (Triton's interpreter): 3 prompts of 5, 16 and 29 tokens, 8 new tokens, pages of 16.
On a GPU (fp16; step 05's solution rung needs sm_90, an H100): 16 prompts of 40 to 500 tokens,
64 new tokens; it prints whether the tokens match the reference and the decode rate in tokens/s
(Python drives each step: at this model size the rate is the host's launch overhead, not the
kernel's bandwidth, which benchmarks/ladder.py measures). A random model's logits are not peaked:
in fp16, a few of the 1024 greedy decisions can fall within rounding of a tie (on a CPU, the fp16
model run against its fp32 self diverged in 3 of 16 such sequences), and one flipped decision
changes the rest of its sequence. Where a sequence differs, the demo compares the logits on the
common prefix and names the first different decision a tie within rounding (the logits agree to
rounding and the reference's top-1 margin is within twice their difference) or a real difference;
it exits 1 on a real difference or logits beyond rounding. On an H100 (2026-11-23,
benchmarks/results/2026-11-23_h100_step09_generate.txt) all 16 sequences matched the cache-free
loop token for token, logits within 3.1e-2 of it.
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, NamedTuple

ROOT = Path(__file__).resolve().parents[3]
for _p in (str(ROOT), str(ROOT / "src")):
    if _p not in sys.path:
        sys.path.insert(0, _p)

from facourse.triton_setup import interpret_without_gpu  # noqa: E402

INTERPRET = interpret_without_gpu()  # before triton is imported anywhere

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402


# ----------------------------------------------------------------------------- the model
@dataclass(frozen=True)
class ModelConfig:
    vocab: int = 64
    dim: int = 256
    layers: int = 2
    Hq: int = 4
    Hkv: int = 2
    D: int = 64              # the Triton kernels support D = 64 and 128
    hidden: int = 512        # the MLP's width
    rope_base: float = 10000.0
    max_len: int = 4096      # positions the rotary tables cover
    # The LM head's scale: logits of standard deviation ~ head_gain, margins and differences in
    # readable units. Argmax is scale-free, so the scale cannot by itself keep greedy decisions off a
    # knife edge; what does is checked instead: the test requires every top-1 margin of the reference
    # to be 20x the paged run's largest logit difference (its prompts: smallest margin 0.05, ~3000x
    # the float32 difference), so the token equality it asserts is not a coincidence of rounding.
    head_gain: float = 8.0


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight


# attend(layer, q [N, Hq, D], k [N, Hkv, D], v [N, Hkv, D]) -> o [N, Hq, D]: the attention of the
# N new tokens over their context, whatever holds it (the whole sequence, or a cache).
Attend = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class TinyLM:
    """A decoder-only transformer, randomly initialised from ``seed``: token embedding, ``layers``
    blocks of RMSNorm -> GQA attention with RoPE on q and k -> output projection (residual) and
    RMSNorm -> SiLU-gated MLP (residual), a final RMSNorm and the LM head.

    ``forward`` computes the logits of N tokens at given positions and leaves the attention to a
    callback, so that the reference loop, the prefill and the decode run the same model code and
    differ only in where the keys and values come from."""

    def __init__(self, cfg: ModelConfig = ModelConfig(), seed: int = 0, device=None, dtype=torch.float32):
        self.cfg, self.device, self.dtype = cfg, torch.device(device or "cpu"), dtype
        g = torch.Generator().manual_seed(seed)
        c = cfg

        def w(*shape, std):
            return (torch.randn(*shape, generator=g) * std).to(self.device, dtype)

        ones = lambda: torch.ones(c.dim, device=self.device, dtype=dtype)  # noqa: E731
        self.embed = w(c.vocab, c.dim, std=1.0)
        self.blocks = [dict(norm1=ones(), wq=w(c.Hq * c.D, c.dim, std=c.dim ** -0.5),
                            wk=w(c.Hkv * c.D, c.dim, std=c.dim ** -0.5), wv=w(c.Hkv * c.D, c.dim, std=c.dim ** -0.5),
                            wo=w(c.dim, c.Hq * c.D, std=(c.Hq * c.D) ** -0.5), norm2=ones(),
                            w_gate=w(c.hidden, c.dim, std=c.dim ** -0.5), w_up=w(c.hidden, c.dim, std=c.dim ** -0.5),
                            w_down=w(c.dim, c.hidden, std=c.hidden ** -0.5))
                       for _ in range(c.layers)]
        self.norm = ones()
        self.lm_head = w(c.vocab, c.dim, std=c.head_gain * c.dim ** -0.5)
        # rotary tables, [max_len, D / 2], in float32 (rotate-half convention)
        inv_freq = c.rope_base ** (-torch.arange(0, c.D, 2, dtype=torch.float64) / c.D)
        angles = torch.arange(c.max_len, dtype=torch.float64)[:, None] * inv_freq[None, :]
        self.cos = angles.cos().float().to(self.device)
        self.sin = angles.sin().float().to(self.device)

    def rope(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Rotary position embedding of ``x [N, H, D]`` at ``positions [N]`` (computed in float32)."""
        cos, sin = self.cos[positions][:, None, :], self.sin[positions][:, None, :]
        x1, x2 = x.float().chunk(2, dim=-1)
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, attend: Attend) -> torch.Tensor:
        """Logits ``[N, vocab]`` (float32) of ``tokens [N]`` at ``positions [N]``."""
        c, N = self.cfg, tokens.shape[0]
        x = self.embed[tokens]
        for i, blk in enumerate(self.blocks):
            h = rms_norm(x, blk["norm1"])
            q = (h @ blk["wq"].T).view(N, c.Hq, c.D)
            k = (h @ blk["wk"].T).view(N, c.Hkv, c.D)
            v = (h @ blk["wv"].T).view(N, c.Hkv, c.D)
            q, k = self.rope(q, positions), self.rope(k, positions)
            o = attend(i, q, k, v)
            x = x + o.reshape(N, c.Hq * c.D) @ blk["wo"].T
            h = rms_norm(x, blk["norm2"])
            x = x + (F.silu(h @ blk["w_gate"].T) * (h @ blk["w_up"].T)) @ blk["w_down"].T
        return (rms_norm(x, self.norm) @ self.lm_head.T).float()


class Generation(NamedTuple):
    tokens: list            # per sequence, its new_tokens generated tokens
    logits: torch.Tensor    # [B, new_tokens, vocab] float32: the logits each token was chosen from
    cache: "PagedKVCache | None" = None
    prefill_s: float = 0.0
    decode_s: float = 0.0


# ----------------------------------------------------------------------------- the reference
def _sdpa_causal(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention of a whole sequence, q [S, Hq, D], k, v [S, Hkv, D]: the KV heads expanded
    to the query heads (query head h reads KV head h // G) and PyTorch's SDPA."""
    G = q.shape[1] // k.shape[1]
    qh, kh, vh = (t.transpose(0, 1).unsqueeze(0) for t in (q, k.repeat_interleave(G, dim=1),
                                                           v.repeat_interleave(G, dim=1)))   # [1, Hq, S, D]
    return F.scaled_dot_product_attention(qh, kh, vh, is_causal=True)[0].transpose(0, 1)


@torch.no_grad()
def reference_generate(model: TinyLM, prompts, new_tokens: int) -> Generation:
    """Greedy generation with no cache: at every step each sequence goes through the whole model
    again, its attention PyTorch's SDPA over the full sequence (is_causal=True)."""
    out, logits = [], torch.empty(len(prompts), new_tokens, model.cfg.vocab)
    for b, prompt in enumerate(prompts):
        seq = list(prompt)
        for t in range(new_tokens):
            z = model.forward(torch.tensor(seq, device=model.device),
                              torch.arange(len(seq), device=model.device), _sdpa_causal)[-1]
            logits[b, t] = z.cpu()
            seq.append(int(z.argmax()))
        out.append(seq[len(prompt):])
    return Generation(out, logits)


# ----------------------------------------------------------------------------- the paged KV cache
def pages_needed(L: int, page_size: int) -> int:
    return -(-L // page_size)


class PagedKVCache:
    """Per layer a pool of pages ``k[layer], v[layer] [num_pages, page_size, Hkv, D]``, shared by the
    sequences; a free list; per sequence its pages (``block_table [B, max_pages]`` int32, padding
    entries 0, never read) and its length (``seq_lens [B]`` int32).

    ``grow(b, n)`` makes room for n more tokens of sequence b, taking a page from the free list only
    when the sequence crosses into it; it returns the slots (``page * page_size + row``) the new
    tokens' K/V go to, and ``write`` puts them there. The host keeps the page lists and lengths and
    ``sync`` copies them to the device tensors the kernel reads (once per step, not per layer)."""

    def __init__(self, layers: int, num_pages: int, page_size: int, Hkv: int, D: int, batch: int,
                 max_pages: int, device, dtype):
        shape = (num_pages, page_size, Hkv, D)
        # NaN in every row no token has written: a reused page holds stale data, and a read past a
        # sequence's length must not reach the output
        self.k = [torch.full(shape, float("nan"), device=device, dtype=dtype) for _ in range(layers)]
        self.v = [torch.full(shape, float("nan"), device=device, dtype=dtype) for _ in range(layers)]
        self.page_size, self.num_pages = page_size, num_pages
        self.free = list(range(num_pages - 1, -1, -1))          # pop() hands out page 0 first
        self.pages: list[list[int]] = [[] for _ in range(batch)]
        self.lens = [0] * batch
        self.taken: list[tuple] = []                              # (sequence, its page index, len before, len after)
        self.block_table = torch.zeros(batch, max_pages, dtype=torch.int32, device=device)
        self.seq_lens = torch.zeros(batch, dtype=torch.int32, device=device)
        self._table_dirty = False

    def grow(self, b: int, n: int) -> list[int]:
        ps, start = self.page_size, self.lens[b]
        end = start + n
        while len(self.pages[b]) * ps < end:
            if not self.free:
                raise RuntimeError(f"out of pages: sequence {b} needs a page for token {len(self.pages[b]) * ps}")
            self.taken.append((b, len(self.pages[b]), start, end))
            self.pages[b].append(self.free.pop())
            self._table_dirty = True
        self.lens[b] = end
        return [self.pages[b][t // ps] * ps + t % ps for t in range(start, end)]

    def release(self, b: int) -> None:
        """Give sequence b's pages back to the free list (a finished request)."""
        self.free.extend(reversed(self.pages[b]))
        self.pages[b], self.lens[b] = [], 0
        self._table_dirty = True

    def sync(self) -> None:
        if self._table_dirty:
            table = torch.zeros(self.block_table.shape, dtype=torch.int32)
            for b, pages in enumerate(self.pages):
                table[b, :len(pages)] = torch.tensor(pages, dtype=torch.int32)
            self.block_table.copy_(table)
            self._table_dirty = False
        self.seq_lens.copy_(torch.tensor(self.lens, dtype=torch.int32))

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """K/V of the tokens ``[N, Hkv, D]`` into their slots ``[N]`` of layer ``layer``'s pool."""
        self.k[layer].view(-1, *self.k[layer].shape[2:])[slots] = k
        self.v[layer].view(-1, *self.v[layer].shape[2:])[slots] = v


# ----------------------------------------------------------------------------- the kernels
def load_kernels():
    """(prefill, decode): step 05's solution rung ``flash_attention_triton(q, k, v, causal, scale)
    -> (o, lse)`` and step 09's v3 ``paged_decode(q, k_cache, v_cache, block_table, seq_lens) ->
    (o, lse)`` (the exercise's solution)."""
    from benchmarks.rungs import entry_point
    from facourse.steps import load_step
    return entry_point("05", load_step("05")["ladder"]["solution"]), entry_point("09", "v3_gqa_packed")


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.no_grad()
def generate(model: TinyLM, prompts, new_tokens: int, page_size: int = 16, prefill=None, decode=None,
             num_pages: int | None = None) -> Generation:
    """Greedy generation of ``new_tokens`` tokens after each prompt (lists of token ids, any lengths).

    Prefill: each prompt alone, attention by ``prefill`` (step 05's kernel, causal) on ``[1, H, L, D]``,
    its K/V written into its pages. Decode: ``new_tokens - 1`` steps of one token for every sequence
    at once, attention by ``decode`` (step 09's paged kernel) on ``q [B, Hq, 1, D]`` after the new
    token's K/V is in the cache and ``seq_lens`` counts it. The pool holds ``num_pages`` pages
    (default: exactly what the sequences end up needing; the last token's K/V is never written)."""
    if prefill is None or decode is None:
        p05, d09 = load_kernels()
        prefill, decode = prefill or p05, decode or d09
    c, dev, B = model.cfg, model.device, len(prompts)
    final = [len(p) + new_tokens - 1 for p in prompts]
    if max(final) > c.max_len:
        raise ValueError(f"sequences of up to {max(final)} tokens; the rotary tables cover {c.max_len}")
    need = sum(pages_needed(L, page_size) for L in final)
    cache = PagedKVCache(c.layers, num_pages or need, page_size, c.Hkv, c.D, B,
                         max(pages_needed(L, page_size) for L in final), dev, model.dtype)
    logits = torch.empty(B, new_tokens, c.vocab, device=dev)
    nxt = torch.empty(B, dtype=torch.long, device=dev)

    # prefill: one prompt at a time, step 05's kernel over the whole prompt
    _sync(dev)
    t0 = time.perf_counter()
    for b, prompt in enumerate(prompts):
        slots = torch.tensor(cache.grow(b, len(prompt)), device=dev)

        def attend(layer, q, k, v, slots=slots):
            cache.write(layer, slots, k, v)
            as_bhsd = lambda t: t.transpose(0, 1).unsqueeze(0).contiguous()  # noqa: E731  [1, H, L, D]
            o, _ = prefill(as_bhsd(q), as_bhsd(k), as_bhsd(v), causal=True)
            return o[0].transpose(0, 1)

        z = model.forward(torch.tensor(prompt, device=dev), torch.arange(len(prompt), device=dev), attend)[-1]
        logits[b, 0] = z
        nxt[b] = z.argmax()
    _sync(dev)
    t1 = time.perf_counter()

    # decode: one token per sequence per step, step 09's kernel over each sequence's pages
    for t in range(1, new_tokens):
        positions = torch.tensor(cache.lens, device=dev)       # the new token's position: the length so far
        slots = torch.tensor([s for b in range(B) for s in cache.grow(b, 1)], device=dev)
        cache.sync()                                            # seq_lens now count the new token

        def attend(layer, q, k, v, slots=slots):
            cache.write(layer, slots, k, v)
            o, _ = decode(q.unsqueeze(2), cache.k[layer], cache.v[layer], cache.block_table, cache.seq_lens)
            return o[:, :, 0]

        z = model.forward(nxt, positions, attend)
        logits[:, t] = z
        nxt = z.argmax(-1)
    _sync(dev)
    t2 = time.perf_counter()
    tokens = logits.argmax(-1).tolist()
    return Generation(tokens, logits.cpu(), cache, t1 - t0, t2 - t1)


def counted(fn):
    """``fn`` with a call counter (``.calls``): how a test knows the kernels ran."""
    def wrapper(*args, **kwargs):
        wrapper.calls += 1
        return fn(*args, **kwargs)
    wrapper.calls = 0
    wrapper.__name__ = getattr(fn, "__name__", "kernel")
    return wrapper


def top1_margin(logits: torch.Tensor) -> float:
    """The smallest gap between the best and the second-best logit over every decision."""
    top = logits.topk(2, dim=-1).values
    return float((top[..., 0] - top[..., 1]).min())


def random_prompts(lengths, vocab: int, seed: int = 1) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (L,), generator=g).tolist() for L in lengths]


# ----------------------------------------------------------------------------- the demo
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--page-size", type=int, default=16)
    args = ap.parse_args(argv)
    gpu = torch.cuda.is_available()
    dev, dtype = (torch.device("cuda"), torch.float16) if gpu else (torch.device("cpu"), torch.float32)
    if gpu:
        lengths, new_tokens = [40 + (i * 97) % 461 for i in range(16)], 64
    else:
        lengths, new_tokens = [5, 16, 29], 8
    model = TinyLM(seed=args.seed, device=dev, dtype=dtype)
    prompts = random_prompts(lengths, model.cfg.vocab, seed=args.seed + 1)
    prefill, decode = (counted(f) for f in load_kernels())
    where = f"{torch.cuda.get_device_name(dev)}, fp16" if gpu else "CPU, Triton's interpreter, float32"
    print(f"{where}: {len(prompts)} prompts of {min(lengths)}-{max(lengths)} tokens, {new_tokens} new tokens, "
          f"pages of {args.page_size}")
    if gpu:   # a first run compiles the kernels (Triton's JIT, specialised on these shapes)
        generate(model, prompts, new_tokens, args.page_size, prefill, decode)
        prefill.calls = decode.calls = 0
    run = generate(model, prompts, new_tokens, args.page_size, prefill, decode)
    ref = reference_generate(model, prompts, new_tokens)
    same = [a == r for a, r in zip(run.tokens, ref.tokens)]
    print(f"prefill: {prefill.calls} calls of step 05's kernel, {run.prefill_s * 1e3:.1f} ms")
    print(f"decode:  {decode.calls} calls of step 09's paged kernel ({new_tokens - 1} steps x {model.cfg.layers} "
          f"layers), {len(prompts) * (new_tokens - 1) / run.decode_s:.1f} tokens/s")
    cache = run.cache
    print(f"cache:   {cache.num_pages - len(cache.free)} of {cache.num_pages} pages in use; "
          f"block table row 0: {cache.block_table[0, :len(cache.pages[0])].tolist()}")
    print(f"tokens match the cache-free PyTorch loop: {sum(same)} of {len(same)} sequences")
    # Where a sequence differs, compare the logits up to its first different token (the same prefix
    # on both sides): if they agree to rounding (tol) and the reference's top-1 margin there is within
    # twice their difference, the two runs chose between logits that rounding cannot tell apart (fp16
    # on a GPU), not a bug.
    tol = (1e-4 if dtype == torch.float32 else 5e-2) * float(ref.logits.std())
    err, real = 0.0, []
    for b in range(len(prompts)):
        t = next((i for i, (x, y) in enumerate(zip(run.tokens[b], ref.tokens[b])) if x != y), new_tokens - 1)
        e = float((run.logits[b, :t + 1] - ref.logits[b, :t + 1]).abs().max())
        err = max(err, e)
        if not same[b]:
            top = ref.logits[b, t].topk(2).values
            margin = float(top[0] - top[1])
            tie = margin <= 2 * e <= 2 * tol
            real += [] if tie else [b]
            print(f"  sequence {b} first differs at new token {t}: the reference's top-1 margin there is "
                  f"{margin:.4f}, the logits differ by up to {e:.4f}: "
                  + ("a tie within rounding" if tie else "a REAL difference"))
    print(f"max |logit - reference| (on common prefixes) {err:.2e}, "
          + ("within" if err <= tol else "BEYOND") + f" rounding ({tol:.1e}: logits' std {float(ref.logits.std()):.1f}); "
          f"the reference's smallest top-1 margin {top1_margin(ref.logits):.4f}")
    for b in range(min(3, len(prompts))):
        print(f"  sequence {b} ({len(prompts[b])} prompt tokens): {run.tokens[b][:16]}")
    return 1 if real or err > tol else 0

if __name__ == "__main__":
    sys.exit(main())
