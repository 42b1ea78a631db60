// specops._C_cudasim (test-only): csrc/cuda/*.cu compiled as host C++ against the SIMT emulation of
// cudasim.h, registered under specops_cudasim:: for CPU tensors, plus the emulator's controls.
#include <Python.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "../schemas.h"

TORCH_LIBRARY(specops_cudasim, m) { SPECOPS_DEFINE_SCHEMAS(m); }

namespace cudasim {
void set_schedule(const std::string& order, uint64_t seed);
void set_arch(int arch);
int arch();
std::map<std::string, uint64_t> stats();
void set_racecheck(bool on);
bool racecheck();
void set_cp_async(const std::string& landing);
void remove_barrier(const std::string& site);
std::vector<std::string> racechecked();
namespace selftest {
std::vector<int> run(const std::string& name, int arg);
}
}  // namespace cudasim

namespace {

// A c10::Error from the emulator becomes a Python RuntimeError.
template <class F>
PyObject* guarded(F&& f) {
  try {
    return f();
  } catch (const c10::Error& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what_without_backtrace());
    return nullptr;
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return nullptr;
  }
}

PyObject* py_set_schedule(PyObject*, PyObject* args) {
  const char* order = nullptr;
  unsigned long long seed = 0;
  if (!PyArg_ParseTuple(args, "s|K", &order, &seed)) return nullptr;
  return guarded([&] {
    cudasim::set_schedule(order, seed);
    Py_RETURN_NONE;
  });
}

PyObject* py_set_arch(PyObject*, PyObject* args) {
  int arch = 0;
  if (!PyArg_ParseTuple(args, "i", &arch)) return nullptr;
  return guarded([&] {
    cudasim::set_arch(arch);
    Py_RETURN_NONE;
  });
}

PyObject* py_arch(PyObject*, PyObject*) { return PyLong_FromLong(cudasim::arch()); }

PyObject* py_stats(PyObject*, PyObject*) {
  PyObject* d = PyDict_New();
  for (const auto& [k, v] : cudasim::stats()) {
    PyObject* x = PyLong_FromUnsignedLongLong(v);
    PyDict_SetItemString(d, k.c_str(), x);
    Py_DECREF(x);
  }
  return d;
}

PyObject* py_set_racecheck(PyObject*, PyObject* args) {
  int on = 0;
  if (!PyArg_ParseTuple(args, "p", &on)) return nullptr;
  return guarded([&] {
    cudasim::set_racecheck(on != 0);
    Py_RETURN_NONE;
  });
}

PyObject* py_racecheck(PyObject*, PyObject*) { return PyBool_FromLong(cudasim::racecheck()); }

PyObject* py_set_cp_async(PyObject*, PyObject* args) {
  const char* landing = nullptr;
  if (!PyArg_ParseTuple(args, "s", &landing)) return nullptr;
  return guarded([&] {
    cudasim::set_cp_async(landing);
    Py_RETURN_NONE;
  });
}

PyObject* py_remove_barrier(PyObject*, PyObject* args) {
  const char* site = nullptr;
  if (!PyArg_ParseTuple(args, "s", &site)) return nullptr;
  return guarded([&] {
    cudasim::remove_barrier(site);
    Py_RETURN_NONE;
  });
}

PyObject* py_racechecked(PyObject*, PyObject*) {
  const std::vector<std::string> names = cudasim::racechecked();
  PyObject* list = PyList_New(static_cast<Py_ssize_t>(names.size()));
  for (size_t i = 0; i < names.size(); ++i)
    PyList_SET_ITEM(list, static_cast<Py_ssize_t>(i), PyUnicode_FromString(names[i].c_str()));
  return list;
}

PyObject* py_selftest(PyObject*, PyObject* args) {
  const char* name = nullptr;
  int arg = 0;
  if (!PyArg_ParseTuple(args, "s|i", &name, &arg)) return nullptr;
  return guarded([&] {
    const std::vector<int> out = cudasim::selftest::run(name, arg);
    PyObject* list = PyList_New(static_cast<Py_ssize_t>(out.size()));
    for (size_t i = 0; i < out.size(); ++i) PyList_SET_ITEM(list, static_cast<Py_ssize_t>(i), PyLong_FromLong(out[i]));
    return list;
  });
}

}  // namespace

#define SPECOPS_MODULE_METHODS                                                                        \
  {"set_schedule", py_set_schedule, METH_VARARGS,                                                     \
   "set_schedule(order, seed=0): forward, reverse, shuffle (per pass), or warp_ahead (warp seed % warps first)."},   \
      {"set_arch", py_set_arch, METH_VARARGS, "set_arch(80 | 90): the device whose launch limits apply."}, \
      {"arch", py_arch, METH_NOARGS, "The emulated device's SM version."},                            \
      {"stats", py_stats, METH_NOARGS, "Counters: launches, blocks, threads, switches, barriers, collectives."}, \
      {"set_racecheck", py_set_racecheck, METH_VARARGS,                                                \
       "set_racecheck(on): record shared-memory accesses and fail a launch at the first hazard."},         \
      {"racecheck", py_racecheck, METH_NOARGS, "Whether racecheck is on."},                                 \
      {"set_cp_async", py_set_cp_async, METH_VARARGS,                                                       \
       "set_cp_async(late | early): cp.async lands at its wait (the latest) or at issue (the earliest)."},  \
      {"remove_barrier", py_remove_barrier, METH_VARARGS,                                                   \
       "remove_barrier('file.cu:line'): that __syncthreads does nothing ('' restores it; mutation runs)."}, \
      {"racechecked", py_racechecked, METH_NOARGS, "The kernels launched under racecheck so far, by name."}, \
      {"selftest", py_selftest, METH_VARARGS, "selftest(name, arg=0): runs one of the emulator's own test kernels."},
#define SPECOPS_MODULE _C_cudasim
#include "../module.h"
