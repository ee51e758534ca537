// The Keys & usage tab (admin): keys (create with the secret shown once, revoke, rotate), usage per
// tenant per UTC day as a chart drawn here as inline SVG, and each key's limits with how close it is.
import { h, clear } from "../dom.js";
import { useStyle, row, head, errorText, s, COLORS } from "./shared.js";

const DAYS = 14;
const METRICS = {
  prompt_tokens: "tokens in", completion_tokens: "tokens out", requests: "requests", rejected: "refusals",
};

function dayList(days) {
  const out = [];
  const now = Date.now();
  for (let i = days - 1; i >= 0; i--) out.push(new Date(now - i * 86400000).toISOString().slice(0, 10));
  return out;
}

// rows (per key, model, day) -> {tenant: {day: {metric: n}}}
export function perTenantDay(rows) {
  const out = {};
  for (const r of rows) {
    const t = (out[r.name] ||= {});
    const d = (t[r.day] ||= { requests: 0, prompt_tokens: 0, completion_tokens: 0, rejected: 0, errors: 0 });
    for (const k of Object.keys(d)) d[k] += r[k] || 0;
  }
  return out;
}

function niceMax(v) {
  if (v <= 0) return 1;
  const p = 10 ** Math.floor(Math.log10(v));
  return [1, 2, 5, 10].map((m) => m * p).find((m) => m >= v);
}

