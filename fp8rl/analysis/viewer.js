// The token viewer's script (fp8rl.analysis.viewer). It only displays what the page's
// data holds (computed in Python): colours tokens by the chosen quantity, shows a token's
// numbers on hover, filters and sorts responses, lays two runs' responses side by side.
// Initial settings may come from the URL: #colour=lr&adv=neg&answer=garbled&sort=clip_low.
"use strict";

const D = JSON.parse(document.getElementById("viewer-data").textContent);
const $ = (id) => document.getElementById(id);
const NA = "n/a";
const LOW = [213, 94, 0];
const HIGH = [0, 114, 178];
const SEQ = [90, 40, 150];
// Okabe-Ito reddish purple (FP8 only), bluish green (BF16 shadow only), yellow (both)
const FP8_ONLY = [204, 121, 167];
const BF16_ONLY = [0, 158, 115];
const BOTH = [240, 228, 66];
// the categories of a category quantity: value -> [colour, white text?]
const CATEGORIES = {
  clip: { 1: [LOW, true], 2: [HIGH, true] },
  mech: { 1: [FP8_ONLY, false], 2: [BF16_ONLY, true], 3: [BOTH, false] },
};
const NO_SHADOW = "no shadow data";
const QUANT = Object.fromEntries(D.quantities.map((q) => [q.key, q]));

const state = {
  colour: D.colour, step: "all", adv: "all", reward: "all", answer: "all",
  clipped: false, sort: null, dir: "desc",
};
for (const part of location.hash.replace(/^#/, "").split("&")) {
  const [key, value] = part.split("=").map(decodeURIComponent);
  if (key in state && value !== undefined) {
    state[key] = key === "clipped" ? value === "1" || value === "true" : value;
  }
}

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v;
    else if (k === "text") node.textContent = v;
    else node.setAttribute(k, v);
  }
  for (const child of children) node.append(child);
  return node;
}

function fmt(v) {
  if (v === null || v === undefined) return NA;
  if (typeof v === "boolean") return v ? "yes" : "no";
  if (typeof v === "number") return Number.isInteger(v) ? String(v) : String(+v.toPrecision(4));
  return String(v);
}

function mix(rgb, a) {
  const c = rgb.map((x) => Math.round(255 + (x - 255) * a));
  return `rgb(${c[0]}, ${c[1]}, ${c[2]})`;
}

// [background, dark text?] of a value of quantity q
function paint(q, v) {
  if (v === null || v === undefined) return ["#e6e6e6", false];
  if (q.kind === "category") {
    const c = CATEGORIES[q.key][v];
    return c ? [mix(c[0], 1), c[1]] : ["transparent", false];
  }
  const hi = q.hi || 1;
  if (q.kind === "sequential") {
    const a = Math.min(Math.max(v / hi, 0), 1);
    return [mix(SEQ, 0.85 * a), a > 0.6];
  }
  const a = Math.max(-1, Math.min(1, v / hi));
  return [mix(a < 0 ? LOW : HIGH, 0.9 * Math.abs(a)), Math.abs(a) > 0.6];
}

function tokenValue(resp, j, key) {
  return key === "adv" ? resp.summary.adv : resp[key][j];
}

// ---------------------------------------------------------------- header and controls

function header() {
  const head = $("head");
  head.append(el("h1", { text: D.title }));
  D.runs.forEach((run, r) => {
    const side = D.mode === "compare" ? `${r === 0 ? "left" : "right"}: ${run.label}; ` : "";
    head.append(el("p", { text: `${side}run ${run.run_id} of experiment ${run.experiment}` }));
    const steps = Object.entries(run.steps).map(([s, info]) =>
      `step ${s}: L = ${fmt(info.clip_low)}, H = ${fmt(info.clip_high)}` +
      ` (${info.responses} responses, format ${info.format}; ` +
      (info.shadow ? `clipped FP8 only ${info.fp8_only}, BF16 only ${info.bf16_only})` : `${NO_SHADOW})`));
    head.append(el("p", { text: steps.join("; ") || "no sample dumps" }));
    const bare = Object.entries(run.steps).filter(([, info]) => !info.shadow).map(([s]) => s);
    if (bare.length) {
      head.append(el("p", {
        class: "note",
        text: `Steps ${bare.join(", ")}: ${NO_SHADOW} (dumped before the trainer recorded the ` +
          "BF16 shadow's log-probs, or by a backend that does not); the FP8-vs-BF16 " +
          "columns and colours read n/a there, not 0.",
      }));
    }
    const old = Object.entries(run.steps).filter(([, info]) => info.format < 2).map(([s]) => s);
    if (old.length) {
      head.append(el("p", {
        class: "note",
        text: `Steps ${old.join(", ")} were dumped in format 1: the batch's first responses ` +
          "(mini-batch 0, where r = 1 and nothing is clipped with trainer old log-probs); " +
          "bounds from metrics.jsonl; values the dump lacks read n/a.",
      }));
    }
  });
  if (D.mode === "compare") {
    head.append(el("p", {
      text: `${D.pairs.length} prompts dumped by both runs at the same step; ` +
        `not paired: ${D.unpaired[0]} responses left, ${D.unpaired[1]} right.`,
    }));
  }
}

