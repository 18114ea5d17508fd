// The rollout viewer: steps, prompt groups and trajectories of a run's dump files, read from the JSON API
// (zerotir/rollout_log/server.py). The view's state lives in the URL hash, so a link shows the same step,
// trajectory, overlay and filters: #split=train&step=2&traj=0-3&overlay=logprob&filter=correct,tool&tool=python
"use strict";

const state = { split: "train", step: null, traj: null, overlay: "none", filter: [], tool: "" };
let stepData = null;   // the step's groups (api.step_view)
let trajData = null;   // the open trajectory (api.trajectory_view)
const openGroups = new Set();

function readHash() {
  const params = new URLSearchParams(location.hash.slice(1));
  state.split = params.get("split") || "train";
  state.step = params.has("step") ? Number(params.get("step")) : null;
  state.traj = params.get("traj");
  state.overlay = params.get("overlay") || "none";
  state.filter = (params.get("filter") || "").split(",").filter(Boolean);
  state.tool = params.get("tool") || "";
}

function writeHash() {
  const params = new URLSearchParams();
  params.set("split", state.split);
  if (state.step !== null) params.set("step", state.step);
  if (state.traj) params.set("traj", state.traj);
  if (state.overlay !== "none") params.set("overlay", state.overlay);
  if (state.filter.length) params.set("filter", state.filter.join(","));
  if (state.tool) params.set("tool", state.tool);
  history.replaceState(null, "", "#" + params.toString());
}

async function getJSON(path) {
  const response = await fetch(path, { cache: "no-store" });
  const body = await response.json();
  if (!response.ok) throw new Error(body.error || response.statusText);
  return body;
}

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else node.setAttribute(key, value);
  }
  for (const child of children) node.append(child);
  return node;
}

const fmt = (value, digits = 2) => (value === null || value === undefined ? "-" : Number(value).toFixed(digits));

function setStatus(text) { document.getElementById("status").textContent = text; }

async function loadRun() {
  const run = await getJSON("/api/run");
  document.getElementById("folder").textContent = run.folder;
  const select = document.getElementById("split");
  select.replaceChildren(...run.splits.map((s) => el("option", { value: s, text: s })));
  if (!run.splits.includes(state.split) && run.splits.length) state.split = run.splits[0];
  select.value = state.split;
  await loadSteps();
}

async function loadSteps() {
  const steps = await getJSON(`/api/steps?split=${state.split}`);
  const body = document.querySelector("#steps tbody");
  body.replaceChildren(...steps.map((s) => {
    const row = el("tr", { "data-step": s.step },
      el("td", { text: s.step }), el("td", { text: s.trajectories }), el("td", { text: fmt(s.reward) }),
      el("td", { text: fmt(s.accuracy) }), el("td", { text: fmt(s.tool_rate) }));
    row.addEventListener("click", () => { state.step = s.step; state.traj = null; loadStep(); });
    return row;
  }));
  if (!steps.length) { setStatus("no steps on disk yet"); return; }
  if (state.step === null || !steps.some((s) => s.step === state.step)) state.step = steps[steps.length - 1].step;
  await loadStep();
}

async function loadStep() {
  writeHash();
  for (const row of document.querySelectorAll("#steps tbody tr")) {
    row.classList.toggle("selected", Number(row.dataset.step) === state.step);
  }
  stepData = await getJSON(`/api/step?split=${state.split}&step=${state.step}`);
  const tools = document.getElementById("tool-filter");
  tools.replaceChildren(el("option", { value: "", text: "any tool" }),
    ...stepData.tools.map((t) => el("option", { value: t, text: t })));
  tools.value = stepData.tools.includes(state.tool) ? state.tool : "";
  renderGroups();
  if (state.traj) await loadTrajectory(state.traj);
  else document.getElementById("traj-pane").hidden = true;
}

function passes(t) {
  const f = state.filter;
  if (f.includes("correct") && !t.correct) return false;
  if (f.includes("wrong") && t.correct) return false;
  if (f.includes("error") && !t.failed) return false;
  if (f.includes("tool") && t.calls === 0) return false;
  if (f.includes("no-tool") && t.calls > 0) return false;
  if (state.tool && !t.tools.includes(state.tool)) return false;
  return true;
}

