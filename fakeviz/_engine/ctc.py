"""cuDNN's CTC loss under fake tensors: fake rules for ``aten._use_cudnn_ctc_loss`` and ``aten._cudnn_ctc_loss``.

Note: [cuDNN CTC under fake tensors]
``F.ctc_loss`` on a CUDA tensor first asks ``aten._use_cudnn_ctc_loss`` whether cuDNN's kernel may run
(``ATen/native/LossCTC.cpp``: ``ctc_loss_impl``), then calls ``_cudnn_ctc_loss`` or the native ``_ctc_loss``.
Neither cuDNN op has a meta kernel, a decomposition or a fake impl in torch, and both are registered for the
CUDA key only: FakeTensorMode's fallback runs the real kernel on zero-filled tensors of the fake device, which a
CPU-only build cannot do (a CUDA build would run it on the GPU, with the lengths' values all zero). So a model
with a CTC head (Wav2Vec2ForCTC, HuBERT, ...) stopped on fake ``cuda:0``.

The rules below are what the C++ kernels of a CUDA build with cuDNN (every CUDA wheel of torch) answer,
``aten/src/ATen/native/cudnn/LossCTC.cpp``:

* ``_use_cudnn_ctc_loss.Tensor`` (lengths as tensors; what a fake run calls, since ``ctc_loss`` takes its
  composite path for tensor subclasses): True exactly when cuDNN is enabled (``torch.backends.cudnn.enabled``),
  ``blank == 0``, ``targets`` is 1-D, contiguous, int32, ``log_probs`` is 3-D float32 on cuda, and both length
  tensors are int32; and then, read back on the host, every target length is below 256 and at most its input
  length. The lengths' values are read where the run knows them (Note: [values under fake tensors]); where it
  does not, the rule assumes valid lengths (below 256, within the input) and says so in ``fidelity()``.
* ``_use_cudnn_ctc_loss.default`` (lengths as int lists; a real run's call): the same static conditions with
  ``targets`` on the cpu and not the length dtypes, then every input length equal to ``log_probs.size(0)``
  and every target length below 256 and within its input.
* ``_use_miopen_ctc_loss`` (both overloads, asked next on every CUDA tensor): False, as on every CUDA build
  (MIOpen is ROCm's; fakeviz's GPUs answer as a CUDA build, AMD names included). Torch 2.10 has no such op
  (its ctc_loss does not ask): the rule is installed only where the op exists (Note: [torch versions]).
* ``_cudnn_ctc_loss`` (both overloads): the kernel's checks and messages, and its outputs: the costs ``[B]``
  and the gradient, a contiguous tensor of ``log_probs``' shape (``empty_like`` with the legacy contiguous
  format), both float32 on the GPU. cuDNN also allocates a workspace whose size only cuDNN knows, and the
  ``.Tensor`` overload copies cpu targets to the GPU: both are temporaries inside the kernel, not in the record
  (listed in ``fidelity()`` as an assumption).

* ``_ctc_loss_backward`` (both overloads; torch has a meta kernel for neither, and the ``.Tensor`` overload
  reads the lengths on the host): the native kernels' output, ``full_like(log_probs)`` in the legacy contiguous
  format (CPU ``ctc_loss_backward_cpu_template``, CUDA ``ctc_loss_backward_gpu_template``), after the checks
  that do not read values. Without it the fallback ran the real kernel on zeros: on the cpu, a kernel call
  per step; on fake cuda, nothing a CPU-only build can run.

``F.ctc_loss`` with the lengths as Python lists and ``reduction="mean"`` cannot run under any FakeTensorMode:
torch's C++ ``ctc_loss_impl`` divides by ``at::tensor(target_lengths, options)``, which is an ``empty`` whose
data it then fills with a raw copy (``tensor_cpu``: ``std::copy`` into ``data_ptr``), and a fake tensor has no
data. While a fake session is active (Note: [session patches]) ``torch.ctc_loss`` does, for that one case, the
same ops in Python (:func:`ctc_loss`): the unreduced loss (``reduction="none"``, of ``log_probs.unsqueeze(1)``
for an unbatched input, as the C++ does), then ``aten.empty.memory_format`` on the cpu given the lengths as its
known value (and ``_to_copy`` to the loss's device off the cpu, as ``tensor_backend`` does), ``clamp_min(1)``,
``div`` and ``mean``: the op log of a real run, op for op.

A Wav2Vec2 head passes int64 targets (``labels.masked_select``) and int64 lengths, so its answer is False and
the native ``_ctc_loss`` runs, as on a real GPU. The rules apply only to fakeviz's fake modes
(:func:`fakeviz._engine.moe.adopted`); for any other FakeTensorMode the previous entry (none) is kept.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch._subclasses.fake_tensor import in_kernel_invocation_manager

from . import patches as _patches
from . import torch_compat
from .moe import adopted
from .value_reads import known_value

__all__ = ["FAKE_RULE_OPS", "ctc_loss", "ctc_loss_outputs", "use_cudnn_ctc_loss"]

#: The ops with a fake rule of this module (``fidelity()`` reports their rule as ``"fakeviz rule"``): those of
#: the eight this torch has (``_use_miopen_ctc_loss``: torch >= 2.11; Note: [torch versions]).
FAKE_RULE_OPS: frozenset[str] = frozenset(
    name
    for name in (
        "aten._use_cudnn_ctc_loss.default",
        "aten._use_cudnn_ctc_loss.Tensor",
        "aten._cudnn_ctc_loss.default",
        "aten._cudnn_ctc_loss.Tensor",
        "aten._use_miopen_ctc_loss.default",
        "aten._use_miopen_ctc_loss.Tensor",
        "aten._ctc_loss_backward.default",
        "aten._ctc_loss_backward.Tensor",
    )
    if torch_compat.op_or_none(name) is not None
)

_VALID_LENGTHS = (
    "cuDNN CTC loss: target lengths unknown, assumed valid for cuDNN (each below 256 and at most its input "
    "length), so cuDNN's kernel runs, as it does on a real GPU for such lengths"
)
_INSIDE_KERNEL = (
    "cuDNN CTC loss: cuDNN's workspace (a size only cuDNN knows) and the copy of the targets to the GPU are "
    "allocated inside the kernel and freed there: not in the record"
)


def _static(log_probs: Any, targets: Any, blank: int) -> bool:
    """The conditions both overloads check first (cuDNN enabled, blank 0, 1-D contiguous int32 targets, 3-D
    float32 log_probs on cuda); the ``.Tensor`` one adds int32 lengths, the int-list one cpu targets."""
    return bool(
        torch.backends.cudnn.enabled
        and blank == 0
        and targets.dim() == 1
        and log_probs.dtype == torch.float32
        and targets.dtype == torch.int32
        and log_probs.device.type == "cuda"
        and targets.is_contiguous()
        and log_probs.dim() == 3
    )


def _lengths_fit(il: list[int], tl: list[int]) -> bool:
    """Every target length below 256 and at most its input length (both overloads, read on the host)."""
    return all(b < len(il) and tl[b] < 256 and tl[b] <= il[b] for b in range(len(tl)))


def use_cudnn_ctc_loss(
    log_probs: Any, targets: Any, input_lengths: Any, target_lengths: Any, blank: int
) -> bool | None:
    """What a CUDA build with cuDNN answers for ``_use_cudnn_ctc_loss`` (either overload), from metadata and
    the lengths' values; None when the answer depends on length values that are not known."""
    if not _static(log_probs, targets, blank):
        return False
    if isinstance(input_lengths, torch.Tensor):  # the .Tensor overload
        if input_lengths.dtype != torch.int32 or target_lengths.dtype != torch.int32:
            return False
        il, tl = known_value(input_lengths), known_value(target_lengths)
        if il is None or tl is None:
            return None
        return _lengths_fit(il.reshape(-1).tolist(), tl.reshape(-1).tolist())
    if targets.device.type != "cpu":
        return False
    t_max = log_probs.size(0)
    if any(int(n) != t_max for n in input_lengths):
        return False
    return _lengths_fit([int(n) for n in input_lengths], [int(n) for n in target_lengths])


