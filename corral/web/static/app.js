// What every page shares: who the visitor is, how every request reaches the API (with the
// visitor's bearer token), live refresh and small DOM helpers. main.js starts the page.

const TOKEN_KEY = "corral.token";
const ROOT = new URL("../", document.baseURI);   // the server (the shell is served at <root>/ui/)
export const UI = new URL(document.baseURI);

export class ApiError extends Error {
  constructor(status, detail) {
    super(detail);
    this.status = status;
  }
}

// --- the token ------------------------------------------------------------------------
// A link like /ui/#token=… hands the page a token once: it is kept in this browser's
// localStorage and taken out of the address bar (and so out of history and bookmarks).
export function takeTokenFromFragment() {
  const fragment = new URLSearchParams(location.hash.slice(1));
  const token = fragment.get("token");
  if (!token) return;
  localStorage.setItem(TOKEN_KEY, token);
  fragment.delete("token");
  const rest = fragment.toString();
  history.replaceState(history.state, "", location.pathname + location.search + (rest ? `#${rest}` : ""));
}

const token = () => localStorage.getItem(TOKEN_KEY);

let loginShown = false;
function askForToken(why) {
  const dialog = document.getElementById("login");
  document.getElementById("login-why").textContent = why;
  if (!loginShown) {
    loginShown = true;
    dialog.showModal();
  }
}

export function setUpLogin() {
  const form = document.getElementById("login-form");
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const value = document.getElementById("login-token").value.trim();
    if (!value) return;
    localStorage.setItem(TOKEN_KEY, value);
    location.reload();
  });
  const signout = document.getElementById("signout");
  signout.hidden = !token();
  signout.addEventListener("click", () => {
    localStorage.removeItem(TOKEN_KEY);
    location.reload();
  });
}

// --- requests -------------------------------------------------------------------------
async function detailOf(response) {
  let body;
  try {
    body = await response.json();
  } catch {
    return `${response.status} ${response.statusText}`;
  }
  const detail = body && body.detail;
  if (typeof detail === "string") return detail;
  if (Array.isArray(detail)) return detail.map((d) => `${(d.loc || []).join(".")}: ${d.msg}`).join("; ");
  if (detail && detail.message) {
    const issues = (detail.errors || []).map((e) => `${e.field ? e.field + ": " : ""}${e.message}`);
    return [detail.message, ...issues].join("; ");
  }
  return `${response.status} ${response.statusText}`;
}

// Every call to the API goes through here, so each carries the token (the log stream too).
export async function request(path, { method = "GET", body, signal, raw = false } = {}) {
  const headers = { Accept: raw ? "text/plain" : "application/json" };
  const bearer = token();
  if (bearer) headers.Authorization = `Bearer ${bearer}`;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  let response;
  try {
    response = await fetch(new URL(path, ROOT), {
      method, headers, signal, cache: "no-store",
      body: body === undefined ? undefined : JSON.stringify(body),
    });
  } catch (error) {
    if (error.name === "AbortError") throw error;
    throw new ApiError(0, `cannot reach the corral server (${error.message})`);
  }
  if (response.status === 401) {
    const why = await detailOf(response);
    if (bearer) localStorage.removeItem(TOKEN_KEY);
    askForToken(bearer ? `The server refused the saved token: ${why}` : why);
    throw new ApiError(401, why);
  }
  if (!response.ok) throw new ApiError(response.status, await detailOf(response));
  return raw ? response : response.json();
}

export const get = (path, params) => request(params ? `${path}?${query(params)}` : path);
export const post = (path, body) => request(path, { method: "POST", body });

export function query(params) {
  const out = new URLSearchParams();
  for (const [key, value] of Object.entries(params)) {
    if (value === undefined || value === null || value === "") continue;
    for (const item of Array.isArray(value) ? value : [value]) out.append(key, String(item));
  }
  return out.toString();
}

// --- who the visitor is ----------------------------------------------------------------
// GET /v1/whoami names the token's user and role (the server's owner, through its local
// token, is an admin); the buttons follow the role, the server decides in the end.
export const me = { user: null, role: null, source: null };

export async function whoami() {
  Object.assign(me, await get("v1/whoami"));
  const who = document.getElementById("who");
  who.textContent = `${me.user} · ${me.role}`;
  who.title = me.source === "local" ? `${me.user}, the server's owner (local token): ${me.role}`
    : `signed in as ${me.user} (role ${me.role}, token ${me.token})`;
}

