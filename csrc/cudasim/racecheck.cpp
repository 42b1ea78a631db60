// Racecheck: shared-memory hazards between the threads of a block (docs/cudasim.md).
//
// How accesses are seen: the emulator build compiles the kernel code (csrc/cuda/*.cu, selftest.cpp)
// with GCC's ThreadSanitizer instrumentation (-fsanitize=thread, setup.py) but does not link its
// runtime; the __tsan_* entry points the compiler calls before each load and store are defined here.
// The runtime (this file included) is compiled without it, so it pays nothing; SPECOPS_RACECHECK
// says the kernels have it. With racecheck off the entry points return at once. With it on, an
// access by an emulated thread to shared memory is recorded in shadow state: the running launch's
// dynamic shared memory, or the module's writable static storage, where every `__shared__` variable
// lives (function statics, cudasim.h). Accesses from the runtime itself (barriers, collectives, the
// warp exchange that reads ldmatrix rows) are not recorded: it is not instrumented, and rc_track is
// false there (inline code that the linker may share with the kernels' instrumented copies).
// ldmatrix rows, cp.async destinations and atomics are recorded explicitly at their call sites (an
// atomic races with plain accesses, not with other atomics).
//
// Shadow state, per byte: the last write and up to two reads since the block's last barrier, each
// as (barrier epoch, thread, the warp's __syncwarp count, call site). A read of a byte another thread
// wrote, or a write of a byte another thread read or wrote, in the same epoch is a hazard (RAW, WAR,
// WAW), unless both threads are lanes of one warp that met at a warp collective since (__syncwarp,
// a shuffle, a vote, ldmatrix, mma). Epochs grow across blocks and launches, so stale entries need no
// clearing.
#include "cudasim.h"
#include "runtime.h"

#include <c10/util/Exception.h>
#include <dlfcn.h>
#include <link.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#define RC_NO_TSAN __attribute__((no_sanitize("thread"), noinline))

namespace cudasim {
namespace detail {

bool rc_track = false;

namespace rc {
namespace {

struct Access {
  uint32_t epoch;  // 0: never
  uint16_t tid;    // | kAtomic for an atomic read-modify-write
  uint16_t wsync;  // how many collectives the thread's warp had completed at the access
  uint64_t site;   // a return address, or kExplicit | index into g.sites
};
struct Cell {
  Access w, r1, r2;
};
constexpr uint64_t kExplicit = 1ull << 63;
constexpr uint16_t kAtomic = 0x8000;  // threads are < 1024
enum Op { kRead = 0, kWrite = 1, kAtomicOp = 2 };

struct Region {
  uintptr_t lo = 0;
  size_t len = 0;
  Cell* shadow = nullptr;
  size_t cap = 0;  // cells mapped

