// The reviewer page: the review queue and one task at a time, over the JSON API (/v1/reviews).
//
// The reviewer's key stays in this tab's sessionStorage and is sent only to this origin, as a bearer
// token. The URL names what is on screen: /review is the queue, /review#<review_id> one task.

import { ApiError, claimLost, explain, request } from "/review/api.js";
import { $, clear, el, fieldLabel, reasonText, show, when } from "/review/dom.js";
import { focusInQueue, renderQueue, select } from "/review/queue.js";
import { changes, focusField, renderDocument, renderFields } from "/review/task.js";

const KEY_STORAGE = "fatura.reviewerKey";
const PAGE_SIZE = 50;
const REVIEW_ID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;
const DECIDED = new Set(["approved", "corrected", "rejected"]);

const state = {
  key: sessionStorage.getItem(KEY_STORAGE),
  filter: "open",
  reviews: [],
  cursor: null,
  selected: 0,
  review: null, // the task on screen (GET /v1/reviews/{id})
  claim: null, // {reviewId, fence, until}: this tab's claim, sent with its decision
  busy: false,
};

const api = (method, path, body) => request(state.key, method, path, body);

// -------------------------------------------------------------------------- messages

function showError(error) {
  const { title, advice, code } = explain(error);
  const box = $("alert");
  clear(box);
  box.append(el("p", { className: "title" }, "Error: ", title));
  if (advice) box.append(el("p", {}, advice));
  const reasons = error instanceof ApiError && Array.isArray(error.body.reasons) ? error.body.reasons : [];
  if (reasons.length) {
    box.append(el("ul", {}, ...reasons.map((r) => el("li", {}, reasonText(r)))));
  }
  if (code) box.append(el("p", { className: "muted" }, el("code", {}, code)));
  box.hidden = false;
  hideStatus();
  if (error instanceof ApiError && (error.status === 401 || error.status === 403) && !state.review) {
    showKeyView();
  }
}

function hideError() {
  $("alert").hidden = true;
}

function showStatus(text) {
  const box = $("status");
  box.textContent = text;
  box.hidden = false;
}

function hideStatus() {
  $("status").hidden = true;
}

// -------------------------------------------------------------------------- views

function showKeyView() {
  show("key-view", true);
  show("queue-view", false);
  show("task-view", false);
  show("session", false);
  $("key-input").focus();
}

function showSession() {
  show("session", true);
  $("session-key").textContent = `Reviewer key ${state.key.slice(0, 12)}…`;
}

async function route() {
  hideStatus();
  if (!state.key) {
    showKeyView();
    return;
  }
  showSession();
  show("key-view", false);
  let target = window.location.hash.slice(1);
  try {
    target = decodeURIComponent(target);
  } catch (_) {
    // not percent-encoded text: shown as it is in the message below
  }
  if (target && REVIEW_ID.test(target)) {
    await openTask(target);
  } else {
    await showQueue();
    if (target) showError(new Error(`"${target}" is not a review id: the link is wrong. Here is the queue.`));
  }
}

async function showQueue() {
  state.review = null;
  show("task-view", false);
  show("queue-view", true);
  await loadQueue(false);
}

async function loadQueue(more) {
  try {
    const params = new URLSearchParams({ state: state.filter, limit: String(PAGE_SIZE) });
    if (more && state.cursor) params.set("cursor", state.cursor);
    const page = await api("GET", `/v1/reviews?${params}`);
    state.reviews = more ? state.reviews.concat(page.reviews) : page.reviews;
    state.cursor = page.next_cursor;
    if (!more) state.selected = 0;
    hideError();
    renderQueue(state.reviews, state.selected, Boolean(state.cursor), (index) => {
      state.selected = select(index, false);
    });
  } catch (error) {
    showError(error);
  }
}

async function openTask(reviewId) {
  show("queue-view", false);
  show("task-view", true);
  try {
    const review = await api("GET", `/v1/reviews/${encodeURIComponent(reviewId)}`);
    hideError();
    renderTask(review);
  } catch (error) {
    state.review = null;
    renderEmptyTask(reviewId);
    showError(error);
  }
}

