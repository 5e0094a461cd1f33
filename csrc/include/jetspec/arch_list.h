// JETSPEC_CUDA_ARCHS lists ("90a,80", CMake's CUDA_ARCHITECTURES syntax with commas): which devices
// the built code runs on, and whether the code an sm_90 device runs holds the Hopper-only (wgmma)
// kernels. Host-only and torch-free.
//
// An entry is a number, an optional arch-specific ('a') or family ('f') suffix, and an optional
// "-real" (SASS only) or "-virtual" (PTX only); a bare entry is both, as in CMake. SASS runs on
// its own major version with an equal or newer minor ('a': on that exact device only). PTX is
// compiled by the driver for any newer device ('a': that exact device; 'f': its family).
#pragma once
#include <cctype>
#include <string>

namespace jetspec {

struct ArchEntry {
  int sm = 0;       // e.g. 90, 100
  char suffix = 0;  // 'a', 'f' or 0
  bool sass = true;
  bool ptx = true;

  bool sass_runs_on(int dev) const {
    if (!sass) return false;
    if (suffix == 'a') return sm == dev;
    return sm / 10 == dev / 10 && sm % 10 <= dev % 10;
  }
  bool ptx_runs_on(int dev) const {
    if (!ptx) return false;
    if (suffix == 'a') return sm == dev;
    if (suffix == 'f') return sm / 10 == dev / 10 && sm % 10 <= dev % 10;
    return sm <= dev;
  }
};

// Parses one entry; false for anything that is not one (empty, "native", "all", a bad suffix).
inline bool parse_arch_entry(std::string a, ArchEntry* e) {
  *e = ArchEntry{};
  const auto ends_with = [&a](const std::string& tail) {
    return a.size() > tail.size() && a.compare(a.size() - tail.size(), tail.size(), tail) == 0;
  };
  if (ends_with("-real")) {
    e->ptx = false;
    a.resize(a.size() - 5);
  } else if (ends_with("-virtual")) {
    e->sass = false;
    a.resize(a.size() - 8);
  }
  if (!a.empty() && (a.back() == 'a' || a.back() == 'f')) {
    e->suffix = a.back();
    a.pop_back();
  }
  if (a.empty() || a.size() > 4) return false;
  for (char c : a) {
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
  }
  e->sm = std::stoi(a);
  return true;
}

// Calls f(entry) for each well-formed entry; stops and returns true when f does.
// Splits by hand: nvcc compiles this header too, and iostreams in nvcc-compiled host code crashed
// on the H200 machine's toolchain (docs/kernels.md, "Host code nvcc compiles").
template <typename F>
bool arch_list_any(const std::string& list, F f) {
  size_t start = 0;
  while (start <= list.size()) {
    size_t comma = list.find(',', start);
    if (comma == std::string::npos) comma = list.size();
    ArchEntry e;
    if (parse_arch_entry(list.substr(start, comma - start), &e) && f(e)) return true;
    start = comma + 1;
  }
  return false;
}

// Does code built for `list` run on compute capability sm (e.g. 90), as SASS or through PTX?
inline bool arch_list_supports(const std::string& list, int sm) {
  return arch_list_any(list, [sm](const ArchEntry& e) { return e.sass_runs_on(sm) || e.ptx_runs_on(sm); });
}

// Is the code an sm_90 device runs sure to hold the wgmma kernels? The runtime prefers SASS that
// runs there, else it compiles the newest PTX that does; only sm_90a code has the kernels (from a
// plain "90", "90f" or older PTX they are empty), so every such candidate must be 90a.
inline bool arch_list_sm90_is_90a(const std::string& list) {
  bool sass_any = false, sass_all_90a = true;
  int ptx_newest = 0;
  arch_list_any(list, [&](const ArchEntry& e) {
    if (e.sass_runs_on(90)) {
      sass_any = true;
      sass_all_90a = sass_all_90a && e.suffix == 'a';
    }
    if (e.ptx_runs_on(90) && e.sm > ptx_newest) ptx_newest = e.sm;
    return false;
  });
  if (sass_any) return sass_all_90a;
  return ptx_newest == 90 && !arch_list_any(list, [](const ArchEntry& e) {
    return e.ptx_runs_on(90) && e.sm == 90 && e.suffix != 'a';
  });
}

}  // namespace jetspec
