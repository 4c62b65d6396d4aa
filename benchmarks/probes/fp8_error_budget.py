"""Step 10's FP8 error on FA3's outlier inputs, source by source, in PyTorch on a CPU: v7_fp8_fa3's numerics
(Q, K rotated by its diag(signs) H_D / sqrt(D) and cast to e4m3 with one scale per 64 and 128 rows, V per 128
rows, P times 2^8 in e4m3, fp32 softmax sums) with one rounding at a time, and candidate changes. P uses the
row's final maximum (the kernel's running maximum differs on a few tiles): the full path reads within 0.3% of
the kernel run in Triton's interpreter (2026-11-27_cpu_step10_fp8_error.txt).

    PYTHONPATH=src python benchmarks/probes/fp8_error_budget.py [S [SEED]]   # S keys, one head; default 8192, 0
    PYTHONPATH=src python benchmarks/probes/fp8_error_budget.py --spread     # v7's RMSE over lengths and seeds,
                                                                             # and the rows that carry it
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


def blocks(x, rows, rot=None):
    """x (times rot) rounded to e4m3 with one scale per `rows` rows, scale applied back."""
    x = x @ rot if rot is not None else x
    xb = x.reshape(x.shape[0], -1, rows, D)
    amax = xb.abs().amax(dim=(2, 3), keepdim=True)
    scale = torch.where(amax > 0, amax / 448, torch.ones_like(amax))
    return (e4m3(xb / scale) * scale).reshape(x.shape)


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


if __name__ == "__main__":
    if sys.argv[1:] == ["--spread"]:
        spread()
    else:
        budget(int(sys.argv[1]) if len(sys.argv) > 1 else 8192, int(sys.argv[2]) if len(sys.argv) > 2 else 0)
