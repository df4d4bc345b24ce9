"""How fast the catalog's GPUs are: peak FLOP/s per dtype, memory and link bandwidths, each figure with its source.

The time model (:mod:`fakeviz._analysis.timing`) reads these through :func:`gpu_spec` and
:meth:`GPUSpec.peak_flops`. What a GPU *has* (memory as the driver reports it, SM count, capability, name)
is :mod:`fakeviz._core.gpus`'s; this module adds what it *does*, and never repeats a fact of the catalog.

Conventions, the same for every row:

* FLOP/s are **dense** peaks at the boost clock: vendors print tensor figures "with sparsity" (2:4
  structured), twice what a dense matmul can reach, and those are halved here. An integer figure (INT8) is
  in operations per second.
* The ``"bf16"`` / ``"fp16"`` / ``"fp8"`` figure is the one **with FP32 accumulate**, which is what PyTorch's
  matmuls and ``torch._scaled_mm`` use. GeForce cards run FP16-accumulate tensor ops twice as fast; that
  figure is never used.
* ``"fp64"`` is the fastest path a float64 matmul gets: the FP64 tensor-core (or AMD matrix-core) figure
  where there is one, else the vector figure, however slow (1/64 of FP32 on Ada and GA10x).
* A kind without a fast path is absent (no ``"bf16"`` on a T4 or V100, no ``"fp8"`` before Ada and Hopper);
  :meth:`GPUSpec.peak_flops` then falls back to the next slower path the GPU has.
* Link bandwidths are **per GPU, one direction**. NVIDIA and AMD quote bidirectional totals (H100 SXM's
  "NVLink 900 GB/s" is 18 links x 25 GB/s each way x 2 directions; "PCIe Gen5 128 GB/s" is an x16 link's
  64 GB/s each way x 2): they are halved. ``nvlink_bytes_per_s`` is the GPU-to-GPU fabric (NVLink, or AMD
  Infinity Fabric), 0 where there is none; PCIe's raw rate is about 1.5% below the quoted one (128b/130b
  encoding), which is left to the time model's efficiencies, as is every gap between peak and achieved.

The measured H100 of ``tests/fixtures/h100_time.json.gz`` (an 8192^3 bf16 mm at about 790 TFLOP/s,
copies beyond L2 at about 3.0 TB/s) checks these figures in ``tests/core/test_gpu_specs.py``; it is not
their source.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field

from .dtypes import DTYPE_NAMES, spelling
from .errors import ArgumentError
from .gpus import GPUS, MULTIPROCESSORS, Capacity

__all__ = ["FLOP_KINDS", "GPU_SPECS", "GPUSpec", "gpu_spec"]

#: The kinds of arithmetic a spec gives a peak for, slowest float first.
FLOP_KINDS = ("fp64", "fp32", "tf32", "bf16", "fp16", "fp8", "int8")

# Where a kind the GPU lacks goes: the nearest slower path it has; every chain ends in fp32, which every GPU has.
# bf16 on a T4 or V100 runs on the CUDA cores (fp32), not on their fp16 tensor cores.
_FALLBACK: dict[str, tuple[str, ...]] = {
    "fp64": ("fp64", "fp32"), "fp32": ("fp32",), "tf32": ("tf32", "fp32"), "bf16": ("bf16", "fp32"),
    "fp16": ("fp16", "fp32"), "fp8": ("fp8", "bf16", "fp16", "fp32"), "int8": ("int8", "fp16", "fp32"),
}  # fmt: skip

# torch dtype names (without "torch.") -> kind; float8_* and float4_* are fp8 (no fp4 kind yet), any other
# dtype (integers, bool) runs on the CUDA cores: fp32.
# A user's spelling ("half", "f16", "bf16") is first read as fakeviz reads every dtype (Note: [dtype spellings]).
_KIND_OF_DTYPE = {
    "float64": "fp64", "complex128": "fp64", "cdouble": "fp64",
    "float32": "fp32", "complex64": "fp32", "cfloat": "fp32",
    "bfloat16": "bf16", "float16": "fp16", "complex32": "fp16", "chalf": "fp16",
    "int8": "int8", "uint8": "int8",
}  # fmt: skip


def _kind(dtype: object) -> str:
    text = spelling(dtype)
    if text in FLOP_KINDS:
        return text
    text = DTYPE_NAMES.get(text, text)
    if text.startswith(("float8", "float4")):
        return "fp8"
    return _KIND_OF_DTYPE.get(text, "fp32")


@dataclass(frozen=True)
class GPUSpec:
    """One catalog GPU's peak rates (see the module docstring for the conventions).

    ``name`` is the catalog name (``"H100"``); ``memory_bytes`` and ``sms`` are :mod:`fakeviz._core.gpus`'s;
    ``flops`` maps a kind of :data:`FLOP_KINDS` to dense peak FLOP/s (a kind without a fast path is absent);
    ``hbm_bytes_per_s`` is the device memory bandwidth; ``nvlink_bytes_per_s`` the GPU-to-GPU fabric per GPU
    and direction (0: none); ``pcie_bytes_per_s`` the host link, one direction; ``sources`` says where each
    figure comes from (keys: the field names, and ``"flops.<kind>"`` where a kind has its own source).
    """

    name: str
    memory_bytes: int
    sms: int
    flops: dict[str, float] = field(hash=False)
    hbm_bytes_per_s: float
    nvlink_bytes_per_s: float
    pcie_bytes_per_s: float
    sources: dict[str, str] = field(hash=False, repr=False)

    def peak_flops(self, dtype: object, *, tf32: bool = False) -> float:
        """Dense peak FLOP/s of a matmul in ``dtype`` (``"torch.bfloat16"``, ``torch.float8_e4m3fn``, ``"int8"``).

        float32 gives the ``"tf32"`` figure when ``tf32`` is True (``torch.backends.cuda.matmul.allow_tf32``),
        else ``"fp32"``. A kind this GPU lacks falls back to the nearest slower path it has (bf16 on a T4 ->
        fp32, fp8 on an A100 -> bf16); never raises.
        """
        kind = _kind(dtype)
        if kind == "fp32" and tf32:
            kind = "tf32"
        return next(self.flops[k] for k in _FALLBACK[kind] if k in self.flops)


# ---- the figures: one row per product, TFLOP/s and GB/s as printed (dense), each with its source -----------

_T, _G = 1e12, 1e9


@dataclass(frozen=True)
class _Row:
    tflops: dict[str, float]
    hbm_gb_s: float
    nvlink_gb_s: float
    pcie_gb_s: float
    sources: dict[str, str]


_HALVED = "the bidirectional total halved"
_PCIE_GEN3 = f"PCIe Gen3 x16: 32 GB/s both directions, {_HALVED}"
_PCIE_GEN4 = f"PCIe Gen4 x16: 64 GB/s both directions, {_HALVED}"
_PCIE_GEN5 = f"PCIe Gen5 x16: 128 GB/s both directions, {_HALVED}"
_NO_NVLINK = "none: a PCIe card without NVLink"

_H100_SXM_FLOPS = {"fp64": 66.9, "fp32": 66.9, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4, "fp8": 1978.9,
                   "int8": 1978.9}  # fmt: skip
_A100_FLOPS = {"fp64": 19.5, "fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0, "int8": 624.0}
_H100_WP = (
    "NVIDIA H100 Tensor Core GPU Architecture whitepaper, the table comparing A100, H100 SXM5 and H100 PCIe, "
    "{col} column: Peak FP64 Tensor, FP32, TF32 / BF16 / FP16 / FP8 Tensor (FP32 accumulate) and INT8 Tensor, "
    "the first (dense) of each dense/sparse pair"
)

_ROWS: dict[str, _Row] = {
    "H100 SXM": _Row(
        _H100_SXM_FLOPS, 3350, 450, 64,
        {"flops": _H100_WP.format(col="H100 SXM5") + "; the H100 datasheet rounds them (67, 989, 1979, 3958 "
                  "with sparsity)",
         "hbm_bytes_per_s": "NVIDIA H100 datasheet, H100 SXM: GPU memory bandwidth 3.35 TB/s",
         "nvlink_bytes_per_s": f"H100 datasheet, H100 SXM: NVLink 900 GB/s (18 NVLink4 links), {_HALVED}",
         "pcie_bytes_per_s": f"H100 datasheet: {_PCIE_GEN5}"},
    ),
    "H100 PCIe": _Row(
        {"fp64": 51.2, "fp32": 51.2, "tf32": 378.0, "bf16": 756.0, "fp16": 756.0, "fp8": 1513.0, "int8": 1513.0},
        2000, 300, 64,
        {"flops": _H100_WP.format(col="H100 PCIe"),
         "hbm_bytes_per_s": "NVIDIA H100 datasheet, H100 PCIe: GPU memory bandwidth 2 TB/s",
         "nvlink_bytes_per_s": f"H100 datasheet, H100 PCIe: NVLink bridge 600 GB/s, {_HALVED}; only between the "
                               "two cards of a bridged pair",
         "pcie_bytes_per_s": f"H100 datasheet: {_PCIE_GEN5}"},
    ),
    "H100 NVL": _Row(
        {"fp64": 60.0, "fp32": 60.0, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5, "fp8": 1670.5, "int8": 1670.5},
        3900, 300, 64,
        {"flops": "NVIDIA H100 datasheet, H100 NVL column (per GPU): FP64 Tensor 60, FP32 60, and TF32 835, BF16 / "
                  "FP16 1671, FP8 / INT8 3341 with sparsity, halved (so the last half-unit is the halving's, not "
                  "the sheet's)",
         "hbm_bytes_per_s": "H100 datasheet, H100 NVL: GPU memory bandwidth 3.9 TB/s",
         "nvlink_bytes_per_s": f"H100 datasheet, H100 NVL: NVLink 600 GB/s, {_HALVED}; between the two cards of a "
                               "bridged pair",
         "pcie_bytes_per_s": f"H100 datasheet: {_PCIE_GEN5}"},
    ),
    "H200": _Row(
        _H100_SXM_FLOPS, 4800, 450, 64,
        {"flops": "NVIDIA H200 datasheet, H200 SXM: the same figures as the H100 SXM's datasheet (FP64 Tensor 67, "
                  "FP32 67, and TF32 989, BF16 / FP16 1979, FP8 / INT8 3958 with sparsity): the same GH100 at the "
                  "same clocks, so the H100 whitepaper's unrounded H100 SXM5 figures. "
                  + _H100_WP.format(col="H100 SXM5"),
         "hbm_bytes_per_s": "NVIDIA H200 datasheet, H200 SXM: GPU memory bandwidth 4.8 TB/s",
         "nvlink_bytes_per_s": f"H200 datasheet, H200 SXM: NVLink 900 GB/s, {_HALVED}",
         "pcie_bytes_per_s": f"H200 datasheet: {_PCIE_GEN5}"},
    ),
    "B200": _Row(
        {"fp64": 40.0, "fp32": 80.0, "tf32": 1100.0, "bf16": 2250.0, "fp16": 2250.0, "fp8": 4500.0, "int8": 4500.0},
        8000, 900, 64,
        {"flops": "NVIDIA Blackwell datasheet, HGX B200 column, per GPU at 1000 W: FP64 / FP64 Tensor 40, FP32 80, "
                  "and TF32 2.2 PF, FP16 / BF16 4.5 PF, FP8 9 PF, INT8 9 POPS with sparsity, halved. Less certain "
                  "than Hopper's: later HGX/DGX B200 sheets give FP64 37 TF (296 for 8 GPUs), and no whitepaper "
                  "gives unrounded figures",
         "hbm_bytes_per_s": "Blackwell datasheet, HGX B200: 8 TB/s per GPU (64 TB/s for 8)",
         "nvlink_bytes_per_s": f"Blackwell datasheet, HGX B200: fifth-generation NVLink 1.8 TB/s per GPU, {_HALVED}",
         "pcie_bytes_per_s": f"uncertain: B200 has PCIe Gen6, but HGX B200 hosts link at Gen5; {_PCIE_GEN5}"},
    ),
    "A100 80GB": _Row(
        _A100_FLOPS, 2039, 300, 32,
        {"flops": "NVIDIA A100 Tensor Core GPU Architecture whitepaper and A100 datasheet, A100 SXM4: Peak FP64 "
                  "Tensor 19.5, FP32 19.5, TF32 Tensor 156, BF16 / FP16 Tensor 312 (FP32 accumulate), INT8 Tensor "
                  "624 TOPS, dense; Ampere has no FP8",
         "hbm_bytes_per_s": "NVIDIA A100 datasheet, A100 80GB SXM: GPU memory bandwidth 2,039 GB/s",
         "nvlink_bytes_per_s": f"A100 datasheet, SXM: NVLink 600 GB/s (12 NVLink3 links), {_HALVED}",
         "pcie_bytes_per_s": f"A100 datasheet: {_PCIE_GEN4}"},
    ),
    "A100 40GB": _Row(
        _A100_FLOPS, 1555, 300, 32,
        {"flops": "NVIDIA A100 Tensor Core GPU Architecture whitepaper and A100 datasheet, A100 SXM4: as the 80GB "
                  "(the same GA100 at the same clocks)",
         "hbm_bytes_per_s": "NVIDIA A100 datasheet, A100 40GB SXM: GPU memory bandwidth 1,555 GB/s",
         "nvlink_bytes_per_s": f"A100 datasheet, SXM: NVLink 600 GB/s (12 NVLink3 links), {_HALVED}",
         "pcie_bytes_per_s": f"A100 datasheet: {_PCIE_GEN4}"},
    ),
    "L40S": _Row(
        {"fp64": 1.43, "fp32": 91.6, "tf32": 183.0, "bf16": 362.05, "fp16": 362.05, "fp8": 733.0, "int8": 733.0},
        864, 0, 32,
        {"flops": "NVIDIA L40S datasheet: FP32 91.6, TF32 Tensor 183, BF16 / FP16 Tensor 362.05, FP8 733, INT8 733 "
                  "TOPS (the dense of each dense | sparse pair). Uncertain: the sheet does not say these BF16/FP16 "
                  "figures hold with FP32 accumulate (the L40's sheet gives 181.05 with FP32 accumulate)",
         "flops.fp64": "not on the datasheet: FP32 / 64 (Ada SMs have 2 FP64 units per 128 FP32 lanes, NVIDIA Ada "
                       "Lovelace GPU Architecture whitepaper)",
         "hbm_bytes_per_s": "L40S datasheet: GDDR6 864 GB/s",
         "nvlink_bytes_per_s": _NO_NVLINK,
         "pcie_bytes_per_s": f"L40S datasheet: {_PCIE_GEN4}"},
    ),
    "L4": _Row(
        {"fp64": 0.47, "fp32": 30.3, "tf32": 60.0, "bf16": 121.0, "fp16": 121.0, "fp8": 242.5, "int8": 242.5},
        300, 0, 32,
        {"flops": "NVIDIA L4 datasheet: FP32 30.3, and TF32 120, BF16 / FP16 242, FP8 / INT8 485 with sparsity, "
                  "halved. Uncertain: as for the L40S, whether BF16/FP16 hold with FP32 accumulate (third-party "
                  "tables give half); a 72 W card that seldom holds its boost clock under tensor load",
         "flops.fp64": "not on the datasheet: FP32 / 64 (Ada, 2 FP64 units per SM)",
         "hbm_bytes_per_s": "L4 datasheet: GDDR6 300 GB/s",
         "nvlink_bytes_per_s": _NO_NVLINK,
         "pcie_bytes_per_s": f"L4 datasheet: {_PCIE_GEN4}"},
    ),
    "A10G": _Row(
        {"fp64": 0.49, "fp32": 31.2, "tf32": 62.5, "bf16": 125.0, "fp16": 125.0, "int8": 250.0}, 600, 0, 32,
        {"flops": "uncertain: NVIDIA publishes no A10G datasheet (an AWS part, 80 SMs per gpus.py) and AWS no peak; "
                  "these are the NVIDIA A10 datasheet's (72 SMs): FP32 31.2, TF32 Tensor 62.5, BF16 / FP16 Tensor "
                  "125, INT8 Tensor 250 TOPS (the dense of each dense | sparse pair); GA10x has no FP8",
         "flops.fp64": "not on the datasheet: FP32 / 64 (GA10x, 2 FP64 units per SM, NVIDIA Ampere GA102 whitepaper)",
         "hbm_bytes_per_s": "NVIDIA A10 datasheet: GDDR6 600 GB/s (AWS: the A10G has the same 24 GB GDDR6)",
         "nvlink_bytes_per_s": _NO_NVLINK,
         "pcie_bytes_per_s": f"A10 datasheet: {_PCIE_GEN4}"},
    ),
    "A10": _Row(
        {"fp64": 0.49, "fp32": 31.2, "tf32": 62.5, "bf16": 125.0, "fp16": 125.0, "int8": 250.0}, 600, 0, 32,
        {"flops": "NVIDIA A10 Tensor Core GPU datasheet: FP32 31.2, TF32 Tensor Core 62.5, BFLOAT16 / FP16 Tensor "
                  "Core 125, INT8 Tensor Core 250 TOPS (the dense of each dense | sparse pair: 125 | 250*, ...); a "
                  "data-centre GA102, whose FP16/BF16 tensor rate with FP32 accumulate is the full rate (unlike "
                  "GeForce); GA10x has no FP8",
         "flops.fp64": "not on the datasheet: FP32 / 64 (GA10x, 2 FP64 units per SM, NVIDIA Ampere GA102 whitepaper)",
         "hbm_bytes_per_s": "NVIDIA A10 datasheet: 24 GB GDDR6, 600 GB/s",
         "nvlink_bytes_per_s": _NO_NVLINK,
         "pcie_bytes_per_s": f"A10 datasheet: {_PCIE_GEN4}"},
    ),
    "RTX A6000": _Row(
        {"fp64": 0.605, "fp32": 38.7, "tf32": 77.4, "bf16": 154.8, "fp16": 154.8, "int8": 309.7}, 768, 56.25, 32,
        {"flops": "NVIDIA RTX A6000 datasheet: Single-precision 38.7, Tensor performance 309.7 (FP16 with sparsity), "
                  "halved; the NVIDIA Ampere GA102 GPU Architecture whitepaper's RTX A6000 column: TF32 Tensor 77.4, "
                  "BF16 / FP16 Tensor with FP32 accumulate 154.8 (a professional card: full rate with FP32 "
                  "accumulate), INT8 Tensor 309.7 TOPS, dense. Uncertain: the whitepaper's figures as recalled, not "
                  "re-read here; the datasheet's two (38.7, 309.7) agree with them, and with 84 SMs at 1.80 GHz",
         "flops.fp64": "not on the datasheet: FP32 / 64 (GA10x, 2 FP64 units per SM, NVIDIA Ampere GA102 whitepaper)",
         "hbm_bytes_per_s": "NVIDIA RTX A6000 datasheet: 48 GB GDDR6 with ECC, 768 GB/s",
         "nvlink_bytes_per_s": f"RTX A6000 datasheet: NVLink bridge of two cards, 112.5 GB/s, {_HALVED}; only between "
                               "the two cards of a bridged pair",
         "pcie_bytes_per_s": f"RTX A6000 datasheet: {_PCIE_GEN4}"},
    ),
    "T4": _Row(
        {"fp64": 0.25, "fp32": 8.1, "fp16": 65.0, "int8": 130.0}, 320, 0, 16,
        {"flops": "NVIDIA T4 datasheet: Single-Precision 8.1, Mixed-Precision (FP16/FP32) 65, INT8 130 TOPS; "
                  "Turing has no BF16, TF32 or FP8 tensor path",
         "flops.fp64": "not on the datasheet: FP32 / 32 (Turing TU10x, NVIDIA Turing GPU Architecture whitepaper)",
         "hbm_bytes_per_s": "T4 datasheet: GDDR6 320+ GB/s",
         "nvlink_bytes_per_s": _NO_NVLINK,
         "pcie_bytes_per_s": f"T4 datasheet: {_PCIE_GEN3}"},
    ),
    "V100 SXM2": _Row(
        {"fp64": 7.8, "fp32": 15.7, "fp16": 125.0}, 900, 150, 16,
        {"flops": "NVIDIA V100 datasheet, V100 SXM2 column: Double-Precision 7.8, Single-Precision 15.7, Tensor "
                  "Performance 125 (FP16 with FP32 accumulate); Volta has no BF16, TF32, FP8 or INT8 tensor path",
         "hbm_bytes_per_s": "V100 datasheet, SXM2: HBM2 900 GB/s (16 and 32 GB alike)",
         "nvlink_bytes_per_s": f"V100 datasheet, SXM2: NVLink 300 GB/s (6 NVLink2 links), {_HALVED}",
         "pcie_bytes_per_s": f"V100 datasheet: {_PCIE_GEN3}"},
    ),
    "RTX 3090": _Row(
        {"fp64": 0.556, "fp32": 35.6, "tf32": 35.6, "bf16": 71.0, "fp16": 71.0, "int8": 284.0}, 936, 56.25, 32,
        {"flops": "NVIDIA Ampere GA102 GPU Architecture whitepaper, the GeForce RTX 3090 column: Peak FP32 35.6, "
                  "Peak FP64 0.556, Peak TF32 Tensor 35.6, Peak BF16 / FP16 Tensor with FP32 accumulate 71 (142 with "
                  "FP16 accumulate, which PyTorch does not use), Peak INT8 Tensor 284 TOPS, dense; GA10x has no FP8",
         "hbm_bytes_per_s": "GA102 whitepaper, RTX 3090: GDDR6X 936 GB/s",
         "nvlink_bytes_per_s": f"GA102 whitepaper: NVLink bridge of two RTX 3090s (4 x4 links) 112.5 GB/s, {_HALVED}",
         "pcie_bytes_per_s": _PCIE_GEN4},
    ),
    "RTX 4090": _Row(
        {"fp64": 1.29, "fp32": 82.6, "tf32": 82.6, "bf16": 165.2, "fp16": 165.2, "fp8": 330.3, "int8": 660.6},
        1008, 0, 32,
        {"flops": "NVIDIA Ada Lovelace GPU Architecture whitepaper, appendix table, GeForce RTX 4090: Peak FP32 "
                  "82.6, Peak TF32 Tensor 82.6, Peak BF16 / FP16 Tensor with FP32 accumulate 165.2 (330.3 with FP16 "
                  "accumulate), Peak FP8 Tensor with FP32 accumulate 330.3 (torch._scaled_mm accumulates in FP32), "
                  "Peak INT8 Tensor 660.6 TOPS, dense",
         "flops.fp64": "FP32 / 64 (the whitepaper's Peak FP64 rounds it to 1.3)",
         "hbm_bytes_per_s": "Ada whitepaper, RTX 4090: GDDR6X 1008 GB/s",
         "nvlink_bytes_per_s": _NO_NVLINK,
         "pcie_bytes_per_s": _PCIE_GEN4},
    ),
    "RTX 5090": _Row(
        {"fp64": 1.64, "fp32": 104.8, "tf32": 104.8, "bf16": 209.5, "fp16": 209.5, "fp8": 419.0, "int8": 838.0},
        1792, 0, 64,
        {"flops": "NVIDIA RTX Blackwell GPU Architecture whitepaper, GeForce RTX 5090: Peak FP32 104.8, TF32 Tensor "
                  "104.8, BF16 / FP16 Tensor with FP32 accumulate 209.5 (419 with FP16 accumulate), FP8 with FP32 "
                  "accumulate 419, INT8 838 TOPS, dense. Less certain than the Ada row: checked against 170 SMs at "
                  "the 2.407 GHz boost clock (GeForce tensor cores at half rate with FP32 accumulate, as on Ada)",
         "flops.fp64": "FP32 / 64 (2 FP64 units per SM), not on the whitepaper's table",
         "hbm_bytes_per_s": "RTX Blackwell whitepaper, RTX 5090: GDDR7 1792 GB/s",
         "nvlink_bytes_per_s": _NO_NVLINK,
         "pcie_bytes_per_s": _PCIE_GEN5},
    ),
    "MI300X": _Row(
        {"fp64": 163.4, "fp32": 163.4, "tf32": 653.7, "bf16": 1307.4, "fp16": 1307.4, "fp8": 2614.9, "int8": 2614.9},
        5300, 448, 64,
        {"flops": "AMD Instinct MI300X data sheet and AMD CDNA 3 architecture whitepaper: Peak FP64 Matrix 163.4, "
                  "FP32 Matrix 163.4, TF32 Matrix 653.7, FP16 / BF16 1307.4, FP8 2614.9, INT8 2614.9 TOPS, dense "
                  "(the with-sparsity figures are twice). Uncertain for tf32: whether PyTorch on ROCm uses TF32 "
                  "(xf32) under allow_tf32 depends on its version and hipBLASLt settings",
         "hbm_bytes_per_s": "MI300X data sheet: HBM3 5.3 TB/s",
         "nvlink_bytes_per_s": "AMD Infinity Fabric, MI300X data sheet: 7 links to the other GPUs of an 8-GPU "
                               "platform, 128 GB/s each (x16 at 32 GT/s, both directions): 896 GB/s, "
                               f"{_HALVED}; AMD's per-link figure read as bidirectional (uncertain)",
         "pcie_bytes_per_s": f"MI300X data sheet: {_PCIE_GEN5}"},
    ),
    "MI250X GCD": _Row(
        {"fp64": 47.85, "fp32": 47.85, "bf16": 191.5, "fp16": 191.5, "int8": 191.5}, 1638.4, 200, 32,
        {"flops": "AMD Instinct MI250X data sheet (one OAM package of two GCDs): Peak FP64 / FP32 Matrix 95.7, "
                  "FP16 / BF16 383, INT8 383 TOPS, halved: gpus.py's MI250X is one GCD, one torch device of 110 "
                  "CUs. CDNA 2 has no TF32 or FP8",
         "hbm_bytes_per_s": "MI250X data sheet: HBM2e 3.2 TB/s (3276.8 GB/s) per package, halved per GCD",
         "nvlink_bytes_per_s": "uncertain: MI250X data sheet: up to 8 Infinity Fabric links of 100 GB/s (x16 at "
                               "25 GT/s, 50 GB/s each way) per package, taken as 4 per GCD at 50 GB/s each way "
                               "(the in-package link between the two GCDs not counted)",
         "pcie_bytes_per_s": f"MI250X data sheet: {_PCIE_GEN4}, per package; a GCD alone may use all of it "
                             "(uncertain: the two GCDs share it)"},
    ),
}  # fmt: skip

# Catalog name (fakeviz._core.gpus.GPUS) -> row. "H100" is the SXM5 part ("NVIDIA H100 80GB HBM3"), "A100" the
# 80GB SXM4; the V100s are SXM2 (gpus.DEVICE_NAMES).
_ROW_OF = {
    "H100": "H100 SXM", "H100 80GB": "H100 SXM", "H100 PCIe": "H100 PCIe", "H100 NVL": "H100 NVL", "H200": "H200",
    "B200": "B200", "A100 80GB": "A100 80GB", "A100": "A100 80GB", "A100 40GB": "A100 40GB", "L40S": "L40S",
    "L4": "L4", "A10G": "A10G", "T4": "T4", "V100 32GB": "V100 SXM2", "V100 16GB": "V100 SXM2",
    "RTX 3090": "RTX 3090", "RTX 4090": "RTX 4090", "RTX 5090": "RTX 5090", "MI300X": "MI300X",
    "MI250X": "MI250X GCD", "A10": "A10", "RTX A6000": "RTX A6000",
}  # fmt: skip
assert set(GPUS) <= set(_ROW_OF), f"figures for every catalog GPU: {sorted(set(GPUS) - set(_ROW_OF))}"
assert set(_ROW_OF.values()) == set(_ROWS), "every row is some catalog GPU's"

_CATALOG_SOURCES = {
    "memory_bytes": "fakeviz._core.gpus.GPUS: the total memory the driver reports (nvidia-smi / rocm-smi MiB)",
    "sms": "fakeviz._core.gpus.MULTIPROCESSORS: streaming multiprocessors (NVIDIA) or compute units (AMD)",
}


def _spec(name: str) -> GPUSpec:
    row = _ROWS[_ROW_OF[name]]
    assert "fp32" in row.tflops and set(row.tflops) <= set(FLOP_KINDS), name
    return GPUSpec(
        name=name,
        memory_bytes=GPUS[name],
        sms=MULTIPROCESSORS[name],
        flops={k: float(round(row.tflops[k] * _T)) for k in FLOP_KINDS if k in row.tflops},  # 66.9e12, not ...01
        hbm_bytes_per_s=float(round(row.hbm_gb_s * _G)),
        nvlink_bytes_per_s=float(round(row.nvlink_gb_s * _G)),
        pcie_bytes_per_s=float(round(row.pcie_gb_s * _G)),
        sources={**_CATALOG_SOURCES, **row.sources},
    )


#: Every catalog GPU's spec, by its catalog name (aliases such as ``"H100 80GB"`` included).
GPU_SPECS: dict[str, GPUSpec] = {name: _spec(name) for name in GPUS}


def gpu_spec(name: str | GPUSpec | Capacity) -> GPUSpec:
    """The spec of a catalog GPU, by any name :mod:`fakeviz._core.gpus` accepts (``"H100"``, ``"h100-80gb"``,
    ``"a100_40gb"``), or a :class:`~fakeviz._core.gpus.Capacity` that names one; a :class:`GPUSpec` is returned
    as is.

    Raises:
        ArgumentError: (a ``ValueError``) not a catalog GPU (a size such as ``"80GB"`` has no speed), with the
            nearest catalog names as ``suggestions``.
    """
    if isinstance(name, GPUSpec):
        return name
    cap: Capacity | None = name if isinstance(name, Capacity) else None
    if cap is None and isinstance(name, str):
        try:
            cap = Capacity.parse(name)
        except ValueError:
            cap = None
    if cap is not None and cap.gpu is not None:
        return GPU_SPECS[cap.gpu]
    near = () if cap is not None else _near(str(name))
    problem = "a memory size, not a GPU: a speed needs a GPU kind" if cap is not None else "not a GPU fakeviz knows"
    hint = f"Did you mean {' or '.join(repr(n) for n in near)}? " if near else ""
    raise ArgumentError("gpu", name, problem, f"{hint}The catalog's GPUs: {', '.join(GPU_SPECS)}.",
                        suggestions=near)  # fmt: skip


def _near(text: str) -> tuple[str, ...]:
    """Catalog names close to ``text`` (case, spaces, dashes and underscores ignored), best first, at most 3."""
    key = " ".join(text.upper().replace("-", " ").replace("_", " ").split())
    by_key = {n.upper(): n for n in GPU_SPECS}
    return tuple(by_key[k] for k in difflib.get_close_matches(key, list(by_key), n=3, cutoff=0.5))
