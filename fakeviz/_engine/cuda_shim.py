"""Fake CUDA devices where torch cannot serve them itself: a CPU-only build, or a CUDA build with no GPU.

See Note: [fake cuda on a CPU-only build] and Note: [fake cuda on a CUDA build without a GPU] in
``csrc/fake_cuda.cpp``.

The shim is compiled once with the system C++ compiler against the headers of
the installed torch wheel (about 2 s), cached under ``$FAKEVIZ_CACHE_DIR`` (or
``~/.cache/fakeviz``), and loaded with :mod:`ctypes`. It works whether or not
``import torch`` came first. Which path serves fake cuda (:class:`ShimStatus` ``mode``):

* ``"shim"`` on a CPU-only build, and on a CUDA build that sees no GPU (``torch.cuda.device_count() == 0``:
  a laptop, a login node, CI): the shim's data-less guard and hooks, ``cuda:0`` .. ``cuda:63``, and
  inside a fake cuda session ``torch.cuda`` answers as the named GPU (:mod:`fakeviz._engine.cuda_api`);
* ``"native"`` on a CUDA build with GPUs: torch's own CUDA guard serves fake tensors on the real
  devices' indices (``cuda:0`` .. ``cuda:{n-1}``); nothing of torch's is replaced, and a real tensor on a
  real GPU stays real;
* ``"unavailable"``: no C++ compiler or an unsupported platform (``reason`` says which).

Known limitations
-----------------
* Without a C++ compiler the shim cannot be built. Then fake tensors can only
  live on ``cpu`` and ``meta``; :func:`status` says why, and one
  :class:`FakeVizWarning` is emitted the first time a cuda device is asked for.
* If a real (non-fake) backward ran in this process before the shim loaded,
  libtorch's autograd engine has already sized its per-device queues (with no
  cuda devices on a CPU-only build), so fake backward on any ``cuda`` device
  raises a :class:`FakeVizError` saying so; forward and cpu work. :func:`status`
  reports it (``backward_max_index == -1``); importing fakeviz first avoids it.
"""

from __future__ import annotations

import atexit
import ctypes
import dataclasses
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import torch

from .._core.errors import FakeVizWarning

__all__ = ["ShimStatus", "ensure_fake_cuda", "status"]

_SRC = Path(__file__).with_name("csrc") / "fake_cuda.cpp"
_lock = threading.Lock()


@dataclasses.dataclass
class ShimStatus:
    """How fake cuda devices are provided in this process."""

    mode: str  # "native" | "shim" | "unavailable" | "not-loaded"
    reason: str = ""
    library: str = ""
    device_count: int = 0
    backward_max_index: int = -1  # highest cuda index a fake backward can use
    build: str = ""  # "cpu" (a CPU-only torch) or "cuda" (a CUDA build, e.g. the default Linux wheel)
    real_gpus: int = 0  # GPUs the CUDA build sees (0 on a CPU-only build)
    torch_version: str = ""

    @property
    def cuda_ok(self) -> bool:
        return self.mode in ("native", "shim")


_status = ShimStatus(mode="not-loaded")
_warned = False
_lib: ctypes.CDLL | None = None  # the loaded shim (mode "shim")


def status() -> ShimStatus:
    """The current :class:`ShimStatus` (loads nothing)."""
    return _status


def cache_dir() -> Path:
    root = os.environ.get("FAKEVIZ_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "fakeviz"
    )
    return Path(root)


def _library_path() -> Path:
    src = _SRC.read_bytes()
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    key = hashlib.sha256(src + torch.__version__.encode() + str(abi).encode() + torch.__file__.encode())
    return cache_dir() / f"fake_cuda_{key.hexdigest()[:16]}.so"


def _cxx_standard(torch_dir: Path) -> str:
    """The C++ standard the installed torch's headers need: C++20 from 2.14 on (``operator<=>`` in
    ``c10/util/intrusive_ptr.h``), C++17 before."""
    text = (torch_dir / "include" / "c10" / "util" / "intrusive_ptr.h").read_text(errors="replace")
    return "c++20" if "operator<=>" in text else "c++17"


