"""Real trials in the model-vs-human benchmark's CSV format: read (with a validation report), write, and image folders.

Geirhos et al., "Partial success in closing the gap between human and machine vision" (NeurIPS 2021); code and
data: bethgelab/model-vs-human (``raw-data/<experiment>/<experiment>_<subject>_session_<n>.csv``, written by its
``ResultPrinter``; read by ``plotting/analyses.py``). One CSV per subject and session with the columns::

    subj, session (or Session), trial, rt, object_response, category, condition, imagename

``imagename`` is ``<trial>_<experiment tag>_<subject tag>_<condition>_<source image>``, e.g.
``0001_cl_s01_cr_oven_40_n04111531_14126.png``; the source image is what observers share, so trials are matched
across observers by it, keyed as the benchmark keys it (:func:`source_image`: ``n04111531_14126.png``). For
cue-conflict, edge and silhouette, whose images the benchmark keeps in class folders without sessions, its model
files name the bare file (``airplane1-bicycle2.png``) with condition ``NaN``: read as the humans' single condition
``0``, and matched to them by that file name. ``object_response`` ``na`` is a trial the subject did not answer in
time: the benchmark keeps it and counts it wrong, and so do we (the report counts them).

:func:`read_trials` turns files into the toolkit's trial table (:data:`perceptual.decisions.TRIAL_TABLE_COLUMNS`,
``subject`` = ``subj``, ``dataset`` = the experiment, ``image_id`` = the source image) plus the raw ``session``,
``trial``, ``rt`` and ``imagename``. Every problem (malformed rows, unknown categories, duplicate trials, a file
that mixes experiments or subjects, an imagename whose condition disagrees with its row) is collected in a
:class:`TrialReport` that names the file, the kind and the count; by default any problem raises
:class:`TrialDataError` carrying that report, before any analysis runs. With ``strict=False`` the offending rows
are left out and the report says which and how many.

:func:`write_trials` writes a trial table (e.g. a model's, :func:`perceptual.decisions.model_trials`) in the same
format, so the benchmark's own code can read it. :func:`read_image_folder` and :func:`classify_image_folder` read
the benchmark's released image folders (``<experiment>/dnn/session-1/*.png``, or ``<experiment>/<class>/*.png``
for cue-conflict, edge and silhouette) and let an ImageNet classifier decide through the 16-class mapping (:func:`perceptual.metrics.imagenet_to_16_classes`).
"""
from __future__ import annotations

import csv
import io
import logging
import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import pandas as pd

from training.io import atomic_write_text

from .decisions import TRIAL_TABLE_COLUMNS
from .metrics import SIXTEEN_CLASS_NAMES

log = logging.getLogger(__name__)

MVH_COLUMNS = ("subj", "session", "trial", "rt", "object_response", "category", "condition", "imagename")
NO_ANSWER = "na"  # the benchmark's response for a trial left unanswered (counted wrong)
# The condition humans' files give the single-condition experiments (cue-conflict, edge, silhouette, ...); the benchmark's
# model files for those whose images have no session folder say "NaN" there and name the image by its bare file name.
SINGLE_CONDITION = "0"
EXTRA_COLUMNS = ("session", "trial", "rt", "imagename")
# Short experiment tags the benchmark uses in image names, for writing; unknown data sets use their own name.
EXPERIMENT_TAGS = {
    "colour": "cl", "contrast": "con", "cue-conflict": "s5n", "edge": "edg", "eidolonI": "eid", "eidolonII": "eid",
    "eidolonIII": "eid", "false-colour": "fc", "high-pass": "hp", "low-pass": "lp", "phase-scrambling": "ps",
    "power-equalisation": "pow", "rotation": "rot", "silhouette": "sif", "sketch": "ske", "stylized": "sty",
    "uniform-noise": "un",
}


