"""Survey packages for people: the paper's 2AFC and clustering tasks as static web pages.

Follows Nanda et al. (AAAI 2023), Fig. 2 and Appendix A: 2AFC (query = an inversion result, options = its
seed and its target, "which option is perceptually closer to the query?") and clustering (3 targets as
columns, their results as rows, match each row to a column), random and hard triplets, a 2AFC between the two
directions of a controversial set (``controversial``, see :func:`_controversial_records`), attention checks
built as the paper built them (the query IS an option; the rows ARE the columns). The trials come from
:mod:`stimuli.trials` (sides and row orders counterbalanced with a seed); once dealt, sides are counterbalanced again
within each survey (:func:`_balance_sides`). Each participant sees a survey's trials in an order of their own, drawn
by the page at Start and kept across reloads (``trial_order="per_participant"``, so that position effects such as
learning and fatigue do not fall on the same trials for everyone; the paper does not say), or all in the package's order
(``"fixed"``); every answer records the position at which it was seen.

A package is a folder::

    manifest.json               every trial's ground truth (model, seed type, answer, attention check); NOT served
    input.csv                   one row per survey: MTurk's batch input (survey_url, completion code, Prolific
                                completion URL); NOT served
    surveys/                    the only folder to serve: ``base_url`` is its address, a survey's URL base_url/<id>/index.html
    surveys/<survey_id>/index.html   a self-contained page (Jinja2 template, inline dependency-free JS)
    surveys/<survey_id>/images/*.png the 8-bit PNGs it shows, under opaque names, one per appearance

The page carries only what a respondent sees: each appearance of an image has a name of its own (a salted hash) and
bytes of its own (:func:`_png_with_nonce`), and a clustering check has as many rows as a real trial, so neither a
name, nor a file's hash, nor the page's data says which option is the target (a target recurs across trials, a seed
does not) or which trial is a check (its query is one of the options). The pixels show that much to a person, as in
the paper, and so to a script that decodes the images and compares them, or merely their sizes (the appearances of
one image differ only in a nonce of fixed length): screen for bots by other means too.
Deliberate differences from the paper: each survey holds one task (the instructions differ), and the trials of all
models are dealt into surveys in an even mix so that no worker sees only one model.
"""
from __future__ import annotations

import csv
import functools
import hashlib
import io
import json
import logging
import math
import struct
import tempfile
import zlib
from collections import Counter
from pathlib import Path
from typing import Mapping, Sequence
from urllib.parse import urlsplit

import jinja2
import numpy as np
import pandas as pd

from training.config import check_whole_number
from training.io import atomic_directory

from .distances import set_trials
from .sets import StimulusSet, canonical_json, load_set
from .sources import stream_seed
from .trials import TASKS, attention_check_count, balanced_sides, check_attention_rate

logger = logging.getLogger("stimuli")

FORMAT = "repalign-survey-package/1"
RESPONSE_FORMAT = "repalign-survey-responses/1"
PACKAGE_ENTRIES = ("surveys", "input.csv", "manifest.json")  # all that build_survey writes into ``out``
PROMPTS = {
    "2afc": "Which option is perceptually closer to the query?",
    "clustering": "Match each row image to the column image it looks most similar to.",
}
SURVEY_TASKS = TASKS + ("controversial",)  # controversial: from controversial sets, the others from inversion sets
TRIAL_ORDERS = ("per_participant", "fixed")  # each participant's page shuffles the trials once, or everyone sees the package's order
PROLIFIC_COMPLETE = "https://app.prolific.com/submissions/complete?cc={code}"
PLACEHOLDER_BASE_URL = "https://YOUR-HOST/PATH"  # the default: input.csv's survey_url works only once it is replaced
DISPLAY_PX = 128  # the size pages aim at (CSS pixels), reached by enlarging small images a whole number of times


def display_size(height: int, width: int) -> tuple[int, int, int]:
    """(height, width, factor): the CSS size a page shows a ``height`` x ``width`` image at, every image pixel as
    ``factor`` x ``factor`` screen pixels (nearest neighbour where ``factor`` > 1): a whole-number enlargement to about
    :data:`DISPLAY_PX` (32 px CIFAR at 4x, 8 px digits at 16x) and never a reduction. Before, every image was forced to
    128 px (96 px as a clustering row), which drops about 100 of a 224-px image's pixel rows and columns: people judged
    another image than the one the observers score, and rows and columns of one trial at different sizes."""
    if any(isinstance(v, bool) or int(v) != v or v < 1 for v in (height, width)):
        raise ValueError(f"an image's height and width must be whole numbers >= 1 pixel, got {height!r} x {width!r}")
    factor = max(1, round(DISPLAY_PX / max(int(height), int(width))))
    return int(height) * factor, int(width) * factor, factor


