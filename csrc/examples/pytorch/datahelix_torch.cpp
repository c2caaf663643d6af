// PyTorch extension: wraps a DataHelix batch's tensors as torch uint8 tensors without copying.
// Built with torch.utils.cpp_extension (python/tests/torch_cpp_extension.py builds and runs it):
//
//   from torch.utils.cpp_extension import load
//   ext = load("datahelix_torch", ["csrc/examples/pytorch/datahelix_torch.cpp"],
//              extra_include_paths=["csrc/include"],
//              extra_ldflags=["-Ltarget/debug", "-ldatahelix", "-Wl,-rpath,target/debug"])
//   batch = loader.next_batch()                     # csrc/examples/python/datahelix.py
//   ids, frames = ext.wrap_batch(batch.detach())    # the extension now owns the batch
//
// (Python code wants the Python package instead: `torch.from_dlpack(batch.tensor(i))` does
// this without a C++ build.)
//
// The batch is released when the last tensor viewing it is freed (each tensor's deleter drops a
// shared reference). Tensors are read-only views on the host: `.to("cuda", non_blocking=True)`
// after `.pin_memory()` copies them to the device. This is C++ against the C header only (no
// Rust meets C++ directly here, so no cxx bridge is needed).
#include <torch/extension.h>

#include <memory>
#include <string>
#include <vector>

#include "datahelix.h"

namespace {

void check(dh_result r, const char *what) {
  if (r != DH_OK) {
    std::string msg(dh_error_message(nullptr, 0), '\0');
    dh_error_message(&msg[0], msg.size());
    TORCH_CHECK(false, what, ": ", dh_result_name(r), ": ", msg.c_str());
  }
}

// Owns one batch; released with the last tensor that views it.
struct BatchOwner {
  dh_batch *batch;
  explicit BatchOwner(dh_batch *b) : batch(b) {}
  ~BatchOwner() { dh_batch_release(&batch); }
  BatchOwner(const BatchOwner &) = delete;
  BatchOwner &operator=(const BatchOwner &) = delete;
};

// Sample ids are 64-bit unsigned (beyond int64 tensors): returned as a list of Python ints.
std::tuple<std::vector<uint64_t>, std::vector<torch::Tensor>> wrap_batch(uint64_t handle) {
  TORCH_CHECK(handle != 0, "wrap_batch: NULL batch");
  auto owner = std::make_shared<BatchOwner>(reinterpret_cast<dh_batch *>(handle));
  const uint64_t *ids = nullptr;
  size_t n = 0;
  check(dh_batch_ids(owner->batch, &ids, &n), "dh_batch_ids");
  std::vector<torch::Tensor> frames;
  frames.reserve(n);
  for (size_t i = 0; i < n; i++) {
    dh_tensor t;
    check(dh_batch_tensor(owner->batch, i, &t), "dh_batch_tensor");
    TORCH_CHECK(t.dtype == DH_DTYPE_U8 && t.device == DH_DEVICE_HOST, "unexpected dtype or device");
    TORCH_CHECK(t.ndim == 4 && t.shape[3] == 3, "sample ", ids[i], ": not a [F, H, W, 3] tensor");
    TORCH_CHECK(t.shape[0] * t.shape[1] * t.shape[2] * t.shape[3] == t.nbytes, "sample ", ids[i],
                ": shape does not match its ", t.nbytes, " bytes");
    std::vector<int64_t> shape(t.shape, t.shape + t.ndim);
    // The deleter keeps the batch alive as long as this tensor (and its views) exist.
    auto keep = owner;
    frames.push_back(torch::from_blob(const_cast<uint8_t *>(t.data), shape, [keep](void *) mutable { keep.reset(); },
                                      torch::TensorOptions().dtype(torch::kUInt8)));
  }
  return {std::vector<uint64_t>(ids, ids + n), frames};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("wrap_batch", &wrap_batch,
        "Takes ownership of a dh_batch* (as an integer) and returns (ids, [uint8 tensors]) viewing it");
}
