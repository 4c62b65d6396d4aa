# %% [markdown]
# # Lecture 03 — Online softmax and the $(m, \ell)$ merge
#
# Read a row $x_1, \dots, x_N$ once, keeping two numbers:
#
# $$m_j = \max(m_{j-1},\, x_j), \qquad
#   \ell_j = \ell_{j-1}\, e^{\,m_{j-1} - m_j} + e^{\,x_j - m_j}, \qquad m_0 = -\infty,\ \ell_0 = 0.$$
#
# At the end, $m_N = \max_j x_j$ and $\ell_N = \sum_j e^{x_j - m_N}$: the two statistics of the safe
# softmax, from **one** pass instead of two. Two partial states merge with
#
# $$(m_a, \ell_a) \oplus (m_b, \ell_b) = \big(m,\ \ell_a e^{m_a - m} + \ell_b e^{m_b - m}\big),
#   \qquad m = \max(m_a, m_b),$$
#
# an associative, commutative operation: blocks of the row can be processed in any order, on any
# processor, and combined at the end.
#
# **What you will learn**
# - the recurrence and its proof by induction;
# - the block form (a block of $B$ elements at a time: what a kernel does) and the merge $\oplus$;
# - associativity and commutativity of $\oplus$, checked numerically, and why split-KV,
#   flash-decoding and ring attention are all this merge;
# - from softmax (3 passes → 2) to attention (→ 1 pass over K and V), with the output
#   accumulator rescaled by $\alpha = e^{m_{\rm old} - m_{\rm new}}$.
#
# **Paper section followed.** Milakov & Gimelshein, *Online normalizer calculation for softmax*
# (2018): §3 (Algorithm 3, the online normalizer, and its proof) and §4 (the parallel form, the
# $\oplus$ operator). FlashAttention-2 (Dao 2023), §3.1.1, for the attention version with the
# rescaled output. Exercise 03 asks you to write `online_softmax(x, block_size)` and
# `merge_softmax_states(m_a, l_a, m_b, l_b)`.

# %%
import math

import torch

from facourse import reference_attention

_ = torch.manual_seed(0)

# %% [markdown]
# ## 1. The recurrence, and why it is right
#
# **Claim.** After reading $x_1..x_j$: $\ m_j = \max_{k \le j} x_k\ $ and
# $\ \ell_j = \sum_{k \le j} e^{x_k - m_j}$.
#
# **Proof by induction.** For $j = 1$: $m_1 = \max(-\infty, x_1) = x_1$ and
# $\ell_1 = 0 \cdot e^{-\infty} + e^{x_1 - x_1} = 1$. ✓
# Suppose the claim holds for $j - 1$. The max part is immediate. For the sum,
#
# $$\sum_{k \le j} e^{x_k - m_j}
#   = e^{m_{j-1} - m_j} \sum_{k \le j-1} e^{x_k - m_{j-1}} + e^{x_j - m_j}
#   = e^{m_{j-1} - m_j}\,\ell_{j-1} + e^{x_j - m_j} = \ell_j. \qquad\blacksquare$$
#
# The factor $e^{m_{j-1} - m_j} \le 1$ *rescales* the old sum to the new maximum. Every exponent is
# $\le 0$, so nothing overflows at any step: this is the safe softmax of lecture 02, with the max
# discovered as we go.

# %%
def online_stats(row):
    """(m, l) of a 1-D row in one pass, one element at a time (Milakov & Gimelshein, Alg. 3)."""
    m, l = -math.inf, 0.0
    for xj in row.tolist():
        m_new = max(m, xj)                               # m_j = max(m_{j-1}, x_j)
        l = l * math.exp(m - m_new) + math.exp(xj - m_new)  # l_j = l_{j-1} e^{m_{j-1}-m_j} + e^{x_j-m_j}
        m = m_new
    return m, l


x = torch.randn(1000, dtype=torch.float64) * 20
m, l = online_stats(x)
print("m        :", m, "  max   :", x.max().item())
print("m + ln l :", m + math.log(l), "  logsumexp:", torch.logsumexp(x, 0).item())

