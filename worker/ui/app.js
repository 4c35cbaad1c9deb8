// The agentrun UI: the runs list and a run's page, rendered from the public API. Every text that comes
// from a run (input, model output, tool results) goes into the page as text nodes, never as HTML.

import { api, ApiError, follow } from "./api.js";

const TERMINAL = new Set(["SUCCEEDED", "FAILED", "CANCELLED", "TIMED_OUT"]);
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
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

const fmtInt = (n) => Number(n || 0).toLocaleString("en-US");
const fmtUsd = (n) => `$${Number(n || 0).toFixed(4)}`;
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

// Status is said in words and a symbol, colour only adds to it.
const SYMBOL = { QUEUED: "○", RUNNING: "▶", WAITING: "⏸", SUCCEEDED: "✓", FAILED: "✗", CANCELLED: "⊘", TIMED_OUT: "⌛",
  STARTED: "▶", DONE: "✓", ERROR: "✗" };
function badge(status) {
  return h("span", { class: `badge s-${status.toLowerCase()}` }, `${SYMBOL[status] || "•"} ${status}`);
}

function notice(text, kind = "error") {
  return h("p", { class: kind, role: kind === "error" ? "alert" : "status" }, text);
}

function connState(text) {
  document.getElementById("conn").textContent = text;
}

// -- the runs list ----------------------------------------------------------------------------------

