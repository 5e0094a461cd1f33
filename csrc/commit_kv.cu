// commit_kv: raw 2- and 4-byte element copies (the cache dtype does not matter beyond its size).
#include "jetspec/api.h"
#include "jetspec/commit_kv.cuh"

namespace jetspec {

Status launch_commit_kv(const CommitKvParams& p, cudaStream_t stream) {
  if (p.cache_elem_bytes == 2) return commit_kv<uint16_t>(p, stream);
  if (p.cache_elem_bytes == 4) return commit_kv<uint32_t>(p, stream);
  return bad_input("cache_elem_bytes ", p.cache_elem_bytes, " is not 2 or 4");
}

}  // namespace jetspec