def _ours(rule: Callable[..., Any]) -> Callable[..., Any]:
    """``rule`` for fakeviz's fake modes; the entry it replaced (or ``NotImplemented``) for any other."""

    def apply(mode: Any, func: Any, *args: Any, **kwargs: Any) -> Any:
        if not adopted(mode):
            prev = _PREVIOUS.get(func)
            return prev(mode, func, *args, **kwargs) if prev is not None else NotImplemented
        return rule(mode, func, *args, **kwargs)

    return apply


def _bind(names: tuple[str, ...], args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    bound = dict(zip(names, args))
    bound.update(kwargs)
    return bound


def _note(mode: Any, func: Any, text: str) -> None:
    values = getattr(mode, "_fv_values", None)
    if values is not None:
        values.assume(func, text)


@_ours
def _use_rule(mode: Any, func: Any, *args: Any, **kwargs: Any) -> Any:
    names = ("log_probs", "targets", "input_lengths", "target_lengths", "blank")
    bound = _bind(names, args, kwargs)
    answer = use_cudnn_ctc_loss(*(bound[n] for n in names))
    if answer is None:
        _note(mode, func, _VALID_LENGTHS)
        answer = True
    return answer


@_ours
def _miopen_rule(mode: Any, func: Any, *args: Any, **kwargs: Any) -> Any:
    return False


def _check(cond: bool, message: str) -> None:
    if not cond:
        raise RuntimeError(message)


@_ours
def _cudnn_rule(mode: Any, func: Any, *args: Any, **kwargs: Any) -> Any:
    names = ("log_probs", "targets", "input_lengths", "target_lengths", "blank", "deterministic", "zero_infinity")
    bound = _bind(names, args, kwargs)
    log_probs, targets = bound["log_probs"], bound["targets"]
    il, tl, blank = bound["input_lengths"], bound["target_lengths"], bound["blank"]
    tensor_overload = isinstance(il, torch.Tensor)
    c = "cudnn_ctc_loss"
    _check(log_probs.dim() == 3, f"Expected 3-dimensional tensor, but got {log_probs.dim()}-dimensional tensor "
                                 f"for argument #1 'log_probs' (while checking arguments for {c})")  # fmt: skip
    _check(log_probs.dtype == torch.float32, f"Expected tensor for argument #1 'log_probs' to have scalar type Float; "
                                             f"but got {log_probs.dtype} instead (while checking arguments for {c})")  # fmt: skip
    _check(targets.dim() == 1, f"Expected 1-dimensional tensor, but got {targets.dim()}-dimensional tensor for "
                               f"argument #2 'targets' (while checking arguments for {c})")  # fmt: skip
    _check(targets.dtype == torch.int32, f"Expected tensor for argument #2 'targets' to have scalar type Int; but got "
                                         f"{targets.dtype} instead (while checking arguments for {c})")  # fmt: skip
    _check(targets.is_contiguous(), f"Expected contiguous tensor, but got non-contiguous tensor for argument #2 "
                                    f"'targets' (while checking arguments for {c})")  # fmt: skip
    _check(log_probs.device.type == "cuda", f"Expected tensor to have CUDA Backend, but got tensor with "
                                            f"{log_probs.device.type.upper()} Backend (while checking arguments for {c})")  # fmt: skip
    if not tensor_overload:
        _check(targets.device.type == "cpu", f"Expected tensor to have CPU Backend, but got tensor with "
                                             f"{targets.device.type.upper()} Backend (while checking arguments for {c})")  # fmt: skip
    batch = log_probs.size(1)
    n_il = (il.size(0) if il.dim() else 1) if tensor_overload else len(il)
    n_tl = (tl.size(0) if tl.dim() else 1) if tensor_overload else len(tl)
    _check(n_il == batch, "input_lengths needs to have size to match batch_size")
    _check(n_tl == batch, "target_lengths needs to have size to match batch_size")
    _check(blank == 0, "blank must be label 0 for cudnn_ctc_loss")
    _note(mode, func, _INSIDE_KERNEL)
    with in_kernel_invocation_manager(mode):
        costs = torch.empty((batch,), dtype=log_probs.dtype, device="meta")
        grad = torch.empty(tuple(log_probs.shape), dtype=log_probs.dtype, device="meta")
    conv = mode.fake_tensor_converter
    dev = log_probs.device
    return conv.from_meta_and_device(mode, costs, dev), conv.from_meta_and_device(mode, grad, dev)


@_ours
def _ctc_backward_rule(mode: Any, func: Any, *args: Any, **kwargs: Any) -> Any:
    names = ("grad", "log_probs", "targets", "input_lengths", "target_lengths", "neg_log_likelihood", "log_alpha")
    bound = _bind(names, args, kwargs)
    log_probs, il, tl = bound["log_probs"], bound["input_lengths"], bound["target_lengths"]
    if isinstance(il, torch.Tensor):
        _check(not il.dtype.is_floating_point and not il.dtype.is_complex and il.dtype != torch.bool,
               "input_lengths must be integral")  # fmt: skip
        _check(not tl.dtype.is_floating_point and not tl.dtype.is_complex and tl.dtype != torch.bool,
               "target_lengths must be integral")  # fmt: skip
    _check(log_probs.dtype in (torch.float32, torch.float64) or log_probs.device.type == "cuda",
           f'"ctc_loss_backward_cpu" not implemented for \'{_C10.get(log_probs.dtype, log_probs.dtype)}\'')  # fmt: skip
    with in_kernel_invocation_manager(mode):
        grad = torch.empty(tuple(log_probs.shape), dtype=log_probs.dtype, device="meta")
    return mode.fake_tensor_converter.from_meta_and_device(mode, grad, log_probs.device)


_original_ctc_loss = torch.ctc_loss
_MEAN = 1  # at::Reduction::Mean


def _fake_active(*tensors: Any) -> Any:
    """The fakeviz fake mode in effect for ``tensors`` (the active one, or theirs), or None."""
    from torch._subclasses.fake_tensor import FakeTensor

    mode = torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE)
    if mode is None:
        mode = next((t.fake_mode for t in tensors if isinstance(t, FakeTensor)), None)
    return mode if mode is not None and adopted(mode) else None


