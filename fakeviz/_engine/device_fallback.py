"""Ops without a fake rule on a fake accelerator: run as on fake cpu, or fail as a real GPU would.

Note: [fallback kernels on fake devices]
FakeTensorMode runs an op that has no meta kernel (``geqrf``, ``histogram``) by running its real kernel on zero-filled
tensors on its inputs' devices (Note: [fallback kernels] in :mod:`fakeviz._engine.recorder.modes`). On a fake cuda
device there is none: the zeros cannot be made, and torch says ``Could not run 'aten::empty_strided' with arguments
from the 'CUDA' backend``, where the same op on fake cpu runs. A fake run then asks whether PyTorch has a kernel for
the op on that device type (:func:`has_kernel`):

* yes (``geqrf``: CPU and CUDA): the op runs as on fake cpu (fake twins of its inputs on cpu, with their values when
  known; FakeTensorMode's fallback on the CPU kernel), and its outputs are placed on the fake device. Their shapes
  and dtypes are the CPU kernel's, as on fake cpu; the op stays listed as a fallback kernel in ``fidelity()``;
* no (``histogram``, ``histogramdd``: CPU and MPS only): a real run on the GPU fails there too, and so does the fake
  one: a ``NotImplementedError`` naming the op and the devices it has kernels for (the recorder adds the user's
  line);
* an op that writes or returns a view of an input cannot be run on twins: it fails naming the op.

An op of torch's that has a meta kernel but no kernel for the device runs under FakeTensorMode where the real run
fails (torch 2.15 gives ``_histogramdd_bin_edges`` and ``_histogramdd_from_bin_cts`` meta kernels; their kernels are
still CPU and MPS only). :func:`check_kernel`, called after every op that succeeded, refuses it the same way: for an
``aten`` op PyTorch says which devices have kernels (another library's ops may register their CUDA kernels only when
a GPU is there, so theirs are not judged). The answer is kept per op: a dictionary lookup for every other op.

Which devices have a kernel: the dispatcher's registrations (a CUDA build registers its CUDA kernels, every build its
composite ones); on a CPU-only build, which registers no CUDA kernel, the op's ``dispatch:`` entry in the
``native_functions.yaml`` that torch ships in ``torchgen/packaged``; an op found in neither is run as on cpu.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor

from .sparse import stand_in
from .value_args import flat
from .value_reads import known_value

__all__ = ["NOT_RETRIED", "check_kernel", "has_kernel", "kernel_keys", "retry"]

#: What :func:`retry` returns for a failure it does not handle: the caller re-raises it.
NOT_RETRIED = object()

# dispatch keys whose kernel serves every device
_COMPOSITE = {"CompositeImplicitAutograd", "CompositeExplicitAutograd", "CompositeExplicitAutogradNonFunctional"}
_YAML = Path(torch.__file__).resolve().parent.parent / "torchgen" / "packaged" / "ATen" / "native"
_YAML = _YAML / "native_functions.yaml"


def retry(values: Any, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
    """``func`` on a fake accelerator after FakeTensorMode's fallback kernel failed there: Note: [fallback kernels on
    fake devices]. :data:`NOT_RETRIED` for any other failure, which the caller re-raises (raising the caller's
    exception here would make a reference cycle, exception -> traceback -> this frame -> exception, that keeps every
    frame up the stack, and the tensors in them, alive until the garbage collector runs)."""
    device = _accelerator(args, kwargs)
    if device is None or not isinstance(func, torch._ops.OpOverload) or not _fallback_failed(values, func):
        return NOT_RETRIED
    has = has_kernel(func, device.type)
    if has is False:
        raise _without_kernel(func, device) from None
    if values.written(func, args, kwargs) or any(r.alias_info is not None for r in func._schema.returns):
        raise NotImplementedError(
            f"{func} has no fake rule, and on {device} the real kernel it falls back to needs a real GPU "
            "(an op that writes or views an input cannot run on cpu twins)"
        ) from None
    seen = _fallback_runs(values)
    n = len(seen) if seen is not None else 0
    if any(isinstance(t, FakeTensor) and t.layout != torch.strided for t in flat(args, [])):
        # a sparse input: the op runs on cpu stand-ins (Note: [sparse results under fake tensors])
        out = stand_in(values, func, args, kwargs, None, device)
        return NOT_RETRIED if out is None else out
    cpu_args, cpu_kwargs = _on_cpu(values, args), {k: _on_cpu(values, v) for k, v in (kwargs or {}).items()}
    if _accelerator(cpu_args, cpu_kwargs) is not None:
        return NOT_RETRIED  # a fake tensor with no cpu twin
    out = values.dispatch(func, types, cpu_args, cpu_kwargs)
    if seen is not None:
        del seen[n:]  # one fallback run for the op (the cpu one repeats the failed one's entry)
    for o in flat(out, []):
        if isinstance(o, FakeTensor):
            o.fake_device = device
    return out


def _without_kernel(func: Any, device: torch.device) -> NotImplementedError:
    keys = ", ".join(kernel_keys(func) or ())
    return NotImplementedError(
        f"{func} has no {device.type.upper()} kernel in PyTorch (only {keys}): a real run on {device} fails here "
        f"too. Run it on a cpu tensor (.cpu())."
    )


_LACKS_CUDA: dict[Any, bool] = {}  # op -> whether it is torch's and PyTorch has no CUDA kernel for it


def check_kernel(func: Any, args: Any, kwargs: Any) -> None:
    """Refuse ``func``, which ran on fake tensors, when an argument is on a fake cuda device and PyTorch has no CUDA
    kernel for this op of torch's (a meta kernel let it run): Note: [fallback kernels on fake devices]."""
    lacks = _LACKS_CUDA.get(func)
    if lacks is None:
        lacks = _LACKS_CUDA[func] = (
            isinstance(func, torch._ops.OpOverload) and func.namespace == "aten" and has_kernel(func, "cuda") is False
        )
    if lacks:
        device = _accelerator(args, kwargs)
        if device is not None and device.type == "cuda":
            raise _without_kernel(func, device) from None


