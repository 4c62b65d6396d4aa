// routing_hopper.h: inserted by the CPU check of step 07 (facourse.emu_build) at the top of
// hopper_harness.cuh's namespace, whose calls of producer and consumer it routes through these flags:
// either side of the ring can be an oracle that follows a list of operations per tile, written from
// the schedule the check expects (driver_hopper.cpp defines the oracles).
#pragma once
using FaOp = std::array<int64_t, 10>;   // tile, kind, bar, arg, map, dst, c0, c1, c2, c3
inline std::vector<FaOp> fa_producer_ops, fa_consumer_ops;
inline bool fa_use_oracle_producer = false, fa_use_oracle_consumer = false;
template <int D>
void fa_oracle_producer(const CUtensorMap*, const CUtensorMap*, const CUtensorMap*, unsigned char*, Barriers&,
                        const FaParams&, const TileScheduler<D>&);
template <typename T, int D>
void fa_oracle_consumer(unsigned char*, Barriers&, const FaParams&, const TileScheduler<D>&, int);