def _split_imagename(imagename: str, condition: str | None = None) -> list[str] | None:
    """``[trial, experiment tag, subject tag, condition, source image]``, or None when the name has too few parts.

    With ``condition`` (the row's), a condition that itself contains ``_`` (the toolkit's ``low_pass=40``) is found
    whole; without it, or when the name does not hold it there, the fourth ``_`` field is the condition.
    """
    head = imagename.split("_", 3)
    if len(head) != 4 or not all(head):
        return None
    rest = head[3]
    if condition and rest.startswith(condition + "_") and len(rest) > len(condition) + 1:
        return head[:3] + [condition, rest[len(condition) + 1:]]
    tail = rest.split("_", 1)
    return head[:3] + tail if len(tail) == 2 and all(tail) else None


def _short_name(image: str) -> str:
    """model-vs-human's ``get_short_imagename`` (``helper/plotting_helper.py``): ImageNet's ``n0…_…`` pair, else the last ``_`` field."""
    fields = image.split("_")
    if len(fields) == 1:
        return image
    return "_".join(fields[-2:]) if fields[-2].startswith("n0") else fields[-1]


def source_image(imagename: str, condition: str | None = None) -> str:
    """The source image of a benchmark image name, the key that joins observers' trials, as model-vs-human keys them.

    As ``get_short_imagename`` in the benchmark's ``helper/plotting_helper.py``: of what follows the trial,
    experiment, subject and condition fields, ImageNet's ``n0…_…`` pair or else the last ``_`` field:
    ``0001_cl_s01_cr_oven_40_n04111531_14126.png`` → ``n04111531_14126.png``,
    ``0001_s5n_s01_0_bird_00_bird3-bird2.png`` → ``bird3-bird2.png``. Every observer (human or model,
    ``..._dnn_...``) who saw that source image gets the same id, whatever the benchmark put between condition and
    image for that observer. A bare file name (``bird3-bird2.png``: what the benchmark writes for models on
    cue-conflict, edge and silhouette, whose images have no session folder) is its own id. Pass the trial's
    ``condition`` when it may contain ``_``.
    """
    imagename = str(imagename)
    if imagename and "_" not in imagename:
        return imagename
    parts = _split_imagename(imagename, condition)
    if parts is None:
        raise ValueError(f"{imagename!r} is not a model-vs-human image name (<trial>_<experiment>_<subject>_<condition>_<image>, "
                         "or a bare file name without '_')")
    return _short_name(parts[4])


def texture_category(imagename: str) -> str:
    """The texture class of a cue-conflict image: ``..._bird3-clock2.png`` → ``clock``.

    As ``ShapeBias.get_texture_category`` in model-vs-human's ``plotting/analyses.py``: the last ``-`` part of the
    file name without its extension and digits.
    """
    stem = str(imagename).split("_")[-1].split(".")[0]
    return "".join(ch for ch in stem.split("-")[-1] if not ch.isdigit())


@dataclass(frozen=True)
class Problem:
    """One kind of problem in one file: how many rows it affects and a few examples (line numbers, values)."""

    file: str
    kind: str
    count: int
    examples: tuple[str, ...] = ()

    def __str__(self) -> str:
        shown = "; ".join(self.examples[:3])
        return f"{self.file}: {self.kind} × {self.count}" + (f" (e.g. {shown})" if shown else "")


@dataclass
class TrialReport:
    """What :func:`read_trials` found: files and rows read, rows kept, unanswered trials, and every problem."""

    files: int = 0
    rows: int = 0
    kept: int = 0
    unanswered: int = 0
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def counts(self) -> dict[str, int]:
        """Problem kind → affected rows (or files) over all files."""
        totals: Counter = Counter()
        for problem in self.problems:
            totals[problem.kind] += problem.count
        return dict(totals)

    def describe(self) -> str:
        head = (f"{self.files} file(s), {self.rows} row(s), {self.kept} kept, {self.unanswered} unanswered ('{NO_ANSWER}', "
                "counted wrong)")
        if self.ok:
            return head + "; no problems"
        lines = [head + f"; {len(self.problems)} problem(s): " + ", ".join(f"{k} × {v}" for k, v in sorted(self.counts().items()))]
        lines += [f"  {p}" for p in self.problems]
        return "\n".join(lines)

    def as_dict(self) -> dict:
        return {"files": self.files, "rows": self.rows, "kept": self.kept, "unanswered": self.unanswered, "problem_counts": self.counts(),
                "problems": [{"file": p.file, "kind": p.kind, "count": p.count, "examples": list(p.examples)} for p in self.problems]}


