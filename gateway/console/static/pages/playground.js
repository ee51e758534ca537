// The playground: chat with a served model through the public API (/v1/chat/completions or
// /v1/responses), streamed; beside each answer the facts the gateway sends (engine, replica, queue
// wait) and those the page measures (TTFT, tokens/s), and the exact request as curl / Python / TypeScript.
import { h, clear, fmt } from "../dom.js";
import { readSSE } from "../sse.js";
import { snippets } from "../snippets.js";

const FACT_HEADERS = { engine: "x-enginegate-engine", replica: "x-enginegate-replica", queue: "x-enginegate-queue-ms",
  requestId: "x-enginegate-request-id" };

export function mount(root, ctx) {
  const s = { models: [], history: [], previousResponseId: null, pending: [], controller: null, gone: false };
  const field = (id, el) => { el.id = id; return el; };
  const ui = {
    model: field("pg-model", h("select", { "aria-label": "Model" })),
    mode: field("pg-mode", h("select", {}, h("option", { value: "chat" }, "Chat completions"),
      h("option", { value: "responses" }, "Responses (previous_response_id)"))),
    system: field("pg-system", h("textarea", { rows: 3, placeholder: "You are a helpful assistant." })),
    temperature: field("pg-temperature", h("input", { type: "number", min: 0, max: 2, step: 0.1, placeholder: "engine default" })),
    maxTokens: field("pg-max-tokens", h("input", { type: "number", min: 1, step: 1, value: "256" })),
    stop: field("pg-stop", h("textarea", { rows: 2, placeholder: "one stop sequence per line" })),
    format: field("pg-format", h("select", {}, h("option", { value: "text" }, "text"),
      h("option", { value: "json_object" }, "JSON mode"), h("option", { value: "json_schema" }, "JSON schema"))),
    schema: field("pg-schema", h("textarea", { rows: 4, class: "code", placeholder: '{"type": "object", "properties": {...}}' })),
    tools: field("pg-tools", h("textarea", { rows: 5, class: "code", placeholder: '[{"type": "function", "function": {"name": "...", "parameters": {...}}}]' })),
    toolChoice: field("pg-tool-choice", h("select", {})),
    stream: field("pg-stream", h("input", { type: "checkbox", checked: true })),
    chain: field("pg-chain", h("input", { type: "checkbox", checked: true })),
    input: field("pg-input", h("textarea", { rows: 3, "aria-label": "Message", placeholder: "Type a message (Ctrl+Enter sends)" })),
    send: field("pg-send", h("button", { type: "button", class: "primary" }, "Send")),
    stopBtn: field("pg-abort", h("button", { type: "button", disabled: true }, "Stop")),
    reset: field("pg-new", h("button", { type: "button" }, "New chat")),
    transcript: h("div", { class: "transcript", id: "pg-transcript", "aria-live": "polite" }),
    note: h("p", { class: "muted", id: "pg-note" }),
  };

  const label = (text, el, extra = "") => h("label", { class: extra }, text, el);
  root.append(h("div", { class: "playground" },
    h("form", { class: "settings", id: "pg-settings", onsubmit: (e) => e.preventDefault() },
      label("Model", ui.model), label("API", ui.mode),
      label("System prompt", ui.system),
      h("div", { class: "row" }, label("Temperature", ui.temperature), label("Max tokens", ui.maxTokens)),
      label("Stop (chat only)", ui.stop),
      label("Response format", ui.format), label("JSON schema", ui.schema),
      label("Tools (JSON list)", ui.tools), label("Tool choice", ui.toolChoice),
      h("label", { class: "inline" }, ui.stream, "Stream"),
      h("label", { class: "inline" }, ui.chain, "Responses: chain with previous_response_id"),
      h("div", {}, ui.reset)),
    h("section", { class: "chat" }, ui.note, ui.transcript,
      h("div", { class: "composer" }, ui.input, h("div", { class: "buttons" }, ui.send, ui.stopBtn)),
      h("p", { class: "muted" }, "Each message is an ordinary API call with your key; nothing is kept on the server ",
        "but what the API itself keeps (a Responses answer is stored for previous_response_id)."))));

  function toolList() {
    const text = ui.tools.value.trim();
    if (!text) return null;
    const tools = JSON.parse(text);
    if (!Array.isArray(tools)) throw new Error("tools: a JSON list of tools");
    return tools;
  }

  function refreshToolChoice() {
    const keep = ui.toolChoice.value;
    let names = [];
    try { names = (toolList() || []).map((t) => (t.function || t).name).filter(Boolean); } catch { names = []; }
    clear(ui.toolChoice).append(h("option", { value: "" }, "(not sent)"), h("option", { value: "auto" }, "auto"),
      h("option", { value: "none" }, "none"), h("option", { value: "required" }, "required"),
      ...names.map((n) => h("option", { value: "fn:" + n }, "function " + n)));
    if ([...ui.toolChoice.options].some((o) => o.value === keep)) ui.toolChoice.value = keep;
  }
  ui.tools.addEventListener("input", refreshToolChoice);
  refreshToolChoice();

  async function loadModels() {
    try {
      const body = await ctx.json("/v1/models");
      s.models = body.data || [];
      const keep = ui.model.value;
      clear(ui.model).append(...s.models.map((m) => h("option", { value: m.id }, m.id + (m.engine ? " (" + m.engine + ")" : ""))));
      if (s.models.some((m) => m.id === keep)) ui.model.value = keep;
      ui.note.textContent = s.models.length ? "" : "This key may use no served model.";
    } catch (err) {
      clear(ui.model);
      ui.note.textContent = err.status === 401 ? "Type your API key above to list the models." : "Models: " + err.message;
    }
  }
  ctx.onKeyChange(loadModels);
  loadModels();

  function newChat() {
    if (s.controller) s.controller.abort();
    s.history = []; s.previousResponseId = null; s.pending = [];
    clear(ui.transcript);
    ui.input.placeholder = "Type a message (Ctrl+Enter sends)";
  }
  ui.reset.addEventListener("click", newChat);
  ui.mode.addEventListener("change", newChat);

  // The next turn: a user message, or the results of the tool calls the model made.
  function turn(text) {
    if (s.pending.length) return s.pending.map((c) => ({ role: "tool", tool_call_id: c.id, name: c.name, content: text }));
    return [{ role: "user", content: text }];
  }

  function chatBody(turns) {
    const body = { model: ui.model.value, messages: [] };
    if (ui.system.value.trim()) body.messages.push({ role: "system", content: ui.system.value });
    body.messages.push(...s.history, ...turns);
    common(body, "max_tokens");
    const stop = ui.stop.value.split("\n").filter((x) => x !== "");
    if (stop.length) body.stop = stop;
    if (ui.format.value === "json_object") body.response_format = { type: "json_object" };
    if (ui.format.value === "json_schema") body.response_format = { type: "json_schema", json_schema: { name: "answer", schema: schema() } };
    const tools = toolList();
    if (tools) body.tools = tools;
    const choice = ui.toolChoice.value;
    if (choice) body.tool_choice = choice.startsWith("fn:") ? { type: "function", function: { name: choice.slice(3) } } : choice;
    if (ui.stream.checked) { body.stream = true; body.stream_options = { include_usage: true }; }
    return body;
  }

  function responsesBody(text) {
    const body = { model: ui.model.value };
    if (s.pending.length) body.input = s.pending.map((c) => ({ type: "function_call_output", call_id: c.id, output: text }));
    else body.input = text;
    if (ui.system.value.trim()) body.instructions = ui.system.value;
    if (ui.chain.checked && s.previousResponseId) body.previous_response_id = s.previousResponseId;
    common(body, "max_output_tokens");
    if (ui.format.value === "json_object") body.text = { format: { type: "json_object" } };
    if (ui.format.value === "json_schema") body.text = { format: { type: "json_schema", name: "answer", schema: schema() } };
    const tools = toolList();
    if (tools) body.tools = tools.map((t) => (t.type === "function" && t.function ? { type: "function", ...t.function } : t));
    const choice = ui.toolChoice.value;
    if (choice) body.tool_choice = choice.startsWith("fn:") ? { type: "function", name: choice.slice(3) } : choice;
    if (ui.stream.checked) body.stream = true;
    return body;
  }

  function common(body, maxName) {
    if (ui.temperature.value !== "") body.temperature = Number(ui.temperature.value);
    if (ui.maxTokens.value !== "") body[maxName] = Number(ui.maxTokens.value);
  }

  function schema() {
    try { return JSON.parse(ui.schema.value); } catch (err) { throw new Error("JSON schema: " + err.message); }
  }

  function bubble(role, text) {
    const el = h("div", { class: "msg " + role, "data-role": role }, h("div", { class: "role" }, role), h("div", { class: "text" }, text));
    ui.transcript.append(el);
    return el;
  }

  async function send() {
    if (s.controller) return;
    const text = ui.input.value;
    if (!text.trim() && !s.pending.length) return;
    const mode = ui.mode.value;
    let body, path, turns = null;
    try {
      if (mode === "chat") { turns = turn(text); body = chatBody(turns); path = "/v1/chat/completions"; }
      else { body = responsesBody(text); path = "/v1/responses"; }
    } catch (err) {
      ui.note.textContent = err.message;
      return;
    }
    ui.note.textContent = "";
    bubble(s.pending.length ? "tool" : "user", text);
    ui.input.value = "";
    const answer = new Answer(ui.transcript, path, body);
    s.controller = new AbortController();
    ui.send.disabled = true; ui.stopBtn.disabled = false;
    try {
      const result = await call(ctx, path, body, s.controller.signal, answer, s.models.find((m) => m.id === body.model));
      if (result.ok) {
        if (mode === "chat") {
          s.history.push(...turns, result.message);
        } else if (result.responseId) {
          s.previousResponseId = result.responseId;
        }
        s.pending = result.toolCalls.map((c) => ({ id: c.id, name: c.name }));
        ui.input.placeholder = s.pending.length
          ? "Result of " + s.pending.map((c) => c.name).join(", ") + " (sent as the tool's output)"
          : "Type a message (Ctrl+Enter sends)";
      }
    } finally {
      s.controller = null;
      if (!s.gone) { ui.send.disabled = false; ui.stopBtn.disabled = true; }
    }
  }
  ui.send.addEventListener("click", send);
  ui.stopBtn.addEventListener("click", () => s.controller && s.controller.abort());
  ui.input.addEventListener("keydown", (e) => { if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) { e.preventDefault(); send(); } });

  return () => { s.gone = true; if (s.controller) s.controller.abort(); };
}

