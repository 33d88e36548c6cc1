"""Shared fixtures: the device under test, the offline data the tests use, and the optional real CIFAR-10 subset.

The device: ``REPALIGN_TEST_DEVICE=cuda`` (``make test-gpu``) runs the pipelines of the suite on the GPU
(:func:`test_device`); it refuses to start where CUDA is missing rather than silently testing the CPU.
Tests of CUDA-only branches carry the ``gpu`` marker and are skipped where there is no GPU.
"""
from __future__ import annotations

import contextlib
import os
import subprocess
import time
from pathlib import Path
from typing import Callable, Iterable

import pytest
import torch
import torch.utils._python_dispatch
from torch.fx.experimental.proxy_tensor import make_fx

# Tests run on two shared cores; more threads only fight each other.
torch.set_num_threads(min(2, os.cpu_count() or 1))

REPO_ROOT = Path(__file__).resolve().parents[1]
CIFAR_MINI = REPO_ROOT.parent / "shared" / "data" / "cifar-10-mini"
MVH_RAW = REPO_ROOT.parent / "shared" / "data" / "model-vs-human-raw"
TEST_DEVICE = os.environ.get("REPALIGN_TEST_DEVICE", "cpu")


def pytest_configure(config):
    if TEST_DEVICE.startswith("cuda") and not torch.cuda.is_available():
        raise pytest.UsageError(f"REPALIGN_TEST_DEVICE={TEST_DEVICE} (make test-gpu) needs CUDA, and torch sees no GPU here")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA (a gpu test; make test-gpu runs it on a GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# What a CUDA graph cannot hold, caught on the CPU: a Python read of a tensor's value (a host sync on CUDA), at the
# Tensor methods and at the dispatcher (aten._local_scalar_dense is what every scalar read becomes), operators whose
# output shape depends on the values (nonzero, masked_select, unique, boolean-mask indexing), and the error check of
# torch.linalg's inv, cholesky, solve... (aten._linalg_check_errors reads their info tensor on the host). Only a real
# capture on a GPU is the full check (the gpu tests); this proxy runs everywhere.
HOST_READS = ("item", "tolist", "numpy", "cpu", "__bool__", "__float__", "__int__", "__index__")
_DATA_DEPENDENT = ("_local_scalar_dense", "nonzero", "nonzero_static", "masked_select", "_unique2", "unique_dim", "unique_consecutive",
                   "argwhere", "repeat_interleave", "bincount", "_linalg_check_errors")


class _RefuseDataDependentOps(torch.utils._python_dispatch.TorchDispatchMode):
    def __init__(self, what: str):
        super().__init__()
        self.what = what

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        boolean_index = name in ("index", "index_put", "index_put_") and any(
            isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in (args[1] if len(args) > 1 else ()) or ())
        if name in _DATA_DEPENDENT or boolean_index:
            raise AssertionError(f"{self.what} ran aten.{name}{' with a boolean mask' if boolean_index else ''}, which reads tensor "
                                 "values on the host (a sync on CUDA, which a CUDA graph cannot hold)")
        return func(*args, **(kwargs or {}))


def start_two_waiting_jobs(command: list[str], logs: list[Path], waiting: str, cwd: Path | None = None) -> list[subprocess.Popen]:
    """Start ``command`` as two processes (output to ``logs``, one thread each) and return once both have logged
    ``waiting``: two jobs of a sweep held by a lock the caller holds."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    jobs = [subprocess.Popen(command, cwd=cwd, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT) for log in logs]
    deadline = time.monotonic() + 240
    while not all(waiting in log.read_text() for log in logs):
        assert time.monotonic() < deadline and all(job.poll() is None for job in jobs), [log.read_text()[-1500:] for log in logs]
        time.sleep(0.5)
    return jobs


def finished_job_logs(jobs: list[subprocess.Popen], logs: list[Path]) -> list[str]:
    """Wait for ``jobs`` to succeed and return their logs."""
    for job, log in zip(jobs, logs):
        assert job.wait(timeout=300) == 0, log.read_text()[-2000:]
    return [log.read_text() for log in logs]


@contextlib.contextmanager
def refusing_host_reads(what: str = "the step"):
    """Within this block any read of a tensor's value into Python, or a value-dependent shape, raises AssertionError:
    the CPU's proxy for "this code can be captured as a CUDA graph"."""
    def refuse(name):
        def read(self, *args, **kwargs):
            raise AssertionError(f"{what} read a tensor on the host (Tensor.{name})")
        return read

    saved = {name: getattr(torch.Tensor, name) for name in HOST_READS}
    try:
        for name in HOST_READS:
            setattr(torch.Tensor, name, refuse(name))
        with _RefuseDataDependentOps(what):
            yield
    finally:
        for name, method in saved.items():
            setattr(torch.Tensor, name, method)


def record_once(step: Callable[[], None], writes: Iterable[torch.Tensor]) -> Callable[[], None]:
    """The CPU's stand-in for capturing ``step`` as a CUDA graph and replaying it: its tensor operations are recorded
    once (``make_fx``) and the recording is returned, to be replayed on the same tensors in place.

    A recording keeps what a CUDA graph keeps: the operators and the tensors they read and write, with every Python
    number the step computed on the way baked in as a constant (a learning rate passed as a float, a step counter kept
    in Python), so a replay that should have used a new value reuses the old one, as a replayed graph would. Random
    draws stay operators and draw afresh from the default generator at each replay, as a graph advances its generator's
    offset. A replay runs without autograd, as a graph's kernels do (the recording holds the backward's operators).
    Recording runs the step once where a capture runs nothing, so every tensor in ``writes`` (all the step changes in
    place) and the CPU generator's state are put back afterwards.
    """
    writes = list(writes)
    before, generator = [t.detach().clone() for t in writes], torch.get_rng_state()
    recording = make_fx(step)()
    with torch.no_grad():
        for tensor, value in zip(writes, before):
            tensor.copy_(value)
    torch.set_rng_state(generator)

    def replay() -> None:
        with torch.no_grad():
            recording()

    return replay


@pytest.fixture(scope="session")
def test_device() -> str:
    """The device the pipelines under test run on: ``cpu`` (make test) or ``cuda`` (make test-gpu)."""
    return TEST_DEVICE


@pytest.fixture(scope="session")
def cifar_mini_root() -> Path:
    """The real CIFAR-10 subset beside the checkout; skipped cleanly where ../shared is absent."""
    if not (CIFAR_MINI / "cifar-10-batches-py").is_dir():
        pytest.skip(f"real CIFAR-10 subset not found at {CIFAR_MINI}")
    return CIFAR_MINI


def train_digits_model(name: str, *, epochs: int, pgd_steps: int = 0, n_images: int | None = None, dataset: str = "digits", root=None, **kwargs):
    """A zoo model trained with SGD on the embedded digits (seconds to a minute on one core; or ``dataset`` from ``root``),
    frozen, in eval mode. ``pgd_steps`` > 0: PGD adversarial training (Madry et al.) at Linf 8/255, step 2.5 eps / steps,
    random start."""
    import torch.nn.functional as F

    from training import build_model, load_dataset
    from training.attacks import ThreatModel, pgd

    torch.manual_seed(0)
    train = load_dataset(dataset, "train", root=root)
    n = min(n_images or len(train), len(train))
    model = build_model(name, dataset, **kwargs)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    x_all, y_all = train.float_images(slice(0, n)), train.labels[:n]
    threat = ThreatModel("linf", 8 / 255, steps=pgd_steps, step_size=2.5 * 8 / 255 / max(pgd_steps, 1)) if pgd_steps else None
    for _ in range(epochs):
        for index in torch.randperm(n).split(64):
            x, y = x_all[index], y_all[index]
            if threat is not None:
                model.eval()  # the attack sees batch-norm running statistics, as the toolkit's PGD recipe (attack_bn: eval)
                x = pgd(model, x, y, threat)
            model.train()
            optimizer.zero_grad()
            F.cross_entropy(model(x), y).backward()
            optimizer.step()
    return model.eval().requires_grad_(False)


@pytest.fixture(scope="session")
def attack_test_cnn():
    """small_cnn (width 8) trained for 3 epochs of SGD on the embedded digits (seconds on one core), frozen, with the
    digits test split: the model the attack and audit tests attack (``model, test``)."""
    from training import load_dataset

    return train_digits_model("small_cnn", epochs=3, width=8), load_dataset("digits", "test")


@pytest.fixture(scope="session")
def pgd_test_cnn():
    """small_cnn (width 8) PGD-trained (2 steps, Linf 8/255) for 4 epochs on 768 digits training images (~15 s)."""
    return train_digits_model("small_cnn", epochs=4, pgd_steps=2, n_images=768, width=8)


@pytest.fixture(scope="session")
def train_digits():
    """:func:`train_digits_model`, for tests that train a model of their own (e.g. the slow k-WTA audit)."""
    return train_digits_model
