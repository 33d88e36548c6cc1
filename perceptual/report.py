"""Reports: the paper's Table 1 as Markdown, Markdown reports as HTML pages, image grids, and the alignment-vs-robustness scatter.

Everything is written atomically next to a JSON file that holds every number (``report.json``).
"""
from __future__ import annotations

import html
import io
import math
import re
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch
from markdown_it import MarkdownIt
from markdown_it.token import Token

from training.io import atomic_write_bytes, atomic_write_text


def plain(obj: Any) -> Any:
    """JSON-safe: NaN/inf → None (JSON has no literal for them; Python's ``json`` writes ``NaN``, which strict readers refuse), numpy → Python."""
    if isinstance(obj, Mapping):
        return {str(k): plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [plain(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return plain(obj.tolist())
    if isinstance(obj, (np.floating, float)):
        return float(obj) if math.isfinite(obj) else None
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.bool_):
        return bool(obj)
    return obj


def format_score(value, std=None, percent: bool = True) -> str:
    """A score as the tables print it: percent with one decimal, ``± std`` when given, "–" when missing."""
    return _fmt(value, std, percent)


def _fmt(value, std=None, percent: bool = True) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    scale = 100 if percent else 1
    text = f"{value * scale:.1f}" if percent else f"{value:.3f}"
    if std is not None and not math.isnan(std):
        text += f" ± {std * scale:.1f}" if percent else f" ± {std:.3f}"
    return text


TASK_TITLES = {"2afc": "2AFC", "clustering": "clustering", "clustering_hard": "hard clustering"}  # the tasks in figures' words

TABLE_COLUMNS = (
    ("model", "Model"),
    ("2afc", "Observer 2AFC (%)"),
    ("clustering", "Observer clustering (%)"),
    ("clustering_hard", "Hard clustering (%)"),
    ("clean_accuracy", "Clean acc. (%)"),
    ("robust_accuracy", "Robust acc. (%)"),
)


# Shown when a model has a ``humans`` entry (perceptual.humans: accuracy of the workers kept after attention checks).
HUMAN_COLUMNS = (("human:2afc", "Human 2AFC (%)"), ("human:clustering", "Human clustering (%)"), ("human:clustering_hard", "Human hard clustering (%)"))


def table_columns(models: Mapping[str, Mapping]) -> tuple:
    """TABLE_COLUMNS, plus the Human columns of Nanda et al. Table 1 when any model has survey results."""
    return TABLE_COLUMNS + (HUMAN_COLUMNS if any(m.get("humans") for m in models.values()) else ())


def table_rows(models: Mapping[str, Mapping]) -> list[list[str]]:
    """One row per model: panel mean ± std for the observer tasks, accuracies, human accuracy when present."""
    rows = []
    for name, result in models.items():
        row = [name]
        for key, _ in table_columns(models)[1:]:
            entry = result.get(key)
            if key.startswith("human:"):
                row.append(_fmt((result.get("humans") or {}).get(key[len("human:"):], {}).get("accuracy")))
            elif isinstance(entry, Mapping):
                row.append(_fmt(entry.get("mean"), entry.get("std")))
            else:
                row.append(_fmt(entry))
        rows.append(row)
    return rows


MARKDOWN_SPECIAL = re.compile(r"([\\`*\[\]<>&|])")  # not "_": inside a word (cnn-standard_noaug) it emphasises nothing


def markdown_text(text: Any) -> str:
    """User text (a model label) as Markdown that renders as written: ``*pgd*`` stayed italic "pgd" and ``x&amp;`` read
    "x&" in the report while the HTML escaped them; a ``|`` split a table row."""
    return MARKDOWN_SPECIAL.sub(r"\\\1", str(text))


def markdown_table(models: Mapping[str, Mapping], caption: str = "") -> str:
    header = [title for _, title in table_columns(models)]
    lines = ([caption, ""] if caption else []) + ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join([markdown_text(row[0]), *row[1:]]) + " |" for row in table_rows(models)]
    return "\n".join(lines) + "\n"


REPORT_STYLE = (
    "body{font-family:sans-serif;max-width:1100px;margin:auto}table{border-collapse:collapse;margin-bottom:1em}"
    "td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}td:first-child,th:first-child{text-align:left}img{max-width:100%}"
)


def markdown_page(markdown: str, title: str = "repalign report", *, style: str = "", mark_tokens: Callable[[list[Token]], None] | None = None) -> str:
    """An HTML page of a Markdown report, so that a report's ``.html`` holds everything its ``.md`` does: its sections,
    tables, notes and figures. CommonMark with tables (markdown-it-py); HTML inside the text is escaped, not passed on.
    ``style`` adds CSS; ``mark_tokens`` may set attributes (a CSS class) on the parsed tokens before they are rendered."""
    parser = MarkdownIt("commonmark", {"html": False}).enable("table")
    tokens = parser.parse(markdown)
    if mark_tokens is not None:
        mark_tokens(tokens)
    body = parser.renderer.render(tokens, parser.options, {})
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title><style>{REPORT_STYLE}{style}</style></head>"
            f"<body>\n{body}</body></html>\n")


