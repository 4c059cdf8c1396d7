// agentrun console: the inbox and the Run pages. Everything an agent wrote (prompts, tools, targets,
// schema titles, results) is untrusted: it is only ever set as text (textContent, text nodes, attribute
// values), never parsed as markup. The server checks every answer again; the checks here are feedback.
"use strict";

const MAX_DEPTH = 6; // deeper schemas: the raw JSON editor (the server sends no form schema past its own bound)
const PAGE = 100; // cards rendered at first; the rest on request or through the filter
const RADIO_LIMIT = 6; // enums up to this many values are radio buttons, longer ones a select

const state = {
  csrf: null,
  user: null,
  skew: 0, // server clock minus this browser's, in ms (countdowns use the server's time)
  inbox: null,
  shown: PAGE,
  filter: "",
  selected: -1,
  loading: null,
  again: false,
  run: null,
};

// ---- small helpers ---------------------------------------------------------------------------------

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "class") el.className = value;
    else if (key === "text") el.textContent = value;
    else if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else el.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(typeof child === "string" ? document.createTextNode(child) : child);
  }
  return el;
}

const $ = (selector, root = document) => root.querySelector(selector);

function serverNow() {
  return Date.now() + state.skew;
}

function duration(seconds) {
  const s = Math.max(0, Math.floor(seconds));
  if (s < 60) return `${s}s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m}m${s % 60 ? ` ${s % 60}s` : ""}`;
  const hours = Math.floor(m / 60);
  if (hours < 48) return `${hours}h${m % 60 ? ` ${m % 60}m` : ""}`;
  return `${Math.floor(hours / 24)}d`;
}

function pretty(value) {
  return JSON.stringify(value, null, 2);
}

function runPath(namespace, name) {
  return `/runs/${encodeURIComponent(namespace)}/${encodeURIComponent(name)}`;
}

function toast(message, ok) {
  const el = $("#toast");
  el.textContent = message;
  el.className = `toast ${ok ? "ok" : "bad"}`;
  el.hidden = false;
}

class SignedOut extends Error {}

async function api(path, body) {
  const options = { credentials: "same-origin", headers: {} };
  if (body !== undefined) {
    options.method = "POST";
    options.headers["Content-Type"] = "application/json";
    options.headers["X-CSRF-Token"] = state.csrf || "";
    options.body = JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(path, options);
  } catch (err) {
    return { status: 0, data: { error: "the console does not answer: is `kubectl agentrun console` still running?" } };
  }
  let data;
  try {
    data = await response.json();
  } catch (err) {
    data = { error: `HTTP ${response.status}` };
  }
  if (response.status === 401) {
    signedOut(data.error, data.proxied);
    throw new SignedOut(data.error);
  }
  return { status: response.status, data };
}

function signedOut(why, proxied) {
  const main = $("#main");
  // Behind a proxy, signing in is the proxy's: reloading goes through it again.
  const how = proxied
    ? h("p", { text: "Sign in again through your organisation's sign-in page (reload this page)." })
    : h("p", {}, "Sign in with the login URL that ", h("code", { text: "kubectl agentrun console" }),
      " printed (each works once); restart it for a new one.");
  main.replaceChildren(
    h("section", { class: "empty" },
      h("h1", { text: "Not signed in" }),
      h("p", { text: why || "The session ended." }),
      how,
    ),
  );
  $("#live").textContent = "signed out";
}

// ---- answers: a form from the request's JSON Schema ------------------------------------------------

function typeOf(schema) {
  if (Array.isArray(schema.type)) return schema.type.find((t) => t !== "null") || "null";
  if (schema.type) return schema.type;
  if (schema.properties) return "object";
  if (schema.enum) return "enum";
  return null;
}

function jsonType(value) {
  if (value === null) return "null";
  if (Array.isArray(value)) return "array";
  if (typeof value === "number") return Number.isInteger(value) ? "integer" : "number";
  return typeof value;
}

function typeMatches(expected, value) {
  const actual = jsonType(value);
  return expected === actual || (expected === "number" && actual === "integer");
}

