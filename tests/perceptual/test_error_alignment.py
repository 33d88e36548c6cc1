"""Error alignment (Xu et al.): per-family z-scores, global vs average Spearman between metrics, figures.

Hand-computed case: two families of three system pairs.

* family A: m1 = [1, 2, 3], m2 = [11, 12, 13]; family B: m1 = [11, 12, 13], m2 = [1, 2, 3].
* Within each family the metrics agree perfectly: rho 1 in both, average 1.
* Pooled raw: ranks of m1 = 1..6, of m2 = 4, 5, 6, 1, 2, 3; d² = 6 · 9 = 54; rho = 1 − 6 · 54 / (6 · 35) = −0.542857.
* z-scored within family: [1, 2, 3] → [−1.2247, 0, 1.2247] (population std √(2/3)) for every column → pooled rho 1.
"""
from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from perceptual.error_alignment import error_alignment, family_zscores, metric_correlations, pair_table, write_error_alignment


def _matrix(upper):
    """3 systems: the (0,1), (0,2), (1,2) entries."""
    m = np.eye(3)
    for (i, j), v in zip(((0, 1), (0, 2), (1, 2)), upper):
        m[i, j] = m[j, i] = v
    return m


PER_FAMILY = {"A": {"m1": _matrix([1, 2, 3]), "m2": _matrix([11, 12, 13])},
              "B": {"m1": _matrix([11, 12, 13]), "m2": _matrix([1, 2, 3])}}
SYSTEMS = ["x", "y", "z"]


def test_pair_table_takes_the_upper_triangles():
    table = pair_table(PER_FAMILY, SYSTEMS)
    assert len(table) == 6
    assert table[["system_a", "system_b"]].iloc[:3].values.tolist() == [["x", "y"], ["x", "z"], ["y", "z"]]
    assert table["m2"].tolist() == [11, 12, 13, 1, 2, 3]
    with pytest.raises(ValueError, match="expected 3"):
        pair_table({"A": {"m1": np.eye(2)}}, SYSTEMS)


def test_zscores_and_global_vs_average_by_hand():
    table = pair_table(PER_FAMILY, SYSTEMS)
    z = family_zscores(table)
    assert z["m1"].tolist() == pytest.approx([-math.sqrt(1.5), 0, math.sqrt(1.5)] * 2)
    result = metric_correlations(table)
    assert result["metrics"] == ["m1", "m2"]
    assert result["per_family"]["A"][0, 1] == pytest.approx(1.0) and result["per_family"]["B"][0, 1] == pytest.approx(1.0)
    assert result["average"][0, 1] == pytest.approx(1.0)
    assert result["global"][0, 1] == pytest.approx(1 - 6 * 54 / (6 * 35))
    assert result["global_z"][0, 1] == pytest.approx(1.0)


def test_constant_metric_and_nan_values_are_left_out():
    table = pd.DataFrame({"family": ["A"] * 4, "m1": [1.0, 1.0, 1.0, 1.0], "m2": [1.0, 2.0, np.nan, 4.0], "m3": [1.0, 3.0, 9.0, 2.0]})
    assert family_zscores(table)["m1"].isna().all()  # constant within its family: no z-score
    # 0.1 three times has a float standard deviation of about 1e-17, which made every z-score -1
    tenths = pd.DataFrame({"family": ["A"] * 3 + ["B"] * 3, "m1": [0.1] * 3 + [0.2, 0.5, 0.9]})
    assert family_zscores(tenths)["m1"].iloc[:3].isna().all() and family_zscores(tenths)["m1"].iloc[3:].notna().all()
    result = metric_correlations(table, ["m2", "m3"])
    # on the three rows where m2 is defined: ranks [1, 2, 3] vs [1, 3, 2], d² = 2, rho = 1 - 6 · 2 / (3 · 8)
    assert result["global"][0, 1] == pytest.approx(0.5)
    analysis = error_alignment({"A": {"m1": _matrix([1, 2, 3]), "cka": np.full((3, 3), np.nan)}, "B": PER_FAMILY["B"] | {"cka": np.full((3, 3), np.nan)}},
                               SYSTEMS, ["m1", "cka"])
    assert analysis["left_out"] == ["cka"] and analysis["correlations"]["metrics"] == ["m1"]


def test_written_json_csv_and_figures(tmp_path):
    data = write_error_alignment(error_alignment(PER_FAMILY, SYSTEMS), tmp_path)
    saved = json.loads((tmp_path / "error_alignment.json").read_text())
    assert saved["global"][0][1] == pytest.approx(-0.542857, abs=1e-6) and saved["average"][0][1] == pytest.approx(1.0)
    assert set(data["figures"]) == {"figures/error_alignment_correlations.png", "figures/error_alignment_zscores.png"}
    for figure in data["figures"]:
        assert (tmp_path / figure).read_bytes()[:4] == b"\x89PNG"
    pairs = pd.read_csv(tmp_path / "error_alignment_pairs.csv")
    assert {"m1", "m1_z", "m2_z", "family"} <= set(pairs.columns)


def test_two_systems_give_an_empty_analysis_not_an_error(tmp_path):
    """One pair per family: no metric has three values, so no correlation and no figure (compare with one model, one subject)."""
    analysis = error_alignment({"A": {"m1": np.array([[1.0, 0.3], [0.3, 1.0]])}}, ["x", "y"])
    assert analysis["left_out"] == ["m1"]
    assert write_error_alignment(analysis, tmp_path)["figures"] == []
