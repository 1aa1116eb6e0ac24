// tokenweir live dashboard: polls GET /api/v1/overview (docs/api.md) and draws tables and
// canvas charts. Plain JS, no library, nothing loaded from elsewhere.
"use strict";

const API = "/api/v1/overview?tenants=50&points=3600";  // the whole history on first open
const POLL_MS = 1000;
const HISTORY_S = 900;  // the charts keep 15 minutes, as the control plane does
let history = [];  // chart points, oldest first; later polls ask only for newer ones

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v; else e.setAttribute(k, v);
  }
  for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return e;
}

function fmt(x, digits) {
  if (x === null || x === undefined) return "–";
  if (typeof x !== "number") return String(x);
  if (digits !== undefined) return x.toFixed(digits);
  return Math.abs(x) >= 1000 ? Math.round(x).toLocaleString("en") : String(Math.round(x * 1000) / 1000);
}

function pct(x) { return x === null || x === undefined ? "–" : (100 * x).toFixed(0) + "%"; }

function fill(tableId, rows) {
  const body = document.querySelector(`#${tableId} tbody`);
  body.replaceChildren(...rows);
}

function renderPools(pools) {
  const rows = [];
  for (const [name, pool] of Object.entries((pools && pools.pools) || {})) {
    for (const [ep, r] of Object.entries(pool.endpoints || {})) {
      const health = !r.ok ? "down" : r.stale ? "stale" : r.deg ? "degraded" : "ok";
      rows.push(el("tr", { "data-pool": name, "data-endpoint": ep },
        el("td", {}, name), el("td", {}, ep),
        el("td", { class: health === "ok" ? "ok" : "bad" }, health),
        el("td", { class: "saturation" }, pct(r.s)), el("td", { class: "running" }, r.run),
        el("td", { class: "queued" }, r.q), el("td", {}, pct(r.kv)),
        el("td", { class: "cache-hit" }, pct(r.hit)), el("td", {}, fmt(r.tput))));
    }
  }
  fill("replicas", rows);
}

function renderPoolStatus(pools) {
  const rate = (p, k) => (p.per_s ? fmt(p.per_s[k], 1) : "–");
  fill("pool-status", pools.map((p) => {
    const errors = p.per_s ? p.per_s["429"] + p.per_s["503"] + p.per_s["5xx"] + p.per_s["4xx"] : 0;
    return el("tr", { "data-pool": p.pool },
      el("td", {}, p.pool),
      el("td", { class: p.ladder_step ? "ladder bad" : "ladder" },
        p.ladder_steps ? `${fmt(p.ladder_step)} of ${p.ladder_steps}` : "no ladder"),
      el("td", { class: "capacity" }, p.admission_capacity === null ? "–" : fmt(p.admission_capacity)),
      el("td", { class: "in-flight" }, fmt(p.in_flight)), el("td", { class: "queued" }, fmt(p.queued)),
      el("td", { class: "rps" }, rate(p, "requests")), el("td", { class: "r2xx" }, rate(p, "2xx")),
      el("td", { class: "r429" }, rate(p, "429")), el("td", { class: "r503" }, rate(p, "503")),
      el("td", { class: "r5xx" }, rate(p, "5xx")), el("td", { class: "r4xx" }, rate(p, "4xx")),
      el("td", { class: errors > 0 ? "bad" : "muted" }, p.per_s && p.per_s.requests
        ? pct(errors / p.per_s.requests) : "–"));
  }));
}

function renderLanes(lanes, rejections, decisions) {
  const rows = lanes.map((l) => el("tr", { "data-lane": `${l.pool}/${l.lane}` },
    el("td", {}, l.pool), el("td", {}, l.lane), el("td", { class: "admitted" }, fmt(l.admitted)),
    el("td", {}, fmt(l.queued)), el("td", { class: "shed" }, fmt(l.shed)),
    el("td", { class: "shed-ladder" }, fmt(l.shed_by_ladder))));
  if (!rows.length) {
    const td = el("td", { colspan: "6", class: "muted" }, "no admission plugin on any route");
    rows.push(el("tr", {}, td));
  }
  fill("lanes", rows);
  const list = (o) => Object.entries(o || {}).map(([k, v]) => `${k} ${fmt(v)}`).join(", ");
  document.getElementById("rejections").textContent =
    `filter rejections: ${list(rejections) || "none"} · rate-limit decisions: ${list(decisions) || "none"}`;
}

