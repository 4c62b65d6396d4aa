"""The backward pass's checks (step 08): gradients by the course's rule, the state a forward keeps.

A training entry point is ``fn(q, k, v, causal=False, scale=None) -> o`` (or ``(o, lse)``) whose
output supports ``.backward()``. :func:`forward_backward` turns it into the function the checks
call, ``fb(q, k, v, do, causal=..., scale=...) -> (o, dq, dk, dv, kept)``: one forward, one
``torch.autograd.grad``, and ``kept`` = ``[bytes autograd saved, bytes still held on the GPU]``
after the forward. Every gradient is judged by the course's one rule (``facourse.rule.compare``):

  1. finite, and exactly zero for query rows that see no key;
  2. max|g - g_ref| <= 2 · max|g_torch - g_ref| + 1e-3 · max|g_ref|, with g_torch PyTorch's own
     gradient in the same dtype and g_ref the float64 (float32 on a GPU) reference;
  3. max|g - g_ref| / max|g_ref| < 1e-2.

The wrong gradients together are compared with the gradients of the classic mistakes
(:func:`backward_mistakes`: the ``D`` term left out, GQA's dK/dV not summed over the group or its
heads interleaved (h % Hkv), dQ scaled twice, the causal mask left out of the backward, off by one on
its diagonal or aligned top-left, P rebuilt from another row's lse, ...), each made in the whole
backward or in one of its two passes (dQ; dK and dV). The message names one only when it explains
every wrong gradient and breaks none that is right; otherwise it says which gradients are wrong, at
which rows and heads.
"""
from __future__ import annotations

import functools

import torch

from .check import check_attention
from .configs import AttnConfig, get_config, make_inputs
from .reference import causal_mask, default_scale, kv_head_index, reference_attention, validate_inputs
from .rule import (REL_LIMIT, AttentionCheckError, Mistake, compare, describe_rows, draw_seed, expect_tensor,
                   guarded_call, is_collecting, make_tag, max_abs, say)
from .rule import diagnose as find_mistake

REL_SLACK = 1e-3   # of max|ref|: a gradient's scale is the data's, not 1 (the forward's slack is 1e-3 absolute)
#: The forward may keep q, k, v, o (by reference: no bytes of its own) and O(N) state besides.
#: Bytes allowed beyond those four: this many float32 numbers per query row and head (lse is one,
#: D another; a P or S tile per row would be Skv of them), plus KEPT_PAD per (batch, head) for
#: rows padded to a tile (an lse allocated for 128 rows where Sq = 1).
KEPT_PER_ROW = 8
KEPT_PAD = 256


# ----------------------------------------------------------------------------- running
def _unique_bytes(tensors) -> int:
    seen, total = set(), 0
    for t in tensors:
        key = (t.untyped_storage().data_ptr(), t.device)
        if key not in seen:
            seen.add(key)
            total += t.untyped_storage().nbytes()
    return total


def _ctx_tensors(node, limit: int = 64) -> list:
    """Tensors kept as attributes of the graph's nodes (``ctx.p = p`` in a custom Function: autograd's
    saved-tensor hooks do not see them), down the graph from ``node``."""
    out, todo, seen = [], [node], set()
    while todo and len(seen) < limit:
        n = todo.pop()
        if n is None or id(n) in seen:
            continue
        seen.add(id(n))
        out += _tensors_in(list(getattr(n, "__dict__", {}).values()))
        todo += [f for f, _ in getattr(n, "next_functions", ())]
    return out


def _tensors_in(x, depth: int = 4) -> list:
    """The tensors in ``x``, inside lists, tuples, dicts and objects' attributes down to ``depth`` levels
    (``ctx.p = [[p]]`` or ``ctx.state = SimpleNamespace(p=p)`` keep P as surely as ``ctx.p = p``)."""
    if isinstance(x, torch.Tensor):
        return [x]
    if depth == 0 or isinstance(x, (str, bytes, int, float, type)) or callable(x):
        return []
    items = (x.values() if isinstance(x, dict) else x if isinstance(x, (list, tuple, set))
             else getattr(x, "__dict__", {}).values())
    return [t for y in items for t in _tensors_in(y, depth - 1)]


