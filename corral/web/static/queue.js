// The queue: pending jobs with their reason, priority factors and expected start; running
// jobs with the GPUs each replica holds; ended ones on request. Filters live in the URL.
import { fill, badge, clock, duration, every, get, h, jobLink, section, since, table } from "./app.js";

const ACTIVE = ["PENDING", "STARTING", "RUNNING", "PREEMPTED"];
const ENDED = ["SUCCEEDED", "FAILED", "CANCELLED", "TIMEOUT"];
const RUNNING = ["STARTING", "RUNNING", "PREEMPTED"];
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
  return job.reason === "None" ? "–" : job.reason;
}

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
    const params = { user: f.user, account: f.account, partition: f.partition, limit: ended ? 500 : 1000 };
    if (ended) params.all = true;
    else if (ACTIVE.includes(f.state)) params.state = f.state;
    const [jobs, priorities] = await Promise.all([get("v1/jobs", params), get("v1/priority")]);
    const shown = ENDED.includes(f.state) ? jobs.filter((j) => j.state === f.state) : jobs;
    remember(form, jobs);
    const factors = new Map(priorities.map((p) => [p.id, p]));
    const order = new Map(priorities.map((p, i) => [p.id, i]));
    const pending = shown.filter((j) => j.state === "PENDING")
      .sort((a, b) => (order.get(a.id) ?? 1e9) - (order.get(b.id) ?? 1e9) || a.id - b.id);
    const running = shown.filter((j) => RUNNING.includes(j.state));
    const done = shown.filter((j) => ENDED.includes(j.state)).reverse();
    const gpusHeld = running.reduce((sum, j) => sum + j.tasks.reduce((n, t) => n + t.replicas.reduce((m, r) => m + r.gpus.length, 0), 0), 0);
    fill(tiles, 
      h("div", { class: "tile" }, h("b", {}, String(pending.length)), "pending"),
      h("div", { class: "tile" }, h("b", {}, String(running.length)), "running"),
      h("div", { class: "tile" }, h("b", {}, String(gpusHeld)), "GPUs held"));
    const rowAttrs = (job) => ({ dataset: { job: job.id, state: job.state } });
    const parts = [
      section(`Pending (${pending.length})`, table([
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
        { title: "Waiting", class: "num", cell: (j) => since(j.submitted_at) },
      ], pending, { empty: "no pending job", rowAttrs })),
      section(`Running (${running.length})`, table([
        { title: "ID", cell: (j) => jobLink(j.id) },
        { title: "Name", cell: (j) => jobLink(j.id, j.name) },
        { title: "User", cell: (j) => j.user },
        { title: "Account", cell: (j) => j.account },
        { title: "Partition", cell: (j) => j.partition },
        { title: "State", cell: (j) => badge(j.state) },
        { title: "Tasks", cell: (j) => j.tasks.map((t) => `${t.name}×${t.replicas.length}`).join(" ") },
        { title: "GPUs (node: indices)", cell: gpuPlaces },
        { title: "Elapsed", class: "num", cell: (j) => since(j.started_at) },
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
        { title: "Message", class: "reason", cell: (j) => j.message || "" },
      ], done, { empty: "no ended job in the newest 500", rowAttrs })));
    }
    fill(body, ...parts);
  });
}
