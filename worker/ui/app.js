// The agentrun UI: the runs list and a run's page, rendered from the public API. Every text that comes
// from a run (input, model output, tool results) goes into the page as text nodes, never as HTML.

import { api, ApiError, follow } from "./api.js";

const TERMINAL = new Set(["SUCCEEDED", "FAILED", "CANCELLED", "TIMED_OUT"]);
// What a person waits on was not decided before the run ended: the timeline reports such a call ABANDONED.
const UNDECIDED = new Set(["WAITING", "ABANDONED"]);
const STATUSES = ["QUEUED", "RUNNING", "WAITING", "SUCCEEDED", "FAILED", "CANCELLED", "TIMED_OUT"];
const main = document.getElementById("main");
let cleanup = () => {};
// Who the token stands for and what it may do (GET /api/whoami); controls it may not use are not shown.
// null when the server cannot say (an older one): then every control is shown and the API decides.
let me = null;
const can = (scope) => me === null || me.scopes.includes(scope) || me.scopes.includes("admin");

// -- small helpers ----------------------------------------------------------------------------------

function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "class") el.className = v;
    else if (k === "style") el.setAttribute("style", v);
    else el.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

const fmtInt = (n) => Number(n || 0).toLocaleString("en-US");
// A cost the price table cannot tell (an unpriced model) is null: it says so, never $0.0000.
const fmtUsd = (n) => (n === null || n === undefined ? "unpriced" : `$${Number(n).toFixed(4)}`);
const shortId = (id) => id.slice(0, 8);

function age(iso) {
  const s = Math.max(0, (Date.now() - new Date(iso).getTime()) / 1000);
  if (s < 60) return `${Math.floor(s)}s ago`;
  if (s < 3600) return `${Math.floor(s / 60)}m ago`;
  if (s < 86400) return `${Math.floor(s / 3600)}h ago`;
  return `${Math.floor(s / 86400)}d ago`;
}

function ms(n) {
  if (n === null || n === undefined) return "–";
  return n < 1000 ? `${n} ms` : `${(n / 1000).toFixed(n < 10000 ? 2 : 1)} s`;
}

// Status is said in words and an icon, colour only adds to it. The icons are drawn by CSS (style.css
// `.ic-*`): glyphs such as ⏸ and ⌛ are missing from common fonts (Debian's) and showed as empty boxes.
const ICON = { QUEUED: "queued", RUNNING: "play", WAITING: "pause", SUCCEEDED: "check", FAILED: "cross", CANCELLED: "stop",
  TIMED_OUT: "hourglass", STARTED: "play", DONE: "check", ERROR: "cross", ABANDONED: "stop" };
const icon = (name) => h("span", { class: `ic ic-${name}`, "aria-hidden": "true" });
function badge(status) {
  return h("span", { class: `badge s-${status.toLowerCase()}` }, icon(ICON[status] || "dot"), " ", status);
}

function notice(text, kind = "error") {
  return h("p", { class: kind, role: kind === "error" ? "alert" : "status" }, text);
}

function connState(text) {
  document.getElementById("conn").textContent = text;
}

// -- the runs list ----------------------------------------------------------------------------------

// The list's filters are kept in the page's address (#/?status=…&labelSelector=…), so a filtered list can be
// bookmarked and shared; their names are GET /api/runs's query parameters.
const FILTERS = [
  ["status", "Status", "running,waiting"], ["labelSelector", "Labels", "team=billing,env!=prod"], ["model", "Model", ""],
  ["agent", "Agent", "name or name@version"], ["createdBy", "Created by", ""], ["createdAfter", "Created after", ""],
  ["createdBefore", "Created before", ""], ["q", "Input contains", ""], ["tenant", "Tenant", "team-a"],
];
// Whether the caller sees every tenant's runs (a platform operator's identity, or an open API); an identity of one
// tenant sees its own only, so the list has no tenant to filter by or to show.
const allTenants = () => me === null || me.tenant === "*";
const isoOf = (local) => (local ? new Date(local).toISOString() : ""); // datetime-local (the browser's zone) → ISO 8601
const localOf = (iso) => { // ISO 8601 → datetime-local's value, in the browser's zone
  if (!iso) return "";
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) return "";
  return new Date(d.getTime() - d.getTimezoneOffset() * 60000).toISOString().slice(0, 16);
};

function duration(run) {
  if (!run.finishedAt) return null;
  return new Date(run.finishedAt).getTime() - new Date(run.startedAt || run.createdAt).getTime();
}

const labelText = (labels) => Object.entries(labels || {}).map(([k, v]) => `${k}=${v}`);
function labelTags(labels) {
  return labelText(labels).map((t) => h("span", { class: "tag label mono" }, t));
}

// Sortable columns: each sorts the loaded rows by a value of its own (numbers and times as numbers).
const COLUMNS = [
  ["Run", (r) => r.id], ["Status", (r) => r.status], ["Input", (r) => r.inputPreview], ["Labels", (r) => labelText(r.labels).join(",")],
  ["Model", (r) => r.model], ["Tokens", (r) => r.tokensUsed], ["Cost", (r) => (r.costUsd ?? -1)], ["Steps", (r) => r.steps],
  ["Created", (r) => new Date(r.createdAt).getTime()], ["Ended", (r) => (r.finishedAt ? new Date(r.finishedAt).getTime() : Infinity)],
  ["Duration", (r) => duration(r) ?? Infinity], ["Worker", (r) => r.lockedBy || ""],
];
const NUMERIC = new Set(["Tokens", "Cost", "Steps", "Duration"]);