// Stacked bars: one per day, one segment per tenant.
function chart(data, days, metric) {
  const tenants = Object.keys(data).sort();
  const W = 720, H = 240, L = 56, B = 36, T = 10, R = 10;
  const totals = days.map((d) => tenants.reduce((n, t) => n + ((data[t][d] || {})[metric] || 0), 0));
  const max = niceMax(Math.max(0, ...totals));
  const bw = (W - L - R) / days.length;
  const y = (v) => T + (H - T - B) * (1 - v / max);
  const svg = s("svg", { class: "chart", viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": `${METRICS[metric]} per tenant per day` });
  for (let i = 0; i <= 4; i++) {
    const v = (max * i) / 4;
    svg.append(s("line", { x1: L, x2: W - R, y1: y(v), y2: y(v), stroke: "#eaeef2" }),
      s("text", { x: L - 6, y: y(v) + 4, "text-anchor": "end" }, v >= 1000 ? (v / 1000).toFixed(v % 1000 ? 1 : 0) + "k" : String(v)));
  }
  days.forEach((d, i) => {
    let base = 0;
    tenants.forEach((t, j) => {
      const v = (data[t][d] || {})[metric] || 0;
      if (!v) return;
      const rect = s("rect", { x: L + i * bw + 2, width: Math.max(1, bw - 4), y: y(base + v), height: y(base) - y(base + v),
        fill: COLORS[j % COLORS.length], "data-tenant": t, "data-day": d, "data-value": v });
      rect.append(s("title", {}, `${t} ${d}: ${v} ${METRICS[metric]}`));
      svg.append(rect);
      base += v;
    });
    if (days.length <= 16 || i % 2 === 0) svg.append(s("text", { x: L + i * bw + bw / 2, y: H - B + 14, "text-anchor": "middle" }, d.slice(5)));
  });
  const legend = h("div", { class: "legend" }, tenants.map((t, j) => h("span", {},
    s("svg", { width: 10, height: 10 }, s("rect", { width: 10, height: 10, fill: COLORS[j % COLORS.length] })), " ", t)));
  return [svg, tenants.length ? legend : h("p", { class: "muted" }, "No usage recorded in these days.")];
}

function meter(ratio) {
  const r = Math.max(0, Math.min(1, ratio || 0));
  const color = r >= 0.9 ? "#cf222e" : r >= 0.6 ? "#bf8700" : "#2da44e";
  return s("svg", { width: 96, height: 10, class: "split", role: "img", "aria-label": `${Math.round(r * 100)} % used` },
    s("rect", { width: 96, height: 10, fill: "#eaeef2", rx: 2 }), s("rect", { width: 96 * r, height: 10, fill: color, rx: 2 }));
}

function limitCell(l) {
  if (!l || l.limit === null) return "no limit";
  const used = l.used === null ? "-" : l.used;
  const reset = l.resets_in_ms ? ` (resets in ${Math.ceil(l.resets_in_ms / 1000)} s)` : "";
  return h("span", {}, meter(l.ratio), ` ${used} / ${l.limit}${reset}`);
}

export function mount(root, ctx) {
  useStyle();
  clear(root);
  if (ctx.needsAdmin(root)) {
    ctx.onKeyChange(() => mount(root, ctx));
    return undefined;
  }
  let metric = "completion_tokens";
  const message = h("p", { id: "keys-message", class: "muted", role: "status" });
  const secretBox = h("div", { id: "secret-box" });
  const keysBody = h("tbody", { id: "keys" });
  const chartBox = h("div", { id: "usage-chart" });
  const usageBody = h("tbody", { id: "usage" });
  const limitsBody = h("tbody", { id: "limits" });
  const field = (label, attrs) => h("label", {}, label, h("input", attrs));
  const form = h("form", { class: "newkey", id: "new-key" },
    field("name", { name: "name", required: true, pattern: "[A-Za-z0-9][A-Za-z0-9._\\-]{0,63}", placeholder: "team-a" }),
    h("label", {}, "role", h("select", { name: "role" }, h("option", { value: "user" }, "user"), h("option", { value: "admin" }, "admin"))),
    field("models (comma-separated; empty: all)", { name: "models" }),
    field("requests / min", { name: "rpm", type: "number", min: 1 }),
    field("tokens / min", { name: "tpm", type: "number", min: 1 }),
    field("concurrency", { name: "max_concurrency", type: "number", min: 1 }),
    field("token budget", { name: "budget_tokens", type: "number", min: 1 }),
    h("label", {}, "budget per", h("select", { name: "budget_period" }, h("option", { value: "month" }, "month"), h("option", { value: "day" }, "day"))),
    h("button", { type: "submit", class: "primary" }, "Create key"));

  function showSecret(name, secret) {
    clear(secretBox);
    const input = h("input", { readonly: true, value: secret, id: "new-secret", "aria-label": `secret of ${name}` });
    secretBox.append(h("div", { class: "secret" }, h("b", {}, name), input,
      h("span", {}, "Shown once: copy it now."), h("button", { type: "button", onclick: () => clear(secretBox) }, "Done")));
    input.select();
  }

  async function act(path, what) {
    try {
      const body = await ctx.json(path, { method: "POST" });
      message.textContent = what;
      if (body.key) showSecret(body.name, body.key);
    } catch (err) {
      message.textContent = errorText(err);
    }
    loadKeys();
  }

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const data = new FormData(form);
    const body = { name: data.get("name"), role: data.get("role"), budget_period: data.get("budget_period") };
    const models = String(data.get("models") || "").split(",").map((m) => m.trim()).filter(Boolean);
    if (models.length) body.models = models;
    for (const k of ["rpm", "tpm", "max_concurrency", "budget_tokens"]) if (data.get(k)) body[k] = Number(data.get(k));
    try {
      const made = await ctx.json("/admin/keys", { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) });
      message.textContent = `key ${made.name} created`;
      showSecret(made.name, made.key);
      form.reset();
    } catch (err) {
      message.textContent = errorText(err) + (err.param ? ` (${err.param})` : "");
    }
    loadKeys();
  });

  async function loadKeys() {
    try {
      const keys = (await ctx.json("/admin/keys")).data;
      clear(keysBody);
      for (const k of keys) {
        const limits = [k.rpm && `${k.rpm} req/min`, k.tpm && `${k.tpm} tok/min`, k.max_concurrency && `${k.max_concurrency} at once`,
          k.budget_tokens && `${k.budget_tokens} tok/${k.budget_period}`].filter(Boolean).join(", ") || "none";
        const buttons = k.static ? h("span", { class: "muted" }, "config file")
          : k.active ? h("span", { class: "actions" },
            h("button", { type: "button", onclick: () => act(`/admin/keys/${encodeURIComponent(k.name)}/rotate`, `key ${k.name} rotated`) }, "Rotate"),
            h("button", { type: "button", onclick: () => act(`/admin/keys/${encodeURIComponent(k.name)}/revoke`, `key ${k.name} revoked`) }, "Revoke"))
            : h("span", { class: "muted" }, "revoked");
        keysBody.append(row([k.name, k.role, (k.models || []).join(", ") || "all", limits,
          k.created_at ? new Date(k.created_at * 1000).toISOString().slice(0, 16).replace("T", " ") : "-", buttons],
        { "data-key": k.name, class: k.active ? "active" : "revoked" }));
      }
    } catch (err) {
      message.textContent = errorText(err);
    }
    loadLimits();
  }

  async function loadUsage() {
    const days = dayList(DAYS);
    try {
      const rows = (await ctx.json(`/admin/usage?since=${days[0]}`)).data;
      const data = perTenantDay(rows);
      clear(chartBox).append(...chart(data, days, metric));
      clear(usageBody);
      for (const t of Object.keys(data).sort()) {
        for (const d of Object.keys(data[t]).sort().reverse()) {
          const u = data[t][d];
          usageBody.append(row([t, d, u.prompt_tokens, u.completion_tokens, u.requests, u.rejected, u.errors]));
        }
      }
    } catch (err) {
      clear(chartBox).append(h("p", { class: "err" }, errorText(err)));
    }
  }

  async function loadLimits() {
    try {
      const body = await ctx.json("/admin/limits");
      clear(limitsBody);
      for (const t of body.data) {
        limitsBody.append(row([t.tenant, limitCell(t.limits.rpm), limitCell(t.limits.tpm), limitCell(t.limits.concurrency),
          limitCell(t.limits.budget), t.seen_at ? new Date(t.seen_at * 1000).toISOString().slice(11, 19) : "no request yet"],
        { "data-tenant": t.tenant }));
      }
    } catch (err) {
      clear(limitsBody).append(row([errorText(err)]));
    }
  }

  const picker = h("select", { id: "usage-metric", onchange: (e) => { metric = e.target.value; loadUsage(); } },
    Object.entries(METRICS).map(([k, label]) => h("option", { value: k, selected: k === metric }, label)));
  root.append(
    h("h2", {}, "Keys"), message, secretBox, form,
    h("table", {}, head("name", "role", "models", "limits", "created (UTC)", ""), keysBody),
    h("h2", {}, "Usage per tenant per day (UTC)"),
    h("div", { class: "filters" }, h("label", {}, "show", picker), h("button", { type: "button", onclick: loadUsage }, "Refresh")),
    chartBox,
    h("details", {}, h("summary", { class: "muted" }, "as a table"),
      h("table", {}, head("tenant", "day", "tokens in", "tokens out", "requests", "refusals", "errors"), usageBody)),
    h("h2", {}, "Limits and headroom"),
    h("p", { class: "muted" }, "Used: as each tenant's last request through this gateway found its counters."),
    h("table", {}, head("tenant", "requests / window", "tokens / window", "concurrency", "budget", "last request (UTC)"), limitsBody));
  ctx.onKeyChange(() => mount(root, ctx));
  loadKeys();
  loadUsage();
  return undefined;
}
