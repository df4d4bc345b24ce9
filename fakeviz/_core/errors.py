"""Exceptions and warnings raised by fakeviz."""

from __future__ import annotations

from typing import Any

__all__ = [
    "ArgumentError",
    "CheckpointError",
    "CheckpointMismatchError",
    "DataDependentError",
    "FakeVizDeprecationWarning",
    "FakeVizError",
    "FakeVizWarning",
    "HubError",
    "SimulationError",
    "RecordError",
    "TraceFormatError",
    "UnknownModelError",
    "renamed",
]


class FakeVizWarning(UserWarning):
    """Warnings emitted by fakeviz."""


class FakeVizDeprecationWarning(FakeVizWarning, FutureWarning):
    """A public name that still works under its old spelling and will go: the warning names the new one.

    A ``FutureWarning`` (shown by default, as pandas' deprecations are) and a :class:`FakeVizWarning` (the test
    suite turns fakeviz's own warnings into errors, so no test or tutorial keeps calling an old name).
    """


def renamed(module: str, names: dict[str, str], namespace: dict[str, Any], why: str = "") -> Any:
    """A module ``__getattr__`` (PEP 562) that answers each old public name of ``names`` (old -> new) with the
    object the new name holds in ``namespace``, warning :class:`FakeVizDeprecationWarning` at the caller
    (``why``: the rule behind the new name, in parentheses after it).

    The old names stay out of ``__all__`` and ``dir()``; ``from module import old`` warns too. CONTRIBUTING's
    "Words" lists every old name and when it was renamed.
    """
    import warnings

    def __getattr__(name: str) -> Any:
        if name in names:
            new = names[name]
            warnings.warn(
                f"{module}.{name} is now {module}.{new}{f' ({why})' if why else ''}; the old name will be removed.",
                FakeVizDeprecationWarning, stacklevel=2,
            )  # fmt: skip
            return namespace[new]
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    return __getattr__


class FakeVizError(RuntimeError):
    """Base class of fakeviz errors."""


class TraceFormatError(FakeVizError, ValueError):
    """A saved trace file is not readable: wrong format, truncated or corrupted."""


class RecordError(FakeVizError):
    """An op failed while recording.

    Attributes: ``op`` (the aten overload name), ``module`` (module path at the
    time), ``user_line`` ("file:line" of the user's code), ``trace`` (the partial
    :class:`~fakeviz.Trace`, recorded up to the failing op; a plain record when the engine is used alone).
    When the op failed inside library code (``model.generate()``), ``call`` is the library function the
    user's code called (``"GenerationMixin.generate"``) and ``called_at`` the user's line that called it;
    both are None otherwise.
    """

    call: str | None = None
    called_at: str | None = None

    def __init__(
        self,
        message: str,
        *,
        op: str | None,
        module: str | None,
        user_line: str | None,
        trace: Any = None,
    ) -> None:
        super().__init__(message)
        self.op = op
        self.module = module
        self.user_line = user_line
        self.trace = trace

    def __reduce__(self) -> tuple[Any, ...]:  # keep picklable for multiprocessing
        return (RuntimeError, (str(self),))


class SimulationError(FakeVizError):
    """A rank's step failed in :func:`fakeviz.simulate`. ``rank`` is that rank, ``user_line`` the user's line,
    ``simulation`` the partial :class:`~fakeviz.Simulation` (the ranks recorded before it, and its partial
    trace, marked incomplete); ``__cause__`` is the original error."""

    def __init__(self, message: str, *, rank: int, user_line: str | None = None, simulation: Any = None) -> None:
        super().__init__(message)
        self.rank = rank
        self.user_line = user_line
        self.simulation = simulation

    def __reduce__(self) -> tuple[Any, ...]:
        return (RuntimeError, (str(self),))


class DataDependentError(RecordError):
    """The model's code needs a tensor *value* the fake run does not know (``.item()``, a branch on data).

    A fake run knows the values of small tensors made from Python numbers or real tensors, of random draws
    in step with the real run, and answers some reads by documented assumptions (Note: [values under fake
    tensors] in ``fakeviz._engine.values``); any other read raises this. See the message for ways around it.
    """


