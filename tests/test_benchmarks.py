"""The benchmarks still run end to end at toy sizes and write their JSON (speed itself is never asserted)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def run_benchmark(script: str, out: Path, *args: str) -> dict:
    done = subprocess.run([sys.executable, str(BENCHMARKS / script), "--out", str(out), *args],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return json.loads(out.read_text())


def test_observer_benchmark_compares_equal_distances(tmp_path):
    report = run_benchmark("bench_observer.py", tmp_path / "observer.json", "--images", "10", "--loop-images", "4", "--threads", "1")
    assert report["results"]["ours"]["pairs"] == 45 and report["results"]["lpips-loop"]["pairs"] == 6
    # The comparison is only meaningful because both compute the same distances.
    assert report["agreement"]["max_abs_difference_vs_batched"] < 1e-5
    assert report["agreement"]["max_abs_difference_vs_loop"] < 1e-5
    assert report["agreement"]["max_abs_difference_pairwise_vs_batched"] < 1e-5
    assert report["agreement"]["pairwise_sliced_equals_one_slice"] is True
    assert report["results"]["ours-pairwise"]["pairs"] == report["results"]["ours-pairwise-one-slice"]["pairs"] == 45
    assert set(report["ratios"]) == {"ours / lpips-batched", "ours / lpips-loop", "ours-pairwise / lpips-batched",
                                     "ours-pairwise / ours-pairwise-one-slice"}


@pytest.mark.slow
def test_training_benchmark_runs_every_contender(tmp_path):
    report = run_benchmark("bench_training.py", tmp_path / "training.json", "--images", "64", "--batch-size", "32", "--epochs", "1",
                           "--repeats", "1", "--pgd-steps", "1", "--threads", "1", "--cuda-graph")
    runs = ("ours", "ours-graph", "robustness", "dataloader", "kernels")
    assert set(report["results"]) == {f"{m}/{r}" for m in ("standard", "pgd") for r in runs}
    assert all(r["images_per_second"] > 0 for r in report["results"].values())
    # off CUDA, --cuda-graph runs the captured step's structure eagerly; ours stays the eager step
    assert report["results"]["pgd/ours-graph"]["cuda_graph"] == "static" and report["results"]["pgd/ours"]["cuda_graph"] == "eager"
    assert report["results"]["pgd/kernels"]["precision"] == report["results"]["pgd/ours"]["precision"]  # the ceiling computes as ours does
    assert {"pgd: ours / robustness", "pgd: ours-graph / robustness", "pgd: ours-graph / kernels", "pgd: ours-graph / ours"} <= set(report["ratios"])
    flops = report["flops_per_training_image"]
    assert flops["pgd"] > flops["standard"] > 0 and report["bf16_peak_tflops"] is None  # a CPU has no entry in the peak table
    gaps = report["same_work_max_gaps"]  # checked before timing: the library's attack step is ours, fused SGD is SGD
    assert gaps["attack_step_library_vs_plain"] < 1e-5 and gaps["sgd_step_fused_vs_plain"] < 1e-6
    for key, result in report["results"].items():
        assert result["tflops"] == pytest.approx(result["images_per_second"] * flops[key.split("/")[0]] / 1e12)
        assert result["fraction_of_bf16_peak"] == "n.a."


@pytest.mark.slow
def test_inversion_benchmark_reports_throughput_and_early_stopping_quality(tmp_path):
    report = run_benchmark("bench_inversion.py", tmp_path / "inversion.json", "--arch", "small_cnn", "--skip", "anchor",
                           "--items", "4", "--steps", "12", "--patience", "3", "--threads", "1")
    assert set(report["results"]) == {"engine", "engine-best", "engine-best-stop"}
    assert report["config"]["run_order"] == ["engine-best", "engine-best-stop", "engine"]  # the goal's runs first
    assert report["flops_per_item_step"] > 0 and report["bf16_peak_tflops"] is None  # a CPU has no entry in the peak table
    for result in report["results"].values():
        assert result["item_steps_per_s"] == pytest.approx(4 * 12 / result["seconds"])
        assert result["tflops"] == pytest.approx(result["item_steps_computed"] * report["flops_per_item_step"] / result["seconds"] / 1e12)
        assert result["fraction_of_bf16_peak"] == "n.a." and result["loop"] == "eager"  # off CUDA, cuda_graph=auto runs eagerly
    assert report["results"]["engine"]["item_steps_computed"] == 4 * 12
    stopping = report["early_stopping"]
    assert stopping["patience"] == 3 and 0 <= stopping["item_steps_saved"] < 1 and 0 <= stopping["items_worse"] <= 4
    assert stopping["item_steps_computed_saved"] <= stopping["item_steps_saved"]


@pytest.mark.slow
def test_measure_benchmark_times_every_stage_of_the_pipeline(tmp_path):
    report = run_benchmark("bench_measure.py", tmp_path / "measure.json", "--scale", "tiny", "--threads", "1",
                           "--observers", "pixel-l2", "ssim", "--device", "cpu")
    assert report["stage_calls"] == {"build": 2, "inversion": 2, "accuracy": 2, "observe": 2, "controversial": 1}
    assert all(report["stage_seconds"][stage] > 0 for stage in report["stage_calls"])
    assert report["seconds"] >= report["pipeline_seconds"] > 0
    assert report["config"]["engine"] == "best" and report["config"]["invert_overrides"] == ["precision=auto", "channels_last=true", "cuda_graph=auto"]


def test_the_early_stopping_replay_is_the_engines_rule_step_for_step():
    import numpy as np
    import torch
    from torch import nn

    sys.path.insert(0, str(BENCHMARKS))
    from early_stopping_study import replay, stopping_steps

    from invert import Engine, InversionLoss, noise_images

    torch.manual_seed(0)
    representation = nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1), nn.ReLU(), nn.Conv2d(8, 8, 3, 2, 1), nn.Flatten()).eval()
    objective = InversionLoss(representation, noise_images(6, (3, 16, 16), seed=3))
    seeds = noise_images(6, (3, 16, 16), seed=4)
    # cuda_graph=True: the batch keeps its shape, so the stopped run follows the unstopped one exactly.
    settings = dict(steps=120, step_size=0.5, progress=False, log_every=1, cuda_graph=True)
    full = Engine(**settings).run(objective, seeds)
    curve = full.loss_curve.numpy()
    for patience, rtol in ((10, 1e-3), (25, 1e-2)):
        stopped = Engine(patience=patience, rtol=rtol, **settings).run(objective, seeds)
        predicted = stopping_steps(curve, patience, rtol, "sliding")
        assert predicted.tolist() == stopped.steps_used.tolist()
        assert (predicted < 120).any()
        row = replay(curve, patience, rtol, "sliding", worse_by=0.01)
        assert row["median_distance"] == pytest.approx(float(np.median(stopped.best_loss.numpy())))  # numpy: the mean of the middle two
    window = stopping_steps(curve, 10, 1e-3, "window")
    assert (window % 10 == 0).all()  # the first rule only looked at multiples of the patience


def test_mart_loss_benchmark_compares_equal_losses(tmp_path):
    report = run_benchmark("bench_mart_loss.py", tmp_path / "mart.json", "--batch", "16", "--iterations", "3", "--repeats", "1", "--threads", "1")
    assert report["agreement"]["abs_difference"] < 1e-5  # the authors' formulation and ours give the same loss
    assert set(report["results"]) == {"ours", "reference"} and report["ratios"]["ours / reference (speed)"] > 0


def test_ssim_benchmark_compares_equal_distances(tmp_path):
    report = run_benchmark("bench_ssim.py", tmp_path / "ssim.json", "--pairs", "8", "--iterations", "2", "--repeats", "1", "--threads", "1")
    assert set(report["results"]) == {"ours", "kornia"} and report["agreement"]["max_abs_difference"] < 1e-5
    assert set(report["ratios"]) == {"ours / kornia (speed)"}


def test_tv_prior_benchmark_compares_equal_values_and_gradients(tmp_path):
    report = run_benchmark("bench_tv_prior.py", tmp_path / "tv.json", "--items", "4", "--iterations", "2", "--repeats", "1", "--threads", "1")
    assert set(report["results"]) == {"ours", "replicate-pad"} and report["agreement"]["max_abs_value_difference"] == 0
    assert report["agreement"]["max_abs_gradient_difference"] < 1e-6 and report["ratios"]["ours / replicate-pad (speed)"] > 0


def test_a_training_steps_flops_are_the_attacks_input_gradients_and_the_training_steps_weight_gradients():
    import torch
    from torch import nn

    sys.path.insert(0, str(BENCHMARKS))
    from throughput import flops_per_training_image

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(256, 10))
    images, labels = torch.rand(5, 3, 8, 8), torch.randint(0, 10, (5,))
    conv, linear = 2 * 3 * 9 * 4 * 8 * 8, 2 * 256 * 10  # multiply-adds x 2 of one 8x8 image's forward
    attack_step = 2 * (conv + linear)  # forward, then the gradients to the input only
    training_step = (conv + linear) + linear + (conv + linear)  # forward, the linear layer's input gradient, both weight gradients
    state = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    model.eval()
    assert flops_per_training_image(model, images, labels, attack_steps=0) == training_step
    assert flops_per_training_image(model, images, labels, attack_steps=3) == 3 * attack_step + training_step
    # the count trains nothing: modes, gradients and batch-norm statistics come back as they were
    assert not model.training and all(p.grad is None for p in model.parameters())
    assert all(torch.equal(state[name], tensor) for name, tensor in model.state_dict().items())


def test_the_bf16_peak_table_matches_each_gpu_by_its_most_specific_name():
    sys.path.insert(0, str(BENCHMARKS))
    from throughput import peak_of_gpu

    names = {"NVIDIA H100 80GB HBM3": 989.0, "NVIDIA H100 PCIe": 756.0, "NVIDIA H100 NVL": 835.0, "NVIDIA H200": 989.0,
             "NVIDIA H200 NVL": 835.0, "NVIDIA GH200 480GB": 989.0, "NVIDIA A100-SXM4-80GB": 312.0, "NVIDIA L40S": 362.0,
             "NVIDIA L40": 181.0, "NVIDIA L4": 121.0, "NVIDIA A10": 125.0, "Tesla T4": None,
             "NVIDIA RTX A1000": None, "NVIDIA L40G": None}  # by whole name: "A10" in "A1000" took the A100's peak
    assert {name: peak_of_gpu(name) for name in names} == names


def test_benchmarks_stop_before_timing_contenders_that_disagree_and_time_without_a_warm_up_when_asked():
    """ssim, tv_prior and mart_loss recorded a disagreement and still reported a speed ratio; interleaved_timings
    divided by zero when its callers had warmed the contenders up themselves (warmup=0)."""
    sys.path.insert(0, str(BENCHMARKS))
    import timing

    timing.require_agreement({"values": 1e-7, "gradients": 0.0}, 1e-5)
    with pytest.raises(SystemExit, match=r"the contenders disagree \(\{'gradients': 0.1\}, limit 1e-05\)"):
        timing.require_agreement({"values": 1e-7, "gradients": 0.1}, 1e-5)
    with pytest.raises(SystemExit, match="disagree"):
        timing.require_agreement({"values": float("nan")}, 1e-5)
    calls = []
    medians, rounds = timing.interleaved_timings({"a": lambda: calls.append("a")}, iterations=1, repeats=2, device="cpu", warmup=0)
    assert calls == ["a", "a"] and len(rounds["a"]) == 2 and medians["a"] >= 0


def test_every_benchmark_command_of_the_gpu_session_script_parses():
    """The GPU session script runs where time is scarce: its commands' flags are checked here, without a GPU."""
    import importlib
    import re
    import shlex

    sys.path.insert(0, str(BENCHMARKS))
    script = (BENCHMARKS / "gpu_session.sh").read_text().replace("\\\n", " ")
    commands = re.findall(r"python3 benchmarks/(\w+)\.py([^\n;]*)", script)
    assert {name for name, _ in commands} == {"bench_inversion", "bench_measure", "bench_training", "early_stopping_study"}
    for name, flags in commands:
        argv = shlex.split(flags.replace('"$cifar"', "/data").replace("$out", "/out").replace("$slug", "gpu"))
        args = importlib.import_module(name).parse_args(argv)
        assert str(args.out).startswith("/out/"), (name, args.out)  # every result lands where the job brings files back
    usage = subprocess.run(["bash", str(BENCHMARKS / "gpu_session.sh")], capture_output=True, text=True)
    assert usage.returncode == 2 and "usage" in usage.stderr
    typo = subprocess.run(["bash", str(BENCHMARKS / "gpu_session.sh"), "out", "inversio"], capture_output=True, text=True)
    assert typo.returncode == 2 and "unknown step 'inversio'" in typo.stderr