class TrialDataError(ValueError):
    """Trial files with problems; ``.report`` is the full :class:`TrialReport`."""

    def __init__(self, report: TrialReport):
        self.report = report
        super().__init__("the trial files have problems (pass strict=False to leave those rows out):\n" + report.describe())


class _FileProblems:
    """Collects (kind → line examples) for one file."""

    def __init__(self, name: str):
        self.name = name
        self.rows: dict[str, list[str]] = defaultdict(list)

    def add(self, kind: str, example: str) -> None:
        self.rows[kind].append(example)

    def problems(self) -> list[Problem]:
        return [Problem(self.name, kind, len(examples), tuple(examples[:5])) for kind, examples in self.rows.items()]


def _is_int(text: str) -> bool:
    try:
        int(text)
    except ValueError:
        return False
    return True


def _is_number_or_nan(text: str) -> bool:
    try:
        float(text)  # "NaN" parses: the benchmark writes it for unanswered trials and for models
    except ValueError:
        return False
    return True


def _read_one(path: Path, dataset: str, categories: frozenset, report: TrialReport) -> tuple[list[dict], list[Problem]]:
    found = _FileProblems(str(path))
    try:
        text = path.read_bytes().decode("utf-8-sig")  # Excel's "CSV UTF-8" starts with a byte-order mark
    except UnicodeDecodeError as error:
        return [], [Problem(str(path), "not UTF-8 text", 1, (f"byte {error.start}: {error.reason}; save the file as CSV UTF-8",))]
    with io.StringIO(text, newline="") as handle:
        reader = csv.reader(handle)
        header = next(reader, None)
        if header is None:
            return [], [Problem(str(path), "empty file", 1)]
        names = [h.strip() for h in header]
        names = ["session" if h == "Session" else h for h in names]  # both capitalisations occur in the benchmark
        missing = [c for c in MVH_COLUMNS if c not in names]
        if missing:
            return [], [Problem(str(path), "missing columns", 1, (f"missing {missing}; header {header}",))]
        index = {c: names.index(c) for c in MVH_COLUMNS}
        rows, bad_rows = [], set()
        for line, fields in enumerate(reader, start=2):
            report.rows += 1
            if len(fields) != len(names):
                found.add("malformed row", f"line {line}: {len(fields)} fields, expected {len(names)}")
                continue
            row = {c: fields[i].strip() for c, i in index.items()}
            bare = bool(row["imagename"]) and "_" not in row["imagename"]  # the benchmark's model files without sessions
            if bare and row["condition"].lower() == "nan":
                row["condition"] = SINGLE_CONDITION
            reasons = [c for c in ("subj", "object_response", "category", "condition", "imagename") if not row[c]]
            reasons += [c for c in ("session", "trial") if not _is_int(row[c])]  # empty too: they key duplicate trials
            reasons += ["rt"] if row["rt"] and not _is_number_or_nan(row["rt"]) else []
            if bare:
                parts = [None, None, None, row["condition"], row["imagename"]]
            else:
                parts = _split_imagename(row["imagename"], row["condition"]) if row["imagename"] else None
            if row["imagename"] and parts is None:
                reasons.append("imagename")
            if reasons:
                found.add("malformed row", f"line {line}: bad {', '.join(reasons)}")
                continue
            if row["category"] not in categories:
                found.add("unknown category", f"line {line}: {row['category']!r}")
                bad_rows.add(line)
            if row["object_response"] not in categories and row["object_response"] != NO_ANSWER:
                found.add("unknown response", f"line {line}: {row['object_response']!r}")
                bad_rows.add(line)
            if parts[3] != row["condition"]:
                found.add("imagename condition differs from condition", f"line {line}: {parts[3]!r} vs {row['condition']!r}")
                bad_rows.add(line)
            rows.append({"line": line, "tag": parts[1], **row, "image_id": _short_name(parts[4])})
    # Whole-file checks: one subject and one experiment per file, each trial and each (condition, image) once.
    subjects = Counter(r["subj"] for r in rows)
    if len(subjects) > 1:
        found.add("file mixes subjects", ", ".join(f"{s} × {n}" for s, n in subjects.most_common()))
    tags = Counter(r["tag"] for r in rows if r["tag"] is not None)
    if len(tags) > 1:
        found.add("file mixes experiments", ", ".join(f"tag {t!r} × {n}" for t, n in tags.most_common()))
    for key_name, key in (("duplicate trial", lambda r: (r["subj"], r["session"], r["trial"])),
                          ("duplicate image", lambda r: (r["subj"], r["condition"], r["image_id"]))):
        first: dict = {}
        for r in rows:
            k = key(r)
            if k in first:
                found.add(key_name, f"line {r['line']} repeats line {first[k]} ({', '.join(map(str, k))})")
                bad_rows.update({r["line"], first[k]})
            else:
                first[k] = r["line"]
    problems = found.problems()
    if any(p.kind in ("file mixes subjects", "file mixes experiments") for p in problems):
        return [], problems  # no row of such a file can be trusted to belong to the experiment
    kept = []
    for r in rows:
        if r["line"] in bad_rows:
            continue
        answered = r["object_response"] != NO_ANSWER
        report.unanswered += not answered
        kept.append({
            "subject": r["subj"], "dataset": dataset, "condition": r["condition"], "image_id": r["image_id"], "category": r["category"],
            "response": r["object_response"], "correct": answered and r["object_response"] == r["category"],
            "session": int(r["session"]), "trial": int(r["trial"]), "rt": float(r["rt"]) if r["rt"] else math.nan, "imagename": r["imagename"],
        })
    return kept, problems


