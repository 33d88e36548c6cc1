/* repalign survey page: consent, trials, progress, answers kept in localStorage, downloads. No dependencies. */
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("survey-data").textContent);
  var params = new URLSearchParams(window.location.search);
  var $ = function (id) { return document.getElementById(id); };
  // MTurk shows the page in preview before a worker accepts the HIT: nothing can be answered or submitted then.
  var urlAssignment = params.get("assignmentId") || "";
  var preview = urlAssignment === "ASSIGNMENT_ID_NOT_AVAILABLE";
  var urlWorker = params.get("workerId") || params.get("PROLIFIC_PID") || "";
  // Prolific's SESSION_ID is the submission id of its export: import matches a returned or timed-out submission by it.
  var urlSession = params.get("SESSION_ID") || "";
  var TURK_ORIGINS = ["https://www.mturk.com", "https://workersandbox.mturk.com"];  // where answers may be posted
  // Answers are kept per participant: per MTurk assignment (a returned and re-accepted HIT is a new one), else per
  // worker id from the URL, else per typed id; a second person on the same browser never continues the first one's.
  var BASE = "repalign:" + data.package + ":" + data.survey_id;
  var urlIdentity = (preview ? "" : urlAssignment) || urlWorker;
  var KEY = urlIdentity ? BASE + ":" + urlIdentity : null;

  function fresh(workerId) {
    return {
      format: data.format, package_fingerprint: data.package, survey_id: data.survey_id,
      worker_id: workerId || urlWorker, assignment_id: preview ? "" : urlAssignment, session_id: urlSession, consent: false, answers: {},
      started_at: null, finished_at: null, completion_code: null, user_agent: navigator.userAgent
    };
  }
  // Storage can be blocked (cookies off, a cross-site frame in some browsers): the page then keeps answers in memory
  // and says that a reload loses them, instead of stopping with an exception.
  function storageFailed() { $("storage-warning").classList.remove("hidden"); return null; }
  function storageGet(key) {
    try { return window.localStorage.getItem(key); } catch (e) { return storageFailed(); }
  }
  function storageSet(key, value) {
    try { window.localStorage.setItem(key, value); } catch (e) { storageFailed(); }
  }
  function load(key, workerId) {
    var saved = null;
    try { saved = key ? JSON.parse(storageGet(key)) : null; } catch (e) { saved = null; }
    return saved || fresh(workerId);
  }
  var state = preview ? fresh() : load(KEY);
  // The same survey open in two tabs (a HIT popped out of its frame, a link opened twice): each tab keeps the other's
  // answers, so the one that saves last writes both; a tab that sees the other save shows where the two now are.
  function mergeStored() {
    var stored = null;
    try { stored = KEY ? JSON.parse(storageGet(KEY)) : null; } catch (e) { stored = null; }
    if (!stored || !stored.answers) return;
    Object.keys(stored.answers).forEach(function (id) {
      var ours = state.answers[id], theirs = stored.answers[id];
      if (!ours || (!ours.complete && theirs.complete)) state.answers[id] = theirs;
    });
    state.finished_at = state.finished_at || stored.finished_at;
    state.completion_code = state.completion_code || stored.completion_code;
  }
  function save() { if (KEY && !preview) { mergeStored(); storageSet(KEY, JSON.stringify(state)); } }
  window.addEventListener("storage", function (event) {
    if (!preview && KEY && event.key === KEY && event.newValue && state.consent) { mergeStored(); render(); }
  });

  // The participant's order of the trials (trial ids): drawn at Start where the package shuffles per participant
  // (trial_order=per_participant) and saved with the answers, so a reload keeps it; else the package's order.
  function drawOrder() {
    var ids = data.trials.map(function (t) { return t.trial_id; });
    for (var i = ids.length - 1; data.shuffle && i > 0; i--) {
      var j = Math.floor(Math.random() * (i + 1)), t = ids[i]; ids[i] = ids[j]; ids[j] = t;
    }
    return ids;
  }
  function sequence() {
    var byId = {};
    data.trials.forEach(function (t) { byId[t.trial_id] = t; });
    var order = state.order || [];
    var whole = order.length === data.trials.length && order.every(function (id) { return byId[id]; });
    return whole ? order.map(function (id) { return byId[id]; }) : data.trials;  // answers saved by an older page: its order
  }

  // A trial takes answers, and its response times count, from when all its images have loaded (a reload shows it anew):
  // before, a key pressed while they loaded answered a trial not yet seen, and rt_ms counted from a blank stage.
  var trialShownAt = 0, shownTrial = null, readyTrial = null;
  var currentRow = 0, preloaded = [];

  function answered(trial) {
    var a = state.answers[trial.trial_id];
    if (!a) return false;
    return a.choices.every(function (c) { return c !== null; }) && a.complete;
  }
  function nextIndex() {
    var trials = sequence();
    for (var i = 0; i < trials.length; i++) if (!answered(trials[i])) return i;
    return trials.length;
  }
  function show(id) {
    ["consent", "trial", "done"].forEach(function (s) { $(s).classList.toggle("hidden", s !== id); });
  }
  function img(name) {
    var el = document.createElement("img");
    el.className = "stim"; el.src = "images/" + name; el.alt = "";
    return el;
  }
  function trialImages(trial) { return trial.task === "2afc" ? [trial.query].concat(trial.options) : trial.columns.concat(trial.rows); }
  function preload(trial) {  // the next trial's images, fetched while this one is answered
    preloaded = trial ? trialImages(trial).map(function (name) { var el = new Image(); el.src = "images/" + name; return el; }) : [];
  }
  function setReady(stage, ready) {
    stage.classList.toggle("loading", !ready);
    $("loading-note").classList.toggle("hidden", ready);
    if (ready) stage.setAttribute("data-ready", "true"); else stage.removeAttribute("data-ready");
  }
  function whenImagesLoaded(stage, trial, index) {
    var pending = Array.prototype.slice.call(stage.querySelectorAll("img.stim")).filter(function (el) { return !(el.complete && el.naturalWidth); });
    function ready() {
      if (shownTrial !== trial.trial_id || readyTrial === trial.trial_id) return;
      readyTrial = trial.trial_id; trialShownAt = Date.now();
      setReady(stage, true);
      preload(sequence()[index + 1]);
    }
    var left = pending.length;
    if (!left) { ready(); return; }
    pending.forEach(function (el) {
      el.addEventListener("load", function () { if (--left === 0) ready(); });
      el.addEventListener("error", function () { $("image-error").classList.remove("hidden"); });
    });
  }

  function render() {
    var i = nextIndex();
    if (!state.consent || preview || !KEY) { show("consent"); return; }
    if (i >= data.trials.length) { finish(); return; }
    show("trial");
    var trial = sequence()[i];
    $("progress-text").textContent = "Question " + (i + 1) + " of " + data.trials.length;
    $("progress-fill").style.width = (100 * i / data.trials.length) + "%";
    var stage = $("stage");
    // A participant answering with Tab and Space keeps a button focused across the re-render (the stage is rebuilt).
    var focused = stage.contains(document.activeElement) ? document.activeElement.getAttribute("data-choice") : null;
    stage.innerHTML = "";
    stage.setAttribute("data-trial", trial.trial_id);
    if (shownTrial !== trial.trial_id) { shownTrial = trial.trial_id; readyTrial = null; }
    if (trial.task === "2afc") render2afc(trial, stage); else renderClustering(trial, stage);
    if (focused !== null) {
      var scope = trial.task === "2afc" ? stage : stage.querySelector(".row.current") || stage;
      var again = scope.querySelector('button[data-choice="' + focused + '"]');
      if (again) again.focus({ preventScroll: true });
    }
    setReady(stage, readyTrial === trial.trial_id);
    if (readyTrial !== trial.trial_id) whenImagesLoaded(stage, trial, i);
  }

  function render2afc(trial, stage) {
    var q = document.createElement("div"); q.className = "query";
    q.appendChild(document.createTextNode("Query")); q.appendChild(img(trial.query));
    var opts = document.createElement("div"); opts.className = "options";
    ["left", "right"].forEach(function (side, k) {
      var b = document.createElement("button");
      b.className = "option"; b.setAttribute("data-choice", side);
      b.appendChild(img(trial.options[k]));
      var key = document.createElement("div"); key.className = "key";
      key.textContent = side === "left" ? "Option A (F or \u2190)" : "Option B (J or \u2192)";
      b.appendChild(key);
      b.addEventListener("click", function (e) { if (e.detail <= 1) answer2afc(trial, side); });  // a double-click answers once
      opts.appendChild(b);
    });
    stage.appendChild(q); stage.appendChild(opts);
  }
  function answer2afc(trial, side) {
    if (readyTrial !== trial.trial_id) return;
    state.answers[trial.trial_id] = { choices: [side], rt_ms: [Date.now() - trialShownAt], complete: true };
    save(); render();
  }

  function renderClustering(trial, stage) {
    var a = state.answers[trial.trial_id];
    if (!a) { a = state.answers[trial.trial_id] = { choices: trial.rows.map(function () { return null; }), rt_ms: trial.rows.map(function () { return null; }), complete: false }; }
    currentRow = a.choices.indexOf(null); if (currentRow < 0) currentRow = trial.rows.length - 1;
    var cols = document.createElement("div"); cols.className = "columns";
    trial.columns.forEach(function (name, k) {
      var f = document.createElement("figure"); f.appendChild(img(name));
      var c = document.createElement("figcaption"); c.textContent = "Column " + (k + 1); f.appendChild(c);
      cols.appendChild(f);
    });
    stage.appendChild(cols);
    trial.rows.forEach(function (name, r) {
      var row = document.createElement("div"); row.className = "row" + (r === currentRow ? " current" : "");
      row.setAttribute("data-row", r);
      var label = document.createElement("span"); label.textContent = "Row " + (r + 1); label.style.width = "4em";
      row.appendChild(label); row.appendChild(img(name));
      [0, 1, 2].forEach(function (k) {
        var b = document.createElement("button"); b.textContent = String(k + 1);
        b.setAttribute("data-choice", String(k));
        if (a.choices[r] === k) b.className = "chosen";
        b.addEventListener("click", function (e) { if (e.detail <= 1) answerRow(trial, r, k); });
        row.appendChild(b);
      });
      stage.appendChild(row);
    });
    var next = document.createElement("button"); next.id = "next"; next.className = "primary"; next.textContent = "Next";
    next.disabled = a.choices.indexOf(null) >= 0;
    next.addEventListener("click", function (e) { if (e.detail <= 1) completeClustering(trial); });
    stage.appendChild(next);
    // Keys 1-3 answer the highlighted row: keep it on screen, below the sticky columns (rows further down were answered unseen).
    var current = stage.querySelector(".row.current");
    current.style.scrollMarginTop = (cols.offsetHeight + 8) + "px";
    current.scrollIntoView({ block: "nearest" });
  }
  function answerRow(trial, r, k) {
    var a = state.answers[trial.trial_id];
    if (readyTrial !== trial.trial_id) return;
    a.choices[r] = k; a.rt_ms[r] = Date.now() - trialShownAt;
    save(); render();
  }
  function completeClustering(trial) {
    var a = state.answers[trial.trial_id];
    if (readyTrial !== trial.trial_id || a.choices.indexOf(null) >= 0) return;
    a.complete = true; save(); render();
  }

  function rowsOut() {
    var out = [];
    sequence().forEach(function (t, k) {  // position: where the participant saw the trial, from 1
      var a = state.answers[t.trial_id];
      if (!a || !a.complete) return;
      a.choices.forEach(function (c, r) { out.push({ trial_id: t.trial_id, row: r, choice: String(c), rt_ms: a.rt_ms[r], position: k + 1 }); });
    });
    return out;
  }
  function responses() {
    return {
      format: state.format, package_fingerprint: state.package_fingerprint, survey_id: state.survey_id,
      worker_id: state.worker_id, assignment_id: state.assignment_id, session_id: urlSession || state.session_id || "",
      completion_code: state.completion_code,
      started_at: state.started_at, finished_at: state.finished_at, user_agent: state.user_agent, answers: rowsOut()
    };
  }
  function csvCell(v) { v = v === null || v === undefined ? "" : String(v); return /[",\r\n]/.test(v) ? '"' + v.replace(/"/g, '""') + '"' : v; }
  function responsesCsv() {
    // started_at: the import keeps a worker's earliest attempt, whichever download (CSV or JSON) it came back as
    var head = ["package_fingerprint", "survey_id", "worker_id", "session_id", "trial_id", "row", "choice", "rt_ms", "position", "started_at"];
    var lines = [head.join(",")], session = responses().session_id;
    rowsOut().forEach(function (a) {
      lines.push([state.package_fingerprint, state.survey_id, state.worker_id, session, a.trial_id, a.row, a.choice, a.rt_ms, a.position,
                  state.started_at].map(csvCell).join(","));
    });
    return lines.join("\n") + "\n";
  }
  function download(text, type, ext) {
    var blob = new Blob([text], { type: type });
    var a = document.createElement("a");
    a.href = URL.createObjectURL(blob);
    a.download = "responses-" + data.survey_id + "-" + (state.worker_id || "anonymous").replace(/[^A-Za-z0-9_-]/g, "_") + "." + ext;
    document.body.appendChild(a); a.click(); a.remove();
  }

  function finish() {
    if (!state.finished_at) { state.finished_at = new Date().toISOString(); state.completion_code = data.completion_code; save(); }
    show("done");
    $("completion-code").textContent = data.completion_code;
    if (params.get("PROLIFIC_PID")) {
      $("prolific").classList.remove("hidden");
      $("prolific-link").href = "https://app.prolific.com/submissions/complete?cc=" + encodeURIComponent(data.completion_code);
    }
    // Only MTurk's own submit hosts: a crafted turkSubmitTo must not receive the answers or run script.
    var turk = params.get("turkSubmitTo"), origin = null;
    try { origin = turk ? new URL(turk).origin : null; } catch (e) { origin = null; }
    if (TURK_ORIGINS.indexOf(origin) >= 0 && urlAssignment && !preview) {
      $("mturk-form").classList.remove("hidden");
      $("mturk-form").action = origin + "/mturk/externalSubmit";
      $("mturk-assignment").value = urlAssignment;  // the assignment this page was opened for, now
      $("mturk-responses").value = JSON.stringify(responses());
    }
  }
  // Without an id in the URL the typed id names the saved answers, and typing it again continues them (a reload). The
  // field starts empty: showing the last id let the next person on a lab machine press Start and go on with the
  // previous person's answers, under their id.
  $("worker-id").value = KEY ? state.worker_id : "";
  $("worker-id").readOnly = Boolean(urlWorker);  // the platform's id is the participant's: not editable
  if (preview) { $("start").textContent = "Accept the HIT to start"; }
  function canStart() { $("start").disabled = preview || !($("consent-box").checked && $("worker-id").value.trim()); }
  $("consent-box").addEventListener("change", canStart);
  $("worker-id").addEventListener("input", canStart);
  $("start").addEventListener("click", function () {
    var typed = urlWorker || $("worker-id").value.trim();
    if (!urlIdentity) {
      KEY = BASE + ":" + typed;
      state = load(KEY, typed);
    }
    state.worker_id = typed; state.consent = true; state.order = state.order || drawOrder();
    state.started_at = state.started_at || new Date().toISOString(); save(); render();
  });
  $("download-json").addEventListener("click", function () { download(JSON.stringify(responses(), null, 1), "application/json", "json"); });
  $("download-csv").addEventListener("click", function () { download(responsesCsv(), "text/csv", "csv"); });

  document.addEventListener("keydown", function (e) {
    // Ctrl+F (find), Ctrl+J or a held key must not answer trials.
    if (preview || e.ctrlKey || e.metaKey || e.altKey || e.repeat || $("trial").classList.contains("hidden")) return;
    var trial = sequence()[nextIndex()];
    if (!trial) return;
    if (trial.task === "2afc") {
      if (e.key === "f" || e.key === "F" || e.key === "ArrowLeft") answer2afc(trial, "left");
      else if (e.key === "j" || e.key === "J" || e.key === "ArrowRight") answer2afc(trial, "right");
    } else if (e.key === "1" || e.key === "2" || e.key === "3") {
      answerRow(trial, currentRow, Number(e.key) - 1);
    } else if (e.key === "Enter") {
      var el = document.activeElement;
      if (el && el.tagName === "BUTTON" && el.id !== "next") return;  // Enter presses the focused row button, as a click would
      e.preventDefault(); completeClustering(trial);
    }
  });

  window.repalignResponses = responses;  // for tests and for researchers inspecting a session
  window.repalignResponsesCsv = responsesCsv;  // the CSV download's text
  render();
})();
