// Fleet console: plain DOM, no build step. Every value from the host is
// written with textContent, never parsed as HTML.
"use strict";

const $ = (sel) => document.querySelector(sel);
const el = (tag, props = {}, ...children) => {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(props)) {
    if (k === "class") node.className = v;
    else if (k === "dataset") Object.assign(node.dataset, v);
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node[k] = v;
  }
  for (const c of children) if (c != null) node.append(c);
  return node;
};

const ACTIONS = {
  cancel: { states: ["blocked", "queued", "claimed", "running"], danger: true, done: "Cancelled",
    ask: (j) => `Cancel ${j.section} (${j.state})? A running job's assignment is revoked and its worker's publication will be superseded.` },
  // The host refuses to reconcile while a worker holds a live lease, so a
  // running job offers it only once its lease has lapsed.
  reconcile: { states: ["running", "unresolved", "cancelled"], done: "Reconciled",
    offered: (j) => j.state !== "running" || j.lease_expires_at_ms <= Date.now() + state.clockOffset,
    ask: (j) => `Reconcile ${j.section}? If its publication committed, the job is marked completed with the original outcome; nothing is retried.` },
  requeue: { states: ["refused", "unresolved", "failed"], done: "Requeued",
    ask: (j) => `Requeue ${j.section}? It goes back to the queue at the next generation; the old holder is fenced out.` },
};

const PAGE = 50;

const NUM = new Intl.NumberFormat("en-US");
const num = (n) => (n == null ? "–" : NUM.format(n));

// when is a past moment as "3 min ago", the absolute time its title.
function when(ms) {
  if (!ms) return el("span", { textContent: "—" });
  const secs = Math.max(0, Math.round((Date.now() + state.clockOffset - ms) / 1000));
  return el("time", { dateTime: new Date(ms).toISOString(), title: new Date(ms).toISOString().replace("T", " ").replace("Z", " UTC"),
    textContent: secs < 60 ? `${secs} s ago` : secs < 3600 ? `${Math.floor(secs / 60)} min ago` :
      secs < 86400 ? `${Math.floor(secs / 3600)} h ago` : `${Math.floor(secs / 86400)} d ago` });
}

// span is a duration in ms as "850 ms", "12.3 s", "4 min 5 s".
function span(ms) {
  if (ms == null || ms < 0) return "";
  if (ms < 1000) return `${ms} ms`;
  if (ms < 60000) return `${(ms / 1000).toFixed(1)} s`;
  return `${Math.floor(ms / 60000)} min ${Math.round((ms % 60000) / 1000)} s`;
}

// runTime is how long a job ran: dispatch to finish, or to now while it runs.
function runTime(j) {
  if (!j.started_at_ms) return "";
  const end = j.finished_at_ms || (j.state === "running" ? Date.now() + state.clockOffset : 0);
  return end ? span(end - j.started_at_ms) : "";
}

const state = {
  stats: null,    // GET /admin/stats: counts by state, the allowance, the event head
  page: null,     // GET /admin/jobs: the rows on screen
  filter: { state: "", section: "", priority: "", owner: "", tenant: "", q: "" },
  cursors: [],    // the cursors of the pages before this one ("" for the first)
  after: "",      // this page's cursor
  clockOffset: 0, // host clock minus this browser's, for lease countdowns
  samples: [],    // GET /admin/series: the last hour, a sample a second
  lastEvent: 0,
  stream: null,
  detailOp: null,
  picked: new Set(), // operation ids selected on this page for a bulk action
  events: [],     // the newest events, oldest first (at most MAX_TIMELINE)
  filtered: null, // the host's answer for the events view's filters, oldest first; null when unfiltered
  eventQuery: "", // the filters that answer is for
  jobEvents: [],  // the job page's events, from the host, oldest first
  refreshTimer: null,
};

class APIError extends Error {
  constructor(status, code, message) { super(message); this.status = status; this.code = code; }
}

async function api(method, path, body) {
  const init = { method, credentials: "same-origin", headers: {} };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const resp = await fetch(path, init);
  if (resp.status === 204) return null;
  let data = null;
  try { data = await resp.json(); } catch { /* not JSON */ }
  if (!resp.ok) {
    const err = (data && data.error) || { code: "http_" + resp.status, message: resp.statusText };
    if (resp.status === 401 && !path.startsWith("/console/session")) showSignIn("Your session ended; sign in again.");
    throw new APIError(resp.status, err.code, err.message);
  }
  return data;
}

function flash(message, bad = false) {
  const f = $("#flash");
  f.textContent = message;
  f.classList.toggle("bad", bad);
  f.hidden = false;
  clearTimeout(flash.timer);
  flash.timer = setTimeout(() => { f.hidden = true; }, 8000);
}

// confirmAction asks before an action: true once confirmed. With typed,
// a large change is confirmed only by typing that text (the count); with
// reason, the dialog asks for one too, found in state.confirmedReason.
function confirmAction(text, { typed = "", reason = false } = {}) {
  const dialog = $("#confirm");
  $("#confirm-text").textContent = text;
  $("#confirm-reason-row").hidden = !reason;
  $("#confirm-reason").value = "";
  $("#confirm-typed-row").hidden = !typed;
  $("#confirm-count").textContent = typed;
  $("#confirm-typed").value = "";
  const ok = $("#confirm-ok");
  ok.disabled = !!typed;
  ok.classList.toggle("danger", !!typed);
  $("#confirm-typed").oninput = () => { ok.disabled = $("#confirm-typed").value.trim() !== typed; };
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => {
      state.confirmedReason = $("#confirm-reason").value.trim();
      resolve(dialog.returnValue === "ok");
    }, { once: true });
    dialog.returnValue = "";
    dialog.showModal();
  });
}

// LARGE is the count past which a bulk action is confirmed by typing it.
const LARGE = 100;

// ---- sign-in ----

function showSignIn(message) {
  stopStream();
  clearInterval(state.seriesTimer);
  clearInterval(state.workersTimer);
  $("#app").hidden = true;
  $("#signin").hidden = false;
  $("#signin-error").textContent = message || "";
  $("#credential").focus();
}

async function signIn(ev) {
  ev.preventDefault();
  const input = $("#credential");
  try {
    await api("POST", "/console/session", { credential: input.value.trim() });
    input.value = "";
    await start();
  } catch (err) {
    $("#signin-error").textContent = err.message;
  }
}

