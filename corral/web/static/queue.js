// The queue: pending jobs with their reason, priority factors and expected start; running
// jobs with the GPUs each replica holds; ended ones on request. Filters live in the URL.
// However long the queue, the tiles are the server's counts (GET /v1/queue), every running
// job is listed (page by page, by cursor) and the first PENDING_SHOWN pending ones.
import { fill, badge, clock, duration, every, get, h, jobLink, section, since, table } from "./app.js";

const ACTIVE = ["PENDING", "STARTING", "RUNNING", "PREEMPTED"];
const ENDED = ["SUCCEEDED", "FAILED", "CANCELLED", "TIMEOUT"];
const RUNNING = ["STARTING", "RUNNING", "PREEMPTED"];
const PENDING_SHOWN = 500;
const PAGE = 1000;
const MAX_PAGES = 20;  // running jobs listed: at most 20,000 (the tiles count them all)
const FACTORS = [["age", "age"], ["fair_share", "fair share"], ["job_size", "job size"],
  ["partition_factor", "partition"], ["qos_factor", "QOS"], ["expansion", "expansion"]];

function filters() {
  const params = new URLSearchParams(location.search);
  return { user: params.get("user") || "", account: params.get("account") || "",
    partition: params.get("partition") || "", state: params.get("state") || "active" };
}

function filterBar(current, onChange) {
  const field = (name, label) => h("label", {}, label,
    h("input", { name, value: current[name], placeholder: "any", list: `known-${name}`, autocomplete: "off" }),
    h("datalist", { id: `known-${name}` }));
  const state = h("select", { name: "state" },
    [["active", "active (pending and running)"], ...ACTIVE.map((s) => [s, s]), ...ENDED.map((s) => [s, s]),
      ["all", "all, with the newest ended"]].map(([value, text]) =>
      h("option", { value, selected: value === current.state }, text)));
  const form = h("form", { class: "filters", onsubmit: (e) => e.preventDefault() },
    field("user", "User"), field("account", "Account"), field("partition", "Partition"), h("label", {}, "State", state));
  form.addEventListener("change", () => {
    const data = Object.fromEntries(new FormData(form));
    const params = new URLSearchParams();
    for (const [key, value] of Object.entries(data)) if (value && !(key === "state" && value === "active")) params.set(key, value);
    history.replaceState(null, "", location.pathname + (params.toString() ? `?${params}` : ""));
    onChange();
  });
  return form;
}

function remember(form, jobs) {
  for (const key of ["user", "account", "partition"]) {
    const list = form.querySelector(`#known-${key}`);
    const known = new Set([...list.options].map((o) => o.value));
    for (const job of jobs) if (job[key] && !known.has(job[key])) { known.add(job[key]); list.append(h("option", { value: job[key] })); }
  }
}

function factorBar(p) {
  const parts = FACTORS.map(([key, label]) => [label, p ? p[key] : 0]).filter(([, v]) => v > 0);
  const total = parts.reduce((sum, [, v]) => sum + v, 0) || 1;
  const title = p ? FACTORS.map(([key, label]) => `${label} ${p[key].toFixed(0)}`).join(", ") + `, nice ${p.nice}` : "not ranked yet";
  return h("span", { class: "factors", title },
    parts.map(([label, v]) => h("span", { class: `factor f-${label.replace(" ", "-")}`, style: { width: `${(100 * v / total).toFixed(1)}%` } })));
}

function gpuPlaces(job) {
  const byNode = new Map();
  for (const task of job.tasks) for (const r of task.replicas) {
    if (!r.node || !r.gpus.length) continue;
    byNode.set(r.node, [...(byNode.get(r.node) || []), ...r.gpus]);
  }
  if (!byNode.size) return job.gpus ? `${job.gpus} (placing)` : "–";
  return [...byNode].map(([node, gpus]) => h("span", { class: "place" }, `${node}: `, h("b", {}, gpus.sort((a, b) => a - b).join(","))));
}

function waitReason(job) {
  if (job.hold) return `held (${job.hold === "admin" ? "JobHeldAdmin" : "JobHeldUser"})`;
  return !job.reason || job.reason === "None" ? "–" : job.reason;
}

// Every job matching `params`, a page at a time (the cursor is the last id of a full page).
async function pages(params) {
  const out = [];
  let after = 0;
  for (let page = 0; page < MAX_PAGES; page++) {
    const batch = await get("v1/jobs", { ...params, limit: PAGE, after });
    out.push(...batch);
    if (batch.length < PAGE) break;
    after = batch[batch.length - 1].id;
  }
  return out;
}

const count = (n) => n.toLocaleString("en-US");

