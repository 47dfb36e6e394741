"use strict";
(function () {
  const data = JSON.parse(document.getElementById("llmtrace-data").textContent);
  const NS = "http://www.w3.org/2000/svg";
  const COLORS = { "llm.schedule": "var(--sched)", "llm.postprocess": "var(--post)", "llm.sample": "var(--sample)",
    schedule: "var(--sched)", postprocess: "var(--post)", sample: "var(--sample)", gc: "var(--gc)",
    tokenize: "var(--tok)", other: "var(--other)" };

  function el(tag, attrs, parent, text) {
    const e = document.createElementNS(NS, tag);
    for (const k in attrs) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    if (parent) parent.appendChild(e);
    return e;
  }
  function h(tag, attrs, parent, text) {
    const e = document.createElement(tag);
    for (const k in attrs) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    if (parent) parent.appendChild(e);
    return e;
  }
  function fmtS(x) {
    if (x === null || x === undefined || isNaN(x)) return "-";
    const a = Math.abs(x);
    if (a === 0) return "0";
    if (a < 1e-3) return (x * 1e6).toFixed(0) + " µs";
    if (a < 1) return (x * 1e3).toPrecision(3) + " ms";
    return x.toPrecision(3) + " s";
  }
  function pct(x) { return x === null || x === undefined ? "-" : (x * 100).toFixed(1) + "%"; }
  function hash(s) { let v = 7; for (let i = 0; i < s.length; i++) v = (v * 31 + s.charCodeAt(i)) >>> 0; return v; }
  function tip(node, text) { el("title", {}, node, text); return node; }
  function empty(container, text) { h("p", { class: "empty" }, container, text); }
  function niceTicks(max, n) {
    if (!(max > 0)) return [0];
    const raw = max / n, mag = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 5, 10].map(m => m * mag).find(s => s >= raw);
    const out = [];
    for (let v = 0; v <= max + 1e-12; v += step) out.push(v);
    return out;
  }

  function cards() {
    const c = document.getElementById("summary-cards");
    const r = data.requests, idle = Object.values(data.gpu_idle);
    const items = [
      ["requests", r.count.toLocaleString()],
      ["TTFT p50 / p99", fmtS(r.ttft_s.p50) + " / " + fmtS(r.ttft_s.p99)],
      ["E2E p50 / p99", fmtS(r.e2e_s.p50) + " / " + fmtS(r.e2e_s.p99)],
      ["throughput", r.throughput_rps.toFixed(1) + " req/s"],
      ["GPU idle", idle.length ? idle.map(e => pct(e.ratio)).join(", ") : "n/a"],
      ["bottleneck", data.bottleneck["class"]],
    ];
    for (const [k, v] of items) {
      const d = h("div", { class: "card" }, c);
      h("div", { class: "k" }, d, k);
      h("div", { class: "v" }, d, v);
    }
  }

  function bottleneck() {
    const c = document.getElementById("bottleneck");
    const b = data.bottleneck;
    const v = h("div", { class: "verdict" }, c);
    h("span", { class: "cls" }, v, b["class"]);
    h("span", {}, v, " — score " + b.score.toFixed(2) + ". " + b.recommendation);
    const t = h("table", {}, c);
    const hr = h("tr", {}, t);
    h("th", {}, hr, "evidence");
    h("th", { class: "num" }, hr, "value");
    for (const k in b.evidence) {
      const tr = h("tr", {}, t);
      h("td", {}, tr, k);
      h("td", { class: "num" }, tr, String(b.evidence[k]));
    }
    const wc = b.window_classes || {};
    if (Object.keys(wc).length) {
      h("p", {}, c, "Per engine window: " + Object.entries(wc).map(([k, n]) => k + " " + n).join(", "));
    }
  }

  function timeline() {
    const c = document.getElementById("timeline");
    const tl = data.views && data.views.timeline;
    if (!tl || !tl.steps || !tl.steps.length) { empty(c, "No engine timeline in these traces."); return; }
    const W = 1320, left = 90, right = 10, rowH = 22, rows = ["steps", "forward", "host", "gc", "idle"];
    const H = rows.length * (rowH + 6) + 40;
    const s = el("svg", { id: "timeline-svg", width: W, height: H, viewBox: "0 0 " + W + " " + H }, c);
    const span = Math.max(tl.duration_us, 1), x = us => left + (us / span) * (W - left - right);
    const y = i => 8 + i * (rowH + 6);
    rows.forEach((r, i) => el("text", { x: 4, y: y(i) + 15 }, s, r));
    const ticks = niceTicks(span / 1000, 10);
    const axis = el("g", { class: "axis" }, s);
    for (const t of ticks) {
      const xx = x(t * 1000);
      el("line", { x1: xx, x2: xx, y1: 4, y2: H - 28, class: "grid" }, axis);
      el("text", { x: xx, y: H - 12, "text-anchor": "middle" }, axis, t.toFixed(t < 10 ? 1 : 0) + " ms");
    }
    for (const g of tl.gaps) {
      tip(el("rect", { x: x(g[0]), y: y(4), width: Math.max(0.5, x(g[1]) - x(g[0])), height: rowH,
        fill: g[3] ? "var(--idle-work)" : "var(--idle-none)", class: "gap" }, s),
        "idle " + fmtS((g[1] - g[0]) / 1e6) + " — " + g[2] + (g[3] ? ", work waiting" : ", nothing to do"));
      el("rect", { x: x(g[0]), y: y(1), width: Math.max(0.5, x(g[1]) - x(g[0])), height: rowH,
        fill: g[3] ? "var(--idle-work)" : "var(--idle-none)", opacity: 0.25 }, s);
    }
    tl.steps.forEach((st, i) => {
      const r = el("rect", { x: x(st[0]), y: y(0), width: Math.max(0.5, x(st[1]) - x(st[0])), height: rowH,
        fill: i % 2 ? "#cfd8e3" : "#e3e9f1", stroke: "#fff", class: "step" }, s);
      tip(r, "step " + st[2] + " · batch " + st[3] + " · " + fmtS((st[1] - st[0]) / 1e6));
    });
    for (const f of tl.forwards) {
      tip(el("rect", { x: x(f[0]), y: y(1), width: Math.max(0.5, x(f[1]) - x(f[0])), height: rowH,
        fill: "var(--fwd)", class: "forward" }, s), "forward " + fmtS((f[1] - f[0]) / 1e6));
    }
    for (const hs of tl.host) {
      tip(el("rect", { x: x(hs[0]), y: y(2), width: Math.max(0.5, x(hs[1]) - x(hs[0])), height: rowH,
        fill: COLORS[hs[2]] || "var(--other)" }, s), hs[2] + " " + fmtS((hs[1] - hs[0]) / 1e6));
    }
    for (const g of tl.gc) {
      tip(el("rect", { x: x(g[0]), y: y(3), width: Math.max(1, x(g[1]) - x(g[0])), height: rowH,
        fill: "var(--gc)" }, s), "gc pause " + fmtS((g[1] - g[0]) / 1e6));
    }
    const cap = document.getElementById("timeline-caption");
    cap.textContent = "Engine " + tl.engine_id + ": " + tl.steps.length + " steps from step " + tl.steps[0][2] +
      " (around its longest idle-with-work gap), " + fmtS(span / 1e6) + " shown.";
  }

  function gpuIdle() {
    const c = document.getElementById("gpu-idle");
    const engines = Object.entries(data.gpu_idle);
    if (!engines.length) { empty(c, "No llm.step / llm.forward spans: GPU idle needs the engine timeline."); return; }
    const t = h("table", {}, c);
    const head = ["engine", "idle", "idle time", "sampled", "gaps", "with work waiting", "of it upstream",
      "nothing to do", "host was in"];
    const hr = h("tr", {}, t);
    head.forEach((k, i) => h("th", i && i < 8 ? { class: "num" } : {}, hr, k));
    for (const [id, e] of engines) {
      const tr = h("tr", {}, t);
      const causes = Object.entries(e.by_cause_s).filter(kv => kv[1] > 0).sort((a, b) => b[1] - a[1])
        .map(([k, v]) => k + " " + pct(v / (e.total_s || 1))).join(", ");
      // upstream_s: the engine held no request (work in the front end); absent in older summaries.
      const upstream = e.upstream_s === undefined ? "–" : fmtS(e.upstream_s);
      [id, pct(e.ratio), fmtS(e.total_s), fmtS(e.covered_s), e.gaps.toLocaleString(), fmtS(e.with_work_waiting_s),
        upstream, fmtS(e.nothing_to_do_s), causes].forEach((v, i) => h("td", i && i < 8 ? { class: "num" } : {}, tr, v));
    }
  }

  function breakdown() {
    const c = document.getElementById("breakdown");
    const phases = Object.entries(data.breakdown).filter(([, d]) => d.p99_s > 0 || d.share > 0);
    if (!phases.length) { empty(c, "No request phases in these traces."); return; }
    const W = 900, left = 110, rowH = 16, group = 3 * rowH + 14, H = phases.length * group + 30;
    const s = el("svg", { id: "breakdown-svg", width: W, height: H }, c);
    const max = Math.max(...phases.map(([, d]) => d.p99_s), 1e-9);
    const x = v => left + (v / max) * (W - left - 240);
    const qs = [["p50_s", "#9db7ef"], ["p90_s", "#5b88e0"], ["p99_s", "#2a57b8"]];
    phases.forEach(([name, d], i) => {
      const y0 = 6 + i * group;
      el("text", { x: 4, y: y0 + 2 * rowH }, s, name);
      qs.forEach(([q, col], j) => {
        const r = el("rect", { x: left, y: y0 + j * rowH, width: Math.max(1, x(d[q]) - left), height: rowH - 3,
          fill: col, class: "bar" }, s);
        tip(r, name + " " + q.replace("_s", "") + " " + fmtS(d[q]));
        el("text", { x: x(d[q]) + 4, y: y0 + j * rowH + 11 }, s, q.replace("_s", "") + " " + fmtS(d[q]));
      });
      el("text", { x: W - 4, y: y0 + 2 * rowH, "text-anchor": "end" }, s, pct(d.share) + " of latency");
    });
  }

  // One scatter plot: pts are [x, y, highlighted?]; fmtX/fmtY label the ticks and tooltips.
  function scatterPlot(c, id, pts, xLabel, yLabel, fmtX, xmax) {
    const W = 640, H = 320, l = 60, b = 36, t = 10, r = 10;
    const s = el("svg", { id: id + "-svg", width: W, height: H }, c);
    const ymax = Math.max(...pts.map(p => p[1]));
    const x = v => l + (v / xmax) * (W - l - r), y = v => H - b - (v / ymax) * (H - b - t);
    const axis = el("g", { class: "axis" }, s);
    for (const v of niceTicks(xmax, 6)) {
      el("line", { x1: x(v), x2: x(v), y1: t, y2: H - b, class: "grid" }, axis);
      el("text", { x: x(v), y: H - b + 14, "text-anchor": "middle" }, axis, fmtX(v));
    }
    for (const v of niceTicks(ymax, 5)) {
      el("line", { x1: l, x2: W - r, y1: y(v), y2: y(v), class: "grid" }, axis);
      el("text", { x: l - 4, y: y(v) + 4, "text-anchor": "end" }, axis, fmtS(v));
    }
    el("text", { x: (W + l) / 2, y: H - 4, "text-anchor": "middle" }, s, xLabel);
    el("text", { x: 12, y: t + 10 }, s, yLabel);
    for (const p of pts) {
      tip(el("circle", { cx: x(p[0]), cy: y(p[1]), r: p[2] ? 3.5 : 2.2,
        fill: p[2] ? "var(--idle-work)" : "var(--fwd)", opacity: p[2] ? 0.95 : 0.55, class: "pt" }, s),
        fmtX(p[0]) + " → " + fmtS(p[1]));
    }
  }

  function scatter(id, idx, label) {
    const c = document.getElementById(id);
    const pts = ((data.views && data.views.scatter) || []).filter(p => p[idx] !== null && p[0] > 0)
      .map(p => [p[0], p[idx], p[3]]);
    if (!pts.length) { empty(c, "No requests with input length and " + label + "."); return; }
    scatterPlot(c, id, pts, "input tokens", label, v => String(Math.round(v)), Math.max(...pts.map(p => p[0])));
  }

  function prefixCache() {
    const c = document.getElementById("prefix-cache");
    const pc = data.prefix_cache;
    const pts = ((data.views && data.views.ttft_vs_cached) || []).map(p => [p[0], p[1], false]);
    if (!pc || !pts.length) {
      empty(c, "No prompt provenance in these traces (llm.prompt_tokens.* on llm.request: vLLM and the " +
        "reference server report it).");
      return;
    }
    h("p", { class: "sub" }, c, "Prefix-cache hit ratio " + pct(pc.hit_ratio) + " of prompt tokens over " +
      pc.requests + " requests; TTFT p50 " + fmtS(pc.ttft_p50_s.hit) + " for hits, " +
      fmtS(pc.ttft_p50_s.miss) + " for misses.");
    scatterPlot(c, "scatter-cached", pts, "share of the prompt served from the prefix cache",
      "time to first token", v => pct(v), 1);
  }

  function flame() {
    const c = document.getElementById("flame");
    const stacks = data.critical_path_stacks || [];
    if (!stacks.length) { empty(c, "No critical paths (no llm.request spans)."); return; }
    const root = { name: "all requests", value: 0, self: 0, kids: {} };
    for (const [path, v] of stacks) {
      let node = root;
      root.value += v;
      for (const part of path.split(";")) {
        node.kids[part] = node.kids[part] || { name: part, value: 0, self: 0, kids: {} };
        node = node.kids[part];
        node.value += v;
      }
      node.self += v;
    }
    let depth = 0;
    (function d(n, k) { depth = Math.max(depth, k); Object.values(n.kids).forEach(ch => d(ch, k + 1)); })(root, 0);
    const W = 1320, rowH = 22, H = (depth + 1) * (rowH + 2) + 4;
    const s = el("svg", { id: "flame-svg", width: W, height: H }, c);
    const palette = ["#f4a261", "#e76f51", "#e9c46a", "#2a9d8f", "#8ab17d", "#b56576", "#6d597a"];
    (function draw(n, x0, width, k) {
      const g = el("g", { class: "frame" }, s);
      tip(el("rect", { x: x0, y: k * (rowH + 2), width: Math.max(0.5, width - 1), height: rowH,
        fill: k ? palette[hash(n.name) % palette.length] : "#98a2b3", rx: 2 }, g),
        n.name + ": " + fmtS(n.value) + " on the critical path (" + pct(n.value / root.value) + "), own " + fmtS(n.self));
      if (width > 60) {
        el("text", { x: x0 + 4, y: k * (rowH + 2) + 15 }, g,
          n.name.slice(0, Math.floor(width / 7)) + " " + pct(n.value / root.value));
      }
      let cx = x0;
      for (const ch of Object.values(n.kids).sort((a, b) => b.value - a.value)) {
        const w = (ch.value / n.value) * width;
        draw(ch, cx, w, k + 1);
        cx += w;
      }
    })(root, 0, W, 0);
  }

  function criticalTable() {
    const c = document.getElementById("critical-path");
    const rows = Object.entries(data.critical_path);
    if (!rows.length) { empty(c, "No requests."); return; }
    const t = h("table", {}, c);
    const hr = h("tr", {}, t);
    ["span", "share", "p50", "p95", "p99", "requests"].forEach((k, i) => h("th", i ? { class: "num" } : {}, hr, k));
    for (const [name, d] of rows) {
      const tr = h("tr", {}, t);
      [name, pct(d.share), fmtS(d.p50_s), fmtS(d.p95_s), fmtS(d.p99_s), String(d.requests)]
        .forEach((v, i) => h("td", i ? { class: "num" } : {}, tr, v));
    }
  }

  function anomalies() {
    const c = document.getElementById("anomalies");
    if (!data.anomalies.length) { empty(c, "No anomalies (robust z > 3.5 within input-length buckets)."); return; }
    const t = h("table", {}, c);
    const hr = h("tr", {}, t);
    ["request", "metric", "value", "bucket median", "z", "input tokens", "mostly in", "trace"]
      .forEach(k => h("th", {}, hr, k));
    for (const a of data.anomalies.slice(0, 25)) {
      const tr = h("tr", {}, t);
      [a.request_id, a.metric, fmtS(a.value), fmtS(a.median), a.z.toFixed(1), String(a.input_tokens),
        a.dominant_segment + " " + fmtS(a.dominant_s), a.trace_id].forEach(v => h("td", {}, tr, v));
    }
  }

  function warnings() {
    const c = document.getElementById("warnings");
    for (const w of data.source.warnings) h("p", { class: "warn" }, c, "⚠ " + w);
  }

  cards(); bottleneck(); timeline(); gpuIdle(); breakdown();
  scatter("scatter-ttft", 1, "time to first token"); scatter("scatter-e2e", 2, "end-to-end latency");
  prefixCache();
  flame(); criticalTable(); anomalies(); warnings();
  document.body.setAttribute("data-rendered", "1");
})();
