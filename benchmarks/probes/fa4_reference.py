"""The FlashAttention authors' own Hopper kernels on this card, against cuDNN and the course's kernels in one process:
what "FlashAttention-3 parity" (issues #35, #36) reads on this GPU with today's cuDNN, not the paper's.

The kernels: flash-attn-4 from PyPI (its CuTe DSL package, flash_attn.cute), whose sm_90 path is the authors' port of
FlashAttention-3 (its tile sizes are FA3's hopper/tile_size.h; forward 128 x 128 with the P V product fed from
registers and intra-warpgroup overlap, backward FA3's 80 x 128 / 64 x 128 at D 128). It runs in its own layout,
[B, S, H, D] storage (make_inputs' "bshd"); the course's kernels run in theirs, contiguous [B, H, S, D]; each ratio is
against cuDNN on the same tensors. Nothing of it is in the course: it travels to the GPU machine as an archive of
wheels (64 MiB a call: the MLIR library of nvidia-cutlass-dsl is 193 MB), made on a machine with pip:

    pip download --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64 -d whl \\
        flash-attn-4==4.0.0b36 nvidia-cutlass-dsl==4.8.1 nvidia-cutlass-dsl-libs-base==4.8.1 \\
        nvidia-cutlass-dsl-libs-core==4.8.1 nvidia-cutlass-dsl-libs-cu13==4.8.1 apache-tvm-ffi torch-c-dlpack-ext \\
        quack-kernels einops          # (add --platform manylinux_2_24_x86_64 etc. where pip asks)
    mkdir site && for w in whl/*.whl; do unzip -q -o $w -d site; done   # then drop the dist-info folders, the
    # aarch64 and QNX stubs, tvm_ffi's headers and sources, the *.pyi stubs and dsl_packages/iket (only quack's sm_120
    # GEMM imports it): with them the archive and the checkout passed 64 MiB (cuda-bindings: the image's torch needs it)
    tar cf - -C site . | xz --x86 --lzma2=preset=9e,dict=256MiB > carry/fa4.tar.xz     # 5 minutes, about 55 MB
    # on the GPU machine: tar xJf carry/fa4.tar.xz -C /tmp/fa4 (PYTHONPATH below; dsl_packages replaces the .pth)

    export PYTHONPATH=/tmp/fa4:/tmp/fa4/nvidia_cutlass_dsl/dsl_packages:src:.
    python benchmarks/probes/fa4_reference.py forward    # step 07's solution and FA4's forward
    python benchmarks/probes/fa4_reference.py backward   # step 08's v4_hopper and FA4's backward
    CFGS=large,noncausal_8k ROUNDS=3 ...   # configurations (default: large and the 4k-16k sweep), rounds (default 2)
    python benchmarks/probes/fa4_reference.py kernels    # both backwards kernel by kernel (torch.profiler)
    ncu -k regex:"FlashAttentionBackwardSm90|bwd_kernel" -s 3 -c 1 --section ... \
        python benchmarks/probes/fa4_reference.py one fa4 noncausal_8k   # four backwards of one, for Nsight Compute
    ncu -k regex:"FlashAttentionForwardSm90|hopper_fa_kernel" -s 4 -c 1 --section ... \
        python benchmarks/probes/fa4_reference.py one_forward step07 noncausal_8k   # five forwards of one

Two methods: the course's bench (facourse.bench: interleaved with cuDNN, L2 flushed, median), then triton's do_bench
back to back (each kernel alone, its own L2 flush, median): a ratio near 1 is read only where both agree.
"""
import os
import sys

sys.path[:0] = ["src", ".", "solutions/08_backward/ladder", "benchmarks/probes"]
import torch  # noqa: E402
import triton  # noqa: E402

from facourse.bench import MODES, bench_attention, reference, timed_call  # noqa: E402
from facourse.configs import SWEEP_4K_16K, get_config, make_inputs  # noqa: E402
from probe_common import kernel_table, summary, timed_rounds  # noqa: E402
from v4_fwd_variants import build, entry  # noqa: E402

MODE = sys.argv[1] if len(sys.argv) > 1 else "forward"
CFGS = os.environ.get("CFGS", ",".join(["large", *SWEEP_4K_16K])).split(",")
ROUNDS = int(os.environ.get("ROUNDS", "2"))
LINES: list[str] = []


def fa4(q, k, v, causal=False, scale=None):
    """FA4's flash_attn_func on [B, H, S, D] views (its [B, S, H, D] by a transpose, no copy for "bshd" inputs)."""
    from flash_attn.cute.interface import flash_attn_func
    o = flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), softmax_scale=scale,
                        causal=bool(causal))
    return (o[0] if isinstance(o, tuple) else o).transpose(1, 2)


def layout_of(name):
    return "bshd" if name == "fa4" else "bhsd"


def first(x):
    return x[0] if isinstance(x, tuple) else x


