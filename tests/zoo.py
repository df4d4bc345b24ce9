"""A zoo of tiny, deterministic, CPU-only models for fake-vs-real fidelity tests.

Every ``build_<name>()`` returns a :class:`Case`: ``model`` (already built, so
call it inside the recorded block), ``make_inputs()`` (builds the inputs; token
ids and targets are drawn from a fixed seed, so call it inside the block too),
``loss_fn(model, inputs)`` (forward + scalar loss) and ``make_optimizer``
(``None`` when the case stops after backward).

Rules that keep a real run and its fake twin on identical code paths:

* all dropout probabilities are 0 (the models stay in training mode);
* Hugging Face models are built from configs only (no downloads) with
  ``attn_implementation="eager"``;
* nothing reads tensor values (no ``.item()``, no data-dependent shapes);
* nothing depends on wall clock or global state other than ``torch.manual_seed``.

``run(name)`` is the whole step (seed, build, inputs, forward, loss, backward,
optional optimizer step) that the fidelity test records twice.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint

__all__ = ["ZOO", "Case", "run"]

SEED = 0


@dataclasses.dataclass
class Case:
    model: nn.Module
    make_inputs: Callable[[], Any]
    loss_fn: Callable[[nn.Module, Any], torch.Tensor]
    make_optimizer: Callable[[nn.Module], torch.optim.Optimizer] | None = None


def _ids(vocab: int, shape: tuple[int, ...], seed: int = 1) -> torch.Tensor:
    torch.manual_seed(seed)
    return torch.randint(0, vocab, shape)


# --------------------------------------------------------------------------- 1. MLP
class MLP(nn.Module):
    def __init__(self, d_in: int = 12, d_hidden: int = 24, n_classes: int = 5) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_in, d_hidden)
        self.norm = nn.LayerNorm(d_hidden)
        self.fc2 = nn.Linear(d_hidden, d_hidden)
        self.head = nn.Linear(d_hidden, n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.gelu(self.fc1(x))
        h = self.norm(h)
        h = h + torch.tanh(self.fc2(h))
        return self.head(h)


def build_mlp() -> Case:
    model = MLP()

    def make_inputs() -> Any:
        torch.manual_seed(1)
        return torch.randn(6, 12), torch.randint(0, 5, (6,))

    def loss_fn(m: nn.Module, inp: Any) -> torch.Tensor:
        x, y = inp
        return F.cross_entropy(m(x), y)

    return Case(model, make_inputs, loss_fn, lambda m: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9))


# --------------------------------------------------------- 2. conv net, channels_last
class ConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 3, stride=2, padding=1)
        self.bn2 = nn.BatchNorm2d(8)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.bn1(self.conv1(x)))
        x = F.relu(self.bn2(self.conv2(x)))
        return self.fc(torch.flatten(self.pool(x), 1))


def build_convnet_channels_last() -> Case:
    model = ConvNet().to(memory_format=torch.channels_last)

    def make_inputs() -> Any:
        torch.manual_seed(1)
        x = torch.randn(2, 3, 8, 8).contiguous(memory_format=torch.channels_last)
        return x, torch.randint(0, 4, (2,))

    def loss_fn(m: nn.Module, inp: Any) -> torch.Tensor:
        x, y = inp
        return F.cross_entropy(m(x), y)

    return Case(model, make_inputs, loss_fn, lambda m: torch.optim.SGD(m.parameters(), lr=0.1))


# ------------------------------------------------------------- 3.-6. Hugging Face
def _hf(cls_name: str, cfg_name: str, **cfg: Any) -> nn.Module:
    import transformers

    config = getattr(transformers, cfg_name)(**cfg)
    config._attn_implementation = "eager"
    return getattr(transformers, cls_name)(config)


def _causal_lm_case(model: nn.Module, vocab: int, optimizer: Any = None) -> Case:
    def make_inputs() -> Any:
        return _ids(vocab, (2, 8))

    def loss_fn(m: nn.Module, ids: torch.Tensor) -> torch.Tensor:
        return m(input_ids=ids, labels=ids).loss

    return Case(model, make_inputs, loss_fn, optimizer)


def build_gpt2() -> Case:
    model = _hf(
        "GPT2LMHeadModel", "GPT2Config",
        n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=32,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=True,
        bos_token_id=0, eos_token_id=0, attn_implementation="eager",
    )  # fmt: skip
    assert model.lm_head.weight is model.transformer.wte.weight, "embeddings must be tied"
    model.loss_type = "ForCausalLM"  # GPT2LMHeadModel leaves it unset (and logs a warning)
    return _causal_lm_case(model, 100)


def build_llama() -> Case:
    model = _hf(
        "LlamaForCausalLM", "LlamaConfig",
        num_hidden_layers=2, hidden_size=32, intermediate_size=64, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=100, max_position_embeddings=32, attention_dropout=0.0,
        tie_word_embeddings=False, attn_implementation="eager",
    )  # fmt: skip
    return _causal_lm_case(model, 100, lambda m: torch.optim.AdamW(m.parameters(), lr=1e-3, foreach=False))


def build_bert() -> Case:
    model = _hf(
        "BertForMaskedLM", "BertConfig",
        num_hidden_layers=2, hidden_size=32, intermediate_size=64, num_attention_heads=2,
        vocab_size=100, max_position_embeddings=32, type_vocab_size=2,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, attn_implementation="eager",
    )  # fmt: skip

    def make_inputs() -> Any:
        ids = _ids(100, (2, 8))
        labels = torch.full((2, 8), -100, dtype=torch.long)
        labels[:, 1::3] = ids[:, 1::3]  # a fixed mask pattern, no data-dependent shapes
        return ids, labels

    def loss_fn(m: nn.Module, inp: Any) -> torch.Tensor:
        ids, labels = inp
        return m(input_ids=ids, labels=labels).loss

    return Case(model, make_inputs, loss_fn)


def build_t5() -> Case:
    model = _hf(
        "T5ForConditionalGeneration", "T5Config",
        num_layers=2, num_decoder_layers=2, d_model=32, d_kv=8, d_ff=64, num_heads=4,
        vocab_size=100, relative_attention_num_buckets=8, relative_attention_max_distance=16,
        dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0, attn_implementation="eager",
    )  # fmt: skip

    def make_inputs() -> Any:
        return _ids(100, (2, 8)), _ids(100, (2, 6), seed=2)

    def loss_fn(m: nn.Module, inp: Any) -> torch.Tensor:
        ids, labels = inp
        return m(input_ids=ids, labels=labels).loss

    return Case(model, make_inputs, loss_fn)


# ------------------------------------------------------------- 7. views and in-place ops
class ViewsInplace(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 16)
        self.scale = nn.Parameter(torch.ones(4, 4))
        self.register_buffer("counter", torch.zeros(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.proj(x)  # [6, 16]
        v = h.view(6, 4, 4).transpose(1, 2)  # non-contiguous view
        v = v * self.scale  # [6, 4, 4]
        a = v.narrow(0, 1, 4)  # view
        b = a[:, ::2, 1:].unsqueeze(1)  # strided view [4, 1, 2, 3]
        out = torch.zeros(4, 2, 2, 3)
        out[:, :1].copy_(b)  # copy_ into a slice
        out[:, 1:] = b * 2  # setitem into a slice
        out.add_(1.0)
        out.mul_(0.5)
        idx = torch.tensor([0, 2])
        out.index_put_((idx,), torch.ones(2, 2, 2, 3), accumulate=True)
        s = torch.as_strided(out, (4, 3), (12, 1), 2)  # as_strided view
        s.sub_(0.25)
        flat = out.reshape(4, -1)  # a view: out is contiguous
        r = flat.t().contiguous()
        r[0].clamp_(min=0.0)  # in-place on a row view
        r.relu_()
        with torch.no_grad():
            self.counter.add_(1)  # in-place on a buffer
        return r.sum(0) + v.diagonal(dim1=1, dim2=2).sum() + s.sum()


def _views_case(model: nn.Module) -> Case:
    """The views/in-place models share inputs, loss and optimizer."""

    def make_inputs() -> Any:
        torch.manual_seed(1)
        return torch.randn(6, 8)

    def loss_fn(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return m(x).pow(2).mean()

    return Case(model, make_inputs, loss_fn, lambda m: torch.optim.SGD(m.parameters(), lr=0.01))


def build_views_inplace() -> Case:
    return _views_case(ViewsInplace())


class ViewsInplaceNoGrad(nn.Module):
    """The same kind of view and in-place work, on tensors that do not require grad.

    Masks, tables and buffers are built with views and in-place ops while
    gradients flow only through out-of-place ops on (views of) activations, so
    autograd never has to rebase the history of a view.
    """

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 16)
        self.register_buffer("table", torch.arange(48, dtype=torch.float32).view(4, 12))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = self.table.clone()
        t4 = t.view(4, 2, 2, 3).transpose(2, 3)  # non-contiguous view [4, 2, 3, 2]
        t4.narrow(0, 1, 2).mul_(0.5)  # in-place through a view of a view
        t4[:, :1].copy_(t4[:, 1:])  # copy_ into a slice
        t4[..., 0] = t4[..., 1]  # setitem into a strided slice (a tensor value: no scalar constant)
        t.add_(1.0).relu_()
        t.index_put_((torch.arange(0, 4, 2),), torch.ones(2, 12), accumulate=True)
        torch.as_strided(t, (3, 4), (12, 1), 2).sub_(0.25)  # as_strided view
        m = t[:, 2:6].t().unsqueeze(0)  # [1, 4, 4] view with stride 0 broadcast below
        with torch.no_grad():
            self.table.mul_(1.0)  # in-place on a buffer
        h = self.proj(x).view(6, 4, 4).transpose(1, 2)  # views of an activation that requires grad
        y = (h * m).narrow(1, 1, 2)
        return y.reshape(6, -1).sum(1) + h.diagonal(dim1=1, dim2=2).sum(1)


def build_views_inplace_nograd() -> Case:
    return _views_case(ViewsInplaceNoGrad())


# ------------------------------------------------------------- 8. activation checkpointing
class Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 2 * d)
        self.fc2 = nn.Linear(2 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(F.silu(self.fc1(self.norm(x))))


class Checkpointed(nn.Module):
    def __init__(self, d: int = 16, n: int = 3) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(d) for _ in range(n))
        self.out = nn.Linear(d, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for blk in self.blocks:
            x = checkpoint(blk, x, use_reentrant=False)
        return self.out(x)


def build_checkpointed() -> Case:
    model = Checkpointed()

    def make_inputs() -> Any:
        torch.manual_seed(1)
        return torch.randn(4, 5, 16)

    def loss_fn(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return m(x).square().mean()

    return Case(model, make_inputs, loss_fn)


ZOO: dict[str, Callable[[], Case]] = {
    "mlp": build_mlp,
    "convnet_channels_last": build_convnet_channels_last,
    "gpt2_tied": build_gpt2,
    "llama": build_llama,
    "bert": build_bert,
    "t5": build_t5,
    "views_inplace": build_views_inplace,
    "views_inplace_nograd": build_views_inplace_nograd,
    "checkpointed": build_checkpointed,
}


def run(name: str) -> dict[str, Any]:
    """One training step of zoo model ``name``: seed, build, inputs, forward, loss, backward, step.

    Returns the objects the caller may want to inspect (model, loss, a parameter).
    """
    torch.manual_seed(SEED)
    case = ZOO[name]()
    inputs = case.make_inputs()
    loss = case.loss_fn(case.model, inputs)
    loss.backward()
    if case.make_optimizer is not None:
        opt = case.make_optimizer(case.model)
        opt.step()
        opt.zero_grad(set_to_none=True)
    return {"model": case.model, "loss": loss, "param": next(case.model.parameters())}