def forward_backward(fn):
    """``fn`` (a training entry point) as ``fb(q, k, v, do, causal=False, scale=None)`` returning
    ``(o, dq, dk, dv, kept)``: the output, the three gradients of ``(o * do).sum()``, and
    ``kept = tensor([saved_bytes, held_bytes])``: the bytes the forward saved for the backward
    beyond q, k, v and o themselves (autograd's saved-tensor hooks, and tensors kept as attributes
    of a custom Function's ctx), and on a GPU the memory the forward still held when it returned,
    beyond o."""

    def fb(q, k, v, do, causal=False, scale=None):
        leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
        cuda = q.device.type == "cuda"
        saved = []

        def pack(t):
            saved.append(t)
            return t

        kwargs = {"causal": causal} if scale is None else {"causal": causal, "scale": scale}
        if cuda:
            torch.cuda.synchronize()
            before = torch.cuda.memory_allocated(q.device)
        with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            result = fn(*leaves, **kwargs)
        o = result[0] if isinstance(result, (tuple, list)) else result
        if not isinstance(o, torch.Tensor):
            raise AttentionCheckError(f"the function returned {type(o).__name__}; it must return the output "
                                      "tensor o (or the pair (o, lse))")
        held = 0
        if cuda:
            torch.cuda.synchronize()
            held = max(0, torch.cuda.memory_allocated(q.device) - before - o.untyped_storage().nbytes())
        own = {(t.untyped_storage().data_ptr(), t.device) for t in (*leaves, o)}
        saved += _ctx_tensors(o.grad_fn)
        saved_bytes = _unique_bytes(t for t in saved if (t.untyped_storage().data_ptr(), t.device) not in own)
        if o.grad_fn is None:
            raise AttentionCheckError(
                "the output has no grad_fn: autograd cannot reach q, k, v from it. Wrap the forward and "
                "your backward in a torch.autograd.Function (forward saves q, k, v, o, lse; backward "
                "returns dq, dk, dv) and return Function.apply(...)")
        grads = torch.autograd.grad(o, leaves, do, allow_unused=True)
        for name, g in zip(("dq", "dk", "dv"), grads):
            if g is None:
                raise AttentionCheckError(f"{name} is None: the backward must return a gradient for each of "
                                          "q, k and v (and None only for causal and scale)")
        kept = torch.tensor([saved_bytes, held], dtype=torch.float64)
        return (o.detach(), *grads, kept)

    fb.__name__ = getattr(fn, "__name__", "forward_backward")
    return fb


def draw_dout(cfg: AttnConfig, seed: int, device, dtype) -> torch.Tensor:
    """dO for ``cfg`` from ``seed``: a non-contiguous ``[B, Hq, Sq, D]`` view, as the tests pass it
    (the last stride is 1; the head and row strides are swapped relative to a contiguous tensor)."""
    g = torch.Generator(device="cpu").manual_seed(int(seed) ^ 0x5EED)
    x = torch.randn(cfg.B, cfg.Sq, cfg.Hq, cfg.D, generator=g, dtype=torch.float32)
    return x.to(device=device, dtype=dtype).permute(0, 2, 1, 3)


# ----------------------------------------------------------------------------- references
def _off_by(shift):
    """The bottom-right causal mask moved by ``shift`` keys: -1 hides the diagonal, +1 shows one more."""
    def mask(Sq, Skv, device):
        i = torch.arange(Sq, device=device)[:, None]
        j = torch.arange(Skv, device=device)[None, :]
        return j <= i + (Skv - Sq) + shift
    return mask


#: variant -> the mask P is rebuilt under in the backward (None: no mask at all)
_BACKWARD_MASKS = {"no_mask_backward": lambda Sq, Skv, device: None,
                   "diagonal_backward": _off_by(-1), "diagonal_plus_one_backward": _off_by(1),
                   "top_left_backward": lambda Sq, Skv, device: causal_mask(Sq, Skv, device, "top_left")}


