// Input checks shared by the host-side launchers of both extensions.
//
// The public Python ops validate every argument with a ValueError/TypeError that
// names it; these checks only guard the kernels against direct torch.ops calls.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#define SPECOPS_CHECK_DTYPE(x, dt) \
  TORCH_CHECK((x).scalar_type() == (dt), #x " must be " #dt ", got ", (x).scalar_type())
#define SPECOPS_CHECK_DIM(x, d) \
  TORCH_CHECK((x).dim() == (d), #x " must have rank " #d ", got ", (x).dim())
#define SPECOPS_CHECK_CONTIG(x) TORCH_CHECK((x).is_contiguous(), #x " must be contiguous")
#define SPECOPS_CHECK_DEVICE(x, dev) \
  TORCH_CHECK((x).device() == (dev), #x " must be on ", (dev), ", got ", (x).device())
