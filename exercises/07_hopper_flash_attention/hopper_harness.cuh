// hopper_harness.cuh: the rest of the step-07 kernel -- epilogue, consumer loop over tiles, the
// kernel (roles, setmaxnreg, barrier set-up) and the host launcher (tensor maps). Given: do not edit.
// It calls the functions of student_kernel.cu: producer, consumer_mainloop (which calls gemm_qk and
// gemm_pv).
#pragma once
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled
#include <cuda_runtime.h>

#include "hopper_common.cuh"

namespace hfa {
// ============================================================================ epilogue
// O_i = O_i / l_i and lse_i = m_i + log l_i (natural log); a row that saw no key: O = 0, lse = -inf.
// Each thread stores its 2 x 4-byte pieces per 8 columns straight from registers. (Staging O_i in
// shared memory for a TMA store, as FA3 does, pushed the consumers past 168 registers and spilled.)
// HFA_WIDE_STORES (v10_wide_stores): the four lanes of a quad first transpose their pieces (two rounds of
// shuffles), so that each lane holds 8 adjacent columns and stores them as one 16 bytes: a quarter of the
// store instructions, each filling whole sectors.
template <typename T, int D>
HP_DEVICE void epilogue(const Accum<D>& acc, const FaParams& p, const Tile& tile, int wg) {
  const int lane = threadIdx.x % 32, warp = (threadIdx.x / 32) % 4;
  const int row0 = tile.m_block * BLOCK_M + wg * 64 + warp * 16 + lane / 4;
  T* O = static_cast<T*>(p.o) + tile.b * p.o_sb + tile.h * p.o_sh;
  float* lse = p.lse + ((int64_t)tile.b * p.Hq + tile.h) * p.Sq;
  const bool wide = kWideStores && ((reinterpret_cast<uintptr_t>(O) | (p.o_ss * sizeof(T))) & 15) == 0;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row0 + 8 * r;
    const float l = quad_sum(acc.l[r]);
    const float inv = l > 0.f ? 1.f / l : 0.f;
    if (wide) {
      // lane q of the quad holds columns 8j + 2q, 8j + 2q + 1 of every 8; per 4 such j, transpose the quad's 4 x 4
      // pieces: swap the off-diagonal 2 x 2 blocks with lane q ^ 2, then the off-diagonal pieces with lane q ^ 1
      const int q = lane & 3;
#pragma unroll
      for (int g = 0; g < D / 32; ++g) {
        uint32_t m[4];
#pragma unroll
        for (int t = 0; t < 4; ++t) m[t] = pack2<T>(acc.o[4 * (4 * g + t) + 2 * r] * inv, acc.o[4 * (4 * g + t) + 2 * r + 1] * inv);
#pragma unroll
        for (int k = 0; k < 2; ++k) {
          const uint32_t x = __shfl_xor_sync(0xffffffffu, (q & 2) ? m[k] : m[2 + k], 2);
          if (q & 2) m[k] = x; else m[2 + k] = x;
        }
#pragma unroll
        for (int k = 0; k < 2; ++k) {
          const uint32_t x = __shfl_xor_sync(0xffffffffu, (q & 1) ? m[2 * k] : m[2 * k + 1], 1);
          if (q & 1) m[2 * k] = x; else m[2 * k + 1] = x;
        }
        if (row < p.Sq)  // m[t] = lane t's piece of column block 4g + q: columns 8 (4g + q) + 0..7 in order
          *reinterpret_cast<uint4*>(O + (int64_t)row * p.o_ss + 8 * (4 * g + q)) = make_uint4(m[0], m[1], m[2], m[3]);
      }
    }
    if (row < p.Sq) {
      if (!wide) {
        T* out = O + (int64_t)row * p.o_ss + 2 * (lane & 3);
#pragma unroll
        for (int j = 0; j < D / 8; ++j)
          *reinterpret_cast<uint32_t*>(out + 8 * j) = pack2<T>(acc.o[4 * j + 2 * r] * inv, acc.o[4 * j + 2 * r + 1] * inv);
      }
      if ((lane & 3) == 0) lse[row] = l > 0.f ? (acc.m[r] + __log2f(l)) * LN2 : -INFINITY;
    }
  }
}

