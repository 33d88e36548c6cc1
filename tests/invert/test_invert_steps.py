"""Steppers and projections: norms respected, per-sample, zero-gradient safe, reproducible."""
from __future__ import annotations

import pytest
import torch

from invert.steps import (
    Adam,
    L2Step,
    LinfStep,
    ScheduledStep,
    clamp01,
    make_stepper,
    per_sample_norm,
    project_l2,
    project_linf,
    random_start_l2,
    random_start_linf,
    select_state,
)


def test_l2_step_moves_each_sample_by_step_size_against_the_gradient():
    x = torch.rand(4, 3, 8, 8)
    grad = torch.randn(4, 3, 8, 8) * torch.tensor([1e-6, 1.0, 10.0, 1e4]).view(-1, 1, 1, 1)
    new = L2Step(0.5).step(x, grad, {})
    torch.testing.assert_close(per_sample_norm(new - x), torch.full((4,), 0.5))
    cosine = torch.nn.functional.cosine_similarity((new - x).flatten(1), grad.flatten(1))
    torch.testing.assert_close(cosine, -torch.ones(4))


def test_l2_step_accepts_per_sample_step_sizes_and_channels_last():
    x = torch.rand(3, 3, 8, 8).contiguous(memory_format=torch.channels_last)
    grad = torch.randn(3, 3, 8, 8).contiguous(memory_format=torch.channels_last)
    sizes = torch.tensor([0.1, 1.0, 2.0])
    new = L2Step(sizes).step(x, grad, {})
    torch.testing.assert_close(per_sample_norm(new - x), sizes)


def test_a_one_dimensional_batch_is_n_samples_of_one_number():
    x = torch.tensor([3.0, -4.0])
    torch.testing.assert_close(per_sample_norm(x), torch.tensor([3.0, 4.0]))  # not the batch's norm, 5
    torch.testing.assert_close(L2Step(1.0).step(torch.zeros(2), x, {}), torch.tensor([-1.0, 1.0]))
    torch.testing.assert_close(project_l2(x, torch.zeros(2), 1.0), torch.tensor([1.0, -1.0]))


def test_zero_gradient_gives_zero_step_not_nan():
    x = torch.rand(2, 3, 4, 4)
    grad = torch.zeros_like(x)
    grad[1] = 1.0
    for stepper in (L2Step(1.0), LinfStep(0.1), Adam(0.1)):
        new = stepper.step(x, grad, stepper.init_state(x))
        assert torch.isfinite(new).all(), type(stepper).__name__
        torch.testing.assert_close(new[0], x[0])
        assert not torch.allclose(new[1], x[1])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_zero_gradient_gives_zero_step_in_half_precision(dtype):
    """1e-12 is 0 in float16: a zero gradient (a confident sample's, underflowed) stepped by 0 / 0 = NaN, as did the
    projection of a zero perturbation and a zero random direction."""
    x = torch.rand(2, 3, 4, 4).to(dtype)
    grad = torch.zeros_like(x)
    grad[1] = 1.0
    new = L2Step(0.5).step(x, grad, None)
    assert torch.isfinite(new).all() and torch.equal(new[0], x[0])
    assert per_sample_norm((new - x)[1:].float()).item() == pytest.approx(0.5, rel=1e-2)
    assert torch.equal(project_l2(x, x, 1.0), x)


def test_linf_step_is_a_sign_step():
    x = torch.rand(2, 3, 4, 4)
    grad = torch.randn_like(x)
    new = LinfStep(0.03).step(x, grad, {})
    torch.testing.assert_close(new - x, -0.03 * grad.sign())


