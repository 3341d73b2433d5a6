// The trace inspector: asks the server's own OpenAI-compatible API (stream=true) and lays out the `selfrag`
// extension of each chunk: the retrieve decision, passages with their verdicts per round, citations, flags.
// URLs are relative, so the page works behind a load balancer or a path prefix. The API key lives in this tab's
// sessionStorage only (never in the URL).
"use strict";
const $ = (id) => document.getElementById(id);
const KEY = "selfrag.apiKey";
let run = null; // {steps, citations: Map, segments, final, controller}

function el(tag, attributes, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes || {})) {
    if (name === "class") node.className = value;
    else if (name.startsWith("data-")) node.setAttribute(name, value);
    else node[name] = value;
  }
  for (const child of children) if (child !== null && child !== undefined) node.append(child);
  return node;
}

function message(text) {
  $("message").textContent = text || "";
  $("message").hidden = !text;
}

function headers() {
  const result = { "Content-Type": "application/json" };
  const key = $("api-key").value.trim();
  if (key) result.Authorization = `Bearer ${key}`;
  return result;
}

async function errorText(response) {
  let detail = "";
  try {
    const body = await response.json();
    detail = body && body.error ? body.error.message : JSON.stringify(body);
  } catch (error) {
    detail = response.statusText || "no details";
  }
  return `The server answered ${response.status}: ${detail}`;
}

async function loadModels() {
  const select = $("model");
  try {
    const response = await fetch("v1/models", { headers: headers() });
    if (!response.ok) { message(await errorText(response)); return; }
    const body = await response.json();
    const current = select.value;
    select.replaceChildren(...body.data.map((model) => el("option", { value: model.id, textContent: model.id })));
    if (current) select.value = current;
    message("");
  } catch (error) {
    message(`The server is not reachable: ${error.message}`);
  }
}

function number(value, digits = 2) {
  return typeof value === "number" ? value.toFixed(digits) : "n/a";
}

function verdictClass(token) {
  if (!token) return "verdict";
  if (/Relevant\]|Fully|Utility:[45]|^retrieve$|accept/.test(token) && !/Irrelevant/.test(token)) return "verdict good";
  if (/Partially|Utility:3/.test(token)) return "verdict mid";
  if (/Irrelevant|No support|Utility:[12]|abstain/.test(token)) return "verdict bad";
  return "verdict";
}

function verdict(token) { return el("span", { class: verdictClass(token), textContent: token || "—" }); }

// -- the decision to retrieve --------------------------------------------------------------------------------
function renderDecide(steps) {
  const box = $("decide");
  const decide = steps.filter((step) => step.step === "decide");
  if (!decide.length) { box.replaceChildren(el("p", { class: "empty", textContent: "No decision yet." })); return; }
  box.replaceChildren(...decide.map((step) => {
    const p = step.probabilities && typeof step.probabilities.p_retrieve === "number" ? step.probabilities.p_retrieve : null;
    const parts = [el("div", {}, el("b", { textContent: `mode ${step.mode || "?"}: ` }), verdict(step.chosen),
      p === null ? null : ` p(retrieve) = ${number(p, 3)}`,
      typeof step.threshold === "number" ? ` against threshold ${number(step.threshold)}` : null)];
    if (p !== null) {
      const gauge = el("div", { class: "gauge", title: `p(retrieve) ${number(p, 3)}; threshold ${step.threshold}` },
        el("div", { class: "fill" }), el("div", { class: "mark" }));
      gauge.querySelector(".fill").style.width = `${Math.round(p * 100)}%`;
      if (typeof step.threshold === "number") gauge.querySelector(".mark").style.left = `${step.threshold * 100}%`;
      parts.push(gauge);
    }
    if (step.reason) parts.push(el("div", { class: "round query", textContent: step.reason }));
    return el("div", { class: "decide", "data-chosen": String(step.chosen) }, ...parts);
  }));
}