def _csv_files(paths: Path | str | Iterable[Path | str]) -> list[tuple[Path, str]]:
    """(file, data set) for a file, a folder of CSVs (data set = folder name) or a benchmark root of experiment folders."""
    items = [paths] if isinstance(paths, (str, Path)) else list(paths)
    found = []
    for item in items:
        path = Path(item).expanduser()
        if path.is_file():
            found.append((path, path.parent.name))
        elif path.is_dir():
            direct = sorted(path.glob("*.csv"))
            if direct:
                found += [(f, path.name) for f in direct]
            else:
                found += [(f, f.parent.name) for f in sorted(path.glob("*/*.csv"))]
        else:
            raise FileNotFoundError(f"no trial file or folder at {path}")
    if not found:
        raise FileNotFoundError(f"no CSV files under {[str(p) for p in items]} (expected <experiment>/*.csv or *.csv)")
    return found


def read_trials(paths: Path | str | Iterable[Path | str], *, experiments: Sequence[str] | None = None, strict: bool = True,
                categories: Sequence[str] = SIXTEEN_CLASS_NAMES) -> tuple[pd.DataFrame, TrialReport]:
    """Read benchmark trial CSVs into a trial table and a :class:`TrialReport` (module docstring).

    ``paths``: a CSV file, a folder of CSVs (the data set is the folder's name), a root of experiment folders
    (``model-vs-human/raw-data``), or a list of these. ``experiments`` keeps only those data sets (an unknown
    name is an error). ``categories``: the valid class names (the 16 entry-level classes by default).
    Returns the table with :data:`~perceptual.decisions.TRIAL_TABLE_COLUMNS` + ``session, trial, rt, imagename``.
    """
    files = _csv_files(paths)
    if isinstance(experiments, str):  # one name, not its characters
        experiments = [experiments]
    if experiments is not None:
        available = sorted({d for _, d in files})
        unknown = sorted(set(experiments) - set(available))
        if unknown:
            raise ValueError(f"no trials for experiment(s) {unknown}; found {available}")
        files = [(f, d) for f, d in files if d in set(experiments)]
    report = TrialReport(files=len(files))
    valid = frozenset(categories)
    rows: list[dict] = []
    for path, dataset in files:
        kept, problems = _read_one(path, dataset, valid, report)
        rows += kept
        report.problems += problems
    # The same subject in two files of one experiment and session would double its trials.
    table = pd.DataFrame(rows, columns=list(TRIAL_TABLE_COLUMNS) + list(EXTRA_COLUMNS))
    duplicated = table.duplicated(["subject", "dataset", "session", "trial"], keep=False) if len(table) else pd.Series(dtype=bool)
    if duplicated.any():
        pairs = table.loc[duplicated, ["dataset", "subject"]].drop_duplicates()
        for dataset, subject in pairs.itertuples(index=False):
            count = int((duplicated & (table["dataset"] == dataset) & (table["subject"] == subject)).sum())
            report.problems.append(Problem(dataset, "subject's trials in several files", count, (f"subject {subject}",)))
        table = table.loc[~duplicated].reset_index(drop=True)
    # A subject who saw one image of a condition in two files (two sessions) has two answers where every analysis expects one.
    seen_twice = table.duplicated(["subject", "dataset", "condition", "image_id"], keep=False) if len(table) else pd.Series(dtype=bool)
    if seen_twice.any():
        for (dataset, subject), group in table.loc[seen_twice].groupby(["dataset", "subject"], sort=True):
            repeated = group[["condition", "image_id"]].drop_duplicates().head(3).itertuples(index=False)
            examples = tuple(f"subject {subject}, condition {c}, image {i}" for c, i in repeated)
            report.problems.append(Problem(dataset, "image seen twice in several files", len(group), examples))
        table = table.loc[~seen_twice].reset_index(drop=True)
    report.kept = len(table)
    if report.problems:
        if strict:
            raise TrialDataError(report)
        log.warning("trial files: left out problem rows\n%s", report.describe())
    if table.empty:
        raise ValueError("no valid trials were read:\n" + report.describe())
    table["correct"] = table["correct"].astype(bool)
    return table, report


