// v8_hopper_fp8_binding.cpp: the torch binding of v8_hopper_fp8.cu (fa8_launch). Built on a GPU machine
// only, by v8_hopper_fp8.py; the kernel never sees torch.
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#include <torch/extension.h>

#include <limits>

#include "v8_hopper_fp8.h"

// q8 [B, Hq, Sq, 128], k8 [B, Hkv, Skv, 128], v8t [B, Hkv, 128, Skv] in float8_e4m3fn, rows 16-byte aligned;
// dq [B, Hq, cdiv(Sq, 64 or 128)], dk and dv [B, Hkv, cdiv(Skv, 128)] fp32. Returns o (fp16, or bf16 when
// out_bf16) and lse (fp32, natural log).
std::vector<at::Tensor> forward(at::Tensor q8, at::Tensor k8, at::Tensor v8t, at::Tensor dq, at::Tensor dk,
                                at::Tensor dv, bool causal, double scale, bool out_bf16) {
  for (const at::Tensor* t : {&q8, &k8, &v8t}) {
    TORCH_CHECK(t->is_cuda() && t->dim() == 4 && t->scalar_type() == at::kFloat8_e4m3fn,
                "q8, k8, v8t: 4-D float8_e4m3fn CUDA tensors");
    TORCH_CHECK(t->stride(-1) == 1 && reinterpret_cast<uintptr_t>(t->data_ptr()) % 16 == 0 &&
                    t->stride(0) % 16 == 0 && t->stride(1) % 16 == 0 && t->stride(2) % 16 == 0,
                "q8, k8, v8t: the last dimension contiguous, the others 16-byte aligned (TMA)");
  }
  const int64_t B = q8.size(0), Hq = q8.size(1), Sq = q8.size(2), D = q8.size(3);
  const int64_t Hkv = k8.size(1), Skv = k8.size(2), nk = (Skv + 127) / 128;
  TORCH_CHECK(D == 128, "v8_hopper_fp8: head dimension 128 only");
  TORCH_CHECK(Hkv > 0 && Hq % Hkv == 0 && k8.size(0) == B && k8.size(3) == D, "k8 must be [B, Hkv, Skv, 128]");
  TORCH_CHECK(v8t.sizes() == at::IntArrayRef({B, Hkv, D, Skv}), "v8t must be [B, Hkv, 128, Skv]");
  const int64_t nq = dq.size(-1);
  const int q_rows = nq == (Sq + 63) / 64 ? 64 : 128;
  TORCH_CHECK(dq.dim() == 3 && dq.size(0) == B && dq.size(1) == Hq && nq == (Sq + q_rows - 1) / q_rows,
              "dq: [B, Hq, cdiv(Sq, 64)] or [B, Hq, cdiv(Sq, 128)]");
  TORCH_CHECK(dk.sizes() == at::IntArrayRef({B, Hkv, nk}) && dv.sizes() == dk.sizes(), "dk, dv: [B, Hkv, cdiv(Skv, 128)]");
  dq = dq.to(at::kFloat).contiguous();
  dk = dk.to(at::kFloat).contiguous();
  dv = dv.to(at::kFloat).contiguous();
  auto o = at::empty({B, Hq, Sq, D}, q8.options().dtype(out_bf16 ? at::kBFloat16 : at::kHalf));
  auto lse = at::empty({B, Hq, Sq}, q8.options().dtype(at::kFloat));
  if (Skv == 0) {
    o.zero_();
    lse.fill_(-std::numeric_limits<float>::infinity());
    return {o, lse};
  }
  Fp8Params f{};
  FaParams& p = f.base;
  p.q = q8.data_ptr(); p.k = k8.data_ptr(); p.v = v8t.data_ptr(); p.o = o.data_ptr();
  p.lse = lse.data_ptr<float>();
  const auto strides = [](const at::Tensor& t, int64_t* sb, int64_t* sh, int64_t* ss) {
    *sb = t.stride(0), *sh = t.stride(1), *ss = t.stride(2);  // batch, head, row (v8t: row = one of D)
  };
  strides(q8, &p.q_sb, &p.q_sh, &p.q_ss);
  strides(k8, &p.k_sb, &p.k_sh, &p.k_ss);
  strides(v8t, &p.v_sb, &p.v_sh, &p.v_ss);
  strides(o, &p.o_sb, &p.o_sh, &p.o_ss);
  p.B = (int)B; p.Hq = (int)Hq; p.Hkv = (int)Hkv; p.Sq = (int)Sq; p.Skv = (int)Skv; p.D = (int)D;
  p.scale = (float)scale; p.causal = causal ? 1 : 0; p.is_bf16 = out_bf16 ? 1 : 0;
  f.dq = dq.data_ptr<float>(); f.dk = dk.data_ptr<float>(); f.dv = dv.data_ptr<float>();
  f.nq = (int)nq; f.nk = (int)nk; f.q_rows = q_rows;
  const int err = fa8_launch(&f, c10::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(err == 0, "kernel launch failed: ", cudaGetErrorString(static_cast<cudaError_t>(err)));
  return {o, lse};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &forward, "FP8 (e4m3) FlashAttention forward on Hopper: returns o, lse");
}
