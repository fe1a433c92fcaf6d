// store.js — conversations and settings kept in this browser: conversations in IndexedDB
// (database "colibri-app", one record per conversation; localStorage where IndexedDB is
// unavailable), settings and the open conversation's id in localStorage.
//
// A conversation: {id, title, customTitle?, model, created, updated, messages: [{role, content, stopped?}]}.
// Everything stays on this machine; nothing is sent anywhere but to the local engine.
// `await open()` once before the rest: it reads every conversation into memory, so the
// functions below answer synchronously and write through to IndexedDB.

const CONVERSATIONS = "colibri.conversations.v1";
const SETTINGS = "colibri.settings.v1";
const ACTIVE = "colibri.active.v1";
// One key per conversation whose IndexedDB write has not completed yet: {seq, conv} (conv
// null: a delete). localStorage is written at once, an IndexedDB transaction only later, and
// a page closed or reloaded in between aborts it; open() applies what is still pending, so
// a delete or a save right before a reload is not lost.
const PENDING = "colibri.pending.v1.";

export const DEFAULT_SETTINGS = Object.freeze({
  model: "",
  system: "",
  temperature: "", // empty: the model's default (generation_config.json)
  topP: "",
  maxTokens: 256,
  seed: "", // empty: a new random seed for every answer
  backend: "auto", // "auto" | "webgpu" | "cpu" (backend_pick.js)
  theme: "system", // "system" | "light" | "dark"
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

const DB_NAME = "colibri-app";
const DB_STORE = "conversations";
const cache = new Map(); // id -> conversation
let db = null; // IDBDatabase, or null: localStorage
let onWriteError = () => {};

const valid = (c) => c && typeof c.id === "string" && Array.isArray(c.messages);

function request(r) {
  return new Promise((ok, bad) => {
    r.onsuccess = () => ok(r.result);
    r.onerror = () => bad(r.error);
  });
}

/** Opens the conversation store; `onError(e)` hears of writes the browser refused later. */
export async function open({ onError } = {}) {
  if (onError) onWriteError = onError;
  cache.clear();
  try {
    const r = indexedDB.open(DB_NAME, 1);
    r.onupgradeneeded = () => r.result.createObjectStore(DB_STORE, { keyPath: "id" });
    db = await request(r);
    for (const c of await request(db.transaction(DB_STORE).objectStore(DB_STORE).getAll())) if (valid(c)) cache.set(c.id, c);
  } catch (_) {
    db = null;
  }
  await replayPending();
  // Conversations of the localStorage era (or of a browser without IndexedDB).
  const old = read(CONVERSATIONS, null);
  if (Array.isArray(old)) {
    const added = old.filter((c) => valid(c) && !cache.has(c.id));
    for (const c of added) cache.set(c.id, c);
    if (db && (await Promise.all(added.map(put))).every(Boolean)) localStorage.removeItem(CONVERSATIONS);
  }
}

/** Writes that a page closed too early left undone: each pending key's conversation is
 * stored again (or deleted again), in memory at once and in IndexedDB. */
async function replayPending() {
  const keys = [];
  for (let i = 0; i < localStorage.length; i++) if (localStorage.key(i)?.startsWith(PENDING)) keys.push(localStorage.key(i));
  const done = [];
  for (const key of keys) {
    const p = read(key, null);
    const id = key.slice(PENDING.length);
    if (!p || (p.conv !== null && (!valid(p.conv) || p.conv.id !== id))) {
      localStorage.removeItem(key);
      continue;
    }
    if (p.conv) cache.set(id, p.conv);
    else cache.delete(id);
    if (!db) localStorage.removeItem(key);
    else done.push(idb(id, p.conv));
  }
  if (!db && keys.length) write(CONVERSATIONS, [...cache.values()]);
  await Promise.all(done);
}

let seq = 0;

/** One IndexedDB write of conversation `id` (`conv` null: delete), journaled in
 * localStorage until it completes; a promise of success. */
function idb(id, conv) {
  const key = PENDING + id;
  const mine = `${Date.now()}.${++seq}`;
  // Best effort: a journal refused (quota) leaves only the IndexedDB write, and no older one.
  if (!write(key, { seq: mine, conv })) localStorage.removeItem(key);
  const settle = (okay) => {
    if (read(key, null)?.seq === mine) localStorage.removeItem(key);
    return okay;
  };
  return new Promise((ok) => {
    try {
      const t = db.transaction(DB_STORE, "readwrite");
      if (conv) t.objectStore(DB_STORE).put(structuredClone(conv));
      else t.objectStore(DB_STORE).delete(id);
      t.oncomplete = () => ok(settle(true));
      t.onerror = t.onabort = () => {
        onWriteError(t.error);
        ok(false);
      };
      t.commit?.();
    } catch (e) {
      onWriteError(e);
      ok(false);
    }
  });
}

/** Writes one conversation to IndexedDB (a promise of success), or, without IndexedDB,
 * all of them to localStorage (success at once). */
function put(conv) {
  if (!db) return write(CONVERSATIONS, [...cache.values()]);
  return idb(conv.id, conv);
}

function remove(id) {
  if (!db) return write(CONVERSATIONS, [...cache.values()]);
  idb(id, null);
  return true;
}

/** All conversations, most recently updated first. */
export function listConversations() {
  return [...cache.values()].sort((a, b) => b.updated - a.updated);
}

export function getConversation(id) {
  return cache.get(id) || null;
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

/** Stores `conv`. False when the browser refused at once; a refusal that comes later
 * goes to open()'s onError. */
export function saveConversation(conv) {
  conv.updated = Date.now();
  conv.title = conv.customTitle || titleOf(conv);
  cache.set(conv.id, conv);
  return put(conv) !== false;
}

/** Gives `conv` a title of the user's own (empty: back to the first message's). */
export function renameConversation(conv, title) {
  const t = title.replace(/\s+/g, " ").trim().slice(0, 120);
  if (t) conv.customTitle = t;
  else delete conv.customTitle;
  conv.title = conv.customTitle || titleOf(conv);
  cache.set(conv.id, conv);
  return put(conv) !== false;
}

/** The conversation as Markdown: a title, then each turn under who said it. */
export function conversationMarkdown(conv) {
  const who = { user: "You", assistant: "colibri", system: "System" };
  const when = new Date(conv.created || Date.now()).toISOString().replace("T", " ").slice(0, 16);
  const out = [`# ${conv.title || titleOf(conv)}`, "", `*${conv.model || "no model"} · ${when} UTC*`, ""];
  for (const m of conv.messages) {
    out.push(`**${who[m.role] || m.role}:**`, "", m.content || "", "");
    if (m.stopped) out.push("*(stopped)*", "");
  }
  return `${out.join("\n").trimEnd()}\n`;
}

/** The conversation as JSON (the stored object, messages in OpenAI's {role, content} shape). */
export function conversationJson(conv) {
  const { id, title, model, created, updated } = conv;
  const messages = conv.messages.map(({ role, content, ...rest }) => ({ role, content, ...rest }));
  return `${JSON.stringify({ id, title, model, created, updated, messages }, null, 2)}\n`;
}

/** Stores `conv` as it is (its id, title and times kept): an imported or undeleted one. */
export function putConversation(conv) {
  cache.set(conv.id, conv);
  return put(conv) !== false;
}

export function deleteConversation(id) {
  cache.delete(id);
  remove(id);
  if (activeId() === id) setActiveId(null);
}

export function activeId() {
  return read(ACTIVE, null);
}

export function setActiveId(id) {
  write(ACTIVE, id);
}
