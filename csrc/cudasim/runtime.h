// Internals shared by the translation units of the cudasim runtime (cudasim.cpp: fibers, the block
// scheduler, launches; collectives.cpp: warp shuffles and votes; fiber_switch.cpp: the context
// switch). Not part of the CUDA surface that kernels see (that is cudasim.h).
#pragma once

#include <string>
#include <vector>

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

// Racecheck's side of the runtime (racecheck.cpp).
namespace rc {
void set_enabled(bool on);
bool enabled();
void launch_begin(const void* kernel, unsigned char* dyn, size_t dyn_bytes);  // per launch
void launch_end();
bool active();  // the running launch checks
void block_begin(int threads);
void barrier();              // a __syncthreads released: a new interval
void warp_synced(int warp);  // the warp's lanes met at a collective
uint64_t site(const char* file, int line);
void note(const void* p, int bytes, int kind, int tid, uint64_t site);  // on a thread's behalf (rc_note's kinds)
bool found();                // a hazard is pending: report() says which
std::string report();
std::vector<std::string> checked_kernels();  // the functions launched under racecheck, by name
void resume_kernel();  // kernel code runs from here on
}  // namespace rc

// Runtime code reached from a kernel (barriers, collectives, cp.async) is not kernel code: its
// accesses are not recorded. Restores the kernel's tracking on the way out.
struct RuntimeScope {
  bool saved = rc_track;
  RuntimeScope() { rc_track = false; }
  ~RuntimeScope() { rc_track = saved && !rc::found(); }
};

}  // namespace detail
}  // namespace cudasim