async function signOut() {
  try { await api("DELETE", "/console/session"); } catch { /* signed out either way */ }
  showSignIn("Signed out.");
}

// ---- the page of jobs on screen, counts and the allowance ----
//
// The console never reads every job: it shows one page (GET /admin/jobs,
// filtered, in queue order), and the counts and the allowance come from
// GET /admin/stats. An event reloads the page only when it concerns a row
// on screen (or new jobs may belong on it), at most once a second.

function scheduleRefresh(all = true) {
  state.wantPage = state.wantPage || all;
  if (state.refreshTimer) return;
  state.refreshTimer = setTimeout(async () => {
    state.refreshTimer = null;
    const page = state.wantPage;
    state.wantPage = false;
    await refresh(page);
  }, 1000);
}

async function refresh(page = true) {
  try {
    const stats = await api("GET", "/admin/stats");
    state.stats = stats;
    state.clockOffset = stats.now_ms - Date.now();
    renderAccounting(stats.accounting);
    renderClaims(stats.claims || {});
    if (page) await loadPage();
    renderChips();
    if (state.detailOp) showDetail(state.detailOp, false);
  } catch (err) {
    if (err.status !== 401) flash("Could not read the host: " + err.message, true);
  }
}

async function loadPage() {
  const q = new URLSearchParams({ limit: String(PAGE) });
  for (const [k, v] of Object.entries(state.filter)) if (v) q.set(k, v);
  if (state.after) q.set("after", state.after);
  state.page = await api("GET", "/admin/jobs?" + q);
  writeAddress();
  renderJobs(state.page.jobs || []);
  $("#page-prev").disabled = state.cursors.length === 0;
  $("#page-next").disabled = !state.page.next;
}

// onScreen reports whether an event concerns a row on screen, or may add
// one (new jobs land on the last page).
function onScreen(e) {
  if (!state.page) return true;
  const op = e.operation_id;
  if (op) return (state.page.jobs || []).some((j) => j.operation_id === op);
  return e.kind === "fleet.enqueued" && !state.page.next;
}

// pickJob selects a row for a bulk action (or lets it go): the bulk
// buttons then act on the rows selected, not on every job the filter
// selects.
function pickJob(op, on) {
  if (on) state.picked.add(op); else state.picked.delete(op);
  const n = state.picked.size;
  for (const [action, { verb }] of Object.entries(BULK)) {
    $("#bulk-" + action).textContent = n ? `${verb} ${n} selected…` : `${verb} all…`;
  }
}

function clearPicks() {
  for (const op of [...state.picked]) pickJob(op, false);
  $("#pick-all").checked = false;
}

function setFilter(change) {
  clearPicks();
  Object.assign(state.filter, change);
  state.cursors = [];
  state.after = "";
  refresh(true);
}

// The filters and the page are in the address (?state=queued&section=…&after=…),
// so a view can be bookmarked and shared; a page opened from one shows it.
function writeAddress() {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(state.filter)) if (v) q.set(k, v);
  if (state.after) q.set("after", state.after);
  const next = q.toString() ? "?" + q : location.pathname;
  if (next !== location.search && !(next === location.pathname && !location.search)) history.replaceState(null, "", next + location.hash);
}

function readAddress() {
  const q = new URLSearchParams(location.search);
  for (const k of Object.keys(state.filter)) state.filter[k] = q.get(k) || "";
  state.after = q.get("after") || "";
  state.cursors = [];
  $("#filter-section").value = state.filter.section;
  $("#filter-priority").value = state.filter.priority;
  $("#filter-owner").value = state.filter.owner;
  $("#filter-tenant").value = state.filter.tenant;
  $("#filter-q").value = state.filter.q;
}

function turnPage(forward) {
  clearPicks();
  if (forward && state.page && state.page.next) {
    state.cursors.push(state.after);
    state.after = state.page.next;
  } else if (!forward && state.cursors.length) {
    state.after = state.cursors.pop();
  } else {
    return;
  }
  refresh(true);
}

// renderChips shows a chip per state with its count; the chip of the
// state filtered on is pressed.
function renderChips() {
  const counts = (state.stats && state.stats.jobs) || {};
  const total = Object.values(counts).reduce((a, b) => a + b, 0);
  const chip = (st, label, n) => el("button", {
    class: "chip" + (state.filter.state === st ? " on" : ""), textContent: `${label} ${num(n)}`,
    dataset: { state: st || "all" }, onclick: () => setFilter({ state: st }),
  });

  const chips = [chip("", "all", total)];
  // The state filtered on keeps its chip at 0, so a view that matches
  // nothing (a bookmark) can be left by a click.
  for (const st of STATES) if (counts[st] || state.filter.state === st) chips.push(chip(st, st, counts[st] || 0));
  $("#chips").replaceChildren(...chips);
  const shown = state.page ? (state.page.jobs || []).length : 0;
  $("#jobs-count").textContent = `${num(total)} in all · showing ${num(shown)}` + (state.cursors.length ? ` (page ${state.cursors.length + 1})` : "");
}

const STATES = ["blocked", "queued", "claimed", "running", "completed", "refused", "cancelled", "cancelled_before_dispatch", "unresolved", "failed"];

function renderAccounting(a) {
  const total = Math.max(a.allowance, a.spent + a.reserved + a.available, 1);
  const pct = (n) => (100 * n / total).toFixed(2) + "%";
  $("#bar .spent").style.width = pct(a.spent);
  $("#bar .reserved").style.width = pct(a.reserved);
  $("#bar .available").style.width = pct(a.available);
  $("#bar").setAttribute("aria-label", `${a.spent} spent, ${a.reserved} reserved, ${a.available} available of ${a.allowance} ${a.unit}`);
  $("#acct-spent").textContent = num(a.spent);
  $("#acct-reserved").textContent = num(a.reserved);
  $("#acct-available").textContent = num(a.available);
  $("#acct-allowance").textContent = `${num(a.allowance)} ${a.unit}`;
  $("#acct-cost").textContent = num(a.cost_per_report);
  $("#acct-calls").textContent = num(a.calls);
  const input = $("#raise-to");
  if (document.activeElement !== input) input.placeholder = String(a.allowance);
}

function outcomeText(j) {
  if (j.outcome && j.outcome.status) return `${j.outcome.status} v${j.outcome.version}`;
  return j.reason || "";
}

