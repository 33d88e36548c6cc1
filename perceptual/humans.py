"""Human survey answers read back and scored: the Human columns of Nanda et al. (AAAI 2023), Table 1.

Reads what a :func:`stimuli.survey.build_survey` package collects: the page's JSON and CSV downloads and
MTurk's batch results CSV (``WorkerId``, ``AssignmentId``, ``AssignmentStatus``, ``Answer.responses`` holding
the page's JSON, which the page posts to MTurk's ``externalSubmit``), and Prolific's submissions export
(``Submission id``, ``Participant id``, ``Status``), which holds no answers but says which submissions were
returned, rejected, timed out or screened out. Every answer is checked against the package manifest; what cannot be
used is excluded with a reason and counted, never dropped silently.

Scoring follows the paper's Appendix A: workers who fail attention checks are excluded (default: any failure);
optionally, so are submissions answered too fast to have looked at the images (``min_median_rt_ms``: the median time
per trial, from the page's ``rt_ms``; the paper names no such rule, it is common practice on MTurk and Prolific);
accuracy per model and task (2AFC: the target chosen; clustering: a row matched to its target's column) with
95 % percentile-bootstrap intervals over workers and over trials (:func:`perceptual.tasks.bootstrap_interval`,
resampling whole clusters); agreement between annotators as Fleiss' kappa per survey (the paper had 3 workers
per survey) and the spread of per-worker accuracy (the paper's "variance between annotators"). The paper's
reliability analysis compares the human ranking of models with each observer's (Kendall's tau, Spearman's
rho, :mod:`scipy.stats`) and the answers trial by trial (:func:`trial_agreement`).
"""
from __future__ import annotations

import io
import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd
import torch
from scipy import stats

from stimuli.sets import read_png
from stimuli.survey import FORMAT, truth_table

from .metrics.survey import fleiss_kappa
from .observers import Observer
from .report import is_number
from .statistics import SIGN_FLIP_MIN_N, percentile_interval
from .tasks import bootstrap_interval, judge_2afc, judge_clustering

logger = logging.getLogger("perceptual")

ANSWER_COLUMNS = ["submission", "source", "worker_id", "survey_id", "trial_id", "row", "choice", "rt_ms", "position"]


@dataclass
class SurveyPackage:
    """A survey package's manifest and its answer units (one row per 2AFC trial or clustering row)."""

    path: Path
    manifest: dict
    truth: pd.DataFrame

    @property
    def fingerprint(self) -> str:
        return self.manifest["fingerprint"]


def load_package(path: str | Path) -> SurveyPackage:
    path = Path(path)
    file = path / "manifest.json"
    if not file.is_file():
        raise FileNotFoundError(f"{file} not found: pass the folder that `python -m stimuli survey` wrote (it holds manifest.json)")
    manifest = json.loads(file.read_text())
    if manifest.get("format") != FORMAT:
        raise ValueError(f"{file} is not a survey package manifest (format {manifest.get('format')!r}, expected {FORMAT!r})")
    return SurveyPackage(path, manifest, truth_table(manifest))


@dataclass
class Responses:
    """Answers that passed validation, and a log of everything excluded with its reason."""

    answers: pd.DataFrame
    excluded: list[dict] = field(default_factory=list)
    submissions: int = 0
    prolific_without_answers: list[str] = field(default_factory=list)  # see ProlificStatuses.without_answers
    # Per submission, the last place in the participant's order that any of its answers holds, valid or not (NaN without
    # positions): how far the participant got (attention_failures' unreached checks).
    last_positions: dict[str, float] = field(default_factory=dict)

    def exclusion_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for e in self.excluded:
            counts[e["reason"]] = counts.get(e["reason"], 0) + e["answers"]
        return counts


# Prolific's submission statuses of participants who withdrew or were turned away: their answers are not used.
PROLIFIC_WITHDRAWN = ("RETURNED", "REJECTED", "TIMED-OUT", "SCREENED-OUT")


def _column_key(name: str) -> str:
    return " ".join(str(name).replace("_", " ").lower().split())


def _prolific_status(value) -> str:
    """A Prolific status as :data:`PROLIFIC_WITHDRAWN` spells it: Prolific writes both ``TIMED-OUT`` and ``SCREENED OUT``
    (and ``AWAITING REVIEW``), so spaces, hyphens and underscores all read as one hyphen."""
    return "-".join(str(value).replace("_", " ").replace("-", " ").upper().split())


def is_prolific_export(columns: Iterable[str]) -> bool:
    """Whether a CSV's header is Prolific's submissions export (``Participant id`` and ``Status``, in any case)."""
    keys = {_column_key(c) for c in columns}
    return {"participant id", "status"} <= keys


@dataclass
class ProlificStatuses:
    """Prolific's status of each submission (by its ``Submission id``, the ``SESSION_ID`` the page records) and of
    each participant (every status of their submissions in the exports given)."""

    by_session: dict[str, str] = field(default_factory=dict)
    by_participant: dict[str, set[str]] = field(default_factory=dict)
    # participants with an export row that names no submission: answers of theirs with an unknown session id may be of it
    without_session_ids: set[str] = field(default_factory=set)

    def add(self, table: pd.DataFrame) -> None:
        columns = {_column_key(c): c for c in table.columns}
        for record in table.to_dict("records"):
            status = _prolific_status(record[columns["status"]])
            participant = str(record[columns["participant id"]]).strip()
            session = str(record.get(columns.get("submission id"), "") or "").strip()
            if session:
                self.by_session[session] = status
            if participant:
                self.by_participant.setdefault(participant, set()).add(status)
                if not session:
                    self.without_session_ids.add(participant)

    def without_answers(self, answered: Iterable[str]) -> list[str]:
        """Participants of the exports who are not withdrawn and gave no valid answer among the files read: the completion
        code is readable in the page's source, so check them before approving (or find their missing downloads)."""
        answered = set(answered)
        return sorted(p for p, statuses in self.by_participant.items() if p not in answered and not statuses <= set(PROLIFIC_WITHDRAWN))

    def exclusion(self, submission: Mapping) -> str | None:
        """Why ``submission`` is excluded, or None: its own submission's status where the page recorded Prolific's
        ``SESSION_ID`` and the exports hold it, else its participant's statuses; answers Prolific does not know (MTurk,
        a lab, or a submission of another study whose export was not given: its session id is in none of the exports,
        all of whose rows for the participant name theirs) are kept."""
        session = str(submission.get("session_id") or "").strip()
        participant = _worker_id(submission)
        if session in self.by_session:
            statuses = {self.by_session[session]}
        elif session and participant not in self.without_session_ids:
            return None  # a returned submission elsewhere says nothing about this one
        else:
            statuses = self.by_participant.get(participant, set())
        withdrawn = statuses & set(PROLIFIC_WITHDRAWN)
        if not withdrawn:
            return None
        if len(statuses) > 1:
            return (f"the participant's Prolific submissions are {', '.join(sorted(statuses))} and these answers carry no session id to "
                    "tell which (add SESSION_ID={{%SESSION_ID%}} to the study URL)")
        return f"submission {withdrawn.pop().lower()} on Prolific"


