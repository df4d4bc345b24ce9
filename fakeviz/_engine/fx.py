"""Fake tensor propagation over a user's FX graph: every node's value as a fake tensor, no data.

:func:`propagate` runs torch's ``FakeTensorProp`` over a ``torch.fx.GraphModule`` (from
``torch.fx.symbolic_trace``, ``torch.export`` or a dynamo backend) and keeps, per node, the fake value it
produced: shape, dtype, device, stride and storage identity exactly as a real run would give them.

Inputs:
* a real tensor is converted with the fake mode's ``from_tensor``, which keeps aliasing between inputs
  (two views of one tensor share one fake storage). With ``symbolic=True`` its sizes become symbols
  (every dim, or the dims named in ``dynamic``; PyTorch names a symbol after a hash of its source, so
  ``x.size()[0]`` is ``s93``, the same in every run); sizes 0 and 1 stay concrete, as PyTorch
  specializes them. Sizes are not "duck" shared: ``[8, 8]`` is two symbols until an op of the
  graph says the two are equal.
* a fake tensor is used as it is (the propagation then runs in its fake mode). With ``symbolic=True`` it
  is replaced by a fresh fake tensor with symbolic sizes (its mode needs a ``ShapeEnv``: create it under
  ``fakeviz.fake_mode(symbolic=True)``); aliasing between such inputs is not kept.
* anything else (ints, floats, ``None``) is passed as it is.

The graph module's parameters and buffers, real or fake, are used where they are; real ones are converted
to fake on first use (static shapes) and cost no copy. ``propagate`` does not write ``node.meta`` of the
user's graph (``FakeTensorProp`` does; what it wrote is put back), and no fake mode stays active after it.

Data-dependent sizes: ``nonzero``, ``masked_select``, boolean indexing and ``.item()`` give unbacked
symbols (``u0``) with ``symbolic=True``; without it they raise :class:`~fakeviz.DataDependentError`
naming the node.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import sys
import sysconfig
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.fx.passes.fake_tensor_prop import FakeTensorProp

from .._core.errors import DataDependentError, FakeVizError
from .session import DATA_DEPENDENT_ERRORS, meta_like, new_fake_mode

__all__ = ["Propagated", "hint_of", "is_user_file", "propagate", "target_text", "user_frames", "user_line"]

_FRAME = re.compile(r'File "([^"]+)", line (\d+), in ([^\s,]+)')


@dataclass
class Propagated:
    """What :func:`propagate` found: the graph, and each node's fake value.

    Attributes:
        graph_module: the graph module that was propagated (not modified).
        nodes: its nodes, in graph order.
        values: node name -> the node's value: a fake tensor, a tuple/list of them (multi-output ops and
            the output node), a ``SymInt`` or int (``x.size(0)``), or None (no value).
        mode: the fake mode the values belong to.
        symbolic: whether the inputs got symbolic sizes.
        inputs: the inputs as the graph received them (fake tensors where a tensor was given).
    """

    graph_module: torch.fx.GraphModule
    nodes: list[torch.fx.Node]
    values: dict[str, Any]
    mode: FakeTensorMode
    symbolic: bool
    inputs: tuple[Any, ...] = field(default=())

    @property
    def shape_env(self) -> Any:
        """The ``ShapeEnv`` of the symbols (None without ``symbolic``)."""
        return self.mode.shape_env

    @property
    def output(self) -> Any:
        """The graph's output (what the output node returns), as fake values."""
        out = [n for n in self.nodes if n.op == "output"]
        return self.values.get(out[-1].name) if out else None

    def guards(self) -> list[str]:
        """The conditions on the symbols the graph imposed (``Eq(s1, 16)``): empty without ``symbolic``."""
        env = self.shape_env
        return [str(g.expr) for g in env.guards] if env is not None else []

    def symbols(self) -> dict[str, tuple[str, int | None]]:
        """Symbol name -> (where it comes from, e.g. ``x.size()[0]``; its value in the example inputs).

        Unbacked symbols (sizes that depend on data) have the op's node as origin and None as value.
        """
        env = self.shape_env
        if env is None:
            return {}
        out: dict[str, tuple[str, int | None]] = {}
        for sym, sources in env.var_to_sources.items():
            out[str(sym)] = (sources[0].name if sources else "", hint_of(env, sym))
        for name, val in self.values.items():
            for t in _tensors(val):
                for size in t.shape:
                    if isinstance(size, torch.SymInt):
                        for sym in size.node.expr.free_symbols:
                            out.setdefault(str(sym), (name, hint_of(env, sym)))
        return out


