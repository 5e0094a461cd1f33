// pybind11 module jetspec_kernels._C: torch-free. Takes raw device pointers (data_ptr() integers),
// sizes and a stream handle, so it does not depend on the installed torch's C++ ABI.
#include <pybind11/pybind11.h>

#include <cctype>
#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>

#include "jetspec/api.h"

namespace py = pybind11;

namespace {

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    std::ostringstream msg;
    msg << "jetspec_kernels._C." << what << ": CUDA error " << static_cast<int>(err) << " ("
        << cudaGetErrorName(err) << "): " << cudaGetErrorString(err);
    throw std::runtime_error(msg.str());
  }
}

template <typename T>
T* ptr(std::uintptr_t p) { return reinterpret_cast<T*>(p); }

cudaStream_t stream_of(std::uintptr_t s) { return reinterpret_cast<cudaStream_t>(s); }

// "90a,80" -> does a binary for one of these run on sm_<major><minor>?
bool supports_arch(int sm) {
  std::string archs = JETSPEC_CUDA_ARCHS;
  std::stringstream ss(archs);
  std::string a;
  while (std::getline(ss, a, ',')) {
    bool arch_specific = !a.empty() && (a.back() == 'a' || a.back() == 'f');
    std::string digits = a;
    while (!digits.empty() && !std::isdigit(static_cast<unsigned char>(digits.back()))) digits.pop_back();
    if (digits.empty()) continue;
    int built = std::stoi(digits);
    if (arch_specific ? built == sm : (built / 10 == sm / 10 && built % 10 <= sm % 10)) return true;
  }
  return false;
}

int device_count() {
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver) {
    cudaGetLastError();
    return 0;
  }
  check(err, "device_count");
  return n;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "jetspec_kernels CUDA kernels (torch-free: raw pointers, sizes, strides, stream)";
  m.def("built_archs", [] { return std::string(JETSPEC_CUDA_ARCHS); },
        "CUDA architectures this module was compiled for, comma-separated (e.g. '90a,80').");
  m.def("supports_arch", &supports_arch, py::arg("sm"),
        "Whether the module has code for compute capability sm (e.g. 90).");
  m.def("device_count", &device_count,
        "Number of visible CUDA devices; 0 (not an error) when there is no device or driver.");
  m.def(
      "pack_mask",
      [](std::uintptr_t parents, std::uintptr_t num_nodes, std::uintptr_t mask, int batch, int n,
         int words, std::uintptr_t stream) {
        check(jetspec::launch_pack_mask(ptr<const int32_t>(parents), ptr<const int32_t>(num_nodes),
                                        ptr<int32_t>(mask), batch, n, words, stream_of(stream)),
              "pack_mask");
      },
      py::arg("parents"), py::arg("num_nodes"), py::arg("mask"), py::arg("batch"), py::arg("n"),
      py::arg("words"), py::arg("stream"),
      "int32 parents [B,N], num_nodes [B] -> int32 mask [B,N,W] (device pointers).");
}
