// brain.js — the Brain view: which experts the model routes to, and where they live.
//
// The grid is layers (rows) x experts (columns). A cell's colour is the tier the expert
// lives in now (GPU, RAM, browser disk, or only on the helper); its brightness is how
// often it has been routed in this tab (log scale); a cell flashes when a token uses it.
// Below, a strip per layer shows that layer's hit rate over the last tokens: the share of
// its routed experts that were already in the browser (green: RAM, GPU or browser disk)
// or had to be fetched from the helper (red).
//
// On WebGPU, a mark inside a cell says where the expert was computed in the last forward
// pass (hybrid placement): a cyan square on the GPU, an orange dot on the CPU threads, both
// where it ran on each (in different layers' passes of several forward passes); unmarked
// cells were not routed to.
//
// Input: `route({counts, tiers, placement})` events from the engine, one per forward pass,
// with counts = [[layer, expert, n], ...] and, when the engine reports it (engine.expertTiers()),
// tiers = one byte per expert (layer-major: 0 helper, 1 browser disk, 2 RAM, 3 GPU), and on
// WebGPU placement = [[layer, expert, CPU uses, GPU uses], ...] since the last event.
// Without tiers, an expert is taken to be in RAM once it has been routed in this tab.
// A route event with no counts only updates the tiers (sent once after loading).

export const TIER = { helper: 0, disk: 1, ram: 2, gpu: 3 };
export const TIER_NAMES = ["helper", "disk", "ram", "gpu"];
// Hue/saturation per tier; lightness carries the routing count.
const TIER_HSL = [
  [215, 14], // helper only: slate
  [38, 92], // browser disk: amber
  [152, 62], // RAM: green
  [268, 80], // GPU: violet
];
// Where an expert was computed in the last pass: none, CPU threads, GPU, both.
export const PLACE = { none: 0, cpu: 1, gpu: 2, both: 3 };
export const PLACE_COLORS = { cpu: "#fb923c", gpu: "#22d3ee" };
const HISTORY = 96; // tokens kept in the hit-rate strips
const FLASH_MS = 700;

export class BrainView {
  /**
   * @param {HTMLCanvasElement} grid  the layers x experts canvas
   * @param {HTMLCanvasElement} chart the per-layer hit-rate strips
   */
  constructor(grid, chart) {
    this.grid = grid;
    this.chart = chart;
    this.raf = 0;
    this.reset(0, 0);
  }

  /** Sets the model's shape; `moeLayers[l]` false marks a dense layer (drawn empty). */
  reset(layers, experts, moeLayers = []) {
    this.layers = layers;
    this.experts = experts;
    this.moe = Array.from({ length: layers }, (_, l) => moeLayers[l] !== false);
    const n = layers * experts;
    this.count = new Float64Array(n);
    this.tier = new Uint8Array(n); // TIER.helper until known
    this.flash = new Float64Array(n); // time of last use
    this.placed = new Uint8Array(n); // PLACE of the last pass
    this.placedUses = { cpu: 0, gpu: 0 }; // since reset, as stats().hybrid counts them
    this.placing = false; // whether the engine reports placement (WebGPU)
    this.history = []; // [{rates: Float32Array(layers) (NaN = no MoE), t}]
    this.steps = 0;
    this.routed = 0;
    this.exact = false;
    this.draw();
  }

  /** One forward pass: counts [[layer, expert, n], ...], tiers (optional Uint8Array),
   * placement (optional [[layer, expert, cpuUses, gpuUses], ...]). */
  route({ counts, tiers, placement }) {
    if (!this.layers) return;
    if (placement && placement.length) this.place(placement);
    if (!counts || !counts.length) {
      if (tiers && tiers.length === this.tier.length) {
        this.tier.set(tiers);
        this.exact = true;
        this.draw();
      }
      return;
    }
    const now = performance.now();
    const hits = new Float32Array(this.layers);
    const uses = new Float32Array(this.layers);
    for (const [l, e, n] of counts) {
      if (l >= this.layers || e >= this.experts) continue;
      const i = l * this.experts + e;
      uses[l] += 1;
      // Before this pass: was it already in the browser (disk, RAM or GPU)?
      if (this.tier[i] >= TIER.disk) hits[l] += 1;
      this.count[i] += n;
      this.flash[i] = now;
      this.routed += n;
      if (!tiers) this.tier[i] = Math.max(this.tier[i], TIER.ram);
    }
    if (tiers && tiers.length === this.tier.length) {
      this.tier.set(tiers);
      this.exact = true;
    }
    const rates = new Float32Array(this.layers).map((_, l) => (uses[l] ? hits[l] / uses[l] : NaN));
    this.history.push({ rates, t: now });
    if (this.history.length > HISTORY) this.history.shift();
    this.steps += 1;
    this.grid.dataset.steps = String(this.steps);
    this.grid.dataset.routed = String(this.routed);
    this.animate();
  }

