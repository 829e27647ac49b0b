/* The page "Check your own snapshot": the allocator doctor in the reader's browser.
 *
 * The reader drops or picks a memory snapshot; this script hands it to a Web Worker
 * (doctor-worker.mjs) that runs the project's doctor in Pyodide, both shipped with the site
 * and fetched only at the first file. It shows the progress, the settings side by side, the
 * figure (SVG drawn here), the report as the command line prints it, the segments at the
 * peak, and a download of the command line's --json object. The file is read in this tab
 * and sent nowhere. Config: window.memlabDoctor (book/_ext/doctor_page.py).
 *
 * A what-if the snapshot cannot settle shows its range in every table and in the
 * figure's legend, as the command line's report does ("X to Y"); the doctor's messages are
 * put in this page's words (its controls, not the command line's flags); the download size
 * shown is the one the site ships; setting names break only after ':', ',', '_' or '=';
 * the figure's axis and legend use one unit; without the network, the page says that it
 * needs it, instead of blaming the tab's memory.
 *
 * The first answer comes before the grid: the worker sends the replay and the what-ifs as soon
 * as the doctor has them ("early"), then the report's text and the segments, then each setting
 * of the grid as it finishes ("grid": a table that fills in), then the whole answer ("result",
 * the command line's JSON byte for byte), which replaces the suggestion and the OOM
 * explanation. Stop while the grid runs ends the worker and keeps what is shown (a worker busy
 * in Python cannot be asked to stop half-way without cross-origin isolation, which a static
 * host cannot promise).
 */