def _submissions_from_file(path: Path, prolific: ProlificStatuses) -> list[dict]:
    """Raw submissions (dicts like the page's JSON download) from one file of any supported format; a Prolific export
    adds its statuses to ``prolific`` and holds no submission."""
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as error:
        if path.suffix.lower() == ".csv":  # typically re-saved by Excel in the system's code page
            advice = "was it re-saved by a spreadsheet? Save it as 'CSV UTF-8', or use the page's original download"
        else:  # the page writes UTF-8 JSON: this is some other file with the same ending
            advice = "it is not a download of the survey page; download it again, or move it out of the answers folder"
        raise ValueError(f"{path} is not UTF-8 text ({error}): {advice}") from error
    if not text.strip():
        raise ValueError(f"{path} is empty: was the download cut short? Download it again from the survey page, or move it out of "
                         "the answers folder")
    if path.suffix.lower() == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as error:  # a download cut short: name the file, not just the character
            raise ValueError(f"{path} is not valid JSON ({error}): was the download cut short? Download it again from the "
                             "survey page, or move it out of the answers folder") from error
        items = data if isinstance(data, list) else [data]
        if not all(isinstance(item, dict) for item in items):
            kinds = sorted({type(item).__name__ for item in items if not isinstance(item, dict)})
            raise ValueError(f"{path} holds JSON that is not the survey page's download (an object, or a list of them; found {', '.join(kinds)}): "
                             "download it again from the survey page, or move it out of the answers folder")
        return [_checked_shape({**item, "source": str(path)}) for item in items]
    if path.suffix.lower() != ".csv":
        raise ValueError(f"{path}: unsupported file type; give the page's .json or .csv downloads or an MTurk batch results .csv")
    try:
        table = pd.read_csv(io.StringIO(text), dtype=str, keep_default_na=False)
    except pd.errors.ParserError as error:
        raise ValueError(f"{path} is not a readable CSV ({error}): download it again, or move it out of the answers folder") from error
    table = _without_repeated_headers(table, path)
    if "Answer.responses" in table.columns:  # MTurk batch results
        missing = {"WorkerId", "AssignmentId"} - set(table.columns)
        if missing:
            raise ValueError(f"{path}: an MTurk batch results file needs columns {sorted(missing)}")
        return [_mturk_submission(record, path) for record in table.to_dict("records")]
    if is_prolific_export(table.columns):
        prolific.add(table)
        return []
    needed = {"package_fingerprint", "survey_id", "worker_id", "trial_id", "row", "choice"}
    if not needed <= set(table.columns):
        separator = " (the columns are separated by semicolons: save it with commas)" if any(";" in c for c in table.columns) else ""
        raise ValueError(f"{path}: a page CSV needs columns {sorted(needed)}, found {list(table.columns)}{separator}; an MTurk file needs "
                         "Answer.responses, a Prolific export Participant id and Status")
    for recorded_later in ("session_id", "started_at"):  # downloads of pages from before the page recorded them
        if recorded_later not in table.columns:
            table[recorded_later] = ""
    fields = ["trial_id", "row", "choice"] + [c for c in ("rt_ms", "position") if c in table.columns]  # older pages, hand-made CSVs lack them
    out = []
    keys = ["package_fingerprint", "survey_id", "worker_id", "session_id", "started_at"]
    for (fingerprint, survey, worker, session, started), group in table.groupby(keys, sort=False):
        answers = group[fields].to_dict("records")
        out.append({"package_fingerprint": fingerprint, "survey_id": survey, "worker_id": worker, "session_id": session,
                    "started_at": started or None, "answers": answers, "source": str(path)})
    return out


def _without_repeated_headers(table: pd.DataFrame, path: Path) -> pd.DataFrame:
    """``table`` without the header rows of further files in it (``cat a.csv b.csv > all.csv``, or batch results pasted
    one below the other), which would otherwise be read as a submission of worker "worker_id". A repeated header in
    another column order is refused: the rows below it would be read under the wrong columns."""
    columns = list(table.columns)
    headers = table.isin(columns).all(axis=1) & (table.nunique(axis=1) > 1)  # every cell a column name, not one name repeated
    if not headers.any():
        return table
    reordered = headers & ~(table == columns).all(axis=1)
    if reordered.any():
        raise ValueError(f"{path} joins CSV files with different columns (a header row in another order at line "
                         f"{int(reordered.idxmax()) + 2}): import the files one by one instead of joined")
    logger.info("%s: dropped %d repeated header rows (files joined into one)", path, int(headers.sum()))
    return table[~headers].reset_index(drop=True)


def _mturk_submission(record: Mapping, path: Path) -> dict:
    base = {"worker_id": record.get("WorkerId", ""), "assignment_id": record.get("AssignmentId", ""), "source": f"{path}#{record.get('AssignmentId', '')}",
            "status": record.get("AssignmentStatus", "")}
    try:
        payload = json.loads(record["Answer.responses"])
    except (TypeError, ValueError) as error:
        return {**base, "invalid": f"Answer.responses is not the page's JSON ({error})"}
    if not isinstance(payload, dict):
        return {**base, "invalid": f"Answer.responses is JSON but not the page's object (a {type(payload).__name__})"}
    return _checked_shape({**payload, **base})


def _checked_shape(submission: dict) -> dict:
    """``submission`` marked ``invalid`` (an exclusion with its reason, like an unreadable MTurk row) where it does not
    have the page's shape: ids that are text, ``answers`` a list of objects. Hand-edited or foreign JSON otherwise fails
    deep inside the import without naming its file."""
    fixed, problems = dict(submission), []
    for key in ("package_fingerprint", "survey_id", "worker_id", "session_id", "started_at"):
        value = submission.get(key)
        if value is not None and not isinstance(value, (str, int, float)):
            fixed[key] = str(value)
            problems.append(f"{key} is a {type(value).__name__}, not text")
    answers = submission.get("answers")
    if answers is not None and not (isinstance(answers, list) and all(isinstance(a, dict) for a in answers)):
        fixed["answers"] = []
        problems.append("answers is not a list of objects")
    if problems and "invalid" not in submission:
        fixed["invalid"] = f"{'; '.join(problems)} (not the page's download)"
    return fixed


