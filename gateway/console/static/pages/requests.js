// The Live requests tab: the last N API requests (tenant name, model, status, timings split into
// queue, prefill and decode), filterable, updating live. The live rows come from
// /admin/requests/stream read with fetch() (EventSource cannot send the Authorization header).
// An admin key sees every tenant's requests, another key its own.
import { h, clear, fmt } from "../dom.js";
import { useStyle, head, errorText, s } from "./shared.js";

const SPLIT = [["queue_ms", "#bf8700", "queue"], ["prefill_ms", "#0969da", "prefill"], ["decode_ms", "#1a7f37", "decode"]];
const RETRY_MS = 2000;

function split(r) {
  const total = r.total_ms || 0;
  const svg = s("svg", { width: 120, height: 10, class: "split", role: "img",
    "aria-label": SPLIT.map(([k, , name]) => `${name} ${fmt(r[k], 0)} ms`).join(", ") });
  svg.append(s("rect", { width: 120, height: 10, fill: "#eaeef2", rx: 2 }));
  let x = 0;
  for (const [k, color] of SPLIT) {
    const w = total > 0 && r[k] ? (120 * r[k]) / total : 0;
    if (w > 0) svg.append(s("rect", { x, width: w, height: 10, fill: color }));
    x += w;
  }
  return svg;
}

function traceLink(r, template) {
  if (!r.trace_id) return "-";
  if (!template) return h("code", { title: "set trace_ui_url to link traces" }, r.trace_id.slice(0, 8));
  return h("a", { href: template.replace("{trace_id}", r.trace_id), target: "_blank", rel: "noopener noreferrer" }, "trace");
}

export function parseEvents(buffer) {
  // -> [rows, rest, ended]: complete SSE events of `data:` rows; `event: end` ends the stream
  const rows = [];
  let ended = false;
  const parts = buffer.split("\n\n");
  const rest = parts.pop();
  for (const part of parts) {
    const lines = part.split("\n");
    if (lines.some((l) => l.startsWith("event: end"))) { ended = true; continue; }
    const data = lines.filter((l) => l.startsWith("data: ")).map((l) => l.slice(6)).join("\n");
    if (data) { try { rows.push(JSON.parse(data)); } catch { /* not a row */ } }
  }
  return [rows, rest, ended];
}