function select(id, label, options, key) {
  const s = el("select", { id });
  for (const [value, text] of options) s.append(el("option", { value, text }));
  s.value = state[key];
  s.addEventListener("change", () => { state[key] = s.value; update(); });
  return el("label", {}, `${label} `, s);
}

function controls() {
  const box = $("controls");
  box.append(select("colour", "Colour by", D.quantities.map((q) => [q.key, q.label]), "colour"));
  const steps = [...new Set(D.runs.flatMap((run) => Object.keys(run.steps)))];
  steps.sort((a, b) => a - b);
  box.append(select("step", "Step", [["all", "all"], ...steps.map((s) => [s, s])], "step"));
  box.append(select("adv", "Advantage", [["all", "all"], ["neg", "A < 0"], ["pos", "A > 0"], ["zero", "A = 0"]], "adv"));
  box.append(select("reward", "Reward", [["all", "all"], ["pos", "> 0"], ["nonpos", "\u2264 0"]], "reward"));
  box.append(select("answer", "Answer", [["all", "all"], ["garbled", "garbled"], ["ok", "not garbled"], ["noboxed", "no boxed answer"]], "answer"));
  const check = el("input", { id: "clipped", type: "checkbox" });
  check.checked = !!state.clipped;
  check.addEventListener("change", () => { state.clipped = check.checked; update(); });
  box.append(el("label", {}, check, " with clipped tokens only"));
}

function legend() {
  const box = $("legend");
  box.replaceChildren();
  const q = QUANT[state.colour];
  box.append(el("b", { text: q.label }), el("span", { text: `: ${q.help}.` }));
  if (q.kind === "category") {
    const names = q.key === "mech"
      ? { 1: "clipped under FP8 only", 2: "under the BF16 shadow only", 3: "under both" }
      : { 1: "lower bound (A < 0, r < L)", 2: "upper bound (A > 0, r > H)" };
    for (const [v, text] of Object.entries(names)) {
      const chip = el("span", { class: "chip", text });
      const [bg, white] = paint(q, +v);
      chip.style.background = bg; chip.style.color = white ? "#fff" : "#000";
      box.append(chip);
    }
    if (q.key === "mech") box.append(el("span", { text: `(same bounds L, H; grey: ${NO_SHADOW})` }));
  } else {
    const bar = el("span", { class: "bar" });
    const stops = q.kind === "sequential" ? [0, 0.5, 1] : [-1, -0.5, 0, 0.5, 1];
    bar.style.background = `linear-gradient(to right, ${stops.map((s) => paint(q, s * q.hi)[0]).join(", ")})`;
    const lo = q.kind === "sequential" ? "0" : fmt(-q.hi);
    box.append(el("span", { text: lo }), bar, el("span", { text: `${fmt(q.hi)} (and beyond)` }));
  }
  box.append(el("span", { text: "Underlined bold: clipped (lower vermillion, upper blue); grey: n/a." }));
}

// ---------------------------------------------------------------- responses

function tokenSpan(r, i, j, text) {
  // newline as an arrow; a token that decodes to nothing (an id outside the vocabulary) as
  // an empty-set sign; special tokens (<eos>, ...) in grey
  const ws = text === "\n" || text === " " || text === "" || text.startsWith("<");
  const shown = text === "\n" ? "\u21b5\n" : text === "" ? "\u2205" : text;
  const span = el("span", { class: `tok${ws ? " ws" : ""}`, "data-r": r, "data-i": i, "data-j": j, text: shown });
  const clip = D.runs[r].responses[i].clip[j];
  if (clip === 1) span.classList.add("low");
  if (clip === 2) span.classList.add("high");
  return span;
}

function badges(s) {
  const out = el("span");
  const add = (text, cls) => out.append(el("span", { class: `badge${cls ? " " + cls : ""}`, text }));
  add(`A = ${fmt(s.adv)}`);
  add(`reward ${fmt(s.reward)}`);
  add(`${s.length} tokens`);
  add(s.boxed ? "boxed" : "no boxed answer", s.boxed ? "" : "bad");
  if (s.garbled) add("garbled", "bad");
  add(`4-gram rep. ${fmt(s.repeat)}`);
  if (s.clip_low) add(`${s.clip_low} clipped low`, "low");
  if (s.clip_high) add(`${s.clip_high} clipped high`, "high");
  add(`clipped share ${fmt(s.clipped)}`);
  if (!s.shadow) add(NO_SHADOW);
  else add(`FP8 only ${s.fp8_only} \u00b7 BF16 only ${s.bf16_only}`, s.fp8_only ? "fp8" : "");
  return out;
}

