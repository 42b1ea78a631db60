// Internals shared by the translation units of the cudasim runtime (cudasim.cpp: fibers, the block
// scheduler, launches; collectives.cpp: warp shuffles and votes; fiber_switch.cpp: the context
// switch). Not part of the CUDA surface that kernels see (that is cudasim.h).
#pragma once

#include <string>

#include "cudasim.h"

// cudasim_switch(save, load): pushes the callee-saved registers and the SSE/x87 control words,
// stores rsp in *save, loads rsp from load, pops and returns into the other fiber. A new fiber's
// stack is laid out so that the first switch "returns" into cudasim_trampoline with the Thread*
// in r12 and the entry function in r13.
extern "C" void cudasim_switch(void** save, void* load);
extern "C" void cudasim_trampoline();

namespace cudasim {
namespace detail {

std::string site(const char* file, int line);  // "verify.cu:40"
std::string block_name();                      // the running block: "kernel block (x, y, z)"
std::string block_state();                     // what its threads are doing, grouped by range
const char* op_name(Collective op);            // "__shfl_xor_sync", ...

}  // namespace detail
}  // namespace cudasim