function trajCard(t) {
  const card = el("div", { class: `traj-card ${t.correct ? "correct" : "wrong"}`, "data-id": t.id },
    el("div", { text: `#${t.id}  reward ${fmt(t.reward)}  adv ${fmt(t.advantage)}` }),
    el("div", { text: `${t.calls} call(s)${t.tools.length ? " (" + t.tools.join(", ") + ")" : ""}` +
                      `${t.failed ? ", failed" : ""} | ${t.response_tokens} tok${t.has_tokens ? " | tokens" : ""}` }),
    el("div", { class: "preview", text: t.preview }));
  if (t.id === state.traj) card.classList.add("selected");
  card.addEventListener("click", () => loadTrajectory(t.id));
  return card;
}

function renderGroups() {
  const box = document.getElementById("groups");
  let shown = 0, total = 0;
  const nodes = [];
  for (const g of stepData.groups) {
    total += g.trajectories.length;
    const kept = g.trajectories.filter(passes);
    if (!kept.length) continue;
    shown += kept.length;
    if (g.trajectories.some((t) => t.id === state.traj)) openGroups.add(g.id);
    const head = el("div", { class: "group-head" },
      el("span", { text: `${g.problem_id}  |  ${kept.length} of ${g.trajectories.length}  |  reward ` +
                         `${fmt(g.reward)}  accuracy ${fmt(g.accuracy)}  |  reference ${g.reference}  ` }),
      el("div", { class: "prompt", text: g.prompt.slice(0, 200) }));
    const group = el("div", { class: "group", "data-group": g.id }, head,
      el("div", { class: "group-trajs" }, ...kept.map(trajCard)));
    group.classList.toggle("open", openGroups.has(g.id));
    head.addEventListener("click", () => {
      group.classList.toggle("open");
      if (group.classList.contains("open")) openGroups.add(g.id); else openGroups.delete(g.id);
    });
    nodes.push(group);
  }
  box.replaceChildren(...nodes);
  document.getElementById("shown").textContent = `${shown} of ${total} trajectories`;
}

async function loadTrajectory(id) {
  state.traj = id;
  writeHash();
  for (const card of document.querySelectorAll(".traj-card")) card.classList.toggle("selected", card.dataset.id === id);
  trajData = await getJSON(`/api/trajectory?split=${state.split}&step=${state.step}&id=${encodeURIComponent(id)}`);
  renderTrajectory();
}

function outputLabel(call) {
  return call ? `${call.tool || "no tool"} output (${call.status})` : "output (?)";
}

const FAILED = ["error", "timeout", "memory", "killed", "sandbox_error", "tool_error", "invalid"];

function renderTrajectory() {
  const t = trajData;
  document.getElementById("traj-pane").hidden = false;
  const verdict = el("span", { class: t.correct ? "verdict-correct" : "verdict-wrong",
                               text: t.correct ? "correct" : "wrong" });
  document.getElementById("traj-head").replaceChildren(
    el("strong", { text: `#${t.id} ${t.problem_id} ` }), verdict,
    ` | reward ${fmt(t.reward)} | advantage ${fmt(t.advantage)} | answer ${t.answer} | reference ${t.reference} | ` +
    `finish ${t.finish_reason} | weights v${t.weight_version}` +
    (t.filtered_by && t.filtered_by.length ? ` | filtered by ${t.filtered_by.join(", ")}` : "") +
    (t.tokens ? "" : " | no per-token record (not in this step's sample)"));
  const body = document.getElementById("traj-body");
  body.replaceChildren(...(t.tokens ? tokenNodes(t) : blockNodes(t)));
  document.getElementById("overlay-bar").hidden = !t.tokens;
  paintOverlay();
}

function blockNodes(t) {
  const nodes = [el("div", { class: "span-prompt", text: t.prompt })];
  let k = 0;
  for (const [kind, text] of t.blocks) {
    if (kind === "text") { nodes.push(el("span", { text })); continue; }
    const call = kind === "output" ? t.tool_calls[k++] : null;
    const cls = kind === "code" ? "block call" : `block output${call && FAILED.includes(call.status) ? " failed" : ""}`;
    nodes.push(el("div", { class: cls, "data-label": outputLabel(call), text }));
  }
  return nodes;
}