class UnknownModelError(FakeVizError, ValueError):
    """A model name that is not in the catalog, not a folder and not a ``config.json``.

    Attributes: ``name`` (what was asked for), ``suggestions`` (near catalog names, best first).
    """

    def __init__(self, message: str, *, name: str = "", suggestions: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.name = name
        self.suggestions = tuple(suggestions)

    def __reduce__(self) -> tuple[Any, ...]:
        return (ValueError, (str(self),))


class SequenceTooLongError(FakeVizError, ValueError):
    """A sequence longer than the model's context (its position embeddings): refused, never silently shortened.

    Attributes: ``seq`` (asked for, prompt plus new tokens), ``context`` (what the model accepts).
    """

    def __init__(self, message: str, *, seq: int = 0, context: int = 0) -> None:
        super().__init__(message)
        self.seq = seq
        self.context = context

    def __reduce__(self) -> tuple[Any, ...]:
        return (ValueError, (str(self),))


class ArgumentError(FakeVizError, ValueError):
    """An argument fakeviz cannot honour: refused, never silently changed or ignored.

    A config override the config does not have (``num_hidden_layer=2``), a size below 1, a GPU count where
    a capacity is needed, a device fakeviz does not fake, an empty sweep axis. The message's first line is
    the argument as written and what is wrong with it; the next lines say what to give instead.

    Attributes: ``argument`` (its name: ``"gpus"``, ``"num_hidden_layers"``), ``value`` (as given),
    ``problem`` (the first line without the argument: what is wrong), ``advice`` (what to do, may be ""),
    ``suggestions`` (near names, best first). The command line words the first line as its own option
    (``--set num_hidden_layer=1: ...``) from these.
    """

    def __init__(
        self,
        argument: str,
        value: Any,
        problem: str,
        advice: str = "",
        *,
        written: str | None = None,
        suggestions: tuple[str, ...] = (),
    ) -> None:
        self.argument = argument
        self.value = value
        self.problem = problem
        self.advice = advice
        self.suggestions = tuple(suggestions)
        self.written = written if written is not None else f"{argument}={value!r}"
        super().__init__(f"{self.written}: {problem}" + (f"\n{advice}" if advice else ""))

    def reworded(self, written: str) -> ArgumentError:
        """The same error with the argument written another way (the command line's ``--set KEY=VALUE``)."""
        return ArgumentError(self.argument, self.value, self.problem, self.advice, written=written,
                             suggestions=self.suggestions)  # fmt: skip

    def __reduce__(self) -> tuple[Any, ...]:
        return (ValueError, (str(self),))


class CheckpointError(FakeVizError, ValueError):
    """A checkpoint cannot be read: no weights, a malformed or truncated file, a missing shard."""


class HubError(CheckpointError):
    """A hub id (``owner/name``) whose files cannot be had: offline (``HF_HUB_OFFLINE``) and not in the hub cache,
    the endpoint unreachable, a gated repo without access (``HF_TOKEN``), an unknown revision, or a repo whose
    code would have to run (``trust_remote_code``). A hub id the hub does not know is an :class:`UnknownModelError`.

    Attributes: ``repo`` (the id), ``endpoint`` (the hub asked, ``HF_ENDPOINT``), ``offline`` (``HF_HUB_OFFLINE``
    was set).
    """

    def __init__(self, message: str, *, repo: str = "", endpoint: str = "", offline: bool = False) -> None:
        super().__init__(message)
        self.repo = repo
        self.endpoint = endpoint
        self.offline = offline

    def __reduce__(self) -> tuple[Any, ...]:
        return (ValueError, (str(self),))


class CheckpointMismatchError(FakeVizError, ValueError):
    """A checkpoint's tensors disagree with the model its config builds (``from_pretrained(strict=True)``).

    Attributes: ``missing`` (model tensors the checkpoint lacks), ``unexpected`` (checkpoint tensors the
    model lacks), ``shapes`` (name -> (checkpoint shape, model shape)).
    """

    def __init__(
        self,
        message: str,
        *,
        missing: tuple[str, ...] = (),
        unexpected: tuple[str, ...] = (),
        shapes: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] | None = None,
    ) -> None:
        super().__init__(message)
        self.missing = tuple(missing)
        self.unexpected = tuple(unexpected)
        self.shapes = dict(shapes or {})

    def __reduce__(self) -> tuple[Any, ...]:
        return (ValueError, (str(self),))