// One assistant answer: its text growing as it streams, tool calls as such, facts, copy buttons.
class Answer {
  constructor(parent, path, body) {
    this.text = h("div", { class: "text", "data-testid": "answer-text" });
    this.calls = h("div", { class: "toolcalls" });
    this.facts = h("div", { class: "facts", "data-testid": "facts" });
    this.error = h("div", { class: "error-detail" });
    this.snippet = h("pre", { class: "snippet", hidden: true });
    const copy = h("div", { class: "copy" }, h("span", { class: "muted" }, "Copy as"),
      ...["curl", "Python", "TypeScript"].map((lang) => h("button", { type: "button", "data-copy": lang,
        onclick: () => this.copy(lang) }, lang)));
    this.el = h("div", { class: "msg assistant", "data-role": "assistant", "data-state": "waiting" },
      h("div", { class: "role" }, "assistant"), this.text, this.calls, this.error, this.facts, copy, this.snippet);
    this.path = path;
    this.body = body;
    this.toolCards = new Map();
    parent.append(this.el);
  }

  state(name) { this.el.dataset.state = name; }

  append(delta) {
    this.text.append(document.createTextNode(delta));
    this.state("streaming");
  }

  toolCall(key, call) {
    let card = this.toolCards.get(key);
    if (!card) {
      card = { name: h("span", { class: "name", "data-testid": "tool-name" }), args: h("pre", { "data-testid": "tool-arguments" }) };
      this.calls.append(h("div", { class: "toolcall", "data-testid": "tool-call" }, h("span", { class: "muted" }, "tool call "),
        card.name, card.args));
      this.toolCards.set(key, card);
    }
    card.name.textContent = call.name || "";
    let args = call.arguments || "";
    try { args = JSON.stringify(JSON.parse(args), null, 2); } catch { /* partial while streaming: as sent */ }
    card.args.textContent = args;
    this.state("streaming");
  }

