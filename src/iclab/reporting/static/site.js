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

// iclab report: filter boxes. An input.table-filter filters the rows of the table whose id is its data-table: a row
// stays when every word typed appears in it (case-insensitive); the count beside it says how many are shown.
(function () {
  "use strict";
  document.querySelectorAll("input.table-filter").forEach(function (input) {
    var table = document.getElementById(input.getAttribute("data-table"));
    var count = input.parentNode.parentNode.querySelector(".filter-count");
    if (!table || !table.tBodies.length) return;
    function apply() {
      var words = input.value.toLowerCase().split(/\s+/).filter(Boolean);
      var rows = Array.prototype.slice.call(table.tBodies[0].rows), shown = 0;
      rows.forEach(function (row) {
        var text = row.textContent.toLowerCase();
        var keep = words.every(function (w) { return text.indexOf(w) >= 0; });
        row.hidden = !keep;
        if (keep) shown += 1;
      });
      if (count) count.textContent = words.length ? shown + " of " + rows.length + " rows" : "";
    }
    input.addEventListener("input", apply);
    apply();
  });
})();

// iclab report: interactive charts with the plotly.min.js written beside this script. A div.chart names (data-source)
// the <script type="application/json"> element holding its data, read with JSON.parse, never run as code; every
// string from a run is HTML-escaped before Plotly sees it (Plotly reads tags in names). Zoom, pan, hover and legend
// toggles are Plotly's; a metric menu and a log-scale box sit above each chart.
(function () {
  "use strict";
  var COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf"];

  function esc(s) {
    return String(s).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
  }

  function element(tag, attrs, text) {
    var e = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (k) { e.setAttribute(k, attrs[k]); });
    if (text !== undefined) e.textContent = text;
    return e;
  }

  function allPositive(traces) {
    return traces.every(function (t) {
      return t.y.every(function (v) { return v === null || v > 0; });
    });
  }

  // Controls above a chart: a metric menu (options: [value, label]) and a log-scale box; draw(metric, log).
  function controls(div, options, isLoss, draw) {
    var bar = element("div", { "class": "chart-controls" });
    var select = element("select", { "class": "chart-metric", "aria-label": "series shown" });
    options.forEach(function (o) { select.appendChild(element("option", { value: o[0] }, o[1])); });
    var label = element("label", { "class": "chart-log" });
    var box = element("input", { type: "checkbox", "class": "chart-log-toggle" });
    label.appendChild(box);
    label.appendChild(document.createTextNode(" log scale (y)"));
    bar.appendChild(select);
    bar.appendChild(label);
    var plot = element("div", { "class": "plot" });
    div.textContent = "";
    div.appendChild(bar);
    div.appendChild(plot);
    function redraw(first) {
      var traces = draw(select.value);
      if (first || select.dataset.drawn !== select.value) {
        box.checked = isLoss(select.value) && traces.length > 0 && allPositive(traces);
        select.dataset.drawn = select.value;
      }
      var layout = {
        margin: { l: 60, r: 20, t: 10, b: 45 }, height: 380, hovermode: "closest",
        xaxis: { title: { text: traces.xTitle || "step" }, type: traces.xType || "-" },
        yaxis: { title: { text: esc(traces.yTitle || select.value) }, type: box.checked ? "log" : "linear" },
        legend: { font: { size: 11 } }
      };
      Plotly.react(plot, traces, layout, { responsive: true, displaylogo: false });
    }
    select.addEventListener("change", function () { redraw(false); });
    box.addEventListener("change", function () {
      Plotly.relayout(plot, { "yaxis.type": box.checked ? "log" : "linear" });
    });
    redraw(true);
  }

  function isLoss(m) { return /loss|err|mse|dist/i.test(m); }

  function curves(div, data) {
    var groups = [];
    data.runs.forEach(function (r) { if (groups.indexOf(r.group) < 0) groups.push(r.group); });
    var meanOf = {};
    data.means.forEach(function (m) { meanOf[m.group] = m; });
    var options = [];
    if (data.metrics.indexOf("train_loss") >= 0 && data.metrics.indexOf("test_loss") >= 0) {
      options.push(["train_loss,test_loss", "train and test loss"]);
    }
    data.metrics.forEach(function (m) { options.push([m, m]); });
    controls(div, options, function (v) { return v.split(",").some(isLoss); }, function (value) {
      var metrics = value.split(","), traces = [];
      metrics.forEach(function (metric) {
        var suffix = metrics.length > 1 ? " · " + metric : "";
        var dash = metric === "test_loss" && metrics.length > 1 ? "dot" : "solid";
        data.runs.forEach(function (r) {
          var s = r.series[metric];
          if (!s) return;
          var colour = COLOURS[groups.indexOf(r.group) % COLOURS.length], mean = meanOf[r.group];
          traces.push({
            x: s[0], y: s[1], type: "scatter", mode: s[0].length > 1 ? "lines" : "markers",
            name: esc(r.name + suffix), legendgroup: esc(r.group + suffix), showlegend: !mean,
            line: { color: colour, width: mean ? 1 : 1.8, dash: dash }, marker: { color: colour },
            opacity: mean ? 0.35 : 1,
            hovertemplate: "%{fullData.name}<br>step %{x}<br>" + esc(metric) + " %{y:.5g}<extra></extra>"
          });
        });
        data.means.forEach(function (m) {
          var s = m.series[metric];
          if (!s) return;
          var colour = COLOURS[groups.indexOf(m.group) % COLOURS.length];
          traces.push({
            x: s[0], y: s[1], type: "scatter", mode: s[0].length > 1 ? "lines" : "markers",
            name: esc(m.group + " mean of " + m.n + " seeds" + suffix), legendgroup: esc(m.group + suffix),
            line: { color: colour, width: 2.6, dash: dash }, marker: { color: colour },
            hovertemplate: "%{fullData.name}<br>step %{x}<br>" + esc(metric) + " %{y:.5g}<extra></extra>"
          });
        });
      });
      traces.yTitle = metrics.length > 1 ? "loss" : metrics[0];
      return traces;
    });
  }

  // Colour of value v among values: viridis-like ramp, on a log scale when they are positive and span > 10x.
  function ramp(values) {
    var nums = values.filter(function (v) { return typeof v === "number"; });
    var log = nums.length && nums.every(function (v) { return v > 0; }) &&
      Math.max.apply(null, nums) / Math.min.apply(null, nums) > 10;
    var f = function (v) { return log ? Math.log(v) : v; };
    var lo = Math.min.apply(null, nums.map(f)), hi = Math.max.apply(null, nums.map(f));
    var stops = [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]];
    return function (v, i) {
      if (typeof v !== "number" || !isFinite(lo) || hi === lo) return COLOURS[i % COLOURS.length];
      var t = (f(v) - lo) / (hi - lo) * (stops.length - 1), k = Math.min(Math.floor(t), stops.length - 2), u = t - k;
      var c = stops[k].map(function (a, j) { return Math.round(a + u * (stops[k + 1][j] - a)); });
      return "rgb(" + c.join(",") + ")";
    };
  }

  function overlay(div, data) {
    var key = data.keys[0];
    var colour = ramp(data.points.map(function (p) { return key ? p.values[key] : null; }));
    var options = data.metrics.map(function (m) { return [m, m]; });
    controls(div, options, isLoss, function (metric) {
      var traces = [];
      data.points.forEach(function (p, i) {
        var s = p.series[metric];
        if (!s) return;
        var c = colour(key ? p.values[key] : null, i);
        traces.push({
          x: s[0], y: s[1], type: "scatter", mode: s[0].length > 1 ? "lines" : "markers", name: esc(p.name),
          line: { color: c, width: 1.8 }, marker: { color: c },
          hovertemplate: "%{fullData.name}<br>step %{x}<br>" + esc(metric) + " %{y:.5g}<extra></extra>"
        });
      });
      return traces;
    });
  }

  function scatter(div, charts) {
    var options = charts.map(function (c, i) {
      return [String(i), c.metric + " vs " + c.key + (c.repeated ? " (mean ± s.e. over seeds)" : " (one seed per point)")];
    });
    controls(div, options, function (v) { return isLoss(charts[Number(v)].metric); }, function (v) {
      var c = charts[Number(v)];
      var traces = c.traces.map(function (t, i) {
        return {
          x: t.x, y: t.y, type: "scatter", mode: "lines+markers", name: esc(t.name),
          line: { color: COLOURS[i % COLOURS.length] }, marker: { size: 8 },
          error_y: { type: "data", array: t.se.map(function (s) { return s === null ? 0 : s; }), visible: c.repeated },
          customdata: t.n,
          hovertemplate: esc(c.key) + " %{x}<br>" + esc(c.metric) + " %{y:.5g}" +
            (c.repeated ? " ± %{error_y.array:.2g} (%{customdata} seeds)" : "") + "<extra>%{fullData.name}</extra>"
        };
      });
      var xs = [].concat.apply([], c.traces.map(function (t) { return t.x; }));
      var positive = xs.length && xs.every(function (x) { return typeof x === "number" && x > 0; });
      traces.xType = positive && Math.max.apply(null, xs) / Math.min.apply(null, xs) > 10 ? "log" : "-";
      traces.xTitle = esc(c.key);
      traces.yTitle = c.metric;
      return traces;
    });
  }

  var DRAW = { curves: curves, overlay: overlay, scatter: scatter };

  function render(div) {
    var source = document.getElementById(div.getAttribute("data-source"));
    var draw = DRAW[div.getAttribute("data-kind")];
    if (!source || !draw || div.hasAttribute("data-ready")) return;
    draw(div, JSON.parse(source.textContent));
    div.setAttribute("data-ready", "true");
  }

  // plotly.min.js (4.8 MB) loads when the first chart scrolls near the viewport, and each chart draws then: a page
  // of twelve experiments opens at once, and one without a chart in view never parses Plotly.
  var bundle = document.body.getAttribute("data-plotly"), pending = [], loading = false;
  var charts = Array.prototype.slice.call(document.querySelectorAll("div.chart"));
  if (!bundle || !charts.length) return; // the hint inside each div stays
  function want(div) {
    if (typeof Plotly !== "undefined") { render(div); return; }
    pending.push(div);
    if (loading) return;
    loading = true;
    var script = document.createElement("script");
    script.src = bundle;
    script.onload = function () { pending.splice(0).forEach(render); };
    document.head.appendChild(script);
  }
  if (!("IntersectionObserver" in window)) { charts.forEach(want); return; }
  var seen = new IntersectionObserver(function (entries) {
    entries.forEach(function (e) {
      if (e.isIntersecting) { seen.unobserve(e.target); want(e.target); }
    });
  }, { rootMargin: "400px 0px" });
  charts.forEach(function (div) { seen.observe(div); });
})();