def save_figure(fig, path: Path) -> Path:
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=SAVE_DPI, bbox_inches="tight")
    plt.close(fig)
    return atomic_write_bytes(path, buffer.getvalue())


def image_grid(rows: Mapping[str, Sequence[torch.Tensor]], column_titles: Sequence[str], path: str | Path, title: str = "",
               captions: Mapping[str, Sequence[str]] | None = None, row_notes: Mapping[str, str] | None = None) -> Path:
    """A grid of images: one row per entry of ``rows`` (its label on the left), columns titled; optional
    ``captions`` under the images of a row and a ``row_notes`` column of text at the right."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    captions, row_notes = captions or {}, row_notes or {}
    if not rows or not any(len(images) for images in rows.values()):
        raise ValueError("image_grid needs at least one row with an image")
    n_rows, n_images = len(rows), max(len(v) for v in rows.values())
    n_cols = n_images + (1 if row_notes else 0)
    fig, axes = plt.subplots(n_rows, n_cols, figsize=(1.3 * n_cols + 1, 1.45 * n_rows + 0.8), squeeze=False)
    for r, (label, images) in enumerate(rows.items()):
        for c in range(n_images):
            ax = axes[r][c]
            ax.set_xticks([])
            ax.set_yticks([])
            if c < len(images):
                ax.imshow(images[c].detach().float().clamp(0, 1).permute(1, 2, 0).cpu().numpy(), interpolation="nearest")
                row_captions = captions.get(label) or ()
                if c < len(row_captions) and row_captions[c]:
                    ax.set_xlabel(row_captions[c], fontsize=6, labelpad=1)
            else:
                ax.axis("off")
            if r == 0 and c < len(column_titles):
                ax.set_title(column_titles[c], fontsize=8)
        axes[r][0].set_ylabel(label, fontsize=8, rotation=0, ha="right", va="center")
        if row_notes:
            note = axes[r][n_images]
            note.axis("off")
            note.text(0.0, 0.5, row_notes.get(label, ""), fontsize=7, va="center", ha="left", transform=note.transAxes)
            if r == 0:
                note.set_title("representation\ndistance", fontsize=7)
    if title:
        fig.suptitle(title, fontsize=10)
    return save_figure(fig, Path(path))


SAVE_DPI = 110  # the resolution save_figure writes at (label placement measures at it too)


def is_number(value) -> bool:
    """A number to print: not None (undefined, as report.json stores it) and not NaN or infinite."""
    return value is not None and math.isfinite(value)


def format_number(value, spec: str = ".4f") -> str:
    """``value`` formatted by ``spec``; "–" where it is undefined (NaN in memory, null in a report read back)."""
    return format(value, spec) if is_number(value) else "–"


def spread(entry: Mapping) -> float:
    """A panel entry's std for an error bar: 0 where it is undefined (None in a report read back, NaN in memory for a
    one-observer panel), which matplotlib would otherwise draw as a missing bar or refuse."""
    std = entry.get("std")
    return float(std) if is_number(std) else 0.0


def scatter_points(models: Mapping[str, Mapping], task: str) -> dict[str, Mapping]:
    """The models :func:`alignment_scatter` can place: a robust accuracy and a panel mean for ``task``, both finite."""
    return {name: result for name, result in models.items()
            if is_number(result.get("robust_accuracy")) and is_number((result.get(task) or {}).get("mean"))}


def alignment_scatter(models: Mapping[str, Mapping], path: str | Path, task: str = "clustering") -> Path:
    """Observer accuracy (panel mean ± std) against robust accuracy, one point per model (paper Figure 4). Refuses to
    draw an empty figure: callers leave it out when :func:`scatter_points` is empty (e.g. ``threat=null``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = scatter_points(models, task)
    if not points:
        raise ValueError(f"no model has both a robust accuracy and an observer {task} score: nothing to plot")
    fig, ax = plt.subplots(figsize=(4.5, 3.6), dpi=SAVE_DPI)  # labels are placed at the resolution the file is written at
    labels = []
    for name, result in points.items():
        entry, robust = result[task], result["robust_accuracy"]
        ax.errorbar(100 * robust, 100 * entry["mean"], yerr=100 * spread(entry), fmt="o", capsize=3)
        labels.append(ax.annotate(name, (100 * robust, 100 * entry["mean"]), textcoords="offset points", xytext=(4, 4), fontsize=8,
                                  arrowprops={"arrowstyle": "-", "color": "grey", "lw": 0.5, "shrinkA": 0, "shrinkB": 3}))
    chance = 100 / 3 if task.startswith("clustering") else 50
    ax.axhline(chance, color="grey", lw=0.8, ls="--")
    # Named on the line, not in a legend box ("best" still put the box over a model's error bar), and in the middle:
    # standard models sit at the left, robust ones at the right.
    ax.annotate("chance", (0.5, chance), xycoords=("axes fraction", "data"), xytext=(0, 2), textcoords="offset points", ha="center",
                va="bottom", fontsize=7, color="grey")
    low, high = ax.get_ylim()
    ax.set_ylim(max(low, 0), min(high, 100))  # a ± std bar past 0 % or 100 % is cut at what an accuracy can be
    title = TASK_TITLES.get(task, task)
    ax.set_xlabel("robust accuracy (%)")
    ax.set_ylabel(f"observer {title} accuracy (%)")
    dagger = "; † = inversions did not converge" if any(name.endswith("†") for name in points) else ""
    ax.set_title(f"Observer {title} accuracy against robust accuracy\n(error bars: ± std over the observer panel{dagger})", fontsize=9)
    ax.grid(alpha=0.3)
    fig.canvas.draw()  # the chance line widens the axes only at a draw: labels separated before it overlapped once drawn
    separate_labels(fig, labels)
    for label in labels:  # a leader line only where a label had to move away from its point
        label.arrow_patch.set_visible(label.xyann != (4, 4))
    return save_figure(fig, Path(path))


def separate_labels(fig, labels: Sequence, gap_px: float = 1.0, max_rounds: int = 100) -> None:
    """Move point labels (annotations placed in offset points) up until no two of them overlap: robust models crowd
    into one corner of the scatter. Each round lifts the upper label of every overlapping pair just clear of the lower."""
    from matplotlib.text import Text

    renderer = fig.canvas.get_renderer()
    points_per_px = 72 / fig.dpi

    def text_box(label):  # the text alone: an annotation's own extent also covers its leader line
        label.update_positions(renderer)
        return Text.get_window_extent(label, renderer)

    for _ in range(max_rounds):
        boxes = [text_box(label) for label in labels]
        order = sorted(range(len(labels)), key=lambda i: (boxes[i].y0, boxes[i].x0))
        moved = False
        for position, lower in enumerate(order):
            for upper in order[position + 1:]:
                if boxes[lower].overlaps(boxes[upper]):
                    lift = boxes[lower].y1 + gap_px - boxes[upper].y0
                    x, y = labels[upper].xyann
                    labels[upper].xyann = (x, y + lift * points_per_px)
                    boxes[upper] = text_box(labels[upper])
                    moved = True
        if not moved:
            return


def write_text(path: str | Path, text: str) -> Path:
    return atomic_write_text(path, text)
