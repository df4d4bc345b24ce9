"""bitsandbytes under fake tensors: its own ``Params4bit`` / ``Int8Params``, ``Linear4bit`` / ``Linear8bitLt``, the
functional quantize / dequantize ops and the 8-bit optimizers, run by the library's own code on fake cpu and cuda.

Note: [bitsandbytes under fake tensors]
bitsandbytes 0.45+ registers its kernels as ``torch.library`` ops with fake kernels (``bitsandbytes::quantize_4bit``,
``gemm_4bit``, ``dequantize_4bit``, ``quantize_blockwise``, ``int8_vectorwise_quant``, ``int8_scaled_mm``,
``optimizer_update_8bit_blockwise``, ...), so its quantization, matmuls and optimizer steps already run under a
fake mode: they are recorded as the library's own ops, with the output storages the real kernels return. Three
things stop or spoil a fake run, and fakeviz answers each while a fake session is active (registry entries
``fake-param-subclass``, ``bnb-qmap``, ``bnb-paged``):

* ``Params4bit`` and ``Int8Params`` are ``nn.Parameter`` subclasses made with ``torch.Tensor._make_subclass(cls,
  data)``, which refuses a FakeTensor (its Python object already exists). For fake ``data``,
  :func:`_make_subclass` does what ``nn.Parameter(data)`` does for a tensor subclass (its unrecorded detach, Note:
  [Parameter detach] in the recorder) and gives the result a class that is both ``cls`` and ``FakeTensor``
  (:func:`fake_class`, one per class): the library's methods (``.to`` quantizes, ``quant_state``, ``CB``/``SCB``)
  run as written, and FakeTensorMode runs its ops. Two details of that class: ``Module._apply`` re-wraps a fake
  parameter as ``nn.Parameter(p)``, which needs ``p.detach()`` to keep the class (only there it does, as the
  real run's ``param.data = p`` keeps the object); and ``p.data = q`` (``_quantize`` replaces the bf16 data with
  the packed ``uint8``, possibly on another device) also takes ``q``'s fake device.
* ``quantize_blockwise`` (the double quantization of the absmax) makes bitsandbytes' 8-bit dynamic map once per
  process with ``.tolist()`` of small tensors (on the CPU: no device is named), moves it to the tensor's device and
  caches it there in the module global ``name2qmap``; made under a fake mode, a fake tensor would stay in that
  cache after the session. fakeviz puts the map, made on the real CPU, in the cache for the session (and takes it
  out after), and hands ``quantize_blockwise`` on a fake device the map on that device, copied there at the
  first call of the fake mode as a GPU process copies it at its first call (:func:`_quantize_blockwise`; a 1 KiB
  ``Other`` storage kept for the mode's life, as ``name2qmap`` keeps it for the process's). A fake cpu record is
  thus the record of a process that has quantized before; what is not recorded is the map's one-time making on
  the CPU (about 60 small CPU ops and 1 KiB of CPU temporaries in the first quantizing call of a process).
* paged optimizers (``PagedAdamW8bit``) allocate their state with ``get_paged`` as CUDA unified memory (Note:
  [paged optimizer state]).

Note: [4-bit matmul workspace on cuda]
On a GPU, ``bitsandbytes::gemm_4bit`` (every 4-bit forward: ``matmul_4bit``) runs a fused kernel for a few rows and
otherwise dequantizes the weight into a temporary ``[N, K]`` of the input's dtype (with double quantization also
two float32 absmax buffers) and calls ``F.linear``: its CUDA heuristic takes that path past 1536 rows always and on
an H100 / H200 for nearly every shape past 4 rows. Those buffers are allocated inside the op, where the op's fake
kernel (which returns the output only) cannot show them, yet they count in ``max_memory_allocated``. On fake cuda,
for more than 4 rows, :func:`_matmul_4bit` allocates them as empty tensors live across the op (freed right after,
as the kernel frees them) and lists the assumption in ``fidelity()``; up to 4 rows (decoding) nothing is added. On
fake cpu nothing is added: the CPU kernel's own temporaries are as invisible to a real CPU record as to a fake one.
Measured on an H100 (``benchmarks/qlora_gpu.py``, ``benchmarks/results/qlora_gpu_h100.json``: a QLoRA step of a
4-layer Llama-3.1-8B in NF4, LoRA r=16, activation checkpointing, AdamW8bit, batch 1): the fake step's peak is
0.995 of ``max_memory_allocated`` at 2048 tokens (8.036 GB live, 8.042 GB with the allocator model, against
8.076 GB) and 0.999 at 512 tokens (5.551 GB with the allocator model, against 5.551 GB, 2 KB apart).

Note: [LLM.int8 outliers under fake tensors]
LLM.int8 with a threshold (transformers' default 6.0) splits off the input columns holding a value above it
(``int8_vectorwise_quant``, ``int8_double_quant``) and multiplies them in fp16 (``int8_mixed_scaled_mm``): how many
depends on the activations' values, so the ops' fake kernels ask for a dynamic size, which a fake mode without a
shape environment refuses. Where the values are known (a real run's inputs and draws, Note: [values under fake
tensors]) the values layer runs them on those values, as in a real run, fake cuda included; else its
``dynamic`` hands the op to :func:`outlier_outputs`: the op's own fake kernel, whose dynamic size is 0 (no outlier
column, listed in ``fidelity()``'s assumptions), or in the mixed matmul the number of columns the quantization
split off. Each outlier column would add 8 bytes (its
index) and, in the mixed matmul, rows x 2 bytes (its fp16 slice of the input): little next to the layer.

Note: [quantized weights in the record]
A bitsandbytes weight is more than its parameter's storage: the packed 4-bit data (``uint8``, numel / 2 bytes,
``[(numel + 1) // 2, 1]``) plus its ``quant_state``: the blockwise absmax (float32, one per block of 64), its 16-value
code, and with double quantization (``compress_statistics``) the absmax as ``uint8`` with the nested absmax
(float32, one per 256 blocks), the nested 256-value code and the offset (a float32 scalar); an LLM.int8 weight is its
``int8`` data (``CB``) plus ``SCB`` (float32, one per row). The quant-state tensors are not ``nn.Parameter``s, but
they are the weight: they live as long as it does and every forward reads them. So :func:`weight_parts` lists
them with the parameter, and the recorder gives every one of their storages the parameter role (category
``Parameter``) and the parameter's name, in fake and real runs alike. Temporaries of the quantization (the
float32 absmax before double quantization, the bf16 weight) are freed by the library and stay ``Other``.

Note: [paged optimizer state]
``PagedAdamW8bit`` & co. allocate each state tensor of at least 1e5 elements with ``cudaMallocManaged`` (unified
memory): it lives on the GPU while the GPU uses it, and the driver evicts it to host memory when the GPU runs out,
instead of failing. It never goes through PyTorch's allocator, so ``torch.cuda.max_memory_allocated`` does not see
it. Under fake tensors :func:`_get_paged` makes it a fake tensor on the parameter's device (the bytes a step
touches there), marks it ``is_paged`` as bitsandbytes does, lists its storage in the record's ``meta["paged"]``
(storage ids) and says so in ``fidelity()``'s assumptions; fakeviz counts it on the GPU, in the ``Optimizer state`` category (the worst
case: every page resident), and a verdict that misses by no more than ``meta["paged"]``'s bytes may still run,
with the pages moving between host and GPU each step. Prefetching and synchronisation (ctypes calls) do nothing
on fake tensors.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import weakref
from collections.abc import Iterator
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily

from .. import patches as _patches

__all__ = ["fake_class", "import_bitsandbytes", "is_bnb_weight", "outlier_outputs", "patch", "weight_parts"]

_TENSOR_DATA = torch._C.TensorBase.data  # the C property behind ``t.data`` (get and set)
_PARAM_NEW = torch.nn.Parameter.__new__
_PARAM_NEW_CODE = _PARAM_NEW.__code__
_original_make_subclass = torch.Tensor._make_subclass
_CLASSES: dict[type, type] = {}  # cls -> its fake class
_BASES: dict[type, type] = {}  # fake class -> cls


# ------------------------------------------------------------------------------------------------ fake parameters
def fake_class(cls: type) -> type:
    """The class of a fake ``cls`` (a ``Parameter`` subclass such as ``Params4bit``): ``cls`` and ``FakeTensor`` at
    once (Note: [bitsandbytes under fake tensors])."""
    got = _CLASSES.get(cls)
    if got is not None:
        return got

    def _set_data(self: Any, value: Any) -> None:
        _TENSOR_DATA.__set__(self, value)
        if isinstance(value, FakeTensor):  # the packed data may live on another device: the object follows it
            self.fake_device = value.fake_device
            self.constant = value.constant

    def detach(self: Any) -> Any:
        out = FakeTensor.detach(self)
        if sys._getframe(1).f_code is _PARAM_NEW_CODE:  # Module._apply's nn.Parameter(p): keep the class and state
            out.__class__ = type(self)
            for k, v in self.__dict__.items():
                out.__dict__.setdefault(k, v)
        return out

    body = {"data": property(_TENSOR_DATA.__get__, _set_data), "detach": detach, "__module__": cls.__module__,
            "__qualname__": cls.__qualname__, "__doc__": cls.__doc__}  # fmt: skip
    got = _CLASSES[cls] = type(cls.__name__, (cls, FakeTensor), body)
    _BASES[got] = cls
    return got


def _make_subclass(*args: Any, **kwargs: Any) -> Any:
    """``torch.Tensor._make_subclass`` that also takes fake ``data`` for a ``Parameter`` subclass (Note:
    [bitsandbytes under fake tensors]); everything else goes to torch's own. Its signature is ``(*args,
    **kwargs)``: torch._dynamo, imported during a session, checks the function it finds against its polyfill's
    ``(cls, data, requires_grad=False, **kwargs)`` and accepts only that or a wildcard."""
    if kwargs or len(args) not in (2, 3):
        return _original_make_subclass(*args, **kwargs)
    cls, data, require_grad = (*args, False)[:3]
    if not isinstance(data, FakeTensor) or not isinstance(cls, type):
        return _original_make_subclass(cls, data, require_grad)
    base = _BASES.get(cls, cls)  # Params4bit.__torch_function__'s cls(...) of a fake weight: its own class
    if issubclass(base, FakeTensor) or not issubclass(base, torch.nn.Parameter):
        return _original_make_subclass(cls, data, require_grad)
    t = _PARAM_NEW(torch.nn.Parameter, data, require_grad)  # its detach is not recorded (Note: [Parameter detach])
    t.__dict__.pop("_is_param", None)
    t.__class__ = fake_class(base)
    return t


def import_bitsandbytes() -> Any:
    """``import bitsandbytes``, from inside a fake session too: the import runs on real tensors and with
    ``torch.cuda`` answering as the build does (on a fake GPU bitsandbytes would load its CUDA backend, which a
    CPU-only torch lacks), as the import at the top of a script does."""
    have = sys.modules.get("bitsandbytes")
    if have is not None:
        return have
    with _as_at_the_top():
        import bitsandbytes
    return bitsandbytes


@contextlib.contextmanager
def _as_at_the_top() -> Iterator[None]:
    """Real tensors, and ``torch.cuda`` answering as the build does, while bitsandbytes' package executes: what
    its import at the top of a script sees. A user's first ``import peft`` / ``import bitsandbytes`` inside a fake
    cuda block runs under this too (``patches.OnImport``), instead of failing on the CUDA backend a CPU-only torch lacks."""
    from ..cuda_api import stack

    gpu = stack.active()
    if gpu is not None:
        gpu.on = False
    try:
        with unset_fake_temporarily():
            yield
    finally:
        if gpu is not None:
            gpu.on = True


# ------------------------------------------------------------------------------------------------ weights
def is_bnb_weight(t: Any) -> bool:
    """A bitsandbytes ``Params4bit`` or ``Int8Params`` (fake or real)."""
    mod = sys.modules.get("bitsandbytes.nn.modules")
    return mod is not None and isinstance(t, (mod.Params4bit, mod.Int8Params))


def weight_parts(t: Any) -> list[Any]:
    """The tensors besides ``t`` that hold a bitsandbytes weight's memory (Note: [quantized weights in the record]):
    a 4-bit weight's quant-state tensors (absmax, code, offset, nested absmax and code), an LLM.int8 weight's
    ``SCB`` (its ``CB`` is its data); ``[]`` for any other tensor."""
    if not is_bnb_weight(t):
        return []
    d = t.__dict__
    out: list[Any] = []
    qs = d.get("quant_state")
    if qs is not None:
        out += [qs.absmax, qs.code, getattr(qs, "offset", None)]
        s2 = getattr(qs, "state2", None)
        if s2 is not None:
            out += [s2.absmax, s2.code]
    out.append(d.get("SCB"))  # its CB is its data
    seen = {id(t)}
    parts = []
    for x in out:
        if isinstance(x, torch.Tensor) and id(x) not in seen:
            seen.add(id(x))
            parts.append(x)
    return parts


# ------------------------------------------------------------------------------------------------ tolist
# Note: [tolist of known values]
# A real tensor's ``.tolist()`` reads its memory in C++ and dispatches no op; FakeTensor's reads element by element
# (an ``unbind`` and one ``_local_scalar_dense`` per element), so a fake record of code that calls it (bitsandbytes
# makes its 8-bit maps with ``.tolist()`` of small tensors, in ``create_dynamic_map``; the 8-bit optimizers call it
# at construction) held ops the real record does not. While a fake session is active, ``.tolist()`` of a fake tensor
# whose values the run knows (``FakeTensor.constant``, Note: [values under fake tensors]) answers from them without
# dispatching, as the real call does; a 0-d tensor (``.item()``, an op in the real run too) and unknown values go
# to FakeTensor's own.
_original_tolist = FakeTensor.tolist


def _tolist(self: Any) -> Any:
    c = self.__dict__.get("constant")
    if c is None or self.dim() == 0 or tuple(c.shape) != tuple(self.shape):
        return _original_tolist(self)
    return c.tolist()


# ------------------------------------------------------------------------------------------------ dynamic map
_original_quantize_blockwise: Any = None
_MAPS: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()  # fake mode -> device -> map


def _quantize_blockwise(A: Any, code: Any = None, *args: Any, **kwargs: Any) -> Any:
    """``quantize_blockwise`` of a fake tensor without a code: bitsandbytes' dynamic map on ``A``'s device, where a
    GPU process's ``name2qmap`` holds it after its first call (Note: [bitsandbytes under fake tensors])."""
    if code is None and isinstance(A, FakeTensor) and A.device.type != "cpu":
        maps = _MAPS.setdefault(A.fake_mode, {})
        code = maps.get(str(A.device))
        if code is None:
            functional = sys.modules["bitsandbytes.functional"]
            code = maps[str(A.device)] = functional.name2qmap["dynamic"].to(A.device)
    return _original_quantize_blockwise(A, code, *args, **kwargs)


