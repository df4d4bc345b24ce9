// The time axis: reading the time pack, the axis's geometry, the seconds format.
import { describe, expect, it } from "vitest";
import { readTime } from "../src/data.js";
import { unpack } from "../src/decode.js";
import { fmtSeconds } from "../src/format.js";
import { timeAxis } from "../src/layout.js";
import { opTime } from "../src/views/timeline.js";
import { END, EST, timePack } from "./fixture.js";

const f32 = (v) => Math.fround(v);

describe("time pack", () => {
  it("gives every op its end, own time, class and bound; untimed ops take no time", () => {
    const t = readTime(unpack(timePack()));
    expect(t.n).toBe(12);
    expect(t.gpu).toBe("H100");
    expect(Array.from(t.end)).toEqual(END.map(f32));
    expect(Array.from(t.est)).toEqual(EST.map(f32));
    expect([t.cls(0), t.cls(2), t.cls(3), t.cls(7)]).toEqual(["none", "gemm", "elementwise", "reduction"]);
    expect([t.boundOf(0), t.boundOf(2), t.boundOf(3), t.boundOf(6)]).toEqual(["none", "compute", "memory", "latency"]);
    // op i spans [edge[i], edge[i + 1]]: ascending ends are the edges themselves
    expect(t.edge[0]).toBe(0);
    expect(Array.from(t.edge.slice(1))).toEqual(END.map(f32));
  });

  it("keeps the op order where a collective ends after later ops (its own stream)", () => {
    const cls = ["gemm", "collective", "gemm", "gemm", "elementwise"];
    const bound = ["compute", "none", "compute", "compute", "memory"];
    const est = [1, 5, 1, 1, 1];
    const end = [1, 6, 2, 3, 7]; // the collective runs 1..6 while ops 2 and 3 run; op 4 reads it (waits)
    const t = readTime(unpack(timePack({ end, est, cls, bound })));
    expect(Array.from(t.edge)).toEqual([0, 1, 2, 2, 3, 7]);
    for (let i = 0; i < 5; i++) expect(t.edge[i + 1]).toBeGreaterThanOrEqual(t.edge[i]);
    expect(t.end[1]).toBe(6); // the hover still says when it ends
    expect(opTime(t, 1)).toBe("collective: 5.00 s on its own stream, ends at 6.00 s on H100");
  });

  it("is null without a pack or without ops (a panel without times)", () => {
    expect(readTime(null)).toBeNull();
    expect(readTime(unpack(timePack({ end: [], est: [], cls: [], bound: [] })))).toBeNull();
  });
});

describe("time axis", () => {
  const edge = Float64Array.from([0, 1, 1, 3, 4]); // op 1 takes no time
  const x = timeAxis(edge, 100, 500); // 4 s over 400 px

  it("maps op boundaries and ends to their seconds", () => {
    expect(x(0)).toBe(100);
    expect(x(1)).toBe(200);
    expect(x(2)).toBe(200);
    expect(x(2.5)).toBe(300);
    expect(x(4)).toBe(500);
    expect(x.time(2)).toBe(300);
  });

  it("inverts a pixel to the op that runs then, never to an op of no duration", () => {
    expect(Math.floor(x.invert(150))).toBe(0);
    expect(Math.floor(x.invert(200))).toBe(2);
    expect(Math.floor(x.invert(399))).toBe(2);
    expect(Math.floor(x.invert(450))).toBe(3);
    expect(Math.floor(x.invert(9999))).toBe(3);
    expect(Math.floor(x.invert(-50))).toBe(0);
  });
});

describe("seconds", () => {
  it("prints three significant digits in s, ms or µs", () => {
    expect(fmtSeconds(0)).toBe("0 s");
    expect(fmtSeconds(1.689)).toBe("1.69 s");
    expect(fmtSeconds(0.512)).toBe("512 ms");
    expect(fmtSeconds(0.0123)).toBe("12.3 ms");
    expect(fmtSeconds(12.3e-6)).toBe("12.3 µs");
    expect(fmtSeconds(1.5e-7)).toBe("0.15 µs");
    expect(fmtSeconds(Math.fround(10e-6))).toBe("10.0 µs");
    expect(fmtSeconds(0.9996)).toBe("1.00 s");
    expect(fmtSeconds(999.6e-6)).toBe("1.00 ms");
    expect(fmtSeconds(null)).toBe("?");
  });
});
