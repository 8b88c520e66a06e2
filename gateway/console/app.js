// htfaas console: reads the gateway's HTTP API with the token the user pastes.
//
// Rules of this file (the gateway's Content-Security-Policy enforces the first two):
// - no inline script or style: behaviour is here, looks are in style.css;
// - nothing from another origin: every request goes to this gateway;
// - everything that comes from the API (paths, names, reasons) is inserted with textContent or
//   setAttribute, never parsed as HTML: an event's file path may carry markup.
"use strict";

const TOKEN_KEY = "htfaas.console.token";
const SVG_NS = "http://www.w3.org/2000/svg";
const JOBS_EVERY_MS = 5000;
const STATS_EVERY_MS = 2000;
const USAGE_EVERY_MS = 15000;
const FLOW_SAMPLES = 90;
const LINEAGE_QUERY_BUDGET = 40;

const state = {
  token: null,
  timers: [],
  generation: 0, // bumped on sign-out: answers of an older session are dropped
  stats: [], // [{t, received, fired, ignored, raw}]
  jobs: [], // the last answer of /v1/jobs, for the functions' last runs
  selectedJob: null,
};

// ---------- small helpers ----------

const $ = (id) => document.getElementById(id);

/** An element with text (never HTML) and attributes. */
function el(tag, text, attrs) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v !== undefined && v !== null) e.setAttribute(k, String(v));
  }
  return e;
}

/** An SVG element with attributes. */
function svg(tag, attrs, text) {
  const e = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
  if (text !== undefined) e.textContent = String(text);
  return e;
}

function clear(node) {
  while (node.firstChild) node.removeChild(node.firstChild);
}

function setStatus(id, text, isError) {
  const p = $(id);
  p.textContent = text || "";
  p.classList.toggle("error", Boolean(isError));
}

function fmtTime(ms) {
  if (ms === null || ms === undefined) return "";
  return new Date(ms).toISOString().replace("T", " ").slice(0, 19) + "Z";
}

function fmtNum(x) {
  if (!Number.isFinite(x)) return "0";
  if (x === 0) return "0";
  if (Math.abs(x) >= 1000) return x.toLocaleString("en", { maximumFractionDigits: 0 });
  if (Math.abs(x) >= 1) return x.toLocaleString("en", { maximumFractionDigits: 2 });
  return x.toPrecision(2);
}

function fmtBytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  let x = n;
  while (x >= 1024 && i < units.length - 1) {
    x /= 1024;
    i += 1;
  }
  return fmtNum(x) + " " + units[i];
}

// ---------- the API ----------

class ApiError extends Error {
  constructor(status, message, routeMissing) {
    super(message);
    this.status = status;
    this.routeMissing = routeMissing; // a 404 without the API's JSON error body: no such route
  }
}

/** GET `path` with the token; the parsed JSON, or an ApiError. */
async function api(path) {
  const generation = state.generation;
  let resp;
  try {
    resp = await fetch(path, {
      headers: { Authorization: "Bearer " + state.token, Accept: "application/json" },
      cache: "no-store",
      credentials: "omit",
    });
  } catch (e) {
    throw new ApiError(0, "the gateway did not answer (" + e.message + ")", false);
  }
  // Reading the body awaits too: check the session after it, so that a late answer to an
  // earlier token (a 401 still in flight at sign-in) neither shows nor stops the new session.
  const text = await resp.text().catch(() => "");
  if (generation !== state.generation) throw new ApiError(0, "signed out", false);
  let body = null;
  try {
    body = text ? JSON.parse(text) : null;
  } catch (_) {
    body = null;
  }
  if (!resp.ok) {
    const message = body && typeof body.error === "string" ? body.error : text.slice(0, 300) || resp.statusText;
    const err = new ApiError(resp.status, message, resp.status === 404 && !(body && body.error));
    if (resp.status === 401 || resp.status === 403) refused(err);
    throw err;
  }
  return body;
}