def _template_env() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.PackageLoader("stimuli", "templates"), autoescape=jinja2.select_autoescape(["html", "j2"]),
        undefined=jinja2.StrictUndefined,
    )


# Characters a model label may not hold (perceptual.measure.ModelSpec refuses the same, so a survey's labels can always be a
# measure report's): "/" and "\\" would split the model's folder, "|" a Markdown table row, "$" turns a figure label into TeX.
LABEL_FORBIDDEN = ("/", "\\", "|", "$", "\n")
LABEL_RULE = f"no {' '.join(repr(c) for c in LABEL_FORBIDDEN)} and no leading '.'"


def is_plain_label(label) -> bool:
    """Whether ``label`` can name a model: a non-empty string that keeps :data:`LABEL_RULE`."""
    return isinstance(label, str) and bool(label) and not label.startswith(".") and not any(c in label for c in LABEL_FORBIDDEN)


def check_model_label(label) -> str:
    """``label`` if it can name a model in the survey and in a measure report, else a ValueError that says why."""
    if not is_plain_label(label):
        raise ValueError(f"model label {label!r} must be a plain, non-empty string: it becomes a folder, a cell of the reports' tables "
                         f"and a figure label, so {LABEL_RULE} (quote numbers: labels=['0.5','1.0'])")
    return label


def check_base_url(base_url) -> str:
    """``base_url`` if it is an absolute address (scheme and host, or a file:// folder), else a ValueError that says why.
    The placeholder default is accepted with a warning (a package built to look at before it is hosted)."""
    parts = urlsplit(base_url) if isinstance(base_url, str) else None
    if parts is None or not parts.scheme or not (parts.netloc or parts.scheme == "file"):
        raise ValueError(f"base_url {base_url!r} is not an absolute address: give the one the package's surveys/ folder is served at, "
                         "with its scheme, e.g. base_url=https://example.org/study (input.csv's survey_url starts with it)")
    if base_url == PLACEHOLDER_BASE_URL:
        logger.warning("base_url is still the placeholder %s: input.csv's survey_url will not open; rebuild with base_url=<the address "
                       "the surveys/ folder is served at> before uploading input.csv (the pages themselves do not depend on it)", base_url)
    return base_url


def _check_sets_comparable(loaded: Mapping[str, StimulusSet]) -> None:
    """Refuse sets that one package cannot hold side by side: the same set under two labels (its trials would count twice,
    as two models) and images of different shapes (the pages would show them at different sizes, and the observers'
    reanalysis of the package compares images of one shape)."""
    by_fingerprint: dict[str, list[str]] = {}
    for label, s in loaded.items():
        if s.fingerprint is not None:
            by_fingerprint.setdefault(s.fingerprint, []).append(label)
    repeated = [labels for labels in by_fingerprint.values() if len(labels) > 1]
    if repeated:
        raise ValueError(f"labels {repeated[0]} name the same stimulus set (fingerprint {loaded[repeated[0][0]].fingerprint}): "
                         "give each label a set of its own")
    shapes = {label: tuple(s.images.shape[1:]) for label, s in loaded.items()}
    if len(set(shapes.values())) > 1:
        listed = ", ".join(f"{label} {'x'.join(map(str, shape))}" for label, shape in shapes.items())
        raise ValueError(f"the sets' images differ in shape (channels x height x width: {listed}): a package compares models on "
                         "images of one shape; build one package per image shape")


def _check_options(sets: Mapping, tasks: Sequence[str], trials_per_survey: int, attention_rate: float, minutes: float,
                   trial_order: str, base_url: str, out: Path, overwrite: bool, seed: int = 0) -> None:
    if not sets:
        raise ValueError("no stimulus sets given: pass sets={label: path} with at least one inversion set")
    for label in sets:
        check_model_label(label)
    unknown = [t for t in tasks if t not in SURVEY_TASKS]
    if unknown or not tasks:
        raise ValueError(f"unknown tasks {unknown or tasks}: use some of {SURVEY_TASKS}")
    repeated = sorted(t for t, n in Counter(tasks).items() if n > 1)
    if repeated:
        raise ValueError(f"tasks {repeated} are listed more than once: name each task once")
    check_whole_number(trials_per_survey, "trials_per_survey")
    check_whole_number(seed, "seed", least=0)
    if isinstance(minutes, bool) or not isinstance(minutes, (int, float)) or not minutes > 0:
        raise ValueError(f"minutes (the duration of a full survey of trials_per_survey judgements) must be a number > 0, got {minutes!r}")
    check_attention_rate(attention_rate)
    if trial_order not in TRIAL_ORDERS:
        raise ValueError(f"unknown trial_order {trial_order!r}: use one of {TRIAL_ORDERS}")
    check_base_url(base_url)
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"{out} is a file: give a directory for the survey package")
    if out.exists() and any(out.iterdir()):
        if not overwrite:
            if _package_manifest(out) is None:
                raise FileExistsError(f"{out} exists and is not empty: choose another out or pass overwrite=true")
            return  # a package: build_survey compares it with the one it builds
        _check_replaceable(out)