  fact(name, label, value) {
    if (value === null || value === undefined || value === "") return;
    this.facts.append(h("span", { "data-fact": name }, label + " ", h("b", {}, String(value))));
  }

  link(name, label, href, text) {
    this.facts.append(h("span", { "data-fact": name }, label + " ",
      h("a", { href, target: "_blank", rel: "noopener noreferrer" }, text)));
  }

  fail(err) {
    this.el.classList.add("error");
    this.state("error");
    const fields = [["status", err.status], ["type", err.type], ["code", err.code], ["param", err.param]]
      .filter(([, v]) => v !== null && v !== undefined && v !== "");
    this.error.append(h("div", { class: "text", "data-testid": "error-message" }, err.message),
      h("dl", { class: "errfields" }, fields.map(([k, v]) => [h("dt", {}, k), h("dd", { "data-error": k }, String(v))])));
    if (err.retryAfter !== null && err.retryAfter !== undefined && isFinite(err.retryAfter)) {
      const retry = h("span", { "data-fact": "retry-after" }, "retry after ", h("b", {}, err.retryAfter + " s"));
      this.error.append(h("p", {}, retry));
    }
  }

  async copy(lang) {
    const text = snippets(location.origin, this.path, this.body)[lang];
    this.snippet.hidden = false;
    this.snippet.dataset.lang = lang;
    this.snippet.textContent = text;
    try { await navigator.clipboard.writeText(text); this.snippet.title = "copied"; }
    catch { this.snippet.title = "select and copy (the clipboard needs https or localhost)"; }
  }
}