// -- passages per retrieval round: retrieval score, relevance score and verdict, support, utility, rank ---------
function rounds(steps) {
  // keyed by segment (long form) and round: each block shows its own retrieve step's query, never another round's
  const byRound = new Map();
  let label = 0;
  let segment;
  const passage = (round, id) => {
    if (!round.passages.has(id)) round.passages.set(id, { id });
    return round.passages.get(id);
  };
  for (const step of steps) {
    if (step.segment !== undefined) segment = step.segment;
    if (typeof step.round === "number") label = step.round;
    const key = segment === undefined ? String(label) : `${segment}:${label}`;
    if (!byRound.has(key)) {
      byRound.set(key, { number: label, segment, query: null, passages: new Map(), support: [], other: [] });
    }
    const round = byRound.get(key);
    if (step.step === "retrieve") {
      round.retrieved = true;
      round.query = typeof step.query === "string" ? step.query : null;
      round.reason = step.reason;
      (Array.isArray(step.chosen) ? step.chosen : []).forEach((id, index) => { passage(round, id).retrieval = (step.scores || [])[index]; });
    } else if (step.step === "relevance" && step.relevance) {
      for (const [id, score] of Object.entries(step.relevance)) {
        const item = passage(round, id);
        item.relevance = score;
        item.relevanceVerdict = (step.chosen || {})[id];
        item.overridden = (step.overridden || []).includes(id);
      }
      round.relevanceThreshold = step.relevance_threshold;
    } else if (step.step === "rank" && Array.isArray(step.candidates)) {
      for (const candidate of step.candidates) {
        if (!candidate.passage_id) continue;
        const item = passage(round, candidate.passage_id);
        Object.assign(item, { score: candidate.score, tokens: candidate.tokens || {}, components: candidate.components || {},
          pruned: candidate.pruned, truncated: candidate.truncated, problems: candidate.problems || [] });
      }
    } else if (step.step === "support") {
      round.support.push(step);
      if (step.passage_id) passage(round, step.passage_id).chosen = true;
    } else if (["prune", "skip", "critique", "partial", "beam", "vote", "length"].includes(step.step)) {
      if (["prune", "skip"].includes(step.step) && Array.isArray(step.chosen)) {
        const why = step.step === "prune" ? `stopped after its relevance token: ${step.reason}`
          : `the round was cut short (skip.${step.rule}): ${step.reason}`;
        step.chosen.forEach((id) => { passage(round, id).notScored = why; });
      }
      round.other.push(step);
    }
  }
  return byRound;
}

// Why a passage row has no support verdict (shown beside the "—"), or null when it has one.
function noSupportWhy(item) {
  if (item.tokens && item.tokens.support) return null;
  if (item.relevanceVerdict && !/Relevant\]/.test(item.relevanceVerdict)) return null; // judged irrelevant: no need
  if (item.notScored) return item.notScored;
  if (item.truncated) return item.truncated;
  const problem = (item.problems || []).find((text) => /support/.test(text)) || (item.problems || [])[0];
  if (problem) return `the model wrote no support token (${problem})`;
  return item.tokens ? "the model wrote no support token" : "its continuation was not decoded past the relevance token";
}

function renderRounds(steps, citations) {
  const box = $("rounds");
  const all = [...rounds(steps).values()];
  const shown = all.filter((round) => round.retrieved || round.passages.size || round.support.length);
  if (!shown.length) { box.replaceChildren(el("p", { class: "empty", textContent: "No retrieval yet." })); return; }
  box.replaceChildren(...shown.map((round) => {
    const head = el("tr", {}, ...["passage", "retrieval", "relevance", "verdict", "support", "utility", "score"]
      .map((name) => el("th", { textContent: name })));
    const rows = [...round.passages.values()].map((item) => {
      const cited = citations.get(item.id);
      const tokens = item.tokens || {};
      const why = noSupportWhy(item);
      return el("tr", { class: item.chosen ? "chosen passage-row" : "passage-row", "data-passage": item.id },
        el("td", { textContent: cited && cited.title ? `${cited.title} (${item.id})` : item.id }),
        el("td", { class: "num", textContent: number(item.retrieval) }),
        el("td", { class: "num", textContent: number(item.relevance, 3) }),
        el("td", {}, verdict(item.relevanceVerdict), item.overridden ? " (overrode the token)" : null),
        el("td", { class: "support" }, verdict(tokens.support), item.components && typeof item.components.support === "number"
          ? ` ${number(item.components.support)}` : null,
          why ? el("div", { class: "why", textContent: `not scored: ${why}` }) : null),
        el("td", {}, verdict(tokens.utility)),
        el("td", { class: "num", textContent: number(item.score) }));
    });
    const support = round.support.map((step) => el("div", { class: "support-step" },
      el("b", { textContent: "support: " }), verdict(step.verdict), ` on ${step.passage_id || "—"} → `,
      verdict(step.chosen), step.reason ? ` (${step.why || step.reason})` : null));
    const other = round.other.map((step) => el("div", { class: "query step-note",
      textContent: `${step.step}: ${step.chosen === undefined ? "" : JSON.stringify(step.chosen)} ${step.reason || ""}` }));
    const before = all.find((other_) => other_.segment === round.segment && other_.number === round.number - 1);
    const same = round.query && before && before.query === round.query ? " (the same query as the round before)" : "";
    return el("div", { class: "round", "data-round": String(round.number) },
      el("div", {}, el("b", { textContent: `Round ${round.number + 1}` }),
        round.segment === undefined ? null : el("span", { class: "query", textContent: ` · segment ${round.segment}` }),
        el("span", { class: "query", "data-query": "", textContent: round.query ? ` · query: ${round.query}${same}` : "" }),
        typeof round.relevanceThreshold === "number"
          ? el("span", { class: "query", textContent: ` · relevant at ≥ ${round.relevanceThreshold}` }) : null),
      rows.length ? el("table", {}, el("thead", {}, head), el("tbody", {}, ...rows))
        : el("p", { class: "empty", textContent: `No passage: ${round.reason || "nothing retrieved"}` }),
      ...support, ...other);
  }));
}