def _number(value, minimum: float) -> float:
    """A recorded number (``rt_ms``, ``position``) as a float; NaN where it is missing, not a number, infinite or below
    ``minimum`` (a negative time: the clock changed)."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return math.nan
    return number if math.isfinite(number) and number >= minimum else math.nan


LATER_ATTEMPT = ("a later attempt at a survey the worker had already submitted (the earliest is kept: by the page's started_at, "
                 "else the first file read)")
COPY = "another copy of a submission already read (the page's JSON and CSV downloads and the MTurk row hold the same answers; counted once)"


def _worker_id(submission: Mapping) -> str:
    """The submission's worker id as the import compares it: stripped; missing or blank is no id."""
    return str(submission.get("worker_id") or "").strip()


def _text_field(submission: Mapping, key: str) -> str:
    """An optional field of a submission as text: ``assignment_id`` (the MTurk assignment: the batch row's or the page's
    own record) or ``started_at`` (the page's ISO start time); empty where the file has none (an empty CSV cell reads
    as NaN)."""
    value = submission.get(key)
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) else str(value).strip()


def _answer_signature(submission: Mapping) -> tuple:
    """What a submission answered, whatever file it came from (the page's JSON or CSV download, an MTurk row): copies of
    one attempt have the same signature."""
    return tuple(sorted((str(a.get("trial_id")), str(a.get("row")), str(a.get("choice"))) for a in submission.get("answers") or []))


def _row_number(value) -> int:
    """An answer's row as a whole number (``1``, ``"1"``, ``1.0`` from a spreadsheet column with blanks), or -1, which
    no trial has: ``int()`` alone read ``0.9`` as row 0 and ``True`` as row 1."""
    if isinstance(value, bool):
        return -1
    try:
        number = float(value)
    except (TypeError, ValueError):
        return -1
    return int(number) if number.is_integer() else -1


def _earliest_attempts(submissions: Sequence[Mapping], exclude: Callable[[str, Mapping, int], None]) -> list[Mapping]:
    """One submission per worker and survey: copies of an attempt (the same answers begun at the same time, or without a
    time in the file) collapse into one, and of several
    attempts the earliest by the page's ``started_at`` (ISO time, so text order is time order) is kept, an attempt
    without one coming after those with one, then in the order the files were read. The rest go to ``exclude`` as
    :data:`LATER_ATTEMPT` or :data:`COPY`. Returns the kept submissions in the order they were read."""
    by_key: dict[tuple[str, str], list[int]] = {}
    for index, sub in enumerate(submissions):
        by_key.setdefault((_worker_id(sub), sub["survey_id"]), []).append(index)
    kept = []
    for indices in by_key.values():
        # An attempt: the same answers begun at the same time (two attempts can give the same answers); a copy from a file
        # that keeps no started_at belongs to the earliest attempt with its answers.
        attempts: dict[tuple, list[int]] = {}
        for index in indices:
            attempts.setdefault((_answer_signature(submissions[index]), _text_field(submissions[index], "started_at")), []).append(index)
        for signature, started in [key for key in attempts if not key[1]]:
            timed = sorted(s for sig, s in attempts if sig == signature and s)
            if timed:
                attempts[(signature, timed[0])] += attempts.pop((signature, started))

        def order(copies: list[int]) -> tuple:
            started = min((_text_field(submissions[i], "started_at") for i in copies if _text_field(submissions[i], "started_at")), default=None)
            return (started is None, started or "", copies[0])

        first, *later = sorted(attempts.values(), key=order)
        first = sorted(first, key=lambda i: (not _text_field(submissions[i], "started_at"), i))  # keep a copy that says when it began
        kept.append(first[0])
        for reason, index in [(COPY, i) for i in first[1:]] + [(LATER_ATTEMPT if i == copies[0] else COPY, i) for copies in later for i in copies]:
            exclude(reason, submissions[index], max(len(submissions[index].get("answers") or []), 1))
    return [submissions[i] for i in sorted(kept)]


def read_responses(paths: Iterable[str | Path], package: SurveyPackage) -> Responses:
    """Read and validate answers from files (page JSON/CSV downloads, MTurk batch results) against ``package``.

    Excluded, each with its reason: submissions from another package (fingerprint), of unknown surveys, without a
    worker id, rejected on MTurk, returned, rejected, timed out or screened out on Prolific (a Prolific export among
    ``paths``: :class:`ProlificStatuses`; an assignment rejected on MTurk takes the page's downloads of the same
    assignment with it, and leaves the worker's other assignments of the survey alone), or repeated
    (:func:`_earliest_attempts`: of a worker's attempts at a survey the earliest is kept; further copies of one
    attempt, such as the page's JSON and CSV downloads beside the MTurk row, are counted once and listed as copies);
    answers to unknown trials or rows, with invalid choices, or repeated within a submission. Trials a worker left
    unanswered are counted as ``missing answer``. An answer keeps its ``rt_ms`` and the ``position`` (from 1) at which
    its trial was shown to this participant (NaN where the file has none or it is not a number); neither excludes
    anything.
    """
    surveys = {s["survey_id"] for s in package.manifest["surveys"]}
    truth = package.truth.set_index(["trial_id", "row"])
    units_by_survey = package.truth.groupby("survey_id").size().to_dict()
    task_of = dict(zip(package.truth["trial_id"], package.truth["task"]))
    files = [Path(p) for p in paths]
    for f in files:
        if not f.is_file():
            raise FileNotFoundError(f"response file {f} not found")
    rows, excluded, last_positions = [], [], {}

    def exclude(reason: str, sub: Mapping, n: int) -> None:
        excluded.append({"reason": reason, "source": sub.get("source"), "worker_id": sub.get("worker_id"), "survey_id": sub.get("survey_id"), "answers": n})

    prolific = ProlificStatuses()
    submissions = [sub for f in files for sub in _submissions_from_file(f, prolific)]  # every export is read before any answer is judged
    # A rejected assignment rejects its answers in every file, the page's downloads of it too (the same assignment id, or for a
    # file without one the same answers), and nothing else: the worker's approved assignment of the survey in another batch stays.
    # Survey ids repeat across packages (2afc-000 in a pilot and in the study): only this package's rejections count.
    rejected_on_mturk = [sub for sub in submissions
                         if "invalid" not in sub and str(sub.get("status") or "").lower() == "rejected"  # an empty CSV cell reads as NaN
                         and sub.get("package_fingerprint") == package.fingerprint]

    def is_rejected(sub: Mapping) -> bool:
        for rejected in rejected_on_mturk:
            if (_worker_id(rejected), rejected.get("survey_id")) != (_worker_id(sub), sub.get("survey_id")):
                continue
            ids = (_text_field(rejected, "assignment_id"), _text_field(sub, "assignment_id"))
            if ids[0] == ids[1] if all(ids) else _answer_signature(rejected) == _answer_signature(sub):
                return True
        return False

    valid = []
    for sub in submissions:
        answers = sub.get("answers") or []
        n = max(len(answers), 1)
        if "invalid" in sub:
            exclude(sub["invalid"], sub, n)
            continue
        if is_rejected(sub):
            exclude("assignment rejected on MTurk", sub, n)
            continue
        withdrawn = prolific.exclusion(sub)
        if withdrawn:
            exclude(withdrawn, sub, n)
            continue
        if sub.get("package_fingerprint") != package.fingerprint:
            other = sub.get("package_fingerprint")
            exclude(f"answers from a package with another fingerprint ({other!r}, this package is {package.fingerprint!r})", sub, n)
            continue
        if sub.get("survey_id") not in surveys:
            exclude(f"unknown survey id {sub.get('survey_id')!r}", sub, n)
            continue
        if not _worker_id(sub):
            exclude("no worker id", sub, n)
            continue
        valid.append(sub)
    for sub in _earliest_attempts(valid, exclude):
        answers = sub.get("answers") or []
        worker = _worker_id(sub)
        submission = f"{worker}@{sub['survey_id']}"
        kept, answered, attempted, last_position = 0, set(), set(), math.nan
        for a in answers:
            trial_id, row, choice = str(a.get("trial_id")), _row_number(a.get("row")), str(a.get("choice"))
            if (trial_id, row) not in truth.index or truth.loc[(trial_id, row), "survey_id"] != sub["survey_id"]:
                exclude(f"unknown trial id or row for survey {sub['survey_id']}", sub, 1)
                continue
            attempted.add((trial_id, row))
            last_position = float(np.fmax(last_position, _number(a.get("position"), 1)))  # fmax: a NaN side is ignored
            valid = ("0", "1", "2") if "clustering" in task_of[trial_id] else ("left", "right")
            if choice not in valid:
                exclude(f"invalid choice (expected one of {valid})", sub, 1)
                continue
            if (trial_id, row) in answered:
                exclude("repeated answer within a submission", sub, 1)
                continue
            answered.add((trial_id, row))
            rows.append({"submission": submission, "source": sub.get("source"), "worker_id": worker, "survey_id": sub["survey_id"],
                         "trial_id": trial_id, "row": row, "choice": choice, "rt_ms": _number(a.get("rt_ms"), 0),
                         "position": _number(a.get("position"), 1)})
            kept += 1
        last_positions[submission] = last_position
        missing = units_by_survey[sub["survey_id"]] - len(attempted)  # an invalid answer is counted as such, not again as missing
        if missing:
            exclude("missing answer", sub, missing)
    answers = pd.DataFrame(rows, columns=ANSWER_COLUMNS).astype({"rt_ms": float, "position": float})
    result = Responses(answers, excluded, len(submissions), prolific.without_answers(answers["worker_id"]), last_positions)
    for reason, count in result.exclusion_counts().items():
        logger.warning("excluded %d answers: %s", count, reason)
    if result.prolific_without_answers:
        logger.warning("%d Prolific participants who are not withdrawn gave no valid answer in these files: %s; the completion code is "
                       "readable in the page, so check them before approving", len(result.prolific_without_answers),
                       ", ".join(result.prolific_without_answers))
    return result