def check(fns: dict) -> None:
    """Each kernel's output (forward) or gradients (backward) against cuDNN's on `large` and `noncausal_4k`: a kernel
    that computes something else is not timed."""
    ref, _ = reference("CUDNN_ATTENTION")
    for cname in ("large", "noncausal_4k"):
        cfg = get_config(cname, "cuda")
        for name, fn in fns.items():
            q, k, v = make_inputs(cfg, 1, "cuda", torch.float16, layout_of(name))
            if MODE == "forward":
                pairs = {"o": (first(fn(q, k, v, cfg.causal)), first(ref(q, k, v, cfg.causal)))}
            else:
                do = torch.randn_like(q)
                grads = []
                for f in (fn, ref):
                    qq, kk, vv = (t.detach().requires_grad_() for t in (q, k, v))
                    grads.append(torch.autograd.grad(first(f(qq, kk, vv, cfg.causal)), (qq, kk, vv), do))
                pairs = {n: (a, b) for n, a, b in zip(("dq", "dk", "dv"), *grads)}
            for n, (a, b) in pairs.items():
                err, top = (a.float() - b.float()).abs().max().item(), b.float().abs().max().item()
                ok = err <= 2e-2 * max(top, 1.0)
                print(f"CHECK {'ok  ' if ok else 'FAIL'} {name} {cname} {n}: max |diff| {err:.2e} (max |cuDNN| "
                      f"{top:.2e})", flush=True)
                if not ok:
                    raise SystemExit(f"{name} disagrees with cuDNN on {cname} ({n}): not timed")


def do_bench_rows(fns: dict) -> None:
    """Second method: triton.testing.do_bench, each kernel and cuDNN back to back on the same tensors."""
    ref, _ = reference("CUDNN_ATTENTION")
    for cname in CFGS:
        cfg = get_config(cname, "cuda")
        for name, fn in fns.items():
            q, k, v = make_inputs(cfg, 0, "cuda", torch.float16, layout_of(name))
            do = torch.randn_like(q) if MODE != "forward" else None
            calls = {n: timed_call(f, q, k, v, do, cfg.causal, MODE) for n, f in ((name, fn), ("cudnn", ref))}
            ms = {n: triton.testing.do_bench(c, warmup=50, rep=300) for n, c in calls.items()}
            flops = cfg.flops() * MODES[MODE]
            print(f"DOBENCH {name:10} {cname:14} {flops / ms[name] / 1e9:6.0f} TFLOP/s vs cuDNN "
                  f"{flops / ms['cudnn'] / 1e9:6.0f}: x{ms['cudnn'] / ms[name]:.3f}", flush=True)


def backward_of(fn, name, cname):
    """One backward of ``fn`` on ``cname`` in its layout (the forward run once, its graph kept), warmed up."""
    cfg = get_config(cname, "cuda")
    q, k, v = make_inputs(cfg, 0, "cuda", torch.float16, layout_of(name))
    run = timed_call(fn, q, k, v, torch.randn_like(q), cfg.causal, "backward")
    for _ in range(3):
        run()
    torch.cuda.synchronize()
    return run


def kernels(fns: dict) -> None:
    """GPU time per backward of each kernel each backward launches (probe_common.kernel_table)."""
    for cname in CFGS:
        for name, fn in fns.items():
            kernel_table(backward_of(fn, name, cname), f"{cname} {name}")


def main() -> None:
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}, cuDNN "
          f"{torch.backends.cudnn.version()}, mode {MODE}", flush=True)
    import cutlass
    import flash_attn
    import flash_attn.cute
    print(f"# flash-attn-4 {getattr(flash_attn, '__version__', '?')}, nvidia-cutlass-dsl "
          f"{getattr(cutlass, '__version__', '?')}, from {os.path.dirname(flash_attn.cute.__file__)}", flush=True)
    if MODE in ("forward", "one_forward"):
        fns = {"fa4": fa4, "step07": entry(build(""))}  # the ladder's solution, as v4_fwd_variants builds it
    else:
        import v4_hopper
        fns = {"fa4": fa4, "v4_hopper": v4_hopper.flash_attention_train}
    if MODE == "one":
        backward_of(fns[sys.argv[2]], sys.argv[2], sys.argv[3])()
        torch.cuda.synchronize()
        return
    if MODE == "one_forward":  # five forwards of one kernel (the first compiles), for Nsight Compute's -s 4 -c 1
        cfg = get_config(sys.argv[3], "cuda")
        q, k, v = make_inputs(cfg, 0, "cuda", torch.float16, layout_of(sys.argv[2]))
        for _ in range(5):
            fns[sys.argv[2]](q, k, v, cfg.causal)
        torch.cuda.synchronize()
        return
    if MODE == "kernels":
        return kernels(fns)
    check(fns)

    def run(name, fn):
        return lambda cname: bench_attention(fn, cname, backend="CUDNN_ATTENTION", mode=MODE,
                                             layout=layout_of(name))
    timed_rounds({n: run(n, f) for n, f in fns.items()}, CFGS, ROUNDS, LINES, width=10)
    do_bench_rows(fns)
    print("## the course's bench, round by round (TFLOP/s, x cuDNN)")
    summary(LINES)


if __name__ == "__main__":
    main()
