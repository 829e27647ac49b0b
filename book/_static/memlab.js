/* CUDA Memory Lab: the book's own script, shipped with the site (no CDN).
 * 1. Phone menus: pydata-sphinx-theme 0.17 binds its drawer to the first .primary-toggle /
 *    .secondary-toggle only (pydata-sphinx-theme issue #2451); the buttons a phone shows
 *    are later ones, so they forward their tap to the first.
 * 2. Solution titles (issue #19): sphinx-exercise makes most of a solution's title a link
 *    back to its exercise, so a tap on the title scrolled away instead of opening the
 *    solution. The title becomes plain text that opens and closes it; the link back to
 *    the exercise moves to the first line of the solution.
 * 3. Drawers (issue #19): a link chosen in the phone's "Contents" or navigation drawer
 *    closes the drawer, then goes where it points.
 * 4. Identifiers in tables (issue #19): claim ids and check names break after a dot or an
 *    underscore (a <wbr> there), never inside a word; memlab.css turns off the break
 *    anywhere that long inline code gets elsewhere.
 * 5. Tables on narrow screens: a table wider than its column is made compact
 *    (smaller text, cells wrap between words), and one still too wide is stacked, a card per
 *    row with each cell under its column's name (memlab.css); a box that still scrolls says so.
 *    Checked again when the width changes.
 * 6. Search results: the snippets under each result come from the page's text
 *    without its solutions and the outputs that answer an exercise (sphinx's searchtools.js
 *    reads the whole page).
 * Explorers and figure zoom: memlab-figures.js.
 */
