// backend_pick.js — the chat page's backend picker (Settings → Backend): where the model
// runs. "auto" times one decode step on WebGPU and on the CPU backend and keeps the
// faster; "webgpu" and "cpu" force one. Both give the same tokens (docs/browser.md). The
// choice is kept with the settings; ?backend=auto|webgpu|cpu in the page's URL overrides it.

export const BACKENDS = ["auto", "webgpu", "cpu"];

/** The backend to load with: the URL's, else the setting's; CPU where there is no WebGPU. */
export function backendChoice(settings) {
  const forced = new URLSearchParams(location.search).get("backend");
  const wanted = BACKENDS.includes(forced) ? forced : BACKENDS.includes(settings.backend) ? settings.backend : "auto";
  return navigator.gpu ? wanted : "cpu";
}

/**
 * Binds the <select>: shows the setting, greys out WebGPU where the browser has none, and
 * on a change saves it (`save(settings)`) and reloads the model (`reload()`).
 */
export function bindBackendPicker(select, settings, save, reload) {
  const webgpu = select.querySelector('option[value="webgpu"]');
  if (!navigator.gpu) {
    webgpu.disabled = true;
    webgpu.textContent = "WebGPU (not in this browser)";
  }
  select.value = backendChoice(settings);
  select.addEventListener("change", () => {
    settings.backend = select.value;
    // The choice made here wins over a ?backend= the page was opened with.
    const url = new URL(location.href);
    if (url.searchParams.has("backend")) {
      url.searchParams.delete("backend");
      history.replaceState(null, "", url);
    }
    save(settings);
    reload();
  });
}
