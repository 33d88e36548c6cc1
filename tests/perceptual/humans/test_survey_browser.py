"""The exported survey pages in a real browser: headless Chromium (Debian's ``chromium`` and ``chromium-driver``,
driven by Selenium) answers every trial by clicking, as three scripted respondents per survey: one that answers
correctly, one at random, one that answers the real trials correctly but fails the attention checks. The correct
respondent reloads half way (mid clustering trial too) and must lose nothing. Answers come back through the page's
download buttons (JSON for some workers, CSV for others) and go through :mod:`perceptual.humans`.
"""
from __future__ import annotations

import contextlib
import functools
import http.server
import io
import json
import shutil
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from perceptual.humans import human_scores, load_package, read_responses, scored

BROWSERS = ("chromium", "chromium-browser", "google-chrome")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--window-size=1000,900")


def _driver(download_dir: Path):
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install -e '.[dev]')")
    from selenium.webdriver.chrome.service import Service

    browser = next((shutil.which(b) for b in BROWSERS if shutil.which(b)), None)
    driver_path = shutil.which("chromedriver")
    if not browser or not driver_path:
        pytest.skip("no Chromium and chromedriver on PATH: apt-get install chromium chromium-driver (.ci/run does so as root)")
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tempfile.mkdtemp(prefix='repalign-chromium-')}")
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    driver.execute_cdp_cmd("Page.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(download_dir)})
    return driver


class _SlowImages(http.server.SimpleHTTPRequestHandler):
    """Serves images ``image_delay`` seconds late, as a slow connection does."""

    image_delay = 0.0

    def do_GET(self):
        if "/images/" in self.path:
            time.sleep(self.image_delay)
        super().do_GET()

    def log_message(self, *args):
        pass


@contextlib.contextmanager
def _serving(folder: Path, image_delay: float = 0.0):
    """A static server for ``folder`` on a free local port; yields its URL."""
    handler = functools.partial(type("Handler", (_SlowImages,), {"image_delay": image_delay}), directory=str(folder))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()


@pytest.fixture(scope="module")
def server(survey_package):
    with _serving(survey_package / "surveys") as url:  # the folder the README serves: base_url is its address
        yield url


def _by(name):
    from selenium.webdriver.common.by import By

    return getattr(By, name)


def _ready(driver, timeout: float = 10.0) -> None:
    """Wait until the shown trial's images have loaded (the page takes no answer before); at once where no trial is shown."""
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(driver, timeout).until(lambda d: d.execute_script(
        "return document.getElementById('trial').classList.contains('hidden') || document.getElementById('stage').hasAttribute('data-ready')"))


def _press(driver, key: str) -> None:
    """A key press once the trial can take it."""
    _ready(driver)
    driver.find_element(_by("TAG_NAME"), "body").send_keys(key)


def _wait_for(path_glob: Path, pattern: str, timeout: float = 10.0) -> Path:
    deadline = time.time() + timeout
    while time.time() < deadline:
        found = [p for p in path_glob.glob(pattern) if not p.name.endswith(".crdownload")]
        if found:
            return found[0]
        time.sleep(0.05)
    raise AssertionError(f"no download matching {pattern} in {path_glob}")


def _respond(driver, url: str, worker: str, truth: dict, strategy: str, rng: np.random.Generator, reload_at: int | None, shots: dict | None):
    """Answer a whole survey by clicking (and by keyboard); return the number of trials answered."""
    from selenium.webdriver.common.keys import Keys

    driver.get(f"{url}?workerId={worker}&assignmentId=A-{worker}")
    driver.execute_script("window.localStorage.clear()")
    driver.get(f"{url}?workerId={worker}&assignmentId=A-{worker}")
    if shots is not None:
        driver.save_screenshot(str(shots["instructions"]))
    assert driver.find_element(_by("ID"), "worker-id").get_attribute("value") == worker  # prefilled from MTurk's URL parameter
    driver.find_element(_by("ID"), "consent-box").click()
    driver.find_element(_by("ID"), "start").click()
    answered = 0
    while driver.find_element(_by("ID"), "done").get_attribute("class") == "hidden":
        _ready(driver)
        stage = driver.find_element(_by("ID"), "stage")
        trial = truth[stage.get_attribute("data-trial")]
        progress = driver.find_element(_by("ID"), "progress-text").text
        assert progress.startswith(f"Question {answered + 1} of "), progress
        if shots is not None and trial["task"] in shots and not shots[trial["task"]].exists():
            driver.save_screenshot(str(shots[trial["task"]]))
        choices = []
        for row in trial["rows"]:
            options = ["left", "right"] if trial["task"] == "2afc" else ["0", "1", "2"]
            if strategy == "random":
                choices.append(str(rng.choice(options)))
            elif strategy == "inattentive" and trial["attention_check"]:
                choices.append(next(o for o in options if o != row["answer"]))
            else:
                choices.append(row["answer"])
        by_keyboard = strategy == "correct" and answered % 2 == 1  # the correct respondent alternates keyboard and mouse
        if trial["task"] == "2afc" and by_keyboard:
            driver.find_element(_by("TAG_NAME"), "body").send_keys({"left": "f", "right": Keys.ARROW_RIGHT}[choices[0]])
        elif trial["task"] == "2afc":
            stage.find_element(_by("CSS_SELECTOR"), f'button[data-choice="{choices[0]}"]').click()
        elif by_keyboard:  # 1/2/3 answer the highlighted row, Enter goes on
            body = driver.find_element(_by("TAG_NAME"), "body")
            for choice in choices:
                body.send_keys(str(int(choice) + 1))
            body.send_keys(Keys.ENTER)
        else:
            for r, choice in enumerate(choices):
                driver.find_element(_by("CSS_SELECTOR"), f'#stage .row[data-row="{r}"] button[data-choice="{choice}"]').click()
                if reload_at is not None and answered == reload_at and r == len(choices) // 2:
                    driver.refresh()  # mid clustering trial: the rows answered so far must survive
                    buttons = driver.find_elements(_by("CSS_SELECTOR"), "#stage .row button.chosen")
                    assert len(buttons) == r + 1
                    _ready(driver)
            driver.find_element(_by("ID"), "next").click()
        answered += 1
        if reload_at is not None and answered == reload_at:
            driver.refresh()
            if driver.find_element(_by("ID"), "done").get_attribute("class") == "hidden":
                assert driver.find_element(_by("ID"), "progress-text").text.startswith(f"Question {answered + 1} of ")
    return answered


def test_three_scripted_respondents_in_chromium(survey_package, server, tmp_path):
    package = load_package(survey_package)
    truth = {t["trial_id"]: t for t in package.manifest["trials"]}
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    shots_dir = tmp_path / "screenshots"
    shots_dir.mkdir()
    driver = _driver(downloads)
    rng = np.random.default_rng(0)
    files = []
    try:
        # MTurk's preview (before a worker accepts the HIT) cannot start, even with consent and an id.
        driver.get(f"{server}/2afc-000/index.html?assignmentId=ASSIGNMENT_ID_NOT_AVAILABLE&workerId=preview")
        driver.find_element(_by("ID"), "consent-box").click()
        assert not driver.find_element(_by("ID"), "start").is_enabled()
        # One survey per task keeps the test near 25 s on 2 shared cores (the others are built the same way).
        for survey in [s for s in package.manifest["surveys"] if s["survey_id"] in ("2afc-000", "clustering-000")]:
            sid, n_trials = survey["survey_id"], survey["n_trials"]
            url = f"{server}/{sid}/index.html"
            for strategy in ("correct", "random", "inattentive"):
                worker = f"{strategy}-{sid}".replace("_", "-")
                first = sid in ("2afc-000", "clustering-000") and strategy == "correct"
                shots = {"instructions": shots_dir / f"instructions-{sid}.png", "2afc": shots_dir / "2afc.png",
                         "clustering": shots_dir / "clustering.png"} if first else None
                answered = _respond(driver, url, worker, truth, strategy, rng, reload_at=n_trials // 2 if strategy == "correct" else None, shots=shots)
                assert answered == n_trials
                assert driver.find_element(_by("ID"), "completion-code").text == survey["completion_code"]
                kind = "json" if strategy != "random" else "csv"
                driver.find_element(_by("ID"), f"download-{kind}").click()
                files.append(_wait_for(downloads, f"responses-{sid}-{worker}.{kind}"))
    finally:
        driver.quit()
    for name in ("2afc.png", "clustering.png", "instructions-2afc-000.png"):
        assert (shots_dir / name).stat().st_size > 5000

    for csv_file in [f for f in files if f.suffix == ".csv"]:  # the CSV download carries the attempt's start, as the JSON does
        assert pd.read_csv(csv_file)["started_at"].str.match(r"\d{4}-\d\d-\d\dT").all()
    responses = read_responses(files, package)
    assert responses.excluded == []  # every trial answered, nothing unknown or repeated
    assert responses.answers["rt_ms"].notna().all() and (responses.answers["rt_ms"] >= 0).all()  # the page's times are read back
    positions = responses.answers.groupby(["submission", "trial_id"])["position"].first().groupby(level="submission").apply(sorted)
    assert all(p == list(range(1, len(p) + 1)) for p in positions)  # and where each trial was seen: every position once
    table = scored(responses, package)
    accuracy = table.groupby(table["worker_id"].str.split("-").str[0])["correct"].mean()
    assert accuracy["correct"] == 1.0
    # Random choice: 2AFC chance 1/2, clustering 1/3; mean over all answers (~63) within ±0.2 of the pooled chance.
    random_answers = table[table["worker_id"].str.startswith("random")]
    chance = np.where(random_answers["task"] == "2afc", 0.5, 1 / 3).mean()
    assert abs(random_answers["correct"].mean() - chance) < 0.2
    real_inattentive = table[table["worker_id"].str.startswith("inattentive") & ~table["attention_check"]]
    assert real_inattentive["correct"].mean() == 1.0

    result = human_scores(package, responses, n_boot=200)
    attention = {a["worker_id"]: a for a in result["attention"]}
    assert all(not a["excluded"] and a["failed"] == 0 for w, a in attention.items() if w.startswith("correct"))
    assert all(a["excluded"] and a["failed"] == a["checks"] > 0 for w, a in attention.items() if w.startswith("inattentive"))
    kept = {w for w, a in attention.items() if not a["excluded"]}
    assert not any(w.startswith("inattentive") for w in kept)
    # Only random respondents that happened to pass every check remain beside the correct ones.
    assert {w.split("-")[0] for w in kept} <= {"correct", "random"}
    if not any(w.startswith("random") for w in kept):
        for model in result["models"].values():
            for task in model.values():
                # over workers the interval needs 6 of them; over trials it is that of a perfect score
                assert task["accuracy"] == 1.0 and task["ci_trials"] == [1.0, 1.0]
                assert task["ci_workers"] == [1.0, 1.0] if task["n_workers"] >= 6 else all(v != v for v in task["ci_workers"])
    json.dumps(result)  # the report's JSON takes it as it is


def _answer_all_by_keyboard(driver, key="f"):
    while driver.find_element(_by("ID"), "done").get_attribute("class") == "hidden":
        _press(driver, key)


def _section(driver) -> str:
    return next(s for s in ("consent", "trial", "done") if "hidden" not in driver.find_element(_by("ID"), s).get_attribute("class"))


def test_every_participant_and_assignment_has_answers_of_its_own(survey_package, server, tmp_path):
    """A second person on the same browser landed on the first one's finished survey (their code, their MTurk form);
    a re-accepted HIT posted the returned assignment's id; preview with saved answers took key presses."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys

    url = f"{server}/2afc-000/index.html"
    driver = _driver(tmp_path)
    try:
        def start(query: str, worker: str | None = None):
            driver.get(f"{url}?{query}")
            if worker is not None:
                field = driver.find_element(_by("ID"), "worker-id")
                field.clear()
                field.send_keys(worker)
            driver.find_element(_by("ID"), "consent-box").click()
            driver.find_element(_by("ID"), "start").click()

        driver.get(url)
        driver.execute_script("window.localStorage.clear()")
        mturk = "turkSubmitTo=https://workersandbox.mturk.com"
        start(f"workerId=W1&assignmentId=A1&{mturk}")
        _answer_all_by_keyboard(driver)
        assert driver.find_element(_by("ID"), "mturk-assignment").get_attribute("value") == "A1"
        # W2 on the same browser starts afresh, with an MTurk form of their own
        driver.get(f"{url}?workerId=W2&assignmentId=A2&{mturk}")
        assert _section(driver) == "consent" and driver.find_element(_by("ID"), "worker-id").get_attribute("value") == "W2"
        start(f"workerId=W2&assignmentId=A2&{mturk}")
        assert driver.find_element(_by("ID"), "progress-text").text.startswith("Question 1 of ")
        # Ctrl+F (find) and a held key answer nothing
        _ready(driver)
        ActionChains(driver).key_down(Keys.CONTROL).send_keys("f").key_up(Keys.CONTROL).perform()
        assert driver.find_element(_by("ID"), "progress-text").text.startswith("Question 1 of ")
        _answer_all_by_keyboard(driver, "j")
        assert driver.find_element(_by("ID"), "mturk-assignment").get_attribute("value") == "A2"
        assert driver.execute_script("return window.repalignResponses().worker_id") == "W2"
        # MTurk's preview shows the consent page even where answers are saved, and takes no key
        driver.get(f"{url}?workerId=W3&assignmentId=A3&{mturk}")
        start(f"workerId=W3&assignmentId=A3&{mturk}")
        driver.get(f"{url}?workerId=W3&assignmentId=ASSIGNMENT_ID_NOT_AVAILABLE")
        driver.find_element(_by("TAG_NAME"), "body").send_keys("f")
        assert _section(driver) == "consent" and not driver.find_element(_by("ID"), "start").is_enabled()
        # a crafted turkSubmitTo gets no form: the answers go to MTurk's hosts only
        driver.get(f"{url}?workerId=W1&assignmentId=A1&turkSubmitTo=javascript:alert(1)//")
        assert _section(driver) == "done" and "hidden" in driver.find_element(_by("ID"), "mturk-form").get_attribute("class")
        # Prolific: the URL's SESSION_ID goes with the answers, so that import can match the export's Submission id
        start("PROLIFIC_PID=P9&STUDY_ID=ST&SESSION_ID=SESS9")
        _answer_all_by_keyboard(driver)
        assert driver.execute_script("return window.repalignResponses().session_id") == "SESS9"
        assert "hidden" not in driver.find_element(_by("ID"), "prolific").get_attribute("class")
        # without an id in the URL (a lab machine), each typed id has its own answers; the field starts empty, so the next
        # person cannot press Start and go on with the last one's answers (it showed the last id)
        start("", worker="P1")
        _answer_all_by_keyboard(driver)
        start("", worker="P2")
        assert driver.find_element(_by("ID"), "progress-text").text.startswith("Question 1 of ")
        _press(driver, "f")
        driver.get(url)
        assert _section(driver) == "consent" and driver.find_element(_by("ID"), "worker-id").get_attribute("value") == ""
        driver.find_element(_by("ID"), "consent-box").click()
        assert not driver.find_element(_by("ID"), "start").is_enabled()  # an id is needed
        start("", worker="P2")  # the same id typed again continues
        assert driver.find_element(_by("ID"), "progress-text").text.startswith("Question 2 of ")
    finally:
        driver.quit()


def test_two_tabs_keep_each_others_answers_and_odd_ids_survive(survey_package, server, tmp_path):
    """Each tab saved its own copy whole, so the tab that answered last erased the other's answers; the typed id "last"
    was the key of the page's last-id slot; a carriage return in an id split the CSV download's rows."""
    url = f"{server}/2afc-000/index.html"
    driver = _driver(tmp_path)
    answers = lambda: len(driver.execute_script("return window.repalignResponses().answers"))  # noqa: E731
    try:
        driver.get(url)
        driver.execute_script("window.localStorage.clear()")
        driver.get(f"{url}?workerId=W1&assignmentId=A1")
        driver.find_element(_by("ID"), "consent-box").click()
        driver.find_element(_by("ID"), "start").click()
        first = driver.current_window_handle
        for _ in range(3):
            _press(driver, "f")
        driver.switch_to.new_window("tab")
        driver.get(f"{url}?workerId=W1&assignmentId=A1")
        second = driver.current_window_handle
        driver.switch_to.window(first)
        for _ in range(5):
            _press(driver, "f")
        assert answers() == 8
        driver.switch_to.window(second)
        _press(driver, "j")
        assert answers() == 9 and driver.find_element(_by("ID"), "progress-text").text.startswith("Question 10 of ")
        driver.switch_to.window(first)
        driver.refresh()
        assert answers() == 9
        driver.close()
        driver.switch_to.window(second)
        # lab mode: "last" is an id like any other
        for worker in ("P7", "last"):
            driver.get(url)
            field = driver.find_element(_by("ID"), "worker-id")
            field.clear()
            field.send_keys(worker)
            driver.find_element(_by("ID"), "consent-box").click()
            driver.find_element(_by("ID"), "start").click()
            for _ in range(2):
                _press(driver, "f")
        driver.get(url)
        field = driver.find_element(_by("ID"), "worker-id")
        assert field.get_attribute("value") == ""
        field.send_keys("last")
        driver.find_element(_by("ID"), "consent-box").click()
        driver.find_element(_by("ID"), "start").click()
        assert answers() == 2 and driver.execute_script("return window.repalignResponses().worker_id") == "last"
        driver.get(f"{url}?workerId=cr%0Dlf&assignmentId=A9")
        driver.find_element(_by("ID"), "consent-box").click()
        driver.find_element(_by("ID"), "start").click()
        _press(driver, "f")
        frame = pd.read_csv(io.StringIO(driver.execute_script("return window.repalignResponsesCsv()")))
        assert list(frame["worker_id"]) == ["cr\rlf"] and len(frame) == 1
    finally:
        driver.quit()


def test_double_clicks_platform_ids_blocked_storage_and_response_times(survey_package, server, tmp_path):
    """A double-click answered two trials (the next trial's option appears under the pointer); the id from the URL could
    be overwritten by typing; blocked storage stopped the page with an exception; a clustering row's time counted from
    the previous click, not from the trial's display."""
    from selenium.webdriver.common.action_chains import ActionChains

    driver = _driver(tmp_path)
    try:
        url = f"{server}/2afc-000/index.html"
        driver.get(url)
        driver.execute_script("window.localStorage.clear()")
        driver.get(f"{url}?PROLIFIC_PID=P1&SESSION_ID=S1")
        field = driver.find_element(_by("ID"), "worker-id")
        field.send_keys("X")
        assert field.get_attribute("value") == "P1" and field.get_attribute("readonly") is not None
        driver.find_element(_by("ID"), "consent-box").click()
        driver.find_element(_by("ID"), "start").click()
        _ready(driver)
        option = driver.find_element(_by("CSS_SELECTOR"), '#stage button[data-choice="left"]')
        ActionChains(driver).double_click(option).perform()
        assert driver.find_element(_by("ID"), "progress-text").text.startswith("Question 2 of ")
        responses = driver.execute_script("return window.repalignResponses()")
        assert responses["worker_id"] == "P1" and len(responses["answers"]) == 1

        # Clustering: each row's time counts from the trial's display.
        driver.get(f"{server}/clustering-000/index.html?workerId=RT&assignmentId=A-RT")
        driver.find_element(_by("ID"), "consent-box").click()
        driver.find_element(_by("ID"), "start").click()
        n_rows = len(driver.find_elements(_by("CSS_SELECTOR"), "#stage .row"))
        _ready(driver)
        for r in range(n_rows):
            time.sleep(0.2)
            driver.find_element(_by("CSS_SELECTOR"), f'#stage .row[data-row="{r}"] button[data-choice="0"]').click()
        driver.find_element(_by("ID"), "next").click()
        times = [a["rt_ms"] for a in driver.execute_script("return window.repalignResponses()")["answers"]]
        assert len(times) == n_rows and times == sorted(times) and times[-1] >= 200 * n_rows, times

        # Storage blocked: the page warns and runs on in memory.
        driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": (
            "Object.defineProperty(window, 'localStorage', {get: function () { throw new DOMException('blocked', 'SecurityError'); }});")})
        driver.get(f"{url}?workerId=B1&assignmentId=A-B1")
        assert "hidden" not in driver.find_element(_by("ID"), "storage-warning").get_attribute("class")
        driver.find_element(_by("ID"), "consent-box").click()
        driver.find_element(_by("ID"), "start").click()
        _answer_all_by_keyboard(driver)
        assert _section(driver) == "done"
        assert driver.execute_script("return window.repalignResponses().worker_id") == "B1"
    finally:
        driver.quit()


