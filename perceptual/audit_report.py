"""The audit's report: ``audit.md`` and ``audit.html`` (a one-screen verdict first, then the evidence) and its
figures (accuracy against eps for every attack, alignment against robust accuracy with the reference models as
in Nanda et al. Fig. 4, the masking checks). Every number comes from the report dict that ``audit.json`` holds.
"""
from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Mapping, Sequence

from markdown_it.token import Token

from .audit import DECISION_RULE
from .report import alignment_scatter, format_number, format_score, markdown_page, save_figure, scatter_points

ALIGNMENT_TASKS = ("2afc", "clustering", "clustering_hard")
STATUS_COLOURS = {"pass": "#c8e6c9", "fail": "#ffcdd2", "n.a.": "#eeeeee"}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def accuracy_vs_eps_figure(robustness: Mapping, path: str | Path) -> Path:
    """Accuracy against eps for every attack of the sweep and the worst case, with the masking report's PGD sweep
    and its unbounded attack (which should reach about 0)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    sweep = robustness["sweep"]
    eps_values = [float(e) for e in sweep]
    attacks = [name for name in next(iter(sweep.values())) if name != "clean"]
    for name in attacks:
        style = dict(color="black", lw=1.6, ls="--", zorder=5) if name == "worst_case" else {}  # dashed: square often lies under it
        ax.plot(eps_values, [sweep[e][name] * 100 for e in sweep], marker="o", label=name, **style)
    masking = robustness["masking"]
    ax.plot([masking["unbounded_eps"]], [masking["unbounded_accuracy"] * 100], marker="X", ls="none", color="tab:red", markersize=10,
            label=f"unbounded PGD (eps {masking['unbounded_eps']:.3g})")
    ax.axhline(robustness["accuracy"]["clean"] * 100, color="grey", ls="--", lw=0.8, label="clean")
    ax.set_xscale("log")
    ax.set_ylim(-2, 102)
    ax.set_xlabel(f"eps ({robustness['norm']}, log scale)")
    ax.set_ylabel("accuracy (%)")
    ax.set_title(f"Accuracy against eps per attack ({robustness['n']} images)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper right")
    return save_figure(fig, Path(path))


def accuracy_bars_figure(robustness: Mapping, path: str | Path) -> Path:
    """Accuracy per attack at the audited eps: clean, each attack, and the per-sample worst case."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    accuracy = robustness["accuracy"]
    names = list(accuracy)
    ax.bar(names, [accuracy[k] * 100 for k in names], color=["tab:gray"] + ["tab:blue"] * (len(names) - 2) + ["tab:red"])
    ax.set_ylabel("accuracy (%)")
    ax.set_xlabel("attack")
    ax.tick_params(axis="x", labelrotation=30)  # apgd-ce, apgd-t, apgd-smooth, square ... ran into each other
    for label in ax.get_xticklabels():
        label.set_horizontalalignment("right")
    ax.set_ylim(0, 100)
    ax.set_title(f"Accuracy per attack ({robustness['norm']} eps={robustness['eps']:.4g}, {robustness['n']} images)")
    return save_figure(fig, Path(path))


def masking_checks_figure(checks: Sequence[Mapping], path: str | Path) -> Path:
    """The masking checks as a coloured pass / fail / n.a. table."""
    plt = _pyplot()
    details = [textwrap.fill(c["detail"], 92) for c in checks]  # wrapped, not cut: the numbers are what the table is for
    lines = [d.count("\n") + 1 for d in details]
    fig, ax = plt.subplots(figsize=(11, 0.3 * (sum(lines) + 1) + 0.8))
    ax.axis("off")
    rows = [[c["name"], c["status"], d] for c, d in zip(checks, details)]
    table = ax.table(cellText=rows, colLabels=["check", "status", "numbers"], loc="center", cellLoc="left", colWidths=[0.27, 0.08, 0.65])
    table.auto_set_font_size(False)
    table.set_fontsize(7.5)
    line_height = table[0, 0].get_height()
    for cell in table.get_celld().values():
        cell.PAD = 0.02  # of the cell's width: the default 0.1 indented the numbers by an inch
    for row, (check, n_lines) in enumerate(zip(checks, lines), start=1):
        for column in range(3):
            table[row, column].set_facecolor(STATUS_COLOURS[check["status"]])
            table[row, column].set_height(line_height * n_lines)
    ax.set_title("Gradient-masking checks (green pass, red fail, grey not applicable)", fontsize=10)
    return save_figure(fig, Path(path))


