"""Step 08's v4_hopper backward kernel by kernel (torch.profiler, CUDA activity): GPU time per backward of the
zeroing, v3's preprocess, the main kernel and dQ's conversion, on large and at non-causal 4k and 16k, both modes.

    PYTHONPATH=src:. python benchmarks/probes/v4_bwd_profile.py      # on an H100/H200
"""
import sys, torch
sys.path[:0] = ["src", ".", "solutions/08_backward/ladder"]
import v4_hopper as v4
from facourse.configs import get_config, make_inputs
from torch.profiler import profile, ProfilerActivity
for name in ("large", "noncausal_4k", "noncausal_16k"):
    cfg = get_config(name, "cuda")
    q, k, v = make_inputs(cfg, 0, "cuda", torch.float16)
    for det in (False, True):
        q_, k_, v_ = (t.detach().requires_grad_() for t in (q, k, v))
        o = v4.flash_attention_train(q_, k_, v_, cfg.causal, None, det)
        do = torch.randn_like(o)
        for _ in range(3):
            torch.autograd.grad(o, (q_, k_, v_), do, retain_graph=True)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                torch.autograd.grad(o, (q_, k_, v_), do, retain_graph=True)
            torch.cuda.synchronize()
        rows = [(e.key, e.device_time_total / 5, e.count // 5) for e in prof.key_averages() if e.device_time_total > 0]
        total = sum(r[1] for r in rows)
        print(f"== {name} deterministic={det}: GPU time per backward {total:.0f} us")
        for key, t, n in sorted(rows, key=lambda r: -r[1]):
            print(f"   {t:9.1f} us {100 * t / total:5.1f}%  x{n}  {key[:90]}")
print(torch.cuda.get_device_name())