def test_adam_matches_torch_optim_adam_per_sample():
    torch.manual_seed(0)
    x = torch.rand(3, 2, 4, 4)
    stepper = Adam(lr=0.05, betas=(0.8, 0.99), eps=1e-6)
    state = stepper.init_state(x)
    references = [x[i : i + 1].clone().requires_grad_(True) for i in range(3)]
    optimisers = [torch.optim.Adam([p], lr=0.05, betas=(0.8, 0.99), eps=1e-6) for p in references]
    for _ in range(5):
        grad = torch.randn_like(x) * torch.tensor([1e-3, 1.0, 100.0]).view(-1, 1, 1, 1)
        x = stepper.step(x, grad, state)
        for i, (p, optimiser) in enumerate(zip(references, optimisers)):
            p.grad = grad[i : i + 1].clone()
            optimiser.step()
    torch.testing.assert_close(x, torch.cat([p.detach() for p in references]), rtol=1e-5, atol=1e-6)


def test_adam_state_subset_continues_like_the_full_batch():
    x = torch.rand(4, 3, 4, 4)
    stepper = Adam(0.1)
    state = stepper.init_state(x)
    grads = [torch.randn_like(x) for _ in range(4)]
    full = x
    for g in grads:
        full = stepper.step(full, g, state)
    part, part_state = x, stepper.init_state(x)
    for i, g in enumerate(grads):
        if i == 2:  # drop samples 0 and 2 half-way, as the engine's compaction does
            keep = torch.tensor([1, 3])
            part, part_state = part[keep], select_state(part_state, keep)
        part = stepper.step(part, g if i < 2 else g[torch.tensor([1, 3])], part_state)
    torch.testing.assert_close(part, full[torch.tensor([1, 3])])


def test_project_l2_respects_per_sample_radii_and_keeps_inside_points():
    center = torch.rand(4, 3, 8, 8)
    x = center + torch.randn_like(center) * torch.tensor([1e-3, 1.0, 5.0, 0.0]).view(-1, 1, 1, 1)
    eps = torch.tensor([0.5, 0.5, 2.0, 0.5])
    projected = project_l2(x, center, eps)
    norms = per_sample_norm(projected - center)
    assert (norms <= eps + 1e-5).all()
    torch.testing.assert_close(projected[0], x[0])  # inside: unchanged
    torch.testing.assert_close(projected[3], center[3])  # at the centre: no NaN
    torch.testing.assert_close(norms[1:3], eps[1:3])  # outside: onto the sphere
    scalar = project_l2(x, center, 0.5)
    assert (per_sample_norm(scalar - center) <= 0.5 + 1e-5).all()


def test_project_linf_clips_each_entry():
    center = torch.rand(2, 3, 4, 4)
    x = center + torch.randn_like(center)
    projected = project_linf(x, center, torch.tensor([0.1, 0.3]))
    assert ((projected - center).abs().amax(dim=(1, 2, 3)) <= torch.tensor([0.1, 0.3]) + 1e-6).all()
    torch.testing.assert_close(project_linf(x, center, 0.2), center + (x - center).clamp(-0.2, 0.2))


