// The cudasim runtime: fibers, the per-block scheduler, counted barriers, the warp rendezvous
// (warp_exchange; the shuffles and votes on it are in collectives.cpp), cp.async and the
// launch-limit checks of csrc/cudasim/cudasim.h. One launch runs at a time (a global mutex): the
// emulated __shared__ variables are function statics shared by the running block's fibers.
#include "cudasim.h"
#include "runtime.h"

#include <c10/util/Exception.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <exception>
#include <map>
#include <mutex>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#define CUDASIM_ASAN 1
#else
#define CUDASIM_ASAN 0
#endif

// ---- runtime API -----------------------------------------------------------------------------------

namespace cudasim {

void read_environment();  // SPECOPS_CUDASIM_* (below)
namespace {

struct Device {
  int arch;        // 80 or 90
  int sms;         // multiprocessors
  int smem_optin;  // max dynamic + static shared memory per block after cudaFuncSetAttribute
};
constexpr int kDefaultSmem = 48 * 1024;  // without cudaFuncSetAttribute
constexpr int kMaxThreads = 1024;
constexpr unsigned kMaxGridYZ = 65535;
const Device kH100{90, 132, 227 * 1024};  // sm_90
const Device kA100{80, 108, 163 * 1024};  // sm_80

Device g_device = kH100;
std::mutex g_mutex;                         // one launch (or attribute change) at a time
std::map<const void*, int> g_max_dyn_smem;  // cudaFuncAttributeMaxDynamicSharedMemorySize per kernel

enum class Order { kForward, kReverse, kShuffle, kWarpAhead };
Order g_order = Order::kForward;
uint64_t g_seed = 0;
bool g_cp_async_early = false;  // cp.async lands at issue, not at the wait
std::string g_removed_barrier;  // "file:line" of a __syncthreads that does nothing (the mutation run)

struct Stats {
  uint64_t launches = 0, blocks = 0, threads = 0, switches = 0, barriers = 0, collectives = 0;
} g_stats;

}  // namespace

namespace detail {

ThreadView* current = nullptr;
uint3 block_idx{0, 0, 0};
dim3 block_dim, grid_dim;
unsigned char* dynamic_smem = nullptr;

namespace {

enum class State { kRunnable, kAtBarrier, kAtCollective, kDone };

struct Thread : ThreadView {
  State state = State::kRunnable;
  const char* file = nullptr;  // where it waits
  int line = 0;
  const void* ex_in = nullptr;  // warp_exchange operands
  void* ex_out = nullptr;
  ExchangeFn ex_fn = nullptr;
  const char* ex_what = nullptr;
  // cp.async copies issued and not yet completed: committed groups, then the open group
  struct Copy {
    unsigned char* dst;
    unsigned char data[16];
    int bytes;
    uint64_t site;  // racecheck's id of the cp.async call
  };
  std::vector<std::vector<Copy>> groups;  // groups[0] oldest; the last is the open (uncommitted) one
  void* sp = nullptr;  // saved stack pointer while switched out
  unsigned char* stack_lo = nullptr;
  size_t stack_size = 0;
  void* fake_stack = nullptr;  // ASan's fake stack while switched out
};

struct Warp {
  int arrived = 0;  // lanes waiting at the warp's pending exchange
  ExchangeFn fn = nullptr;
};

// Fiber stacks, reused across blocks and launches; each has a guard page below it.
#if CUDASIM_ASAN
constexpr size_t kStackSize = 512 * 1024;
#else
constexpr size_t kStackSize = 128 * 1024;
#endif

struct StackPool {
  std::vector<unsigned char*> stacks;
  size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));