def _shown_order(driver, url: str, reload_after: int) -> tuple[list[str], dict]:
    """Start ``url`` afresh, answer every trial with F, reload once; the trial ids in the order shown, and the answers."""
    driver.get(url)
    driver.execute_script("window.localStorage.clear()")
    driver.get(url)
    driver.find_element(_by("ID"), "consent-box").click()
    driver.find_element(_by("ID"), "start").click()
    shown = []
    while _section(driver) == "trial":
        _ready(driver)
        shown.append(driver.find_element(_by("ID"), "stage").get_attribute("data-trial"))
        _press(driver, "f")
        if len(shown) == reload_after:
            driver.refresh()  # the participant's id comes from the URL: the page continues at once
    return shown, driver.execute_script("return window.repalignResponses()")


def test_each_participant_sees_an_order_of_their_own_kept_across_reloads(survey_package, inversion_sets, server, tmp_path):
    """The page showed every participant the survey's trials in the package's order, so position effects (learning,
    fatigue) fell on the same trials for everyone; trial_order=fixed keeps that order on purpose."""
    from stimuli.survey import build_survey

    package = load_package(survey_package)
    in_package = [t["trial_id"] for t in package.manifest["trials"] if t["survey_id"] == "2afc-000"]
    driver = _driver(tmp_path)
    try:
        orders = []
        for worker in ("O1", "O2"):
            shown, responses = _shown_order(driver, f"{server}/2afc-000/index.html?workerId={worker}&assignmentId=A-{worker}", reload_after=4)
            assert sorted(shown) == sorted(in_package) and len(shown) == len(in_package)  # each trial once, the reload lost none
            assert {a["trial_id"]: a["position"] for a in responses["answers"]} == {t: k + 1 for k, t in enumerate(shown)}
            orders.append(shown)
        # 15 trials: two independent shuffles agree, or one equals the package's order, with probability about 1e-12
        assert orders[0] != orders[1] and in_package not in orders

        fixed = tmp_path / "fixed"
        build_survey(inversion_sets, fixed, tasks=("2afc",), trials_per_survey=15, attention_rate=0.2, seed=0, trial_order="fixed")
        fixed_ids = [t["trial_id"] for t in load_package(fixed).manifest["trials"] if t["survey_id"] == "2afc-000"]
        with _serving(fixed / "surveys") as url:
            shown, _ = _shown_order(driver, f"{url}/2afc-000/index.html?workerId=F1&assignmentId=A-F1", reload_after=4)
        assert shown == fixed_ids
    finally:
        driver.quit()
    with pytest.raises(ValueError, match="unknown trial_order 'random'"):
        build_survey(inversion_sets, tmp_path / "bad", trial_order="random")


