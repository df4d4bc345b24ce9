// The header: title, device and phase selectors, module search, tree sizing, the selection.
import { h, setText } from "../dom.js";
import { searchModules, searchTree } from "../filter.js";
import { SIZE_BY, fmtInt } from "../format.js";

export function controlsView(ctx) {
  const { data, store } = ctx;
  const { summary, tree, ops } = data;
  const option = (value, label) => h("option", { value, text: label });

  const device = h(
    "select",
    { class: "fv-device", "data-testid": "fv-device", "aria-label": "device" },
    option("", "all devices"),
    summary.devices.map((d) => option(d, d)),
  );
  device.addEventListener("change", () => store.set({ device: device.value }));

  const phase = h(
    "select",
    { class: "fv-phase", "data-testid": "fv-phase", "aria-label": "phase" },
    option("", "all phases"),
    summary.phases.map((p) => option(p, p)),
  );
  phase.addEventListener("change", () => store.set({ phase: phase.value }));

  const sizeBy = h(
    "select",
    { class: "fv-size-by", "data-testid": "fv-size-by", "aria-label": "size the tree by" },
    Object.entries(SIZE_BY).map(([k, v]) => option(k, v.label)),
  );
  sizeBy.addEventListener("change", () => store.set({ sizeBy: sizeBy.value }));

  const search = h("input", {
    class: "fv-search",
    "data-testid": "fv-search",
    type: "search",
    placeholder: "search module paths",
    "aria-label": "search module paths",
    autocomplete: "off",
  });
  const results = h("ul", { class: "fv-search-results", "data-testid": "fv-search-results", hidden: true });
  search.addEventListener("input", () => store.set({ search: search.value }));
  search.addEventListener("keydown", (ev) => {
    if (ev.key === "Escape") {
      results.hidden = true;
    } else if (ev.key === "Enter") {
      const first = results.querySelector("button");
      if (first) first.click();
    }
  });
  search.addEventListener("focus", () => {
    results.hidden = !results.childElementCount;
  });

  const label = h("span", { class: "fv-selection-label", "data-testid": "fv-selection-label" });
  const clear = h("button", { class: "fv-clear", type: "button", text: "clear", title: "clear the selection" });
  clear.addEventListener("click", () => store.set({ selected: "" }));

  const title = h(
    "div",
    { class: "fv-title" },
    h("b", { text: "fakeviz explorer" }),
    h("span", {
      class: "fv-subtitle",
      text: ` ${fmtInt(summary.nOps)} ops · ${summary.devices.join(", ") || "no devices"}`,
    }),
  );
  const el = h(
    "header",
    { class: "fv-header", "data-testid": "fv-header" },
    title,
    h("div", { class: "fv-controls" }, device, phase, h("div", { class: "fv-search-box" }, search, results), sizeBy),
    h("div", { class: "fv-selection" }, label, clear),
    summary.error
      ? h("p", {
          class: "fv-error",
          text: `The run stopped with ${summary.error.type}${summary.error.op ? ` in ${summary.error.op}` : ""}: ${summary.error.message ?? ""}`,
        })
      : null,
  );

  function renderResults(text) {
    const rows = searchTree(tree, text, 8);
    const shown = new Set(rows.map((r) => tree.path[r]));
    const mods = searchModules(ops.strings.modules, text, 12, shown);
    const item = (path, note) => {
      const b = h("button", { type: "button", class: "fv-search-hit", "data-path": path, title: path }, path);
      if (note) b.appendChild(h("span", { class: "fv-hint", text: ` ${note}` }));
      b.addEventListener("click", () => {
        ctx.select(path);
        results.hidden = true;
      });
      return h("li", {}, b);
    };
    results.replaceChildren(
      ...rows.map((r) => item(tree.path[r], tree.count[r] > 1 ? `x${tree.count[r]}` : "")),
      ...mods.map((m) => item(ops.strings.modules[m], "")),
    );
    results.hidden = !results.childElementCount || document.activeElement !== search;
  }

  return {
    el,
    update(changed) {
      const st = store.get();
      const all = !changed;
      if (all || changed.has("device")) device.value = st.device;
      if (all || changed.has("phase")) phase.value = st.phase;
      if (all || changed.has("sizeBy")) sizeBy.value = st.sizeBy;
      if (all || changed.has("search")) {
        if (search.value !== st.search) search.value = st.search;
        renderResults(st.search);
      }
      if (all || changed.has("selected")) {
        const sel = ctx.derived.selection;
        setText(label, !st.selected
          ? "no module selected"
          : sel.kind === "none"
            ? `${st.selected} (not in this trace)`
            : st.selected, st.selected);
        clear.disabled = !st.selected;
      }
    },
  };
}