def attention_grads(q, k, v, do, causal=False, scale=None, *, dtype=None, variant: str | None = None):
    """Gradients ``(dq, dk, dv)`` of attention computed plainly in ``dtype`` (float64 on a CPU, float32
    on a GPU), or, with ``variant``, of a classic mistake (see ``VARIANTS``)."""
    validate_inputs(q, k, v, scale)
    B, Hq, Sq, D = q.shape
    Hkv, Skv = k.shape[1], k.shape[2]
    s = default_scale(D, scale)
    if dtype is None:
        dtype = torch.float32 if q.device.type == "cuda" else torch.float64
    idx = kv_head_index(Hq, Hkv).to(q.device)
    # the KV head the backward pairs with each query head (the forward's, but for the interleaved mistake)
    idx_b = torch.arange(Hq, device=q.device) % Hkv if variant == "gqa_head_mod" else idx
    mask = causal_mask(Sq, Skv, q.device) if causal else None
    dqs, dks, dvs = [], [], []
    for b in range(B):                    # one batch at a time bounds the [Hq, Sq, Skv] matrices
        qd, kd, vd, dod = (t[b].to(dtype) for t in (q, k, v, do))
        kx, vx = kd.index_select(0, idx), vd.index_select(0, idx)
        S = torch.matmul(qd, kx.transpose(-1, -2)) * s                  # S = scale Q K^T
        if mask is not None:
            S = S.masked_fill(~mask, float("-inf"))
        lse = torch.logsumexp(S, dim=-1, keepdim=True)
        P = torch.nan_to_num(torch.exp(S - lse), nan=0.0)               # empty rows: P = 0
        O = torch.matmul(P, vx)                                         # the forward's output
        if variant in _BACKWARD_MASKS and mask is not None:             # P rebuilt under another mask
            S_all = torch.matmul(qd, kx.transpose(-1, -2)) * s
            wrong = _BACKWARD_MASKS[variant](Sq, Skv, q.device)
            if wrong is not None:
                S_all = S_all.masked_fill(~wrong, float("-inf"))
            P = torch.nan_to_num(torch.exp(S_all - lse), nan=0.0, posinf=0.0)
        if variant in ("lse_next_row", "lse_next_row_wrap"):            # lse of row i + 1
            lse2 = (torch.cat([lse[:, 1:], lse[:, -1:]], dim=1) if variant == "lse_next_row"
                    else torch.roll(lse, -1, dims=1))                   # the last row reads row 0's
            P = torch.nan_to_num(torch.exp(S - lse2), nan=0.0, posinf=0.0)
        if variant == "gqa_head_mod":                                   # P rebuilt from another head's K
            kx, vx = kd.index_select(0, idx_b), vd.index_select(0, idx_b)
            S_b = torch.matmul(qd, kx.transpose(-1, -2)) * s
            if mask is not None:
                S_b = S_b.masked_fill(~mask, float("-inf"))
            P = torch.nan_to_num(torch.exp(S_b - lse), nan=0.0, posinf=0.0)
        dP = torch.matmul(dod, vx.transpose(-1, -2))                    # dP = dO V^T
        Dr = (dod * O).sum(-1, keepdim=True)                            # D = rowsum(dO o O)
        if variant == "no_D":
            Dr = torch.zeros_like(Dr)
        dS = P * (dP - Dr)                                              # dS = P o (dP - D)
        dq = torch.matmul(dS, kx) * s                                   # dQ = scale dS K
        if variant == "dq_scaled_twice":
            dq = dq * s
        if variant == "dq_unscaled":
            dq = dq / s
        dk_h = torch.matmul(dS.transpose(-1, -2), qd) * s               # dK = scale dS^T Q
        dv_h = torch.matmul(P.transpose(-1, -2), dod)                   # dV = P^T dO
        if variant == "dk_unscaled":
            dk_h = dk_h / s
        g = Hq // Hkv
        if variant == "gqa_head_mod":                                   # summed into the head it was paired with
            dk = torch.zeros_like(kd).index_add_(0, idx_b, dk_h)
            dv = torch.zeros_like(vd).index_add_(0, idx_b, dv_h)
        elif variant in ("gqa_first_head", "gqa_last_head"):             # one query head per group
            pick = 0 if variant == "gqa_first_head" else g - 1
            dk = dk_h.view(Hkv, g, Skv, D)[:, pick]
            dv = dv_h.view(Hkv, g, Skv, D)[:, pick]
        else:
            dk = dk_h.view(Hkv, g, Skv, D).sum(1)                       # GQA: sum over the group
            dv = dv_h.view(Hkv, g, Skv, D).sum(1)
        dqs.append(dq), dks.append(dk), dvs.append(dv)
    return torch.stack(dqs), torch.stack(dks), torch.stack(dvs)


def torch_grads(q, k, v, do, causal=False, scale=None):
    """PyTorch's own gradients in the inputs' dtype (autograd through its math): rule 2's yardstick."""
    from .reference import torch_attention

    leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
    with torch.enable_grad():
        o = torch_attention(*leaves, causal, scale)
        return torch.autograd.grad(o, leaves, do)