# %% [markdown]
# ### Two passes instead of three
#
# The softmax itself still needs a second pass: $y_i = e^{x_i - m_N} / \ell_N$ depends on the final
# $m_N, \ell_N$. Online softmax is therefore **stats in one pass, normalize in a second**. Count the
# reads of $x$:

# %%
class CountingRow:
    """A list wrapper that counts element reads."""

    def __init__(self, values):
        self.values, self.reads = values, 0

    def __iter__(self):
        for v in self.values:
            self.reads += 1
            yield v


def softmax_3pass(r):
    m = max(r)                                  # pass 1
    l = sum(math.exp(v - m) for v in r)         # pass 2
    return [math.exp(v - m) / l for v in r]     # pass 3


def softmax_2pass(r):
    m, l = -math.inf, 0.0
    for v in r:                                 # pass 1: m and l together
        m_new = max(m, v)
        l, m = l * math.exp(m - m_new) + math.exp(v - m_new), m_new
    return [math.exp(v - m) / l for v in r]     # pass 2


vals = x.tolist()
for f in (softmax_3pass, softmax_2pass):
    r = CountingRow(vals)
    y = torch.tensor(f(r), dtype=torch.float64)
    print(f"{f.__name__}: {r.reads // len(vals)} reads of x, max err {(y - torch.softmax(x, 0)).abs().max().item():.1e}")

# %% [markdown]
# ## 2. Blocks and the merge
#
# A kernel does not read one element at a time but a block $x_B$ of $B$ elements (a tile of a row of
# $S$). The block update is the element update with a max and a sum over the block:
#
# $$m_{\rm new} = \max(m, \max x_B), \qquad \ell_{\rm new} = \ell\,e^{m - m_{\rm new}} + \sum e^{x_B - m_{\rm new}}.$$
#
# ![the online softmax update](../diagrams/online_softmax_update.png)
#
# More generally, the statistics of a block are a state $(\max x_B, \sum e^{x_B - \max x_B})$, and
# two states combine with $\oplus$. Reading the row left to right is folding $\oplus$ over the
# blocks; nothing forces left to right.

# %%
def block_state(xb):
    """(m, l) of one block of a row, the way a kernel computes it from a tile."""
    m = xb.max().item()
    return m, torch.exp(xb - m).sum().item()


def merge_states(a, b):
    """(m_a, l_a) ⊕ (m_b, l_b). Assumes neither state is empty (m = -inf): see the note below."""
    (m_a, l_a), (m_b, l_b) = a, b
    m = max(m_a, m_b)                                        # m = max(m_a, m_b)
    return m, l_a * math.exp(m_a - m) + l_b * math.exp(m_b - m)  # l = l_a e^{m_a-m} + l_b e^{m_b-m}


def lse(state):
    m, l = state
    return m + math.log(l)


blocks = list(x.split(128))  # 8 blocks of 128 (the last one 104)
states = [block_state(b) for b in blocks]
exact = torch.logsumexp(x, 0).item()

left = states[0]
for s in states[1:]:                      # left to right, as a kernel's loop does
    left = merge_states(left, s)
right = states[-1]
for s in reversed(states[:-1]):           # right to left, operands swapped
    right = merge_states(right, s)


def tree(ss):                             # a balanced tree, as a parallel reduction does
    if len(ss) == 1:
        return ss[0]
    h = len(ss) // 2
    return merge_states(tree(ss[:h]), tree(ss[h:]))


g = torch.Generator().manual_seed(1)
shuffled = [states[i] for i in torch.randperm(len(states), generator=g).tolist()]
for name, st in (("left fold", left), ("right fold, swapped", right), ("balanced tree", tree(states)),
                 ("tree of a shuffle", tree(shuffled))):
    print(f"{name:20s}: lse = {lse(st):.15f}   |diff| = {abs(lse(st) - exact):.1e}")

