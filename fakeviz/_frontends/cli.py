"""The command line: ``fakeviz report MODEL_OR_FOLDER`` (also ``python -m fakeviz``), ``fakeviz demo``.

``fakeviz report meta-llama/Llama-3.1-405B --train --seq 4096 --gpus 8xH100 --html out.html`` builds the
model of a catalog name (``fakeviz.models``), a checkpoint folder or a ``config.json`` under fake tensors,
records one run of it (inference forward, ``--train`` steps or ``--generate N`` tokens), prints a short
table (parameters, peak per device by category, the verdict and the first op that fails) and writes the
explorer as one self-contained HTML file. ``fakeviz report trace.fvz`` summarises a saved trace.

Exit codes: 0 a report was made (whether or not the model fits), 1 the run failed (the partial record is
reported), 2 a usage error (a bad option, an unknown model: one line, no traceback; ``--verbose`` shows it).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

from .._core.fmt import visible
from .._core.limits import MAX_REPEATS
from .._core.notices import quiet_import_notices, verbose_requested

__all__ = ["main"]

_QUANT = ("nf4", "fp4", "int8", "int4", "fp8")
_DEFAULT_GPU = "H100"


class UsageError(Exception):
    """A bad command line: printed as one line, exit code 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # argparse prints usage + message and exits; we want one line
        raise UsageError(f"{message} (see '{self.prog} --help')")


# ------------------------------------------------------------------------------------------ options
def _positive(name: str, most: int | None = None, low: int = 1) -> Any:
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} takes a whole number, not {text!r}") from None
        if v < low:
            raise argparse.ArgumentTypeError(f"{name} must be at least {low}, not {v}")
        if most is not None and v > most:  # Note: [size limits]
            raise argparse.ArgumentTypeError(f"{name} is at most {most:,} (each one is recorded), not {v:,}")
        return v

    return parse


def _dtype(text: str) -> str:
    """``--dtype``: read as ``models.build(dtype=...)`` and ``fv.record(dtype=...)`` read it
    (:func:`fakeviz._engine.arguments.as_dtype`); the canonical name (``"bfloat16"``)."""
    from .._engine.arguments import as_dtype

    try:
        return str(as_dtype(text)).removeprefix("torch.")
    except ValueError:
        raise argparse.ArgumentTypeError(f"unknown dtype {text!r}: use bf16, fp16, fp32, fp64 or fp8") from None


def gpus_option(text: str) -> tuple[int, str]:
    """``--gpus``: ``"8xH100"`` -> ``(8, "H100")`` (:func:`fakeviz._core.gpus.split_gpus`: ``gpus=``'s one parser).

    Raises:
        ArgumentError: (a ``ValueError``) naming ``--gpus`` as written (a count alone: of which GPU?).
    """
    from .._core.gpus import split_gpus

    return split_gpus(text, written=f"--gpus {text!r}")


# options that take a value: "--gpus -1GB" is that option's value, not an option of its own (argparse reads a
# word that starts with "-" and is not a plain negative number as an option, and says "expected one argument")
_NEGATIVE = re.compile(r"-[0-9.]")


def _value_options(parser: argparse.ArgumentParser) -> set[str]:
    """The option strings that take one value, in ``parser`` and its subcommands."""
    out: set[str] = set()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                out |= _value_options(sub)
        elif action.option_strings and action.nargs is None:
            out |= set(action.option_strings)
    return out


