/* CUDA Memory Lab: the book's own script, shipped with the site (no CDN).
 * Phone menus: pydata-sphinx-theme 0.17 binds its drawer to the first .primary-toggle /
 * .secondary-toggle only (pydata-sphinx-theme issue #2451); the buttons a phone shows
 * are later ones, so they forward their tap to the first.
 * Explorers and figures: memlab-figures.js.
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

  function ready(fn) {
    if (document.readyState !== "loading") fn(); else document.addEventListener("DOMContentLoaded", fn);
  }
  ready(function () { setupMenus(); });
})();
