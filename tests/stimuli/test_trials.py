"""Trials (stimuli.trials): structure, balanced answer positions, exact attention-check rates,
hard triplets nearest under the given distance, determinism from the seed."""
from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest

from stimuli.trials import CLUSTERING_COLUMNS, TWO_AFC_COLUMNS, clustering_trials, make_trials, nearest_triplets, two_afc_trials


def inversion_manifest(n_targets: int = 10, seed_types=("noise", "train")) -> pd.DataFrame:
    """A manifest as an inversion set has it: targets, per-target seeds, one result per seed."""
    rows = []
    for k in range(n_targets):
        target = f"t{k:04d}"
        rows.append({"id": target, "role": "target", "target_id": None, "seed_id": None, "seed_type": None})
        for s in seed_types:
            rows.append({"id": f"{target}.seed.{s}", "role": "seed", "target_id": target, "seed_id": None, "seed_type": s})
            rows.append({"id": f"{target}.result.{s}", "role": "result", "target_id": target, "seed_id": f"{target}.seed.{s}", "seed_type": s})
    return pd.DataFrame(rows)


def line_distances(positions: dict[str, float]) -> pd.DataFrame:
    ids = list(positions)
    values = np.array([[abs(positions[a] - positions[b]) for b in ids] for a in ids])
    return pd.DataFrame(values, index=ids, columns=ids)


# ------------------------------------------------------------------------------------------ 2AFC


def test_two_afc_one_trial_per_result_with_target_and_seed_as_options():
    manifest = inversion_manifest(10)
    table = two_afc_trials(manifest, seed=3)
    assert list(table.columns) == TWO_AFC_COLUMNS
    assert len(table) == 20 and list(table["trial"]) == list(range(20))
    results = manifest[manifest.role == "result"].set_index("id")
    assert sorted(table["query_id"]) == sorted(results.index)
    for t in table.itertuples():
        r = results.loc[t.query_id]
        assert {t.left_id, t.right_id} == {r.target_id, r.seed_id}
        assert (t.left_id if t.answer == "left" else t.right_id) == r.target_id == t.target_id
        assert t.seed_id == r.seed_id and t.seed_type == r.seed_type and not t.attention_check


@pytest.mark.parametrize("n_targets, seed", [(10, 0), (7, 0), *((100, s) for s in range(5))])
def test_two_afc_answer_positions_are_balanced_within_every_seed_type(n_targets, seed):
    """Balanced over all trials, a seed type's split was up to 58/42 at 100 targets."""
    table = two_afc_trials(inversion_manifest(n_targets, seed_types=("noise", "train")), seed=seed, attention_rate=0.2)
    for _, group in table.groupby(["attention_check", "seed_type"]):
        counts = group["answer"].value_counts()
        assert abs(counts.get("left", 0) - counts.get("right", 0)) <= len(group) % 2


@pytest.mark.parametrize("rate, expected_checks", [(0.2, 5), (0.5, 20), (0.0, 0), (1 / 3, 10)])
def test_two_afc_attention_rate_is_exact(rate, expected_checks):
    table = two_afc_trials(inversion_manifest(10), seed=1, attention_rate=rate)
    checks = table[table["attention_check"]]
    assert len(checks) == expected_checks
    assert len(checks) / len(table) == pytest.approx(rate, abs=1e-12)
    # A check's query is one of its options (the target), so attention alone answers it.
    for t in checks.itertuples():
        assert t.query_id == t.target_id == (t.left_id if t.answer == "left" else t.right_id)


def test_two_afc_attention_count_follows_the_documented_formula_when_not_divisible():
    table = two_afc_trials(inversion_manifest(10, seed_types=("noise",)), seed=0, attention_rate=0.1)
    assert table["attention_check"].sum() == round(0.1 * 10 / 0.9) == 1


@pytest.mark.parametrize("task", ["2afc", "clustering"])
def test_a_rate_that_rounds_to_no_check_still_gives_one(task):
    """0.05 of 10 trials rounds to no check: the trials went out without any, silently."""
    table = make_trials(inversion_manifest(10, seed_types=("noise",)), task, seed=0, attention_rate=0.05)
    assert table.drop_duplicates("trial")["attention_check"].sum() == 1
    assert make_trials(inversion_manifest(10, seed_types=("noise",)), task, seed=0, attention_rate=0)["attention_check"].sum() == 0


def test_two_afc_is_deterministic_in_the_seed():
    manifest = inversion_manifest(10)
    pd.testing.assert_frame_equal(two_afc_trials(manifest, seed=5, attention_rate=0.2), two_afc_trials(manifest, seed=5, attention_rate=0.2))
    assert not two_afc_trials(manifest, seed=5).equals(two_afc_trials(manifest, seed=6))


# ------------------------------------------------------------------------------------ clustering


def _trials(table: pd.DataFrame):
    return [group for _, group in table.groupby("trial", sort=True)]