/** How an API failure reads in a panel. */
function describe(err) {
  if (!(err instanceof ApiError)) return "error: " + err.message;
  if (err.status === 0) return err.message;
  if (err.status === 401) return "401 Unauthorized: " + err.message;
  if (err.status === 403) return "403 Forbidden: " + err.message;
  if (err.status >= 500) return err.status + " from the gateway: " + err.message;
  return err.status + ": " + err.message;
}

/** A refused token stops every panel and asks for another. */
function refused(err) {
  showError("The gateway refused the token (" + describe(err) + "). Paste another token.");
  stop();
  sessionStorage.removeItem(TOKEN_KEY);
  $("main").hidden = true;
  $("login-panel").hidden = false;
  $("logout").hidden = true;
  $("who").textContent = "not signed in";
}

function showError(text) {
  const p = $("error");
  p.textContent = text;
  p.hidden = !text;
}

// ---------- sign in / out ----------

function start(token) {
  stop();
  state.token = token;
  state.stats = [];
  showError("");
  $("login-panel").hidden = true;
  $("main").hidden = false;
  $("logout").hidden = false;
  $("who").textContent = "signed in with a token ending in …" + token.slice(-4);
  every(JOBS_EVERY_MS, refreshJobs);
  every(JOBS_EVERY_MS, refreshEps);
  every(JOBS_EVERY_MS, refreshDlq);
  seedFlow().finally(() => every(STATS_EVERY_MS, pollStats));
  every(USAGE_EVERY_MS, refreshUsage);
}

function stop() {
  state.generation += 1;
  for (const t of state.timers) clearTimeout(t);
  state.timers = [];
}

/** Runs `f` now and again `ms` after each run ends, until sign-out. */
function every(ms, f) {
  const generation = state.generation;
  const run = async () => {
    try {
      await f();
    } catch (e) {
      // each panel reports its own failures; a refused token already stopped everything
    }
    if (generation === state.generation) state.timers.push(setTimeout(run, ms));
  };
  run();
}

function signOut() {
  stop();
  sessionStorage.removeItem(TOKEN_KEY);
  state.token = null;
  $("main").hidden = true;
  $("login-panel").hidden = false;
  $("logout").hidden = true;
  $("who").textContent = "not signed in";
}

// ---------- jobs ----------

async function refreshJobs() {
  let jobs;
  try {
    jobs = await api("/v1/jobs");
  } catch (e) {
    setStatus("jobs-status", describe(e), true);
    return;
  }
  jobs.sort((a, b) => b.submitted_at_ms - a.submitted_at_ms || (a.id < b.id ? -1 : 1));
  const tbody = $("jobs").tBodies[0];
  clear(tbody);
  for (const job of jobs) {
    const tr = el("tr", null, { "data-job-id": job.id, "data-state": job.state });
    if (job.id === state.selectedJob) tr.classList.add("selected");
    const stateCell = el("td");
    stateCell.appendChild(el("span", job.state, { class: "state state-" + job.state, title: job.reason || null }));
    tr.appendChild(stateCell);
    tr.appendChild(el("td", job.owner, { class: "owner" }));
    tr.appendChild(el("td", job.function + " v" + job.version, { class: "function" }));
    tr.appendChild(el("td", job.event && job.event.path, { class: "input path", title: job.input }));
    const outputs = el("td", null, { class: "outputs path" });
    for (const o of job.outputs || []) outputs.appendChild(el("div", o.path, { title: o.sha256 }));
    tr.appendChild(outputs);
    tr.appendChild(el("td", fmtTime(job.submitted_at_ms), { class: "time" }));
    tr.appendChild(el("td", fmtTime(job.finished_at_ms), { class: "time" }));
    const idCell = el("td");
    const button = el("button", job.id, { type: "button", class: "link job-id", "aria-label": "history of job " + job.id });
    button.addEventListener("click", () => showHistory(job.id));
    idCell.appendChild(button);
    tr.appendChild(idCell);
    tr.addEventListener("click", (ev) => {
      if (ev.target === button) return;
      showHistory(job.id);
    });
    tbody.appendChild(tr);
  }
  $("jobs-count").textContent = "(" + jobs.length + ")";
  setStatus("jobs-status", jobs.length ? "updated " + fmtTime(Date.now()) : "no jobs yet");
  state.jobs = jobs;
  await refreshFunctions();
}

