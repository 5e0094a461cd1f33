// The launchers' Python calling convention for _C (bindings.cpp): each launcher's Python signature
// is its params struct's field list (params.h), then `stream`, then the optional fields, parsed by
// define_launcher below and called through vectorcall. pybind11 only, torch-free; included by
// bindings.cpp alone. tests/test_cuda_launcher_args.py holds its behaviour and messages.
#pragma once

#include <pybind11/pybind11.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <functional>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "jetspec/api.h"

namespace jetspec {
namespace bind {

namespace py = pybind11;

inline std::string op_prefix(const char* op) {
  return std::string("jetspec_kernels._C.") + op + ": ";
}

// A launcher's failure as a Python exception naming the op: refused input is a ValueError (the
// launcher's message names the argument, its value and the limit), a request this device or
// build cannot run a RuntimeError saying why, a failed CUDA call a RuntimeError with the error.
inline void check(const jetspec::Status& st, const char* op) {
  if (st.ok()) return;
  if (st.kind == jetspec::Status::kBadInput) throw std::invalid_argument(op_prefix(op) + st.msg);
  if (st.kind == jetspec::Status::kUnsupported) throw std::runtime_error(op_prefix(op) + st.msg);
  throw std::runtime_error(jetspec::cat(op_prefix(op), st.msg, st.msg.empty() ? "" : ": ",
                                       "CUDA error ", static_cast<int>(st.err), " (",
                                       cudaGetErrorName(st.err), "): ", cudaGetErrorString(st.err)));
}

// ---- Launcher arguments ------------------------------------------------------------------------
// Each launcher's Python signature is its params struct's field list (params.h), then `stream`,
// then the optional fields: the C++ type of a field says how its Python value converts (Arg
// below). A missing, unknown, repeated or mistyped argument is a TypeError naming it; _C.FIELDS
// exports the signatures.

// "jetspec_kernels._C.<op>: argument '<name>' must be <type>, got <Python type>".
[[noreturn]] inline void wrong_type(const char* op, const char* name, const char* type,
                                    py::handle h) {
  throw py::type_error(op_prefix(op) + "argument '" + name + "' must be " + type + ", got " +
                       std::string(py::str(py::type::handle_of(h).attr("__name__"))));
}

inline bool is_integer(py::handle h) { return PyIndex_Check(h.ptr()) && !PyBool_Check(h.ptr()); }

inline long long integer(py::handle h, const char* op, const char* name, const char* type) {
  if (!is_integer(h)) wrong_type(op, name, type, h);
  py::int_ i = py::reinterpret_steal<py::int_>(PyNumber_Index(h.ptr()));
  if (!i) throw py::error_already_set();  // its __index__ raised: that error, as it is
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(i.ptr(), &overflow);
  if (overflow) throw py::value_error(op_prefix(op) + "argument '" + name + "' does not fit int64");
  return v;
}

// Arg<T>: the Python type name of a field of C++ type T, and the conversion (raising for the
// wrong type). Only the types below may appear in a field list.
template <typename T>
struct Arg;

template <typename T>
struct Arg<T*> {  // a device pointer (or stream handle): an int, 0 = absent
  static constexpr const char* type = "int (device pointer, 0 = absent)";
  static T* get(py::handle h, const char* op, const char* name) {
    const long long v = integer(h, op, name, "int (device pointer)");
    if (v < 0) throw py::value_error(op_prefix(op) + "argument '" + name + "' is negative");
    return reinterpret_cast<T*>(static_cast<std::uintptr_t>(v));
  }
};
template <>
struct Arg<int> {
  static constexpr const char* type = "int";
  static int get(py::handle h, const char* op, const char* name) {
    const long long v = integer(h, op, name, type);
    if (v < INT32_MIN || v > INT32_MAX)
      throw py::value_error(op_prefix(op) + "argument '" + name + "' = " + std::to_string(v) +
                            " does not fit int32");
    return static_cast<int>(v);
  }
};
template <>
struct Arg<int64_t> {
  static constexpr const char* type = "int";
  static int64_t get(py::handle h, const char* op, const char* name) {
    return integer(h, op, name, type);
  }
};
template <>
struct Arg<double> {
  static constexpr const char* type = "float";
  static double get(py::handle h, const char* op, const char* name) {
    if (!PyFloat_Check(h.ptr()) && !is_integer(h)) wrong_type(op, name, type, h);
    const double v = PyFloat_AsDouble(h.ptr());
    if (v == -1.0 && PyErr_Occurred()) {
      if (!PyErr_ExceptionMatches(PyExc_OverflowError)) throw py::error_already_set();
      PyErr_Clear();  // an int past float64's range
      throw py::value_error(op_prefix(op) + "argument '" + name + "' does not fit float64");
    }
    return v;
  }
};
template <>
struct Arg<float> {
  static constexpr const char* type = "float";
  static float get(py::handle h, const char* op, const char* name) {
    return static_cast<float>(Arg<double>::get(h, op, name));
  }
};
template <>
struct Arg<jetspec::Flag> {
  static constexpr const char* type = "bool";
  static jetspec::Flag get(py::handle h, const char* op, const char* name) {
    if (!PyBool_Check(h.ptr())) wrong_type(op, name, type, h);
    return h.ptr() == Py_True ? jetspec::kTrue : jetspec::kFalse;
  }
};
template <>
struct Arg<jetspec::Strides4> {  // strides of dims 0..2 of a 4-d tensor (dim 3 is contiguous)
  static constexpr const char* type = "list[int] (strides of dims 0..2)";
  static jetspec::Strides4 get(py::handle h, const char* op, const char* name) {
    if (!PyList_Check(h.ptr()) && !PyTuple_Check(h.ptr())) wrong_type(op, name, type, h);
    const py::sequence s = py::reinterpret_borrow<py::sequence>(h);
    if (s.size() < 3) {
      throw std::invalid_argument(op_prefix(op) + name + " needs 3 strides, got " +
                                  std::to_string(s.size()));
    }
    const std::string each = std::string(name) + "[i]";
    return jetspec::Strides4{integer(s[0], op, each.c_str(), "int"),
                             integer(s[1], op, each.c_str(), "int"),
                             integer(s[2], op, each.c_str(), "int")};
  }
};

// What a call fills: the launcher's params struct and the stream.
template <typename Params>
struct Call {
  Params p{};
  cudaStream_t stream = nullptr;
};

template <typename Params>
struct Field {
  const char* name;
  const char* type;  // the Python type, for messages and _C.FIELDS
  void (*store)(Call<Params>&, py::handle, const char* op);
};

// The Field of a params.h list entry X(T, name) (a generic lambda: it converts to any Call).
#define JETSPEC_BIND_FIELD(T, name)                                         \
  {#name, ::jetspec::bind::Arg<T>::type,                                    \
   [](auto& c, ::pybind11::handle h, const char* op) {                      \
     c.p.name = ::jetspec::bind::Arg<T>::get(h, op, #name);                 \
   }},

// A module function called through vectorcall (METH_FASTCALL | METH_KEYWORDS): no argument tuple,
// keyword dict or pybind11 dispatch per call (with them, parsing tree_attention's 33
// keyword arguments cost more than the rest of its host path; docs/perf/decode_round.md, "Host time").
using FastCall = std::function<void(PyObject* const*, size_t, PyObject*)>;

inline PyObject* fastcall_entry(PyObject* self, PyObject* const* args, Py_ssize_t nargs,
                         PyObject* kwnames) {
  // (The capsule's name is whatever this pybind11 version gives py::capsule: ask for it.)
  const auto* fn = static_cast<const FastCall*>(PyCapsule_GetPointer(self, PyCapsule_GetName(self)));
  if (fn == nullptr) return nullptr;
  try {
    (*fn)(args, static_cast<size_t>(nargs), kwnames);
    Py_RETURN_NONE;
  } catch (py::error_already_set& e) {  // what pybind11's dispatcher would raise, the same way
    e.restore();
  } catch (const py::builtin_exception& e) {
    e.set_error();
  } catch (const std::bad_alloc&) {
    PyErr_NoMemory();
  } catch (const std::out_of_range& e) {  // pybind11's mapping of the standard exceptions
    PyErr_SetString(PyExc_IndexError, e.what());
  } catch (const std::overflow_error& e) {
    PyErr_SetString(PyExc_OverflowError, e.what());
  } catch (const std::logic_error& e) {  // invalid_argument, length_error, domain_error
    PyErr_SetString(PyExc_ValueError, e.what());
  } catch (const std::range_error& e) {
    PyErr_SetString(PyExc_ValueError, e.what());
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  } catch (...) {
    PyErr_SetString(PyExc_RuntimeError, "unknown C++ exception");
  }
  return nullptr;
}

inline void def_fastcall(py::module_& m, const char* name, const std::string& doc, FastCall fn) {
  // The method table entry and its doc must outlive the function: kept for the process's life,
  // like the module.
  char* doc_copy = new char[doc.size() + 1];
  std::copy(doc.c_str(), doc.c_str() + doc.size() + 1, doc_copy);
  auto* def = new PyMethodDef{name, reinterpret_cast<PyCFunction>(
                                        reinterpret_cast<void (*)()>(fastcall_entry)),
                              METH_FASTCALL | METH_KEYWORDS, doc_copy};
  py::capsule self(new FastCall(std::move(fn)), [](void* p) { delete static_cast<FastCall*>(p); });
  PyObject* f = PyCFunction_NewEx(def, self.ptr(), m.attr("__name__").ptr());
  if (f == nullptr) throw py::error_already_set();
  m.attr(name) = py::reinterpret_steal<py::object>(f);
}

// _C.<op>(...): the fields in order, then stream, then the optional fields (these may be left
// out and stay 0 / null). Also its row of _C.FIELDS: ((name, Python type, optional), ...).
template <typename Params>
void define_launcher(py::module_& m, py::dict& table, const char* op,
                     const std::vector<Field<Params>>& fields,
                     jetspec::Status (*launch)(const Params&, cudaStream_t), const char* doc,
                     const std::vector<std::string>& optional = {}) {
  auto is_optional = [&](const char* name) {
    return std::find(optional.begin(), optional.end(), name) != optional.end();
  };
  std::vector<Field<Params>> sig;
  for (const Field<Params>& f : fields)
    if (!is_optional(f.name)) sig.push_back(f);
  const size_t required = sig.size() + 1;
  sig.push_back({"stream", Arg<cudaStream_t>::type, [](Call<Params>& c, py::handle h, const char* op) {
                   c.stream = Arg<cudaStream_t>::get(h, op, "stream");
                 }});
  for (const Field<Params>& f : fields)
    if (is_optional(f.name)) sig.push_back(f);

  if (sig.size() > 64) throw std::logic_error(op_prefix(op) + "more than 64 fields");
  // The names as interned Python strings (kept for the module's life): a keyword at a call site
  // is the same interned object, so a lookup is mostly one pointer compare.
  std::vector<PyObject*> names;
  for (const Field<Params>& f : sig) {
    names.push_back(PyUnicode_InternFromString(f.name));
    if (names.back() == nullptr) throw py::error_already_set();
  }

  // args[0, nargs) positional, then one value per name in kwnames (a tuple, or null).
  auto call = [op, sig, names, required, launch](PyObject* const* args, size_t nargs,
                                                 PyObject* kwnames) {
    const size_t n = sig.size();
    if (nargs > n) {
      throw py::type_error(op_prefix(op) + "takes " + std::to_string(n) + " arguments, got " +
                           std::to_string(nargs) + " positional");
    }
    Call<Params> c;
    uint64_t seen = 0;
    for (size_t i = 0; i < nargs; ++i) {
      sig[i].store(c, args[i], op);
      seen |= uint64_t{1} << i;
    }
    const size_t nkw = kwnames ? static_cast<size_t>(PyTuple_GET_SIZE(kwnames)) : 0;
    size_t next = nargs;  // call sites mostly pass the fields in order: look there first
    for (size_t k = 0; k < nkw; ++k) {
      PyObject* key = PyTuple_GET_ITEM(kwnames, k);
      size_t i = next < n && names[next] == key ? next : 0;
      while (i < n && names[i] != key) ++i;
      if (i == n && PyUnicode_Check(key)) {  // not the interned object: compare the text
        i = 0;
        while (i < n && PyUnicode_Compare(names[i], key) != 0) ++i;
      }
      if (i == n) {
        throw py::type_error(op_prefix(op) + "unexpected argument '" +
                             std::string(py::str(key)) + "'");
      }
      if (seen >> i & 1) {
        throw py::type_error(op_prefix(op) + "got multiple values for argument '" + sig[i].name +
                             "'");
      }
      sig[i].store(c, args[nargs + k], op);
      seen |= uint64_t{1} << i;
      next = i + 1;
    }
    for (size_t i = 0; i < required; ++i) {
      if (!(seen >> i & 1))
        throw py::type_error(op_prefix(op) + "missing argument '" + sig[i].name + "'");
    }
    check(launch(c.p, c.stream), op);
  };

  // "op(name: type, ...) -> None" and the doc; the pybind signature itself is (*args, **kwargs).
  std::string full_doc = std::string(op) + "(";
  py::list rows;
  for (size_t i = 0; i < sig.size(); ++i) {
    const bool opt = i >= required;
    full_doc += std::string(i ? ", " : "") + sig[i].name + ": " + sig[i].type + (opt ? " = 0" : "");
    rows.append(py::make_tuple(sig[i].name, sig[i].type, opt));
  }
  full_doc += ") -> None\n\n" + std::string(doc);
  def_fastcall(m, op, full_doc, call);
  table[op] = py::tuple(rows);
}

}  // namespace bind
}  // namespace jetspec
