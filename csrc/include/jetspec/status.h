// What a launcher returns: its CUDA error (cudaSuccess when all went well) and, when it refused
// its input or the device cannot run the request, a message that names the argument, its value
// and the limit. Host code only, no CUDA syntax: bindings.cpp (g++) turns it into a Python error.
#pragma once
#ifdef JETSPEC_CPU_SIM
#include "cuda_sim.h"
#else
#include <cuda_runtime.h>
#endif
#include <cstdio>
#include <string>

namespace jetspec {

struct [[nodiscard]] Status {
  enum Kind : int {
    kCuda = 0,         // a CUDA call failed (msg: what the launcher was doing, or empty)
    kBadInput = 1,     // the launcher refused an argument: a ValueError
    kUnsupported = 2,  // valid input this device or build cannot run: a RuntimeError
  };
  cudaError_t err = cudaSuccess;
  Kind kind = kCuda;
  std::string msg;

  Status() = default;
  Status(cudaError_t e) : err(e) {}  // implicit, so a CUDA call's result can be returned as is
  bool ok() const { return err == cudaSuccess; }
};

// Appends every part to one string: cat("budget ", 600, " exceeds ", 512). No iostreams: in the
// nvcc-compiled host code of the real build, numbers streamed into an ostringstream came out empty
// or crashed (docs/kernels.md, "Host code nvcc compiles"), so numbers go through std::to_string.
inline void cat_part(std::string& out, const std::string& part) { out += part; }
inline void cat_part(std::string& out, const char* part) { out += part; }
inline void cat_part(std::string& out, char part) { out += part; }
inline void cat_part(std::string& out, bool part) { out += part ? "true" : "false"; }
inline void cat_part(std::string& out, double part) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", part);
  out += buf;
}
inline void cat_part(std::string& out, float part) { cat_part(out, static_cast<double>(part)); }
template <typename T>
void cat_part(std::string& out, T part) {
  out += std::to_string(part);  // integers
}

template <typename... Parts>
std::string cat(const Parts&... parts) {
  std::string s;
  (cat_part(s, parts), ...);
  return s;
}

template <typename... Parts>
Status bad_input(const Parts&... parts) {
  Status s(cudaErrorInvalidValue);
  s.kind = Status::kBadInput;
  s.msg = cat(parts...);
  return s;
}

template <typename... Parts>
Status unsupported(const Parts&... parts) {
  Status s(cudaErrorNotSupported);
  s.kind = Status::kUnsupported;
  s.msg = cat(parts...);
  return s;
}

// A failed CUDA call, told with what it was for; success stays success.
inline Status cuda_context(cudaError_t err, const std::string& what) {
  Status s(err);
  if (err != cudaSuccess) s.msg = what;
  return s;
}

// "<name> <value> is below <lo>" / "... exceeds <hi>", or success when lo <= value <= hi.
inline Status check_range(const char* name, long long value, long long lo,
                          long long hi = 0x7fffffffffffffffLL) {
  if (value < lo) return bad_input(name, " ", value, " is below ", lo);
  if (value > hi) return bad_input(name, " ", value, " exceeds ", hi);
  return Status();
}

// Return the first failure (a Status, or a CUDA error) from a launcher that returns Status.
#define JETSPEC_RETURN_IF_FAILED(expr)                      \
  do {                                                      \
    ::jetspec::Status jetspec_status_ = (expr);             \
    if (!jetspec_status_.ok()) return jetspec_status_;      \
  } while (0)

}  // namespace jetspec