function listView(params) {
  const filters = Object.fromEntries(FILTERS.map(([k]) => [k, params.get(k) || ""]));
  let sort = { col: params.get("sort") || "Created", desc: params.get("order") !== "asc" };
  const selected = new Set();
  let rows = []; // the first page, refreshed live
  let older = []; // pages past it, loaded with "Load older runs"
  let next = null;

  const fields = FILTERS.filter(([k]) => k !== "tenant" || allTenants()).map(([k, label, placeholder]) => {
    const type = k.startsWith("created") && k !== "createdBy" ? "datetime-local" : "text";
    const input = h("input", { id: `f-${k}`, name: k, type, placeholder: placeholder || null,
      value: type === "datetime-local" ? localOf(filters[k]) : filters[k] });
    const list = k === "status" ? h("datalist", { id: "status-values" }, STATUSES.map((st) => h("option", { value: st.toLowerCase() }))) : null;
    if (list) input.setAttribute("list", "status-values");
    return h("div", { class: "field" }, h("label", { for: `f-${k}` }, label), input, list);
  });
  const filterForm = h("form", { class: "filters card", id: "filters", "aria-label": "filter runs", onsubmit: (e) => {
    e.preventDefault();
    const q = new URLSearchParams();
    for (const [k] of FILTERS) {
      const el = document.getElementById(`f-${k}`);
      if (!el) continue;
      const v = el.type === "datetime-local" ? isoOf(el.value) : el.value.trim();
      if (v) q.set(k, v);
    }
    location.hash = q.toString() ? `#/?${q}` : "#/";
  } }, fields, h("div", { class: "field buttons" }, h("button", { type: "submit", class: "primary", id: "apply-filters" }, "Filter"),
    h("button", { type: "button", id: "clear-filters", onclick: () => { location.hash = "#/"; } }, "Clear")));

  const body = h("tbody");
  const head = h("tr");
  const info = h("p", { class: "muted", role: "status", id: "list-info" });
  const more = h("button", { type: "button", id: "load-more", hidden: true, onclick: () => loadOlder() }, "Load older runs");
  const cancelSelected = h("button", { type: "button", class: "danger", id: "cancel-selected", disabled: true, onclick: async () => {
    const ids = [...selected];
    const results = await Promise.allSettled(ids.map((id) => api.cancel(id)));
    const failed = results.map((r, i) => [r, ids[i]]).filter(([r]) => r.status === "rejected");
    bulkInfo.textContent = failed.length
      ? `Cancel asked for ${ids.length - failed.length} of ${ids.length}; ${failed.map(([r, id]) => `${shortId(id)}: ${r.reason.message}`).join("; ")}`
      : `Cancel asked for ${ids.length} run${ids.length > 1 ? "s" : ""}.`;
    bulkInfo.className = failed.length ? "error" : "ok";
    selected.clear();
    refresh(false);
  } }, "Cancel selected");
  const bulkInfo = h("span", { role: "status", id: "bulk-info" });
  const allBox = h("input", { type: "checkbox", id: "select-all", "aria-label": "select every run shown that has not finished",
    onchange: (e) => {
      for (const r of [...rows, ...older]) if (!TERMINAL.has(r.status)) { if (e.target.checked) selected.add(r.id); else selected.delete(r.id); }
      draw();
    } });

  function sorted() {
    const all = [...rows, ...older.filter((r) => !rows.some((x) => x.id === r.id))];
    const key = (COLUMNS.find(([c]) => c === sort.col) || COLUMNS[8])[1];
    // Equal keys keep the server's order (newest first, to the microsecond), reversed only for the oldest
    // first: createdAt in ms ties for runs made within one millisecond, which must not put an older run first.
    const tie = sort.col === "Created" && !sort.desc ? -1 : 1;
    return all.map((r, i) => [r, i]).sort(([a, i], [b, j]) => {
      const x = key(a); const y = key(b);
      const c = x < y ? -1 : x > y ? 1 : 0;
      return c === 0 ? tie * (i - j) : sort.desc ? -c : c;
    }).map(([r]) => r);
  }

  function draw() {
    head.replaceChildren(h("th", { scope: "col", class: "pick" }, can("cancel") ? allBox : null), ...COLUMNS.map(([c]) => {
      const on = sort.col === c;
      return h("th", { scope: "col", class: NUMERIC.has(c) ? "num" : null, "aria-sort": on ? (sort.desc ? "descending" : "ascending") : "none" },
        h("button", { type: "button", class: "sort", "data-col": c, onclick: () => {
          sort = { col: c, desc: on ? !sort.desc : !["Run", "Status", "Input", "Labels", "Model", "Worker"].includes(c) };
          draw();
        } }, c, on ? h("span", { class: `ic ic-${sort.desc ? "down" : "up"}`, "aria-hidden": "true" }) : null));
    }));
    body.replaceChildren(...sorted().map((r) => h("tr", { "data-run": r.id },
      h("td", { class: "pick" }, can("cancel") && !TERMINAL.has(r.status)
        ? h("input", { type: "checkbox", class: "pick-run", "aria-label": `select run ${shortId(r.id)}`, checked: selected.has(r.id),
          onchange: (e) => { if (e.target.checked) selected.add(r.id); else selected.delete(r.id); drawBulk(); } }) : null),
      h("td", {}, h("a", { href: `#/runs/${r.id}`, class: "mono" }, shortId(r.id)),
        allTenants() ? h("span", { class: "tenant muted small", title: "tenant" }, ` ${r.tenant}`) : null),
      h("td", {}, badge(r.status)),
      h("td", { class: "input", title: r.inputPreview }, r.inputPreview),
      h("td", { class: "labels" }, labelTags(r.labels)),
      h("td", { class: "mono small" }, r.model),
      h("td", { class: "num" }, fmtInt(r.tokensUsed)),
      h("td", { class: "num cost" }, fmtUsd(r.costUsd)),
      h("td", { class: "num" }, r.steps),
      h("td", { class: "age", title: r.createdAt }, age(r.createdAt)),
      h("td", { class: "ended", title: r.finishedAt || "" }, r.finishedAt ? new Date(r.finishedAt).toLocaleTimeString() : "–"),
      h("td", { class: "num duration" }, ms(duration(r))),
      h("td", { class: "mono" }, r.lockedBy || "–"),
    )));
    drawBulk();
  }

  function drawBulk() {
    for (const id of [...selected]) if (![...rows, ...older].some((r) => r.id === id && !TERMINAL.has(r.status))) selected.delete(id);
    cancelSelected.disabled = selected.size === 0;
    cancelSelected.textContent = selected.size ? `Cancel selected (${selected.size})` : "Cancel selected";
  }

  const input = h("textarea", { id: "new-input", name: "input", rows: 2, required: true,
    placeholder: "Which acme tickets are overdue?" });
  const budget = h("input", { id: "new-budget", name: "tokenBudget", type: "number", min: 1, value: 50000 });
  const model = h("input", { id: "new-model", name: "model", type: "text", placeholder: "the server's default" });
  const timeout = h("input", { id: "new-timeout", name: "timeoutSeconds", type: "number", min: 1, value: 300 });
  const cost = h("input", { id: "new-cost", name: "costBudgetUsd", type: "number", min: 0, step: "any", placeholder: "no limit" });
  const tools = h("input", { id: "new-tools", name: "tools", type: "text", placeholder: "every tool", list: "tool-names" });
  const approvals = h("input", { id: "new-approval", name: "requireApproval", type: "text", placeholder: "none (\"*\": every tool)", list: "tool-names" });
  const labels = h("input", { id: "new-labels", name: "labels", type: "text", placeholder: "team=billing,env=dev" });
  const schema = h("textarea", { id: "new-schema", name: "outputSchema", rows: 3, placeholder: '{"type": "object", "properties": {"overdue": {"type": "array"}}}' });
  const toolNames = h("datalist", { id: "tool-names" });
  const formError = h("p", { class: "error", role: "alert", id: "new-error" });
  const names = (text) => text.split(",").map((t) => t.trim()).filter(Boolean);
  const form = h("form", { class: "new-run", id: "new-run", onsubmit: async (e) => {
    e.preventDefault();
    formError.textContent = "";
    const req = { input: input.value, tokenBudget: Number(budget.value), timeoutSeconds: Number(timeout.value) };
    try {
      if (model.value.trim()) req.model = model.value.trim();
      if (cost.value !== "") req.costBudgetUsd = Number(cost.value);
      if (tools.value.trim()) req.tools = names(tools.value);
      if (approvals.value.trim()) req.requireApproval = names(approvals.value);
      if (labels.value.trim()) req.labels = parseLabels(labels.value);
      if (schema.value.trim()) {
        try { req.outputSchema = JSON.parse(schema.value); } catch (err) { throw new Error(`outputSchema: not JSON (${err.message})`); }
      }
      const made = await api.submit(req);
      location.hash = `#/runs/${made.id}`;
    } catch (err) {
      formError.textContent = err.message;
    }
  } },
  h("h2", {}, "New run"),
  h("label", { for: "new-input" }, "Request"), input,
  h("div", { class: "grid" },
    h("div", { class: "field" }, h("label", { for: "new-model" }, "Model"), model),
    h("div", { class: "field" }, h("label", { for: "new-budget" }, "Token budget"), budget),
    h("div", { class: "field" }, h("label", { for: "new-cost" }, "Cost budget (USD)"), cost),
    h("div", { class: "field" }, h("label", { for: "new-timeout" }, "Timeout (s)"), timeout),
    h("div", { class: "field" }, h("label", { for: "new-tools" }, "Tools (a, b)"), tools),
    h("div", { class: "field" }, h("label", { for: "new-approval" }, "Need approval"), approvals),
    h("div", { class: "field" }, h("label", { for: "new-labels" }, "Labels"), labels)),
  toolNames,
  h("label", { for: "new-schema" }, "Output schema (JSON Schema, optional)"), schema,
  h("div", { class: "row" }, h("button", { type: "submit", class: "primary" }, "Submit run")),
  formError);

  main.replaceChildren(
    h("section", { class: "list-head" }, h("h1", {}, "Runs")),
    filterForm,
    can("cancel") ? h("div", { class: "row bulk" }, cancelSelected, bulkInfo) : null,
    h("div", { class: "table-wrap" }, h("table", { class: "runs list", "aria-label": "runs" }, h("thead", {}, head), body)),
    h("div", { class: "row" }, info, more),
    can("submit") ? form : null,
  );
  draw();
  if (can("submit")) api.tools().then((t) => toolNames.replaceChildren(...(t.tools || []).map((x) => h("option", { value: x.name })))).catch(() => {});

  let timer = null;
  let alive = true;
  function say() {
    const n = rows.length + older.length;
    const any = FILTERS.some(([k]) => filters[k]);
    info.textContent = n ? `${n} run${n > 1 ? "s" : ""}${any ? " matching the filters" : ""}${next ? " (more below)" : ""}, newest updated live`
      : any ? "No run matches these filters." : "No runs yet: submit one below, or with `agentrun runs submit`.";
    more.hidden = !next;
  }
  async function loadOlder() {
    if (!next) return;
    try {
      const page = await api.list(filters, next);
      older = [...older, ...page.items];
      next = page.next;
      draw(); say();
    } catch (err) {
      info.textContent = `cannot load older runs: ${err.message}`;
    }
  }
  let drawn = null; // the first page as last drawn, to leave the rows alone when nothing changed
  async function refresh(again = true) {
    try {
      const page = await api.list(filters);
      if (!alive) return;
      rows = page.items;
      if (!older.length) next = page.next;
      info.className = "muted";
      // Redrawing replaces every row: a click that straddles it (pressed on the old checkbox, released on
      // the new) is lost. The list refreshes every 2 s, so it redraws only when the page has changed, and
      // otherwise moves the ages on in place.
      const fresh = JSON.stringify(page.items);
      if (fresh !== drawn) { drawn = fresh; draw(); }
      else for (const td of body.querySelectorAll("td.age")) td.textContent = age(td.title);
      say();
      connState("");
    } catch (err) {
      if (alive) {
        connState("");
        info.textContent = `cannot list runs: ${err.message}`;
        info.className = "error";
      }
    }
    if (alive && again) timer = setTimeout(refresh, 2000);
  }
  refresh();
  return () => { alive = false; clearTimeout(timer); };
}

// `team=billing,env=dev` → {"team": "billing", "env": "dev"}; the API checks the syntax and names a bad key.
function parseLabels(text) {
  const out = {};
  for (const part of text.split(",").map((t) => t.trim()).filter(Boolean)) {
    const eq = part.indexOf("=");
    if (eq <= 0) throw new Error(`labels: "${part}" is not key=value`);
    out[part.slice(0, eq).trim()] = part.slice(eq + 1).trim();
  }
  return out;
}

// -- the workers page (GET /api/workers) ---------------------------------------------------------------

function workersView() {
  const body = h("tbody");
  const info = h("p", { class: "muted", role: "status" });
  main.replaceChildren(
    h("section", { class: "list-head" }, h("h1", {}, "Workers")),
    h("table", { class: "runs workers", "aria-label": "live workers" },
      h("thead", {}, h("tr", {}, ["Worker", "Version", "Runs held", "Concurrency", "Last seen", "MCP servers"]
        .map((c) => h("th", { scope: "col", class: ["Runs held", "Concurrency"].includes(c) ? "num" : null }, c)))),
      body),
    info);
  let timer = null;
  let alive = true;
  async function refresh() {
    try {
      const listed = await api.workers();
      if (!alive) return;
      body.replaceChildren(...listed.items.map((w) => h("tr", { "data-worker": w.id },
        h("td", { class: "mono" }, w.id),
        h("td", { class: "mono" }, w.version || "–"),
        h("td", { class: "num" }, w.runsHeld),
        h("td", { class: "num" }, w.concurrency),
        h("td", {}, w.lastSeen ? h("time", { datetime: w.lastSeen, title: w.lastSeen }, age(w.lastSeen)) : "–"),
        h("td", { class: "mono small" }, (w.mcpServers || []).join(", ") || "–"))));
      info.textContent = listed.items.length ? `${listed.items.length} live worker${listed.items.length > 1 ? "s" : ""}, updated every few seconds`
        : "No live worker: runs stay QUEUED until one starts (`agentrun worker`).";
    } catch (err) {
      if (alive) info.textContent = `cannot list workers: ${err.message}`;
    }
    if (alive) timer = setTimeout(refresh, 3000);
  }
  refresh();
  return () => { alive = false; clearTimeout(timer); };
}

// -- the schedules list (issue 27) ------------------------------------------------------------------