// attemptsText is "failed attempts/allowed" once an attempt has failed.
function attemptsText(j) {
  return j.attempts ? `${j.attempts}/${j.max_attempts}` : "";
}

function leaseText(j) {
  if (j.state !== "claimed" && j.state !== "running") return "";
  const left = Math.round((j.lease_expires_at_ms - (Date.now() + state.clockOffset)) / 1000);
  return left > 0 ? `${left}s` : "expiring";
}

// shortOp shows an operation id's start (what the search takes) and its
// end: ids are UUIDv7, whose first digits are the time, the same for every
// job of a report.
function shortOp(op) {
  return op.slice(0, 8) + "…" + op.slice(-6);
}

function renderJobs(jobs) {
  const body = $("#jobs tbody");
  const rows = jobs.map((j) => {
    const actions = el("td", { class: "actions" });
    for (const [name, act] of Object.entries(ACTIONS)) {
      if (!act.states.includes(j.state) || (act.offered && !act.offered(j))) continue;
      actions.append(el("button", {
        class: "small" + (act.danger ? " danger" : ""), textContent: name,
        dataset: { action: name, op: j.operation_id },
        onclick: (ev) => { ev.stopPropagation(); runAction(name, j); },
      }));
    }
    const receipt = j.receipt_id
      ? el("a", { href: "#receipt/" + j.receipt_id, textContent: j.receipt_id.slice(5, 13),
        onclick: (ev) => { ev.preventDefault(); ev.stopPropagation(); showReceipt(j.receipt_id); } })
      : "";
    const pick = el("input", { type: "checkbox", checked: state.picked.has(j.operation_id), dataset: { op: j.operation_id },
      onclick: (ev) => ev.stopPropagation(), onchange: (ev) => { pickJob(j.operation_id, ev.target.checked); } });
    return el("tr", { dataset: { op: j.operation_id, state: j.state }, onclick: () => openJob(j.operation_id) },
      el("td", { class: "pick" }, pick),
      el("td", { class: "op", title: j.operation_id }, el("code", { textContent: shortOp(j.operation_id) })),
      el("td", { class: "pos", textContent: num(j.position) }),
      el("td", { class: "section" }, el("a", { href: "#job/" + j.operation_id, textContent: j.section,
        onclick: (ev) => { ev.preventDefault(); ev.stopPropagation(); openJob(j.operation_id); } })),
      el("td", {}, el("span", { class: "state " + j.state, textContent: j.state }),
        j.state === "blocked" ? el("small", { class: "waits", textContent: ` waits for ${num(j.waiting_on)}` }) : ""),
      el("td", { class: "priority", textContent: j.priority }),
      el("td", { class: "owner", textContent: j.owner || "—" }),
      el("td", { class: "gen", textContent: j.generation }),
      el("td", { class: "created" }, when(j.created_at_ms)),
      el("td", { class: "claimed" }, when(j.claimed_at_ms)),
      el("td", { class: "finished" }, when(j.finished_at_ms)),
      el("td", { class: "run", textContent: runTime(j) }),
      el("td", { class: "lease", textContent: leaseText(j) }),
      el("td", { class: "attempts", textContent: attemptsText(j), title: j.last_error || "" }),
      el("td", { class: "outcome", textContent: outcomeText(j) }),
      el("td", { class: "receipt" }, receipt),
      actions);
  });
  body.replaceChildren(...rows);
}

// loadReport shows the open job's report: each of its sections with its
// state and what it waits for, refreshed with the job.
async function loadReport(key) {
  try {
    const r = await api("GET", "/admin/reports/" + encodeURIComponent(key));
    $("#detail-report-key").textContent = `${r.key}, ${num(r.sections.length)} sections`;
    $("#detail-report tbody").replaceChildren(...r.sections.map((x) => el("tr", { dataset: { section: x.section, state: x.state } },
      el("td", {}, el("a", { href: "#job/" + x.operation_id, textContent: x.section })),
      el("td", {}, el("span", { class: "state " + x.state, textContent: x.state })),
      el("td", { class: "after", textContent: x.after.length
        ? x.after.join(", ") + (x.state === "blocked" ? ` (${num(x.waiting_on)} not completed)` : "") : "—" }),
      el("td", {}, el("code", { textContent: shortOp(x.operation_id) })))));
  } catch (err) {
    if (err.status !== 401) flash("Could not read the report: " + err.message, true);
  }
}

// waitsFor says which sections a job waits for, each with its state, and
// why one that did not complete stands where it does.
function waitsFor(deps) {
  if (!deps || !deps.length) return "—";
  return deps.map((x) => `${x.section} (${x.state}${x.reason ? ": " + x.reason : ""})`).join("; ");
}

function tickLeases() {
  if (!state.page) return;
  const byOp = new Map(state.page.jobs.map((j) => [j.operation_id, j]));
  for (const row of document.querySelectorAll("#jobs tbody tr")) {
    const j = byOp.get(row.dataset.op);
    if (j) {
      row.querySelector(".lease").textContent = leaseText(j);
      if (j.state === "running") row.querySelector(".run").textContent = runTime(j);
    }
  }
}

async function runAction(name, job) {
  if (!(await confirmAction(ACTIONS[name].ask(job)))) return;
  try {
    const res = await api("POST", `/admin/jobs/${encodeURIComponent(job.operation_id)}/${name}`);
    let detail = res && res.state ? `now ${res.state}` : "done";
    if (res && res.reused_existing_effect) detail += ", reused the committed outcome";
    if (res && res.recovery) detail += ` (${res.recovery})`;
    flash(`${ACTIONS[name].done} the ${job.section} job (#${job.position}): ${detail}.`);
  } catch (err) {
    flash(`Could not ${name} the ${job.section} job (#${job.position}): ${err.message}`, true);
  }
  scheduleRefresh();
}

async function raiseAllowance(ev) {
  ev.preventDefault();
  const a = state.stats && state.stats.accounting;
  const to = Number($("#raise-to").value);
  if (!a || !Number.isInteger(to) || to < 0) return;
  if (!(await confirmAction(`Change the allowance from ${a.allowance} to ${to} ${a.unit}?`))) return;
  try {
    await api("POST", "/admin/allowance", { expected_allowance: a.allowance, allowance: to });
    $("#raise-to").value = "";
    flash(`Allowance is now ${to}.`);
  } catch (err) {
    flash("Allowance not changed: " + err.message, true);
  }
  scheduleRefresh();
}