  /** Marks where each expert of the last pass was computed; counts the uses. */
  place(placement) {
    this.placed.fill(PLACE.none);
    this.placing = true;
    for (const [l, e, cpu, gpu] of placement) {
      this.placedUses.cpu += cpu;
      this.placedUses.gpu += gpu;
      if (l >= this.layers || e >= this.experts) continue;
      this.placed[l * this.experts + e] = (cpu > 0 ? PLACE.cpu : 0) | (gpu > 0 ? PLACE.gpu : 0);
    }
  }

  /** Cells of the last pass by where they were computed, e.g. {cpu: 5, gpu: 11, both: 0}. */
  placementCounts() {
    const out = { cpu: 0, gpu: 0, both: 0 };
    for (const p of this.placed) if (p) out[["", "cpu", "gpu", "both"][p]] += 1;
    return out;
  }

  /** Counts per tier of the experts now, e.g. {helper: 40, disk: 0, ram: 24, gpu: 0}. */
  tierCounts() {
    const out = { helper: 0, disk: 0, ram: 0, gpu: 0 };
    if (this.tier) for (const t of this.tier) out[TIER_NAMES[t]] += 1;
    return out;
  }

  animate() {
    if (this.raf) return;
    const frame = () => {
      this.raf = 0;
      const busy = this.draw();
      if (busy) this.raf = requestAnimationFrame(frame);
    };
    this.raf = requestAnimationFrame(frame);
  }

  /** Draws both canvases; true while some cell is still flashing. */
  draw() {
    this.grid.dataset.tiers = JSON.stringify(this.tierCounts());
    this.grid.dataset.exact = String(!!this.exact);
    if (this.placing) {
      this.grid.dataset.placement = JSON.stringify(this.placementCounts());
      this.grid.dataset.placedUses = JSON.stringify(this.placedUses);
    } else {
      delete this.grid.dataset.placement;
      delete this.grid.dataset.placedUses;
    }
    const busy = this.drawGrid();
    this.drawChart();
    return busy;
  }

  drawGrid() {
    const c = this.grid;
    const ctx = c.getContext("2d");
    const { layers, experts } = this;
    const w = c.clientWidth || 320;
    // Cells are square when they fit; a wide model gets thin columns.
    const cell = layers && experts ? Math.max(2, Math.min(18, Math.floor(w / experts))) : 10;
    const gap = cell >= 6 ? 1 : 0;
    const width = Math.max(1, experts * cell);
    const height = Math.max(1, layers * cell);
    if (c.width !== width || c.height !== height) {
      c.width = width;
      c.height = height;
    }
    ctx.fillStyle = getComputedStyle(c).getPropertyValue("--brain-bg").trim() || "#111";
    ctx.fillRect(0, 0, width, height);
    if (!layers) return false;
    let max = 0;
    for (const v of this.count) max = Math.max(max, v);
    const norm = Math.log1p(max || 1);
    const now = performance.now();
    let busy = false;
    for (let l = 0; l < layers; l++) {
      for (let e = 0; e < experts; e++) {
        const x = e * cell;
        const y = l * cell;
        if (!this.moe[l]) {
          ctx.fillStyle = "rgba(127,127,127,0.12)";
          ctx.fillRect(x, y, cell - gap, cell - gap);
          continue;
        }
        const i = l * experts + e;
        const [h, s] = TIER_HSL[this.tier[i]];
        const heat = this.count[i] ? Math.log1p(this.count[i]) / norm : 0;
        const age = now - this.flash[i];
        const flash = this.flash[i] && age < FLASH_MS ? 1 - age / FLASH_MS : 0;
        if (flash) busy = true;
        // Unrouted experts stay dim but keep their tier's colour readable.
        const light = (this.tier[i] === TIER.helper ? 18 : 30) + heat * 40 + flash * 30;
        ctx.fillStyle = `hsl(${h} ${s}% ${Math.min(light, 92)}%)`;
        ctx.fillRect(x, y, cell - gap, cell - gap);
        if (flash > 0.4 && cell >= 6) {
          ctx.strokeStyle = `rgba(255,255,255,${flash})`;
          ctx.lineWidth = 1;
          ctx.strokeRect(x + 0.5, y + 0.5, cell - gap - 1, cell - gap - 1);
        }
        if (this.placed[i]) this.drawPlace(ctx, this.placed[i], x, y, cell - gap);
      }
    }
    return busy;
  }

