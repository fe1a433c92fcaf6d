// theme.js — the chat page's light / dark / system theme and its toggle button.

import { $ } from "./dom.js";
import * as store from "./store.js";

const THEMES = ["system", "light", "dark"];
/** Shows `settings.theme` (system, light or dark) on the page and its button. */
export function applyTheme(settings) {
  const t = THEMES.includes(settings.theme) ? settings.theme : "system";
  if (t === "system") delete document.documentElement.dataset.theme;
  else document.documentElement.dataset.theme = t;
  const b = $("theme");
  b.textContent = { system: "◐ Auto", light: "☀ Light", dark: "☾ Dark" }[t];
  b.title = t === "system" ? "Theme: as the system (click for light)" : `Theme: ${t} (click for ${t === "light" ? "dark" : "the system's"})`;
  b.setAttribute("aria-label", `Theme: ${t === "system" ? "as the system" : t}. Change theme`);
}

/** The next theme after `settings.theme`, saved and shown. */
export function cycleTheme(settings) {
  const t = THEMES.includes(settings.theme) ? settings.theme : "system";
  settings.theme = THEMES[(THEMES.indexOf(t) + 1) % THEMES.length];
  store.saveSettings(settings);
  applyTheme(settings);
}
