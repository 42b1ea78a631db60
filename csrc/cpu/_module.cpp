#define SPECOPS_MODULE _C
#include "../module.h"