def test_random_start_l2_is_uniform_in_the_ball_and_reproducible():
    x = torch.zeros(20000, 1, 1, 2)  # d = 2: P(radius < eps / 2) = 1/4 for a uniform draw in the disc
    start = random_start_l2(x, 2.0, generator=torch.Generator().manual_seed(0))
    radii = per_sample_norm(start)
    assert radii.max() <= 2.0 + 1e-6
    assert abs((radii < 1.0).float().mean().item() - 0.25) < 0.02
    again = random_start_l2(x, 2.0, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(start, again)
    per_item = random_start_l2(torch.zeros(3, 3, 8, 8), torch.tensor([0.1, 1.0, 10.0]))
    assert (per_sample_norm(per_item) <= torch.tensor([0.1, 1.0, 10.0]) + 1e-5).all()


def test_random_start_linf_stays_in_the_box():
    start = random_start_linf(torch.full((8, 3, 4, 4), 0.5), 0.1, generator=torch.Generator().manual_seed(1))
    assert ((start - 0.5).abs() <= 0.1 + 1e-7).all()
    assert (start - 0.5).abs().max() > 0.09  # it does use the box


def test_clamp01():
    torch.testing.assert_close(clamp01(torch.tensor([-1.0, 0.5, 2.0])), torch.tensor([0.0, 0.5, 1.0]))


def test_error_messages():
    with pytest.raises(ValueError, match="unknown stepper 'sgd'.*adam.*l2.*linf"):
        make_stepper("sgd", 0.1)
    with pytest.raises(ValueError, match=r"per-sample value must have shape \(4,\)"):
        L2Step(torch.ones(3)).step(torch.rand(4, 3, 2, 2), torch.rand(4, 3, 2, 2), {})
    assert isinstance(make_stepper("adam", 0.01), Adam) and make_stepper("adam", 0.01).lr == 0.01


@pytest.mark.parametrize("schedule", ["cosine", "linear"])
def test_scheduled_l2_steps_decay_from_step_size_and_sum_to_its_closed_form(schedule):
    # Under a constant gradient the L2 steps are collinear: after T steps x moved by eta * sum_t f(t / T), which is
    # eta * (T + 1) / 2 for both cosine (sum_t cos(pi t / T) = 1) and linear decay.
    steps, eta = 20, 0.01
    stepper = make_stepper("l2", eta, schedule=schedule, total_steps=steps)
    x0 = torch.rand(3, 3, 4, 4)
    grad = torch.randn_like(x0)
    x, state, sizes = x0, stepper.init_state(x0), []
    for _ in range(steps):
        new = stepper.step(x, grad, state)
        sizes.append(per_sample_norm(new - x))
        x = new
    torch.testing.assert_close(sizes[0], torch.full((3,), eta))
    assert all((later < earlier).all() for earlier, later in zip(sizes, sizes[1:]))
    torch.testing.assert_close(per_sample_norm(x - x0), torch.full((3,), eta * (steps + 1) / 2))
    torch.testing.assert_close(state["schedule_count"], torch.full((3,), float(steps)))


def test_a_scheduled_state_subset_continues_like_the_full_batch():
    stepper = make_stepper("adam", 0.05, schedule="cosine", total_steps=10)
    assert isinstance(stepper, ScheduledStep)
    x = torch.rand(4, 2, 3, 3)
    grad = torch.randn_like(x)
    state = stepper.init_state(x)
    for _ in range(3):
        x = stepper.step(x, grad, state)
    keep = torch.tensor([1, 3])
    subset = select_state({key: value.clone() for key, value in state.items()}, keep)
    full = stepper.step(x, grad, state)
    torch.testing.assert_close(stepper.step(x[keep], grad[keep], subset), full[keep])


def test_constant_schedule_is_the_plain_stepper_and_bad_schedules_are_named():
    assert make_stepper("l2", 1.0, schedule="constant") == L2Step(1.0)
    with pytest.raises(ValueError, match="unknown step schedule 'step'; choose one of \\['constant', 'cosine', 'linear'\\]"):
        make_stepper("l2", 1.0, schedule="step", total_steps=5)
    with pytest.raises(ValueError, match="the 'cosine' step schedule needs total_steps >= 1"):
        make_stepper("l2", 1.0, schedule="cosine")


@pytest.mark.parametrize("name", ["adam", "l2"])
def test_the_step_counts_keep_counting_past_256_on_a_bf16_iterate(name):
    """bf16 holds integers exactly only up to 256 (256 + 1 rounds back to 256): the per-sample counts that drive Adam's
    bias correction and the schedule are float32 whatever the iterate's dtype, so a bf16 run decays to the end."""
    steps = 300
    stepper = make_stepper(name, 0.05, schedule="linear", total_steps=steps)
    x = torch.rand(2, 3, 4, 4).to(torch.bfloat16)
    grad = torch.randn_like(x)
    state = stepper.init_state(x)
    for _ in range(steps):
        x = stepper.step(x, grad, state)
    assert x.dtype == torch.bfloat16
    counts = [state[key] for key in ("count", "schedule_count") if key in state]
    assert counts and all(count.dtype == torch.float32 and count.tolist() == [steps, steps] for count in counts)