def test_every_benchmark_command_in_the_readme_parses():
    import importlib
    import re
    import shlex

    sys.path.insert(0, str(BENCHMARKS))
    readme = (BENCHMARKS.parent / "README.md").read_text()
    commands = re.findall(r"python benchmarks/(\w+)\.py([^\n#`]*)", readme)
    assert {name for name, _ in commands} >= {"bench_inversion", "bench_measure", "bench_training"}
    for name, flags in commands:
        importlib.import_module(name).parse_args(shlex.split(flags))  # argparse exits (a failure) on a bad flag


def test_every_benchmark_answers_help_without_running():
    """gpu_deterministic_cost.py had no parser: --help ran the benchmark and died in CUDA's driver check. Every script runs
    as ``__main__`` with ``--help`` in one interpreter (one torch import instead of one per script)."""
    scripts = [str(script) for script in sorted(BENCHMARKS.glob("*.py"))
               if script.name not in ("results_io.py", "timing.py", "throughput.py", "robustness_compat.py")]  # imported, not run
    driver = """
import contextlib, io, json, runpy, sys
sys.path.insert(0, sys.argv[1])
answers = {}
for script in sys.argv[2:]:
    sys.argv, out = [script, "--help"], io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            runpy.run_path(script, run_name="__main__")
        answers[script] = "ran without exiting"
    except SystemExit as done:
        answers[script] = "usage" if done.code in (0, None) and "usage" in out.getvalue() else f"exit {done.code}: {out.getvalue()[-300:]}"
    except Exception as err:
        answers[script] = f"{type(err).__name__}: {err}"
print(json.dumps(answers))
"""
    done = subprocess.run([sys.executable, "-c", driver, str(BENCHMARKS), *scripts], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    answers = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(answers) == len(scripts) >= 8 and all(answer == "usage" for answer in answers.values()), answers


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_the_deterministic_cost_benchmark_refuses_a_machine_without_cuda(tmp_path):
    done = subprocess.run([sys.executable, str(BENCHMARKS / "gpu_deterministic_cost.py"), "--out", str(tmp_path / "r.json")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "needs a CUDA device" in done.stderr and not (tmp_path / "r.json").exists()


@pytest.mark.parametrize("script, args, message", [
    ("bench_inversion.py", ["--repeats", "0"], "--repeats must be at least 1, got 0"),  # KeyError: 'results' at the end
    ("bench_inversion.py", ["--items", "0"], "--items must be at least 1"),
    ("bench_inversion.py", ["--warmup-steps=-1"], "--warmup-steps must be 0 (none) or more"),
    ("bench_inversion.py", ["--skip", "engine-best", "engine-best-stop", "engine", "anchor"], "--skip leaves no run to time"),
    ("early_stopping_study.py", ["--patience", "50", "0"], "every --patience must be at least 1"),  # ZeroDivisionError
    ("bench_inversion.py", ["--compile", "--cuda-graph", "true"], "--compile and --cuda-graph true are two ways"),  # after the models
])
def test_bad_benchmark_arguments_are_refused_before_any_work(tmp_path, script, args, message):
    done = subprocess.run([sys.executable, str(BENCHMARKS / script), "--out", str(tmp_path / "r.json"), *args],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and message in done.stderr and not (tmp_path / "r.json").exists(), done.stderr[-1500:]


def test_the_gpu_session_refuses_its_cifar_steps_without_cifar(tmp_path):
    """Without CIFAR-10 the inversion step inverted random images (distances that mean nothing) and measure failed late."""
    done = subprocess.run(["bash", str(BENCHMARKS / "gpu_session.sh"), str(tmp_path / "out"), "inversion"], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "CIFAR_ROOT": str(tmp_path / "nowhere")})
    assert done.returncode == 2 and "no CIFAR-10 at" in done.stderr and "set CIFAR_ROOT" in done.stderr