# %% [markdown]
# All four orders agree with `torch.logsumexp` to the last few bits of float64: $\oplus$ is
# associative and commutative (in exact arithmetic exactly; in floating point up to rounding, as
# every sum is). Two facts make it so:
#
# - in log space the state is one number, $\text{lse} = m + \ln \ell$, and $\oplus$ is
#   $\ln(e^{\text{lse}_a} + e^{\text{lse}_b})$: addition of the underlying sums, written stably;
# - $m$ is only a *reference point* for the exponent. Any $m \ge$ the true max gives the same lse.
#
# **The empty state.** $(-\infty, 0)$ is the identity of $\oplus$ (a block with no visible element,
# e.g. fully masked). But `merge_states((-inf, 0), (-inf, 0))` computes $e^{-\infty - (-\infty)}$ =
# NaN. The exercise's `merge_softmax_states` must return the empty state there; think about which
# reference point to use when $m = -\infty$.

# %%
print("empty ⊕ state:", merge_states((-math.inf, 0.0), (2.0, 3.0)))
print("empty ⊕ empty:", merge_states((-math.inf, 0.0), (-math.inf, 0.0)), " <- NaN: handle this case")

# %% [markdown]
# ## 3. One pass for attention
#
# For one query row $q$ with scores $s_j = q \cdot k_j \cdot \text{scale}$, attention is
# $o = \sum_j \frac{e^{s_j - m}}{\ell} v_j$. Keep an **unnormalized** accumulator next to $(m, \ell)$:
#
# $$\tilde o_{\rm new} = \alpha\, \tilde o + \sum_{j \in B} e^{s_j - m_{\rm new}}\, v_j,
#   \qquad \alpha = e^{\,m_{\rm old} - m_{\rm new}},$$
#
# the same rescale that $\ell$ gets, because $\tilde o$ is a sum of terms $e^{s_j - m}$ times a
# vector. By the same induction, after the last block $\tilde o = \sum_j e^{s_j - m_N} v_j$, so
# $o = \tilde o / \ell_N$. The division happens **once, at the end**, and $K$, $V$ are read once:
# softmax needed two passes because it must *write* each $y_i$; attention only writes $o$.

# %%
def attention_row_online(q_row, K, V, scale, block=64):
    """o and lse for one query row, reading K and V once, `block` keys at a time."""
    m, l = -math.inf, 0.0
    acc = torch.zeros(V.shape[-1], dtype=V.dtype)
    for j0 in range(0, K.shape[0], block):
        s = (K[j0:j0 + block] @ q_row) * scale                # s_B = K_B q · scale
        m_new = max(m, s.max().item())                       # m_new = max(m, max s_B)
        alpha = math.exp(m - m_new)                          # alpha = e^{m_old - m_new}
        p = torch.exp(s - m_new)                             # p = e^{s_B - m_new}
        l = alpha * l + p.sum().item()                       # l = alpha l + sum p
        acc = alpha * acc + p @ V[j0:j0 + block]             # o~ = alpha o~ + p V_B
        m = m_new
    return acc / l, m + math.log(l)                          # o = o~ / l, lse = m + ln l


D, N = 64, 1000
qr, K, V = torch.randn(D, dtype=torch.float64), torch.randn(N, D, dtype=torch.float64), torch.randn(N, D, dtype=torch.float64)
scale = 1 / math.sqrt(D)
o_on, lse_on = attention_row_online(qr, K, V, scale)
o_ref, lse_ref = reference_attention(qr[None, None, None], K[None, None], V[None, None], scale=scale)
print("max |o - ref| :", (o_on - o_ref[0, 0, 0]).abs().max().item())
print("lse - ref lse :", lse_on - lse_ref[0, 0, 0].item(), " (the reference returns lse in float32)")

# %% [markdown]
# **What if we forget $\alpha$?** Then every block after the first one that raises the max is
# summed with the wrong weight. The first block decides; the error appears as soon as a later
# block holds a larger score. This is the most common bug in a first flash-attention kernel, and
# the course's check names it ("does your loop rescale the accumulator by alpha?").

# %%
def attention_row_no_alpha(q_row, K, V, scale, block=64):
    m, l = -math.inf, 0.0
    acc = torch.zeros(V.shape[-1], dtype=V.dtype)
    for j0 in range(0, K.shape[0], block):
        s = (K[j0:j0 + block] @ q_row) * scale
        m_new = max(m, s.max().item())
        p = torch.exp(s - m_new)
        l = l + p.sum().item()                               # bug: no alpha
        acc = acc + p @ V[j0:j0 + block]                     # bug: no alpha
        m = m_new
    return acc / l


