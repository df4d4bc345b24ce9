"""FakeTensorMode's private methods, bound to the signature the installed torch has.

Note: [private torch signatures]
The recording fake mode (``modes.py``) overrides private methods of FakeTensorMode and calls torch's own, and
``values.py`` calls ``_cached_dispatch_impl``. Torch moves their parameters between releases (2.15 dropped
``func`` from ``_output_from_cache_entry``), so each is bound when fakeviz is imported (``modes.adapt``) to the
parameters ``inspect.signature`` finds there, against the ones fakeviz was written for (``native.TORCH_CONTRACT``,
the one table of them):

* the same parameters: the override as written, torch's method called positionally (and the C core's hook,
  where it has one, is installed: Note: [the C core's torch contract]);
* torch's parameters are fakeviz's, reordered or fewer, and every one the override reads is there by name or
  can be derived (``func`` from the dispatch-cache ``key``, :func:`func_of_key`): :func:`incoming` reads torch's
  call by name and :func:`outgoing` calls torch's method by name (the C core's hook steps aside to this one);
* a parameter fakeviz does not know (one it could only pass on wrong), or one it reads and cannot find: the
  override steps aside to torch's own path, and one :class:`~fakeviz._engine.torch_compat.TorchInternalsWarning`
  says which and what that costs (the record stays the same, slower).

``tests/engine/test_torch_contract.py`` moves a signature (renames a parameter of torch's own method in the
test's scope) and checks both the adapted and the stepped-aside record against the normal one.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Collection
from typing import Any

from .. import native as _native
from .. import values as _values

__all__ = ["func_of_key", "incoming", "outgoing", "parameters"]


def parameters(fn: Any) -> tuple[str, ...] | None:
    """``fn``'s parameter names (``self`` included) when all are plain (positional or keyword); None for one
    with ``*args``, ``**kwargs`` or keyword-only parameters (nothing to bind by name with certainty)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is not inspect.Parameter.POSITIONAL_OR_KEYWORD for p in params):
        return None
    return tuple(p.name for p in params)


def func_of_key(key: Any) -> Any:
    """The op a dispatch-cache key is for: torch's keys start with it, fakeviz's fast keys follow their marker
    with it (Note: [fast dispatch-cache key])."""
    items = getattr(key, "key", None)
    if type(items) is not tuple or not items:
        return None
    return items[1] if items[0] is _values.FAST_KEY and len(items) > 1 else items[0]


#: how a parameter torch no longer passes is found from the ones it does: name -> (needs, derive)
DERIVED: dict[str, tuple[str, Callable[[Any], Any]]] = {"func": ("key", func_of_key)}


def incoming(path: str, ours: Callable[..., Any], reads: Collection[str]) -> tuple[Callable[..., Any] | None, str]:
    """``ours`` (an override written for ``TORCH_CONTRACT[path]``) as a method torch can call with the signature
    it has: ``ours`` itself where nothing moved, an adapter where torch passes what ``ours`` reads (``reads``: by
    name, or :data:`DERIVED`), else None. The second item says what moved ("" where nothing did)."""
    expected = _native.TORCH_CONTRACT[path]
    found = _native.torch_parameters(path)
    if found == expected:
        return ours, ""
    if not found:
        return None, f"{path} is missing" if found is None else f"{path} has no signature to read"
    moved = f"{path}({', '.join(found)}) where fakeviz expects ({', '.join(expected)})"
    if parameters(_torch_object(path)) is None or not set(found) <= set(expected):
        return None, moved  # torch passes what fakeviz does not know
    for name in reads:
        if name not in found and (name not in DERIVED or DERIVED[name][0] not in found):
            return None, moved
    derive = {n: DERIVED[n] for n in expected if n not in found and n in DERIVED}
    names = found

    def adapter(*args: Any, **kwargs: Any) -> Any:
        got = dict(zip(names, args))
        got.update(kwargs)
        for name, (source, fn) in derive.items():
            got[name] = fn(got[source])
        return ours(*(got.get(n) for n in expected))

    adapter.__name__ = adapter.__qualname__ = getattr(ours, "__name__", "adapter")
    adapter.__doc__ = (
        f"{getattr(ours, '__doc__', None) or ''}\n\n(adapted to {moved}: Note: [private torch signatures])"
    )
    return adapter, moved


def outgoing(path: str) -> tuple[Callable[..., Any] | None, str]:
    """Torch's own ``path`` callable with the arguments of ``TORCH_CONTRACT[path]``, in that order: torch's
    function itself where nothing moved, else a caller that passes each by the name torch has (those torch
    dropped are left out); None where torch wants a parameter fakeviz does not have. The second item says what
    moved ("" where nothing did)."""
    expected = _native.TORCH_CONTRACT[path]
    found = _native.torch_parameters(path)
    fn = _torch_object(path)
    if found == expected:
        return fn, ""
    if not found:
        return None, f"{path} is missing" if found is None else f"{path} has no signature to read"
    moved = f"{path}({', '.join(found)}) where fakeviz expects ({', '.join(expected)})"
    if parameters(fn) is None or not set(found) <= set(expected):
        return None, moved
    at = [expected.index(n) for n in found]

    def caller(*args: Any) -> Any:
        return fn(*[args[i] for i in at])

    caller.__name__ = caller.__qualname__ = path.rsplit(".", 1)[-1]
    return caller, moved


def _torch_object(path: str) -> Any:
    import torch._subclasses.fake_tensor as ft

    obj: Any = ft
    for part in path.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj  # as torch calls it (a decorated method's wrapper too); inspect.signature reads through wrappers
