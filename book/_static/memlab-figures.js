/* CUDA Memory Lab: figures and recorded-grid explorers (issue 19), shipped with the site (no CDN).
 * 1. Explorers (experiments/core/explorer.py): show the figure of the point the controls
 *    select. A value recorded only with other settings of the other controls moves those
 *    controls to the nearest recorded point, and says so, so no choice leads nowhere.
 *    A hidden view's images carry data-src/data-srcset: they are fetched when it is shown.
 * 2. Figures shown clearly smaller than the screen could show them open in a dialog, at
 *    most as large as the screen, on a click, a tap or Enter.
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
      if (v === match) reveal(v.el);
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
      update(explorer, state, undefined);
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
  ready(function () { setupZoom(); setupExplorers(); });
})();
