"""Step 10's FP8 error on FA3's outlier inputs, source by source, in PyTorch on a CPU: v7_fp8_fa3's numerics
(Q, K rotated by its diag(signs) H_D / sqrt(D) and cast to e4m3 with one scale per 64 and 128 rows, V per 128
rows, P times 2^8 in e4m3, fp32 softmax sums) with one rounding at a time, and candidate changes. P uses the
row's final maximum (the kernel's running maximum differs on a few tiles): the full path reads within 0.3% of
the kernel run in Triton's interpreter (2026-11-27_cpu_step10_fp8_error.txt).

    PYTHONPATH=src python benchmarks/probes/fp8_error_budget.py [S [SEED]]   # S keys, one head; default 8192, 0
    PYTHONPATH=src python benchmarks/probes/fp8_error_budget.py --spread [N [S ...]]   # v7's RMSE over lengths
                                                         # and N seeds (4; 2k-8k), and the rows that carry it
    PYTHONPATH=src python benchmarks/probes/fp8_error_budget.py --table3 [S ...]   # FA3's Table 3 rows emulated
    PYTHONPATH=src python benchmarks/probes/fp8_error_budget.py --int8 [N]         # Q and K in int8 (INT8_QK),
                                                         # N seeds at 2k, 8k and 16k keys
    PYTHONPATH=src python benchmarks/probes/fp8_error_budget.py --scales [N]       # rows a scale, N seeds at 8k
    PYTHONPATH=src python benchmarks/probes/fp8_error_budget.py --residual [N]     # each tensor's rounding error
                                                         # added back as a second e4m3 term (v7's V_RESIDUAL)
"""
import math
import sys

import torch

sys.path.insert(0, "solutions/10_attention_variants/ladder")
import v7_fp8_fa3 as v7  # noqa: E402

from facourse.fp8 import fa3_outlier_inputs  # noqa: E402

D = 128
R = v7.signed_hadamard(D).float() / math.sqrt(D)
e4m3 = lambda x: x.to(torch.float8_e4m3fn).float()  # noqa: E731


def blocks(x, rows, rot=None, int8=False):
    """x (times rot) rounded to e4m3 (int8: to integers, amax at 127) with one scale per `rows` rows, scale
    applied back."""
    x = x @ rot if rot is not None else x
    xb = x.reshape(x.shape[0], -1, rows, D)
    amax = xb.abs().amax(dim=(2, 3), keepdim=True)
    scale = torch.where(amax > 0, amax / (127 if int8 else 448), torch.ones_like(amax))
    return ((torch.round(xb / scale) if int8 else e4m3(xb / scale)) * scale).reshape(x.shape)


def attention(qq, kk, vv, round_p=False, chunk=1024):
    """float64 O of one head; P = 2^8 exp(S - m) rounded to e4m3 when round_p, its row sum from the unrounded P."""
    S = qq.shape[1]
    out = torch.empty(S, D, dtype=torch.float64)
    for a in range(0, S, chunk):
        s = qq[0, a:a + chunk].double() @ kk[0].double().T / math.sqrt(D)
        p = torch.exp(s - s.amax(1, keepdim=True)) * 256
        out[a:a + chunk] = ((e4m3(p.float()).double() if round_p else p) @ vv[0].double()) / p.sum(1, keepdim=True)
    return out


def largest_p(qq, kk, chunk=1024):
    """Each row's largest attention weight, exact."""
    S = qq.shape[1]
    out = torch.empty(S, dtype=torch.float64)
    for a in range(0, S, chunk):
        out[a:a + chunk] = torch.softmax(qq[0, a:a + chunk].double() @ kk[0].double().T / math.sqrt(D), 1).amax(1)
    return out


def inputs(S, seed):
    return (t[0].float() for t in fa3_outlier_inputs(1, 1, S, D, seed=seed))   # [1, S, D]


def v7_path(q, k, v):
    return attention(blocks(q, 64, R), blocks(k, 128, R), blocks(v, 128), True)


def rmse(o, ref):
    return float((o - ref).pow(2).mean().sqrt())


