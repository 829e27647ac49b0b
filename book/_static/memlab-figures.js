/* CUDA Memory Lab: figures and recorded-grid explorers (issue 19), shipped with the site (no CDN).
 * 1. Explorers (experiments/core/explorer.py): show the figure of the point the controls
 *    select. A value recorded only with other settings of the other controls moves those
 *    controls to the nearest recorded point, and says so, so no choice leads nowhere.
 *    A hidden view's images carry data-src/data-srcset: they are fetched when it is shown.
 * 2. Figures shown clearly smaller than the screen could show them open in a dialog, at
 *    most as large as the screen, on a click, a tap or Enter; Escape, a click or a tap closes
 *    it (sphinx_highlight.js cancels Escape's default on the page, so the dialog handles the
 *    key itself).
 * 3. Answers: an explorer view that is an exercise's answer (data-answer-to, set by
 *    book/_ext/memlab_book.py) shows a note instead of its figure until the reader has opened
 *    that exercise's solution or its answer fold (remembered in localStorage); an explorer
 *    whose first view is an answer starts at the nearest other one.
 */
(function () {
  "use strict";

  // ----------------------------------------------------------------- explorers

  function controlsOf(explorer) {
    const byParam = {};
    explorer.querySelectorAll("[data-param]").forEach(function (el) {
      const name = el.dataset.param;
      if (!byParam[name]) byParam[name] = { name: name, els: [] };
      byParam[name].els.push(el);
    });
    return Object.keys(byParam).map(function (name) {
      const c = byParam[name];
      const first = c.els[0];
      if (first.type === "range") {
        c.kind = "range";
        c.values = JSON.parse(first.dataset.values);
        c.labels = JSON.parse(first.dataset.labels);
      } else if (first.tagName === "SELECT") {
        c.kind = "select";
        c.values = Array.prototype.map.call(first.options, function (o) { return JSON.parse(o.value); });
      } else {
        c.kind = "radio";
        c.values = c.els.map(function (r) { return JSON.parse(r.value); });
      }
      return c;
    });
  }

  function same(a, b) { return JSON.stringify(a) === JSON.stringify(b); }

  function indexOf(control, value) {
    for (let i = 0; i < control.values.length; i++) if (same(control.values[i], value)) return i;
    return -1;
  }

  function read(control) {
    if (control.kind === "range") return control.values[+control.els[0].value];
    if (control.kind === "select") return JSON.parse(control.els[0].value);
    const on = control.els.filter(function (r) { return r.checked; })[0];
    return on ? JSON.parse(on.value) : undefined;
  }

  function write(control, value) {
    const i = indexOf(control, value);
    if (i < 0) return;
    if (control.kind === "range") control.els[0].value = String(i);
    else if (control.kind === "select") control.els[0].selectedIndex = i;
    else control.els.forEach(function (r, k) { r.checked = k === i; });
  }

  function label(control, value) {
    const i = indexOf(control, value);
    return control.kind === "range" ? control.labels[i] : String(value);
  }

  function showRange(control) {
    if (control.kind !== "range") return;
    const text = control.labels[+control.els[0].value];
    control.els[0].setAttribute("aria-valuetext", text);
    const out = control.els[0].parentNode.querySelector("output");
    if (out) out.textContent = text;
  }

  // The recorded point nearest to `chosen` among those with `fixed` = chosen[fixed]: fewest
  // other controls changed, then the smallest moves along their option lists.
  function nearest(controls, views, chosen, fixed) {
    let best = null, bestCost = null;
    views.forEach(function (v) {
      if (!same(v.point[fixed], chosen[fixed])) return;
      let changed = 0, steps = 0;
      controls.forEach(function (c) {
        if (c.name === fixed || same(v.point[c.name], chosen[c.name])) return;
        changed += 1;
        steps += Math.abs(indexOf(c, v.point[c.name]) - indexOf(c, chosen[c.name]));
      });
      const cost = changed * 1000 + steps;
      if (bestCost === null || cost < bestCost) { best = v; bestCost = cost; }
    });
    return best;
  }

  function reveal(view) {
    // <source> first, so that the browser picks the variant before the <img> starts loading
    view.querySelectorAll("source[data-srcset]").forEach(function (s) {
      s.srcset = s.dataset.srcset;
      s.removeAttribute("data-srcset");
    });
    view.querySelectorAll("img[data-src]").forEach(function (i) {
      i.src = i.dataset.src;
      i.removeAttribute("data-src");
    });
  }

  // ----------------------------------------------------------------- answers

  const OPENED = "memlab-answer-opened:";

  function opened(label) {
    try { return window.localStorage.getItem(OPENED + location.pathname + "#" + label) === "1"; }
    catch (e) { return !!opened.mem[label]; }
  }
  opened.mem = {};

  function exerciseName(label) {
    const ex = document.getElementById(label);
    const title = ex && ex.querySelector(".admonition-title");
    const text = title ? title.textContent.trim().replace(/\s+/g, " ") : "";
    const m = text.match(/^Exercise [\d.]+/);
    return m ? m[0] : "the exercise";
  }

  function locked(view) {
    return !!view.el.dataset.answerTo && !opened(view.el.dataset.answerTo);
  }

  function showLock(view) {
    let note = view.el.querySelector(":scope > .memlab-answer-note");
    const label = view.el.dataset.answerTo;
    if (!note) {
      note = document.createElement("p");
      note.className = "memlab-answer-note";
      const a = document.createElement("a");
      a.href = "#" + label;
      a.textContent = exerciseName(label);
      note.append("This setting is the answer to ", a,
        ". Its figure shows here once you have opened that exercise's solution or its answer.");
      view.el.prepend(note);
    }
    view.el.classList.add("memlab-locked");
  }

  function hideLock(view) {
    view.el.classList.remove("memlab-locked");
    const note = view.el.querySelector(":scope > .memlab-answer-note");
    if (note) note.remove();
  }

  function update(explorer, state, changed) {
    const chosen = {};
    state.controls.forEach(function (c) { chosen[c.name] = read(c); });
    let match = state.views.filter(function (v) {
      return state.controls.every(function (c) { return same(v.point[c.name], chosen[c.name]); });
    })[0];
    // the 'change' that follows an 'input' finds the point already shown: keep its note
    if (match && match === state.shown) return;
    const status = explorer.querySelector(".memlab-explorer-status");
    let note = "";
    if (!match && changed) {
      match = nearest(state.controls, state.views, chosen, changed);
      if (match) {
        const moved = state.controls.filter(function (c) { return !same(match.point[c.name], chosen[c.name]); });
        moved.forEach(function (c) { write(c, match.point[c.name]); });
        const ctl = state.controls.filter(function (c) { return c.name === changed; })[0];
        note = changed + " = " + label(ctl, chosen[changed]) + " was recorded only with other settings: " +
          moved.map(function (c) { return c.name + " set to " + label(c, match.point[c.name]); }).join(", ") + ".";
      }
    }
    state.shown = match;
    state.controls.forEach(showRange);
    state.views.forEach(function (v) {
      v.el.hidden = v !== match;
      if (v !== match) return;
      if (locked(v)) { showLock(v); return; }
      hideLock(v);
      reveal(v.el);
    });
    if (status) status.textContent = note;
    const missing = explorer.querySelector(".memlab-explorer-missing");
    if (missing) missing.hidden = !!match;
    markZoomable(explorer);
  }

  function setupExplorers() {
    document.querySelectorAll(".memlab-explorer").forEach(function (explorer) {
      const state = {
        controls: controlsOf(explorer),
        views: Array.prototype.map.call(explorer.querySelectorAll(".memlab-view"), function (el) {
          return { el: el, point: JSON.parse(el.dataset.point) };
        }),
      };
      const form = explorer.querySelector("form");
      function changedBy(ev) { return ev.target && ev.target.dataset ? ev.target.dataset.param : undefined; }
      form.addEventListener("input", function (ev) { update(explorer, state, changedBy(ev)); });
      form.addEventListener("change", function (ev) { update(explorer, state, changedBy(ev)); });
      startAway(state);
      update(explorer, state, undefined);
      explorer.memlabRefresh = function () { state.shown = null; update(explorer, state, undefined); };
    });
  }

  // An explorer whose first view is an exercise's answer starts at the nearest other view.
  function startAway(state) {
    const chosen = {};
    state.controls.forEach(function (c) { chosen[c.name] = read(c); });
    const first = state.views.filter(function (v) {
      return state.controls.every(function (c) { return same(v.point[c.name], chosen[c.name]); });
    })[0];
    if (!first || !locked(first)) return;
    let best = null, bestCost = null;
    state.views.forEach(function (v) {
      if (locked(v)) return;
      let cost = 0;
      state.controls.forEach(function (c) { cost += Math.abs(indexOf(c, v.point[c.name]) - indexOf(c, chosen[c.name])); });
      if (bestCost === null || cost < bestCost) { best = v; bestCost = cost; }
    });
    if (best) state.controls.forEach(function (c) { write(c, best.point[c.name]); });
  }

  // The reader opened a solution or an answer fold: its exercise's views unlock.
  function unlock(label) {
    if (!label || opened(label)) return;
    try { window.localStorage.setItem(OPENED + location.pathname + "#" + label, "1"); }
    catch (e) { opened.mem[label] = true; }
    document.querySelectorAll(".memlab-explorer").forEach(function (ex) {
      if (ex.querySelector('[data-answer-to="' + CSS.escape(label) + '"]') && ex.memlabRefresh) ex.memlabRefresh();
    });
  }

  function solutionLabel(solution) {
    const a = solution.querySelector('.admonition-title a[href^="#"], .memlab-solution-back a[href^="#"]');
    return a ? a.getAttribute("href").slice(1) : null;
  }

  function setupAnswers() {
    const labels = new Set(Array.prototype.map.call(document.querySelectorAll("[data-answer-to]"),
                                                    function (v) { return v.dataset.answerTo; }));
    if (!labels.size) return;
    // sphinx-togglebutton adds its button (aria-expanded) when the DOM is loaded, maybe after this
    document.querySelectorAll(".solution").forEach(function (sol) {
      new MutationObserver(function () {
        const button = sol.querySelector(".toggle-button");
        if (button && button.getAttribute("aria-expanded") === "true") unlock(solutionLabel(sol));
      }).observe(sol, { attributes: true, subtree: true, attributeFilter: ["aria-expanded"] });
    });
    labels.forEach(function (label) {
      document.querySelectorAll(".memlab-answer-to-" + CSS.escape(label) + " details").forEach(function (d) {
        d.addEventListener("toggle", function () { if (d.open) unlock(label); });
      });
    });
  }

  // ----------------------------------------------------------------- figures that open larger

  let zoom = null;

  // The width the dialog would show an image at: its natural size, at most the screen's.
  function fittedWidth(img) {
    const w = img.naturalWidth, h = img.naturalHeight;
    if (!w || !h) return 0;
    return Math.min(w, 0.96 * window.innerWidth, w * (0.9 * window.innerHeight) / h);
  }

  function openZoom(img) {
    if (!zoom) {
      zoom = document.createElement("dialog");
      zoom.className = "memlab-zoom";
      zoom.setAttribute("aria-label", "Figure enlarged (press Escape or tap to close)");
      zoom.addEventListener("click", function () { zoom.close(); });
      // sphinx_highlight.js calls preventDefault() on every Escape keydown of the page, which
      // stops the dialog's own close: close it here, before the event reaches the document.
      zoom.addEventListener("keydown", function (ev) {
        if (ev.key === "Escape") { ev.stopPropagation(); ev.preventDefault(); zoom.close(); }
      });
      document.body.appendChild(zoom);
    }
    zoom.innerHTML = "";
    const big = document.createElement("img");
    big.src = img.currentSrc || img.src;  // the variant this screen shows
    big.alt = img.alt;
    zoom.appendChild(big);
    zoom.showModal();
  }

  function mark(img) {
    const shown = img.getBoundingClientRect().width;
    const zoomable = shown > 0 && fittedWidth(img) > 1.2 * shown;
    img.classList.toggle("memlab-zoomable", zoomable);
    if (zoomable) {
      img.tabIndex = 0;
      img.setAttribute("role", "button");
    } else {
      img.removeAttribute("tabindex");
      img.removeAttribute("role");
    }
  }

  function markZoomable(root) {
    root.querySelectorAll("img").forEach(function (img) { if (img.complete) mark(img); });
  }

  function setupZoom() {
    document.querySelectorAll("article .cell_output img").forEach(function (img) {
      img.addEventListener("click", function () { if (img.classList.contains("memlab-zoomable")) openZoom(img); });
      img.addEventListener("keydown", function (ev) {
        if ((ev.key === "Enter" || ev.key === " ") && img.classList.contains("memlab-zoomable")) {
          ev.preventDefault();
          openZoom(img);
        }
      });
      img.addEventListener("load", function () { mark(img); });
      if (img.complete) mark(img);
    });
    window.addEventListener("resize", function () {
      markZoomable(document.querySelector("article") || document);
    });
  }

  function ready(fn) {
    if (document.readyState !== "loading") fn(); else document.addEventListener("DOMContentLoaded", fn);
  }
  ready(function () { setupZoom(); setupExplorers(); setupAnswers(); });
})();