// ============================================================================ consumer
template <typename T, int D>
HP_DEVICE void consumer(unsigned char* smem, Barriers& bars, const FaParams& p, const TileScheduler<D>& sched, int wg) {
  const float scale_log2 = p.scale * LOG2E;
  int it = 0, q_round = 0;
  if (HFA_PINGPONG && wg == 1) named_bar_arrive(kBarWarpgroup0, 2 * 128);  // warpgroup 0 issues first
  for (int t = sched.first(); t < sched.total; t = sched.next(t)) {
    const Tile tile = sched(t);
    const int nb = num_kv_blocks(p, tile.m_block);
    Accum<D> acc;
    acc.zero();
    if (nb > 0) {
      consumer_mainloop<T, D>(acc, smem, bars, p, tile, nb, q_round & 1, it, wg, scale_log2);
      ++q_round;
    }
    epilogue<T, D>(acc, p, tile, wg);
  }
}
}  // namespace hfa
#if HFA_OVERLAP_TILES
#include "overlap_tiles.cuh"  // the ladder's v12_overlap_tiles: producer_two_q, consumer_overlapped (not given)
#endif
namespace hfa {

// ============================================================================ kernel
// This consumer warpgroup's index, 0 or 1. HFA_UNIFORM_WG: lane 0's through a shuffle, which nvcc knows is the same in
// every lane, so that the descriptors built from it stay on the uniform datapath (no R2UR a key block)
HP_DEVICE int consumer_index() {
#if HFA_UNIFORM_WG
  return __shfl_sync(0xffffffffu, int(threadIdx.x / 128), 0) - 1;
#else
  return threadIdx.x / 128 - 1;
#endif
}

// Thread 0 fetches the tensor maps and sets up the ring's, Q's and the tile hand-over's mbarriers (full:
// one arrival, the producer's; empty: one lane per consumer warp); then the whole CTA syncs.
HP_DEVICE void init_barriers(Barriers& bars, const CUtensorMap* tm_q, const CUtensorMap* tm_k, const CUtensorMap* tm_v,
                             int* tile_counter) {
  if (threadIdx.x == 0) {
    bars.counter = tile_counter;
    prefetch_tensormap(tm_q);
    prefetch_tensormap(tm_k);
    prefetch_tensormap(tm_v);
    mbar_init(&bars.q_full, 1);
    mbar_init(&bars.q_empty, 4 * kConsumers);
    if (kQStages > 1) {
      mbar_init(&bars.q2_full, 1);
      mbar_init(&bars.q2_empty, 4 * kConsumers);
    }
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(&bars.k_full[s], 1);
      mbar_init(&bars.v_full[s], 1);
      mbar_init(&bars.k_empty[s], 4 * kConsumers);
      mbar_init(&bars.v_empty[s], 4 * kConsumers);
    }
    for (int s = 0; s < 2; ++s) {
      mbar_init(&bars.tile_full[s], 1);
      mbar_init(&bars.tile_empty[s], 4 * kConsumers);
    }
    fence_barrier_init();
  }
  __syncthreads();
}

template <typename T, int D>
__global__ void __launch_bounds__(NTHREADS, 1)
    hopper_fa_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                     const __grid_constant__ CUtensorMap tm_v, const FaParams p, int* tile_counter) {
  unsigned char* smem = smem_base();
  Barriers& bars = barriers<D>();
  init_barriers(bars, &tm_q, &tm_k, &tm_v, tile_counter);
  const TileScheduler<D> sched(p);
  if (threadIdx.x < 128) {  // warpgroup 0: the producer
    setmaxnreg_dec<kProducerRegs>();
#if HFA_OVERLAP_TILES
    if (threadIdx.x == 0) producer_two_q<D>(&tm_q, &tm_k, &tm_v, smem, bars, p, sched);
#else
    if (threadIdx.x == 0) producer<D>(&tm_q, &tm_k, &tm_v, smem, bars, p, sched);
#endif
  } else {
    setmaxnreg_inc<kConsumerRegs>();
#if HFA_OVERLAP_TILES
    consumer_overlapped<T, D>(smem, bars, p, sched, consumer_index());
#else
    consumer<T, D>(smem, bars, p, sched, consumer_index());
#endif
  }
}

// ============================================================================ host
// cuTensorMapEncodeTiled lives in the driver: fetch it through the runtime (no -lcuda needed).
inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = nullptr;
  if (!fn) {
    void* ptr = nullptr;
    cudaDriverEntryPointQueryResult found;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &ptr, 12000, cudaEnableDefault, &found) ==
            cudaSuccess &&
        found == cudaDriverEntryPointSuccess)
      fn = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(ptr);
  }
  return fn;
}