def budget(S, seed):
    q, k, v = inputs(S, seed)
    ref = attention(q, k, v)
    qr, kr, vb = blocks(q, 64, R), blocks(k, 128, R), blocks(v, 128)
    rows = {
        "v7 (Q, K, V and P rounded)": attention(qr, kr, vb, True),
        "Q and K only": attention(qr, kr, v),
        "V only": attention(q, k, vb),
        "P only": attention(q, k, v, True),
        "v7, V rotated too (O times R^T after)": attention(qr, kr, blocks(v, 128, R) @ R.T, True),
        "v7, one scale per row of Q and of K": attention(blocks(q, 1, R), blocks(k, 1, R), vb, True),
        "v7, Q per 16 rows": attention(blocks(q, 16, R), kr, vb, True),
    }
    print(f"# FP8 error budget, FA3's outlier inputs (seed {seed}), one head, {S} keys, D {D}, non-causal; "
          f"torch {torch.__version__} on a CPU")
    for name, o in rows.items():
        print(f"{name:40s} RMSE {rmse(o, ref):.2e}")


def spread(lengths=(2048, 4096, 8192), seeds=(0, 1, 2, 3), shares=(0.1, 0.5)):
    """v7's RMSE for each length and seed (one head each), their root mean square over the seeds, and, for each
    length over its seeds, the rows whose largest attention weight (exact) passes each share: how many, and how
    much of the squared error of O they carry."""
    print(f"# v7's FP8 error on FA3's outlier inputs by length and seed: one head, D {D}, non-causal; "
          f"torch {torch.__version__} on a CPU")
    print(f"{'keys':>6s} " + " ".join(f"{'seed ' + str(s):>9s}" for s in seeds) + f" {'all seeds':>10s}   "
          + "   ".join(f"{'rows with max p > ' + str(t):>40s}" for t in shares))
    for S in lengths:
        errs, sq, pm = [], [], []
        for seed in seeds:
            q, k, v = inputs(S, seed)
            ref = attention(q, k, v)
            e = (v7_path(q, k, v) - ref).pow(2).mean(1)
            errs.append(float(e.mean().sqrt()))
            sq.append(e)
            pm.append(largest_p(q, k))
        sq, pm = torch.cat(sq), torch.cat(pm)
        cells = [f"{100 * (pm > t).double().mean():.1f}% of rows, {100 * sq[pm > t].sum() / sq.sum():.1f}% of the error"
                 for t in shares]
        print(f"{S:6d} " + " ".join(f"{e:9.2e}" for e in errs) + f" {float(sq.mean().sqrt()):10.2e}   "
              + "   ".join(f"{c:>40s}" for c in cells))


def fa2_fp16(q, k, v, chunk=1024):
    """FlashAttention-2 in fp16: S and the softmax in fp32, P rounded to fp16 for P V, O to fp16."""
    out = torch.empty(q.shape[1], D, dtype=torch.float64)
    for a in range(0, q.shape[1], chunk):
        s = q[0, a:a + chunk].half().float() @ k[0].half().float().T / math.sqrt(D)
        p = torch.exp(s - s.amax(1, keepdim=True))
        out[a:a + chunk] = ((p.half().float() @ v[0].half().float()) / p.sum(1, keepdim=True)).half().double()
    return out


def standard_fp16(q, k, v, chunk=1024):
    """Attention as three fp16 PyTorch ops: S rounded to fp16, then scaled, softmax's P in fp16, O in fp16."""
    out = torch.empty(q.shape[1], D, dtype=torch.float64)
    for a in range(0, q.shape[1], chunk):
        s = ((q[0, a:a + chunk].half().float() @ k[0].half().float().T).half().float() / math.sqrt(D)).half()
        out[a:a + chunk] = (torch.softmax(s.float(), 1).half().float() @ v[0].half().float()).half().double()
    return out


def per_tensor(x):
    """x rounded to e4m3 with one scale for the whole tensor, scale applied back."""
    scale = x.abs().amax() / 448
    return e4m3(x / scale) * scale


