// The dsec dashboard: a single page over the public HTTP API, with the
// caller's own token. No framework and no build step; served from the
// apiserver binary.
//
// Two rules hold everywhere below:
// - Everything shown that comes from the API (ids, images, labels, job
//   names, reasons, audit details) goes into the page as text: `h()` makes
//   text nodes of strings, and nothing here parses a string as HTML. Sandbox
//   metadata is user input.
// - The token lives in sessionStorage and travels only in the
//   Authorization header; the dashboard never puts it in a URL (a sign-in
//   link's `#token=` fragment is removed from the address at once).
"use strict";

const TOKEN_KEY = "dsec.token";
const LIST_REFRESH_MS = 3000;
const DETAIL_REFRESH_MS = 2000;
const NODES_REFRESH_MS = 3000;
// The list fetches usage for at most this many running sandboxes.
const LIST_USAGE_MAX = 100;

let refreshTimer = null;
// Bumped on every navigation, so an answer for a page left behind is dropped.
let generation = 0;
let isAdmin = false;

// ---- DOM helpers ---------------------------------------------------------

/** Makes an element. `props`: class, id, type, value, placeholder, href
 *  (only from this file's own routes), title, disabled, testid, for event
 *  handlers on*; `children`: nodes, or strings (made text nodes). */