def write_trials(table: pd.DataFrame, path: Path | str, *, session: int | None = None) -> Path:
    """Write a trial table in the benchmark's CSV format (atomically); returns the path.

    One file should hold one subject of one experiment, as in the benchmark; the table may hold several
    conditions. ``rt`` is written as ``NaN`` where absent (models have none, as in the benchmark's own output).
    ``session`` is the table's own column when present (as :func:`read_trials` returns it), else the ``session``
    argument, else 1; a ``session`` argument that contradicts the column is an error. ``trial`` is the table's
    own column when present, else 1, 2, ... in row order. ``imagename`` is the table's own column when present,
    else ``<trial>_<experiment tag>_dnn_<condition>_<image_id>`` (models are ``dnn`` in the benchmark's image
    names), so that :func:`read_trials` recovers ``image_id`` exactly (an id with ``_`` that is not ImageNet's ``n0…_…``
    would not, and is an error).
    """
    missing = [c for c in TRIAL_TABLE_COLUMNS if c not in table.columns]
    if missing:
        raise ValueError(f"the trial table lacks the column(s) {missing}; required: {TRIAL_TABLE_COLUMNS}")
    if table.empty:
        raise ValueError("the trial table is empty: nothing to write")
    for column in ("subject", "dataset"):
        values = table[column].unique()
        if len(values) != 1:
            raise ValueError(f"one file holds one {column}, as in the benchmark; got {len(values)}: {sorted(map(str, values))[:5]}; "
                             "write one file per subject and experiment")
    n = len(table)
    if "session" in table.columns:
        sessions = table["session"].astype(int).to_numpy()
        if session is not None and (sessions != session).any():
            raise ValueError(f"session={session} contradicts the table's own session column {sorted(set(sessions.tolist()))[:5]}; "
                             "drop the argument to keep the column, or drop the column to write one session")
    else:
        sessions = np.full(n, 1 if session is None else int(session))
    trials = table["trial"].astype(int).to_numpy() if "trial" in table.columns else np.arange(1, n + 1)
    if "imagename" in table.columns:
        names = table["imagename"].astype(str).tolist()
    else:
        conditions = table["condition"].astype(str)
        if (conditions == "").any():
            raise ValueError("conditions must not be empty: the condition is a field of the image name")
        if (table["image_id"].astype(str) == "").any():
            raise ValueError("image_id must not be empty: it is the source-image part of the image name")
        tag = EXPERIMENT_TAGS.get(str(table["dataset"].iloc[0]), str(table["dataset"].iloc[0]).replace("_", "-"))
        names = [f"{t:04d}_{tag}_dnn_{c}_{i}" for t, c, i in zip(trials, table["condition"].astype(str), table["image_id"].astype(str))]
        unkeyed = sorted({i for i in table["image_id"].astype(str) if _short_name(i) != i})
        if unkeyed:
            raise ValueError(f"image_id(s) {unkeyed[:5]} would not read back: observers are matched on the image name's last '_' field "
                             "(or ImageNet's n0…_… pair), as in model-vs-human; use ids without '_'")
    rt = table["rt"].to_numpy(dtype=float) if "rt" in table.columns else np.full(n, np.nan)
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(MVH_COLUMNS)
    for subject, s, t, r, response, category, condition, name in zip(
        table["subject"].astype(str), sessions, trials, rt, table["response"].astype(str), table["category"].astype(str),
        table["condition"].astype(str), names,
    ):
        writer.writerow([subject, int(s), int(t), "NaN" if math.isnan(r) else repr(float(r)), response, category, condition, name])
    return atomic_write_text(path, buffer.getvalue())