function renderEmptyTask(reviewId) {
  $("task-title").textContent = `Review ${reviewId}`;
  $("task-state").textContent = "";
  $("task-meta").textContent = "";
  clear($("reasons"));
  clear($("fields"));
  clear($("document"));
  show("decision-summary", false);
  setDecisionEnabled(false);
}

function renderTask(review) {
  state.review = review;
  const decided = DECIDED.has(review.state);
  $("task-title").textContent = `Review of job ${review.job_id}`;
  $("task-state").textContent = review.state;
  $("task-state").className = `badge ${review.state}`;
  const claimed = review.state === "claimed" ? ` · claimed by ${review.claimed_by} until ${when(review.claimed_until)}` : "";
  $("task-meta").textContent =
    `${review.kind === "erp_rejected" ? "The ERP rejected the delivered result" : "The result did not pass validation"}` +
    ` · job ${review.job.state} (version ${review.job.state_version})` +
    ` · policy ${review.job.policy_version || "?"} · opened ${when(review.created_at)}${claimed}`;

  const summary = $("decision-summary");
  clear(summary);
  if (review.decision) {
    const d = review.decision;
    summary.append(el("p", {}, `Decided: ${d.action} by ${d.reviewer} at ${when(d.at)}.`));
    if (d.reason) summary.append(el("p", {}, "Reason: ", d.reason));
    if (d.changes) {
      summary.append(el("ul", {}, ...Object.entries(d.changes).map(
        ([pointer, value]) => el("li", {}, `${fieldLabel(pointer)} set to `, el("code", {}, JSON.stringify(value))),
      )));
    }
  }
  summary.hidden = !review.decision;

  const reasons = $("reasons");
  clear(reasons);
  review.reasons.forEach((reason, index) => {
    reasons.append(el("li", { id: `reason-${index}` }, reasonText(reason), " ", el("code", {}, reason.code)));
  });
  if (!review.reasons.length) reasons.append(el("li", {}, "No reasons were recorded."));

  renderFields(review, decided, () => {
    updateApproveLabel();
    hideError(); // what it said was about the values before this edit
  });
  renderDocument(review);
  setDecisionEnabled(!decided);
  $("reject-reason").value = "";
  updateApproveLabel();
}

function updateApproveLabel() {
  const count = Object.keys(changes()).length;
  $("approve").textContent = count === 0 ? "Approve" : `Approve with ${count} correction${count === 1 ? "" : "s"}`;
}

function setDecisionEnabled(enabled) {
  for (const id of ["approve", "correct", "reject", "reject-reason"]) $(id).disabled = !enabled;
}

// -------------------------------------------------------------------------- deciding

async function claim(review) {
  const mine = state.claim;
  if (mine && mine.reviewId === review.review_id && Date.parse(mine.until) - Date.now() > 5000) {
    return mine.fence;
  }
  const claimed = await api("POST", `/v1/reviews/${review.review_id}:claim`);
  state.claim = { reviewId: review.review_id, fence: claimed.fence, until: claimed.claimed_until };
  return claimed.fence;
}

async function decide(action) {
  const review = state.review;
  if (!review || state.busy || DECIDED.has(review.state)) return;
  const edits = changes();
  let path = action;
  if (action === "approve" && Object.keys(edits).length) path = "correct";
  const reason = $("reject-reason").value.trim();
  if (action === "reject" && !reason) {
    showError(new Error("Write why you reject it first: the reason is kept with the job."));
    $("reject-reason").focus();
    return;
  }
  state.busy = true;
  setDecisionEnabled(false);
  hideError();
  try {
    const fence = await claim(review);
    const body = path === "correct" ? { fence, changes: edits } : path === "reject" ? { fence, reason } : { fence };
    const decided = await api("POST", `/v1/reviews/${review.review_id}:${path}`, body);
    state.claim = null;
    renderTask(decided);
    const count = Object.keys(edits).length;
    const done = {
      approve: "Approved: the job is SUCCEEDED and its result goes to the ERP.",
      correct: `Approved with ${count} correction${count === 1 ? "" : "s"}: the corrected result passed ` +
        "validation; the job is SUCCEEDED and goes to the ERP.",
      reject: "Rejected: the job is REJECTED and the ERP is told it will not get a result.",
    }[path];
    showStatus(`${done} (job state version ${decided.job.state_version})`);
    $("back").focus();
  } catch (error) {
    if (claimLost(error)) state.claim = null;
    setDecisionEnabled(!DECIDED.has(review.state));
    showError(error);
  } finally {
    state.busy = false;
  }
}