def _package_manifest(out: Path) -> dict | None:
    """The manifest of the survey package at ``out``, or None where ``out`` holds none."""
    try:
        manifest = json.loads((out / "manifest.json").read_text())
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) and manifest.get("format") == FORMAT else None


def _check_replaceable(out: Path) -> None:
    """Refuse to replace ``out`` unless it is a survey package and nothing else (answers saved inside it would go too)."""
    if _package_manifest(out) is None:
        raise FileExistsError(f"{out} is not a survey package: overwrite=true replaces only a package; choose another out")
    others = sorted(p.name for p in out.iterdir() if p.name not in PACKAGE_ENTRIES)
    if others:
        raise FileExistsError(f"{out} holds {others} besides the survey package: move them out first, or choose another out")


def _trial_records(label: str, stimulus_set: StimulusSet, task: str, seed: int, attention_rate: float, distance) -> list[dict]:
    """The trials of one set and task as records with the set's image ids (ground truth included)."""
    table = set_trials(stimulus_set, task, seed=stream_seed(seed, f"survey:{label}:{task}"), attention_rate=attention_rate, distance=distance)
    records = []
    if task == "2afc":
        for r in table.itertuples():
            records.append({
                "model": label, "task": task, "attention_check": bool(r.attention_check), "seed_type": r.seed_type,
                "target_id": r.target_id, "query": r.query_id, "options": [r.left_id, r.right_id],
                "rows": [{"query": r.query_id, "answer": r.answer, "seed_type": r.seed_type}],
            })
        return records
    for _, group in table.groupby("trial", sort=True):
        first = group.iloc[0]
        records.append({
            "model": label, "task": task, "attention_check": bool(first["attention_check"]), "seed_type": None,
            "columns": [first["column_0"], first["column_1"], first["column_2"]],
            "rows": [{"query": q, "answer": str(int(a)), "seed_type": s, "target_id": t}
                     for q, a, s, t in zip(group["query_id"], group["answer"], group["seed_type"], group["target_id"])],
        })
    return records


def _controversial_records(label: str, stimulus_set: StimulusSet, seed: int, attention_rate: float) -> list[dict]:
    """2AFC between the two directions of a controversial set (Nanda et al. Eq. 2): the query is the origin, the options
    the result that keeps model A (direction AB) and the one that keeps model B (BA) from the same start. There is no
    correct side; ``answer`` marks the AB option, so the "accuracy" is the fraction of answers that find model A's
    stimulus closer to the origin (above 1/2: people see A's invariances as more aligned, cf. Table 2). Checks: one
    option is the origin itself (their answer is the origin's side)."""
    rng = np.random.default_rng(stream_seed(seed, f"survey:{label}:controversial"))
    results = stimulus_set.manifest[stimulus_set.manifest["role"] == "result"]
    directions = set(results["direction"].dropna())
    if not {"AB", "BA"} <= directions:
        raise ValueError(f"set {label!r} has directions {sorted(directions)}: a controversial survey needs both AB and BA results")
    pairs = []
    for (origin, _), group in results.groupby(["origin_id", "restart"], sort=True):
        by_direction = dict(zip(group["direction"], group["id"]))
        if {"AB", "BA"} <= set(by_direction):
            pairs.append((origin, by_direction["AB"], by_direction["BA"], False))
    n_checks = attention_check_count(len(pairs), attention_rate)
    for i in rng.choice(len(pairs), size=n_checks, replace=n_checks > len(pairs)):
        origin, ab, ba, _ = pairs[i]
        pairs.append((origin, origin, ab if rng.random() < 0.5 else ba, True))  # the origin against one result
    n_real = len(pairs) - n_checks
    # Sides counterbalanced separately among real trials and among checks, the odd one at random: a fixed side for it
    # would put a lone check's correct answer on the left every time.
    first_left = np.r_[balanced_sides(n_real, rng), balanced_sides(n_checks, rng)]
    records = []
    for (origin, first, second, check), left in zip(pairs, first_left):
        options = [first, second] if left else [second, first]
        records.append({"model": label, "task": "controversial", "attention_check": check, "seed_type": None, "target_id": origin,
                        "query": origin, "options": options,
                        "rows": [{"query": origin, "answer": "left" if left else "right", "seed_type": "origin" if check else "AB-vs-BA"}]})
    return records