def ctc_loss(log_probs: Any, targets: Any, input_lengths: Any, target_lengths: Any, blank: int = 0,
             reduction: int = _MEAN, zero_infinity: bool = False) -> Any:  # fmt: skip
    """``torch.ctc_loss`` while a fake session is active: see Note: [cuDNN CTC under fake tensors]."""
    mode = _fake_active(log_probs, targets)
    if (
        mode is None
        or reduction != _MEAN
        or isinstance(target_lengths, torch.Tensor)
        or not isinstance(log_probs, torch.Tensor)
        or log_probs.dim() not in (2, 3)
    ):
        return _original_ctc_loss(log_probs, targets, input_lengths, target_lengths, blank, reduction, zero_infinity)
    if log_probs.dim() == 2:
        log_probs = log_probs.unsqueeze(1)
    res = _original_ctc_loss(log_probs, targets, input_lengths, target_lengths, blank, 0, zero_infinity)
    lengths = [int(n) for n in target_lengths]
    tl = torch.ops.aten.empty.memory_format([len(lengths)], dtype=res.dtype, layout=torch.strided, device="cpu")
    values = getattr(mode, "_fv_values", None)
    if values is not None:
        from torch.utils._mode_utils import no_dispatch

        with no_dispatch():
            real = torch.tensor(lengths, dtype=res.dtype, device="cpu")
        values.give(tl, real)
    if res.device.type != "cpu":
        tl = tl.to(res.device)
    return (res / tl.clamp_min(1)).mean()