# ------------------------------------------------------------------------------------------------ 4-bit matmul
_original_matmul_4bit: Any = None
_FUSED_ROWS = 4  # bitsandbytes' _GEMM_4BIT_CUSTOM_FLOOR_M: up to this many rows its fused kernel always runs


def _matmul_4bit(A: Any, B: Any, quant_state: Any, out: Any = None, bias: Any = None) -> Any:
    """``bitsandbytes.matmul_4bit`` with the CUDA kernel's dequantized-weight workspace on fake cuda (Note: [4-bit
    matmul workspace on cuda])."""
    qs = quant_state
    if not (isinstance(A, FakeTensor) and A.device.type == "cuda" and qs is not None and len(qs.shape) == 2):
        return _original_matmul_4bit(A, B, quant_state, out=out, bias=bias)
    n, k = (int(x) for x in qs.shape)
    rows = A.numel() // A.shape[-1] if A.shape[-1] else 0
    if rows <= _FUSED_ROWS or A.shape[-1] != k:
        return _original_matmul_4bit(A, B, quant_state, out=out, bias=bias)
    work = [torch.empty((n, k), dtype=A.dtype, device=A.device)]
    if qs.nested:
        work += [torch.empty(qs.absmax.shape, dtype=torch.float32, device=A.device) for _ in range(2)]
    from torch._guards import detect_fake_mode

    state = getattr(detect_fake_mode(), "_fv_state", None)
    if state is not None and state.active:
        size = sum(w.numel() * w.element_size() for w in work)
        state.note_assumption(
            "bitsandbytes.gemm_4bit.default",
            f"bitsandbytes' CUDA gemm_4bit for {rows} rows takes its dequantize + F.linear path: its {size:,}-byte "
            f"workspace (the [{n}, {k}] weight in {str(A.dtype).replace('torch.', '')}"
            + (" and two float32 absmax buffers" if qs.nested else "")
            + ") is recorded as empty tensors live across the op; the GPU's heuristic may pick its fused kernel, "
            "without it, up to 1536 rows",
        )
    try:
        return _original_matmul_4bit(A, B, quant_state, out=out, bias=bias)
    finally:
        del work