// ---- bulk actions: every job the filter selects ----

function filterText() {
  const parts = Object.entries(state.filter).filter(([, v]) => v).map(([k, v]) => `${k} ${v}`);
  return parts.length ? parts.join(", ") : "no filter: every job";
}

const BULK = {
  cancel: { verb: "Cancel", done: "cancelled", states: "blocked, queued, claimed or running", takes: ["blocked", "queued", "claimed", "running"] },
  requeue: { verb: "Requeue", done: "requeued", states: "refused, unresolved or failed", takes: ["refused", "unresolved", "failed"] },
  reconcile: { verb: "Reconcile", done: "reconciled", states: "unresolved", takes: ["unresolved"] },
};

// bulkPicked acts on the rows selected, each through its own single call
// (each its own operation, refused alone), after a confirmation that counts
// those the action applies to.
async function bulkPicked(action) {
  const { verb, done: past, states, takes } = BULK[action];
  const rows = (state.page.jobs || []).filter((j) => state.picked.has(j.operation_id));
  const applicable = rows.filter((j) => takes.includes(j.state));
  if (!applicable.length) { flash(`None of the ${rows.length} selected job(s) can be ${past}: only ${states} jobs can.`); return; }
  const left = rows.length - applicable.length;
  const ask = `${verb} the ${applicable.length} selected job(s) that are ${states}?` + (left ? ` The other ${left} selected are left alone.` : "");
  if (!(await confirmAction(ask))) return;
  let done = 0, refused = 0;
  for (const j of applicable) {
    try {
      await api("POST", `/admin/jobs/${encodeURIComponent(j.operation_id)}/${action}`);
      done++;
    } catch (err) {
      refused++;
    }
  }
  clearPicks();
  flash(`${verb}: ${num(done)} done, ${num(refused)} refused (selected).`, refused > 0 && done === 0);
  scheduleRefresh();
}

async function bulk(action) {
  if (state.picked.size) return bulkPicked(action);
  const filter = Object.fromEntries(Object.entries(state.filter).filter(([, v]) => v)
    .map(([k, v]) => [k, k === "priority" ? Number(v) : v]));
  try {
    const dry = await api("POST", "/admin/jobs/bulk", { action, filter, dry_run: true });
    const { verb, done: past, states } = BULK[action];
    if (!dry.matched) { flash(`No job matches (${filterText()}).`); return; }
    // What the action applies to, not every job the filter selects.
    if (!dry.applicable) { flash(`None of the ${num(dry.matched)} job(s) matching ${filterText()} can be ${past}: only ${states} jobs can.`); return; }
    const left = dry.matched - dry.applicable;
    const ask = `${verb} ${num(dry.applicable)} job(s) matching ${filterText()}?` +
      (left ? ` The other ${num(left)} matching are not ${states} and are left alone.` : "") +
      ` Each is its own operation with its own receipt; a job that changed meanwhile is refused alone.`;
    if (!(await confirmAction(ask, { typed: dry.applicable > LARGE ? String(dry.applicable) : "", reason: true }))) return;
    const reason = state.confirmedReason;
    let done = 0, refused = 0, after = "";
    do {
      // Through what the dry run counted: a job that arrived since the
      // operator confirmed is not acted on.
      const res = await api("POST", "/admin/jobs/bulk", { action, filter, after, through: dry.through, reason });
      done += res.done;
      refused += Object.values(res.refused).reduce((a, b) => a + b, 0);
      after = res.next;
      flash(`${verb}: ${num(done)} done, ${num(refused)} refused…`);
    } while (after);
    flash(`${verb}: ${num(done)} done, ${num(refused)} refused (${filterText()}).`, refused > 0 && done === 0);
  } catch (err) {
    flash(`Bulk ${action} stopped: ${err.message}`, true);
  }
  scheduleRefresh();
}

// ---- pausing claims ----

function renderClaims(c) {
  const paused = !!c.paused;
  const badge = $("#claims-state");
  badge.classList.toggle("paused", paused);
  badge.textContent = paused ? "claims paused" + (c.reason ? ": " + c.reason : "") : "claims running";
  badge.title = paused && c.at_ms ? "paused at " + new Date(c.at_ms).toISOString() : "workers can claim jobs";
  const toggle = $("#claims-toggle");
  toggle.textContent = paused ? "Resume claims" : "Pause claims";
  toggle.dataset.paused = paused ? "true" : "false";
}

async function toggleClaims() {
  const paused = $("#claims-toggle").dataset.paused === "true";
  const ask = paused ? "Resume claims? Workers start claiming jobs again."
    : "Pause claims on every host? No job is handed out until you resume; jobs already claimed or running go on.";
  if (!(await confirmAction(ask, { reason: !paused }))) return;
  try {
    const reason = state.confirmedReason || "paused from the console";
    const res = await api("POST", paused ? "/admin/claims/resume" : "/admin/claims/pause", paused ? undefined : { reason });
    renderClaims(res);
    flash(res.paused ? "Claims paused." : "Claims resumed.");
  } catch (err) {
    flash("Could not change claims: " + err.message, true);
  }
  scheduleRefresh(false);
}

// ---- workers ----

async function loadWorkers() {
  try {
    const res = await api("GET", "/admin/workers");
    const rows = res.workers.map((w) => el("tr", { dataset: { worker: w.name, alive: String(w.alive) } },
      el("td", { class: "name", textContent: w.name }),
      el("td", { class: "status" }, el("span", { class: "state " + (w.revoked_at_ms ? "failed" : w.alive ? "running" : "queued"),
        textContent: w.revoked_at_ms ? "revoked" : w.alive ? "alive" : "idle" })),
      el("td", { class: "seen" }, when(w.last_seen_ms)),
      el("td", { class: "held" }, w.held ? el("a", { href: "?owner=" + encodeURIComponent(w.name), textContent: num(w.held),
        onclick: (ev) => { ev.preventDefault(); setFilter({ owner: w.name, state: "" }); $("#filter-owner").value = w.name; } }) : "0"),
      el("td", { class: "completed", textContent: num(w.completed_in_window) }),
      el("td", { class: "failed", textContent: num(w.failed_in_window) })));
    $("#workers tbody").replaceChildren(...rows);
    const alive = res.workers.filter((w) => w.alive).length;
    $("#workers-count").textContent = `${num(alive)} alive of ${num(res.workers.length)}`;
  } catch (err) {
    if (err.status !== 401) flash("Could not read the workers: " + err.message, true);
  }
}

