// specops._C: the CPU kernels, and the schemas of every op (csrc/schemas.h).
#include <torch/library.h>

#include "../schemas.h"

TORCH_LIBRARY(specops, m) { SPECOPS_DEFINE_SCHEMAS(m); }

#define SPECOPS_MODULE _C
#include "../module.h"
