// The label audit page: one sampled teacher label at a time; the reviewer's label is saved by POST /api/verdict.
"use strict";
const $ = (id) => document.getElementById(id);
const state = { items: [], index: 0, busy: false };

function message(text, ok) {
  const box = $("message");
  box.textContent = text;
  box.className = ok ? "ok" : "";
  box.hidden = !text;
}

async function call(path, options) {
  let response;
  try {
    response = await fetch(path, options);
  } catch (error) {
    throw new Error(`the audit server is not reachable (${error.message}); is \`selfrag audit\` still running?`);
  }
  let body = null;
  try { body = await response.json(); } catch (error) { body = null; }
  if (!response.ok) {
    const text = body && body.error && body.error.message ? body.error.message : `HTTP ${response.status}`;
    throw new Error(text);
  }
  return body;
}

function reviewedCount() { return state.items.filter((item) => item.human).length; }

function show() {
  const total = state.items.length;
  $("progress").textContent = `${reviewedCount()} / ${total} reviewed`;
  if (!total) return;
  const item = state.items[state.index];
  $("type").textContent = item.type;
  $("position").textContent = `record ${state.index + 1} of ${total}`;
  $("record-id").textContent = item.id;
  $("question").textContent = item.question;
  $("preceding-block").hidden = !item.preceding;
  $("preceding").textContent = item.preceding || "";
  $("passage-block").hidden = !item.passage;
  $("passage-title").textContent = item.passage ? `· ${item.passage.title || ""}` : "";
  $("passage").textContent = item.passage ? item.passage.text : "";
  $("output-block").hidden = !item.output;
  $("output").textContent = item.output || "";
  const hide = $("blind").checked && !item.human;
  $("teacher").textContent = hide ? "(hidden until you pick)" : item.teacher;
  const choices = $("choices");
  choices.replaceChildren();
  item.choices.forEach((label, number) => {
    const button = document.createElement("button");
    button.type = "button";
    button.dataset.label = label;
    const key = document.createElement("kbd");
    key.textContent = String(number + 1);
    button.append(key, label);
    if (item.human === label) button.classList.add("picked");
    button.addEventListener("click", () => pick(label));
    choices.append(button);
  });
}

function nextUnreviewed(from) {
  const total = state.items.length;
  for (let step = 1; step <= total; step += 1) {
    const index = (from + step) % total;
    if (!state.items[index].human) return index;
  }
  return -1;
}

async function pick(label) {
  if (state.busy || !state.items.length) return;
  const item = state.items[state.index];
  state.busy = true;
  try {
    const body = await call("/api/verdict", {
      method: "POST", headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ id: item.id, human: label }),
    });
    item.human = body.verdict.human;
    const next = nextUnreviewed(state.index);
    if (next < 0) {
      message(`All ${state.items.length} sampled labels are reviewed; press r for the report.`, true);
    } else {
      message("");
      state.index = next;
    }
    show();
  } catch (error) {
    message(`The verdict was not saved: ${error.message}`);
  } finally {
    state.busy = false;
  }
}

function cell(row, text, numeric) {
  const td = document.createElement("td");
  td.textContent = text;
  if (numeric) td.className = "num";
  row.append(td);
}

function withInterval(value, interval) {
  if (value === null || value === undefined) return "n/a";
  return value.toFixed(2) + (interval ? ` [${interval[0].toFixed(2)}, ${interval[1].toFixed(2)}]` : "");
}

async function report() {
  const panel = $("report");
  if (!panel.hidden) { panel.hidden = true; return; }
  try {
    const body = await call("/api/report");
    const rows = $("report-table").querySelector("tbody");
    rows.replaceChildren();
    for (const type of body.report.types) {
      const row = document.createElement("tr");
      row.dataset.type = type.type;
      cell(row, type.type);
      cell(row, String(type.reviewed), true);
      cell(row, withInterval(type.accuracy, type.accuracy_interval));
      const kappa = document.createElement("td");
      kappa.className = "kappa";
      kappa.dataset.value = type.kappa === null ? "" : String(type.kappa);
      kappa.textContent = withInterval(type.kappa, type.kappa_interval);
      row.append(kappa);
      cell(row, Object.entries(type.labels).map(([label, s]) => `${label} ${s.confirmed}/${s.reviewed}`).join(", "));
      rows.append(row);
    }
    $("report-note").textContent = `${body.reviewed} of ${body.sampled} sampled labels reviewed. 95% intervals: ` +
      `agreement ${body.report.accuracy_interval}; kappa ${body.report.kappa_interval}. ` +
      "Also written to audit/report.md, report.json and report.png.";
    $("report-plot").src = `/api/report.png?t=${Date.now()}`;
    panel.hidden = false;
    panel.scrollIntoView();
  } catch (error) {
    message(`No report: ${error.message}`);
  }
}

document.addEventListener("keydown", (event) => {
  if (event.ctrlKey || event.metaKey || event.altKey || !state.items.length) return;
  const item = state.items[state.index];
  const number = Number.parseInt(event.key, 10);
  if (number >= 1 && number <= item.choices.length) {
    pick(item.choices[number - 1]);
  } else if (event.key === "ArrowRight" || event.key === "j") {
    state.index = Math.min(state.index + 1, state.items.length - 1); show();
  } else if (event.key === "ArrowLeft" || event.key === "k") {
    state.index = Math.max(state.index - 1, 0); show();
  } else if (event.key === "n") {
    const next = nextUnreviewed(state.index);
    if (next >= 0) { state.index = next; show(); }
  } else if (event.key === "r") {
    report();
  } else {
    return;
  }
  event.preventDefault();
});

async function start() {
  $("report-button").addEventListener("click", report);
  $("blind").addEventListener("change", show);
  try {
    const body = await call("/api/state");
    state.items = body.items;
    $("source").textContent = `${body.data_dir} · seed ${body.settings.seed} · up to ${body.settings.per_stratum} per type and label`;
    const first = state.items.findIndex((item) => !item.human);
    state.index = first < 0 ? 0 : first;
    if (first < 0) message("Every sampled label is reviewed; press r for the report.", true);
    show();
    document.body.dataset.ready = "true";
  } catch (error) {
    message(`The audit could not load: ${error.message}`);
  }
}

start();
