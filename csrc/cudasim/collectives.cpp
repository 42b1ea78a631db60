// Warp shuffles and votes of the cudasim runtime, as the PTX ISA defines them: every lane's
// operands meet at one warp_exchange (csrc/cudasim/cudasim.cpp), and the last lane to arrive
// computes all 32 results.
#include <c10/util/Exception.h>

#include <cstdint>
#include <ios>

#include "cudasim.h"
#include "runtime.h"

namespace cudasim {
namespace detail {

const char* op_name(Collective op) {
  switch (op) {
    case Collective::kShfl: return "__shfl_sync";
    case Collective::kShflXor: return "__shfl_xor_sync";
    case Collective::kShflDown: return "__shfl_down_sync";
    case Collective::kShflUp: return "__shfl_up_sync";
    case Collective::kBallot: return "__ballot_sync";
    case Collective::kAny: return "__any_sync";
    case Collective::kAll: return "__all_sync";
    case Collective::kSyncWarp: return "__syncwarp";
  }
  return "?";
}

namespace {

struct CollectiveIn {
  Collective op;
  uint64_t value;
  int arg;    // source lane, lane mask or delta
  int width;  // power of 2 <= 32
};

// Shuffles and votes as the PTX ISA defines them: a source lane outside the lane's `width`
// segment yields the lane's own value.
void collective_all(const void* const* ins, void* const* outs) {
  const auto* first = static_cast<const CollectiveIn*>(ins[0]);
  uint64_t votes = 0;
  for (int l = 0; l < 32; ++l) {
    const auto* in = static_cast<const CollectiveIn*>(ins[l]);
    TORCH_CHECK(in->op == first->op && in->width == first->width, "cudasim: lanes of one warp in ", block_name(),
                " meet at different warp collectives: ", op_name(in->op), " (width ", in->width, ") and ",
                op_name(first->op), " (width ", first->width, "); ", block_state());
    votes |= (in->value & 1u) << l;
  }
  const int width = first->width;
  for (int l = 0; l < 32; ++l) {
    const auto* in = static_cast<const CollectiveIn*>(ins[l]);
    const int a = in->arg, seg = l & ~(width - 1), pos = l & (width - 1);
    int src = l;
    switch (in->op) {
      case Collective::kShfl: src = seg + (a & (width - 1)); break;
      case Collective::kShflXor: src = (pos ^ a) < width ? seg + (pos ^ a) : l; break;
      case Collective::kShflDown: src = pos + a < width ? l + a : l; break;
      case Collective::kShflUp: src = pos >= a ? l - a : l; break;
      default: break;
    }
    uint64_t r = static_cast<const CollectiveIn*>(ins[src])->value;
    if (in->op == Collective::kBallot) r = votes;
    else if (in->op == Collective::kAny) r = votes != 0;
    else if (in->op == Collective::kAll) r = votes == 0xffffffffull;
    else if (in->op == Collective::kSyncWarp) r = 0;
    *static_cast<uint64_t*>(outs[l]) = r;
  }
}

}  // namespace

uint64_t warp_collective(Collective op, uint64_t value, int arg, int width, unsigned mask, const char* file,
                         int line) {
  const RuntimeScope runtime;
  TORCH_CHECK(mask == 0xffffffffu, "cudasim: ", op_name(op), " at ", site(file, line), " in ", block_name(),
              " uses mask 0x", std::hex, mask, std::dec, "; the emulator supports full-warp masks only");
  TORCH_CHECK(width >= 1 && width <= 32 && (width & (width - 1)) == 0, "cudasim: ", op_name(op), " at ",
              site(file, line), ": width must be a power of 2 <= 32, got ", width);
  const CollectiveIn in{op, value, arg, width};
  uint64_t out = 0;
  warp_exchange(op_name(op), collective_all, &in, &out, file, line);
  return out;
}

}  // namespace detail
}  // namespace cudasim
