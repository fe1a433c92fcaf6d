// stats_panel.js — the chat page's live numbers: tokens/s, time to first token, bytes
// fetched, lookahead recall, the share of expert uses each tier served, and the Brain
// view's legend.

import { $, h, formatBytes } from "./dom.js";
import { TIER_NAMES, hybridLine } from "./brain.js";

/** What the panel reads of the page: { state }. */
let app;

export function bindStats(page) {
  app = page;
}

let statsPending = null;
export function scheduleStats(s) {
  if (!statsPending) requestAnimationFrame(() => { renderStats(statsPending); statsPending = null; });
  statsPending = s;
}

const TIER_LABELS = { gpu: "GPU", ram: "RAM", disk: "Browser disk", helper: "Helper" };
const TIER_COLORS = { gpu: "hsl(268 80% 60%)", ram: "hsl(152 62% 45%)", disk: "hsl(38 92% 50%)", helper: "hsl(215 14% 55%)" };

export function renderStats(s) {
  if (!s) return;
  $("stat-tps").textContent = s.tokensPerSecond ? s.tokensPerSecond.toFixed(s.tokensPerSecond < 10 ? 2 : 1) : "—";
  $("stat-ttft").textContent = s.ttftMs != null ? `${Math.round(s.ttftMs)} ms` : "—";
  $("stat-bytes").textContent = formatBytes(s.bytesFetched ?? NaN);
  $("stat-recall").textContent = typeof s.prefetchRecall === "number" ? `${(100 * s.prefetchRecall).toFixed(0)}%` : "—";
  // Each expert use is counted once, by the tier that served it, so the shares add up to 100%.
  const tiers = s.tiers || {};
  const total = ["gpu", "ram", "disk", "helper"].reduce((a, t) => a + (tiers[t] || 0), 0);
  const rows = ["gpu", "ram", "disk", "helper"].map((t) => {
    const n = tiers[t] || 0;
    const pct = total ? (100 * n) / total : 0;
    return h("div", { class: "tier-row", "data-tier": t, "data-count": n, title: `${n} of ${total} expert uses` },
      h("span", {}, h("span", { class: "swatch", style: `background:${TIER_COLORS[t]}` }), TIER_LABELS[t]),
      h("div", { class: "tier-bar" }, h("span", { style: `width:${pct.toFixed(1)}%;background:${TIER_COLORS[t]}` })),
      h("span", { class: "pct" }, total ? `${pct.toFixed(0)}%` : "—"));
  });
  $("tiers").replaceChildren(...rows);
  // WebGPU with hybrid placement (?hybrid=on|auto): expert uses computed on each side.
  const line = hybridLine(s.hybrid);
  $("brain-hybrid").hidden = !line;
  if (line) $("brain-hybrid").textContent = line;
}

export function renderLegend() {
  const names = { helper: "only on the helper", disk: "browser disk", ram: "RAM", gpu: "GPU" };
  $("legend").replaceChildren(...TIER_NAMES.map((t) => h("span", {}, h("span", { class: "swatch", style: `background:${TIER_COLORS[t]}` }), names[t])),
    h("span", {}, `${app.state.info?.layers ?? 0} layers × ${app.state.info?.experts ?? 0} experts, top-${app.state.info?.topK ?? "?"}`));
}
