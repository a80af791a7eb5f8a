// A job group's page: its tasks and replicas (state, readiness, node, GPUs, restarts,
// address), the event timeline, live logs per replica, and cancel / hold / release / scale
// for those allowed to.
import { fill, ApiError, badge, clock, duration, every, h, jobLink, mayAct, post, query, request, section, since, table,
  whyNot } from "./app.js";

const ENDED = ["SUCCEEDED", "FAILED", "CANCELLED", "TIMEOUT"];
const MAX_LOG_CHARS = 400_000;   // the page keeps the newest part of a long log

function facts(job) {
  const rows = [
    ["User", job.user], ["Account", job.account], ["Partition", job.partition], ["QOS", job.qos],
    ["Submitted", clock(job.submitted_at)], ["Started", clock(job.started_at)], ["Ended", clock(job.ended_at)],
    ["Ran", job.started_at ? since(job.started_at, job.ended_at) : "–"],
    ["Time limit", job.time_limit ? duration(job.time_limit) : "none"],
    [job.state === "PENDING" ? "Est. run" : "Predicted run",
      job.predicted_run_s ? duration(job.predicted_run_s) : "no history"], ["GPUs", String(job.gpus)],
    ["Exit code", job.exit_code ?? "–"], ["Requeues", String(job.requeues)],
  ];
  if (job.state === "PENDING") rows.push(["Reason", job.reason || "–"], ["Expected start", clock(job.expected_start)]);
  if (job.dependency) rows.push(["Dependency", job.dependency]);
  if (job.hold) rows.push(["Held", job.hold === "admin" ? "by an operator (JobHeldAdmin)" : "by its owner (JobHeldUser)"]);
  return h("dl", { class: "facts" }, rows.map(([k, v]) => h("div", {}, h("dt", {}, k), h("dd", {}, v))));
}

class Actions {
  constructor(jobId, refresh) {
    this.jobId = jobId;
    this.refresh = refresh;
    this.el = h("div", { class: "actions" });
    this.result = h("p", { class: "result", role: "status" });
    this.shape = null;
  }

  async act(label, call) {
    this.result.className = "result";
    this.result.textContent = `${label}…`;
    try {
      const answer = await call();
      this.result.textContent = answer.message || `${label}: done`;
      this.result.classList.add("ok");
    } catch (error) {
      if (!(error instanceof ApiError)) throw error;
      this.result.textContent = error.message;   // the server's sentence, e.g. which role may do it
      this.result.classList.add("refused");
    }
    this.refresh();
  }

  update(job) {
    const allowed = mayAct(job);
    const live = !ENDED.includes(job.state);
    const elastic = job.tasks.filter((t) => t.min_nodes !== null && t.max_nodes !== null);
    // Rebuilt only when what can be done changes, so a number being typed is not wiped.
    const shape = JSON.stringify([allowed, live, job.state, job.hold, job.cancel_requested,
      elastic.map((t) => [t.name, t.min_nodes, t.max_nodes])]);
    if (shape !== this.shape) {
      this.shape = shape;
      this.build(job, allowed, live, elastic);
    }
    for (const task of elastic) {
      const input = this.el.querySelector(`input[data-task="${CSS.escape(task.name)}"]`);
      if (input && document.activeElement !== input) input.value = String(task.replicas.length);
    }
  }