def _with_a_check_per_survey(records: list[dict], trials_per_survey: int, task: str) -> tuple[list[dict], int]:
    """``records`` with enough attention checks for every survey to get one, and the number of surveys. With fewer checks
    than surveys (a small ``attention_rate`` or ``trials_per_survey``) some surveys would have none, and a participant
    who always presses one key could never be excluded there; checks are repeated (each survey is done by other people)
    until there is one per survey, adding surveys only where the repeats do not fit into ``trials_per_survey``. Without
    any check (``attention_rate`` 0, or a rate that rounds to no check on this few trials), or with one trial per survey,
    nothing is added."""
    checks = [r for r in records if r["attention_check"]]
    n_surveys = max(1, math.ceil(len(records) / trials_per_survey))
    if not checks or len(checks) >= n_surveys or trials_per_survey < 2:
        return records, n_surveys
    n_real = len(records) - len(checks)
    while math.ceil((n_real + n_surveys) / trials_per_survey) > n_surveys:  # one check per survey, and room for it
        n_surveys += 1
    repeats = [dict(checks[i % len(checks)]) for i in range(n_surveys - len(checks))]
    logger.info("%s: %d attention checks for %d surveys: %d repeated so that every survey has one", task, len(checks), n_surveys, len(repeats))
    return records + repeats, n_surveys


def _deal(records: list[dict], n_surveys: int, rng: np.random.Generator) -> list[list[dict]]:
    """Split trials into ``n_surveys`` hands with a balanced mix of models (real trials and checks separately); no
    hand holds more than ceil(len(records) / n_surveys) trials."""

    def interleaved(checks: bool) -> list[dict]:
        """Every model's trials (in random order) spread evenly over one sequence: its i-th of n trials sits at
        (i + 1/2) / n. Equal counts give a round robin; a model with fewer trials still reaches every part."""
        by_model: dict[str, list[dict]] = {}
        for r in records:
            if r["attention_check"] == checks:
                by_model.setdefault(r["model"], []).append(r)
        placed = [((i + 0.5) / len(trials), m, trials[j])
                  for m, trials in enumerate(by_model.values()) for i, j in enumerate(rng.permutation(len(trials)))]
        return [r for _, _, r in sorted(placed, key=lambda p: p[:2])]

    hands: list[list[dict]] = [[] for _ in range(n_surveys)]
    real = interleaved(checks=False)
    # Contiguous pieces of the interleaved order: each hand gets every model in its share (dealing card by card
    # would give hand k only the models at positions k, k + n_surveys, ...).
    for hand, piece in zip(hands, np.array_split(np.arange(len(real)), n_surveys)):
        hand.extend(real[i] for i in piece)
    # Each check to the shortest hand, of those the one with fewest checks: splitting checks on their own could put one
    # trial too many in a hand, and a tie broken by position alone could give one hand two checks and another none. The
    # remaining ties are broken at random: by position, the checks (interleaved by model) all went model by model to
    # the same hands, every standard check to survey 0 and every robust one to survey 1.
    # A clustering check shows the columns of a real triplet (its rows are those columns): in the survey that holds that
    # triplet a participant could tell the check by its columns seen before. Among the hands with room, one without its
    # twin is taken first.
    cap = math.ceil(len(records) / n_surveys)

    def twin(hand: list[dict], check: dict) -> bool:
        columns = frozenset(check.get("columns", ()))
        return bool(columns) and any(not r["attention_check"] and frozenset(r.get("columns", ())) == columns for r in hand)

    for check in interleaved(checks=True):
        tie_break = rng.permutation(n_surveys)
        k = min(range(n_surveys), key=lambda k: (len(hands[k]) >= cap, sum(r["attention_check"] for r in hands[k]),
                                                 twin(hands[k], check), len(hands[k]), tie_break[k]))
        hands[k].append(check)
    return [[hand[i] for i in rng.permutation(len(hand))] for hand in hands]