#: The classic mistakes of a backward pass: variant name -> (the gradients it breaks, the cause).
VARIANTS = {
    "no_D": ({"dq", "dk"}, "the D term is missing: dS = P o (dP - D) with D_i = rowsum(dO_i o O_i) (the "
                           "preprocess kernel), not P o dP"),
    "dq_scaled_twice": ({"dq"}, "dQ is scaled twice: dQ = scale · dS K, and scale is applied once (if S was "
                                "built with the scale folded into Q or into exp2, do not multiply again)"),
    "dq_unscaled": ({"dq"}, "dQ misses the softmax scale: dQ = scale · dS K"),
    "dk_unscaled": ({"dk"}, "dK misses the softmax scale: dK = scale · dSᵀ Q"),
    "gqa_first_head": ({"dk", "dv"}, "GQA: dK and dV hold only the first query head of each group; they are "
                                     "sums over the Hq // Hkv query heads that share the KV head"),
    "gqa_last_head": ({"dk", "dv"}, "GQA: dK and dV hold only one query head of each group (the last write "
                                    "won); they are sums over the Hq // Hkv query heads that share the KV head"),
    "no_mask_backward": ({"dq", "dk", "dv"}, "the causal mask is missing in the backward: P rebuilt from S and "
                                             "lse must be 0 above the (bottom-right) diagonal, as in the forward"),
    "diagonal_backward": ({"dq", "dk", "dv"}, "the backward's causal mask is off by one on the diagonal: it hides "
                                              "key j = i + (Skv - Sq), which the forward showed. Keep keys with "
                                              "j <= i + (Skv - Sq) (hide j > i + (Skv - Sq)), as in the forward"),
    "diagonal_plus_one_backward": ({"dq", "dk", "dv"}, "the backward's causal mask is off by one on the diagonal: "
                                                       "it shows key j = i + (Skv - Sq) + 1, which the forward hid. "
                                                       "Hide keys with j > i + (Skv - Sq), as in the forward"),
    "lse_next_row": ({"dq", "dk", "dv"}, "P is rebuilt with another row's lse (off by one row): row i of P is "
                                         "exp(S_i · scale - lse_i) with lse_i of that same row, batch and head"),
}
VARIANTS["lse_next_row_wrap"] = VARIANTS["lse_next_row"]


def _span(what: str, a: int, b: int) -> str:
    return f"{what} {a}" if a == b else f"{what}s {a}-{b}"


def _gqa_head_mod_cause(Hq, Hkv, Sq, Skv, broken) -> str:
    G = Hq // Hkv
    group = f"query heads {G}j to {G}j + {G - 1}"
    if broken == {"dq"}:
        return (f"GQA: the dQ pass reads K and V of KV head h % Hkv for query head h; it must read KV head "
                f"h // (Hq // Hkv) = h // {G}, as the forward does (the dK/dV pass is right)")
    if "dq" not in broken:
        return (f"GQA: the dK/dV pass sums KV head j's gradients over the query heads with h % Hkv = j; KV head j "
                f"belongs to the query heads with h // (Hq // Hkv) = j, {group}, as in the forward (the dQ pass "
                "is right)")
    return (f"GQA: the backward pairs query head h with KV head h % Hkv, in both passes; query head h reads KV head "
            f"h // (Hq // Hkv) = h // {G}, as in the forward: dQ of head h takes that head's K and V, and dK, dV "
            f"of KV head j sum over {group}")


def _top_left_is_no_mask(Sq, Skv) -> bool:
    """Every row that sees a key (i >= Sq - Skv) has i >= Skv - 1: top-left shows it all Skv keys, as no mask."""
    return Sq - Skv >= Skv - 1


def _top_left_cause(Hq, Hkv, Sq, Skv, broken) -> str:
    where = ("in both passes" if broken == {"dq", "dk", "dv"} else
             "in the dQ pass (the dK/dV pass is right)" if broken == {"dq"} else
             "in the dK/dV pass (the dQ pass is right)")
    forward = f"the forward keeps j <= i + (Skv - Sq) = i {'+' if Skv >= Sq else '-'} {abs(Skv - Sq)} (bottom-right)"
    if _top_left_is_no_mask(Sq, Skv):      # the same gradients: name both
        head = (f"the causal mask is missing in the backward, or aligned top-left (j <= i), {where}: with "
                f"Sq - Skv >= Skv - 1 both show every row that sees a key all {Skv} keys, where {forward}")
    else:
        head = f"the backward's causal mask is aligned top-left, {where}: it keeps keys j <= i, where {forward}"
    if Sq < Skv:
        hurt = f"P rebuilt in the backward misses the {Skv - Sq} keys past j = i that each query row saw"
        dq = "every row of dQ is wrong"
        dkdv = "dK and dV " + (f"lose those rows' terms at {_span('key', 1, Sq - 1)} and " if Sq > 1 else "") + \
            f"get none at all (0) at {_span('key', Sq, Skv - 1)}"
    else:
        hurt = f"P rebuilt in the backward shows query row i the keys i - {Sq - Skv} < j <= i, which the forward hid"
        dq = f"dQ is wrong at {_span('row', Sq - Skv, Sq - 2)}"
        dkdv = f"dK and dV gain terms of rows that must not see them at {_span('key', 1, Skv - 1)}"
    told = " and ".join(([dq] if "dq" in broken else []) + ([dkdv] if "dk" in broken else []))
    return (f"{head}. {hurt}, so {told}. Keep key j for query i iff j <= i + (Skv - Sq) there, as the forward "
            "does (and in its tile loops' bounds)")


