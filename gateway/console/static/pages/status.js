// The status tab: polls /ready, /v1/gateway/stats (and /v1/gateway/plan once, which needs an admin
// key when keys are configured) and derives rates from two consecutive readings of the gateway's totals.
import { h, fmt } from "../dom.js";

const INTERVAL_MS = 2000;
let plans = null;
let root = null;
const $ = (id) => root.querySelector("#" + id);

function layout() {
  const figure = (id, label) => h("div", { class: "figure" }, h("div", { class: "value", id }, "-"), h("div", { class: "label" }, label));
  const th = (...names) => h("tr", {}, names.map((n) => h("th", {}, n)));
  return [
    h("div", { class: "status-head" }, h("h2", {}, "Status"), h("span", { id: "overall", class: "badge" }, "loading"),
      h("span", { class: "muted" }, "refreshes every ", h("span", { id: "interval" }, String(INTERVAL_MS / 1000)), " s")),
    h("section", {}, h("h2", {}, "Live"), h("div", { class: "figures" },
      figure("rps", "requests/s"), figure("tps", "tokens/s generated"), figure("ttft", "TTFT (mean, ms)"),
      figure("tpot", "time per token (mean, ms)"), figure("overhead", "gateway overhead (mean, ms)"),
      figure("total-requests", "requests served"), figure("total-tokens", "tokens generated"))),
    h("section", {}, h("h2", {}, "Models"), h("table", {},
      h("thead", {}, th("model", "engine", "ready", "running / slots", "waiting / queue", "speculation", "why this engine")),
      h("tbody", { id: "models" }))),
    h("section", {}, h("h2", {}, "Hardware"), h("table", {}, h("tbody", { id: "hardware" })),
      h("details", {}, h("summary", { class: "muted" }, "as detected (JSON)"), h("pre", { id: "hardware-json" }, "-"))),
    h("p", { class: "muted" }, h("a", { href: "/v1/gateway/stats" }, "/v1/gateway/stats"), " · ",
      h("a", { href: "/v1/gateway/plan" }, "/v1/gateway/plan"), " · ", h("span", { id: "error" })),
  ];
}

function totals(stats) {
  const t = { requests: 0, completion: 0, ttftSum: 0, ttftCount: 0, tpotSum: 0, tpotCount: 0 };
  for (const m of Object.values(stats.models)) {
    t.requests += m.requests;
    t.completion += m.completion_tokens;
    t.ttftSum += m.ttft_seconds.sum; t.ttftCount += m.ttft_seconds.count;
    t.tpotSum += m.tpot_seconds.sum; t.tpotCount += m.tpot_seconds.count;
  }
  t.overheadSum = stats.overhead_seconds.sum; t.overheadCount = stats.overhead_seconds.count;
  t.time = stats.time;
  return t;
}

// Mean over the last interval when something happened in it, else the mean since start.
function mean(now, before, sumKey, countKey) {
  if (before && now[countKey] > before[countKey]) {
    return (now[sumKey] - before[sumKey]) / (now[countKey] - before[countKey]);
  }
  return now[countKey] > 0 ? now[sumKey] / now[countKey] : null;
}

function why(modelId) {
  const plan = plans && plans[modelId];
  if (!plan) return "";
  const reasons = plan.reasons || [];
  const chosen = (plan.candidates || []).find((c) => c.status === "chosen");
  const rule = plan.rule || (chosen && chosen.rule);
  return [rule ? "rule " + rule : null, ...reasons].filter(Boolean).join("; ");
}

// The plan's speculation decision and, once the engine drafted, the share of drafts it accepted.
function speculation(modelId, m) {
  const plan = plans && plans[modelId];
  const decision = ((plan && plan.features) || []).find((f) => f.feature === "speculation");
  const s = m.speculation;
  const rate = s ? `${(100 * s.acceptance).toFixed(0)}% of ${s.drafted} drafted tokens accepted` : "";
  return [decision ? decision.choice : "", rate].filter(Boolean).join(": ") || "-";
}

// One row per top-level part of the snapshot; nested values shown as "key: value" pairs.
function flat(value) {
  if (value === null || value === undefined) return "unknown";
  if (Array.isArray(value)) return value.length ? value.map(flat).join(", ") : "none";
  if (typeof value === "object") {
    return Object.entries(value).map(([k, v]) => k + ": " + (k.endsWith("_bytes") && typeof v === "number" ? (v / 2 ** 30).toFixed(1) + " GiB" : flat(v))).join(" · ");
  }
  return String(value);
}

function renderHardware(hardware) {
  $("hardware-json").textContent = JSON.stringify(hardware, null, 2);
  const rows = Object.entries(hardware || {}).map(([key, value]) => {
    const tr = document.createElement("tr");
    const th = document.createElement("th");
    th.textContent = key;
    const td = document.createElement("td");
    td.textContent = flat(value);
    tr.append(th, td);
    return tr;
  });
  $("hardware").replaceChildren(...rows);
}

