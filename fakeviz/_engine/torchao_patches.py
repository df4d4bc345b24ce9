"""torchao under fake tensors: what fakeviz changes so that torchao's quantized weights run in a fake session as
they run on the GPU the session answers as.

Note: [torchao on fake GPUs]
torchao picks its kernels by the device: ``Float8DynamicActivationFloat8WeightConfig`` asserts
``is_sm_at_least_89()``, and ``Float8Tensor`` picks ``torch._scaled_mm`` (sm89+) by ``is_sm_at_least_89/90/100``.
Each of these asks ``torch.cuda.is_available() and torch.version.cuda and torch.cuda.get_device_capability() >=
...``. In a fake cuda session on the shim (a CPU-only build, Note: [torch.cuda on fake GPUs]) ``torch.cuda`` answers
as the named GPU (an H100 by default: capability 9.0), but ``torch.version.cuda`` is the build's own ``None``: fp8
was refused on a fake H100. While a session answers as a GPU on the shim, torchao's checks
(``torchao.utils.is_sm_at_least_89/90/100``, also where a torchao module imported them by name) answer by the fake
GPU's capability; in any other thread or session, and on a CUDA build, they are torchao's own. ``torch.version.cuda``
itself stays ``None`` (fakeviz's own code reads it as the build's, ``moe.py``). torchao imported inside the session
is patched when ``torchao.utils`` has run (a ``sys.meta_path`` finder while the session lasts).

Note: [out_dtype under the recording mode]
torchao's int8 matmul on CUDA (``Int8DynamicActivationInt8WeightConfig``: ``torch._int_mm`` through the
higher-order op ``out_dtype``) finds the op's rule for the current dispatch mode by the mode's exact type
(``python_key_table[type(mode)]``, Note: [higher-order ops under the recording mode] in ``export.py``): the
FakeTensorMode rule did not apply to fakeviz's subclass of it ("no rule registered for HigherOrderOperator
out_dtype"). fakeviz's mode class gets a rule that runs the op's dense kernel (``out_dtype_dense``: ``torch._int_mm``
for int8 inputs) in the mode, so the record holds the ops a real GPU run records (import scope; no other mode
class sees a change).

Note: [torchao optimizers in a record]
torchao's ``AdamW8bit`` / ``AdamW4bit`` / ``AdamWFp8`` keep their state as tensor subclasses (``OptimState8bit``:
int8 codes + one fp32 scale per block of 256 (``block_size``); ``OptimState4bit``: packed 4-bit codes + scales per
block of 128; ``OptimStateFp8``: fp8 codes + scales), and step each parameter with
``torch.compile(single_param_adam, fullgraph=True)``. Dynamo refuses to compile under a dispatch mode (the
recorder's, real or fake: "non-infra torch dispatch mode present"), so inside a session ``torch.compile`` gives
torchao's optimizer functions back uncompiled (any other function goes to torch's own): the step runs eagerly, op
by op, in the fake run and in its real CPU twin alike. The state's storages are torchao's own; on a GPU the step is
one fused kernel per parameter, whose temporaries the eager ops over-count (an assumption in ``fidelity()``).
"""

from __future__ import annotations

import functools
import importlib
import importlib.abc
import inspect
import sys
from typing import Any

import torch

from . import patches as _patches

__all__ = ["EAGER_STEP", "KERNEL_ASSUMPTIONS", "SM_CHECKS", "install_hop_rules", "op_assumption", "session_patches"]

#: torchao's capability checks and the capability each needs.
SM_CHECKS = {"is_sm_at_least_89": (8, 9), "is_sm_at_least_90": (9, 0), "is_sm_at_least_100": (10, 0)}
_UTILS = "torchao.utils"


#: What a record of torchao's CUDA-only kernels rests on (``fidelity()["assumptions"]``, one row per op).
KERNEL_ASSUMPTIONS = {
    "aten._convert_weight_to_int4pack.default": (
        "CUDA-only kernel (tinygemm's int4 packing: torchao Int4WeightOnlyConfig, tile_packed_to_4d): recorded "
        "through its meta rule, the CUDA kernel's output shape and dtype (int32 [n/8, k/128, 32, 4]); not compared "
        "with a GPU run here"
    ),
    "aten._weight_int4pack_mm.default": (
        "CUDA-only kernel (tinygemm's int4 matmul): recorded through its meta rule (the kernel's output shape and "
        "dtype; memory the kernel may allocate inside it is not counted); not compared with a GPU run here"
    ),
    "aten._scaled_mm.default": (
        "fp8 matmul (torch._scaled_mm: torchao's Float8Tensor on sm89+, chosen by the capability of the GPU the "
        "record answers as): recorded through its meta rule (cuBLASLt's output; its workspace is not counted)"
    ),
}


def op_assumption(op: str) -> str | None:
    """The assumption a record of op ``op`` (its name, ``aten._weight_int4pack_mm.default``) rests on, if any."""
    return KERNEL_ASSUMPTIONS.get(op)