// ---------- functions ----------

const LAST_RUNS = 5;

async function refreshFunctions() {
  let fns;
  try {
    fns = await api("/v1/functions");
  } catch (e) {
    setStatus("functions-status", describe(e), true);
    return;
  }
  const tbody = $("functions").tBodies[0];
  clear(tbody);
  for (const f of fns) {
    const m = f.manifest || {};
    const tr = el("tr", null, { "data-function": m.name, "data-enabled": String(f.enabled) });
    tr.appendChild(el("td", m.name, { class: "function" }));
    tr.appendChild(el("td", m.owner, { class: "owner" }));
    const version = "v" + f.version + (f.latest_version !== f.version ? " of " + f.latest_version : "");
    const vcell = el("td", version, { class: "version" });
    if (f.pinned != null) vcell.appendChild(el("span", "pinned", { class: "badge", title: "rolled back to v" + f.pinned }));
    tr.appendChild(vcell);
    const fstate = el("td");
    fstate.appendChild(el("span", f.enabled ? "enabled" : "disabled", { class: "state state-" + (f.enabled ? "enabled" : "disabled") }));
    tr.appendChild(fstate);
    const t = m.trigger || {};
    const trigger = [t.path, t.rule].filter(Boolean).join(" and ");
    tr.appendChild(el("td", trigger, { class: "path" }));
    const runs = el("td", null, { class: "runs" });
    const mine = state.jobs.filter((j) => j.function === m.name && j.owner === m.owner).slice(0, LAST_RUNS);
    for (const j of mine) {
      runs.appendChild(el("span", j.state, {
        class: "state state-" + j.state,
        title: "v" + j.version + " " + fmtTime(j.finished_at_ms || j.submitted_at_ms) + (j.reason ? ": " + j.reason : ""),
      }));
    }
    if (!mine.length) runs.appendChild(el("span", "none yet", { class: "muted" }));
    tr.appendChild(runs);
    tbody.appendChild(tr);
  }
  $("functions-count").textContent = "(" + fns.length + ")";
  setStatus("functions-status", fns.length ? "" : "no function registered");
}

// ---------- execution points ----------

async function refreshEps() {
  let eps;
  try {
    eps = await api("/v1/eps");
  } catch (e) {
    setStatus("eps-status", describe(e), true);
    return;
  }
  const tbody = $("eps").tBodies[0];
  clear(tbody);
  for (const ep of eps) {
    const attached = ep.session != null;
    const tr = el("tr", null, { "data-ep": ep.name, "data-state": ep.state, "data-attached": String(attached) });
    tr.appendChild(el("td", ep.name, { class: "ep" }));
    tr.appendChild(el("td", attached ? ep.address || "" : "not attached", { class: attached ? "" : "muted" }));
    const scope = [ep.owner ? "owner " + ep.owner : "", ep.annex ? "annex " + ep.annex : ""].filter(Boolean).join(", ");
    tr.appendChild(el("td", scope || "any owner"));
    const total = ep.total || {};
    const free = ep.free || {};
    tr.appendChild(el("td", (free.cpus ?? 0) + " / " + (total.cpus ?? 0), { class: "num" }));
    tr.appendChild(el("td", fmtBytes((free.memory_mb ?? 0) * 1048576) + " / " + fmtBytes((total.memory_mb ?? 0) * 1048576), { class: "num" }));
    tr.appendChild(el("td", String((ep.running || []).length), { class: "num running", title: (ep.running || []).join(" ") }));
    const estate = el("td");
    estate.appendChild(el("span", ep.state, { class: "state state-" + ep.state, title: ep.reason || null }));
    tr.appendChild(estate);
    tbody.appendChild(tr);
  }
  $("eps-count").textContent = "(" + eps.length + ")";
  setStatus("eps-status", eps.length ? "" : "no EP attached");
}

// ---------- dead letters ----------