  build(job, allowed, live, elastic) {
    const id = this.jobId;
    const disabled = !allowed;
    const title = allowed ? undefined : whyNot(job);
    const buttons = [];
    if (live) {
      buttons.push(h("button", { type: "button", class: "danger", "data-action": "cancel", disabled: disabled || job.cancel_requested, title,
        onclick: () => confirm(`Cancel job ${id} (${job.name})? Every replica gets its stop signal.`) &&
          this.act("cancel", async () => {
            const answer = await post(`v1/jobs/${id}/cancel`);
            return { message: answer.cancelled ? `job ${id}: cancel requested` : `job ${id} was already ending` };
          }) }, job.cancel_requested ? "Cancelling…" : "Cancel"));
    }
    if (job.state === "PENDING" && !job.hold) {
      buttons.push(h("button", { type: "button", "data-action": "hold", disabled, title,
        onclick: () => this.act("hold", () => post(`v1/jobs/${id}/hold`)) }, "Hold"));
    }
    if (job.hold) {
      buttons.push(h("button", { type: "button", "data-action": "release", disabled, title,
        onclick: () => this.act("release", () => post(`v1/jobs/${id}/release`)) }, "Release"));
    }
    const scalers = (job.state === "RUNNING" || job.state === "STARTING") ? elastic.map((task) => {
      const input = h("input", { type: "number", min: task.min_nodes, max: task.max_nodes, value: task.replicas.length,
        "data-task": task.name, disabled, title, "aria-label": `replicas of ${task.name}` });
      return h("span", { class: "scale" }, `${task.name}: `, input,
        h("button", { type: "button", "data-action": "scale", "data-task": task.name, disabled, title,
          onclick: () => this.act(`scale ${task.name}`, async () => {
            await post(`v1/jobs/${id}/scale`, { task: task.name, replicas: Number(input.value) });
            // an autoscaled task's count alone pins its bounds (min = max): the autoscaler holds it there
            return { message: task.autoscaled
              ? `${task.name}: pinned at ${input.value} replica(s) (min = max; corral scale --min/--max gives the autoscaler room again)`
              : `${task.name}: scaling to ${input.value} replica(s)` };
          }) }, task.autoscaled ? "Pin" : "Scale"),
        h("small", {}, ` ${task.min_nodes}–${task.max_nodes}${task.autoscaled ? ", autoscaled" : ""}`));
    }) : [];
    const note = !allowed && (buttons.length || scalers.length) ? h("p", { class: "readonly" }, whyNot(job)) : null;
    fill(this.el, ...buttons, ...scalers, note, this.result);
  }
}

function tasksView(job, onLogs) {
  return job.tasks.map((task) => {
    const what = [task.primary ? "primary" : "auxiliary",
      task.gpus ? `${task.gpus}× ${task.gpu_type || "GPU"} per replica` : "no GPU",
      `${task.cpus} CPU`, task.memory ? `${task.memory} GB` : null,
      task.min_nodes !== null ? `elastic ${task.min_nodes}–${task.max_nodes}` : null,
      task.endpoint ? `endpoint ${task.endpoint}` : null].filter(Boolean).join(" · ");
    return h("div", { class: "task", dataset: { task: task.name } },
      h("h3", {}, task.name, h("small", {}, ` ${what}`)),
      table([
        { title: "Replica", cell: (r) => h("code", {}, r.hostname) },
        { title: "State", cell: (r) => r.reason ? h("span", { title: r.reason }, badge("PULLING"), h("small", {}, ` ${r.reason}`))
          : badge(r.state) },
        { title: "Ready", cell: (r) => r.state === "RUNNING" ? (r.ready ? "✔ ready" : "not ready") : "–" },
        { title: "Node", cell: (r) => r.node || "–" },
        { title: "GPUs", cell: (r) => r.gpus.length ? r.gpus.join(",") : "–" },
        { title: "Restarts", class: "num", cell: (r) => String(r.restarts) },
        { title: "Address", cell: (r) => r.addr || "–" },
        { title: "Exit", class: "num", cell: (r) => r.exit_code ?? (r.last_exit_code !== null ? `(${r.last_exit_code})` : "–") },
        { title: "Up", class: "num", cell: (r) => r.started_at ? since(r.started_at, r.ended_at) : "–" },
        { title: "", cell: (r) => h("button", { type: "button", class: "link", "data-logs": `${task.name}-${r.rank}`,
          onclick: () => onLogs(`${task.name}-${r.rank}`) }, "logs") },
      ], task.replicas, { empty: "no replica", rowAttrs: (r) => ({ dataset: { replica: `${task.name}-${r.rank}`, state: r.state } }) }));
  });
}

function timeline(events) {
  if (!events.length) return h("p", { class: "empty" }, "no event yet");
  return h("ol", { class: "timeline" }, events.map((e) => h("li", { class: e.to_state ? `to-${e.to_state.toLowerCase()}` : "" },
    h("time", { datetime: e.ts, title: new Date(e.ts).toLocaleString() }, new Date(e.ts).toLocaleTimeString()),
    h("span", { class: "subject" }, e.subject),
    e.to_state ? h("span", { class: "move" }, `${e.from_state || "∅"} → ${e.to_state}`) : null,
    h("span", { class: "cause" }, e.cause),
    e.message ? h("span", { class: "message" }, e.message) : null)));
}