function renderEnvoys(envoys) {
  const rows = [];
  for (const n of envoys) {
    for (const [type, t] of Object.entries(n.types)) {
      const nack = t.nack
        ? el("span", { class: t.nack.current ? "bad" : "muted", title: t.nack.error },
          `${t.nack.version} (${fmt(t.nack.age_s, 0)}s ago)${t.nack.current ? " refusing" : ""}`)
        : "–";
      rows.push(el("tr", { "data-node": n.node },
        el("td", {}, `${n.node} (${n.mode})`), el("td", {}, type),
        el("td", { class: "acked" }, t.acked_version || "–"), el("td", {}, t.pending_version || "–"),
        el("td", {}, nack)));
    }
  }
  fill("envoys", rows);
}

function bar(share) {
  const b = el("div", { class: share > 0.9 ? "bar hot" : "bar" });
  const inner = el("i", {});
  inner.style.width = (100 * Math.min(1, share)).toFixed(1) + "%";
  b.append(inner);
  return b;
}

const UNIT = { tokens: "tokens", requests: "requests", usd: "USD" };

function bindingText(w) {  // "1,940 of 2,000 tokens (bucket, full in 97 s)"
  if (!w) return "none";
  const amount = (x) => (w.quota === "usd" ? `$${fmt(x, 2)}` : fmt(x));
  const unit = w.quota === "usd" ? "" : ` ${UNIT[w.quota] || w.quota}`;
  const reset = w.resets_in_s === null || w.resets_in_s === undefined ? ""
    : `, ${w.window === "bucket" ? "full" : "resets"} in ${fmt(w.resets_in_s, 0)} s`;
  return `${amount(w.used)} of ${amount(w.limit)}${unit} (${w.window}${reset})`;
}

function renderTenants(tenants, count) {
  fill("tenants", tenants.map((t) => {
    const b = t.budget;
    const used = b ? b.used : null;
    const w = t.binding;  // the limit closest to refusing now (null: Redis not read)
    return el("tr", { "data-tenant": t.tenant },
      el("td", {}, t.tenant), el("td", {}, t.tier || "–"),
      el("td", { class: "binding" }, w ? bindingText(w) : (b ? `${fmt(b.limit)} ${b.window}` : "none")),
      el("td", { class: "binding-use" }, w ? pct(w.use) : "–"),
      el("td", {}, bar(w ? w.use : 0)),
      el("td", { class: "recent-429", title: t.recent_s ? `over the last ${fmt(t.recent_s, 0)} s` : "" },
        t.recent_429 === null || t.recent_429 === undefined ? "–" : fmt(t.recent_429)),
      el("td", { class: "tokens", title: b ? `${fmt(b.limit)} ${b.window}` : "" },
        used === null ? "–" : fmt(used)),
      el("td", { class: "budget" }, b ? `${fmt(b.limit)} ${b.window}` : "none"),
      el("td", { class: "since-start" }, fmt(t.since_start.tokens)),
      el("td", { class: "rejections" }, fmt(t.rejections)),
      el("td", {}, t.retry_after_mean_s === null ? "–" : `${fmt(t.retry_after_mean_s, 1)} s`));
  }));
  document.getElementById("tenant-count").textContent = `(${count} in the policy)`;
}

function drawChart(id, series, keys, colors) {
  const canvas = document.getElementById(id);
  const ctx = canvas.getContext("2d");
  const w = canvas.width, h = canvas.height, left = 44, bottom = 16;
  ctx.clearRect(0, 0, w, h);
  let max = 0;
  for (const p of series) for (const k of keys) if (p[k] !== null && p[k] > max) max = p[k];
  max = max > 0 ? max * 1.1 : 1;
  ctx.strokeStyle = "#ddd"; ctx.fillStyle = "#666"; ctx.font = "10px sans-serif";
  for (let i = 0; i <= 4; i++) {
    const y = (h - bottom) * (1 - i / 4);
    ctx.beginPath(); ctx.moveTo(left, y); ctx.lineTo(w, y); ctx.stroke();
    const digits = max < 0.01 ? 4 : max < 0.1 ? 3 : max < 10 ? 2 : 0;
    ctx.fillText(fmt(max * i / 4, digits), 2, Math.max(10, y + 3));
  }
  if (series.length < 2) return;
  const t0 = series[0].t, span = Math.max(1, series[series.length - 1].t - t0);
  ctx.fillText(`last ${Math.round(span)} s`, left, h - 3);
  keys.forEach((k, i) => {
    ctx.strokeStyle = colors[i]; ctx.lineWidth = 1.5; ctx.beginPath();
    let pen = false;
    for (const p of series) {
      if (p[k] === null) { pen = false; continue; }
      const x = left + (w - left) * (p.t - t0) / span;
      const y = (h - bottom) * (1 - p[k] / max);
      if (pen) ctx.lineTo(x, y); else ctx.moveTo(x, y);
      pen = true;
    }
    ctx.stroke();
  });
}

