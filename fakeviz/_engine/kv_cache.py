"""KV caches: which storages a transformers cache holds, and the prefill and decode steps of a generation.

Note: [KV cache storages]
A KV cache is not a module, a parameter or an autograd object: nothing the recorder hooks says that a
tensor is one. What says it is where the tensor lives between model calls: in a transformers ``Cache``
(``DynamicCache``, ``StaticCache``, ``EncoderDecoderCache``, ...), whose layer objects hold ``keys`` and
``values`` (``transformers/cache_utils.py``). At every top-level module call (the module stack is empty:
``model(...)``, each forward ``generate()`` makes) the recorder looks at the call's arguments, keyword
arguments and output for such a cache and marks the storages of the tensors its layers hold with
``ROLE_KV``. A category holds for a storage's whole life (``fakeviz._analysis.categories``), and every
storage a cache holds is held by it at the end of some top-level call: a ``DynamicCache`` replaces each
layer's tensors by a ``torch.cat`` inside the call and keeps the result until the next one; a
``StaticCache`` allocates its tensors inside the first call and writes into them in place. So marking at
the boundaries labels every cache storage, from the op that made it. Storages that only pass through a
call (the new keys before the ``cat``) are not the cache's and stay Temporary.

Caches are found by duck typing, never by importing transformers: a class in the object's MRO whose
name ends with ``Cache`` and whose module is ``transformers...``. Only tensors that hold cached
states are marked (``_STATE_ATTRS``: keys, values, indexer keys, quantized keys and values, linear
attention conv and recurrent states; the legacy per-layer lists ``key_cache``/``value_cache``), not the
bookkeeping tensors (``StaticLayer.cumulative_length``, a sliding window's length), so the KV cache
bytes of a run are the published ``2 * layers * batch * kv_heads * head_dim * positions * dtype size``.

Steps: a top-level call that has a cache, in or out, is a step of ``trace.meta["steps"]`` as
``[first_op, stop_op, label]`` (ops ``first_op <= seq < stop_op``). It is ``"prefill"`` when its cache
was never seen at an earlier step (``generate()`` passes a fresh empty cache; a bare ``model(ids,
use_cache=True)`` returns a new one) and ``"decode N"`` when it continues a cache seen before.
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Iterator
from typing import Any

import torch

from .._core.schema import ROLE_KV

__all__ = ["KVCacheMixin", "cache_tensors", "find_caches", "is_cache"]

# attributes of a cache layer that hold cached states (tensors, or tuples / dicts of tensors)
_STATE_ATTRS = (
    "keys", "values", "indexer_keys", "_quantized_keys", "_quantized_values", "conv_states", "recurrent_states",
)  # fmt: skip
# attributes of a cache object itself: nested caches (encoder-decoder) and legacy per-layer lists
_NESTED_ATTRS = ("self_attention_cache", "cross_attention_cache")
_LEGACY_ATTRS = ("key_cache", "value_cache", "conv_states", "ssm_states")
_CACHE_KWARGS = ("past_key_values", "past_key_value", "cache")
_IS_CACHE: dict[type, bool] = {}


def is_cache(obj: Any) -> bool:
    """Whether ``obj`` is a transformers cache object (duck-typed: Note: [KV cache storages])."""
    cls = type(obj)
    v = _IS_CACHE.get(cls)
    if v is None:
        v = _IS_CACHE[cls] = any(
            c.__name__.endswith("Cache") and (c.__module__ or "").startswith("transformers.") for c in cls.__mro__
        )
    return v


def _tensors(x: Any, depth: int = 0) -> Iterator[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        yield x
    elif depth < 3 and isinstance(x, (list, tuple)):
        for y in x:
            yield from _tensors(y, depth + 1)
    elif depth < 3 and isinstance(x, dict):
        for y in x.values():
            yield from _tensors(y, depth + 1)


def cache_tensors(cache: Any, depth: int = 0) -> Iterator[torch.Tensor]:
    """The tensors holding cached states in a transformers cache: Note: [KV cache storages]."""
    d = getattr(cache, "__dict__", None)
    if not isinstance(d, dict):
        return
    for name in _NESTED_ATTRS:
        sub = d.get(name)
        if sub is not None and depth < 2 and is_cache(sub):
            yield from cache_tensors(sub, depth + 1)
    layers = d.get("layers")
    if isinstance(layers, (list, tuple)):
        for layer in layers:
            ld = getattr(layer, "__dict__", None)
            if isinstance(ld, dict):
                for name in _STATE_ATTRS:
                    yield from _tensors(ld.get(name))
    for name in _LEGACY_ATTRS:
        yield from _tensors(d.get(name))


def find_caches(args: Any, kwargs: dict[str, Any] | None, output: Any = None) -> list[Any]:
    """The caches among a call's arguments, keyword arguments and output (one level deep), once each.

    A legacy cache (a tuple of per-layer ``(key, value)`` tuples passed as ``past_key_values``) is
    returned as that tuple.
    """
    found: dict[int, Any] = {}
    cands: list[Any] = list(args) if isinstance(args, tuple) else [args]
    for k, v in (kwargs or {}).items():
        cands.append(v)
        if k in _CACHE_KWARGS and isinstance(v, (list, tuple)) and v and isinstance(v[0], (list, tuple)):
            found[id(v)] = v
    if output is not None:
        if isinstance(output, dict):  # transformers' ModelOutput is an OrderedDict
            cands.extend(output.values())
        elif isinstance(output, (list, tuple)):
            cands.extend(output)
        else:
            cands.append(output)
    for c in cands:
        if c is not None and is_cache(c):
            found.setdefault(id(c), c)
    return list(found.values())


def _call_kwargs(depth: int) -> dict[str, Any] | None:
    """The keyword arguments of the module call whose global forward hook is running ``depth`` frames up.

    Global forward pre-hooks get no keyword arguments: ``Module._call_impl`` runs them from its nested
    ``inner`` function, whose locals hold them (the recorder's ``_mark_inputs`` reads them the same way).
    """
    try:
        f = sys._getframe(depth + 1)
    except ValueError:
        return None
    if f.f_code.co_name == "inner":
        kw = f.f_locals.get("kwargs")
        return kw if isinstance(kw, dict) else None
    return None


def _ref(obj: Any) -> Any:
    try:
        return weakref.ref(obj)
    except TypeError:  # a legacy tuple cache: kept alive by the step, its id is not reused meanwhile
        return lambda: obj


class KVCacheMixin:
    """The part of ``_State`` that finds KV caches at top-level calls and records the generation steps.

    Called by ``ModulesMixin.fw_pre``/``fw_post`` for top-level calls only: Note: [KV cache storages].
    """

    def _init_kv(self) -> None:
        self.kv_seen: dict[int, tuple[Any, int]] = {}  # id(cache) -> (weakref, decode steps so far)
        self.kv_open: tuple[int, int, list[Any]] | None = None  # (id(module), first op, caches passed in)

    def _mark_cache(self, cache: Any) -> None:
        tensors = _tensors(cache) if isinstance(cache, (list, tuple)) else cache_tensors(cache)
        for t in tensors:
            self.add_roles(t, ROLE_KV)  # type: ignore[attr-defined]

    def kv_pre(self, mod: Any, args: Any) -> None:
        """A top-level call starts: remember where, mark the caches it was given."""
        try:
            caches = find_caches(args, _call_kwargs(2))
            for c in caches:
                self._mark_cache(c)
            self.kv_open = (id(mod), self.builder.num_ops(), caches)  # type: ignore[attr-defined]
        except Exception as exc:  # noqa: BLE001 - never break the user's forward
            self.kv_open = None
            self.internal_note("kv_cache", exc)  # type: ignore[attr-defined]

    def kv_post(self, mod: Any, output: Any) -> None:
        """A top-level call ends: mark the caches it holds or returns; a call with a cache is a step."""
        opened, self.kv_open = self.kv_open, None
        if opened is None or opened[0] != id(mod):
            return
        try:
            _, first, given = opened
            caches = {id(c): c for c in (*given, *find_caches((), None, output))}
            if not caches:
                return
            for c in caches.values():
                self._mark_cache(c)
            label = "prefill"
            for c in given:
                seen = self.kv_seen.get(id(c))
                if seen is not None and seen[0]() is c:
                    n = seen[1] + 1
                    label = f"decode {n}"
                    break
            n = 0 if label == "prefill" else n
            for c in caches.values():
                self.kv_seen[id(c)] = (_ref(c), n)
            meta = self.trace.meta  # type: ignore[attr-defined]
            meta.setdefault("steps", []).append([first, self.builder.num_ops(), label])  # type: ignore[attr-defined]
        except Exception as exc:  # noqa: BLE001 - never break the user's forward
            self.internal_note("kv_cache", exc)  # type: ignore[attr-defined]