function replicaRow(model, r) {
  // one replica of a model: its breaker state, load and slots, and where it runs
  const tr = document.createElement("tr");
  tr.dataset.model = model;
  tr.dataset.replica = r.name;
  const up = r.state !== "open" && !r.down;
  const where = r.base_url || (r.port ? `port ${r.port}` : "");
  const cells = [`  ↳ replica ${r.name}`, r.engine, up ? r.state : `down (${r.state})`, `${r.running} / ${r.slots ?? "no cap"}`,
                 `${r.waiting} / ${r.max_queue}`, "", [where, r.reason, `served ${r.served}, failed ${r.failed}`].filter(Boolean).join(" · ")];
  cells.forEach((text, i) => {
    const td = document.createElement("td");
    td.textContent = text;
    if (i === 2) td.className = up ? "ready" : "not_ready";
    tr.appendChild(td);
  });
  return tr;
}

function schedulerText(s) {
  // who waits by tier and what the scheduler refused, by reason (only what is not zero)
  if (!s) return "";
  const nonzero = (o) => Object.entries(o || {}).filter(([, n]) => n > 0).map(([k, n]) => `${k} ${n}`);
  const waiting = nonzero(s.waiting), refused = nonzero(s.refusals);
  return (waiting.length ? " · " + waiting.join(", ") : "") + (refused.length ? " · refused: " + refused.join(", ") : "");
}

function renderModels(stats, ready) {
  const rows = [];
  for (const [id, m] of Object.entries(stats.models)) {
    const isReady = ready.models && ready.models[id] ? ready.models[id].ready : m.ready;
    const tr = document.createElement("tr");
    tr.dataset.model = id;
    // A model not loaded yet is not "not ready": it loads on its first request.
    const state = m.state && m.state !== "loaded" ? m.state + (m.reason ? ": " + m.reason : "") : (isReady ? "ready" : "not ready");
    const fellBack = (m.fallbacks || []).map((f) => "fell back from " + f.engine + ": " + f.reason);
    const cells = [id, m.engine, state, `${m.running} / ${m.slots ?? "no cap"}`, `${m.waiting} / ${m.max_queue}` + schedulerText(m.scheduler),
      speculation(id, m), [...fellBack, why(id)].filter(Boolean).join("; ")];
    cells.forEach((text, i) => {
      const td = document.createElement("td");
      td.textContent = text;
      if (i === 2) { td.className = isReady ? "ready" : (m.state === "failed" ? "not_ready" : "idle"); td.dataset.field = "ready"; }
      tr.appendChild(td);
    });
    rows.push(tr);
    const replicas = m.replicas || [];
    if (replicas.length > 1) rows.push(...replicas.map((r) => replicaRow(id, r)));
  }
  $("models").replaceChildren(...rows);
}


export function mount(el, ctx) {
  root = el;
  plans = null;
  let previous = null;
  let stopped = false;
  el.append(...layout());

  async function tick() {
    try {
      if (plans === null) {
        try {
          const plan = await ctx.json("/v1/gateway/plan");
          plans = plan.plans || {};
          renderHardware(plan.hardware);
        } catch (err) {
          if (!(err instanceof ctx.ApiError) || (err.status !== 401 && err.status !== 403)) throw err;
          plans = {};  // the plan and the hardware are an admin's; the live figures are every key's
          $("hardware").replaceChildren(h("tr", {}, h("td", {}, "The hardware and the plans need an admin key.")));
        }
      }
      // /ready answers 503 with its body while an engine is not ready: read it either way
      const [ready, stats] = await Promise.all([ctx.api("/ready").then((r) => r.json()), ctx.json("/v1/gateway/stats")]);
      if (stopped) return;
      $("overall").textContent = ready.status === "ready" ? "ready" : "not ready";
      $("overall").className = "badge " + ready.status;
      renderModels(stats, ready);
      const now = totals(stats);
      if (previous) {
        const dt = now.time - previous.time;
        $("rps").textContent = fmt((now.requests - previous.requests) / dt, 2);
        $("tps").textContent = fmt((now.completion - previous.completion) / dt, 1);
      }
      const ttft = mean(now, previous, "ttftSum", "ttftCount");
      const tpot = mean(now, previous, "tpotSum", "tpotCount");
      const overhead = mean(now, previous, "overheadSum", "overheadCount");
      $("ttft").textContent = ttft === null ? "-" : fmt(ttft * 1000, 1);
      $("tpot").textContent = tpot === null ? "-" : fmt(tpot * 1000, 1);
      $("overhead").textContent = overhead === null ? "-" : fmt(overhead * 1000, 3);
      $("total-requests").textContent = String(now.requests);
      $("total-tokens").textContent = String(now.completion);
      $("error").textContent = "";
      previous = now;
    } catch (err) {
      if (!stopped) $("error").textContent = String(err.message || err);
    }
  }

  ctx.onKeyChange(() => { plans = null; tick(); });
  tick();
  const timer = setInterval(tick, INTERVAL_MS);
  return () => { stopped = true; clearInterval(timer); };
}
