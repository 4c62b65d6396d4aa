// v4_hopper_binding.cpp: the torch binding of v4_hopper.cu: step 07's forward (fa_launch) and the Hopper
// backward (fa_bwd_launch). Built on a GPU machine only, by v4_hopper.py; the kernels never see torch.
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#include <torch/extension.h>

#include <limits>

#include "v4_hopper.h"

// TMA wants a 16-byte aligned base and 16-byte aligned strides; the last dimension contiguous.
static at::Tensor tma_ready(const at::Tensor& t) {
  const bool ok = t.stride(-1) == 1 && reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0 && t.stride(0) % 8 == 0 &&
                  t.stride(1) % 8 == 0 && t.stride(2) % 8 == 0;
  return ok ? t : t.contiguous();
}

// q, k, v, and a fourth [B, Hq, Sq, D] tensor (the forward's o, the backward's dO) into FaParams.
static FaParams params(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& o,
                       bool causal, double scale) {
  TORCH_CHECK(q.is_cuda() && q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "q, k, v: 4-D CUDA tensors");
  TORCH_CHECK(q.scalar_type() == k.scalar_type() && q.scalar_type() == v.scalar_type(), "q, k, v: one dtype");
  TORCH_CHECK(q.scalar_type() == at::kHalf || q.scalar_type() == at::kBFloat16, "fp16 or bf16 only");
  TORCH_CHECK(q.size(3) == 64 || q.size(3) == 128, "head dimension 64 or 128");
  TORCH_CHECK(k.size(1) > 0 && q.size(1) % k.size(1) == 0, "Hq must be a multiple of Hkv");
  TORCH_CHECK(k.sizes() == v.sizes() && k.size(0) == q.size(0) && k.size(3) == q.size(3), "k, v: [B, Hkv, Skv, D]");
  FaParams p{};
  p.q = q.data_ptr(); p.k = k.data_ptr(); p.v = v.data_ptr(); p.o = o.data_ptr();
  p.q_sb = q.stride(0); p.q_sh = q.stride(1); p.q_ss = q.stride(2);
  p.k_sb = k.stride(0); p.k_sh = k.stride(1); p.k_ss = k.stride(2);
  p.v_sb = v.stride(0); p.v_sh = v.stride(1); p.v_ss = v.stride(2);
  p.o_sb = o.stride(0); p.o_sh = o.stride(1); p.o_ss = o.stride(2);
  p.B = (int)q.size(0); p.Hq = (int)q.size(1); p.Hkv = (int)k.size(1); p.Sq = (int)q.size(2);
  p.Skv = (int)k.size(2); p.D = (int)q.size(3);
  p.scale = (float)scale; p.causal = causal ? 1 : 0; p.is_bf16 = q.scalar_type() == at::kBFloat16;
  return p;
}

static void check(int err) {
  TORCH_CHECK(err == 0, "kernel launch failed: ", cudaGetErrorString(static_cast<cudaError_t>(err)));
}

// Step 07's forward: (o, lse).
std::vector<at::Tensor> forward(at::Tensor q, at::Tensor k, at::Tensor v, bool causal, double scale) {
  q = tma_ready(q), k = tma_ready(k), v = tma_ready(v);
  auto o = at::empty(q.sizes(), q.options());
  auto lse = at::empty({q.size(0), q.size(1), q.size(2)}, q.options().dtype(at::kFloat));
  FaParams p = params(q, k, v, o, causal, scale);
  p.lse = lse.data_ptr<float>();
  if (p.Skv == 0) {
    o.zero_();
    lse.fill_(-std::numeric_limits<float>::infinity());
  } else if (o.numel() > 0) {
    check(fa_launch(&p, c10::cuda::getCurrentCUDAStream().stream()));
  }
  return {o, lse};
}

// (dq, dk, dv) from q, k, v, dO and v3's preprocess (m2 = lse log2 e, delta = rowsum(dO O), [B, Hq, Sq_pad]).
std::vector<at::Tensor> backward(at::Tensor q, at::Tensor k, at::Tensor v, at::Tensor dout, at::Tensor m2,
                                 at::Tensor delta, bool causal, double scale, bool deterministic,
                                 int64_t section, int64_t order) {
  q = tma_ready(q), k = tma_ready(k), v = tma_ready(v), dout = tma_ready(dout);
  TORCH_CHECK(dout.sizes() == q.sizes() && dout.scalar_type() == q.scalar_type(), "dO: like q");
  auto dq = at::empty(q.sizes(), q.options());
  auto dk = at::empty(k.sizes(), k.options());
  auto dv = at::empty(v.sizes(), v.options());
  FaBwdParams f{};
  f.base = params(q, k, v, dout, causal, scale);
  const FaParams& p = f.base;
  if (p.Sq == 0 || p.Skv == 0 || p.B == 0 || p.Hq == 0) return {dq.zero_(), dk.zero_(), dv.zero_()};
  const int64_t bm = fa_bwd_block_m(p.D, p.causal), m_blocks = (p.Sq + bm - 1) / bm;
  TORCH_CHECK(m2.is_contiguous() && delta.is_contiguous() && m2.size(-1) >= p.Sq && m2.size(-1) % 4 == 0,
              "m2, delta: contiguous [B, Hq, Sq_pad]");
  auto opts = q.options().dtype(at::kFloat);
  auto dq_acc = at::zeros({p.B * p.Hq * m_blocks * 128 * bm}, opts);
  auto counter = at::zeros({1}, q.options().dtype(at::kInt));
  at::Tensor sems = deterministic ? at::zeros({p.B * p.Hq * m_blocks}, q.options().dtype(at::kInt)) : at::Tensor();
  f.m2 = m2.data_ptr<float>(); f.delta = delta.data_ptr<float>(); f.dq_acc = dq_acc.data_ptr<float>();
  f.dq = dq.data_ptr(); f.dk = dk.data_ptr(); f.dv = dv.data_ptr();
  f.counter = counter.data_ptr<int>(); f.sems = deterministic ? sems.data_ptr<int>() : nullptr;
  f.sq_pad = (int)m2.size(-1);
  f.section = (int)section;
  f.order = (int)order;
  check(fa_bwd_launch(&f, c10::cuda::getCurrentCUDAStream().stream()));
  return {dq, dk, dv};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &forward, "step 07's Hopper forward: returns o, lse");
  m.def("backward", &backward, "the Hopper backward: returns dq, dk, dv");
}
