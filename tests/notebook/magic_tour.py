"""A tour of every ``%%fake`` option, executed by tests/notebook/test_notebooks.py: ``write(path)`` writes it.

It was tutorial 01 before the tutorials were renumbered (issue 20); tutorial 01 now teaches the magic
briefly, and this notebook keeps checking every option, the progress line and the error display."""

import nbformat as nbf
from nbcells import write_notebook

md, code = nbf.v4.new_markdown_cell, nbf.v4.new_code_cell
cells = [
    md("# 01 · `%%fake`: run a cell under fake tensors\n\n"
       "`%%fake` runs a cell with fake tensors (shape, dtype, device, no data) and records every op. "
       "Variables made in the cell stay in the notebook as fake objects, so later `%%fake` cells can keep "
       "using them. Nothing here allocates real model memory, and `cuda` works without a GPU."),
    code("%load_ext fakeviz\nimport torch\nfrom transformers import LlamaConfig, LlamaForCausalLM"),
    md("A Llama-shaped model with 2 layers of Llama-3-8B width, built on a fake `cuda:0` in bfloat16, "
       "with a verdict against an L4's 24 GB. The trace is kept as `trace`."),
    code("%%fake --device cuda:0 --dtype bfloat16 --gpu L4 -o trace\n"
         "cfg = LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=2,\n"
         "                  num_attention_heads=32, num_key_value_heads=8, vocab_size=128256)\n"
         "model = LlamaForCausalLM(cfg)\n"
         "ids = torch.randint(0, cfg.vocab_size, (1, 1024))\n"
         "loss = model(ids, labels=ids).loss\n"
         "loss.backward()"),
    code("print(type(model.model.embed_tokens.weight).__name__, model.model.embed_tokens.weight.device)\n"
         "trace.ops.groupby('phase', observed=True).size()"),
    md("The same fake session lasts across cells: the model from above takes an optimizer step here "
       "(a trailing `;` suppresses the display; the trace goes to `_fake`)."),
    code("%%fake --device cuda:0\nopt = torch.optim.AdamW(model.parameters(), foreach=False)\nopt.step();"),
    code("_fake.ops.phase.value_counts()"),
    md("`--capacity` takes a size instead of a GPU name; `--attention` restricts the SDPA backends; "
       "`--no-display` shows nothing."),
    code("%%fake --device cuda:0 --capacity 8GiB --attention math -o t_math\n"
         "q = torch.randn(1, 8, 512, 64, dtype=torch.bfloat16)\n"
         "o = torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)"),
    code("%%fake --no-display -o quiet\nx = torch.ones(1000, 1000)"),
    code("quiet"),
    md("`--real` records a real run with the same recorder (small sizes only!)."),
    code("%%fake --real -o real_trace\nr = torch.ones(3) * 2\nprint(r.sum().item())"),
    md("Fake tensors carry no data, yet small values a real run could know are known: numbers you wrote, "
       "and random draws on the CPU from the seeded generator. A draw on a GPU is not (its generator is the "
       "GPU's), so a cell that branches on one cannot run on fake tensors. The error explains why and what "
       "to do, the partial trace is kept, and no fake mode stays active."),
    nbf.v4.new_code_cell("%%fake --device cuda:0 -o broken\nx = torch.randn(3)\nif x.sum() > 0:\n    print('positive')",
                         metadata={"tags": ["raises-exception"]}),
    code("print(broken.error['op'], '| partial ops:', broken.num_ops)\n"
         "print('fake mode still active?', torch._guards.detect_fake_mode() is not None)\n"
         "torch.ones(2) + 1  # an ordinary cell computes real tensors again"),
    md("Long cells show a progress line (ops recorded, phase, module) that disappears when the cell ends."),
    code("%config FakeMagics.progress_interval = 0.0"),
    code("%%fake -o t_long\nacc = torch.zeros(64, 64)\nfor _ in range(1500):\n    acc = acc + 1"),
    md("Sessions: `--session NAME` keeps a separate fake mode; `%fake_reset` forgets them all."),
    code("%%fake --session scratch -o t_scratch\ny = torch.zeros(10)"),
    code("%fake_reset"),
    code("%config FakeMagics.device = 'cuda:3'"),
    code("%%fake -o t_cfg\nw = torch.empty(4)\nprint(w.device)"),
    code("%unload_ext fakeviz"),
]  # fmt: skip


def write(path) -> None:
    write_notebook(cells, path)