# ------------------------------------------------------------------------------------------------ image folders


IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")


def _class_folders(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".") and p.name != "dnn") if folder.is_dir() else []


def has_image_folder(root: Path | str, experiment: str) -> bool:
    """Whether ``root`` holds the experiment's images in one of the benchmark's layouts (:func:`read_image_folder`)."""
    folder = Path(root).expanduser() / experiment
    return (folder / "dnn" / "session-1").is_dir() or bool(_class_folders(folder))


def read_image_folder(root: Path | str, experiment: str) -> pd.DataFrame:
    """The images of one experiment as the benchmark releases them.

    Two layouts, as model-vs-human's data sets have them: ``<root>/<experiment>/dnn/session-1/*.png`` with
    ``<trial>_<tag>_dnn_<condition>_<image>`` names (``InfoMappingWithSessions``), or, for cue-conflict, edge and
    silhouette, ``<root>/<experiment>/<class>/*.png`` with bare file names (``ImageNetInfoMapping``: the class is the
    folder, the condition the single ``0``). Returns one row per image: ``path, imagename, condition, category,
    image_id`` (image_id = :func:`source_image`), sorted by name. A name that does not parse, or a category that is
    not one of the 16 classes, is an error that lists every such file.
    """
    experiment_folder = Path(root).expanduser() / experiment
    folder = experiment_folder / "dnn" / "session-1"
    if not folder.is_dir():
        if _class_folders(experiment_folder):
            return _read_class_folders(experiment_folder)
        raise FileNotFoundError(f"no image folder {folder} (the benchmark's layouts: <root>/<experiment>/dnn/session-1/*.png, "
                                "or <root>/<experiment>/<class>/*.png)")
    files = sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
    if not files:
        raise FileNotFoundError(f"{folder} holds no .png/.jpg images")
    rows, bad = [], []
    for path in files:
        parts = _split_imagename(path.name)
        if parts is None:
            bad.append(f"{path.name} (not <trial>_<experiment>_<subject>_<condition>_<image>)")
            continue
        category = parts[4].split("_")[0]
        if category not in SIXTEEN_CLASS_NAMES:
            bad.append(f"{path.name} (category {category!r} is not one of the 16 classes)")
            continue
        rows.append({"path": str(path), "imagename": path.name, "condition": parts[3], "category": category,
                     "image_id": _short_name(parts[4])})
    if bad:
        raise ValueError(f"{len(bad)} image name(s) in {folder} do not parse: " + "; ".join(bad[:10]) + (" ..." if len(bad) > 10 else ""))
    return pd.DataFrame(rows)