  // Lazily committed shadow (untouched pages cost nothing), kept across launches.
  void reserve(size_t n) {
    if (n <= cap) return;
    if (shadow) munmap(shadow, cap * sizeof(Cell));
    void* p = mmap(nullptr, n * sizeof(Cell), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    TORCH_CHECK(p != MAP_FAILED, "cudasim racecheck: cannot map ", n * sizeof(Cell), " B of shadow state");
    shadow = static_cast<Cell*>(p);
    cap = n;
  }
};

enum class Kind { kRAW, kWAR, kWAW };

struct Hazard {
  Kind kind;
  bool dynamic;
  size_t offset;     // in the region
  uintptr_t addr;
  int tid, prev_tid;
  bool atomic, prev_atomic;
  uint64_t site, prev_site;
};

struct State {
  bool enabled = false;  // set_racecheck / SPECOPS_CUDASIM_RACECHECK
  bool active = false;   // the running launch checks
  uint32_t epoch = 0;
  Region dyn, stat;
  std::vector<uint16_t> wsync_buf;  // per warp of the running block
  uint16_t* wsync = nullptr;
  std::vector<std::pair<const char*, int>> sites;
  std::map<std::pair<const char*, int>, uint64_t> site_index;
  bool found = false;
  Hazard hazard{};
  const void* kernel = nullptr;
  std::set<const void*> checked;  // the kernels launched under racecheck
} g;

// The module's writable PT_LOAD segments (.data, .bss: every __shared__ variable), as one range.
struct Span {
  uintptr_t self, lo, hi;
};

int find_segments(dl_phdr_info* info, size_t, void* data) {
  auto* s = static_cast<Span*>(data);
  uintptr_t lo = ~uintptr_t{0}, hi = 0;
  bool mine = false;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_LOAD) continue;
    const uintptr_t a = info->dlpi_addr + ph.p_vaddr, b = a + ph.p_memsz;
    if (s->self >= a && s->self < b) mine = true;
    if (ph.p_flags & PF_W) {
      lo = std::min(lo, a);
      hi = std::max(hi, b);
    }
  }
  if (!mine || hi == 0) return 0;
  s->lo = lo;
  s->hi = hi;
  return 1;
}

// Whether access `a` races with one by thread `tid` now (atomic: an atomic one).
__attribute__((no_sanitize("thread"))) inline bool conflicts(const Access& a, int tid, bool atomic) {
  const int other = a.tid & ~kAtomic;
  if (a.epoch != g.epoch || other == tid || (atomic && (a.tid & kAtomic))) return false;
  const int w = other / 32;
  return !(w == tid / 32 && a.wsync != g.wsync[w]);  // lanes that met at a collective since are ordered
}

RC_NO_TSAN void flag(Kind kind, bool dynamic, size_t off, uintptr_t addr, int tid, bool atomic, uint64_t site,
                     const Access& prev) {
  if (g.found) return;
  g.found = true;
  g.hazard = {kind, dynamic, off, addr, tid, prev.tid & ~kAtomic, atomic, (prev.tid & kAtomic) != 0, site, prev.site};
}

RC_NO_TSAN void record(uintptr_t a, size_t bytes, int op, int tid, uint64_t site) {
  if (a == reinterpret_cast<uintptr_t>(&rc_track)) return;  // the runtime's own switch
  Region* r = &g.dyn;
  size_t off = a - r->lo;
  if (off >= r->len) {
    r = &g.stat;
    off = a - r->lo;
    if (off >= r->len) return;
  }
  const bool track = rc_track;
  rc_track = false;  // what follows touches static state of its own
  const bool atomic = op == kAtomicOp, dyn = r == &g.dyn;
  const Access me{g.epoch, static_cast<uint16_t>(tid | (atomic ? kAtomic : 0)), g.wsync[tid / 32], site};
  const size_t end = std::min(off + bytes, r->len);
  for (size_t o = off; o < end && !g.found; ++o) {
    Cell& c = r->shadow[o];
    const uintptr_t at = a + (o - off);
    if (op != kRead) {
      if (conflicts(c.w, tid, atomic)) flag(Kind::kWAW, dyn, o, at, tid, atomic, site, c.w);
      else if (conflicts(c.r1, tid, false)) flag(Kind::kWAR, dyn, o, at, tid, atomic, site, c.r1);
      else if (conflicts(c.r2, tid, false)) flag(Kind::kWAR, dyn, o, at, tid, atomic, site, c.r2);
      // An atomic after the thread's own plain write keeps that write: other threads' atomics race with it.
      if (!(atomic && c.w.epoch == g.epoch && !(c.w.tid & kAtomic))) c.w = me;
      c.r1.epoch = c.r2.epoch = 0;
    } else {
      if (conflicts(c.w, tid, false)) flag(Kind::kRAW, dyn, o, at, tid, false, site, c.w);
      if (c.r1.epoch != g.epoch || c.r1.tid == tid) c.r1 = me;
      else if (c.r2.epoch != g.epoch || c.r2.tid == tid) c.r2 = me;
    }
  }
  rc_track = track && !g.found;
}

__attribute__((no_sanitize("thread"))) inline void hook(const void* p, size_t bytes, bool write, void* pc) {
  if (!rc_track) return;
  record(reinterpret_cast<uintptr_t>(p), bytes, write ? kWrite : kRead, current->linear, reinterpret_cast<uint64_t>(pc));
}

// ---- the report ----

// Drops a trailing bracketed group, "(...)" or "<...>", nested ones included.
void drop_trailing(std::string& s, char open, char close) {
  if (s.empty() || s.back() != close) return;
  int depth = 0;
  for (size_t i = s.size(); i-- > 0;) {
    if (s[i] == close) ++depth;
    else if (s[i] == open && --depth == 0) {
      s.erase(i);
      return;
    }
  }
}

// "void (anonymous namespace)::f<int, 4>(Args)" -> "f"
std::string base_name(std::string fn) {
  drop_trailing(fn, '(', ')');
  drop_trailing(fn, '<', '>');
  if (const auto colons = fn.rfind("::"); colons != std::string::npos) fn = fn.substr(colons + 2);
  if (const auto sp = fn.rfind(' '); sp != std::string::npos) fn = fn.substr(sp + 1);
  return fn;
}

std::string run(const std::string& cmd) {
  std::string out;
  if (FILE* f = popen(cmd.c_str(), "r")) {
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
    pclose(f);
  }
  return out;
}

std::string hex(uintptr_t v) {
  std::ostringstream s;
  s << "0x" << std::hex << v;
  return s.str();
}

// The function (its base name, "" if unknown) and "file:line" of a code address, by addr2line over
// the module's debug information; the innermost of inlined calls.
std::pair<std::string, std::string> symbolize(uintptr_t pc) {
  Dl_info info{};
  if (!dladdr(reinterpret_cast<void*>(pc), &info) || !info.dli_fname) return {"", hex(pc)};
  const std::string so = info.dli_fname;
  const uintptr_t off = pc - reinterpret_cast<uintptr_t>(info.dli_fbase);
  std::istringstream lines(run("addr2line -C -f -i -e '" + so + "' " + hex(off) + " 2>/dev/null"));
  std::string fn, loc;
  if (!std::getline(lines, fn) || !std::getline(lines, loc) || loc.rfind("??", 0) == 0)
    return {"", so.substr(so.rfind('/') + 1) + "+" + hex(off)};
  loc = loc.substr(0, loc.find(' '));  // drop " (discriminator n)"
  loc = loc.substr(loc.rfind('/') + 1);
  return {base_name(fn), loc};
}

// "verify.cu:38 (block_sum)" for a recorded access.
std::string describe_site(uint64_t site) {
  if (site & kExplicit) {
    const auto& [file, line] = g.sites[site & ~kExplicit];
    return detail::site(file, line);
  }
  const auto [fn, loc] = symbolize(site - 1);  // a return address: inside the call instruction
  return fn.empty() ? loc : loc + " (" + fn + ")";
}

// "static __shared__ sh (in verify_tree_kernel) + 24", by the module's symbol table.
std::string describe_static(uintptr_t addr) {
  Dl_info info{};
  if (!dladdr(reinterpret_cast<void*>(&rc_track), &info) || !info.dli_fname) return "static shared memory";
  const uintptr_t off = addr - reinterpret_cast<uintptr_t>(info.dli_fbase);
  std::istringstream lines(run("nm -C -S --defined-only '" + std::string(info.dli_fname) + "' 2>/dev/null"));
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream f(line);
    std::string a, n, type;
    if (!(f >> a >> n >> type)) continue;
    const uintptr_t start = std::stoull(a, nullptr, 16), size = std::stoull(n, nullptr, 16);
    if (off < start || off >= start + size) continue;
    std::string name;
    std::getline(f >> std::ws, name);
    const auto colons = name.rfind("::");
    const std::string var = colons == std::string::npos ? name : name.substr(colons + 2);
    const std::string fn = colons == std::string::npos ? "" : base_name(name.substr(0, colons));
    return "static __shared__ " + var + (fn.empty() ? "" : " (in " + fn + ")") + " + " + std::to_string(off - start);
  }
  return "static shared memory at module offset " + hex(off);
}

std::string thread_name(int tid) {
  std::ostringstream s;
  s << "thread " << tid << " (warp " << tid / 32 << ", lane " << tid % 32 << ")";
  return s.str();
}

}  // namespace

void set_enabled(bool on) {
#if !defined(SPECOPS_RACECHECK)
  TORCH_CHECK(!on, "cudasim: racecheck needs the build with its instrumentation (setup.py's; SPECOPS_SANITIZE=1 "
              "and CMake builds leave it out)");
#endif
  g.enabled = on;
}
bool enabled() { return g.enabled; }

void launch_begin(const void* kernel, unsigned char* dyn, size_t dyn_bytes) {
  g.active = g.enabled;
  g.found = false;
  if (!g.active) return;
  g.kernel = kernel;
  g.checked.insert(kernel);
  g.dyn.lo = reinterpret_cast<uintptr_t>(dyn);
  g.dyn.len = dyn ? dyn_bytes : 0;
  g.dyn.reserve(g.dyn.len);
  if (!g.stat.len) {
    Span s{reinterpret_cast<uintptr_t>(&rc_track), 0, 0};
    dl_iterate_phdr(find_segments, &s);
    TORCH_CHECK(s.hi > s.lo, "cudasim racecheck: cannot find the module's static storage");
    g.stat.reserve(s.hi - s.lo);
    g.stat.lo = s.lo;
    g.stat.len = s.hi - s.lo;
  }
}

void launch_end() {
  g.active = false;
  rc_track = false;
}

bool active() { return g.active; }

void block_begin(int threads) {
  if (!g.active) return;
  ++g.epoch;
  g.wsync_buf.assign((threads + 31) / 32, 0);
  g.wsync = g.wsync_buf.data();
}

void barrier() { ++g.epoch; }

void warp_synced(int warp) {
  if (g.active) ++g.wsync[warp];
}

uint64_t site(const char* file, int line) {
  auto [it, fresh] = g.site_index.emplace(std::make_pair(file, line), g.sites.size());
  if (fresh) g.sites.emplace_back(file, line);
  return kExplicit | it->second;
}

void note(const void* p, int bytes, int op, int tid, uint64_t site_id) {
  if (g.active && !g.found) record(reinterpret_cast<uintptr_t>(p), static_cast<size_t>(bytes), op, tid, site_id);
}

bool found() { return g.found; }

std::vector<std::string> checked_kernels() {
  std::set<std::string> names;
  for (const void* fn : g.checked) names.insert(symbolize(reinterpret_cast<uintptr_t>(fn)).first);
  return {names.begin(), names.end()};
}

// Kernel code runs from here on (entering the kernel, or returning to it from the runtime).
void resume_kernel() { rc_track = g.active && !g.found; }

std::string report() {
  const Hazard& h = g.hazard;
  static const char* kNames[] = {"read-after-write (RAW)", "write-after-read (WAR)", "write-after-write (WAW)"};
  const std::string now = h.kind == Kind::kRAW ? "read" : h.atomic ? "wrote (atomically)" : "wrote";
  const std::string before = h.kind == Kind::kWAR ? "read" : h.prev_atomic ? "wrote (atomically)" : "wrote";
  std::ostringstream s;
  const std::string kernel = symbolize(reinterpret_cast<uintptr_t>(g.kernel)).first;
  const std::string block = block_name();
  s << "cudasim racecheck: " << kNames[static_cast<int>(h.kind)] << " hazard in " << block
    << (kernel.empty() || block.rfind(kernel, 0) == 0 ? "" : " [" + kernel + "]") << " on "
    << (h.dynamic ? "extern __shared__ + " + std::to_string(h.offset) : describe_static(h.addr)) << ": "
    << thread_name(h.tid) << " " << now << " it at " << describe_site(h.site) << " after " << thread_name(h.prev_tid)
    << " " << before << " it at " << describe_site(h.prev_site) << ", with no __syncthreads between";
  return s.str();
}

}  // namespace rc

