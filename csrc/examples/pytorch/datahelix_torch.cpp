// PyTorch extension: wraps a DataHelix batch's tensors as torch uint8 tensors without copying.
// Built only where PyTorch is installed (not in this repository's tests):
//
//   from torch.utils.cpp_extension import load
//   ext = load("datahelix_torch", ["csrc/examples/pytorch/datahelix_torch.cpp"],
//              extra_include_paths=["csrc/include"], extra_ldflags=["-Ltarget/debug", "-ldatahelix"])
//   batch = loader.next_batch()                     # csrc/examples/python/datahelix.py
//   ids, frames = ext.wrap_batch(batch.detach())    # the extension now owns the batch
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

std::tuple<torch::Tensor, std::vector<torch::Tensor>> wrap_batch(uint64_t handle) {
  TORCH_CHECK(handle != 0, "wrap_batch: NULL batch");
  auto owner = std::make_shared<BatchOwner>(reinterpret_cast<dh_batch *>(handle));
  const uint64_t *ids = nullptr;
  size_t n = 0;
  check(dh_batch_ids(owner->batch, &ids, &n), "dh_batch_ids");
  torch::Tensor id_tensor = torch::empty({static_cast<int64_t>(n)}, torch::kInt64);
  std::vector<torch::Tensor> frames;
  frames.reserve(n);
  for (size_t i = 0; i < n; i++) {
    id_tensor[static_cast<int64_t>(i)] = static_cast<int64_t>(ids[i]);
    dh_tensor t;
    check(dh_batch_tensor(owner->batch, i, &t), "dh_batch_tensor");
    TORCH_CHECK(t.dtype == DH_DTYPE_U8 && t.device == DH_DEVICE_HOST, "unexpected dtype or device");
    std::vector<int64_t> shape(t.shape, t.shape + t.ndim);
    // The deleter keeps the batch alive as long as this tensor (and its views) exist.
    auto keep = owner;
    frames.push_back(torch::from_blob(const_cast<uint8_t *>(t.data), shape, [keep](void *) mutable { keep.reset(); },
                                      torch::TensorOptions().dtype(torch::kUInt8)));
  }
  return {id_tensor, frames};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("wrap_batch", &wrap_batch,
        "Takes ownership of a dh_batch* (as an integer) and returns (ids, [uint8 tensors]) viewing it");
}
