"""Step 07's kernel on the GPU, outside the ladder runner: the ladder's solution against builds of
ladder/student_kernel_solution.cu (v4_persistent's switches unless a flag sets one) with -D flags
(HFA_BLOCK_N=176, HFA_CONSUMER_REGS=240, ...; several joined by ":"), each checked on the five configurations and
the edge cases (fp16), then timed against cuDNN, alternating, ROUNDS rounds (default 2).

    PYTHONPATH=src:. python benchmarks/probes/v4_fwd_variants.py HFA_BLOCK_N=176 HFA_BLOCK_N=176:HFA_CONSUMER_REGS=240
    CFGS=large,noncausal_8k ROUNDS=3 ...   # the configurations timed (default: large and the 4k-16k sweep);
    CFGS=noncausal_8448,...                # a sweep point at any length (B = max(1, 16384 // S), H 16, D 128)
    CLOCKS=1 ...                           # nvidia-smi samples the SM clock and the power every 50 ms: each timing's means
    ncu -k regex:hopper_fa_kernel -s 2 -c 1 --section SpeedOfLight --section WarpStateStats \
        python benchmarks/probes/v4_fwd_variants.py --one noncausal_8k [FLAG=V:...]   # one launch after two, for ncu
"""
import concurrent.futures as cf
import os
import sys

sys.path[:0] = ["src", "."]
import torch  # noqa: E402

from benchmarks.rungs import build_cuda  # noqa: E402
from facourse import validate_inputs  # noqa: E402
from facourse.bench import bench_attention  # noqa: E402
from facourse.configs import CONFIGS, EDGE_CASES, SWEEP_4K_16K, sweep_config  # noqa: E402
from facourse.cuda_build import load_hopper_rung  # noqa: E402
from facourse.kinds.forward import KIND  # noqa: E402
from facourse.steps import load_step  # noqa: E402
from probe_common import summary, timed_rounds  # noqa: E402

M = load_step("07")
SOLUTION = M["ladder"]["solution"]
SOURCE = M["ladder_dir"] / "student_kernel_solution.cu"  # its switches are #ifndef-guarded: -D flags set them
CFGS = os.environ.get("CFGS", ",".join(["large", *SWEEP_4K_16K])).split(",")
LINES: list[str] = []


def config(name: str):
    """A configuration's name, or, for `causal_S` / `noncausal_S` with S in tokens, that sweep point at length S."""
    kind, _, n = name.rpartition("_")
    return sweep_config(int(n), kind == "causal") if n.isdigit() and kind in ("causal", "noncausal") else name


def entry(ext):
    def fn(q, k, v, causal=False, scale=None):
        validate_inputs(q, k, v, scale)
        return tuple(ext.forward(q, k, v, bool(causal), float(q.shape[-1] ** -0.5 if scale is None else scale)))
    return fn


def build(variant: str):
    """The ladder solution's extension, or the exercise solution's build with -D flags (cached: built once)."""
    if not variant:
        return build_cuda(M, SOLUTION)
    defs = variant.split(":")
    return load_hopper_rung("fa07_sol_" + "_".join(defs).replace("=", "_").lower(),
                            [SOURCE, M["dir"] / M["build"]["binding"]], [M["ladder_dir"], M["dir"]],
                            extra_cuda_cflags=[f"-D{d}" for d in defs])


def prebuild(variant: str) -> None:  # a pool worker: nvcc runs side by side, the cache keeps the builds
    build(variant)


def main(variants: list[str]) -> None:
    with cf.ProcessPoolExecutor(max_workers=len(variants) + 1) as pool:
        list(pool.map(prebuild, ["", *variants]))
    fns = {SOLUTION: entry(build(""))} | {v: entry(build(v)) for v in variants}
    failed = set()
    for name, fn in fns.items():  # a variant that fails a check is not timed
        for case in [*CONFIGS, *EDGE_CASES]:
            try:
                KIND.check(fn, case, "cuda", torch.float16)
            except Exception as e:  # noqa: BLE001 (report every failure, keep going)
                failed.add(name)
                print(f"CHECK FAIL {name} {case}: {str(e)[:300]}", flush=True)
        print(f"CHECK {'FAIL' if name in failed else 'ok  '} {name}: {len(CONFIGS) + len(EDGE_CASES)} cases", flush=True)
    runs = {name: (lambda cfg, fn=fn: bench_attention(fn, config(cfg), backend="CUDNN_ATTENTION"))
            for name, fn in fns.items() if name not in failed}
    timed_rounds(runs, CFGS, int(os.environ.get("ROUNDS", "2")), LINES, width=36)


def one(cfg: str, variant: str = "") -> None:
    """Three launches of the solution (or a variant) on ``cfg``: ncu skips two and reads the third."""
    from facourse.configs import get_config, make_inputs
    c = get_config(cfg, "cuda")
    q, k, v = make_inputs(c, 0, "cuda", torch.float16)
    fn = entry(build(variant))
    for _ in range(3):
        fn(q, k, v, c.causal)
    torch.cuda.synchronize()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--one"]:
        one(*sys.argv[2:4])
        sys.exit(0)
    main(sys.argv[1:])
    summary(LINES)
    print(torch.cuda.get_device_name())
