// The explorer panel: reads the traits, keeps the selection state, links the views.
// All linking happens here, in the browser; only the selection traits go back to the kernel.
import { readAlias, readData, readTime } from "./data.js";
import { unpack } from "./decode.js";
import { h } from "./dom.js";
import { resolveSelection, textMask } from "./filter.js";
import { applyPalette } from "./palette.js";
import { createStore } from "./store.js";
import { aliasView } from "./views/alias.js";
import { barsView } from "./views/bars.js";
import { controlsView } from "./views/controls.js";
import { opsView } from "./views/ops.js";
import { timelineView } from "./views/timeline.js";
import { treeView } from "./views/tree.js";

/** Store keys synced with the widget's traits, both ways. */
export const SYNCED = {
  selected: "selected_module",
  device: "device",
  phase: "phase",
  search: "search",
  sizeBy: "size_by",
  xAxis: "x_axis",
};

/** Mount the panel into `root`; returns {store, destroy}. */
export function mountExplorer(root, model) {
  const data = readData((k) => model.get(k));
  applyPalette(root, data.summary.palette, data.summary.phases);
  const initial = { zoom: -1, cursor: -1, opText: "", colorBy: "" };
  for (const [key, trait] of Object.entries(SYNCED)) initial[key] = model.get(trait) ?? "";
  if (!initial.sizeBy) initial.sizeBy = "param_bytes";
  if (!initial.xAxis) initial.xAxis = "op";
  const store = createStore(initial);
  const derived = {};
  const derive = (st, changed) => {
    if (!changed || changed.has("selected")) derived.selection = resolveSelection(st.selected, data.tree, data.ops);
    if (!changed || changed.has("search")) derived.searchMask = textMask(data.ops.strings.modules, st.search);
  };
  derive(store.get(), null);

  const ctx = {
    data,
    store,
    derived,
    select: (path) => store.set({ selected: path || "" }),
    phaseCode: (name) => data.summary.phases.indexOf(name),
    deviceCode: (name) => data.ops.strings.devices.indexOf(name),
  };
  const views = [controlsView, treeView, barsView, timelineView, opsView, aliasView].map((make) => make(ctx));
  const grid = h(
    "div",
    { class: "fv-grid" },
    views.slice(1).map((v) => v.el),
  );
  root.replaceChildren(views[0].el, grid);

  const unsubscribe = store.subscribe((st, changed) => {
    derive(st, changed);
    let dirty = false;
    for (const key of changed) {
      const trait = SYNCED[key];
      if (trait && model.get(trait) !== st[key]) {
        model.set(trait, st[key]);
        dirty = true;
      }
    }
    if (dirty) model.save_changes();
    for (const v of views) v.update(changed);
  });

  // the kernel (or another view of the same model) moved a selection trait
  const listeners = Object.entries(SYNCED).map(([key, trait]) => {
    const fn = () => store.set({ [key]: model.get(trait) ?? "" });
    model.on(`change:${trait}`, fn);
    return [trait, fn];
  });

  // the kernel redrew the alias-graph neighbourhood (around the selected module)
  const onAlias = () => {
    data.alias = readAlias(unpack(model.get("alias")));
    for (const v of views) v.update(new Set(["alias"]));
  };
  model.on("change:alias", onAlias);
  // the kernel estimated the times on another GPU (the gpu trait)
  const onTime = () => {
    data.time = readTime(unpack(model.get("time")));
    for (const v of views) v.update(new Set(["time"]));
  };
  model.on("change:time", onTime);

  for (const v of views) v.update(null);
  return {
    store,
    destroy() {
      unsubscribe();
      for (const [trait, fn] of listeners) model.off(`change:${trait}`, fn);
      model.off("change:alias", onAlias);
      model.off("change:time", onTime);
      for (const v of views) v.destroy?.();
      root.replaceChildren();
    },
  };
}