async function refreshDlq() {
  let entries;
  try {
    entries = await api("/v1/dlq");
  } catch (e) {
    setStatus("dlq-status", describe(e), true);
    return;
  }
  const tbody = $("dlq").tBodies[0];
  clear(tbody);
  for (const d of entries) {
    const tr = el("tr", null, { "data-entry": String(d.id), "data-kind": d.kind, "data-function": d.function });
    tr.appendChild(el("td", String(d.id), { class: "num" }));
    const kind = el("td");
    kind.appendChild(el("span", d.kind.replace("_", " "), { class: "state state-" + d.kind }));
    tr.appendChild(kind);
    tr.appendChild(el("td", d.function + (d.version != null ? " v" + d.version : ""), { class: "function" }));
    tr.appendChild(el("td", d.owner));
    tr.appendChild(el("td", (d.event && d.event.path) || "", { class: "path" }));
    tr.appendChild(el("td", d.reason, { class: "reason" }));
    tr.appendChild(el("td", fmtTime(d.created_ms), { class: "time" }));
    tr.appendChild(el("td", String((d.redrives || []).length), { class: "num" }));
    tbody.appendChild(tr);
  }
  $("dlq-count").textContent = "(" + entries.length + ")";
  setStatus("dlq-status", entries.length ? "" : "nothing failed");
}

async function showHistory(id) {
  state.selectedJob = id;
  for (const tr of $("jobs").tBodies[0].rows) tr.classList.toggle("selected", tr.dataset.jobId === id);
  $("history-panel").hidden = false;
  $("history-job").textContent = id;
  const tbody = $("history").tBodies[0];
  clear(tbody);
  setStatus("history-status", "loading…");
  let attempts;
  try {
    attempts = await api("/v1/jobs/" + encodeURIComponent(id) + "/history");
  } catch (e) {
    setStatus("history-status", describe(e), true);
    return;
  }
  if (state.selectedJob !== id) return;
  for (const a of attempts) {
    const tr = el("tr");
    tr.appendChild(el("td", a.n));
    tr.appendChild(el("td", a.ep));
    tr.appendChild(el("td", fmtTime(a.started_at_ms)));
    tr.appendChild(el("td", fmtTime(a.ended_at_ms)));
    tr.appendChild(el("td", a.outcome + (a.reason ? ": " + a.reason : "")));
    tbody.appendChild(tr);
  }
  setStatus("history-status", attempts.length ? "" : "not run yet");
}

// ---------- event flow ----------

const FLOW_SERIES = [
  { key: "received", label: "received", cls: "s-received" },
  { key: "fired", label: "fired (firings queued)", cls: "s-fired" },
  { key: "ignored", label: "ignored (no event, not enabled, unmatched, malformed, duplicate)", cls: "s-ignored" },
];

/** Starts the chart from the gateway's own history, its clock shifted onto this page's. */
async function seedFlow() {
  let h;
  try {
    h = await api("/v1/stats/history");
  } catch (e) {
    return; // the live samples still come
  }
  const samples = (h.samples || []).slice(-(FLOW_SAMPLES + 1));
  if (!samples.length) return;
  const skew = Date.now() - samples[samples.length - 1].at_ms;
  state.stats = samples.map((x) => ({
    t: x.at_ms + skew,
    received: x.events_received,
    fired: x.firings_queued,
    ignored: x.events_ignored,
  }));
  $("flow-chart").dataset.history = String(samples.length);
  drawFlow();
}

async function pollStats() {
  let s;
  try {
    s = await api("/v1/stats");
  } catch (e) {
    setStatus("flow-status", describe(e), true);
    return;
  }
  const n = (k) => (typeof s[k] === "number" ? s[k] : 0);
  state.stats.push({
    t: Date.now(),
    received: n("events_received"),
    fired: n("firings_queued"),
    ignored: n("events_ignored") + n("events_not_enabled") + n("events_unmatched") + n("events_malformed") + n("events_duplicate"),
  });
  if (state.stats.length > FLOW_SAMPLES + 1) state.stats.shift();
  $("flow-totals").textContent =
    "Since the gateway started: " + n("events_received") + " received, " + n("firings_queued") + " firings, " +
    n("jobs_submitted") + " jobs submitted, " + n("firings_pending") + " pending, " + n("events_malformed") + " malformed.";
  setStatus("flow-status", state.stats.length < 2 ? "collecting…" : "");
  drawFlow();
}

