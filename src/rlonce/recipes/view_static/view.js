// rlonce view: the page of `rlonce view RUN`. Plain JS, no build step, nothing fetched from elsewhere.
// Every text of the run is hostile (the policy wrote it): it only ever reaches the page as text
// nodes (el() below), never as markup. The address names what is open (route() below), so a
// step, a sequence and its context can be linked to and reopened.
"use strict";

const state = { run: null, step: null, ctx: null, ctxIndex: 0, rows: [], seq: null, mode: "version", ticket: 0 };
const $ = (id) => document.getElementById(id);

function el(tag, props, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(props || {})) {
    if (k === "class") node.className = v;
    else if (k === "data") Object.assign(node.dataset, v);
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node[k] = v;
  }
  for (const c of children.flat()) {
    if (c !== null && c !== undefined) node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

function fmt(x, d = 3) {
  if (x === null || x === undefined) return "—";
  if (typeof x !== "number") return String(x);
  return x !== 0 && Math.abs(x) < 10 ** -d ? x.toExponential(2) : String(+x.toFixed(d));
}

async function api(path) {
  const r = await fetch(path, { headers: { Accept: "application/json" } });
  if (!r.ok) throw new Error(`${path}: ${r.status}`);
  return r.json();
}

function say(text) { $("status").textContent = text; }

// ---- loading: #loading shows what is being fetched while anything is --------------------------
let pending = 0;

async function busy(text, work) {
  pending += 1;
  $("loading").textContent = text;
  $("loading").hidden = false;
  try {
    return await work;
  } finally {
    pending -= 1;
    if (!pending) $("loading").hidden = true;
  }
}

function placeholder(text) { return el("div", { class: "loading-note" }, el("span", { class: "spinner" }), text); }

// ---- the address: #/step/S[/group/G/seq/Q[/context/C]], #/compare/A/B or #/plots ----------------
let following = false;

function route() {
  if (!$("pane-plots").hidden) return "#/plots";
  if (!$("pane-compare").hidden) return `#/compare/${$("compare-a").value}/${$("compare-b").value}`;
  if (!state.step) return "";
  let h = `#/step/${state.step.step}`;
  if (state.seq) h += `/group/${state.seq.g.index}/seq/${state.seq.q.index}`;
  if (state.seq && state.ctxIndex > 0) h += `/context/${state.ctxIndex + 1}`;
  return h;
}

function remember() { // a new history entry for what the user opened (none while following an address)
  const h = route();
  if (!following && h && h !== location.hash) history.pushState(null, "", h);
}

function parseRoute(hash) {
  let m = hash.match(/^#\/step\/(\d+)(?:\/group\/(\d+)\/seq\/(\d+)(?:\/context\/(\d+))?)?\/?$/);
  if (m) {
    return { pane: "steps", step: +m[1], group: m[2] === undefined ? null : +m[2], seq: m[3] === undefined ? null : +m[3],
      context: m[4] === undefined ? 1 : +m[4] };
  }
  m = hash.match(/^#\/compare\/(\d+)\/(\d+)\/?$/);
  if (m) return { pane: "compare", a: m[1], b: m[2] };
  return hash === "#/plots" ? { pane: "plots" } : null;
}

async function follow(hash) { // open what the address names; an address naming nothing here opens the first step
  const r = parseRoute(hash);
  const steps = state.run.steps.map((s) => s.step);
  following = true;
  try {
    if (r && r.pane === "plots") showPane("plots");
    else if (r && r.pane === "compare") {
      for (const [id, v] of [["compare-a", r.a], ["compare-b", r.b]]) if (steps.includes(+v)) $(id).value = v;
      showPane("compare");
    } else {
      showPane("steps");
      if (r && !steps.includes(r.step)) say(`step ${r.step} is not stored in this run; showing step ${steps[0]}`);
      const step = r && steps.includes(r.step) ? r.step : steps[0];
      if (step === undefined) return;
      if (!state.step || state.step.step !== step) await openStep(step);
      else if (r && r.group === null) closeSeq();
      if (r && r.group !== null) {
        const g = state.step.groups.find((x) => x.index === r.group);
        const q = g && g.sequences.find((x) => x.index === r.seq);
        if (q) await openSeq(g, q, r.context - 1);
        else say(`step ${step} has no group ${r.group} sequence #${r.seq}`);
      }
    }
  } finally {
    following = false;
  }
  const h = route();
  if (h && h !== location.hash) history.replaceState(null, "", h);
}

// ---- steps -------------------------------------------------------------------------------
async function loadRun() {
  state.run = await busy("loading the run…", api("/api/run"));
  $("title").textContent = `rlonce view: ${state.run.run}`;
  const body = $("steps").tBodies[0];
  body.replaceChildren(...state.run.steps.map((s) => el("tr", { data: { step: s.step }, onclick: () => openStep(s.step).catch((e) => say(String(e))) },
    el("td", {}, s.step), el("td", {}, fmt(s.metrics.reward_mean)), el("td", {}, fmt(s.metrics.success_rate)),
    el("td", {}, fmt(s.metrics.trained_tokens, 0)))));
  for (const id of ["compare-a", "compare-b"]) {
    $(id).replaceChildren(...state.run.steps.map((s) => el("option", { value: s.step }, `step ${s.step}`)));
  }
  if (state.run.steps.length) $("compare-b").selectedIndex = state.run.steps.length - 1;
  $("plots").replaceChildren(...state.run.plots.map((p) => el("figure", {},
    el("img", { src: `/api/plots/${p.id}.png`, alt: p.title, loading: "lazy" }), el("figcaption", {}, p.title))));
  if (state.run.steps.length) await follow(location.hash);
  else say("this run has no stored steps (rollouts/ is empty)");
}

async function openStep(step) {
  $("groups").replaceChildren(placeholder(`loading step ${step}…`));
  state.step = await busy(`loading step ${step}…`, api(`/api/steps/${step}`));
  for (const tr of $("steps").tBodies[0].rows) tr.classList.toggle("selected", +tr.dataset.step === step);
  closeSeq();
  const s = state.step;
  $("step-title").textContent = `Step ${s.step}: groups`;
  const m = s.metrics;
  $("step-info").replaceChildren(el("div", {}, `trains policy version ${s.train_version}; staleness `,
    Object.entries(s.staleness).map(([k, v]) => `${k} ${v}`).join(", "),
    `; reward ${fmt(m.reward_mean)}, success ${fmt(m.success_rate)}, entropy ${fmt(m.entropy)}, `,
    `mismatch KL ${fmt(m.mismatch_kl, 6)}, clipped ${fmt(m.clipfrac)}`),
    el("div", {}, "ledger: ", s.ledger.map((e) =>
      `${e.source}: dispatched ${e.dispatched}, retained ${e.retained}, filtered ${e.no_contrast_filtered}, ` +
      `rejected ${e.penalty_rejected}, unfinished ${e.unfinished_dropped ?? 0}, stale ${e.stale_dropped}, infra ${e.infra_failed}`).join(" | ")),
    ...(s.trained_nothing ? [el("div", { class: "note" }, "no row trained at this step: its untrained sequences are " +
      "all stored (runs made before this rule kept a sample)")] : []));
  fillFilters();
  renderGroups();
  remember();
}

function closeSeq() {
  state.seq = null;
  state.ctx = null;
  state.ctxIndex = 0;
  state.ticket += 1;
  $("context-title").textContent = "Sequence";
  $("context-info").textContent = "pick a sequence on the left";
  for (const id of ["context-tabs", "context", "legend"]) $(id).replaceChildren();
}

// ---- filters -----------------------------------------------------------------------------
const FILTERS = { "f-source": (g) => g.source, "f-arm": (g, q) => q.arm, "f-status": (g, q) => q.status,
  "f-failure": (g, q) => q.failure };

function fillFilters() {
  for (const [id, get] of Object.entries(FILTERS)) {
    const seen = new Set();
    for (const g of state.step.groups) for (const q of g.sequences) seen.add(String(get(g, q) ?? "none"));
    const keep = $(id).value;
    $(id).replaceChildren(el("option", { value: "" }, "any"), [...seen].sort().map((v) => el("option", { value: v }, v)));
    if (seen.has(keep)) $(id).value = keep;
  }
}

function visible(g, q) {
  for (const [id, get] of Object.entries(FILTERS)) {
    if ($(id).value && String(get(g, q) ?? "none") !== $(id).value) return false;
  }
  const lo = $("f-reward-min").value, hi = $("f-reward-max").value;
  if (lo !== "" && !(q.reward !== null && q.reward >= +lo)) return false;
  if (hi !== "" && !(q.reward !== null && q.reward <= +hi)) return false;
  return g.kind === "trained" || $("f-untrained").checked;
}

function renderGroups() {
  let shown = 0, total = 0;
  const cards = [];
  for (const g of state.step.groups) {
    total += g.sequences.length;
    const seqs = g.sequences.filter((q) => visible(g, q));
    shown += seqs.length;
    if (!seqs.length) continue;
    cards.push(el("div", { class: `group ${g.kind}`, data: { group: g.index } },
      el("div", { class: "group-head" }, g.task_id, g.kind === "trained" ? "" : state.step.trained_nothing ? " (untrained, all stored)" : " (untrained sample)"),
      el("div", { class: "group-meta" }, `source ${g.source ?? "?"}`,
        g.kind === "trained" ? `, dispatched at step ${g.dispatch_step}, retained; scores [${(g.scores || []).map((x) => fmt(x)).join(", ")}]`
          + `, advantages [${(g.advantages || []).map((x) => fmt(x)).join(", ")}]` : ", not trained"),
      explain(g), seqs.map((q) => seqRow(g, q))));
  }
  $("groups").replaceChildren(...cards);
  $("filter-count").textContent = `showing ${shown} of ${total} sequences`;
}

function explain(g) { // how the group's advantages came about (view_data.explain_group)
  return el("dl", { class: "explain" }, (g.explain || []).flatMap(([what, text]) => [el("dt", {}, what), el("dd", {}, text)]));
}

function seqRow(g, q) {
  const tokens = g.kind === "trained" ? `${q.tokens} tok, ${q.trained_tokens} trained`
    : `${q.tokens} tok, ${q.model_tokens} from the model`;
  return el("div", { class: "seq", data: { group: g.index, seq: q.index },
    onclick: () => openSeq(g, q).catch((e) => say(String(e))) },
    el("span", {}, `#${q.index}`), el("span", { class: `badge st-${q.status}` }, q.status),
    el("span", {}, `reward ${fmt(q.reward)}`), el("span", {}, `adv ${fmt(q.advantage)}`),
    el("span", {}, q.arm), el("span", {}, tokens),
    q.failure ? el("span", {}, `failure ${q.failure}`) : null, q.retained ? null : el("span", {}, "not trained"));
}

// ---- a sequence's contexts ---------------------------------------------------------------
async function openSeq(g, q, context = 0) {
  for (const n of document.querySelectorAll(".seq")) {
    n.classList.toggle("selected", +n.dataset.group === g.index && +n.dataset.seq === q.index);
  }
  state.seq = { g, q };
  $("context-title").textContent = `Step ${state.step.step}, ${g.task_id}, sequence #${q.index}`;
  $("context-tabs").replaceChildren(...q.rows.map((r, i) => el("button", { type: "button", class: "ctx-tab",
    data: { context: i }, onclick: () => openContext(g.kind, i).catch((e) => say(String(e))) }, `context ${i + 1}`)));
  if (q.rows.length) await openContext(g.kind, Math.min(Math.max(context, 0), q.rows.length - 1));
  else {
    state.ctx = null;
    state.ctxIndex = 0;
    state.ticket += 1;
    $("context-info").textContent = "no stored context: this sequence was not made a row (not trained, not sampled)";
    $("context").replaceChildren(verdict(q));
    $("legend").replaceChildren();
    remember();
  }
}

function describe(c) { // a context's token counts, worded so that "not trained" and "trained" never meet
  const rest = `the other ${c.tokens - c.model_tokens} are prompt and tool output`;
  if (c.kind === "untrained") {
    return `untrained row ${c.row}: ${c.tokens} tokens, of which ${c.model_tokens} sampled from the model and ` +
      `none trained (this sequence was not in the step's batch); ${rest}`;
  }
  const masked = c.model_tokens - c.trained_tokens;
  return `row ${c.row}: ${c.tokens} tokens, of which ${c.trained_tokens} model tokens trained` +
    (masked > 0 ? ` (${masked} more sampled but masked)` : "") + `; ${rest}, never trained. Row weight ${fmt(c.weight)}`;
}

async function openContext(kind, i) {
  const part = kind === "untrained" ? "untrained" : "rows";
  const row = state.seq.q.rows[i], ticket = ++state.ticket;
  state.ctxIndex = i;
  for (const b of document.querySelectorAll(".ctx-tab")) b.classList.toggle("active", +b.dataset.context === i);
  remember();
  $("context-info").textContent = "";
  $("legend").replaceChildren();
  $("context").replaceChildren(placeholder("loading the context… (the first one also loads the run's tokenizer: " +
    "a few seconds)"));
  const c = await busy("loading a context…", api(`/api/steps/${state.step.step}/${part}/${row}`));
  if (ticket !== state.ticket) return; // another sequence or context was opened meanwhile
  state.ctx = c;
  $("context-info").textContent = `${describe(c)}; trains version ${c.train_version}; text from ${c.tokenizer}`;
  renderContext();
}

function renderContext() {
  const c = state.ctx;
  if (!c) return;
  const color = COLOURS[state.mode](c);
  const turns = c.segments.map((s, n) => {
    const head = el("div", { class: "turn-head" }, s.role === "model" ? "model turn" : s.role,
      ` (tokens ${s.start}–${s.end - 1})`);
    if (s.role === "model") {
      for (const call of s.tool_calls) head.append(el("div", { class: "tool-call" }, `tool call: ${call.name} ${call.arguments}`));
      if (s.flag) head.append(el("div", { class: "tool-call" }, s.flag));
    }
    const toks = [];
    for (let i = s.start; i < s.end; i++) {
      const t = el("span", { class: "tok", data: { i } }, c.pieces[i]);
      const bg = color.of(i);
      if (bg) t.style.backgroundColor = bg;
      toks.push(t);
    }
    return el("div", { class: `turn turn-${s.role}`, data: { turn: n } }, head, el("div", { class: "tokens" }, toks));
  });
  $("context").replaceChildren(...turns, verdict(c.outcome || state.seq.q));
  $("legend").replaceChildren(...color.legend);
}

function verdict(o) {
  const metrics = Object.entries(o.metrics || {}).map(([k, v]) => `${k} ${fmt(v)}`).join(", ");
  return el("div", { class: "verdict", id: "verdict" }, el("span", { class: "verdict-head" }, "grader verdict: "),
    `status ${o.status}, reward ${fmt(o.reward)}, passed ${o.passed ? "yes" : "no"}, hack confirmed `,
    `${o.hack_confirmed ? "yes" : "no"}, turns ${o.turns}, failure ${o.failure ?? "none"}`,
    o.cause ? `, cause: ${o.cause}` : "", el("div", {}, metrics),
    o.transcript ? el("pre", { class: "transcript" }, o.transcript) : "");
}

function hover(ev) {
  const t = ev.target.closest(".tok");
  const c = state.ctx;
  if (!t || !c) return;
  const i = +t.dataset.i, tr = c.trainer_logprobs, lp = c.rollout_logprobs[i];
  const gap = tr && tr[i] !== null && lp !== null ? tr[i] - lp : null;
  $("hover").textContent = `token ${i}: id ${c.token_ids[i]} ${JSON.stringify(c.pieces[i])} | loss mask ${c.loss_mask[i]}` +
    ` | version ${c.versions[i] < 0 ? "not sampled" : c.versions[i]} | rollout log-prob ${fmt(lp, 4)}` +
    ` | trainer log-prob ${tr ? fmt(tr[i], 4) : "not recorded"} | gap ${fmt(gap, 4)}` +
    ` | IS ratio ${gap === null ? "—" : fmt(Math.exp(gap), 4)} | advantage ${fmt(c.advantages[i], 4)}` +
    (c.candidates[i] > 0 ? ` | candidates ${c.candidates[i]}` : "") +
    (c.teacher_logprobs && c.teacher_logprobs[i] !== null ? ` | teacher log-prob ${fmt(c.teacher_logprobs[i], 4)}` : "") +
    (c.teacher_topk && c.teacher_topk[i] ? ` | teacher top-${c.teacher_topk[i].length}: ` +
      c.teacher_topk[i].map(([p, x]) => `${JSON.stringify(p)} ${fmt(Math.exp(x), 3)}`).join(", ") : "") +
    (c.routes && c.routes[i] ? ` | experts ${c.routes[i].map((e, l) => `L${l}:${e.join("+")}`).join(" ")}` : "");
}

// ---- colour modes: each gives a colour per token and its legend ---------------------------
const GREY = "#e4e4e4";
const PALETTE = ["#8ecae6", "#ffb703", "#90be6d", "#f28482", "#b39ddb", "#f6bd60", "#84a59d", "#e5989b"];

function swatch(colour, label) {
  const s = el("span", { class: "swatch" });
  s.style.backgroundColor = colour;
  return el("span", { class: "legend-item" }, s, label);
}

function diverging(v, max) { // v in [-max, max]: red below 0, blue above
  const a = Math.min(1, Math.abs(v) / (max || 1));
  const [r, g, b] = v < 0 ? [214, 64, 69] : [42, 93, 176];
  return `rgba(${r}, ${g}, ${b}, ${0.1 + 0.5 * a})`;
}

function scale(values, max, label, shown) {
  return { of: (i) => (values[i] === null ? null : diverging(values[i], max)),
    legend: [swatch(diverging(-max, max), `${shown(-max)}`), swatch(diverging(0, max), `${shown(0)}`),
      swatch(diverging(max, max), `${shown(max)}`), el("span", { class: "legend-item" }, label),
      swatch(GREY, "uncoloured: not sampled")] };
}

function gaps(c) {
  return c.rollout_logprobs.map((lp, i) => (lp === null || c.trainer_logprobs[i] === null ? null : c.trainer_logprobs[i] - lp));
}

function notRecorded(what) {
  return { of: () => null, legend: [el("span", { class: "legend-note" },
    `${what}: not recorded in this run (it stored no trainer log-probs)`)] };
}

const COLOURS = {
  version(c) {
    const vs = [...new Set(c.versions.filter((v) => v >= 0))].sort((a, b) => a - b);
    const colour = (v) => PALETTE[vs.indexOf(v) % PALETTE.length];
    return { of: (i) => (c.versions[i] < 0 ? GREY : colour(c.versions[i])),
      legend: [...vs.map((v) => swatch(colour(v), `version ${v} (${c.train_version - v} behind the trained ${c.train_version})`)),
        swatch(GREY, "not sampled (prompt, observation)")] };
  },
  mask(c) {
    const of = (i) => (c.loss_mask[i] ? "#90be6d" : c.versions[i] >= 0 ? "#f6bd60" : GREY);
    return { of, legend: [swatch("#90be6d", "trained (mask 1)"), swatch("#f6bd60", "sampled, masked (mask 0)"),
      swatch(GREY, "not sampled (mask 0)")] };
  },
  advantage(c) {
    const vals = c.advantages.map((a, i) => (c.loss_mask[i] ? a : null));
    const max = Math.max(1e-9, ...vals.filter((v) => v !== null).map(Math.abs));
    return scale(vals, max, "advantage of trained tokens", (v) => fmt(v));
  },
  gap(c) {
    if (!c.trainer_logprobs) return notRecorded("log-prob gap");
    const g = gaps(c), max = Math.max(1e-9, ...g.filter((v) => v !== null).map(Math.abs));
    return scale(g, max, "trainer − rollout log-prob", (v) => fmt(v, 4));
  },
  ratio(c) {
    if (!c.trainer_logprobs) return notRecorded("IS ratio");
    const g = gaps(c), max = Math.max(1e-9, ...g.filter((v) => v !== null).map(Math.abs));
    return scale(g, max, "IS ratio exp(trainer − rollout), log scale", (v) => fmt(Math.exp(v), 4));
  },
};

// ---- compare two steps ---------------------------------------------------------------------
async function compare() {
  const [a, b] = await busy("loading two steps…",
    Promise.all([api(`/api/steps/${$("compare-a").value}`), api(`/api/steps/${$("compare-b").value}`)]));
  const sum = (s, key) => s.groups.reduce((n, g) => n + g.sequences.reduce((m, q) => m + (q[key] || 0), 0), 0);
  const rows = [["groups trained", (s) => s.groups.filter((g) => g.kind === "trained").length],
    ["sequences shown", (s) => s.groups.reduce((n, g) => n + g.sequences.length, 0)],
    ["stored tokens", (s) => sum(s, "tokens")], ["trained tokens (stored)", (s) => sum(s, "trained_tokens")],
    ...Object.keys({ ...a.metrics, ...b.metrics }).filter((k) => k !== "step").sort().map((k) => [k, (s) => s.metrics[k]])];
  $("compare-table").tHead.replaceChildren(el("tr", {}, el("th", {}, "metric"), el("th", {}, `step ${a.step}`),
    el("th", {}, `step ${b.step}`), el("th", {}, "B − A")));
  $("compare-table").tBodies[0].replaceChildren(...rows.map(([name, get]) => {
    const x = get(a), y = get(b);
    const d = typeof x === "number" && typeof y === "number" ? fmt(y - x, 4) : "";
    return el("tr", {}, el("td", {}, name), el("td", {}, fmt(x, 4)), el("td", {}, fmt(y, 4)), el("td", {}, d));
  }));
  for (const [id, s] of [["compare-col-a", a], ["compare-col-b", b]]) {
    $(id).replaceChildren(el("h2", {}, `Step ${s.step} (trains version ${s.train_version})`),
      ...s.groups.map((g) => el("div", { class: `group ${g.kind}` }, el("div", { class: "group-head" }, g.task_id),
        el("div", { class: "group-meta" }, `source ${g.source ?? "?"}; rewards [${g.sequences.map((q) => fmt(q.reward)).join(", ")}]`))));
  }
}

// ---- wiring ------------------------------------------------------------------------------
function showPane(name) {
  for (const p of ["steps", "compare", "plots"]) {
    $(`pane-${p}`).hidden = p !== name;
    $(`tab-${p}`).classList.toggle("active", p === name);
  }
  if (name === "compare") compare().catch((e) => say(String(e)));
  remember();
}

document.addEventListener("DOMContentLoaded", () => {
  for (const p of ["steps", "compare", "plots"]) $(`tab-${p}`).addEventListener("click", () => showPane(p));
  window.addEventListener("popstate", () => follow(location.hash).catch((e) => say(String(e))));
  for (const id of [...Object.keys(FILTERS), "f-reward-min", "f-reward-max", "f-untrained"]) {
    $(id).addEventListener("input", renderGroups);
  }
  $("mode").addEventListener("change", () => { state.mode = $("mode").value; renderContext(); });
  $("context").addEventListener("mouseover", hover);
  for (const id of ["compare-a", "compare-b"]) {
    $(id).addEventListener("change", () => { remember(); compare().catch((e) => say(String(e))); });
  }
  loadRun().catch((e) => say(String(e)));
});