  unsigned char* get(size_t i) {
    while (stacks.size() <= i) {
      void* p = mmap(nullptr, kStackSize + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      TORCH_CHECK(p != MAP_FAILED, "cudasim: cannot map a fiber stack");
      mprotect(p, page, PROT_NONE);  // a stack overflow faults instead of corrupting a neighbour
      stacks.push_back(static_cast<unsigned char*>(p) + page);
    }
    return stacks[i];
  }
};

struct Block {
  const LaunchConfig* cfg;
  void (*entry)(void*);
  void* ctx;
  std::vector<Thread> threads;
  std::vector<Warp> warps;
  void* main_sp = nullptr;
  const void* main_stack_lo = nullptr;  // for ASan's fiber annotations
  size_t main_stack_size = 0;
  void* main_fake_stack = nullptr;
  std::exception_ptr error;
};

Block* g_block = nullptr;
StackPool g_stacks;

std::string where(const Block& b) {
  std::ostringstream s;
  s << b.cfg->name << " block (" << block_idx.x << ", " << block_idx.y << ", " << block_idx.z << ")";
  return s.str();
}

// Thread ranges grouped by what they are doing, e.g. "threads 0-31 wait at verify.cu:40".
std::string describe(const Block& b) {
  std::ostringstream s;
  size_t i = 0;
  const auto& t = b.threads;
  while (i < t.size()) {
    auto label = [&](const Thread& x) {
      switch (x.state) {
        case State::kDone: return std::string("exited");
        case State::kAtBarrier: return "wait at __syncthreads " + site(x.file, x.line);
        case State::kAtCollective:
          return std::string("wait at ") + x.ex_what + " " +
                 site(x.file, x.line);
        case State::kRunnable: return std::string("runnable");
      }
      return std::string("?");
    };
    const std::string what = label(t[i]);
    size_t j = i + 1;
    while (j < t.size() && label(t[j]) == what) ++j;
    if (i) s << "; ";
    if (j - i > 1) s << "threads " << i << "-" << (j - 1);
    else s << "thread " << i;
    s << " " << what;
    i = j;
  }
  return s.str();
}

// ---- switching ----

void switch_to_thread(Block& b, Thread& t) {
  ++g_stats.switches;
  current = &t;
#if CUDASIM_ASAN
  __sanitizer_start_switch_fiber(&b.main_fake_stack, t.stack_lo, t.stack_size);
#endif
  cudasim_switch(&b.main_sp, t.sp);
#if CUDASIM_ASAN
  __sanitizer_finish_switch_fiber(b.main_fake_stack, nullptr, nullptr);
#endif
  current = nullptr;
}

void switch_to_main(Block& b, Thread& t, bool finished) {
#if CUDASIM_ASAN
  // A finished fiber's fake stack is released (nullptr save slot).
  __sanitizer_start_switch_fiber(finished ? nullptr : &t.fake_stack, b.main_stack_lo, b.main_stack_size);
#else
  (void)finished;
#endif
  cudasim_switch(&t.sp, b.main_sp);
#if CUDASIM_ASAN
  __sanitizer_finish_switch_fiber(t.fake_stack, nullptr, nullptr);
#endif
}

extern "C" void cudasim_fiber_main(Thread* t) {
  Block& b = *g_block;
#if CUDASIM_ASAN
  __sanitizer_finish_switch_fiber(nullptr, &b.main_stack_lo, &b.main_stack_size);
#endif
  try {
    rc::resume_kernel();
    b.entry(b.ctx);
    rc_track = false;
    cp_async_commit();  // a device completes what was issued, waited for or not
    cp_async_wait(0);
  } catch (...) {
    if (!b.error) b.error = std::current_exception();
  }
  t->state = State::kDone;
  switch_to_main(b, *t, true);
  __builtin_unreachable();
}

void init_fiber(Thread& t, unsigned char* stack_lo) {
  t.stack_lo = stack_lo;
  t.stack_size = kStackSize;
  t.fake_stack = nullptr;
  // [mxcsr|fcw] r15 r14 r13 r12 rbx rbp ret: the order cudasim_switch pops them in.
  auto* top = reinterpret_cast<uint64_t*>(stack_lo + kStackSize);  // 16-byte aligned
  uint64_t* sp = top - 1;                                          // ret slot at 16n + 8
  *sp-- = reinterpret_cast<uint64_t>(&cudasim_trampoline);
  *sp-- = 0;                                                       // rbp
  *sp-- = 0;                                                       // rbx
  *sp-- = reinterpret_cast<uint64_t>(&t);                          // r12: the thread
  *sp-- = reinterpret_cast<uint64_t>(&cudasim_fiber_main);         // r13: the entry
  *sp-- = 0;                                                       // r14
  *sp-- = 0;                                                       // r15
  *sp = 0x1F80ull | (0x037Full << 32);                             // default MXCSR, x87 control word
  t.sp = sp;
}

// ---- the block scheduler ----

std::vector<int> pass_order(int n, uint64_t pass) {
  std::vector<int> order(n);
  for (int i = 0; i < n; ++i) order[i] = i;
  if (g_order == Order::kReverse) {  // kWarpAhead: the lead warp ran first, then forward
    std::reverse(order.begin(), order.end());
  } else if (g_order == Order::kShuffle) {
    std::mt19937_64 rng(g_seed ^ (pass * 0x9E3779B97F4A7C15ull) ^
                        (static_cast<uint64_t>(block_idx.x) << 20) ^ (static_cast<uint64_t>(block_idx.y) << 40) ^
                        block_idx.z);
    std::shuffle(order.begin(), order.end(), rng);
  }
  return order;
}

void run_block(Block& b) {
  const int n = static_cast<int>(b.threads.size());
  for (int i = 0; i < n; ++i) {
    Thread& t = b.threads[i];
    t.tid = {static_cast<unsigned>(i % block_dim.x), static_cast<unsigned>((i / block_dim.x) % block_dim.y),
             static_cast<unsigned>(i / (block_dim.x * block_dim.y))};
    t.linear = i;
    t.state = State::kRunnable;
    t.groups.clear();
    init_fiber(t, g_stacks.get(i));
  }
  for (Warp& w : b.warps) w = Warp{};
  // Shared memory is undefined at block start: 0xFF bytes read as NaN floats and -1 integers, so
  // a kernel that reads before it writes shows it.
  if (b.cfg->smem) std::memset(dynamic_smem, 0xFF, b.cfg->smem);
  rc::block_begin(n);
  auto run = [&](Thread& t) {
    switch_to_thread(b, t);
    if (b.error) std::rethrow_exception(b.error);
    TORCH_CHECK(!rc::found(), rc::report());
  };
  const int lead = g_order == Order::kWarpAhead ? static_cast<int>(g_seed % b.warps.size()) : -1;
  for (uint64_t pass = 0;; ++pass) {
    bool ran = false;
    // The lead warp runs as far as barriers let it before any other thread starts.
    for (bool again = lead >= 0; again;) {
      again = false;
      for (int i = lead * 32; i < std::min(n, lead * 32 + 32); ++i) {
        if (b.threads[i].state != State::kRunnable) continue;
        run(b.threads[i]);
        ran = again = true;
      }
    }
    for (int i : pass_order(n, pass)) {
      Thread& t = b.threads[i];
      if (t.state != State::kRunnable) continue;
      run(t);
      ran = true;
    }
    if (ran) continue;
    // Nobody can run: every live thread waits at a barrier (release it if they all wait at the
    // same one), or something is stuck.
    int live = 0, at_barrier = 0;
    const Thread* first = nullptr;
    bool same = true;
    for (const Thread& t : b.threads) {
      if (t.state == State::kDone) continue;
      ++live;
      if (t.state != State::kAtBarrier) continue;
      ++at_barrier;
      if (!first) first = &t;
      else if (t.line != first->line || std::strcmp(t.file, first->file) != 0) same = false;
    }
    if (live == 0) return;
    if (at_barrier == live && same) {
      ++g_stats.barriers;
      for (Thread& t : b.threads)
        if (t.state == State::kAtBarrier) t.state = State::kRunnable;
      if (rc::active()) {
        // A new interval. A cp.async not yet waited for may land in it: it writes its bytes again.
        rc::barrier();
        for (const Thread& t : b.threads)
          for (const auto& group : t.groups)
            for (const auto& c : group) rc::note(c.dst, c.bytes, 1, t.linear, c.site);
      }
      continue;
    }
    const bool divergent = at_barrier == live;
    TORCH_CHECK(false, "cudasim: ", divergent ? "divergent __syncthreads" : "deadlock (a warp collective is missing a lane)",
                " in ", where(b), ": ", describe(b));
  }
}

}  // namespace

// ---- what kernel code calls ----

std::string site(const char* file, int line) {
  std::string f = file ? file : "?";
  const auto slash = f.rfind('/');
  if (slash != std::string::npos) f = f.substr(slash + 1);
  return f + ":" + std::to_string(line);
}

std::string block_name() { return where(*g_block); }

std::string block_state() { return describe(*g_block); }


void syncthreads(const char* file, int line) {
  const RuntimeScope runtime;
  if (!g_removed_barrier.empty() && g_removed_barrier == site(file, line)) return;  // as if deleted
  Block& b = *g_block;
  auto& t = static_cast<Thread&>(*current);
  t.state = State::kAtBarrier;
  t.file = file;
  t.line = line;
  switch_to_main(b, t, false);
}

void warp_exchange(const char* what, ExchangeFn compute, const void* in, void* out, const char* file, int line) {
  const RuntimeScope runtime;
  Block& b = *g_block;
  auto& t = static_cast<Thread&>(*current);
  const int warp_id = t.linear / 32;
  Warp& w = b.warps[warp_id];
  if (w.arrived == 0) {
    w.fn = compute;
  } else if (w.fn != compute) {
    const Thread* other = nullptr;  // a lane that arrived first, to name its collective
    for (int l = 0; l < 32 && !other; ++l)
      if (b.threads[warp_id * 32 + l].state == State::kAtCollective) other = &b.threads[warp_id * 32 + l];
    TORCH_CHECK(false, "cudasim: lanes of warp ", warp_id, " in ", where(b), " meet at different warp collectives: ",
                what, " at ", site(file, line), " and ", other->ex_what, " at ", site(other->file, other->line), "; ",
                describe(b));
  }
  t.state = State::kAtCollective;
  t.ex_fn = compute;
  t.ex_in = in;
  t.ex_out = out;
  t.ex_what = what;
  t.file = file;
  t.line = line;
  if (++w.arrived < 32) {
    switch_to_main(b, t, false);
    return;
  }
  // The 32nd lane arrived: it computes every lane's result and goes on without a switch.
  ++g_stats.collectives;
  Thread* lanes = &b.threads[warp_id * 32];
  const void* ins[32];
  void* outs[32];
  for (int l = 0; l < 32; ++l) {
    ins[l] = lanes[l].ex_in;
    outs[l] = lanes[l].ex_out;
  }
  w.arrived = 0;
  for (int l = 0; l < 32; ++l) lanes[l].state = State::kRunnable;
  // Every lane reached it before any goes on, and a warp's shared-memory accesses are performed in
  // order: racecheck orders the lanes' accesses across it (docs/cudasim.md says what that misses).
  rc::warp_synced(warp_id);
  compute(ins, outs);
}

void cp_async(void* smem_dst, const void* src, int bytes, int src_bytes, const char* file, int line) {
  const RuntimeScope runtime;
  auto& t = static_cast<Thread&>(*current);
  TORCH_CHECK(bytes == 4 || bytes == 8 || bytes == 16, "cudasim: cp.async copies 4, 8 or 16 bytes, got ", bytes);
  TORCH_CHECK(reinterpret_cast<uintptr_t>(smem_dst) % bytes == 0 && (src_bytes == 0 || reinterpret_cast<uintptr_t>(src) % bytes == 0),
              "cudasim: cp.async of ", bytes, " bytes needs ", bytes, "-byte aligned addresses");
  if (t.groups.empty()) t.groups.emplace_back();
  Thread::Copy c{static_cast<unsigned char*>(smem_dst), {}, bytes, 0};
  // src_bytes < bytes zero-fills the rest (src_bytes = 0: no read at all, e.g. a row past the end)
  if (src_bytes > 0) std::memcpy(c.data, src, static_cast<size_t>(std::min(src_bytes, bytes)));
  if (g_cp_async_early) std::memcpy(c.dst, c.data, static_cast<size_t>(bytes));
  if (rc::active()) {  // the copy may land any time until its wait: a write from now on
    c.site = rc::site(file, line);
    rc::note(c.dst, bytes, 1, t.linear, c.site);
  }
  t.groups.back().push_back(c);
}

void cp_async_commit() {
  const RuntimeScope runtime;
  auto& t = static_cast<Thread&>(*current);
  if (t.groups.empty()) t.groups.emplace_back();
  t.groups.emplace_back();  // the committed group stays, a new open one starts
}

void cp_async_wait(int keep_groups) {
  const RuntimeScope runtime;
  auto& t = static_cast<Thread&>(*current);
  if (t.groups.empty()) return;
  // Committed groups are all but the last (the open one, which wait_group does not cover):
  // complete the oldest until at most keep_groups committed groups remain pending.
  const int committed = static_cast<int>(t.groups.size()) - 1;
  const int done = std::max(committed - keep_groups, 0);
  for (int gi = 0; gi < done && !g_cp_async_early; ++gi)
    for (const auto& c : t.groups[gi]) std::memcpy(c.dst, c.data, static_cast<size_t>(c.bytes));
  t.groups.erase(t.groups.begin(), t.groups.begin() + done);
  if (t.groups.empty()) t.groups.emplace_back();
}

cudaError_t set_max_dynamic_smem(const void* fn, int bytes) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (bytes < 0 || bytes > g_device.smem_optin) return cudaErrorInvalidValue;
  g_max_dyn_smem[fn] = bytes;
  return cudaSuccess;
}

