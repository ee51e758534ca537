// The Models tab: each model's state, its plan (engine, why, the features chosen and why, memory
// figures), its replicas with health and breaker state; for an admin key, load/unload and the
// engine's log tail. Reads /v1/gateway/stats (any key), /v1/gateway/plan and /admin/* (admin).
import { h, clear, fmt } from "../dom.js";
import { useStyle, row, head, bytes, errorText } from "./shared.js";

const INTERVAL_MS = 3000;
const LOG_LINES = 80;

function stateOf(stat) {
  if (!stat) return "unknown";
  if (stat.state === "loaded") return stat.ready ? "ready" : "not-ready";
  return stat.state || (stat.ready ? "ready" : "not-ready");
}

function replicasTable(stat) {
  const body = h("tbody", {}, (stat.replicas || []).map((r) => row([
    r.name, r.engine, h("span", { class: "state " + (r.down ? "not-ready" : "ready") }, r.down ? "down" : "serving"),
    h("span", { class: "state " + r.state, title: r.reason || "" }, r.state.replace("_", "-")),
    `${r.running} / ${r.slots ?? "no cap"}`, r.waiting, r.served, r.failed, r.breaker_opens,
    r.kv_cache_usage_ratio === null || r.kv_cache_usage_ratio === undefined ? "-" : fmt(100 * r.kv_cache_usage_ratio, 0) + " %",
  ], { "data-replica": r.name })));
  return h("table", { class: "replicas" },
    head("replica", "engine", "health", "breaker", "running / slots", "waiting", "served", "failed", "breaker opens", "KV cache"), body);
}

function planSection(plan, life, budget) {
  if (!plan) return h("p", { class: "muted" }, "The plan needs an admin key (it shows the host's hardware).");
  const cap = plan.capacity || {};
  const foot = (life && life.footprint) || {};
  const fmtPools = (pools) => (pools ? Object.entries(pools).map(([k, v]) => `${k} ${bytes(v)}`).join(", ") : "-");
  return h("div", { class: "plan" },
    h("h4", {}, "Why this engine", plan.rule ? ` (rule ${plan.rule})` : ""),
    h("ul", { class: "reasons" }, (plan.reasons || []).map((r) => h("li", {}, r))),
    (plan.overridden || []).length ? [h("h4", {}, "Your settings that replaced the plan's"),
      h("ul", {}, plan.overridden.map((o) => h("li", {}, `${o.option}: ${JSON.stringify(o.planned)} -> ${JSON.stringify(o.chosen)}` + (o.reason ? ` (${o.reason})` : ""))))] : null,
    (plan.warnings || []).length ? [h("h4", {}, "Warnings"), h("ul", { class: "warnings" }, plan.warnings.map((w) => h("li", {}, w)))] : null,
    h("h4", {}, "Features"),
    h("table", { class: "features" }, head("feature", "choice", "why"),
      h("tbody", {}, (plan.features || []).map((f) => row([f.feature, f.choice, f.reason])))),
    h("h4", {}, "Memory"),
    h("table", { class: "memory" }, h("tbody", {},
      row(["weights", bytes(cap.weights_bytes)]),
      row(["KV cache per sequence", `${bytes(cap.kv_bytes_per_sequence)} (${cap.kv_dtype || "-"}, ${cap.context_length ?? "-"} tokens)`]),
      row(["required", `${bytes(cap.required_bytes)} in ${cap.memory || "-"} (fit: ${cap.fit || "-"})`]),
      row(["usable", bytes(cap.usable_bytes)]),
      row(["sequences at full context", cap.max_concurrency ?? "-"]),
      row(["footprint estimated / measured", `${fmtPools(foot.estimated_bytes)} / ${fmtPools(foot.measured_bytes)}`]),
      foot.differs ? row(["note", foot.differs]) : null,
      row(["memory budget", fmtPools(budget)]))),
    (plan.candidates || []).length > 1 ? h("details", {}, h("summary", { class: "muted" }, "other engines considered"),
      h("ul", {}, plan.candidates.map((c) => h("li", {}, `${c.rank}. ${c.engine}: ${c.because}`)),
        (plan.rejected || []).map((r) => h("li", {}, `${r.engine}: ${r.detail}`)))) : null);
}