def scored(responses: Responses, package: SurveyPackage) -> pd.DataFrame:
    """Answers joined with their ground truth and a ``correct`` column."""
    table = responses.answers.merge(package.truth.drop(columns="survey_id"), on=["trial_id", "row"], how="left")
    table["correct"] = (table["choice"] == table["answer"]).astype(float)
    return table


def trial_times(table: pd.DataFrame) -> pd.Series:
    """Milliseconds each submission took per trial, indexed by (submission, trial_id).

    The page's ``rt_ms`` counts from when the trial was shown, for every row of a clustering trial, so a trial's time is
    its last row's ``rt_ms`` (its largest); a trial with no valid time is left out.
    """
    return table.dropna(subset=["rt_ms"]).groupby(["submission", "trial_id"])["rt_ms"].max()


def attention_failures(table: pd.DataFrame, package: SurveyPackage, max_failures: int = 0, min_median_rt_ms: float = 0,
                       min_answered: float = 0, last_positions: Mapping[str, float] | None = None) -> pd.DataFrame:
    """Per submission: attention checks answered, failed, unanswered, the median time per trial, the share of its
    survey's answer units it answered, and whether the submission is excluded.

    A check counts as failed when any of its rows is wrong or unanswered (a clustering check answered only in the rows
    the worker got right does not pass). A check the submission cannot have seen is counted in ``unreached``, not as a
    failure: the page shows checks at random positions among the trials, so counting them failed excluded nearly every
    partial submission, by where its checks happened to fall (``min_answered`` is the rule for how much must be
    answered). "Cannot have seen" is read from the answers' ``position`` (the place in the participant's order;
    ``last_positions``, :attr:`Responses.last_positions`, counts invalid answers too, else the table's valid ones): of the
    checks with no valid answer, at most as many as the trials after the last one answered are unreached, the others
    (skipped, or answered with an invalid choice, before the participant stopped) failed; without positions (hand-made
    files) every check with no valid answer failed. A submission is excluded when failures exceed ``max_failures`` (the
    paper: any failure) or, where ``min_median_rt_ms`` > 0, when its median time per trial
    (:func:`trial_times`, checks included) is below it (``too_fast``); a submission without any valid time is not judged
    on speed (``median_rt_ms`` NaN); and, where ``min_answered`` > 0, when it answered less than that share of its
    survey's answer units (``incomplete``: a participant who gave up part-way; 1 keeps complete submissions only).
    """
    units = package.truth.groupby("survey_id").size().to_dict()
    checks = package.truth[package.truth["attention_check"]]
    n_checks = checks.groupby("survey_id")["trial_id"].nunique().to_dict()
    n_trials = package.truth.groupby("survey_id")["trial_id"].nunique().to_dict()
    rows_per_check = checks.groupby("trial_id")["row"].nunique()
    median_time = trial_times(table).groupby(level="submission").median()
    out = []
    for (submission, worker, survey), group in table.groupby(["submission", "worker_id", "survey_id"], sort=True):
        answered = group[group["attention_check"].astype(bool)]
        per_trial = answered.groupby("trial_id").agg(worst=("correct", "min"), rows=("row", "nunique"))
        passed = (per_trial["worst"] >= 1) & (per_trial["rows"] == rows_per_check.reindex(per_trial.index).to_numpy())
        total = n_checks.get(survey, 0)
        missing = total - len(per_trial)  # checks without a valid answer: skipped, garbled, or never shown
        last = (last_positions or {}).get(submission, group["position"].max() if "position" in group else math.nan)
        unseen = max(0, n_trials[survey] - int(last)) if last == last else 0  # NaN: no positions, nothing can be told unseen
        unreached = min(missing, unseen)
        failed = int((~passed).sum()) + missing - unreached
        median_rt = float(median_time.get(submission, math.nan))
        too_fast = bool(min_median_rt_ms > 0 and median_rt < min_median_rt_ms)  # NaN compares False: untimed is not judged
        answered_share = group[["trial_id", "row"]].drop_duplicates().shape[0] / units[survey]
        incomplete = answered_share < min_answered
        out.append({"submission": submission, "worker_id": worker, "survey_id": survey, "checks": total, "failed": failed,
                    "unreached": unreached, "median_rt_ms": median_rt, "too_fast": too_fast, "answered": answered_share, "incomplete": incomplete,
                    "excluded": failed > max_failures or too_fast or incomplete})
    return pd.DataFrame(out, columns=["submission", "worker_id", "survey_id", "checks", "failed", "unreached", "median_rt_ms", "too_fast", "answered",
                                      "incomplete", "excluded"])