// What the answer gets wrong against the schema (a subset of JSON Schema: the server checks it all).
function problems(value, schema, path = "", depth = 0) {
  if (!schema || typeof schema !== "object" || depth > MAX_DEPTH * 2) return [];
  const where = path || "the answer";
  const out = [];
  if (schema.type) {
    const types = Array.isArray(schema.type) ? schema.type : [schema.type];
    if (!types.some((t) => typeMatches(t, value))) return [`${where} must be ${types.join(" or ")}`];
  }
  if (schema.enum && !schema.enum.some((v) => JSON.stringify(v) === JSON.stringify(value))) {
    out.push(`${where} must be one of ${schema.enum.map((v) => JSON.stringify(v)).join(", ")}`);
  }
  if ("const" in schema && JSON.stringify(schema.const) !== JSON.stringify(value)) {
    out.push(`${where} must be ${JSON.stringify(schema.const)}`);
  }
  if (typeof value === "string") {
    if (schema.minLength !== undefined && value.length < schema.minLength) out.push(`${where} needs at least ${schema.minLength} characters`);
    if (schema.maxLength !== undefined && value.length > schema.maxLength) out.push(`${where} allows at most ${schema.maxLength} characters`);
    if (schema.pattern) {
      try {
        if (!new RegExp(schema.pattern, "u").test(value)) out.push(`${where} must match ${schema.pattern}`);
      } catch (err) { /* a pattern JavaScript cannot read: the server judges it */ }
    }
  }
  if (typeof value === "number") {
    if (schema.minimum !== undefined && value < schema.minimum) out.push(`${where} must be at least ${schema.minimum}`);
    if (schema.maximum !== undefined && value > schema.maximum) out.push(`${where} must be at most ${schema.maximum}`);
    if (schema.exclusiveMinimum !== undefined && value <= schema.exclusiveMinimum) out.push(`${where} must be more than ${schema.exclusiveMinimum}`);
    if (schema.exclusiveMaximum !== undefined && value >= schema.exclusiveMaximum) out.push(`${where} must be less than ${schema.exclusiveMaximum}`);
  }
  if (Array.isArray(value)) {
    if (schema.minItems !== undefined && value.length < schema.minItems) out.push(`${where} needs at least ${schema.minItems} items`);
    if (schema.maxItems !== undefined && value.length > schema.maxItems) out.push(`${where} allows at most ${schema.maxItems} items`);
    if (schema.items && typeof schema.items === "object") {
      value.forEach((item, i) => out.push(...problems(item, schema.items, `${path}[${i}]`, depth + 1)));
    }
  }
  if (jsonType(value) === "object") {
    const properties = schema.properties || {};
    for (const name of schema.required || []) {
      if (!(name in value)) out.push(`${path ? `${path}.` : ""}${name} is required`);
    }
    for (const [name, item] of Object.entries(value)) {
      const sub = `${path ? `${path}.` : ""}${name}`;
      if (Object.prototype.hasOwnProperty.call(properties, name)) out.push(...problems(item, properties[name], sub, depth + 1));
      else if (schema.additionalProperties === false) out.push(`${sub} is not expected`);
      else if (typeof schema.additionalProperties === "object") out.push(...problems(item, schema.additionalProperties, sub, depth + 1));
    }
  }
  return out;
}

let fieldIds = 0;

// One field of the form: {el, read()}; read() returns undefined for "left empty", or throws with why.
function field(schema, name, required, depth) {
  const id = `f${++fieldIds}`;
  const title = (schema && typeof schema.title === "string" && schema.title) || name || "answer";
  const label = h("label", { for: id }, title, required ? h("span", { class: "req", "aria-hidden": "true", text: " *" }) : null);
  const hint = schema && typeof schema.description === "string" ? h("small", { class: "hint", text: schema.description }) : null;
  const kind = schema && typeof schema === "object" ? typeOf(schema) : null;

  if (kind === "object" && schema.properties && depth < MAX_DEPTH) {
    const fields = Object.entries(schema.properties).map(([key, sub]) => [key, field(sub, key, (schema.required || []).includes(key), depth + 1)]);
    const el = h("fieldset", { class: "group" }, depth ? h("legend", { text: title }) : null, hint, fields.map(([, f]) => f.el));
    return {
      el,
      read() {
        const value = {};
        for (const [key, f] of fields) {
          const v = f.read();
          if (v !== undefined) value[key] = v;
        }
        return Object.keys(value).length || required || depth === 0 ? value : undefined;
      },
    };
  }
  if (schema && Array.isArray(schema.enum) && schema.enum.length) {
    if (schema.enum.length <= RADIO_LIMIT) {
      const options = schema.enum.map((v, i) => {
        const input = h("input", { type: "radio", name: id, id: `${id}-${i}`, value: String(i) });
        return [v, h("label", { class: "choice", for: `${id}-${i}` }, input, ` ${typeof v === "string" ? v : JSON.stringify(v)}`)];
      });
      const el = h("fieldset", { class: "field choices", role: "radiogroup" }, h("legend", {}, title, required ? h("span", { class: "req", text: " *" }) : null), hint, options.map(([, l]) => l));
      return {
        el,
        read() {
          const chosen = el.querySelector("input:checked");
          return chosen ? schema.enum[Number(chosen.value)] : undefined;
        },
      };
    }
    const select = h("select", { id }, h("option", { value: "", text: "choose…" }),
      schema.enum.map((v, i) => h("option", { value: String(i), text: typeof v === "string" ? v : JSON.stringify(v) })));
    return { el: h("div", { class: "field" }, label, hint, select), read: () => (select.value === "" ? undefined : schema.enum[Number(select.value)]) };
  }
  if (kind === "boolean") {
    const input = h("input", { type: "checkbox", id });
    return { el: h("div", { class: "field check" }, input, label, hint), read: () => input.checked };
  }
  if (kind === "string") {
    const long = (schema.maxLength || 0) > 200 || schema.format === "textarea";
    const input = h(long ? "textarea" : "input", { id, type: long ? null : "text", maxlength: schema.maxLength, rows: long ? 3 : null, autocomplete: "off" });
    return { el: h("div", { class: "field" }, label, hint, input), read: () => (input.value === "" && !required ? undefined : input.value) };
  }
  if (kind === "number" || kind === "integer") {
    const input = h("input", { id, type: "number", inputmode: kind === "integer" ? "numeric" : "decimal", step: kind === "integer" ? "1" : "any", min: schema.minimum, max: schema.maximum });
    return {
      el: h("div", { class: "field" }, label, hint, input),
      read() {
        if (input.value === "") return undefined;
        const n = Number(input.value);
        if (!Number.isFinite(n)) throw new Error(`${title} is not a number`);
        return n;
      },
    };
  }
  if (kind === "array" && schema.items && Array.isArray(schema.items.enum) && schema.items.enum.length <= 20) {
    const boxes = schema.items.enum.map((v, i) => {
      const input = h("input", { type: "checkbox", id: `${id}-${i}`, value: String(i) });
      return h("label", { class: "choice", for: `${id}-${i}` }, input, ` ${typeof v === "string" ? v : JSON.stringify(v)}`);
    });
    const el = h("fieldset", { class: "field choices" }, h("legend", { text: title }), hint, boxes);
    return { el, read: () => Array.from(el.querySelectorAll("input:checked"), (b) => schema.items.enum[Number(b.value)]) };
  }
  // anything else (nested past the bound, anyOf, free JSON): a JSON box for this part of the answer
  const area = h("textarea", { id, rows: 3, class: "json", spellcheck: "false", placeholder: "JSON" });
  return {
    el: h("div", { class: "field" }, label, hint, area),
    read() {
      if (area.value.trim() === "") return undefined;
      try {
        return JSON.parse(area.value);
      } catch (err) {
        throw new Error(`${title} is not valid JSON: ${err.message}`);
      }
    },
  };
}

