// Bundle the explorer panel into ../fakeviz/static/ (ESM, minified, one file each for JS and CSS).
//   node build.mjs            build once (what `npm run build` and the wheel build run)
//   node build.mjs --watch    rebuild on change (with ANYWIDGET_HMR=1 a running widget reloads)
import * as esbuild from "esbuild";
import { statSync } from "node:fs";
import { dirname, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const outdir = resolve(here, "../fakeviz/static");
const watch = process.argv.includes("--watch");

const common = { bundle: true, minify: true, legalComments: "none", logLevel: "info", target: "es2020" };
const builds = [
  { ...common, entryPoints: [resolve(here, "src/explorer.js")], outfile: resolve(outdir, "explorer.js"), format: "esm" },
  { ...common, entryPoints: [resolve(here, "src/explorer.css")], outfile: resolve(outdir, "explorer.css") },
];

if (watch) {
  for (const opts of builds) await (await esbuild.context(opts)).watch();
} else {
  await Promise.all(builds.map((opts) => esbuild.build(opts)));
  for (const name of ["explorer.js", "explorer.css"]) {
    console.log(`${name}: ${statSync(resolve(outdir, name)).size} bytes`);
  }
}