def alignment_figures(models: Mapping[str, Mapping], folder: str | Path) -> list[Path]:
    """One alignment-vs-robust-accuracy scatter per task (:func:`perceptual.report.alignment_scatter`): the defence
    and the reference models, robust accuracy being each one's worst case under the audit's attacks."""
    return [alignment_scatter(models, Path(folder) / f"alignment_vs_robust_{task}.png", task=task) for task in ALIGNMENT_TASKS
            if scatter_points(models, task)]


def _alignment_rows(alignment: Mapping) -> list[list[str]]:
    rows = []
    for label, scores in (alignment.get("models") or {}).items():
        rows.append([label] + [format_score((scores.get(t) or {}).get("mean"), (scores.get(t) or {}).get("std")) for t in ALIGNMENT_TASKS]
                    + [format_score(scores.get("clean_accuracy")), format_score(scores.get("robust_accuracy"))])
    return rows


def _convergence_note(alignment: Mapping) -> str:
    converged = alignment.get("converged") or {}
    missing = [label for label, ok in converged.items() if not ok]
    if not missing:
        return "Every model's inversions converged (perceptual.convergence)."
    return (f"Inversions did not converge for {', '.join(missing)} (perceptual.convergence): their alignment scores are weak evidence; "
            "raise invert.steps (the paper: 5000).")


ALIGNMENT_HEADER = ["model", "2AFC (%)", "clustering (%)", "hard clustering (%)", "clean acc. (%)", "robust acc., worst case (%)"]


def _chance_note(robustness: Mapping) -> str:
    """Rule 0's number beside the threat: the chance agreement the clean accuracy was tested against (absent from older reports)."""
    chance = robustness.get("chance_agreement")
    return "" if chance is None else f"; chance agreement of the clean answers {chance:.1%} (rule 0)"


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:]


