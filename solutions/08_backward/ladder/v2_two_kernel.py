"""v2: the exercise's solution: the backward in Triton as three kernels, D = rowsum(dO * O), then
dK/dV with one program per key tile, then dQ with one program per query tile. No atomics:
deterministic. Its code is the exercise's (solutions/08_backward/08_backward.pct.py, the cells
`forward`, `preprocess`, `dkdv`, `dq` and `autograd`); this file loads those cells, so the rung
and the exercise's solution are one source.

v2 verdict: 258 TFLOP/s backward on large (1.24x SDPA FLASH's backward), 1.21x on long, 1.06-1.23x at
4k-16k (fp16, H100, benchmarks/results/2026-11-23_h100_step08.json); deterministic.

What it teaches. The forward is one loop; the backward has two reductions that run in different
directions: dK_j, dV_j sum over query rows i, dQ_i sums over key columns j. One program cannot
own both without racing on the other, so each gets its own kernel:

1. ``bwd_preprocess``: D_i = rowsum(dO_i * O_i) in fp32, one program per query tile.
2. ``bwd_dkdv``: one program per (key tile, KV head, batch) keeps K_j, V_j and the fp32
   accumulators dK_j, dV_j on chip and loops over every query head of its GQA group and every
   query tile that can see the key tile (causal: tiles above the diagonal are skipped). Because
   the whole group is summed inside one program, dK and dV need no atomics.
3. ``bwd_dq``: one program per (query tile, query head, batch) keeps Q_i, dO_i and dQ_i on chip and
   loops over the key tiles it can see.

Both loops rebuild P_ij = exp(scale * Q_i K_j^T - lse_i) from the forward's lse (``rebuild_p``);
the price of no atomics is that S and dP are computed twice (7 matmuls per tile pair instead of
5). Every tile is masked; v3 splits off the tiles that need no mask. Rows with no visible key
(lse = -inf) get P = 0, hence exactly zero gradients. The forward is the exercise's own (plain:
every visited tile masked); v3 uses step 05's solution forward.

Run on its own:  python v2_two_kernel.py   (TRITON_INTERPRET=1 on a machine without a GPU)
"""
import linecache
import os
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402,F401  (sets up the interpreter without a GPU, before triton is imported)

TWIN = Path(__file__).resolve().parents[1] / "08_backward.pct.py"
CELLS = ("setup", "forward", "preprocess", "dkdv", "dq", "autograd")


def _cells(text: str, names=CELLS) -> str:
    """The code of the twin's cells named by grade_id, in order, without nbgrader's markers."""
    out = []
    for chunk in ("\n" + text).split("\n# %%")[1:]:
        header, _, body = chunk.partition("\n")
        gid = header.partition('"grade_id": "')[2].partition('"')[0]
        if gid in names and "[markdown]" not in header:
            out.append("\n".join(ln for ln in body.splitlines() if "### BEGIN" not in ln and "### END" not in ln))
    return "\n\n".join(out)


# Triton reads a kernel's source back (inspect.getsource): the cells go into linecache under a name of
# their own, so that the line numbers it reads are the cells', not the twin's.
_SRC = _cells(TWIN.read_text(encoding="utf-8"))
_NAME = f"<{TWIN.name}: cells {', '.join(CELLS)}>"
linecache.cache[_NAME] = (len(_SRC), None, _SRC.splitlines(True), _NAME)
exec(compile(_SRC, _NAME, "exec"))  # noqa: S102


if __name__ == "__main__":
    from facourse.backward import check_gradients
    for name in ("ragged", "empty_rows", "mqa", "decode"):
        check_gradients(flash_attention_train, name)  # noqa: F821 (defined by the exercise's cells)
