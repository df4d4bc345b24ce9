"""Autograd: saved tensors (pack/unpack hooks), backward events, the leaves a backward reaches, gradients."""

from __future__ import annotations

import weakref
from typing import Any

from ..._core.schema import ROLE_GRAD, ROLE_SAVED
from .. import patches as _patches
from .common import _get_ident, _get_sequence_nr, _no_torch_function, _Tensor
from .fastpath import _fake_detach


class AutogradMixin:
    """The part of ``_State`` that autograd calls: the saved-tensor hooks and the backward listener.

    Owns ``bw_line`` (the user line that started the running backward), ``bw_leaves``, ``grad_of``
    and ``unpacked`` (Note: [unpack detach]); the C core shares ``unpacked`` and calls ``_saved_alias``.
    """

    def _init_autograd(self) -> None:
        self.bw_line = -1
        self.bw_leaves: list[Any] = []
        self.grad_of: dict[int, int] = {}  # parameter tensor id -> storage id of its last .grad
        self.unpacked: dict[int, Any] = {}  # thread ident -> tensor; Note: [unpack detach]

    def pack_saved(self, t: Any) -> Any:
        """saved_tensors_hooks pack: the storage of ``t`` is saved for backward (an activation).

        Note: [saved tensors]
        A pack hook that returns the tensor it was given makes a reference cycle when
        autograd saves an op's *output* on the output's own grad_fn (exp, relu, softmax
        save their result): tensor -> grad_fn -> saved tensor. Without hooks autograd
        avoids this by saving a grad_fn-less alias. We do the same for outputs of the
        node being built (their grad_fn has the newest autograd sequence number): they
        are saved as ``t.detach()`` (same storage and version counter, so in-place
        checks still work), made as an inner dispatch so it is not recorded, and tagged
        with the same tensor id so backward ops name the forward tensor. Inputs and
        leaves are saved as themselves, as autograd does.
        """
        if not self.active:
            return t
        try:
            self.add_roles(t, ROLE_SAVED)
        except Exception:  # noqa: BLE001 - never break autograd
            return t
        fn = t.grad_fn
        if fn is None or fn._sequence_nr() != _get_sequence_nr() - 1:
            # a leaf, or an input of the node being built (whose sequence number is the
            # newest one handed out): no cycle is possible, save the tensor itself
            return t
        return self._saved_alias(t)

    def _saved_alias(self, t: Any) -> Any:
        """The grad_fn-less alias of ``t`` saved in its place (Note: [saved tensors])."""
        alias = _fake_detach(t)  # Note: [fast fake detach]
        if alias is None:
            loc = self.local
            depth = loc.__dict__.get("depth", 0)
            loc.depth = depth + 1  # an inner dispatch: not recorded
            try:
                alias = t.detach()
            finally:
                loc.depth = depth
        tag = t.__dict__.get("_fakeviz_tid")
        if tag is not None:
            alias.__dict__["_fakeviz_tid"] = tag
        return alias

    def own_thread(self) -> bool:
        """Whether an op dispatched on a thread other than the record's (``owner``) is the record's: autograd's
        worker thread running a backward of the record (a backward on fake cuda runs on the device's thread).
        The registry is told, so the patches answer there as in the record's thread until that backward ends;
        an op outside a backward (another thread using the record's tensors) is not recorded (Note: [threads] in
        ``patches.py``). The C core asks once per worker thread and graph task."""
        return _patches.claim(self.owner)

    def unpack_saved(self, t: Any) -> Any:
        """saved_tensors_hooks unpack: hand ``t`` back; the detach autograd may make of it next is
        bookkeeping (Note: [unpack detach])."""
        if self.active:
            self.unpacked[_get_ident()] = t
        return t

    def _leaves(self, roots: Any) -> list[Any]:
        """Leaf tensors (AccumulateGrad nodes) reachable from the graph of ``roots``."""
        # the nodes seen, kept alive: before torch 2.13 a node's Python object is made anew on each access and freed
        # after it, so a bare id() is soon another node's and the walk stopped early (gradients counted Temporary)
        seen: dict[int, Any] = {}
        stack = [t.grad_fn for t in roots if isinstance(t, _Tensor) and t.grad_fn is not None]
        leaves = []
        while stack:
            node = stack.pop()
            if node is None or id(node) in seen:
                continue
            seen[id(node)] = node
            var = getattr(node, "variable", None)
            if var is not None:
                leaves.append(weakref.ref(var))
                continue
            stack.extend(n for n, _ in node.next_functions)
        return leaves

    @_no_torch_function
    def backward_event(self, when: str, args: tuple[Any, ...], kwargs: dict[str, Any], is_grad: bool) -> None:
        """Called by the patched torch.autograd.backward/grad (see Note: [session patches])."""
        if not self.active:
            return
        if when == "before":
            self.bw_line = self.user_line(3)
            self.bw_leaves = []
            if not is_grad:
                tensors = kwargs.get("tensors", args[0] if args else ())
                tensors = (tensors,) if isinstance(tensors, _Tensor) else tuple(tensors)
                self.bw_leaves = self._leaves(tensors)
        else:
            self.unpacked.clear()  # Note: [unpack detach]
            for ref in self.bw_leaves:
                self._mark_grad(ref())
            self.bw_leaves = []

    def _mark_grad(self, p: Any) -> None:
        g = getattr(p, "grad", None) if p is not None else None
        if g is not None:
            tid = self.tensor_id(p)
            self.grad_of[tid] = self.add_roles(g, ROLE_GRAD, tid)