def baseline_fp8(q, k, v, chunk=1024):
    """FA3's FP8 baseline as its section 4.3 describes it: one scale per tensor for Q, K and V, fp32 GEMM
    sums, the softmax's results in fp16; P to e4m3 times 448 (its largest value, 1, at e4m3's largest)."""
    out = torch.empty(q.shape[1], D, dtype=torch.float64)
    q8, k8, v8 = per_tensor(q), per_tensor(k), per_tensor(v)
    for a in range(0, q.shape[1], chunk):
        p = torch.softmax((q8[0, a:a + chunk] @ k8[0].T / math.sqrt(D)).half().float(), 1).half().float()
        out[a:a + chunk] = (e4m3(p * 448) / 448 @ v8[0]).half().double()
    return out


def scales(S=8192, seeds=range(8)):
    """v7's RMSE with Q's and K's scales over fewer rows (v7: Q 64, K 128), seed by seed and over the seeds."""
    variants = {"v7": (64, 128), "Q per 16 rows": (16, 128), "Q per row": (1, 128), "Q and K per row": (1, 1),
                "K per 16 rows": (64, 16)}
    print(f"# v7's RMSE by the rows a scale covers: one head a seed, {S} keys, D {D}, non-causal; "
          f"torch {torch.__version__} on a CPU")
    print(f"{'seed':>9s} " + " ".join(f"{n:>16s}" for n in variants))
    sq = {n: [] for n in variants}
    for seed in seeds:
        q, k, v = inputs(S, seed)
        ref, vb = attention(q, k, v), blocks(v, 128)
        for n, (rq, rk) in variants.items():
            sq[n].append(float((attention(blocks(q, rq, R), blocks(k, rk, R), vb, True) - ref).pow(2).mean()))
        print(f"{seed:9d} " + " ".join(f"{e[-1] ** 0.5:16.3e}" for e in sq.values()), flush=True)
    print(f"{'all seeds':>9s} " + " ".join(f"{(sum(e) / len(e)) ** 0.5:16.3e}" for e in sq.values()))


def hi_lo(x, rows, rot=None):
    """(hi, lo): x (times rot) in e4m3 with one scale per `rows` rows, and its rounding error in e4m3 in the same
    scale (v7's V_RESIDUAL for V), both with the scale applied back."""
    x = x @ rot if rot is not None else x
    xb = x.reshape(x.shape[0], -1, rows, D)
    amax = xb.abs().amax(dim=(2, 3), keepdim=True)
    scale = torch.where(amax > 0, amax / 448, torch.ones_like(amax))
    hi = e4m3(xb / scale)
    return (hi * scale).reshape(x.shape), (e4m3(xb / scale - hi) * scale).reshape(x.shape)


def residual(lengths=(2048, 8192), seeds=range(4)):
    """v7's RMSE with the rounding error of V, of Q, of both, or of Q, K and V added back as a second e4m3 term in
    the same scale: one more Q K^T (Q's), one more P V (V's), or both, on the tensor cores."""
    print(f"# v7 with rounding errors added back (a second e4m3 term, same scale): one head a seed, D {D}, non-causal; "
          f"torch {torch.__version__} on a CPU")
    print(f"{'keys':>6s} {'seed':>4s} {'v7':>10s} {'+ V':>10s} {'+ Q':>10s} {'+ Q, V':>10s} {'+ Q, K, V':>10s}")
    for S in lengths:
        for seed in seeds:
            q, k, v = inputs(S, seed)
            ref = attention(q, k, v)
            (qh, ql), (kh, kl), (vh, vl) = hi_lo(q, 64, R), hi_lo(k, 128, R), hi_lo(v, 128)
            rows = [(qh, kh, vh), (qh, kh, vh + vl), (qh + ql, kh, vh), (qh + ql, kh, vh + vl),
                    (qh + ql, kh + kl, vh + vl)]
            print(f"{S:6d} {seed:4d} " + " ".join(f"{rmse(attention(*r, True), ref):10.2e}" for r in rows), flush=True)