/** Per-second rates between consecutive samples; a counter that went down (a restarted gateway) counts from 0. */
function flowRates() {
  const out = [];
  for (let i = 1; i < state.stats.length; i++) {
    const a = state.stats[i - 1];
    const b = state.stats[i];
    const dt = Math.max((b.t - a.t) / 1000, 0.001);
    const point = { t: b.t };
    for (const { key } of FLOW_SERIES) point[key] = (b[key] >= a[key] ? b[key] - a[key] : b[key]) / dt;
    out.push(point);
  }
  return out;
}

function drawFlow() {
  const box = $("flow-chart");
  clear(box);
  const rates = flowRates();
  const W = 560;
  const H = 200;
  const pad = { l: 44, r: 8, t: 10, b: 22 };
  const max = Math.max(1, ...rates.flatMap((p) => FLOW_SERIES.map((s) => p[s.key])));
  const chart = svg("svg", { viewBox: `0 0 ${W} ${H}`, width: "100%", class: "plot", "data-points": rates.length });
  axes(chart, W, H, pad, max, "/s");
  const x = (i) => pad.l + (FLOW_SAMPLES <= 1 ? 0 : (i + FLOW_SAMPLES - rates.length) * (W - pad.l - pad.r) / (FLOW_SAMPLES - 1));
  const y = (v) => H - pad.b - (v / max) * (H - pad.t - pad.b);
  for (const s of FLOW_SERIES) {
    if (rates.length === 0) continue;
    const points = rates.map((p, i) => `${x(i).toFixed(1)},${y(p[s.key]).toFixed(1)}`).join(" ");
    const line = svg("polyline", { points, class: "series " + s.cls, "data-series": s.key });
    const last = rates[rates.length - 1];
    line.appendChild(svg("title", {}, `${s.label}: ${fmtNum(last[s.key])}/s now`));
    chart.appendChild(line);
  }
  chart.appendChild(svg("text", { x: W - pad.r, y: H - 6, class: "axis-label", "text-anchor": "end" }, "now"));
  chart.appendChild(svg("text", { x: pad.l, y: H - 6, class: "axis-label" }, `−${Math.round((FLOW_SAMPLES * STATS_EVERY_MS) / 1000)} s`));
  box.appendChild(chart);
  const legend = $("flow-legend");
  clear(legend);
  for (const s of FLOW_SERIES) {
    const item = el("span", null, { class: "key" });
    item.appendChild(el("span", null, { class: "swatch " + s.cls, "aria-hidden": "true" }));
    const now = rates.length ? fmtNum(rates[rates.length - 1][s.key]) + "/s" : "…";
    item.appendChild(document.createTextNode(s.label + ": " + now));
    legend.appendChild(item);
  }
}

/** A y axis with three ticks, and the base line. */
function axes(chart, W, H, pad, max, unit) {
  for (const f of [0, 0.5, 1]) {
    const yy = H - pad.b - f * (H - pad.t - pad.b);
    chart.appendChild(svg("line", { x1: pad.l, x2: W - pad.r, y1: yy, y2: yy, class: f === 0 ? "axis" : "grid" }));
    chart.appendChild(svg("text", { x: pad.l - 4, y: yy + 4, class: "axis-label", "text-anchor": "end" }, fmtNum(max * f) + unit));
  }
}

// ---------- usage ----------

const USAGE_METRICS = {
  jobs: { label: "jobs finished", unit: "", of: (r) => Object.values(r.jobs || {}).reduce((a, b) => a + b, 0) },
  core_seconds: { label: "core-seconds", unit: " core-s", of: (r) => (r.core_hours || 0) * 3600 },
  bytes: { label: "bytes read + written", unit: " B", of: (r) => (r.bytes_read || 0) + (r.bytes_written || 0) },
};