(function () {
  "use strict";

  function setupMenus() {
    [".primary-toggle", ".secondary-toggle"].forEach(function (sel) {
      const buttons = document.querySelectorAll(sel);
      if (buttons.length < 2) return;
      const bound = buttons[0];
      Array.prototype.slice.call(buttons, 1).forEach(function (b) {
        b.addEventListener("click", function (ev) {
          ev.preventDefault();
          ev.stopImmediatePropagation();
          bound.click();
        }, true);
      });
    });
  }

  /* ---- 2. Solution titles: a tap anywhere on the title opens the solution. ---- */
  function setupSolutionTitles() {
    document.querySelectorAll(".solution.dropdown > .admonition-title").forEach(function (title) {
      const link = title.querySelector("a[href]");
      if (!link) return;
      const label = document.createElement("span");
      label.className = "memlab-solution-label";
      label.textContent = link.textContent;
      link.replaceWith(label);
      const back = document.createElement("p");
      back.className = "memlab-solution-back";
      const a = document.createElement("a");
      a.href = link.getAttribute("href");
      a.className = "reference internal";
      a.textContent = "Back to" + link.textContent;
      back.appendChild(a);
      const content = title.parentNode.querySelector(":scope > section, :scope > p, :scope > div");
      if (content && content.tagName === "SECTION") content.prepend(back);
      else title.after(back);
    });
  }

  /* ---- 3. Drawers: choosing a link closes the drawer first. ---- */
  function setupDrawerLinks() {
    document.querySelectorAll("#pst-primary-sidebar-modal, #pst-secondary-sidebar-modal").forEach(function (dialog) {
      dialog.addEventListener("click", function (ev) {
        const a = ev.target.closest && ev.target.closest("a[href]");
        if (!a || !dialog.open || ev.defaultPrevented) return;
        if (ev.button !== 0 || ev.metaKey || ev.ctrlKey || ev.shiftKey || ev.altKey || a.target === "_blank") return;
        ev.preventDefault();
        const href = a.href;
        // The theme's own close handler moves the links back and focuses the menu button;
        // going to the link after it keeps that focus from scrolling the page back up.
        dialog.addEventListener("close", function () {
          window.setTimeout(function () { window.location.href = href; }, 0);
        }, { once: true });
        dialog.close();
      });
    });
  }

  /* ---- 4. Identifiers in tables: break after "." or "_" only. ---- */
  function setupIdentifierBreaks() {
    document.querySelectorAll("article table code").forEach(function (code) {
      const walker = document.createTreeWalker(code, NodeFilter.SHOW_TEXT);
      const texts = [];
      while (walker.nextNode()) texts.push(walker.currentNode);
      texts.forEach(function (node) {
        const parts = node.nodeValue.split(/(?<=\w[._])(?=\w)/);
        if (parts.length < 2) return;
        const frag = document.createDocumentFragment();
        parts.forEach(function (part, i) {
          if (i) frag.appendChild(document.createElement("wbr"));
          frag.appendChild(document.createTextNode(part));
        });
        node.replaceWith(frag);
      });
      code.classList.add("memlab-identifier");
    });
  }

  /* ---- 5. Tables on narrow screens: compact, then stacked, or a word that they scroll. ---- */
  const TABLES = "article .cell_output table, article table.table";

  function tooWide(table) {
    const box = table.closest(".output, .pst-scrollable-table-container, .table-wrapper, .cell_output, .memlab-scroll") || table.parentElement;
    return table.getBoundingClientRect().width > box.clientWidth + 1 || box.scrollWidth > box.clientWidth + 1;
  }

  function labelCells(table) {
    if (table.dataset.memlabLabelled) return true;
    const head = table.tHead && table.tHead.rows[0];
    if (!head) return false;
    const names = Array.prototype.map.call(head.cells, function (c) { return c.textContent.trim(); });
    Array.prototype.forEach.call(table.tBodies, function (body) {
      Array.prototype.forEach.call(body.rows, function (row) {
        if (row.cells.length !== names.length) return;  // a group heading spans the row
        Array.prototype.forEach.call(row.cells, function (cell, i) { if (names[i]) cell.dataset.label = names[i]; });
      });
    });
    table.dataset.memlabLabelled = "1";
    return true;
  }

  function fitTable(table) {
    table.classList.remove("memlab-compact", "memlab-stacked");
    const old = table.parentElement && table.parentElement.querySelector(":scope > .memlab-scroll-cue");
    if (!table.offsetParent) return;
    if (tooWide(table)) table.classList.add("memlab-compact");
    if (tooWide(table) && labelCells(table)) {
      table.classList.remove("memlab-compact");
      table.classList.add("memlab-stacked");
    }
    const scrolls = tooWide(table);
    if (scrolls && !old) {
      const cue = document.createElement("p");
      cue.className = "memlab-scroll-cue";
      cue.textContent = "This table is wider than the screen: scroll it sideways \u2192";
      table.before(cue);
    } else if (!scrolls && old) {
      old.remove();
    }
  }

  function setupTables() {
    const tables = document.querySelectorAll(TABLES);
    if (!tables.length) return;
    const fitAll = function () { tables.forEach(fitTable); };
    fitAll();
    let timer = null;
    window.addEventListener("resize", function () { clearTimeout(timer); timer = setTimeout(fitAll, 100); });
    // a table in a fold is measured when the fold opens
    document.addEventListener("toggle", function (ev) {
      if (ev.target.open) ev.target.querySelectorAll("table").forEach(fitTable);
    }, true);
    document.addEventListener("click", function () { setTimeout(fitAll, 50); }, { passive: true });
  }

  /* ---- 6. Search result snippets without solutions or answers. ---- */
  const ANSWERS = ".solution, .memlab-answer, [data-answer-to]";

  function setupSearchSnippets() {
    // sphinx's searchtools.js declares Search with const: a global of the page, not of window
    if (typeof Search === "undefined" || typeof Search.htmlToText !== "function") return;
    const original = Search.htmlToText;
    Search.htmlToText = function (htmlString, anchor) {
      const doc = new DOMParser().parseFromString(htmlString, "text/html");
      doc.querySelectorAll(ANSWERS).forEach(function (e) { e.remove(); });
      return original("<!DOCTYPE html>" + doc.documentElement.outerHTML, anchor);
    };
  }

  function ready(fn) {
    if (document.readyState !== "loading") fn(); else document.addEventListener("DOMContentLoaded", fn);
  }
  ready(function () {
    setupMenus(); setupSolutionTitles(); setupDrawerLinks(); setupIdentifierBreaks(); setupTables();
    setupSearchSnippets();
  });
})();
