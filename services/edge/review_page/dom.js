// Building the page from data, as text only, and the words the page uses for data.
//
// Document text and extracted fields are untrusted input: they reach the page through text nodes
// and attribute values, never as markup.

export const $ = (id) => document.getElementById(id);

export function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (name === "className") node.className = value;
    else if (name === "dataset") Object.assign(node.dataset, value);
    else node.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

export function clear(node) {
  while (node.firstChild) node.removeChild(node.firstChild);
}

export function show(id, visible) {
  $(id).hidden = !visible;
}

// "/lines/0/unit_price" → "Line 1 · unit price"
export function fieldLabel(pointer) {
  const parts = String(pointer).split("/").slice(1).map((p) => p.replace(/~1/g, "/").replace(/~0/g, "~"));
  const words = [];
  for (let i = 0; i < parts.length; i += 1) {
    if (parts[i] === "lines" && /^\d+$/.test(parts[i + 1] || "")) {
      words.push(`Line ${Number(parts[i + 1]) + 1}`);
      i += 1;
    } else {
      words.push(parts[i].replace(/_/g, " "));
    }
  }
  const text = words.join(" · ");
  return text.charAt(0).toUpperCase() + text.slice(1);
}

export function reasonText(reason) {
  const where = reason.field ? `${fieldLabel(reason.field)}: ` : "";
  return `${where}${reason.message || reason.code}`;
}

export function when(iso) {
  if (!iso) return "";
  const at = new Date(iso);
  return Number.isNaN(at.getTime()) ? String(iso) : at.toLocaleString();
}