# ------------------------------------------------------------------------------------------------ outliers
_original_dynamic_size: Any = None
_OUTLIERS = threading.local()  # .count: the dynamic size the op's fake kernel gets now (None: torch's own answer)
_MIXED = "bitsandbytes::int8_mixed_scaled_mm"


def _new_dynamic_size(self: Any, *, min: int = 0, max: int | None = None) -> Any:  # noqa: A002 - torch's names
    """``FakeImplCtx.new_dynamic_size`` while :func:`outlier_outputs` runs a bitsandbytes op's fake kernel: the
    count it decided (Note: [LLM.int8 outliers under fake tensors]); torch's own answer otherwise."""
    count = getattr(_OUTLIERS, "count", None)
    if count is None:
        return _original_dynamic_size(self, min=min, max=max)
    return count


def outlier_outputs(mode: Any, func: Any, args: Any, kwargs: Any, assume: Any) -> Any:
    """The outputs of a bitsandbytes op whose size depends on values the fake run does not know (the values
    layer's ``dynamic``): its own fake kernel, with no outlier column (an assumption, said through ``assume``), or in
    the mixed matmul as many as the quantization split off; None for an op that is not bitsandbytes' (Note: [LLM.int8
    outliers under fake tensors])."""
    if func.namespace != "bitsandbytes" or _original_dynamic_size is None:
        return None
    from torch._library import simple_registry
    from torch._library.fake_impl import FakeImplCtx, set_ctx_getter

    kernel = simple_registry.singleton.find(func.name()).fake_impl.kernel
    if kernel is None:
        return None
    count = 0
    cols = args[5] if func.name() == _MIXED and len(args) > 5 else kwargs.get("outlier_cols")
    if isinstance(cols, torch.Tensor) and cols.dim() == 1:
        count = int(cols.shape[0])
    else:
        assume("LLM.int8's outlier columns (inputs at or above its threshold) assumed none: their count depends on "
               "the activations' values, which the fake run does not know")  # fmt: skip
    ctx = FakeImplCtx(mode, func)
    _OUTLIERS.count = count
    try:
        with set_ctx_getter(lambda: ctx), mode:
            return kernel(*args, **kwargs)
    finally:
        _OUTLIERS.count = None