// -- the answer, its citations and flags ---------------------------------------------------------------------
function citationNumber(id) { return [...run.citations.keys()].indexOf(id) + 1; }

function highlight(id, on) {
  document.querySelectorAll(`[data-passage="${CSS.escape(id)}"]`).forEach((node) => node.classList.toggle("hot", on));
}

function renderAnswer() {
  const box = $("answer");
  box.replaceChildren(...run.segments.map((segment) => {
    const span = el("span", { class: segment.passage_id ? "segment linked" : "segment", textContent: segment.text });
    if (!segment.passage_id) return span;
    span.setAttribute("data-passage", segment.passage_id);
    const n = citationNumber(segment.passage_id);
    const link = el("a", { href: `#cite-${n}`, textContent: `[${n}]`, title: `supported by passage ${segment.passage_id}` });
    span.append(el("sup", {}, link));
    span.addEventListener("mouseenter", () => highlight(segment.passage_id, true));
    span.addEventListener("mouseleave", () => highlight(segment.passage_id, false));
    return span;
  }));
}

function renderCitations() {
  const box = $("citations");
  if (!run.citations.size) { box.replaceChildren(el("p", { class: "empty", textContent: "No citations." })); return; }
  const sentences = new Map();
  for (const citation of (run.final && run.final.citations) || []) sentences.set(citation.passage_id, citation.sentences);
  box.replaceChildren(...[...run.citations.values()].map((citation, index) => {
    const card = el("div", { class: "card", id: `cite-${index + 1}`, "data-passage": citation.passage_id },
      el("h3", { textContent: `[${index + 1}] ${citation.title || citation.passage_id}${
        citation.relevance === "[Irrelevant]" ? " (the model judged it [Irrelevant])" : ""}` }),
      el("div", { class: "text", textContent: citation.text }));
    const supported = sentences.get(citation.passage_id) || [];
    if (supported.length) {
      card.append(el("h2", { textContent: "supports" }),
        ...supported.map((text) => el("span", { class: "sentence", textContent: `“${text.trim()}”` })));
    }
    card.addEventListener("mouseenter", () => highlight(citation.passage_id, true));
    card.addEventListener("mouseleave", () => highlight(citation.passage_id, false));
    return card;
  }));
}

function renderFlags() {
  const box = $("flags");
  const final = run.final;
  if (!final) { box.replaceChildren(); return; }
  const flags = [el("span", { class: "flag info", textContent: final.retrieved ? "retrieved" : "no retrieval" })];
  // every reason, without the "abstained: " / "flagged: " each starts with (the flag says it)
  const reasons = (final.reasons || []).map((reason) => reason.replace(/^(abstained|flagged): /, "")).join("; ");
  if (final.abstained) {
    flags.push(el("span", { class: "flag abstained", id: "abstained",
      textContent: `abstained${reasons ? `: ${reasons}` : ""}` }));
  }
  if (final.low_confidence) {
    flags.push(el("span", { class: "flag low", id: "low-confidence",
      textContent: `low confidence${reasons ? `: ${reasons}` : ""}` }));
  }
  if (!final.abstained && !final.low_confidence) flags.push(el("span", { class: "flag ok", textContent: "confident" }));
  flags.push(el("span", { class: "flag info",
    textContent: `${final.engine_calls} engine calls · ${final.generated_tokens} tokens generated` }));
  box.replaceChildren(...flags);
}

