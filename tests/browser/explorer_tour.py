"""The explorer tour the browser tests run in JupyterLab and Notebook 7: ``write(path)`` writes it (no outputs).

It was tutorial 02 before the tutorials were renumbered (issue 20); it stays as the browser tests' fixture."""

import nbformat as nbf
from nbcells import write_notebook

md, code = nbf.v4.new_markdown_cell, nbf.v4.new_code_cell
cells = [
    md("# 02 · The explorer: a trace in the browser\n\n"
       "A trace displays itself as the **explorer**: the layer tree (an icicle), each device's peak memory "
       "by category, the memory timeline over the run, the alias graph and the ops table. Everything is "
       "computed once in Python and sent as a few compact binary buffers; clicking around (select a module, "
       "filter the ops, hover the timeline) happens in the browser, without the kernel, so the panel keeps "
       "working in a saved notebook and in an offline HTML report."),
    code("%load_ext fakeviz\nimport torch\nfrom transformers import LlamaConfig, LlamaForCausalLM"),
    md("A small Llama (4 layers, 1024 wide) runs forward and backward on a fake `cuda:0` in bfloat16, "
       "with a verdict against an L4's 24 GB. The cell's result is the trace, and the trace shows the explorer."),
    code("%%fake --device cuda:0 --dtype bfloat16 --gpu L4 -o trace\n"
         "cfg = LlamaConfig(hidden_size=1024, intermediate_size=3584, num_hidden_layers=4,\n"
         "                  num_attention_heads=16, num_key_value_heads=4, vocab_size=32000)\n"
         "model = LlamaForCausalLM(cfg)\n"
         "ids = torch.randint(0, cfg.vocab_size, (1, 512))\n"
         "loss = model(ids, labels=ids).loss\n"
         "loss.backward()"),
    md("`trace.explore()` returns the panel as a widget you can keep: give it another capacity (a GPU name "
       "or a size) and a starting view. Here the tree is sized by the activations each module makes.\n\n"
       "Click a module in the tree: it is selected (and the tree drills into it), the ops table keeps only "
       "its ops, the timeline marks when it ran, and the bars show its share of each device's peak. "
       "The breadcrumb above the tree goes back up."),
    code('explorer = trace.explore("H100", size_by="act_bytes")\nexplorer'),
    md("The selection is a trait, both ways: set it from Python and the panel above follows…"),
    code('explorer.selected_module = "LlamaForCausalLM.model.layers.0-3.mlp"'),
    md("…and after a click in the tree, Python sees the module you picked (run this cell again):"),
    code('print("selected:", explorer.selected_module or "(nothing)")'),
    md("`trace.to_html(path)` writes the same panel as one self-contained file: no server, no kernel "
       "and no network needed to open it."),
    code('report = trace.to_html("explorer_report.html", "L4")\nprint(report.name, f"{report.stat().st_size / 1e6:.1f} MB")'),
]  # fmt: skip


def write(path) -> None:
    write_notebook(cells, path)
