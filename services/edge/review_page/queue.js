// The review queue: one link per task (its URL is /review#<review_id>), moved through with j/k.

import { $, clear, el, reasonText, show, when } from "/review/dom.js";

// Draws the list; onFocus(index) runs when a task's link takes the focus (by Tab, j/k or a click).
export function renderQueue(reviews, selected, more, onFocus) {
  const list = $("queue");
  clear(list);
  reviews.forEach((review, index) => {
    const reasons = review.reasons.map(reasonText).join(" · ") || review.kind;
    const link = el(
      "a",
      {
        href: `#${review.review_id}`,
        className: index === selected ? "selected" : "",
        dataset: { reviewId: review.review_id, index: String(index) },
      },
      el("span", { className: `badge ${review.state}` }, review.state),
      el("span", { className: "reasons-line" }, reasons),
      el("span", { className: "muted" }, when(review.created_at)),
    );
    link.addEventListener("focus", () => onFocus(index));
    list.append(el("li", {}, link));
  });
  show("queue-empty", reviews.length === 0);
  show("queue-more", more);
}

// Marks the task at ``index`` (kept within the list) as selected, and focuses it if asked; its index.
export function select(index, focus) {
  const links = $("queue").querySelectorAll("a");
  if (!links.length) return 0;
  const chosen = Math.max(0, Math.min(index, links.length - 1));
  links.forEach((link, i) => link.classList.toggle("selected", i === chosen));
  if (focus) links[chosen].focus();
  return chosen;
}

// Whether the keyboard focus is on a task of the queue.
export function focusInQueue() {
  return Boolean(document.activeElement && document.activeElement.closest("#queue"));
}
