"""How long: a time model per op (roofline with achieved fractions) and a step's time as its critical path.

Computed from a finished record, never while recording (Note: [time model]):

* every op gets a **kernel class** from its name and flags (:func:`op_class`): views and metadata ops cost
  nothing on the GPU; a GEMM, attention, convolution, elementwise, reduction, copy or foreach op costs
  ``max(FLOPs / (peak * compute fraction), bytes / (bandwidth * memory fraction)) + launch``, where FLOPs are
  the record's (torch's formulas), bytes are the op's tensor inputs read plus its outputs written (the
  record's metadata), and peak and bandwidth come from the GPU's spec (:mod:`fakeviz._core.gpu_specs`);
  ``bound`` says which term won (``compute``, ``memory`` or ``latency`` when the launch cost dominates);
* the host issues ops one after another (``host_s`` per op) while the GPU runs them in order, so a step's
  time is the critical path of both: ``gpu_i = max(gpu_{i-1}, host_i) + est_i``; an op that reads a value
  on the host (``.item()``, a data-dependent shape) makes the host wait for the GPU;
* a collective runs on its own stream: it starts once its inputs are ready and the previous collective is
  done, takes ``alpha + wire bytes / link bandwidth`` (ring algorithms, :mod:`.collectives`), and the first
  op that reads what it wrote waits for it (FSDP2's prefetched all-gathers and overlapped reduce-scatters
  fall out of this data flow).

Every constant is in :data:`ACHIEVED` with where it comes from: fitted on a real H100 by
``benchmarks/fit_time.py`` from ``tests/fixtures/h100_time.json.gz`` (``benchmarks/gpu_time.py``).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from .._core.gpu_specs import GPUSpec, gpu_spec
from .._core.record import Record
from .._core.schema import FLAG_DATA_DEPENDENT, FLAG_INPLACE, FLAG_VIEW, PHASES
from .collectives import KINDS as _COLLECTIVE_KINDS
from .collectives import NAMESPACES as _COLLECTIVE_NAMESPACES

__all__ = [
    "ACHIEVED", "CLASSES", "MATRIX_CLASSES", "Achieved", "OpFeatures", "StepTime", "critical_path", "estimate",
    "features", "matmul_peak", "op_class", "op_times", "step_start", "step_time", "training_steps",
]  # fmt: skip

CLASSES = (
    "none", "gemm", "grouped_gemm", "attention", "attention_backward", "conv", "elementwise", "reduction", "copy", "foreach",
    "collective", "sync",
)  # fmt: skip
_CODE = {c: i for i, c in enumerate(CLASSES)}


@dataclass(frozen=True)
class Achieved:
    """What a kernel class reaches of the GPU's peaks, and what each launch costs.

    ``compute``: fraction of the dtype's dense peak FLOP/s; ``memory``: fraction of HBM bandwidth;
    ``launch_s``: fixed GPU time per op (the kernel's start and tail); ``host_s``: time the host spends
    issuing the op (Python, dispatcher, launch), which bounds steps of small ops.
    """

    compute: float
    memory: float
    launch_s: float
    host_s: float


# Note: [time model]. Fitted by benchmarks/fit_time.py on an NVIDIA H100 80GB HBM3 (SXM, 132 SMs), torch
# 2.11.0+cu130, 2026-11-27, from the kernels of 13 real training steps (tests/fixtures/h100_time.json.gz,
# benchmarks/gpu_time.py: every op's CUDA kernels attributed through profiler ranges) against the H100 SXM's
# datasheet peaks; other GPUs use the same fractions of their own peaks (an assumption fidelity() names).
ACHIEVED_SOURCE = "fitted on NVIDIA H100 80GB HBM3, torch 2.11.0+cu130, 2026-11-27 (benchmarks/fit_time.py)"
ACHIEVED: dict[str, Achieved] = {
    # compute 1.0 where a class is never bound by FLOPs (the fit found the memory term always larger)
    "none": Achieved(compute=1.0, memory=1.0, launch_s=0.0, host_s=12e-6),
    "gemm": Achieved(compute=0.800, memory=0.825, launch_s=4.0e-6, host_s=31e-6),
    "grouped_gemm": Achieved(compute=0.625, memory=0.425, launch_s=12e-6, host_s=31e-6),
    "attention": Achieved(compute=1.0, memory=1.0, launch_s=5e-6, host_s=31e-6),  # ATTENTION has the fractions
    "attention_backward": Achieved(compute=1.0, memory=1.0, launch_s=10e-6, host_s=31e-6),
    "conv": Achieved(compute=0.50, memory=0.70, launch_s=5e-6, host_s=31e-6),  # not measured: no conv step
    "elementwise": Achieved(compute=1.0, memory=0.900, launch_s=1.25e-6, host_s=31e-6),
    "reduction": Achieved(compute=1.0, memory=0.650, launch_s=5.0e-6, host_s=31e-6),
    "copy": Achieved(compute=1.0, memory=0.900, launch_s=7.75e-6, host_s=31e-6),
    "foreach": Achieved(compute=1.0, memory=0.600, launch_s=12e-6, host_s=31e-6),
    "collective": Achieved(compute=1.0, memory=1.0, launch_s=0.0, host_s=31e-6),
    "sync": Achieved(compute=1.0, memory=1.0, launch_s=5e-6, host_s=31e-6),
}
# idle time of the compute stream between consecutive kernels of an eager step (the median over the GPU-bound
# steps of the fixture of (step time - kernel time) / ops with kernels; 5-18 us per op across them)
KERNEL_GAP_S = 11e-6
# GEMMs whose leading dimensions are not 16-byte multiples: factor on the compute fraction by alignment in bytes
# (H100 bf16, tests/fixtures/h100_time_extra.json.gz: the median of the misaligned shapes over their aligned twins)
MISALIGNED: dict[int, float] = {8: 0.364, 4: 0.26, 2: 0.173, 1: 0.173}
# Attention: fraction of the dense peak against the FLOPs torch's formula counts (the full product, causal or not),
# by backend, (forward, backward); a causal mask takes ATTENTION_CAUSAL_TIME of the unmasked time (H100 bf16,
# non-causal and causal twins in tests/fixtures/h100_time_extra.json.gz)
ATTENTION: dict[str, tuple[float, float]] = {
    "cudnn": (0.659, 0.418), "flash": (0.349, 0.239), "efficient": (0.173, 0.126),
}  # fmt: skip
ATTENTION_CAUSAL_TIME = 0.656
# a collective: alpha (latency per call) and the fraction of the link's bandwidth NCCL's ring reaches
COLLECTIVE_ALPHA_S = {"intra": 10e-6, "inter": 30e-6}
COLLECTIVE_BUS_FRACTION = {"intra": 0.80, "inter": 0.80}

# ----------------------------------------------------------------------------------------------------- classes
# ops that never launch a kernel (metadata, allocation without a write, aliasing), beyond what FLAG_VIEW marks
_NO_KERNEL = frozenset(
    """
    view _unsafe_view _reshape_alias alias detach detach_ lift_fresh t transpose expand permute squeeze unsqueeze
    slice select split split_with_sizes unbind chunk as_strided as_strided_ empty empty_like empty_strided
    new_empty new_empty_strided resize_ set_ _local_scalar_dense sym_size sym_stride sym_numel sym_storage_offset
    wait_tensor record_stream _record_function_enter _record_function_enter_new _record_function_exit
    unflatten diagonal narrow view_as_real view_as_complex real imag _neg_view _conj _indices _values
    """.split()
)
_GEMM = frozenset(
    "mm addmm bmm baddbmm addbmm _scaled_mm _int_mm addmv mv dot vdot _addmm_activation addr matmul linear".split()
    + "gptq_gemm awq_gemm scaled_matmul".split()  # pre-quantized layers' kernels (fakeviz._engine.quant_kernels)
    + "gemm_4bit gemv_4bit".split()  # bitsandbytes' 4-bit matmuls: a GEMM on the dequantized weight (Note: [time model])
)
# GEMMs whose weight operand is stored packed (bitsandbytes' [n/2, 1] uint8): the kernel multiplies a dequantized,
# contiguous copy, so the packed layout's strides say nothing of the GEMM's alignment
_PACKED_GEMM = frozenset("gemm_4bit gemv_4bit".split())
_GROUPED_GEMM = frozenset("_grouped_mm _scaled_grouped_mm".split())
_CONV = re.compile(r"^(_?convolution|cudnn_convolution|conv\w*|miopen_convolution\w*|_convolution_double_backward)")
_ATTENTION = re.compile(r"scaled_dot_product|_flash_attention|_efficient_attention|_cudnn_attention|flash_attn")
_SYNC = frozenset("_local_scalar_dense item nonzero masked_select unique _unique _unique2 unique_dim "
                  "unique_consecutive bincount repeat_interleave _assert_async".split())  # fmt: skip
_REDUCTION = re.compile(
    r"^(sum|mean|amax|amin|max|min|var|std|var_mean|std_mean|norm|linalg_vector_norm|prod|argmax|argmin|"
    r"logsumexp|any|all|cumsum|cumprod|_softmax|_log_softmax|softmax|log_softmax|_softmax_backward_data|"
    r"_log_softmax_backward_data|native_layer_norm|native_layer_norm_backward|_fused_rms_norm|"
    r"_fused_rms_norm_backward|native_batch_norm|native_batch_norm_backward|cudnn_batch_norm|"
    r"cudnn_batch_norm_backward|_batch_norm_with_update|batch_norm_backward|native_group_norm|"
    r"native_group_norm_backward|nll_loss\w*|cross_entropy\w*|embedding_dense_backward|topk|sort|"
    r"_embedding_bag\w*|mse_loss|binary_cross_entropy\w*|kthvalue|median|mode|histc|_fused_moving_avg\w*)$"
)
_COPY = re.compile(
    r"^(_to_copy|copy_|copy|clone|contiguous|cat|stack|index|index_put_?|_index_put_impl_|index_select|gather|"
    r"scatter\w*|embedding|slice_backward|select_backward|index_add_?|index_copy_?|index_fill_?|masked_scatter_?|"
    r"repeat|constant_pad_nd|_unsafe_index\w*|flip|roll|take|take_along_dim|as_strided_scatter|slice_scatter|"
    r"select_scatter|diagonal_scatter|lift_fresh_copy|_pin_memory|split_with_sizes_copy|_chunk_cat|"
    r"all_gather_copy_in|split_with_sizes_copy|chunk_cat|_unsafe_masked_index\w*|narrow_copy|unfold_backward|"
    r"_foreach_copy_)$"
)


def _base(name: str) -> tuple[str, str]:
    parts = name.split(".")
    return (parts[0], parts[1]) if len(parts) >= 2 else ("", name)


@functools.lru_cache(maxsize=4096)
def op_class(name: str, flags: int = 0) -> str:
    """The kernel class of an op by its recorded name (``"aten.mm.default"``) and record flags."""
    namespace, base = _base(name)
    if namespace in _COLLECTIVE_NAMESPACES:
        return "collective" if base in _COLLECTIVE_KINDS else "none"
    if flags & FLAG_VIEW or base in _NO_KERNEL:
        return "sync" if base == "_local_scalar_dense" else "none"
    if base in _SYNC or flags & FLAG_DATA_DEPENDENT:
        return "sync"
    if _ATTENTION.search(base):
        return "attention_backward" if "backward" in base else "attention"
    if base in _GROUPED_GEMM:
        return "grouped_gemm"
    if base in _GEMM:
        return "gemm"
    if _CONV.match(base):
        return "conv"
    if base.startswith(("_foreach_", "_fused_")) and base != "_fused_rms_norm":
        return "foreach"
    if _REDUCTION.match(base):
        return "reduction"
    if _COPY.match(base) or base.endswith("_copy"):
        return "copy"
    return "elementwise"


# ------------------------------------------------------------------------------------------------- features
@dataclass
class OpFeatures:
    """What the time model reads of each op (arrays of one length): what the record holds, nothing measured.

    ``cls``: code into :data:`CLASSES`; ``flops``: the record's (``-1`` none); ``bytes_in``/``bytes_out``:
    tensor inputs read and outputs written; ``dtype``: the dtype the op computes in (a GEMM's first input, else
    its first output; ``""`` none); ``coll_*``: collectives only (kind, group size, wire bytes, intra-node).
    """

    names: list[str]
    cls: np.ndarray
    flops: np.ndarray
    bytes_in: np.ndarray
    bytes_out: np.ndarray
    dtype: list[str]
    align: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # GEMMs: leading-dim alignment, bytes
    causal: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))  # attention: is_causal
    waits_on: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # seq of a collective, or -1
    coll_wire: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float64))
    coll_ranks: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float64))
    coll_kind: list[str] = field(default_factory=list)
    # collectives and comm-stream ops: what the op waits for before it starts (Note: [collective streams]):
    # AFTER_COMPUTE everything issued before it on the compute stream, AFTER_NOTHING nothing there, >= 0 that op
    coll_after: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    on_comm: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))  # a copy FSDP2 runs on its comm streams

    def __len__(self) -> int:
        return len(self.cls)

    def tail(self, start: int) -> OpFeatures:
        """The features of the ops from ``start`` on, their references to earlier ops (a collective read, what a
        collective comes after) renumbered, and those before ``start`` dropped (``AFTER_NOTHING``: done already)."""
        if start <= 0:
            return self
        n = len(self)
        w = OpFeatures(**{fl.name: v[start:] if len(v := getattr(self, fl.name)) == n else v for fl in fields(self)})
        if len(self.waits_on) == n:
            v = self.waits_on[start:]
            w.waits_on = np.where(v >= start, v - start, -1)
        if len(self.coll_after) == n:
            v = self.coll_after[start:]
            w.coll_after = np.where(v >= start, v - start, np.where(v >= 0, AFTER_NOTHING, v))
        return w


def _tensor_table(c: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Every tensor id the record knows, sorted, with its bytes, dtype code and shape code (its last output row; a
    parameter's own row; else, an input never produced, its storage's bytes and no dtype or shape)."""
    ids = [c["out_tensor"][::-1], c["p_tensor"], c["t_tensor"]]
    sh = [c["out_shape"][::-1].astype(np.int64), c["p_shape"].astype(np.int64), np.full(len(c["t_tensor"]), -1)]
    st = [c["out_stride"][::-1].astype(np.int64), np.full(len(c["p_tensor"]), -1), np.full(len(c["t_tensor"]), -1)]
    nb = [c["out_nbytes"][::-1], c["p_nbytes"], np.where(
        (c["t_storage"] >= 0) & (c["t_storage"] < len(c["st_nbytes"])),
        c["st_nbytes"][np.clip(c["t_storage"], 0, max(len(c["st_nbytes"]) - 1, 0))] if len(c["st_nbytes"]) else -1,
        -1,
    )]  # fmt: skip
    dt = [c["out_dtype"][::-1].astype(np.int64), c["p_dtype"].astype(np.int64), np.full(len(c["t_tensor"]), -1)]
    all_ids = np.concatenate([np.asarray(x, np.int64) for x in ids])
    all_nb = np.concatenate([np.asarray(x, np.int64) for x in nb])
    all_dt = np.concatenate([np.asarray(x, np.int64) for x in dt])
    all_sh = np.concatenate([np.asarray(x, np.int64) for x in sh])
    all_st = np.concatenate([np.asarray(x, np.int64) for x in st])
    uniq, first = np.unique(all_ids, return_index=True)  # first occurrence wins: last output row, then p, then t
    return uniq, np.maximum(all_nb[first], 0), all_dt[first], all_sh[first], all_st[first]


def _parse_shape(shapes: list[str], code: int) -> list[int] | None:
    if not 0 <= code < len(shapes):
        return None
    try:
        return [int(x) for x in shapes[code].strip("[]").split(",") if x.strip()]
    except ValueError:  # symbolic sizes
        return None


def gemm_alignment(name: str, mats: list[tuple[list[int], list[int]] | None], itemsize: int) -> int:
    """The alignment in bytes (1, 2, 4, 8 or 16) of a GEMM's leading dimensions: the non-unit stride of each
    matrix operand (its last two dimensions) and the output's row length; 16 when unknown.

    cuBLAS takes its fast tensor-core kernels only when every leading dimension is a 16-byte multiple: an H100 ran
    ``[8192, 1024] @ [1024, 50257]`` in bf16 at 129 TFLOP/s and the same with 50304 columns at 721
    (tests/fixtures/h100_time_extra.json.gz); a misaligned row count of a non-transposed operand costs nothing.
    """
    known = [m for m in mats if m is not None and len(m[0]) >= 2]
    if len(known) < 2 or "grouped" in name or _base(name)[1] in _PACKED_GEMM:
        return 16
    lds = []
    for shape, stride in known[-2:]:
        rows, cols = shape[-2], shape[-1]
        s_rows, s_cols = stride[-2], stride[-1]
        lds.append(s_rows if s_cols == 1 or cols == 1 else s_cols if s_rows == 1 or rows == 1 else 1)
    lds.append(known[-1][0][-1])  # the output's row: N
    align = 16
    for ld in lds:
        b = (ld * itemsize) & -(ld * itemsize) if ld > 0 else 16  # largest power of two dividing ld bytes
        align = min(align, b)
    return max(1, align)


_ITEMSIZE = {"torch.float32": 4, "torch.float64": 8, "torch.float8_e4m3fn": 1, "torch.float8_e5m2": 1,
             "torch.int8": 1, "torch.float16": 2, "torch.bfloat16": 2}  # fmt: skip


def _split_args(text: str) -> list[str]:
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    if "".join(cur).strip():
        parts.append("".join(cur).strip())
    return parts


@functools.lru_cache(maxsize=256)
def _causal_position(name: str) -> int:
    from .._engine.flops import resolve_op

    op = resolve_op(name)
    if op is None:
        return -1
    for i, a in enumerate(op._schema.arguments):
        if a.name == "is_causal":
            return i
    return -1


def is_causal(name: str, args: str) -> bool:
    """Whether an attention op's recorded arguments say ``is_causal=True`` (by keyword or by schema position)."""
    parts = _split_args(args.strip()[1:-1] if args.strip().startswith("(") else args)
    for p in parts:
        if p.replace(" ", "").startswith("is_causal="):
            return p.split("=", 1)[1].strip() == "True"
    pos = _causal_position(name)
    positional = [p for p in parts if "=" not in p.split("(")[0]]
    return 0 <= pos < len(positional) and positional[pos] == "True"


def _segment_sum(values: np.ndarray, ends: np.ndarray) -> np.ndarray:
    csum = np.concatenate([[0], np.cumsum(values, dtype=np.int64)])
    starts = np.concatenate([[0], ends[:-1]]) if len(ends) else ends
    return csum[ends] - csum[starts]


def features(rec: Record) -> OpFeatures:
    """The model's inputs for every op of ``rec`` (memoised on the record)."""
    return rec.cached("timing_features", lambda: _features(rec))


def _features(rec: Record) -> OpFeatures:
    c, s = rec.columns(), rec.string_tables()
    n = len(c["op"])
    names = s["ops"]
    flags = c["flags"].astype(np.int64)
    op_codes = c["op"].astype(np.int64)
    # class per (name, relevant flags): a handful of distinct pairs
    key = op_codes * 8 + (flags & (FLAG_VIEW | FLAG_DATA_DEPENDENT))
    uk, inv = np.unique(key, return_inverse=True)
    cls = np.array([_CODE[op_class(names[k // 8], int(k % 8))] for k in uk.tolist()], np.int8)[inv] if n else (
        np.zeros(0, np.int8)
    )  # fmt: skip
    ids, nbytes, dtcode, shcode, stcode = _tensor_table(c)
    in_t = c["in_tensor"].astype(np.int64)
    pos = np.clip(np.searchsorted(ids, in_t), 0, max(len(ids) - 1, 0))
    found = (ids[pos] == in_t) if len(ids) else np.zeros(len(in_t), bool)
    in_nb = np.where(found, nbytes[pos] if len(ids) else 0, 0)
    in_dt = np.where(found, dtcode[pos] if len(ids) else -1, -1)
    in_sh = np.where(found, shcode[pos] if len(ids) else -1, -1)
    in_st = np.where(found, stcode[pos] if len(ids) else -1, -1)
    in_end = c["in_end"].astype(np.int64)
    out_end = c["out_end"].astype(np.int64)
    bytes_in = _segment_sum(in_nb, in_end) if n else np.zeros(0, np.int64)
    out_nb = np.maximum(c["out_nbytes"].astype(np.int64), 0)
    bytes_out = _segment_sum(out_nb, out_end) if n else np.zeros(0, np.int64)
    # compute dtype: the first input's for matrix ops, else the first output's
    dtypes = s["dtypes"]
    in_start = np.concatenate([[0], in_end[:-1]]) if n else in_end
    out_start = np.concatenate([[0], out_end[:-1]]) if n else out_end
    first_in = np.where(
        in_end > in_start, in_dt[np.clip(in_start, 0, max(len(in_dt) - 1, 0))] if len(in_dt) else -1, -1
    )
    out_dt = c["out_dtype"].astype(np.int64)
    first_out = np.where(
        out_end > out_start, out_dt[np.clip(out_start, 0, max(len(out_dt) - 1, 0))] if len(out_dt) else -1, -1
    )
    matrix = np.isin(
        cls, [_CODE["gemm"], _CODE["grouped_gemm"], _CODE["attention"], _CODE["attention_backward"], _CODE["conv"]]
    )
    code = np.where(matrix & (first_in >= 0), first_in, np.where(first_out >= 0, first_out, first_in))
    dtype = [dtypes[i] if 0 <= i < len(dtypes) else "" for i in code.tolist()]
    align = np.full(n, 16, np.int64)
    shapes, strides = s["shapes"], s["strides"]
    for seq in np.flatnonzero(cls == _CODE["gemm"]).tolist():
        mats = []
        for k, st in zip(in_sh[in_start[seq] : in_end[seq]].tolist(), in_st[in_start[seq] : in_end[seq]].tolist()):
            shape, stride = _parse_shape(shapes, int(k)), _parse_shape(strides, int(st))
            mats.append((shape, stride) if shape is not None and stride is not None else None)
        align[seq] = gemm_alignment(names[int(op_codes[seq])], mats, _ITEMSIZE.get(dtype[seq], 2))
    causal = np.zeros(n, bool)
    att = np.flatnonzero((cls == _CODE["attention"]) | (cls == _CODE["attention_backward"]))
    if len(att):
        from .tables import args_strings

        args = args_strings(rec)
        for seq in att.tolist():
            causal[seq] = is_causal(names[int(op_codes[seq])], args[seq])
    feats = OpFeatures(
        names=[names[i] for i in op_codes.tolist()], cls=cls, flops=c["flops"].astype(np.int64),
        bytes_in=bytes_in, bytes_out=bytes_out, dtype=dtype, align=align, causal=causal,
    )  # fmt: skip
    _collective_features(rec, feats, in_t, in_start, in_end, out_start, out_end)
    return feats


# Note: [collective streams]
# NCCL runs a collective on a stream of its own that first waits for the stream it was issued from. One issued from
# the compute stream (tensor parallel's all-reduce, DDP's buckets) starts once everything issued before it there is
# done (AFTER_COMPUTE). FSDP2 issues its collectives from side streams (torch/distributed/fsdp/_fully_shard/
# _fsdp_param_group.py ``_get_all_gather_streams``, _fsdp_collectives.py ``foreach_all_gather`` / ``foreach_reduce``):
# * in forward and in backward prefetching the all-gather's copy-in (``fsdp.all_gather_copy_in``) runs on the
#   all-gather copy-in stream, which waits only for what wrote the sharded parameters it reads (the optimizer step,
#   awaited once per step at the root), and the all-gather follows it on the all-gather stream: the all-gather of
#   block i+1 overlaps block i's compute whenever it is issued before that compute is done (the host running ahead:
#   FSDP2's implicit forward prefetch; its explicit backward prefetch);
# * the reduce-scatter's copy-in (``fsdp.chunk_cat``) runs on the reduce-scatter stream after
#   ``wait_stream(current_stream)``: after the compute issued before it (the block's gradients), then the
#   reduce-scatter, which overlaps the next block's backward.
# Both copy-ins are put on the one communication stream of the model (``on_comm``), before their collective.
# The compute stream waits for a collective at the first op *with a kernel* that reads a storage the collective (or
# its copy-in) wrote: a view of its output reads nothing (FSDP2 makes the sharded gradients as ``as_strided`` views
# of the reduce-scatter's output right after issuing it, and waits for it only at the end of backward, when the
# optimizer reads them); FSDP2's copy-out (``fsdp.split_with_sizes_copy``) is where the all-gather is awaited.
AFTER_COMPUTE, AFTER_NOTHING = -1, -2
_COMM_COPIES = {"fsdp.all_gather_copy_in": AFTER_NOTHING, "fsdp.chunk_cat": AFTER_COMPUTE}


def _storages(c: dict[str, np.ndarray], tensors: np.ndarray) -> np.ndarray:
    """The storage of each tensor id (its last output row, else its parameter row, else its first-seen row; -1)."""
    ids = np.concatenate([c["out_tensor"][::-1], c["p_tensor"], c["t_tensor"]]).astype(np.int64)
    sts = np.concatenate([c["out_storage"][::-1], c["p_storage"], c["t_storage"]]).astype(np.int64)
    if not len(ids) or not len(tensors):
        return np.full(len(tensors), -1, np.int64)
    uniq, first = np.unique(ids, return_index=True)
    pos = np.clip(np.searchsorted(uniq, tensors), 0, len(uniq) - 1)
    return np.where(uniq[pos] == tensors, sts[first][pos], -1)


def _last_before(w_st: np.ndarray, w_seq: np.ndarray, q_st: np.ndarray, q_seq: np.ndarray, n: int) -> np.ndarray:
    """For each query (storage, seq): the last writer seq of that storage before seq, or -1."""
    if not len(w_st) or not len(q_st):
        return np.full(len(q_st), -1, np.int64)
    key = w_st * (n + 1) + w_seq
    order = np.argsort(key, kind="stable")
    key, seqs, sts = key[order], w_seq[order], w_st[order]
    i = np.searchsorted(key, q_st * (n + 1) + q_seq, side="left") - 1
    ok = (i >= 0) & (sts[np.maximum(i, 0)] == q_st)
    return np.where(ok, seqs[np.maximum(i, 0)], -1)


def _collective_features(
    rec: Record, f: OpFeatures, in_t: np.ndarray, in_start: np.ndarray, in_end: np.ndarray,
    out_start: np.ndarray, out_end: np.ndarray,
) -> None:  # fmt: skip
    """Wire bytes and group size of each collective, what each collective and comm-stream copy waits for before it
    starts, and for every op the collective (or copy) whose writes it first reads (Note: [collective streams])."""
    n = len(f)
    f.waits_on = np.full(n, -1, np.int64)
    f.coll_wire = np.zeros(n, np.float64)
    f.coll_ranks = np.ones(n, np.float64)
    f.coll_kind = [""] * n
    f.coll_after = np.full(n, AFTER_COMPUTE, np.int64)
    f.on_comm = np.zeros(n, bool)
    seqs = np.flatnonzero(f.cls == _CODE["collective"])
    if not len(seqs):
        return
    from .collectives import collectives

    for row in collectives(rec).itertuples(index=False):
        seq = int(row.seq)
        f.coll_wire[seq] = float(row.sent) if row.sent == row.sent else 0.0  # NaN: unknown (a broadcast's root)
        f.coll_ranks[seq] = float(row.group_size) if row.group_size == row.group_size else 1.0
        f.coll_kind[seq] = str(row.kind)
    c = rec.columns()
    op_codes = c["op"].astype(np.int64)
    for code, name in enumerate(rec.strings("ops")):
        wait = _COMM_COPIES.get(name.rsplit(".", 1)[0])
        if wait is not None:
            at = op_codes == code
            f.on_comm[at] = True
            f.coll_after[at] = wait
    # c10d's own ops (``allreduce_``, ``_allgather_base_``) write their tensor arguments; functional ones return new
    c10d_inplace = np.isin(op_codes, [i for i, name in enumerate(rec.strings("ops"))
                                      if name.startswith("c10d.") and _base(name)[1].endswith("_")])  # fmt: skip
    in_st = _storages(c, in_t)
    out_st = c["out_storage"].astype(np.int64)
    op_in = np.repeat(np.arange(n), in_end - in_start)
    op_out = np.repeat(np.arange(n), out_end - out_start)
    kernel = f.cls != _CODE["none"]
    inplace = (rec.col("flags").astype(np.int64) & FLAG_INPLACE) != 0
    comm = f.on_comm | (f.cls == _CODE["collective"])
    # what each op writes: its outputs' storages, and an in-place / out= op's inputs (c10d ops write their arguments)
    w_in = (kernel & (inplace | c10d_inplace))[op_in] & (in_st >= 0)
    w_out = kernel[op_out] & (out_st >= 0)
    w_st = np.concatenate([out_st[w_out], in_st[w_in]])
    w_seq = np.concatenate([op_out[w_out], op_in[w_in]])
    # an FSDP2 copy-in that waits for nothing on the compute stream waits for what wrote the storages it reads; a
    # collective whose inputs an FSDP2 copy-in wrote starts after it (on FSDP2's stream), else after the compute
    q = comm[op_in] & (in_st >= 0)
    last = _last_before(w_st, w_seq, in_st[q], op_in[q], n)
    writer = np.full(n, -1, np.int64)
    np.maximum.at(writer, op_in[q], last)
    gather_in = f.on_comm & (f.coll_after == AFTER_NOTHING) & (writer >= 0)
    f.coll_after[gather_in] = writer[gather_in]
    fed = (f.cls == _CODE["collective"]) & (writer >= 0)
    fed_by_copy = np.zeros(n, bool)
    fed_by_copy[fed] = f.on_comm[writer[fed]]
    f.coll_after[fed_by_copy] = writer[fed_by_copy]
    # the compute stream waits at the first op with a kernel reading what a collective or copy-in wrote
    cw = comm[w_seq]
    c_st, c_seq = w_st[cw], w_seq[cw]
    reads = (kernel & ~comm)[op_in] & np.isin(in_st, c_st)
    src = _last_before(c_st, c_seq, in_st[reads], op_in[reads], n)
    np.maximum.at(f.waits_on, op_in[reads], src)


# ---------------------------------------------------------------------------------------------------- the model
_BOUNDS = ("none", "compute", "memory", "latency")


def estimate(
    f: OpFeatures, gpu: GPUSpec | str, *, tf32: bool = False, table: dict[str, Achieved] | None = None,
    gap_s: float | None = None,
) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """GPU seconds of every op (collectives excluded: their time is the link's, see :func:`critical_path`) and its bound
    (codes into ``("none", "compute", "memory", "latency")``). ``table`` and ``gap_s`` replace :data:`ACHIEVED` and
    :data:`KERNEL_GAP_S` (``benchmarks/fit_time.py`` tries its fitted table and kernel times without the gap)."""
    spec = gpu_spec(gpu)
    table = ACHIEVED if table is None else table
    gap = KERNEL_GAP_S if gap_s is None else gap_s
    n = len(f)
    comp = np.array([table[c].compute for c in CLASSES])[f.cls]
    if len(f.align) == n:
        factor = np.array([MISALIGNED.get(int(a), 1.0) for a in f.align]) if (f.align < 16).any() else 1.0
        comp = np.where(f.cls == _CODE["gemm"], comp * factor, comp)
    att = np.flatnonzero((f.cls == _CODE["attention"]) | (f.cls == _CODE["attention_backward"]))
    for seq in att.tolist():
        backend = next((b for b in ATTENTION if b in f.names[seq]), "efficient")
        comp[seq] = ATTENTION[backend][1 if f.cls[seq] == _CODE["attention_backward"] else 0]
        if len(f.causal) == n and f.causal[seq]:
            comp[seq] /= ATTENTION_CAUSAL_TIME
    mem = np.array([table[c].memory for c in CLASSES])[f.cls]
    launch = np.array([table[c].launch_s for c in CLASSES])[f.cls]
    peak = peak_flops(spec, f.dtype, tf32)
    flops = np.maximum(f.flops, 0).astype(np.float64)
    t_c = flops / (peak * comp)
    t_m = (f.bytes_in + f.bytes_out).astype(np.float64) / (spec.hbm_bytes_per_s * mem)
    body = np.maximum(t_c, t_m)
    est = body + launch + gap
    silent = np.isin(f.cls, [_CODE["none"], _CODE["collective"]])
    est[silent] = 0.0
    bound = np.where(launch + gap > body, 3, np.where(t_c >= t_m, 1, 2)).astype(np.int8)
    bound[silent] = 0
    return est if n else np.zeros(0), bound


def peak_flops(spec: GPUSpec, dtypes: list[str], tf32: bool) -> np.ndarray:
    """Each op's dtype's peak FLOP/s on ``spec`` (``tf32``: float32 matmuls on TF32 tensor cores)."""
    table = {d: spec.peak_flops(d or "torch.float32", tf32=tf32) for d in set(dtypes)}
    return np.array([table[d] for d in dtypes], np.float64) if dtypes else np.zeros(0)


def host_times(f: OpFeatures, host_scale: float = 1.0, table: dict[str, Achieved] | None = None) -> np.ndarray:
    """Seconds the host spends issuing each op (``ACHIEVED[cls].host_s``, times ``host_scale`` for a faster or
    slower host than the one the constants were fitted on; ``table`` replaces :data:`ACHIEVED`)."""
    table = ACHIEVED if table is None else table
    return np.array([table[c].host_s for c in CLASSES])[f.cls] * host_scale


# Note: [one step]
# "step" is one training step (forward, backward, optimizer: several microbatches' forwards and backwards before one
# optimizer step are one step), or, without a backward, the run after its set-up (a forward, or a whole
# ``generate`` call, prefill and every decode step: what one "step" of a plan of ``new_tokens`` is). Set-up is
# never in it: ops of the ``init`` phase (a model built inside the recording, ``to_empty``, the optimizer state
# made by a first step outside the timed one) and the inputs made before the first forward. Of a record of N
# training steps the last is timed (the steady state: the first step makes the optimizer state), and
# ``StepTime.timed`` says which and the ops it spans. Every figure called "step" (``step_s``, the CLI's
# "step ... on H100", the explorer's "estimated step") is this one.

# the kernel classes whose FLOPs MFU counts: the tensor-core work the dense peak is the peak of (Note: [model FLOPs]
# in fakeviz._frontends.steps)
MATRIX_CLASSES = ("gemm", "grouped_gemm", "attention", "attention_backward", "conv")


def step_start(rec: Record) -> int:
    """The first op of the step a record holds (Note: [one step]): what comes before is set-up (inputs, a model's
    sharding and ``to_empty``, an optimizer state made by a first step) or, for several training steps, the
    earlier steps.

    A training step (the record has a backward) starts at the first forward op after the last optimizer op before
    its last backward op (so several microbatches' forwards and backwards are one step, and of ``--steps 2`` the
    second, steady-state one is the step); anything else at its first forward op, else its first op after set-up.
    """
    phase = np.asarray(rec.col("phase"))
    fwd, bwd, opt, init = (PHASES.index(p) for p in ("forward", "backward", "optimizer", "init"))
    back = np.flatnonzero(phase == bwd)
    after = 0
    if len(back):
        before = np.flatnonzero(phase[: back[-1]] == opt)
        after = int(before[-1]) + 1 if len(before) else 0
    fw = np.flatnonzero(phase[after:] == fwd)
    if len(fw):
        return after + int(fw[0])
    rest = np.flatnonzero(phase[after:] != init)
    return after + int(rest[0]) if len(rest) else 0


def training_steps(rec: Record) -> int:
    """How many training steps the record holds: runs of ops that hold a backward, each closed by an optimizer step
    (or by the end of the record); 0 without a backward."""
    phase = np.asarray(rec.col("phase"))
    bwd, opt = PHASES.index("backward"), PHASES.index("optimizer")
    is_opt = phase == opt
    # an optimizer step ends where an optimizer op is followed by a non-optimizer op (or the record ends)
    ends = np.flatnonzero(is_opt & ~np.append(is_opt[1:], False))
    bounds = [0, *(ends + 1).tolist()]
    if bounds[-1] < len(phase):
        bounds.append(len(phase))
    return sum(1 for a, b in zip(bounds, bounds[1:]) if (phase[a:b] == bwd).any())


def _timed_text(rec: Record, start: int) -> str:
    """Which step :func:`step_time` timed, in words: ``"the last of 2 training steps (ops 8,643 to 16,411)"``."""
    n = len(rec)
    span = f"ops {start:,} to {n - 1:,}" if n else "no ops"
    first = step_start(rec)
    if start != first:
        return f"{span}, as asked (the step starts at op {first:,})"
    trained = training_steps(rec)
    if trained > 1:
        return f"the last of {trained} training steps ({span})"
    if trained == 1:
        return f"the training step ({span}{', after the set-up' if start else ''})"
    return f"the run without its set-up ({span})" if start else f"the whole run ({span})"


def matmul_peak(rec: Record, gpu: GPUSpec | str, start: int = 0, *, tf32: bool = False) -> tuple[float, str]:
    """``(peak FLOP/s, dtype)``: the dense peak MFU divides by (Note: [model FLOPs] in fakeviz._frontends.steps):
    of the dtype the matrix ops from ``start`` on ran in (a GEMM's first input's), and when they ran in several,
    the FLOP-weighted one, ``sum(flops) / sum(flops / peak)`` (the time the step's matrix FLOPs take at peak), with
    ``dtype`` saying the mix (``"torch.bfloat16 98%, torch.float32 2%"``). ``(0.0, "")`` when no matrix op ran."""
    spec = gpu_spec(gpu)
    f = features(rec).tail(start)
    matrix = np.flatnonzero(np.isin(f.cls, [CLASSES.index(c) for c in MATRIX_CLASSES]) & (f.flops > 0))
    by: dict[str, float] = {}
    for i in matrix.tolist():
        d = f.dtype[i] or "torch.float32"
        by[d] = by.get(d, 0.0) + float(f.flops[i])
    total = sum(by.values())
    if not total:
        return 0.0, ""
    at_peak = sum(v / spec.peak_flops(d, tf32=tf32) for d, v in by.items())
    order = sorted(by, key=lambda d: -by[d])
    dtype = order[0] if len(order) == 1 else ", ".join(f"{d} {by[d] / total:.0%}" for d in order)
    return total / at_peak, dtype


@dataclass
class StepTime:
    """A step's estimated time and where it goes (Note: [one step]).

    ``step_s``: the critical path (host issuing, GPU stream, collectives); ``gpu_s``: sum of op estimates on the
    compute stream; ``host_s``: sum of issuing times; ``comm_s``: sum of collective times; ``exposed_comm_s``:
    how long the compute stream waited for collectives; ``by_class``/``by_phase``: GPU seconds; ``start``: the
    first op timed; ``timed``: which step that is, in words (``"the last of 2 training steps (ops 8,643 to
    16,411)"``).
    """

    step_s: float
    gpu_s: float
    host_s: float
    comm_s: float
    exposed_comm_s: float
    flops: int
    gpu: str
    by_class: dict[str, float]
    by_phase: dict[str, float]
    start: int = 0
    timed: str = ""

    @property
    def bound(self) -> str:
        """What limits the step: ``"gpu"``, ``"host"`` (launch bound) or ``"communication"``."""
        if self.exposed_comm_s > 0.25 * self.step_s:
            return "communication"
        return "host" if self.host_s > self.gpu_s else "gpu"


def critical_path(
    f: OpFeatures, est: np.ndarray, host: np.ndarray, coll_s: np.ndarray
) -> tuple[float, np.ndarray, float]:
    """The critical path of one rank's step: ``(step seconds, each op's end on its stream, exposed comm seconds)``.

    The host issues op ``i`` at ``H_i = sum(host[:i+1])``; the compute stream runs it at
    ``max(end of the previous compute op, H_i, end of the collective it reads)``; a collective runs on the
    communication stream from ``max(previous collective's end, H_i, what it waits for)``: the compute stream's
    work issued before it, or only the FSDP2 copy-in that fed it (Note: [collective streams]), as do FSDP2's
    copy-ins (``on_comm``);
    a sync op makes the host wait for the compute stream. Between breakpoints (syncs, collectives and their
    readers) the recurrence is the running maximum ``E_i + max_{j<=i}(H_j - E_{j-1})``, computed without a loop.
    """
    n = len(est)
    end = np.zeros(n)
    if n == 0:
        return 0.0, end, 0.0
    on_comm = f.on_comm if len(f.on_comm) == n else np.zeros(n, bool)
    after = f.coll_after if len(f.coll_after) == n else np.full(n, AFTER_COMPUTE, np.int64)
    breaks = np.flatnonzero((f.cls == _CODE["sync"]) | (f.cls == _CODE["collective"]) | (f.waits_on >= 0) | on_comm)
    host_now = 0.0  # host clock before the next op
    gpu_now = 0.0  # compute stream free at
    comm_now = 0.0  # communication stream free at
    exposed = 0.0
    coll_end: dict[int, float] = {}
    start = 0
    for b in [*breaks.tolist(), n]:
        if b > start:  # a run of ordinary ops [start, b)
            h = host_now + np.cumsum(host[start:b])
            e = est[start:b]
            e_cum = np.cumsum(e)
            e_prev = np.concatenate([[0.0], e_cum[:-1]])
            # end_i = E_i + max(gpu_now, max_{j<=i}(h_j - E_{j-1}))
            end[start:b] = e_cum + np.maximum(gpu_now, np.maximum.accumulate(h - e_prev))
            host_now = float(h[-1])
            gpu_now = float(end[b - 1])
        if b == n:
            break
        host_now += float(host[b])
        cls = CLASSES[int(f.cls[b])]
        if cls == "collective" or on_comm[b]:  # on the communication stream (Note: [collective streams])
            wait = int(after[b])
            ready = gpu_now if wait == AFTER_COMPUTE else 0.0 if wait < 0 else float(end[wait])
            s = max(comm_now, ready, host_now)
            comm_now = s + float(coll_s[b] if cls == "collective" else est[b])
            coll_end[b] = comm_now
            end[b] = comm_now
        else:
            ready = max(gpu_now, host_now)
            src = int(f.waits_on[b])
            if src >= 0 and coll_end.get(src, 0.0) > ready:
                exposed += coll_end[src] - ready
                ready = coll_end[src]
            gpu_now = ready + float(est[b])
            end[b] = gpu_now
            if cls == "sync":
                host_now = max(host_now, gpu_now)
        start = b + 1
    step = max(host_now, gpu_now, comm_now)
    return step, end, exposed


def collective_seconds(
    f: OpFeatures, spec: GPUSpec, *, gpus_per_node: int = 8, network_bytes_per_s: float = 50e9
) -> np.ndarray:
    """Alpha-beta time of each collective: ``alpha + wire bytes / (link bandwidth * bus fraction)``; a group that
    fits in one node (``group size <= gpus_per_node``) uses NVLink (PCIe where the GPU has none), else the
    network (``network_bytes_per_s`` per GPU, one direction: 400 Gb/s InfiniBand is 50e9)."""
    t = np.zeros(len(f))
    seqs = np.flatnonzero(f.cls == _CODE["collective"])
    for seq in seqs.tolist():
        ranks = f.coll_ranks[seq]
        if ranks <= 1 or f.coll_kind[seq] == "barrier":
            t[seq] = COLLECTIVE_ALPHA_S["intra"] if f.coll_kind[seq] == "barrier" else 0.0
            continue
        where = "intra" if ranks <= gpus_per_node else "inter"
        link = (spec.nvlink_bytes_per_s or spec.pcie_bytes_per_s) if where == "intra" else network_bytes_per_s
        steps = 2 * (ranks - 1) if f.coll_kind[seq] == "all_reduce" else ranks - 1  # ring steps
        t[seq] = COLLECTIVE_ALPHA_S[where] * steps + f.coll_wire[seq] / (link * COLLECTIVE_BUS_FRACTION[where])
    return t


# ------------------------------------------------------------------------------------------------ on a record
def op_times(rec: Record, gpu: GPUSpec | str, *, tf32: bool = False, host_scale: float = 1.0, **links: Any) -> Any:
    """One row per op: ``seq, op, phase, module, cls, flops, bytes, est_s, bound, start_s, end_s``.

    ``est_s`` is the op's own time (GPU for kernels, the link for collectives); ``end_s`` its end on the step's
    critical path (:func:`critical_path`), so ``end_s`` of the last op is about the step's time.
    """
    import pandas as pd

    from .tables import ops_table

    spec = gpu_spec(gpu)
    f = features(rec)
    est, bound = estimate(f, spec, tf32=tf32)
    coll = collective_seconds(f, spec, **links)
    _, end, _ = critical_path(f, est, host_times(f, host_scale), coll)
    own = np.where(f.cls == _CODE["collective"], coll, est)
    ops = ops_table(rec)
    return pd.DataFrame(
        {
            "seq": ops["seq"], "op": ops["op"], "phase": ops["phase"], "module": ops["module"],
            "cls": pd.Categorical.from_codes(f.cls.astype(np.int32), categories=list(CLASSES)),
            "flops": f.flops, "bytes": f.bytes_in + f.bytes_out, "est_s": own,
            "bound": pd.Categorical.from_codes(bound.astype(np.int32), categories=list(_BOUNDS)),
            "start_s": end - own, "end_s": end,
        }
    )  # fmt: skip


def step_time(
    rec: Record, gpu: GPUSpec | str, *, start: int | None = None, tf32: bool = False, host_scale: float = 1.0, **links: Any
) -> StepTime:  # fmt: skip
    """The estimated time of the recorded step on ``gpu`` (see :class:`StepTime`): of the ops from ``start`` on,
    by default the step's (:func:`step_start`, Note: [one step]: without the set-up, the last of several training
    steps); ``start=0`` times the whole record."""
    spec = gpu_spec(gpu)
    if start is None:
        start = step_start(rec)
    f = features(rec).tail(start)
    est, _ = estimate(f, spec, tf32=tf32)
    host = host_times(f, host_scale)
    coll = collective_seconds(f, spec, **links)
    step, _, exposed = critical_path(f, est, host, coll)
    by_class = {c: float(est[f.cls == i].sum()) for i, c in enumerate(CLASSES) if c not in ("none", "collective")}
    by_class = {c: v for c, v in by_class.items() if v > 0}
    phase = rec.col("phase")[max(start, 0) :].astype(np.int64)
    by_phase = {p: float(est[phase == i].sum()) for i, p in enumerate(PHASES) if (phase == i).any()}
    return StepTime(
        step_s=step, gpu_s=float(est.sum()), host_s=float(host.sum()), comm_s=float(coll.sum()),
        exposed_comm_s=exposed, flops=int(np.maximum(f.flops, 0).sum()), gpu=spec.name,
        by_class=by_class, by_phase=by_phase, start=int(start),
        timed=_timed_text(rec, start),
    )  # fmt: skip