// ---- inbox cards ------------------------------------------------------------------------------------

function may(item, what) {
  const permissions = (state.inbox && state.inbox.may[item.namespace]) || (state.run && state.run.may) || {};
  return Boolean(permissions[what]);
}

function readOnlyNote(item, what) {
  const verb = what === "effects" ? "update SideEffect status" : "patch Runs";
  return h("p", { class: "readonly", text: `Read only: your Kubernetes permissions do not let you ${verb} in namespace ${item.namespace}.` });
}

async function send(card, action, body, button) {
  const out = card.querySelector(".outcome");
  const buttons = card.querySelectorAll("button.act");
  buttons.forEach((b) => { b.disabled = true; });
  card.dataset.sent = "1"; // kept on the page until its outcome is read, even once the request is gone
  out.className = "outcome wait";
  out.textContent = `${button ? button.textContent : action}: sent, waiting for the operator's verdict…`;
  let result;
  try {
    result = await api(`/api/${action}`, body);
  } catch (err) {
    return;
  }
  buttons.forEach((b) => { b.disabled = false; });
  const message = result.data.message || result.data.error || `HTTP ${result.status}`;
  out.className = `outcome ${result.data.ok ? "ok" : "bad"}`;
  out.textContent = message;
  out.setAttribute("role", result.data.ok ? "status" : "alert");
  toast(message, Boolean(result.data.ok));
  if (route()) load(); // the Run page shows what the action changed
  const waiting = state.inbox && state.inbox.items.some((i) => i.id === card.dataset.id);
  if (card.matches("article.card") && (result.data.ok || !waiting)) settle(card);
}

// A card whose request was answered (by this person or another): its outcome stays readable, its
// controls go, until the person dismisses it.
function settle(card) {
  if (card.classList.contains("settled")) return;
  card.classList.add("settled");
  card.querySelectorAll("form, .row").forEach((el) => el.remove());
  const dismiss = h("button", { type: "button", class: "link", text: "Dismiss" });
  dismiss.addEventListener("click", () => {
    card.remove();
    if (state.inbox && !route()) renderInbox();
  });
  card.append(dismiss);
}

function base(item) {
  return { namespace: item.namespace, run: item.run, requestId: item.requestId, checkpointId: item.checkpointId };
}

