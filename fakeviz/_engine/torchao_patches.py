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
"""

from __future__ import annotations

import functools
import importlib
import importlib.abc
import sys
from typing import Any

import torch

from . import patches as _patches

__all__ = ["SM_CHECKS", "install_hop_rules", "session_patches"]

#: torchao's capability checks and the capability each needs.
SM_CHECKS = {"is_sm_at_least_89": (8, 9), "is_sm_at_least_90": (9, 0), "is_sm_at_least_100": (10, 0)}
_UTILS = "torchao.utils"


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
            if d.get(name) is fn:
                _TOKENS.append(_patches.push(mod, name, new[name], entry="torchao-sm-checks"))


class _OnUtils(importlib.abc.MetaPathFinder):
    """Patch ``torchao.utils`` once it has run (torchao imported during a fake session)."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != _UTILS:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        exec_module = getattr(spec.loader, "exec_module", None)
        if exec_module is None:
            return spec

        def run(module: Any) -> None:
            exec_module(module)
            if _FINDER:  # the session is still open
                _patch(module)

        spec.loader.exec_module = run  # this spec's own loader instance
        return spec


def session_patches(on: bool) -> None:
    """Note: [torchao on fake GPUs]: called when the first fake session starts (``on``) and the last one ends. Only
    on a build without CUDA (the shim), where ``torch.version.cuda`` is None."""
    if torch.version.cuda or torch.version.hip:
        return
    if on:
        utils = sys.modules.get(_UTILS)
        if utils is not None:
            _patch(utils)
        elif not _FINDER:
            finder = _OnUtils()
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
