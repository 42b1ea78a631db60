// The Python module behind specops._C (CPU), specops._C_cuda (CUDA) and specops._C_cudasim (the
// test-only CUDA emulation); included by each extension's _module.cpp with SPECOPS_MODULE set.
#pragma once
//
// Importing it runs the static TORCH_LIBRARY registrations of the object files
// linked into it; the module itself only reports how it was built.
#include <Python.h>

#ifndef SPECOPS_MODULE
#error "SPECOPS_MODULE must name the extension (_C or _C_cuda)"
#endif
#ifndef SPECOPS_CUDA_ARCHS
#define SPECOPS_CUDA_ARCHS none
#endif

#define SPECOPS_STR2(x) #x
#define SPECOPS_STR(x) SPECOPS_STR2(x)
#define SPECOPS_CAT2(a, b) a##b
#define SPECOPS_CAT(a, b) SPECOPS_CAT2(a, b)

static PyObject* build_info(PyObject*, PyObject*) {
  return Py_BuildValue("{s:s,s:s}", "module", SPECOPS_STR(SPECOPS_MODULE), "cuda_archs",
                       SPECOPS_STR(SPECOPS_CUDA_ARCHS));
}

#ifndef SPECOPS_MODULE_METHODS
#define SPECOPS_MODULE_METHODS  // an extension's own entries, each followed by a comma
#endif

static PyMethodDef kMethods[] = {
    {"build_info", build_info, METH_NOARGS, "How this extension was compiled."},
    SPECOPS_MODULE_METHODS
    {nullptr, nullptr, 0, nullptr}};

static PyModuleDef kModule = {PyModuleDef_HEAD_INIT, SPECOPS_STR(SPECOPS_MODULE), nullptr, -1,
                              kMethods};

PyMODINIT_FUNC SPECOPS_CAT(PyInit_, SPECOPS_MODULE)(void) { return PyModule_Create(&kModule); }
