"""Models by name and checkpoints without their data, as a user of the command line meets them (issue 16).

Sections (``--sections``, default all):

* ``from_pretrained``: ``fakeviz.models.from_pretrained`` on a Llama-3.1-70B-shaped sharded checkpoint
  (30 safetensors shards, 141 GB, written as sparse files whose data regions are holes) against
  ``fakeviz.models.build`` of the same config.json, interleaved run by run; reports the ratio of the
  medians (goal: within 1.2x), the bytes read (``/proc/self/io`` rchar) and the RSS growth of one
  from_pretrained.
* ``report``: ``fakeviz report meta-llama/Llama-3.1-405B --train --seq 4096`` in a subprocess, wall time and
  peak RSS (``wait4``'s ``ru_maxrss``), against a subprocess that only imports torch and transformers, in the
  same run, interleaved (goal: under 1 GiB beyond those imports).

    python benchmarks/cli.py [--sections from_pretrained] [--runs 5] [--shards 30]

Results are printed and written to benchmarks/results/cli.json (merged with the other sections' results).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from sparse_safetensors import write_sparse_safetensors  # noqa: E402 - shared with tests/engine/test_checkpoint.py

HERE = Path(__file__).resolve().parent
OUT = HERE / "results" / "cli.json"
MODEL = "meta-llama/Llama-3.1-70B"


# ------------------------------------------------------------------------------------- helpers
def _rchar() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    return -1


def _rss() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def make_sparse_checkpoint(folder: Path, name: str = MODEL, shards: int = 30) -> int:
    """config.json + a sharded safetensors index of ``name`` (bf16, sparse files); returns the bytes of the shards."""
    import torch

    from fakeviz import models

    entry = models.resolve(name)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(entry.config))
    sd = models.build(folder, device="meta", dtype=torch.bfloat16).state_dict()
    names = list(sd)
    per = -(-len(names) // shards)
    weight_map: dict[str, str] = {}
    total = 0
    for i in range(shards):
        file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = names[i * per : (i + 1) * per]
        total += write_sparse_safetensors(folder / file, {k: ("BF16", tuple(sd[k].shape), 2) for k in part})
        weight_map.update(dict.fromkeys(part, file))
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return total


# ------------------------------------------------------------------------------ from_pretrained
def bench_from_pretrained(runs: int = 5, shards: int = 30) -> dict[str, Any]:
    """from_pretrained on a 70B-shaped sparse sharded checkpoint vs build from its config.json."""
    import torch
    import transformers

    from fakeviz import models

    transformers.logging.set_verbosity_error()
    with tempfile.TemporaryDirectory(prefix="fakeviz-bench-") as tmp:
        folder = Path(tmp) / "Llama-3.1-70B"
        size = make_sparse_checkpoint(folder, shards=shards)
        on_disk = sum(os.stat(f).st_blocks * 512 for f in folder.iterdir())
        models.build(folder / "config.json", device="cuda:0", dtype=torch.bfloat16)  # warm imports and caches
        models.from_pretrained(folder, device="cuda:0")
        t_build, t_pre = [], []
        for _ in range(runs):  # interleaved, so a drift of the machine's speed hits both alike
            t = time.perf_counter()
            models.build(folder / "config.json", device="cuda:0", dtype=torch.bfloat16)
            t_build.append(time.perf_counter() - t)
            t = time.perf_counter()
            models.from_pretrained(folder, device="cuda:0")
            t_pre.append(time.perf_counter() - t)
        r0, m0 = _rchar(), _rss()
        model = models.from_pretrained(folder, device="cuda:0")
        read, grew = _rchar() - r0, _rss() - m0
        params = sum(p.numel() for p in model.parameters())
    res = {
        "model": MODEL,
        "shards": shards,
        "checkpoint_bytes": size,
        "bytes_on_disk": on_disk,
        "parameters": params,
        "runs": runs,
        "build_s": [round(x, 3) for x in t_build],
        "from_pretrained_s": [round(x, 3) for x in t_pre],
        "ratio_of_medians": round(statistics.median(t_pre) / statistics.median(t_build), 3),
        "bytes_read_one_from_pretrained": read,
        "rss_growth_one_from_pretrained": grew,
        "goal": "ratio <= 1.2",
    }
    print(
        f"from_pretrained ({shards} sparse shards, {size / 1e9:.0f} GB, {on_disk / 1e6:.1f} MB on disk): "
        f"median {statistics.median(t_pre):.2f}s vs build {statistics.median(t_build):.2f}s -> "
        f"{res['ratio_of_medians']:.2f}x (goal <= 1.2x); read {read / 1e6:.2f} MB, RSS +{grew / 2**20:.0f} MiB"
    )
    return res


def _child(argv: list[str]) -> tuple[float, int, int]:
    """Run ``argv`` as a child process: (wall seconds, peak RSS in bytes, exit code)."""
    import subprocess

    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=HERE.parent, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        print(proc.stderr.read().decode()[-2000:] if proc.stderr else "")
    return wall, usage.ru_maxrss * 1024, proc.returncode


def bench_report(runs: int = 3, model: str = "meta-llama/Llama-3.1-405B", seq: int = 4096) -> dict[str, Any]:
    """``fakeviz report MODEL --train --seq SEQ`` against ``import torch, transformers`` alone (both children)."""
    import sys

    base_cmd = [sys.executable, "-c", "import torch, transformers"]
    with tempfile.TemporaryDirectory() as tmp:
        js = Path(tmp) / "r.json"
        cmd = [sys.executable, "-m", "fakeviz", "report", model, "--train", "--seq", str(seq), "--json", str(js)]
        base, rep = [], []
        for _ in range(runs):
            base.append(_child(base_cmd))
            rep.append(_child(cmd))
        data = json.loads(js.read_text()) if js.is_file() else {}
    if any(r[2] for r in rep):
        raise RuntimeError(f"fakeviz report failed: exit codes {[r[2] for r in rep]}")
    b_wall, b_rss = statistics.median(x[0] for x in base), statistics.median(x[1] for x in base)
    r_wall, r_rss = statistics.median(x[0] for x in rep), statistics.median(x[1] for x in rep)
    res = {
        "command": " ".join(["fakeviz", *cmd[3:-2]]),
        "runs": runs,
        "imports_wall_s": [round(x[0], 2) for x in base],
        "imports_peak_rss_mib": [round(x[1] / 2**20) for x in base],
        "report_wall_s": [round(x[0], 2) for x in rep],
        "report_peak_rss_mib": [round(x[1] / 2**20) for x in rep],
        "report_record_s": round(data.get("seconds", float("nan")), 2),
        "ops": data.get("ops"),
        "wall_ratio_of_medians": round(r_wall / b_wall, 2),
        "rss_beyond_imports_mib": round((r_rss - b_rss) / 2**20),
        "goal": "rss_beyond_imports < 1024 MiB",
    }
    print(
        f"report {model} --train --seq {seq}: {r_wall:.1f} s wall ({res['wall_ratio_of_medians']}x the imports' "
        f"{b_wall:.1f} s; recording {res['report_record_s']} s, {res['ops']:,} ops), peak RSS {r_rss / 2**20:.0f} MiB "
        f"= imports {b_rss / 2**20:.0f} MiB + {res['rss_beyond_imports_mib']} MiB (goal < 1024 MiB)"
    )
    return res


SECTIONS = {"from_pretrained": bench_from_pretrained, "report": bench_report}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sections", nargs="+", default=list(SECTIONS), choices=list(SECTIONS))
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--shards", type=int, default=30)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    results: dict[str, Any] = json.loads(args.out.read_text()) if args.out.is_file() else {}
    for name in args.sections:
        if name == "from_pretrained":
            results[name] = bench_from_pretrained(runs=args.runs, shards=args.shards)
        elif name == "report":
            results[name] = bench_report(runs=args.runs)
        else:
            results[name] = SECTIONS[name]()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    return results


if __name__ == "__main__":
    main()