function questionControls(item, card) {
  const schema = item.schema;
  // Any schema the server found small enough gets a form: an object's fields, or one field for a
  // top-level string, number, boolean or choice.
  const form = item.formSchema ? field(item.formSchema, "", true, 0) : null;
  const raw = h("textarea", { class: "json raw", rows: 6, spellcheck: "false", "aria-label": "answer as JSON", hidden: form ? true : null });
  raw.value = form ? "" : "{}";
  const feedback = h("ul", { class: "problems", "aria-live": "polite" });
  const toggle = h("button", { type: "button", class: "link", text: form ? "Edit as JSON" : "" });
  if (!form) toggle.hidden = true;

  const value = () => {
    if (!raw.hidden) return JSON.parse(raw.value);
    return form.read();
  };
  const judge = () => {
    let v;
    try {
      v = value();
    } catch (err) {
      return { problems: [err.message] };
    }
    if (v === undefined || v === null) return { problems: ["an answer is required (use {} for an empty one)"] };
    return { value: v, problems: schema ? problems(v, schema) : [] };
  };
  const show = (list) => {
    feedback.replaceChildren(...list.map((p) => h("li", { text: p })));
    card.classList.toggle("invalid", list.length > 0);
  };
  toggle.addEventListener("click", () => {
    if (raw.hidden) {
      let current = {};
      try { current = form.read() ?? {}; } catch (err) { /* start from {} */ }
      raw.value = pretty(current);
      raw.hidden = false;
      form.el.hidden = true;
      toggle.textContent = "Use the form";
      raw.focus();
    } else {
      raw.hidden = true;
      form.el.hidden = false;
      toggle.textContent = "Edit as JSON";
    }
    show([]);
  });
  const submit = h("button", { type: "submit", class: "act primary", text: "Send answer" });
  const el = h("form", { class: "answer", novalidate: true }, form ? form.el : null, raw, h("div", { class: "row" }, submit, toggle), feedback);
  el.addEventListener("input", () => { card.dataset.dirty = "1"; if (card.classList.contains("invalid")) show(judge().problems); });
  el.addEventListener("change", () => { card.dataset.dirty = "1"; });
  el.addEventListener("submit", (event) => {
    event.preventDefault();
    const verdict = judge();
    show(verdict.problems);
    if (verdict.problems.length) {
      const first = el.querySelector("input, select, textarea:not([hidden])");
      if (first) first.setAttribute("aria-invalid", "true");
      return;
    }
    send(card, "answer", { ...base(item), value: verdict.value }, submit);
  });
  return el;
}

function keyValue(rows) {
  return h("dl", { class: "kv" }, rows.filter(([, v]) => v !== null && v !== undefined && v !== "").map(([k, v]) => [h("dt", { text: k }), h("dd", {}, typeof v === "string" ? v : v)]));
}

function approvalControls(item, card) {
  const a = item.approval || {};
  const details = keyValue([
    ["Tool", a.tool],
    ["Target", a.target],
    ["Idempotency key", a.idempotencyKey],
    ["Can be undone", a.reversible === false ? "no: irreversible" : a.reversible === true ? "yes" : null],
    ["Digest", a.requestDigest],
    ["Recomputed", a.recomputedDigest],
    ["Stored at", a.reference],
  ]);
  const request = "request" in a ? h("details", { open: true }, h("summary", { text: "Request" }), h("pre", { class: "json", text: pretty(a.request) })) : null;
  const verdict = a.verified
    ? h("p", { class: "verified", text: "✓ The digest matches the request shown (RFC 8785, recomputed here)." })
    : h("p", { class: "warning", role: "note", text: a.problem || "The request could not be verified." });
  const controls = h("div", { class: "row" });
  if (may(item, "runs")) {
    if (a.verified) {
      const approve = h("button", { type: "button", class: "act primary", text: "Approve" });
      approve.addEventListener("click", () => send(card, "approve", { ...base(item), approved: true }, approve));
      controls.append(approve);
    }
    const deny = h("button", { type: "button", class: "act danger", text: "Deny" });
    deny.addEventListener("click", () => send(card, "approve", { ...base(item), approved: false }, deny));
    controls.append(deny);
  }
  return h("div", {}, details, request, verdict, may(item, "runs") ? controls : readOnlyNote(item, "runs"));
}

function sendsTable(sends) {
  if (!sends.length) return h("p", { class: "muted", text: "No send recorded." });
  return h("table", { class: "grid" },
    h("thead", {}, h("tr", {}, ["Send", "Attempt", "Time", "Outcome", "Reference", "Message"].map((t) => h("th", { text: t })))),
    h("tbody", {}, sends.map((s) => h("tr", {}, [s.sendId, s.attempt, s.time, s.outcome || "no answer", s.reference, s.message].map((v) => h("td", { text: v === undefined || v === null ? "" : String(v) }))))));
}