def _balance_sides(hand: list[dict], rng: np.random.Generator, excess: dict[tuple, int]) -> list[dict]:
    """Counterbalance the answer side of two-option trials within one survey: among its checks, and among each
    model's real trials, half the answers sit on the left, and half within each of the model's seed types. Sides
    balanced over a whole set are not balanced per survey once the set is dealt: a survey whose checks all sit on one
    side lets a participant who always presses that key pass them all, and a model whose trials lean to one side picks
    up any side bias. The odd trial of a (model, seed type) goes to the side that group is behind on over the package
    so far (``excess``: left minus right answers, updated here), so the per-seed-type scores stay balanced over the
    package as :func:`stimuli.trials.two_afc_trials` made them. A trial is flipped by swapping its options (and its
    answer); images and ground truth stay as they were."""
    groups: dict[tuple, dict[str | None, list[int]]] = {}
    for i, record in enumerate(hand):
        if "options" in record:
            check = record["attention_check"]
            groups.setdefault(("check",) if check else ("real", record["model"]), {}).setdefault(
                None if check else record["rows"][0]["seed_type"], []).append(i)
    balanced = list(hand)
    for key, by_seed_type in groups.items():
        odd = [s for s, members in by_seed_type.items() if len(members) % 2]
        tie_break = dict(zip(odd, rng.random(len(odd))))
        odd.sort(key=lambda s: (excess.get((*key, s), 0), tie_break[s]))  # those furthest behind on the left first
        n_left = len(odd) // 2  # half the odd ones left keeps the model's total balanced
        if len(odd) % 2:
            behind = excess.get((*key, odd[n_left]), 0)
            n_left += bool(behind < 0 or (behind == 0 and rng.random() < 0.5))
        for seed_type, members in by_seed_type.items():
            left = balanced_sides(len(members), rng, odd_left=seed_type in odd[:n_left])
            excess[(*key, seed_type)] = excess.get((*key, seed_type), 0) + 2 * int(left.sum()) - len(left)
            for i, on_left in zip(members, left):
                record, row = hand[i], hand[i]["rows"][0]
                if (row["answer"] == "left") != bool(on_left):
                    balanced[i] = {**record, "options": record["options"][::-1],
                                   "rows": [{**row, "answer": "left" if on_left else "right"}, *record["rows"][1:]]}
    return balanced


def _warn_of_small_surveys(task: str, records: Sequence[Mapping], per_page: int, trials_per_survey: int) -> None:
    """Say where a small ``trials_per_survey`` bends the package's promises: a clustering survey holds whole trials (at
    least two where it can), so more judgements than asked (and announces their time); a one-trial survey has no room
    for an attention check."""
    rows = max((len(r["rows"]) for r in records), default=1)
    if per_page * rows > trials_per_survey:
        logger.warning("%s: its surveys hold %d trial(s) of %d rows, %d judgements each (and announce their time), more than "
                       "trials_per_survey=%d (a survey holds at least 2 trials where it can, so that one can be a check)",
                       task, per_page, rows, per_page * rows, trials_per_survey)
    checks = sum(bool(r["attention_check"]) for r in records)
    surveys = math.ceil(len(records) / per_page)
    if per_page < 2 and 0 < checks < surveys:
        logger.warning("%s: with one trial per survey there is no room for an attention check beside it: %d of %d surveys have "
                       "none (raise trials_per_survey to 2 or more)", task, surveys - checks, surveys)