def audit_markdown(report: Mapping) -> str:
    """``audit.md``: the verdict and warnings first, then accuracy per attack, the masking checks, the eps sweep,
    alignment, controversial stimuli, the references, the figures and the decision rule."""
    robustness = report["robustness"]
    lines = ["# Defence audit", "", f"**Verdict:** {report['verdict']}", ""]
    for warning in report.get("warnings", []):  # a blank line between: consecutive quoted lines would run into one paragraph
        lines += [f"> **Warning:** {warning}", ""]
    lines += ["", f"Defence: {report.get('defence_name', 'the defence')}. Threat: {robustness['norm']} eps={robustness['eps']:.4g}, "
              f"{robustness['n']} images; randomised: {robustness['randomised']} (eot_samples={robustness['eot_samples']}); "
              f"BPDA: {robustness.get('bpda') or 'off'}{_chance_note(robustness)}.", "", "## Accuracy per attack", "", "| attack | accuracy |", "|---|---|"]
    lines += [f"| {k} | {v:.1%} |" for k, v in robustness["accuracy"].items()]
    lines += ["", "## Masking checks", "", "| check | status | numbers |", "|---|---|---|"]
    lines += [f"| {c['name']} | {c['status']} | {c['detail']} |" for c in robustness["checks"]]
    sweep = robustness.get("sweep") or {}
    if sweep:
        attacks = list(next(iter(sweep.values())))
        lines += ["", "## Accuracy against eps", "", "| eps | " + " | ".join(attacks) + " |", "|---" * (len(attacks) + 1) + "|"]
        lines += [f"| {e} | " + " | ".join(f"{acc[a]:.1%}" for a in attacks) + " |" for e, acc in sweep.items()]
    alignment = report.get("alignment") or {}
    lines += ["", "## Alignment", ""]
    if alignment.get("models"):
        position = alignment.get("position")
        lines += [f"Position between the standard (0) and the robust (1) reference: {'n.a.' if position is None else f'{position:.2f}'}", "",
                  "| " + " | ".join(ALIGNMENT_HEADER) + " |", "|---" * len(ALIGNMENT_HEADER) + "|"]
        lines += ["| " + " | ".join(row) + " |" for row in _alignment_rows(alignment)]
        lines += ["", _convergence_note(alignment)]
        controversial = alignment.get("controversial")
        if controversial and controversial.get("objective") == "class_controversial":
            lines += ["", f"Class-controversial stimuli ({controversial['model_a']} vs {controversial['model_b']}; an observer sides with the "
                      "model whose decision it makes by its nearest class exemplars): " + controversial["summary"] + ".", ""]
            lines += [f"- {line}" for line in controversial["verdict"].splitlines()]
        elif controversial:
            lines += ["", f"Controversial stimuli ({controversial['model_a']} vs {controversial['model_b']}, Table 2 score per direction "
                      "and observer; the observers' scales differ): " + "; ".join(
                          f"{controversial['directions'][d]}: " + ", ".join(f"{o} {format_number(v)}" for o, v in scores.items())
                          for d, scores in controversial["scores"].items()),
                      "", f"Controversial: {controversial['summary']}. {_sentence(controversial['verdict'])}."]
    else:
        lines.append(alignment.get("note", "not measured (alignment.enabled=false)"))
    references = report.get("references") or {}
    if references:
        lines += ["", "## Reference models", ""]
        lines += [f"- {label}: {ref.get('source')}" for label, ref in references.items()]
    figures = report.get("figures") or []
    if figures:
        lines += ["", "## Figures", ""] + [f"![{Path(f).stem}]({f})" for f in figures]
    lines += ["", "## Decision rule", "", "```", DECISION_RULE.rstrip(), "```", ""]
    return "\n".join(lines)


STATUS_CLASSES = {"pass": "pass", "fail": "fail", "n.a.": "na"}


def _mark_verdict_and_checks(tokens: list[Token]) -> None:
    """Classes for audit.html's styles: the verdict's paragraph, and each masking check's row by its status."""
    section = ""
    for i, token in enumerate(tokens):
        if token.type == "heading_open":
            section = tokens[i + 1].content
        elif token.type == "paragraph_open" and tokens[i + 1].content.startswith("**Verdict:**"):
            token.attrSet("class", "verdict")
        elif section == "Masking checks" and token.type == "tr_open" and tokens[i + 4].type == "td_open":
            status = tokens[i + 5].content  # the row's second cell
            if status in STATUS_CLASSES:
                token.attrSet("class", STATUS_CLASSES[status])


def audit_html(report: Mapping) -> str:
    """``audit.html``: :func:`audit_markdown` as a page (:func:`perceptual.report.markdown_page`, so the two never
    differ), the verdict in a box coloured by its outcome and the masking checks coloured by their status."""
    verdict = report["verdict"]
    colour = "#ffcdd2" if report.get("flagged") else ("#fff3cd" if "not robust" in verdict or "low alignment" in verdict else "#c8e6c9")
    style = (f".verdict{{font-size:1.25em;padding:12px;border-radius:6px;background:{colour}}}blockquote{{background:#fff3cd;margin:8px 0;"
             "padding:2px 8px}td,th{text-align:left}" + "".join(f"tr.{name}{{background:{STATUS_COLOURS[status]}}}" for status, name in STATUS_CLASSES.items()))
    return markdown_page(audit_markdown(report), "Defence audit", style=style, mark_tokens=_mark_verdict_and_checks)


__all__ = ["accuracy_bars_figure", "accuracy_vs_eps_figure", "alignment_figures", "audit_html", "audit_markdown", "masking_checks_figure"]
