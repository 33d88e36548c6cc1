"""The measurement pipeline end to end on tiny data: report contents, caching, refusals."""
from __future__ import annotations

import html
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from invert import Engine, InvertConfig
from perceptual.measure import ModelSpec, measure_models
from perceptual.observers import Panel, PixelL2Observer, SSIMObserver
from training import build_model, save_checkpoint
from training.attacks import ThreatModel

from ..conftest import TEST_DEVICE

ENGINE = {"steps": 15, "log_every": 5, "progress": False, "patience": None}


@pytest.fixture(scope="module")
def tiny_checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    paths = {}
    for label, width in (("narrow", 8), ("wide", 12)):
        torch.manual_seed(width)
        paths[label] = save_checkpoint(build_model("small_cnn", "digits", width=width), root / f"{label}.safetensors")
    return paths


def run_pipeline(out, checkpoints, **kwargs):
    specs = [ModelSpec("small_cnn", str(checkpoints["narrow"]), "narrow", kwargs={"width": 8}),
             ModelSpec("small_cnn", str(checkpoints["wide"]), "wide", kwargs={"width": 12})]
    options = dict(engine=ENGINE, n_targets=4, seed=0, panel=Panel([PixelL2Observer(), SSIMObserver()]), threat=ThreatModel("l2", 0.5, steps=2),
                   accuracy_limit=40, device=TEST_DEVICE)
    return measure_models(specs, {"name": "digits", "root": None}, out, **{**options, **kwargs})


def test_pipeline_end_to_end_writes_every_number_and_figure(tmp_path, tiny_checkpoints):
    out = tmp_path / "report"
    controversial = {"model_a": "narrow", "model_b": "wide", "n_origins": 2, "restarts": 2}
    config = {"invert": ENGINE, "n_targets": 4, "controversial": controversial}
    data = run_pipeline(out, tiny_checkpoints, controversial=controversial, config=config)
    for name in ("report.json", "report.md", "report.html", "grid.png", "scatter_2afc.png", "scatter_clustering.png"):
        assert (out / name).is_file(), name
    saved = json.loads((out / "report.json").read_text())
    assert saved["models"].keys() == {"narrow", "wide"} and saved["observers"] == ["pixel-l2", "ssim"]
    assert saved["config"] == config  # the settings behind the numbers travel with them
    narrow = saved["models"]["narrow"]
    for task in ("2afc", "clustering", "clustering_hard"):
        assert set(narrow[task]["observers"]) == {"pixel-l2", "ssim"}
        assert 0 <= narrow[task]["mean"] <= 1
        per = narrow["per_observer"][task]["pixel-l2"]
        assert per["overall"]["n"] == (8 if task == "2afc" else 24)  # 4 targets × 2 seeds; 4 triplets × 6 rows
        assert set(per["by_seed_type"]) == {"noise", "train"} and per["overall"]["ci_low"] <= per["overall"]["accuracy"]
    assert 0 <= narrow["clean_accuracy"] <= 1 and narrow["robust_accuracy"] <= narrow["clean_accuracy"]
    assert set(saved["controversial"]["directions"]) == {"AB", "BA"} and "spread" not in saved["controversial"]  # no mean over scales
    table = (out / "report.md").read_text()
    assert "| narrow |" in table and "Observer 2AFC" in table and "narrow keeps, wide pushed" in table
    assert data["models"]["wide"]["set"].endswith("models/wide/set")
    # Per seed type (the authors' Table 1 is the noise row): with as many trials per seed type, the pooled 2AFC panel
    # mean is the mean of the seed types' panel means.
    by_seed = narrow["by_seed_type"]
    assert set(by_seed) == {"noise", "train"}
    noise = by_seed["noise"]["2afc"]
    assert noise["observers"] == {o: narrow["per_observer"]["2afc"][o]["by_seed_type"]["noise"]["accuracy"] for o in ("pixel-l2", "ssim")}
    assert narrow["2afc"]["mean"] == pytest.approx((noise["mean"] + by_seed["train"]["2afc"]["mean"]) / 2)
    assert "## By seed type" in table and "| narrow | noise |" in table and "| wide | train |" in table
    # report.html holds every section, table and figure of report.md, not only Table 1
    page = (out / "report.html").read_text()
    headings = re.findall(r"^## (.+)$", table, flags=re.MULTILINE)
    assert len(headings) >= 3 and all(f"<h2>{html.escape(h, quote=False)}</h2>" in page for h in headings)
    assert page.count("<table>") == len(re.findall(r"^\|---", table, flags=re.MULTILINE)) >= 3
    assert "narrow keeps, wide pushed" in page and '<img src="grid.png"' in page


def test_a_markdown_report_becomes_a_page_with_its_tables_and_figures_and_no_raw_html():
    from perceptual.report import markdown_page

    page = markdown_page("# Report\n\n| Model | 2AFC |\n|---|---|\n| a <b> | 50.0 |\n\n- note <script>alert(1)</script>\n- ![grid.png](grid.png)\n")
    assert page.startswith("<!doctype html>") and "<h1>Report</h1>" in page
    assert "<th>Model</th>" in page and "<td>a &lt;b&gt;</td>" in page and '<img src="grid.png" alt="grid.png"' in page
    assert "<script>" not in page and "<b>" not in page  # text is text, never markup


def test_model_labels_render_as_written_in_the_markdown_and_its_page():
    """``*pgd*`` was italic "pgd" in the Markdown (and its page), ``x&amp;`` read "x&", a ``|`` split the row."""
    from perceptual.report import markdown_page, markdown_table

    table = markdown_table({"*pgd* x&amp; a|b cnn_x": {"2afc": {"mean": 0.5, "std": 0.1}}})
    row = table.splitlines()[-1]
    assert row.startswith("| \\*pgd\\* x\\&amp; a\\|b cnn_x |") and row.count(" | ") == table.splitlines()[0].count(" | ")
    assert "<td>*pgd* x&amp;amp; a|b cnn_x</td>" in markdown_page(table)