function card(r, i) {
  const resp = D.runs[r].responses[i];
  const s = resp.summary;
  const where = `step ${s.step} \u00b7 prompt ${fmt(s.prompt)} \u00b7 row ${fmt(s.row)}` +
    ` (mini-batch ${fmt(s.minibatch)})${s.finished === false ? " \u00b7 cut at the length limit" : ""}`;
  const meta = el("div", { class: "meta" }, el("b", { text: where }), " ", badges(s));
  const question = el("div", { class: "meta", text: `Q: ${fmt(resp.question)}   gold answer: ${fmt(resp.answer)}` });
  const tokens = el("div", { class: "tokens" });
  resp.t.forEach((text, j) => tokens.append(tokenSpan(r, i, j, text)));
  return el("div", { class: "response", id: `resp-${r}-${i}`, "data-r": r, "data-i": i, "data-prompt": resp.prompt, "data-step": resp.step }, meta, question, tokens);
}

function recolour() {
  const q = QUANT[state.colour];
  for (const span of document.querySelectorAll(".tok")) {
    const resp = D.runs[+span.dataset.r].responses[+span.dataset.i];
    const [bg, dark] = paint(q, tokenValue(resp, +span.dataset.j, q.key));
    span.style.background = bg;
    span.style.color = dark ? "#fff" : "";
  }
  legend();
}

function shown(resp) {
  const s = resp.summary;
  if (state.step !== "all" && String(s.step) !== state.step) return false;
  const a = s.adv;
  if (state.adv === "neg" && !(a < 0)) return false;
  if (state.adv === "pos" && !(a > 0)) return false;
  if (state.adv === "zero" && a !== 0) return false;
  if (state.reward === "pos" && !(s.reward > 0)) return false;
  if (state.reward === "nonpos" && !(s.reward <= 0)) return false;
  if (state.answer === "garbled" && !s.garbled) return false;
  if (state.answer === "ok" && s.garbled) return false;
  if (state.answer === "noboxed" && s.boxed) return false;
  if (state.clipped && !(s.clip_low + s.clip_high > 0)) return false;
  return true;
}

// ---------------------------------------------------------------- inspector

function inspect(span) {
  const r = +span.dataset.r, i = +span.dataset.i, j = +span.dataset.j;
  const run = D.runs[r], resp = run.responses[i], step = run.steps[String(resp.step)] || {};
  const sides = ["no", "lower bound (gradient zeroed)", "upper bound (gradient zeroed)"];
  const clip = sides[resp.clip[j]];
  const shadow = resp.sclip[j] === null
    ? [["BF16 shadow", NO_SHADOW]]
    : [
      ["FP8 vs BF16 shadow", D.mechanism[resp.mech[j]]],
      ["BF16 shadow r_bf16", fmt(resp.sr[j])],
      ["BF16 shadow clipped", sides[resp.sclip[j]].replace(" (gradient zeroed)", "")],
      ["BF16 shadow log-prob old / new", `${fmt(resp.solp[j])} / ${fmt(resp.slp[j])}`],
    ];
  const rows = [
    ["token", JSON.stringify(resp.t[j]) + ` (#${j + 1} of ${resp.t.length})`],
    ["run", `${run.label}`],
    ["step / prompt", `${resp.step} / ${fmt(resp.prompt)}`],
    ["clipped", clip],
    ["r = pi_new / pi_old", fmt(resp.r[j])],
    ["log r", fmt(resp.lr[j])],
    ["bounds [L, H]", `[${fmt(step.clip_low)}, ${fmt(step.clip_high)}]`],
    ...shadow,
    ["advantage", fmt(resp.summary.adv)],
    ["raw IS ratio pi_old / pi_rollout", fmt(resp.is[j])],
    ["TIS weight min(ratio, C)", `${fmt(resp.w[j])} (C = ${fmt(step.tis_threshold)})`],
    ["trainer - rollout log-prob", fmt(resp.tr[j])],
    ["old log-prob (the loss's pi_old)", fmt(resp.olp[j])],
    ["rollout log-prob", fmt(resp.rlp[j])],
    ["entropy", fmt(resp.ent[j])],
  ];
  const table = el("table");
  for (const [k, v] of rows) table.append(el("tr", {}, el("td", { text: k }), el("td", { text: v })));
  $("inspect").replaceChildren(table);
}

document.addEventListener("mouseover", (e) => {
  const span = e.target.closest && e.target.closest(".tok");
  if (span) inspect(span);
});

