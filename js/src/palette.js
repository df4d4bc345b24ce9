// The panel's data colours come from Python: summary.palette is fakeviz._core.palette.palette() (see
// fakeviz/_views/payload.py). They are set as CSS custom properties on the panel's root, which
// explorer.css reads (.fv-cat-<i>, .fv-phase-<name>, .fv-edge-<kind>); no colour is defined on this side.

/** The custom properties for `palette`: categories by index, phases by name (the summary's `phases`), edges by kind. */
export function paletteProperties(palette, phases = []) {
  const props = {};
  if (!palette) return props;
  (palette.categories || []).forEach((color, i) => {
    props[`--fv-cat-${i}`] = color;
  });
  phases.forEach((name, i) => {
    const color = palette.phases?.[i];
    if (color) props[`--fv-phase-${name}`] = color;
  });
  for (const [kind, color] of Object.entries(palette.edges || {})) props[`--fv-edge-${kind}`] = color;
  return props;
}

/** Set the palette's custom properties on `el` (the panel's root). */
export function applyPalette(el, palette, phases) {
  for (const [name, value] of Object.entries(paletteProperties(palette, phases))) el.style.setProperty(name, value);
}

/** The colour of tree key `key` (an index into the device or dtype key table `by`), or null. */
export function treeKeyColor(palette, by, key) {
  return palette?.tree?.[by]?.[key] ?? null;
}