class RecordingEngine(Engine):
    """Records how many items each engine call got."""

    def __init__(self, **overrides):
        super().__init__(InvertConfig(**{**ENGINE, **overrides}))
        self.batches: list[int] = []

    def run(self, objective, init, **kwargs):
        self.batches.append(init.shape[0])
        return super().run(objective, init, **kwargs)


def test_one_engine_call_per_set_holds_all_of_a_models_work(tmp_path, tiny_checkpoints):
    """One batch per job: every target x seed type of a model (more than the stimuli commands' 256-item chunks) in one
    call, the controversial set's both directions and all restarts in another; an int chunk_size cuts them into parts."""
    engine = RecordingEngine(steps=2, log_every=1)
    controversial = {"model_a": "narrow", "model_b": "wide", "n_origins": 3, "restarts": 2}
    cheap = dict(tasks=["2afc"], panel=Panel([PixelL2Observer()]), threat=None, accuracy_limit=8)
    run_pipeline(tmp_path / "whole", tiny_checkpoints, engine=engine, n_targets=140, controversial=controversial, **cheap)
    assert engine.batches == [280, 280, 12]  # narrow, wide (140 targets x 2 seed types), controversial (3 x 2 x 2)
    engine = RecordingEngine(steps=2, log_every=1)
    run_pipeline(tmp_path / "parts", tiny_checkpoints, engine=engine, n_targets=4, controversial=controversial, chunk_size=5, **cheap)
    assert engine.batches == [5, 3, 5, 3, 5, 5, 2]
    with pytest.raises(ValueError, match="chunk_size must be at least 1"):
        run_pipeline(tmp_path / "bad", tiny_checkpoints, chunk_size=0)
    assert not (tmp_path / "bad").exists()


def test_rerun_reuses_cached_sets_accuracies_and_judgements(tmp_path, tiny_checkpoints):
    out = tmp_path / "report"
    first = run_pipeline(out, tiny_checkpoints)
    judged = out / "models" / "narrow" / "observers" / "ssim-2afc.json"  # observer_slug("ssim") == "ssim"
    accuracy = out / "models" / "narrow" / "accuracy.json"
    stamps = (judged.stat().st_mtime_ns, accuracy.stat().st_mtime_ns)
    # the Human columns a `humans` import added survive the rerun's rewrite of the report
    report = json.loads((out / "report.json").read_text())
    report["models"]["narrow"]["humans"] = report["models"]["wide"]["humans"] = {"2afc": {"accuracy": 0.75}}
    # people saw narrow's set as it is, and a set of wide's that has been made anew since
    report["humans"] = {"package": "abc", "kept_submissions": 3, "excluded_counts": {},
                        "sets": {"narrow": first["models"]["narrow"]["set_fingerprint"], "wide": "0123456789abcdef"}}
    (out / "report.json").write_text(json.dumps(report))
    second = run_pipeline(out, tiny_checkpoints)
    assert (judged.stat().st_mtime_ns, accuracy.stat().st_mtime_ns) == stamps
    assert second["models"]["narrow"]["2afc"] == first["models"]["narrow"]["2afc"]
    again = json.loads((out / "report.json").read_text())
    assert again["models"]["narrow"]["humans"] == {"2afc": {"accuracy": 0.75}} and again["humans"]["package"] == "abc"
    assert "humans" not in again["models"]["wide"]  # answers about other stimuli than the observers judged
    assert "Human 2AFC" in (out / "report.md").read_text()
    assert Path(second["models"]["narrow"]["set"]).is_absolute()  # humans= rewrites the report from any folder


def test_a_factory_model_with_other_settings_gets_sets_of_its_own(tmp_path):
    """input_quantised at levels 8 and 2 has the same weights: under one label it reused the 8-level inversions."""
    factory = "training.models.defences:input_quantised"
    runs = []
    for levels in (8, 2):
        torch.manual_seed(0)  # the same random weights
        spec = ModelSpec(None, None, "q", factory=factory, kwargs={"name": "small_cnn", "dataset": "digits", "width": 4, "levels": levels})
        runs.append(measure_models([spec], {"name": "digits", "root": None}, tmp_path, engine=ENGINE, n_targets=2, seed=0, tasks=["2afc"],
                                   panel=Panel([PixelL2Observer()]), threat=None, accuracy_limit=20, device=TEST_DEVICE))
    first, second = (r["models"]["q"]["set"] for r in runs)
    assert first != second and Path(first).parent.name.startswith("q-") and Path(second).is_dir()


def test_a_zoo_model_with_other_kwargs_is_not_served_the_old_sets_and_accuracy(tmp_path):
    """A k-WTA ratio changes what the model computes, not its weights: keyed by weights, ratio 0.9 got ratio 0.1's numbers."""
    from training.config import dataset_from_config
    from training.evaluate import clean_accuracy

    torch.manual_seed(0)
    checkpoint = save_checkpoint(build_model("kwta_small_cnn", "digits", width=8, ratio=0.1), tmp_path / "kwta.safetensors")
    test = dataset_from_config({"name": "digits", "root": None}, "test").subset(torch.arange(100))
    fingerprints = []
    for ratio in (0.1, 0.9):
        spec = ModelSpec("kwta_small_cnn", str(checkpoint), "kwta", kwargs={"width": 8, "ratio": ratio})
        data = measure_models([spec], {"name": "digits", "root": None}, tmp_path / "report", engine=ENGINE, n_targets=2, seed_types=["noise"],
                              tasks=["2afc"], panel=Panel([PixelL2Observer()]), threat=None, accuracy_limit=100, device=TEST_DEVICE)
        model = build_model("kwta_small_cnn", "digits", checkpoint=str(checkpoint), width=8, ratio=ratio)
        assert data["models"]["kwta"]["clean_accuracy"] == pytest.approx(clean_accuracy(model, test))
        fingerprints.append(json.loads((Path(data["models"]["kwta"]["set"]) / "manifest.json").read_text())["fingerprint"])
    assert fingerprints[0] != fingerprints[1]


