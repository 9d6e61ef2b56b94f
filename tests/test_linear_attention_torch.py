"""F.delta_rule and F.gated_delta_rule (chunk and recurrent modes) against torch: the chunked
WY/UT algorithm of flash-linear-attention's naive ``delta_rule_chunkwise`` and a step-by-step
loop (benchmarks/bench_linear_attention.py), in float64 to 1e-10: outputs, final states and
the gradients of q, k, v, beta, g and initial_state, at T a multiple of the chunk size and
not."""

import sys
from pathlib import Path

import numpy as np
import pytest

import nnkit as nk
import nnkit.functional as F

torch = pytest.importorskip("torch")

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from bench_linear_attention import (  # noqa: E402
    torch_delta_rule_chunk,
    torch_delta_rule_recurrent,
    torch_gated_delta_rule_chunk,
    torch_gated_delta_rule_recurrent,
)

CHUNK = 8
TOL = {"rtol": 1e-10, "atol": 1e-10}


def make_problem(seed, batch, heads, T, dk, dv, gated, with_state=True):
    """A stable (gated) delta rule: k L2-normalised, beta in (0, 1), g in [-0.5, 0); plus the
    loss weights r (of o) and rs (of the final state)."""
    rng = np.random.default_rng(seed)
    k = rng.standard_normal((batch, heads, T, dk))
    args = {"q": rng.standard_normal((batch, heads, T, dk)),
            "k": k / np.linalg.norm(k, axis=-1, keepdims=True),
            "v": rng.standard_normal((batch, heads, T, dv)),
            "beta": rng.uniform(0.05, 0.95, (batch, heads, T))}
    if gated:
        args["g"] = -rng.uniform(0.01, 0.5, (batch, heads, T))
    if with_state:
        args["initial_state"] = rng.standard_normal((batch, heads, dk, dv))
    weights = (rng.standard_normal((batch, heads, T, dv)), rng.standard_normal((batch, heads,
                                                                                 dk, dv)))
    return args, weights


def _torch_run(fn, args, weights, scale, **extra):
    leaves = {name: torch.tensor(x, requires_grad=True) for name, x in args.items()}
    o, final = fn(**leaves, scale=scale, output_final_state=True, **extra)
    ((o * torch.tensor(weights[0])).sum() + (final * torch.tensor(weights[1])).sum()).backward()
    grads = {name: x.grad.numpy() for name, x in leaves.items()}
    return o.detach().numpy(), final.detach().numpy(), grads


def _nnkit_run(fn, args, weights, scale, mode):
    leaves = {name: nk.tensor(x, requires_grad=True) for name, x in args.items()}
    o, final = fn(**leaves, scale=scale, output_final_state=True, mode=mode, chunk_size=CHUNK)
    ((o * weights[0]).sum() + (final * weights[1]).sum()).backward()
    return o.numpy(), final.numpy(), {name: x.grad for name, x in leaves.items()}


def _assert_same(ours, theirs, what):
    np.testing.assert_allclose(ours[0], theirs[0], **TOL, err_msg=f"o {what}")
    np.testing.assert_allclose(ours[1], theirs[1], **TOL, err_msg=f"final state {what}")
    assert set(ours[2]) == set(theirs[2])
    for name in theirs[2]:
        np.testing.assert_allclose(ours[2][name], theirs[2][name], **TOL,
                                   err_msg=f"d{name} {what}")


CASES = [  # seed, batch, heads, T, dk, dv
    (0, 2, 3, 24, 5, 4),   # T a multiple of the chunk size
    (1, 1, 2, 29, 4, 6),   # T not
    (2, 2, 1, 5, 3, 3),    # T under one chunk
]


@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("case", CASES)
def test_matches_torch(case, gated):
    seed, *shape = case
    args, weights = make_problem(seed, *shape, gated=gated)
    scale = 0.7
    if gated:
        ours_fn, chunk_fn, loop_fn = (F.gated_delta_rule, torch_gated_delta_rule_chunk,
                                      torch_gated_delta_rule_recurrent)
    else:
        ours_fn, chunk_fn, loop_fn = (F.delta_rule, torch_delta_rule_chunk,
                                      torch_delta_rule_recurrent)
    chunked = _torch_run(chunk_fn, args, weights, scale, chunk_size=CHUNK)
    loop = _torch_run(loop_fn, args, weights, scale)
    _assert_same(chunked, loop, "torch chunk vs torch loop")  # the two references agree
    for mode in ("chunk", "recurrent"):
        ours = _nnkit_run(ours_fn, args, weights, scale, mode)
        _assert_same(ours, chunked, f"{mode} vs torch chunk")
        _assert_same(ours, loop, f"{mode} vs torch loop")


def test_default_scale_and_no_state():
    """scale None is 1/sqrt(dk) on both sides, no initial state is zeros, and without
    output_final_state the state is None."""
    args, weights = make_problem(3, 1, 2, 13, 4, 3, gated=False, with_state=False)
    leaves = {name: torch.tensor(x) for name, x in args.items()}
    expected, none = torch_delta_rule_chunk(**leaves, chunk_size=CHUNK)
    assert none is None
    for mode in ("chunk", "recurrent"):
        o, final = F.delta_rule(**args, mode=mode, chunk_size=CHUNK)
        assert final is None
        np.testing.assert_allclose(o.numpy(), expected.numpy(), **TOL)


def test_references_catch_a_wrong_answer():
    """The comparison can fail: a beta off by 1e-6 at one step moves o past the tolerance."""
    args, weights = make_problem(4, 1, 1, 16, 3, 3, gated=True)
    leaves = {name: torch.tensor(x) for name, x in args.items()}
    expected, _ = torch_gated_delta_rule_chunk(**leaves, chunk_size=CHUNK)
    args["beta"] = args["beta"].copy()
    args["beta"][0, 0, 3] += 1e-6
    o, _ = F.gated_delta_rule(**args, mode="chunk", chunk_size=CHUNK)
    with pytest.raises(AssertionError):
        np.testing.assert_allclose(o.numpy(), expected.numpy(), **TOL)