def _accelerator(args: Any, kwargs: Any) -> torch.device | None:
    """The device of the first fake tensor argument that is not on cpu or meta, or None."""
    for t in flat(args, []) + flat(list((kwargs or {}).values()), []):
        if isinstance(t, FakeTensor) and t.fake_device.type not in ("cpu", "meta"):
            return t.fake_device
    return None


def _fallback_runs(values: Any) -> list[Any] | None:
    rec = values.recorder
    return rec.trace.meta.get("fallback_kernels") if rec is not None and rec.active else None


def _fallback_failed(values: Any, func: Any) -> bool:
    """Whether the op now failing entered FakeTensorMode's fallback kernel (Note: [fallback kernels]: the recording
    lists every run, at the seq of the op not yet recorded); without a recording, whether it has no meta kernel."""
    runs = _fallback_runs(values)
    if runs is None:
        return not torch._C._dispatch_has_computed_kernel_for_dispatch_key(func.name(), "Meta")
    return bool(runs) and runs[-1] == [values.recorder.builder.num_ops(), str(func)]


def _on_cpu(values: Any, x: Any) -> Any:
    """``x`` with every fake tensor on an accelerator replaced by a fake twin on cpu (same metadata, same value)."""
    if isinstance(x, FakeTensor) and x.fake_device.type not in ("cpu", "meta") and x.layout == torch.strided:
        from torch.utils._mode_utils import no_dispatch

        with no_dispatch():
            meta = torch.empty_strided(tuple(x.shape), tuple(x.stride()), dtype=x.dtype, device="meta")
        twin = FakeTensor(values.mode, meta, torch.device("cpu"))
        value = known_value(x)
        if value is not None:
            values.give(twin, value)
        return twin
    if isinstance(x, torch.device) and x.type not in ("cpu", "meta"):
        return torch.device("cpu")
    if isinstance(x, (list, tuple)):
        return type(x)(_on_cpu(values, y) for y in x)
    return x


def has_kernel(func: Any, device_type: str) -> bool | None:
    """Whether PyTorch runs op ``func`` on ``device_type`` (``"cuda"``) for some tensor kind (dense, sparse,
    quantized), also where this build has no such kernels (Note: [fallback kernels on fake devices]); None when it
    cannot tell."""
    key = device_type.upper()
    for k in (key, "Sparse" + key, "SparseCsr" + key, "Quantized" + key, "NestedTensor" + key):
        try:
            if torch._C._dispatch_has_computed_kernel_for_dispatch_key(func.name(), k):
                return True
        except (RuntimeError, ValueError):  # no such dispatch key in this torch
            continue
    if key == "CUDA" and (torch.version.cuda or torch.version.hip):
        return False  # this build registers its CUDA kernels: there is none
    keys = kernel_keys(func)
    if keys is None:
        return None
    return not keys or any(k.endswith(key) for k in keys) or bool(_COMPOSITE & set(keys))


def kernel_keys(func: Any) -> tuple[str, ...] | None:
    """The dispatch keys op ``func`` has kernels for in ``native_functions.yaml`` (``()``: none named, a composite
    op), or None when the file or the op is not there."""
    name = func._schema.name.split("::", 1)[-1]
    if func._overloadname != "default":
        name += "." + func._overloadname
    return _yaml_keys().get(name)


@functools.cache
def _yaml_keys() -> dict[str, tuple[str, ...]]:
    """Every op of ``native_functions.yaml`` -> its dispatch keys (read once; ``{}`` without the file)."""
    try:
        text = _YAML.read_text(encoding="utf-8")
    except OSError:
        return {}
    out: dict[str, tuple[str, ...]] = {}
    for block in re.split(r"^- func: ", text, flags=re.M)[1:]:
        name = block.split("(", 1)[0].strip()
        keys: list[str] = []
        m = re.search(r"^  dispatch:\n((?:    .*\n?)+)", block, flags=re.M)
        if m:
            for line in m.group(1).splitlines():
                keys.extend(k.strip() for k in line.split(":", 1)[0].split(","))
        out[name] = tuple(keys)
    return out