function when(iso) {
  // In the browser's time zone, as the run page shows times; the exact instant (UTC) on hover.
  return iso ? h("time", { datetime: iso, title: iso }, new Date(iso).toLocaleString()) : "–";
}

function schedulesView() {
  const body = h("tbody");
  const info = h("p", { class: "muted", role: "status" });
  main.replaceChildren(
    h("section", { class: "list-head" }, h("h1", {}, "Schedules")),
    h("table", { class: "runs schedules", "aria-label": "schedules, by name" },
      h("thead", {}, h("tr", {}, ["Name", "Schedule", "Suspend", "Last", "Next", "Active"]
        .map((c) => h("th", { scope: "col", class: c === "Active" ? "num" : null }, c)))),
      body),
    info,
  );
  let timer = null;
  let alive = true;
  async function refresh() {
    try {
      const listed = await api.schedules();
      if (!alive) return;
      body.replaceChildren(...listed.items.map((s) => h("tr", { "data-schedule": s.name },
        h("td", { class: "mono" }, s.name),
        h("td", { class: "mono" }, s.cron ? `${s.cron} (${s.timezone})` : `every ${s.intervalSeconds}s`),
        h("td", {}, s.suspend ? "suspended" : "no"),
        h("td", {}, when(s.lastScheduleTime)),
        h("td", {}, when(s.nextScheduleTime)),
        h("td", { class: "num" }, s.active),
      )));
      info.textContent = listed.items.length ? `${listed.items.length} schedules, updated every few seconds`
        : "No schedules yet: create one with POST /api/schedules or `agentrun schedules create`.";
      connState("");
    } catch (err) {
      if (alive) connState(`cannot list schedules: ${err.message}`);
    }
    if (alive) timer = setTimeout(refresh, 3000);
  }
  refresh();
  return () => { alive = false; clearTimeout(timer); };
}

// -- a run's page -----------------------------------------------------------------------------------

function bar(label, used, total, text) {
  const share = total > 0 ? Math.min(1, used / total) : 0;
  const level = share >= 0.9 ? "high" : share >= 0.6 ? "mid" : "low";
  return h("div", { class: "budget" },
    h("div", { class: "budget-label" }, h("span", {}, label), h("span", { class: "mono" }, text)),
    h("div", { class: `meter ${level}`, role: "meter", "aria-label": label, "aria-valuemin": 0, "aria-valuemax": 100,
      "aria-valuenow": Math.round(share * 100), "aria-valuetext": text },
    h("div", { class: "fill", style: `width:${(share * 100).toFixed(1)}%` })));
}

function budgets(run) {
  // The budget bounds the run's tokens with its sub-agents' (tokensUsedTotal), when it has any.
  const tokens = run.tokensUsedTotal !== undefined && run.tokensUsedTotal > run.tokensUsed ? run.tokensUsedTotal : run.tokensUsed;
  const own = tokens !== run.tokensUsed ? ` (own ${fmtInt(run.tokensUsed)})` : "";
  const out = [bar("Tokens", tokens, run.tokenBudget, `${fmtInt(tokens)} of ${fmtInt(run.tokenBudget)}${own}`)];
  const cost = run.costUsdTotal !== undefined && run.costUsdTotal !== null && (run.costUsd === null || run.costUsdTotal > run.costUsd) ? run.costUsdTotal : run.costUsd;
  if (run.costBudgetUsd) out.push(bar("Cost", cost, run.costBudgetUsd, `${fmtUsd(cost)} of ${fmtUsd(run.costBudgetUsd)}`));
  else out.push(h("div", { class: "budget" }, h("div", { class: "budget-label" }, h("span", {}, "Cost"),
    h("span", { class: "mono" }, `${fmtUsd(cost)} (no limit)`))));
  const start = new Date(run.startedAt || run.createdAt).getTime();
  const end = run.finishedAt ? new Date(run.finishedAt).getTime() : Date.now();
  const used = Math.max(0, (end - start) / 1000);
  out.push(bar("Deadline", used, run.timeoutSeconds, `${used.toFixed(1)} s of ${run.timeoutSeconds} s`));
  return out;
}

// What a COMPACT step did, from its `compaction` (the timeline's and the step's): its own kind, never a tool.
function compactLabel(s) {
  const c = s.compaction || {};
  if (c.strategy === "clear_tool_results") return `compacted: cleared ${c.cleared ?? 0} tool result${c.cleared === 1 ? "" : "s"}`;
  const covers = Array.isArray(c.coversSeqs) && c.coversSeqs.length === 2 ? c.coversSeqs[1] - c.coversSeqs[0] + 1 : null;
  return covers === null ? "compacted: steps summarised" : `compacted: ${covers} step${covers === 1 ? "" : "s"} summarised`;
}

// A MODEL step the provider compacted: its response opens with a compaction block (or its summary says so).
function providerCompacted(d) {
  if (!d) return false;
  if (d.context && d.context.compacted) return true;
  try { const blocks = JSON.parse(d.response || "[]"); return Array.isArray(blocks) && blocks.some((b) => b && b.type === "compaction"); } catch (_) { return false; }
}

