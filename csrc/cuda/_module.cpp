#define SPECOPS_MODULE _C_cuda
#include "../module.h"