void rc_note(const void* p, int bytes, int kind, const char* file, int line) {
  if (!rc_track) return;
  const RuntimeScope runtime;  // the site table is the runtime's
  rc::note(p, bytes, kind, current->linear, rc::site(file, line));
}

}  // namespace detail
}  // namespace cudasim

// ---- the ThreadSanitizer entry points GCC's instrumentation calls ----------------------------------

using cudasim::detail::rc::hook;
#define RC_HOOK extern "C" __attribute__((visibility("hidden"), no_sanitize("thread")))
#define RC_PC __builtin_return_address(0)

RC_HOOK void __tsan_init() {}
RC_HOOK void __tsan_func_entry(void*) {}
RC_HOOK void __tsan_func_exit() {}
RC_HOOK void __tsan_vptr_update(void**, void*) {}
RC_HOOK void __tsan_vptr_read(void**) {}
RC_HOOK void __tsan_read_range(void* p, unsigned long n) { hook(p, n, false, RC_PC); }
RC_HOOK void __tsan_write_range(void* p, unsigned long n) { hook(p, n, true, RC_PC); }

#define RC_RW(N)                                                                              \
  RC_HOOK void __tsan_read##N(void* p) { hook(p, N, false, RC_PC); }                          \
  RC_HOOK void __tsan_write##N(void* p) { hook(p, N, true, RC_PC); }                          \
  RC_HOOK void __tsan_unaligned_read##N(void* p) { hook(p, N, false, RC_PC); }                \
  RC_HOOK void __tsan_unaligned_write##N(void* p) { hook(p, N, true, RC_PC); }                \
  RC_HOOK void __tsan_volatile_read##N(void* p) { hook(p, N, false, RC_PC); }                 \
  RC_HOOK void __tsan_volatile_write##N(void* p) { hook(p, N, true, RC_PC); }                 \
  RC_HOOK void __tsan_unaligned_volatile_read##N(void* p) { hook(p, N, false, RC_PC); }       \
  RC_HOOK void __tsan_unaligned_volatile_write##N(void* p) { hook(p, N, true, RC_PC); }