function renderSteps() {
  $("steps").replaceChildren(...run.steps.map((step) => el("li", { "data-step": step.step },
    el("details", {}, el("summary", {}, el("b", { textContent: step.step }), " ",
      typeof step.chosen === "string" ? verdict(step.chosen) : null, step.reason ? ` ${step.reason}` : ""),
    el("pre", { textContent: JSON.stringify(step, null, 2) })))));
}

function render() {
  renderDecide(run.steps);
  renderRounds(run.steps, run.citations);
  renderAnswer();
  renderCitations();
  renderFlags();
  renderSteps();
}

// -- the stream ----------------------------------------------------------------------------------------------
function handle(chunk) {
  if (chunk.error) throw new Error(`The server reported an error: ${chunk.error.message}`);
  const extension = chunk.selfrag;
  const choice = (chunk.choices || [])[0];
  if (extension && extension.type === "trace") run.steps.push(extension.step);
  if (extension && extension.type === "citation") run.citations.set(extension.citation.passage_id, extension.citation);
  if (choice && choice.delta && choice.delta.content) {
    run.segments.push({ text: choice.delta.content, passage_id: extension ? extension.passage_id : null });
  }
  if (extension && extension.type === "final") {
    run.final = extension;
    run.steps = extension.trace; // the whole trace, in order (the stream sent the same entries)
    for (const citation of extension.citations) if (!run.citations.has(citation.passage_id)) run.citations.set(citation.passage_id, citation);
  }
  render();
}

async function ask(event) {
  event.preventDefault();
  const question = $("question").value.trim();
  if (!question) return;
  if (run && run.controller) run.controller.abort();
  run = { steps: [], citations: new Map(), segments: [], final: null, controller: new AbortController() };
  message("");
  render();
  $("status").textContent = "streaming…";
  $("send").disabled = true;
  $("stop").disabled = false;
  document.body.dataset.state = "streaming";
  const body = { model: $("model").value || "selfrag", stream: true, messages: [{ role: "user", content: question }] };
  if ($("mode").value) body.mode = $("mode").value;
  if ($("threshold").value !== "") body.threshold = Number($("threshold").value);
  if ($("top-k").value !== "") body.top_k = Number($("top-k").value);
  try {
    const response = await fetch("v1/chat/completions", {
      method: "POST", headers: headers(), body: JSON.stringify(body), signal: run.controller.signal,
    });
    if (!response.ok) throw new Error(await errorText(response));
    await readEvents(response);
    if (!run.final) throw new Error("The stream ended without an answer; the server log has the details.");
    $("status").textContent = "done";
    document.body.dataset.state = "done";
  } catch (error) {
    const aborted = error.name === "AbortError";
    $("status").textContent = aborted ? "stopped" : "failed";
    document.body.dataset.state = aborted ? "stopped" : "failed";
    if (!aborted) message(error.message.startsWith("The ") ? error.message : `The request failed: ${error.message}`);
  } finally {
    $("send").disabled = false;
    $("stop").disabled = true;
  }
}

async function readEvents(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    buffer += decoder.decode(value || new Uint8Array(), { stream: !done });
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const data = block.split("\n").filter((line) => line.startsWith("data:")).map((line) => line.slice(5).trim()).join("");
      if (!data || data === "[DONE]") continue;
      handle(JSON.parse(data));
    }
    if (done) return;
  }
}

function start() {
  const key = $("api-key");
  key.value = sessionStorage.getItem(KEY) || "";
  key.addEventListener("change", () => { sessionStorage.setItem(KEY, key.value); loadModels(); });
  $("ask").addEventListener("submit", ask);
  $("question").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) $("ask").requestSubmit();
  });
  $("stop").addEventListener("click", () => run && run.controller.abort());
  run = { steps: [], citations: new Map(), segments: [], final: null, controller: null };
  loadModels().then(() => { document.body.dataset.ready = "true"; });
}

start();
