// markdown.js — a small Markdown renderer for model output that builds DOM nodes.
//
//   import { renderMarkdown } from "./markdown.js";
//   el.replaceChildren(renderMarkdown(text));
//
// Model text is never parsed as HTML: every piece of it reaches the page through
// createTextNode/textContent, and the only attribute taken from it is a link's href,
// which must be an absolute http(s) or mailto URL. So `<script>` or `<img onerror>` in an
// answer shows up as the characters it is made of.
//
// Supported: paragraphs, # headings, ``` fenced code (with a language label and a copy
// button), indented lists (- * + and 1.), > quotes, --- rules, `code`, **bold**,
// *italic* / _italic_, ~~strike~~, [links](https://...) and bare https:// URLs, and
// tables (a header row, a delimiter row such as |---|:--:|, body rows; \| is a literal |).
// Unclosed fences render as code (the answer may still be streaming).

const FENCE = /^ {0,3}(`{3,}|~{3,})\s*([\w+#.-]*)/;
const HEADING = /^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$/;
const RULE = /^ {0,3}([-*_])(\s*\1){2,}\s*$/;
const BULLET = /^(\s*)([-*+])\s+(.*)$/;
const ORDERED = /^(\s*)(\d{1,9})[.)]\s+(.*)$/;
const QUOTE = /^ {0,3}>\s?(.*)$/;
const TABLE_DELIM = /^\s*\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*$/;

/** Renders `text` into a DocumentFragment of safe elements. */
export function renderMarkdown(text, doc = globalThis.document) {
  const frag = doc.createDocumentFragment();
  renderBlocks(String(text ?? "").replace(/\r\n?/g, "\n").split("\n"), frag, doc);
  return frag;
}

function el(doc, tag, cls) {
  const e = doc.createElement(tag);
  if (cls) e.className = cls;
  return e;
}

function renderBlocks(lines, parent, doc) {
  let i = 0;
  let para = [];
  const flush = () => {
    if (!para.length) return;
    const p = el(doc, "p");
    para.forEach((l, k) => {
      if (k) p.append(doc.createElement("br"));
      renderInline(l, p, doc);
    });
    parent.append(p);
    para = [];
  };
  while (i < lines.length) {
    const line = lines[i];
    let m;
    if ((m = FENCE.exec(line))) {
      flush();
      const fence = m[1];
      const body = [];
      i++;
      while (i < lines.length && !lines[i].trimStart().startsWith(fence)) body.push(lines[i++]);
      i++; // the closing fence (or the end of an unfinished answer)
      parent.append(codeBlock(body.join("\n"), m[2], doc));
      continue;
    }
    if (!line.trim()) {
      flush();
      i++;
      continue;
    }
    if ((m = HEADING.exec(line))) {
      flush();
      const h = el(doc, `h${m[1].length}`);
      renderInline(m[2], h, doc);
      parent.append(h);
      i++;
      continue;
    }
    if (RULE.test(line) && !para.length) {
      flush();
      parent.append(el(doc, "hr"));
      i++;
      continue;
    }
    if (QUOTE.test(line)) {
      flush();
      const inner = [];
      while (i < lines.length && (m = QUOTE.exec(lines[i]))) {
        inner.push(m[1]);
        i++;
      }
      const q = el(doc, "blockquote");
      renderBlocks(inner, q, doc);
      parent.append(q);
      continue;
    }
    if (BULLET.test(line) || ORDERED.test(line)) {
      flush();
      i = renderList(lines, i, parent, doc);
      continue;
    }
    if (isTableStart(lines, i)) {
      flush();
      i = renderTable(lines, i, parent, doc);
      continue;
    }
    para.push(line.trim());
    i++;
  }
  flush();
}

// A list starting at lines[i]; items indented deeper than the marker nest.
function renderList(lines, i, parent, doc) {
  const first = BULLET.exec(lines[i]) || ORDERED.exec(lines[i]);
  const indent = first[1].length;
  const ordered = !BULLET.test(lines[i]);
  const list = el(doc, ordered ? "ol" : "ul");
  if (ordered && first[2] !== "1") list.start = Number(first[2]);
  let item = null;
  let body = [];
  const close = () => {
    if (!item) return;
    const [head, ...rest] = body;
    renderInline(head, item, doc);
    if (rest.length) renderBlocks(rest, item, doc);
    list.append(item);
    item = null;
  };
  while (i < lines.length) {
    const line = lines[i];
    const m = (ordered ? ORDERED : BULLET).exec(line);
    if (m && m[1].length === indent) {
      close();
      item = el(doc, "li");
      body = [m[3]];
      i++;
      continue;
    }
    const deeper = line.length - line.trimStart().length > indent;
    if (item && line.trim() && (deeper || !(BULLET.test(line) || ORDERED.test(line) || FENCE.test(line) || HEADING.test(line) || QUOTE.test(line)))) {
      body.push(deeper ? line.slice(Math.min(indent + 2, line.length - line.trimStart().length)) : line.trim());
      i++;
      continue;
    }
    break;
  }
  close();
  parent.append(list);
  return i;
}

// The cells of a table row: split on | (not on \|), outer pipes optional.
export function splitRow(line) {
  let s = line.trim();
  if (s.startsWith("|")) s = s.slice(1);
  if (s.endsWith("|") && !s.endsWith("\\|")) s = s.slice(0, -1);
  const cells = [];
  let cur = "";
  for (let k = 0; k < s.length; k++) {
    if (s[k] === "\\" && s[k + 1] === "|") {
      cur += "|";
      k++;
    } else if (s[k] === "|") {
      cells.push(cur.trim());
      cur = "";
    } else cur += s[k];
  }
  cells.push(cur.trim());
  return cells;
}

// A header row with a pipe, then a delimiter row with a pipe and as many cells.
function isTableStart(lines, i) {
  const head = lines[i];
  const delim = lines[i + 1];
  return head.includes("|") && delim !== undefined && delim.includes("|") && TABLE_DELIM.test(delim) &&
    splitRow(head).length === splitRow(delim).length;
}

function renderTable(lines, i, parent, doc) {
  const head = splitRow(lines[i]);
  const align = splitRow(lines[i + 1]).map((d) => (d.startsWith(":") && d.endsWith(":") ? "center" : d.endsWith(":") ? "right" : d.startsWith(":") ? "left" : ""));
  const row = (cells, tag) => {
    const tr = el(doc, "tr");
    head.forEach((_, k) => {
      const td = el(doc, tag);
      if (align[k]) td.style.textAlign = align[k];
      renderInline(cells[k] ?? "", td, doc);
      tr.append(td);
    });
    return tr;
  };
  const table = el(doc, "table");
  const thead = el(doc, "thead");
  thead.append(row(head, "th"));
  table.append(thead);
  const tbody = el(doc, "tbody");
  i += 2;
  while (i < lines.length && lines[i].trim() && lines[i].includes("|")) tbody.append(row(splitRow(lines[i++]), "td"));
  if (tbody.childElementCount) table.append(tbody);
  const wrap = el(doc, "div", "md-table");
  wrap.append(table);
  parent.append(wrap);
  return i;
}

function codeBlock(code, lang, doc) {
  const wrap = el(doc, "div", "md-code");
  const bar = el(doc, "div", "md-code-bar");
  const label = el(doc, "span", "md-code-lang");
  label.textContent = lang || "text";
  const copy = el(doc, "button", "md-copy");
  copy.type = "button";
  copy.textContent = "Copy";
  copy.setAttribute("aria-label", `Copy ${lang || "text"} code`);
  copy.addEventListener("click", async () => {
    try {
      await navigator.clipboard.writeText(code);
      copy.textContent = "Copied";
    } catch (_) {
      copy.textContent = "Copy failed";
    }
    setTimeout(() => (copy.textContent = "Copy"), 1500);
  });
  bar.append(label, copy);
  const pre = el(doc, "pre");
  const c = el(doc, "code");
  if (lang) c.dataset.lang = lang;
  c.textContent = code;
  pre.append(c);
  wrap.append(bar, pre);
  return wrap;
}

/** Only absolute http(s) and mailto links; anything else stays text. */
export function safeHref(url) {
  try {
    const u = new URL(url);
    return ["http:", "https:", "mailto:"].includes(u.protocol) ? u.href : null;
  } catch (_) {
    return null;
  }
}

// Inline spans, left to right: the earliest match wins, the text between is text.
const INLINE = [
  { re: /`([^`\n]+)`/y, make: (m, doc) => text(doc, "code", m[1]) },
  { re: /\*\*(?=\S)([^\n]*?\S)\*\*/y, make: (m, doc) => nest(doc, "strong", m[1]) },
  { re: /(?<!\w)__(?=\S)([^\n]*?\S)__(?!\w)/y, make: (m, doc) => nest(doc, "strong", m[1]) },
  { re: /~~(?=\S)([^\n]*?\S)~~/y, make: (m, doc) => nest(doc, "del", m[1]) },
  { re: /\*(?=[^\s*])([^*\n]*?[^\s*])\*/y, make: (m, doc) => nest(doc, "em", m[1]) },
  { re: /(?<![\w])_(?=[^\s_])([^_\n]*?[^\s_])_(?![\w])/y, make: (m, doc) => nest(doc, "em", m[1]) },
  { re: /\[([^\]\n]+)\]\(([^)\s]+)\)/y, make: (m, doc) => link(doc, m[1], m[2]) },
  { re: /https?:\/\/[^\s<>()]+[^\s<>().,;:!?'"]/y, make: (m, doc) => link(doc, m[0], m[0]) },
];
const STARTS = /[`*_~[h]/g;

function text(doc, tag, s) {
  const e = doc.createElement(tag);
  e.textContent = s;
  return e;
}

function nest(doc, tag, s) {
  const e = doc.createElement(tag);
  renderInline(s, e, doc);
  return e;
}

function link(doc, label, url) {
  const href = safeHref(url);
  if (!href) return doc.createTextNode(label === url ? url : `[${label}](${url})`);
  const a = doc.createElement("a");
  a.href = href;
  a.target = "_blank";
  a.rel = "noopener noreferrer";
  if (label === url) a.textContent = label;
  else renderInline(label, a, doc);
  return a;
}

/** Appends the inline Markdown of `s` to `parent`. */
export function renderInline(s, parent, doc = globalThis.document) {
  let at = 0;
  let plain = 0;
  STARTS.lastIndex = 0;
  while (at < s.length) {
    STARTS.lastIndex = at;
    const hit = STARTS.exec(s);
    if (!hit) break;
    at = hit.index;
    let node = null;
    for (const { re, make } of INLINE) {
      re.lastIndex = at;
      const m = re.exec(s);
      if (m) {
        node = make(m, doc);
        if (plain < at) parent.append(doc.createTextNode(s.slice(plain, at)));
        parent.append(node);
        at += m[0].length;
        plain = at;
        break;
      }
    }
    if (!node) at++;
  }
  if (plain < s.length) parent.append(doc.createTextNode(s.slice(plain)));
}