def test_an_observer_is_cached_by_its_weights_and_settings_not_its_name(tmp_path, tiny_checkpoints):
    """LPIPS from another weights file keeps its name: keyed by the name, it was served the first file's judgements."""
    from perceptual.measure import observe_set
    from perceptual.observers import LPIPSObserver
    from stimuli import load_set

    data = run_pipeline(tmp_path / "report", tiny_checkpoints, tasks=["clustering_hard"])
    stimulus_set = load_set(data["models"]["narrow"]["set"])
    first, second = (LPIPSObserver(backbone="random", seed=seed) for seed in (0, 1))
    assert first.name == second.name
    observe_set(stimulus_set, Panel([first]), tmp_path / "shared", tasks=["clustering_hard"])
    cached = observe_set(stimulus_set, Panel([second]), tmp_path / "shared", tasks=["clustering_hard"])
    fresh = observe_set(stimulus_set, Panel([second]), tmp_path / "fresh", tasks=["clustering_hard"])
    assert cached == fresh
    assert SSIMObserver().fingerprint() != SSIMObserver(sigma=2.0).fingerprint() and PixelL2Observer().fingerprint() == PixelL2Observer().fingerprint()
    # A run of `first` interrupted between its answers (CSV) and its summary (JSON) leaves its answers beside `second`'s
    # summary: the restricted scores, read from the answers, must not be the other observer's.
    observe_set(stimulus_set, Panel([first]), tmp_path / "first", tasks=["clustering_hard"])
    (answers,), (other,) = ((tmp_path / folder / "observers").glob("*.csv") for folder in ("shared", "first"))
    answers.write_bytes(other.read_bytes())
    every_result = stimulus_set.manifest.loc[stimulus_set.manifest["role"] == "result", "id"].tolist()
    summary = observe_set(stimulus_set, Panel([second]), tmp_path / "shared", tasks=["clustering_hard"], only_results=every_result)
    result = summary["clustering_hard"][second.name]
    assert result["restricted"]["overall"] == result["overall"] == fresh["clustering_hard"][second.name]["overall"]


def test_cached_accuracies_are_keyed_by_the_data_root():
    """cifar-10-mini and the full CIFAR-10 share the name cifar10: keyed by the name, one was served the other's accuracy."""
    from perceptual.measure import accuracy_cache_key

    mini, full = ({"name": "cifar10", "root": root} for root in ("/data/cifar-10-mini", "/data/cifar-10"))
    assert accuracy_cache_key("w", None, 100, mini) != accuracy_cache_key("w", None, 100, full)
    home = {"name": "cifar10", "root": "~/data"}
    assert accuracy_cache_key("w", None, 100, home) == accuracy_cache_key("w", None, 100, {**home, "root": str(Path.home() / "data")})
    assert accuracy_cache_key("w", None, 100, {"name": "digits", "root": None}) != accuracy_cache_key("w", None, 50, {"name": "digits", "root": None})


def test_pipeline_refusals(tmp_path, tiny_checkpoints):
    with pytest.raises(ValueError, match="labels must be unique"):
        measure_models([ModelSpec("small_cnn", label="x"), ModelSpec("small_cnn", label="x")], {"name": "digits"}, tmp_path, engine=ENGINE, n_targets=3)
    with pytest.raises(ValueError, match="not among the measured models"):
        run_pipeline(tmp_path / "r", tiny_checkpoints, controversial={"model_a": "narrow", "model_b": "nope"})
    with pytest.raises(ValueError, match="needs 'name'"):
        ModelSpec.parse({"checkpoint": "x.pt"})


@pytest.mark.parametrize("change, message", [
    ({"controversial": {"model_a": "narrow", "model_b": "robustt"}}, r"model_b='robustt' is not among the measured models \['narrow', 'wide'\]"),
    ({"controversial": {"model_a": "narrow", "model_b": "wide", "lambda": 0.1}}, r"unknown controversial key\(s\) \['lambda'\]"),
    ({"controversial": {"model_a": "narrow", "model_b": "wide", "lambda_": -0.1}}, r"lambda .* must be a finite number >= 0, got -0.1"),
    ({"n_targets": 2}, "n_targets=2 is too few: clustering, clustering_hard needs at least 3 targets"),
    ({"engine": {"steps": 2, "step": 3}}, r"unknown invert config keys \['step'\]; valid keys are"),
    ({"seed_types": ["noise", "trian"]}, "seed_types must be a non-empty list of"),
    ({"noise_kind": "normal"}, r"unknown noise_kind 'normal': use one of \['gaussian', 'light', 'super', 'uniform'\]"),
    ({"accuracy_limit": 0}, r"accuracy_limit must be a positive number of test images \(or null for all\), got 0"),
    ({"convergence_threshold": 0}, "the convergence threshold must be a positive number"),
    ({"attention_rate": 1.0}, r"attention_rate must be a fraction of the trials in \[0, 1\), got 1.0"),
    ({"gaussian_targets": [{"name": "g", "mean": 0.5}]}, r"Gaussian 0 lacks \['std'\]: give each as \{name, mean, std\}"),
    ({"controversial": {"model_a": "narrow", "model_b": "wide", "steps": -1}}, r"controversial steps must be a whole number >= 0 \(or null\), got -1"),
    ({"controversial": {"model_a": "narrow", "model_b": "wide", "objective": "class_controversial", "k": 0}},
     "controversial k must be a whole number >= 1, got 0"),
    ({"controversial": {"model_a": "narrow", "model_b": "wide", "objective": "class_controversial", "exemplars_per_class": 0}},
     "controversial exemplars_per_class must be a whole number >= 1, got 0"),
], ids=["controversial-label", "controversial-key", "controversial-lambda", "too-few-targets", "engine-key", "seed-type", "noise-kind", "accuracy-limit",
        "convergence-threshold", "attention-rate", "gaussian-without-std", "controversial-steps", "class-controversial-k", "exemplars-per-class"])