async function refreshUsage() {
  const [rangeS, periodS] = $("usage-range").value.split(":").map(Number);
  const metric = USAGE_METRICS[$("usage-metric").value] || USAGE_METRICS.jobs;
  const now = Date.now();
  const since = Math.floor((now - rangeS * 1000) / (periodS * 1000)) * periodS * 1000;
  let report;
  try {
    report = await api(`/v1/accounting/report?by=owner&period_s=${periodS}&since_ms=${since}`);
  } catch (e) {
    const box = $("usage-charts");
    clear(box);
    if (e instanceof ApiError && e.routeMissing) {
      setStatus("usage-status", "Usage reports are not available on this gateway (GET /v1/accounting/report is missing).", true);
      box.appendChild(el("p", "not available", { class: "unavailable" }));
    } else {
      setStatus("usage-status", describe(e), true);
    }
    return;
  }
  drawUsage(report, metric, periodS);
}

function drawUsage(report, metric, periodS) {
  const box = $("usage-charts");
  clear(box);
  const byOwner = new Map();
  for (const row of report.rows || []) {
    if (!byOwner.has(row.key)) byOwner.set(row.key, []);
    byOwner.get(row.key).push(row);
  }
  const step = (report.period_s || periodS) * 1000;
  const first = Math.floor(report.since_ms / step) * step;
  const periods = [];
  for (let t = first; t < report.until_ms && periods.length < 400; t += step) periods.push(t);
  if (byOwner.size === 0) {
    setStatus("usage-status", "no finished jobs between " + fmtTime(report.since_ms) + " and " + fmtTime(report.until_ms));
    return;
  }
  setStatus("usage-status", metric.label + " per " + (step / 1000) + " s, " + fmtTime(report.since_ms) + " to " + fmtTime(report.until_ms));
  for (const [owner, rows] of byOwner) {
    const values = new Map();
    for (const r of rows) values.set(r.period_start_ms, (values.get(r.period_start_ms) || 0) + metric.of(r));
    const fig = el("figure", null, { class: "usage", "data-owner": owner });
    const total = rows.reduce((a, r) => a + metric.of(r), 0);
    const jobs = rows.reduce((a, r) => a + USAGE_METRICS.jobs.of(r), 0);
    const coreS = rows.reduce((a, r) => a + USAGE_METRICS.core_seconds.of(r), 0);
    const read = rows.reduce((a, r) => a + (r.bytes_read || 0), 0);
    const written = rows.reduce((a, r) => a + (r.bytes_written || 0), 0);
    fig.appendChild(el("h3", owner, { class: "owner" }));
    const W = 560;
    const H = 120;
    const pad = { l: 52, r: 8, t: 8, b: 16 };
    const max = Math.max(...values.values(), 0) || 1;
    const chart = svg("svg", { viewBox: `0 0 ${W} ${H}`, width: "100%", class: "plot", role: "img" });
    chart.setAttribute("aria-label", owner + ": " + metric.label + " over time");
    axes(chart, W, H, pad, max, metric.unit);
    const bw = (W - pad.l - pad.r) / Math.max(periods.length, 1);
    periods.forEach((t, i) => {
      const v = values.get(t) || 0;
      if (v <= 0) return;
      const h = Math.max(1, (v / max) * (H - pad.t - pad.b));
      const bar = svg("rect", { x: pad.l + i * bw + 0.5, y: H - pad.b - h, width: Math.max(bw - 1, 1), height: h, class: "bar", "data-period": t });
      bar.appendChild(svg("title", {}, fmtTime(t) + ": " + fmtNum(v) + metric.unit));
      chart.appendChild(bar);
    });
    fig.appendChild(chart);
    fig.appendChild(
      el("figcaption", `${fmtNum(total)}${metric.unit} in range · ${jobs} jobs · ${fmtNum(coreS)} core-s · read ${fmtBytes(read)} · wrote ${fmtBytes(written)}`),
    );
    box.appendChild(fig);
  }
}