// How long, in words: "45 s", "3m 20s", "2h 5m".
function span(msTotal) {
  const s = Math.max(0, Math.floor(msTotal / 1000));
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.floor(s / 60)}m ${s % 60}s`;
  if (s < 86400) return `${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m`;
  return `${Math.floor(s / 86400)}d ${Math.floor((s % 86400) / 3600)}h`;
}

// The waits for a person a step's row shows: each decision asked about its call, from when it was asked to
// when it was decided (to now while it waits, to the run's end when it was abandoned).
function waitsOf(run, s, now) {
  const end = run.finishedAt ? new Date(run.finishedAt).getTime() : now;
  return (s.decisions || []).filter((d) => d.since).map((d) => ({
    start: new Date(d.since).getTime(),
    end: d.decidedAt ? new Date(d.decidedAt).getTime() : end,
    open: !d.decidedAt,
    kind: d.kind,
  }));
}

// A worker change is a takeover (a crash, a lost lease) only when the step shows one: a tool call run again
// (attempts > 1) or asked about as in doubt. After a wait (an approval, a timer, children) the run is
// released and any worker may resume it: that is normal, and said plainly.
const crashed = (s) => (s.attempts || 0) > 1 || (s.decisions || []).some((d) => d.kind === "in_doubt");

function waterfall(run, steps, onFork, inflight, details = new Map(), onInspect = null, inspecting = null) {
  if (!steps.length && !inflight) return h("p", { class: "muted" }, run.status === "QUEUED" ? "Waiting for a worker…" : "No steps yet.");
  const now = Date.now();
  if (inflight && !TERMINAL.has(run.status)) {
    // The model call whose text is streaming in has no step row until it ends: drawn from the last
    // step's end (or the run's start) to now.
    const ends = steps.map((s) => s.finishedAt).filter(Boolean).sort();
    steps = [...steps, { seq: inflight, kind: "MODEL", status: "STARTED", startedAt: ends.length ? ends[ends.length - 1] : run.startedAt,
      finishedAt: null, latencyMs: null, inputTokens: 0, outputTokens: 0, cacheCreationInputTokens: 0, cacheReadInputTokens: 0,
      worker: run.lockedBy, stopReason: "streaming", inflight: true }];
  }
  const times = steps.map((s) => {
    const waits = waitsOf(run, s, now);
    if (!s.startedAt) { // a call waiting for a person (no step yet): its wait is all there is
      return { start: waits.length ? waits[0].start : now, end: waits.length ? waits[waits.length - 1].end : now, waits, none: true };
    }
    return { start: new Date(s.startedAt).getTime(), end: s.finishedAt ? new Date(s.finishedAt).getTime() : now, waits };
  });
  // The axis is this run's own time: steps inherited from the run it continues or forks ran earlier (maybe
  // days before) and would squash its own steps into a sliver; they are listed, marked, off the axis.
  const own = times.filter((_, i) => !steps[i].inherited);
  const scaled = own.length ? own : times;
  const edges = scaled.flatMap((t) => [t.start, t.end, ...t.waits.flatMap((w) => [w.start, w.end])]);
  const t0 = Math.min(...edges);
  const t1 = Math.max(...edges, t0 + 1);
  const total = t1 - t0;
  const pos = (t) => Math.min(100, Math.max(0, ((t - t0) / total) * 100));
  let previous = null;
  const rows = steps.map((s, i) => {
    const { start, end, waits, none } = times[i];
    const changed = previous !== null && s.worker && previous !== s.worker;
    const takeover = changed && crashed(s);
    previous = s.worker || previous;
    const kind = s.kind === "MODEL" ? "model" : s.kind === "USER" ? "user" : s.kind === "COMPACT" ? "compact" : "tool";
    const name = s.kind === "MODEL" ? `model${s.stopReason ? ` · ${s.stopReason}` : ""}`
      : s.kind === "USER" ? `user message${s.createdBy ? ` · ${s.createdBy}` : ""}`
      : s.kind === "COMPACT" ? compactLabel(s) : `tool · ${s.toolName || "?"}`;
    const tokens = s.kind === "MODEL" || (s.kind === "COMPACT" && (s.inputTokens || s.outputTokens))
      ? `in ${fmtInt(s.inputTokens)} · out ${fmtInt(s.outputTokens)} · cache w ${fmtInt(s.cacheCreationInputTokens)} / r ${fmtInt(s.cacheReadInputTokens)}`
      : s.kind === "USER" ? "a user message" : s.kind === "COMPACT" ? "no model call" : `attempt ${s.attempts}`;
    const cost = s.kind === "MODEL" || s.kind === "COMPACT" ? ` · ${fmtUsd(s.costUsd)}` : "";
    let track;
    if (s.inherited) {
      track = h("div", { class: "wf-track inherited" }, h("span", { class: "wf-note" },
        `inherited · ran ${s.startedAt ? new Date(s.startedAt).toLocaleString() : "before"} · ${ms(s.latencyMs)}`));
    } else {
      const marks = waits.map((w) => h("div", { class: `wf-wait${w.open ? " open" : ""}`, style: `left:${pos(w.start).toFixed(2)}%;width:${Math.max(0.6, pos(w.end) - pos(w.start)).toFixed(2)}%`,
        title: `waiting for a person (${w.kind === "approval" ? "approval" : "in doubt"}) · ${span(w.end - w.start)}` },
        h("span", {}, `${UNDECIDED.has(s.status) && run.status !== "WAITING" && w.open ? "abandoned after" : "waited"} ${span(w.end - w.start)}`)));
      const bar = none ? null : s.kind === "USER"
        ? h("div", { class: "wf-mark user", style: `left:${pos(start).toFixed(2)}%`, title: "a user message" })
        : h("div", { class: `wf-bar ${kind} ${s.status.toLowerCase()}`, style: `left:${pos(start).toFixed(2)}%;width:${Math.max(0.6, pos(end) - pos(start)).toFixed(2)}%` });
      track = h("div", { class: "wf-track" }, marks, bar);
    }
    const waitingRow = s.seq === null;
    const status = waitingRow && TERMINAL.has(run.status) ? "ABANDONED" : s.status;
    return h("li", { class: `wf-row ${kind}${s.inherited ? " inherited" : ""}${inspecting === s.seq && s.seq !== null ? " inspecting" : ""}`,
      "data-seq": s.seq ?? null, "data-status": status, "data-tool-use": waitingRow ? s.toolUseId : null },
      h("div", { class: "wf-label" },
        h("span", { class: "seq mono" }, waitingRow ? "#–" : `#${s.seq}`), " ", h("strong", {}, name), " ", badge(status),
        s.inherited ? h("span", { class: "tag" }, "inherited") : null,
        s.kind === "MODEL" && providerCompacted(details.get(s.seq)) ? h("span", { class: "tag compacted", title: "the provider compacted the conversation before this call" }, "compacted by the provider") : null,
        takeover ? h("span", { class: "tag takeover", title: "the worker that held the run stopped mid-step (a crash or a lost lease); another went on" }, `taken over by ${s.worker}`) : null,
        changed && !takeover ? h("span", { class: "tag resumed", title: "the run was released (it waited) and another worker resumed it" }, `resumed on ${s.worker}`) : null),
      track,
      s.inflight ? h("div", { class: "wf-meta mono" }, `in flight · ${s.worker || "–"}`)
        : waitingRow ? h("div", { class: "wf-meta" }, status === "ABANDONED" ? "never decided: the run ended first" : "waiting for a person's decision")
        : h("div", { class: "wf-meta mono" }, `${ms(s.latencyMs)} · ${tokens}${cost} · ${s.worker || "–"}`, " ",
          onInspect ? h("button", { type: "button", class: "link", id: `inspect-${s.seq}`, onclick: () => onInspect(s.seq), "aria-label": `Inspect step ${s.seq}` }, "Inspect") : null,
          can("submit") ? h("button", { type: "button", class: "link", id: `fork-${s.seq}`, onclick: () => onFork(s.seq), "aria-label": `Fork from step ${s.seq}` }, "Fork here") : null));
  });
  const inherited = steps.filter((s) => s.inherited).length;
  return h("div", {}, h("div", { class: "wf-axis mono", "aria-hidden": "true" }, h("span", {}, "0 s"),
    h("span", {}, `${(total / 1000).toFixed(1)} s${inherited ? ` (this run's own ${steps.length - inherited} step${steps.length - inherited === 1 ? "" : "s"})` : ""}`)),
    h("ol", { class: "waterfall", "aria-label": "steps on a time axis" }, rows),
    h("p", { class: "legend" }, h("span", { class: "key model" }), " model call ", h("span", { class: "key tool" }), " tool call",
      steps.some((s) => s.kind === "USER") ? [" ", h("span", { class: "key user" }), " user message"] : null,
      times.some((t) => t.waits.length) ? [" ", h("span", { class: "key wait" }), " waiting for a person"] : null,
      steps.some((s) => s.kind === "COMPACT") ? [" ", h("span", { class: "key compact" }), " compaction"] : null,
      inherited ? [" ", h("span", { class: "key inherited" }), ` inherited (${inherited}, off the axis)`] : null));
}

// -- the step inspector: what a step sent and got, formatted or as raw JSON, and a download --------------

function jsonOf(text) {
  if (typeof text !== "string") return text;
  try { return JSON.parse(text); } catch (_) { return text; }
}

function download(name, value) {
  const blob = new Blob([JSON.stringify(value, null, 2)], { type: "application/json" });
  const url = URL.createObjectURL(blob);
  const a = h("a", { href: url, download: name });
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 1000);
}

const block = (title, value, cls = "") => h("div", { class: `part ${cls}` }, h("h3", {}, title),
  h("pre", {}, typeof value === "string" ? value : JSON.stringify(value, null, 2)));

function inspector(run, seq, d, raw, setRaw, close) {
  if (seq === null) return null;
  const head = h("div", { class: "row insp-head" },
    h("h2", { id: "inspector-title" }, `Step #${seq}`, d ? ` · ${d.kind}${d.toolName ? ` · ${d.toolName}` : ""}` : ""),
    d ? badge(d.status) : null,
    h("div", { class: "insp-tabs", role: "group", "aria-label": "view" },
      h("button", { type: "button", id: "insp-formatted", "aria-pressed": String(!raw), onclick: () => setRaw(false) }, "Formatted"),
      h("button", { type: "button", id: "insp-raw", "aria-pressed": String(raw), onclick: () => setRaw(true) }, "Raw JSON")),
    d ? h("button", { type: "button", id: "insp-download", onclick: () => download(`run-${shortId(run.id)}-step-${seq}.json`, d) }, "Download JSON") : null,
    h("button", { type: "button", class: "link", id: "insp-close", onclick: close }, "Close"));
  if (!d) return h("section", { class: "card inspector", id: "inspector", "aria-labelledby": "inspector-title" }, head, h("p", { class: "muted" }, "loading…"));
  const facts = h("p", { class: "mono small insp-facts" },
    `cost ${fmtUsd(d.costUsd)} · ${ms(d.latencyMs)}`,
    d.kind === "MODEL" ? ` · in ${fmtInt(d.inputTokens)} · out ${fmtInt(d.outputTokens)} · cache w ${fmtInt(d.cacheCreationInputTokens)} / r ${fmtInt(d.cacheReadInputTokens)}` : "",
    d.worker ? ` · ${d.worker}` : "");
  let parts;
  if (raw) {
    parts = [h("pre", { class: "raw", id: "insp-json" }, JSON.stringify(d, null, 2))];
  } else if (d.kind === "MODEL") {
    const sent = d.sent || null;
    parts = [h("h3", { class: "side" }, "Request"),
      sent ? [
        block("System prompt", sent.system ?? "(none)", "system"),
        h("div", { class: "part tools" }, h("h3", {}, `Tools (${(sent.tools || []).length})`),
          (sent.tools || []).map((t) => h("details", {}, h("summary", { class: "mono" }, t.name || "?", t.description ? h("span", { class: "muted" }, ` · ${t.description}`) : null),
            h("pre", {}, JSON.stringify(t, null, 2))))),
        h("div", { class: "part messages" }, h("h3", {}, `Messages (${(sent.messages || []).length})`),
          (sent.messages || []).map((m, i) => h("details", { open: i === (sent.messages || []).length - 1 },
            h("summary", {}, h("strong", {}, m.role), " ", h("span", { class: "muted small" }, asText(m.content).slice(0, 120))),
            h("pre", {}, typeof m.content === "string" ? m.content : JSON.stringify(m.content, null, 2))))),
      ] : block("Request summary", jsonOf(d.request)),
      h("h3", { class: "side" }, "Response"), block("Content blocks", jsonOf(d.response), "response")];
  } else if (d.kind === "TOOL") {
    parts = [block("Input", jsonOf(d.request), "tool-input"), block(d.status === "ERROR" ? "Output (an error)" : "Output", jsonOf(d.response), "tool-output")];
  } else {
    parts = [block("Request", jsonOf(d.request)), block("Response", jsonOf(d.response))];
  }
  return h("section", { class: "card inspector", id: "inspector", "aria-labelledby": "inspector-title", "data-seq": seq }, head, facts, parts);
}

function asText(content) {
  if (typeof content === "string") return content;
  if (Array.isArray(content)) return content.map((b) => (b && b.text) || "").join("");
  return content === null || content === undefined ? "" : JSON.stringify(content);
}

function pretty(text) {
  try { return JSON.stringify(JSON.parse(text), null, 2); } catch (_) { return text; }
}

function conversation(run, steps, details, live) {
  // A continued run starts with its parent's conversation, user messages included (USER steps).
  const opensWithUser = steps.length && steps[0].kind === "USER";
  const items = opensWithUser ? [] : [h("li", { class: "msg user" }, h("div", { class: "who" }, "user"), h("div", { class: "text" }, run.input))];
  for (const s of steps) {
    const d = details.get(s.seq);
    if (s.kind === "MODEL") {
      if (!d) { items.push(h("li", { class: "msg assistant muted" }, `loading step ${s.seq}…`)); continue; }
      let blocks = [];
      try { blocks = JSON.parse(d.response || "[]"); } catch (_) { blocks = []; }
      if (providerCompacted(d)) {
        items.push(h("li", { class: "msg compact", "data-seq": s.seq }, h("div", { class: "who" }, `compacted by the provider · #${s.seq}`),
          h("p", { class: "muted small" }, "The provider summarised the earlier conversation before this call; the turns are all kept in the step log.")));
      }
      for (const b of blocks) {
        if (b.type === "text" && b.text) {
          items.push(h("li", { class: "msg assistant", "data-seq": s.seq }, h("div", { class: "who" }, `assistant · #${s.seq}`), h("div", { class: "text" }, b.text)));
        } else if (b.type === "tool_use") {
          items.push(h("li", { class: "msg call", "data-seq": s.seq }, h("div", { class: "who" }, `tool call · ${b.name}`),
            h("div", { class: "mono small" }, b.id), h("pre", {}, JSON.stringify(b.input, null, 2))));
        }
      }
    } else if (s.kind === "USER") {
      const text = d ? asText((() => { try { return JSON.parse(d.response || '""'); } catch (_) { return d.response; } })()) : "…";
      // A message posted while the run worked says who sent it (createdBy).
      const from = s.createdBy ? ` · from ${s.createdBy}` : "";
      items.push(h("li", { class: `msg user${d && d.request === "message" ? " posted" : ""}`, "data-seq": s.seq },
        h("div", { class: "who" }, `user · #${s.seq}${from}`), h("div", { class: "text" }, text)));
    } else if (s.kind === "COMPACT") {
      const c = s.compaction || (d && d.compaction) || {};
      const covers = Array.isArray(c.coversSeqs) ? ` (steps ${c.coversSeqs[0]}–${c.coversSeqs[1]})` : "";
      const body = !d ? h("p", { class: "muted" }, "loading…")
        : c.strategy === "clear_tool_results" ? h("p", { class: "muted small" }, "Older tool results are sent as placeholders naming the step that keeps each one.")
        : h("div", { class: "text" }, d.response || "");
      items.push(h("li", { class: "msg compact", "data-seq": s.seq },
        h("div", { class: "who" }, `${compactLabel(s)}${covers} · #${s.seq}`), body));
    } else if (s.seq === null) {
      // A run cancelled or timed out while it waited never got the decision: not "waiting" any more.
      const abandoned = s.status === "ABANDONED" || TERMINAL.has(run.status);
      items.push(h("li", { class: `msg result ${abandoned ? "abandoned" : "waiting"}`, "data-tool-use": s.toolUseId },
        h("div", { class: "who" }, `tool call · ${s.toolName}`, " ", badge(abandoned ? "ABANDONED" : "WAITING")),
        h("p", { class: "muted" }, abandoned ? `never decided: the run ended ${run.status === "TIMED_OUT" ? "(timed out)" : run.status === "CANCELLED" ? "(cancelled)" : ""} first`
          : "waiting for a person's decision (above)")));
    } else {
      const error = s.status === "ERROR";
      const body = s.status === "STARTED" ? h("p", { class: "muted" }, "running…")
        : d ? h("pre", {}, pretty(asText(d.response))) : h("p", { class: "muted" }, "loading…");
      items.push(h("li", { class: `msg result${error ? " is-error" : ""}`, "data-seq": s.seq },
        h("div", { class: "who" }, `tool result · ${s.toolName}${error ? " · is_error" : ""}`, " ", badge(s.status)),
        (s.decisions || []).filter((d) => d.decision).map((d) => h("p", { class: "small decided" },
          `${d.kind === "approval" ? "approval" : "in doubt"}: ${d.decision}${d.decidedBy ? ` by ${d.decidedBy}` : ""}${d.reason ? ` (${d.reason})` : ""}`)),
        body));
    }
  }
  const lastSeq = Math.max(0, ...steps.filter((s) => s.seq !== null).map((s) => s.seq));
  for (const [seq, text] of live) {
    if (seq > lastSeq && text) {
      items.push(h("li", { class: "msg assistant streaming", "aria-live": "polite", "data-seq": seq },
        h("div", { class: "who" }, `assistant · #${seq} · streaming`), h("div", { class: "text" }, text, h("span", { class: "caret" }, "▍"))));
    }
  }
  return h("ol", { class: "conversation", "aria-label": "conversation" }, items);
}

function pendingSection(run, pending, decide) {
  if (pending === null) return null; // this server has no decisions API
  if (TERMINAL.has(run.status)) return null; // nothing left to decide: the run ended (its calls are abandoned)
  // Sub-agent calls (treeSection) and timers and event waits (waitsSection) take no decision.
  pending = pending.filter((p) => !["children", "timer", "event"].includes(p.kind));
  if (!pending.length) return null;
  return h("section", { class: "card pending", "aria-labelledby": "pending-title" },
    h("h2", { id: "pending-title" }, `Waiting for a decision (${pending.length})`),
    pending.map((p) => {
      const reason = h("input", { type: "text", name: "reason", id: `reason-${p.toolUseId}`, placeholder: "reason (optional)", "aria-label": `reason for ${p.toolUseId}` });
      const output = h("textarea", { name: "output", id: `output-${p.toolUseId}`, rows: 2, placeholder: "the output to record", "aria-label": `output for ${p.toolUseId}` });
      const isError = h("input", { type: "checkbox", name: "isError", id: `err-${p.toolUseId}` });
      const go = (decision, extra = {}) => decide(p.toolUseId, { decision, ...(reason.value ? { reason: reason.value } : {}), ...extra });
      const buttons = p.kind === "approval"
        ? [h("button", { type: "button", class: "primary", id: `approve-${p.toolUseId}`, onclick: () => go("approve") }, "Approve"),
          h("button", { type: "button", class: "danger", id: `deny-${p.toolUseId}`, onclick: () => go("deny") }, "Deny")]
        : [h("button", { type: "button", id: `retry-${p.toolUseId}`, onclick: () => go("retry") }, "Retry"),
          h("button", { type: "button", id: `record-${p.toolUseId}`, onclick: () => go("record", { output: output.value, isError: isError.checked }) }, "Record"),
          h("button", { type: "button", class: "danger", id: `fail-${p.toolUseId}`, onclick: () => go("fail") }, "Fail")];
      return h("div", { class: "decision", "data-tool-use": p.toolUseId },
        h("p", {}, h("strong", {}, p.tool), " ", h("span", { class: "tag" }, p.kind === "approval" ? "needs approval" : "in doubt"),
          " ", h("span", { class: "mono small" }, p.toolUseId),
          // A decision authorises one execution: the attempt says which question this is.
          p.kind === "in_doubt" && p.attempt ? h("span", { class: "muted small attempt" }, ` · interrupted at attempt ${p.attempt}`) : null),
        p.since ? h("p", { class: "small waited", "data-since": p.since }, `waiting for ${span(Date.now() - new Date(p.since).getTime())}`,
          h("span", { class: "muted" }, ` (since ${new Date(p.since).toLocaleString()})`)) : null,
        h("pre", {}, JSON.stringify(p.input, null, 2)),
        p.kind === "in_doubt" ? h("div", {}, output, h("label", { for: `err-${p.toolUseId}` }, isError, " the output is an error")) : null,
        can("decide") ? h("div", { class: "row" }, reason, ...buttons)
          : h("p", { class: "muted", id: `no-decide-${p.toolUseId}` }, "Deciding needs the decide scope."));
    }));
}

// -- waits: a timer, or an event from outside (POST /api/events) ---------------------------------------

// A time and how far it is from now: "in 5m" ahead, "3s ago" past.
function whenText(iso) {
  const s = (new Date(iso).getTime() - Date.now()) / 1000;
  const rel = s <= 0 ? age(iso)
    : s < 60 ? `in ${Math.ceil(s)}s` : s < 3600 ? `in ${Math.ceil(s / 60)}m` : s < 86400 ? `in ${Math.ceil(s / 3600)}h`
      : `in ${Math.ceil(s / 86400)}d`;
  return `${new Date(iso).toLocaleString()} (${rel})`;
}

// MCP tools' progress notifications (`progress` events), by tool_use id, while their calls run: live only,
// like text deltas; a call's entry goes once its step ends.
function progressSection(progress) {
  if (!progress.size) return null;
  return h("section", { class: "card", id: "progress", "aria-labelledby": "progress-title" },
    h("h2", { id: "progress-title" }, "Tools at work"),
    [...progress.values()].map((p) => {
      const share = typeof p.total === "number" && p.total > 0 ? Math.min(1, p.progress / p.total) : null;
      return h("div", { class: "budget tool-progress", "data-tool-use": p.toolUseId },
        h("div", { class: "budget-label" },
          h("span", { class: "mono" }, p.toolName),
          h("span", {}, share === null ? `${p.progress}` : `${p.progress} of ${p.total}`)),
        share === null ? null : h("div", { class: "meter" }, h("div", { class: "fill", style: `width:${(share * 100).toFixed(1)}%` })),
        p.message ? h("div", { class: "muted small progress-message" }, p.message) : null);
    }));
}

function waitsSection(run, pending) {
  if (run.status !== "WAITING" || !["timer", "event"].includes(run.waitingFor)) return null;
  const waits = (pending || []).filter((p) => p.kind === "timer" || p.kind === "event");
  return h("section", { class: "card waits", id: "waits", "aria-labelledby": "waits-title" },
    h("h2", { id: "waits-title" }, run.waitingFor === "timer" ? "Waiting for a timer" : "Waiting for an event"),
    waits.length ? waits.map((w) => h("dl", { class: "wait", "data-kind": w.kind, "data-tool-use": w.toolUseId },
      w.kind === "timer"
        ? [h("dt", {}, "Wakes at"), h("dd", { class: "wake-at", "data-at": w.wakeAt }, whenText(w.wakeAt))]
        : [h("dt", {}, "Event key"), h("dd", { class: "mono event-key" }, w.key),
          h("dt", {}, "Times out at"), h("dd", { class: "timeout-at", "data-at": w.timeoutAt }, whenText(w.timeoutAt))],
      h("dt", {}, "Call"), h("dd", { class: "mono small" }, `${w.tool} ${w.toolUseId}`)))
      : h("p", { class: "muted" }, "…"),
    run.waitingFor === "event"
      ? h("p", { class: "muted small" }, "Send it with POST /api/events or `agentrun events send KEY --payload JSON`.")
      : null);
}

// -- sub-agents: a child's parent, a parent's tree of children and its totals ------------------------

// Whether a run may have started sub-agent runs (worth asking for its children).
const mayHaveChildren = (run) => Boolean((run.subAgents && run.subAgents.length) || run.childrenActive
  || (run.tokensUsedTotal || 0) > (run.tokensUsed || 0) || (run.costUsdTotal || 0) > (run.costUsd || 0));

const agentOf = (run) => run.agent ? `${run.agent}${run.agentVersion && !String(run.agent).includes("@") ? `@${run.agentVersion}` : ""}` : "–";

// Where the run came from: the parent whose sub-agent call started it, or the run it continues or forks.
function lineage(run, descendants, children) {
  const subAgents = new Set((children || []).map((c) => c.id));
  const made = (descendants || []).filter((r) => !subAgents.has(r.id));
  const from = made.length ? h("p", { id: "descendants" }, "Continued or forked as: ",
    made.map((r, i) => [i ? ", " : "", h("a", { href: `#/runs/${r.id}`, class: "mono", "data-run": r.id }, shortId(r.id)), " ", badge(r.status)])) : null;
  // A replay's run: the replay it is part of and the recorded run it replays (issue 47).
  const replayed = run.replayId ? h("p", { id: "replay-of" }, "Replay of run ",
    h("a", { href: `#/runs/${run.replayOf}`, class: "mono" }, shortId(run.replayOf || "")), " in replay ",
    h("a", { href: `#/replays/${run.replayId}`, class: "mono" }, shortId(run.replayId)),
    run.toolPolicy ? ` · tool calls: ${run.toolPolicy}` : "") : null;
  if (!run.parentRunId) return replayed || from ? h("div", { class: "lineage" }, replayed, from) : null;
  return h("div", { class: "lineage" }, replayed, parentLine(run), from);
}

function parentLine(run) {
  const link = h("a", { href: `#/runs/${run.parentRunId}`, class: "mono", id: "parent-link" }, shortId(run.parentRunId));
  if (run.parentToolUseId) {
    return h("p", { id: "started-by" }, "Started by run ", link, " for call ",
      h("span", { class: "mono small" }, run.parentToolUseId), run.depth > 1 ? ` (depth ${run.depth})` : "");
  }
  return h("p", {}, `From run `, link, run.forkedAtSeq ? ` at step ${run.forkedAtSeq}` : "");
}

function treeSection(run, children) {
  if (!children || !children.length) {
    return run.waitingFor === "children"
      ? h("section", { class: "card tree", id: "children" }, h("h2", {}, "Sub-agents"),
        h("p", { class: "waiting-children" }, `Waiting for its sub-agents (${run.childrenActive} at work)…`))
      : null;
  }
  const rows = children.map((c) => h("tr", { "data-run": c.id, "data-call": c.parentToolUseId || "" },
    h("td", {}, badge(c.status)),
    h("td", {}, h("a", { href: `#/runs/${c.id}`, class: "mono" }, shortId(c.id))),
    h("td", { class: "mono" }, agentOf(c)),
    h("td", { class: "mono small" }, c.parentToolUseId || "–"),
    h("td", { class: "num" }, fmtInt(c.tokensUsedTotal)),
    h("td", { class: "num" }, fmtUsd(c.costUsdTotal)),
    h("td", { class: "small" }, c.childrenActive ? `${c.childrenActive} at work` : c.error || "")));
  return h("section", { class: "card tree", id: "children", "aria-labelledby": "children-title" },
    h("h2", { id: "children-title" }, `Sub-agents (${children.length})`),
    run.waitingFor === "children"
      ? h("p", { class: "waiting-children" }, `Waiting for its sub-agents: ${run.childrenActive} of ${children.length} at work.`) : null,
    h("table", { class: "runs children" },
      h("thead", {}, h("tr", {}, ["Status", "Run", "Agent", "Call", "Tokens", "Cost", ""].map((t) => h("th", t === "Tokens" || t === "Cost" ? { class: "num" } : {}, t)))),
      h("tbody", {}, rows)),
    h("p", { class: "totals", id: "totals" }, "Totals with its sub-agents: ",
      h("strong", {}, `${fmtInt(run.tokensUsedTotal)} tokens`), " · ", h("strong", {}, fmtUsd(run.costUsdTotal)),
      h("span", { class: "muted" }, ` (own: ${fmtInt(run.tokensUsed)} tokens · ${fmtUsd(run.costUsd)})`)));
}

function runView(id) {
  let run = null;
  let steps = new Map();
  const details = new Map();
  const live = new Map();
  const progress = new Map(); // toolUseId -> its latest `progress` event
  let pending = [];
  let message = null;
  let alive = true;
  let children = null; // the runs its sub-agent calls started (null: none asked for yet)
  let descendants = null; // the runs whose parent is this one: sub-agents', continuations, forks
  let inspecting = null; // the seq of the step shown in the inspector
  let raw = false;
  const root = h("div", { class: "run" });
  main.replaceChildren(root);

  // A fork or a continuation keeps this run's budgets and model unless the options say otherwise.
  const source = () => {
    const val = (key) => { const el = document.getElementById(`opt-${key}`); return el ? el.value.trim() : ""; };
    const out = { tokenBudget: Number(val("tokenBudget") || run.tokenBudget), timeoutSeconds: Number(val("timeoutSeconds") || run.timeoutSeconds) };
    if (val("model") && val("model") !== run.model) out.model = val("model");
    if (val("costBudgetUsd")) out.costBudgetUsd = Number(val("costBudgetUsd"));
    if (val("maxSteps")) out.maxSteps = Number(val("maxSteps"));
    return out;
  };

  function inspect(seq) {
    inspecting = seq;
    const step = steps.get(seq);
    if (step) loadDetail(step);
    render();
    const el = document.getElementById("inspector");
    if (el) el.scrollIntoView({ block: "nearest" });
  }

  async function loadDescendants() {
    try {
      descendants = (await api.descendants(id)).items;
    } catch (_) { /* kept as it was */ }
    if (alive) render();
  }

  async function act(what, fn) {
    message = null;
    try {
      const result = await fn();
      message = notice(`${what}: done`, "ok");
      return result;
    } catch (err) {
      message = notice(`${what}: ${err.message}`);
      return null;
    } finally {
      render();
    }
  }

  async function fork(seq) {
    const made = await act(`Fork from step ${seq}`, () => api.submit({ forkFrom: { runId: id, seq }, ...source() }));
    if (made) location.hash = `#/runs/${made.id}`;
  }

  async function loadDetail(step) {
    if (step.seq === null || step.status === "STARTED") return;
    const have = details.get(step.seq);
    if (have && have.status === step.status) return;
    try {
      details.set(step.seq, await api.step(id, step.seq));
      if (alive) render();
    } catch (_) { /* shown as loading; the next event tries again */ }
  }

  async function loadPending() {
    try {
      pending = await api.pending(id);
    } catch (err) {
      pending = err instanceof ApiError && (err.status === 404 || err.status === 405) ? null : pending;
    }
    if (alive) render();
  }

  async function loadChildren() {
    if (!run || !mayHaveChildren(run)) return;
    try {
      children = await api.children(id);
    } catch (_) { /* kept as it was; the next run event or tick asks again */ }
    if (alive) render();
  }

  function render() {
    if (!run) return;
    // Re-rendered on every event: keep what the person is typing and where the keyboard focus is.
    const focused = document.activeElement && root.contains(document.activeElement) ? document.activeElement.id : null;
    const values = new Map([...root.querySelectorAll("input[id], textarea[id]")]
      .map((el) => [el.id, el.type === "checkbox" ? el.checked : el.value]));
    const open = root.querySelector("#run-options") ? root.querySelector("#run-options").open : false;
    draw(ordered());
    if (open && root.querySelector("#run-options")) root.querySelector("#run-options").open = true;
    for (const [key, value] of values) {
      const el = document.getElementById(key);
      if (el && root.contains(el)) { if (el.type === "checkbox") el.checked = value; else el.value = value; }
    }
    if (focused) { const el = document.getElementById(focused); if (el) el.focus(); }
  }

  const inflightSeq = (rows) => {
    const last = Math.max(0, ...rows.filter((s) => s.seq !== null).map((s) => s.seq));
    const streaming = [...live.keys()].filter((seq) => seq > last && live.get(seq));
    return streaming.length ? Math.max(...streaming) : null;
  };

  const ordered = () => [...steps.values()].sort((a, b) => (a.seq ?? Infinity) - (b.seq ?? Infinity));

  function draw(ordered) {
    const cancel = !TERMINAL.has(run.status) && can("cancel")
      ? h("button", { type: "button", class: "danger", id: "cancel", disabled: run.cancelRequested,
        onclick: () => act("Cancel", () => api.cancel(id)) }, run.cancelRequested ? "Cancel requested" : "Cancel run")
      : null;
    const contInput = h("textarea", { id: "continue-input", rows: 2, required: true, placeholder: "Your next message" });
    const cont = run.status === "SUCCEEDED" && can("submit")
      ? h("form", { class: "card continue", onsubmit: async (e) => {
        e.preventDefault();
        const made = await act("Continue", () => api.submit({ continueFrom: id, input: contInput.value, ...source() }));
        if (made) location.hash = `#/runs/${made.id}`;
      } }, h("h2", {}, h("label", { for: "continue-input" }, "Continue the conversation")), contInput,
      h("div", { class: "row" }, h("button", { type: "submit", class: "primary" }, "Continue")))
      : null;
    // A run still working takes messages: the model gets each at its next turn boundary.
    const msgInput = h("textarea", { id: "message-input", rows: 2, required: true, maxlength: 100000,
      placeholder: "A message for the model: it gets it after its current turn and tool calls" });
    const waitingMessages = (run.messagesSent || 0) - (run.messagesDelivered || 0);
    const talk = !TERMINAL.has(run.status) && !run.cancelRequested && can("submit")
      ? h("form", { class: "card continue message", id: "message-form", onsubmit: async (e) => {
        e.preventDefault();
        const text = msgInput.value;
        const sent = await act("Message", () => api.message(id, text));
        if (sent) { const el = document.getElementById("message-input"); if (el) el.value = ""; render(); }
      } }, h("h2", {}, h("label", { for: "message-input" }, "Send a message")), msgInput,
      h("div", { class: "row" }, h("button", { type: "submit", class: "primary", id: "message-send" }, "Send"),
        waitingMessages > 0 ? h("span", { class: "muted small", id: "messages-waiting" },
          `${waitingMessages} message${waitingMessages > 1 ? "s" : ""} waiting for the next turn boundary`) : null))
      : null;
    const opt = (key, label, attrs) => h("div", { class: "field" }, h("label", { for: `opt-${key}` }, label),
      h("input", { id: `opt-${key}`, name: key, ...attrs }));
    const options = h("details", { class: "card options", id: "run-options" },
      h("summary", {}, "Fork and continue with other settings"),
      h("p", { class: "muted small" }, "Left as they are, a fork (“Fork here” on a step) and a continuation keep this run's model and budgets."),
      h("div", { class: "grid" },
        opt("model", "Model", { type: "text", value: run.model }),
        opt("tokenBudget", "Token budget", { type: "number", min: 1, value: run.tokenBudget }),
        opt("costBudgetUsd", "Cost budget (USD)", { type: "number", min: 0, step: "any", value: run.costBudgetUsd ?? "", placeholder: "no limit" }),
        opt("timeoutSeconds", "Timeout (s)", { type: "number", min: 1, value: run.timeoutSeconds }),
        opt("maxSteps", "Max steps", { type: "number", min: 1, value: run.maxSteps })));
    root.replaceChildren(...[
      h("p", {}, h("a", { href: "#/" }, "← all runs")),
      h("section", { class: "run-head" },
        h("div", {}, h("h1", {}, "Run ", h("span", { class: "mono" }, shortId(run.id))), h("p", { class: "mono small muted" }, run.id)),
        h("div", { class: "head-status" }, badge(run.status), cancel)),
      message,
      // A cancel that worked is no error: said plainly, who asked included; a failure or a timeout is red.
      run.status === "CANCELLED" ? h("p", { class: "note", id: "cancelled", role: "status" },
        `Cancelled${run.cancelledBy ? ` by ${run.cancelledBy}` : ""}${run.error && !/^cancel/i.test(run.error) ? `: ${run.error}` : "."}`)
        : run.error ? notice(`${run.status === "TIMED_OUT" ? "Timed out" : "Error"}: ${run.error}`) : null,
      run.status === "QUEUED" && run.modelRetries > 0 && run.runAt
        ? h("p", { class: "muted", id: "handed-back" },
          `Handed back after ${run.modelRetries} failed model step${run.modelRetries > 1 ? "s" : ""}; claimable again from ${new Date(run.runAt).toLocaleTimeString()}.`)
        : null,
      lineage(run, descendants, children),
      h("section", { class: "card facts" },
        h("dl", {},
          h("dt", {}, "Tenant"), h("dd", { class: "mono", id: "run-tenant" }, run.tenant),
          run.throttled ? [h("dt", {}, "Held back"), h("dd", { id: "run-throttled", class: "warn" },
            `${run.throttled.reason || run.throttled.quota}${run.throttled.until ? ` until ${new Date(run.throttled.until).toLocaleTimeString()}` : ""}`)] : null,
          h("dt", {}, "Model"), h("dd", { class: "mono" }, run.model),
          run.agent ? [h("dt", {}, "Agent"), h("dd", { class: "mono" }, agentOf(run))] : null,
          h("dt", {}, "Steps"), h("dd", {}, `${run.steps} of at most ${run.maxSteps}`),
          h("dt", {}, "Cost"), h("dd", { class: "mono", id: "run-cost" }, fmtUsd(run.costUsd)),
          h("dt", {}, "Worker"), h("dd", { class: "mono" }, run.lockedBy || "–"),
          h("dt", {}, "Created"), h("dd", {}, `${new Date(run.createdAt).toLocaleString()} (${age(run.createdAt)})${run.createdBy ? ` by ${run.createdBy}` : ""}`),
          run.finishedAt ? [h("dt", {}, "Ended"), h("dd", { id: "run-ended" }, `${new Date(run.finishedAt).toLocaleString()} · took ${ms(duration(run))}`)] : null,
          Object.keys(run.labels || {}).length ? [h("dt", {}, "Labels"), h("dd", { id: "run-labels" }, labelTags(run.labels))] : null),
        h("div", { class: "budgets" }, budgets(run))),
      pendingSection(run, pending, (toolUseId, body) => act(`Decision on ${toolUseId}`, async () => {
        const r = await api.decide(id, toolUseId, body);
        await loadPending();
        return r;
      })),
      waitsSection(run, pending),
      progressSection(progress),
      treeSection(run, children),
      run.output !== undefined && run.output !== null
        ? h("section", { class: "card answer" }, h("h2", {}, "Answer"), h("div", { class: "text" },
          typeof run.output === "string" ? run.output : JSON.stringify(run.output, null, 2)))
        : null,
      h("section", { class: "card" }, h("h2", {}, "Steps"), waterfall(run, ordered, fork, inflightSeq(ordered), details, inspect, inspecting)),
      inspector(run, inspecting, details.get(inspecting), raw, (v) => { raw = v; render(); }, () => { inspecting = null; render(); }),
      h("section", { class: "card" }, h("h2", {}, "Conversation"), conversation(run, ordered, details, live)),
      talk,
      cont,
      can("submit") ? options : null,
    ].filter(Boolean));
  }

  const stop = follow(id, (type, data) => {
    if (type === "run") {
      const before = run ? run.pending : undefined;
      run = data;
      if (TERMINAL.has(run.status)) progress.clear();
      if (run.status === "WAITING" || (run.pending !== undefined && run.pending !== before)) loadPending();
      loadChildren();
      if (!descendants || TERMINAL.has(run.status)) loadDescendants();
    } else if (type === "step") {
      // A call waiting for a person has no seq yet: keyed by its tool_use id until its step appears.
      if (data.seq === null) steps.set(`w:${data.toolUseId}`, data);
      else { steps.delete(`w:${data.toolUseId}`); steps.set(data.seq, data); }
      if (data.kind === "MODEL") live.delete(data.seq);
      if (data.kind === "TOOL" && data.status !== "STARTED") progress.delete(data.toolUseId);
      loadDetail(data);
      if (data.status !== "DONE" && data.status !== "ERROR" && data.status !== "STARTED") loadPending();
    } else if (type === "delta") {
      if (!steps.has(data.seq)) live.set(data.seq, (live.get(data.seq) || "") + data.text);
    } else if (type === "progress") {
      progress.set(data.toolUseId, data);
    }
    render();
  }, (state) => {
    connState({ live: "● live", ended: "", reconnecting: "reconnecting…", gone: "" }[state] || "");
    if (state === "gone") root.replaceChildren(notice(`No run with id ${id}.`), h("p", {}, h("a", { href: "#/" }, "← all runs")));
  });
  loadPending();
  // The deadline bar and running bars grow with the clock between events.
  // A wait for a person says how long it has waited, by the second.
  const tick = setInterval(() => {
    if (run && run.status === "RUNNING") render();
    else if (run && run.status === "WAITING") {
      for (const el of root.querySelectorAll(".waited[data-since]")) {
        el.firstChild.textContent = `waiting for ${span(Date.now() - new Date(el.dataset.since).getTime())}`;
      }
    }
  }, 1000);
  // Children at work change without their parent's row: their statuses and spending are asked for.
  const treeTick = setInterval(() => { if (run && run.childrenActive) loadChildren(); }, 2000);
  return () => { alive = false; stop(); clearInterval(tick); clearInterval(treeTick); connState(""); };
}

// -- replays (issue 47): the list, and a replay's report with the recorded and replayed runs side by side --

const fmtRate = (r) => (r === null || r === undefined ? "–" : `${Math.round(r * 100)}%`);
function verdict(pass) {
  if (pass === null || pass === undefined) return h("span", { class: "verdict none" }, "–");
  return pass ? h("span", { class: "verdict pass" }, icon("check"), " pass") : h("span", { class: "verdict fail" }, icon("cross"), " fail");
}
function replayStatus(status) {
  return h("span", { class: `badge s-${status === "COMPLETED" ? "succeeded" : "running"}` }, icon(status === "COMPLETED" ? "check" : "play"), " ", status);
}
function changeText(change) {
  const parts = Object.entries(change || {}).map(([k, v]) => (k === "system" ? "system prompt" : `${k} ${Array.isArray(v) ? v.join(",") : v}`));
  return parts.length ? parts.join(" · ") : "no change";
}

function replaysView() {
  const body = h("tbody");
  const info = h("p", { class: "muted", role: "status" });
  main.replaceChildren(
    h("section", { class: "list-head" }, h("h1", {}, "Replays")),
    h("p", { class: "muted small" }, "Recorded runs run again against a change, their tool calls answered from the recording. "
      + "Make one with ", h("code", {}, "agentrun replay"), " or ", h("code", {}, "POST /api/replays"), "."),
    h("table", { class: "runs replays", "aria-label": "replays, newest first" },
      h("thead", {}, h("tr", {}, ["Replay", "Status", "Pass rate", "Runs", "Change", "Scorer", "Created"]
        .map((c) => h("th", { scope: "col", class: ["Pass rate", "Runs"].includes(c) ? "num" : null }, c)))),
      body),
    info);
  let timer = null;
  let alive = true;
  async function refresh() {
    try {
      const listed = await api.replays();
      if (!alive) return;
      body.replaceChildren(...listed.items.map((r) => h("tr", { "data-replay": r.id },
        h("td", { class: "mono" }, h("a", { href: `#/replays/${r.id}` }, shortId(r.id))),
        h("td", {}, replayStatus(r.status)),
        h("td", { class: "num" }, fmtRate(r.passRate)),
        h("td", { class: "num" }, r.finished === r.runs ? `${r.runs}` : `${r.finished} of ${r.runs}`),
        h("td", {}, changeText(r.change)),
        h("td", { class: "mono small" }, r.scorer),
        h("td", {}, h("time", { datetime: r.createdAt, title: r.createdAt }, age(r.createdAt))))));
      info.textContent = listed.items.length ? "" : "No replays yet.";
      connState("");
    } catch (err) {
      if (alive) connState(`cannot list replays: ${err.message}`);
    }
    if (alive) timer = setTimeout(refresh, 3000);
  }
  refresh();
  return () => { alive = false; clearTimeout(timer); };
}

// A run's conversation, loaded whole once (a finished run does not change), for the side-by-side view.
async function loadConversation(id) {
  const [run, timeline] = await Promise.all([api.get(id), api.timeline(id)]);
  const details = new Map();
  const shown = timeline.filter((s) => s.seq !== null && s.status !== "STARTED").slice(0, 200);
  await Promise.all(shown.map(async (s) => { details.set(s.seq, await api.step(id, s.seq)); }));
  return { run, timeline, details };
}

function sideOf(title, loaded, id) {
  if (!loaded) return h("section", { class: "side" }, h("h3", {}, title), h("p", { class: "muted" }, "loading…"));
  if (loaded.error) return h("section", { class: "side" }, h("h3", {}, title), notice(loaded.error));
  const { run, timeline, details } = loaded;
  return h("section", { class: "side", "aria-label": `${title} conversation` },
    h("h3", {}, title, " ", h("a", { class: "mono small", href: `#/runs/${id}` }, shortId(id)), " ", badge(run.status)),
    h("p", { class: "small muted" }, `${run.model} · ${fmtInt(run.tokensUsedTotal ?? run.tokensUsed)} tokens · ${fmtUsd(run.costUsdTotal ?? run.costUsd)}`),
    conversation(run, timeline, details, new Map()),
    run.output !== null && run.output !== undefined
      ? h("div", { class: "output" }, h("div", { class: "who" }, "output"), h("pre", {}, typeof run.output === "string" ? run.output : JSON.stringify(run.output, null, 2)))
      : null);
}

function diffFacts(diff) {
  if (!diff) return h("p", { class: "muted small" }, "Not scored yet: the replay run has not finished.");
  if (diff.recordedMissing) return notice(diff.error || "the recorded run is gone");
  const rows = [];
  const pair = (label, p, f = (x) => x) => rows.push(h("dt", {}, label), h("dd", {}, `${f(p.recorded)} → ${f(p.replayed)}`));
  pair("Status", diff.status);
  rows.push(h("dt", {}, "Output"), h("dd", {}, diff.output.equal ? "equal" : "differs",
    diff.output.schemaValid ? "" : ` · not valid: ${diff.output.schemaProblem}`));
  const calls = diff.toolCalls;
  rows.push(h("dt", {}, "Tool calls"), h("dd", {}, `distance ${calls.distance}`,
    calls.firstDifference !== null ? ` · first difference at call ${calls.firstDifference + 1}` : "",
    h("div", { class: "mono small" }, `${calls.recorded.join(", ") || "none"}  →  ${calls.replayed.join(", ") || "none"}`)));
  pair("Steps", diff.steps);
  pair("Tokens", diff.tokens, fmtInt);
  pair("Cost", diff.costUsd, fmtUsd);
  pair("Latency", diff.latencyMs, ms);
  if (diff.scorerError) rows.push(h("dt", {}, "Scorer"), h("dd", { class: "error" }, diff.scorerError));
  if (diff.scorerDetail) rows.push(h("dt", {}, "Scorer says"), h("dd", { class: "mono small" }, JSON.stringify(diff.scorerDetail)));
  return h("dl", { class: "diff" }, rows);
}

function replayView(id) {
  let replay = null;
  let error = null;
  let open = null; // the replay run whose comparison is shown
  const loaded = new Map(); // run id -> its conversation (or {error})
  let alive = true;
  let timer = null;
  const root = h("div", { class: "replay" });
  main.replaceChildren(root);

  async function compare(result) {
    open = open === result.replayRunId ? null : result.replayRunId;
    render();
    if (open === null) return;
    for (const runId of [result.recordedRunId, result.replayRunId]) {
      if (loaded.has(runId) && !loaded.get(runId).error && TERMINAL.has(loaded.get(runId).run.status)) continue;
      try { loaded.set(runId, await loadConversation(runId)); } catch (err) { loaded.set(runId, { error: err.message }); }
      if (alive) render();
    }
    const el = document.getElementById("compare");
    if (el) el.scrollIntoView({ block: "nearest" });
  }

  function render() {
    if (error) { root.replaceChildren(h("p", {}, h("a", { href: "#/replays" }, "← Replays")), notice(error)); return; }
    if (!replay) { root.replaceChildren(h("p", { class: "muted" }, "Loading…")); return; }
    const r = replay;
    const judged = r.results.filter((x) => x.pass !== null && x.pass !== undefined);
    const passed = judged.filter((x) => x.pass).length;
    const delta = (p) => (p.recorded ? ` (${p.replayed >= p.recorded ? "+" : ""}${Math.round(((p.replayed - p.recorded) / p.recorded) * 100)}%)` : "");
    const rows = r.results.map((x) => {
      const d = x.diff || {};
      return h("tr", { "data-replay-run": x.replayRunId, class: open === x.replayRunId ? "selected" : null },
        h("td", { class: "mono" }, h("a", { href: `#/runs/${x.recordedRunId}` }, shortId(x.recordedRunId))),
        h("td", { class: "mono" }, h("a", { href: `#/runs/${x.replayRunId}` }, shortId(x.replayRunId))),
        h("td", {}, badge(x.status)),
        h("td", {}, verdict(x.pass)),
        h("td", { class: "num" }, d.toolCalls ? d.toolCalls.distance : "–"),
        h("td", {}, d.output ? (d.output.equal ? "equal" : "differs") : "–"),
        h("td", { class: "num" }, d.tokens && d.tokens.recorded !== null && d.tokens.recorded !== undefined ? `${fmtInt(d.tokens.recorded)} → ${fmtInt(d.tokens.replayed)}` : "–"),
        h("td", {}, h("button", { class: "link", "aria-expanded": open === x.replayRunId ? "true" : "false",
          onclick: () => compare(x) }, open === x.replayRunId ? "Hide" : "Compare")));
    });
    const chosen = r.results.find((x) => x.replayRunId === open);
    root.replaceChildren(
      h("p", {}, h("a", { href: "#/replays" }, "← Replays")),
      h("section", { class: "run-head" },
        h("div", {}, h("h1", {}, "Replay ", h("span", { class: "mono" }, shortId(r.id))),
          h("p", { class: "muted" }, changeText(r.change), ` · scorer ${r.scorer} · tool policy ${r.toolPolicy}`,
            r.fromSeq ? ` · from step ${r.fromSeq}` : "")),
        h("div", { class: "head-status" }, replayStatus(r.status))),
      h("section", { class: "card totals", "aria-label": "report" },
        h("div", { class: "big" }, h("div", { class: "figure", "data-pass-rate": r.passRate ?? "" }, fmtRate(r.passRate)), h("div", { class: "muted small" }, `pass rate · ${passed} of ${judged.length} judged`)),
        h("div", { class: "big" }, h("div", { class: "figure" }, `${r.finished} / ${r.runs}`), h("div", { class: "muted small" }, "replay runs finished")),
        h("div", { class: "big" }, h("div", { class: "figure" }, fmtInt(r.tokens.replayed)), h("div", { class: "muted small" }, `tokens, against ${fmtInt(r.tokens.recorded)} recorded${delta(r.tokens)}`)),
        h("div", { class: "big" }, h("div", { class: "figure" }, fmtUsd(r.costUsd.replayed)), h("div", { class: "muted small" }, `cost, against ${fmtUsd(r.costUsd.recorded)} recorded${delta(r.costUsd)}`))),
      h("table", { class: "runs results", "aria-label": "verdicts, one per recorded run" },
        h("thead", {}, h("tr", {}, ["Recorded run", "Replay run", "Status", "Verdict", "Tool-call distance", "Output", "Tokens", ""]
          .map((c) => h("th", { scope: "col", class: ["Tool-call distance", "Tokens"].includes(c) ? "num" : null }, c)))),
        h("tbody", {}, rows)),
      chosen ? h("section", { id: "compare", class: "card compare-card", "aria-label": "recorded and replayed run, side by side" },
        h("h2", {}, "Recorded and replayed, side by side"),
        diffFacts(chosen.diff),
        h("div", { class: "compare" },
          sideOf("Recorded", loaded.get(chosen.recordedRunId), chosen.recordedRunId),
          sideOf("Replayed", loaded.get(chosen.replayRunId), chosen.replayRunId))) : null,
    );
  }

  async function refresh() {
    try {
      replay = await api.replay(id);
      error = null;
    } catch (err) {
      error = err instanceof ApiError && err.status === 404 ? `No replay ${id} (or not yours to see).` : `cannot load the replay: ${err.message}`;
    }
    if (!alive) return;
    render();
    if (replay && replay.status !== "COMPLETED") timer = setTimeout(refresh, 2000);
  }
  render();
  refresh();
  return () => { alive = false; clearTimeout(timer); };
}

// -- routing ----------------------------------------------------------------------------------------

function route() {
  cleanup();
  const hash = location.hash || "#/";
  const [path, query] = hash.slice(1).split("?");
  const params = new URLSearchParams(query || "");
  const m = path.match(/^\/runs\/([0-9a-fA-F-]{36})$/);
  if (path === "/workers") {
    cleanup = workersView();
    document.title = "workers · agentrun";
    return;
  }
  if (path === "/replays") {
    cleanup = replaysView();
    document.title = "replays · agentrun";
    return;
  }
  const replayPage = path.match(/^\/replays\/([0-9a-fA-F-]{36})$/);
  if (replayPage) {
    cleanup = replayView(replayPage[1].toLowerCase());
    document.title = `replay ${shortId(replayPage[1])} · agentrun`;
    return;
  }
  if (path === "/schedules") {
    cleanup = schedulesView();
    document.title = "schedules · agentrun";
    return;
  }
  cleanup = m ? runView(m[1].toLowerCase()) : listView(params);
  document.title = m ? `run ${shortId(m[1])} · agentrun` : "runs · agentrun";
}

async function start() {
  try {
    me = await api.whoami();
  } catch (err) {
    me = null;
  }
  const who = document.getElementById("me");
  if (me !== null && who) {
    const tenant = me.tenant === "*" ? "all tenants" : `tenant ${me.tenant}`;
    who.textContent = me.name === null ? "open API" : `${me.name} · ${tenant} · ${me.scopes.join(", ")}`;
    who.title = me.name === null ? "this server asks for no token"
      : "the identity of your token, the tenant whose runs it sees, and its scopes";
  }
  window.addEventListener("hashchange", route);
  route();
}

start();