function renderCharts(series) {
  const c = ["#1f77b4", "#d62728"];
  drawChart("chart-rps", series, ["answers_per_s", "errors_per_s"], c);
  drawChart("chart-ttft", series, ["ttft_p50_s", "ttft_p95_s"], c);
  drawChart("chart-tbt", series, ["tbt_p50_s", "tbt_p95_s"], c);
  drawChart("chart-tps", series, ["completion_tokens_per_s", "prompt_tokens_per_s"], c);
}

function renderBatch(b, series) {  // null: the policy has no batch section
  document.getElementById("batch-panel").hidden = !b;
  document.getElementById("chart-batch-fig").hidden = !b;
  if (!b) return;
  drawChart("chart-batch", series, ["batch_lines_per_s"], ["#1f77b4"]);
  fill("batch", [el("tr", {},
    el("td", { class: "jobs" }, fmt(b.jobs_in_flight)), el("td", {}, fmt(b.jobs_running)),
    el("td", { class: "done" }, fmt(b.lines_completed)),
    el("td", { class: b.lines_failed ? "bad failed" : "failed" }, fmt(b.lines_failed)),
    el("td", { class: "rate" }, fmt(b.lines_per_s, 1)),
    el("td", {}, `${fmt(b.lines_in_flight)} / ${fmt(b.window)}`),
    el("td", { class: "left" }, fmt(b.lines_remaining)),
    el("td", { class: "lag" }, b.jobs_running ? `${fmt(b.lag_s, 0)} s` : "–"),
    el("td", { class: b.runners_seen < b.runners ? "bad runners" : "runners" },
      `${b.runners_seen} of ${b.runners}`))]);
}

function renderSources(sources, quotaSource, quotaError) {
  const box = document.getElementById("sources");
  const spans = sources.map((s) =>
    el("span", { class: s.ok ? "src" : "src bad", title: s.error || s.endpoint },
      `${s.name} ${s.ok ? "✓" : "✗"}`));
  if (quotaSource) {  // the tenants' budgets, read from the rate-limit service's Redis
    spans.push(el("span", { class: quotaError ? "src bad" : "src", title: quotaError || "budgets" },
      `quotas (${quotaSource}) ${quotaError ? "✗" : "✓"}`));
  }
  box.replaceChildren(...spans);
}

let updates = 0;

async function poll() {
  const status = document.getElementById("status");
  try {
    const last = history.length ? history[history.length - 1].t : null;
    const r = await fetch(last === null ? API : `${API}&since=${last}`, { cache: "no-store" });
    if (!r.ok) throw new Error(`HTTP ${r.status}`);
    const o = await r.json();
    history = history.concat(o.series).filter((p) => p.t > o.time - HISTORY_S);
    renderPools(o.pools);
    renderPoolStatus(o.pool_status);
    renderLanes(o.lanes, o.rejections, o.decisions);
    renderEnvoys(o.envoys);
    renderTenants(o.tenants, o.tenant_count);
    renderCharts(history);
    renderBatch(o.batch, history);
    renderSources(o.sources, o.quota_source, o.quota_error);
    updates += 1;
    status.textContent = `updated ${new Date(o.time * 1000).toLocaleTimeString()}`;
    status.dataset.updates = String(updates);
    status.dataset.points = String(history.length);
  } catch (err) {
    status.textContent = `control plane unreachable (${err.message}); retrying`;
  }
  setTimeout(poll, POLL_MS);
}

poll();