def install_hop_rules(mode_cls: type) -> None:
    """Give ``mode_cls`` (a fakeviz subclass of FakeTensorMode) a rule for ``out_dtype``: Note: [out_dtype under
    the recording mode]. Once per class, for the process."""
    try:  # the module (the package's own name out_dtype is the operator)
        _od = importlib.import_module("torch._higher_order_ops.out_dtype")
    except ImportError:  # a torch without the op: nothing uses it
        return
    hop, dense = getattr(_od, "out_dtype", None), getattr(_od, "out_dtype_dense", None)
    if hop is None or dense is None or mode_cls in hop.python_key_table:
        return

    def rule(mode: Any, op: Any, output_dtype: Any, *args: Any) -> Any:
        # what the op's dense kernel does on a GPU (torch._int_mm for an int8 matmul, else the op then a cast),
        # run in the mode: each op is recorded as the real run records it
        with mode:
            return dense(op, output_dtype, *args)

    _patches.push_item(hop.python_key_table, mode_cls, rule, entry="torchao-out-dtype")


def _gpu_capability() -> tuple[int, int] | None:
    """The capability of the fake GPU the calling thread's session answers as on the shim, else None."""
    if torch.version.cuda or torch.version.hip:
        return None  # a CUDA build: torchao's own check reads the build's version
    from .cuda_api.stack import active

    s = active()
    if s is None:
        return None
    return (int(s.props.major), int(s.props.minor))


def _check(original: Any, need: tuple[int, int]) -> Any:
    @functools.wraps(original)
    def check(*args: Any, **kwargs: Any) -> Any:  # Note: [torchao on fake GPUs]
        cap = _gpu_capability()
        if cap is None:
            return original(*args, **kwargs)
        return cap >= need

    check._fakeviz_sm = True  # type: ignore[attr-defined]
    return check


_TOKENS: list[int] = []
_FINDER: list[Any] = []


def _patch(utils: Any) -> None:
    """Replace torchao's checks in ``torchao.utils`` and wherever a loaded torchao module bound them by name."""
    originals = {name: getattr(utils, name, None) for name in SM_CHECKS}
    originals = {k: v for k, v in originals.items() if callable(v) and not getattr(v, "_fakeviz_sm", False)}
    if not originals:
        return
    new = {name: _check(fn, SM_CHECKS[name]) for name, fn in originals.items()}
    for mod_name, mod in list(sys.modules.items()):
        if mod is None or not (mod_name == "torchao" or mod_name.startswith("torchao.")):
            continue
        d = getattr(mod, "__dict__", {})
        for name, fn in originals.items():
            v = d.get(name)
            # a module imported during an earlier session bound that session's change (a registry dispatcher that
            # now answers as torchao's own): it is torchao's check too
            if v is fn or (callable(v) and hasattr(v, "__wrapped__") and inspect.unwrap(v) is fn):
                _TOKENS.append(_patches.push(mod, name, new[name], entry="torchao-sm-checks"))


#: What a record of torchao's low-bit optimizers assumes (Note: [torchao optimizers in a record]).
EAGER_STEP = (
    "torchao's low-bit optimizer step runs torch.compile(single_param_adam) on a GPU (one fused kernel per "
    "parameter); torch.compile cannot run under a dispatch mode, so it ran eagerly here: the state (codes and "
    "scales) is exact, the step's temporaries are eager PyTorch's (fp32 copies of the parameter, its gradient and "
    "its dequantized state, and the quantization's work: a first step rose by about 14 times the parameter's fp32 "
    "size for AdamW8bit / AdamW4bit, 7 for AdamWFp8, its new state included), an upper bound of the fused kernel's"
)


def _eager_compile(original: Any) -> Any:
    """``torch.compile`` that gives torchao's optimizer step function back as it is (Note: [torchao optimizers in a
    record]); anything else goes to torch's own."""

    @functools.wraps(original)
    def compile(model: Any = None, *args: Any, **kwargs: Any) -> Any:
        if callable(model) and str(getattr(model, "__module__", "")).startswith("torchao.optim"):
            mode = torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE)
            values = getattr(mode, "_fv_values", None)
            rec = getattr(values, "recorder", None)
            if rec is not None and not any(r[2] == EAGER_STEP for r in rec.trace.meta.get("assumptions") or ()):
                values.assume(f"{model.__module__}.{model.__name__}", EAGER_STEP)
            return model
        return original(model, *args, **kwargs)

    return compile


def _patch_if_open(module: Any) -> None:
    """``torchao.utils`` has run during a session: patch it while the session is still open."""
    if _FINDER:
        _patch(module)


def session_patches(on: bool) -> None:
    """Note: [torchao on fake GPUs], Note: [torchao optimizers in a record]: called when the first session starts
    (``on``; a real record opens one too) and the last one ends. The capability checks only on a build without CUDA
    (the shim), where ``torch.version.cuda`` is None."""
    if on:
        _TOKENS.append(_patches.push(torch, "compile", _eager_compile(torch.compile), entry="torchao-eager-step"))
    if torch.version.cuda or torch.version.hip:
        if not on:
            while _TOKENS:
                _patches.pop(_TOKENS.pop())
        return
    if on:
        utils = sys.modules.get(_UTILS)
        if utils is not None:
            _patch(utils)
        elif not _FINDER:
            finder = _patches.OnImport(_UTILS, _patch_if_open)
            _FINDER.append(finder)
            _TOKENS.append(_patches.push_call(lambda: sys.meta_path.insert(0, finder),
                                              lambda: _remove_finder(finder), entry="torchao-sm-checks"))  # fmt: skip
    else:
        while _TOKENS:
            _patches.pop(_TOKENS.pop())
        _FINDER.clear()


def _remove_finder(finder: Any) -> None:
    if finder in sys.meta_path:
        sys.meta_path.remove(finder)