def _join_negative_values(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """``["--gpus", "-1GB"]`` -> ``["--gpus=-1GB"]`` for every option that takes one value, so that its own
    check refuses the value by name instead of argparse's "expected one argument"."""
    takes = _value_options(parser)
    out: list[str] = []
    i = 0
    while i < len(argv):
        if argv[i] in takes and i + 1 < len(argv) and _NEGATIVE.match(argv[i + 1]):
            out.append(f"{argv[i]}={argv[i + 1]}")
            i += 2
        else:
            out.append(argv[i])
            i += 1
    return out


def _parser() -> _Parser:
    p = _Parser(prog="fakeviz", description="fakeviz: memory, FLOPs and ops of a PyTorch run, without the hardware.")
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=_Parser)
    r = sub.add_parser(
        "report", help="record a model (catalog name, checkpoint folder, config.json) or summarise a saved .fvz",
        description="Build MODEL under fake tensors, record one run and report its memory (or summarise a .fvz).",
    )  # fmt: skip
    r.add_argument("model", metavar="MODEL_OR_FOLDER", help="catalog name or alias, folder, config.json, or .fvz")
    r.add_argument("--batch", type=_positive("--batch"), default=1, help="batch size (default 1)")
    r.add_argument("--seq", type=_positive("--seq"), default=2048,
                   help="sequence length (default 2048; past the model's context: refused); the prompt with --generate")  # fmt: skip
    r.add_argument("--dtype", type=_dtype, default=None, help="bf16, fp16 or fp32 (default: the published weights')")
    mode = r.add_mutually_exclusive_group()
    mode.add_argument("--train", action="store_true", help="training steps: forward with a loss, backward, step")
    mode.add_argument("--generate", type=_positive("--generate"), metavar="N", default=0,
                      help="generate N tokens after a --seq prompt (greedy, KV cache)")  # fmt: skip
    r.add_argument("--optim", "--optimizer", dest="optimizer", default=None, metavar="NAME",
                   help="with --train: adamw (default), adamw_fused, adam, adafactor, adamw8bit, paged_adamw8bit, "
                        "adamw8bit_ao, adamw4bit_ao, sgd or none")  # fmt: skip
    r.add_argument("--quant", choices=_QUANT, default=None,
                   help="quantize the weights: nf4, fp4, int8 (bitsandbytes), int4, fp8 (torchao); --train needs --lora")  # fmt: skip
    r.add_argument("--lora", type=_positive("--lora"), default=None, metavar="RANK",
                   help="LoRA adapters of this rank on every linear layer (peft; with --quant: QLoRA)")  # fmt: skip
    r.add_argument("--steps", type=_positive("--steps", MAX_REPEATS), default=None,
                   help="training steps (default 2: the second holds the first's optimizer state, as later ones do)")  # fmt: skip
    r.add_argument("--checkpointing", nargs="?", const=True, default=False, metavar="FORM", help="with --train: "
                   "activation checkpointing: full (no value), selective (op-level SAC) or N (every N-th block)")  # fmt: skip
    r.add_argument("--cache", choices=("dynamic", "static"), default="dynamic", help="KV cache with --generate")
    where = r.add_mutually_exclusive_group()
    where.add_argument("--gpus", default=None, metavar="NxGPU",
                       help=f"GPUs, e.g. 8xH100 or H100 (default {_DEFAULT_GPU}): the verdict, torch.cuda's answers")  # fmt: skip
    where.add_argument("--capacity", default=None, help="memory per device for the verdict, e.g. 80GB")
    r.add_argument("--device", default="cuda:0", help="where the model runs (default cuda:0)")
    r.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field, e.g. --set num_hidden_layers=4 (repeatable)")  # fmt: skip
    r.add_argument("--html", type=Path, default=None, help="write the explorer as one self-contained HTML file")
    r.add_argument("--json", type=Path, default=None, help="write the report as JSON")
    r.add_argument("--save", type=Path, default=None, help="save the trace (.fvz)")
    r.add_argument("--oplog", type=_positive("--oplog", low=0), default=0, help="also print the first N op-log lines")
    r.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="a progress line on stderr while recording (default: when stderr is a terminal)")  # fmt: skip
    r.add_argument("--verbose", action="store_true", help="tracebacks for errors")
    r.set_defaults(fn=report)
    d = sub.add_parser("demo", help="record a Llama-3-70B-shaped fwd+bwd under fake tensors")
    d.add_argument("--model", default="llama3-70b")
    d.add_argument("--layers", type=int, default=0, help="override the number of layers (0: the config's)")
    d.add_argument("--device", default="cuda:0")
    d.add_argument("--batch", type=int, default=1)
    d.add_argument("--seq", type=int, default=2048)
    d.add_argument("-o", "--output", default="fakeviz-demo.fvz")
    d.add_argument("--gpu", default="H100", help="GPU (catalog name) or capacity for the fits / does-not-fit verdict")
    d.add_argument("--verbose", action="store_true", help="tracebacks for errors")
    d.set_defaults(fn=demo)
    from .cli_serve import add_parser as add_serve  # fakeviz serve (fakeviz/_frontends/cli_serve.py)

    add_serve(sub)
    return p