// Whether the visitor may cancel, hold or scale this job; the server decides in the end (a
// refusal's sentence is shown), this only spares a button that cannot work.
export function mayAct(job) {
  if (["admin", "operator"].includes(me.role)) return true;
  return me.role === "user" && job.user === me.user;
}

export function whyNot(job) {
  if (!me.role) return "The server did not say who you are (GET /v1/whoami failed); reload to try again.";
  if (me.role === "viewer") return "Your role (viewer) may look but not change jobs.";
  if (me.role === "user") return `Only ${job.user} (its owner) or an operator may change this job.`;
  return `Your role (${me.role}) may not change jobs.`;
}

// --- live refresh ----------------------------------------------------------------------
const live = () => document.getElementById("live");
const banner = () => document.getElementById("banner");

export function showError(message) {
  const el = banner();
  el.textContent = message;
  el.hidden = !message;
}

// Run `refresh` now and every `ms` while the tab is visible; a failure is shown in the
// banner and retried at the next tick.
export function every(ms, refresh) {
  let timer = null;
  let running = false;
  async function tick() {
    clearTimeout(timer);
    if (!document.hidden && !running) {
      running = true;
      try {
        await refresh();
        live().textContent = "live";
        live().classList.remove("stale");
        live().title = `refreshed ${new Date().toLocaleTimeString()}`;
        showError("");
      } catch (error) {
        live().textContent = "stale";
        live().classList.add("stale");
        if (error.status !== 401) showError(error.message);
      } finally {
        running = false;
      }
    }
    timer = setTimeout(tick, ms);
  }
  document.addEventListener("visibilitychange", () => { if (!document.hidden) tick(); });
  tick();
  return tick;   // call it to refresh at once (after an action)
}

// --- DOM ----------------------------------------------------------------------------------
// Elements are built with text nodes only: job names, messages and log lines are the users'
// own strings and never become markup.
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") el.className = value;
    else if (key === "dataset") Object.assign(el.dataset, value);
    else if (key === "style") Object.assign(el.style, value);
    else if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else el.setAttribute(key, value === true ? "" : value);
  }
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : String(child));
  }
  return el;
}

// replaceChildren without the holes (null, false) that conditional parts leave.
export function fill(el, ...children) {
  el.replaceChildren(...children.flat(Infinity).filter((c) => c !== undefined && c !== null && c !== false && c !== ""));
  return el;
}

export const link = (path, ...children) => h("a", { href: new URL(path, UI).href }, ...children);
export const jobLink = (id, ...children) => link(`jobs/${id}`, ...(children.length ? children : [String(id)]));

export function table(columns, rows, { empty = "nothing to show", rowAttrs } = {}) {
  const head = h("thead", {}, h("tr", {}, columns.map((c) => h("th", { class: c.class }, c.title))));
  const body = h("tbody", {}, rows.length ? rows.map((row, i) => h("tr", rowAttrs ? rowAttrs(row, i) : {},
    columns.map((c) => h("td", { class: c.class }, c.cell(row)))))
    : h("tr", {}, h("td", { class: "empty", colspan: columns.length }, empty)));
  return h("table", { class: "grid" }, head, body);
}

export const badge = (state) => h("span", { class: `badge state-${String(state).toLowerCase()}` }, state);

export function section(title, ...children) {
  return h("section", { class: "card" }, h("h2", {}, title), ...children);
}

// --- time ---------------------------------------------------------------------------------
export function duration(seconds) {
  if (seconds === null || seconds === undefined || Number.isNaN(seconds)) return "–";
  seconds = Math.max(0, Math.round(seconds));
  if (seconds < 60) return `${seconds}s`;
  if (seconds < 3600) return `${Math.floor(seconds / 60)}m${String(seconds % 60).padStart(2, "0")}s`;
  if (seconds < 86400) return `${Math.floor(seconds / 3600)}h${String(Math.floor(seconds % 3600 / 60)).padStart(2, "0")}m`;
  return `${Math.floor(seconds / 86400)}d${String(Math.floor(seconds % 86400 / 3600)).padStart(2, "0")}h`;
}

export const since = (iso, until) => iso ? duration(((until ? Date.parse(until) : Date.now()) - Date.parse(iso)) / 1000) : "–";

export function clock(iso) {
  if (!iso) return "–";
  const when = new Date(iso);
  const today = new Date().toDateString() === when.toDateString();
  return today ? when.toLocaleTimeString() : when.toLocaleString();
}

// A colour per job, the same on every page (its GPU cells, its legend entry).
export function jobColour(id) {
  const hue = (Number(id) * 137.508) % 360;
  return `hsl(${hue.toFixed(0)} 60% 62%)`;
}