function reconcileControls(item, card) {
  const details = keyValue([
    ["Tool", item.tool],
    ["Target", item.target],
    ["Idempotency key", item.idempotencyKey],
    ["State", item.state],
    ["Can be undone", item.reversible ? "yes" : "no: irreversible"],
    ["Sends", `${item.sends.length} of at most ${item.maxSends}`],
  ]);
  const history = item.history && item.history.length
    ? h("details", {}, h("summary", { text: "Lookups and history" }), h("ul", { class: "history" }, item.history.map((e) => h("li", { text: `${e.time} ${e.state}${e.message ? `: ${e.message}` : ""}` }))))
    : null;
  const parts = [details, h("h3", { text: "What was sent" }), sendsTable(item.sends), history];
  if (!may(item, "effects")) return h("div", {}, parts, readOnlyNote(item, "effects"));
  const id = `v${++fieldIds}`;
  const verdicts = [
    ["confirmed", "Confirmed: it happened"],
    ["failed", "Failed: it did not happen, never send it again"],
    ["absent", "Absent: it did not happen, a later Attempt may send it again"],
  ].map(([value, text], i) => h("label", { class: "choice", for: `${id}-${i}` }, h("input", { type: "radio", name: id, id: `${id}-${i}`, value }), ` ${text}`));
  const reference = h("input", { type: "text", id: `${id}-ref`, autocomplete: "off" });
  const reason = h("input", { type: "text", id: `${id}-why`, autocomplete: "off" });
  const retry = h("input", { type: "checkbox", id: `${id}-retry`, checked: true });
  const submit = h("button", { type: "submit", class: "act primary", text: "Record verdict" });
  const again = h("button", { type: "button", class: "act", text: "Send again" });
  const feedback = h("ul", { class: "problems", "aria-live": "polite" });
  const form = h("form", { class: "answer", novalidate: true },
    h("fieldset", { class: "field choices" }, h("legend", { text: "What happened?" }), verdicts),
    h("div", { class: "field" }, h("label", { for: `${id}-ref`, text: "Reference in the external system (needed for Confirmed)" }), reference),
    h("div", { class: "field" }, h("label", { for: `${id}-why`, text: "Why (recorded)" }), reason),
    h("div", { class: "field check" }, retry, h("label", { for: `${id}-retry`, text: "Then retry the Run" })),
    h("div", { class: "row" }, submit, again), feedback);
  const body = (verdict) => ({ namespace: item.namespace, effect: item.effect, verdict, reference: reference.value || null, reason: reason.value || null, retry: retry.checked });
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const chosen = form.querySelector(`input[name="${id}"]:checked`);
    const list = [];
    if (!chosen) list.push("choose what happened");
    else if (chosen.value === "confirmed" && !reference.value) list.push("Confirmed needs the reference the external system gave the action");
    feedback.replaceChildren(...list.map((p) => h("li", { text: p })));
    if (!list.length) send(card, "resolve", body(chosen.value), submit);
  });
  form.addEventListener("input", () => feedback.replaceChildren()); // judged again at the next send
  again.addEventListener("click", () => send(card, "resolve", { ...body("absent"), retry: true }, again));
  return h("div", {}, parts, form);
}

function simpleControl(item, card, action, label, extra = {}) {
  if (!may(item, "runs")) return readOnlyNote(item, "runs");
  const button = h("button", { type: "button", class: "act primary", text: label });
  button.addEventListener("click", () => send(card, action, { ...base(item), ...extra }, button));
  return h("div", { class: "row" }, button);
}

const KIND_LABEL = { question: "Question", approval: "Approval", reconcile: "Reconcile", pause: "Paused", retry: "Retry" };

function card(item) {
  const el = h("article", { class: `card ${item.kind}`, tabindex: "-1", "data-id": item.id, "data-kind": item.kind });
  const title = h("h2", {},
    h("span", { class: `badge ${item.kind}`, text: KIND_LABEL[item.kind] || item.kind }), " ",
    h("a", { href: runPath(item.namespace, item.run), "data-route": true, text: item.run }),
    h("span", { class: "ns", text: ` ${item.namespace}` }));
  const meta = h("p", { class: "meta" },
    h("span", { text: item.reason }),
    item.requestId ? h("span", { class: "mono", text: item.requestId }) : null,
    h("span", {}, "waiting ", h("span", { class: "age", "data-since": item.since || "" })),
    item.expiresAt ? h("span", { class: "expiry" }, "expires in ", h("span", { class: "countdown", "data-expires": item.expiresAt })) : null,
    item.heldBy ? h("span", { class: "held", text: `held by ${item.heldBy}` }) : null);
  const prompt = item.prompt ? h("p", { class: "prompt", text: item.prompt }) : null;
  let controls;
  if (item.kind === "question") controls = may(item, "runs") ? questionControls(item, el) : readOnlyNote(item, "runs");
  else if (item.kind === "approval") controls = approvalControls(item, el);
  else if (item.kind === "reconcile") controls = reconcileControls(item, el);
  else if (item.kind === "pause") controls = simpleControl(item, el, "release", "Release");
  else controls = simpleControl(item, el, "retry", "Retry", { reason: "reconciled in the console" });
  el.append(...[title, meta, prompt, controls, h("p", { class: "outcome", "aria-live": "polite" })].filter(Boolean));
  el.dataset.signature = JSON.stringify(item);
  return el;
}