def test_bad_measure_inputs_are_refused_before_any_model_is_built(tmp_path, tiny_checkpoints, change, message):
    specs = [ModelSpec("small_cnn", str(tiny_checkpoints["narrow"]), "narrow", kwargs={"width": 8}),
             ModelSpec("small_cnn", str(tiny_checkpoints["wide"]), "wide", kwargs={"width": 12})]
    kwargs = {"engine": ENGINE, "n_targets": 4, **change}
    with pytest.raises(ValueError, match=message):
        measure_models(specs, {"name": "digits", "root": None}, tmp_path / "r", panel=Panel([PixelL2Observer()]), device="cpu", **kwargs)
    assert not (tmp_path / "r").exists()  # nothing was inverted, judged or written
    with pytest.raises(FileNotFoundError, match="model 'gone': checkpoint not found"):
        measure_models([ModelSpec("small_cnn", str(tmp_path / "gone.pt"), "gone")], {"name": "digits", "root": None}, tmp_path / "r")


def test_the_demo_states_class_controversial_results_too():
    from perceptual.pipelines.demo import controversial_lines

    assert controversial_lines({"objective": "class_controversial", "verdict": "pixel-l2: sides with robust"}) == [
        "class-controversial:\npixel-l2: sides with robust"]  # it printed nothing for them
    two_way = {"directions": {"AB": "standard keeps, robust pushed"}, "per_observer": {"ssim": {"AB": {"mean": 0.25}}},
               "verdict": "robust favoured"}
    assert controversial_lines(two_way) == ["controversial (Table 2 score), standard keeps, robust pushed: ssim 0.2500",
                                            "controversial: robust favoured"]
    assert controversial_lines({}) == []


def test_checkpoint_paths_expand_environment_variables(tmp_path, monkeypatch):
    """As data.root and lpips_weights do: '$RUNS/m.safetensors' inside the quoted models=[...] was not found."""
    from perceptual.measure import ModelSpec, validate_inputs
    from training.checkpoints import save_checkpoint
    from training.models import build_model

    save_checkpoint(build_model("small_cnn", "digits", width=8), tmp_path / "m.safetensors")
    monkeypatch.setenv("REPALIGN_TEST_RUNS", str(tmp_path))
    spec = ModelSpec.parse({"name": "small_cnn", "checkpoint": "$REPALIGN_TEST_RUNS/m.safetensors", "kwargs": {"width": 8}})
    assert spec.checkpoint == str(tmp_path / "m.safetensors") and spec.label == "m"
    validate_inputs([spec], n_targets=3, seed_types=["noise"], tasks=["2afc"], engine={"steps": 1}, controversial=None)
    assert isinstance(spec.build("digits"), torch.nn.Module)


def test_an_empty_task_list_and_a_bare_model_name_are_read_as_meant():
    """tasks=[] inverted every model for a report without alignment numbers; models=foo was the models 'f', 'o', 'o'."""
    from perceptual.measure import ModelSpec, validate_inputs
    from perceptual.pipelines.measure import run
    from training.config import compose

    with pytest.raises(ValueError, match=r"tasks is empty: name at least one of"):
        validate_inputs([ModelSpec("small_cnn", None, "a")], n_targets=3, seed_types=["noise"], tasks=[], engine={"steps": 1}, controversial=None)
    with pytest.raises(ValueError, match=r"^unknown zoo model|model labels|foo"):  # one model named foo, refused as such
        run(compose("measure", ["models=foo", "n_targets=3"]))


def test_bare_values_of_list_options_are_one_item(tmp_path):
    """``observers=pixel-l2 tasks=2afc seed_types=noise`` on the command line: one item each (observers=ssim was the
    observers 's', 's', 'i', 'm', refused only after the models were built)."""
    from perceptual.pipelines.measure import run
    from training.checkpoints import save_checkpoint
    from training.config import compose
    from training.models import build_model

    torch.manual_seed(0)
    path = save_checkpoint(build_model("small_cnn", "digits", width=8), tmp_path / "m.safetensors")
    data = run(compose("measure", [
        f"out={tmp_path / 'report'}", f"models=[{{name:small_cnn,checkpoint:'{path}',label:tiny,kwargs:{{width:8}}}}]",
        "observers=pixel-l2", "tasks=2afc", "seed_types=noise", "n_targets=3", "threat=null", "accuracy_limit=8", "device=cpu",
        "invert.steps=2", "invert.progress=false",
    ]))
    assert data["observers"] == ["pixel-l2"] and list(data["models"]["tiny"]["per_observer"]) == ["2afc"]
    assert data["models"]["tiny"]["per_observer"]["2afc"]["pixel-l2"]["overall"]["n"] == 3  # 3 targets x 1 seed type


def test_demo_refuses_a_bad_key_before_training(tmp_path):
    from perceptual.pipelines.demo import run as demo_run
    from training.config import compose

    cfg = compose("demo", [f"out={tmp_path / 'demo'}", "+invert.step=10", "progress=false"])
    with pytest.raises(ValueError, match=r"unknown invert config keys \['step'\]"):
        demo_run(cfg)
    cfg = compose("demo", [f"out={tmp_path / 'demo'}", "+schedule.epoch=3", "progress=false"])
    with pytest.raises(ValueError, match="unknown config key 'train.epoch'.*Did you mean train.epochs"):
        demo_run(cfg)
    cfg = compose("demo", [f"out={tmp_path / 'demo'}", "noise_kind=lite", "progress=false"])
    with pytest.raises(ValueError, match="unknown noise_kind 'lite'"):
        demo_run(cfg)
    for override, message in (("convergence_threshold=0", "the convergence threshold must be a positive number"),
                              ("accuracy_limit=0", "accuracy_limit must be a positive number")):  # refused after both models trained
        with pytest.raises(ValueError, match=message):
            demo_run(compose("demo", [f"out={tmp_path / 'demo'}", override, "progress=false"]))
    assert not (tmp_path / "demo" / "runs").exists()  # no model was trained