#: Mistakes whose cause depends on the shapes and on which pass holds them: variant -> (gradients it
#: breaks, cause(Hq, Hkv, Sq, Skv, the gradients broken) -> the whole sentence, its pass named).
SHAPED_VARIANTS = {
    "gqa_head_mod": ({"dq", "dk", "dv"}, _gqa_head_mod_cause),
    "top_left_backward": ({"dq", "dk", "dv"}, _top_left_cause),
}

#: The backward's two passes (FlashAttention-2): one computes dQ, the other dK and dV; a mistake can sit in
#: either, and then breaks only that pass's gradients.
PASSES = ({"dq"}, {"dk", "dv"})


def _variants_for(q, k, causal) -> list[str]:
    Hq, Hkv = q.shape[1], k.shape[1]
    out = ["no_D", "dq_scaled_twice", "dq_unscaled", "dk_unscaled"]
    if q.shape[2] > 1:          # with one query row, "another row's lse" is the row's own: it would match anything
        out += ["lse_next_row", "lse_next_row_wrap"]
    if Hq != Hkv:
        out += ["gqa_first_head", "gqa_last_head"]
    if 1 < Hkv < Hq:            # with one KV head (MQA), h % Hkv is h // Hq: the right head
        out += ["gqa_head_mod"]
    Sq, Skv = q.shape[2], k.shape[2]
    if causal:       # Sq == Skv (or Skv = 1): top-left is bottom-right; where it is no mask, one names both
        alike = Sq > Skv > 1 and _top_left_is_no_mask(Sq, Skv)
        out += ["top_left_backward" if alike else "no_mask_backward", "diagonal_backward", "diagonal_plus_one_backward"]
        out += ["top_left_backward"] if Sq != Skv and Skv > 1 and not alike else []
    return out


#: Variants that pair the first group's query heads with other KV heads: formed on every head, then cut.
_EVERY_HEAD = {"gqa_head_mod"}


def backward_mistakes(q, k, v, do, causal, scale, *, first_group: bool = False) -> list[Mistake]:
    """Step 08's mistakes on these inputs: each variant made in the whole backward, or in one of its
    two passes only (then the other pass's gradients are the reference's). With ``first_group``, the
    gradients of the first KV head and its group of query heads only (dq[:, :G], dk[:, :1], dv[:, :1])."""
    names = ("dq", "dk", "dv")
    Hq, Sq, Hkv, Skv = q.shape[1], q.shape[2], k.shape[1], k.shape[2]
    G = Hq // Hkv
    part_in = (q[:, :G], k[:, :1], v[:, :1], do[:, :G]) if first_group else (q, k, v, do)

    def grads(variant=None):
        if first_group and variant in _EVERY_HEAD:
            dq, dk, dv = attention_grads(q, k, v, do, causal, scale, variant=variant)
            return {"dq": dq[:, :G], "dk": dk[:, :1], "dv": dv[:, :1]}
        return dict(zip(names, attention_grads(*part_in, causal, scale, variant=variant)))

    ref = functools.cache(grads)
    out = []
    for variant in _variants_for(q, k, causal):
        breaks, cause = VARIANTS.get(variant) or SHAPED_VARIANTS[variant]
        says = (lambda broken, cause=cause: cause(Hq, Hkv, Sq, Skv, broken)) if callable(cause) else None
        alt = functools.cache(lambda variant=variant: grads(variant))
        out.append(Mistake(says(breaks) if says else cause, alt, frozenset(breaks)))
        for part in PASSES:
            if breaks & part and breaks - part:
                where = "dQ" if part == {"dq"} else "dK and dV"
                out.append(Mistake(says(breaks & part) if says else f"{cause} (in the pass that computes {where})",
                                   lambda part=part, alt=alt: {n: (alt() if n in part else ref())[n] for n in names},
                                   frozenset(breaks & part)))
    return out