// Puts `nodes` in `container` in that order, moving only what is out of place: a card that stays
// where it was is never detached (the person may be clicking it).
function place(container, nodes) {
  nodes.forEach((node, i) => {
    const at = container.children[i];
    if (at !== node) container.insertBefore(node, at || null);
  });
  while (container.children.length > nodes.length) container.lastElementChild.remove();
}

function tick() {
  const now = serverNow();
  for (const el of document.querySelectorAll("[data-since]")) {
    const since = Date.parse(el.dataset.since);
    el.textContent = Number.isNaN(since) ? "" : duration((now - since) / 1000);
  }
  for (const el of document.querySelectorAll("[data-expires]")) {
    const left = (Date.parse(el.dataset.expires) - now) / 1000;
    el.textContent = left > 0 ? duration(left) : "expired";
    el.parentElement.classList.toggle("soon", left < 300);
  }
}

function matches(item, filter) {
  if (!filter) return true;
  const text = [item.namespace, item.run, item.kind, item.reason, item.prompt, item.requestId, item.tool, item.effect].join(" ").toLowerCase();
  return filter.toLowerCase().split(/\s+/).every((word) => text.includes(word));
}

function renderInbox() {
  const data = state.inbox;
  const main = $("#main");
  let view = $("#inbox", main);
  if (!view) {
    const filter = h("input", { type: "search", id: "filter", placeholder: "Filter: run, namespace, kind, words of the prompt  ( / )", "aria-label": "filter the inbox", value: state.filter });
    filter.addEventListener("input", () => { state.filter = filter.value; state.shown = PAGE; renderInbox(); });
    view = h("section", { id: "inbox", "aria-label": "inbox" }, h("div", { class: "tools" }, filter), h("div", { id: "notes" }), h("div", { id: "cards" }), h("div", { id: "more" }));
    main.replaceChildren(view);
  }
  const notes = data.problems.map((p) => h("p", { class: "warning", text: `${p}. Ask for read access, or start the console with --namespaces.` }));
  $("#notes", view).replaceChildren(...notes);
  const wanted = data.items.filter((i) => matches(i, state.filter));
  const shown = wanted.slice(0, state.shown);
  $("#count").textContent = data.items.length ? String(data.items.length) : "";
  document.title = data.items.length ? `(${data.items.length}) agentrun console` : "agentrun console";

  const cards = $("#cards", view);
  const existing = new Map(Array.from(cards.children, (c) => [c.dataset.id, c]));
  const next = shown.map((item) => {
    const old = existing.get(item.id);
    existing.delete(item.id);
    // Keep a card the person is typing in (the server judges the answer anyway); redraw changed ones.
    if (old && (old.dataset.signature === JSON.stringify(item) || old.dataset.dirty || old.dataset.sent)) return old;
    return card(item);
  });
  // Requests gone from the inbox whose card holds the person's answer (sent, or being written): kept on
  // top, with its outcome, or with what happened to the request meanwhile.
  const answered = Array.from(existing.values()).filter((c) => c.dataset.sent || c.dataset.dirty);
  answered.forEach((c) => {
    if (c.querySelector(".outcome.wait")) return;
    if (!c.dataset.sent && !c.classList.contains("settled")) {
      const out = c.querySelector(".outcome");
      out.className = "outcome bad";
      out.textContent = "This request was answered meanwhile (by someone else?) or ended: nothing of yours was sent. Its Run page says what happened.";
    }
    settle(c);
  });
  place(cards, [...answered, ...next]);
  if (!data.items.length && !answered.length) {
    cards.replaceChildren(h("div", { class: "empty" },
      h("h1", { text: "Nothing waits for you" }),
      h("p", { text: `No question, approval, pause or unknown outcome in ${data.namespaces.length ? data.namespaces.join(", ") : "the namespaces you can see"}.` }),
      h("p", { text: "New requests appear here as agents ask; this page updates by itself." })));
  } else if (!wanted.length && !answered.length) {
    cards.replaceChildren(h("p", { class: "empty", text: `No request matches “${state.filter}”.` }));
  }
  const rest = wanted.length - shown.length;
  const more = $("#more", view);
  more.replaceChildren();
  if (rest > 0) {
    const button = h("button", { type: "button", class: "link", text: `Show ${Math.min(rest, PAGE)} more (${rest} not shown)` });
    button.addEventListener("click", () => { state.shown += PAGE; renderInbox(); });
    more.append(button);
  }
  tick();
  if (!document.body.dataset.ready) {
    document.body.dataset.ready = "1";
    performance.mark("inbox-usable");
  }
}

