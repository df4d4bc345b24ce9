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
// backward. There the shim changes two things for the process:
//   1. the guard slot holds the fake guard (force=1; the build's own is kept and
//      put back by fakeviz_restore_cuda_guard);
//   2. one entry of the hooks object's vtable: hasPrimaryContext answers false
//      (no context on any device, which is true without a GPU) instead of
//      throwing. The object gets a copy of its own vtable with that one slot
//      changed (its position from the Itanium C++ ABI's pointer to a virtual
//      member: 1 + the slot's byte offset), so every other answer stays the
//      build's own (initCUDA still says "Found no NVIDIA driver", versionCuDNN
//      the cuDNN it was built with). fakeviz_restore_cuda_hooks puts it back.
// Nothing real can run on a build that sees no GPU, so no real tensor is
// affected. With a GPU present fakeviz calls neither: the native path serves.

#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <cstdint>
#include <cstdio>
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

bool no_primary_context(const void*, c10::DeviceIndex) { return false; }

// The vtable copy of Note: [fake cuda on a CUDA build without a GPU] (2 ABI words before slot 0: the offset to
// top and the type info), and how many bytes from an address to the end of its mapping (/proc/self/maps), so
// the copy never reads past the library's mapped memory.
constexpr size_t kCopiedSlots = 512;
void* vtable_copy[kCopiedSlots + 2];

size_t mapped_bytes_after(const void* p) {
  auto a = reinterpret_cast<uintptr_t>(p);
  FILE* f = std::fopen("/proc/self/maps", "r");
  if (f == nullptr) return 0;
  unsigned long lo = 0, hi = 0;
  char line[512];
  size_t out = 0;
  while (std::fgets(line, sizeof line, f) != nullptr) {
    if (std::sscanf(line, "%lx-%lx", &lo, &hi) == 2 && lo <= a && a < hi) {
      out = hi - a;
      // a vtable may sit at the end of one mapping and run on into the next (same library): take both
      uintptr_t end = hi;
      while (std::fgets(line, sizeof line, f) != nullptr && std::sscanf(line, "%lx-%lx", &lo, &hi) == 2 &&
             lo == end) {
        out += hi - lo;
        end = hi;
      }
      break;
    }
  }
  std::fclose(f);
  return out;
}

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

// 0: patched now or already, 1: the hooks already report a CUDA build (left alone).
int fakeviz_patch_cuda_hooks() {
  static FakeCUDAHooks fake;
  const at::CUDAHooksInterface& cur = at::detail::getCUDAHooks();
  void* vp_fake = nullptr;
  void* vp_cur = nullptr;
  std::memcpy(&vp_fake, static_cast<const void*>(&fake), sizeof(void*));
  std::memcpy(&vp_cur, static_cast<const void*>(&cur), sizeof(void*));
  if (vp_cur == vp_fake) return 0;
  if (cur.isBuilt()) return 1;
  original_hooks_vptr = vp_cur;
  patched_hooks = &cur;
  std::memcpy(const_cast<void*>(static_cast<const void*>(&cur)), &vp_fake, sizeof(void*));
  return 0;
}

// Note: [fake cuda on a CUDA build without a GPU], 2: the build's hooks answer hasPrimaryContext with false.
// 0: patched now or already; 2: not the Itanium ABI's virtual-member encoding; 3: the vtable is not readable.
int fakeviz_patch_primary_context() {
  const at::CUDAHooksInterface& cur = at::detail::getCUDAHooks();
  void** vp_cur = nullptr;
  std::memcpy(&vp_cur, static_cast<const void*>(&cur), sizeof(void*));
  if (vp_cur == vtable_copy + 2) return 0;
  auto member = &at::CUDAHooksInterface::hasPrimaryContext;
  std::ptrdiff_t raw = 0;
  std::memcpy(&raw, &member, sizeof raw);
  if ((raw & 1) == 0) return 2;
  size_t slot = static_cast<size_t>(raw - 1) / sizeof(void*);
  size_t words = mapped_bytes_after(vp_cur - 2) / sizeof(void*);
  if (words < slot + 3) return 3;
  if (words > kCopiedSlots + 2) words = kCopiedSlots + 2;
  std::memcpy(vtable_copy, vp_cur - 2, words * sizeof(void*));
  vtable_copy[2 + slot] = reinterpret_cast<void*>(&no_primary_context);
  original_hooks_vptr = vp_cur;
  patched_hooks = &cur;
  void* vp_new = vtable_copy + 2;
  std::memcpy(const_cast<void*>(static_cast<const void*>(&cur)), &vp_new, sizeof(void*));
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