def _accuracy(frame: pd.DataFrame, n_boot: int, seed: int) -> dict:
    """Mean credit with percentile-bootstrap intervals over workers and over trials. Below
    :data:`perceptual.statistics.SIGN_FLIP_MIN_N` workers the interval over workers is undefined (NaN): resampling
    three workers covered the true accuracy in 70 % of simulated studies, one worker gave an interval of zero width."""
    if frame.empty:
        return {"accuracy": math.nan, "n_answers": 0, "n_workers": 0, "n_trials": 0}
    credit = frame["correct"].to_numpy(float)
    few_workers = frame["worker_id"].nunique() < SIGN_FLIP_MIN_N
    return {
        "accuracy": float(credit.mean()),
        "ci_workers": [math.nan, math.nan] if few_workers else list(bootstrap_interval(credit, frame["worker_id"].to_numpy(), n_boot=n_boot, seed=seed)),
        # whole trials: a clustering trial's rows share its images and are not independent answers
        "ci_trials": list(bootstrap_interval(credit, frame["trial_id"].to_numpy(), n_boot=n_boot, seed=seed)),
        "n_answers": int(len(frame)), "n_workers": int(frame["worker_id"].nunique()), "n_trials": int(frame["trial_id"].nunique()),
    }


def survey_kappa(table: pd.DataFrame) -> dict[str, float]:
    """Fleiss' kappa per survey over its real answer units, among the kept workers who answered every one of them (NaN
    with fewer than 2 such workers). A worker who left units unanswered is left out of the survey's kappa (and named in
    the log) rather than the units: keeping only the units every worker answered let one worker who answered one
    trial reduce a survey's kappa to that trial (NaN where everyone agreed on it)."""
    out = {}
    for survey, group in table[~table["attention_check"].astype(bool)].groupby("survey_id", sort=True):
        units = group.groupby("worker_id")[["trial_id", "row"]].apply(lambda g: len(g.drop_duplicates()))
        complete = units.index[units == group[["trial_id", "row"]].drop_duplicates().shape[0]]
        if len(complete) < units.size:
            logger.warning("survey %s: Fleiss' kappa over the %d of %d workers who answered every unit (left out: %s)", survey, len(complete),
                        units.size, ", ".join(map(str, units.index.difference(complete))))
        if len(complete) < 2:
            out[survey] = math.nan
            continue
        answered = group[group["worker_id"].isin(complete)]
        counts = answered.groupby(["trial_id", "row"])["choice"].value_counts().unstack(fill_value=0)
        out[survey] = fleiss_kappa(counts.to_numpy())
    return out


def order_effects(real: pd.DataFrame, package: SurveyPackage, n_boot: int = 2000, seed: int = 0) -> dict:
    """Per task: accuracy on the real trials each participant saw in the first and in the second half of their survey
    (by the answer's ``position``), with intervals over workers, and their difference (second minus first) with a 95 %
    paired bootstrap interval over workers (a worker's two halves are drawn together); answers without a position are
    left out.

    Learning would raise the second half, fatigue lower it; controversial answers (a preference) are left out. Read it as
    an effect of order only where each participant had an order of their own (``trial_order=per_participant``): with one
    order for all, the halves hold different trials.
    """
    order = package.manifest.get("config", {}).get("trial_order", "per_participant")
    if order != "per_participant":  # the halves hold different trials: a difference says which trials are harder
        logger.warning("no order effects: the package shows every participant its trials in one order (trial_order=%s)", order)
        return {}
    n_trials = {s["survey_id"]: s["n_trials"] for s in package.manifest["surveys"]}
    placed = real[real["task"] != "controversial"].dropna(subset=["position"])  # controversial answers are preferences, not right or wrong
    out = {}
    for task, group in placed.groupby("task", sort=True):
        first = group["position"] <= group["survey_id"].map(n_trials) / 2
        halves = {"first_half": _accuracy(group[first], n_boot, seed), "second_half": _accuracy(group[~first], n_boot, seed)}
        n_workers = int(group["worker_id"].nunique())
        interval = (list(_paired_half_interval(group, first.to_numpy(), n_boot, seed)) if n_workers >= SIGN_FLIP_MIN_N
                    else [math.nan, math.nan])  # with 3 workers the interval excluded 0 in 18 % of studies without an effect
        out[task] = {**halves, "difference": halves["second_half"]["accuracy"] - halves["first_half"]["accuracy"],
                     "ci_difference": interval, "n_workers": n_workers}
    return out


def _paired_half_interval(group: pd.DataFrame, first: np.ndarray, n_boot: int, seed: int) -> tuple[float, float]:
    """Percentile bootstrap of (second-half accuracy - first-half accuracy), resampling workers."""
    _, worker = np.unique(group["worker_id"].to_numpy(), return_inverse=True)
    credit = group["correct"].to_numpy(float)
    n = worker.max() + 1
    sums = [np.bincount(worker[m], weights=credit[m], minlength=n) for m in (first, ~first)]
    counts = [np.bincount(worker[m], minlength=n) for m in (first, ~first)]
    draws = np.random.default_rng(seed).integers(0, n, size=(n_boot, n))
    with np.errstate(invalid="ignore", divide="ignore"):  # a draw of workers with no answers in one half: left out
        differences = sums[1][draws].sum(1) / counts[1][draws].sum(1) - sums[0][draws].sum(1) / counts[0][draws].sum(1)
    return percentile_interval(differences[np.isfinite(differences)], 0.95)


def check_min_median_rt_ms(value) -> float:
    """``min_median_rt_ms`` as a float, refused unless it is a number >= 0 (NaN, text and booleans too)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise ValueError(f"min_median_rt_ms must be >= 0 milliseconds (0 = no minimum, e.g. 1000 for one second per trial), got {value!r}")
    return float(value)


def check_min_answered(value) -> float:
    """``min_answered`` as a float, refused unless it is a share in [0, 1] (NaN, text and booleans too)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise ValueError(f"min_answered must be a share of a survey's answers in [0, 1] (0 = keep partial submissions, 1 = complete "
                         f"ones only), got {value!r}")
    return float(value)