// ---- tenants ----

async function loadTenants() {
  try {
    const res = await api("GET", "/admin/tenants");
    const rows = res.tenants.map((t) => el("tr", { dataset: { tenant: t.name } },
      el("td", { class: "name", textContent: t.name }),
      el("td", { class: "allowance", textContent: t.allowance === null ? "fleet's" : num(t.allowance) }),
      el("td", { class: "spent", textContent: num(t.spent) }),
      el("td", { class: "reserved", textContent: num(t.reserved) }),
      el("td", { class: "available", textContent: num(t.available) }),
      el("td", { class: "period", textContent: t.period ? t.period + " from " + new Date(t.period_start_ms).toISOString().slice(0, 10) : "–" }),
      el("td", { class: "weight", textContent: num(t.weight) }),
      el("td", { class: "queued", textContent: num(t.jobs.queued || 0) }),
      el("td", { class: "running", textContent: num(t.jobs.running || 0) }),
      el("td", { class: "completed", textContent: num(t.jobs.completed || 0) })));
    $("#tenants tbody").replaceChildren(...rows);
    $("#tenants-count").textContent = `${num(res.tenants.length)}`;
  } catch (err) {
    if (err.status !== 401) flash("Could not read the tenants: " + err.message, true);
  }
}

// ---- job detail and reassignment ----

async function showDetail(op, scroll) {
  try {
    const d = await api("GET", "/admin/jobs/" + encodeURIComponent(op));
    // A refresh that was in flight when the panel closed must not reopen it.
    if (!scroll && state.detailOp !== op) return;
    const opened = state.detailOp !== op;
    state.detailOp = op;
    $("#detail-op").textContent = op;
    const fields = [
      ["section", d.section], ["state", d.state], ["priority", d.priority], ["tenant", d.tenant], ["position", num(d.position)],
      ["created", at(d.created_at_ms)], ["claimed", at(d.claimed_at_ms)], ["started", at(d.started_at_ms)],
      ["finished", at(d.finished_at_ms)], ["run time", runTime(d) || "—"],
      ["owner", d.owner || "—"], ["last worker", d.worker || "—"],
      ["document", `${d.document_id} (version ${d.document.version}, generation ${d.generation})`], ["mutations", d.mutations],
      ["outcome", d.outcome ? `${d.outcome.status} at version ${d.outcome.version}` + (d.outcome.reason ? `: ${d.outcome.reason}` : "") : "—"],
      ["reason", d.reason || "—"], ["attempts", `${d.attempts} failed of ${d.max_attempts}`], ["last error", d.last_error || "—"],
      ["input sha256", d.input_sha256],
      ["waits for", waitsFor(d.dependencies)],
    ];
    $("#detail-fields").replaceChildren(...fields.flatMap(([k, v]) => [el("dt", { textContent: k }), el("dd", { textContent: String(v) })]));
    loadReport(d.batch);
    $("#detail-attempts").replaceChildren(...(d.attempt_log || []).map((a) => el("li", {
      textContent: `#${a.attempt} by ${a.worker || "—"} at generation ${a.generation}, ${at(a.at_ms)}: ${a.reason} (${a.outcome}, cost ${a.cost})` })));
    if (!(d.attempt_log || []).length) $("#detail-attempts").append(el("li", { textContent: "no failed attempt" }));
    $("#detail-input").textContent = (d.input && d.input.document) || "—";
    $("#detail-published").textContent = publishedText(d.document.body);
    if (opened) loadJobEvents(op);
    $("#detail-receipts").replaceChildren(...d.receipts.map((r) => el("li", {},
      el("a", { href: "#receipt/" + r.id, textContent: `#${r.sequence} ${r.kind}: ${r.decision}`,
        onclick: (ev) => { ev.preventDefault(); showReceipt(r.id); } }))));
    if (!d.receipts.length) $("#detail-receipts").append(el("li", { textContent: "none yet" }));
    $("#assign-form").dataset.document = d.document_id;
    $("#assign-form").dataset.generation = d.generation;
    $("#detail-panel").hidden = false;
    document.body.classList.add("job-open");
    if (scroll && opened) window.scrollTo(0, 0);
  } catch (err) {
    flash("Could not read job: " + err.message, true);
  }
}

// at is a time in Unix ms as the host's UTC time, "—" before it happens.
function at(ms) {
  return ms ? new Date(ms).toISOString().replace("T", " ").replace("Z", " UTC") : "—";
}

// publishedText is a published body as a reader wants it: a model's
// answer as its text, any other body as indented JSON.
function publishedText(body) {
  if (!body) return "nothing published";
  if (typeof body.answer === "string") return body.answer;
  return JSON.stringify(body, null, 2);
}

// The job page is the address #job/OP: a row opens it, Back and the close
// button leave it, and the address can be bookmarked and shared.
function openJob(op) {
  if (location.hash === "#job/" + op) showDetail(op, true);
  else location.hash = "#job/" + op;
}

function closeJob() {
  state.detailOp = null;
  $("#detail-panel").hidden = true;
  document.body.classList.remove("job-open");
  if (location.hash.startsWith("#job/")) history.pushState(null, "", location.pathname + location.search);
}