// ---------------------------------------------------------------- the run page

function summaryTable(entries, columns, onSort) {
  const table = el("table", { class: "summary", id: "summary" });
  const head = el("tr");
  for (const [key, label, help] of columns) {
    const th = el("th", { "data-key": key, title: help, text: label });
    if (state.sort === key) th.className = `sorted${state.dir === "asc" ? " asc" : ""}`;
    th.addEventListener("click", () => onSort(key));
    head.append(th);
  }
  table.append(el("thead", {}, head));
  const body = el("tbody");
  for (const entry of entries) {
    const tr = el("tr", { class: "row", "data-key": entry.id });
    for (const [key] of columns) {
      const v = entry.values[key];
      const bad = (key === "garbled" && v === true) || (key === "boxed" && v === false) ||
        (key === "clip_low" && v > 0);
      const cell = el("td", { class: (typeof v === "string" ? "text" : "") + (bad ? " bad" : ""), text: fmt(v) });
      if (typeof v === "string") cell.title = v;  // the whole question, where it is cut
      if (v === null && /(fp8|bf16)_only$/.test(key)) cell.title = NO_SHADOW;
      tr.append(cell);
    }
    tr.addEventListener("click", () => {
      const target = $(entry.id);
      document.querySelectorAll(".focus").forEach((n) => n.classList.remove("focus"));
      target.classList.add("focus");
      target.scrollIntoView({ block: "center" });
    });
    body.append(tr);
  }
  table.append(body);
  return table;
}

function sorted(entries) {
  if (!state.sort) return entries;
  const sign = state.dir === "asc" ? 1 : -1;
  const value = (e) => {
    const v = e.values[state.sort];
    return v === null || v === undefined ? -Infinity : typeof v === "boolean" ? +v : v;
  };
  return [...entries].sort((a, b) => {
    const x = value(a), y = value(b);
    if (typeof x === "string" || typeof y === "string") return sign * String(x).localeCompare(String(y));
    return sign * (x - y);
  });
}

function sortBy(key) {
  if (state.sort === key) state.dir = state.dir === "desc" ? "asc" : "desc";
  else { state.sort = key; state.dir = "desc"; }
  update();
}

function runEntries() {
  return D.runs[0].responses.map((resp, i) => ({ id: `resp-0-${i}`, values: resp.summary, resp }));
}

function updateRun() {
  const entries = sorted(runEntries());
  const visible = entries.filter((e) => shown(e.resp));
  const main = $("responses");
  for (const e of entries) {
    const node = $(e.id);
    node.classList.toggle("hidden", !visible.includes(e));
    main.append(node);  // the cards follow the table's order
  }
  const table = summaryTable(visible, D.columns, sortBy);
  $("summary-box").replaceChildren(table);
  $("count").textContent = `${visible.length} of ${entries.length} responses shown`;
}

// ---------------------------------------------------------------- the comparison page

function pairEntries() {
  return D.pairs.map((p, k) => ({ id: `pair-${k}`, values: p.summary, pair: p }));
}

function updateCompare() {
  const entries = sorted(pairEntries());
  let shownPairs = 0;
  const main = $("responses");
  const visible = [];
  for (const e of entries) {
    const node = $(e.id);
    let any = false;
    for (const [r, side] of [[0, "left"], [1, "right"]]) {
      for (const i of e.pair[side]) {
        const ok = shown(D.runs[r].responses[i]);
        $(`resp-${r}-${i}`).classList.toggle("hidden", !ok);
        any = any || ok;
      }
    }
    node.classList.toggle("hidden", !any);
    if (any) { shownPairs += 1; visible.push(e); }
    main.append(node);
  }
  $("summary-box").replaceChildren(summaryTable(visible, D.pair_columns, sortBy));
  $("count").textContent = `${shownPairs} of ${entries.length} prompt pairs shown`;
}

function buildCompare() {
  const main = $("responses");
  D.pairs.forEach((p, k) => {
    const sides = [0, 1].map((r) => {
      const list = r === 0 ? p.left : p.right;
      return el("div", { class: `side ${r === 0 ? "left" : "right"}` },
        el("h4", { text: D.runs[r].label }), ...list.map((i) => card(r, i)));
    });
    main.append(el("div", { class: "pair", id: `pair-${k}`, "data-prompt": p.prompt, "data-step": p.step },
      el("h3", { text: `step ${p.step} \u00b7 prompt ${p.prompt}` }), ...sides));
  });
}

function update() {
  if (D.mode === "compare") updateCompare(); else updateRun();
  recolour();
}

header();
controls();
if (D.mode === "compare") buildCompare();
else D.runs[0].responses.forEach((_, i) => $("responses").append(card(0, i)));
update();