// ---------- audit search: lineage ----------

/**
 * Follows the audit trail from a file: the records naming it, then each job they name (its
 * input and outputs), each event, and each file those name, until nothing new turns up or the
 * query budget is spent. Builds jobs {id → {input, outputs, kinds, ...}}.
 */
async function followAudit(path) {
  const records = new Map();
  const asked = new Set();
  const queue = [["file", path]];
  let queries = 0;
  let truncated = false;
  while (queue.length) {
    const [what, value] = queue.shift();
    const key = what + "\u0000" + value;
    if (asked.has(key)) continue;
    if (queries >= LINEAGE_QUERY_BUDGET) {
      truncated = true;
      break;
    }
    asked.add(key);
    queries += 1;
    const found = await api(`/v1/audit?${what}=${encodeURIComponent(value)}&limit=1000`);
    for (const r of found) {
      if (records.has(r.seq)) continue;
      records.set(r.seq, r);
      const s = r.subject || {};
      if (s.job) queue.push(["job", s.job]);
      if (s.event_id) queue.push(["event", s.event_id]);
      for (const p of s.paths || []) queue.push(["file", p]);
    }
  }
  return { records: [...records.values()].sort((a, b) => a.seq - b.seq), truncated, queries };
}

function jobsOf(records) {
  const jobs = new Map();
  for (const r of records) {
    const s = r.subject || {};
    if (!s.job) continue;
    if (!jobs.has(s.job)) {
      jobs.set(s.job, { id: s.job, function: s.function, owner: s.owner, event: s.event_id, input: null, outputs: [], kinds: [], first: r.time_ms, last: r });
    }
    const j = jobs.get(s.job);
    j.function = j.function || s.function;
    j.owner = j.owner || s.owner;
    j.event = j.event || s.event_id;
    j.kinds.push(r.kind);
    j.last = r;
    const d = r.detail || {};
    if (r.kind === "input.read" && typeof d.path === "string") j.input = d.path;
    if (r.kind === "job.accepted" && !j.input && (s.paths || []).length) j.input = s.paths[0];
    if (r.kind === "output.written" && Array.isArray(d.outputs)) {
      for (const o of d.outputs) if (o && typeof o.path === "string" && !j.outputs.includes(o.path)) j.outputs.push(o.path);
    }
  }
  return [...jobs.values()].sort((a, b) => a.first - b.first);
}

/** The gateway's own lineage (`GET /v1/lineage`), as the same job list `jobsOf` makes. */
async function lineageFromApi(path) {
  const answer = await api("/v1/lineage?file=" + encodeURIComponent(path));
  const records = [];
  const jobs = new Map();
  for (const step of answer.steps || []) {
    const recs = step.records || [];
    records.push(...recs);
    if (jobs.has(step.job)) continue;
    jobs.set(step.job, {
      id: step.job,
      function: step.function,
      owner: step.owner,
      event: step.event_id,
      rule: step.rule,
      token: step.token_jti,
      input: step.input,
      outputs: step.outputs || [],
      kinds: recs.map((r) => r.kind),
      first: recs.length ? recs[0].time_ms : 0,
    });
  }
  return {
    jobs: [...jobs.values()].sort((a, b) => a.first - b.first),
    records,
    truncated: Boolean(answer.truncated),
    how: "from /v1/lineage",
  };
}

/** The lineage from /v1/lineage, or, on a gateway without it, by following /v1/audit. */
async function findLineage(path) {
  try {
    return await lineageFromApi(path);
  } catch (e) {
    if (!(e instanceof ApiError && e.routeMissing)) throw e;
  }
  const found = await followAudit(path);
  return { jobs: jobsOf(found.records), records: found.records, truncated: found.truncated, how: `followed /v1/audit in ${found.queries} queries` };
}

