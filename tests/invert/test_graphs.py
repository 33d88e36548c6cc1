"""The capture-or-fall-back decision shared by the engine and the training step, on the CPU: torch.cuda's graph
API is replaced by a recorder, so the paths (captured, failed and strict, failed and lenient) run without a GPU."""
from __future__ import annotations

import contextlib
import logging

import pytest
import torch

from invert.graphs import capture_cuda_graph


class FakeGraph:
    def __init__(self):
        self.replays = 0

    def replay(self):
        self.replays += 1


@pytest.fixture
def fake_cuda(monkeypatch):
    made, synced = [], []

    def new_graph():
        made.append(FakeGraph())
        return made[-1]

    monkeypatch.setattr(torch.cuda, "CUDAGraph", new_graph)
    monkeypatch.setattr(torch.cuda, "graph", lambda graph, stream=None: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: synced.append(device))
    monkeypatch.setattr(torch.cuda, "Stream", lambda device=None: f"stream on {device}")
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    return made, synced


def capture(step, strict, warm_up=None):
    return capture_cuda_graph(step, device=torch.device("cpu"), strict=strict, what="the test step", suspect="the test objective",
                              fix="Set graphs off.", warm_up=warm_up)


def test_a_captured_step_returns_its_replay_after_the_warm_up(fake_cuda):
    made, synced = fake_cuda
    calls = []
    replay = capture(lambda: calls.append("step"), strict=True, warm_up=lambda: calls.append("warm-up"))
    assert calls == ["warm-up", "step"] and len(made) == 1 and not synced
    replay()
    assert made[0].replays == 1


def failing():
    raise RuntimeError("operation not permitted when stream is capturing")


def test_a_failed_capture_names_the_cause_and_the_fix_when_strict(fake_cuda):
    with pytest.raises(RuntimeError, match=r"capturing the test step as a CUDA graph failed \(operation not permitted.*\); "
                                           r"the test objective probably synchronises with the host .*Set graphs off\."):
        capture(failing, strict=True)


def test_errors_that_are_not_capture_failures_keep_their_own_message(fake_cuda, caplog):
    """Every failure was reported as "probably synchronises with the host", a shape bug in the (eager) warm-up or
    running out of memory too."""
    def shape_bug():
        raise RuntimeError("The size of tensor a (1024) must match the size of tensor b (512)")

    def out_of_memory():
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    for strict in (True, False):
        with pytest.raises(RuntimeError, match=r"^The size of tensor a") as raised:
            capture(lambda: None, strict=strict, warm_up=shape_bug)  # the eager loop would meet it too
        assert "synchronises" not in str(raised.value)
    for warm_up, step in ((out_of_memory, lambda: None), (None, out_of_memory)):
        with pytest.raises(torch.OutOfMemoryError):
            capture(step, strict=True, warm_up=warm_up)
        with caplog.at_level(logging.WARNING, logger="invert.graphs"):
            assert capture(step, strict=False, warm_up=warm_up) is None
        assert "out of memory" in caplog.text and "synchronises" not in caplog.text


def test_capture_and_replay_run_on_the_steps_device(monkeypatch, fake_cuda):
    """torch.cuda.graph's default capture stream is made on whichever device was current first: a run on cuda:1 with
    cuda:0 current captured nothing. The capture gets a stream of the run's device, and capture and replay run with
    that device current."""
    entered, streams = [], []

    @contextlib.contextmanager
    def device(d):
        entered.append(d)
        yield

    monkeypatch.setattr(torch.cuda, "device", device)
    monkeypatch.setattr(torch.cuda, "graph", lambda graph, stream=None: streams.append(stream) or contextlib.nullcontext())
    replay = capture_cuda_graph(lambda: None, device=torch.device("cuda", 1), strict=True, what="s", suspect="o", fix="f")
    assert entered == [torch.device("cuda", 1)] and streams == ["stream on cuda:1"]
    replay()
    assert entered == [torch.device("cuda", 1)] * 2 and fake_cuda[0][0].replays == 1


def test_a_failed_capture_falls_back_with_a_warning_when_lenient(fake_cuda, caplog):
    _, synced = fake_cuda
    with caplog.at_level(logging.WARNING, logger="invert.graphs"):
        assert capture(failing, strict=False) is None
    assert synced == [torch.device("cpu")]
    assert "CUDA graph capture of the test step failed (operation not permitted" in caplog.text
