// token_count.js — the chat page's count before sending: the conversation as the model
// will read it (system prompt, the messages still in its context, the message being
// typed, the chat template applied) in tokens, against the model's context, under the
// message box: "1,234 / 4,096 tokens". Past the context less the answer's room (Max
// tokens), it turns red and says that the oldest messages will be dropped.

const WAIT_MS = 200;

/**
 * A counter bound to `el`: call it (cheaply, often) with
 * `{engine, messages, contextLength, answerTokens}`; it counts after WAIT_MS of quiet, and
 * never while `busy()` (the engine is writing an answer).
 */
export function tokenCounter(el, busy) {
  let timer = 0;
  let seq = 0;
  return (what) => {
    clearTimeout(timer);
    timer = setTimeout(() => count(what, ++seq), WAIT_MS);
  };

  async function count({ engine, messages, contextLength, answerTokens }, mine) {
    if (!engine || busy() || typeof engine.countChatTokens !== "function") return;
    if (!messages.length) {
      el.textContent = "";
      el.classList.remove("over");
      return;
    }
    let n;
    try {
      n = await engine.countChatTokens(messages);
    } catch (_) {
      return; // the engine went away (another model): the next count will say
    }
    if (mine !== seq) return; // a newer count is on its way
    const fmt = (x) => x.toLocaleString("en-US");
    const ctx = contextLength || 0;
    const over = ctx > 0 && n + Math.max(1, answerTokens || 0) > ctx;
    el.dataset.tokens = String(n);
    el.textContent = ctx ? `· ${fmt(n)} / ${fmt(ctx)} tokens` : `· ${fmt(n)} tokens`;
    el.classList.toggle("over", over);
    el.title = over
      ? `With its answer (Max tokens) this chat no longer fits the model's context of ${fmt(ctx)} tokens: the oldest messages will be dropped.`
      : "The chat as the model will read it, with this message, against the model's context";
  }
}
