// answers.js — what the chat page keeps about an answer besides its text: the partial
// answer, saved while it streams so that a reload (or a closed tab) keeps it, marked as
// cut; and its speed (tokens and tokens/s, shown under the answer).
//
// A message being written has `streaming: true` in storage. A page that opens and finds
// one knows its writer went away mid-answer: the message becomes `cut: true` (shown with a
// "cut off" tag and Regenerate).

/** How often a streaming answer is written to storage, at most. */
export const SAVE_MS = 300;

/**
 * Marks the answers left streaming by a page that went away as cut; returns the
 * conversations it changed (to be saved again).
 */
export function markCut(conversations) {
  const changed = [];
  for (const c of conversations) {
    let hit = false;
    for (const m of c.messages || []) {
      if (m.streaming) {
        delete m.streaming;
        m.cut = true;
        hit = true;
      }
    }
    if (hit) changed.push(c);
  }
  return changed;
}

/**
 * Follows a streaming answer `msg`: `piece()` on each piece of text (saves with `save()`
 * at most every SAVE_MS, and when the page is hidden or closed), `usage(u)` with the
 * stream's usage chunk, `end()` once the stream is over (the last save is the caller's).
 */
export function follow(msg, save) {
  msg.streaming = true;
  const t0 = performance.now();
  let first = 0;
  let pieces = 0;
  let tokens = 0;
  let timer = 0;
  const flush = () => {
    clearTimeout(timer);
    timer = 0;
    save();
  };
  const hidden = () => {
    if (msg.streaming) flush();
  };
  addEventListener("pagehide", hidden);
  document.addEventListener("visibilitychange", hidden);
  return {
    piece() {
      pieces += 1;
      if (!first) first = performance.now();
      if (!timer) timer = setTimeout(flush, SAVE_MS);
    },
    usage(u) {
      if (Number.isFinite(u?.completion_tokens)) tokens = u.completion_tokens;
    },
    end() {
      clearTimeout(timer);
      removeEventListener("pagehide", hidden);
      document.removeEventListener("visibilitychange", hidden);
      delete msg.streaming;
      const n = tokens || pieces;
      if (!n) return;
      msg.tokens = n;
      const now = performance.now();
      // Decode speed: the tokens after the first over the time since it came (the first
      // one's wait is the prompt's prefill); a one-token answer: over the whole wait.
      const secs = (n > 1 && first ? now - first : now - t0) / 1000;
      if (secs > 0) msg.tps = (n > 1 ? n - 1 : n) / secs;
    },
  };
}

/** "42 tokens · 18.5 tok/s", or "" when the message has no speed. */
export function speedLabel(m) {
  if (!m.tokens) return "";
  const tps = Number.isFinite(m.tps) ? ` · ${m.tps.toFixed(m.tps < 10 ? 2 : 1)} tok/s` : "";
  return `${m.tokens} token${m.tokens === 1 ? "" : "s"}${tps}`;
}
