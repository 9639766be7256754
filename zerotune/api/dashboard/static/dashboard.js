/* zerotune dashboard: draws each page's charts from #page-data with plotly.js (served by the API
   itself), sorts and filters the trials table, and keeps running studies live by polling the JSON
   API (/v1/studies/{id}, /v1/studies/{id}/points, /v1/jobs/{id}, /v1/trials/{id}). Every chart
   element gets data-traces (how many traces it was given) and data-rendered once drawn. */
"use strict";
(function () {
  const DATA = JSON.parse(document.getElementById("page-data").textContent || "{}");
  const PAGE = document.body.dataset.page;
  const GiB = 2 ** 30, MiB = 2 ** 20;
  const TERMINAL = new Set(["complete", "failed", "pruned", "infeasible"]);
  const ACTIVE_STUDY = new Set(["pending", "running"]);
  const CATEGORIES = ["params", "secondary_params", "grads", "optim_states", "comm_buffers", "activations"];
  const CATEGORY_COLORS = {params: "#1f77b4", secondary_params: "#9ecae1", grads: "#ff7f0e",
    optim_states: "#2ca02c", comm_buffers: "#9467bd", activations: "#8c564b"};
  const INNER_COLORS = ["#c6dbef", "#6baed6", "#2171b5", "#08306b", "#74c476", "#31a354"];
  const CONFIG = {displaylogo: false, responsive: true, modeBarButtonsToRemove: ["lasso2d", "select2d"]};
  const POLL_MS = 1500;
  const PAGE_ROWS = 100;  // trials table rows per page (sorting and filtering see every trial)

  // --- small helpers ---------------------------------------------------------------------------
  const $ = (sel, root) => (root || document).querySelector(sel);
  const esc = (v) => String(v).replace(/[&<>"']/g, (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));
  const isNum = (v) => typeof v === "number" && isFinite(v);
  function fmt(v, digits) {
    if (v === null || v === undefined || v === "") return "—";
    if (typeof v === "number") return isFinite(v) ? String(Number(v.toPrecision(digits || 3))) : "—";
    return String(v);
  }
  const badge = (s) => `<span class="badge s-${esc(s)}">${esc(s)}</span>`;
  async function getJSON(url) {
    const r = await fetch(url, {headers: {accept: "application/json"}});
    if (!r.ok) throw new Error(`${url}: HTTP ${r.status}`);
    return r.json();
  }
  function levelColor(i, n) { return n > 1 && i === n - 1 ? "#d62728" : INNER_COLORS[i % INNER_COLORS.length]; }

  function layout(extra) {
    return Object.assign({
      height: 320, margin: {l: 60, r: 20, t: 24, b: 48}, paper_bgcolor: "#fff", plot_bgcolor: "#fff",
      font: {family: "system-ui, -apple-system, 'Segoe UI', sans-serif", size: 12, color: "#222"},
      legend: {orientation: "h", x: 0, y: 1.12}, hovermode: "closest",
    }, extra || {});
  }
  function axis(title, extra) {
    return Object.assign({title: {text: title}, gridcolor: "#eee", zeroline: false, automargin: true}, extra || {});
  }
  function limitLine(x, label, vertical) {
    const line = {type: "line", line: {color: "#d62728", width: 2, dash: "dash"}};
    const shape = vertical === false
      ? Object.assign(line, {xref: "paper", x0: 0, x1: 1, yref: "y", y0: x, y1: x})
      : Object.assign(line, {yref: "paper", y0: 0, y1: 1, xref: "x", x0: x, x1: x});
    const note = vertical === false
      ? {xref: "paper", x: 1, yref: "y", y: x, xanchor: "right", yanchor: "bottom", text: label, showarrow: false, font: {color: "#d62728"}}
      : {xref: "x", x: x, yref: "paper", y: 1, xanchor: "right", yanchor: "top", text: label, showarrow: false, font: {color: "#d62728"}, textangle: -90};
    return {shapes: [shape], annotations: [note]};
  }

  // Memory against the device limit: the limit is drawn as a line when it is near the data, else (a
  // 5 GiB peak on a 64 GiB device) the chart keeps the data readable and states the share in words.
  function memoryScale(maxBytes, limitGiB, vertical) {
    const limitBytes = isNum(limitGiB) ? limitGiB * GiB : null;
    const onScale = limitBytes !== null && limitBytes <= 2.5 * maxBytes;
    const top = Math.max(maxBytes, onScale ? limitBytes : 0, 1);
    const unit = top >= GiB ? [GiB, "GiB"] : [MiB, "MiB"];
    const extra = limitBytes !== null && onScale ? limitLine(limitBytes / unit[0], `device limit ${fmt(limitGiB)} GiB`, vertical) : {};
    const note = limitBytes !== null && !onScale
      ? `device limit ${fmt(limitGiB)} GiB, off scale: the largest peak uses ${fmt(100 * maxBytes / limitBytes, 2)}% of it` : "";
    return {unit, range: [0, 1.08 * top / unit[0]], extra, note};
  }

  function draw(id, traces, lay) {
    const el = document.getElementById(id);
    if (!el) return Promise.resolve();
    if (typeof Plotly === "undefined") { empty(id, "plotly.js is not installed on the server (pip install plotly)."); return Promise.resolve(); }
    if (el.dataset.empty) { el.innerHTML = ""; delete el.dataset.empty; }
    el.dataset.traces = String(traces.length);
    const done = el.dataset.drawn ? Plotly.react(el, traces, lay, CONFIG) : Plotly.newPlot(el, traces, lay, CONFIG);
    el.dataset.drawn = "1";
    return done.then(() => { el.dataset.rendered = "1"; });
  }
  function empty(id, text) {
    const el = document.getElementById(id);
    if (!el) return;
    if (el.dataset.drawn && typeof Plotly !== "undefined") Plotly.purge(el);
    delete el.dataset.drawn;
    el.innerHTML = `<p class="empty">${esc(text)}</p>`;
    el.dataset.empty = "1"; el.dataset.traces = "0"; el.dataset.rendered = "1";
  }
  function linkClicks(id, key) {  // a click on a point opens its trial
    const el = document.getElementById(id);
    if (!el || el.dataset.clicks) return;
    el.dataset.clicks = "1";
    el.on("plotly_click", (ev) => {
      const p = ev.points && ev.points[0];
      const trial = p && (p.customdata !== undefined ? p.customdata : null);
      if (trial !== null && trial !== undefined) window.location.href = `/dashboard/trials/${key ? trial[key] : trial}`;
    });
  }

  // --- the study page ----------------------------------------------------------------------------
  const PARAM_WORDS = {spans: "spans (P,G,OS)", quantize_above: "quantize_above", weight_bits: "weight_bits",
    grad_bits: "grad_bits", allgather_bucket_mb: "allgather_bucket_mb", reduce_bucket_mb: "reduce_bucket_mb",
    prefetch_buckets: "prefetch_buckets", micro_batch_size: "micro_batch_size",
    activation_checkpointing: "activation_checkpointing", checkpoint_policy: "checkpoint_policy"};
  const paramWords = (name) => PARAM_WORDS[name] || name.replace(/^secondary_span_p(\d+)$/, "secondary_span (hpZ) when param_span=$1");

  function errorOf(p) {
    return isNum(p.measured_step_time_s) && isNum(p.predicted_step_time_s) && p.measured_step_time_s > 0
      ? (p.predicted_step_time_s - p.measured_step_time_s) / p.measured_step_time_s : null;
  }
  const S = (p, k) => (p.strategy || {})[k];
  // activation checkpointing as one value: off, full (a stored strategy from before the policy is full) or selective
  const ckpt = (p) => (!S(p, "activation_checkpointing") ? "no" : S(p, "checkpoint_policy") === "selective" ? "selective"
    : (S(p, "checkpoint_every") || 1) > 1 ? `1 in ${S(p, "checkpoint_every")}` : "full");
  const COLUMNS = [
    {key: "select", label: "", sortable: false, html: (p) => `<input type="checkbox" class="pick" value="${p.id}" aria-label="select trial ${p.id}">`},
    {key: "id", label: "trial", value: (p) => p.id, html: (p) => `<a href="/dashboard/trials/${p.id}">${p.id}</a>`},
    {key: "number", label: "#", value: (p) => p.number},
    {key: "status", label: "status", value: (p) => p.status, html: (p) => badge(p.status) + (p.proxy ? ' <span class="muted small">proxy</span>' : "")},
    {key: "label", label: "strategy", value: (p) => p.label, cls: "mono"},
    {key: "spans", label: "P/G/OS", value: (p) => `${S(p, "param_span")}/${S(p, "grad_span")}/${S(p, "optim_span")}`, cls: "mono"},
    {key: "hpz", label: "hpZ", value: (p) => S(p, "secondary_span")},
    {key: "bits", label: "w/g bits", value: (p) => `${S(p, "weight_bits")}/${S(p, "grad_bits")}`, cls: "mono"},
    {key: "qa", label: "q. from", value: (p) => S(p, "quantize_above")},
    {key: "buckets", label: "AG/RS MB", value: (p) => `${S(p, "allgather_bucket_mb")}/${S(p, "reduce_bucket_mb")}`, cls: "mono"},
    {key: "prefetch", label: "prefetch", value: (p) => S(p, "prefetch_buckets")},
    {key: "mbs", label: "mbs", value: (p) => S(p, "micro_batch_size")},
    {key: "ckpt", label: "ckpt", value: ckpt},
    {key: "value", label: "TFLOPS/rank", num: true, value: (p) => p.value},
    {key: "mem", label: "peak GiB", num: true, value: (p) => (isNum(p.peak_memory_bytes) ? p.peak_memory_bytes / GiB : null)},
    {key: "inter", label: "inter-node MiB", num: true, value: (p) => (isNum(p.inter_node_bytes) ? p.inter_node_bytes / MiB : null)},
    {key: "pred", label: "pred. step s", num: true, value: (p) => p.predicted_step_time_s},
    {key: "meas", label: "meas. step s", num: true, value: (p) => p.measured_step_time_s},
    {key: "err", label: "model err.", num: true, value: errorOf, text: (v) => (isNum(v) ? `${v >= 0 ? "+" : ""}${(100 * v).toFixed(1)}%` : "—")},
    {key: "reason", label: "reason", value: (p) => p.reason, html: (p) => (p.reason ? `<span class="reason" title="${esc(p.reason)}">${esc(p.reason)}</span>` : "")},
  ];

  function compareValues(a, b) {  // nulls last, numbers numerically, the rest as text
    const an = a === null || a === undefined, bn = b === null || b === undefined;
    if (an || bn) return an && bn ? 0 : an ? 1 : -1;
    if (typeof a === "number" && typeof b === "number") return a - b;
    return String(a).localeCompare(String(b), undefined, {numeric: true});
  }

  function TrialsTable(getPoints) {
    const table = $("#trials"), head = $("thead tr", table), body = $("tbody", table);
    const filters = $("#status-filter"), compare = $("#compare-selected"), pager = $("#trials-pager");
    const asked = Number(new URLSearchParams(window.location.search).get("rows"));  // ?rows=N: a shareable page size
    const state = {filter: "all", key: "id", dir: 1, picked: new Set(), page: 0, size: asked >= 1 ? asked : PAGE_ROWS};
    head.innerHTML = COLUMNS.map((c) => `<th data-key="${c.key}"${c.num ? ' class="num"' : ""}${c.sortable === false ? "" : ' tabindex="0" aria-sort="none"'}>${esc(c.label)}</th>`).join("");
    head.querySelectorAll("th[aria-sort]").forEach((th) => {
      const sort = () => {
        const key = th.dataset.key;
        state.dir = state.key === key ? -state.dir : (COLUMNS.find((c) => c.key === key).num ? -1 : 1);
        state.key = key;
        state.page = 0;
        render();
      };
      th.addEventListener("click", sort);
      th.addEventListener("keydown", (e) => { if (e.key === "Enter") sort(); });
    });
    filters.addEventListener("click", (e) => {
      const b = e.target.closest("button[data-status]");
      if (b) { state.filter = b.dataset.status; state.page = 0; render(); }
    });
    pager.addEventListener("click", (e) => {
      const b = e.target.closest("button[data-page]");
      if (!b) return;
      if (b.dataset.page === "all") { state.size = Infinity; state.page = 0; } else state.page += Number(b.dataset.page);
      render();
    });
    body.addEventListener("change", (e) => {
      if (!e.target.classList.contains("pick")) return;
      if (e.target.checked) state.picked.add(e.target.value); else state.picked.delete(e.target.value);
      compare.disabled = state.picked.size < 2;
      compare.textContent = `Compare selected (${state.picked.size})`;
    });
    compare.addEventListener("click", () => { window.location.href = `/dashboard/compare?trials=${[...state.picked].join(",")}`; });

    function render() {
      const points = getPoints();
      const counts = {};
      points.forEach((p) => { counts[p.status] = (counts[p.status] || 0) + 1; });
      if (state.filter !== "all" && !counts[state.filter]) state.filter = "all";
      filters.innerHTML = [["all", points.length], ...Object.entries(counts).sort()].map(([s, n]) =>
        `<button type="button" data-status="${esc(s)}" class="${state.filter === s ? "on" : ""}" aria-pressed="${state.filter === s}">${esc(s)} <span class="muted">${n}</span></button>`).join("");
      const col = COLUMNS.find((c) => c.key === state.key);
      const shown = points.filter((p) => state.filter === "all" || p.status === state.filter);
      shown.sort((a, b) => {
        const va = col.value(a), vb = col.value(b);
        if (va === null || va === undefined || vb === null || vb === undefined) return compareValues(va, vb);
        return state.dir * compareValues(va, vb) || a.id - b.id;
      });
      head.querySelectorAll("th[aria-sort]").forEach((th) => {
        th.setAttribute("aria-sort", th.dataset.key === state.key ? (state.dir > 0 ? "ascending" : "descending") : "none");
      });
      const pages = Math.max(1, Math.ceil(shown.length / state.size));
      state.page = Math.min(Math.max(0, state.page), pages - 1);
      const first = state.page ? state.page * state.size : 0, rows = shown.slice(first, first + state.size);
      pager.innerHTML = pages > 1 ? `rows ${first + 1}–${first + rows.length} of ${shown.length} ` +
        `<button type="button" data-page="-1"${state.page ? "" : " disabled"}>‹ previous</button> ` +
        `<button type="button" data-page="1"${state.page < pages - 1 ? "" : " disabled"}>next ›</button> ` +
        `<button type="button" data-page="all">show all ${shown.length}</button>` : "";
      body.innerHTML = rows.map((p) => `<tr data-id="${p.id}" data-status="${esc(p.status)}">` + COLUMNS.map((c) => {
        const v = c.value ? c.value(p) : null;
        const inner = c.html ? c.html(p) : esc(c.text ? c.text(v) : fmt(v, 4));
        const cls = [c.num ? "num" : "", c.cls || ""].join(" ").trim();
        return `<td${cls ? ` class="${cls}"` : ""}>${inner}</td>`;
      }).join("") + "</tr>").join("");
      body.querySelectorAll("input.pick").forEach((box) => { box.checked = state.picked.has(box.value); });
      $("#trial-count").textContent = `${shown.length} shown of ${points.length}`;
    }
    return {render};
  }

  function historyChart(points) {
    const done = points.filter((p) => p.status === "complete" && isNum(p.value))
      .sort((a, b) => compareValues(a.number, b.number) || a.id - b.id);
    if (!done.length) return empty("chart-history", "No complete trial yet: the history starts with the first one.");
    const x = done.map((p, i) => (isNum(p.number) ? p.number : i));
    let best = -Infinity;
    const running = done.map((p) => (best = Math.max(best, p.value)));
    return draw("chart-history", [
      {type: "scatter", mode: "markers", name: "trial", x, y: done.map((p) => p.value), customdata: done.map((p) => p.id),
        text: done.map((p) => `trial ${p.id}: ${p.label}`), hovertemplate: "%{text}<br>%{y:.4g} TFLOPS/rank<extra></extra>",
        marker: {color: "#1f77b4", size: 7, opacity: 0.75}},
      {type: "scatter", mode: "lines", name: "best so far", x, y: running, line: {color: "#ff7f0e", width: 2, shape: "hv"}, hoverinfo: "skip"},
    ], layout({xaxis: axis("trial number"), yaxis: axis("TFLOPS per rank", {rangemode: "tozero"})})).then(() => linkClicks("chart-history"));
  }

  function paretoChart(points, limit) {
    const withMem = (p) => isNum(p.peak_memory_bytes);
    const done = points.filter((p) => p.status === "complete" && isNum(p.value) && withMem(p));
    const over = points.filter((p) => p.status === "infeasible" && isNum(p.predicted_tflops_per_rank) && withMem(p));
    if (!done.length && !over.length) return empty("chart-pareto", "No trial with a throughput and a memory figure yet.");
    // the axis is the complete trials' (and the device limit's when it is near them): a point the model ruled
    // out far beyond (20x the memory) sits at the axis' edge with its figure in words, instead of squeezing
    // the front to a sliver
    const memOf = (ps) => ps.map((p) => p.peak_memory_bytes);
    const axisTop = Math.max(...memOf(done.length ? done : over));
    const scale = memoryScale(axisTop, limit);
    const [div, unit] = scale.unit;
    const edge = 0.985 * scale.range[1] * div;  // bytes at the axis' right edge
    const beyond = over.filter((p) => p.peak_memory_bytes > edge);
    const point = (ps, y, name, marker) => ({type: "scatter", mode: "markers", name, x: ps.map((p) => Math.min(p.peak_memory_bytes, edge) / div),
      y: ps.map(y), customdata: ps.map((p) => p.id), text: ps.map((p) => `trial ${p.id}: ${p.label}, ${fmt(p.peak_memory_bytes / GiB, 3)} GiB` +
        `${p.reason ? "<br>" + esc(p.reason) : ""}`),
      hovertemplate: `%{text}<br>%{y:.4g} TFLOPS/rank<extra></extra>`, marker});
    const traces = [];
    if (done.length) traces.push(point(done, (p) => p.value, "complete", {color: "#1f77b4", size: 7, opacity: 0.7}));
    if (over.length) traces.push(point(over, (p) => p.predicted_tflops_per_rank, "infeasible (predicted)", {color: "#999", size: 7,
      symbol: over.map((p) => (p.peak_memory_bytes > edge ? "triangle-right" : "x"))}));
    if (beyond.length) {
      const most = Math.max(...memOf(beyond)) / GiB;
      scale.note = (scale.note ? scale.note + "<br>" : "") + `${beyond.length} infeasible point${beyond.length > 1 ? "s" : ""} beyond the axis ` +
        `(▶, up to ${fmt(most, 3)} GiB)`;
    }
    const front = [];
    let best = -Infinity;
    [...done].sort((a, b) => a.peak_memory_bytes - b.peak_memory_bytes || b.value - a.value).forEach((p) => {
      if (p.value > best) { front.push(p); best = p.value; }
    });
    if (front.length) traces.push({type: "scatter", mode: "lines+markers", name: "Pareto front", x: front.map((p) => p.peak_memory_bytes / div),
      y: front.map((p) => p.value), customdata: front.map((p) => p.id), line: {color: "#ff7f0e", shape: "hv", width: 2},
      marker: {color: "#ff7f0e", size: 9}, text: front.map((p) => `trial ${p.id}: ${p.label}`),
      hovertemplate: `front: %{text}<br>%{x:.4g} ${unit}, %{y:.4g} TFLOPS/rank<extra></extra>`});
    const title = `peak memory per rank (${unit})` + (scale.note ? `<br><span style="color:#d62728">${scale.note}</span>` : "");
    return draw("chart-pareto", traces, layout(Object.assign({xaxis: axis(title, {range: scale.range}),
      yaxis: axis("TFLOPS per rank", {rangemode: "tozero"})}, scale.extra))).then(() => linkClicks("chart-pareto"));
  }

  function importanceChart(result) {
    if (!result.data.length) return empty("chart-importance", `Parameter importance: ${result.note || "not available"}.`);
    const rows = [...result.data].reverse();
    return draw("chart-importance", [{type: "bar", orientation: "h", name: "importance", x: rows.map((r) => r.importance),
      y: rows.map((r) => paramWords(r.param)), marker: {color: "#2171b5"},
      hovertemplate: "%{y}: %{x:.1%}<extra></extra>"}],
    layout({height: Math.max(240, 26 * rows.length + 80), margin: {l: 20, r: 20, t: 24, b: 48},
      xaxis: axis(`share of importance (${result.trials_used} trials)`, {tickformat: ".0%", rangemode: "tozero"}),
      yaxis: {automargin: true}}));
  }

  // Parallel coordinates in SVG. Plotly's parcoords draws its lines with WebGL, which a browser
  // without a GPU (headless, a login node's remote desktop) renders in software, seconds per chart;
  // plain scatter lines stay fast. Each strategy dimension is a vertical axis with its choices spread
  // evenly, the last axis is TFLOPS per rank; trials are grouped in TFLOPS bands (one trace each:
  // click a band in the legend to hide or show it) and the best trial is drawn on top.
  const BANDS = ["#440154", "#3b528b", "#21918c", "#5ec962", "#fde725"];  // viridis, slow to fast
  const DIMENSIONS = [["param_span", "P span"], ["grad_span", "G span"], ["optim_span", "OS span"],
    ["secondary_span", "hpZ span"], ["weight_bits", "weight bits"], ["grad_bits", "grad bits"],
    ["quantize_above", "quantize from"], ["allgather_bucket_mb", "AG bucket MB"], ["reduce_bucket_mb", "RS bucket MB"],
    ["prefetch_buckets", "prefetch"], ["micro_batch_size", "micro-batch"], ["activation_checkpointing", "act. ckpt"]];
  function parcoordsChart(points) {
    const done = points.filter((p) => p.status === "complete" && isNum(p.value));
    if (!done.length) return empty("chart-parcoords", "No complete trial yet: each one becomes a line across the strategy dimensions.");
    const values = done.map((p) => p.value);
    const lo = Math.min(...values), hi = Math.max(...values);
    const dims = DIMENSIONS.map(([key, label]) => {
      const shown = done.map((p) => { const v = key === "activation_checkpointing" ? ckpt(p) : S(p, key); return v === null || v === undefined ? "off" : typeof v === "boolean" ? (v ? "yes" : "no") : v; });
      const levels = [...new Set(shown)].sort(compareValues);
      const at = (j) => (levels.length > 1 ? j / (levels.length - 1) : 0.5);
      return {label, shown, pos: shown.map((v) => at(levels.indexOf(v))), ticks: levels.map((v, j) => [at(j), String(v)])};
    });
    dims.push({label: "TFLOPS/rank", shown: values.map((v) => fmt(v, 4)), pos: values.map((v) => (hi > lo ? (v - lo) / (hi - lo) : 0.5)),
      ticks: hi > lo ? [[0, fmt(lo, 4)], [1, fmt(hi, 4)]] : [[0.5, fmt(hi, 4)]]});
    const band = (v) => (hi > lo ? Math.min(BANDS.length - 1, Math.floor(BANDS.length * (v - lo) / (hi - lo))) : BANDS.length - 1);
    const groups = BANDS.map(() => ({x: [], y: [], n: 0}));
    done.forEach((p, i) => {
      const g = groups[band(p.value)];
      g.n += 1;
      dims.forEach((d, k) => { g.x.push(k); g.y.push(d.pos[i]); });
      g.x.push(null); g.y.push(null);
    });
    // axis titles and choices as two text traces: Plotly measures every annotation one by one, texts in bulk
    const tickX = [], tickY = [], tickText = [];
    dims.forEach((d, k) => d.ticks.forEach(([y, text]) => { tickX.push(k); tickY.push(y); tickText.push(text); }));
    const traces = [
      // titles on two alternating rows above the highest choice: neighbours and choices never overlap
      {type: "scatter", mode: "text", name: "axes", x: dims.map((_, k) => k), y: dims.map((_, k) => (k % 2 ? 1.15 : 1.07)),
        text: dims.map((d) => `<b>${esc(d.label)}</b>`), textposition: "middle center", textfont: {size: 11}, hoverinfo: "skip",
        showlegend: false},
      {type: "scatter", mode: "text", name: "choices", x: tickX, y: tickY, text: tickText.map(esc), textposition: "middle left",
        textfont: {size: 10, color: "#444"}, hoverinfo: "skip", showlegend: false},
    ];
    groups.forEach((g, b) => {
      if (!g.n) return;
      const from = lo + (hi - lo) * b / BANDS.length, to = lo + (hi - lo) * (b + 1) / BANDS.length;
      traces.push({type: "scatter", mode: "lines", name: `${fmt(from, 3)}–${fmt(to, 3)} (${g.n})`, x: g.x, y: g.y,
        line: {color: BANDS[b], width: 1}, opacity: 0.5, hoverinfo: "skip"});
    });
    const best = values.indexOf(hi);
    traces.push({type: "scatter", mode: "lines+markers", name: `best: trial ${done[best].id}`, x: dims.map((_, k) => k),
      y: dims.map((d) => d.pos[best]), line: {color: "#ff7f0e", width: 3}, marker: {size: 6}, customdata: dims.map(() => done[best].id),
      text: dims.map((d) => `${d.label}: ${d.shown[best]}`), hovertemplate: "%{text}<extra>best</extra>"});
    return draw("chart-parcoords", traces, layout({height: 380, margin: {l: 40, r: 20, t: 20, b: 10},
      shapes: dims.map((_, k) => ({type: "line", x0: k, x1: k, y0: 0, y1: 1, line: {color: "#aaa", width: 1}, layer: "below"})),
      xaxis: {visible: false, range: [-0.7, dims.length - 0.6], fixedrange: true}, yaxis: {visible: false, range: [-0.04, 1.2], fixedrange: true},
      legend: {orientation: "h", x: 0, y: -0.02, yanchor: "top", title: {text: "TFLOPS per rank "}}})).then(() => linkClicks("chart-parcoords"));
  }

  // a log axis labels its decades only: Plotly's default writes 2..9 between them, which collide
  const LOG_AXIS = {type: "log", dtick: 1, tickformat: ".2~g", minor: {ticks: "inside", ticklen: 3, showgrid: false}};
  function errorChart(points, executor) {
    const measured = points.filter((p) => p.status === "complete" && isNum(p.measured_step_time_s) && isNum(p.predicted_step_time_s));
    if (!measured.length) {
      return empty("chart-error", executor === "model"
        ? "No measured trial in this study: its trials are cost-model predictions (executor model), so there is nothing " +
          "to compare the model with. Trials of the local or slurm executors, and uploaded run.json files, are measured."
        : "No measured trial has completed yet: each one that does is plotted here against the cost model's prediction.");
    }
    const xs = measured.map((p) => p.predicted_step_time_s), ys = measured.map((p) => p.measured_step_time_s);
    const lo = Math.min(...xs, ...ys), hi = Math.max(...xs, ...ys);
    const errors = measured.map((p) => Math.abs(errorOf(p))).sort((a, b) => a - b);
    const median = errors[Math.floor(errors.length / 2)];
    const log = hi / Math.max(lo, 1e-12) > 30;
    return draw("chart-error", [
      {type: "scatter", mode: "markers", name: "measured trial", x: xs, y: ys, customdata: measured.map((p) => p.id),
        text: measured.map((p) => `trial ${p.id}: ${p.label}, error ${fmt(100 * errorOf(p), 3)}%`),
        hovertemplate: "%{text}<br>predicted %{x:.4g} s, measured %{y:.4g} s<extra></extra>", marker: {color: "#2ca02c", size: 8}},
      {type: "scatter", mode: "lines", name: "prediction = measurement", x: [lo, hi], y: [lo, hi], line: {color: "#999", dash: "dot"}, hoverinfo: "skip"},
    ], layout({xaxis: axis("predicted step time (s)", log ? LOG_AXIS : {}),
      yaxis: axis("measured step time (s)", log ? LOG_AXIS : {}),
      annotations: [{xref: "paper", yref: "paper", x: 0, y: 1, xanchor: "left", yanchor: "top", showarrow: false,
        text: `median |error| ${fmt(100 * median, 3)}% over ${measured.length} measured trials`}]})).then(() => linkClicks("chart-error"));
  }

  function studyPage() {
    let study = DATA.study, job = DATA.job, points = DATA.points.data;
    const table = TrialsTable(() => points);
    let importanceAt = -1, importanceBusy = false, failures = 0;
    function loadImportance() {
      const complete = (study.trial_counts || {}).complete || 0;
      if (importanceBusy || complete === importanceAt) return;
      importanceBusy = true;
      getJSON(`/v1/studies/${study.id}/importance`).then((r) => { importanceAt = complete; importanceChart(r); })
        .catch((e) => empty("chart-importance", `Parameter importance could not be loaded: ${e.message}`))
        .finally(() => { importanceBusy = false; });
    }
    const nextTask = () => new Promise((resolve) => setTimeout(resolve, 0));
    async function renderAll() {  // the table first, then one chart per task: the page paints while charts draw
      loadImportance();  // its request runs while the charts draw
      table.render();
      for (const chart of [() => historyChart(points), () => paretoChart(points, DATA.device_memory_gib),
        () => errorChart(points, study.executor), () => parcoordsChart(points)]) {
        await nextTask();
        chart();
      }
    }
    function header() {
      $("#study-state").innerHTML = badge(study.state);
      const counts = Object.entries(study.trial_counts || {}).sort();
      $("#trial-counts").innerHTML = counts.length ? counts.map(([s, n]) => `${badge(s)} ${n}`).join(" ") : "none yet";
      $("#best").innerHTML = study.best_trial_id
        ? `<a href="/dashboard/trials/${study.best_trial_id}">${fmt(study.best_value, 4)} (trial ${study.best_trial_id})</a>` : "—";
      if (study.recommendation_id) $("#rec").innerHTML = `<a href="/dashboard/recommendations/${study.recommendation_id}">recommendation ${study.recommendation_id}</a>`;
      else if (study.error) $("#rec").innerHTML = `<span class="muted">none: ${esc(study.error)}</span>`;
      if (job) {
        $("#progress-bar").style.width = `${Math.round(100 * job.progress)}%`;
        $("#progress-text").textContent = `${job.trials_done} / ${job.trials_total} trials`
          + (job.phase && job.state === "running" ? ` · ${job.phase}` : "");
      } else if (!ACTIVE_STUDY.has(study.state)) {
        $("#progress-bar").style.width = "100%";
      }
    }
    async function poll() {
      const live = $("#live");
      try {
        const fresh = await getJSON(`/v1/studies/${study.id}`);
        const total = Object.values(fresh.trial_counts || {}).reduce((a, b) => a + b, 0);
        const open = points.findIndex((p) => !TERMINAL.has(p.status));
        if (total !== points.length || open !== -1 || fresh.state !== study.state) {
          const from = open === -1 ? points.length : Math.min(open, points.length);
          const rows = [];
          for (let offset = from; ;) {
            const page = await getJSON(`/v1/studies/${study.id}/points?offset=${offset}&limit=500`);
            rows.push(...page.data);
            offset += page.data.length;
            if (!page.data.length || offset >= page.count) break;
          }
          points = points.slice(0, from).concat(rows);
          study = fresh;
          renderAll();
        }
        study = fresh;
        if (job) job = await getJSON(`/v1/jobs/${job.id}`);
        header();
        failures = 0;
        live.textContent = `● live · ${new Date().toLocaleTimeString()}`;
        live.classList.remove("paused");
      } catch (e) {
        failures += 1;
        live.textContent = `● live updates paused: ${e.message}; retrying`;
        live.classList.add("paused");
      }
      if (ACTIVE_STUDY.has(study.state)) setTimeout(poll, Math.min(POLL_MS * (1 + failures), 30000));
      else { live.textContent = `study ${study.state}`; live.classList.add("ended"); }
    }
    renderAll();
    if (ACTIVE_STUDY.has(study.state)) { $("#live").hidden = false; setTimeout(poll, POLL_MS); }
  }

  // --- the studies page --------------------------------------------------------------------------
  function studiesPage() {
    const live = DATA.live || [], waiting = DATA.waiting || [];
    if (live.length || waiting.length) $("#live-note").hidden = false;
    async function pollStudy(entry) {
      const row = document.querySelector(`tr[data-study="${entry.study_id}"]`);
      try {
        const s = await getJSON(`/v1/studies/${entry.study_id}`);
        const done = Object.entries(s.trial_counts || {}).filter(([k]) => TERMINAL.has(k)).reduce((a, [, n]) => a + n, 0);
        const job = entry.job_id ? await getJSON(`/v1/jobs/${entry.job_id}`) : null;
        $(".js-state", row).innerHTML = badge(s.state);
        $(".js-done-text", row).textContent = `${done} / ${s.n_trials}`;
        $(".progress .bar", row).style.width = `${Math.min(100, Math.round(100 * (job ? job.progress : done / s.n_trials)))}%`;
        $(".js-best", row).textContent = fmt(s.best_value, 4);
        if (s.recommendation_id) $(".js-rec", row).innerHTML = `<a href="/dashboard/recommendations/${s.recommendation_id}">recommendation ${s.recommendation_id}</a>`;
        row.dataset.state = s.state;
        if (ACTIVE_STUDY.has(s.state)) setTimeout(() => pollStudy(entry), 2000);
      } catch (e) {
        setTimeout(() => pollStudy(entry), 10000);
      }
    }
    async function pollJob(id) {
      try {
        const job = await getJSON(`/v1/jobs/${id}`);
        if (job.study_id || !["queued", "running"].includes(job.state)) { window.location.reload(); return; }
      } catch (e) { /* the service restarts: try again later */ }
      setTimeout(() => pollJob(id), 3000);
    }
    live.forEach((entry) => setTimeout(() => pollStudy(entry), 2000));
    waiting.forEach((id) => setTimeout(() => pollJob(id), 3000));
  }

  // --- the trial page ----------------------------------------------------------------------------
  function bytesTraces(volume, levels) {
    const names = [...levels.filter((l) => volume[l]), ...Object.keys(volume).filter((l) => !levels.includes(l))];
    const kinds = [];
    names.forEach((l) => Object.keys(volume[l] || {}).forEach((k) => { if (!kinds.includes(k)) kinds.push(k); }));
    const total = names.reduce((a, l) => a + Object.values(volume[l]).reduce((x, y) => x + (isNum(y) ? y : 0), 0), 0);
    const unit = total >= GiB ? [GiB, "GiB"] : [MiB, "MiB"];
    const traces = names.map((l, i) => ({type: "bar", name: l, x: kinds, y: kinds.map((k) => (isNum(volume[l][k]) ? volume[l][k] / unit[0] : 0)),
      marker: {color: levelColor(levels.indexOf(l) >= 0 ? levels.indexOf(l) : i, Math.max(levels.length, names.length))},
      hovertemplate: `${esc(l)}: %{x} %{y:.4g} ${unit[1]}<extra></extra>`}));
    return {traces, names, total, unit};
  }

  function trialPage() {
    const t = DATA.trial, levels = DATA.levels || [], limit = DATA.device_memory_gib;
    const m = t.metrics || {}, pred = t.prediction || {};
    const measured = m.status === "ok";
    // health
    const health = m.health;
    $("#health").innerHTML = measured && health
      ? `<p>${badge(health.verdict === "ok" ? "healthy" : "unhealthy")} verdict <strong>${esc(health.verdict)}</strong></p>` +
        (health.evidence ? `<p class="muted">${esc(health.evidence)}</p>` : "")
      : `<p class="muted">${t.status === "failed" ? "The run failed: " + esc(t.reason || "no reason recorded") :
        "A cost-model prediction: no training ran, so there is no health verdict (measured trials have one)."}</p>`;
    // bytes
    const volume = (measured ? m.bytes_per_level : null) || pred.bytes_per_level || m.bytes_per_level;
    if (volume && Object.keys(volume).length) {
      const {traces, names, total, unit} = bytesTraces(volume, levels);
      const outer = levels.length > 1 ? levels[levels.length - 1] : null;
      const inter = outer && volume[outer] ? Object.values(volume[outer]).reduce((a, b) => a + (isNum(b) ? b : 0), 0) : 0;
      const title = outer ? `${outer}: ${fmt(inter / unit[0], 4)} of ${fmt(total / unit[0], 4)} ${unit[1]} per step (${fmt(total ? 100 * inter / total : 0, 3)}%)` : "";
      draw("chart-bytes", traces, layout({barmode: "stack", xaxis: axis("collective"), yaxis: axis(`${unit[1]} sent per rank per step`),
        annotations: outer ? [{xref: "paper", yref: "paper", x: 1, y: 1.12, xanchor: "right", showarrow: false, text: title}] : [],
        legend: {orientation: "h", x: 0, y: 1.12, traceorder: "normal"}}));
      $("#chart-bytes").dataset.levels = names.join(",");
    } else {
      empty("chart-bytes", "No bytes recorded for this trial (it did not get far enough to be predicted or run).");
    }
    // memory
    const rows = [];
    if (measured && m.memory_bytes) rows.push(["measured", m.memory_bytes]);
    if (pred.memory_bytes) rows.push(["predicted", pred.memory_bytes]);
    else if (!measured && m.memory_bytes) rows.push(["predicted", m.memory_bytes]);
    if (rows.length) {
      const cats = CATEGORIES.filter((c) => rows.some(([, mem]) => isNum(mem[c]) && mem[c] > 0));
      const sum = (mem) => cats.reduce((a, c) => a + (isNum(mem[c]) ? mem[c] : 0), 0);
      const scale = memoryScale(Math.max(...rows.map(([, mem]) => Math.max(sum(mem), isNum(mem.peak) ? mem.peak : 0))), limit);
      const [div, unit] = scale.unit;
      const traces = cats.map((c) => ({type: "bar", orientation: "h", name: c, y: rows.map((r) => r[0]),
        x: rows.map(([, mem]) => (isNum(mem[c]) ? mem[c] / div : 0)), marker: {color: CATEGORY_COLORS[c]},
        hovertemplate: `${c}: %{x:.4g} ${unit}<extra>%{y}</extra>`}));
      traces.push({type: "scatter", mode: "markers", name: "peak", y: rows.map((r) => r[0]),
        x: rows.map(([, mem]) => (isNum(mem.peak) ? mem.peak / div : null)), marker: {symbol: "diamond", size: 12, color: "#000"},
        hovertemplate: `peak %{x:.4g} ${unit}<extra>%{y}</extra>`});
      draw("chart-memory", traces, layout(Object.assign({barmode: "stack", height: 340, margin: {l: 80, r: 20, t: 70, b: 40},
        legend: {orientation: "h", x: 0, y: 1.02, yanchor: "bottom"}, xaxis: axis(`${unit} per rank` +
          (scale.note ? `<br><span style="color:#d62728">${scale.note}</span>` : ""), {range: scale.range}),
        yaxis: {automargin: true}}, scale.extra)));
    } else {
      empty("chart-memory", "No memory figures for this trial.");
    }
    // curves
    const loss = Array.isArray(m.loss) ? m.loss : [], gn = Array.isArray(m.grad_norm) ? m.grad_norm : [];
    if (measured && (loss.length || gn.length)) {
      const steps = (n) => Array.from({length: n}, (_, i) => i + 1);
      draw("chart-curves", [
        {type: "scatter", mode: "lines+markers", name: "loss", x: steps(loss.length), y: loss, line: {color: "#1f77b4"}},
        {type: "scatter", mode: "lines+markers", name: "grad norm", x: steps(gn.length), y: gn, yaxis: "y2", line: {color: "#ff7f0e", dash: "dot"}},
      ], layout({xaxis: axis("step"), yaxis: axis("loss"), yaxis2: axis("grad norm", {overlaying: "y", side: "right", showgrid: false})}));
    } else if (measured || t.status === "failed") {
      empty("chart-curves", "The run recorded no step: no loss or grad-norm curve.");
    } else {
      empty("chart-curves", "A cost-model prediction: no training ran, so there are no loss or grad-norm curves. " +
        "Measured trials (executor local or slurm, or an uploaded run.json) show them here with the health verdict.");
    }
    if (!TERMINAL.has(t.status)) {
      const poll = () => getJSON(`/v1/trials/${t.id}`).then((fresh) => {
        if (TERMINAL.has(fresh.status)) window.location.reload(); else setTimeout(poll, 2000);
      }).catch(() => setTimeout(poll, 5000));
      setTimeout(poll, 2000);
    }
  }

  // --- the compare page --------------------------------------------------------------------------
  function comparePage() {
    const items = DATA.trials || [];
    if (items.length < 2) return;
    const labels = items.map((it) => it.label);
    const src = (t) => (t.metrics && t.metrics.status === "ok" ? t.metrics : t.prediction || t.metrics || {});
    draw("chart-tflops", [{type: "bar", name: "TFLOPS per rank", x: labels,
      y: items.map((it) => (isNum(it.trial.value) ? it.trial.value : isNum(src(it.trial).tflops_per_rank) ? src(it.trial).tflops_per_rank : null)),
      marker: {color: items.map((it) => (it.trial.status === "complete" ? "#1f77b4" : "#bbb"))},
      hovertemplate: "%{x}: %{y:.4g} TFLOPS/rank<extra></extra>"}],
    layout({xaxis: axis(""), yaxis: axis("TFLOPS per rank", {rangemode: "tozero"})}));
    const levels = [];
    items.forEach((it) => it.levels.forEach((l) => { if (!levels.includes(l)) levels.push(l); }));
    const perLevel = (t, l) => Object.values((src(t).bytes_per_level || {})[l] || {}).reduce((a, b) => a + (isNum(b) ? b : 0), 0);
    const used = levels.filter((l) => items.some((it) => perLevel(it.trial, l) > 0));
    const outermost = new Set(items.map((it) => it.levels[it.levels.length - 1]));
    draw("chart-bytes", used.map((l, i) => ({type: "bar", name: l, x: labels, y: items.map((it) => perLevel(it.trial, l) / MiB),
      marker: {color: outermost.has(l) && levels.length > 1 ? "#d62728" : INNER_COLORS[i % INNER_COLORS.length]}, hovertemplate: `${esc(l)}: %{y:.4g} MiB<extra>%{x}</extra>`})),
    layout({barmode: "stack", xaxis: axis(""), yaxis: axis("MiB sent per rank per step"), legend: {orientation: "h", x: 0, y: 1.12, traceorder: "normal"}}));
    const cats = CATEGORIES.filter((c) => items.some((it) => isNum((src(it.trial).memory_bytes || {})[c]) && src(it.trial).memory_bytes[c] > 0));
    const totals = items.map((it) => cats.reduce((a, c) => a + ((src(it.trial).memory_bytes || {})[c] || 0), 0));
    const scale = memoryScale(Math.max(...totals), DATA.device_memory_gib, false);
    const [div, unit] = scale.unit;
    draw("chart-memory", cats.map((c) => ({type: "bar", name: c, x: labels,
      y: items.map((it) => ((src(it.trial).memory_bytes || {})[c] || 0) / div), marker: {color: CATEGORY_COLORS[c]},
      hovertemplate: `${c}: %{y:.4g} ${unit}<extra>%{x}</extra>`})),
    layout(Object.assign({barmode: "stack", xaxis: axis(scale.note ? `<span style="color:#d62728">${scale.note}</span>` : ""),
      yaxis: axis(`${unit} per rank`, {range: scale.range})}, scale.extra)));
  }

  // --- the recommendation page -------------------------------------------------------------------
  function recommendationPage() {
    document.querySelectorAll("button.copy").forEach((button) => button.addEventListener("click", async () => {
      const text = document.getElementById(button.dataset.target).textContent;
      let ok = false;
      try { await navigator.clipboard.writeText(text); ok = true; } catch (e) {
        const area = document.createElement("textarea");  // no clipboard API (plain http): the old way
        area.value = text; document.body.appendChild(area); area.select();
        try { ok = document.execCommand("copy"); } catch (e2) { ok = false; }
        area.remove();
      }
      button.textContent = ok ? "Copied" : "Select the text and copy it";
      setTimeout(() => { button.textContent = "Copy"; }, 2000);
    }));
    const v = DATA.verification;
    if (v && Array.isArray(v.loss) && v.loss.length) {  // the proxy run that verified (or disqualified) the pick
      const steps = v.loss.map((_, i) => i + 1);
      const traces = [{type: "scatter", mode: "lines+markers", name: "loss", x: steps, y: v.loss, marker: {size: 5}}];
      const floor = v.data && isNum(v.data.loss_floor) ? v.data.loss_floor : null;
      if (floor !== null) traces.push({type: "scatter", mode: "lines", name: "loss floor of the data", x: [1, steps.length],
        y: [floor, floor], line: {dash: "dot", color: "#6a737d"}});
      draw("chart-verification-loss", traces, layout({height: 300, xaxis: axis("step", {dtick: 1}), yaxis: axis("loss (nats)"),
        legend: {orientation: "h", y: -0.25}}));
    }
  }

  const PAGES = {study: studyPage, studies: studiesPage, trial: trialPage, compare: comparePage, recommendation: recommendationPage};
  if (PAGES[PAGE]) PAGES[PAGE]();
})();