def test_a_trial_takes_answers_once_its_images_have_loaded(survey_package, tmp_path):
    """On a slow connection a key pressed while the images loaded answered a trial the participant had not seen, and
    rt_ms counted from the blank stage; the next trial's images now load while this one is answered."""
    delay = 1.5
    driver = _driver(tmp_path)
    try:
        with _serving(survey_package / "surveys", image_delay=delay) as url:
            page = f"{url}/2afc-000/index.html?workerId=S1&assignmentId=A-S1"
            driver.get(page)
            driver.execute_script("window.localStorage.clear()")
            driver.get(page)
            driver.find_element(_by("ID"), "consent-box").click()
            driver.find_element(_by("ID"), "start").click()
            driver.find_element(_by("TAG_NAME"), "body").send_keys("f")  # before the images are there
            answers = lambda: driver.execute_script("return window.repalignResponses().answers")  # noqa: E731
            assert answers() == [] and "loading" in driver.find_element(_by("ID"), "stage").get_attribute("class")
            assert "hidden" not in driver.find_element(_by("ID"), "loading-note").get_attribute("class")
            _ready(driver)
            assert "hidden" in driver.find_element(_by("ID"), "loading-note").get_attribute("class")
            time.sleep(2 * delay)  # the next trial's images load meanwhile
            driver.find_element(_by("TAG_NAME"), "body").send_keys("f")
            (first,) = answers()
            assert 2 * delay * 1000 <= first["rt_ms"] < 2 * delay * 1000 + 700  # from the images' arrival (the blank stage: 3 * delay)
            assert driver.find_element(_by("ID"), "stage").get_attribute("data-ready") == "true"  # preloaded: shown at once
    finally:
        driver.quit()


