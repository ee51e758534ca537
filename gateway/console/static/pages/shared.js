// Helpers the Models, Keys & usage and Live requests pages share (not a tab itself).
import { h } from "../dom.js";

export function useStyle() {
  if (!document.querySelector("link[data-admin-css]")) {
    document.head.append(h("link", { rel: "stylesheet", href: "/console/pages/admin.css", "data-admin-css": "" }));
  }
}

export const SVG_NS = "http://www.w3.org/2000/svg";
export function s(tag, attrs = {}, ...children) {
  const el = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs)) if (v !== null && v !== undefined) el.setAttribute(k, String(v));
  for (const c of children) el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return el;
}

// A cell per value; numbers right-aligned.
export function row(values, attrs = {}) {
  return h("tr", attrs, values.map((v) => (v instanceof Node ? h("td", {}, v)
    : h("td", typeof v === "number" ? { class: "num" } : {}, v === null || v === undefined ? "-" : String(v)))));
}

export function head(...names) {
  return h("thead", {}, h("tr", {}, names.map((n) => h("th", {}, n))));
}

export function bytes(n) {
  if (n === null || n === undefined) return "-";
  const units = ["B", "KB", "MB", "GB", "TB"];
  let i = 0;
  let v = n;
  while (v >= 1000 && i < units.length - 1) { v /= 1000; i++; }
  return (i ? v.toFixed(1) : String(v)) + " " + units[i];
}

export function errorText(err) {
  return err && err.status ? `${err.status}: ${err.message}` : String((err && err.message) || err);
}

export const COLORS = ["#0969da", "#bf3989", "#1a7f37", "#bc4c00", "#8250df", "#57606a", "#0598bc", "#9a6700"];