// ---- the Run page -----------------------------------------------------------------------------------

function runControls(page) {
  if (!page.may.runs) return readOnlyNote({ namespace: page.namespace }, "runs");
  const reason = h("input", { type: "text", id: "control-reason", autocomplete: "off", placeholder: "why (recorded with the request)" });
  const holder = h("section", { class: "card controls", "data-id": "controls" }, h("h2", { text: "Controls" }),
    h("div", { class: "field" }, h("label", { for: "control-reason", text: "Reason" }), reason));
  const row = h("div", { class: "row" });
  const button = (label, action, extra, cls = "act") => {
    const b = h("button", { type: "button", class: cls, text: label });
    b.addEventListener("click", () => {
      if (action === "cancel" && b.dataset.armed !== "1") {
        b.dataset.armed = "1";
        b.textContent = "Really cancel?";
        return;
      }
      send(holder, action, { namespace: page.namespace, run: page.name, reason: reason.value || null, ...extra() }, b);
    });
    row.append(b);
  };
  const phase = page.phase;
  if (!page.stopped) button("Cancel run", "cancel", () => ({}), "act danger");
  if (phase === "Failed" || phase === "NeedsReconciliation") {
    const from = h("select", { id: "from-checkpoint", "aria-label": "retry from checkpoint" }, h("option", { value: "", text: "from the latest checkpoint" }), page.checkpoints.map((c) => h("option", { value: c, text: `from ${c}` })));
    row.append(from);
    button("Retry", "retry", () => ({ fromCheckpoint: from.value || null }));
  }
  if (["Succeeded", "Failed", "Cancelled", "NeedsReconciliation"].includes(phase)) button("Compensate", "compensate", () => ({}));
  if (!page.stopped && !page.pending) button("Pause", "pause", () => ({}));
  holder.append(row, h("p", { class: "outcome", "aria-live": "polite" }));
  return row.children.length ? holder : null;
}

function renderRun(page) {
  state.run = page;
  const main = $("#main");
  const pending = page.pending ? card(page.pending) : null;
  const timeline = h("table", { class: "grid timeline" },
    h("thead", {}, h("tr", {}, h("th", { text: "Time (UTC)" }), h("th", { text: "What" }), h("th", { text: "Detail" }))),
    h("tbody", {}, page.timeline.map((e) => h("tr", {}, h("td", { class: "mono", text: e.time.replace("T", " ").replace("Z", "") }), h("td", { text: e.what }), h("td", { text: e.detail })))));
  const effects = page.effects.length
    ? h("table", { class: "grid effects" },
      h("thead", {}, h("tr", {}, ["Name", "Tool", "Target", "State", "Reference", "Reversible", "Sends", "Approved by", "Resolved by"].map((t) => h("th", { text: t })))),
      h("tbody", {}, page.effects.map((e) => h("tr", {}, [e.name, e.tool, e.target, e.state, e.reference, e.reversible ? "yes" : "no", `${e.sends}/${e.maxSends}`, e.approvedBy, e.resolvedBy].map((v) => h("td", { text: v === null || v === undefined ? "" : String(v) }))))))
    : h("p", { class: "muted", text: "No side effects recorded." });
  main.replaceChildren(h("section", { id: "run", "aria-label": `run ${page.name}` },
    h("p", { class: "crumbs" }, h("a", { href: "/", "data-route": true, text: "Inbox" }), ` / ${page.namespace} / `),
    h("h1", { text: page.name }),
    h("p", { class: `phase ${page.phase}`, text: page.phaseLine }),
    keyValue([["Checkpoint", page.latestCheckpoint], ["Trace id", page.traceId]]),
    pending, runControls(page),
    h("h2", { text: "Timeline" }), timeline,
    h("h2", { text: "Side effects" }), effects,
    h("h2", { text: "Report" }), h("pre", { class: "report", text: page.report }),
    h("details", {}, h("summary", { text: "As kubectl agentrun describe prints it" }), h("pre", { class: "report", text: page.describe }))));
  document.title = `${page.name}: ${page.phase} · agentrun console`;
  tick();
}

// ---- loading, routing, live updates -----------------------------------------------------------------

function route() {
  const match = location.pathname.match(/^\/runs\/([^/]+)\/([^/]+)$/);
  return match ? { namespace: decodeURIComponent(match[1]), name: decodeURIComponent(match[2]) } : null;
}

