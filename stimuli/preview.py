"""A preview figure next to every set: a grid like Nanda et al.'s Figure 1.

Inversion sets: one row per target (the first ``max_rows``), columns target, then seed and result
for each seed type. Controversial sets: one row per origin, columns origin, the first start, and
the result of each direction from that start. Other sets: the first images in a grid.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd
from torch import Tensor

from training.io import atomic_save


def _grid_cells(manifest: pd.DataFrame, max_rows: int) -> tuple[list[str], list[list[tuple[str | None, str]]]]:
    """(column titles, rows of (id or None, caption))."""
    ids = set(manifest["id"])
    results = manifest[manifest["role"] == "result"]
    loss = {r.id: r.final_loss for r in results.itertuples()}

    def caption(image_id: str | None) -> str:
        value = loss.get(image_id)
        return f"loss {value:.3f}" if value is not None and value == value else ""

    origins = manifest[manifest["role"] == "origin"]
    if len(origins):  # controversial
        directions = sorted(d for d in results["direction"].dropna().unique())

        def direction_title(d: str) -> str:
            one = results[results["direction"] == d].head(1)
            if not len(one) or "pushed_model" not in one:
                return f"result {d}"
            return f"{d}: {one['model'].iloc[0]} keeps,\n{one['pushed_model'].iloc[0]} pushed"  # d tells one architecture's two apart

        titles = ["origin", "start (restart 0)"] + [direction_title(d) for d in directions]  # noise, or the origin plus noise
        rows = []
        for origin in origins["id"][:max_rows]:
            mine = results[(results["origin_id"] == origin)]
            first = mine.sort_values("restart").head(1)
            start = first["seed_id"].iloc[0] if len(first) else None
            row = [(origin, ""), (start, "")]
            for d in directions:
                hit = mine[(mine["direction"] == d) & (mine["seed_id"] == start)]
                rid = hit["id"].iloc[0] if len(hit) else None
                row.append((rid, caption(rid)))
            rows.append(row)
        return titles, rows
    targets = manifest[manifest["role"] == "target"]
    if len(targets) and len(results):  # inversion
        seed_types = list(dict.fromkeys(results["seed_type"].dropna()))
        titles = ["target"] + [t for s in seed_types for t in (f"seed: {s}", f"result: {s}")]
        rows = []
        for target in targets["id"][:max_rows]:
            row = [(target, "")]
            for s in seed_types:
                hit = results[(results["target_id"] == target) & (results["seed_type"] == s)]
                rid = hit["id"].iloc[0] if len(hit) else None
                sid = hit["seed_id"].iloc[0] if len(hit) else None
                row += [(sid if sid in ids else None, ""), (rid, caption(rid))]
            rows.append(row)
        return titles, rows
    chosen = list(manifest["id"][: max_rows * 6])
    return [""] * min(6, len(chosen)), [[(i, r) for i, r in zip(chosen[k : k + 6], manifest["role"][k : k + 6])] for k in range(0, len(chosen), 6)]


def write_preview(path: str | Path, images: Tensor, manifest: pd.DataFrame, title: str = "", max_rows: int = 8) -> Path:
    """Draw the grid of ``images`` (row i described by ``manifest.iloc[i]``) to the PNG ``path``."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    titles, rows = _grid_cells(manifest, max_rows)
    index = {image_id: i for i, image_id in enumerate(manifest["id"])}
    n_rows, n_cols = max(len(rows), 1), max(len(titles), 1)
    fig, axes = plt.subplots(n_rows, n_cols, figsize=(1.4 * n_cols, 1.45 * n_rows + 0.4), squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    for r, row in enumerate(rows):
        for c, (image_id, caption) in enumerate(row):
            ax = axes[r][c]
            if image_id is not None and image_id in index:
                image = images[index[image_id]].detach().float().clamp(0, 1).permute(1, 2, 0).cpu().numpy()
                grey = image.shape[2] == 1
                ax.imshow(image[:, :, 0] if grey else image, cmap="gray" if grey else None, vmin=0, vmax=1, interpolation="nearest")
            if caption:
                ax.text(0.5, -0.08, caption, transform=ax.transAxes, ha="center", va="top", fontsize=6)
            if r == 0 and titles[c]:
                ax.set_title(titles[c], fontsize=7)
    if title:
        fig.suptitle(title, fontsize=8)
    fig.tight_layout()
    try:
        atomic_save(path, lambda tmp: fig.savefig(tmp, format="png", dpi=100))
    finally:
        plt.close(fig)
    return Path(path)