def test_imagenet_style_folder_with_a_torchvision_architecture(tmp_path):
    """Folder data sets: targets, train seeds and an accuracy subset are read from the class folders."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for split in ("val", "train"):
        for cls in ("n01", "n02", "n03"):
            (tmp_path / "imagenet" / split / cls).mkdir(parents=True)
            for k in range(2):
                Image.fromarray(rng.integers(0, 256, (240, 260, 3), dtype=np.uint8)).save(tmp_path / "imagenet" / split / cls / f"{k}.png")
    data = measure_models(
        [ModelSpec("mobilenet_v3_small", label="mobilenet")],
        {"name": "imagenet", "root": str(tmp_path / "imagenet"), "split": "val"},
        tmp_path / "report", engine={"steps": 3, "log_every": 1, "progress": False, "patience": None},
        n_targets=3, seed_types=("noise", "train"), panel=Panel([PixelL2Observer()]), tasks=("2afc", "clustering"),
        threat=ThreatModel("linf", 4 / 255, steps=1), accuracy_limit=4, device=TEST_DEVICE,
    )
    result = data["models"]["mobilenet"]
    assert result["per_observer"]["2afc"]["pixel-l2"]["overall"]["n"] == 6
    from stimuli import load_set

    assert load_set(result["set"]).images.shape[1:] == (3, 224, 224)


def test_controversial_favoured_model_is_decided_by_a_sign_flip_test_over_origins():
    from perceptual.measure import controversial_favoured, controversial_verdict

    def spread(ab, ba):
        return {"AB": {"mean": sum(ab) / len(ab), "per_origin": dict(enumerate(ab))},
                "BA": {"mean": sum(ba) / len(ba), "per_origin": dict(enumerate(ba))}}

    favoured_input = {
        "lpips": spread([0.2, 0.25, 0.22, 0.21, 0.2, 0.2], [0.3, 0.35, 0.33, 0.31, 0.3, 0.3]),   # AB lower at every origin: standard
        "ssim": spread([0.5, 0.52, 0.55, 0.51, 0.5, 0.5], [0.4, 0.41, 0.45, 0.40, 0.4, 0.4]),    # BA lower at every origin: robust
        "pixel": spread([0.1, 0.3, 0.1, 0.3, 0.1, 0.3], [0.3, 0.1, 0.3, 0.1, 0.3, 0.1]),         # no consistent difference
    }
    favoured = controversial_favoured(favoured_input, {"AB": "standard", "BA": "robust"})
    # six origins agreeing in sign: 2 of the 2^6 sign flips are as extreme
    assert favoured["lpips"]["favours"] == "standard" and favoured["lpips"]["p_value"] == pytest.approx(2 / 64) and favoured["lpips"]["ci"][1] < 0
    assert favoured["ssim"]["favours"] == "robust" and favoured["ssim"]["ci"][0] > 0
    assert favoured["pixel"]["favours"] is None and favoured["pixel"]["ci"][0] < 0 < favoured["pixel"]["ci"][1]
    assert favoured["lpips"]["difference"] == pytest.approx(-0.61 / 6)
    verdict = controversial_verdict(favoured)
    assert verdict.startswith("the observers disagree (ssim favour robust; lpips favour standard; pixel favour neither)")
    partly = controversial_verdict({"lpips": {"favours": "standard"}, "ssim": {"favours": None}})
    assert partly.startswith("the observers do not agree (lpips favour standard; ssim favour neither)")
    assert "favour neither" in controversial_verdict({"lpips": {"favours": None}})
    # five origins that all agree are still a one-in-16 chance under the null: no verdict, though the bootstrap interval excludes 0
    five = controversial_favoured({"lpips": spread([0.4, 0.45, 0.4, 0.42, 0.41], [0.3, 0.31, 0.3, 0.3, 0.3])}, {"AB": "standard", "BA": "robust"})
    assert five["lpips"]["ci"][0] > 0 and five["lpips"]["p_value"] == pytest.approx(2 / 32) and five["lpips"]["favours"] is None
    # an observer's interval is its own: the same with other observers before it in the panel (one shared generator moved it)
    uneven = spread([0.31, 0.12, 0.27, 0.18, 0.4, 0.22], [0.2, 0.33, 0.1, 0.25, 0.19, 0.36])
    alone = controversial_favoured({"uneven": uneven}, {"AB": "standard", "BA": "robust"})["uneven"]
    last = controversial_favoured({**favoured_input, "uneven": uneven}, {"AB": "standard", "BA": "robust"})["uneven"]
    assert alone["ci"] == last["ci"]


def test_controversial_verdicts_from_origins_that_side_at_random_stay_rare():
    """Each origin's difference a fair coin's sign: the percentile bootstrap alone declared a model favoured in about
    half the runs of 2 origins and one in five of 4; the sign-flip test keeps it at most 5 % at every size."""
    from perceptual.measure import controversial_favoured

    rng = np.random.default_rng(0)
    for n_origins in (2, 4, 8, 12):
        verdicts = 0
        for _ in range(200):
            ab = rng.uniform(0.2, 0.4, n_origins)
            ba = ab + rng.choice([-1, 1], n_origins) * rng.uniform(0.01, 0.1, n_origins)
            spread = {"AB": {"mean": ab.mean(), "per_origin": dict(enumerate(ab))}, "BA": {"mean": ba.mean(), "per_origin": dict(enumerate(ba))}}
            verdicts += controversial_favoured({"o": spread}, {"AB": "a", "BA": "b"}, n_boot=200)["o"]["favours"] is not None
        assert verdicts / 200 <= 0.08, (n_origins, verdicts)


def test_one_origin_favours_no_model():
    """One origin gives no interval: a difference of 0.01 at one origin is no evidence for either model."""
    from perceptual.measure import controversial_favoured

    one = {"AB": {"mean": 0.30, "per_origin": {"o0": 0.30}}, "BA": {"mean": 0.31, "per_origin": {"o0": 0.31}}}
    means_only = {"AB": {"mean": 0.30}, "BA": {"mean": 0.31}}
    favoured = controversial_favoured({"lpips": one, "ssim": means_only}, {"AB": "standard", "BA": "robust"})
    for observer in ("lpips", "ssim"):
        assert favoured[observer]["favours"] is None
        assert favoured[observer]["difference"] == pytest.approx(-0.01)
        assert all(math.isnan(bound) for bound in favoured[observer]["ci"])


def test_threat_eps_may_be_a_fraction_on_the_measure_command_line():
    from omegaconf import OmegaConf

    from perceptual.measure import threat_from_config
    from training.config import check_overrides

    cfg = check_overrides("measure", ["threat.norm=linf", "threat.eps=8/255", "threat.steps=5"])
    threat = threat_from_config(OmegaConf.to_container(cfg.threat, resolve=True))
    assert threat.norm == "linf" and threat.eps == pytest.approx(8 / 255) and threat.steps == 5
    assert threat_from_config(None) is None


def test_model_spec_takes_a_factory_or_a_built_module():
    """A defence that is in nobody's zoo: ``factory`` (module:function + kwargs) or an already built ``module``."""
    spec = ModelSpec.parse({"factory": "training.models.defences:input_quantised", "kwargs": {"name": "small_cnn", "dataset": "digits", "width": 4}})
    assert spec.label == "input_quantised" and spec.name is None
    model = spec.build("digits")
    assert type(model).__name__ == "InputQuantised" and model(torch.rand(2, 3, 32, 32)).shape == (2, 10)
    built = build_model("small_cnn", "digits", width=4)
    assert ModelSpec(name="small_cnn", label="mine", module=built).build("digits") is built
    with pytest.raises(ValueError, match="exactly one of name"):
        ModelSpec(name="small_cnn", factory="training.models.defences:input_quantised")
    with pytest.raises(ValueError, match="needs 'name'"):
        ModelSpec.parse({"checkpoint": "x.safetensors"})


