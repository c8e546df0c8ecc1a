// Builds the one front-end bundle both hosts load: src/index.js with its dependencies (dagre) and
// its CSS inlined, as one ES module, into the Python package (neurarch_trace/static/).
//   node build.mjs           write the bundle
//   node build.mjs --check   build in memory and fail when the committed bundle differs
import { build } from "esbuild";
import { readFileSync, writeFileSync, mkdirSync } from "node:fs";
import { dirname, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const outfile = resolve(here, "../neurarch_trace/static/neurarch-widget.js");
const check = process.argv.includes("--check");

const result = await build({
  entryPoints: [resolve(here, "src/index.js")],
  bundle: true,
  format: "esm",
  target: ["es2020"],
  minify: true,
  legalComments: "eof",
  loader: { ".css": "text" },
  write: false,
  logLevel: "warning",
});
const text = result.outputFiles[0].text;
if (check) {
  let committed = "";
  try {
    committed = readFileSync(outfile, "utf8");
  } catch (_err) {
    committed = "";
  }
  if (committed !== text) {
    console.error(`${outfile} is not the build of extension/src: run "npm run build" in extension/ and commit it`);
    process.exit(1);
  }
  console.log(`${outfile} matches the build of extension/src (${text.length} bytes)`);
} else {
  mkdirSync(dirname(outfile), { recursive: true });
  writeFileSync(outfile, text);
  console.log(`wrote ${outfile} (${text.length} bytes)`);
}