def test_narrow_screens_small_windows_and_keyboard_rows_keep_everything_reachable(survey_package, server, tmp_path):
    """At 320 px the left 2AFC option started off-screen, where no scrolling reaches; the 1/2/3 keys answered clustering
    rows below the window, unseen; Enter on a focused row button was swallowed; and the images were forced to 128 px
    (96 px as rows), whatever the set's size."""
    from selenium.webdriver.common.keys import Keys

    from stimuli.survey import display_size

    driver = _driver(tmp_path)
    try:
        driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {"width": 320, "height": 640, "deviceScaleFactor": 1, "mobile": False})
        driver.get(f"{server}/2afc-000/index.html?workerId=N1&assignmentId=A-N1")
        driver.find_element(_by("ID"), "consent-box").click()
        driver.find_element(_by("ID"), "start").click()
        _ready(driver)
        edges = driver.execute_script("return Array.from(document.querySelectorAll('#stage button.option'))"
                                      ".map(function (b) { var r = b.getBoundingClientRect(); return [r.left, r.right]; })")
        assert len(edges) == 2 and min(left for left, _ in edges) >= 0, edges
        height, width, factor = display_size(32, 32)  # the sets' 32 x 32 images, every pixel 4 x 4 screen pixels
        sizes = driver.execute_script("return Array.from(document.querySelectorAll('#stage img.stim'))"
                                      ".map(function (i) { return [i.clientWidth, i.clientHeight, i.naturalWidth, getComputedStyle(i).imageRendering]; })")
        assert all(s == [width, height, 32, "pixelated"] for s in sizes) and factor == 4, sizes

        # A short window: the highlighted row stays in view under the sticky columns as keys answer the rows above it.
        driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {"width": 1000, "height": 500, "deviceScaleFactor": 1, "mobile": False})
        driver.get(f"{server}/clustering-000/index.html?workerId=N2&assignmentId=A-N2")
        driver.find_element(_by("ID"), "consent-box").click()
        driver.find_element(_by("ID"), "start").click()
        n_rows = len(driver.find_elements(_by("CSS_SELECTOR"), "#stage .row"))
        body = driver.find_element(_by("TAG_NAME"), "body")
        sizes = driver.execute_script("return Array.from(document.querySelectorAll('#stage img.stim')).map(function (i) { return i.clientWidth; })")
        assert set(sizes) == {width}  # rows as large as the columns
        for r in range(n_rows - 2):
            _press(driver, "1")
            view = driver.execute_script(
                "var row = document.querySelector('#stage .row.current').getBoundingClientRect(),"
                " cols = document.querySelector('#stage .columns').getBoundingClientRect();"
                "return [row.top, row.bottom, cols.bottom, window.innerHeight];")
            assert view[0] >= view[2] - 1 and view[1] <= view[3] + 1, (r, view)  # below the columns, above the window's bottom
        # Enter on a focused row button chooses it, and focus stays on that choice in the next row
        driver.execute_script("document.querySelector('#stage .row.current button[data-choice=\"2\"]').focus()")
        driver.switch_to.active_element.send_keys(Keys.ENTER)
        chosen = driver.execute_script("return Array.from(document.querySelectorAll('#stage .row')).map(function (row) {"
                                       " var b = row.querySelector('button.chosen'); return b ? b.getAttribute('data-choice') : null; })")
        assert chosen == ["0"] * (n_rows - 2) + ["2", None], chosen
        active = driver.execute_script("var a = document.activeElement; return [a.closest('.row') && a.closest('.row').getAttribute('data-row'),"
                                       " a.getAttribute('data-choice')]")
        assert active == [str(n_rows - 1), "2"]
        body.send_keys("2")
        body.send_keys(Keys.ENTER)  # with the last row's focus gone to the body, Enter goes on to the next trial
        assert driver.find_element(_by("ID"), "progress-text").text.startswith("Question 2 of ")
    finally:
        driver.quit()
