// JETSPEC_CUDA_ARCHS lists ("90a,80", CMake syntax with commas): which devices the built code runs
// on, and whether the code for sm_90 in it holds the Hopper-only (wgmma) kernels. Host-only and
// torch-free.
#pragma once
#include <cctype>
#include <sstream>
#include <string>

namespace jetspec {

// Calls f(sm, suffix) for each entry: "90a" -> (90, 'a'), "80" -> (80, 0); stops when f is true.
template <typename F>
bool arch_list_any(const std::string& list, F f) {
  std::stringstream ss(list);
  std::string a;
  while (std::getline(ss, a, ',')) {
    char suffix = 0;
    if (!a.empty() && !std::isdigit(static_cast<unsigned char>(a.back()))) {
      suffix = a.back();
      a.pop_back();
    }
    if (a.empty() || !std::isdigit(static_cast<unsigned char>(a[0]))) continue;
    if (f(std::stoi(a), suffix)) return true;
  }
  return false;
}

// Does code built for `list` run on compute capability sm (e.g. 90)? An arch-specific entry
// ("90a", "90f") runs only there; a plain one on the same major with an equal or newer minor.
inline bool arch_list_supports(const std::string& list, int sm) {
  return arch_list_any(list, [sm](int built, char suffix) {
    return suffix != 0 ? built == sm : (built / 10 == sm / 10 && built % 10 <= sm % 10);
  });
}

// Is "90a" the only sm_90 entry? Only then is the code the runtime picks on an sm_90 device sure to
// hold the wgmma kernels: from a plain "90" (or "90f", or PTX of an older arch) they are empty.
inline bool arch_list_sm90_is_90a(const std::string& list) {
  const bool has_90a = arch_list_any(list, [](int sm, char s) { return sm == 90 && s == 'a'; });
  const bool other_90 = arch_list_any(list, [](int sm, char s) { return sm == 90 && s != 'a'; });
  return has_90a && !other_90;
}

}  // namespace jetspec