void run_grid(const LaunchConfig& cfg, void (*entry)(void*), void* ctx) {
  static const bool environment_read = (read_environment(), true);
  (void)environment_read;
  std::lock_guard<std::mutex> lock(g_mutex);
  const dim3 g = cfg.grid, t = cfg.block;
  const uint64_t threads = static_cast<uint64_t>(t.x) * t.y * t.z;
  auto fail = [&](const std::string& why) {
    TORCH_CHECK(false, "cudasim: launch of ", cfg.name, " with grid (", g.x, ", ", g.y, ", ", g.z, "), block (", t.x,
                ", ", t.y, ", ", t.z, "), ", cfg.smem, " B dynamic shared memory on sm_", g_device.arch, ": ", why,
                " (a real device fails the launch)");
  };
  if (g.x == 0 || g.y == 0 || g.z == 0) fail("a grid dimension is 0");
  if (g.y > kMaxGridYZ || g.z > kMaxGridYZ) fail("grid y and z must be <= 65535");
  if (threads == 0 || threads > kMaxThreads || t.z > 64) fail("a block holds 1..1024 threads (z <= 64)");
  const auto opt = g_max_dyn_smem.find(cfg.fn);
  const int allowed = opt == g_max_dyn_smem.end() ? kDefaultSmem : std::max(opt->second, 0);
  if (cfg.smem > static_cast<size_t>(std::max(allowed, kDefaultSmem)) || cfg.smem > static_cast<size_t>(g_device.smem_optin)) {
    fail(cfg.smem > static_cast<size_t>(g_device.smem_optin)
             ? "more dynamic shared memory than the device's opt-in limit of " + std::to_string(g_device.smem_optin) + " B"
             : "more than 48 KB of dynamic shared memory needs cudaFuncSetAttribute(MaxDynamicSharedMemorySize), "
               "which allows " + std::to_string(allowed) + " B");
  }
  ++g_stats.launches;
  Block b;
  b.cfg = &cfg;
  b.entry = entry;
  b.ctx = ctx;
  b.threads.resize(threads);
  b.warps.resize((threads + 31) / 32);
  std::vector<unsigned char> smem_buf(cfg.smem + 128);
  auto* smem = reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_buf.data()) + 127) & ~uintptr_t{127});
  block_dim = t;
  grid_dim = g;
  dynamic_smem = cfg.smem ? smem : nullptr;
  g_block = &b;
  rc::launch_begin(cfg.fn, dynamic_smem, cfg.smem);
  struct Reset {
    ~Reset() {
      rc::launch_end();
      g_block = nullptr;
      current = nullptr;
      dynamic_smem = nullptr;
    }
  } reset;
  for (unsigned z = 0; z < g.z; ++z)
    for (unsigned y = 0; y < g.y; ++y)
      for (unsigned x = 0; x < g.x; ++x) {
        block_idx = {x, y, z};
        ++g_stats.blocks;
        g_stats.threads += threads;
        run_block(b);
      }
}

}  // namespace detail

