// The entry point: takes a token handed over in the URL, learns who the visitor is, and
// shows the page the path names (/ui/, /ui/jobs/ID, /ui/nodes, /ui/usage).
import { UI, setUpLogin, showError, takeTokenFromFragment, whoami } from "./app.js";

const PAGES = {
  queue: () => import("./queue.js"),
  nodes: () => import("./nodes.js"),
  usage: () => import("./usage.js"),
  job: () => import("./job.js"),
};

function route() {
  const rest = location.pathname.slice(UI.pathname.length).replace(/\/+$/, "");
  const job = /^jobs\/([^/]+)$/.exec(rest);
  if (job) return ["job", decodeURIComponent(job[1])];
  return [PAGES[rest] ? rest : "queue", null];
}

async function start() {
  takeTokenFromFragment();
  setUpLogin();
  const [name, arg] = route();
  for (const a of document.querySelectorAll("nav a")) a.classList.toggle("active", a.dataset.page === name);
  const main = document.getElementById("main");
  try {
    await whoami();
  } catch (error) {
    if (error.status === 401) return;   // the sign-in form is up
    showError(error.message);
  }
  const page = await PAGES[name]();
  page.show(main, arg);
}

start();