def hint_of(shape_env: Any, expr: Any) -> int | None:
    """The value of a size expression (sympy, or a ``SymInt``) for the example inputs; None if it has none.

    An unbacked symbol (``u0``: a size that depends on data) has no value.
    """
    if isinstance(expr, torch.SymInt):
        expr = expr.node.expr
    if shape_env is None:
        return int(expr) if getattr(expr, "is_number", False) else None
    try:
        hint = shape_env.guarding_hint_or_throw(expr)
    except Exception:  # noqa: BLE001 - unbacked (GuardOnDataDependentSymNode) or not evaluable: no value
        return None
    return int(hint)


def _tensors(val: Any) -> Iterator[torch.Tensor]:
    if isinstance(val, torch.Tensor):
        yield val
    elif isinstance(val, (list, tuple)):
        for v in val:
            yield from _tensors(v)


def target_text(node: torch.fx.Node) -> str:
    """The node's target as a reader wants it: ``aten.add.Tensor``, ``torch.relu``, ``fc1 (Linear)``, ``view``,
    ``higher_order.cond``, ``getitem``."""
    target = node.target
    if node.op == "call_module":
        try:
            mod = node.graph.owning_module.get_submodule(str(target))
        except AttributeError:
            return str(target)
        return f"{target} ({type(mod).__name__})"
    if node.op != "call_function":
        return str(target)
    if isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return str(target)
    if isinstance(target, torch._ops.HigherOrderOperator):
        return f"higher_order.{target.name()}"  # torch.cond -> higher_order.cond, as torch.ops spells it
    name = getattr(target, "__qualname__", None) or getattr(target, "__name__", None)
    if name is None:
        return str(target)
    if any(part.startswith("_") for part in name.split(".")[:-1]):  # torch._VariableFunctionsClass.chunk
        name = getattr(target, "__name__", name)
    module = getattr(target, "__module__", None) or ""
    if module in ("_operator", "operator", "builtins"):
        return name
    if module.startswith("torch._C._nn"):
        module = "torch.nn.functional"
    elif module.startswith("torch._C._"):
        module = "torch"
    return f"{module}.{name}" if module else name


# --------------------------------------------------------------------- the user's line
_TORCH_DIR = os.path.dirname(os.path.realpath(torch.__file__)) + os.sep
_OWN_DIR = os.path.dirname(os.path.dirname(os.path.realpath(__file__))) + os.sep
_STDLIB_DIRS = tuple({os.path.realpath(sysconfig.get_paths()[k]) + os.sep for k in ("stdlib", "platstdlib")})
# packages torch runs on the way to an error (guards are sympy expressions): never the user's code
_TORCH_DEPS = ("functorch", "sympy", "optree", "typing_extensions")
_dep_dirs: tuple[str, ...] | None = None


def _internal_dirs() -> tuple[str, ...]:
    global _dep_dirs
    if _dep_dirs is None:
        dirs = []
        for name in _TORCH_DEPS:
            with contextlib.suppress(Exception):
                spec = importlib.util.find_spec(name)
                if spec is not None and spec.submodule_search_locations:
                    dirs.append(os.path.realpath(list(spec.submodule_search_locations)[0]) + os.sep)
        _dep_dirs = (_TORCH_DIR, _OWN_DIR, *dirs)
    return _dep_dirs


def is_user_file(filename: str) -> bool:
    """True for the user's source files: not torch, fakeviz, the standard library or code torch generates."""
    if filename.startswith("<"):
        return filename.startswith(("<ipython-input", "<stdin>", "<string>"))
    real = os.path.realpath(filename)
    if real.startswith(_internal_dirs()) or filename.startswith(_internal_dirs()):
        return False
    if real.startswith(_STDLIB_DIRS):
        return "site-packages" in real or "dist-packages" in real
    return True


def user_frames(text: str | None) -> list[tuple[str, int, str]]:
    """The ``(file, line, function)`` of each user frame (:func:`is_user_file`) a text names with
    ``File "...", line N, in f`` (a stack trace, or torch's message), outermost first."""
    return [(m[0], int(m[1]), m[2]) for m in _FRAME.findall(text or "") if is_user_file(m[0])]


def user_line(node: torch.fx.Node) -> str:
    """``"file:line in function"`` of the user's code that made ``node`` (from its stack trace), or ``""``.

    The innermost user frame (:func:`is_user_file`: not torch, fakeviz or the standard library): for a
    ``linear`` that is the user's ``self.fc1(x)``, not ``torch/nn/modules/linear.py``. ``torch.export`` and
    dynamo record stack traces; ``torch.fx.symbolic_trace`` does not (unless its tracer has
    ``record_stack_traces = True``). This is the one definition of a node's user line (``fakeviz.prop``'s and
    ``fakeviz.check_export``'s tables both use it).
    """
    frames = user_frames(node.meta.get("stack_trace"))
    if not frames:
        return ""
    path, line, func = frames[-1]
    return f"{path}:{line} in {func}"


