// The console shell: tabs routed by the hash (#/playground ...), the key box (sessionStorage only),
// and ctx for each page: api() adds `Authorization: Bearer <key>` to an ordinary same-origin call.
// A page is pages/<name>.js exporting mount(root, ctx); mount may return a function the shell
// calls when the tab is left (stop timers, close streams). No build step, no framework.
import { h, clear } from "./dom.js";

export const TABS = [
  { name: "playground", title: "Playground" },
  { name: "models", title: "Models" },
  { name: "keys", title: "Keys & usage", admin: true },
  { name: "requests", title: "Live requests" },
  { name: "status", title: "Status" },
];
const DEFAULT_TAB = "playground";
const KEY_ITEM = "enginegate-key"; // the status page's item name, kept so a key typed there still works

let keyListeners = new Set();
let unmount = null;
let mountedTab = null;
let firstCheck = null; // pages mount once the key's access is known

export function currentKey() {
  return sessionStorage.getItem(KEY_ITEM) || "";
}

// fetch() for this gateway with the typed key; `init.headers` may be a plain object.
export function api(path, init = {}) {
  const headers = new Headers(init.headers || {});
  const key = currentKey();
  if (key && !headers.has("Authorization")) headers.set("Authorization", "Bearer " + key);
  return fetch(path, { cache: "no-store", ...init, headers });
}

export class ApiError extends Error {
  constructor(status, body, response) {
    const e = (body && body.error) || {};
    super(e.message || `HTTP ${status}`);
    this.status = status;
    this.type = e.type || null;
    this.code = e.code || null;
    this.param = e.param ?? null;
    const retry = response ? response.headers.get("retry-after") : null;
    this.retryAfter = retry === null ? null : Number(retry);
  }
}

// The response's JSON; a non-2xx answer throws ApiError carrying the API's message and fields.
export async function json(path, init = {}) {
  const response = await api(path, init);
  let body = null;
  try { body = await response.json(); } catch { body = null; }
  if (!response.ok) throw new ApiError(response.status, body, response);
  return body;
}

// What this gateway lets the typed key do: {open} no keys configured, {valid, admin} for a key.
export const access = { checked: false, open: false, valid: false, admin: false, note: "" };

async function probe(path, withKey) {
  const headers = new Headers();
  if (withKey && currentKey()) headers.set("Authorization", "Bearer " + currentKey());
  return (await fetch(path, { cache: "no-store", headers })).status;
}

async function checkAccess() {
  const el = document.getElementById("access");
  try {
    const anonymous = await probe("/v1/models", false);
    access.open = anonymous === 200;
    access.valid = access.open;
    access.admin = access.open;
    if (access.open) {
      access.note = "No keys configured: this gateway is open to anyone who can reach it (local use).";
    } else if (!currentKey()) {
      access.note = "This gateway needs an API key: type yours.";
    } else {
      const user = await probe("/v1/models", true);
      access.valid = user === 200;
      if (!access.valid) {
        access.note = user === 401 ? "This key is not accepted (wrong, revoked or expired)." : `Key check answered ${user}.`;
      } else {
        const admin = await probe("/admin/keys", true);
        access.admin = admin === 200;
        access.note = access.admin ? "Admin key." : (admin === 403 ? "User key (admin pages need an admin key)." : "Key accepted.");
      }
    }
  } catch (err) {
    access.note = "Cannot reach the gateway: " + (err.message || err);
  }
  access.checked = true;
  el.textContent = access.note;
  el.className = "access " + (access.open ? "open" : access.admin ? "admin" : access.valid ? "user" : "none");
  renderTabs();
}

function setKey(key) {
  if (key) sessionStorage.setItem(KEY_ITEM, key); else sessionStorage.removeItem(KEY_ITEM);
  document.getElementById("key").value = "";
  document.getElementById("key").placeholder = key ? "key set (" + key.length + " characters)" : "sk-...";
  checkAccess().then(() => { for (const fn of [...keyListeners]) fn(); });
}

function tabFromHash() {
  const name = (location.hash.match(/^#\/([a-z-]+)/) || [])[1];
  return TABS.some((t) => t.name === name) ? name : DEFAULT_TAB;
}

function renderTabs() {
  const active = tabFromHash();
  const nav = document.getElementById("tabs");
  clear(nav);
  for (const t of TABS) {
    const a = h("a", { href: "#/" + t.name, class: "tab" + (t.name === active ? " active" : ""), "data-tab": t.name }, t.title);
    if (t.name === active) a.setAttribute("aria-current", "page");
    if (t.admin && access.checked && !access.admin) a.title = "needs an admin key";
    nav.append(a);
  }
}

// Shown by an admin page when the typed key is not an admin's.
export function needsAdmin(root) {
  if (access.admin) return false;
  clear(root);
  root.append(h("p", { class: "notice" }, "This page needs an admin key: type one in the key box above."));
  return true;
}

async function show() {
  const name = tabFromHash();
  renderTabs();
  if (name === mountedTab) return;
  if (unmount) { try { unmount(); } catch (err) { console.warn(err); } }
  unmount = null;
  keyListeners = new Set();
  mountedTab = name;
  const root = document.getElementById("page");
  clear(root);
  root.dataset.page = name;
  const listeners = keyListeners;
  const ctx = { api, json, access, needsAdmin, ApiError, onKeyChange: (fn) => listeners.add(fn) };
  await firstCheck;
  let page;
  try {
    page = await import(`./pages/${name}.js`);
  } catch (err) {
    root.append(h("p", { class: "notice" }, `The ${name} page is not available in this build.`));
    return;
  }
  if (mountedTab !== name) return; // the user moved on while it loaded
  const done = page.mount(root, ctx);
  unmount = typeof done === "function" ? done : null;
}

function start() {
  document.getElementById("keybox").addEventListener("submit", (event) => {
    event.preventDefault();
    setKey(document.getElementById("key").value.trim());
  });
  document.getElementById("key-forget").addEventListener("click", () => setKey(""));
  if (currentKey()) document.getElementById("key").placeholder = "key set (" + currentKey().length + " characters)";
  window.addEventListener("hashchange", show);
  firstCheck = checkAccess();
  show();
}

start();
