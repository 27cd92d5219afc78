"""Notebook 12's exercise: DiLoCo's outer step, its reference against torch's own Nesterov SGD, and the check on
its three paths: not attempted, wrong (plausible slips), right."""

import torch


def test_the_reference_outer_step_is_torchs_nesterov_sgd():
    from commhooks_lab.exercises import communicate_less_often as ex

    theta, ranks = ex._inputs()
    ours = [p.clone() for p in theta]
    theirs = [p.clone().requires_grad_() for p in theta]
    sgd = torch.optim.SGD(theirs, lr=0.7, momentum=0.9, nesterov=True)
    buffers = [torch.zeros_like(p) for p in ours]
    for r in range(3):
        local = [[p - 0.01 * (r + 1) * (k + 1) for p in rank] for k, rank in enumerate(ranks)]
        ex.outer_step(ours, local, buffers)
        for i, p in enumerate(theirs):
            p.grad = sum(p.detach() - rank[i] for rank in local) / len(local)
        sgd.step()
    # Within the exercise's own closeness, not bit for bit: torch's SGD computes Δ + m b and θ - lr g with
    # add(alpha=), which ATen's AVX2 kernels fuse into one rounding (FMA); the reference spells out two.
    assert ex._close(ours, [b.detach() for b in theirs])
    assert not ex._close(ours, [p.clone() for p in theta])  # and it did move


def test_the_outer_step_exercise_on_its_three_paths():
    from commhooks_lab.exercises import NOT_ATTEMPTED, RIGHT, WRONG
    from commhooks_lab.exercises import communicate_less_often as ex

    def summed(global_params, local_params, buffers, lr=0.7, momentum=0.9):  # Δ not divided by the ranks
        for i, (theta, buf) in enumerate(zip(global_params, buffers)):
            delta = sum(theta - rank[i] for rank in local_params)
            buf.mul_(momentum).add_(delta)
            theta.sub_(lr * (delta + momentum * buf))

    def buffer_rebound(global_params, local_params, buffers, lr=0.7, momentum=0.9):
        for i, theta in enumerate(global_params):
            delta = torch.stack([theta - rank[i] for rank in local_params]).mean(0)
            buf = momentum * buffers[i] + delta
            theta -= lr * (delta + momentum * buf)

    def theta_rebound(global_params, local_params, buffers, lr=0.7, momentum=0.9):
        for i, theta in enumerate(global_params):
            delta = torch.stack([theta - rank[i] for rank in local_params]).mean(0)
            buffers[i].mul_(momentum).add_(delta)
            theta = theta - lr * (delta + momentum * buffers[i])

    def scaled(global_params, local_params, buffers, lr=0.7, momentum=0.9):  # no slip the check knows
        ex.outer_step(global_params, local_params, buffers, lr=lr / 2, momentum=momentum)

    def stub(global_params, local_params, buffers, lr=0.7, momentum=0.9):
        raise NotImplementedError

    untried = ex.check_outer_step(stub)
    assert untried.status == NOT_ATTEMPTED and "Nothing later in the notebook depends on it" in untried.message
    assert "The rest of the notebook uses the reference" not in untried.message  # nothing later uses outer_step
    for slip, hint in [
        (ex._variant(ex._averaged_parameters), "local SGD's step"),
        (ex._variant(ex._wrong_sign), "moves away from the ranks"),
        (ex._variant(ex._heavy_ball), "heavy-ball"),
        (ex._variant(ex._no_momentum), "No momentum"),
        (summed, "You summed the pseudo-gradients"),
        (buffer_rebound, "does not carry over"),
        (theta_rebound, "θ_global did not change"),
        (lambda global_params, local_params, buffers, lr=0.7, momentum=0.9: None, "θ_global did not change"),
        (scaled, "θ_global is not the reference's"),
    ]:
        outcome = ex.check_outer_step(slip)
        assert outcome.status == WRONG and hint in outcome.message and outcome.value is ex.outer_step

    def written_differently(global_params, local_params, buffers, lr=0.7, momentum=0.9):
        for i, theta in enumerate(global_params):
            delta = torch.stack([theta - rank[i] for rank in local_params]).mean(0)
            buffers[i] = buffers[i].mul_(momentum).add_(delta)
            theta -= lr * delta + lr * momentum * buffers[i]

    assert ex.check_outer_step(written_differently).status == RIGHT

    def hard_coded(global_params, local_params, buffers, lr=0.7, momentum=0.9):
        ex.outer_step(global_params, local_params, buffers)  # the paper's 0.7 and 0.9, whatever it is given

    outcome = ex.check_outer_step(hard_coded)
    assert outcome.status == WRONG and "use the lr and momentum your function is given" in outcome.message
