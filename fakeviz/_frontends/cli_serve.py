"""``fakeviz serve MODEL --gpus H100 --max-model-len 8192``: :func:`fakeviz.serve` on the command line (the
``serve`` subcommand of :mod:`fakeviz._frontends.cli`, which adds it with :func:`add_parser`).

Prints what vLLM would allocate (the budget, KV cache blocks, maximum concurrency, longest context) or vLLM's own
error when it would not start (exit 1); ``--json`` prints the figures as JSON instead. A value ``fv.serve`` refuses
is named as its option (``--block-size 24: ...``), exit 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from .._core.fmt import visible

__all__ = ["add_parser", "serve_command"]

_QUANT = ("nf4", "fp4", "int8", "int4", "fp8")
_KV_DTYPES = ("auto", "bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2")
# fv.serve's argument -> the option that sets it
_OPTIONS = {
    "gpus": "--gpus", "max_model_len": "--max-model-len", "gpu_memory_utilization": "--gpu-memory-utilization",
    "block_size": "--block-size", "quantization": "--quant", "dtype": "--dtype", "kv_cache_dtype": "--kv-cache-dtype",
    "max_num_batched_tokens": "--max-num-batched-tokens", "max_num_seqs": "--max-num-seqs",
    "tensor_parallel_size": "--tensor-parallel-size",
}  # fmt: skip


def add_parser(sub: Any) -> None:
    """Add ``serve`` to the command line's subcommands ``sub`` (argparse's subparsers action)."""
    s = sub.add_parser(
        "serve", help="serving capacity as vLLM computes it: KV cache blocks, max concurrency, longest context",
        description="Record vLLM's profile run of MODEL on a fake GPU and say how many KV cache blocks and requests "
                    "of --max-model-len tokens fit (vLLM's own arithmetic; its error when it would not start).",
    )  # fmt: skip
    s.add_argument("model", metavar="MODEL_OR_FOLDER", help="catalog name or alias, folder, or config.json")
    s.add_argument(
        "--gpus", default="H100", metavar="GPU", help="the GPU: H100, 1xH100, A100-40GB, 80GB (default H100)"
    )
    s.add_argument("--max-model-len", type=int, default=8192, help="tokens of one request (default 8192)")
    s.add_argument("--gpu-memory-utilization", type=float, default=0.9, help="fraction of GPU memory (default 0.9)")
    s.add_argument("--block-size", type=int, default=16, help="tokens per KV cache block (default 16)")
    s.add_argument("--quant", choices=_QUANT, default=None, help="quantize the weights: nf4, fp4, int8, int4, fp8")
    s.add_argument("--dtype", default=None, help="the model's dtype (default: vLLM's auto)")
    s.add_argument("--kv-cache-dtype", choices=_KV_DTYPES, default="auto", help="KV cache dtype (default auto)")
    s.add_argument("--max-num-batched-tokens", type=int, default=None,
                   help="tokens of one scheduler step (default vllm serve's: 8192 on >= 70 GiB GPUs but A100, else 2048)")  # fmt: skip
    s.add_argument("--max-num-seqs", type=int, default=None, help="requests at once (default 1024, or 256)")
    s.add_argument(
        "--tensor-parallel-size",
        type=int,
        default=1,
        help="GPUs the model is split over (default 1; --gpus names as many)",
    )
    s.add_argument("--json", action="store_true", help="print the figures as JSON")
    s.add_argument("--verbose", action="store_true", help="tracebacks for errors")
    s.set_defaults(fn=serve_command)


def serve_command(args: argparse.Namespace) -> int:
    """Run ``fakeviz serve``: 0 when vLLM would start, 1 when it would not (its error printed)."""
    from .._core.errors import ArgumentError
    from .serving import serve

    kw = {
        "max_model_len": args.max_model_len, "gpu_memory_utilization": args.gpu_memory_utilization,
        "block_size": args.block_size, "quantization": args.quant, "dtype": args.dtype,
        "kv_cache_dtype": args.kv_cache_dtype, "max_num_batched_tokens": args.max_num_batched_tokens,
        "max_num_seqs": args.max_num_seqs, "tensor_parallel_size": args.tensor_parallel_size,
    }  # fmt: skip
    try:
        s = serve(args.model, args.gpus, **kw)
    except ArgumentError as exc:
        opt = _OPTIONS.get(exc.argument)
        if opt is None:
            raise
        given = args.gpus if exc.argument == "gpus" else kw.get(exc.argument)
        raise exc.reworded(f"{opt} {given}") from exc
    if args.json:
        json.dump(s.to_dict(), sys.stdout, indent=1)
        print()
    else:
        print(visible(s.text, lines=True))  # Note: [bidi controls in names]
    return 0 if s.fits else 1