class Logs {
  constructor(jobId) {
    this.jobId = jobId;
    this.tabs = h("div", { class: "tabs", role: "tablist" });
    this.status = h("span", { class: "log-status" });
    this.pre = h("pre", { class: "log", tabindex: "0" });
    this.el = h("div", {}, this.tabs, this.status, this.pre);
    this.labels = [];
    this.current = undefined;
    this.abort = null;
  }

  setReplicas(labels) {
    if (labels.join() === this.labels.join()) return;
    this.labels = labels;
    fill(this.tabs, ...[null, ...labels].map((label) => h("button", {
      type: "button", role: "tab", class: "tab", "data-replica": label || "all",
      "aria-selected": String(label === this.current), onclick: () => this.open(label),
    }, label || "all replicas")));
  }

  async open(label) {
    this.current = label;
    for (const tab of this.tabs.children) tab.setAttribute("aria-selected", String(tab.dataset.replica === (label || "all")));
    if (this.abort) this.abort.abort();
    const abort = (this.abort = new AbortController());
    this.pre.textContent = "";
    this.status.textContent = `following ${label || "every replica"}…`;
    let text = "";
    let pending = false;
    const paint = () => {
      pending = false;
      const stick = this.pre.scrollTop + this.pre.clientHeight >= this.pre.scrollHeight - 8;
      this.pre.textContent = text;
      if (stick) this.pre.scrollTop = this.pre.scrollHeight;
    };
    try {
      const params = { follow: true, tail: 2000, replica: label || undefined };
      const response = await request(`v1/jobs/${this.jobId}/logs?${query(params)}`, { signal: abort.signal, raw: true });
      const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        text += value;
        if (text.length > MAX_LOG_CHARS) text = text.slice(text.length - MAX_LOG_CHARS / 2);
        if (!pending) { pending = true; requestAnimationFrame(paint); }
      }
      paint();
      // The server ends a followed log when the job ends (or when it stops itself).
      const over = this.ended || ENDED.includes((await request(`v1/jobs/${this.jobId}`)).state);
      this.status.textContent = over ? `${label || "every replica"}: the job has ended; this is the whole log`
        : "the log stream closed; pick a tab to follow it again";
    } catch (error) {
      if (error.name === "AbortError") return;
      this.status.textContent = `log stream stopped: ${error.message}`;
    }
  }

  close() {
    if (this.abort) this.abort.abort();
  }
}

export function show(main, ident) {
  const title = h("h1", {}, `Job ${ident}`);
  const state = h("span");
  const message = h("p", { class: "message" });
  const factsBox = h("div");
  const tasksBox = h("div");
  const eventsBox = h("div");
  const logs = new Logs(ident);
  let refresh = () => {};
  const actions = new Actions(ident, () => refresh());
  let opened = false;
  fill(main, 
    h("p", { class: "crumbs" }, h("a", { href: "./" }, "Queue"), " / job ", ident),
    h("div", { class: "job-head" }, title, state), message, actions.el, factsBox,
    section("Tasks and replicas", tasksBox),
    h("div", { class: "columns" }, section("Logs", logs.el), section("Events", eventsBox)));
  addEventListener("pagehide", () => logs.close());

  refresh = every(1500, async () => {
    let job;
    let events;
    try {
      [job, events] = await Promise.all([request(`v1/jobs/${encodeURIComponent(ident)}`),
        request(`v1/jobs/${encodeURIComponent(ident)}/events`)]);
    } catch (error) {
      if (error.status === 404) {
        title.textContent = `No job ${ident}`;
        message.textContent = error.message;
        message.classList.add("refused");
        return;
      }
      throw error;
    }
    document.title = `${job.name} (${job.id}) · corral`;
    fill(title, job.name, h("small", {}, ` job ${job.id}${job.group ? " · job group" : ""}`));
    fill(state, badge(job.state), job.cancel_requested && !ENDED.includes(job.state) ? h("small", {}, " cancelling") : null);
    message.textContent = job.message || "";
    actions.jobId = job.id;
    actions.update(job);
    fill(factsBox, facts(job));
    fill(tasksBox, ...tasksView(job, (label) => logs.open(label)));
    fill(eventsBox, timeline(events));
    logs.jobId = job.id;
    logs.ended = ENDED.includes(job.state);
    logs.setReplicas(job.tasks.flatMap((t) => t.replicas.map((r) => `${t.name}-${r.rank}`)));
    if (!opened && job.state !== "PENDING") {
      opened = true;
      logs.open(null);
    }
  });
}