RC_RW(1)
RC_RW(2)
RC_RW(4)
RC_RW(8)
RC_RW(16)

// Atomics in the instrumented code (host code: reference counts and the like), done for real and
// always sequentially consistent (stronger than asked, which is allowed). Not recorded.
#define RC_ATOMIC(N, T)                                                                                   \
  RC_HOOK T __tsan_atomic##N##_load(const volatile T* a, int) { return __atomic_load_n(a, __ATOMIC_SEQ_CST); } \
  RC_HOOK void __tsan_atomic##N##_store(volatile T* a, T v, int) { __atomic_store_n(a, v, __ATOMIC_SEQ_CST); } \
  RC_HOOK T __tsan_atomic##N##_exchange(volatile T* a, T v, int) { return __atomic_exchange_n(a, v, __ATOMIC_SEQ_CST); } \
  RC_HOOK T __tsan_atomic##N##_fetch_add(volatile T* a, T v, int) { return __atomic_fetch_add(a, v, __ATOMIC_SEQ_CST); } \
  RC_HOOK T __tsan_atomic##N##_fetch_sub(volatile T* a, T v, int) { return __atomic_fetch_sub(a, v, __ATOMIC_SEQ_CST); } \
  RC_HOOK T __tsan_atomic##N##_fetch_and(volatile T* a, T v, int) { return __atomic_fetch_and(a, v, __ATOMIC_SEQ_CST); } \
  RC_HOOK T __tsan_atomic##N##_fetch_or(volatile T* a, T v, int) { return __atomic_fetch_or(a, v, __ATOMIC_SEQ_CST); }   \
  RC_HOOK T __tsan_atomic##N##_fetch_xor(volatile T* a, T v, int) { return __atomic_fetch_xor(a, v, __ATOMIC_SEQ_CST); } \
  RC_HOOK T __tsan_atomic##N##_fetch_nand(volatile T* a, T v, int) { return __atomic_fetch_nand(a, v, __ATOMIC_SEQ_CST); } \
  RC_HOOK int __tsan_atomic##N##_compare_exchange_strong(volatile T* a, T* c, T v, int, int) {          \
    return __atomic_compare_exchange_n(a, c, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);               \
  }                                                                                                      \
  RC_HOOK int __tsan_atomic##N##_compare_exchange_weak(volatile T* a, T* c, T v, int, int) {            \
    return __atomic_compare_exchange_n(a, c, v, true, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);                \
  }                                                                                                      \
  RC_HOOK T __tsan_atomic##N##_compare_exchange_val(volatile T* a, T c, T v, int, int) {                \
    __atomic_compare_exchange_n(a, &c, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);                     \
    return c;                                                                                            \
  }
RC_ATOMIC(8, uint8_t)
RC_ATOMIC(16, uint16_t)
RC_ATOMIC(32, uint32_t)
RC_ATOMIC(64, uint64_t)

RC_HOOK void __tsan_atomic_thread_fence(int) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
RC_HOOK void __tsan_atomic_signal_fence(int) { __atomic_signal_fence(__ATOMIC_SEQ_CST); }
