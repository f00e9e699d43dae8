// The reviewer page: the review queue and one task at a time, over the JSON API (/v1/reviews).
//
// Document text is untrusted input: every piece of it reaches the page as a text node
// (createTextNode / textContent), never as markup. The reviewer's key stays in this tab's
// sessionStorage and is sent only to this origin, as a bearer token.
"use strict";

(() => {
  const KEY_STORAGE = "fatura.reviewerKey";
  const PAGE_SIZE = 50;
  const REVIEW_ID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;
  const DECIDED = new Set(["approved", "corrected", "rejected"]);
  // The order a reader meets the fields on an invoice; others follow.
  const FIELD_ORDER = [
    "/invoice_number", "/issue_date", "/due_date", "/currency",
    "/supplier/name", "/supplier/tax_id", "/supplier/iban",
    "/lines", "/subtotal", "/tax_total", "/total",
  ];
  const LINE_ORDER = ["description", "quantity", "unit_price", "tax_rate", "amount"];

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

  const $ = (id) => document.getElementById(id);

  // -------------------------------------------------------------------------- DOM, text only

  function el(tag, attrs, ...children) {
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

  function clear(node) {
    while (node.firstChild) node.removeChild(node.firstChild);
  }

  function show(id, visible) {
    $(id).hidden = !visible;
  }

  // -------------------------------------------------------------------------- the API

  class ApiError extends Error {
    constructor(status, code, message, body, retryAfter) {
      super(message);
      this.status = status;
      this.code = code;
      this.body = body || {};
      this.retryAfter = retryAfter;
    }
  }

  async function api(method, path, body) {
    const headers = { Accept: "application/json", Authorization: `Bearer ${state.key}` };
    const init = { method, headers, cache: "no-store", credentials: "omit", redirect: "error" };
    if (body !== undefined) {
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    let response;
    try {
      response = await fetch(path, init);
    } catch (_) {
      throw new ApiError(0, "network_error", "The Fatura server could not be reached.");
    }
    let data = null;
    try {
      data = await response.json();
    } catch (_) {
      data = null;
    }
    if (!response.ok) {
      const error = data && typeof data.error === "object" && data.error ? data.error : {};
      throw new ApiError(
        response.status,
        error.code || `http_${response.status}`,
        error.message || `The server answered HTTP ${response.status} without an explanation.`,
        error,
        response.headers.get("Retry-After"),
      );
    }
    if (data === null) throw new ApiError(response.status, "bad_response", "The server's answer was not JSON.");
    return data;
  }

  // What the reviewer should know and do about an error, in words.
  function explain(error) {
    if (!(error instanceof ApiError)) {
      return { title: String((error && error.message) || error), advice: "" };
    }
    const advice = {
      0: "Check the connection to the server and try again; nothing was changed.",
      401: "The key was not accepted: it may be mistyped, revoked or expired. Enter a valid reviewer key.",
      403: error.code === "wrong_key_scope"
        ? `This is a ${error.body.key_scope || "different"} key; this page needs a reviewer key ` +
          "(fatura keys create --tenant ID --scope reviewer)."
        : "This key may not do that.",
      404: "It may belong to another tenant, or the link is wrong. Go back to the queue.",
      409: {
        review_claimed: "Another reviewer is working on it; pick another task or try again later.",
        review_decided: "Someone has already decided it; the queue shows what is still open.",
        stale_claim: "Your claim was replaced; press the button again to claim the task anew.",
        claim_expired: "Your claim ran out; press the button again to claim the task anew.",
        review_not_claimed: "Your claim is gone; press the button again to claim the task anew.",
        job_moved: "The job changed since this review opened; reload the task.",
      }[error.code] || "Reload the task and try again.",
      413: "The request is too large.",
      422: error.code === "correction_invalid"
        ? "Nothing was changed. Fix the values below and approve again."
        : "Nothing was changed. Check the values you entered.",
      429: `Too many requests or failed keys from this address; wait ${error.retryAfter || "a few"} seconds.`,
    }[error.status];
    const fallback = error.status >= 500
      ? `The server could not complete the request (HTTP ${error.status}); nothing was changed. ` +
        `Try again${error.retryAfter ? ` in ${error.retryAfter} seconds` : " shortly"}.`
      : `The request was refused (HTTP ${error.status}).`;
    return { title: error.message, advice: advice || fallback, code: error.code };
  }

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

  // -------------------------------------------------------------------------- words for data

  function fieldLabel(pointer) {
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

  function reasonText(reason) {
    const where = reason.field ? `${fieldLabel(reason.field)}: ` : "";
    return `${where}${reason.message || reason.code}`;
  }

  function when(iso) {
    if (!iso) return "";
    const at = new Date(iso);
    return Number.isNaN(at.getTime()) ? String(iso) : at.toLocaleString();
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
    const target = decodeURIComponent(window.location.hash.slice(1));
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
      renderQueue();
    } catch (error) {
      showError(error);
    }
  }

  function renderQueue() {
    const list = $("queue");
    clear(list);
    state.reviews.forEach((review, index) => {
      const reasons = review.reasons.map(reasonText).join(" · ") || review.kind;
      const link = el(
        "a",
        {
          href: `#${review.review_id}`,
          className: index === state.selected ? "selected" : "",
          dataset: { reviewId: review.review_id, index: String(index) },
        },
        el("span", { className: `badge ${review.state}` }, review.state),
        el("span", { className: "reasons-line" }, reasons),
        el("span", { className: "muted" }, when(review.created_at)),
      );
      link.addEventListener("focus", () => select(index, false));
      list.append(el("li", {}, link));
    });
    show("queue-empty", state.reviews.length === 0);
    show("queue-more", Boolean(state.cursor));
  }

  function select(index, focus) {
    const links = $("queue").querySelectorAll("a");
    if (!links.length) return;
    state.selected = Math.max(0, Math.min(index, links.length - 1));
    links.forEach((link, i) => link.classList.toggle("selected", i === state.selected));
    if (focus) links[state.selected].focus();
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

    renderFields(review, decided);
    renderDocument(review);
    setDecisionEnabled(!decided);
    $("reject-reason").value = "";
    updateApproveLabel();
  }

  // -------------------------------------------------------------------------- fields

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

  function fieldRank(pointer) {
    const index = FIELD_ORDER.findIndex((p) => pointer === p || pointer.startsWith(`${p}/`));
    const line = /^\/lines\/(\d+)\/(.+)$/.exec(pointer);
    const within = line ? LINE_ORDER.indexOf(line[2]) : -1;
    return [index < 0 ? FIELD_ORDER.length : index, line ? Number(line[1]) : 0, within < 0 ? LINE_ORDER.length : within];
  }

  function byRank(a, b) {
    const [x, y] = [fieldRank(a), fieldRank(b)];
    return x[0] - y[0] || x[1] - y[1] || x[2] - y[2];
  }

  function renderFields(review, decided) {
    const body = $("fields");
    clear(body);
    const evidence = new Map(review.evidence.map((e) => [e.field, e]));
    const flagged = new Map();
    review.reasons.forEach((reason, index) => {
      if (reason.field) flagged.set(reason.field, [...(flagged.get(reason.field) || []), `reason-${index}`]);
    });
    const fields = leaves(review.result || {}, "", []);
    fields.sort((a, b) => byRank(a[0], b[0]));
    fields.forEach(([pointer, value], index) => {
      const id = `field-${index}`;
      const input = el("input", {
        id,
        type: "text",
        value: value === null ? "" : String(value),
        placeholder: value === null ? "(none)" : null,
        disabled: decided,
        spellcheck: "false",
        "aria-describedby": flagged.has(pointer) ? flagged.get(pointer).join(" ") : null,
        dataset: { pointer, original: value === null ? "" : String(value), kind: value === null ? "null" : typeof value },
      });
      input.addEventListener("input", () => {
        input.classList.toggle("changed", input.value !== input.dataset.original);
        updateApproveLabel();
        hideError(); // what it said was about the values before this edit
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
  function changes() {
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

  function updateApproveLabel() {
    const count = Object.keys(changes()).length;
    $("approve").textContent = count === 0 ? "Approve" : `Approve with ${count} correction${count === 1 ? "" : "s"}`;
  }

  function setDecisionEnabled(enabled) {
    for (const id of ["approve", "correct", "reject", "reject-reason"]) $(id).disabled = !enabled;
  }

  // -------------------------------------------------------------------------- the document

  // Evidence spans count characters as Python does (code points); JavaScript strings count UTF-16
  // units, so each page is split into code points first.
  function renderDocument(review) {
    const container = $("document");
    clear(container);
    const pages = review.document.pages;
    pages.forEach((text, index) => {
      const page = index + 1;
      const chars = Array.from(text);
      const spans = review.evidence
        .map((e) => ({ field: e.field, span: e.span }))
        .filter(({ span }) => span && span.page === page && Number.isInteger(span.start) &&
          Number.isInteger(span.end) && span.start >= 0 && span.end > span.start && span.end <= chars.length);
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

  function marksOf(pointer) {
    return [...$("document").querySelectorAll("mark.span")].filter((m) => m.dataset.fields.split(" ").includes(pointer));
  }

  function activate(pointer) {
    for (const mark of $("document").querySelectorAll("mark.active")) mark.classList.remove("active");
    for (const row of $("fields").querySelectorAll("tr.active")) row.classList.remove("active");
    const marks = marksOf(pointer);
    marks.forEach((m) => m.classList.add("active"));
    const row = [...$("fields").querySelectorAll("tr")].find((r) => r.dataset.pointer === pointer);
    if (row) row.classList.add("active");
    if (marks.length) marks[0].scrollIntoView({ block: "nearest" });
  }

  function focusField(pointer) {
    const input = [...$("fields").querySelectorAll("input")].find((i) => i.dataset.pointer === pointer);
    if (input && !input.disabled) {
      input.focus();
      input.select();
    } else {
      activate(pointer);
    }
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
    let body;
    if (action === "approve" && Object.keys(edits).length) path = "correct";
    const reason = $("reject-reason").value.trim();
    if (action === "reject" && !reason) {
      showError(new ApiError(400, "reason_missing", "Write why you reject it first.", {}));
      $("reject-reason").focus();
      return;
    }
    state.busy = true;
    setDecisionEnabled(false);
    hideError();
    try {
      const fence = await claim(review);
      body = path === "correct" ? { fence, changes: edits } : path === "reject" ? { fence, reason } : { fence };
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
      if (error instanceof ApiError && ["stale_claim", "claim_expired", "review_not_claimed"].includes(error.code)) {
        state.claim = null;
      }
      setDecisionEnabled(!DECIDED.has(review.state));
      showError(error);
    } finally {
      state.busy = false;
    }
  }

  function correctFirst() {
    const review = state.review;
    if (!review) return;
    const flagged = review.reasons.map((r) => r.field).find(Boolean);
    const inputs = [...$("fields").querySelectorAll("input")];
    const target = inputs.find((i) => i.dataset.pointer === flagged) || inputs[0];
    if (target && !target.disabled) {
      target.focus();
      target.select();
    }
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
      const inQueue = Boolean(document.activeElement && document.activeElement.closest("#queue"));
      if (event.key === "j" || event.key === "ArrowDown") {
        event.preventDefault();
        select(state.selected + (inQueue ? 1 : 0), true);
      } else if (event.key === "k" || event.key === "ArrowUp") {
        event.preventDefault();
        select(state.selected - (inQueue ? 1 : 0), true);
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
      showError(new ApiError(400, "key_missing", "Enter your reviewer key.", {}));
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
    if (!$("queue-view").hidden) select(0, true);
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

  document.addEventListener("DOMContentLoaded", () => {
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
  });
})();
