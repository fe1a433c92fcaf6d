// store.js — conversations and settings kept in this browser (localStorage).
//
// A conversation: {id, title, model, created, updated, messages: [{role, content, stopped?}]}.
// Everything stays on this machine; nothing is sent anywhere but to the local engine.

const CONVERSATIONS = "colibri.conversations.v1";
const SETTINGS = "colibri.settings.v1";
const ACTIVE = "colibri.active.v1";

export const DEFAULT_SETTINGS = Object.freeze({
  model: "",
  system: "",
  temperature: "", // empty: the model's default (generation_config.json)
  topP: "",
  maxTokens: 256,
  seed: "", // empty: a new random seed for every answer
});

function read(key, fallback) {
  try {
    const v = localStorage.getItem(key);
    return v === null ? fallback : JSON.parse(v);
  } catch (_) {
    return fallback;
  }
}

/** Returns false when the browser refused (storage full or disabled). */
function write(key, value) {
  try {
    localStorage.setItem(key, JSON.stringify(value));
    return true;
  } catch (_) {
    return false;
  }
}

export function loadSettings() {
  return { ...DEFAULT_SETTINGS, ...read(SETTINGS, {}) };
}

export function saveSettings(s) {
  return write(SETTINGS, s);
}

/** All conversations, most recently updated first. */
export function listConversations() {
  const all = read(CONVERSATIONS, []);
  return (Array.isArray(all) ? all : []).filter((c) => c && c.id && Array.isArray(c.messages)).sort((a, b) => b.updated - a.updated);
}

export function getConversation(id) {
  return listConversations().find((c) => c.id === id) || null;
}

export function newConversation(model) {
  const now = Date.now();
  return { id: `c${now.toString(36)}${Math.random().toString(36).slice(2, 8)}`, title: "New chat", model, created: now, updated: now, messages: [] };
}

/** A title from the first user message. */
export function titleOf(conv) {
  const first = conv.messages.find((m) => m.role === "user");
  if (!first) return "New chat";
  const t = first.content.replace(/\s+/g, " ").trim();
  return t.length > 48 ? `${t.slice(0, 47)}…` : t || "New chat";
}

export function saveConversation(conv) {
  conv.updated = Date.now();
  conv.title = titleOf(conv);
  const all = listConversations().filter((c) => c.id !== conv.id);
  all.unshift(conv);
  return write(CONVERSATIONS, all);
}

export function deleteConversation(id) {
  write(CONVERSATIONS, listConversations().filter((c) => c.id !== id));
  if (activeId() === id) setActiveId(null);
}

export function activeId() {
  return read(ACTIVE, null);
}

export function setActiveId(id) {
  write(ACTIVE, id);
}