# ----------------------------------------------------------------------------- the check
def _diagnose(wrong, grads, cmps, q, k, v, do, causal, scale) -> str:
    """The mistake whose gradients are the student's, for every wrong one; or what is wrong."""
    # told apart on the first batch and the first KV head's group of query heads (a mistake's gradients
    # are a full backward in float64: on all of them, a failing check of `large` spent more time here
    # than in the kernel; only GQA's interleaved heads, which pair the group with other KV heads, use them all)
    g = q.shape[1] // k.shape[1]
    sub = {"dq": grads["dq"][:1, :g], "dk": grads["dk"][:1, :1], "dv": grads["dv"][:1, :1]}
    # the rule's own tolerance, with the mistake's gradient as the reference: its rel_slack of max|ref| grows
    # with a mistake whose gradients are far larger (a float32 kernel's sums round at that scale)
    found = find_mistake(sub, wrong, backward_mistakes(q[:1], k[:1], v[:1], do[:1], causal, scale,
                                                       first_group=True),
                         lambda n, alt: cmps[n].allowed + REL_SLACK * max(0.0, max_abs(alt) - cmps[n].ref_max))
    if found is not None:
        return found.cause
    zeros = [n for n in wrong if max_abs(grads[n]) == 0.0]
    if zeros:
        return f"{' and '.join(zeros)} {'is' if len(zeros) == 1 else 'are'} all zeros: written back (and " \
               "accumulated over every tile)?"
    right = [n for n in ("dq", "dk", "dv") if n not in wrong]
    where = "; ".join(f"{n} at {_where(n, cmps[n].bad_rows)}" for n in ("dq", "dk", "dv") if n in wrong)
    told = f"no classic mistake matches: {where}" + (f"; {' and '.join(right)} right" if right else "")
    if wrong == {"dq"}:
        return (f"{told}. dQ_i sums dS_ij K_j over every key tile j (accumulate across the loop, or across "
                "programs with atomics), times scale once")
    if "dq" not in wrong and "dv" in wrong:
        return (f"{told}. dV_j = sum over query rows i (and the group's query heads) of P_ij dO_i: check P = "
                "exp(S · scale - lse) in the dK/dV pass (the forward's natural-log lse, this row's), its mask, "
                "and that every query tile is visited")
    return (f"{told}. Check P = exp(S · scale - lse) (the forward's natural-log lse, this row's), the mask, "
            "and dS = P o (dP - D)")


def _where(name, bad_rows) -> str:
    return describe_rows(bad_rows, ("batches", "heads", "query rows" if name == "dq" else "key rows"))


def check_gradients_of(o, dq, dk, dv, q, k, v, do, causal=False, scale=None, *, config: str = "custom",
                       seed: int | None = None, kept=None) -> list[str]:
    """Check a forward's output and its three gradients; returns the summary lines. Raises
    :class:`AttentionCheckError` naming the gradient, the rows and the likely cause: a classic mistake
    only when it explains every wrong gradient and none that is right."""
    tag = make_tag(config, seed)
    if is_collecting():     # the judge checks the recorded result; nothing here may fail in the kernel
        return []
    lines = [check_attention(o, q, k, v, causal, scale, config=config, seed=seed).summary()]
    Sq = q.shape[2]
    refs = attention_grads(q, k, v, do, causal, scale)
    yard = torch_grads(q, k, v, do, causal, scale)
    empty = None
    if causal and Sq > k.shape[2]:
        empty = ~causal_mask(Sq, k.shape[2], q.device).any(-1)        # [Sq]: rows that see no key
    grads = {"dq": dq, "dk": dk, "dv": dv}
    cmps = {}
    for (name, g), ref, mine, src in zip(grads.items(), refs, yard, (q, k, v)):
        expect_tensor(g, src, name=name, like_name=name[1], tag=tag,
                      dtype_note=" (accumulate in float32, store in the input dtype)")
        ref64 = ref.to(torch.float64)
        cmps[name] = compare(g, ref64, max_abs(mine.to(torch.float64) - ref64), name=name, tag=tag,
                             empty=None if name != "dq" or empty is None else empty[:, None],
                             slack=0.0, rel_slack=REL_SLACK)
    for name, cmp in cmps.items():
        if cmp.failure == "nonfinite":
            rows = cmp.nonfinite_rows
            cause = ("these rows see no key (causal, Sq > Skv): their P is 0, so their gradient is 0; "
                     "guard exp(S - lse) where lse = -inf" if name == "dq" and empty is not None
                     and not bool(rows[..., ~empty].any()) else
                     "an element was never written (new allocations are filled with NaN: does the grid cover "
                     "every tile?) or exp() of a masked score minus lse = -inf gave NaN")
            raise AttentionCheckError(f"{tag} NaN or inf in {name} at {describe_rows(rows, ('batches', 'heads', 'rows'))}"
                                      f".\n  likely cause: {cause}")
    if cmps["dq"].failure == "not_empty":
        raise AttentionCheckError(f"{tag} dq must be exactly 0 for the first {int(empty.sum())} rows "
                                  "(they see no key), but is not.\n  likely cause: P rebuilt for a row with "
                                  "lse = -inf must be 0; skip those rows or mask exp(S - lse)")
    wrong = {n for n, c in cmps.items() if not c.ok}
    if wrong:
        cause = _diagnose(wrong, grads, cmps, q, k, v, do, causal, scale)
        first = next(n for n in cmps if n in wrong)
        others = sorted(wrong - {first})
        also = f" ({' and '.join(others)} {'is' if len(others) == 1 else 'are'} wrong too)" if others else ""
        raise cmps[first].error(cause, what=f"{first} is wrong{also}", where=_where(first, cmps[first].bad_rows),
                                index_names=("b", "h", "row", "d"))
    for name, cmp in cmps.items():
        lines.append(f"[{config}] {name} passed: max err {cmp.max_err:.2e} (allowed {cmp.allowed:.2e}), "
                     f"relative {cmp.rel:.2e}")
    if kept is not None:
        lines.append(check_kept(kept, q, k, tag))
    return lines


