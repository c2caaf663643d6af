// MindSpore AOT custom op: copies sample INDEX of a DataHelix batch into the op's output.
// Built with g++ and run by python/tests/mindspore_aot.py (MindSpore 2.10, CPU):
//
//   g++ -shared -fPIC -O2 -Icsrc/include csrc/examples/mindspore/datahelix_aot.cc
//       -Ltarget/debug -ldatahelix -Wl,-rpath,target/debug -o datahelix_aot.so   (one command line)
//   op = ops.Custom("./datahelix_aot.so:DataHelixSample", out_shape=lambda h, i, like: like[:3] + [3],
//                   out_dtype=mstype.uint8, func_type="aot")
//   like = Tensor(np.zeros((F, H, W, 0), np.uint8))       # the sample's shape, no bytes
//   frames = op(Tensor(np.int64(batch_handle)), Tensor(np.int64(index)), like)
//
// Inputs: params[0] an int64 scalar holding the dh_batch* handle, params[1] an int64 scalar
// index, params[2] a uint8 tensor of shape [F, H, W, 0]: MindSpore infers an op's output shape
// from its inputs' shapes only (and reuses a kernel while they do not change), so the sample's
// shape travels as an empty input. Output params[3]: uint8 [F, H, W, 3].
//
// MindSpore allocates an AOT op's outputs, so this path copies once; for zero-copy on the host
// use the Python package's arrays with mindspore.Tensor.from_numpy (also in that test). The
// batch stays owned by the caller (release it after the step). A non-zero return stops
// MindSpore's execution; the reason is printed on stderr with the sample.
#include <cstdint>
#include <cstdio>
#include <cstring>

#include "datahelix.h"

extern "C" int DataHelixSample(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                               void *stream, void *extra) {
  (void)stream;
  (void)extra;
  (void)dtypes;
  if (nparam != 4) {
    std::fprintf(stderr, "DataHelixSample: %d tensors; expected handle, index, like and the output\n", nparam);
    return 1;
  }
  const auto handle = *static_cast<const int64_t *>(params[0]);
  const auto index = *static_cast<const int64_t *>(params[1]);
  if (handle == 0 || index < 0) {
    std::fprintf(stderr, "DataHelixSample: NULL batch or negative index %lld\n", static_cast<long long>(index));
    return 2;
  }
  dh_tensor t;
  if (dh_batch_tensor(reinterpret_cast<const dh_batch *>(handle), static_cast<size_t>(index), &t) != DH_OK) {
    std::fprintf(stderr, "DataHelixSample: no sample %lld in the batch\n", static_cast<long long>(index));
    return 3;
  }
  bool same = ndims[3] == static_cast<int>(t.ndim);
  for (uint32_t d = 0; same && d < t.ndim; d++) same = shapes[3][d] == static_cast<int64_t>(t.shape[d]);
  if (!same || t.shape[0] * t.shape[1] * t.shape[2] * t.shape[3] != t.nbytes) {
    std::fprintf(stderr, "DataHelixSample: sample %lld is [%llu, %llu, %llu, %llu]; pass `like` of that shape with 0 last\n",
                 static_cast<long long>(index), static_cast<unsigned long long>(t.shape[0]),
                 static_cast<unsigned long long>(t.shape[1]), static_cast<unsigned long long>(t.shape[2]),
                 static_cast<unsigned long long>(t.shape[3]));
    return 4;
  }
  std::memcpy(params[3], t.data, t.nbytes);
  return 0;
}