function routeAddress() {
  const m = location.hash.match(/^#job\/([0-9a-f-]{36})$/);
  if (m) showDetail(m[1], true);
  else if (state.detailOp) closeJob();
}

async function reassign(ev) {
  ev.preventDefault();
  const form = $("#assign-form");
  const owner = $("#assign-owner").value.trim();
  const generation = Number(form.dataset.generation);
  if (!owner) return;
  if (!(await confirmAction(`Reassign document ${form.dataset.document} (generation ${generation}) to ${owner}? The current holder is fenced out.`))) return;
  try {
    const res = await api("POST", `/admin/documents/${encodeURIComponent(form.dataset.document)}/assign`,
      { expected_generation: generation, owner });
    $("#assign-owner").value = "";
    flash(`Document reassigned to ${owner} at generation ${res.generation}.`);
  } catch (err) {
    flash("Reassignment refused: " + err.message, true);
  }
  scheduleRefresh();
}

// ---- receipts ----

async function showReceipt(id) {
  try {
    const c = await api("GET", `/admin/receipts/${encodeURIComponent(id)}/verification`);
    $("#receipt-id").textContent = id;
    const checks = [
      [c.id_matches_body, "id is the SHA-256 of the canonical body"],
      [c.signature_valid, "Ed25519 signature verifies"],
      [c.kernel_trusted, "signed by this host's kernel key"],
      [c.chain.linked, c.chain.prev ? `links to receipt #${c.chain.prev_sequence || "?"} (${c.chain.prev.slice(0, 13)}…)` : "first receipt in the chain"],
    ];
    $("#receipt-checks").replaceChildren(...checks.map(([ok, text]) => el("li", { class: ok ? "ok" : "bad", textContent: text })));
    $("#receipt-body").textContent = c.canonical_body;
    $("#receipt-signature").textContent = c.receipt.signature;
    $("#receipt-panel").hidden = false;
    $("#receipt-panel").scrollIntoView({ behavior: "smooth", block: "nearest" });
  } catch (err) {
    flash("Could not read receipt: " + err.message, true);
  }
}

// ---- charts: the host's last hour, a sample a second ----


async function loadSeries() {
  const last = state.samples.length ? state.samples[state.samples.length - 1].t : 0;
  try {
    const res = await api("GET", "/admin/series" + (last ? "?after=" + last : ""));
    state.samples.push(...(res.samples || []));
    if (state.samples.length > 3600) state.samples.splice(0, state.samples.length - 3600);
    drawCharts();
  } catch (err) {
    if (err.status !== 401) setLive(false, "charts: " + err.message);
  }
}

// Each chart is a uPlot (embedded, MIT: uplot.LICENSE) over the samples'
// times: a time axis, a value axis with its unit, a legend that shows the
// values at the second under the pointer, and a scale of its own. Below
// each, the newest values in words.

const COLORS = ["#2d5bd7", "#c0392b", "#d68910", "#1e8449", "#7d3c98", "#5d6d7e"];

function chartOf(id, lines, { unit = "", asinh = false, gaps = false } = {}) {
  const node = document.getElementById(id);
  const names = lines.map((l) => l.name).join("\n");
  if (node.uplot && node.uplot.names === names) return node.uplot;
  // A chart whose lines change (the tenants that spent most) is drawn anew.
  if (node.uplot) node.uplot.destroy();
  const opts = {
    width: Math.max(280, node.clientWidth || 560), height: 170,
    scales: { x: { time: true }, y: asinh ? { distr: 4, asinh: 1 } : { range: (u, min, max) => [0, Math.max(1, max) * 1.05] } },
    // space: the least room between two time labels, so they never overlap.
    axes: [{ stroke: "#556", space: 90 }, { stroke: "#556", label: unit, size: 56,
      values: (u, vals) => vals.map((v) => (v == null ? "" : NUM.format(v))) }],
    // gaps: a series measured only in some seconds (latencies) is drawn as
    // a line across the seconds between, not as scattered dots.
    series: [{}, ...lines.map((l, k) => ({ label: l.name, stroke: lineColor(l, k), width: 1.5, spanGaps: gaps,
      value: (u, v) => (v == null ? "–" : NUM.format(Math.round(v * 100) / 100)) }))],
    legend: { live: true },
  };
  node.uplot = new uPlot(opts, [[], ...lines.map(() => [])], node);
  node.uplot.names = names;
  return node.uplot;
}

// zoomedIn reports whether a chart shows less than the samples it drew
// last: a drag zoomed it (uPlot's own), and new samples leave that alone
// until a double click shows the whole again. Read from the scale itself,
// not from uPlot's scale hooks, which also fire, deferred, for the
// scales a new sample sets.
function zoomedIn(u) {
  const seen = u.data[0], x = u.scales.x;
  return seen.length > 1 && x.min != null && (x.min > seen[0] + 0.5 || x.max < seen[seen.length - 1] - 0.5);
}

// lineColor is a line's own colour (the allowance's are the bar's), or the
// palette's.
function lineColor(l, k) {
  return l.color || COLORS[k % COLORS.length];
}

// average is each value's mean over the window seconds up to it: counts
// per second read as a rate, not as a comb between 0 and a batch.
function average(values, window) {
  let sum = 0;
  return values.map((v, i) => {
    sum += v - (i >= window ? values[i - window] : 0);
    return sum / Math.min(i + 1, window);
  });
}

// drawChart draws lines over the samples' seconds, or over xs when given
// (a line read only in some seconds).
function drawChart(id, lines, opts, xs = state.samples.map((x) => x.t)) {
  const chart = chartOf(id, lines, opts);
  chart.setData([xs, ...lines.map((l) => l.values)], !zoomedIn(chart));
  const latest = document.querySelector(`p.latest[data-chart="${id.slice(6)}"]`);
  latest.replaceChildren(...lines.map((l, k) => {
    const v = l.values.length ? l.values[l.values.length - 1] : null;
    return el("span", { dataset: { name: l.name }, style: `color: ${lineColor(l, k)}`,
      textContent: `${l.name} ${v == null ? "–" : NUM.format(Math.round(v * 100) / 100)}` });
  }));
}

function drawCharts() {
  const s = state.samples;
  const col = (f) => s.map(f);
  drawChart("chart-rate", [
    { name: "completed/s", values: average(col((x) => x.completed), 10) },
    { name: "refused/s", values: average(col((x) => x.refused), 10) },
    { name: "failed/s", values: average(col((x) => x.failed), 10) },
  ], { unit: "per second, 10 s average" });
  drawChart("chart-depth", ["queued", "claimed", "running", "unresolved", "failed"].map((st) =>
    ({ name: st, values: col((x) => (x.jobs && x.jobs[st]) || 0) })), { unit: "jobs", asinh: true });
  const bar = getComputedStyle(document.documentElement);
  drawChart("chart-allowance", [
    { name: "spent", values: col((x) => x.spent), color: bar.getPropertyValue("--spent").trim() },
    { name: "reserved", values: col((x) => x.reserved), color: bar.getPropertyValue("--reserved").trim() },
    { name: "available", values: col((x) => x.available), color: bar.getPropertyValue("--available").trim() },
  ], { unit: "credits" });
  const lat = (kind, p, div = 1) => col((x) => (x.latency && x.latency[kind] ? x.latency[kind][p] / div : null));
  drawChart("chart-latency", [
    { name: "claim p99", values: lat("claim", "p99_ms") },
    { name: "dispatch p99", values: lat("dispatch", "p99_ms") },
    { name: "publish p50", values: lat("publish", "p50_ms") },
    { name: "publish p99", values: lat("publish", "p99_ms") },
  ], { unit: "ms", gaps: true });
  drawChart("chart-jobtime", [
    { name: "queue wait p50", values: lat("queue_wait", "p50_ms", 1000) },
    { name: "queue wait p99", values: lat("queue_wait", "p99_ms", 1000) },
    { name: "run p50", values: lat("run", "p50_ms", 1000) },
    { name: "run p99", values: lat("run", "p99_ms", 1000) },
  ], { unit: "seconds", gaps: true });
  drawBurn();
  if (s.length) {
    const mins = Math.round((s[s.length - 1].t - s[0].t) / 60);
    $("#charts-span").textContent = `${num(s.length)} seconds` + (mins ? ` (${mins} min)` : "");
  }
}

// drawBurn draws what the tenants spent, in credits a minute, over the
// seconds the host read their figures: the six that spent most in the
// samples held ("(others)" is the tenants past the sixteen a sample names).
function drawBurn() {
  const read = state.samples.filter((x) => x.tenants && x.tenants.interval_s > 0);
  const totals = {};
  for (const x of read) {
    for (const [name, credits] of Object.entries(x.tenants.burn)) totals[name] = (totals[name] || 0) + credits;
  }
  const top = Object.keys(totals).sort((a, b) => totals[b] - totals[a] || a.localeCompare(b)).slice(0, COLORS.length);
  drawChart("chart-burn", top.map((name) => ({
    name, values: read.map((x) => ((x.tenants.burn[name] || 0) * 60) / x.tenants.interval_s),
  })), { unit: "credits a minute" }, read.map((x) => x.t));
}

// ---- submitting reports ----

async function submitReport(ev) {
  ev.preventDefault();
  const document_ = $("#submit-document").value;
  const sections = [...document.querySelectorAll("#submit-form input[name=section]:checked")].map((i) => i.value);
  if (!sections.length) { flash("Choose at least one section.", true); return; }
  const tenant = $("#submit-tenant").value.trim();
  try {
    const res = await api("POST", "/admin/reports",
      { document: document_, sections, idempotency_key: "console-" + crypto.randomUUID(), ...(tenant ? { tenant } : {}) });
    $("#submit-document").value = "";
    flash(`Queued ${res.operation_ids.length} job(s).`);
  } catch (err) {
    flash("Report not submitted: " + err.message, true);
  }
  scheduleRefresh();
}

// ---- the event timeline, live ----

const MAX_TIMELINE = 500;

// eventItem is one event as a line of the timeline, linking to its job.
function eventItem(e) {
  const op = e.operation_id;
  const job = op ? el("a", { class: "job", href: "#job/" + op, textContent: "job " + shortOp(op),
    onclick: (ev) => ev.stopPropagation() }) : "";
  return el("li", { dataset: { seq: e.sequence, kind: e.kind, op: op || "" } },
    el("details", {},
      el("summary", {},
        el("span", { class: "seq", textContent: e.sequence }),
        el("span", { class: "kind", textContent: e.kind }),
        el("span", { textContent: e.title }), job,
        el("span", { class: "when", textContent: new Date(e.timestamp_ms).toLocaleTimeString() })),
      el("pre", { textContent: `actor: ${e.actor}\n${JSON.stringify(e.data, null, 2)}` })));
}

// Every kind of event the host writes, for the events view's filter
// (TestConsoleKnowsEveryKind keeps it whole).
const EVENT_KINDS = ["fleet.started", "fleet.host_started", "fleet.host_stopped", "fleet.host_restarted",
  "fleet.worker_started", "fleet.enqueued", "fleet.claimed", "call.allowed", "call.denied", "fleet.published",
  "fleet.superseded", "fleet.version_conflict", "fleet.rejected", "fleet.credential", "fleet.retry_scheduled",
  "fleet.failed", "fleet.replayed", "fleet.cancelled", "fleet.lease_expired", "fleet.requeued", "fleet.released",
  "fleet.unblocked", "fleet.reconciled", "fleet.assigned", "fleet.allowance_changed", "fleet.claims_paused", "fleet.claims_resumed",
  "tenant.added", "tenant.allowance_changed", "tenant.weight_changed", "tenant.period_started", "schedule.changed", "schedule.fired"];

const FILTERED_PAGE = 200;
const WHOLE_OP = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

// eventShown reports whether the events view's filters take e. A job's
// start filters the events the console holds; a whole operation id, or a
// kind, is asked of the host, which reads its whole log (filterEvents).
function eventShown(e) {
  const kind = $("#events-kind").value, job = $("#events-job").value.trim().toLowerCase();
  return (!kind || e.kind === kind) && (!job || (e.operation_id || "").startsWith(job));
}

function renderEvents() {
  const held = state.filtered || state.events;
  $("#events").replaceChildren(...held.filter(eventShown).reverse().map(eventItem));
  renderEventsCount();
}

// renderEventsCount says what the events view shows.
function renderEventsCount() {
  $("#events-count").textContent = state.filtered
    ? `the newest ${num(state.filtered.length)} that match, from the host's whole log`
    : `latest #${state.lastEvent}` + ($("#events-job").value.trim() ? ", among the newest the console holds" : "");
}

// filterEvents asks the host for the newest events of the filters' kind
// and job; with neither, the view is the live timeline again.
async function filterEvents() {
  const kind = $("#events-kind").value, job = $("#events-job").value.trim();
  const q = new URLSearchParams({ limit: String(FILTERED_PAGE) });
  if (kind) q.set("kind", kind);
  if (WHOLE_OP.test(job)) q.set("job", job.toLowerCase());
  const key = q.has("kind") || q.has("job") ? q.toString() : "";
  state.eventQuery = key;
  if (!key) {
    state.filtered = null;
    renderEvents();
    return;
  }
  try {
    const res = await api("GET", "/admin/events?" + key);
    if (state.eventQuery !== key) return; // the filters changed meanwhile
    state.filtered = res.events;
    renderEvents();
  } catch (err) {
    if (state.eventQuery !== key) return;
    state.filtered = [];
    renderEvents();
    flash("Could not read the events: " + err.message, true);
  }
}

// loadJobEvents reads the job page's events from the host's log (the
// newest thousand of them); live ones are added as they arrive.
async function loadJobEvents(op) {
  state.jobEvents = [];
  renderJobEvents();
  try {
    const res = await api("GET", "/admin/events?job=" + encodeURIComponent(op));
    if (state.detailOp !== op) return;
    const seen = new Set(res.events.map((e) => e.sequence));
    state.jobEvents = res.events.concat(state.jobEvents.filter((e) => !seen.has(e.sequence)));
    renderJobEvents();
  } catch (err) {
    flash("Could not read the job's events: " + err.message, true);
  }
}

function renderJobEvents() {
  $("#detail-events").replaceChildren(...state.jobEvents.slice().reverse().map(eventItem));
  if (!state.jobEvents.length) $("#detail-events").append(el("li", { textContent: "none yet" }));
}

function addEvent(e) {
  state.events.push(e);
  if (state.events.length > MAX_TIMELINE) state.events.shift();
  if (state.filtered && eventShown(e)) {
    state.filtered.push(e);
    if (state.filtered.length > FILTERED_PAGE) state.filtered.shift();
  }
  if (eventShown(e)) {
    const list = $("#events");
    list.prepend(eventItem(e));
    while (list.children.length > MAX_TIMELINE) list.lastElementChild.remove();
  }
  if (state.detailOp && e.operation_id === state.detailOp && !state.jobEvents.some((x) => x.sequence === e.sequence)) {
    state.jobEvents.push(e);
    renderJobEvents();
  }
  renderEventsCount();
}

function setLive(on, text) {
  const live = $("#live");
  live.classList.toggle("off", !on);
  live.textContent = text;
}

// The stream is read with fetch rather than EventSource: events are named
// by kind, and EventSource cannot listen for names it does not know.
// Each connection has its own controller and is aborted however its
// reading ends (an error, a frame that does not parse, the page's own
// code throwing): an abandoned response keeps its connection, and a
// browser holds six to a host, past which nothing the page asks is sent.
async function followEvents() {
  const controller = new AbortController();
  state.stream = controller;
  while (state.stream === controller) {
    const attempt = new AbortController();
    const stop = () => attempt.abort();
    controller.signal.addEventListener("abort", stop);
    try {
      const resp = await fetch(`/admin/events/stream?after=${state.lastEvent}`,
        { credentials: "same-origin", signal: attempt.signal });
      if (resp.status === 401) { showSignIn("Your session ended; sign in again."); return; }
      if (!resp.ok) throw new Error("HTTP " + resp.status);
      setLive(true, "live");
      const reader = resp.body.pipeThrough(new TextDecoderStream()).getReader();
      let buffer = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += value;
        let cut;
        while ((cut = buffer.indexOf("\n\n")) >= 0) {
          const frame = buffer.slice(0, cut);
          buffer = buffer.slice(cut + 2);
          const data = frame.split("\n").filter((l) => l.startsWith("data: ")).map((l) => l.slice(6)).join("\n");
          if (!data) continue; // keep-alive comment
          const e = JSON.parse(data);
          if (e.sequence <= state.lastEvent) continue;
          state.lastEvent = e.sequence;
          addEvent(e);
          scheduleRefresh(onScreen(e));
        }
      }
    } catch (err) {
      if (controller.signal.aborted) return;
    } finally {
      attempt.abort();
      controller.signal.removeEventListener("abort", stop);
    }
    setLive(false, "reconnecting");
    await new Promise((r) => setTimeout(r, 1000));
  }
}

