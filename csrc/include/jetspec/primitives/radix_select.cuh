// Radix select over the keys a block holds: most significant digit first, 8 bits a pass, one
// shared histogram a pass (counts, and with kMass the keys' summed masses), warp 0 choosing the
// digit. build_tree finds the k-th smallest topn key with it, verify_tree's filter the top-k /
// top-p thresholds.
#pragma once
#include "jetspec/primitives/block_scan.cuh"

namespace jetspec {

constexpr int kRadixBits = 8;
constexpr int kRadixBins = 1 << kRadixBits;
static_assert(kRadixBins == 32 * 8, "warp 0 scans the bins, 8 a lane");

// radix_select's shared memory; kMass adds a 64-bit mass per bin (selects by mass). digit and
// the sums after it are warp 0's choice, for every thread (the next pass clears the bins).
template <bool kMass>
struct RadixSelectSmem {
  unsigned int count[kRadixBins];                   // this pass's histogram: keys per digit
  unsigned long long mass[kMass ? kRadixBins : 1];  // and their mass
  int digit;
  unsigned long long above_count, above_mass, equal_count, equal_mass, target;
};

template <typename Key>
struct RadixSelected {
  Key key;                                     // the selected key c
  unsigned long long above_count, above_mass;  // keys above c, and their mass
  unsigned long long equal_count, equal_mass;  // keys equal to c, and their mass
  unsigned long long target;                   // the weight the search had to reach
};

// key >> (shift + kRadixBits): the digits above a pass's (a 64-bit key takes two shifts, so that
// none is by 64 bits).
template <typename Key>
__device__ __forceinline__ unsigned long long radix_digits_above(Key key, int shift) {
  if constexpr (sizeof(Key) < sizeof(unsigned long long)) {
    return static_cast<unsigned long long>(key) >> (shift + kRadixBits);
  } else {
    return (key >> shift) >> kRadixBits;
  }
}

// What a select whose target is given asks of the total weight: nothing.
struct NoTargetOfTotal {
  __device__ __forceinline__ unsigned long long operator()(unsigned long long) const { return 0; }
};

// The largest key c such that the keys at or above c weigh at least `target` (weight: their
// count, or their summed mass when by_mass and kMass). for_each_key(add) calls add(key, mass) for
// each key this thread holds, the same keys on every call (the Threads threads together hold them
// all); keys are below 2^nbits. target 0 means target_of(total), the total weight of the keys,
// known after the first pass. Every weight is an integer, so the atomics' order does not matter.
// A target above the total weight is not a valid request (the result is then unspecified).
template <int Threads, bool kMass, typename Key, typename ForEachKey,
          typename TargetOf = NoTargetOfTotal>
__device__ __forceinline__ RadixSelected<Key> radix_select(ForEachKey for_each_key, int nbits,
                                                           bool by_mass, unsigned long long target,
                                                           RadixSelectSmem<kMass>& sm,
                                                           TargetOf target_of = {}) {
  by_mass = kMass && by_mass;
  const int npass = (nbits + kRadixBits - 1) / kRadixBits;
  RadixSelected<Key> r{0, 0ull, 0ull, 0ull, 0ull, target};
  for (int pass = 0; pass < npass; ++pass) {
    const int shift = (npass - 1 - pass) * kRadixBits;  // below nbits: no shift by a key's width
    for (int b = threadIdx.x; b < kRadixBins; b += Threads) {
      sm.count[b] = 0u;
      if (kMass) sm.mass[b] = 0ull;
    }
    __syncthreads();
    // Only keys that share the digits chosen so far take part.
    const unsigned long long high = radix_digits_above(r.key, shift);
    for_each_key([&](Key key, unsigned long long mass) {
      if (radix_digits_above(key, shift) != high) return;
      const int d = static_cast<int>((key >> shift) & (kRadixBins - 1));
      atomicAdd(&sm.count[d], 1u);
      if (kMass && mass) atomicAdd(&sm.mass[d], mass);
    });
    __syncthreads();
    if (threadIdx.x < 32) {
      // Lane l holds bins 8 (31 - l) .. 8 (31 - l) + 7: lane 0 the highest digits.
      const int lane = threadIdx.x, top = 8 * (31 - lane) + 7;
      unsigned long long own_count = 0, own_mass = 0;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        own_count += sm.count[top - j];
        if (kMass) own_mass += sm.mass[top - j];
      }
      unsigned long long count = own_count, mass = own_mass;  // lanes 0..l: the bins from the top
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const unsigned long long uc = __shfl_up_sync(0xffffffffu, count, o);
        const unsigned long long um = kMass ? __shfl_up_sync(0xffffffffu, mass, o) : 0ull;
        if (lane >= o) {
          count += uc;
          mass += um;
        }
      }
      unsigned long long goal = r.target;
      if (pass == 0 && goal == 0) goal = target_of(__shfl_sync(0xffffffffu, by_mass ? mass : count, 31));
      const bool reach = (by_mass ? r.above_mass + mass : r.above_count + count) >= goal;
      const unsigned hit = __ballot_sync(0xffffffffu, reach);
      if (lane == (hit ? __ffs(hit) - 1 : 31)) {
        unsigned long long above_count = r.above_count + count - own_count;
        unsigned long long above_mass = r.above_mass + mass - own_mass;
        int d = top;
        for (; d > top - 7; --d) {
          const unsigned long long bin_mass = kMass ? sm.mass[d] : 0ull;
          if ((by_mass ? above_mass + bin_mass : above_count + sm.count[d]) >= goal) break;
          above_count += sm.count[d];
          above_mass += bin_mass;
        }
        sm.digit = d;
        sm.above_count = above_count;
        sm.above_mass = above_mass;
        sm.equal_count = sm.count[d];
        sm.equal_mass = kMass ? sm.mass[d] : 0ull;
        sm.target = goal;
      }
    }
    __syncthreads();
    r.key |= static_cast<Key>(sm.digit) << shift;
    r.above_count = sm.above_count;
    r.above_mass = sm.above_mass;
    r.equal_count = sm.equal_count;
    r.equal_mass = sm.equal_mass;
    r.target = sm.target;
  }
  return r;
}

}  // namespace jetspec