# ------------------------------------------------------------------------------------------------ paged state
_original_get_paged: Any = None


def _get_paged(*shape: int, dtype: torch.dtype = torch.float32, device: Any = None) -> Any:
    """``bitsandbytes.functional.get_paged`` under a fake session: a fake tensor on ``device``, marked paged
    (Note: [paged optimizer state])."""
    from torch._guards import detect_fake_mode

    mode = detect_fake_mode()
    if mode is None:
        return _original_get_paged(*shape, dtype=dtype, device=device)
    device = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
    out = torch.empty(shape, dtype=dtype, device=device)
    out.is_paged = True
    out.page_deviceid = device.index
    state = getattr(mode, "_fv_state", None)
    if state is not None and state.active:
        sid = state.storage_id(out, state.builder.num_ops())
        if sid >= 0:
            state.trace.meta.setdefault("paged", []).append(int(sid))
        state.note_assumption(
            "bitsandbytes.get_paged",
            f"paged optimizer state ({out.numel() * out.element_size():,} bytes) is CUDA unified memory: counted on "
            f"{device} as resident; the driver moves it to host memory when the GPU runs out, and "
            "torch.cuda.max_memory_allocated does not count it",
        )
    return out


_original_elementwise: Any = None
_original_prefetch: Any = None


def _elementwise_func(func_name: str, A: Any, B: Any, value: Any, prefetch: bool = True) -> Any:
    """bitsandbytes' ctypes element-wise kernels on paged memory (``fill``, ``_mul``): on fake tensors the torch op
    that does the same (Note: [paged optimizer state])."""
    if not isinstance(A, FakeTensor):
        return _original_elementwise(func_name, A, B, value, prefetch)
    if func_name == "fill":
        A.fill_(value)
    elif func_name == "_mul":
        A.mul_(B)
    else:
        raise NotImplementedError(f"bitsandbytes' {func_name} on a fake tensor")
    return None


