// The warm-up of colibri's browser engine before a timed run, shared by browser.mjs and
// profile_browser.mjs: native runs with every expert resident (`coli bench --ram all
// --cache warm`), so the tab gets every expert into its RAM tier first and the timed run
// fetches nothing from the helper (its stats().tiers.helper is 0).
//
// warmAll runs inside the page (page.evaluate serializes it: it must not use anything
// from this module's scope), on the engine the page keeps in window.engine.

/**
 * Prefills of prompts of the timed prompt's length (other ids each time: the same ids
 * would let the engine reuse their KV cache and skip the prefill), until
 * engine.expertTiers() has every routed expert in RAM (2) or above, at most `maxPasses`.
 * Returns {passes, notResident}: the experts still below RAM after the last pass.
 */
export async function warmAll({ ids, vocab, maxPasses = 16 }) {
  const engine = window.engine;
  let passes = 0;
  let notResident = null;
  while (passes < maxPasses) {
    passes += 1;
    const other = ids.map((id) => (id + passes * 7919) % vocab);
    // One new token: a prefill only (engines before the twelfth session counted every
    // decoded token since the load in stats().tokensPerSecond, so a warm-up decodes none).
    await engine.generate({ ids: other, maxNewTokens: 1, temperature: 0, ignoreEos: true });
    const tiers = await engine.expertTiers();
    notResident = tiers ? tiers.filter((t) => t < 2).length : null;
    if (notResident === 0 || notResident === null) break;
  }
  return { passes, notResident };
}
