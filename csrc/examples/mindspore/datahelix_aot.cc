// MindSpore AOT custom op: copies sample INDEX of a DataHelix batch into the op's output.
// Built only where MindSpore is installed (not in this repository's tests):
//
//   g++ -shared -fPIC -O2 -Icsrc/include csrc/examples/mindspore/datahelix_aot.cc
//       -Ltarget/debug -ldatahelix -o datahelix_aot.so          (one command line)
//   op = ops.Custom("./datahelix_aot.so:DataHelixSample", out_shape=lambda h, i: FRAME_SHAPE,
//                   out_dtype=mstype.uint8, func_type="aot")
//   frames = op(Tensor(batch_handle, mstype.int64), Tensor(index, mstype.int64))
//
// MindSpore allocates an AOT op's outputs, so this path copies once; for zero-copy on the host
// use the numpy views of csrc/examples/python/datahelix.py with mindspore.Tensor.from_numpy.
// The batch stays owned by the caller (release it after the step). Inputs: params[0] an int64
// scalar holding the dh_batch* handle, params[1] an int64 scalar index; output params[2] a
// uint8 tensor whose shape must equal the sample's [F, H, W, 3].
#include <cstdint>
#include <cstring>

#include "datahelix.h"

extern "C" int DataHelixSample(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                               void *stream, void *extra) {
  (void)stream;
  (void)extra;
  (void)dtypes;
  if (nparam != 3) return 1;
  const auto handle = *static_cast<const int64_t *>(params[0]);
  const auto index = *static_cast<const int64_t *>(params[1]);
  if (handle == 0 || index < 0) return 2;
  dh_tensor t;
  if (dh_batch_tensor(reinterpret_cast<const dh_batch *>(handle), static_cast<size_t>(index), &t) != DH_OK) return 3;
  if (ndims[2] != static_cast<int>(t.ndim)) return 4;
  for (uint32_t d = 0; d < t.ndim; d++) {
    if (shapes[2][d] != static_cast<int64_t>(t.shape[d])) return 4;
  }
  std::memcpy(params[2], t.data, t.nbytes);
  return 0;
}