@pytest.mark.parametrize("label", ["wrn|trades", "wrn_$\\beta_$", "runs/a", "a\\b", ".hidden", "two\nlines"])
def test_a_label_that_would_break_a_folder_a_table_or_a_figure_is_refused(label):
    """``|`` split the reports' table rows (every value moved one column), ``$...$`` made matplotlib parse the figure
    labels as TeX and stop the report with a ParseSyntaxException."""
    with pytest.raises(ValueError, match="must be a plain name"):
        ModelSpec("small_cnn", label=label)
    assert ModelSpec("small_cnn", label="wrn-28_trades (eps 8, β 6)").label == "wrn-28_trades (eps 8, β 6)"


def test_the_alignment_scatter_is_left_out_where_it_has_no_point():
    from perceptual.audit_report import alignment_figures
    from perceptual.report import alignment_scatter, scatter_points

    clean_only = {"a": {"2afc": {"mean": 0.8, "std": 0.1}, "robust_accuracy": None}}  # threat=null
    undefined = {"a": {"clustering": {"mean": math.nan, "std": 0.0}, "robust_accuracy": 0.4}}
    assert scatter_points(clean_only, "2afc") == {} and scatter_points(undefined, "clustering") == {}
    with pytest.raises(ValueError, match="nothing to plot"):  # was: a titled figure with no data points, linked from the report
        alignment_scatter(clean_only, "unused.png", "2afc")
    assert alignment_figures(undefined, "unused") == []


def test_an_undefined_spread_draws_no_error_bar():
    """A one-observer panel's std is NaN in memory (None read back): it went into the error bars as NaN."""
    from perceptual.report import spread

    assert spread({"std": math.nan}) == spread({"std": None}) == spread({}) == 0.0 and spread({"std": 0.05}) == 0.05


