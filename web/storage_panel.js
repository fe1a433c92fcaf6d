// storage_panel.js — the chat page's browser-storage panel: how much the browser holds and
// allows, this model's disk tier, persistence, the low-space notice, and clearing a
// model's cached experts. app.js hands it what it shares with the rest of the page.

import { $, h, formatBytes } from "./dom.js";

/** What the panel uses of the page: { state, notice, dismiss, stop, setComposerEnabled, loadModel }. */
let app;

export function bindStorage(page) {
  app = page;
}

// The page's own estimate (same origin, same numbers as the engine's worker) works before
// a model is loaded too, e.g. when loading failed for want of space.
export async function storageEstimate() {
  try {
    if (navigator.storage?.estimate) return await navigator.storage.estimate();
  } catch (_) {}
  try {
    if (app.state.engine) return await app.state.engine.storage();
  } catch (_) {}
  return null;
}

export async function refreshStorage() {
  const est = await storageEstimate();
  const box = $("storage");
  $("clear-cache").disabled = !app.state.modelId || app.state.busy;
  if (!est || !est.quota) {
    box.textContent = "The browser does not say how much storage it has.";
    return;
  }
  const { usage, quota } = est;
  const free = quota - usage;
  const need = app.state.modelSize || 0;
  const low = free < Math.max(need, 0.05 * quota) || usage / quota > 0.9;
  box.replaceChildren(
    h("div", {}, `${formatBytes(usage)} used of ${formatBytes(quota)} (${((100 * usage) / quota).toFixed(usage / quota < 0.01 ? 2 : 0)}%)`),
    h("div", { class: `meter${low ? " low" : ""}`, role: "meter", "aria-label": "Browser storage used", "aria-valuemin": 0, "aria-valuemax": quota, "aria-valuenow": usage },
      h("span", { style: `width:${Math.min(100, (100 * usage) / quota).toFixed(1)}%` })),
  );
  // This model's share: its disk tier's budget (evicting the least recently used unpinned
  // experts beyond it), or why this tab has none (another tab holds the model's storage).
  const s = app.state.engine?.stats();
  $("disk-tier").textContent = !s ? "" : s.diskEnabled && s.diskBudget
    ? `${app.state.modelId}: ${s.dense?.storedBytes ? `its dense weights (${formatBytes(s.dense.storedBytes)}) and ` : ""}` +
      `${formatBytes(s.diskStoredBytes || 0)} of experts stored, at most ${formatBytes(s.diskBudget)} of experts` +
      (s.diskEvictions ? ` (${s.diskEvictions} evicted to stay under it)` : "") + "."
    : s.diskEnabled ? "" : s.diskError || "";
  // Persistence is asked for only when the user says so (the button), never on load.
  const persisted = navigator.storage?.persisted ? await navigator.storage.persisted().catch(() => false) : false;
  $("persisted").textContent = persisted
    ? "Storage is persistent: the browser will not evict the cached experts on its own."
    : "Storage is not persistent: the browser may evict cached experts when space runs low.";
  $("persist").hidden = persisted || !navigator.storage?.persist;
  box.dataset.usage = String(usage);
  box.dataset.quota = String(quota);
  if (low) {
    app.notice("quota", "warn", [
      h("strong", {}, "Browser storage is almost full: "), `${formatBytes(usage)} used of ${formatBytes(quota)}. `,
      "colibri keeps fetched experts there so a reload does not fetch them again; with too little room it fetches them from the helper each time.",
    ], [h("button", { class: "btn small-btn", type: "button", onclick: clearModelCache }, `Clear ${app.state.modelId}'s cached experts`)]);
  } else app.dismiss("quota");
}

/**
 * Deletes this model's expert cache (OPFS `colibri/<model>-<16 hex>`). The worker holds
 * sync access handles on those files, so the engine is stopped first and loaded again after.
 */
export async function clearModelCache() {
  const id = app.state.modelId;
  if (!id) return;
  if (app.state.busy) app.stop();
  $("clear-cache").disabled = true;
  if (app.state.engine) app.state.engine.terminate();
  app.state.engine = null;
  app.setComposerEnabled(false);
  // The engine's storage name (wasm/src/engine.rs storage_name): the URL path segment
  // of the id with other characters than [A-Za-z0-9._-] as "_", then the fingerprint.
  const key = encodeURIComponent(id).replace(/[^A-Za-z0-9._-]/g, "_").replace(/^\.+/, "");
  const pattern = new RegExp(`^${key.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")}-[0-9a-f]{16}$`);
  let removed = 0;
  let failure = null;
  try {
    // IndexedDB, the disk tier where OPFS is missing: one database per model version.
    for (const db of (await indexedDB.databases?.()) || []) {
      if (!db.name?.startsWith("colibri-") || !pattern.test(db.name.slice(8))) continue;
      await new Promise((ok, bad) => {
        const r = indexedDB.deleteDatabase(db.name);
        r.onsuccess = ok;
        r.onerror = () => bad(r.error);
      });
      removed++;
    }
    const root = await navigator.storage?.getDirectory?.();
    const top = root && (await root.getDirectoryHandle("colibri").catch(() => null));
    if (top) {
      for await (const [name] of top.entries()) {
        if (!pattern.test(name)) continue;
        // The terminated worker's handles are released asynchronously: retry briefly.
        for (let attempt = 0; ; attempt++) {
          try {
            await top.removeEntry(name, { recursive: true });
            removed++;
            break;
          } catch (e) {
            if (attempt >= 20) throw e;
            await new Promise((r) => setTimeout(r, 100));
          }
        }
      }
    }
  } catch (e) {
    failure = e;
  }
  app.dismiss("quota");
  if (failure?.name === "NoModificationAllowedError") {
    app.notice("cache", "error", [`Could not clear ${id}'s cached experts: another colibri tab or window is using them. Close it and try again.`]);
  } else if (failure) app.notice("cache", "error", [`Could not clear ${id}'s cached experts: ${failure.message || failure}`]);
  else app.notice("cache", "info", [removed ? `Cleared ${id}'s cached experts from browser storage.` : `${id} had no cached experts in this browser.`]);
  await app.loadModel(id);
}