// "c": the cursor goes to the field the first reason is about (or to the first field).
function correctFirst() {
  const review = state.review;
  if (review) focusField(review.reasons.map((r) => r.field).find(Boolean) || null, true);
}

// -------------------------------------------------------------------------- keyboard

function typing(target) {
  return target instanceof HTMLElement && (target.isContentEditable || ["INPUT", "TEXTAREA", "SELECT"].includes(target.tagName));
}

function backToQueue() {
  history.pushState(null, "", window.location.pathname + window.location.search);
  route();
}

function onKey(event) {
  if (event.ctrlKey || event.metaKey || event.altKey) return;
  if (typing(event.target)) {
    if (event.key === "Escape") event.target.blur();
    return;
  }
  if (!$("task-view").hidden) {
    const action = { a: "approve", r: "reject" }[event.key];
    if (action === "reject" && !$("reject-reason").value.trim()) {
      event.preventDefault();
      $("reject-reason").focus();
    } else if (action) {
      event.preventDefault();
      decide(action);
    } else if (event.key === "c") {
      event.preventDefault();
      correctFirst();
    } else if (event.key === "Escape") {
      event.preventDefault();
      backToQueue();
    }
    return;
  }
  if (!$("queue-view").hidden) {
    // The first j or k takes focus to the selected task; the next ones move it.
    const inQueue = focusInQueue();
    if (event.key === "j" || event.key === "ArrowDown") {
      event.preventDefault();
      state.selected = select(state.selected + (inQueue ? 1 : 0), true);
    } else if (event.key === "k" || event.key === "ArrowUp") {
      event.preventDefault();
      state.selected = select(state.selected - (inQueue ? 1 : 0), true);
    } else if (event.key === "Enter" && !inQueue) {
      const review = state.reviews[state.selected];
      if (review) window.location.hash = review.review_id;
    }
  }
}

// -------------------------------------------------------------------------- wiring

async function useKey(event) {
  event.preventDefault();
  const key = $("key-input").value.trim();
  if (!key) {
    showError(new Error("Enter your reviewer key."));
    return;
  }
  state.key = key;
  try {
    await api("GET", "/v1/reviews?limit=1");
  } catch (error) {
    state.key = null;
    showError(error);
    $("key-input").focus();
    return;
  }
  sessionStorage.setItem(KEY_STORAGE, key);
  $("key-input").value = "";
  hideError();
  await route();
  if (!$("queue-view").hidden) state.selected = select(0, true);
}

function forgetKey() {
  sessionStorage.removeItem(KEY_STORAGE);
  state.key = null;
  state.claim = null;
  state.review = null;
  hideError();
  showStatus("The key is forgotten in this tab.");
  showKeyView();
}

// A module runs once the document is parsed.
function start() {
  $("key-form").addEventListener("submit", useKey);
  $("forget-key").addEventListener("click", forgetKey);
  $("queue-filter").addEventListener("change", () => {
    state.filter = $("queue-filter").value;
    loadQueue(false);
  });
  $("queue-refresh").addEventListener("click", () => loadQueue(false));
  $("queue-more").addEventListener("click", () => loadQueue(true));
  $("back").addEventListener("click", (event) => {
    event.preventDefault();
    backToQueue();
  });
  $("approve").addEventListener("click", () => decide("approve"));
  $("correct").addEventListener("click", correctFirst);
  $("reject").addEventListener("click", () => decide("reject"));
  document.addEventListener("keydown", onKey);
  window.addEventListener("hashchange", route);
  route();
}

start();
