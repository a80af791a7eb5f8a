// Usage: the fair-share tree (shares, decayed usage, factor) and accounting per user or
// account over a time range, as a stacked chart of GPU- or CPU-hours.
import { fill, every, get, h, section, table } from "./app.js";

const RANGES = [["1h", 3600], ["24h", 86400], ["7d", 7 * 86400], ["30d", 30 * 86400]];
const TOP = 8;   // series drawn on their own; the rest are summed as "others"

function loadChartJs() {
  if (window.Chart) return Promise.resolve(window.Chart);
  return new Promise((resolve, reject) => {
    const script = document.createElement("script");
    script.src = "static/vendor/chart.umd.js";
    script.onload = () => resolve(window.Chart);
    script.onerror = () => reject(new Error("could not load the chart library"));
    document.head.append(script);
  });
}

function shareTree(rows) {
  return table([
    { title: "Account / user", cell: (r) => h("span", { class: r.user ? "tree-user" : "tree-account", style: { paddingLeft: `${r.depth * 1.2}em` } },
      r.user ? r.user : r.account) },
    { title: "Shares", class: "num", cell: (r) => String(r.raw_shares) },
    { title: "Norm. shares", class: "num", cell: (r) => r.norm_shares.toFixed(3) },
    { title: "Usage (decayed)", class: "num", cell: (r) => r.raw_usage.toFixed(0) },
    { title: "Effective usage", class: "num", cell: (r) => r.effective_usage.toFixed(3) },
    { title: "Fair share", cell: (r) => h("span", { class: "share", title: r.fair_share.toFixed(4) },
      h("span", { class: "share-bar" }, h("span", { style: { width: `${(100 * r.fair_share).toFixed(1)}%` } })),
      r.fair_share.toFixed(3)) },
  ], rows, { empty: "no account has jobs yet", rowAttrs: (r) => ({ dataset: { account: r.account, user: r.user } }) });
}

const hours = (v) => v === 0 ? "0" : v >= 10 ? v.toFixed(1) : v >= 0.01 ? v.toFixed(2) : v.toPrecision(2);

function localInput(date) {
  const shifted = new Date(date.getTime() - date.getTimezoneOffset() * 60000);
  return shifted.toISOString().slice(0, 16);
}

function bucketLabel(iso, step) {
  const when = new Date(iso);
  if (step >= 86400) return when.toLocaleDateString();
  return when.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" }) +
    (step >= 3600 ? ` ${when.toLocaleDateString([], { month: "short", day: "numeric" })}` : "");
}

export function show(main) {
  const shareBox = h("div");
  const range = h("select", { name: "range" }, [...RANGES.map(([label]) => h("option", { value: label, selected: label === "24h" }, `last ${label}`)),
    h("option", { value: "custom" }, "custom range")]);
  const from = h("input", { type: "datetime-local", name: "since" });
  const to = h("input", { type: "datetime-local", name: "until" });
  const by = h("select", { name: "by" }, h("option", { value: "user" }, "user"), h("option", { value: "account" }, "account"));
  const metric = h("select", { name: "metric" }, h("option", { value: "gpu" }, "GPU-hours"), h("option", { value: "cpu" }, "CPU-hours"));
  const controls = h("form", { class: "filters", onsubmit: (e) => e.preventDefault() },
    h("label", {}, "Range", range), h("label", {}, "From", from), h("label", {}, "To", to),
    h("label", {}, "Per", by), h("label", {}, "Show", metric));
  const canvas = h("canvas", { id: "usage-chart", "aria-label": "usage over time", role: "img" });
  const totals = h("div");
  const note = h("p", { class: "hint" });
  fill(main, h("h1", {}, "Usage"), section("Fair share", shareBox),
    section("Accounting", controls, note, h("div", { class: "chart" }, canvas), totals));

  const setRange = () => {
    const seconds = (RANGES.find(([label]) => label === range.value) || [])[1];
    if (!seconds) return;
    const now = new Date();
    from.value = localInput(new Date(now.getTime() - seconds * 1000));
    to.value = localInput(now);
  };
  setRange();
  let chart = null;
  let refresh;
  controls.addEventListener("change", (event) => {
    if (event.target === range) setRange();
    else if (event.target === from || event.target === to) range.value = "custom";
    refresh();
  });

  refresh = every(3000, async () => {
    let window;
    const preset = (RANGES.find(([label]) => label === range.value) || [])[1];
    if (preset) {   // a "last …" range slides with the clock, to the second
      setRange();
      window = { since: new Date(Date.now() - preset * 1000).toISOString(), until: new Date().toISOString() };
    } else {
      if (!from.value || !to.value) throw new Error("pick both ends of the range");
      window = { since: new Date(from.value).toISOString(), until: new Date(to.value).toISOString() };
    }
    const [share, usage, Chart] = await Promise.all([get("v1/share"),
      get("v1/accounting", { ...window, by: by.value }), loadChartJs()]);
    fill(shareBox, shareTree(share));
    const key = metric.value === "gpu" ? "gpu_hours" : "cpu_hours";
    const series = [...usage.series].sort((a, b) => b[key] - a[key] || a.key.localeCompare(b.key));
    const drawn = series.slice(0, TOP);
    const rest = series.slice(TOP);
    if (rest.length) {
      drawn.push({ key: `${rest.length} others`, [`${key}_by_bucket`]: usage.buckets.map((_, i) => rest.reduce((s, r) => s + r[`${key}_by_bucket`][i], 0)) });
    }
    note.textContent = `${usage.buckets.length} buckets of ${usage.step >= 3600 ? `${usage.step / 3600} h` : `${usage.step / 60} min`}; ` +
      "a job counts what it holds at once while its last run is in the range.";
    const data = {
      labels: usage.buckets.map((b) => bucketLabel(b, usage.step)),
      datasets: drawn.map((s, i) => ({ label: s.key, data: s[`${key}_by_bucket`], backgroundColor: `hsl(${(i * 47) % 360} 55% 58%)`, stack: "usage" })),
    };
    if (!chart) {
      chart = new Chart(canvas, {
        type: "bar", data,
        options: { animation: false, responsive: true, maintainAspectRatio: false,
          scales: { x: { stacked: true }, y: { stacked: true, title: { display: true, text: metric.selectedOptions[0].text } } },
          plugins: { legend: { position: "bottom" } } },
      });
    } else {
      chart.data = data;
      chart.options.scales.y.title.text = metric.selectedOptions[0].text;
      chart.update("none");
    }
    fill(totals, table([
      { title: by.value === "user" ? "User" : "Account", cell: (s) => s.key },
      { title: "Jobs", class: "num", cell: (s) => String(s.jobs) },
      { title: "GPU-hours", class: "num", cell: (s) => hours(s.gpu_hours) },
      { title: "CPU-hours", class: "num", cell: (s) => hours(s.cpu_hours) },
    ], series, { empty: "no job ran in this range", rowAttrs: (s) => ({ dataset: { key: s.key } }) }));
  });
}