// A [B, H, S, D] tensor (strides in elements, D contiguous) as a 4-D tensor map with coordinates
// (d, s, h, b); one box is one 128-byte panel (64 16-bit or 128 8-bit columns) x `rows` rows, 128-byte
// swizzled. TMA wants a 16-byte aligned base and strides that are multiples of 16 bytes (the binding
// makes a tensor contiguous otherwise). T: __half, __nv_bfloat16, or uint8_t for e4m3 (step 10's v8).
template <typename T>
int make_tensor_map(CUtensorMap* map, const void* ptr, int D, int S, int H, int B, int64_t ss, int64_t sh, int64_t sb,
                    int rows) {
  auto encode = tensor_map_encoder();
  if (!encode) return (int)cudaErrorNotSupported;
  auto bytes = [](int64_t stride) { return (cuuint64_t)(stride > 0 ? stride : 8) * sizeof(T); };
  const cuuint64_t dims[4] = {(cuuint64_t)D, (cuuint64_t)S, (cuuint64_t)H, (cuuint64_t)B};
  const cuuint64_t strides[3] = {bytes(ss), bytes(sh), bytes(sb)};
  const cuuint32_t box[4] = {(cuuint32_t)(128 / sizeof(T)), (cuuint32_t)rows, 1, 1};
  const cuuint32_t elem_strides[4] = {1, 1, 1, 1};
  const CUtensorMapDataType dtype = sizeof(T) == 1                     ? CU_TENSOR_MAP_DATA_TYPE_UINT8
                                    : std::is_same<T, __half>::value ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                                                     : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  const CUresult r = encode(map, dtype, 4, const_cast<void*>(ptr), dims, strides, box, elem_strides,
                            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? 0 : (int)cudaErrorInvalidValue;
}

// The grid (one CTA per tile, or persistent: one per SM at most) and the persistent kernel's tile counter
// (one int per device, zeroed before every launch; nullptr otherwise).
inline int persistent_setup(const FaParams& p, cudaStream_t stream, int** counter, int* grid) {
  const int tiles = (p.Sq + BLOCK_M - 1) / BLOCK_M * p.Hq * p.B;
  *grid = tiles;
  *counter = nullptr;
  if (!HFA_PERSISTENT) return 0;
  static int* counters[64] = {};
  int device = 0, sms = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  *grid = tiles < sms ? tiles : sms;
  if (!counters[device]) {
    cudaError_t e = cudaMalloc(&counters[device], sizeof(int));
    if (e != cudaSuccess) return (int)e;
  }
  *counter = counters[device];
  return (int)cudaMemsetAsync(*counter, 0, sizeof(int), stream);
}

template <typename T, int D>
int launch(const FaParams& p, cudaStream_t stream) {
  if (p.B == 0 || p.Hq == 0 || p.Sq == 0) return 0;
  using L = SmemLayout<D>;
  CUtensorMap tm_q, tm_k, tm_v;
  int err = make_tensor_map<T>(&tm_q, p.q, D, p.Sq, p.Hq, p.B, p.q_ss, p.q_sh, p.q_sb, BLOCK_M);
  if (!err) err = make_tensor_map<T>(&tm_k, p.k, D, p.Skv, p.Hkv, p.B, p.k_ss, p.k_sh, p.k_sb, BLOCK_N);
  if (!err) err = make_tensor_map<T>(&tm_v, p.v, D, p.Skv, p.Hkv, p.B, p.v_ss, p.v_sh, p.v_sb, BLOCK_N);
  if (err) return err;
  int* counter = nullptr;
  int grid = 0;
  err = persistent_setup(p, stream, &counter, &grid);
  if (err) return err;
  auto kernel = hopper_fa_kernel<T, D>;
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, L::kBytes);
  if (e != cudaSuccess) return (int)e;
  kernel<<<grid, NTHREADS, L::kBytes, stream>>>(tm_q, tm_k, tm_v, p, counter);
  return (int)cudaGetLastError();
}
}  // namespace hfa

extern "C" int fa_launch(const FaParams* p, void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
#ifdef HFA_FP16_D128_ONLY  // the instance the rungs are timed in (lecture 07, the compile check): a quarter of the compile
  if (p->D == 128 && !p->is_bf16) return hfa::launch<__half, 128>(*p, s);
#else
  if (p->D == 64) return p->is_bf16 ? hfa::launch<__nv_bfloat16, 64>(*p, s) : hfa::launch<__half, 64>(*p, s);
  if (p->D == 128) return p->is_bf16 ? hfa::launch<__nv_bfloat16, 128>(*p, s) : hfa::launch<__half, 128>(*p, s);
#endif
  return (int)cudaErrorInvalidValue;
}