function listView(params) {
  const status = params.get("status") || "";
  const select = h("select", { id: "status-filter", name: "status", onchange: (e) => {
    location.hash = e.target.value ? `#/?status=${e.target.value}` : "#/";
  } }, h("option", { value: "" }, "all statuses"), STATUSES.map((s) => h("option", { value: s, selected: s === status }, s)));
  const body = h("tbody");
  const info = h("p", { class: "muted", role: "status" });
  const input = h("textarea", { id: "new-input", name: "input", rows: 2, required: true,
    placeholder: "Which acme tickets are overdue?" });
  const budget = h("input", { id: "new-budget", name: "tokenBudget", type: "number", min: 1, value: 50000 });
  const formError = h("p", { class: "error", role: "alert" });
  const form = h("form", { class: "new-run", onsubmit: async (e) => {
    e.preventDefault();
    formError.textContent = "";
    try {
      const made = await api.submit({ input: input.value, tokenBudget: Number(budget.value), timeoutSeconds: 300 });
      location.hash = `#/runs/${made.id}`;
    } catch (err) {
      formError.textContent = err.message;
    }
  } },
  h("h2", {}, "New run"),
  h("label", { for: "new-input" }, "Request"), input,
  h("div", { class: "row" }, h("label", { for: "new-budget" }, "Token budget"), budget,
    h("button", { type: "submit", class: "primary" }, "Submit run")),
  formError);

  main.replaceChildren(
    h("section", { class: "list-head" },
      h("h1", {}, "Runs"),
      h("div", { class: "filter" }, h("label", { for: "status-filter" }, "Status"), select)),
    h("table", { class: "runs", "aria-label": "runs, newest first" },
      h("thead", {}, h("tr", {}, ["Run", "Status", "Input", "Tokens", "Cost", "Steps", "Age", "Worker"]
        .map((c) => h("th", { scope: "col", class: ["Tokens", "Cost", "Steps"].includes(c) ? "num" : null }, c)))),
      body),
    info,
    can("submit") ? form : null,
  );

  let timer = null;
  let alive = true;
  async function refresh() {
    try {
      const page = await api.list(status);
      if (!alive) return;
      body.replaceChildren(...page.items.map((r) => h("tr", { "data-run": r.id },
        h("td", {}, h("a", { href: `#/runs/${r.id}`, class: "mono" }, shortId(r.id))),
        h("td", {}, badge(r.status)),
        h("td", { class: "input", title: r.inputPreview }, r.inputPreview),
        h("td", { class: "num" }, fmtInt(r.tokensUsed)),
        h("td", { class: "num" }, fmtUsd(r.costUsd)),
        h("td", { class: "num" }, r.steps),
        h("td", { title: r.createdAt }, age(r.createdAt)),
        h("td", { class: "mono" }, r.lockedBy || "–"),
      )));
      info.textContent = page.items.length ? `${page.items.length} runs${page.next ? " (newest 100)" : ""}, updated live`
        : "No runs yet: submit one below, or with `agentrun runs submit`.";
      connState("");
    } catch (err) {
      if (alive) connState(`cannot list runs: ${err.message}`);
    }
    if (alive) timer = setTimeout(refresh, 2000);
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
  const cost = run.costUsdTotal !== undefined && run.costUsdTotal > run.costUsd ? run.costUsdTotal : run.costUsd;
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

function waterfall(run, steps, onFork, inflight, details = new Map()) {
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
    const end = s.finishedAt ? new Date(s.finishedAt).getTime() : now;
    return { start: new Date(s.startedAt).getTime(), end };
  });
  const t0 = Math.min(...times.map((t) => t.start));
  const t1 = Math.max(...times.map((t) => t.end), t0 + 1);
  const span = t1 - t0;
  let previous = null;
  const rows = steps.map((s, i) => {
    const { start, end } = times[i];
    const left = ((start - t0) / span) * 100;
    const width = Math.max(0.6, ((end - start) / span) * 100);
    const takeover = previous !== null && s.worker && previous !== s.worker;
    previous = s.worker || previous;
    const kind = s.kind === "MODEL" ? "model" : s.kind === "USER" ? "user" : s.kind === "COMPACT" ? "compact" : "tool";
    const name = s.kind === "MODEL" ? `model${s.stopReason ? ` · ${s.stopReason}` : ""}`
      : s.kind === "USER" ? `user${s.createdBy ? ` · ${s.createdBy}` : ""}`
      : s.kind === "COMPACT" ? compactLabel(s) : `tool · ${s.toolName}`;
    const tokens = s.kind === "MODEL" || (s.kind === "COMPACT" && (s.inputTokens || s.outputTokens))
      ? `in ${fmtInt(s.inputTokens)} · out ${fmtInt(s.outputTokens)} · cache w ${fmtInt(s.cacheCreationInputTokens)} / r ${fmtInt(s.cacheReadInputTokens)}`
      : s.kind === "USER" ? "a user message" : s.kind === "COMPACT" ? "no model call" : `attempt ${s.attempts}`;
    return h("li", { class: `wf-row ${kind}`, "data-seq": s.seq, "data-status": s.status },
      h("div", { class: "wf-label" },
        h("span", { class: "seq mono" }, `#${s.seq}`), " ", h("strong", {}, name), " ", badge(s.status),
        s.inherited ? h("span", { class: "tag" }, "inherited") : null,
        s.kind === "MODEL" && providerCompacted(details.get(s.seq)) ? h("span", { class: "tag compacted", title: "the provider compacted the conversation before this call" }, "compacted by the provider") : null,
        takeover ? h("span", { class: "tag takeover", title: "another worker took the run over" }, `⇄ taken over by ${s.worker}`) : null),
      h("div", { class: "wf-track", "aria-hidden": "true" },
        h("div", { class: `wf-bar ${kind} ${s.status.toLowerCase()}`, style: `left:${left.toFixed(2)}%;width:${width.toFixed(2)}%` })),
      s.inflight ? h("div", { class: "wf-meta mono" }, `in flight · ${s.worker || "–"}`) : h("div", { class: "wf-meta mono" }, `${ms(s.latencyMs)} · ${tokens} · ${s.worker || "–"}`,
        " ", can("submit") ? h("button", { type: "button", class: "link", id: `fork-${s.seq}`, onclick: () => onFork(s.seq), "aria-label": `Fork from step ${s.seq}` }, "Fork here") : null));
  });
  return h("div", {}, h("div", { class: "wf-axis mono", "aria-hidden": "true" }, h("span", {}, "0 s"), h("span", {}, `${(span / 1000).toFixed(1)} s`)),
    h("ol", { class: "waterfall", "aria-label": "steps on a time axis" }, rows),
    h("p", { class: "legend" }, h("span", { class: "key model" }), " model call ", h("span", { class: "key tool" }), " tool call",
      steps.some((s) => s.kind === "COMPACT") ? [" ", h("span", { class: "key compact" }), " compaction"] : null));
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
      items.push(h("li", { class: "msg result waiting", "data-tool-use": s.toolUseId },
        h("div", { class: "who" }, `tool call · ${s.toolName}`, " ", badge("WAITING")),
        h("p", { class: "muted" }, "waiting for a person's decision (above)")));
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

const agentOf = (run) => run.agent ? `${run.agent}${run.agentVersion ? `@${run.agentVersion}` : ""}` : "–";

// Where the run came from: the parent whose sub-agent call started it, or the run it continues or forks.
function lineage(run) {
  if (!run.parentRunId) return null;
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
  let pending = [];
  let message = null;
  let alive = true;
  let children = null; // the runs its sub-agent calls started (null: none asked for yet)
  const root = h("div", { class: "run" });
  main.replaceChildren(root);

  const source = () => ({ tokenBudget: run.tokenBudget, timeoutSeconds: run.timeoutSeconds });

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
    draw(ordered());
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
    root.replaceChildren(...[
      h("p", {}, h("a", { href: "#/" }, "← all runs")),
      h("section", { class: "run-head" },
        h("div", {}, h("h1", {}, "Run ", h("span", { class: "mono" }, shortId(run.id))), h("p", { class: "mono small muted" }, run.id)),
        h("div", { class: "head-status" }, badge(run.status), cancel)),
      message,
      run.error ? notice(`Error: ${run.error}`) : null,
      run.status === "QUEUED" && run.modelRetries > 0 && run.runAt
        ? h("p", { class: "muted", id: "handed-back" },
          `Handed back after ${run.modelRetries} failed model step${run.modelRetries > 1 ? "s" : ""}; claimable again from ${new Date(run.runAt).toLocaleTimeString()}.`)
        : null,
      lineage(run),
      h("section", { class: "card facts" },
        h("dl", {},
          h("dt", {}, "Model"), h("dd", { class: "mono" }, run.model),
          h("dt", {}, "Steps"), h("dd", {}, `${run.steps} of at most ${run.maxSteps}`),
          h("dt", {}, "Worker"), h("dd", { class: "mono" }, run.lockedBy || "–"),
          h("dt", {}, "Created"), h("dd", {}, `${new Date(run.createdAt).toLocaleString()} (${age(run.createdAt)})`)),
        h("div", { class: "budgets" }, budgets(run))),
      pendingSection(run, pending, (toolUseId, body) => act(`Decision on ${toolUseId}`, async () => {
        const r = await api.decide(id, toolUseId, body);
        await loadPending();
        return r;
      })),
      waitsSection(run, pending),
      treeSection(run, children),
      run.output !== undefined && run.output !== null
        ? h("section", { class: "card answer" }, h("h2", {}, "Answer"), h("div", { class: "text" },
          typeof run.output === "string" ? run.output : JSON.stringify(run.output, null, 2)))
        : null,
      h("section", { class: "card" }, h("h2", {}, "Steps"), waterfall(run, ordered.filter((s) => s.seq !== null), fork, inflightSeq(ordered), details)),
      h("section", { class: "card" }, h("h2", {}, "Conversation"), conversation(run, ordered, details, live)),
      talk,
      cont,
    ].filter(Boolean));
  }

  const stop = follow(id, (type, data) => {
    if (type === "run") {
      const before = run ? run.pending : undefined;
      run = data;
      if (run.status === "WAITING" || (run.pending !== undefined && run.pending !== before)) loadPending();
      loadChildren();
    } else if (type === "step") {
      // A call waiting for a person has no seq yet: keyed by its tool_use id until its step appears.
      if (data.seq === null) steps.set(`w:${data.toolUseId}`, data);
      else { steps.delete(`w:${data.toolUseId}`); steps.set(data.seq, data); }
      if (data.kind === "MODEL") live.delete(data.seq);
      loadDetail(data);
      if (data.status !== "DONE" && data.status !== "ERROR" && data.status !== "STARTED") loadPending();
    } else if (type === "delta") {
      if (!steps.has(data.seq)) live.set(data.seq, (live.get(data.seq) || "") + data.text);
    }
    render();
  }, (state) => {
    connState({ live: "● live", ended: "", reconnecting: "reconnecting…", gone: "" }[state] || "");
    if (state === "gone") root.replaceChildren(notice(`No run with id ${id}.`), h("p", {}, h("a", { href: "#/" }, "← all runs")));
  });
  loadPending();
  // The deadline bar and running bars grow with the clock between events.
  const tick = setInterval(() => { if (run && run.status === "RUNNING") render(); }, 1000);
  // Children at work change without their parent's row: their statuses and spending are asked for.
  const treeTick = setInterval(() => { if (run && run.childrenActive) loadChildren(); }, 2000);
  return () => { alive = false; stop(); clearInterval(tick); clearInterval(treeTick); connState(""); };
}

// -- routing ----------------------------------------------------------------------------------------

function route() {
  cleanup();
  const hash = location.hash || "#/";
  const [path, query] = hash.slice(1).split("?");
  const params = new URLSearchParams(query || "");
  const m = path.match(/^\/runs\/([0-9a-fA-F-]{36})$/);
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
    who.textContent = me.name === null ? "open API" : `${me.name} · ${me.scopes.join(", ")}`;
    who.title = me.name === null ? "this server asks for no token" : "the identity of your token, and its scopes";
  }
  window.addEventListener("hashchange", route);
  route();
}

start();
