// The page "Check your own snapshot": the Web Worker that runs the allocator doctor in Pyodide.
//
// It starts Python only when the page sends the first file, from this site's own copy of
// Pyodide (book/_ext/doctor_page.py ships it), unpacks the doctor's zip, and answers:
//   in:  {type: "run", name, bytes (ArrayBuffer, transferred), request: {what_if, cap_bytes, suggest}}
//        {type: "details"}                        the report's text and the peak's segments
//   out: {type: "stage", text, step, steps}       progress while loading and running
//        {type: "ready", seconds, marks}          Python and the doctor are loaded (ms per step)
//        {type: "replay", answer}                 the recorded run replayed, before the what-ifs
//                                                 (doctor_worker.replay_answer)
//        {type: "early", answer}                  the replay and the what-ifs, before the grid
//                                                 (doctor_worker.early_answer)
//        {type: "details", answer}                after "early" too, before the grid
//        {type: "grid", answer}                   each setting of the grid as it finishes
//        {type: "result", answer}                 doctor_worker.run_json's answer
//        {type: "details", answer}                doctor_worker.details_json's answer
//        {type: "fatal", message}                 Pyodide could not start or died
// The file never leaves this worker: nothing here sends anything anywhere.

let config = null;
let starting = null;
let py = null;
let driver = null;

function stage(text, step, steps) {
  postMessage({ type: "stage", text, step, steps });
}

async function start() {
  const t0 = performance.now();
  const base = new URL(config.pyodide, config.base).href;
  stage("loading Python (Pyodide " + config.pyodideVersion + ")", 1, 3);
  const { loadPyodide } = await import(base + "pyodide.mjs");
  const marks = { module: performance.now() - t0, snapshot: false };
  const options = {
    indexURL: base,
    // The page loads no package; with these, Pyodide has no reason to ask its CDN for one.
    packageBaseUrl: base,
    lockFileURL: base + "pyodide-lock.json",
    stdout: () => {},
    stderr: () => {},
  };
  if (config.snapshot) {
    // Python already started, with the doctor imported (made at build time by doctor_snapshot.mjs).
    try {
      const snap = fetch(new URL(config.snapshot, config.base)).then(async (r) => {
        if (!r.ok) throw new Error("HTTP " + r.status);
        const head = new Uint8Array(await r.clone().arrayBuffer(), 0, 2);
        // gzip'd at build time (book/_ext/doctor_page.py), unless the host already undid it
        if (head[0] !== 0x1f || head[1] !== 0x8b) return r.arrayBuffer();
        return new Response(r.body.pipeThrough(new DecompressionStream("gzip"))).arrayBuffer();
      });
      py = await loadPyodide({ ...options, _loadSnapshot: snap });
      marks.snapshot = true;
    } catch (err) {
      marks.snapshotError = String((err && err.message) || err);
      py = null;
    }
  }
  if (!py) py = await loadPyodide(options);
  marks.python = performance.now() - t0;
  stage("loading the doctor", 2, 3);
  const zip = await fetch(new URL(config.zip, config.base)).then((r) => {
    if (!r.ok) throw new Error("the doctor's files: HTTP " + r.status);
    return r.arrayBuffer();
  });
  marks.zip = performance.now() - t0;
  // The files back the modules a snapshot already holds (tracebacks) and any it does not.
  py.unpackArchive(zip, "zip", { extractDir: "/home/pyodide/memlab" });
  py.runPython("import sys\nif '/home/pyodide/memlab' not in sys.path: sys.path.insert(0, '/home/pyodide/memlab')");
  stage("starting the doctor", 3, 3);
  driver = py.pyimport("doctor_worker");
  if (!marks.snapshot) driver.warm_up();
  py.FS.mkdirTree("/snapshots");
  marks.doctor = performance.now() - t0;
  // Milliseconds since the start at the end of each step (the page keeps them for the tests).
  postMessage({ type: "ready", seconds: (performance.now() - t0) / 1000, marks });
}

function safeName(name) {
  // The file keeps its own name, so the doctor's messages name it as the command line does.
  const base = String(name || "snapshot").split(/[\\/]/).pop().replace(/[\x00-\x1f]/g, "");
  return base && base !== "." && base !== ".." ? base : "snapshot";
}

async function runFile(msg) {
  const name = safeName(msg.name);
  for (const old of py.FS.readdir("/snapshots")) {
    if (old !== "." && old !== "..") py.FS.unlink("/snapshots/" + old);
  }
  py.FS.writeFile("/snapshots/" + name, new Uint8Array(msg.bytes));
  msg.bytes = null;
  py.runPython("import os; os.chdir('/snapshots')");
  let n = 0;
  const progress = (text) => stage(text, ++n, 0);
  // What is ready before the end goes to the page at once: it shows the first answer while the
  // grid runs (a worker busy in Python cannot be asked to stop; the page ends it instead).
  const partial = (kind, answer) => postMessage({ type: kind, answer });
  try {
    const answer = driver.run_json(name, JSON.stringify(msg.request), progress, partial);
    postMessage({ type: "result", answer });
  } finally {
    py.FS.unlink("/snapshots/" + name);  // the trace is in Python's memory now: free the copy
  }
}

onmessage = async (event) => {
  const msg = event.data;
  try {
    if (msg.type === "config") {
      config = msg.config;
      return;
    }
    if (!starting) starting = start();
    await starting;
    if (msg.type === "run") await runFile(msg);
    else if (msg.type === "details") postMessage({ type: "details", answer: driver.details_json() });
  } catch (err) {
    postMessage({ type: "fatal", message: String((err && err.message) || err) });
  }
};
