// specops._C: the CPU kernels, and the schemas of every op (csrc/schemas.h).
#include <Python.h>
#include <torch/library.h>

#include "../schemas.h"

TORCH_LIBRARY(specops, m) { SPECOPS_DEFINE_SCHEMAS(m); }

PyObject* specops_linear_py(PyObject*, PyObject* const* args, Py_ssize_t nargs);  // linear.cpp
PyObject* specops_linear_isa_py(PyObject*, PyObject*);                             // linear.cpp

#define SPECOPS_MODULE_METHODS                                                                        \
  {"linear", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(specops_linear_py)), METH_FASTCALL, \
   "linear(x [M, K], weight [N, K], bias [N] or None, packed=None): specops::linear (linear_packed with " \
   "packed) on the CPU without the dispatcher."},                                                      \
  {"linear_isa", specops_linear_isa_py, METH_NOARGS,                                                   \
   "linear_isa(): the kernel a bf16 specops::linear call runs here: amx, avx512, avx2 or generic."},
#define SPECOPS_MODULE _C
#include "../module.h"
