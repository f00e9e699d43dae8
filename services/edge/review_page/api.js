// The review API (/v1/reviews) as the page calls it, and what each of its errors means for a reviewer.

export class ApiError extends Error {
  constructor(status, code, message, body, retryAfter) {
    super(message);
    this.status = status;
    this.code = code;
    this.body = body || {};
    this.retryAfter = retryAfter;
  }
}

// The JSON answer, or an ApiError carrying the server's {"error": {code, message, ...}}.
export async function request(key, method, path, body) {
  const headers = { Accept: "application/json", Authorization: `Bearer ${key}` };
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

const CONFLICTS = {
  review_claimed: "Another reviewer is working on it; pick another task or try again later.",
  review_decided: "Someone has already decided it; the queue shows what is still open.",
  stale_claim: "Your claim was replaced; press the button again to claim the task anew.",
  claim_expired: "Your claim ran out; press the button again to claim the task anew.",
  review_not_claimed: "Your claim is gone; press the button again to claim the task anew.",
  job_moved: "The job changed since this review opened; reload the task.",
};

// {title, advice, code}: what happened, in the server's words, and what the reviewer can do.
export function explain(error) {
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
    409: CONFLICTS[error.code] || "Reload the task and try again.",
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

// A claim that no longer holds: the next decision claims the task again.
export function claimLost(error) {
  return error instanceof ApiError && ["stale_claim", "claim_expired", "review_not_claimed"].includes(error.code);
}
