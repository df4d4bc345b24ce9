"""The time model end to end: a fake record made on this machine against the step a real GPU ran.

For every step ``benchmarks/gpu_time.py`` measured on the lent H100 (``tests/fixtures/h100_time*.json.gz``: the
fitting steps, the held-out ones, and the three predicted before they were measured), the same step is recorded
here under fake tensors on ``cuda:0`` (a ``FakeSession``: the build in one block, a first step in a second so
AdamW's state exists, the timed step in a third, as the GPU's step was a steady-state one) and
``trace.step_time("H100")`` is compared with the GPU's median step time. The tiny zoo steps are left out: their
time is the host's (Python), which the model takes from the device's host.

    python benchmarks/time_accuracy.py [--out benchmarks/results/time_accuracy.json]
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
FIXTURES = {
    "fit": REPO / "tests" / "fixtures" / "h100_time.json.gz",
    "held out": REPO / "tests" / "fixtures" / "h100_time_holdout.json.gz",
    "predicted before measuring": REPO / "tests" / "fixtures" / "h100_time_holdout2.json.gz",
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=HERE / "results" / "time_accuracy.json")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(HERE))
    import gpu_time

    import fakeviz as fv

    result: dict[str, Any] = {}
    for label, path in FIXTURES.items():
        with gzip.open(path, "rt") as fh:
            data = json.load(fh)
        rows = []
        for row in data["steps"]:
            if "error" in row or row["case"] in gpu_time.ZOO_CASES:
                continue
            t = time.perf_counter()
            session = fv.FakeSession()
            with fv.record(session=session, device="cuda:0"):
                case = gpu_time._hf_case(row["case"], "cuda:0")
            with fv.record(session=session, device="cuda:0"):
                case.step()
            with fv.record(session=session, device="cuda:0") as trace:
                case.step()
            st = trace.step_time("H100")
            err = st.step_s / row["median_s"] - 1
            rows.append({"case": row["case"], "measured_s": row["median_s"], "model_s": st.step_s, "rel_error": err,
                         "bound": st.bound, "record_s": time.perf_counter() - t})  # fmt: skip
            print(f"{label:<28}{row['case']:<28}{row['median_s'] * 1e3:9.2f} ms measured  {st.step_s * 1e3:9.2f} ms "
                  f"model  {err:+7.1%}")  # fmt: skip
        errs = [abs(r["rel_error"]) for r in rows]
        result[label] = {"steps": rows, "median_abs_error": statistics.median(errs), "max_abs_error": max(errs)}
        print(f"{label}: median |error| {statistics.median(errs):.1%}, worst {max(errs):.1%}\n")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
