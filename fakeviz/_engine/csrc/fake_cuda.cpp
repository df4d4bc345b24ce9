// fakeviz fake-CUDA shim for CPU-only builds of PyTorch.
//
// Note: [fake cuda on a CPU-only build]
// A CPU-only libtorch has no DeviceGuardImpl for CUDA, so FakeTensorMode cannot
// run module init, copy_ or indexing on fake cuda tensors ("PyTorch is not
// linked with support for cuda devices"), and the autograd engine cannot route
// backward work for them. This shim
//   1. registers a DeviceGuardImpl for CUDA that owns no memory and runs no
//      kernels: it only tracks the "current device" per thread and hands out
//      default streams, and reports 64 devices (cuda:0 .. cuda:63);
//   2. makes the already-created CUDA hooks object report isBuilt() == true
//      (isAvailable() stays false), so at::accelerator::getAccelerator finds
//      CUDA as the accelerator that the autograd engine asks for streams.
// The hooks object is created once and cached by libtorch (often during
// `import torch`), so instead of registering a new hooks class we swap the
// vtable pointer of the cached object for one of a subclass that adds no data
// members. The original vtable pointer is kept and can be put back.
// Nothing here allocates device memory: real CUDA kernels still cannot run,
// only fake (meta-backed) tensors that claim a cuda device.
//
// Note: [fake cuda on a CUDA build without a GPU]
// A CUDA build of torch (the default Linux wheel) on a machine with no GPU has a
// CUDA guard and CUDA hooks, but both ask the driver: the guard counts 0
// devices, so the autograd engine makes no cuda queues, and the hooks'
// hasPrimaryContext(0) throws "expects a valid device index" on every fake
// backward. There the shim takes over the same two places with force=1: the
// guard slot holds the fake guard (the build's own is kept and put back by
// fakeviz_restore_cuda_guard), and the hooks object answers through the fake
// hooks' vtable (isBuilt true, isAvailable false, no primary context; the
// build's vtable is kept and put back by fakeviz_restore_cuda_hooks). Nothing
// real can run on a build that sees no GPU, so no real tensor is affected.
// With a GPU present fakeviz never calls either: the native path serves.
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <cstring>

namespace {

constexpr c10::DeviceIndex kFakeDeviceCount = 64;
thread_local c10::DeviceIndex current_index = 0;

c10::DeviceIndex clamp_index(c10::Device d) {
  return d.index() < 0 ? 0 : d.index();
}

struct FakeCUDAGuardImpl final : public c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return c10::DeviceType::CUDA; }
  c10::Device exchangeDevice(c10::Device d) const override {
    c10::Device old = getDevice();
    current_index = clamp_index(d);
    return old;
  }
  c10::Device getDevice() const override {
    return c10::Device(c10::DeviceType::CUDA, current_index);
  }
  void setDevice(c10::Device d) const override { current_index = clamp_index(d); }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    current_index = clamp_index(d);
  }
  c10::Stream getStream(c10::Device d) const override {
    return c10::Stream(c10::Stream::DEFAULT, c10::Device(c10::DeviceType::CUDA, clamp_index(d)));
  }
  c10::Stream getDefaultStream(c10::Device d) const override { return getStream(d); }
  c10::Stream getNewStream(c10::Device d, int) const override { return getStream(d); }
  c10::Stream exchangeStream(c10::Stream s) const override { return s; }
  c10::DeviceIndex deviceCount() const noexcept override { return kFakeDeviceCount; }
  void record(void**, const c10::Stream&, const c10::DeviceIndex, const c10::EventFlag) const override {}
  void block(void*, const c10::Stream&) const override {}
  bool queryEvent(void*) const override { return true; }
  void destroyEvent(void*, const c10::DeviceIndex) const noexcept override {}
  bool queryStream(const c10::Stream&) const override { return true; }
  void synchronizeStream(const c10::Stream&) const override {}
  void synchronizeEvent(void*) const override {}
  void synchronizeDevice(const c10::DeviceIndex) const override {}
  void recordDataPtrOnStream(const c10::DataPtr&, const c10::Stream&) const override {}
};

struct FakeCUDAHooks : public at::CUDAHooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return false; }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return false; }
};

FakeCUDAGuardImpl guard_impl;
void* original_hooks_vptr = nullptr;
const c10::impl::DeviceGuardImplInterface* original_guard = nullptr;
const at::CUDAHooksInterface* patched_hooks = nullptr;

}  // namespace

extern "C" {

// 0: registered now (or already ours), 1: a CUDA guard was already registered (left alone unless
// force: then it is kept for fakeviz_restore_cuda_guard and replaced).
int fakeviz_register_cuda_guard(int force) {
  auto& slot = c10::impl::device_guard_impl_registry[static_cast<size_t>(c10::DeviceType::CUDA)];
  const c10::impl::DeviceGuardImplInterface* cur = slot.load();
  if (cur == &guard_impl) return 0;
  if (cur != nullptr && !force) return 1;
  original_guard = cur;
  slot.store(&guard_impl);
  return 0;
}

// Puts back the guard that force replaced; 0 done, 1 nothing to put back.
int fakeviz_restore_cuda_guard() {
  auto& slot = c10::impl::device_guard_impl_registry[static_cast<size_t>(c10::DeviceType::CUDA)];
  if (slot.load() != &guard_impl || original_guard == nullptr) return 1;
  slot.store(original_guard);
  original_guard = nullptr;
  return 0;
}

// 0: patched now or already, 1: the hooks already report a CUDA build (left alone unless force).
int fakeviz_patch_cuda_hooks(int force) {
  static FakeCUDAHooks fake;
  const at::CUDAHooksInterface& cur = at::detail::getCUDAHooks();
  void* vp_fake = nullptr;
  void* vp_cur = nullptr;
  std::memcpy(&vp_fake, static_cast<const void*>(&fake), sizeof(void*));
  std::memcpy(&vp_cur, static_cast<const void*>(&cur), sizeof(void*));
  if (vp_cur == vp_fake) return 0;
  if (cur.isBuilt() && !force) return 1;
  original_hooks_vptr = vp_cur;
  patched_hooks = &cur;
  std::memcpy(const_cast<void*>(static_cast<const void*>(&cur)), &vp_fake, sizeof(void*));
  return 0;
}

// Puts back the hooks' own vtable; 0 done, 1 nothing to put back.
int fakeviz_restore_cuda_hooks() {
  if (patched_hooks == nullptr || original_hooks_vptr == nullptr) return 1;
  std::memcpy(const_cast<void*>(static_cast<const void*>(patched_hooks)), &original_hooks_vptr, sizeof(void*));
  patched_hooks = nullptr;
  original_hooks_vptr = nullptr;
  return 0;
}

int fakeviz_device_count() { return kFakeDeviceCount; }

// The calling thread's current fake cuda device, the one the guard above reports (the autograd
// engine sets it on its device threads); fakeviz._engine.cuda_api answers torch.cuda.current_device,
// set_device and torch.cuda.device(i) with these. Exchange with a negative index only reads.
int fakeviz_current_device() { return current_index; }

int fakeviz_exchange_device(int index) {
  int old = current_index;
  if (index >= 0) current_index = static_cast<c10::DeviceIndex>(index);
  return old;
}

}  // extern "C"
