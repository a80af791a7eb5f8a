// Nodes: a GPU map (which job's replica holds which GPU of which node), what CPUs and memory
// are in use, the nodes that are not taking work (DOWN), and the partitions that are DOWN because
// the engine of their infra does not answer (with why; they come back by themselves).
import { fill, every, get, h, jobColour, jobLink, section, table } from "./app.js";

function meter(label, used, total, unit) {
  const share = total ? Math.min(1, used / total) : 0;
  return h("div", { class: "meter", title: `${label}: ${used.toFixed(1)} of ${total}${unit} in use` },
    h("span", { class: "meter-label" }, `${label} ${+used.toFixed(1)}/${total}${unit}`),
    h("span", { class: "meter-bar" }, h("span", { style: { width: `${(100 * share).toFixed(1)}%` } })));
}

function gpuCell(node, index, holder) {
  if (!holder) return h("div", { class: "gpu free", title: `${node.name} GPU ${index}: free`, dataset: { gpu: index } },
    h("span", { class: "gpu-index" }, String(index)), h("span", { class: "gpu-job" }, "free"));
  return h("a", {
    class: "gpu held", href: `jobs/${holder.job}`, style: { background: jobColour(holder.job) },
    title: `${node.name} GPU ${index}: job ${holder.job} ${holder.job_name} (${holder.user}), replica ${holder.replica}, ${holder.state}`,
    dataset: { gpu: index, job: holder.job },
  }, h("span", { class: "gpu-index" }, String(index)), h("span", { class: "gpu-job" }, `#${holder.job}`),
  h("span", { class: "gpu-replica" }, holder.replica));
}

function nodeCard(node, allocations) {
  const holders = new Map();
  for (const a of allocations) for (const g of a.gpus) holders.set(g, a);
  const down = node.state !== "UP";
  const usedCpus = allocations.reduce((s, a) => s + a.cpus, 0);
  const usedMemory = allocations.reduce((s, a) => s + a.memory, 0);
  const labels = Object.entries(node.labels).map(([k, v]) => `${k}=${v}`).join(" ");
  return h("article", { class: `node${down ? " down" : ""}`, dataset: { node: node.name, state: node.state } },
    h("header", {}, h("b", {}, node.name), h("span", { class: `badge state-${node.state.toLowerCase()}` }, node.state),
      h("small", {}, [node.infra, node.gpu_type, labels].filter(Boolean).join(" · "))),
    node.gpus ? h("div", { class: "gpus" }, Array.from({ length: node.gpus }, (_, i) => gpuCell(node, i, holders.get(i))))
      : h("p", { class: "empty" }, "no GPU"),
    down ? h("p", { class: "refused" }, "Lost by its executor: nothing new is placed here.") : [
      meter("CPU", usedCpus, node.cpus, ""), meter("Memory", usedMemory, node.memory, " GB")]);
}

export function show(main) {
  const tiles = h("div", { class: "tiles" });
  const outages = h("div");
  const unavailable = h("div");
  const grid = h("div", { class: "nodes" });
  const legend = h("div");
  fill(main, h("h1", {}, "Nodes"), outages, tiles, unavailable, section("GPU map", grid), legend);

  every(2000, async () => {
    const [nodes, allocations, partitions] = await Promise.all([get("v1/nodes"), get("v1/allocations"), get("v1/partitions")]);
    const down = partitions.filter((p) => p.state === "DOWN");
    fill(outages, down.length ? section(`Partitions DOWN (${down.length})`, table([
      { title: "Partition", cell: (p) => p.name },
      { title: "State", cell: (p) => h("span", { class: "badge state-down" }, p.state) },
      { title: "Infra", cell: (p) => p.infra || "any" },
      { title: "Why (its jobs wait; it comes back when the engine answers)", class: "reason", cell: (p) => p.reason || "" },
    ], down)) : "");
    const byNode = new Map(nodes.map((n) => [n.name, []]));
    for (const a of allocations) byNode.get(a.node)?.push(a);
    const up = nodes.filter((n) => n.state === "UP");
    const gpus = up.reduce((s, n) => s + n.gpus, 0);
    const free = up.reduce((s, n) => s + n.free_gpus.length, 0);
    fill(tiles, 
      h("div", { class: "tile" }, h("b", {}, `${up.length}/${nodes.length}`), "nodes up"),
      h("div", { class: "tile" }, h("b", {}, String(gpus - free)), "GPUs held"),
      h("div", { class: "tile" }, h("b", {}, String(free)), "GPUs free"));
    const out = nodes.filter((n) => n.state !== "UP");
    fill(unavailable, out.length ? section(`Not taking work (${out.length})`, table([
      { title: "Node", cell: (n) => n.name },
      { title: "State", cell: (n) => h("span", { class: `badge state-${n.state.toLowerCase()}` }, n.state) },
      { title: "Infra", cell: (n) => n.infra },
      { title: "GPUs", class: "num", cell: (n) => String(n.gpus) },
      { title: "Replicas still recorded there", cell: (n) => (byNode.get(n.name) || []).map((a) => `${a.replica} of job ${a.job}`).join(", ") || "–" },
    ], out)) : "");
    fill(grid, ...nodes.map((n) => nodeCard(n, byNode.get(n.name) || [])));
    const jobs = new Map();
    for (const a of allocations) {
      const entry = jobs.get(a.job) || { ...a, gpus: 0, replicas: 0 };
      entry.gpus += a.gpus.length;
      entry.replicas += 1;
      jobs.set(a.job, entry);
    }
    fill(legend, section("Jobs holding resources", table([
      { title: "", cell: (j) => h("span", { class: "swatch", style: { background: jobColour(j.job) } }) },
      { title: "Job", cell: (j) => jobLink(j.job, `${j.job} ${j.job_name}`) },
      { title: "User", cell: (j) => j.user },
      { title: "Account", cell: (j) => j.account },
      { title: "Replicas", class: "num", cell: (j) => String(j.replicas) },
      { title: "GPUs", class: "num", cell: (j) => String(j.gpus) },
    ], [...jobs.values()].sort((a, b) => a.job - b.job), { empty: "nothing is running" })));
  });
}