function tokenNodes(t) {
  const spans = t.tokens.span, nodes = [];
  let k = 0, i = 0;
  while (i < spans.length) {
    const kind = spans[i];
    let j = i;
    while (j < spans.length && spans[j] === kind) j++;
    const toks = [];
    for (let n = i; n < j; n++) toks.push(el("span", { class: "tok", "data-i": n, text: t.tokens.pieces[n] }));
    if (kind === "call") nodes.push(el("div", { class: "block call" }, ...toks));
    else if (kind === "output") {
      const call = t.tool_calls[k++];
      const failed = call && FAILED.includes(call.status) ? " failed" : "";
      nodes.push(el("div", { class: `block output${failed}`, "data-label": outputLabel(call) }, ...toks));
    } else nodes.push(el("span", { class: kind === "prompt" ? "span-prompt" : kind === "answer" ? "answer" : "" },
                         ...toks));
    i = j;
  }
  return nodes;
}

function overlayValue(tokens, i, maxVersion) {
  // [strength 0..1, hue] of token i under the chosen overlay; null: no colour (no value at that token)
  const engine = tokens.engine_logprob[i];
  const trainer = tokens.trainer_logprob ? tokens.trainer_logprob[i] : null;
  switch (state.overlay) {
    case "logprob": {
      const lp = trainer ?? engine;
      return lp === null ? null : [Math.min(-lp / 5, 1), 0];
    }
    case "entropy": {
      const e = tokens.entropy ? tokens.entropy[i] : null;
      return e === null ? null : [Math.min(e / 3, 1), 280];
    }
    case "mismatch":
      return engine === null || trainer === null ? null : [Math.min(Math.abs(trainer - engine) / 0.5, 1), 25];
    case "weight":
      return [tokens.loss_weight[i] ? 0.5 : 0.0, 120];
    case "version": {
      const v = tokens.weight_version ? tokens.weight_version[i] : null;
      return v === null ? null : [Math.min((maxVersion - v + 1) / 4, 1), 210];
    }
    default:
      return null;
  }
}

function paintOverlay() {
  if (!trajData || !trajData.tokens) return;
  const tokens = trajData.tokens;
  const versions = (tokens.weight_version || []).filter((v) => v !== null);
  const maxVersion = versions.length ? Math.max(...versions) : 0;
  for (const node of document.querySelectorAll("#traj-body .tok")) {
    const value = overlayValue(tokens, Number(node.dataset.i), maxVersion);
    node.style.backgroundColor = value === null ? "" : `hsla(${value[1]}, 85%, 50%, ${0.08 + 0.6 * value[0]})`;
  }
}

function tokenInfo(event) {
  const node = event.target.closest(".tok");
  if (!node || !trajData || !trajData.tokens) return;
  const i = Number(node.dataset.i), t = trajData.tokens;
  const pick = (name) => (t[name] ? t[name][i] : null);
  document.getElementById("token-info").textContent =
    `#${i} id ${t.ids[i]} ${JSON.stringify(t.pieces[i])} ${t.span[i]} | engine ${fmt(pick("engine_logprob"), 3)} ` +
    `trainer ${fmt(pick("trainer_logprob"), 3)} entropy ${fmt(pick("entropy"), 3)} adv ` +
    `${fmt(pick("advantage"), 3)} weight ${t.loss_weight[i]} version ${pick("weight_version") ?? "-"}`;
}

function bind() {
  document.getElementById("split").addEventListener("change", (e) => {
    state.split = e.target.value; state.step = null; state.traj = null; loadSteps().catch(showError);
  });
  for (const box of document.querySelectorAll("#filters input[type=checkbox]")) {
    box.checked = state.filter.includes(box.value);
    box.addEventListener("change", () => {
      state.filter = [...document.querySelectorAll("#filters input:checked")].map((b) => b.value);
      writeHash(); renderGroups();
    });
  }
  document.getElementById("tool-filter").addEventListener("change", (e) => {
    state.tool = e.target.value; writeHash(); renderGroups();
  });
  for (const radio of document.querySelectorAll("input[name=overlay]")) {
    radio.checked = radio.value === state.overlay;
    radio.addEventListener("change", () => { state.overlay = radio.value; writeHash(); paintOverlay(); });
  }
  document.getElementById("traj-body").addEventListener("mouseover", tokenInfo);
}

function showError(error) { setStatus(`error: ${error.message}`); }

readHash();
bind();
loadRun().then(() => setStatus("")).catch(showError);
