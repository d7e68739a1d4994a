// iclab report: sortable tables. Click a header of a table.sortable to sort its rows by that column (numbers as
// numbers, else text; empty cells last), click again to reverse. A cell's data-sort attribute, when present, is the
// value sorted on. No dependencies; works from file://.
(function () {
  "use strict";

  function value(cell) {
    var v = cell.hasAttribute("data-sort") ? cell.getAttribute("data-sort") : cell.textContent;
    v = v.trim();
    if (v === "") return null;
    var n = Number(v);
    return isNaN(n) ? v.toLowerCase() : n;
  }

  function compare(a, b) {
    if (typeof a === typeof b) return a < b ? -1 : a > b ? 1 : 0;
    return typeof a === "number" ? -1 : 1; // numbers before text
  }

  function sortBy(table, col, dir) {
    var body = table.tBodies[0];
    var rows = Array.prototype.slice.call(body.rows).map(function (row, i) {
      return { row: row, key: row.cells[col] ? value(row.cells[col]) : null, i: i };
    });
    rows.sort(function (a, b) {
      if (a.key === null || b.key === null) {
        return a.key === b.key ? a.i - b.i : a.key === null ? 1 : -1;
      }
      return dir * compare(a.key, b.key) || a.i - b.i;
    });
    rows.forEach(function (r) { body.appendChild(r.row); });
  }

  document.querySelectorAll("table.sortable").forEach(function (table) {
    if (!table.tHead || !table.tBodies.length) return;
    var heads = Array.prototype.slice.call(table.tHead.rows[0].cells);
    heads.forEach(function (th, col) {
      th.tabIndex = 0;
      th.title = "sort by " + th.textContent.trim();
      function sort() {
        var dir = th.getAttribute("aria-sort") === "ascending" ? -1 : 1;
        heads.forEach(function (h) { h.removeAttribute("aria-sort"); });
        th.setAttribute("aria-sort", dir === 1 ? "ascending" : "descending");
        sortBy(table, col, dir);
      }
      th.addEventListener("click", sort);
      th.addEventListener("keydown", function (e) {
        if (e.key === "Enter" || e.key === " ") { e.preventDefault(); sort(); }
      });
    });
  });
})();