def int8_qk(lengths=(2048, 8192, 16384), seeds=range(4)):
    """v7 against Q and K in int8 (v7's INT8_QK: one scale per 64 and 128 rows, amax at 127; P and V as v7), seed by
    seed and over the seeds (root mean square), with the rotation and without, and the int8 Q K^T's error alone."""
    rows = {"v7 (e4m3)": lambda q, k, v, vb: v7_path(q, k, v),
            "int8 Q, K": lambda q, k, v, vb: attention(blocks(q, 64, R, True), blocks(k, 128, R, True), vb, True),
            "int8, no rotation": lambda q, k, v, vb: attention(blocks(q, 64, None, True), blocks(k, 128, None, True),
                                                               vb, True),
            "int8 Q K^T alone": lambda q, k, v, vb: attention(blocks(q, 64, R, True), blocks(k, 128, R, True), v),
            "e4m3 Q K^T alone": lambda q, k, v, vb: attention(blocks(q, 64, R), blocks(k, 128, R), v)}
    print(f"# v7's RMSE on FA3's outlier inputs with Q and K in int8: one head a seed, D {D}, non-causal; "
          f"torch {torch.__version__} on a CPU")
    print(f"{'keys':>6s} {'seed':>9s} " + " ".join(f"{n:>18s}" for n in rows))
    for S in lengths:
        sq = {n: [] for n in rows}
        for seed in seeds:
            q, k, v = inputs(S, seed)
            ref, vb = attention(q, k, v), blocks(v, 128)
            for n, f in rows.items():
                sq[n].append(float((f(q, k, v, vb) - ref).pow(2).mean()))
            print(f"{S:6d} {seed:9d} " + " ".join(f"{e[-1] ** 0.5:18.3e}" for e in sq.values()), flush=True)
        print(f"{S:6d} {'all seeds':>9s} " + " ".join(f"{(sum(e) / len(e)) ** 0.5:18.3e}" for e in sq.values()))


def table3(lengths=(1024, 2048, 4096, 8192, 16384), seeds=(0, 1)):
    """FA3's Table 3 (Shah et al., 2024) rows emulated on its inputs, for each length and seed, against float64
    attention of the fp32 draws (before the fp16 rounding of fa3_outlier_inputs, as FA3's FP64 reference would
    see them): at which length do the emulations read FA3's figures?"""
    paper = {"FA2 fp16": 1.9e-4, "standard fp16": 3.2e-4, "FP8 baseline": 2.4e-2, "v7": 9.1e-3,
             "v7, no rotation": 2.4e-2, "v7, one scale a tensor": 9.3e-3}
    print(f"# FA3's Table 3 emulated: RMSE of O against float64 attention of the fp32 draws; one head, D {D}, "
          f"non-causal; torch {torch.__version__} on a CPU")
    print(f"{'keys':>6s} {'seed':>4s} " + " ".join(f"{n:>22s}" for n in paper))
    print(f"{'FA3':>6s} {'':>4s} " + " ".join(f"{e:22.1e}" for e in paper.values()))
    for S in lengths:
        for seed in seeds:
            q, k, v = (t[0] for t in fa3_outlier_inputs(1, 1, S, D, seed=seed, dtype=torch.float32))
            ref = attention(q, k, v)
            qh, kh, vh = (t.half().float() for t in (q, k, v))
            rows = [fa2_fp16(q, k, v), standard_fp16(q, k, v), baseline_fp8(qh, kh, vh), v7_path(qh, kh, vh),
                    attention(blocks(qh, 64), blocks(kh, 128), blocks(vh, 128), True),
                    attention(per_tensor(qh @ R), per_tensor(kh @ R), per_tensor(vh), True)]
            print(f"{S:6d} {seed:4d} " + " ".join(f"{rmse(o, ref):22.2e}" for o in rows), flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--spread"]:
        n = int(sys.argv[2]) if sys.argv[2:] else 4
        spread(*[tuple(int(a) for a in sys.argv[3:])] if sys.argv[3:] else (), seeds=range(n))
    elif sys.argv[1:2] == ["--scales"]:
        scales(seeds=range(int(sys.argv[2]) if sys.argv[2:] else 8))
    elif sys.argv[1:2] == ["--residual"]:
        residual(seeds=range(int(sys.argv[2]) if sys.argv[2:] else 4))
    elif sys.argv[1:2] == ["--int8"]:
        int8_qk(seeds=range(int(sys.argv[2]) if sys.argv[2:] else 4))
    elif sys.argv[1:2] == ["--table3"]:
        table3(*[tuple(int(a) for a in sys.argv[2:])] if sys.argv[2:] else ())
    else:
        budget(int(sys.argv[1]) if len(sys.argv) > 1 else 8192, int(sys.argv[2]) if len(sys.argv) > 2 else 0)
