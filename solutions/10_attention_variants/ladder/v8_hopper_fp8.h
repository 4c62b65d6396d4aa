// v8_hopper_fp8.h: the C ABI between v8_hopper_fp8.cu and its torch binding (no CUDA, no torch).
#pragma once
#include "fa_params.h"

typedef struct Fp8Params {
  FaParams base;   // q, k: e4m3 [B, H, S, 128]; v: e4m3 V^T [B, Hkv, 128, Skv] (keys contiguous, v_ss its row
                   // stride, a multiple of 16); o and lse as in FaParams, o in fp16 or bf16 (is_bf16)
  const float* dq;  // descales, fp32: [B, Hq, nq], one per q_rows (64 or 128) query rows
  const float* dk;  // [B, Hkv, nk], one per 128 keys
  const float* dv;  // [B, Hkv, nk]
  int nq, nk, q_rows;
} Fp8Params;

#ifdef __cplusplus
extern "C" {
#endif
int fa8_launch(const Fp8Params* p, void* stream);
#ifdef __cplusplus
}
#endif