async function searchLineage(path) {
  const list = $("lineage");
  const table = $("audit-records").tBodies[0];
  clear(list);
  clear(table);
  setStatus("audit-status", "following " + path + " …");
  let found;
  try {
    found = await findLineage(path);
  } catch (e) {
    setStatus("audit-status", describe(e), true);
    return;
  }
  if ($("audit-file").value.trim() !== path) return; // a newer search is under way
  const writers = new Map(); // output path → job id
  for (const j of found.jobs) for (const o of j.outputs) writers.set(o, j.id);
  for (const j of found.jobs) list.appendChild(lineageStep(j, writers, path));
  for (const r of found.records) {
    const tr = el("tr");
    tr.appendChild(el("td", r.writer));
    tr.appendChild(el("td", r.seq));
    tr.appendChild(el("td", fmtTime(r.time_ms)));
    tr.appendChild(el("td", r.kind));
    tr.appendChild(el("td", r.actor || ""));
    tr.appendChild(el("td", (r.subject && r.subject.job) || ""));
    tr.appendChild(el("td", ((r.subject && r.subject.paths) || []).join(", "), { class: "path" }));
    table.appendChild(tr);
  }
  if (!found.jobs.length) {
    setStatus("audit-status", found.records.length ? "records found, but no job names " + path : "No audit record names " + path + ".");
    return;
  }
  setStatus(
    "audit-status",
    `${found.jobs.length} job(s), ${found.records.length} audit records, ${found.how}` +
      (found.truncated ? " (stopped at the limit: the lineage may go on)" : ""),
  );
}

function fileBox(path, label, searched) {
  const box = el("div", null, { class: "node file" + (path === searched ? " hit" : "") });
  box.appendChild(el("span", label, { class: "node-label" }));
  const link = el("button", path, { type: "button", class: "link path", "data-path": path, title: "follow this file" });
  link.addEventListener("click", () => {
    $("audit-file").value = path;
    searchLineage(path);
  });
  box.appendChild(link);
  return box;
}

function lineageStep(job, writers, searched) {
  const li = el("li", null, { class: "step", "data-job-id": job.id });
  const from = job.input ? writers.get(job.input) : undefined;
  li.appendChild(job.input ? fileBox(job.input, from ? "written by job " + from : "upload", searched) : el("div", "input unknown", { class: "node file" }));
  li.appendChild(el("span", "→", { class: "arrow", "aria-hidden": "true" }));
  const jb = el("div", null, { class: "node job" });
  jb.appendChild(el("span", "job", { class: "node-label" }));
  jb.appendChild(el("code", job.id, { class: "job-id" }));
  jb.appendChild(el("div", [job.function, job.owner && "owner " + job.owner].filter(Boolean).join(" · ")));
  if (job.event) jb.appendChild(el("div", "event " + job.event, { class: "muted small" }));
  if (job.rule) jb.appendChild(el("div", "trigger " + job.rule, { class: "muted small" }));
  if (job.token) jb.appendChild(el("div", "token " + job.token, { class: "muted small" }));
  jb.appendChild(el("div", job.kinds.join(" → "), { class: "muted small" }));
  li.appendChild(jb);
  li.appendChild(el("span", "→", { class: "arrow", "aria-hidden": "true" }));
  const outs = el("div", null, { class: "outputs" });
  if (job.outputs.length === 0) outs.appendChild(el("div", "no outputs recorded", { class: "node file muted" }));
  for (const o of job.outputs) outs.appendChild(fileBox(o, "output", searched));
  li.appendChild(outs);
  return li;
}

// ---------- wiring ----------

document.addEventListener("DOMContentLoaded", () => {
  $("login").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const token = $("token").value.trim();
    if (!token) return;
    $("token").value = "";
    sessionStorage.setItem(TOKEN_KEY, token);
    start(token);
  });
  $("logout").addEventListener("click", signOut);
  $("audit-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const path = $("audit-file").value.trim();
    if (path) searchLineage(path);
  });
  $("usage-range").addEventListener("change", () => refreshUsage().catch(() => {}));
  $("usage-metric").addEventListener("change", () => refreshUsage().catch(() => {}));
  const saved = sessionStorage.getItem(TOKEN_KEY);
  if (saved) start(saved);
  document.body.dataset.ready = "true";
});