def test_crowded_scatter_labels_are_moved_apart():
    """Robust models crowd into one corner of Fig. 4: their names used to be printed over each other."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.text import Text

    from perceptual.report import separate_labels

    fig, ax = plt.subplots(figsize=(4.5, 3.6))
    ax.set(xlim=(0, 100), ylim=(30, 60))
    labels = [ax.annotate(f"cnn-trades_beta{i} †", (90, 55 + 0.1 * i), textcoords="offset points", xytext=(4, 4), fontsize=8,
                          arrowprops={"arrowstyle": "-"}) for i in range(4)]
    labels.append(ax.annotate("cnn-standard", (5, 35), textcoords="offset points", xytext=(4, 4), fontsize=8, arrowprops={"arrowstyle": "-"}))
    separate_labels(fig, labels)
    renderer = fig.canvas.get_renderer()
    boxes = [Text.get_window_extent(label, renderer) for label in labels]
    assert not any(boxes[i].overlaps(boxes[j]) for i in range(len(boxes)) for j in range(i + 1, len(boxes)))
    assert labels[-1].xyann == (4, 4)  # a label with room keeps its place
    assert max(label.xyann[1] for label in labels[:4]) < 60  # lifted just clear, not thrown off the figure
    plt.close(fig)


def test_the_report_names_a_noise_seed_distribution_other_than_uniform():
    from perceptual.measure import seed_names

    assert seed_names({"seed_types": ["noise", "train"]}) == "noise, train"  # reports written before the option
    assert seed_names({"seed_types": ["noise", "train"], "noise_kind": "uniform"}) == "noise, train"
    assert seed_names({"seed_types": ["train", "noise"], "noise_kind": "light"}) == "train, noise (light)"


def test_a_report_with_relative_set_paths_is_rewritten_from_another_folder(tmp_path, tiny_checkpoints, monkeypatch):
    """Reports written before set paths were absolute: `humans measure_report=...` from another folder crashed on grid.png."""
    from perceptual.measure import load_report, write_report

    out = tmp_path / "report"
    run_pipeline(out, tiny_checkpoints)
    report = load_report(out)
    for label, result in report["models"].items():
        result["set"] = f"reports/measure/models/{label}/set"  # relative to a folder this test is not in
    grid = (out / "grid.png").read_bytes()
    monkeypatch.chdir(tmp_path)
    write_report(report, out)
    assert (out / "grid.png").read_bytes() == grid and "grid.png" in (out / "report.md").read_text()


def _strict_json(path):
    """``path`` read as JSON that other languages parse: no NaN or Infinity literals."""
    def refuse(literal):
        raise ValueError(f"{path} holds the literal {literal}, which JSON does not allow")
    return json.loads(path.read_text(), parse_constant=refuse)


def test_report_json_is_strict_json_and_a_loaded_report_renders_again(tmp_path, tiny_checkpoints):
    """One observer (no panel std) and one origin (no interval) wrote bare NaN into report.json, which JavaScript's
    JSON.parse, jq and pandas' strict readers refuse; undefined numbers are null there, and a report read back (as the
    humans command does) renders the same tables."""
    from perceptual.measure import load_report, write_report

    out = tmp_path / "report"
    controversial = {"model_a": "narrow", "model_b": "wide", "n_origins": 1, "restarts": 2}
    data = run_pipeline(out, tiny_checkpoints, panel=Panel([PixelL2Observer()]), controversial=controversial, convergence_threshold=0.5)
    assert math.isnan(data["models"]["narrow"]["2afc"]["std"])  # in memory the number stays a float
    saved = _strict_json(out / "report.json")
    assert saved["models"]["narrow"]["2afc"]["std"] is None
    first = (out / "report.md").read_text()
    assert not re.search(r"\bnan\b", first, flags=re.IGNORECASE) and "(no interval: fewer than 2 origins)" in first  # was [+nan, +nan]
    write_report(load_report(out), out)
    assert (out / "report.md").read_text() == first
    assert _strict_json(out / "report.json") == saved


def test_the_convergence_table_says_which_column_is_a_distance(tmp_path, tiny_checkpoints):
    """"best" (the distance alone, float32) and "last iterate" (the whole objective with priors, bf16 on a GPU) stood under
    one heading as if both were distances."""
    from perceptual.measure import load_report, write_report

    out = tmp_path / "report"
    run_pipeline(out, tiny_checkpoints, panel=Panel([PixelL2Observer()]))
    text = (out / "report.md").read_text()
    assert "| best distance: median | best distance: 90th pct. | last iterate's loss: median |" in text
    assert "in the run's precision" in text and "not a distance" not in text
    report = load_report(out)
    report["models"]["wide"]["convergence"]["curve_includes_priors"] = True  # as a set made with tv_weight > 0 records
    write_report(report, out)
    assert "for wide it includes the priors (tv_weight, lp_weight, transform_robust), so it is not a distance." in (out / "report.md").read_text()


def test_an_undefined_ranking_agreement_is_written_as_undefined_not_nan(tmp_path, tiny_checkpoints):
    from perceptual.measure import load_report, write_report

    out = tmp_path / "report"
    run_pipeline(out, tiny_checkpoints)
    report = load_report(out)
    report["statistics"]["ranking_agreement"] = {"2afc: noise vs train seeds": {"tau": math.nan, "ci_low": math.nan, "ci_high": math.nan},
                                                 "random vs hard clustering": {"tau": -1.0, "ci_low": -1.0, "ci_high": 1.0}}
    write_report(report, out)
    text = (out / "report.md").read_text()
    assert "| 2afc: noise vs train seeds | undefined (tied scores) | – |" in text and "| random vs hard clustering | -1.00 | [-1.00, +1.00] |" in text
    assert not re.search(r"\bnan\b", text, flags=re.IGNORECASE)


def test_panel_scores_by_seed_type_on_constructed_judgements():
    from perceptual.measure import panel_scores_by_seed_type

    def result(noise, train):
        return {"overall": {"accuracy": (noise + train) / 2}, "by_seed_type": {"noise": {"accuracy": noise}, "train": {"accuracy": train}}}

    scores = panel_scores_by_seed_type({"2afc": {"a": result(0.2, 0.6), "b": result(0.4, 1.0)}})
    assert scores["noise"]["2afc"]["mean"] == pytest.approx(0.3) and scores["noise"]["2afc"]["std"] == pytest.approx(math.sqrt(0.02))
    assert scores["train"]["2afc"]["mean"] == pytest.approx(0.8) and scores["train"]["2afc"]["observers"] == {"a": 0.6, "b": 1.0}
    # an observer without a seed type's score (a cached summary from before by_seed_type) leaves the mean to the others
    one = panel_scores_by_seed_type({"2afc": {"a": result(0.2, 0.6), "b": {"overall": {"accuracy": 0.5}}}})
    assert one["noise"]["2afc"]["mean"] == pytest.approx(0.2) and math.isnan(one["noise"]["2afc"]["observers"]["b"])


def test_judgements_are_cached_by_the_pixels_judged_not_only_the_sets_fingerprint(tmp_path, tiny_checkpoints):
    """A set made again keeps its fingerprint (the settings that made it) while its pixels may differ (deleted and
    inverted anew, other hardware): keyed by the fingerprint alone, the new pixels were served the old judgements."""
    import dataclasses

    from perceptual.measure import observe_set
    from stimuli import load_set

    data = run_pipeline(tmp_path / "report", tiny_checkpoints, tasks=["2afc"])
    stimulus_set = load_set(data["models"]["narrow"]["set"])
    results = torch.tensor((stimulus_set.manifest["role"] == "result").to_numpy())
    made_again = dataclasses.replace(stimulus_set, images=torch.where(results[:, None, None, None], 1 - stimulus_set.images, stimulus_set.images))
    assert made_again.fingerprint == stimulus_set.fingerprint
    panel = Panel([PixelL2Observer()])
    first = observe_set(stimulus_set, panel, tmp_path / "shared", tasks=["2afc"])
    again = observe_set(made_again, panel, tmp_path / "shared", tasks=["2afc"])
    fresh = observe_set(made_again, panel, tmp_path / "fresh", tasks=["2afc"])
    assert again == fresh and again != first


def test_a_figure_that_fails_loses_no_number_and_a_rewritten_report_keeps_no_stale_figure(tmp_path, tiny_checkpoints, monkeypatch):
    """The figures were drawn before report.json: one that failed lost every number. A report rewritten without robust
    accuracy or convergence kept the earlier scatter and convergence figures beside it; an undefined converged share
    read "nan%"; the scatter named no model whose inversions did not converge."""
    import shutil

    import perceptual.measure as measure_module
    from perceptual.measure import load_report, write_report

    # With a relative out= and checkpoints (the command line's), the controversial set's and the checkpoints' paths were
    # relative to where the command ran: a report read from another folder could not find them.
    monkeypatch.chdir(tmp_path)
    relative = {name: shutil.copy(path, tmp_path / f"{name}.safetensors") and Path(f"{name}.safetensors") for name, path in tiny_checkpoints.items()}
    controversial = {"model_a": "narrow", "model_b": "wide", "n_origins": 1, "restarts": 2}
    out = Path("report")
    first = run_pipeline(out, relative, panel=Panel([PixelL2Observer()]), controversial=controversial, convergence_threshold=1e-9)  # †
    assert Path(first["controversial"]["set"]).is_absolute() and Path(first["controversial"]["set"]).is_dir()
    assert all(Path(m["set"]).is_absolute() and Path(m["model"]["checkpoint"]).is_absolute() for m in first["models"].values())
    out = tmp_path / "report"  # monkeypatch.undo() below also undoes the chdir
    assert {"scatter_2afc.png", "convergence.png"} <= {p.name for p in out.glob("*.png")}
    data = load_report(out)
    drawn = []
    monkeypatch.setattr(measure_module.report, "alignment_scatter", lambda models, path, task: drawn.append(list(models)) or path)
    write_report(data, out)
    assert drawn and all(label.endswith(" †") for labels in drawn for label in labels)  # the table's marks reach the scatter
    monkeypatch.undo()

    def broken(*args, **kwargs):
        raise RuntimeError("a figure that cannot be drawn")

    (out / "report.json").unlink()
    monkeypatch.setattr(measure_module, "convergence_figure", broken)
    with pytest.raises(RuntimeError):
        write_report(data, out)
    assert _strict_json(out / "report.json")["models"]  # the numbers are written before any figure
    monkeypatch.undo()
    for model in data["models"].values():
        model["robust_accuracy"] = None
        for entry in model["convergence"]["by_seed_type"].values():
            entry["converged_fraction"] = float("nan")  # undefined in memory (NaN), not null as read back
    write_report(data, out)
    assert not (out / "scatter_2afc.png").exists() and (out / "convergence.png").exists()
    assert "nan%" not in (out / "report.md").read_text()
    for model in data["models"].values():
        del model["convergence"]
    write_report(data, out)
    assert not (out / "convergence.png").exists()


def test_every_model_is_checked_on_the_data_before_the_first_is_inverted(tmp_path, tiny_checkpoints, monkeypatch):
    """A model of another number of classes, another image size or a bad layer failed only once the models before it
    were inverted, judged and measured (hours at the paper's scale); 100 outputs on 10-class digits were measured."""
    import textwrap

    (tmp_path / "wrong_models.py").write_text(textwrap.dedent("""
        import torch
        from training import build_model

        def hundred():
            return build_model("small_cnn", "cifar100", width=4)

        def big():  # made for 64-pixel images
            return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 64 * 64, 10))

        def flat():
            return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 32 * 32, 10))
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    cases = [("hundred", None, r"model 'hundred' has 100 outputs but digits has 10 classes"),
             ("big", "1", r"model 'big' fails on the digits images, of shape \(3, 32, 32\): RuntimeError"),
             ("flat", "nowhere", r"model 'flat': its representation at layer 'nowhere' does not run: ValueError: unknown layer 'nowhere'")]
    good = ModelSpec("small_cnn", str(tiny_checkpoints["narrow"]), "narrow", kwargs={"width": 8})
    for label, layer, message in cases:
        with pytest.raises(ValueError, match=message):
            measure_models([good, ModelSpec(factory=f"wrong_models:{label}", label=label, layer=layer)], {"name": "digits", "root": None},
                           tmp_path / label, engine=ENGINE, n_targets=4, panel=Panel([PixelL2Observer()]), device=TEST_DEVICE)
        assert not (tmp_path / label / "models").exists()  # nothing inverted for the good model first
    assert ModelSpec(factory="wrong_models:flat", layer=4).layer == "4"  # Hydra reads layer=4 as a number
    # a folder data set (always named imagenet) takes a model of its own classes: as many outputs as its subfolders, or more
    from perceptual.measure import check_model_serves

    check_model_serves("mine", torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 8 * 8, 3)), torch.rand(2, 3, 8, 8), "imagenet", 3)
    with pytest.raises(ValueError, match="model 'two' has 2 outputs but the data has 3 classes"):
        check_model_serves("two", torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 8 * 8, 2)), torch.rand(2, 3, 8, 8), "imagenet", 3)
