// Lecture 14's two unit rates measured on the GPU at hand: MUFU's exp2 (ex2.approx.ftz.f32) and the FMA
// pipes' fp32 fused multiply-add, in results per clock per SM. Each thread runs CHAINS independent chains of
// ITERS dependent operations; two blocks of 1024 threads share each SM, and each block reads the SM's clock
// (clock64) around its loop, so the rate per SM is the SM's operations over its slower block's cycles.
// CUDA events time the whole launch too, which gives the clock the SMs ran at.
//
//   nvcc -O3 -gencode=arch=compute_90,code=sm_90 benchmarks/probes/unit_rates.cu -o /tmp/unit_rates && /tmp/unit_rates
#include <cstdio>
#include <cuda_runtime.h>

constexpr int CHAINS = 8, ITERS = 4096, THREADS = 1024, PER_SM = 2;

template <bool EXP2>
__global__ void __launch_bounds__(THREADS) rate_kernel(float* out, long long* cycles) {
    float x[CHAINS];
    for (int c = 0; c < CHAINS; ++c) x[c] = -1e-3f * (threadIdx.x + c);
    __syncthreads();
    long long t0 = clock64();
    for (int i = 0; i < ITERS; ++i) {
#pragma unroll
        for (int c = 0; c < CHAINS; ++c) {
            if (EXP2) asm volatile("ex2.approx.ftz.f32 %0, %0;" : "+f"(x[c]));             // MUFU.EX2
            else asm volatile("fma.rn.f32 %0, %0, 0f3F7FFFFF, 0fB8D1B717;" : "+f"(x[c]));   // FFMA
        }
    }
    __syncthreads();
    long long t1 = clock64();
    float s = 0.f;
    for (int c = 0; c < CHAINS; ++c) s += x[c];
    out[blockIdx.x * THREADS + threadIdx.x] = s;                                               // keep the chains live
    if (threadIdx.x == 0) cycles[blockIdx.x] = t1 - t0;
}

template <bool EXP2>
void measure(const char* name, int sms) {
    int blocks = sms * PER_SM;
    float* out;
    long long* cyc;
    cudaMalloc(&out, sizeof(float) * blocks * THREADS);
    cudaMalloc(&cyc, sizeof(long long) * blocks);
    long long* host = new long long[blocks];
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    for (int round = 0; round < 4; ++round) {                 // the first round warms up; all are printed
        cudaEventRecord(a);
        rate_kernel<EXP2><<<blocks, THREADS>>>(out, cyc);
        cudaEventRecord(b);
        cudaEventSynchronize(b);
        float ms = 0.f;
        cudaEventElapsedTime(&ms, a, b);
        cudaMemcpy(host, cyc, sizeof(long long) * blocks, cudaMemcpyDeviceToHost);
        long long worst = 0;
        for (int i = 0; i < blocks; ++i) worst = host[i] > worst ? host[i] : worst;
        double ops_per_sm = double(PER_SM) * THREADS * ITERS * CHAINS;
        printf("%-5s round %d: %.2f results/clock/SM (slowest block %lld cycles), %.3f ms for %d SMs, "
               "%.1f T results/s, SM clock %.0f MHz\n", name, round, ops_per_sm / worst, worst, ms, sms,
               ops_per_sm * sms / (ms * 1e-3) / 1e12, worst / (ms * 1e3));
    }
    cudaFree(out);
    cudaFree(cyc);
    delete[] host;
}

int main() {
    cudaDeviceProp p;
    cudaGetDeviceProperties(&p, 0);
    int rt = 0, drv = 0;
    cudaRuntimeGetVersion(&rt);
    cudaDriverGetVersion(&drv);
    printf("%s, %d SMs, compute capability %d.%d, CUDA runtime %d, driver %d\n", p.name, p.multiProcessorCount,
           p.major, p.minor, rt, drv);
    measure<true>("ex2", p.multiProcessorCount);
    measure<false>("ffma", p.multiProcessorCount);
    return 0;
}