def human_scores(package: SurveyPackage, responses: Responses, max_attention_failures: int = 0, n_boot: int = 2000, seed: int = 0,
                 min_median_rt_ms: float = 0, min_answered: float = 0) -> dict:
    """Everything the report needs: per model and task accuracy with intervals, per seed type, agreement, response
    times, exclusions (attention checks, answering too fast where ``min_median_rt_ms`` > 0, and answering too little
    of a survey where ``min_answered`` > 0: :func:`attention_failures`)."""
    check_min_median_rt_ms(min_median_rt_ms)
    check_min_answered(min_answered)
    table = scored(responses, package)
    attention = attention_failures(table, package, max_attention_failures, min_median_rt_ms, min_answered, responses.last_positions)
    untimed = attention.loc[attention["median_rt_ms"].isna(), "submission"].tolist()
    if min_median_rt_ms > 0 and untimed:
        logger.warning("%d of %d submissions carry no valid rt_ms (hand-made files?): the minimum time per trial is not applied to them: %s",
                       len(untimed), len(attention), ", ".join(map(str, untimed)))
    dropped = set(attention.loc[attention["excluded"], "submission"])
    kept = table[~table["submission"].isin(dropped)]
    excluded = list(responses.excluded)
    for row in attention[attention["excluded"]].itertuples():
        if row.failed > max_attention_failures:  # one reason per submission: its answers are counted once
            reason = f"failed attention checks ({row.failed} of {row.checks}, more than {max_attention_failures} allowed)"
        elif row.too_fast:
            reason = f"answered too fast (median time per trial below {min_median_rt_ms:g} ms)"
        else:
            reason = f"answered too little of the survey (less than min_answered {min_answered:.0%} of its answers)"
        excluded.append({"reason": reason, "source": None, "worker_id": row.worker_id, "survey_id": row.survey_id,
                         "answers": int((table["submission"] == row.submission).sum())})
    real = kept[~kept["attention_check"].astype(bool)]
    models: dict[str, dict] = {}
    for (model, task), group in real.groupby(["model", "task"], sort=True):
        entry = _accuracy(group, n_boot, seed)
        entry["by_seed_type"] = {str(k): _accuracy(g, n_boot, seed) for k, g in group.groupby("seed_type", sort=True)}
        models.setdefault(model, {})[task] = entry
    kappas = survey_kappa(kept)
    task_of_survey = {s["survey_id"]: s["task"] for s in package.manifest["surveys"]}
    agreement = {}
    for task in sorted(set(task_of_survey.values())):
        values = [k for s, k in kappas.items() if task_of_survey[s] == task]
        finite = [k for k in values if not math.isnan(k)]
        per_worker = real[real["task"] == task].groupby("worker_id")["correct"].mean()
        times = trial_times(kept[kept["task"] == task])
        agreement[task] = {
            "median_rt_ms": float(times.median()) if len(times) else math.nan,  # per trial, over the kept submissions' trials
            "fleiss_kappa_mean": float(np.mean(finite)) if finite else math.nan,
            "fleiss_kappa_per_survey": {s: k for s, k in kappas.items() if task_of_survey[s] == task},
            "worker_accuracy_mean": float(per_worker.mean()) if len(per_worker) else math.nan,
            "worker_accuracy_std": float(per_worker.std(ddof=1)) if len(per_worker) > 1 else math.nan,
            "worker_accuracy_min": float(per_worker.min()) if len(per_worker) else math.nan,
            "worker_accuracy_max": float(per_worker.max()) if len(per_worker) else math.nan,
            "n_workers": int(len(per_worker)),
        }
    counts: dict[str, int] = {}
    for e in excluded:
        counts[e["reason"]] = counts.get(e["reason"], 0) + e["answers"]
    return {
        "package": package.fingerprint, "submissions": responses.submissions,
        "copies": sum(e["reason"] == COPY for e in responses.excluded),  # the same attempt in another file: not a rejected one
        "kept_submissions": int(kept["submission"].nunique()),
        "kept_answers": int(len(kept)), "excluded_counts": counts, "excluded": excluded,
        "prolific_without_answers": list(responses.prolific_without_answers),
        "attention": attention.to_dict("records"), "max_attention_failures": max_attention_failures, "min_median_rt_ms": min_median_rt_ms,
        "min_answered": min_answered,
        "models": models, "agreement": agreement, "order_effects": order_effects(real, package, n_boot, seed),
        "sets": package_set_fingerprints(package),  # what the people saw
    }


def human_observer_agreement(human: Mapping[str, float], observer: Mapping[str, float]) -> dict:
    """Kendall's tau and Spearman's rho between human and observer scores over the models both have (a score that is
    undefined, NaN or a report's null, counts as missing)."""
    models = sorted(m for m in set(human) & set(observer) if is_number(human[m]) and is_number(observer[m]))
    if len(models) < 2:
        return {"models": models, "kendall_tau": math.nan, "spearman_rho": math.nan,
                "note": "fewer than 2 models with both human and observer scores"}
    h, o = [human[m] for m in models], [observer[m] for m in models]
    if len(set(h)) == 1 or len(set(o)) == 1:
        return {"models": models, "kendall_tau": math.nan, "spearman_rho": math.nan,
                "note": "the human or the observer scores are all equal: no ranking to compare"}
    tau = stats.kendalltau(h, o)
    rho = stats.spearmanr(h, o)
    return {"models": models, "kendall_tau": float(tau.statistic), "kendall_p": float(tau.pvalue),
            "spearman_rho": float(rho.statistic), "spearman_p": float(rho.pvalue),
            # ties as ties: sorting by score put tied models in name order, so the answer depended on their names
            "same_order": bool(np.array_equal(stats.rankdata(h), stats.rankdata(o)))}


def trial_agreement(table: pd.DataFrame, observer_choices: pd.DataFrame) -> dict:
    """How often a human's answer equals the observer's, answer by answer and against the majority human answer.

    ``observer_choices`` has ``trial_id, row, choice`` (``tie`` / -1 for ties, which count as disagreement) for
    the package's answer units. Attention checks are left out. Where the humans' vote on a unit is tied between k
    answers, the majority is any of them: the observer gets 1/k if it gave one of them (agreement with a random
    tie-break), so a tie favours no side; ``n_tied_units`` says how many there were.
    """
    real = table[~table["attention_check"].astype(bool)]
    merged = real.merge(observer_choices[["trial_id", "row", "choice"]].astype({"choice": str}), on=["trial_id", "row"], suffixes=("", "_observer"))
    if merged.empty:
        return {"per_answer": math.nan, "majority": math.nan, "n_answers": 0}
    per_answer = float((merged["choice"] == merged["choice_observer"]).mean())
    credit, tied = [], 0
    for _, unit in merged.groupby(["trial_id", "row"], sort=False):
        votes = unit["choice"].value_counts()
        majority = set(votes.index[votes == votes.max()])
        tied += len(majority) > 1
        credit.append((unit["choice_observer"].iloc[0] in majority) / len(majority))
    return {"per_answer": per_answer, "majority": float(np.mean(credit)), "n_answers": int(len(merged)), "n_units": len(credit),
            "n_tied_units": int(tied)}