export function mount(root, ctx) {
  useStyle();
  let timer = null;
  let stopped = false;
  const logs = new Map(); // model -> <pre> kept across refreshes
  const status = h("p", { class: "muted", id: "models-status" }, "loading...");
  const cards = h("div", { class: "cards", id: "model-cards" });
  clear(root);
  root.append(h("h2", {}, "Models"), status, cards);

  async function action(model, verb, button) {
    button.disabled = true;
    status.textContent = `${verb === "load" ? "loading" : "unloading"} ${model}...`;
    try {
      await ctx.json(`/admin/models/${encodeURIComponent(model)}/${verb}`, { method: "POST" });
      status.textContent = `${model}: ${verb}ed`;
    } catch (err) {
      status.textContent = `${model}: ${errorText(err)}`;
    } finally {
      button.disabled = false;
      refresh();
    }
  }

  async function showLog(model, pre) {
    try {
      const body = await ctx.json(`/admin/engines/${encodeURIComponent(model)}/logs?lines=${LOG_LINES}`);
      pre.textContent = body.lines.join("\n") || "(the engine has written nothing yet)";
    } catch (err) {
      pre.textContent = errorText(err);
    }
  }

  function card(id, stat, plan, life, budget) {
    const state = stateOf(stat);
    const pre = logs.get(id);
    const admin = ctx.access.admin;
    return h("section", { class: "card", "data-model": id },
      h("h3", {}, id, h("span", { class: "state " + state, "data-field": "state" }, state.replace("-", " ")),
        h("span", { class: "muted" }, stat.engine)),
      life && life.reason ? h("p", { class: "err" }, life.reason) : null,
      (stat.fallbacks || []).length ? h("p", { class: "muted" }, "fallbacks: " + stat.fallbacks.map((f) => `${f.engine}: ${f.reason}`).join("; ")) : null,
      admin ? h("div", { class: "actions" },
        h("button", { type: "button", onclick: (e) => action(id, "load", e.target) }, "Load"),
        h("button", { type: "button", onclick: (e) => action(id, "unload", e.target) }, "Unload"),
        h("button", { type: "button", onclick: () => {
          const p = logs.get(id) || h("pre", { class: "log", "data-log": id }, "reading...");
          logs.set(id, p);
          showLog(id, p);
          refresh();
        } }, pre ? "Refresh log" : "Engine log")) : null,
      pre || null,
      h("h4", {}, "Replicas"), replicasTable(stat),
      planSection(plan, life, budget));
  }

  let planCache = null;
  async function refresh() {
    if (stopped) return;
    clearTimeout(timer);
    if (!ctx.access.valid) { // no key typed yet on a gateway that needs one: wait for it
      clear(cards);
      status.textContent = "This page needs an API key: type one in the key box above.";
      return;
    }
    try {
      const stats = await ctx.json("/v1/gateway/stats");
      if (ctx.access.admin && !planCache) {
        try { planCache = await ctx.json("/v1/gateway/plan"); } catch { planCache = null; }
      }
      const lifecycles = planCache ? planCache.models : {};
      const plans = planCache ? planCache.plans : {};
      if (stopped) return;
      clear(cards);
      for (const [id, stat] of Object.entries(stats.models)) {
        cards.append(card(id, stat, plans[id], lifecycles[id] && { ...lifecycles[id], state: stat.state }, planCache && planCache.memory_budget));
      }
      if (!Object.keys(stats.models).length) cards.append(h("p", { class: "notice" }, "No model is configured."));
      status.textContent = ctx.access.admin ? "" : "Load, unload, the plan and the engine log need an admin key.";
    } catch (err) {
      status.textContent = errorText(err);
    }
    timer = setTimeout(refresh, INTERVAL_MS);
  }

  ctx.onKeyChange(() => { planCache = null; refresh(); });
  refresh();
  return () => { stopped = true; clearTimeout(timer); };
}