print("without alpha, max |o - ref| :", (attention_row_no_alpha(qr, K, V, scale) - o_ref[0, 0, 0]).abs().max().item())

# %% [markdown]
# ## 4. The same merge, three famous uses
#
# A partial attention result over a subset of keys is a triple $(o_a, \text{lse}_a)$ with $o_a$
# normalized over its own keys. Two of them combine exactly:
#
# $$\text{lse} = \ln(e^{\text{lse}_a} + e^{\text{lse}_b}), \qquad
#   o = e^{\text{lse}_a - \text{lse}}\, o_a + e^{\text{lse}_b - \text{lse}}\, o_b.$$
#
# - **Split-KV / flash-decoding** (Dao, Haziza, Massa, Sizov 2023): at decode time $S_q = 1$, so there
#   is one query tile per head and too little parallelism; split the keys into chunks, one program per
#   chunk, and merge the partial results in a second small kernel.
# - **Ring attention** (Liu, Zaharia, Abbeel 2023): the keys are spread over devices; K/V blocks pass
#   around a ring, each device merges the partial result of each block into its running state.
# - **FlashAttention's own inner loop** is the left fold of the same merge, one $K_j, V_j$ tile at a time.
#
# A check with four KV chunks of very different sizes, merged in a shuffled order:

# %%
B_, H_, Sq_, Skv_, D_ = 1, 2, 5, 700, 64
q = torch.randn(B_, H_, Sq_, D_, dtype=torch.float64)
k = torch.randn(B_, H_, Skv_, D_, dtype=torch.float64)
v = torch.randn(B_, H_, Skv_, D_, dtype=torch.float64)


def partial_attention(q, k, v):
    """(o, lse) over the keys given, in float64 (the reference returns lse in float32)."""
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])   # S = Q K^T · scale
    lse_p = torch.logsumexp(s, -1)
    return torch.exp(s - lse_p[..., None]) @ v, lse_p      # O = softmax(S) V


o_full, lse_full = partial_attention(q, k, v)
print("our float64 helper vs the course reference:", (o_full - reference_attention(q, k, v)[0]).abs().max().item())
cuts = [0, 50, 300, 310, 700]
parts = [partial_attention(q, k[:, :, a:b], v[:, :, a:b]) for a, b in zip(cuts[:-1], cuts[1:])]


def merge_partials(pa, pb):
    (o_a, lse_a), (o_b, lse_b) = pa, pb
    lse_ab = torch.logaddexp(lse_a, lse_b)                        # lse = ln(e^lse_a + e^lse_b)
    w_a, w_b = torch.exp(lse_a - lse_ab), torch.exp(lse_b - lse_ab)
    return w_a[..., None] * o_a + w_b[..., None] * o_b, lse_ab    # o = w_a o_a + w_b o_b


order = [2, 0, 3, 1]
acc = parts[order[0]]
for i in order[1:]:
    acc = merge_partials(acc, parts[i])
print("split-KV merged vs full: max |o diff| =", (acc[0] - o_full).abs().max().item(),
      "  max |lse diff| =", (acc[1] - lse_full).abs().max().item())

# %% [markdown]
# ## Summary
#
# - $(m, \ell)$ can be computed in one pass: rescale the old sum by $e^{m_{\rm old} - m_{\rm new}}$
#   whenever the max grows. Proof: induction on the invariant $\ell_j = \sum_{k \le j} e^{x_k - m_j}$.
# - States merge with an associative, commutative $\oplus$ (it is log-add-exp), so blocks can be
#   processed in any order or in parallel; the empty state $(-\infty, 0)$ needs care.
# - Softmax: 3 passes → 2. Attention: → **1** pass over K and V, with an unnormalized
#   accumulator rescaled by the same $\alpha$ and divided by $\ell$ once at the end.
# - Split-KV, flash-decoding and ring attention are this merge applied to partial attention results.
#
# **Next:** lecture 04 applies it to tiles of $Q$, $K$, $V$: FlashAttention in PyTorch.