def package_images(package: SurveyPackage) -> tuple[torch.Tensor, dict[str, int]]:
    """Every image the package shows, as [0, 1] floats, with a file-name-to-row map (the observer sees what people saw)."""
    files = {}
    for t in package.manifest["trials"]:
        names = [t["images"].get("query")] + t["images"].get("options", []) + t["images"].get("columns", []) + t["images"].get("rows", [])
        for name in names:
            if name and name not in files:
                files[name] = package.path / "surveys" / t["survey_id"] / "images" / name
    names = sorted(files)
    images = torch.stack([read_png(files[n]) for n in names]).float() / 255
    return images, {n: i for i, n in enumerate(names)}


def observer_choices(package: SurveyPackage, observer: Observer) -> pd.DataFrame:
    """The observer's answer to every answer unit of the package (``trial_id, row, choice, credit``)."""
    images, id_to_row = package_images(package)
    two_afc, clustering = [], []
    for t in package.manifest["trials"]:
        if "clustering" not in t["task"]:
            query, (left, right) = t["images"]["query"], t["images"]["options"]
            two_afc.append({"trial_id": t["trial_id"], "row": 0, "query_id": query, "left_id": left, "right_id": right, "answer": t["rows"][0]["answer"]})
        else:
            for k, row in enumerate(t["rows"]):
                clustering.append({"trial_id": t["trial_id"], "row": k, "query_id": row["query_file"],
                                   **{f"column_{c}": name for c, name in enumerate(t["images"]["columns"])}, "answer": int(row["answer"])})
    parts = []
    if two_afc:
        parts.append(judge_2afc(pd.DataFrame(two_afc), images, id_to_row, observer))
    if clustering:
        parts.append(judge_clustering(pd.DataFrame(clustering), images, id_to_row, observer))
    judged = pd.concat(parts, ignore_index=True)
    judged["choice"] = judged["choice"].astype(str)
    return judged[["trial_id", "row", "choice", "credit"]]


def analyse(package: SurveyPackage, responses: Responses, observers: Sequence[Observer] = (), measure_report: Mapping | None = None,
            max_attention_failures: int = 0, n_boot: int = 2000, seed: int = 0, min_median_rt_ms: float = 0, min_answered: float = 0) -> dict:
    """:func:`human_scores` plus the paper's reliability analysis against ``observers`` (which answer the package's own
    trials, so the comparison is trial by trial) and against the observers of a measurement report (model rankings)."""
    data = human_scores(package, responses, max_attention_failures, n_boot, seed, min_median_rt_ms, min_answered)
    table = scored(responses, package)
    kept_submissions = {a["submission"] for a in data["attention"] if not a["excluded"]}
    kept = table[table["submission"].isin(kept_submissions)]
    human_by_task: dict[str, dict[str, float]] = {}
    for model, tasks in data["models"].items():
        for task, entry in tasks.items():
            human_by_task.setdefault(task, {})[model] = entry["accuracy"]
    reliability: dict[str, dict] = {}
    for observer in observers:
        choices = observer_choices(package, observer)
        judged = choices.merge(package.truth, on=["trial_id", "row"])
        judged = judged[~judged["attention_check"]]
        entry = {"trial_agreement": {task: trial_agreement(kept[kept["task"] == task], choices) for task in sorted(kept["task"].unique())},
                 "accuracy_on_package": {}, "ranking": {}}
        for (model, task), group in judged.groupby(["model", "task"], sort=True):
            entry["accuracy_on_package"].setdefault(task, {})[model] = float(group["credit"].mean())
        for task, human in human_by_task.items():
            entry["ranking"][task] = human_observer_agreement(human, entry["accuracy_on_package"].get(task, {}))
        reliability[observer.name] = entry
    data["reliability"] = reliability
    if measure_report is not None:
        ranking: dict[str, dict] = {}
        for task, human in human_by_task.items():
            per_observer: dict[str, dict[str, float]] = {}
            for model, result in measure_report["models"].items():
                for name, summary in (result.get("per_observer", {}).get(task) or {}).items():
                    per_observer.setdefault(name, {})[model] = summary["overall"]["accuracy"]
            ranking[task] = {name: human_observer_agreement(human, scores) for name, scores in per_observer.items()}
        data["measure_ranking"] = ranking
    return data


def check_report_matches(measure_report: Mapping, labels: Iterable[str], set_fingerprints: Mapping[str, str | None]) -> None:
    """Refuse to put people's answers about the sets ``labels`` (fingerprints ``set_fingerprints``) beside a measurement
    report that does not measure a model of each label on that very set: the observers' numbers would be about other
    images. Reports and packages from before fingerprints were recorded are checked by label only."""
    models = measure_report["models"]
    unknown = sorted(label for label in labels if label not in models)
    if unknown:
        raise ValueError(f"survey models {unknown} are not in the measurement report (models {sorted(models)}): "
                         "label the survey's sets as the report labels its models (python -m stimuli survey labels=[...])")
    other = {label: (set_fingerprints.get(label), models[label].get("set_fingerprint")) for label in labels}
    other = {label: pair for label, pair in other.items() if None not in pair and pair[0] != pair[1]}
    if other:
        described = "; ".join(f"{label}: survey {ours}, report {theirs}" for label, (ours, theirs) in sorted(other.items()))
        raise ValueError(f"the survey's sets are not the sets the measurement report measured ({described}): people answered about "
                         "other images than the observers judged; build the survey from the report's sets (its models/<label>/ "
                         "folders), or import without measure_report")


def package_set_fingerprints(package: SurveyPackage) -> dict[str, str | None]:
    """The fingerprint of each set people saw, by the survey's label."""
    return {label: info.get("fingerprint") for label, info in package.manifest.get("sets", {}).items()}


def survey_model_labels(package: SurveyPackage) -> list[str]:
    """The package's sets that stand for a model (every set but the controversial ones, which are labelled by the set)."""
    return sorted(set(package.truth.loc[package.truth["task"] != "controversial", "model"]))


def with_human_columns(measure_report: dict, data: Mapping) -> dict:
    """A copy of a measurement report whose models carry ``humans`` ({task: accuracy entry}) for the Table 1 Human columns.

    The columns of an earlier import are removed first, so that one report never mixes two packages. A controversial
    set's answers (labelled by the set, not by a model of the report) go to ``humans["controversial"]``."""
    out = json.loads(json.dumps(measure_report))
    table = {model: {t: e for t, e in tasks.items() if t != "controversial"} for model, tasks in data["models"].items()}
    check_report_matches(out, [model for model, tasks in table.items() if tasks], data.get("sets") or {})
    for result in out["models"].values():
        result.pop("humans", None)
    for model, tasks in table.items():
        if tasks:
            out["models"][model]["humans"] = tasks
    out["humans"] = {"package": data["package"], "kept_submissions": data["kept_submissions"], "excluded_counts": data["excluded_counts"],
                     "sets": dict(data.get("sets") or {})}
    controversial = {model: tasks["controversial"] for model, tasks in data["models"].items() if "controversial" in tasks}
    if controversial:
        out["humans"]["controversial"] = controversial
    return out