function stopStream() {
  if (state.stream) state.stream.abort();
  state.stream = null;
}

// ---- start ----

async function start() {
  const who = await api("GET", "/console/session");
  $("#whoami").textContent = "signed in as " + who.caller;
  $("#signin").hidden = true;
  $("#app").hidden = false;
  readAddress();
  await refresh(true);
  loadWorkers();
  loadTenants();
  clearInterval(state.workersTimer);
  state.workersTimer = setInterval(() => { loadWorkers(); loadTenants(); }, 5000);
  // Show the newest events, not the whole history of a long-lived host.
  state.lastEvent = Math.max(0, (state.stats ? state.stats.events : 0) - 200);
  $("#events").replaceChildren();
  state.events = [];
  stopStream();
  followEvents();
  state.samples = [];
  loadSeries();
  clearInterval(state.seriesTimer);
  state.seriesTimer = setInterval(loadSeries, 2000);
  routeAddress();
}

document.addEventListener("DOMContentLoaded", () => {
  $("#signin-form").addEventListener("submit", signIn);
  $("#signout").addEventListener("click", signOut);
  $("#raise-form").addEventListener("submit", raiseAllowance);
  $("#assign-form").addEventListener("submit", reassign);
  $("#submit-form").addEventListener("submit", submitReport);
  $("#detail-close").addEventListener("click", closeJob);
  window.addEventListener("hashchange", routeAddress);
  $("#events-kind").append(...EVENT_KINDS.map((k) => el("option", { value: k, textContent: k })));
  $("#events-kind").addEventListener("change", filterEvents);
  $("#events-job").addEventListener("input", filterEvents);
  $("#receipt-close").addEventListener("click", () => { $("#receipt-panel").hidden = true; });
  $("#page-prev").addEventListener("click", () => turnPage(false));
  $("#page-next").addEventListener("click", () => turnPage(true));
  $("#claims-toggle").addEventListener("click", toggleClaims);
  $("#bulk-cancel").addEventListener("click", () => bulk("cancel"));
  $("#bulk-requeue").addEventListener("click", () => bulk("requeue"));
  $("#bulk-reconcile").addEventListener("click", () => bulk("reconcile"));
  $("#pick-all").addEventListener("change", (ev) => {
    for (const j of (state.page && state.page.jobs) || []) pickJob(j.operation_id, ev.target.checked);
    renderJobs((state.page && state.page.jobs) || []);
  });
  $("#filter-section").addEventListener("change", (ev) => setFilter({ section: ev.target.value }));
  $("#filter-priority").addEventListener("change", (ev) => setFilter({ priority: ev.target.value }));
  $("#filter-owner").addEventListener("change", (ev) => setFilter({ owner: ev.target.value.trim() }));
  $("#filter-tenant").addEventListener("change", (ev) => setFilter({ tenant: ev.target.value.trim() }));
  $("#filter-q").addEventListener("change", (ev) => setFilter({ q: ev.target.value.trim() }));
  setInterval(tickLeases, 1000);
  start().catch(() => showSignIn());
});