// ---- control from Python (specops._C_cudasim) ----

void set_schedule(const std::string& order, uint64_t seed) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (order == "forward") g_order = Order::kForward;
  else if (order == "reverse") g_order = Order::kReverse;
  else if (order == "shuffle") g_order = Order::kShuffle;
  else if (order == "warp_ahead") g_order = Order::kWarpAhead;
  else TORCH_CHECK(false, "cudasim: schedule must be forward, reverse, shuffle or warp_ahead, got '", order, "'");
  g_seed = seed;
}

void set_arch(int arch) {
  std::lock_guard<std::mutex> lock(g_mutex);
  TORCH_CHECK(arch == 80 || arch == 90, "cudasim: arch must be 80 or 90, got ", arch);
  g_device = arch == 90 ? kH100 : kA100;
  g_max_dyn_smem.clear();  // attributes belong to a device
}

int arch() { return g_device.arch; }

void set_racecheck(bool on) {
  std::lock_guard<std::mutex> lock(g_mutex);
  detail::rc::set_enabled(on);
}

bool racecheck() { return detail::rc::enabled(); }

void set_cp_async(const std::string& landing) {
  std::lock_guard<std::mutex> lock(g_mutex);
  TORCH_CHECK(landing == "late" || landing == "early", "cudasim: cp.async landing must be late or early, got '",
              landing, "'");
  g_cp_async_early = landing == "early";
}

