// chat_list.js — the conversation list's tools: search (titles and message text), import
// of chats exported as JSON (Export → JSON, one conversation or an array of them), and
// what a delete keeps for its Undo. Pure functions over conversations; app.js draws them.

const ROLES = new Set(["system", "user", "assistant"]);

/** Whether conversation `c` matches `query` (case-insensitive, every word somewhere in
 * its title or its messages). An empty query matches everything. */
export function matches(c, query) {
  const words = query.toLowerCase().split(/\s+/).filter(Boolean);
  if (!words.length) return true;
  const text = [c.title || "", ...(c.messages || []).map((m) => m.content || "")].join("\n").toLowerCase();
  return words.every((w) => text.includes(w));
}

/**
 * The conversations in an exported JSON file's `text`: [{conversation}] ready to store,
 * each with a fresh id when `taken(id)` says its own is in use. Throws an Error that says
 * what is wrong with the file.
 */
export function parseImport(text, taken) {
  let data;
  try {
    data = JSON.parse(text);
  } catch (e) {
    throw new Error(`not JSON (${e.message})`);
  }
  const list = Array.isArray(data) ? data : [data];
  if (!list.length) throw new Error("no conversation in it");
  const now = Date.now();
  return list.map((c, i) => {
    const where = list.length > 1 ? `conversation ${i + 1}: ` : "";
    if (!c || typeof c !== "object" || !Array.isArray(c.messages)) throw new Error(`${where}no "messages" list (is it a colibri JSON export?)`);
    const messages = c.messages.map((m, j) => {
      if (!m || !ROLES.has(m.role) || typeof m.content !== "string") throw new Error(`${where}message ${j + 1} needs a role (system, user or assistant) and text content`);
      const out = { role: m.role, content: m.content };
      for (const k of ["stopped", "cut", "finish", "error", "tokens", "tps"]) if (m[k] !== undefined) out[k] = m[k];
      return out;
    });
    const id = typeof c.id === "string" && c.id && !taken(c.id) ? c.id : `c${now.toString(36)}${i}${Math.random().toString(36).slice(2, 8)}`;
    const created = Number.isFinite(c.created) ? c.created : now;
    const conv = { id, title: typeof c.title === "string" ? c.title : "Imported chat", model: typeof c.model === "string" ? c.model : null, created, updated: Number.isFinite(c.updated) ? c.updated : created, messages };
    if (typeof c.title === "string" && c.title) conv.customTitle = c.title;
    return conv;
  });
}

/** How long a deleted conversation can be brought back. */
export const UNDO_MS = 10_000;