def kept_limit(q) -> int:
    B, Hq, Sq, _ = q.shape
    return 4 * B * Hq * (KEPT_PER_ROW * Sq + KEPT_PAD)


def check_kept(kept, q, k, tag: str = "") -> str:
    """The forward keeps O(N) state: beyond q, k, v and o, at most ``KEPT_PER_ROW`` float32 numbers
    per query row and head, plus ``KEPT_PAD`` per head (the score matrix would be Skv per row)."""
    if not isinstance(kept, torch.Tensor) or kept.numel() != 2:
        raise AttentionCheckError(f"{tag} the kept-state record is malformed")
    saved, held = (float(x) for x in kept.tolist())
    limit = kept_limit(q)
    worst = max(saved, held)
    if worst > limit:
        what = "saved for the backward" if saved >= held else "still held on the GPU after the forward"
        B, Hq, Sq, _ = q.shape
        per_row = worst / (4 * B * Hq * Sq)
        raise AttentionCheckError(
            f"{tag} the forward kept {worst / 2**20:.1f} MiB {what} beyond q, k, v and o: {per_row:.0f} float32 "
            f"numbers per query row and head; at most {KEPT_PER_ROW} are allowed, plus {KEPT_PAD} per head "
            f"(lse needs 1).\n  likely cause: "
            "the forward stores P or S (Sq x Skv per head); keep only lse and rebuild P in the backward")
    return f"{tag} kept state: {worst / 2**10:.1f} KiB beyond q, k, v, o (limit {limit / 2**10:.1f} KiB)"


def check_forward_backward(fb, config: str | AttnConfig = "small", *, seed: int | None = None, device=None,
                           dtype=None, layout: str = "bshd", scale=None, verbose: bool = True,
                           kept: bool = True) -> None:
    """Draw q, k, v and a non-contiguous dO for ``config``, call ``fb`` (see :func:`forward_backward`)
    and check o, dq, dk, dv (and the kept state) with the course's rule. Inputs must stay untouched."""
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    cfg = config if isinstance(config, AttnConfig) else get_config(config, device)
    seed = draw_seed(seed)
    q, k, v = make_inputs(cfg, seed, device, dtype, layout)
    do = draw_dout(cfg, seed, device, q.dtype)
    kwargs = {"causal": cfg.causal} if scale is None else {"causal": cfg.causal, "scale": scale}
    tag = f"[{cfg.name}]"
    result = guarded_call(fb, q, k, v, do, device=device, tag=tag, inputs={"q": q, "k": k, "v": v, "dO": do},
                          untouched="forward and backward must leave their inputs untouched", **kwargs)
    if not isinstance(result, (tuple, list)) or len(result) != 5:
        raise AttentionCheckError(f"{tag} forward_backward returned {type(result).__name__}")
    o, dq, dk, dv, kept_rec = result
    shown = cfg.describe() if scale is None else f"{cfg.describe()}, scale {scale:g}"     # a given scale said
    lines = check_gradients_of(o, dq, dk, dv, q, k, v, do, cfg.causal, scale, config=shown, seed=seed,
                               kept=kept_rec if kept else None)
    if verbose:
        say(*lines)