void remove_barrier(const std::string& site) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_removed_barrier = site;
}

std::vector<std::string> racechecked() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return detail::rc::checked_kernels();
}

// The controls' environment variables, for runs that cannot call them (the mutation run's pytest).
void read_environment() {
  if (const char* v = std::getenv("SPECOPS_CUDASIM_RACECHECK")) set_racecheck(std::string(v) == "1");
  if (const char* v = std::getenv("SPECOPS_CUDASIM_CP_ASYNC")) set_cp_async(v);
  if (const char* v = std::getenv("SPECOPS_CUDASIM_REMOVE_BARRIER")) remove_barrier(v);
}

std::map<std::string, uint64_t> stats() {
  return {{"launches", g_stats.launches}, {"blocks", g_stats.blocks}, {"threads", g_stats.threads},
          {"switches", g_stats.switches}, {"barriers", g_stats.barriers}, {"collectives", g_stats.collectives}};
}

}  // namespace cudasim

const char* cudaGetErrorString(cudaError_t err) {
  switch (err) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
  }
  return "unknown error";
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int /*device*/) {
  const auto& d = cudasim::g_device;
  switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock: *value = cudasim::kMaxThreads; return cudaSuccess;
    case cudaDevAttrMaxGridDimX: *value = 0x7fffffff; return cudaSuccess;
    case cudaDevAttrMaxGridDimY:
    case cudaDevAttrMaxGridDimZ: *value = static_cast<int>(cudasim::kMaxGridYZ); return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerBlock: *value = cudasim::kDefaultSmem; return cudaSuccess;
    case cudaDevAttrWarpSize: *value = 32; return cudaSuccess;
    case cudaDevAttrMultiProcessorCount: *value = d.sms; return cudaSuccess;
    case cudaDevAttrComputeCapabilityMajor: *value = d.arch / 10; return cudaSuccess;
    case cudaDevAttrComputeCapabilityMinor: *value = d.arch % 10; return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = d.smem_optin; return cudaSuccess;
  }
  return cudaErrorInvalidValue;
}