def _overrides(items: list[str]) -> dict[str, Any]:
    """``--set KEY=VALUE`` items as config overrides (VALUE read as JSON when it is JSON: ``4``, ``true``)."""
    out: dict[str, Any] = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not key.strip().isidentifier():
            raise UsageError(f"--set {item!r}: use KEY=VALUE, e.g. --set num_hidden_layers=4")
        try:
            out[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            out[key.strip()] = value
    return out


def _check(args: argparse.Namespace) -> None:
    """Option combinations argparse cannot express."""
    if not args.train:
        for flag, given in (("--optim", args.optimizer), ("--steps", args.steps), ("--checkpointing",
                            args.checkpointing)):  # fmt: skip
            if given:
                raise UsageError(f"{flag} needs --train")
    if args.optimizer is not None:
        from .._core.errors import ArgumentError
        from .steps import check_optimizer

        try:
            args.optimizer = check_optimizer(args.optimizer, written=f"--optim {args.optimizer!r}")
        except ArgumentError as exc:
            raise UsageError(_first_line(exc) + (f"; did you mean {exc.suggestions[0]!r}?" if exc.suggestions else
                             "; --help lists them")) from exc  # fmt: skip
    if args.checkpointing is not False:
        from .steps import check_checkpointing

        try:  # an ArgumentError (a ValueError): its one line
            args.checkpointing = check_checkpointing(args.checkpointing, written=f"--checkpointing {args.checkpointing}")  # fmt: skip
        except ValueError as exc:
            raise UsageError(_first_line(exc)) from exc
    if args.quant and args.train and not args.lora:
        raise UsageError(f"--quant {args.quant} --train: quantized weights do not train; add --lora RANK (QLoRA)")
    if args.cache != "dynamic" and not args.generate:
        raise UsageError("--cache needs --generate")
    if args.gpus is not None:
        from .._core.errors import ArgumentError

        try:
            args.gpus_parsed = gpus_option(args.gpus)
        except ArgumentError as exc:
            raise UsageError(f"{exc.written}: {exc.problem} (write e.g. --gpus 8xH100, H100 or 2x80GB)") from exc
    if args.capacity is not None:
        from .._core.gpus import Capacity

        try:
            Capacity.parse(args.capacity)
        except ValueError as exc:
            raise UsageError(f"--capacity {args.capacity!r}: {_first_line(exc)}") from exc
    from .._core.errors import ArgumentError
    from .._engine.arguments import fake_device

    try:
        fake_device(args.device, written=f"--device {args.device!r}")
    except ArgumentError as exc:
        raise UsageError(f"{exc.written}: {exc.problem} (use cuda:N, cpu or meta)") from exc
    source = Path(args.model) if isinstance(getattr(args, "model", None), str) else None
    for flag in ("html", "json", "save"):  # before any work: a run of minutes must not end in "no such folder"
        path = getattr(args, flag)
        if path is not None:
            _check_output(f"--{flag}", path, source)


def _check_output(flag: str, path: Path, source: Path | None = None) -> None:
    """``path`` can be written: its folder exists, it is not a folder itself, not the file being read
    (``source``), and for ``--save`` a regular file or a new path (else a one-line UsageError)."""
    folder = path.parent
    if not folder.is_dir():
        raise UsageError(f"{flag} {str(path)!r}: no folder {str(folder)!r} to write it in")
    if path.is_dir():
        raise UsageError(f"{flag} {str(path)!r}: a folder; give a file name")
    if source is not None and source.is_file() and path.exists() and os.path.samefile(path, source):
        raise UsageError(f"{flag} {str(path)!r}: the file being read; give another file name")
    if flag == "--save" and path.exists() and not path.is_file():
        raise UsageError(f"{flag} {str(path)!r}: not a regular file (a device, FIFO or socket); saving never "
                         "replaces one: give a file name")  # fmt: skip


def _print(*args: Any, **kwargs: Any) -> None:
    """``print``, each control character in a name or message written out (Note: [bidi controls in names])."""
    print(*(visible(a, lines=True) for a in args), **kwargs)


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


# ----------------------------------------------------------------------------------------- progress
class _Progress:
    """One line on stderr, rewritten in place at most 10 times a second: what is being recorded."""

    def __init__(self, on: bool) -> None:
        self.on = on
        self.last = 0.0
        self.t0 = time.perf_counter()
        self.width = 0

    def say(self, text: str, *, force: bool = False) -> None:
        if not self.on:
            return
        now = time.perf_counter()
        if not force and now - self.last < 0.1:
            return
        self.last = now
        line = f"fakeviz: {text} [{now - self.t0:.0f} s]"[:160]
        sys.stderr.write("\r" + line.ljust(self.width))
        sys.stderr.flush()
        self.width = len(line)

    def __call__(self, n_ops: int, phase: str, module: str | None) -> None:  # the recorder's progress callback
        self.say(f"recording {n_ops:,} ops, {phase} {module or ''}".rstrip())

    def done(self) -> None:
        if self.on and self.width:
            sys.stderr.write("\r" + " " * self.width + "\r")
            sys.stderr.flush()
            self.width = 0


# ------------------------------------------------------------------------------------------- report
def report(args: argparse.Namespace) -> int:
    _check(args)
    path = Path(args.model)
    if path.suffix == ".fvz":
        if not path.is_file():
            raise FileNotFoundError(f"no such trace file: {path}")
        return _report_saved(args, path)
    return _report_model(args)


def _report_saved(args: argparse.Namespace, path: Path) -> int:
    from .._trace import load
    from .._views.text import summary

    trace = load(path)
    if args.capacity or args.gpus:
        trace.meta["capacity"] = args.capacity or args.gpus_parsed[1]
    _print(summary(trace))
    if args.gpus:
        from .._core.gpus import Capacity
        from . import steps as _steps

        kind = Capacity.parse(args.gpus_parsed[1]).gpu
        note = "" if kind else f"--gpus {args.gpus} gives memory only, no GPU kind; name the GPU (e.g. --gpus H100)"
        sp = _steps.speed([(trace, 1)], gpu=kind, gpus=1, tokens=None, note=note)
        _print(_speed_line({"gpus": 1}, sp.as_dict()))
    if args.oplog:
        _print(trace.oplog(limit=args.oplog))
    _write_outputs(args, trace, None)
    return 0


def _report_model(args: argparse.Namespace) -> int:
    progress = _Progress(args.progress if args.progress is not None else sys.stderr.isatty())
    progress.say("importing torch and transformers", force=True)
    import torch

    from .. import models
    from .._api import record
    from .._core.errors import RecordError
    from .._core.gpus import Capacity

    n_gpus, gpu = args.gpus_parsed if args.gpus else (1, None)
    capacity = args.capacity or gpu or _DEFAULT_GPU
    named = Capacity.parse(capacity).capability is not None
    on_cuda = torch.device(args.device).type == "cuda"
    overrides = _overrides(args.set)
    info: dict[str, Any] = {
        "model": args.model, "capacity": capacity, "capacity_label": Capacity.parse(capacity).label, "gpus": n_gpus,
    }  # fmt: skip
    t0 = time.perf_counter()
    trace = None
    error: BaseException | None = None
    progress.say("building the model", force=True)
    # Built before the recording, in a fake mode of its own that the recording adopts: the record starts
    # with the weights in place, as after loading a checkpoint, without what __init__ allocates and drops.
    # a quantization library asks torch.cuda what the GPU can do (torchao's fp8: compute capability 8.9)
    machine = contextlib.nullcontext()
    if args.quant and on_cuda:
        from .._engine import cuda_api

        machine = cuda_api.gpu_session(on=True, gpu=capacity if named else None, count=n_gpus)
    with machine:
        model = _build(models, args, overrides)
        models.check_seq(model, args.seq, args.generate or 0)  # refused before recording, never shortened
        runner = _adapt(model, args)  # LoRA (QLoRA) before the recording, as a script sets it up before training
    info.update(_describe(model))
    info.update(
        quantization=args.quant, lora=runner.lora, trainable_parameters=sum(p.numel() for p in runner.trainable)
    )
    progress.say(f"recording the run on fake {args.device}", force=True)
    try:
        with record(
            device=args.device, gpu=capacity if named and on_cuda else None, gpus=n_gpus if on_cuda else None,
            progress=progress if progress.on else None, modules=[model],
        ) as trace:  # fmt: skip
            _run(models, model, args, info, runner.runner)
            del model, runner
    except RecordError as exc:  # the model's run failed: report what was recorded
        error = exc
        trace = exc.trace if exc.trace is not None else trace
    except RuntimeError as exc:  # --lora over weights whose matmul has no backward: one line naming --quant
        from .adapters import check_backward

        check_backward(exc, {"quantization": args.quant, "train": args.train},
                       written=f"--quant {args.quant} --lora {args.lora} --train")  # fmt: skip
        raise
    finally:
        progress.done()
    info["seconds"] = time.perf_counter() - t0
    if trace is None:
        raise error if error is not None else RuntimeError("nothing was recorded")
    trace.meta["capacity"] = capacity
    trace.meta["capacity_spec"] = f"{n_gpus}x{capacity}" if n_gpus > 1 else capacity
    info["speed"] = _speed(trace, args, capacity, on_cuda).as_dict()
    data = report_data(trace, info)
    _print(report_table(data))
    if error is not None:
        _print(f"\nthe run stopped: {error}", file=sys.stderr)
    if args.oplog:
        _print(trace.oplog(limit=args.oplog))
    _write_outputs(args, trace, data)
    return 1 if error is not None else 0


def _speed(trace: Any, args: argparse.Namespace, capacity: Any, on_cuda: bool) -> Any:
    """How long the recorded run's step takes on the GPU given (``--gpus``, default H100): the last step of
    ``--train`` (the steady state), the whole generation of ``--generate``, the forward (:func:`.steps.speed`;
    Note: [one step] in :mod:`fakeviz._analysis.timing`)."""
    from .._core.gpus import Capacity
    from . import steps as _steps

    kind = Capacity.parse(capacity).gpu
    note = ""
    if args.capacity is not None:
        note = f"--capacity {args.capacity} gives memory only; --gpus names the GPU kind (e.g. --gpus H100)"
    elif kind is None:
        note = f"--gpus {args.gpus} gives memory only, no GPU kind; name the GPU (e.g. --gpus 8xH100)"
    elif not on_cuda:
        note = f"the run is on {args.device}, and the time model covers GPUs (run on --device cuda:0)"
    tokens = args.batch * (args.generate or args.seq)
    return _steps.speed([(trace, 1)], gpu=None if note else kind, gpus=1, tokens=tokens, note=note)


def _build(models: Any, args: argparse.Namespace, overrides: dict[str, Any]) -> Any:
    """The model of a catalog name, a checkpoint folder (safetensors / .bin headers) or a config."""
    from .._core.errors import ArgumentError

    path = Path(args.model)
    quant = {"quantization": args.quant} if args.quant else {}
    if path.is_dir() and not overrides and (any(path.glob("*.safetensors*")) or any(path.glob("*.bin"))):
        return models.from_pretrained(path, device=args.device, dtype=args.dtype, **quant)
    try:  # an unknown name: build raises UnknownModelError with near names before any work (a hub id: the hub's)
        return models.build(args.model, device=args.device, dtype=args.dtype, **quant, **overrides)
    except ArgumentError as exc:  # an override the config lacks, a size below 1: named as the user wrote it
        items = [i for i in args.set if i.partition("=")[0].strip() == exc.argument] or args.set
        raise exc.reworded(" ".join(f"--set {i}" for i in items)) from exc


def _adapt(model: Any, args: argparse.Namespace) -> Any:
    """``--lora`` on the built model (after QLoRA's preparation with ``--quant --train``): :mod:`.adapters`."""
    from .adapters import apply

    return apply(model, lora=args.lora, quantized=bool(args.quant), train=args.train, checkpointing=args.checkpointing is True,
                 quantization=args.quant)  # fmt: skip


def _describe(model: Any) -> dict[str, Any]:
    from .adapters import logical_numel

    params = {id(p): p for p in model.parameters()}.values()
    dtypes: dict[str, int] = {}
    for p in params:
        key = str(p.dtype).removeprefix("torch.")
        dtypes[key] = dtypes.get(key, 0) + p.numel() * p.element_size()
    return {
        "class": type(model).__name__,
        "parameters": int(sum(logical_numel(p) for p in params)),  # a packed 4-bit weight: the weights it holds
        "parameter_bytes": int(sum(dtypes.values())),
        "dtype": max(dtypes, key=dtypes.__getitem__) if dtypes else None,
    }


def _run(models: Any, model: Any, args: argparse.Namespace, info: dict[str, Any], runner: Any = None) -> None:
    """One recorded run: inference forward, training steps or generation (:mod:`.steps`); ``runner`` is what the
    steps call (the PEFT model with ``--lora``), ``model`` the transformers model (its inputs, its checkpointing)."""
    import torch

    from . import steps as _steps

    runner = model if runner is None else runner
    if args.train:
        opt_name = info["optimizer"] = args.optimizer or "adamw"
        n = args.steps or 2
        info["run"] = f"train, {n} step{'s' if n > 1 else ''}" + (
            f", {opt_name}" if opt_name != "none" else ", no optimizer"
        ) + ((", activation checkpointing" + ("" if args.checkpointing is True else
                f" ({_steps.checkpointing_tag(args.checkpointing)})")) if args.checkpointing else "")  # fmt: skip
        if args.checkpointing and not getattr(model, "supports_gradient_checkpointing", False):
            raise UsageError(f"--checkpointing: {type(model).__name__} does not support gradient checkpointing")
        batch = models.inputs(model, batch=args.batch, seq=args.seq, labels=True)
        with _steps.checkpointing(model, args.checkpointing):  # Note: [selective checkpointing]
            _steps.train(runner, batch, optimizer=opt_name, steps=n)
    elif args.generate:
        info["run"] = f"generate {args.generate} tokens ({args.cache} KV cache)"
        try:
            task = models.task_of(model)
        except ValueError:
            task = None
        if task not in ("causal_lm", "seq2seq", "speech_seq2seq") or not hasattr(model, "generate"):
            raise UsageError(f"--generate: {type(model).__name__} does not generate text")
        batch = models.inputs(model, batch=args.batch, seq=args.seq, labels=False)
        batch.pop("decoder_input_ids", None)
        _steps.generate(runner, batch, args.generate, cache=args.cache)
    else:
        info["run"] = "inference forward"
        batch = models.inputs(model, batch=args.batch, seq=args.seq, labels=False)
        _steps.forward(runner, batch)
    shape = next((v.shape for v in batch.values() if isinstance(v, torch.Tensor)), None)
    info["inputs"] = {k: list(v.shape) for k, v in batch.items() if isinstance(v, torch.Tensor)}
    info["input_shape"] = list(shape) if shape is not None else None


# ----------------------------------------------------------------------------------- data and table
def report_data(trace: Any, info: dict[str, Any]) -> dict[str, Any]:
    """The report as plain data (what ``--json`` writes): the run, peaks per device by category, the verdict."""
    from .._core.schema import CATEGORIES

    v = trace.verdict(trace.meta["capacity"])
    devices = {}
    for dev, pk in trace.peak(top=0).items():
        vd = v["devices"].get(dev, {})
        devices[dev] = {
            "peak": int(vd.get("peak", pk.bytes)),  # reserved at peak on cuda (the allocator model), else tensors
            "judged": vd.get("judged"),  # what the verdict judged (Note: [the verdict]); None: not judged (cpu)
            "freed": vd.get("freed"),
            "tensors": int(pk.bytes),
            "allocated": pk.allocated,
            "reserved": pk.reserved,
            "by_category": {c: int(pk.by_category.get(c, 0)) for c in CATEGORIES},
            "at": {"seq": pk.seq, "op": pk.op, "phase": pk.phase, "module": pk.module, "line": pk.user_line},
            "fits": vd.get("fits"),
            "first_oom": vd.get("first_oom"),
        }
    paged = trace.meta.get("paged") or []  # bitsandbytes' paged optimizer state (Note: [paged optimizer state])
    st = trace.storages
    return {
        **info,
        "paged_bytes": int(st.nbytes[st.storage.isin(paged)].sum()) if paged else 0,
        "ops": int(trace.num_ops),
        "steps": trace.meta.get("steps", []),
        "devices": devices,
        "verdict": {
            "fits": bool(v["fits"]),
            "incomplete": bool(v["incomplete"]),
            "capacity": int(v["capacity"]),
            "text": v["text"],
        },  # fmt: skip
        "error": {k: trace.error.get(k) for k in ("type", "op", "message")} if trace.error else None,
    }


def report_table(data: dict[str, Any]) -> str:
    """The concise text report: run, parameters, a table of the peak per device by category, the verdict."""
    from .._core.fmt import format_bytes
    from .._core.schema import CATEGORIES

    head = f"{data['model']}"
    if data.get("class"):
        head += f" ({data['class']})"
    lines = [head]
    if data.get("parameters") is not None:
        lines.append(f"  parameters  {data['parameters'] / 1e9:,.3f} B ({format_bytes(data['parameter_bytes'])}"
                     f"{', ' + data['dtype'] if data.get('dtype') else ''})")  # fmt: skip
    tune = [x for x in (data.get("quantization"), data.get("lora")) if x]
    if tune:
        trainable = data.get("trainable_parameters")
        share = (
            f" ({trainable / data['parameters']:.2%} of the parameters)" if trainable and data.get("parameters") else ""
        )
        lines.append(
            f"  weights     {', '.join(tune)}" + (f"; {trainable:,} trainable{share}" if data.get("lora") else "")
        )
    if data.get("run"):
        shape = "x".join(str(x) for x in data.get("input_shape") or [])
        lines.append(f"  run         {data['run']}" + (f", input {shape}" if shape else ""))
    gpus = f"{data['gpus']} x " if data.get("gpus", 1) > 1 else ""
    cap = data.get("capacity_label") or data["capacity"]
    lines.append(f"  recorded    {data['ops']:,} ops in {data.get('seconds', 0):.1f} s, capacity {gpus}{cap}")
    devs = data["devices"]
    if devs:
        cats = [c for c in CATEGORIES if any(d["by_category"][c] for d in devs.values())]
        cols = ["device", "peak", *cats]
        rows = [cols]
        for dev, d in devs.items():
            rows.append([dev, format_bytes(d["peak"]), *(format_bytes(d["by_category"][c]) for c in cats)])
        widths = [max(len(r[i]) for r in rows) for i in range(len(cols))]
        lines.append("")
        lines.append("peak per device (reserved at peak on cuda; tensors live at the peak, by category):")
        for r in rows:
            lines.append("  " + "  ".join(x.rjust(w) if i else x.ljust(w) for i, (x, w) in enumerate(zip(r, widths))))
    lines.append("")
    v = data["verdict"]
    lines.append(f"verdict: {v['text']}")  # the verdict's one text, with the bytes it judged (Note: [the verdict])
    if data.get("paged_bytes"):
        lines.append(f"  {format_bytes(data['paged_bytes'])} of the optimizer state is paged (CUDA unified memory): "
                     "counted on the GPU; the driver moves pages to host memory when the GPU runs out")  # fmt: skip
    sp = data.get("speed")
    if sp is not None:
        lines.append(_speed_line(data, sp))
    for d in devs.values():
        o = d.get("first_oom")
        if o:  # the verdict's text names where; the request that failed is said here
            asks, free = format_bytes(o["request"]), format_bytes(o["free"])
            lines.append(f"  the request that fails asks {asks} with {free} free")
    if data.get("error"):
        e = data["error"]
        lines.append(f"  the run stopped at {e.get('op')}: {e.get('type')} (the figures are up to there)")
    return "\n".join(lines)


def _speed_line(data: dict[str, Any], sp: dict[str, Any]) -> str:
    """``time: step 565 ms on H100, 7.2 K tokens/s, MFU 37.7% (gpu bound); timed: the last of 2 training steps
    (ops 8,643 to 16,411)`` or why there is none (Note: [one step] in :mod:`fakeviz._analysis.timing`)."""
    from .._views.text import speed_text

    text = speed_text(sp["step_s"], sp["tokens_per_s"], sp["mfu"], gpus=sp["gpus"], gpu=sp["gpu"], note=sp["note"])
    if sp["step_s"] is None:
        return f"time: {text}"
    extra = f" ({sp['bound']} bound); timed: {sp['timed']}"
    if data.get("gpus", 1) > 1:
        extra += f"; the run is one GPU's, not {data['gpus']} GPUs together"
    return f"time: {text}{extra}"


def _write_outputs(args: argparse.Namespace, trace: Any, data: dict[str, Any] | None) -> None:
    capacity = trace.meta.get("capacity")
    if getattr(args, "json", None) is not None:
        payload = data if data is not None else {"model": str(args.model), "ops": int(trace.num_ops)}
        with _writing("--json", args.json):
            args.json.write_text(json.dumps(payload, indent=2, default=str) + "\n")
        _print(f"report written to {args.json}")
    if getattr(args, "save", None) is not None:
        with _writing("--save", args.save):
            trace.save(args.save)
        _print(f"trace written to {args.save}")
    if getattr(args, "html", None) is not None:
        with _writing("--html", args.html):
            what = _write_html(trace, args.html, capacity, title=f"fakeviz: {args.model}")
        _print(f"{what} written to {args.html}")


@contextlib.contextmanager
def _writing(flag: str, path: Path) -> Iterator[None]:
    """An output that cannot be written: one line naming the option and the user's path (not a temporary
    file's, not the JS bundle's), checked again here as the folder may have gone during the run."""
    _check_output(flag, path)
    try:
        yield
    except OSError as exc:
        raise UsageError(f"{flag} {str(path)!r}: cannot write it ({exc.strerror or type(exc).__name__})") from exc


def _write_html(trace: Any, path: Path, capacity: Any, *, title: str | None = None) -> str:
    """The explorer as one self-contained HTML file; a static summary page when the JS bundle is not built."""
    from .._core.fmt import html_text
    from .._views.text import summary_html

    try:
        trace.to_html(path, capacity, title=title)
        return "explorer (one self-contained HTML file; works offline)"
    except FileNotFoundError as exc:  # the JS bundle was not built (no npm): a static summary instead
        _print(f"fakeviz: {_first_line(exc)}", file=sys.stderr)
        path.write_text(
            f"<!doctype html><meta charset='utf-8'><title>{html_text(title or 'fakeviz')}</title>"
            + summary_html(trace)
            + "<pre>"
            + html_text("\n".join(trace.oplog_lines(limit=200)))
            + "</pre>"
        )
        return "summary page"


# --------------------------------------------------------------------------------------------- demo
def demo(args: argparse.Namespace) -> int:
    import torch

    from .. import models
    from .._api import fake_cuda_status, record
    from .._core.errors import ArgumentError
    from .._core.gpus import gpu_capability
    from .._views.text import summary

    try:
        cfg = models.config(args.model, **({"num_hidden_layers": args.layers} if args.layers else {}))
    except ArgumentError as exc:
        raise exc.reworded(f"--layers {args.layers}") from exc
    _print(
        f"fakeviz demo: {args.model} ({cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}), bf16, "
        f"batch {args.batch}, seq {args.seq}, fwd+bwd on fake {args.device}"
    )
    _print(f"fake cuda: {fake_cuda_status().mode}")
    t0 = time.perf_counter()
    named = bool(args.gpu) and gpu_capability(args.gpu) is not None
    with record(device=args.device, gpu=args.gpu if named else None) as trace:
        model = models.build(cfg, dtype=torch.bfloat16)
        ids = torch.randint(0, cfg.vocab_size, (args.batch, args.seq))
        out = model(ids, labels=ids)
        out.loss.backward()
    dt = time.perf_counter() - t0
    if args.gpu and not named:
        trace.meta["capacity"] = args.gpu  # a size such as "80GB": the verdict, without a GPU's attention rules
    n_params = sum(p.numel() for p in model.parameters())
    _print(f"{n_params / 1e9:.1f} B parameters, recorded in {dt:.1f} s")
    _print(summary(trace))
    if named and args.device.startswith("cuda"):
        # the step as the report and the HTML page time it: fwd+bwd, never the model's build (Note: [one step])
        from .._core.gpus import Capacity
        from . import steps as _steps

        sp = _steps.speed([(trace, 1)], gpu=Capacity.parse(args.gpu).gpu, gpus=1, tokens=args.batch * args.seq)
        _print(_speed_line({"gpus": 1}, sp.as_dict()))
    out_path = Path(args.output)
    trace.save(out_path)
    html_path = out_path.with_suffix(".html")
    what = _write_html(trace, html_path, args.gpu, title="fakeviz demo")
    _print(f"trace written to {out_path}, {what}: {html_path}")
    return 0


# --------------------------------------------------------------------------------------------- main
def _user_errors() -> tuple[type[BaseException], ...]:
    from .._core import errors
    from .._core.errors import FakeVizError, TraceFormatError, UnknownModelError

    found: list[type[BaseException]] = [UsageError, UnknownModelError, TraceFormatError, FileNotFoundError]
    for name in ("ArgumentError", "CheckpointError", "CheckpointMismatchError", "SequenceTooLongError"):
        cls = getattr(errors, name, None)
        if isinstance(cls, type) and issubclass(cls, FakeVizError):
            found.append(cls)
    return tuple(found)


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit code (0 report made, 1 the run failed, 2 usage error)."""
    verbose = verbose_requested("--verbose" in (sys.argv[1:] if argv is None else argv))
    with quiet_import_notices(verbose):  # Note: [import notices]: not what a report is about
        return _main(argv, verbose)


def _main(argv: list[str] | None, verbose: bool) -> int:
    try:
        parser = _parser()
        args = parser.parse_args(_join_negative_values(parser, list(sys.argv[1:] if argv is None else argv)))
        return int(args.fn(args))
    except UsageError as exc:
        if verbose:
            traceback.print_exc()
        _print(f"fakeviz: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        _print("fakeviz: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - no traceback for user errors; --verbose shows every one
        if verbose:
            traceback.print_exc()
        user = isinstance(exc, _user_errors())
        msg = str(exc).strip() if user else f"{type(exc).__name__}: {_first_line(exc)}"
        lines = msg.splitlines() or [type(exc).__name__]
        _print("fakeviz: error: " + "\n  ".join(lines[:25]), file=sys.stderr)
        if not verbose and not user:
            _print("  (--verbose shows the traceback)", file=sys.stderr)
        return 2 if user else 1


if __name__ == "__main__":
    sys.exit(main())