export function show(main) {
  const current = filters();
  const tiles = h("div", { class: "tiles" });
  const body = h("div");
  let refresh;
  const form = filterBar(current, () => { Object.assign(current, filters()); refresh(); });
  fill(main, h("h1", {}, "Queue"), form, tiles, body);

  refresh = every(1500, async () => {
    const f = filters();
    const ended = ENDED.includes(f.state) || f.state === "all";
    const scope = { user: f.user, account: f.account, partition: f.partition };
    const live = f.state === "active" || f.state === "all";
    const wantPending = live || f.state === "PENDING";
    const runningStates = live ? RUNNING : RUNNING.filter((s) => s === f.state);
    const [totals, running, pendingPage, history, priorities] = await Promise.all([
      get("v1/queue", scope),
      runningStates.length ? pages({ ...scope, state: runningStates }) : [],
      wantPending ? get("v1/jobs", { ...scope, state: "PENDING", limit: PENDING_SHOWN }) : [],
      ended ? get("v1/jobs", { ...scope, all: true, limit: 500 }) : [],
      wantPending ? get("v1/priority") : [],
    ]);
    remember(form, [...running, ...pendingPage, ...history]);
    const factors = new Map(priorities.map((p) => [p.id, p]));
    const order = new Map(priorities.map((p, i) => [p.id, i]));
    const pending = pendingPage
      .sort((a, b) => (order.get(a.id) ?? 1e9) - (order.get(b.id) ?? 1e9) || a.id - b.id);
    const done = history.filter((j) => (f.state === "all" ? ENDED.includes(j.state) : j.state === f.state)).reverse();
    const runningTotal = runningStates.reduce((n, s) => n + totals[s.toLowerCase()], 0);
    fill(tiles,
      h("div", { class: "tile" }, h("b", {}, count(totals.pending)), "pending",
        totals.held ? h("small", {}, ` (${count(totals.held)} held)`) : ""),
      h("div", { class: "tile" }, h("b", {}, count(totals.starting + totals.running + totals.preempted)), "running"),
      h("div", { class: "tile" }, h("b", {}, count(totals.gpus)), "GPUs held"));
    const pendingTitle = totals.pending > pending.length
      ? `Pending (${count(totals.pending)}; the oldest ${count(pending.length)} shown, in scheduling order)`
      : `Pending (${count(pending.length)})`;
    const runningTitle = runningTotal > running.length
      ? `Running (${count(runningTotal)}; ${count(running.length)} shown)` : `Running (${count(running.length)})`;
    const rowAttrs = (job) => ({ dataset: { job: job.id, state: job.state } });
    const parts = [
      section(pendingTitle, table([
        { title: "ID", cell: (j) => jobLink(j.id) },
        { title: "Name", cell: (j) => jobLink(j.id, j.name) },
        { title: "User", cell: (j) => j.user },
        { title: "Account", cell: (j) => j.account },
        { title: "Partition", cell: (j) => j.partition },
        { title: "QOS", cell: (j) => j.qos },
        { title: "State", cell: (j) => badge(j.state) },
        { title: "Reason", class: "reason", cell: (j) => waitReason(j) },
        { title: "Priority", class: "num", cell: (j) => factors.has(j.id) ? factors.get(j.id).priority.toFixed(0) : "–" },
        { title: "Factors", cell: (j) => factorBar(factors.get(j.id)) },
        { title: "GPUs", class: "num", cell: (j) => String(j.gpus) },
        { title: "Est. start", cell: (j) => j.expected_start ? clock(j.expected_start) : "–" },
        { title: "Est. run", class: "num", cell: (j) => duration(j.predicted_run_s) },
        { title: "Waiting", class: "num", cell: (j) => since(j.submitted_at) },
      ], pending, { empty: "no pending job", rowAttrs })),
      section(runningTitle, table([
        { title: "ID", cell: (j) => jobLink(j.id) },
        { title: "Name", cell: (j) => jobLink(j.id, j.name) },
        { title: "User", cell: (j) => j.user },
        { title: "Account", cell: (j) => j.account },
        { title: "Partition", cell: (j) => j.partition },
        { title: "State", cell: (j) => badge(j.state) },
        { title: "Tasks", cell: (j) => j.tasks.map((t) => `${t.name}×${t.replicas.length}`).join(" ") },
        { title: "GPUs (node: indices)", cell: gpuPlaces },
        { title: "Elapsed", class: "num", cell: (j) => since(j.started_at) },
        { title: "Predicted run", class: "num", cell: (j) => duration(j.predicted_run_s) },
        { title: "Time limit", class: "num", cell: (j) => j.time_limit ? duration(j.time_limit) : "–" },
      ], running, { empty: "no running job", rowAttrs })),
    ];
    if (ended) {
      parts.push(section(`Ended (${done.length})`, table([
        { title: "ID", cell: (j) => jobLink(j.id) },
        { title: "Name", cell: (j) => jobLink(j.id, j.name) },
        { title: "User", cell: (j) => j.user },
        { title: "Account", cell: (j) => j.account },
        { title: "State", cell: (j) => badge(j.state) },
        { title: "Exit", class: "num", cell: (j) => j.exit_code ?? "–" },
        { title: "Ended", cell: (j) => clock(j.ended_at) },
        { title: "Ran", class: "num", cell: (j) => j.started_at ? since(j.started_at, j.ended_at) : "–" },
        { title: "Predicted", class: "num", cell: (j) => duration(j.predicted_run_s) },
        { title: "Message", class: "reason", cell: (j) => j.message || "" },
      ], done, { empty: "no ended job in the newest 500", rowAttrs })));
    }
    fill(body, ...parts);
  });
}