(function () {
  "use strict";

  const cfg = window.memlabDoctor;
  const root = document.getElementById("memlab-doctor");
  if (!cfg || !root || !document.currentScript) return;
  const staticBase = new URL(".", document.currentScript.src).href;

  const PALETTE = ["#3b6ea8", "#d9822b", "#3f9a5b", "#b5403a", "#7b5ea7", "#8c6d46", "#c2549d", "#6b6b6b"];
  const STATE_COLORS = { active_allocated: "#3b6ea8", active_pending_free: "#d9822b", inactive: "#d8dde3" };
  const STATE_LABELS = { active_allocated: "allocated", active_pending_free: "freed, pending on a stream", inactive: "free (cached)" };
  const PRESETS = [
    ["expandable_segments:True", "one growing segment per stream and pool instead of many fixed ones", true],
    ["max_split_size_mb:128", "blocks above 128 MiB are never split", false],
    ["garbage_collection_threshold:0.8", "free cached blocks when a cap is 80 % used (needs a cap)", false],
    ["roundup_power2_divisions:4", "round requests to quarter powers of two", false],
    ["", "defaults (no PYTORCH_CUDA_ALLOC_CONF)", false],
  ];
  const SVG = "http://www.w3.org/2000/svg";
  const KiB = 1024, MiB = KiB * 1024, GiB = MiB * 1024;

  // ------------------------------------------------------------------ small helpers

  function el(tag, attrs, children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "text") e.textContent = v;
      else if (k === "class") e.className = v;
      else if (v !== false && v !== null && v !== undefined) e.setAttribute(k, v === true ? "" : v);
    }
    for (const c of children || []) if (c) e.append(c);
    return e;
  }

  function svg(tag, attrs, text) {
    const e = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
    if (text !== undefined) e.textContent = text;
    return e;
  }

  function sig(x, digits) {
    // Python's f"{x:.{digits}g}" for the sizes we write (no exponent below 10**digits).
    let s = x.toPrecision(digits);
    if (s.includes("e")) s = String(Number(s));
    if (s.includes(".")) s = s.replace(/0+$/, "").replace(/\.$/, "");
    return s;
  }

  // experiments.core.units.format_bytes: sizes within 4 KiB of a whole MiB or GiB are exact.
  function formatBytes(n, digits) {
    digits = digits || 4;
    n = Math.trunc(n);
    if (n < 0) return "\u2212" + formatBytes(-n, digits);
    for (const [unit, scale] of [["GiB", GiB], ["MiB", MiB]]) {
      const whole = Math.round(n / scale);
      const diff = n - whole * scale;
      if (whole >= 1 && Math.abs(diff) < 4096) {
        if (diff === 0) return whole + " " + unit;
        return whole + " " + unit + " " + (diff > 0 ? "+" : "\u2212") + " " + Math.abs(diff) + " B";
      }
      if (n >= scale) {
        const v = n / scale;
        return (v < Math.pow(10, digits) ? sig(v, digits) : v.toFixed(0)) + " " + unit;
      }
    }
    if (n >= KiB) return (n % KiB === 0 ? n / KiB : sig(n / KiB, digits)) + " KiB";
    return n + " B";
  }

  function megabytes(n) {
    if (n < 1e6) return Math.max(1, Math.round(n / 1e3)) + " kB";
    return (n / 1e6).toFixed(n < 1e7 ? 1 : 0) + " MB";
  }

  function shellQuote(a) {
    return /^[A-Za-z0-9_.,:=\/+-]+$/.test(a) ? a : "'" + a.replace(/'/g, "'\\''") + "'";
  }

  function niceStep(span, count) {
    const raw = span / Math.max(1, count);
    const p = Math.pow(10, Math.floor(Math.log10(raw)));
    for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= raw) return m * p;
    return 10 * p;
  }

  // ------------------------------------------------------------------ the controls

  const fileInput = el("input", { type: "file", id: "memlab-doctor-file", accept: ".pickle,.pkl,.gz,.json,.pt,application/json,application/gzip,application/octet-stream" });
  const drop = el("div", { class: "memlab-doctor-drop", tabindex: "0", role: "button",
                            "aria-describedby": "memlab-doctor-drop-note" }, [
    el("p", { class: "memlab-doctor-drop-title", text: "Drop a memory snapshot here" }),
    el("p", {}, [document.createTextNode("or "),
      el("label", { for: "memlab-doctor-file", class: "memlab-doctor-pick", text: "choose a file" }), fileInput]),
    el("p", { id: "memlab-doctor-drop-note", class: "memlab-doctor-note",
              text: "A pickle from torch.cuda.memory._dump_snapshot (gzip'd or not) or a JSON snapshot, up to " +
                    megabytes(cfg.limitBytes) + ". It is read in this tab and sent nowhere." }),
  ]);

  const checks = PRESETS.map(([setting, note, on], i) => {
    const box = el("input", { type: "checkbox", id: "memlab-doctor-wi-" + i, value: setting, checked: on });
    return el("div", { class: "memlab-doctor-check" }, [box,
      el("label", { for: box.id }, [breakable(setting || "defaults"), document.createTextNode(" \u2014 " + note)])]);
  });
  const other = el("textarea", { id: "memlab-doctor-other", rows: "2", spellcheck: "false",
                                 placeholder: "expandable_segments:True,max_split_size_mb:256" });
  const cap = el("input", { type: "number", id: "memlab-doctor-cap", min: "0", step: "any", inputmode: "decimal",
                            placeholder: "none" });
  const total = el("input", { type: "number", id: "memlab-doctor-total", min: "0", step: "any", inputmode: "decimal",
                              placeholder: "auto", "aria-describedby": "memlab-doctor-total-note" });
  const suggest = el("input", { type: "checkbox", id: "memlab-doctor-suggest", checked: true });
  const runButton = el("button", { type: "button", class: "memlab-doctor-run", disabled: true, text: "Run again" });
  const stopButton = el("button", { type: "button", class: "memlab-doctor-stop", hidden: true, text: "Stop" });

  const settings = el("fieldset", { class: "memlab-doctor-settings" }, [
    el("legend", { text: "What if the run had used these allocator settings?" }),
    ...checks,
    el("div", { class: "memlab-doctor-field" }, [
      el("label", { for: other.id, text: "Other settings, one per line (PYTORCH_CUDA_ALLOC_CONF syntax):" }), other]),
    el("div", { class: "memlab-doctor-field memlab-doctor-inline" }, [
      el("label", { for: cap.id, text: "Memory cap for the what-ifs, GiB (empty: the snapshot's own, if any):" }), cap]),
    el("div", { class: "memlab-doctor-field memlab-doctor-inline" }, [
      el("label", { for: total.id, text: "The GPU's memory, GiB (empty: the snapshot's if it records it, else the lab " +
                                         "H200's 139.8):" }),
      total,
      el("p", { class: "memlab-doctor-note", id: "memlab-doctor-total-note" }, [document.createTextNode("On that GPU: "),
        dotted("torch.cuda.get_device_properties(0).total_memory / 2**30")])]),
    cfg.options && cfg.options.suggest ? el("div", { class: "memlab-doctor-check" }, [suggest,
      el("label", { for: suggest.id, text: "Also rank a grid of settings and suggest one" })]) : null,
    el("div", { class: "memlab-doctor-buttons" }, [runButton, stopButton]),
  ]);

  const bar = el("progress", { max: "1", "aria-label": "progress" });
  const statusText = el("span", { class: "memlab-doctor-status-text" });
  const status = el("div", { class: "memlab-doctor-status", role: "status", "aria-live": "polite", hidden: true },
                    [bar, statusText]);
  const errorBox = el("p", { class: "memlab-doctor-error", role: "alert", hidden: true });
  const results = el("div", { class: "memlab-doctor-results", hidden: true });

  root.replaceChildren(drop, settings, status, errorBox, results);

  // ------------------------------------------------------------------ the worker

  let worker = null;
  let file = null;
  let busy = false;
  let timer = null;
  let started = 0;
  let stageText = "";
  let readyPending = true;
  let phase = null;        // "early": the first answer is shown and the grid runs; "final"; null
  let gridWhy = null;      // why a grid follows the first answer: "suggest", "oom" or null
  let gridRows = [];       // the grid's settings as they finish (before the ranking)

  function newWorker() {
    const w = new Worker(staticBase + cfg.worker, { type: "module" });
    w.postMessage({ type: "config", config: { ...cfg, base: staticBase } });
    w.onmessage = (e) => onWorkerMessage(e.data);
    w.onerror = (e) => {
      e.preventDefault();
      const loaded = !readyPending;
      reachable().then((online) => {
        if (!online) return fail(offlineLine(loaded));
        fail("error: the page's Python stopped (" + (e.message || "the tab may have run out of memory") +
             "); for a snapshot this large, run the doctor on your machine: pip install cuda-memory-lab, then " +
             "python -m experiments doctor FILE");
      });
    };
    readyPending = true;
    return w;
  }

  // Whether this site answers: the worker's own script, asked again (a worker that cannot load
  // its files reports no reason).
  function reachable() {
    if (navigator.onLine === false) return Promise.resolve(false);
    return fetch(staticBase + cfg.worker, { method: "HEAD", cache: "no-store" }).then((r) => r.ok, () => false);
  }

  function downloadSize() {
    return cfg.downloadBytes ? "about " + Math.round(cfg.downloadBytes / 1e6) + " MB" : "its files";
  }

  function offlineLine(loaded) {
    return "error: the page could not download the doctor (Python and its code, " + downloadSize() +
      " from this site): the network seems to be off. " + (loaded
        ? "Python was loaded once in this tab but had to be started again (after Stop or an error); "
        : "") + "Run again once you are online; after a first run the doctor stays loaded in this tab until you " +
      "leave or stop it. Without a network, use the command line: pip install cuda-memory-lab, then " +
      "python -m experiments doctor FILE";
  }

  // The doctor speaks command line: its flags become this page's controls.
  const CLI = "run the doctor on your machine (pip install cuda-memory-lab, then python -m experiments doctor FILE " +
              "--max-bytes N)";
  const PAGE_WORDS = [
    [/pass --cap BYTES or --cap-fraction F/g, "give the memory cap above (GiB)"],
    [/pass --cap( BYTES)?\b/g, "give the memory cap above (GiB)"],
    [/--cap must be a number of bytes >= 0, got \S+/g, "the memory cap must be 0 GiB or more"],
    [/if it is a real snapshot, raise (it|the limit) \(--max-bytes\)/g, "this page cannot raise that limit: " + CLI],
    [/if the snapshot is real, raise it: --read-budget BYTES \(Limits\(budget_bytes=\.\.\.\) from Python\)/g,
     "this page cannot raise that limit: " + CLI.replace("--max-bytes N", "--read-budget BYTES")],
    [/if the snapshot is real, raise the limit: --max-events N \(Limits\(max_events=\.\.\.\) from Python\)/g,
     "this page cannot raise that limit: " + CLI.replace("--max-bytes N", "--max-events N")],
    [/ \(--max-events N\)/g, "; this page cannot raise that limit: " + CLI.replace("--max-bytes N", "--max-events N")],
    [/give --total-memory BYTES \(torch\.cuda\.get_device_properties\(0\)\.total_memory\)/g,
     "give the GPU's memory above (GiB)"],
    [/--total-memory must be a whole number of bytes in \(0, \w+\), got \S+/g, "the GPU's memory must be more than 0 GiB"],
  ];

  function pageWords(line) {
    let out = String(line);
    for (const [from, to] of PAGE_WORDS) out = out.replace(from, to);
    return out.replace(/^error: python -m experiments doctor: /, "error: ");
  }

  function setStage(text, fraction) {
    stageText = text;
    if (fraction === null) bar.removeAttribute("value");
    else bar.value = fraction;
    tick();
  }

  function tick() {
    const s = ((performance.now() - started) / 1000).toFixed(1);
    statusText.textContent = stageText + " \u2026 " + s + " s";
  }

  function setBusy(on) {
    busy = on;
    status.hidden = !on;
    stopButton.hidden = !on;
    if (!on) stopButton.textContent = "Stop";
    runButton.disabled = on || !file;
    root.classList.toggle("memlab-doctor-busy", on);
    clearInterval(timer);
    if (on) timer = setInterval(tick, 200);
  }

  function fail(line) {
    setBusy(false);
    errorBox.textContent = pageWords(line);
    errorBox.hidden = false;
    if (worker) worker.terminate();
    worker = null;
  }

  function request() {
    const whatIf = checks.map((c) => c.querySelector("input")).filter((b) => b.checked).map((b) => b.value);
    for (const line of other.value.split("\n")) if (line.trim()) whatIf.push(line.trim());
    const req = { what_if: whatIf };
    if (cap.value.trim() !== "") {
      const g = Number(cap.value);
      // Bytes, as the command line's --cap takes them.
      req.cap_bytes = Math.round(g * GiB);
    }
    if (total.value.trim() !== "") req.total_memory = Math.round(Number(total.value) * GiB);
    if (cfg.options && cfg.options.suggest && suggest.checked) req.suggest = true;
    return req;
  }

  async function run() {
    if (!file || busy) return;
    errorBox.hidden = true;
    const capText = cap.value.trim();
    if (capText !== "" && !(Number.isFinite(Number(capText)) && Number(capText) >= 0)) {
      errorBox.textContent = "error: the memory cap must be a number of GiB, 0 or more (or empty: the snapshot's own), got " +
        JSON.stringify(cap.value);
      errorBox.hidden = false;
      return;
    }
    const totalText = total.value.trim();
    if (totalText !== "" && !(Number.isFinite(Number(totalText)) && Number(totalText) > 0 && Number(totalText) < 65536)) {
      errorBox.textContent = "error: the GPU's memory must be a number of GiB above 0 and under 65,536 (or empty: the " +
        "snapshot's, else the lab H200's), got " + JSON.stringify(total.value);
      errorBox.hidden = false;
      return;
    }
    if (file.size > cfg.limitBytes) {
      errorBox.textContent = "error: " + file.name + " is " + megabytes(file.size) + "; this page takes snapshots up to " +
        megabytes(cfg.limitBytes) + ". Run the doctor on your machine instead: pip install cuda-memory-lab, then " +
        "python -m experiments doctor " + shellQuote(file.name) + " --what-if expandable_segments:True";
      errorBox.hidden = false;
      return;
    }
    started = performance.now();
    // what a test or a reader's tool reads of the last run: nothing of the one before stays
    for (const k of ["state", "replaySeconds", "firstResultSeconds", "resultSeconds", "doneSeconds", "gridRows"]) {
      delete root.dataset[k];
    }
    phase = null;
    gridWhy = null;
    gridRows = [];
    setBusy(true);
    setStage(readyPending ? "loading Python (the first time " + downloadSize() + " from this site)" : "reading the file", null);
    results.hidden = true;
    let bytes;
    try {
      bytes = await file.arrayBuffer();
    } catch (err) {
      fail("error: cannot read " + file.name + ": " + err);
      return;
    }
    if (!worker) worker = newWorker();
    worker.postMessage({ type: "run", name: file.name, bytes, request: request() }, [bytes]);
  }

  function onWorkerMessage(msg) {
    if (msg.type === "stage") {
      setStage(msg.text, msg.steps ? msg.step / (msg.steps + 1) : null);
    } else if (msg.type === "ready") {
      readyPending = false;
      root.dataset.pyodideSeconds = msg.seconds.toFixed(2);
      root.dataset.pyodideMarks = JSON.stringify(msg.marks);
    } else if (msg.type === "fatal") {
      const loaded = !readyPending;
      reachable().then((online) => fail(online ? "error: the page could not run the doctor: " + msg.message
                                                : offlineLine(loaded)));
    } else if (msg.type === "replay") {
      // the recorded run replayed: its row and its line at once, the what-ifs follow
      root.dataset.replaySeconds = seconds();
      showReplay(JSON.parse(msg.answer));
      root.dataset.state = "replay";
    } else if (msg.type === "early") {
      // the replay and the what-ifs: shown at once, the grid (if any) runs on
      const answer = JSON.parse(msg.answer);
      phase = "early";
      gridWhy = answer.grid || null;
      root.dataset.firstResultSeconds = seconds();
      root.dataset.seconds = JSON.stringify(answer.seconds);
      showResult(answer);
      if (gridWhy) {
        root.dataset.state = "grid";
        stopButton.textContent = "Stop the ranking";
      }
    } else if (msg.type === "grid") {
      const g = JSON.parse(msg.answer);
      gridRows.push(g);
      showGridSoFar(g.count);
      root.dataset.gridRows = String(gridRows.length);
    } else if (msg.type === "result") {
      const answer = JSON.parse(msg.answer);
      if (!answer.ok) {
        if (answer.bug) showBug(answer.bug);
        else fail(answer.error);
        if (answer.bug) setBusy(false);
        return;
      }
      if (!root.dataset.firstResultSeconds) root.dataset.firstResultSeconds = seconds();
      root.dataset.resultSeconds = seconds();
      root.dataset.seconds = JSON.stringify(answer.seconds);
      if (phase === "early") completeResult(answer);
      else showResult(answer);
      phase = "final";
      setStage("writing the report", null);
      worker.postMessage({ type: "details" });
    } else if (msg.type === "details") {
      const d = JSON.parse(msg.answer);
      if (!d.ok) return showBug(d.bug);
      showDetails(d);
      if (phase === "early") return;   // the first answer's report and segments; the grid runs on
      setBusy(false);
      root.dataset.doneSeconds = seconds();
      root.dataset.state = "done";
    }
  }

  function seconds() {
    return ((performance.now() - started) / 1000).toFixed(2);
  }

  function showBug(trace) {
    setBusy(false);
    errorBox.replaceChildren(
      document.createTextNode("The doctor hit a bug of its own (not a problem with your file). Please report it with this: "),
      el("details", {}, [el("summary", { text: "the Python traceback" }), el("pre", { text: trace })]));
    errorBox.hidden = false;
  }

  // ------------------------------------------------------------------ the result

  function runsOf(json) {
    return [{ label: "recorded: " + (json.settings || "defaults"), recorded: true, ...json.replay }]
      .concat((json.what_if || []).map((w) => ({ label: w.settings || "defaults", recorded: false, ...w })));
  }

  // A what-if's figure as the reader should take it (experiments.doctor.report._between): one
  // number when exact, else the range of the runs the snapshot cannot tell apart.
  function range(x, name) {
    const rng = x[name === "oom_events" ? "oom_events_range" : name.replace(/_bytes$/, "_range_bytes")];
    return x.exact === false && rng && rng[0] !== rng[1] ? rng : null;
  }

  function between(x, name) {
    const rng = range(x, name);
    const fmt = name === "oom_events" ? String : (b) => formatBytes(b);
    return rng ? fmt(rng[0]) + " to " + fmt(rng[1]) : fmt(x[name]);
  }

  function signedBytes(b) {
    return (b > 0 ? "+" : b < 0 ? "\u2212" : "") + formatBytes(Math.abs(b));
  }

  function savedText(r) {
    // the change of peak reserved against the recorded run: + costs memory, - saves it
    const rng = r.exact === false && r.saved_range_bytes && r.saved_range_bytes[0] !== r.saved_range_bytes[1]
      ? r.saved_range_bytes : null;
    return rng ? signedBytes(-rng[1]) + " to " + signedBytes(-rng[0]) : signedBytes(-r.saved_bytes);
  }

  function numCell(text, ranged) {
    return el("td", { class: "memlab-num" + (ranged ? " memlab-doctor-range" : ""), text: text });
  }

  // Why the ranged what-ifs are ranges: one line per reason and bound (the report's wording).
  function uncertainNote(rows, nameOf) {
    const off = new Map();
    for (const x of rows) {
      if (x.exact !== false) continue;
      const key = (x.uncertain || ["?"]).join(", ") + "|" + (x.bound_bytes || 0);
      if (!off.has(key)) off.set(key, []);
      off.get(key).push(nameOf(x));
    }
    if (!off.size) return null;
    const lines = [...off.entries()].map(([key, names]) => {
      const [why, bound] = key.split("|");
      const who = names.length === 1 ? names[0] : names.length + " settings";
      return who + ": not exact (" + why + ")" + (+bound ? "; peak and final reserved may be off by up to " +
        formatBytes(+bound) : "") + ".";
    });
    return el("p", { class: "memlab-doctor-note memlab-doctor-uncertain",
                     text: "A range (X to Y) is where the snapshot cannot tell the runs apart. " + lines.join(" ") });
  }

  // A what-if in which a request the recording served runs out of memory: where it stops.
  function stoppedFlag(r) {
    if (r.finished !== false) return null;
    return el("span", { class: "memlab-doctor-flag", text: r.stopped_at_request === null || r.stopped_at_request === undefined
      ? "stops part-way" : "stops at request " + r.stopped_at_request.toLocaleString("en") });
  }

  function rowLabel(label, r) {
    const flag = stoppedFlag(r);
    return el("th", { scope: "row" }, flag ? [breakable(label), el("br"), flag] : [breakable(label)]);
  }

  const TOTAL_SOURCE = { given: "yours", snapshot: "the snapshot's", assumed: "assumed: the lab H200's" };

  // What the answer rests on: the GPU's memory and where it comes from, the best-fit order
  // between equal free blocks the replay followed.
  function basisNote(json) {
    const parts = [];
    if (json.device_total_bytes) {
      parts.push("GPU memory " + formatBytes(json.device_total_bytes) + " (" +
                 (TOTAL_SOURCE[json.device_total_source] || json.device_total_source || "?") + ")");
    }
    const rule = json.allocator_rule;
    if (rule && rule.version) {
      parts.push("equal free blocks chosen in torch " + rule.version + (rule.version === "2.13" ? "+" : "") +
                 "'s best-fit order (" + (rule.note || "") + (rule.ties !== undefined ? "; " + rule.ties.toLocaleString("en") +
                 " tie" + (rule.ties === 1 ? "" : "s") + " decided" : "") +
                 (rule.tried && rule.tried.length > 1 ? "; also tried " + rule.tried.filter((v) => v !== rule.version).join(", ") : "") +
                 ")");
    }
    return parts.length ? el("p", { class: "memlab-doctor-note memlab-doctor-basis", text: parts.join("; ") + "." }) : null;
  }

  function warningList(json) {
    const w = (json.warnings || []).filter((x) => typeof x === "string" && x);
    if (!w.length) return null;
    return el("ul", { class: "memlab-doctor-warnings", "aria-label": "Notes on this answer" },
              w.map((x) => el("li", { text: "Note: " + pageWords(x) })));
  }

  function stoppedNote(answer) {
    const lines = answer.stopped || [];
    if (!lines.length) return null;
    return el("ul", { class: "memlab-doctor-note memlab-doctor-stopped", "aria-label": "What-ifs that stop part-way" },
              lines.map((x) => el("li", { text: pageWords(x) + "." })));
  }

  function settingsTable(json, answer) {
    const runs = runsOf(json);
    // the lowest peak at the worst end of its range, as --suggest ranks them
    // (a what-if that stops part-way is not one to pick: the doctor does not suggest it)
    const worst = (r) => r.finished === false ? Infinity : (range(r, "peak_reserved_bytes") || [0, r.peak_reserved_bytes])[1];
    const best = Math.min(...runs.map(worst));
    const head = el("tr", {}, ["setting", "peak reserved", "peak allocated", "final reserved", "OOMs"].map(
      (h, i) => el("th", { scope: "col", class: i ? "memlab-num" : "", text: h })));
    const rows = runs.map((r) => el("tr", { class: worst(r) === best && runs.length > 1 ? "memlab-doctor-best" : "" }, [
      rowLabel(r.label, r),
      numCell(between(r, "peak_reserved_bytes"), range(r, "peak_reserved_bytes")),
      numCell(formatBytes(r.peak_allocated_bytes)),
      numCell(between(r, "final_reserved_bytes"), range(r, "final_reserved_bytes")),
      numCell(between(r, "oom_events"), range(r, "oom_events")),
    ]));
    return el("div", {}, [
      el("p", { class: "memlab-doctor-note", text: json.trace_events.toLocaleString("en") + " trace events" +
        (json.cap_bytes ? "; the what-ifs ran under a cap of " + formatBytes(json.cap_bytes) +
          ({ given: " (yours)", fraction: " (your fraction of the device)", snapshot: " (the snapshot's)",
             inferred: " (inferred from the out-of-memory entry)" }[json.cap_source] || "") : "") +
        ". " + replayVerdict(json.replay) }),
      basisNote(json) || "",
      warningList(json) || "",
      el("div", { class: "memlab-scroll" }, [el("table", { class: "memlab-doctor-table" }, [
        el("thead", {}, [head]), el("tbody", {}, rows.concat(((answer && answer.pending) || []).map((p) =>
          el("tr", { class: "memlab-doctor-pending" }, [rowLabel(p || "defaults", {}),
            el("td", { colspan: "4", class: "memlab-doctor-note", text: "replaying\u2026" })]))))])]),
      uncertainNote(json.what_if || [], (x) => x.settings || "defaults") || "",
      (answer && stoppedNote(answer)) || ""]);
  }

  // Python code that may break after a '.' on a phone, never inside a name.
  function dotted(text) {
    const code = el("code");
    text.split(/(?<=\.)/).forEach((part, i) => {
      if (i) code.append(el("wbr"));
      code.append(document.createTextNode(part));
    });
    return code;
  }

  function breakable(label, cls) {
    // A setting may break after ':', ',', '_' or '=' on a phone, never inside a word.
    const code = el("code", cls ? { class: cls } : {});
    label.split(/(?<=[:,_=])/).forEach((part, i) => {
      if (i) code.append(el("wbr"));
      code.append(document.createTextNode(part));
    });
    return code;
  }

  function replayVerdict(r) {
    if (r.matches_trace) return "The replay matches the trace exactly.";
    const m = r.first_mismatch || {};
    return "The replay stops at trace event " + m.event_index + " (" + m.action + "): " + pageWords(m.reason) +
           "; the figures cover the events before it.";
  }

  // The figure's one unit, for its axis and its legend: GiB from 1 GiB up, else MiB.
  function figureUnit(fig) {
    const most = Math.max(0, ...fig.runs.map((r) => Math.max(...r.reserved, 0)));
    return most >= GiB ? { name: "GiB", bytes: GiB } : { name: "MiB", bytes: MiB };
  }

  function inUnit(b, unit) {
    return sig(b / unit.bytes, 4) + " " + unit.name;
  }

  function timeline(fig, width) {
    const runs = fig.runs;
    const unit = figureUnit(fig);
    const h = Math.max(220, Math.min(320, Math.round(width * 0.55)));
    const m = { l: 56, r: 10, t: 10, b: 40 };
    const w = width;
    const top = Math.max(1, ...runs.map((r) => Math.max(...r.reserved, 0) / unit.bytes)) * 1.05;
    const xmax = Math.max(1, fig.requests);
    const X = (i) => m.l + (i / xmax) * (w - m.l - m.r);
    const Y = (b) => h - m.b - (b / unit.bytes / top) * (h - m.t - m.b);
    const s = svg("svg", { width: w, height: h, viewBox: `0 0 ${w} ${h}`, role: "img", class: "memlab-doctor-svg",
      "aria-label": "Reserved and allocated memory over the requests, " + runs.map((r) => r.label + ": peak " +
        formatBytes(r.peak_reserved_bytes)).join("; ") });
    const ystep = niceStep(top, h < 260 ? 4 : 5);
    for (let k = 0; k * ystep <= top + 1e-9; k++) {
      const v = k * ystep;
      s.append(svg("line", { x1: m.l, x2: w - m.r, y1: Y(v * unit.bytes), y2: Y(v * unit.bytes), class: "memlab-doctor-grid" }));
      s.append(svg("text", { x: m.l - 6, y: Y(v * unit.bytes) + 4, "text-anchor": "end", class: "memlab-doctor-tick" },
                   sig(v, 6) + (v ? " " + unit.name : "")));
    }
    const xstep = niceStep(xmax, Math.max(2, Math.floor((w - m.l) / 90)));
    for (let v = 0; v <= xmax; v += xstep) {
      s.append(svg("text", { x: X(v), y: h - m.b + 16, "text-anchor": "middle", class: "memlab-doctor-tick" },
                   v.toLocaleString("en")));
    }
    s.append(svg("text", { x: m.l + (w - m.l - m.r) / 2, y: h - 6, "text-anchor": "middle", class: "memlab-doctor-axis" },
                 "request (alloc, free, empty_cache) in trace order"));
    s.append(svg("line", { x1: m.l, x2: m.l, y1: m.t, y2: h - m.b, class: "memlab-doctor-axisline" }));
    s.append(svg("line", { x1: m.l, x2: w - m.r, y1: h - m.b, y2: h - m.b, class: "memlab-doctor-axisline" }));
    runs.forEach((r, k) => {
      const color = PALETTE[k % PALETTE.length];
      const pts = (ys) => r.x.map((x, i) => X(x).toFixed(1) + "," + Y(ys[i]).toFixed(1)).join(" ");
      s.append(svg("polyline", { points: pts(r.allocated), fill: "none", stroke: color, "stroke-width": 1,
                                 "stroke-dasharray": "4 3", opacity: 0.9 }));
      // The recorded run drawn wider, under the what-ifs: a what-if that changes nothing lies on it.
      s.append(svg("polyline", { points: pts(r.reserved), fill: "none", stroke: color, "stroke-width": k ? 1.75 : 4,
                                 class: "memlab-doctor-reserved" }));
      for (const i of r.ooms) {
        s.append(svg("line", { x1: X(i), x2: X(i), y1: h - m.b, y2: h - m.b - 8, stroke: color, "stroke-width": 2 }));
      }
    });
    return s;
  }

  function legend(fig, json) {
    const unit = figureUnit(fig);
    const shown = runsOf(json);   // the table's figures, in the same order
    return el("ul", { class: "memlab-doctor-legend" }, fig.runs.map((r, k) => {
      const x = shown[k] || r;
      const rng = range(x, "peak_reserved_bytes");
      const ooms = x.oom_events;
      return el("li", {}, [
        el("span", { class: "memlab-doctor-swatch", style: "background:" + PALETTE[k % PALETTE.length] }),
        breakable(r.label),
        document.createTextNode(" peak " + (rng ? inUnit(rng[0], unit) + " to " + inUnit(rng[1], unit)
                                                : inUnit(r.peak_reserved_bytes, unit)) +
          (ooms ? ", " + between(x, "oom_events") + " OOM" + (ooms > 1 || range(x, "oom_events") ? "s" : "") : "")),
      ]);
    }));
  }

  function segmentMap(d, width) {
    const segs = d.segments;
    const rowH = 26, labelW = width < 500 ? 0 : 130, m = { t: 4, b: 4 };
    const perRow = labelW ? rowH : rowH + 16;
    const h = m.t + m.b + segs.length * perRow;
    const widest = Math.max(1, ...segs.map((s) => s.total_size));
    const span = width - labelW - 4;
    const s = svg("svg", { width, height: h, viewBox: `0 0 ${width} ${h}`, role: "img", class: "memlab-doctor-svg",
      "aria-label": "Segments at the recorded run's peak: " + segs.length + " of " + d.segments_total });
    segs.forEach((seg, row) => {
      const y = m.t + row * perRow + (labelW ? 0 : 16);
      const label = seg.pool + " \u00b7 " + formatBytes(seg.total_size, 3) + (seg.expandable ? " \u00b7 expandable" : "");
      s.append(svg("text", { x: labelW ? labelW - 6 : 0, y: labelW ? y + rowH / 2 + 4 : y - 4,
                             "text-anchor": labelW ? "end" : "start", class: "memlab-doctor-tick" }, label));
      let off = 0;
      for (const b of seg.blocks) {
        const x = labelW + (off / widest) * span, bw = Math.max(0.5, (b.size / widest) * span);
        const r = svg("rect", { x: x.toFixed(1), y: y + 2, width: bw.toFixed(1), height: rowH - 6,
                                fill: STATE_COLORS[b.state] || "#999", stroke: "#fff", "stroke-width": 0.8 });
        r.append(svg("title", {}, formatBytes(b.size) + " " + (STATE_LABELS[b.state] || b.state)));
        s.append(r);
        if (bw > 58) {
          s.append(svg("text", { x: (x + bw / 2).toFixed(1), y: y + rowH / 2 + 3, "text-anchor": "middle",
                                 class: "memlab-doctor-blocklabel" + (b.state !== "active_allocated" ? " memlab-doctor-dark" : "") },
                       formatBytes(b.size, 3)));
        }
        off += b.size;
      }
    });
    return s;
  }

  const TITLES = { suggest: "Suggested settings", suggestions: "Suggested settings", oom: "The out-of-memory error",
                   oom_explanation: "Why the run ran out of memory", ooms: "The out-of-memory errors" };

  function oomSection(answer) {
    // The doctor's own sentences (Report.oom_text), and the settings under which the request fits.
    const o = answer.json.oom;
    if (!o) return null;
    const names = (list) => list.length ? list.map((x) => x || "defaults").join(", ") : "none of the settings tried";
    return el("section", { class: "memlab-doctor-oom", "data-key": "oom" }, [
      el("h3", { text: "Why the run ran out of memory" }),
      el("pre", { class: "memlab-doctor-prose", text: pageWords(answer.oom_text || JSON.stringify(o, null, 1)) }),
      o.fits_under && o.fits_under.length ? el("p", {}, [document.createTextNode("It would have fitted under: "),
        el("code", { text: names(o.fits_under) })]) : null]);
  }

  function suggestionSection(json) {
    const s = json.suggestion;
    if (!s) return null;
    const rows = (s.rows || []).slice(0, 10);
    const rec = (s.recorded || {}).settings;
    const table = el("div", { class: "memlab-scroll" }, [el("table", { class: "memlab-doctor-table" }, [
      el("thead", {}, [el("tr", {}, ["setting", "peak reserved", "final reserved", "OOMs", "peak vs yours"].map(
        (h, i) => el("th", { scope: "col", class: i ? "memlab-num" : "", text: h })))]),
      el("tbody", {}, rows.map((r) => el("tr", { class: s.best && r.settings === s.best.settings ? "memlab-doctor-best" : "" }, [
        rowLabel((r.settings || "defaults") + (r.settings === rec ? " (yours)" : ""), r),
        numCell(between(r, "peak_reserved_bytes"), range(r, "peak_reserved_bytes")),
        numCell(between(r, "final_reserved_bytes"), range(r, "final_reserved_bytes")),
        numCell(between(r, "oom_events"), range(r, "oom_events")),
        numCell(savedText(r), r.exact === false && r.saved_range_bytes &&
                r.saved_range_bytes[0] !== r.saved_range_bytes[1])])))])]);
    const verdict = s.best && s.alloc_conf
      ? el("p", {}, [document.createTextNode("Use: "), breakable(s.alloc_conf, "memlab-doctor-conf")])
      : el("p", { text: "No setting of the grid beats the one you ran with (" + (rec || "defaults") + "): keep it." });
    return el("section", { class: "memlab-doctor-suggestion", "data-key": "suggestion" }, [
      el("h3", { text: "Suggested setting" }), verdict,
      el("p", { class: "memlab-doctor-note", text: (s.rows || []).length + " settings replayed, best first" +
        ((s.rows || []).length > 10 ? " (10 shown; all in the download)" : "") + "." }), table,
      uncertainNote(rows, (x) => x.settings || "defaults") || ""]);
  }

  function extraSections(json) {
    // Sections a later --json may add: each shown as given, a list of records as a table, text as text.
    const known = new Set(["format", "trace_events", "settings", "device_total_bytes", "device_total_source", "cap_bytes",
                           "cap_source", "allocator_rule", "warnings", "replay", "what_if", "oom", "suggestion"]);
    const out = [];
    for (const [key, value] of Object.entries(json)) {
      if (known.has(key) || value === null || value === undefined) continue;
      const box = el("section", { class: "memlab-doctor-extra", "data-key": key }, [
        el("h3", { text: TITLES[key] || key.charAt(0).toUpperCase() + key.slice(1).replace(/_/g, " ") }),
        renderValue(value)]);
      out.push(box);
    }
    return out;
  }

  function renderValue(v) {
    if (typeof v === "string") return el("p", { text: v });
    if (Array.isArray(v) && v.length && v.every((r) => r && typeof r === "object" && !Array.isArray(r))) {
      const cols = [...new Set(v.flatMap((r) => Object.keys(r)))];
      return el("div", { class: "memlab-scroll" }, [el("table", { class: "memlab-doctor-table" }, [
        el("thead", {}, [el("tr", {}, cols.map((c) => el("th", { scope: "col", text: c.replace(/_/g, " ") })))]),
        el("tbody", {}, v.map((r) => el("tr", {}, cols.map((c) => el("td", { text: cell(c, r[c]) })))))])]);
    }
    if (v && typeof v === "object" && !Array.isArray(v)) {
      return el("dl", { class: "memlab-doctor-dl" }, Object.entries(v).flatMap(([k, x]) => [
        el("dt", { text: k.replace(/_/g, " ") }),
        el("dd", {}, [typeof x === "object" && x !== null ? renderValue(x) : el("span", { text: cell(k, x) })])]));
    }
    return el("pre", { text: JSON.stringify(v, null, 1) });
  }

  function cell(key, x) {
    if (typeof x === "number" && /bytes$/.test(key)) return formatBytes(x);
    if (x === null || x === undefined) return "";
    return typeof x === "object" ? JSON.stringify(x) : String(x);
  }

  let lastFigure = null;
  let lastDetails = null;

  function showResult(answer) {
    const json = answer.json;
    lastFigure = answer.figure;
    lastDetails = null;
    const pending = answer.early && answer.grid;
    results.replaceChildren(
      oomSection(answer) || (pending === "oom" ? gridSection("oom") : ""),
      suggestionSection(json) || (pending === "suggest" ? gridSection("suggest") : ""),
      el("h3", { text: "The settings side by side" }),
      settingsTable(json, answer),
      el("figure", { class: "memlab-doctor-figure" }, [
        el("div", { class: "memlab-doctor-plot" }),
        legend(answer.figure, json),
        el("figcaption", { text: "Reserved (solid) and allocated (dashed) memory after each request, for every setting; " +
                                  "ticks on the axis mark requests that ran out of memory." })]),
      el("div", { "data-key": "extras" }, extraSections(json)),
      downloadPart(answer),
      el("div", { class: "memlab-doctor-details" }, [el("p", { class: "memlab-doctor-note", text: "The report and the segments at the peak follow\u2026" })]),
    );
    results.hidden = false;
    results.dataset.json = answer.json_text;
    drawPlots();
  }

  // The recorded run replayed, before the what-ifs (a long trace): its row, its line.
  function showReplay(answer) {
    lastFigure = answer.figure;
    lastDetails = null;
    results.replaceChildren(
      el("h3", { text: "The settings side by side" }),
      settingsTable(answer.json, answer),
      el("figure", { class: "memlab-doctor-figure" }, [
        el("div", { class: "memlab-doctor-plot" }),
        legend(answer.figure, answer.json),
        el("figcaption", { text: "Reserved (solid) and allocated (dashed) memory after each request, as recorded; " +
                                  "the what-ifs are added as they finish." })]));
    results.hidden = false;
    drawPlots();
  }

  // The download of the --json object and the command that prints it, with the times here.
  function downloadPart(answer) {
    const blob = new Blob([answer.json_text], { type: "application/json" });
    const early = answer.early && answer.grid;
    const download = el("a", { href: URL.createObjectURL(blob), download: file.name.replace(/\.[^.]*$/, "") + ".doctor.json",
                                class: "memlab-doctor-download",
                                text: early ? "Download the result so far (the command line's --json without the " +
                                              (answer.grid === "oom" ? "explanation of the out-of-memory error" : "suggestion") + ")"
                                            : "Download the result (the command line's --json)" });
    const cmd = ["python", "-m", "experiments"].concat(answer.argv).map(shellQuote).join(" ");
    const secs = answer.seconds;
    return el("div", { "data-key": "download" }, [
      el("p", {}, [download]),
      el("p", { class: "memlab-doctor-note" }, [document.createTextNode(
        early && answer.grid === "oom" ? "The command " : "The same as "), el("code", { text: cmd }),
        document.createTextNode((early && answer.grid === "oom" ? " on your machine gives this and explains the error. "
                                                                : " on your machine. ") +
          "Here: " + (secs.read ? "reading " + secs.read.toFixed(2) + " s, " : "") + "replay " + (secs.replay || 0).toFixed(2) + " s" +
          (secs.what_if.length ? ", what-ifs " + secs.what_if.map((t) => t.toFixed(2) + " s").join(", ") : "") +
          (secs.grid && secs.grid.length ? ", the grid's " + secs.grid.length + " settings " +
            secs.grid.reduce((a, b) => a + b, 0).toFixed(1) + " s" : "") + ".")])]);
  }

  // The whole answer after the first: the OOM explanation and the suggestion take the grid's
  // place, the download becomes the command line's full answer; the rest is unchanged.
  function completeResult(answer) {
    const json = answer.json;
    const swap = (key, node) => {
      const old = results.querySelector(':scope > [data-key="' + key + '"]');
      if (old && node) old.replaceWith(node);
      else if (old) old.remove();
      return !!old;
    };
    const oom = oomSection(answer);
    if (!swap("oom", oom) && oom) results.prepend(oom);
    const sug = suggestionSection(json);
    if (!swap("suggestion", sug) && sug) results.querySelector(':scope > h3').before(sug);
    swap("extras", el("div", { "data-key": "extras" }, extraSections(json)));
    swap("download", downloadPart(answer));
    results.dataset.json = answer.json_text;
    drawPlots();
  }

  const GRID_COLUMNS = ["setting", "peak reserved", "final reserved", "OOMs", "peak vs yours"];

  function gridCells(r, label) {
    return [
      rowLabel(label, r),
      numCell(between(r, "peak_reserved_bytes"), range(r, "peak_reserved_bytes")),
      numCell(between(r, "final_reserved_bytes"), range(r, "final_reserved_bytes")),
      numCell(between(r, "oom_events"), range(r, "oom_events")),
      numCell(r.saved_bytes === undefined ? "" : savedText(r),
              r.exact === false && r.saved_range_bytes && r.saved_range_bytes[0] !== r.saved_range_bytes[1])];
  }

  // While the grid runs: what it is for, its settings as they finish, and a way to stop it.
  function gridSection(why) {
    const stop = el("button", { type: "button", class: "memlab-doctor-stop-grid", text: "Stop the ranking" });
    stop.addEventListener("click", stopRun);
    return el("section", { class: "memlab-doctor-gridrun " + (why === "oom" ? "memlab-doctor-oom" : "memlab-doctor-suggestion"),
                           "data-key": why === "oom" ? "oom" : "suggestion", "aria-busy": "true" }, [
      el("h3", { text: why === "oom" ? "Why the run ran out of memory" : "Suggested setting" }),
      el("p", { class: "memlab-doctor-grid-status", text: why === "oom"
        ? "The run ran out of memory. To say which settings would have fitted, the doctor replays a grid of " +
          "settings; the figures below are complete, the explanation follows."
        : "Ranking a grid of settings; the figures below are complete, the suggestion follows once every setting " +
          "has been replayed." }),
      el("p", {}, [stop]),
      el("div", { class: "memlab-scroll", hidden: true }, [el("table", { class: "memlab-doctor-table" }, [
        el("thead", {}, [el("tr", {}, GRID_COLUMNS.map((h, i) => el("th", { scope: "col", class: i ? "memlab-num" : "", text: h })))]),
        el("tbody")])])]);
  }

  function showGridSoFar(count) {
    const box = results.querySelector(".memlab-doctor-gridrun");
    if (!box) return;
    const last = gridRows[gridRows.length - 1];
    const body = box.querySelector("tbody");
    body.append(el("tr", {}, gridCells(last.row, last.settings || "defaults")));
    body.closest(".memlab-scroll").hidden = false;
    box.querySelector(".memlab-doctor-grid-status").textContent = gridRows.length + " of " + count +
      " settings replayed" + (gridRows.length < count ? "" : " (more may follow: combinations of the best)") +
      ", in the order run; " + (gridWhy === "oom" ? "the explanation follows." : "ranked once all are done.");
  }

  // Stop: the worker ends (Python starts again at the next run); a first answer already shown stays.
  function stopRun() {
    if (worker) worker.terminate();
    worker = null;
    const kept = phase === "early";
    setBusy(false);
    const box = results.querySelector(".memlab-doctor-gridrun");
    if (kept && box) {
      box.removeAttribute("aria-busy");
      const b = box.querySelector(".memlab-doctor-stop-grid");
      if (b) b.parentElement.remove();
      box.querySelector(".memlab-doctor-grid-status").textContent = "Stopped after " + gridRows.length +
        " setting" + (gridRows.length === 1 ? "" : "s") + " of the grid" +
        (gridRows.length ? " (below, in the order run, not ranked)" : "") + ": " +
        (gridWhy === "oom" ? "the explanation needs the whole grid. " : "the suggestion needs the whole grid. ") +
        "The figures below are complete. Run again for the rest; Python starts again first.";
      if (!lastDetails) {
        results.querySelector(".memlab-doctor-details").replaceChildren(el("p", { class: "memlab-doctor-note",
          text: "Stopped before the report and the segments at the peak were written." }));
      }
      root.dataset.state = "stopped";
    } else {
      errorBox.textContent = "Stopped. Python is loaded again at the next run.";
      errorBox.hidden = false;
    }
    phase = null;
  }

  function showDetails(d) {
    lastDetails = d;
    const box = results.querySelector(".memlab-doctor-details");
    box.replaceChildren(
      el("h3", { text: "The report, as the command line prints it" }),
      el("pre", { class: "memlab-doctor-report", text: d.text }),
      el("h3", { text: "Segments at the recorded run's peak" }),
      el("p", { class: "memlab-doctor-note", text: (d.segments.length < d.segments_total ? d.segments.length + " of " + d.segments_total +
        " segments: those that live blocks pin first, then the largest. " : "") + "Hover or tap a block for its size." }),
      el("div", { class: "memlab-doctor-segmap" }),
      el("ul", { class: "memlab-doctor-legend" }, Object.keys(STATE_COLORS).map((k) => el("li", {}, [
        el("span", { class: "memlab-doctor-swatch", style: "background:" + STATE_COLORS[k] }), document.createTextNode(STATE_LABELS[k])]))));
    drawPlots();
  }

  // A report wider than its column says that it scrolls (on a phone it wraps instead: doctor.css).
  function reportCue() {
    const pre = results.querySelector(".memlab-doctor-report");
    if (!pre) return;
    let cue = pre.previousElementSibling && pre.previousElementSibling.classList.contains("memlab-scroll-cue")
      ? pre.previousElementSibling : null;
    const wide = pre.scrollWidth > pre.clientWidth + 1;
    if (wide && !cue) {
      cue = el("p", { class: "memlab-scroll-cue memlab-doctor-note",
                      text: "The report is wider than this column: scroll it sideways \u2192" });
      pre.before(cue);
    } else if (!wide && cue) {
      cue.remove();
    }
  }

  function drawPlots() {
    reportCue();
    const plot = results.querySelector(".memlab-doctor-plot");
    if (plot && lastFigure) plot.replaceChildren(timeline(lastFigure, Math.max(280, plot.clientWidth)));
    const seg = results.querySelector(".memlab-doctor-segmap");
    if (seg && lastDetails && lastDetails.segments.length) seg.replaceChildren(segmentMap(lastDetails, Math.max(280, seg.clientWidth)));
  }

  let resizeTimer = null;
  window.addEventListener("resize", () => {
    clearTimeout(resizeTimer);
    resizeTimer = setTimeout(drawPlots, 150);
  });

  // ------------------------------------------------------------------ events

  function choose(f) {
    if (!f) return;
    file = f;
    drop.querySelector(".memlab-doctor-drop-title").textContent = f.name + " (" + megabytes(f.size) + ")";
    runButton.disabled = busy;
    run();
  }

  fileInput.addEventListener("change", () => {
    choose(fileInput.files[0]);
    fileInput.value = "";  // picking the same file again (after changing it on disk) runs again
  });
  drop.addEventListener("click", (e) => { if (e.target === drop || e.target.tagName === "P") fileInput.click(); });
  drop.addEventListener("keydown", (e) => { if (e.key === "Enter" || e.key === " ") { e.preventDefault(); fileInput.click(); } });
  drop.addEventListener("dragover", (e) => { e.preventDefault(); drop.classList.add("memlab-doctor-over"); });
  drop.addEventListener("dragleave", () => drop.classList.remove("memlab-doctor-over"));
  drop.addEventListener("drop", (e) => {
    e.preventDefault();
    drop.classList.remove("memlab-doctor-over");
    choose(e.dataTransfer.files[0]);
  });
  runButton.addEventListener("click", run);
  stopButton.addEventListener("click", stopRun);
})();