def check_gradients(fn, config: str | AttnConfig = "small", **kw) -> None:
    """Check a training entry point ``fn(q, k, v, causal, scale) -> o``: its output, the gradients
    of q, k and v for a random dO, and that its forward keeps O(N) state (see the module doc)."""
    check_forward_backward(forward_backward(fn), config, **kw)


def gradcheck_forward_backward(fb, *, seed: int | None = None, device=None, dtype=torch.float32,
                               causal: bool = True, directions: int = 2, eps: float | None = None,
                               tol: float | None = None) -> None:
    """A gradcheck of ``fb`` (see :func:`forward_backward`) on a tiny GQA shape (Sq != Skv, ragged):
    for random directions u and random dO, the backward's <dq, u_q> + <dk, u_k> + <dv, u_v> must equal
    the forward's central difference <dO, (f(x + eps u) - f(x - eps u)) / 2 eps> (what
    ``torch.autograd.gradcheck(fast_mode=True)`` compares). In float32 by default: Triton's interpreter
    runs no float64 ``tl.dot``, and the kernels accumulate in float32 anyway; float64 works for
    PyTorch functions (the lecture's). The gap may also be what the forward's own rounding explains
    (its error against the float64 reference at both points, divided by 2 eps): nothing in exact
    float32 on a CPU, but on a GPU Triton multiplies float32 as TF32 (10 bits), and there the
    check is coarse; the gradients' own check against the float64 reference is the fine one."""
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    seed = draw_seed(seed)
    cfg = AttnConfig("gradcheck", 1, 2, 1, 19, 23, 64, causal)
    eps0, tol0 = (1e-6, 1e-6) if dtype == torch.float64 else (1e-2, 2e-3)
    if dtype == torch.float32 and torch.device(device).type == "cuda":
        # TF32 rounding: a larger step keeps the difference quotient's rounding small. Measured on an
        # H100 (24 draws, 2 directions each): the exercise's solution never failed with eps 0.1 and tol
        # 0.02, a backward without the D term was caught in 21 of 24; four directions here.
        eps0, tol0, directions = 0.1, 0.02, max(directions, 4)
    eps, tol = eps or eps0, tol or tol0
    name = str(dtype).replace("torch.", "")
    for i in range(directions):
        s = (seed + 7919 * i) % 2**31
        x = make_inputs(cfg, s, device, dtype)
        u = make_inputs(cfg, s ^ 0xD1CE, device, dtype)
        do = draw_dout(cfg, s, device, dtype)
        xp = [a + eps * b for a, b in zip(x, u)]
        xm = [a - eps * b for a, b in zip(x, u)]
        _, dq, dk, dv, _ = fb(*x, do, causal=causal)
        plus, minus = fb(*xp, do, causal=causal)[0], fb(*xm, do, causal=causal)[0]
        if is_collecting():
            continue
        d64 = do.double()
        analytic = sum(float((g.double() * b.double()).sum()) for g, b in zip((dq, dk, dv), u))
        numeric = float((d64 * (plus.double() - minus.double())).sum()) / (2 * eps)
        # What the forward's own rounding can do to the difference quotient: its error against the
        # float64 reference at both points (tiny in exact float32; on a GPU, Triton multiplies float32
        # as TF32, 10 bits, and the quotient inherits that error divided by 2 eps).
        rounding = sum(float((d64.abs() * (y.double() - reference_attention(
            *(t.double() for t in pt), causal, dtype=torch.float64)[0]).abs()).sum())
            for y, pt in ((plus, xp), (minus, xm))) / (2 * eps)
        scale_ = max(abs(analytic), abs(numeric), 1.0)
        if not abs(analytic - numeric) <= tol * scale_ + rounding:
            raise AttentionCheckError(
                f"[gradcheck] {name}, {cfg.describe()}: the backward is not the derivative of the forward: "
                f"along a random direction the gradients give {analytic:.6g} and the forward's finite "
                f"difference {numeric:.6g} (gap {abs(analytic - numeric):.3g}; allowed {tol:g} of {scale_:.3g} plus "
                f"{rounding:.3g}, what the forward's own rounding explains).\n"
                "  likely cause: a term of dS = P o (dP - D) or a scale differs between your forward and backward")
    say(f"[gradcheck] passed: {name}, {cfg.describe()}, {directions} random directions")


def gradcheck(fn, **kw) -> None:
    """:func:`gradcheck_forward_backward` of a training entry point ``fn``."""
    gradcheck_forward_backward(forward_backward(fn), **kw)