  /** The placement mark of a cell at (x, y), `size` pixels wide. */
  drawPlace(ctx, p, x, y, size) {
    if (size < 6) {
      // Thin cells: the lower third in the placement's colour (the GPU's when both).
      ctx.fillStyle = p & PLACE.gpu ? PLACE_COLORS.gpu : PLACE_COLORS.cpu;
      ctx.fillRect(x, y + size - Math.max(1, Math.floor(size / 3)), size, Math.max(1, Math.floor(size / 3)));
      return;
    }
    const m = Math.round(size / 2);
    const x0 = x + Math.floor((size - m) / 2);
    const y0 = y + Math.floor((size - m) / 2);
    // A dark edge keeps the mark readable on every tier's colour.
    ctx.strokeStyle = "rgba(0,0,0,0.7)";
    ctx.lineWidth = 1;
    if (p & PLACE.gpu) {
      ctx.fillStyle = PLACE_COLORS.gpu;
      ctx.fillRect(x0, y0, m, m);
      ctx.strokeRect(x0 - 0.5, y0 - 0.5, m + 1, m + 1);
    }
    if (p & PLACE.cpu) {
      ctx.fillStyle = PLACE_COLORS.cpu;
      ctx.beginPath();
      ctx.arc(x + size / 2, y + size / 2, p & PLACE.gpu ? m / 4 : m / 2, 0, 2 * Math.PI);
      ctx.fill();
      ctx.stroke();
    }
  }

  drawChart() {
    const c = this.chart;
    if (!c) return;
    const ctx = c.getContext("2d");
    const rows = Math.max(1, this.layers);
    const rowH = Math.max(3, Math.min(12, Math.floor(96 / rows)));
    const colW = 4;
    const width = HISTORY * colW;
    const height = rows * rowH;
    if (c.width !== width || c.height !== height) {
      c.width = width;
      c.height = height;
    }
    ctx.fillStyle = getComputedStyle(c).getPropertyValue("--brain-bg").trim() || "#111";
    ctx.fillRect(0, 0, width, height);
    const start = HISTORY - this.history.length;
    this.history.forEach(({ rates }, k) => {
      for (let l = 0; l < this.layers; l++) {
        const r = rates[l];
        if (Number.isNaN(r)) continue;
        // red (all fetched) -> yellow -> green (all already in the tab)
        ctx.fillStyle = `hsl(${Math.round(r * 130)} 70% ${38 + r * 10}%)`;
        ctx.fillRect((start + k) * colW, l * rowH, colW - 1, rowH - 1);
      }
    });
    const avg = this.history.length ? this.history.at(-1).rates.filter((r) => !Number.isNaN(r)) : [];
    c.dataset.lastHitRate = avg.length ? (avg.reduce((a, b) => a + b, 0) / avg.length).toFixed(3) : "";
  }
}

/** The line under the Brain view for stats().hybrid (null when hybrid placement is off). */
export function hybridLine(hy) {
  if (!hy || hy.mode === "off") return null;
  return `Experts computed on the GPU: ${hy.gpuExperts}, on the CPU threads at the same time: ${hy.cpuExperts} (hybrid ${hy.mode}). ` +
    "In the grid, the last step's experts are marked: a cyan square computed on the GPU, an orange dot on the CPU threads.";
}