def _prefetch_tensor(A: Any, to_cpu: bool = False) -> Any:
    """``prefetch_tensor`` (moves paged pages between host and GPU): nothing to move for a fake tensor."""
    if not isinstance(A, FakeTensor):
        return _original_prefetch(A, to_cpu)
    return None


# ------------------------------------------------------------------------------------------------ the patches
_tokens: list[int] = []
_finder: Any = None


def _dynamic_map(functional: Any) -> Any:
    """bitsandbytes' 8-bit dynamic map, made on the real CPU (Note: [bitsandbytes under fake tensors])."""
    have = functional.name2qmap.get("dynamic")
    if isinstance(have, torch.Tensor) and not isinstance(have, FakeTensor) and have.device.type == "cpu":
        return have
    with unset_fake_temporarily(), torch.device("cpu"):
        return functional.create_dynamic_map()


def _install(_: Any = None) -> None:
    """Make the changes once bitsandbytes is imported (the package, its ``functional``)."""
    global _original_get_paged, _original_quantize_blockwise, _original_elementwise, _original_prefetch
    global _original_matmul_4bit
    functional = sys.modules["bitsandbytes.functional"]
    _tokens.append(_patches.push_item(functional.name2qmap, "dynamic", _dynamic_map(functional), entry="bnb-qmap"))
    _original_quantize_blockwise = _patches.original(functional, "quantize_blockwise")
    _tokens.append(_patches.push(functional, "quantize_blockwise", _quantize_blockwise, entry="bnb-qmap"))
    _original_get_paged = _patches.original(functional, "get_paged")
    _original_elementwise = _patches.original(functional, "elementwise_func")
    _original_prefetch = _patches.original(functional, "prefetch_tensor")
    _tokens.append(_patches.push(functional, "get_paged", _get_paged, entry="bnb-paged"))
    _tokens.append(_patches.push(functional, "elementwise_func", _elementwise_func, entry="bnb-paged"))
    _tokens.append(_patches.push(functional, "prefetch_tensor", _prefetch_tensor, entry="bnb-paged"))
    global _original_dynamic_size
    from torch._library.fake_impl import FakeImplCtx

    _original_dynamic_size = _patches.original(FakeImplCtx, "new_dynamic_size")
    _tokens.append(_patches.push(FakeImplCtx, "new_dynamic_size", _new_dynamic_size, entry="bnb-outliers"))
    package = sys.modules["bitsandbytes"]
    _original_matmul_4bit = _patches.original(package, "matmul_4bit")
    _tokens.append(_patches.push(package, "matmul_4bit", _matmul_4bit, entry="bnb-gemm-workspace"))


def patch(on: bool) -> None:
    """Install (``on``) or undo the session patches of Note: [bitsandbytes under fake tensors], through the registry
    (Note: [patch registry]); bitsandbytes imported during the session is patched when its ``functional`` loads."""
    global _finder
    if not on:
        if _finder is not None:
            _patches.pop(_finder)
            _finder = None
        while _tokens:
            _patches.pop(_tokens.pop())
        return
    _tokens.append(_patches.push(torch.Tensor, "_make_subclass", _make_subclass, entry="fake-param-subclass"))
    _tokens.append(_patches.push(FakeTensor, "tolist", _tolist, entry="fake-tolist"))
    package = sys.modules.get("bitsandbytes")
    if package is not None and hasattr(package, "matmul_4bit"):  # imported (not halfway through its import)
        _install()
    else:
        _finder = _patches.push_member(
            sys.meta_path, _patches.OnImport("bitsandbytes", _install, around=_as_at_the_top), entry="bnb-qmap"
        )
        # first in line: move it to the front (push_member appends)
        sys.meta_path.insert(0, sys.meta_path.pop())
