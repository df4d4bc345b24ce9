// anywidget entry point of the fakeviz explorer panel (fakeviz._views.explorer.Explorer).
import { mountExplorer } from "./app.js";
import { h } from "./dom.js";

// a new alias graph (redrawn by the kernel around a selection) is handled by the panel itself
const DATA_TRAITS = ["summary", "tree", "memory", "ops"];

/**
 * Hide the static summary written beside this panel while the panel lives (Note: [static fallback] in
 * fakeviz/_views/explorer.py): the output that holds `[data-fv-static=<id>]`, or the element itself.
 */
export function hideStatic(id, doc = globalThis.document) {
  if (!id || !doc) return 0;
  let n = 0;
  for (const node of doc.querySelectorAll("[data-fv-static]")) {
    if (node.getAttribute("data-fv-static") !== id) continue;
    const box = node.closest(".jp-OutputArea-child") || node;
    box.style.display = "none";
    n += 1;
  }
  return n;
}

function render({ model, el }) {
  hideStatic(model.get("static_id"));
  const root = h("div", { class: "fv-root", "data-testid": "fv-explorer" });
  el.appendChild(root);
  let app = null;
  const mount = () => {
    app?.destroy();
    try {
      app = mountExplorer(root, model);
    } catch (err) {
      app = null;
      root.replaceChildren(h("p", { class: "fv-error", text: `fakeviz explorer could not render: ${err?.message ?? err}` }));
      console.error(err);
    }
  };
  mount();
  // new data (the kernel rebuilt the state): mount again once per message, keeping the selection
  let pending = false;
  let alive = true;
  const remount = () => {
    if (pending) return;
    pending = true;
    queueMicrotask(() => {
      pending = false;
      if (alive) mount();
    });
  };
  for (const k of DATA_TRAITS) model.on(`change:${k}`, remount);
  return () => {
    alive = false;
    for (const k of DATA_TRAITS) model.off(`change:${k}`, remount);
    app?.destroy();
    root.remove();
  };
}

export default { render };
