// dom.js — the chat page's small DOM helpers: element lookup, element creation (children
// are always text or nodes, never HTML) and the byte and time formats it shows.

export const $ = (id) => document.getElementById(id);

/** createElement with props; children are Nodes or strings (always text). */
export function h(tag, props = {}, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(props)) {
    if (k === "class") e.className = v;
    else if (k === "text") e.textContent = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else if (v === true) e.setAttribute(k, "");
    else if (v !== false && v != null) e.setAttribute(k, String(v));
  }
  for (const kid of kids.flat()) if (kid != null && kid !== false) e.append(kid instanceof Node ? kid : String(kid));
  return e;
}

export const code = (s) => h("code", {}, s);

export function formatBytes(n) {
  if (n == null || !Number.isFinite(n)) return "—";
  const units = ["B", "KB", "MB", "GB", "TB"];
  let i = 0;
  while (Math.abs(n) >= 1000 && i < units.length - 1) {
    n /= 1000;
    i++;
  }
  return `${i ? n.toFixed(n < 10 ? 2 : n < 100 ? 1 : 0) : n} ${units[i]}`;
}

export function formatSeconds(s) {
  if (!Number.isFinite(s) || s < 0) return "";
  if (s < 1) return "less than a second left";
  if (s < 90) return `${Math.ceil(s)} s left`;
  return `${Math.round(s / 60)} min left`;
}
