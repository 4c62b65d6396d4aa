// fa_binding.cpp: the torch binding of a step-06 or step-07 kernel (any file that exports fa_launch).
// Built on a GPU machine only, by facourse.load_cuda_extension; the kernels never see torch.
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>
#include <limits>
#include <cuda_runtime.h>

#include "fa_params.h"

static bool aligned16(const at::Tensor& t) {
  // cp.async copies 16 bytes: the base and every row must start on a 16-byte boundary
  return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0 && t.stride(0) % 8 == 0 && t.stride(1) % 8 == 0 &&
         t.stride(2) % 8 == 0;
}

std::vector<at::Tensor> forward(at::Tensor q, at::Tensor k, at::Tensor v, bool causal, double scale, int64_t window) {
  TORCH_CHECK(q.is_cuda() && k.is_cuda() && v.is_cuda(), "q, k, v must be CUDA tensors");
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "q, k, v must be [B, H, S, D]");
  TORCH_CHECK(q.scalar_type() == k.scalar_type() && q.scalar_type() == v.scalar_type(), "q, k, v: one dtype");
  TORCH_CHECK(q.scalar_type() == at::kHalf || q.scalar_type() == at::kBFloat16, "fp16 or bf16 only");
  TORCH_CHECK(q.stride(-1) == 1 && k.stride(-1) == 1 && v.stride(-1) == 1, "the last dimension must be contiguous");
  const int64_t B = q.size(0), Hq = q.size(1), Sq = q.size(2), D = q.size(3);
  const int64_t Hkv = k.size(1), Skv = k.size(2);
  TORCH_CHECK(D == 64 || D == 128, "head dimension must be 64 or 128");
  TORCH_CHECK(window >= 0 && (window == 0 || causal), "a sliding window (window > 0) goes with causal");
  TORCH_CHECK(Hkv > 0 && Hq % Hkv == 0, "Hq must be a multiple of Hkv");
  TORCH_CHECK(k.sizes() == v.sizes() && k.size(0) == B && k.size(3) == D, "k and v must be [B, Hkv, Skv, D]");
  if (!aligned16(q)) q = q.contiguous();
  if (!aligned16(k)) k = k.contiguous();
  if (!aligned16(v)) v = v.contiguous();
  auto o = at::empty({B, Hq, Sq, D}, q.options());
  auto lse = at::empty({B, Hq, Sq}, q.options().dtype(at::kFloat));
  FaParams p{};
  p.q = q.data_ptr(); p.k = k.data_ptr(); p.v = v.data_ptr(); p.o = o.data_ptr();
  p.lse = lse.data_ptr<float>();
  p.q_sb = q.stride(0); p.q_sh = q.stride(1); p.q_ss = q.stride(2);
  p.k_sb = k.stride(0); p.k_sh = k.stride(1); p.k_ss = k.stride(2);
  p.v_sb = v.stride(0); p.v_sh = v.stride(1); p.v_ss = v.stride(2);
  p.o_sb = o.stride(0); p.o_sh = o.stride(1); p.o_ss = o.stride(2);
  p.B = (int)B; p.Hq = (int)Hq; p.Hkv = (int)Hkv; p.Sq = (int)Sq; p.Skv = (int)Skv; p.D = (int)D;
  p.scale = (float)scale; p.causal = causal ? 1 : 0; p.is_bf16 = q.scalar_type() == at::kBFloat16;
  p.window = (int)std::min<int64_t>(window, Skv);  // a window of Skv keys or more is plain causal
  if (Skv == 0) {  // no key at all: every row is empty
    o.zero_();
    lse.fill_(-std::numeric_limits<float>::infinity());
    return {o, lse};
  }
  const int err = fa_launch(&p, c10::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(err == 0, "kernel launch failed: ", cudaGetErrorString(static_cast<cudaError_t>(err)));
  return {o, lse};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  // window (optional, 0: none): a sliding window, for the kernels that read FaParams::window
  m.def("forward", &forward, "FlashAttention forward (step 06): returns o, lse", pybind11::arg("q"), pybind11::arg("k"),
        pybind11::arg("v"), pybind11::arg("causal"), pybind11::arg("scale"), pybind11::arg("window") = 0);
}
