"""The runs the front ends record: a training step, a forward, ``generate`` (the CLI's ``report`` and
``fakeviz.plan`` both run these, so a plan and a report of the same settings record the same ops)."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

import torch

__all__ = ["checkpointing", "forward", "generate", "init_state", "make_optimizer", "run", "train"]


def make_optimizer(name: str, model: torch.nn.Module) -> torch.optim.Optimizer | None:
    """``"adamw"`` (lr 1e-4), ``"adam"``, ``"sgd"`` (momentum 0.9) over the trainable parameters, or None for ``"none"``."""
    params = [p for p in model.parameters() if p.requires_grad]
    if name == "none":
        return None
    if name == "sgd":
        return torch.optim.SGD(params, lr=1e-3, momentum=0.9)
    return (torch.optim.AdamW if name == "adamw" else torch.optim.Adam)(params, lr=1e-4)


def init_state(opt: torch.optim.Optimizer) -> None:
    """Give ``opt`` the state it holds from its first step on (AdamW's ``exp_avg``, ``exp_avg_sq``, ``step``), by
    its own code: a step on zero gradients, which are then dropped. A training step recorded after this is a
    steady-state step: the optimizer state is alive through forward and backward, as from step 2 of a real run."""
    params = [p for group in opt.param_groups for p in group["params"]]
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    opt.step()
    opt.zero_grad(set_to_none=True)


def train(
    model: torch.nn.Module,
    kwargs: dict[str, Any],
    *,
    optimizer: str | torch.optim.Optimizer | None = "adamw",
    steps: int = 1,
) -> None:
    """``steps`` training steps on ``kwargs`` (which hold the labels): forward, backward, optimizer step.
    ``optimizer`` is a name (:func:`make_optimizer`, made here) or an optimizer over the model's parameters."""
    model.train()
    opt = (
        optimizer
        if optimizer is None or isinstance(optimizer, torch.optim.Optimizer)
        else make_optimizer(optimizer, model)
    )
    for _ in range(steps):
        out = model(**kwargs)
        loss = out["loss"] if isinstance(out, dict) else out[0]
        loss.backward()
        del out, loss
        if opt is not None:
            opt.step()
            opt.zero_grad(set_to_none=True)


train_steps = train  # for run(), whose ``train`` flag hides the function


def forward(model: torch.nn.Module, kwargs: dict[str, Any]) -> None:
    """One inference forward, without autograd."""
    model.eval()
    with torch.no_grad():
        model(**kwargs)


def generate(model: torch.nn.Module, kwargs: dict[str, Any], new_tokens: int, *, cache: str | None = None) -> None:
    """Greedy ``generate`` of exactly ``new_tokens`` tokens after the prompt in ``kwargs`` (prefill, then one decode
    step per token, with a KV cache: transformers' default or ``cache``)."""
    model.eval()
    kwargs = {k: v for k, v in kwargs.items() if k != "decoder_input_ids"}
    pad = getattr(model.generation_config, "pad_token_id", None)
    if pad is None:
        pad = getattr(model.generation_config, "eos_token_id", None) or 0
        pad = pad[0] if isinstance(pad, (list, tuple)) else pad
    extra = {"cache_implementation": cache} if cache is not None else {}
    with torch.no_grad():
        model.generate(**kwargs, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, num_beams=1,
                       pad_token_id=pad, **extra)  # fmt: skip


@contextlib.contextmanager
def checkpointing(model: torch.nn.Module, on: bool) -> Iterator[None]:
    """Activation checkpointing of the model's repeated blocks for the block (transformers' own switch where
    the model has one, else each block's forward through ``torch.utils.checkpoint``)."""
    if not on:
        yield
        return
    if getattr(model, "supports_gradient_checkpointing", False) and hasattr(model, "gradient_checkpointing_enable"):
        # transformers 5 renamed the switch (the old name warns)
        new = hasattr(model, "activation_checkpointing_enable")
        enable = model.activation_checkpointing_enable if new else model.gradient_checkpointing_enable
        disable = model.activation_checkpointing_disable if new else model.gradient_checkpointing_disable
        key = "activation_checkpointing_kwargs" if new else "gradient_checkpointing_kwargs"
        enable(**{key: {"use_reentrant": False}})
        try:
            yield
        finally:
            disable()
        return
    from torch.utils.checkpoint import checkpoint

    from .._analysis import placement

    names = [n for n in placement.units(model) if n.rsplit(".", 1)[-1].isdigit()]
    saved = []
    for n in names:
        block = model.get_submodule(n)
        saved.append((block, block.forward))
        block.forward = functools.partial(checkpoint, block.forward, use_reentrant=False)  # type: ignore[method-assign]
    try:
        yield
    finally:
        for block, fwd in saved:
            block.forward = fwd  # type: ignore[method-assign]


def run(model: torch.nn.Module, *, batch: int, seq: int, train: bool, new_tokens: int,
          optimizer: torch.optim.Optimizer | str = "adamw") -> None:  # fmt: skip
    """A plan's run: one training step (AdamW by default), or ``generate`` of ``new_tokens``, or a forward."""
    from .. import models

    models.check_seq(model, seq, 0 if train else new_tokens)  # the prompt and what is generated after it
    kwargs = models.inputs(model, batch=batch, seq=seq, labels=train)
    if train:
        train_steps(model, kwargs, optimizer=optimizer, steps=1)
    elif new_tokens:
        generate(model, kwargs, new_tokens)
    else:
        forward(model, kwargs)