// Send one request and render its answer; returns {ok, message, responseId, toolCalls}.
async function call(ctx, path, body, signal, answer, model) {
  const started = performance.now();
  let first = null, last = null, chunks = 0;
  const out = { ok: false, message: null, responseId: null, toolCalls: [] };
  let response;
  try {
    response = await ctx.api(path, { method: "POST", headers: { "Content-Type": "application/json" },
      body: JSON.stringify(body), signal });
  } catch (err) {
    answer.fail({ message: err.name === "AbortError" ? "stopped" : "network: " + err.message, status: null });
    return out;
  }
  if (!response.ok) {
    let errBody = null;
    try { errBody = await response.json(); } catch { errBody = null; }
    answer.fail(new ctx.ApiError(response.status, errBody, response));
    return out;
  }
  const facts = Object.fromEntries(Object.entries(FACT_HEADERS).map(([k, name]) => [k, response.headers.get(name)]));
  const seen = () => { const now = performance.now(); if (first === null) first = now; last = now; chunks += 1; };
  const text = [];
  const calls = new Map(); // index or item id -> {id, name, arguments}
  let usage = null, finish = null, failure = null;

  const onCall = (key, patch) => {
    const c = calls.get(key) || { id: "", name: "", arguments: "" };
    if (patch.id) c.id = patch.id;
    if (patch.name) c.name = patch.name;
    if (patch.arguments !== undefined) c.arguments = patch.replace ? patch.arguments : c.arguments + patch.arguments;
    calls.set(key, c);
    answer.toolCall(key, c);
  };

  try {
    if (!body.stream) {
      const data = await response.json();
      seen();
      if (path === "/v1/chat/completions") {
        const choice = (data.choices || [])[0] || {};
        const msg = choice.message || {};
        if (msg.content) { text.push(msg.content); answer.append(msg.content); }
        (msg.tool_calls || []).forEach((tc, i) => onCall(i, { id: tc.id, name: tc.function.name, arguments: tc.function.arguments }));
        finish = choice.finish_reason; usage = data.usage;
      } else {
        responsesFinal(data);
        for (const [i, item] of (data.output || []).entries()) {
          if (item.type === "message") for (const part of item.content || []) if (part.text) { text.push(part.text); answer.append(part.text); }
          if (item.type === "function_call") onCall(i, { id: item.call_id, name: item.name, arguments: item.arguments });
        }
      }
    } else {
      for await (const event of readSSE(response.body)) {
        if (event.data === "[DONE]") break;
        let data;
        try { data = JSON.parse(event.data); } catch { continue; }
        if (data.error) { failure = data.error; break; }
        if (path === "/v1/chat/completions") {
          if (data.usage) usage = data.usage;
          const choice = (data.choices || [])[0];
          if (!choice) continue;
          const delta = choice.delta || {};
          if (delta.content) { seen(); text.push(delta.content); answer.append(delta.content); }
          for (const tc of delta.tool_calls || []) {
            seen();
            onCall(tc.index ?? 0, { id: tc.id, name: tc.function && tc.function.name, arguments: (tc.function && tc.function.arguments) || "" });
          }
          if (choice.finish_reason) finish = choice.finish_reason;
        } else {
          const type = data.type || event.event;
          if (type === "response.output_text.delta") { seen(); text.push(data.delta); answer.append(data.delta); }
          else if (type === "response.output_item.added" && data.item && data.item.type === "function_call") {
            seen(); onCall(data.item.id, { id: data.item.call_id, name: data.item.name, arguments: data.item.arguments || "", replace: true });
          } else if (type === "response.function_call_arguments.delta") { seen(); onCall(data.item_id, { arguments: data.delta }); }
          else if (type === "response.output_item.done" && data.item && data.item.type === "function_call") {
            onCall(data.item.id, { id: data.item.call_id, name: data.item.name, arguments: data.item.arguments, replace: true });
          } else if (type === "response.completed" || type === "response.incomplete") responsesFinal(data.response);
          else if (type === "response.failed") { failure = (data.response && data.response.error) || { message: "response failed" }; }
          else if (type === "error") failure = data;
        }
      }
    }
  } catch (err) {
    failure = { message: err.name === "AbortError" ? "stopped" : String(err.message || err) };
  }

  function responsesFinal(r) {
    if (!r) return;
    out.responseId = r.id || null;
    finish = r.status === "incomplete" ? "incomplete: " + ((r.incomplete_details || {}).reason || "") : r.status;
    if (r.usage) usage = { prompt_tokens: r.usage.input_tokens, completion_tokens: r.usage.output_tokens,
      prompt_tokens_details: r.usage.input_tokens_details };
  }

  const ended = performance.now();
  if (failure) answer.fail({ message: failure.message || String(failure), status: null, type: failure.type || null,
    code: failure.code || null, param: failure.param ?? null });
  else answer.state("done");
  const engine = facts.engine || (model && model.engine ? model.engine + " (from /v1/models)" : null);
  answer.fact("engine", "engine", engine);
  answer.fact("replica", "replica", facts.replica);
  answer.fact("queue", "queue", facts.queue !== null ? fmt(Number(facts.queue), 1) + " ms" : null);
  answer.fact("ttft", body.stream ? "TTFT" : "time (not streamed)", first !== null ? fmt(first - started, 0) + " ms" : null);
  const completion = usage && usage.completion_tokens;
  const n = completion || chunks;
  if (body.stream && first !== null && last > first && n > 1) answer.fact("tps", "tokens/s", fmt((n - 1) / ((last - first) / 1000), 1));
  if (usage) {
    const cached = (usage.prompt_tokens_details || {}).cached_tokens;
    answer.fact("cached", "prompt tokens cached", cached === undefined || cached === null
      ? `not reported (prompt ${usage.prompt_tokens})` : `${cached} of ${usage.prompt_tokens}`);
    answer.fact("tokens", "completion tokens", completion);
  }
  answer.fact("finish", "finish", finish);
  answer.fact("total", "total", fmt(ended - started, 0) + " ms");
  answer.fact("request-id", "request", facts.requestId);
  if (facts.requestId) recorded(ctx, answer, facts.requestId);
  if (failure) return out;
  out.ok = true;
  out.toolCalls = [...calls.values()];
  const message = { role: "assistant", content: text.join("") || null };
  if (out.toolCalls.length) message.tool_calls = out.toolCalls.map((c) => ({ id: c.id, type: "function", function: { name: c.name, arguments: c.arguments } }));
  out.message = message;
  return out;
}

// The gateway's own record of the request (GET /admin/requests?id=: any key sees its own tenant's
// rows): the time split into prefill and decode, and the trace when tracing is on. The row is written
// as the response ends, so a first miss is asked once more.
async function recorded(ctx, answer, id) {
  for (const wait of [0, 300]) {
    if (wait) await new Promise((resolve) => setTimeout(resolve, wait));
    let body;
    try { body = await ctx.json("/admin/requests?limit=1&id=" + encodeURIComponent(id)); } catch { return; }
    const row = (body.data || [])[0];
    if (!row) continue;
    answer.fact("prefill", "prefill", row.prefill_ms !== null && row.prefill_ms !== undefined ? fmt(row.prefill_ms, 0) + " ms" : null);
    answer.fact("decode", "decode", row.decode_ms !== null && row.decode_ms !== undefined ? fmt(row.decode_ms, 0) + " ms" : null);
    if (row.trace_id && body.trace_url) answer.link("trace", "trace", body.trace_url.replace("{trace_id}", row.trace_id), row.trace_id.slice(0, 12));
    return;
  }
}