def test_clustering_structure_three_targets_as_columns_and_their_results_as_rows():
    manifest = inversion_manifest(10)
    table = clustering_trials(manifest, seed=0)
    assert list(table.columns) == CLUSTERING_COLUMNS
    trials = _trials(table)
    assert len(trials) == 10  # one triplet per anchor target
    results = manifest[manifest.role == "result"].set_index("id")
    anchors_cover = set()
    for group in trials:
        columns = list(group[["column_0", "column_1", "column_2"]].iloc[0])
        assert len(set(columns)) == 3 and (group[["column_0", "column_1", "column_2"]].nunique() == 1).all()
        assert len(group) == 6 and list(group["row"]) == list(range(6))
        assert sorted(results.loc[list(group["query_id"]), "target_id"]) == sorted(columns * 2)
        for row in group.itertuples():
            assert columns[row.answer] == row.target_id == results.loc[row.query_id, "target_id"]
        anchors_cover.update(columns)
    assert anchors_cover == {f"t{k:04d}" for k in range(10)}


def test_clustering_attention_checks_exact_rate_and_rows_are_the_columns():
    """A check showed each column once (3 rows) where a real trial shows each target's results (6 rows with two seed
    types), so a survey page's row count alone told a script which trials were checks. Each column now appears as
    often as its target's results do."""
    table = clustering_trials(inversion_manifest(10), seed=2, attention_rate=1 / 6)
    per_trial = table.drop_duplicates("trial")
    assert per_trial["attention_check"].sum() == 2 and len(per_trial) == 12
    assert set(table.groupby("trial").size()) == {6}  # checks and real trials alike
    for group in _trials(table[table["attention_check"]]):
        columns = list(group[["column_0", "column_1", "column_2"]].iloc[0])
        assert len(group) == 6 and sorted(group["query_id"]) == sorted(columns * 2)
        assert all(columns[r.answer] == r.query_id for r in group.itertuples())


def test_hard_triplets_are_the_nearest_under_the_given_distance():
    rng = np.random.default_rng(0)
    positions = {f"t{k:04d}": float(x) for k, x in enumerate(rng.permutation(10) * 1.7 + rng.random(10))}
    distances = line_distances(positions)
    table = clustering_trials(inversion_manifest(10), seed=4, hard=True, target_distances=distances)
    assert set(table["task"]) == {"clustering_hard"}
    shown = [frozenset(group[["column_0", "column_1", "column_2"]].iloc[0]) for group in _trials(table)]
    assert len(shown) == 10 and len(set(shown)) == 10  # no triplet twice (on a line, neighbours are often each other's nearest)
    assert set(shown) == {frozenset(t) for t in nearest_triplets(distances, sorted(positions))}
    # Brute force on the helper: each anchor with the hardest pair still free, ordered by its farther member's rank,
    # then its nearer one's; without distinct, the paper's two nearest of every anchor.
    used = set()
    for anchor, a, b in nearest_triplets(distances, list(positions)):
        ranked = sorted(set(positions) - {anchor}, key=lambda t: distances.loc[anchor, t])
        pairs = sorted(((n, f) for f in range(len(ranked)) for n in range(f)), key=lambda nf: (nf[1], nf[0]))
        expected = next({ranked[n], ranked[f]} for n, f in pairs if frozenset((anchor, ranked[n], ranked[f])) not in used)
        assert {a, b} == expected
        used.add(frozenset((anchor, a, b)))
    for anchor, a, b in nearest_triplets(distances, list(positions), distinct=False):
        others = sorted(set(positions) - {anchor}, key=lambda t: distances.loc[anchor, t])
        assert {a, b} == set(others[:2])


def test_mutual_nearest_targets_do_not_give_the_same_hard_triplet_twice():
    """a, b and c are each other's nearest: the paper's rule gave the triplet {a, b, c} three times of four."""
    distances = line_distances({"a": 0.0, "b": 1.0, "c": 2.5, "d": 10.0})
    assert nearest_triplets(distances, ["a", "b", "c", "d"], distinct=False) == [("a", "b", "c"), ("b", "a", "c"), ("c", "b", "a"), ("d", "c", "b")]
    assert nearest_triplets(distances, ["a", "b", "c", "d"]) == [("a", "b", "c"), ("b", "a", "d"), ("c", "b", "d"), ("d", "c", "a")]
    # three targets make one triplet: it repeats, as it must
    assert nearest_triplets(distances.loc[["a", "b", "c"], ["a", "b", "c"]], ["a", "b", "c"]) == [("a", "b", "c"), ("b", "a", "c"), ("c", "b", "a")]


def test_hard_triplets_use_only_targets_with_results():
    manifest = inversion_manifest(6)
    distances = line_distances({**{f"t{k:04d}": float(k) for k in range(6)}, "stranger": 2.5})
    table = clustering_trials(manifest, hard=True, target_distances=distances)
    assert "stranger" not in set(table[["column_0", "column_1", "column_2"]].to_numpy().ravel())