def patch_ctc_loss(on: bool) -> None:
    """Install (or remove) :func:`ctc_loss` as ``torch.ctc_loss`` (Note: [session patches])."""
    global _ctc_token
    if on and _ctc_token is None:
        _ctc_token = _patches.push(torch, "ctc_loss", ctc_loss, entry="ctc-loss")
    elif not on and _ctc_token is not None:
        _patches.pop(_ctc_token)
        _ctc_token = None


_ctc_token: int | None = None


_C10 = {torch.float16: "Half", torch.bfloat16: "BFloat16"}

_PREVIOUS: dict[Any, Callable[..., Any] | None] = {}


def _install() -> None:
    rules = {
        "_use_cudnn_ctc_loss": _use_rule,
        "_cudnn_ctc_loss": _cudnn_rule,
        "_use_miopen_ctc_loss": _miopen_rule,
        "_ctc_loss_backward": _ctc_backward_rule,
    }
    for name in sorted(FAKE_RULE_OPS):
        _patches.install_fake_rule(torch_compat.op_or_none(name), rules[name.split(".")[1]], _PREVIOUS)


_install()


def ctc_loss_outputs(mode: Any, args: Any, kwargs: Any, assume: Callable[[str], None]) -> tuple[Any, Any]:
    """``_ctc_loss.Tensor``'s outputs where torch's fake rule needs the lengths' values: ``neg_log_likelihood``
    ``[B]`` and ``log_alpha`` ``[B, T, 2 * max(target_lengths) + 1]``, exact when the target lengths are known
    (Note: [values under fake tensors]), else sized by the stated assumption of equal lengths."""
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.utils._mode_utils import no_dispatch

    log_probs, targets = args[0], args[1]
    lengths = args[3] if len(args) > 3 else (kwargs or {}).get("target_lengths")
    b = log_probs.shape[1] if log_probs.dim() == 3 else 1
    known = lengths.constant if isinstance(lengths, FakeTensor) else None
    if known is not None:  # the kernel's max_target_length: exact
        with no_dispatch():
            longest = int(known.max()) if known.numel() else 0
    else:
        longest = targets.shape[1] if targets.dim() == 2 else -(-targets.shape[0] // max(b, 1))
        assume(f"ctc_loss: target lengths unknown, assumed equal: the longest is {longest} (the targets split "
               "evenly over the batch), which sizes log_alpha")  # fmt: skip
    dev = log_probs.fake_device
    nll = torch.empty((b,) if log_probs.dim() == 3 else (), dtype=log_probs.dtype, device="meta")
    alpha = torch.empty((b, log_probs.shape[0], 2 * longest + 1), dtype=log_probs.dtype, device="meta")
    return FakeTensor(mode, nll, dev), FakeTensor(mode, alpha, dev)