def _source_of(node: torch.fx.Node) -> str:
    """The last code line of the node's stack trace (what the user wrote), or ``""``."""
    lines = [s.strip() for s in (node.meta.get("stack_trace") or "").strip().splitlines()]
    return lines[-1] if lines and not lines[-1].startswith("File ") else ""


class _Prop(FakeTensorProp):
    """FakeTensorProp that keeps each node's value in ``self.values`` and says which node needed data."""

    def __init__(self, module: torch.fx.GraphModule, mode: FakeTensorMode, symbolic: bool) -> None:
        super().__init__(module, mode=mode)
        self.values: dict[str, Any] = {}
        self.symbolic = symbolic
        self.extra_traceback = False  # Interpreter would rewrite the message; we add a note instead

    def run_node(self, n: torch.fx.Node) -> Any:
        try:
            result = super().run_node(n)
        except DATA_DEPENDENT_ERRORS as exc:
            raise _data_dependent(n, exc, self.symbolic) from exc
        except Exception as exc:
            line = user_line(n)
            exc.add_note(f"fakeviz.prop: while propagating node {_node_text(n)}" + (f" at {line}" if line else ""))
            raise
        self.values[n.name] = n.meta.get("val")
        return result


def _node_text(node: torch.fx.Node) -> str:
    """``nonzero = torch.nonzero(x)``: the node as a line of code."""
    args = [str(a) for a in node.args] + [f"{k}={v}" for k, v in node.kwargs.items()]
    return f"{node.name} = {target_text(node)}({', '.join(args)})"


def _data_dependent(node: torch.fx.Node, exc: BaseException, symbolic: bool) -> DataDependentError:
    line = user_line(node)
    src = _source_of(node)
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if symbolic:
        todo = (
            "With symbolic=True, sizes that depend on data are symbols (u0), but this node needs a value or "
            "branches on one: state what holds with torch._check(...) in the model, or pass the value in as a "
            "Python number."
        )
    else:
        todo = "Pass symbolic=True so that sizes depending on data become symbols (u0)."
    msg = (
        (f"{line}: " if line else "")
        + f"node {_node_text(node)} needs the values of a tensor, but fake tensors carry no data.\n"
        + (f"    {src}\n" if src else "")
        + f"{todo} (torch said: {type(exc).__name__}: {first})"
    )
    return DataDependentError(msg, op=target_text(node), module=None, user_line=line or None)


def _modes_of(objs: Iterable[Any]) -> list[FakeTensorMode]:
    modes: list[FakeTensorMode] = []
    for t in objs:
        if isinstance(t, FakeTensor) and all(t.fake_mode is not m for m in modes):
            modes.append(t.fake_mode)
    return modes


def _pick_mode(gm: torch.fx.GraphModule, inputs: Sequence[Any], symbolic: bool) -> FakeTensorMode:
    state = [*gm.parameters(), *gm.buffers()]
    modes = _modes_of([*inputs, *state])
    if len(modes) > 1:
        raise FakeVizError(
            "the inputs and the graph module's parameters are fake tensors of different fake modes; "
            "create them all in one fakeviz.fake_mode() block, or pass real inputs"
        )
    if not modes:
        return new_fake_mode(symbolic=symbolic, shape_env=_shape_env() if symbolic else None)
    mode = modes[0]
    if symbolic and mode.shape_env is None:
        raise FakeVizError(
            "symbolic=True needs the fake inputs and parameters to come from a fake mode with a ShapeEnv; "
            "create them under fakeviz.fake_mode(symbolic=True), or pass real inputs"
        )
    return mode


def _shape_env() -> Any:
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    # no duck sizing: a batch of 16 and a hidden size of 16 stay two symbols until an op equates them
    return ShapeEnv(allow_dynamic_output_shape_ops=True, duck_shape=False)


def _dims(dynamic: Any, i: int, name: str, ndim: int) -> set[int]:
    """The dims of input ``i`` (placeholder ``name``) to make symbolic."""
    if dynamic is None:
        return set(range(ndim))
    if isinstance(dynamic, Mapping):
        dims = dynamic.get(name, dynamic.get(i, ()))
    else:
        dims = dynamic[i] if i < len(dynamic) else ()
    if dims is None:
        return set(range(ndim))
    dims = [dims] if isinstance(dims, int) else list(dims)
    return {d % ndim for d in dims} if ndim else set()