def trials_per_page(records: Sequence[Mapping], trials_per_survey: int) -> int:
    """How many of a task's trials one survey holds, so that every survey asks at most ``trials_per_survey`` judgements and
    takes at most a full survey's ``minutes``: a 2AFC trial asks one, a clustering trial one per row (6 with two seed types),
    so a clustering survey holds ``trials_per_survey // 6`` trials; before, it held ``trials_per_survey`` and ran six
    times as long (two hours at the defaults). At least two trials where the task has them (one may be an attention
    check), and never more than ``trials_per_survey``."""
    per_trial = max((len(r["rows"]) for r in records), default=1)
    return min(trials_per_survey, max(2, trials_per_survey // per_trial)) if per_trial > 1 else trials_per_survey


def announced_minutes(minutes: float, n_judgements: int, trials_per_survey: int) -> int:
    """The duration a survey of ``n_judgements`` announces when a full one of ``trials_per_survey`` 2AFC trials (one
    judgement each) takes ``minutes``. A clustering trial asks one judgement per row (6 with two seed types), so a page of
    10 clustering trials takes longer than one of 10 2AFC trials; and the deal spreads a task's trials evenly, so 41 2AFC
    trials at 40 per survey make two surveys of about 20, each half as long as a full one. At least one minute."""
    if not minutes > 0 or n_judgements < 0 or trials_per_survey < 1:
        raise ValueError(f"need minutes > 0, n_judgements >= 0 and trials_per_survey >= 1, got {minutes}, {n_judgements} and {trials_per_survey}")
    return max(1, math.ceil(minutes * n_judgements / trials_per_survey - 1e-9))


def _image_name(png: bytes) -> str:
    return hashlib.sha256(png).hexdigest()[:20] + ".png"


PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _png_with_nonce(png: bytes, nonce: str) -> bytes:
    """``png`` with a ``tEXt`` chunk (keyword ``Comment``, text ``nonce``) after its header: the same pixels, bit for
    bit, in a file whose hash no other appearance shares. Written by hand rather than re-encoded by Pillow, so that the
    image data stays the stimulus set's own (PNG specification, section 5.3: length, type, data, CRC-32 of type and data)."""
    header_end = len(PNG_SIGNATURE) + 8 + 13 + 4  # IHDR: length, type, 13 bytes of data, CRC
    if not png.startswith(PNG_SIGNATURE) or png[12:16] != b"IHDR":
        raise ValueError("not a PNG file (no signature and header): the stimulus set's images are corrupt; make the set again")
    data = b"Comment\0" + nonce.encode("latin-1")
    chunk = struct.pack(">I", len(data)) + b"tEXt" + data + struct.pack(">I", zlib.crc32(b"tEXt" + data))
    return png[:header_end] + chunk + png[header_end:]


def build_survey(
    sets: Mapping[str, str | Path | StimulusSet],
    out: str | Path,
    *,
    tasks: Sequence[str] = ("2afc", "clustering", "clustering_hard"),
    trials_per_survey: int = 40,
    attention_rate: float = 0.1,
    seed: int = 0,
    distance="pixel_l2",
    title: str = "Image similarity study",
    base_url: str = PLACEHOLDER_BASE_URL,
    minutes: float = 20,
    trial_order: str = "per_participant",
    overwrite: bool = False,
) -> dict:
    """Write a survey package for ``sets`` ({model label: inversion set or its path}) to ``out``; return its manifest.

    Each task's trials (with ``attention_rate`` checks) from every set are dealt round-robin over models into surveys of
    at most ``trials_per_survey`` judgements: that many 2AFC trials, or clustering trials whose rows add up to no more
    (:func:`trials_per_page`). ``minutes`` is the duration of a full survey of ``trials_per_survey`` judgements; each page
    announces its own share (:func:`announced_minutes`), as does ``input.csv``. ``base_url`` is the address the package's ``surveys/`` folder will be served at
    (:func:`check_base_url`). ``trial_order``: ``per_participant`` (each participant's page shuffles the survey's trials
    once) or ``fixed``. The package is written
    into a temporary folder next to ``out`` and renamed into place, so a crash never leaves a half package. ``overwrite``
    replaces an earlier package at ``out``; a folder that is not one, or a package with other files beside it (answers
    saved there), is refused, not deleted. Without ``overwrite``, a package at ``out`` is kept and its manifest returned
    where it is the very package this call builds (a rerun of the same command), and refused, naming what differs, otherwise.
    """
    out = Path(out)
    _check_options(sets, list(tasks), trials_per_survey, attention_rate, minutes, trial_order, base_url, out, overwrite, seed)
    loaded = {label: s if isinstance(s, StimulusSet) else load_set(s) for label, s in sets.items()}
    _check_sets_comparable(loaded)
    for label, s in loaded.items():
        wanted = "controversial" if s.kind == "controversial" else "inversion" if s.kind == "inversion" else None
        if wanted is None:
            raise ValueError(f"set {label!r} is a {s.kind} set: surveys are built from inversion and controversial sets")
        if wanted == "controversial" and "controversial" not in tasks:
            raise ValueError(f"set {label!r} is a controversial set: add controversial to tasks (tasks=[...,controversial])")
        if wanted == "inversion" and not set(tasks) & set(TASKS):
            raise ValueError(f"set {label!r} is an inversion set: tasks needs one of {TASKS}")
    rng = np.random.default_rng(seed)
    surveys = []
    for task in tasks:
        if task == "controversial":
            records = [r for label, s in loaded.items() if s.kind == "controversial" for r in _controversial_records(label, s, seed, attention_rate)]
        else:
            records = [r for label, s in loaded.items() if s.kind == "inversion" for r in _trial_records(label, s, task, seed, attention_rate, distance)]
        if not records:
            raise ValueError(f"no set gives {task} trials: {task} needs {'a controversial' if task == 'controversial' else 'an inversion'} set")
        per_page = trials_per_page(records, trials_per_survey)
        _warn_of_small_surveys(task, records, per_page, trials_per_survey)
        records, n_surveys = _with_a_check_per_survey(records, per_page, task)
        excess: dict[tuple, int] = {}  # (check or real, model, seed type) -> left minus right answers in this task's surveys
        for k, hand in enumerate(_deal(records, n_surveys, rng)):
            surveys.append({"survey_id": f"{task}-{k:03d}", "task": task, "trials": _balance_sides(hand, rng, excess)})

    write = functools.partial(_write_package, loaded=loaded, surveys=surveys, tasks=list(tasks), trials_per_survey=trials_per_survey,
                              attention_rate=attention_rate, seed=seed, trial_order=trial_order, title=title, base_url=base_url,
                              minutes=minutes, rng=rng)
    existing = None if overwrite else _package_manifest(out)
    if existing is not None:  # a rerun (a script, a requeued job) that would build the same package leaves the served one alone
        with tempfile.TemporaryDirectory(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent) as scratch:
            manifest = write(Path(scratch))
        _check_same_package(out, existing, manifest)
        logger.info("%s already holds this survey package (%s): left as it is", out, existing["fingerprint"])
        return existing
    with atomic_directory(out) as staging:  # a package replaced only once the new one is complete; served as the umask says
        manifest = write(staging)
    logger.info("survey package with %d surveys (%d trials) written to %s", len(surveys), len(manifest["trials"]), out)
    return manifest


def _check_same_package(out: Path, existing: Mapping, built: Mapping) -> None:
    """Refuse, naming what differs, unless the package at ``out`` is the one just built (where the sets lay aside)."""
    def content(manifest: Mapping) -> dict:
        sets = {label: {k: v for k, v in info.items() if k != "path"} for label, info in manifest.get("sets", {}).items()}
        return {**manifest, "sets": sets}

    old, new = content(existing), json.loads(json.dumps(content(built)))  # as read back: tuples as lists
    if old == new:
        return
    config = sorted(k for k in set(old.get("config", {})) | set(new["config"]) if old.get("config", {}).get(k) != new["config"].get(k))
    other = sorted(k for k in set(old) | set(new) if k != "config" and old.get(k) != new.get(k))
    differs = ", ".join([*(f"config.{k}" for k in config), *other])
    raise FileExistsError(f"{out} holds another survey package (it differs in {differs}): choose another out, or pass overwrite=true "
                          "to replace it (answers already collected for it will not match the new one)")


def _write_package(root: Path, loaded: Mapping[str, StimulusSet], surveys: list[dict], *, rng: np.random.Generator,
                   title: str, base_url: str, minutes: float, **config) -> dict:
    pngs: dict[tuple[str, str], bytes] = {}
    files: dict[str, bytes] = {}  # served name -> PNG
    salt = rng.bytes(16)  # names no page can predict

    def png(label: str, image_id: str, appearance: str) -> str:
        """A name and bytes of its own for each appearance of an image: a shared name or file would tell a script which
        option is the target (it recurs across trials, seeds do not) and which trials are checks (the query among the options)."""
        key = (label, image_id)
        if key not in pngs:
            stimulus_set = loaded[label]
            relative = stimulus_set.manifest.set_index("id").loc[image_id, "png"]
            pngs[key] = (Path(stimulus_set.path) / relative).read_bytes()
        name = _image_name(salt + appearance.encode() + pngs[key])
        files[name] = _png_with_nonce(pngs[key], name.removesuffix(".png"))
        return name

    truth, pages = [], []
    for survey in surveys:
        page_trials = []
        for position, r in enumerate(survey["trials"]):
            trial_id = f"{survey['survey_id']}/{position:03d}"
            label = r["model"]
            if r["task"] in ("2afc", "controversial"):
                shown = {"query": png(label, r["query"], f"{trial_id}:query"),
                         "options": [png(label, o, f"{trial_id}:option{k}") for k, o in enumerate(r["options"])]}
                ids = {"query_id": r["query"], "left_id": r["options"][0], "right_id": r["options"][1]}
                query_files = [shown["query"]]
            else:
                shown = {"columns": [png(label, c, f"{trial_id}:column{k}") for k, c in enumerate(r["columns"])],
                         "rows": [png(label, row["query"], f"{trial_id}:row{k}") for k, row in enumerate(r["rows"])]}
                ids = {f"column_{k}": c for k, c in enumerate(r["columns"])}
                query_files = shown["rows"]
            page_trials.append({"trial_id": trial_id, "task": "clustering" if "clustering" in r["task"] else "2afc", **shown})
            truth.append({
                "trial_id": trial_id, "survey_id": survey["survey_id"], "position": position, "model": label, "task": r["task"],
                "attention_check": r["attention_check"], **ids, "images": shown,
                "rows": [{**row, "query_file": name} for row, name in zip(r["rows"], query_files)],
            })
        pages.append((survey, page_trials))

    sets_info = {label: {"path": str(s.path), "fingerprint": s.fingerprint, "model": s.parameters.get("model")} for label, s in loaded.items()}
    # What the answers mean (each set's content and label, the trials), not where the sets lay: the same package rebuilt from
    # another path, or on another machine, must accept the answers to the pages already out.
    identity = {label: {k: v for k, v in info.items() if k != "path"} for label, info in sets_info.items()}
    fingerprint = hashlib.sha256(canonical_json({"sets": identity, "trials": truth}).encode()).hexdigest()[:16]
    env = _template_env()
    template = env.get_template("survey.html.j2")
    shown_height, shown_width, factor = display_size(*next(iter(loaded.values())).images.shape[2:])  # one shape: _check_sets_comparable
    script = (Path(__file__).parent / "templates" / "survey.js").read_text()
    survey_rows = []
    for survey, page_trials in pages:
        sid = survey["survey_id"]
        folder = root / "surveys" / sid
        (folder / "images").mkdir(parents=True)
        names = {name for t in page_trials for name in ([t.get("query")] + t.get("options", []) + t.get("columns", []) + t.get("rows", [])) if name}
        for name in sorted(names):
            (folder / "images" / name).write_bytes(files[name])
        code = "".join(rng.choice(list("ABCDEFGHJKLMNPQRSTUVWXYZ23456789"), size=8))
        task = "clustering" if "clustering" in survey["task"] else "2afc"
        page_data = {"package": fingerprint, "survey_id": sid, "task": task, "prompt": PROMPTS[task], "completion_code": code,
                     "format": RESPONSE_FORMAT, "shuffle": config["trial_order"] == "per_participant", "trials": page_trials}
        data_json = json.dumps(page_data, separators=(",", ":")).replace("</", "<\\/")
        n_judgements = sum(len(r["rows"]) for r in survey["trials"])  # a 2AFC trial is one, a clustering trial one per row
        survey_minutes = announced_minutes(minutes, n_judgements, config["trials_per_survey"])
        html = template.render(title=title, task=task, prompt=PROMPTS[task], minutes=survey_minutes, n_trials=len(page_trials),
                               data_json=data_json, script=script, image_height=shown_height, image_width=shown_width, enlarged=factor > 1)
        (folder / "index.html").write_text(html, encoding="utf-8")
        survey_rows.append({
            "survey_id": sid, "task": survey["task"], "n_trials": len(page_trials), "n_judgements": n_judgements, "minutes": survey_minutes,
            "n_attention_checks": sum(r["attention_check"] for r in survey["trials"]),
            "models": sorted({r["model"] for r in survey["trials"]}),
            "survey_url": f"{base_url.rstrip('/')}/{sid}/index.html", "completion_code": code,  # base_url serves surveys/ alone
            "prolific_completion_url": PROLIFIC_COMPLETE.format(code=code),
        })

    manifest = {"format": FORMAT, "fingerprint": fingerprint, "config": {**config, "title": title, "minutes": minutes},
                "sets": sets_info, "surveys": survey_rows, "trials": truth}
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=["survey_id", "task", "n_trials", "minutes", "survey_url", "completion_code", "prolific_completion_url"],
                            extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    writer.writerows(survey_rows)
    (root / "input.csv").write_text(buffer.getvalue())
    (root / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return manifest


def truth_table(manifest: Mapping) -> pd.DataFrame:
    """One row per answer unit (a 2AFC trial, a clustering row) with its ground truth, from a package manifest."""
    rows = []
    for t in manifest["trials"]:
        for k, row in enumerate(t["rows"]):
            rows.append({"trial_id": t["trial_id"], "row": k if "clustering" in t["task"] else 0, "survey_id": t["survey_id"], "model": t["model"],
                         "task": t["task"], "attention_check": t["attention_check"], "seed_type": row.get("seed_type"), "answer": str(row["answer"])})
    return pd.DataFrame(rows)
