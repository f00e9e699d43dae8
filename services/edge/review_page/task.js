// One review task on screen: the extracted fields as inputs beside their evidence, and the source
// document with every evidence span highlighted. Only text nodes carry the document's text.

import { $, clear, el, fieldLabel } from "/review/dom.js";

// The order a reader meets the fields on an invoice; others follow.
const FIELD_ORDER = [
  "/invoice_number", "/issue_date", "/due_date", "/currency",
  "/supplier/name", "/supplier/tax_id", "/supplier/iban",
  "/lines", "/subtotal", "/tax_total", "/total",
];
const LINE_ORDER = ["description", "quantity", "unit_price", "tax_rate", "amount"];

// [pointer, value] of every scalar in the result but its evidence and schema name.
function leaves(value, pointer, out) {
  if (value !== null && typeof value === "object") {
    const entries = Array.isArray(value) ? value.map((v, i) => [String(i), v]) : Object.entries(value);
    for (const [name, child] of entries) {
      if (pointer === "" && (name === "evidence" || name === "schema")) continue;
      leaves(child, `${pointer}/${name.replace(/~/g, "~0").replace(/\//g, "~1")}`, out);
    }
  } else {
    out.push([pointer, value]);
  }
  return out;
}

function rank(pointer) {
  const index = FIELD_ORDER.findIndex((p) => pointer === p || pointer.startsWith(`${p}/`));
  const line = /^\/lines\/(\d+)\/(.+)$/.exec(pointer);
  const within = line ? LINE_ORDER.indexOf(line[2]) : -1;
  return [index < 0 ? FIELD_ORDER.length : index, line ? Number(line[1]) : 0, within < 0 ? LINE_ORDER.length : within];
}

function byRank(a, b) {
  const [x, y] = [rank(a), rank(b)];
  return x[0] - y[0] || x[1] - y[1] || x[2] - y[2];
}

// The fields table; onEdit runs after each keystroke in a field.
export function renderFields(review, decided, onEdit) {
  const body = $("fields");
  clear(body);
  const evidence = new Map(review.evidence.map((e) => [e.field, e]));
  const flagged = new Map(); // pointer → ids of the reasons about it
  review.reasons.forEach((reason, index) => {
    if (reason.field) flagged.set(reason.field, [...(flagged.get(reason.field) || []), `reason-${index}`]);
  });
  const fields = leaves(review.result || {}, "", []).sort((a, b) => byRank(a[0], b[0]));
  fields.forEach(([pointer, value], index) => {
    const id = `field-${index}`;
    const original = value === null ? "" : String(value);
    const input = el("input", {
      id,
      type: "text",
      value: original,
      placeholder: value === null ? "(none)" : null,
      disabled: decided,
      spellcheck: "false",
      "aria-describedby": flagged.has(pointer) ? flagged.get(pointer).join(" ") : null,
      dataset: { pointer, original, kind: value === null ? "null" : typeof value },
    });
    input.addEventListener("input", () => {
      input.classList.toggle("changed", input.value !== original);
      onEdit();
    });
    input.addEventListener("focus", () => activate(pointer));
    const found = evidence.get(pointer);
    let quote;
    if (!found) quote = el("td", { className: "evidence none" }, "no evidence");
    else if (found.text === null) quote = el("td", { className: "evidence none" }, "the span names no text");
    else quote = el("td", { className: "evidence", title: `page ${found.span.page}` }, found.text);
    const row = el(
      "tr",
      { className: flagged.has(pointer) ? "flagged" : "", dataset: { pointer } },
      el("th", { scope: "row" }, el("label", { for: id }, fieldLabel(pointer)), el("code", {}, pointer)),
      el("td", {}, input),
      quote,
    );
    row.addEventListener("mouseenter", () => activate(pointer));
    body.append(row);
  });
}

// The fields the reviewer changed, by JSON Pointer, typed like the value they replace.
export function changes() {
  const found = {};
  for (const input of $("fields").querySelectorAll("input")) {
    if (input.value === input.dataset.original) continue;
    const text = input.value.trim();
    let value = text;
    if (input.dataset.kind === "number" && text !== "" && !Number.isNaN(Number(text))) value = Number(text);
    else if (input.dataset.kind === "null" && text === "") value = null;
    found[input.dataset.pointer] = value;
  }
  return found;
}

// Evidence spans count characters as Python does (code points); JavaScript strings count UTF-16
// units, so each page is split into code points first. Overlapping spans are cut into pieces, each
// marked with every field whose span covers it (data-fields, space-separated pointers).
export function renderDocument(review) {
  const container = $("document");
  clear(container);
  const pages = review.document.pages;
  pages.forEach((text, index) => {
    const page = index + 1;
    const chars = Array.from(text);
    const spans = review.evidence.filter(({ span }) =>
      span && span.page === page && Number.isInteger(span.start) && Number.isInteger(span.end) &&
      span.start >= 0 && span.end > span.start && span.end <= chars.length);
    const cuts = new Set([0, chars.length]);
    for (const { span } of spans) {
      cuts.add(span.start);
      cuts.add(span.end);
    }
    const bounds = [...cuts].sort((a, b) => a - b);
    const pre = el("pre", {});
    for (let i = 0; i + 1 < bounds.length; i += 1) {
      const [start, end] = [bounds[i], bounds[i + 1]];
      const piece = chars.slice(start, end).join("");
      const fields = spans.filter(({ span }) => span.start <= start && end <= span.end).map((s) => s.field);
      if (!fields.length) {
        pre.append(document.createTextNode(piece));
        continue;
      }
      const mark = el("mark", {
        className: "span",
        title: `Evidence of ${fields.map(fieldLabel).join(", ")}`,
        dataset: { fields: fields.join(" ") },
      }, piece);
      mark.addEventListener("click", () => focusField(fields[0]));
      pre.append(mark);
    }
    const heading = pages.length > 1 ? el("h4", {}, `Page ${page} of ${pages.length}`) : null;
    container.append(el("section", { className: "page", "aria-label": `Page ${page}` }, heading, pre));
  });
}

// Shows which text a field was read from: its marks and its row light up.
function activate(pointer) {
  for (const mark of $("document").querySelectorAll("mark.active")) mark.classList.remove("active");
  for (const row of $("fields").querySelectorAll("tr.active")) row.classList.remove("active");
  const marks = [...$("document").querySelectorAll("mark.span")]
    .filter((m) => m.dataset.fields.split(" ").includes(pointer));
  marks.forEach((m) => m.classList.add("active"));
  const row = [...$("fields").querySelectorAll("tr")].find((r) => r.dataset.pointer === pointer);
  if (row) row.classList.add("active");
  if (marks.length) marks[0].scrollIntoView({ block: "nearest" });
}

// Puts the cursor in the input of a field (or of the first field inside it, or of the first field
// at all when ``orFirst``); once decided, only shows where the field was read from.
export function focusField(pointer, orFirst) {
  const inputs = [...$("fields").querySelectorAll("input")];
  const input = inputs.find((i) => i.dataset.pointer === pointer) ||
    inputs.find((i) => pointer && i.dataset.pointer.startsWith(`${pointer}/`)) ||
    (orFirst ? inputs[0] : null);
  if (input && !input.disabled) {
    input.focus();
    input.select();
  } else if (pointer) {
    activate(pointer);
  }
}