def _symbolic_input(mode: FakeTensorMode, t: torch.Tensor, name: str, dims: set[int]) -> torch.Tensor:
    from torch._dynamo.source import ConstantSource
    from torch.fx.experimental.symbolic_shapes import DimDynamic, StatelessSymbolicContext

    ctx = StatelessSymbolicContext(
        dynamic_sizes=[DimDynamic.DYNAMIC if d in dims else DimDynamic.STATIC for d in range(t.dim())]
    )
    source = ConstantSource(name)
    if not isinstance(t, FakeTensor):
        return mode.from_tensor(t, source=source, symbolic_context=ctx)
    if any(isinstance(s, torch.SymInt) for s in t.shape):
        return t  # already symbolic
    env = mode.shape_env
    sizes, strides, _ = env.create_symbolic_sizes_strides_storage_offset(meta_like(t), source, symbolic_context=ctx)
    with mode:
        out = torch.empty_strided(sizes, strides, dtype=t.dtype, device=t.device)
    return out.requires_grad_(t.requires_grad)


def _convert_inputs(
    gm: torch.fx.GraphModule, mode: FakeTensorMode, inputs: Sequence[Any], symbolic: bool, dynamic: Any
) -> tuple[Any, ...]:
    names = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    out = []
    for i, x in enumerate(inputs):
        name = names[i] if i < len(names) else f"input{i}"
        if not isinstance(x, torch.Tensor):
            out.append(x)
        elif symbolic:
            out.append(_symbolic_input(mode, x, name, _dims(dynamic, i, name, x.dim())))
        elif isinstance(x, FakeTensor):
            out.append(x)
        else:
            out.append(mode.from_tensor(x, static_shapes=True))
    return tuple(out)


def propagate(
    graph_module: torch.fx.GraphModule,
    *inputs: Any,
    symbolic: bool = False,
    dynamic: Sequence[Iterable[int] | int | None] | Mapping[str | int, Iterable[int] | int | None] | None = None,
) -> Propagated:
    """Run ``FakeTensorProp`` over ``graph_module`` with ``inputs`` made fake; every node's fake value.

    Args:
        graph_module: a ``torch.fx.GraphModule``; an ``ExportedProgram`` is propagated through its
            ``.module()`` (inputs as the program takes them, flattened).
        *inputs: the graph's inputs, one per placeholder (real or fake tensors, or plain values).
        symbolic: give the tensor inputs symbolic sizes (``s93``, ...), and data-dependent sizes unbacked
            symbols (``u0``).
        dynamic: with ``symbolic``, which dims become symbols: per input (a sequence aligned with the
            inputs, or a mapping by placeholder name or position), an int, an iterable of ints, or None for
            every dim; inputs a mapping does not name keep static sizes. Default: every dim of every input.

    Returns:
        A :class:`Propagated`.

    Raises:
        DataDependentError: a node needs tensor values (without ``symbolic``: an op whose output size
            depends on data).
        FakeVizError: the inputs' fake modes cannot be used (several, or no ShapeEnv with ``symbolic``).
    """
    exported = sys.modules.get("torch.export.exported_program")  # not imported: cannot be an ExportedProgram
    if exported is not None and isinstance(graph_module, exported.ExportedProgram):
        graph_module = graph_module.module()
    if not isinstance(graph_module, torch.fx.GraphModule):
        raise TypeError(
            f"prop() takes a torch.fx.GraphModule (torch.fx.symbolic_trace(model), torch.export.export(...)"
            f".module()), not {type(graph_module).__name__}"
        )
    if dynamic is not None and not symbolic:
        raise ValueError("dynamic= says which dims become symbols: it needs symbolic=True")
    nodes = list(graph_module.graph.nodes)
    n_inputs = sum(1 for n in nodes if n.op == "placeholder")
    if len(inputs) != n_inputs and not any(n.op == "placeholder" and n.target.startswith("*") for n in nodes):
        raise TypeError(f"the graph takes {n_inputs} inputs, got {len(inputs)}")
    mode = _pick_mode(graph_module, inputs, symbolic)
    fake_inputs = _convert_inputs(graph_module, mode, inputs, symbolic, dynamic)
    saved = {n: {k: n.meta[k] for k in ("val", "unbacked_bindings") if k in n.meta} for n in nodes}
    interp = _Prop(graph_module, mode, symbolic)
    try:
        interp.propagate_dont_convert_inputs(*fake_inputs)
    finally:
        for n in nodes:  # FakeTensorProp writes node.meta: leave the user's graph as it was
            for k in ("val", "unbacked_bindings"):
                n.meta.pop(k, None)
            n.meta.update(saved[n])
    return Propagated(
        graph_module=graph_module,
        nodes=nodes,
        values=interp.values,
        mode=mode,
        symbolic=symbolic,
        inputs=fake_inputs,
    )
