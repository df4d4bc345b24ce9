// Per-device peak memory as a stacked bar by category, with the capacity line, the caching
// allocator's peaks and the verdict; the selected module's share of the peak underneath.
import { h, s, setText, tip, watchWidth, widthOf } from "../dom.js";
import { peakShare } from "../filter.js";
import { capacityOf, fmtBytes, fmtInt } from "../format.js";
import { linear } from "../layout.js";

const DEFAULT_W = 640;
const PAD_L = 8;
const PAD_R = 8;
const BAR_H = 26;

export function barsView(ctx) {
  const { data, store } = ctx;
  const { summary, memory } = data;
  const body = h("div", { class: "fv-bars-body" });
  const verdict = h("p", { class: "fv-verdict-all", "data-testid": "fv-verdict" });
  const el = h(
    "section",
    { class: "fv-panel fv-bars", "data-testid": "fv-bars" },
    h("div", { class: "fv-panel-head" }, h("h3", { text: "Peak memory" })),
    verdict,
    body,
  );
  let W = DEFAULT_W; // drawn at the body's real width: text is never scaled

  function deviceVerdict(dev) {
    const v = summary.verdict?.devices?.[dev];
    if (!v) return null;
    // the verdict's own words for this device, with the bytes it judged (Note: [the verdict] in
    // fakeviz/_analysis/verdict.py): reserved at peak, or after freeing cached blocks when it had to
    const o = v.first_oom;
    const fails = o ? `; ${o.where}` : ""; // the verdict's one text (fakeviz/_analysis/verdict.py _where)
    if (Object.keys(summary.verdict.devices).length < 2) {
      // one device: the verdict above says it all; say only the headroom here (capacity - the bytes judged)
      const text = v.fits ? `headroom ${fmtBytes(v.headroom)}` : `over by ${fmtBytes(-v.headroom)}`;
      return h("p", { class: "fv-hint fv-headroom", text });
    }
    const text = `${v.fits ? "fits" : "does not fit"}: ${v.text}${fails}`;
    return h("p", { class: `fv-verdict ${v.fits ? "fv-fits" : "fv-over"}`, text });
  }

  function deviceBlock(dev, mem, sel) {
    const pk = summary.peaks[dev];
    const cats = summary.categories;
    const byCat = cats.map((c) => pk.by_category?.[c] ?? 0);
    const share = sel.mask ? peakShare(mem?.attr, sel.mask, cats.length) : null;
    const shareTotal = share ? share.reduce((a, b) => a + b, 0) : 0;
    const capacity = capacityOf(summary, dev);
    const top = Math.max(pk.bytes, pk.reserved ?? 0, pk.allocated ?? 0, capacity ?? 0) || 1;
    const x = linear(0, top, PAD_L, W - PAD_R);
    const rows = share ? 2 : 1;
    const height = 18 + rows * (BAR_H + 6) + 16;
    const svg = s("svg", {
      class: "fv-bar-svg",
      width: W,
      height,
      viewBox: `0 0 ${W} ${height}`,
      role: "img",
      "aria-label": `${dev} peak by category`,
    });
    const stack = (values, y, extra) => {
      const g = s("g", { class: `fv-bar-stack${extra}` });
      let acc = 0;
      values.forEach((v, c) => {
        if (!(v > 0)) return;
        const rect = s("rect", {
          class: `fv-bar-seg fv-cat-${c}`,
          x: x(acc),
          y,
          width: Math.max(0.5, x(acc + v) - x(acc)),
          height: BAR_H,
          "data-category": cats[c],
        });
        rect.appendChild(tip(`${cats[c]}: ${fmtBytes(v)}`));
        g.appendChild(rect);
        acc += v;
      });
      return g;
    };
    svg.appendChild(stack(byCat, 18, ""));
    if (share) {
      const g = stack(Array.from(share), 18 + BAR_H + 6, " fv-highlight fv-share");
      g.setAttribute("data-testid", "fv-bar-share");
      svg.appendChild(g);
    }
    const bottom = 18 + rows * (BAR_H + 6);
    const mark = (value, cls, label) => {
      if (value == null) return;
      const xv = x(value);
      svg.appendChild(s("line", { class: cls, x1: xv, x2: xv, y1: 12, y2: bottom }));
      const anchor = xv > W * 0.7 ? "end" : "start";
      svg.appendChild(
        s("text", { class: `${cls}-label`, x: anchor === "end" ? xv - 3 : xv + 3, y: 10, "text-anchor": anchor, text: label }),
      );
    };
    if (capacity) mark(capacity, "fv-capacity", `capacity ${summary.capacitySpec ?? ""} ${fmtBytes(capacity)}`);
    if (pk.reserved != null && pk.reserved !== pk.bytes) {
      svg.appendChild(s("line", { class: "fv-reserved", x1: x(pk.reserved), x2: x(pk.reserved), y1: 16, y2: bottom }, tip(`reserved peak ${fmtBytes(pk.reserved)} at op ${pk.reserved_seq}`)));
    }
    svg.appendChild(s("text", { class: "fv-axis", x: PAD_L, y: height - 3, text: "0" }));
    svg.appendChild(s("text", { class: "fv-axis", x: W - PAD_R, y: height - 3, "text-anchor": "end", text: fmtBytes(top) }));

    const legend = h(
      "ul",
      { class: "fv-legend" },
      byCat
        .map((v, c) => [v, c])
        .filter(([v]) => v > 0)
        .map(([v, c]) =>
          h(
            "li",
            {},
            h("span", { class: `fv-swatch fv-cat-${c}` }),
            `${cats[c]} ${fmtBytes(v)}`,
            share && share[c] > 0 ? h("span", { class: "fv-hint", text: ` (selected ${fmtBytes(share[c])})` }) : null,
          ),
        ),
    );
    const where = [pk.module || "top level", pk.user_line].filter(Boolean).join(" · ");
    return h(
      "div",
      { class: "fv-bar-device", "data-device": dev },
      h("div", {
        class: "fv-bar-title",
        text: `${dev}: peak ${fmtBytes(pk.bytes)} at op ${fmtInt(pk.seq)} (${pk.phase}, ${pk.op})`,
        title: where,
      }),
      pk.allocated != null
        ? h("div", {
            class: "fv-hint",
            text: `caching allocator: ${fmtBytes(pk.allocated)} allocated, ${fmtBytes(pk.reserved)} reserved at peak`,
          })
        : null,
      svg,
      share
        ? h("p", {
            class: "fv-share-text fv-highlight",
            text: `${sel.path} holds ${fmtBytes(shareTotal)} of this peak (${pk.bytes ? ((100 * shareTotal) / pk.bytes).toFixed(1) : "0"} %)`,
          })
        : null,
      deviceVerdict(dev),
      legend,
    );
  }

  function render() {
    const st = store.get();
    W = widthOf(body, W);
    const sel = ctx.derived.selection;
    setText(verdict, summary.verdict ? summary.verdict.text : summary.capacity ? "" : "no capacity given: pass capacity= for a verdict");
    verdict.className = `fv-verdict-all ${summary.verdict ? (summary.verdict.fits ? "fv-fits" : "fv-over") : "fv-hint"}`;
    const devs = Object.keys(summary.peaks).filter((d) => !st.device || d === st.device);
    const memOf = new Map(memory.devices.map((m) => [m.device, m]));
    body.replaceChildren(
      ...(devs.length
        ? devs.map((d) => deviceBlock(d, memOf.get(d), sel))
        : [h("p", { class: "fv-empty", text: st.device ? `no memory on ${st.device}` : "no memory was used" })]),
    );
  }

  const unwatch = watchWidth(body, (w) => {
    if (w !== W) render();
  });

  return {
    el,
    destroy: unwatch,
    update(changed) {
      if (!changed || changed.has("selected") || changed.has("device")) render();
    },
  };
}
