// anywidget entry point of the fakeviz explorer panel (fakeviz._views.explorer.Explorer).
import { mountExplorer } from "./app.js";
import { h } from "./dom.js";

// a new alias graph (redrawn by the kernel around a selection) is handled by the panel itself
const DATA_TRAITS = ["summary", "tree", "memory", "ops"];

function render({ model, el }) {
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