def test_clustering_is_deterministic_in_the_seed_and_n_trials():
    manifest = inversion_manifest(8)
    pd.testing.assert_frame_equal(clustering_trials(manifest, seed=9, n_trials=20), clustering_trials(manifest, seed=9, n_trials=20))
    assert clustering_trials(manifest, seed=9, n_trials=20)["trial"].nunique() == 20
    assert not clustering_trials(manifest, seed=9).equals(clustering_trials(manifest, seed=10))


# --------------------------------------------------------------------------------------- errors


def test_make_trials_dispatches_and_refuses_bad_input():
    manifest = inversion_manifest(4)
    assert set(make_trials(manifest, "2afc")["task"]) == {"2afc"}
    assert set(make_trials(manifest, "clustering")["task"]) == {"clustering"}
    with pytest.raises(ValueError, match="unknown task"):
        make_trials(manifest, "3afc")
    with pytest.raises(ValueError, match="lacks columns"):
        make_trials(manifest.drop(columns=["seed_id"]), "2afc")
    with pytest.raises(ValueError, match="no rows with role 'result'"):
        make_trials(manifest[manifest.role != "result"], "2afc")
    with pytest.raises(ValueError, match="at least 3 targets"):
        make_trials(inversion_manifest(2), "clustering")
    with pytest.raises(ValueError, match="target_distances"):
        make_trials(manifest, "clustering_hard")
    with pytest.raises(ValueError, match=r"attention_rate must be a fraction of the trials in \[0, 1\)"):
        make_trials(manifest, "2afc", attention_rate=1.0)
    bad = line_distances({f"t{k:04d}": float(k) for k in range(3)})
    with pytest.raises(ValueError, match=r"lacks targets \['t0003'\]"):
        make_trials(manifest, "clustering_hard", target_distances=bad)


def test_every_triplet_member_is_a_real_target():
    manifest = inversion_manifest(5)
    table = clustering_trials(manifest, seed=0, n_trials=30)
    targets = set(manifest[manifest.role == "target"]["id"])
    members = set(itertools.chain.from_iterable(table[["column_0", "column_1", "column_2"]].to_numpy()))
    assert members <= targets


def test_hard_triplets_from_a_human_similarity_matrix(tmp_path):
    from types import SimpleNamespace

    import numpy as np

    from stimuli.distances import human_target_distances, load_similarity_matrix, target_distances
    from stimuli.trials import nearest_triplets

    # four targets whose human similarities say: a~b most, then a~c; d is alike to c
    ids = ["101", "102", "103", "104"]
    similarity = np.array([[1.0, 0.9, 0.6, 0.1], [0.9, 1.0, 0.3, 0.2], [0.6, 0.3, 1.0, 0.7], [0.1, 0.2, 0.7, 1.0]])
    path = tmp_path / "similarity.csv"
    pd.DataFrame(similarity, index=ids, columns=ids).to_csv(path)
    manifest = pd.DataFrame({"id": ["t0", "t1", "t2", "t3"], "role": "target", "source_index": [101, 102, 103, 104]})
    stimulus_set = SimpleNamespace(role=lambda role: (manifest[manifest["role"] == role].reset_index(drop=True), None), kind="inversion")
    distances = human_target_distances(stimulus_set, load_similarity_matrix(path))
    # the paper's "2 most similar images" of each anchor
    assert nearest_triplets(distances, ["t0", "t3"]) == [("t0", "t1", "t2"), ("t3", "t2", "t1")]
    assert target_distances(stimulus_set, f"human:{path}").equals(distances)
    bad = tmp_path / "bad.csv"
    pd.DataFrame(similarity[:, :3], index=ids, columns=ids[:3]).to_csv(bad)
    with pytest.raises(ValueError, match="must be square"):
        load_similarity_matrix(bad)
    other = tmp_path / "other.csv"
    pd.DataFrame(similarity, index=["1", "2", "3", "4"], columns=["1", "2", "3", "4"]).to_csv(other)
    with pytest.raises(KeyError, match="target 't0' .source index 101. is not in the similarity matrix"):
        human_target_distances(stimulus_set, load_similarity_matrix(other))
    with pytest.raises(FileNotFoundError, match="similarity matrix not found"):
        load_similarity_matrix(tmp_path / "none.csv")
    padded = tmp_path / "padded.csv"  # zero-padded numeric ids: the index read 00101 as 101, the header kept 00101
    pd.DataFrame(similarity, index=[f"00{i}" for i in ids], columns=[f"00{i}" for i in ids]).to_csv(padded)
    assert list(load_similarity_matrix(padded).index) == [f"00{i}" for i in ids]
    twice = tmp_path / "twice.csv"  # said "not the same ids in the same order": pandas renames the repeated column id
    pd.DataFrame(similarity, index=["101", "102", "101", "104"], columns=["101", "102", "101", "104"]).to_csv(twice)
    with pytest.raises(ValueError, match=r"duplicate ids \['101'\]"):
        load_similarity_matrix(twice)