def _read_class_folders(folder: Path) -> pd.DataFrame:
    rows, bad = [], []
    for class_folder in _class_folders(folder):
        if class_folder.name not in SIXTEEN_CLASS_NAMES:
            bad.append(f"{class_folder.name}/ (not one of the 16 classes)")
            continue
        for path in sorted(p for p in class_folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES and not p.name.startswith(".")):
            if "_" in path.name:  # the key would drop everything before the last "_" and could join two images
                bad.append(f"{class_folder.name}/{path.name} (a bare file name has no '_')")
                continue
            rows.append({"path": str(path), "imagename": path.name, "condition": SINGLE_CONDITION, "category": class_folder.name,
                         "image_id": path.name})
    if bad:
        raise ValueError(f"{len(bad)} problem(s) in {folder}'s class folders: " + "; ".join(bad[:10]) + (" ..." if len(bad) > 10 else ""))
    if not rows:
        raise FileNotFoundError(f"{folder}'s class folders hold no .png/.jpg images")
    duplicated = pd.Series([r["image_id"] for r in rows]).duplicated(keep=False)
    if duplicated.any():
        names = sorted({r["image_id"] for r, d in zip(rows, duplicated) if d})
        raise ValueError(f"image name(s) {names[:5]} occur in more than one class folder of {folder}: trials are matched by file name")
    return pd.DataFrame(rows).sort_values("imagename", kind="stable").reset_index(drop=True)


def load_images(paths: Sequence[str | Path], size: int | None):
    """[0, 1] float images (N, 3, H, W) from image files (RGB), resized to ``size`` × ``size`` (bilinear) where they differ."""
    import torch
    from PIL import Image

    tensors = []
    for path in paths:
        with Image.open(path) as image:
            image = image.convert("RGB")
            if size is not None and image.size != (size, size):
                image = image.resize((size, size), Image.BILINEAR)
            tensors.append(torch.from_numpy(np.asarray(image, dtype=np.uint8).copy()).permute(2, 0, 1))
    shapes = {tuple(t.shape) for t in tensors}
    if len(shapes) != 1:
        raise ValueError(f"images of different sizes {sorted(shapes)} in one batch: give a square size to resize them to "
                         "(image_size= in python -m perceptual visalign, humans_image_size= in compare)")
    return torch.stack(tensors).float() / 255


def classify_image_folder(model, root: Path | str, experiment: str, *, subject: str, batch_size: int = 64,
                          size: int | None = 224, device: str = "cpu") -> pd.DataFrame:
    """A model's trial table on one experiment's image folder, deciding among the 16 classes.

    ``model`` maps [0, 1] images (N, 3, H, W) to ImageNet-1k logits (normalisation inside, as the toolkit's
    zoo does); its softmax goes through :func:`perceptual.metrics.imagenet_to_16_classes` (model-vs-human's
    ``ImageNetProbabilitiesTo16ClassesMapping``) and the argmax is the response. ``size``: images are resized to
    ``size`` × ``size`` when they differ (None: keep; the benchmark's images are 224 px). The table has the
    image names, so :func:`write_trials` writes them as the benchmark would and the trials join the human ones by
    source image.
    """
    import torch

    from .metrics import imagenet_to_16_classes

    images = read_image_folder(root, experiment)
    responses = []
    with torch.no_grad():
        for start in range(0, len(images), batch_size):
            batch = load_images(images["path"].iloc[start:start + batch_size].tolist(), size).to(device)
            logits = model(batch)
            if logits.ndim != 2 or logits.shape[1] != 1000:
                raise ValueError(f"the model must return (N, 1000) ImageNet logits, got shape {tuple(logits.shape)}")
            scores = imagenet_to_16_classes(logits.double().softmax(dim=1).cpu().numpy())
            responses += [SIXTEEN_CLASS_NAMES[i] for i in scores.argmax(axis=1)]
    table = pd.DataFrame({
        "subject": subject, "dataset": experiment, "condition": images["condition"], "image_id": images["image_id"],
        "category": images["category"], "response": responses,
    })
    table["correct"] = table["response"] == table["category"]
    table["session"] = 1
    table["trial"] = np.arange(1, len(table) + 1)
    table["rt"] = np.nan
    table["imagename"] = images["imagename"]
    return table[list(TRIAL_TABLE_COLUMNS) + list(EXTRA_COLUMNS)]


__all__ = [
    "EXPERIMENT_TAGS", "MVH_COLUMNS", "NO_ANSWER", "Problem", "SINGLE_CONDITION", "TrialDataError", "TrialReport", "classify_image_folder",
    "has_image_folder", "load_images", "read_image_folder", "read_trials", "source_image", "texture_category", "write_trials",
]
