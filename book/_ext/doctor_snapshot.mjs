// Build step of the page "Check your own snapshot" (book/_ext/doctor_page.py runs it with Node):
// start Pyodide with the doctor's zip, import everything a run needs, and write Pyodide's memory
// snapshot. The page's worker restores it instead of starting Python from nothing, which on a
// 2-core machine cuts the start from several seconds to under one.
//
//   node doctor_snapshot.mjs PYODIDE_DIR DOCTOR_ZIP OUT
//
// Pyodide 314.0.7's _makeSnapshot / _loadSnapshot (pyodide.d.ts); the worker falls back to a
// plain start if the snapshot cannot be restored.
import fs from "node:fs";
import path from "node:path";
import { pathToFileURL } from "node:url";

const [dir, zipPath, out] = process.argv.slice(2);
if (!out) {
  console.error("usage: node doctor_snapshot.mjs PYODIDE_DIR DOCTOR_ZIP OUT");
  process.exit(2);
}
const { loadPyodide } = await import(pathToFileURL(path.join(dir, "pyodide.mjs")).href);
const lock = JSON.parse(fs.readFileSync(path.join(dir, "pyodide-lock.json"), "utf8"));
const py = await loadPyodide({
  indexURL: dir + path.sep,
  lockFileContents: { info: lock.info, packages: {} },
  _makeSnapshot: true,
  stdout: () => {},
  stderr: (line) => console.error(line),
});
py.unpackArchive(new Uint8Array(fs.readFileSync(zipPath)), "zip", { extractDir: "/home/pyodide/memlab" });
// Only Python state goes into the snapshot: no JavaScript object may be held by Python here.
py.runPython("import sys\nsys.path.insert(0, '/home/pyodide/memlab')\nimport doctor_worker\ndoctor_worker.warm_up()");
const snapshot = py.makeMemorySnapshot();
fs.writeFileSync(out + ".tmp", snapshot);
fs.renameSync(out + ".tmp", out);