def _compile(target: Path) -> None:
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        raise RuntimeError("no C++ compiler found (looked for $CXX, c++, g++, clang++)")
    torch_dir = Path(torch.__file__).parent
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    cmd = [
        cxx, "-O1", "-shared", "-fPIC", f"-std={_cxx_standard(torch_dir)}", "-w",
        f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
        f"-I{torch_dir / 'include'}",
        str(_SRC), "-o", tmp,
        f"-L{torch_dir / 'lib'}", "-lc10", "-ltorch_cpu",
        f"-Wl,-rpath,{torch_dir / 'lib'}",
    ]  # fmt: skip
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            raise RuntimeError(f"compiling the fake-cuda shim failed:\n{proc.stderr[-2000:]}")
        os.replace(tmp, target)  # atomic: concurrent builders never load half a file
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _real_gpu_count() -> int:
    """GPUs a CUDA build sees (0 without a driver or a device); asks the runtime, makes no context."""
    try:
        return int(torch.cuda.device_count())
    except Exception:  # noqa: BLE001 - a broken driver install counts as no GPU
        return 0


def _probe_backward() -> int:
    """Highest fake cuda index on which autograd's engine accepts work."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    best = -1
    for index in (0, 63):
        try:
            with FakeTensorMode():
                x = torch.empty(2, device=f"cuda:{index}", requires_grad=True)
                (x * 2).sum().backward()
            best = index
        except RuntimeError:
            break
    return best


def drain_autograd_workers(rounds: int = 4) -> None:
    """Let torch's autograd device threads finish releasing finished graph tasks.

    Note: [autograd worker exit race]
    Backward work on (fake) cuda runs on torch's per-device autograd threads. The
    last reference to a finished GraphTask may be dropped on such a thread; its
    thread-local state holds Python objects (the fake mode, device context), so
    the thread needs the GIL to release them. If the interpreter is finalizing
    by then, CPython exits the thread inside a noexcept destructor and the
    process aborts ("terminate called without an active exception"). Sleeping
    releases the GIL so waiting workers finish first; this runs at exit and
    after each backward started inside a fakeviz session.
    """
    for _ in range(rounds):
        time.sleep(0.002)


def ensure_fake_cuda() -> ShimStatus:
    """Make fake cuda devices usable in this process; idempotent and thread-safe."""
    global _status, _lib
    with _lock:
        if _status.mode != "not-loaded":
            return _status
        cuda_build = torch.backends.cuda.is_built()
        facts = {"build": "cuda" if cuda_build else "cpu", "torch_version": torch.__version__}
        real = _real_gpu_count() if cuda_build else 0
        if real > 0:
            _status = ShimStatus(
                mode="native", device_count=real, backward_max_index=real - 1, real_gpus=real,
                reason=f"a CUDA build of torch {torch.__version__} with {real} GPU(s): torch's own CUDA guard "
                       f"serves fake cuda:0 .. cuda:{real - 1}; nothing of torch is replaced",
                **facts,
            )  # fmt: skip
            return _status
        if not sys.platform.startswith("linux") and sys.platform != "darwin":
            _status = ShimStatus(mode="unavailable", reason=f"platform {sys.platform} is not supported", **facts)
            return _status
        try:
            path = _library_path()
            if not path.exists():
                _compile(path)
            lib = ctypes.CDLL(str(path))
            lib.fakeviz_register_cuda_guard.argtypes = [ctypes.c_int]
            lib.fakeviz_exchange_device.argtypes = [ctypes.c_int]
            # Note: [fake cuda on a CUDA build without a GPU]: force only where the build's own guard exists and
            # can serve nothing (no GPU); on a CPU-only build nothing is registered to replace
            lib.fakeviz_register_cuda_guard(int(cuda_build))
            rc = lib.fakeviz_patch_primary_context() if cuda_build else lib.fakeviz_patch_cuda_hooks()
            if cuda_build and rc != 0:
                lib.fakeviz_restore_cuda_guard()
                raise RuntimeError(
                    "this CUDA build's hooks could not be made to answer without a GPU "
                    f"({'not the Itanium C++ ABI' if rc == 2 else 'their vtable is not readable'})"
                )
            why = (
                f"a CUDA build of torch {torch.__version__} that sees no GPU: fakeviz's data-less CUDA guard "
                "replaces the build's (which asks the driver), and the build's CUDA hooks say no device has a "
                "primary context"
                if cuda_build
                else f"a CPU-only build of torch {torch.__version__}: fakeviz's data-less CUDA guard and hooks"
            )
            _status = ShimStatus(mode="shim", library=str(path), device_count=int(lib.fakeviz_device_count()),
                                 reason=why, **facts)  # fmt: skip
        except Exception as exc:  # noqa: BLE001 - any failure means: no fake cuda, say why
            _status = ShimStatus(mode="unavailable", reason=str(exc), **facts)
            return _status
        _lib = lib
        if not cuda_build:
            _register_cuda_kernels()
        _status.backward_max_index = _probe_backward()
        atexit.register(drain_autograd_workers, 25)
        drain_autograd_workers()
        if _status.backward_max_index < 0:
            _status.reason += "; " + (
                "a real backward ran in this process before fakeviz was imported, so torch's autograd "
                "engine sized its device queues without cuda devices and cannot run fake backward on cuda; "
                "restart the process (kernel) and import fakeviz before running any backward"
            )
        elif _status.backward_max_index < 63:
            _status.reason += "; " + (
                "a real backward ran in this process before fakeviz was imported, so torch's autograd "
                f"engine serves fake backward only on cuda:0 .. cuda:{_status.backward_max_index}; "
                "import fakeviz before running any backward to lift this"
            )
        return _status


# Note: [CUDA kernels a CPU-only build lacks]
# An op with a CompositeImplicitAutograd kernel and a kernel per backend (``silu_backward``: CPU and CUDA) runs
# its composite on a backend without a kernel: the dispatcher fills that backend's Autograd key with it. A
# CPU-only build has no CUDA kernels, so a fake cuda ``silu_backward`` (the backward of every Llama/Mistral/Qwen
# MLP) was decomposed above the fake mode into ``sigmoid, empty_like, fill_, sub_, mul, add, mul, mul`` (the
# composite's ``1 - sigmoid`` is ``empty_like(...).fill_(1).sub_(...)``), where a GPU logs one
# ``silu_backward`` (H100, tests/fixtures/h100_time_holdout.json.gz). On a CPU-only build the shim registers a
# CUDA kernel for each such op that a CUDA build has (checked on the 2.11, 2.12, 2.14 CUDA wheels), so autograd
# redispatches the op to the fake mode, which runs its meta kernel. The kernel itself never runs on fake
# tensors (the Python key comes first); a real cuda tensor cannot exist on a CPU-only build, and if one came it
# would raise. ``native_channel_shuffle`` is the third op of that kind on a CPU-only build; a CUDA build has no
# CUDA kernel for it either (its composite runs on a GPU too), so it is left alone.
_CUDA_KERNELS_OF_CUDA_BUILDS = ("silu_backward", "mish_backward")
_cuda_kernels: list[Any] = []  # the torch.library.Library that holds them (kept for the process)


def _register_cuda_kernels() -> None:
    """Note: [CUDA kernels a CPU-only build lacks] (on a CPU-only build, once, with the shim)."""
    if _cuda_kernels:
        return
    lib = torch.library.Library("aten", "IMPL")  # kernels of aten ops for one more dispatch key

    def no_cuda(name: str) -> Any:
        def kernel(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError(f"aten::{name}: a CPU-only build of torch has no CUDA kernel to run")

        return kernel

    for name in _CUDA_KERNELS_OF_CUDA_BUILDS:
        if not torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{name}", "CUDA"):
            lib.impl(name, no_cuda(name), "CUDA")
    _cuda_kernels.append(lib)


def current_device() -> int:
    """The calling thread's current fake cuda device (the shim's device guard); 0 without the shim."""
    return _lib.fakeviz_current_device() if _lib is not None else 0


def exchange_device(index: int) -> int:
    """Make ``index`` the calling thread's current fake cuda device (a negative index only reads); the old one."""
    return _lib.fakeviz_exchange_device(index) if _lib is not None else 0


def warn_if_unavailable(device: str | torch.device | None) -> None:
    """One clear warning when a cuda device is asked for but cannot be faked."""
    global _warned
    if device is None or _warned:
        return
    if torch.device(device).type == "cuda" and not _status.cuda_ok:
        _warned = True
        warnings.warn(
            "fakeviz: fake cuda devices are unavailable in this process "
            f"({_status.reason or _status.mode}); fake tensors can only use cpu and meta. "
            "Install a C++ compiler (g++) so fakeviz can build its small fake-cuda shim.",
            FakeVizWarning,
            stacklevel=3,
        )
