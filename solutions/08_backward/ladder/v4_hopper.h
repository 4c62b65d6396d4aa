// v4_hopper.h: the C ABI between v4_hopper.cu and its torch binding (no CUDA, no torch).
#pragma once
#include "fa_params.h"

typedef struct FaBwdParams {
  FaParams base;       // q, k, v as the forward's; o: dO [B, Hq, Sq, D] (o_* its strides); lse unused
  const float* m2;     // [B, Hq, Sq_pad]: lse * log2(e) (+inf on empty rows and padding), v3's preprocess
  const float* delta;  // [B, Hq, Sq_pad]: rowsum(dO * O) (0 on padding)
  float* dq_acc;       // [B, Hq, cdiv(Sq, BM), 128 BM] fp32, zeroed: dQ tiles in the kernel's fragment order
  void* dq;            // [B, Hq, Sq, D] like q, contiguous
  void* dk;            // [B, Hkv, Skv, D] like k, contiguous
  void* dv;
  int* counter;        // one int, zeroed: the CTAs' tickets
  int* sems;           // deterministic: [B, Hq, cdiv(Sq, BM)] ints, zeroed; nullptr: dQ added in any order
  int sq_pad;          // m2's and delta's last dimension, >= Sq
  int section;         // tickets: key block first within sections of this many (b, h_kv) pairs (0: one section)
  int order;           // query blocks of a CTA: 0 ascending, group heads outermost; 1 descending, heads innermost
} FaBwdParams;

#ifdef __cplusplus
extern "C" {
#endif
int fa_bwd_block_m(int D, int causal);  // BM, the query rows of a step: what dq_acc and sems are sized by
int fa_bwd_launch(const FaBwdParams* p, void* stream);
#ifdef __cplusplus
}
#endif