async function load() {
  if (state.loading) {
    state.again = true; // a change arrived while loading: load once more after this one
    return state.loading;
  }
  state.loading = (async () => {
    try {
      const where = route();
      if (where) {
        const result = await api(`/api/runs/${encodeURIComponent(where.namespace)}/${encodeURIComponent(where.name)}`);
        if (result.status !== 200) {
          $("#main").replaceChildren(h("section", { class: "empty" }, h("h1", { text: "Cannot show this Run" }), h("p", { text: result.data.error }), h("p", {}, h("a", { href: "/", "data-route": true, text: "Back to the inbox" }))));
          return;
        }
        // Not while the person types in the page or waits for a verdict (send() loads again after it).
        const view = $("#run");
        const typing = view && view.contains(document.activeElement) && ["INPUT", "SELECT", "TEXTAREA"].includes(document.activeElement.tagName);
        if (!view || !(typing || view.querySelector(".outcome.wait"))) renderRun(result.data);
      } else {
        state.run = null;
        const result = await api("/api/inbox");
        if (result.status !== 200) {
          $("#main").replaceChildren(h("section", { class: "empty" }, h("h1", { text: "The inbox cannot be shown yet" }), h("p", { class: "warning", text: result.data.error }), h("p", { text: "This page tries again by itself as soon as the console hears from the cluster." })));
          return;
        }
        state.skew = Date.parse(result.data.now) - Date.now();
        state.inbox = result.data;
        renderInbox();
      }
    } catch (err) {
      if (!(err instanceof SignedOut)) throw err;
    } finally {
      state.loading = null;
    }
    if (state.again) {
      state.again = false;
      await load();
    }
  })();
  return state.loading;
}

function navigate(path) {
  if (path !== location.pathname) history.pushState(null, "", path);
  $("#main").replaceChildren(h("p", { class: "empty", text: "Loading…" }));
  state.selected = -1;
  load().then(() => $("#main").focus({ preventScroll: true }));
}

function listen() {
  const live = $("#live");
  const loaded = (state.run || state.inbox || {}).version;
  const events = new EventSource(`/api/events?since=${Number.isInteger(loaded) ? loaded : -1}`);
  events.addEventListener("open", () => { live.textContent = "live"; live.className = "live on"; });
  events.addEventListener("changed", () => { load(); });
  events.addEventListener("expired", () => { events.close(); signedOut("The session expired."); });
  events.addEventListener("error", () => { live.textContent = "reconnecting…"; live.className = "live off"; });
}

function select(step) {
  const cards = Array.from(document.querySelectorAll("#cards .card, #run .card"));
  if (!cards.length) return;
  state.selected = Math.max(0, Math.min(cards.length - 1, state.selected + step));
  cards.forEach((c, i) => c.classList.toggle("selected", i === state.selected));
  cards[state.selected].focus();
  cards[state.selected].scrollIntoView({ block: "nearest" });
}

let pendingG = false;

function keys(event) {
  const typing = ["INPUT", "SELECT", "TEXTAREA"].includes(event.target.tagName);
  const help = $("#help");
  if (event.key === "Escape") {
    if (typing) event.target.blur();
    help.hidden = true;
    return;
  }
  if (typing || event.metaKey || event.ctrlKey || event.altKey) return;
  const cards = Array.from(document.querySelectorAll("#cards .card, #run .card"));
  const current = cards[state.selected];
  if (pendingG) {
    pendingG = false;
    if (event.key === "i") navigate("/");
    return;
  }
  if (event.key === "j") select(1);
  else if (event.key === "k") select(-1);
  else if (event.key === "g") pendingG = true;
  else if (event.key === "/") {
    const filter = $("#filter");
    if (filter) { event.preventDefault(); filter.focus(); }
  } else if (event.key === "?") {
    help.hidden = !help.hidden;
    $("#help-button").setAttribute("aria-expanded", String(!help.hidden));
  } else if (event.key === "Enter" && current && event.target === current) {
    const first = current.querySelector("input, select, textarea, button.act");
    if (first) { event.preventDefault(); first.focus(); }
  } else if (event.key === "o" && current) {
    const link = current.querySelector("h2 a");
    if (link) navigate(link.getAttribute("href"));
  } else return;
}

async function start() {
  document.addEventListener("click", (event) => {
    const link = event.target.closest("a[data-route]");
    if (!link || event.button !== 0 || event.metaKey || event.ctrlKey || event.shiftKey) return;
    event.preventDefault();
    navigate(link.getAttribute("href"));
  });
  window.addEventListener("popstate", () => navigate(location.pathname));
  document.addEventListener("keydown", keys);
  $("#help-button").addEventListener("click", () => {
    const help = $("#help");
    help.hidden = !help.hidden;
    $("#help-button").setAttribute("aria-expanded", String(!help.hidden));
  });
  $("#toast").addEventListener("click", () => { $("#toast").hidden = true; });
  let session;
  try {
    session = await api("/api/session");
  } catch (err) {
    return; // signed out: said so
  }
  if (session.status !== 200) {
    signedOut(session.data.error, session.data.proxied);
    return;
  }
  state.csrf = session.data.csrf;
  state.user = session.data.user;
  $("#who").textContent = session.data.user ? `as ${session.data.user}` : "";
  await load();
  listen();
  setInterval(tick, 1000);
}

start();