function h(tag, props, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(props || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else if (k === "class") e.className = v;
    else if (k === "testid") e.dataset.testid = v;
    else if (k === "value") e.value = v;
    else if (k === "disabled") e.disabled = true;
    else e.setAttribute(k, String(v));
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

function main() {
  return document.getElementById("main");
}

function show(...nodes) {
  main().replaceChildren(...nodes.filter((n) => n !== null && n !== undefined));
}

function errorBox(err) {
  return h("div", { class: "error", role: "alert", testid: "error" }, String(err && err.message ? err.message : err));
}

// ---- formatting ----------------------------------------------------------

function bytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  let v = n;
  while (v >= 1024 && i < units.length - 1) {
    v /= 1024;
    i++;
  }
  return `${v.toFixed(i === 0 ? 0 : 1)} ${units[i]}`;
}

function cores(c) {
  return c === null || c === undefined ? "–" : `${c.toFixed(c < 0.1 ? 3 : 2)} cores`;
}

function age(rfc3339) {
  const t = Date.parse(rfc3339);
  if (Number.isNaN(t)) return "–";
  const s = Math.max(0, Math.round((Date.now() - t) / 1000));
  if (s < 120) return `${s}s`;
  if (s < 7200) return `${Math.round(s / 60)}m`;
  if (s < 172800) return `${Math.round(s / 3600)}h`;
  return `${Math.round(s / 86400)}d`;
}

function stateBadge(state) {
  return h("span", { class: `state state-${state}`, testid: "state" }, state);
}

function sandboxLink(id) {
  return h("a", { href: `#/sandbox/${encodeURIComponent(id)}`, class: "mono", testid: "sandbox-link" }, id);
}

// ---- the API -------------------------------------------------------------

class ApiError extends Error {
  constructor(status, code, message) {
    super(`${message} (${code}, HTTP ${status})`);
    this.status = status;
    this.code = code;
  }
}

function token() {
  return sessionStorage.getItem(TOKEN_KEY);
}

async function api(method, path, body) {
  const headers = { Authorization: `Bearer ${token()}` };
  const init = { method, headers, cache: "no-store", credentials: "omit", referrerPolicy: "no-referrer" };
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const resp = await fetch(path, init);
  const text = await resp.text();
  let json = null;
  try {
    json = text ? JSON.parse(text) : null;
  } catch (_) {
    json = null;
  }
  if (!resp.ok) {
    const err = (json && json.error) || {};
    if (resp.status === 401 && path !== "/v1/sandboxes") {
      signOut("The server refused the token; sign in again.");
    }
    throw new ApiError(resp.status, err.code || "unknown", err.message || text.slice(0, 200) || resp.statusText);
  }
  return json;
}

const sid = (id) => encodeURIComponent(id);

// ---- sign-in -------------------------------------------------------------

function signOut(message) {
  sessionStorage.removeItem(TOKEN_KEY);
  isAdmin = false;
  location.hash = "#/login";
  render(message);
}

async function signIn(candidate) {
  sessionStorage.setItem(TOKEN_KEY, candidate);
  try {
    await api("GET", "/v1/sandboxes");
  } catch (e) {
    sessionStorage.removeItem(TOKEN_KEY);
    throw e.status === 401 ? new Error("The server does not know this token.") : e;
  }
  isAdmin = await api("GET", "/v1/nodes").then(
    () => true,
    () => false,
  );
}

function loginPage(message) {
  const input = h("input", { type: "password", id: "token", autocomplete: "off", placeholder: "token", testid: "token" });
  const status = h("div", {});
  if (message) status.append(errorBox(message));
  const form = h(
    "form",
    {
      class: "login",
      onsubmit: async (ev) => {
        ev.preventDefault();
        status.replaceChildren();
        try {
          await signIn(input.value.trim());
          location.hash = "#/sandboxes";
        } catch (e) {
          status.replaceChildren(errorBox(e));
        }
      },
    },
    h("h1", {}, "Sign in"),
    h("label", { for: "token" }, "An API token (a tenant's or the admin's)", input),
    h("p", {}, h("button", { type: "submit", testid: "sign-in" }, "Sign in")),
    status,
  );
  show(form);
  input.focus();
}

// ---- sandboxes -----------------------------------------------------------

function listQuery(params) {
  const q = new URLSearchParams();
  for (const k of ["state", "job"]) if (params.get(k)) q.set(k, params.get(k));
  for (const l of params.getAll("label")) if (l) q.append("label", l);
  return q;
}

async function usageOf(sandboxes) {
  // A few at a time: one request per running sandbox.
  const running = sandboxes.filter((s) => s.state === "running").slice(0, LIST_USAGE_MAX);
  const out = new Map();
  const queue = running.slice();
  const worker = async () => {
    while (queue.length) {
      const s = queue.shift();
      try {
        const m = await api("GET", `/v1/sandboxes/${sid(s.id)}/metrics?seconds=3`);
        if (m.samples.length) out.set(s.id, m.samples[m.samples.length - 1]);
      } catch (_) {
        // It may have stopped since the list was read.
      }
    }
  };
  await Promise.all([1, 2, 3, 4, 5, 6].map(worker));
  return out;
}

function filtersForm(params) {
  const state = h(
    "select",
    { id: "f-state", testid: "filter-state" },
    ["", "queued", "creating", "running", "paused", "stopped", "failed"].map((s) => {
      const o = h("option", { value: s }, s || "any");
      if (s === (params.get("state") || "")) o.selected = true;
      return o;
    }),
  );
  const job = h("input", { id: "f-job", value: params.get("job") || "", placeholder: "job", testid: "filter-job" });
  const label = h("input", { id: "f-label", value: params.get("label") || "", placeholder: "key=value", testid: "filter-label" });
  return h(
    "form",
    {
      class: "filters",
      onsubmit: (ev) => {
        ev.preventDefault();
        const q = new URLSearchParams();
        if (state.value) q.set("state", state.value);
        if (job.value.trim()) q.set("job", job.value.trim());
        if (label.value.trim()) q.set("label", label.value.trim());
        location.hash = `#/sandboxes?${q}`;
      },
    },
    h("label", {}, "State", state),
    h("label", {}, "Job", job),
    h("label", {}, "Label", label),
    h("button", { type: "submit" }, "Filter"),
  );
}

function jobActions(job) {
  const status = h("span", { class: "muted", testid: "job-status" });
  const act = (what) => async () => {
    status.textContent = `${what}…`;
    try {
      const r = await api("POST", `/v1/jobs/${encodeURIComponent(job)}/${what}`);
      const failed = r.failed.length ? `, ${r.failed.length} failed` : "";
      status.textContent = `${what}: ${r.changed} changed, ${r.unchanged} unchanged, ${r.ended} ended of ${r.matched}${failed}`;
    } catch (e) {
      status.replaceChildren(errorBox(e));
    }
  };
  return h(
    "div",
    { class: "actions" },
    h("span", {}, "Job ", h("code", {}, job), ":"),
    h("button", { type: "button", onclick: act("pause"), testid: "job-pause" }, "Pause job"),
    h("button", { type: "button", onclick: act("resume"), testid: "job-resume" }, "Resume job"),
    status,
  );
}

/** The row to show for `id`: its current one with only the cells whose
 *  text changed swapped for `fresh`'s, so a refresh never replaces an
 *  element under the pointer (a click whose press and release land on
 *  different elements is lost). */
function keepRow(rows, id, fresh) {
  const old = rows.get(id);
  if (!old) {
    rows.set(id, fresh);
    return fresh;
  }
  const cells = Array.from(fresh.children);
  cells.forEach((cell, i) => {
    const was = old.children[i];
    if (was.textContent !== cell.textContent) old.replaceChild(cell, was);
  });
  return old;
}

async function sandboxesPage(params, gen) {
  const body = h("tbody", {});
  const note = h("p", { class: "muted", testid: "list-note" }, "Loading…");
  show(
    h("h1", {}, "Sandboxes"),
    filtersForm(params),
    params.get("job") ? jobActions(params.get("job")) : null,
    h(
      "table",
      { testid: "sandboxes" },
      h(
        "thead",
        {},
        h("tr", {}, ["Sandbox", "State", "Backend", "Image", "Node", "Job", "Labels", "Age", "CPU", "Memory"].map((c) => h("th", {}, c))),
      ),
      body,
    ),
    note,
  );
  const q = listQuery(params);
  // Rows by sandbox id, kept across refreshes (see keepRow).
  const rows = new Map();
  const tick = async () => {
    try {
      const list = await api("GET", `/v1/sandboxes${q.toString() ? "?" + q : ""}`);
      const usage = await usageOf(list.sandboxes);
      if (gen !== generation) return;
      const fresh = list.sandboxes
        .slice()
        .reverse()
        .map((s) => {
          const u = usage.get(s.id);
          return h(
            "tr",
            { testid: "sandbox-row" },
            h("td", {}, sandboxLink(s.id)),
            h("td", {}, stateBadge(s.state)),
            h("td", {}, s.backend),
            h("td", {}, s.image),
            h("td", {}, s.node),
            h("td", {}, s.job || ""),
            h("td", { testid: "labels" }, Object.entries(s.labels || {}).map(([k, v]) => h("div", { class: "mono" }, `${k}=${v}`))),
            h("td", {}, age(s.created_at)),
            h("td", { class: "num" }, u ? cores(u.cpu_cores) : "–"),
            h("td", { class: "num" }, u ? `${bytes(u.memory_bytes)} / ${bytes(s.limits.memory_limit_mb * 1048576)}` : "–"),
          );
        });
      const ids = list.sandboxes
        .slice()
        .reverse()
        .map((s) => s.id);
      const shown = ids.map((id, i) => keepRow(rows, id, fresh[i]));
      const same = shown.length === body.children.length && shown.every((tr, i) => body.children[i] === tr);
      if (!same) body.replaceChildren(...shown);
      for (const id of rows.keys()) if (!ids.includes(id)) rows.delete(id);
      note.textContent = `${list.sandboxes.length} sandboxes, newest first; refreshed ${new Date().toLocaleTimeString()}`;
    } catch (e) {
      if (gen === generation) note.replaceChildren(errorBox(e));
    }
    schedule(tick, LIST_REFRESH_MS, gen);
  };
  await tick();
}

/** Draws series (arrays of [time_ms, value]) on a canvas, each scaled to
 *  its own maximum (a limit when known), newest at the right. */
function drawChart(canvas, series) {
  const ratio = window.devicePixelRatio || 1;
  const w = canvas.clientWidth || 600;
  const ht = canvas.clientHeight || 180;
  canvas.width = w * ratio;
  canvas.height = ht * ratio;
  const g = canvas.getContext("2d");
  g.scale(ratio, ratio);
  g.clearRect(0, 0, w, ht);
  const times = series.flatMap((s) => s.points.map((p) => p[0]));
  if (!times.length) return;
  const t0 = Math.min(...times);
  const t1 = Math.max(...times, t0 + 1000);
  const pad = 22;
  g.font = "11px system-ui, sans-serif";
  series.forEach((s, i) => {
    const max = Math.max(s.max || 0, ...s.points.map((p) => p[1]), 1e-9);
    g.strokeStyle = s.color;
    g.lineWidth = 1.5;
    g.beginPath();
    s.points.forEach(([t, v], j) => {
      const x = pad + ((t - t0) / (t1 - t0)) * (w - 2 * pad);
      const y = ht - pad - (v / max) * (ht - 2 * pad);
      if (j === 0) g.moveTo(x, y);
      else g.lineTo(x, y);
    });
    g.stroke();
    g.fillStyle = s.color;
    g.fillText(`${s.name} (max ${s.format(max)})`, pad + i * 220, 14);
  });
  g.fillStyle = "#5f6b7a";
  g.fillText(`${Math.round((t1 - t0) / 1000)} s`, pad, ht - 6);
}

function figure(key, value, testid) {
  return h("div", { class: "figure" }, h("div", { class: "k" }, key), h("div", { class: "v", testid }, value));
}

function facts(pairs) {
  return h(
    "dl",
    { class: "facts", testid: "facts" },
    pairs.flatMap(([k, v]) => [h("dt", {}, k), h("dd", {}, v)]),
  );
}

function actionButtons(id, state) {
  const status = h("span", { class: "muted", testid: "action-status" });
  const run = (label, method, path) => async (ev) => {
    ev.target.disabled = true;
    status.textContent = `${label}…`;
    try {
      await api(method, path);
      status.textContent = `${label}: done`;
    } catch (e) {
      status.replaceChildren(errorBox(e));
    } finally {
      ev.target.disabled = false;
    }
  };
  const ended = state === "stopped" || state === "failed";
  // Killing asks twice: the first click arms the button for a few seconds.
  const kill = h("button", { type: "button", class: "danger", testid: "kill", disabled: ended }, "Kill");
  let armed = null;
  kill.addEventListener("click", (ev) => {
    if (!armed) {
      kill.textContent = "Really kill?";
      armed = setTimeout(() => {
        armed = null;
        kill.textContent = "Kill";
      }, 5000);
      return;
    }
    clearTimeout(armed);
    armed = null;
    kill.textContent = "Kill";
    run("kill", "POST", `/v1/sandboxes/${sid(id)}/stop`)(ev);
  });
  return h(
    "div",
    { class: "actions" },
    h("button", { type: "button", testid: "pause", disabled: state !== "running", onclick: run("pause", "POST", `/v1/sandboxes/${sid(id)}/pause`) }, "Pause"),
    h("button", { type: "button", testid: "resume", disabled: state !== "paused", onclick: run("resume", "POST", `/v1/sandboxes/${sid(id)}/resume`) }, "Resume"),
    kill,
    status,
  );
}

function trajectoryTable(steps) {
  if (!steps.length) return h("p", { class: "muted" }, "No steps recorded.");
  return h(
    "table",
    { testid: "trajectory" },
    h("thead", {}, h("tr", {}, ["#", "Step", "Kind", "Status", "Operation"].map((c) => h("th", {}, c)))),
    h(
      "tbody",
      {},
      steps
        .slice(-50)
        .reverse()
        .map((s) =>
          h(
            "tr",
            {},
            h("td", { class: "num" }, s.seq),
            h("td", { class: "mono" }, s.step_id || ""),
            h("td", {}, s.kind),
            h("td", {}, s.status),
            h("td", {}, h("pre", { class: "out" }, JSON.stringify(s.operation))),
          ),
        ),
    ),
  );
}

function auditTable(audit) {
  if (!audit.events.length) return h("p", { class: "muted" }, "No refused attempts.");
  return h(
    "table",
    { testid: "audit" },
    h("thead", {}, h("tr", {}, ["When", "Kind", "PID", "Detail"].map((c) => h("th", {}, c)))),
    h(
      "tbody",
      {},
      audit.events
        .slice()
        .reverse()
        .map((e) => h("tr", {}, h("td", {}, new Date(e.time_ms).toLocaleTimeString()), h("td", {}, e.kind), h("td", { class: "num" }, e.pid), h("td", {}, e.detail))),
    ),
  );
}

async function sandboxPage(id, gen) {
  const head = h("div", {});
  const figures = h("div", { class: "figures", testid: "figures" });
  const canvas = h("canvas", { class: "chart", testid: "chart" });
  const history = h("div", {});
  const note = h("div", {});
  let lastState = null;
  let historyAt = 0;
  // The audit events are asked of the sandbox's agent, and any request to
  // a paused sandbox's agent resumes it: they are read once when the page
  // opens on a running sandbox, then only when asked, never on a timer
  // that could race a pause.
  const auditBody = h("div", {});
  const auditButton = h("button", { type: "button", testid: "audit-refresh" }, "Read again");
  const readAudit = async () => {
    const a = await api("GET", `/v1/sandboxes/${sid(id)}/audit`).catch((e) => e);
    if (gen === generation) auditBody.replaceChildren(a instanceof Error ? errorBox(a) : auditTable(a));
  };
  auditButton.addEventListener("click", () => {
    if (lastState === "running") readAudit();
    else auditBody.replaceChildren(h("p", { class: "muted" }, "Read only while the sandbox runs (reading them would resume it)."));
  });
  const audit = h("div", {}, h("h2", {}, "Audit events ", auditButton), auditBody);
  show(h("p", {}, h("a", { href: "#/sandboxes" }, "← Sandboxes")), h("h1", { class: "mono", testid: "sandbox-id" }, id), head, h("h2", {}, "Usage"), figures, canvas, history, audit, note);
  const tick = async () => {
    try {
      const s = await api("GET", `/v1/sandboxes/${sid(id)}`);
      if (gen !== generation) return;
      if (s.state !== lastState) {
        lastState = s.state;
        head.replaceChildren(
          facts([
            ["State", h("span", {}, stateBadge(s.state), s.state_reason ? ` (${s.state_reason})` : "")],
            ["Backend", s.backend],
            ["Image", s.image],
            ["Node", s.node],
            ["Job", s.job || "–"],
            ["Labels", Object.entries(s.labels || {}).map(([k, v]) => h("div", { class: "mono" }, `${k}=${v}`))],
            ["Created", `${s.created_at} (${age(s.created_at)} ago)`],
            ["Limits", `${s.limits.cpu_cores_limit} cores, ${s.limits.memory_limit_mb} MiB memory, ${s.limits.disk_limit_mb} MiB disk, ${s.limits.pids_limit} pids`],
          ]),
          // The buttons are made again when the state changes, not when an
          // action answers: a second re-render could replace a button
          // between a press and its release.
          actionButtons(id, s.state),
        );
      }
      // Reading usage never resumes a paused sandbox.
      const m = await api("GET", `/v1/sandboxes/${sid(id)}/metrics`);
      if (gen !== generation) return;
      const last = m.samples[m.samples.length - 1];
      figures.replaceChildren(
        figure("CPU", last ? cores(last.cpu_cores) : "–", "cpu-now"),
        figure("Memory", last ? `${bytes(last.memory_bytes)} of ${bytes(m.limits.memory_limit_mb * 1048576)}` : "–", "memory-now"),
        figure("Processes", last ? `${last.pids} of ${m.limits.pids_limit}` : "–", "pids-now"),
        figure("Disk", last ? bytes(last.disk_bytes) : "–", "disk-now"),
        figure("Network in / out", last && last.net_rx_bytes_per_s !== null ? `${bytes(last.net_rx_bytes_per_s)}/s / ${bytes(last.net_tx_bytes_per_s)}/s` : "–", "net-now"),
      );
      drawChart(canvas, [
        { name: "CPU", color: "#2457c5", max: m.limits.cpu_cores_limit, format: cores, points: m.samples.map((p) => [p.time_ms, p.cpu_cores]) },
        { name: "memory", color: "#1e7b34", max: m.limits.memory_limit_mb * 1048576, format: bytes, points: m.samples.map((p) => [p.time_ms, p.memory_bytes]) },
      ]);
      // The log changes less often: every 10 s.
      if (Date.now() - historyAt > 10000 || historyAt === 0) {
        const first = historyAt === 0;
        historyAt = Date.now();
        const t = await api("GET", `/v1/sandboxes/${sid(id)}/trajectory`).catch((e) => e);
        if (gen === generation) history.replaceChildren(h("h2", {}, "Trajectory (last 50 steps)"), t instanceof Error ? errorBox(t) : trajectoryTable(t.steps));
        if (first && s.state === "running") await readAudit();
      }
      note.replaceChildren(h("p", { class: "muted" }, `refreshed ${new Date().toLocaleTimeString()}`));
    } catch (e) {
      if (gen === generation) note.replaceChildren(errorBox(e));
    }
    schedule(tick, DETAIL_REFRESH_MS, gen);
  };
  await tick();
}

// ---- nodes ---------------------------------------------------------------

async function nodesPage(gen) {
  const body = h("tbody", {});
  const note = h("p", { class: "muted" }, "Loading…");
  const charts = h("div", {});
  show(
    h("h1", {}, "Nodes"),
    h(
      "table",
      { testid: "nodes" },
      h(
        "thead",
        {},
        h("tr", {}, ["Node", "Healthy", "Sandboxes", "Paused", "Queued", "CPU reserved", "Memory reserved", "CPU used", "Memory used", "Swap"].map((c) => h("th", {}, c))),
      ),
      body,
    ),
    charts,
    note,
  );
  const tick = async () => {
    try {
      const nodes = await api("GET", "/v1/nodes");
      const usage = await Promise.all(nodes.map((n) => api("GET", `/v1/nodes/${encodeURIComponent(n.name)}/metrics?seconds=300`).catch(() => null)));
      if (gen !== generation) return;
      body.replaceChildren(
        ...nodes.map((n, i) => {
          const u = usage[i];
          const last = u && u.samples[u.samples.length - 1];
          return h(
            "tr",
            { testid: "node-row" },
            h("td", { class: "mono" }, n.name),
            h("td", {}, n.healthy ? "yes" : "no"),
            h("td", { class: "num" }, n.sandboxes),
            h("td", { class: "num" }, n.paused),
            h("td", { class: "num" }, n.queued),
            h("td", { class: "num" }, `${n.cpu_reserved.toFixed(1)} / ${n.cpu_capacity.toFixed(1)}`),
            h("td", { class: "num" }, `${bytes(n.memory_reserved_mb * 1048576)} / ${bytes(n.memory_capacity_mb * 1048576)}`),
            h("td", { class: "num", testid: "node-cpu" }, last ? `${cores(last.cpu_cores)} of ${u.cpus}` : "–"),
            h("td", { class: "num", testid: "node-memory" }, last ? `${bytes(last.memory_bytes)} of ${bytes(u.memory_total_bytes)}` : "–"),
            h("td", { class: "num" }, last ? bytes(last.swap_bytes) : "–"),
          );
        }),
      );
      charts.replaceChildren(
        ...nodes.map((n, i) => {
          const u = usage[i];
          if (!u) return h("p", { class: "muted" }, `${n.name}: no usage (the node did not answer)`);
          const c = h("canvas", { class: "chart" });
          const wrap = h("div", {}, h("h2", { class: "mono" }, n.name), c);
          requestAnimationFrame(() =>
            drawChart(c, [
              { name: "CPU", color: "#2457c5", max: u.cpus, format: cores, points: u.samples.map((p) => [p.time_ms, p.cpu_cores]) },
              { name: "memory", color: "#1e7b34", max: u.memory_total_bytes, format: bytes, points: u.samples.map((p) => [p.time_ms, p.memory_bytes]) },
            ]),
          );
          return wrap;
        }),
      );
      note.textContent = `refreshed ${new Date().toLocaleTimeString()}`;
    } catch (e) {
      if (gen === generation) note.replaceChildren(errorBox(e));
    }
    schedule(tick, NODES_REFRESH_MS, gen);
  };
  await tick();
}

// ---- routing -------------------------------------------------------------

function schedule(fn, ms, gen) {
  if (gen !== generation) return;
  clearTimeout(refreshTimer);
  refreshTimer = setTimeout(() => {
    if (gen === generation) fn();
  }, ms);
}

function render(message) {
  generation++;
  clearTimeout(refreshTimer);
  const gen = generation;
  const signedIn = !!token();
  document.getElementById("nav").hidden = !signedIn;
  document.getElementById("sign-out").hidden = !signedIn;
  document.getElementById("nav-nodes").hidden = !isAdmin;
  document.getElementById("who").textContent = signedIn ? (isAdmin ? "signed in as the admin" : "signed in") : "";
  const [path, query] = location.hash.replace(/^#/, "").split("?");
  for (const a of document.querySelectorAll("#nav a")) a.classList.toggle("active", a.getAttribute("href") === `#${path}`);
  if (!signedIn) return loginPage(message);
  const params = new URLSearchParams(query || "");
  if (path.startsWith("/sandbox/")) return sandboxPage(decodeURIComponent(path.slice("/sandbox/".length)), gen);
  if (path === "/nodes") {
    if (!isAdmin) return show(h("h1", {}, "Nodes"), h("p", { class: "muted" }, "Nodes are the admin's view."));
    return nodesPage(gen);
  }
  if (path !== "/sandboxes") {
    location.replace("#/sandboxes");
    return;
  }
  return sandboxesPage(params, gen);
}

async function start() {
  // A sign-in link (`/ui/#token=...`): keep the token, then take it out of
  // the address bar and the history entry.
  const m = location.hash.match(/^#token=([^&]+)/);
  let message;
  if (m) {
    history.replaceState(null, "", `${location.pathname}#/sandboxes`);
    try {
      await signIn(decodeURIComponent(m[1]));
    } catch (e) {
      message = e.message;
    }
  } else if (token()) {
    isAdmin = await api("GET", "/v1/nodes").then(
      () => true,
      () => false,
    );
  }
  document.getElementById("sign-out").addEventListener("click", () => signOut());
  window.addEventListener("hashchange", () => render());
  render(message);
}

start();