export function mount(root, ctx) {
  useStyle();
  clear(root);
  let controller = null;
  let retry = null;
  let stopped = false;
  let traceTemplate = null;
  const rows = [];
  const body = h("tbody", { id: "request-rows" });
  const live = h("span", { class: "live off", id: "live-state", role: "status" }, "connecting");
  const message = h("p", { class: "muted", id: "requests-message" });
  const input = (name, label, attrs = {}) => h("label", {}, label, h("input", { name, ...attrs }));
  const filters = h("form", { class: "filters", id: "request-filters" },
    input("model", "model"), input("tenant", "tenant"),
    h("label", {}, "status", h("select", { name: "status" }, [["", "any"], ["error", "errors (400+)"], ["2xx", "2xx"],
      ["4xx", "4xx"], ["5xx", "5xx"], ["429", "429"], ["499", "499 (client left)"]].map(([v, l]) => h("option", { value: v }, l)))),
    input("limit", "show last", { type: "number", min: 1, max: 1000, value: 100 }),
    h("button", { type: "submit" }, "Apply"), live);

  function wanted() {
    const data = new FormData(filters);
    const q = new URLSearchParams();
    for (const k of ["model", "tenant", "status"]) if (data.get(k)) q.set(k, String(data.get(k)).trim());
    const limit = Math.max(1, Math.min(1000, Number(data.get("limit")) || 100));
    return [q, limit];
  }

  function render(freshIds = new Set()) {
    const [, limit] = wanted();
    rows.splice(limit);
    clear(body);
    for (const r of rows) {
      const when = new Date(r.created * 1000).toISOString().slice(11, 23);
      const cells = [when, r.tenant ?? "-", r.model ?? "-", r.endpoint.replace("/v1/", ""), r.status,
        r.engine ? `${r.engine}/${r.replica}` : "-", r.stream ? "yes" : "no", fmt(r.queue_ms, 0), fmt(r.ttft_ms, 0),
        fmt(r.prefill_ms, 0), fmt(r.decode_ms, 0), fmt(r.total_ms, 0),
        `${r.prompt_tokens ?? "-"} / ${r.completion_tokens ?? "-"}` + (r.cached_tokens ? ` (${r.cached_tokens} cached)` : ""),
        r.finish_reason ?? "-"];
      const tr = h("tr", { "data-id": r.id, class: (freshIds.has(r.id) ? "fresh " : "") + (r.status >= 400 ? "err" : "") },
        cells.map((c, i) => h("td", i >= 7 && i <= 11 ? { class: "num" } : {}, String(c))),
        h("td", {}, split(r)), h("td", {}, traceLink(r, traceTemplate)));
      tr.children[4].setAttribute("data-field", "status");
      body.append(tr);
    }
    message.textContent = rows.length ? "" : "No request matches yet: rows appear here as requests finish.";
  }

  async function follow(q) {
    controller = new AbortController();
    try {
      const response = await ctx.api("/admin/requests/stream?" + q, { signal: controller.signal });
      if (!response.ok) {
        let err = null;
        try { err = (await response.json()).error; } catch { err = null; }
        throw new Error(`${response.status}: ${(err && err.message) || "stream refused"}`);
      }
      live.textContent = "live";
      live.className = "live on";
      const reader = response.body.getReader();
      const decoder = new TextDecoder();
      let buffer = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += decoder.decode(value, { stream: true });
        const [fresh, rest, ended] = parseEvents(buffer);
        buffer = rest;
        if (fresh.length) {
          rows.unshift(...fresh.reverse());
          render(new Set(fresh.map((r) => r.id)));
        }
        if (ended) break;
      }
    } catch (err) {
      if (stopped || (err && err.name === "AbortError")) return;
      message.textContent = errorText(err);
    }
    if (stopped) return;
    live.textContent = "reconnecting";
    live.className = "live off";
    retry = setTimeout(start, RETRY_MS);
  }

  async function start() {
    if (controller) controller.abort();
    clearTimeout(retry);
    if (stopped) return;
    if (!ctx.access.valid) { // no key typed yet on a gateway that needs one: wait for it
      message.textContent = "This page needs an API key: type one in the key box above.";
      return;
    }
    const [q, limit] = wanted();
    const first = new URLSearchParams(q);
    first.set("limit", String(limit));
    try {
      const got = await ctx.json("/admin/requests?" + first);
      traceTemplate = got.trace_url;
      rows.splice(0, rows.length, ...got.data);
      render();
    } catch (err) {
      message.textContent = errorText(err);
      live.textContent = "off";
      live.className = "live off";
      return;
    }
    follow(q);
  }

  filters.addEventListener("submit", (e) => { e.preventDefault(); start(); });
  root.append(h("h2", {}, "Live requests"),
    h("p", { class: "muted" }, "Timings in ms. The bar splits each request's time into ",
      SPLIT.map(([, color, name], i) => [i ? ", " : "", s("svg", { width: 10, height: 10 }, s("rect", { width: 10, height: 10, fill: color })), " ", name]),
      ". Kept in this gateway's memory only; never a key or any prompt text."),
    filters, message,
    h("table", { class: "requests" }, head("time (UTC)", "tenant", "model", "endpoint", "status", "engine/replica", "stream",
      "queue", "TTFT", "prefill", "decode", "total", "tokens in / out", "finish", "split", "trace"), body));
  ctx.onKeyChange(start);
  start();
  return () => { stopped = true; clearTimeout(retry); if (controller) controller.abort(); };
}
