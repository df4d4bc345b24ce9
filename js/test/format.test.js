import { describe, expect, it } from "vitest";
import { capacityOf, fmtBytes, fmtFlops, fmtInt, fmtSI, fmtTensor, shortLine, shortPath, SIZE_BY } from "../src/format.js";

describe("format", () => {
  it("applies the GPU capacity to the devices the verdict judges (Python leaves the host's out)", () => {
    const judged = { peak: 1, headroom: 1, fits: true };
    const summary = { capacity: 80e9, verdict: { devices: { "cuda:3": judged, mps: judged } } };
    expect(capacityOf(summary, "cuda:3")).toBe(80e9);
    expect(capacityOf(summary, "mps")).toBe(80e9);
    expect(capacityOf(summary, "cpu")).toBeNull();
    expect(capacityOf(summary, "meta")).toBeNull();
    expect(capacityOf({ capacity: null, verdict: null }, "cuda:0")).toBeNull();
  });

  it("prints bytes like fakeviz does in Python", () => {
    expect(fmtBytes(0)).toBe("0 B");
    expect(fmtBytes(512)).toBe("512 B");
    expect(fmtBytes(1536)).toBe("1.5 KiB");
    expect(fmtBytes(85520809984)).toBe("79.6 GiB");
    expect(fmtBytes(282248397320)).toBe("262.9 GiB");
    expect(fmtBytes(-259924164608)).toBe("-242.1 GiB");
    expect(fmtBytes(1280)).toBe("1.2 KiB"); // 1.25: a tie, to the even digit as Python's f"{x:.1f}"
    expect(fmtBytes(1792)).toBe("1.8 KiB");
    expect(fmtBytes(-1280)).toBe("-1.2 KiB");
    expect(fmtBytes(1023.9)).toBe("1023 B");
    expect(fmtBytes(null)).toBe("?");
    expect(fmtBytes(NaN)).toBe("?");
  });

  it("prints counts with SI prefixes", () => {
    expect(fmtSI(512)).toBe("512");
    expect(fmtSI(70553706496)).toBe("70.6 G");
    expect(fmtSI(1.2e6)).toBe("1.20 M");
    expect(fmtSI(295703622721536, "FLOP")).toBe("296 TFLOP");
    expect(fmtFlops(-1)).toBe("?");
    expect(fmtFlops(0)).toBe("0 FLOP");
    expect(fmtInt(23227)).toBe("23,227");
  });

  it("shortens paths and lines", () => {
    expect(shortPath("A.model.layers.0-79.mlp.up_proj")).toBe("…0-79.mlp.up_proj");
    expect(shortPath("A.b")).toBe("A.b");
    expect(shortLine("/usr/lib/python3.11/site-packages/transformers/modeling_llama.py:342 in __init__")).toBe(
      "modeling_llama.py:342 in __init__",
    );
    expect(shortLine("train.py:3 in <module>")).toBe("train.py:3 in <module>");
    expect(fmtTensor("bf16", "1, 2048, 8192")).toBe("bf16[1, 2048, 8192]");
  });

  it("sizes the tree by fwd+bwd totals where asked", () => {
    const f = { flops_fwd: [1, 2], flops_bwd: [10, 20], ops_fwd: [3, 4], ops_bwd: [5, 6] };
    expect(SIZE_BY.flops.value(f, 1)).toBe(22);
    expect(SIZE_BY.ops.value(f, 0)).toBe(8);
  });
});
