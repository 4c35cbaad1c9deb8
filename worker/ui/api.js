// The page's only way to the server: the public REST API and the run events stream, with the bearer
// token (asked for once when the server wants one, kept in sessionStorage, never in a URL or cookie).

const TOKEN_KEY = "agentrun.token";

export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

let asking = null; // one token prompt at a time, shared by every request that got a 401

function token() {
  return sessionStorage.getItem(TOKEN_KEY);
}

function headers(extra = {}) {
  const t = token();
  return t ? { ...extra, Authorization: `Bearer ${t}` } : extra;
}

function askToken(wrong) {
  if (!asking) {
    asking = new Promise((resolve) => {
      const dialog = document.getElementById("token-dialog");
      const form = document.getElementById("token-form");
      const input = document.getElementById("token-input");
      document.getElementById("token-error").textContent = wrong ? "That token was refused." : "";
      form.onsubmit = (e) => {
        e.preventDefault();
        sessionStorage.setItem(TOKEN_KEY, input.value.trim());
        input.value = "";
        dialog.close();
        asking = null;
        resolve();
      };
      dialog.oncancel = (e) => e.preventDefault(); // nothing works without it
      dialog.showModal();
      input.focus();
    });
  }
  return asking;
}

async function errorOf(response) {
  try {
    const body = await response.json();
    if (body && typeof body.error === "string") return new ApiError(response.status, body.error);
  } catch (_) { /* not JSON */ }
  return new ApiError(response.status, `${response.status} ${response.statusText}`);
}

export async function call(method, path, body) {
  for (;;) {
    const init = { method, headers: headers(body === undefined ? {} : { "Content-Type": "application/json" }) };
    if (body !== undefined) init.body = JSON.stringify(body);
    const response = await fetch(path, init);
    if (response.status === 401) {
      await askToken(token() !== null);
      continue;
    }
    if (!response.ok) throw await errorOf(response);
    return response.status === 204 ? null : response.json();
  }
}

// The runs list's query: every filter of GET /api/runs (status, labelSelector, model, agent, createdBy,
// parent, createdAfter, createdBefore, q), empty ones left out, and `after` for the page past `next`.
function runsQuery(filters = {}, after = null) {
  const q = new URLSearchParams({ limit: "100" });
  for (const [k, v] of Object.entries(filters)) if (v !== undefined && v !== null && String(v).trim() !== "") q.set(k, String(v).trim());
  if (after) q.set("after", after);
  return q.toString();
}

export const api = {
  list: (filters, after) => call("GET", `/api/runs?${runsQuery(typeof filters === "string" ? { status: filters } : filters, after)}`),
  get: (id) => call("GET", `/api/runs/${id}`),
  timeline: (id) => call("GET", `/api/runs/${id}/timeline`),
  step: (id, seq) => call("GET", `/api/runs/${id}/steps/${seq}`),
  cancel: (id) => call("POST", `/api/runs/${id}/cancel`),
  message: (id, text) => call("POST", `/api/runs/${id}/messages`, { text }),
  submit: (body) => call("POST", "/api/runs", body),
  pending: (id) => call("GET", `/api/runs/${id}/pending`),
  decide: (id, toolUseId, body) => call("POST", `/api/runs/${id}/pending/${encodeURIComponent(toolUseId)}`, body),
  whoami: () => call("GET", "/api/whoami"),
  children: (id) => call("GET", `/api/runs/${id}/children`),
  descendants: (id) => call("GET", `/api/runs?${runsQuery({ parent: id })}`),
  schedules: () => call("GET", "/api/schedules"),
  workers: () => call("GET", "/api/workers"),
  tools: () => call("GET", "/api/tools"),
  replays: () => call("GET", "/api/replays"),
  replay: (id) => call("GET", `/api/replays/${id}`),
};

// Server-sent events read with fetch (EventSource cannot send an Authorization header). Resumes after a
// dropped connection with Last-Event-ID, so nothing is missed and nothing comes twice. Returns stop().
export function follow(id, onEvent, onState) {
  let lastId = null;
  let stopped = false;
  let controller = null;

  async function once() {
    controller = new AbortController();
    const h = headers({ Accept: "text/event-stream" });
    if (lastId) h["Last-Event-ID"] = lastId;
    const response = await fetch(`/api/runs/${id}/events`, { headers: h, signal: controller.signal });
    if (response.status === 401) {
      await askToken(token() !== null);
      return false;
    }
    if (!response.ok) throw await errorOf(response);
    onState("live");
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    let event = { id: null, type: "message", data: [] };
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return false;
      buffer += value;
      let nl;
      while ((nl = buffer.search(/\r\n|\r|\n/)) >= 0) {
        const line = buffer.slice(0, nl);
        buffer = buffer.slice(nl + (buffer.startsWith("\r\n", nl) ? 2 : 1));
        if (line === "") {
          if (event.data.length) {
            if (event.id !== null) lastId = event.id;
            const data = JSON.parse(event.data.join("\n"));
            onEvent(event.type, data);
            if (event.type === "end") return true;
          }
          event = { id: null, type: "message", data: [] };
        } else if (!line.startsWith(":")) {
          const colon = line.indexOf(":");
          const name = colon < 0 ? line : line.slice(0, colon);
          let v = colon < 0 ? "" : line.slice(colon + 1);
          if (v.startsWith(" ")) v = v.slice(1);
          if (name === "data") event.data.push(v);
          else if (name === "event") event.type = v;
          else if (name === "id") event.id = v;
        }
      }
    }
  }

  (async () => {
    let delay = 500;
    while (!stopped) {
      try {
        if (await once()) {
          onState("ended");
          return;
        }
        delay = 500;
      } catch (e) {
        if (stopped) return;
        if (e instanceof ApiError && e.status === 404) {
          onState("gone");
          return;
        }
        delay = Math.min(delay * 2, 10000);
      }
      if (stopped) return;
      onState("reconnecting");
      await new Promise((r) => setTimeout(r, delay));
    }
  })();

  return () => {
    stopped = true;
    if (controller) controller.abort();
  };
}