def _unreached_note(data: Mapping) -> str:
    """A sentence on kept submissions that stopped before some of their checks (none in a humans.json of before the count)."""
    gave_up = [a for a in data.get("attention", []) if not a["excluded"] and a.get("unreached")]
    if not gave_up:
        return ""
    return (f" {len(gave_up)} of them stopped before {sum(a['unreached'] for a in gave_up)} of their attention checks (unreached, not "
            "failed; min_answered sets how much of a survey must be answered).")


def markdown_summary(data: Mapping) -> str:
    """The human numbers as Markdown: accuracy per model and task with both intervals, agreement, exclusions, reliability."""
    pct = lambda v: "–" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{100 * v:.1f}"  # noqa: E731
    minimum = data.get("min_median_rt_ms") or 0
    speed = f", median time per trial at least {minimum:g} ms" if minimum > 0 else ""
    least_answered = data.get("min_answered") or 0
    speed += f", at least {least_answered:.0%} of a survey answered" if least_answered > 0 else ""
    copies = data.get("copies") or 0
    read = f"{data['submissions']} submissions read" + (f" ({data['submissions'] - copies} attempts; {copies} further copies of them, "
                                                         "such as a JSON and a CSV download of one attempt, counted once)" if copies else "")
    lines = ["# Human survey results", "", f"Package {data['package']}: {read}, "
             f"{data['kept_submissions']} kept after validation and attention checks (at most {data['max_attention_failures']} failures{speed})."
             + _unreached_note(data), "",
             "| Model | Task | Accuracy (%) | 95% CI workers | 95% CI trials | Workers | Answers |", "|---|---|---|---|---|---|---|"]
    for model, tasks in data["models"].items():
        for task, e in tasks.items():
            lines.append(f"| {model} | {task} | {pct(e['accuracy'])} | {pct(e['ci_workers'][0])}–{pct(e['ci_workers'][1])} | "
                         f"{pct(e['ci_trials'][0])}–{pct(e['ci_trials'][1])} | {e['n_workers']} | {e['n_answers']} |")
    lines += ["", "Intervals: over workers (whole workers resampled; none below 6 workers) is the one that generalises to other "
              "participants; over trials holds these workers fixed and is narrower (it covered the truth in about 80 % of simulated "
              "studies)."]
    if any("controversial" in tasks for tasks in data["models"].values()):
        lines += ["", "controversial: the share of answers that find the stimulus keeping model A (direction AB) closer to the origin "
                  "than the one keeping model B; there is no correct side, 50 % is no preference."]
    lines += ["", "| Task | Fleiss' kappa (mean over surveys) | Worker accuracy mean ± std (min–max) | Workers | Median time per trial (s) |",
              "|---|---|---|---|---|"]
    for task, a in data["agreement"].items():
        kappa = "–" if math.isnan(a["fleiss_kappa_mean"]) else f"{a['fleiss_kappa_mean']:.3f}"
        rt = a.get("median_rt_ms", math.nan)
        seconds = "–" if math.isnan(rt) else f"{rt / 1000:.1f}"
        lines.append(f"| {task} | {kappa} | {pct(a['worker_accuracy_mean'])} ± {pct(a['worker_accuracy_std'])} "
                     f"({pct(a['worker_accuracy_min'])}–{pct(a['worker_accuracy_max'])}) | {a['n_workers']} | {seconds} |")
    if data.get("order_effects"):
        lines += ["", "| Task | Accuracy, first half of each survey (%) | Second half (%) | Difference (points) | 95 % interval over workers |",
                  "|---|---|---|---|---|"]
        signed = lambda v: "–" if math.isnan(v) else f"{100 * v:+.1f}"  # noqa: E731
        for task, e in data["order_effects"].items():
            low, high = e["ci_difference"]
            lines.append(f"| {task} | {pct(e['first_half']['accuracy'])} | {pct(e['second_half']['accuracy'])} | {signed(e['difference'])} | "
                         f"[{signed(low)}, {signed(high)}] |")
    lines += ["", "## Excluded", ""] + ([f"- {n} answers: {reason}" for reason, n in data["excluded_counts"].items()] or ["- nothing"])
    if data.get("prolific_without_answers"):
        lines += ["", f"Prolific participants who are not withdrawn but gave no valid answer in the files read: "
                  f"{', '.join(data['prolific_without_answers'])}. The completion code is readable in the page's source: check "
                  "them before approving (or add their downloads)."]
    if data.get("reliability"):
        lines += ["", "## Humans and observers", "", "| Observer | Task | Agreement per answer (%) | With the majority (%) | Kendall's tau | Spearman's rho |",
                  "|---|---|---|---|---|---|"]
        for name, r in data["reliability"].items():
            for task, agreement in r["trial_agreement"].items():
                rank = r["ranking"].get(task, {})
                tau, rho = rank.get("kendall_tau", math.nan), rank.get("spearman_rho", math.nan)
                lines.append(f"| {name} | {task} | {pct(agreement['per_answer'])} | {pct(agreement['majority'])} | "
                             f"{'–' if math.isnan(tau) else f'{tau:.2f}'} | {'–' if math.isnan(rho) else f'{rho:.2f}'} |")
    return "\n".join(lines) + "\n"


def accuracy_figure(data: Mapping, path: str | Path) -> Path:
    """Bars: human accuracy per model and task with the bootstrap interval over workers."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .report import save_figure

    tasks = sorted({t for m in data["models"].values() for t in m})
    models = list(data["models"])
    fig, ax = plt.subplots(figsize=(1.8 + 1.4 * len(tasks) * max(len(models), 1) / 2, 3.2))
    width = 0.8 / max(len(models), 1)
    for k, model in enumerate(models):
        entries = [data["models"][model].get(t) for t in tasks]
        values = [e["accuracy"] if e else np.nan for e in entries]
        errors = np.array([[e["accuracy"] - e["ci_workers"][0], e["ci_workers"][1] - e["accuracy"]] if e else [np.nan, np.nan] for e in entries]).T
        ax.bar(np.arange(len(tasks)) + k * width, values, width, yerr=errors, capsize=3, label=model)
    ax.set_xticks(np.arange(len(tasks)) + width * (len(models) - 1) / 2, tasks)
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("task")
    ax.set_ylabel("human accuracy (95% CI over workers)")
    ax.set_title("Human survey accuracy per model" if models else "Human survey accuracy per model: no answers kept")
    if models:
        ax.legend(fontsize=8)
    return save_figure(fig, Path(path))
