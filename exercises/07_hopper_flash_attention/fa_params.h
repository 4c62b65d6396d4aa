// fa_params.h: the C ABI between a kernel file and its host binding (no CUDA, no torch).
// Every kernel of steps 06 and 07 exports
//     extern "C" int fa_launch(const FaParams* p, void* stream);   // returns a cudaError_t
// Strides are in elements; the last dimension is contiguous (stride 1).
#pragma once
#include <stdint.h>

typedef struct FaParams {
  const void* q;  // [B, Hq, Sq, D]
  const void* k;  // [B, Hkv, Skv, D]
  const void* v;  // [B, Hkv, Skv, D]
  void* o;        // [B, Hq, Sq, D], q's dtype
  float* lse;     // [B, Hq, Sq] fp32, contiguous, natural log
  int64_t q_sb, q_sh, q_ss;  // strides of batch, head, sequence
  int64_t k_sb, k_sh, k_ss;
  int64_t v_sb, v_sh, v_ss;
  int64_t o_sb, o_sh, o_ss;
  int B, Hq, Hkv, Sq, Skv, D;
  float scale;   // softmax scale (1/sqrt(D) by default)
  int causal;    // bottom-right aligned: key j visible to query i iff j <= i + (Skv - Sq)
  int is_bf16;   // 0: fp16, 1: bf16
  int window;    // > 0 (with causal): a sliding window, key j also needs j > i + (Skv - Sq) - window;
                 // 0: none. Read only by kernels built for it (step 07's with HFA_WINDOW, step 10's v6)
} FaParams;

#ifdef __cplusplus
extern "C" {
#endif
int fa_launch(const FaParams* p, void* stream);
#ifdef __cplusplus
}
#endif
