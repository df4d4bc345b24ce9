"""Sparse tensors under fake tensors: the parts that hold a sparse tensor's memory, and conversions from dense.

Note: [sparse conversions under fake tensors]
How many elements ``to_sparse()`` / ``to_sparse_csr()`` / ``_csc`` / ``_bsr`` / ``_bsc`` of a dense tensor keep
(nnz) depends on its values: torch's fake rule answers nnz 0 (no memory) whatever they are, and on a fake cuda
device it has no rule at all (the fallback kernel needs a real GPU). A fake run answers these conversions itself
(:func:`from_dense`), on any device:

* with the input's values known (Note: [values under fake tensors] in :mod:`fakeviz._engine.values`: a small
  tensor made from Python numbers, a real tensor passed in), the real kernel runs on them: nnz, the parts'
  shapes and dtypes are the real run's, exactly;
* otherwise every element is assumed nonzero, the largest the output can be (memory is never under-estimated),
  and the assumption is listed in ``fidelity()["assumptions"]``. The real kernel still runs, on an expanded
  zero tensor of the input's shape (no memory), so its argument checks and the output's layout, index dtype,
  batch, sparse and dense dimensions and block size are the real kernel's; only nnz is the assumed one.

The output carries no values (a sparse value has no storage torch can map to a fake tensor): a later read of
its data is a read of an unknown value. The recorder counts a sparse tensor's memory as its parts' (Note: [sparse
tensors in the record] in :mod:`fakeviz._engine.recorder.storages`).

Note: [sparse results under fake tensors]
torch's fake rules of ops *on* sparse tensors (``clone``, ``t``, ``mul``, ``add``, ``coalesce``, conversions
between sparse layouts) give a sparse result with nnz 0 whatever the input's nnz: no memory. A fake run runs such an
op (:func:`stand_in`, for every op with a sparse fake input and a sparse result) on stand-ins instead: real CPU
sparse tensors with each input's layout, size, nnz and dtypes, their elements at the first ``nnz`` positions
(row-major, distinct), all ones. The result's nnz, parts and sharing (``t`` keeps its input's values) are then
the real kernel's for these stand-ins: exact for an op of one sparse input whose result does not depend on where
the elements are or on their values (``clone``, ``t``, ``neg``, ``mul`` by a number, a layout change of a
coalesced tensor); otherwise an assumption, listed in ``fidelity()["assumptions"]``: two sparse inputs have their
elements at the same positions (``add`` keeps ``max(nnz)``, ``mul`` ``min(nnz)``); an op that coalesces an
uncoalesced input (``coalesce``, a layout change) finds no two elements at one position. Stand-ins of more than ``STAND_IN_LIMIT`` elements are not made (torch's nnz is kept and
said), nor for ops that write an input (torch's rule, said too).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor, in_kernel_invocation_manager
from torch.utils._mode_utils import no_dispatch

from .value_args import arg_tensors, has_sym
from .value_reads import known_value

__all__ = ["ALL_NONZERO", "FROM_DENSE", "PARTS", "STAND_IN_LIMIT", "from_dense", "sparse_parts", "stand_in"]

aten = torch.ops.aten

#: The parts of a sparse tensor, by layout: the methods that read them, values last.
PARTS: dict[Any, tuple[str, ...]] = {
    torch.sparse_coo: ("_indices", "_values"),
    torch.sparse_csr: ("crow_indices", "col_indices", "values"),
    torch.sparse_bsr: ("crow_indices", "col_indices", "values"),
    torch.sparse_csc: ("ccol_indices", "row_indices", "values"),
    torch.sparse_bsc: ("ccol_indices", "row_indices", "values"),
}

#: The conversions from a dense tensor whose nnz depends on the values.
FROM_DENSE = frozenset(
    (aten._to_sparse.default, aten._to_sparse.sparse_dim, aten._to_sparse_csr.default, aten._to_sparse_csc.default,
     aten._to_sparse_bsr.default, aten._to_sparse_bsc.default)
)  # fmt: skip

#: Above this many elements a conversion of unknown values is probed at a smaller size (``_small_like``).
PROBE_LIMIT = 1 << 20
#: The most elements (indices and values of every sparse input together) the stand-ins of one op may hold.
STAND_IN_LIMIT = 1 << 22

ALL_NONZERO = (
    "nnz (the elements a sparse tensor keeps) depends on the values of the {shape} tensor, not known: assumed "
    "every element nonzero (nnz {nnz}, {layout}), the largest the output can be"
)
SAME_POSITIONS = (
    "the result's nnz ({nnz}) is as if the sparse inputs' elements sat at the same positions and no two at one "
    "(the fake run does not know where they are)"
)
DISTINCT = (
    "the result's nnz ({nnz}) is as if no two elements of the uncoalesced input sat at one position (the fake run "
    "does not know where they are)"
)
TORCH_NNZ = "the sparse result's nnz ({nnz}) is torch's fake rule's, which does not know the inputs' elements ({why})"


def sparse_parts(t: Any) -> list[Any]:
    """The tensors that hold sparse tensor ``t``'s memory, values last; ``[]`` for any other layout.

    Read without a dispatch, so reading them is no op of a record: a fake tensor's parts are meta tensors
    (``in_kernel_invocation_manager``), a real one's are its own (``no_dispatch``).
    """
    names = PARTS.get(t.layout)
    if names is None:
        return []
    ctx = in_kernel_invocation_manager(t.fake_mode) if isinstance(t, FakeTensor) else no_dispatch()
    with ctx:
        return [getattr(t, n)() for n in names]


def from_dense(values: Any, func: Any, args: Any, kwargs: Any) -> Any:
    """``func`` (one of :data:`FROM_DENSE`) on a dense tensor, as Note: [sparse conversions under fake tensors]
    says; None when its input is not a dense tensor of concrete size (torch's own rule answers then).

    ``values`` is the fake mode's :class:`~fakeviz._engine.values.Values` (its mode, and where assumptions go).
    """
    src = args[0] if args else None
    if not isinstance(src, torch.Tensor) or src.layout != torch.strided or has_sym(args, kwargs):
        return None
    fake = isinstance(src, FakeTensor)
    device = src.fake_device if fake else src.device
    value = known_value(src) if fake else (src if src.device.type == "cpu" else None)
    rest, kw = args[1:], kwargs or {}
    with no_dispatch():
        if value is not None:
            real = func(value, *rest, **kw)
            layout, specs = real.layout, [_spec(p) for p in sparse_parts(real)]
            coalesced = real.is_coalesced() if layout == torch.sparse_coo else False
        else:
            # the real kernel on no memory: its checks, and the output's layout, dtypes and dimensions (nnz 0); a
            # large input is probed at a size with its rank and block divisibility (the kernel reads every element)
            shape = tuple(src.shape)
            probe = shape if math.prod(shape) <= PROBE_LIMIT else _small_like(func, args, kwargs, shape)
            try:
                none = func(torch.zeros((), dtype=src.dtype).expand(probe), *rest, **kw)
            except RuntimeError as exc:
                if probe != shape:
                    exc.add_note(f"fakeviz: checked on a {list(probe)} stand-in for the {list(shape)} input (same "
                                 "rank, same remainders by the block size)")  # fmt: skip
                raise
            layout, shapes = none.layout, [(tuple(p.shape), p.dtype) for p in sparse_parts(none)]
            # ... and on one block of ones: how much storage each part holds for its elements
            one = func(torch.ones((), dtype=src.dtype).expand(_one_block(layout, shapes, src.dim())), *rest, **kw)
            ratios = [p.untyped_storage().nbytes() / max(p.numel() * p.element_size(), 1) for p in sparse_parts(one)]
            shapes = _all_nonzero(layout, tuple(src.shape), shapes)
            specs = [_contiguous(s, d, r) for (s, d), r in zip(shapes, ratios)]
            nnz = shapes[-1][0][_batch(layout, shapes)]
            name = str(layout).removeprefix("torch.")
            values.assume(func, ALL_NONZERO.format(shape=list(src.shape), nnz=nnz, layout=name))
            coalesced = True
        parts = [
            torch.empty(elems, dtype=dt, device="meta").as_strided(shape, stride, offset)
            for shape, stride, offset, dt, elems in specs
        ]
        size = tuple(src.shape)
        if layout == torch.sparse_coo:
            meta = torch.sparse_coo_tensor(*parts, size, is_coalesced=coalesced, check_invariants=False)
        else:
            meta = torch.sparse_compressed_tensor(*parts, size, layout=layout, check_invariants=False)
    return FakeTensor(values.mode, meta, device)


def _spec(p: Any) -> tuple[Any, ...]:
    """A part as (shape, stride, storage offset, dtype, storage elements): what its meta twin needs."""
    return tuple(p.shape), p.stride(), p.storage_offset(), p.dtype, p.untyped_storage().nbytes() // p.element_size()


def _contiguous(shape: tuple[int, ...], dtype: Any, ratio: float) -> tuple[Any, ...]:
    """The spec of a contiguous part of ``shape`` in a storage ``ratio`` times its size (``_spec``'s form)."""
    stride, acc = [], 1
    for n in reversed(shape):
        stride.append(acc)
        acc *= max(n, 1)
    n = math.prod(shape)
    return shape, tuple(reversed(stride)), 0, dtype, max(n, round(n * ratio))


def _one_block(layout: Any, shapes: list[tuple[tuple[int, ...], Any]], ndim: int) -> tuple[int, ...]:
    """The smallest dense size with the dimensions of a conversion's input: one element, or one block."""
    if layout not in (torch.sparse_bsr, torch.sparse_bsc):
        return (1,) * ndim
    b = len(shapes[0][0]) - 1
    vshape = shapes[-1][0]
    return (*(1,) * b, vshape[b + 1], vshape[b + 2], *(1,) * (ndim - b - 2))


def _batch(layout: Any, shapes: list[tuple[tuple[int, ...], Any]]) -> int:
    """The number of batch dimensions of a sparse tensor's values (0 for COO)."""
    return 0 if layout == torch.sparse_coo else len(shapes[0][0]) - 1


def _all_nonzero(layout: Any, size: tuple[int, ...], shapes: list[tuple[tuple[int, ...], Any]]) -> list[Any]:
    """The parts' shapes when every element of a dense tensor of ``size`` is kept, from the parts of the same
    conversion of zeros (``shapes``, of ``size`` or a smaller probe: its sparse and batch dimensions, block size,
    index dtypes are what count)."""
    if layout == torch.sparse_coo:
        (ishape, idt), (_, vdt) = shapes
        d = ishape[0]
        nnz = math.prod(size[:d])
        return [((d, nnz), idt), ((nnz, *size[d:]), vdt)]
    (cshape, cdt), (_, pdt), (vshape, vdt) = shapes
    b = len(cshape) - 1  # batch dimensions
    block = tuple(vshape[b + 1 : b + 3]) if layout in (torch.sparse_bsr, torch.sparse_bsc) else (1, 1)
    rows, cols = size[b] // block[0], size[b + 1] // block[1]
    n_comp, n_plain = (rows, cols) if layout in (torch.sparse_csr, torch.sparse_bsr) else (cols, rows)
    nnz = n_comp * n_plain
    batch, dense = size[:b], size[b + 2 :]
    values_shape = (*batch, nnz, *(block if layout in (torch.sparse_bsr, torch.sparse_bsc) else ()), *dense)
    return [((*batch, n_comp + 1), cdt), ((*batch, nnz), pdt), (values_shape, vdt)]


def _small_like(func: Any, args: Any, kwargs: Any, shape: tuple[int, ...]) -> tuple[int, ...]:
    """A small size a conversion accepts or refuses as it does ``shape``: every dimension at most 2, but the two
    blocked ones of a block layout ``blocksize + size % blocksize``."""
    bound = dict(zip((a.name for a in func._schema.arguments), args))
    bound.update(kwargs or {})
    small = [min(n, 2) for n in shape]
    blocksize = bound.get("blocksize")
    if blocksize is not None and len(shape) >= 2:
        dense = bound.get("dense_dim") or 0
        for i, bs in zip((len(shape) - 2 - dense, len(shape) - 1 - dense), blocksize):
            if 0 <= i < len(shape) and bs > 0:
                small[i] = bs + shape[i] % bs
    return tuple(small)


def stand_in(values: Any, func: Any, args: Any, kwargs: Any, out: Any, device: Any = None) -> Any:
    """``out`` (torch's fake result of ``func``, sparse) remade from ``func`` run on stand-ins of its sparse inputs:
    Note: [sparse results under fake tensors]. ``out`` itself where the op has no sparse fake input.

    With ``out`` None (torch has no fake rule for the op on ``device``, a fake accelerator: Note: [fallback kernels on
    fake devices] in :mod:`fakeviz._engine.device_fallback`) the result is made on ``device`` from the stand-ins' run
    alone, dense or sparse; None where no stand-in can be made.
    """
    ins = arg_tensors(args, kwargs)
    sparse = []
    for t in ins:
        if isinstance(t, FakeTensor) and t.layout in PARTS and all(t is not u for u in sparse):
            sparse.append(t)
    if not sparse or (out is not None and any(out is t for t in ins)):
        return out
    why = None
    fake_parts = [sparse_parts(t) for t in sparse]
    if values.written(func, args, kwargs) or has_sym(args, kwargs):
        why = "it writes an input"
    elif sum(p.numel() for parts in fake_parts for p in parts) > STAND_IN_LIMIT:
        why = "stand-ins too large to make"
    if why is not None:
        if out is not None:
            values.assume(func, TORCH_NNZ.format(nnz=out._nnz(), why=why))
        return out
    coalesced = {}
    for t in sparse:
        if t.layout == torch.sparse_coo:
            with in_kernel_invocation_manager(t.fake_mode):
                coalesced[id(t)] = t.is_coalesced()
    with no_dispatch():
        made = {id(t): _make_stand_in(t, parts, coalesced.get(id(t), True)) for t, parts in zip(sparse, fake_parts)}

        def real(x: Any) -> Any:
            if isinstance(x, FakeTensor):
                if id(x) in made:
                    return made[id(x)]
                value = known_value(x)
                return value if value is not None else torch.zeros((), dtype=x.dtype).expand(tuple(x.shape))
            if isinstance(x, torch.device):
                return torch.device("cpu")
            if isinstance(x, (list, tuple)):
                return type(x)(real(y) for y in x)
            return x

        result = func(*real(tuple(args)), **{k: real(v) for k, v in (kwargs or {}).items()})
        if not isinstance(result, torch.Tensor):
            return out
        device = out.fake_device if out is not None else device
        if result.layout not in PARTS:
            if out is not None:
                return out
            stride = result.stride()
            if any(st == 0 and n > 1 for st, n in zip(stride, result.shape)):  # follows an expanded placeholder
                stride = torch.empty(tuple(result.shape), dtype=result.dtype, device="meta").stride()
            meta = torch.empty_strided(tuple(result.shape), stride, dtype=result.dtype, device="meta")
            return FakeTensor(values.mode, meta, device)
        # a part the result shares with a stand-in is shared with that input's fake part
        shared = {}
        for t, parts in zip(sparse, fake_parts):
            for rp, fp in zip(sparse_parts(made[id(t)]), parts):
                shared[rp.untyped_storage()._cdata] = fp
        new = []
        for p in sparse_parts(result):
            shape, stride, offset, dt, elems = _spec(p)
            base = shared.get(p.untyped_storage()._cdata)
            if base is None:
                base = torch.empty(elems, dtype=dt, device="meta")
            new.append(base.as_strided(shape, stride, offset))
        size = tuple(result.shape)
        if result.layout == torch.sparse_coo:
            meta = torch.sparse_coo_tensor(*new, size, is_coalesced=result.is_coalesced(), check_invariants=False)
        else:
            meta = torch.sparse_compressed_tensor(*new, size, layout=result.layout, check_invariants=False)
        nnz = result._nnz()
        merged = result.layout != torch.sparse_coo or result.is_coalesced()  # duplicates would have merged
    if len(sparse) > 1:
        values.assume(func, SAME_POSITIONS.format(nnz=nnz))
    elif merged and not all(coalesced.values()):
        values.assume(func, DISTINCT.format(nnz=nnz))
    return FakeTensor(values.mode, meta, device)


def _make_stand_in(t: Any, parts: list[Any], coalesced: bool) -> Any:
    """A real CPU sparse tensor like fake ``t`` (layout, size, nnz, parts' dtypes, a COO tensor's coalesced flag):
    elements at the first positions, row-major, all ones (Note: [sparse results under fake tensors])."""
    size = tuple(t.shape)
    vals = torch.ones(tuple(parts[-1].shape), dtype=parts[-1].dtype)
    if t.layout == torch.sparse_coo:
        d, nnz = parts[0].shape
        pos = torch.arange(nnz, dtype=torch.int64)
        idx = torch.stack(torch.unravel_index(pos, size[:d])) if d else torch.zeros((0, nnz), dtype=torch.int64)
        return torch.sparse_coo_tensor(
            idx.to(parts[0].dtype), vals, size, is_coalesced=coalesced, check_invariants=False
        )
    compressed, plain = parts[0], parts[1]
    n_comp, nnz = compressed.shape[-1] - 1, plain.shape[-1]
    b = compressed.dim() - 1
    rows_first = t.layout in (torch.sparse_csr, torch.sparse_bsr)
    n_plain = size[b + 1] if rows_first else size[b]
    if t.layout in (torch.sparse_bsr, torch.sparse_bsc):
        n_plain //= parts[-1].shape[b + 2] if rows_first else parts[-1].shape[b + 1]
    n_plain = max(n_plain, 1)
    comp = torch.clamp(torch.arange(n_comp + 1, dtype=torch.int64) * n_plain, max=nnz)
    plain_idx = torch.arange(nnz, dtype=torch.int64) % n_plain
    batch = tuple(compressed.shape[:-1])
    comp = comp.expand(*batch, n_comp + 1).to(compressed.dtype).contiguous()
    plain_idx = plain_idx.expand(*batch, nnz).to(plain.dtype).contiguous()
    return torch.sparse_compressed_tensor(comp, plain_idx, vals, size, layout=t.layout, check_invariants=False)
