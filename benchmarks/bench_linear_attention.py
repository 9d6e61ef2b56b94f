"""The delta rule (DeltaNet) at a DeltaNet layer's shapes: nnkit's chunked form
(``F.delta_rule(mode="chunk")``) against nnkit's step-by-step kernel (``mode="recurrent"``),
against the same chunked algorithm written in torch (the WY/UT representation of
flash-linear-attention's naive reference ``delta_rule_chunkwise``, autograd for the backward)
and against a torch loop over the steps.

Shape (batch 4, heads 8, T 4096, dk = dv = 64), float32, k L2-normalised and beta in (0, 1)
as DeltaNet calls it; chunks of 64 steps for both chunked contenders. Forward, and forward +
backward of sum(o * r) for a fixed random r (gradients of q, k, v, beta). Targets: torch
chunk / nnkit chunk >= 3 and nnkit recurrent / nnkit chunk >= 10.

Every contender runs in its own worker process, with numba's thread count (torch set to it)
and glibc malloc tuned alike (harness.same_allocator()). The machine, its CPU and the
instruction sets in use are printed with the figures.

    python benchmarks/bench_linear_attention.py [--quick] [--no-torch] [--modes] [--json PATH]

``--quick`` runs (batch 2, heads 4, T 512, dim 32); ``--no-torch`` times nnkit alone;
``--modes`` times nnkit's two modes at the shapes of ``MODE_SHAPES`` (what ``mode="auto"``
chooses between); ``--json PATH`` writes the machine, the medians and the ratios there.

The torch functions (``torch_delta_rule_chunk``, ``torch_gated_delta_rule_chunk``,
``torch_delta_rule_recurrent``, ``torch_gated_delta_rule_recurrent``) are the references
tests/test_linear_attention_torch.py checks ``F.delta_rule`` and ``F.gated_delta_rule``
against.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve()
SHAPE = (4, 8, 4096, 64)  # batch, heads, T, dk = dv
QUICK_SHAPE = (2, 4, 512, 32)
CHUNK = 64
CONTENDERS = ("nnkit_chunk", "nnkit_recurrent", "torch_chunk", "torch_recurrent")
TARGETS = {"torch_chunk/nnkit_chunk": 3.0, "nnkit_recurrent/nnkit_chunk": 10.0}


def problem(shape, dtype=np.float32, seed=0) -> dict:
    """DeltaNet's arguments: q, k (batch, heads, T, dk) with k L2-normalised, v (batch, heads,
    T, dv), beta = sigmoid(N(0, 1)) (batch, heads, T), and r (batch, heads, T, dv), the fixed
    weights of the loss sum(o * r)."""
    batch, heads, T, dim = shape
    rng = np.random.default_rng(seed)
    k = rng.standard_normal((batch, heads, T, dim))
    args = {"q": rng.standard_normal((batch, heads, T, dim)),
            "k": k / np.linalg.norm(k, axis=-1, keepdims=True),
            "v": rng.standard_normal((batch, heads, T, dim)),
            "beta": 1.0 / (1.0 + np.exp(-rng.standard_normal((batch, heads, T)))),
            "r": rng.standard_normal((batch, heads, T, dim))}
    return {name: x.astype(dtype) for name, x in args.items()}


# ---- the torch references ------------------------------------------------------------------

def _chunks(x, size):
    """(batch, heads, n * size, ...) -> (batch, heads, n, size, ...)."""
    return x.reshape(*x.shape[:2], x.shape[2] // size, size, *x.shape[3:])


def _padded(x, pad):
    """x (batch, heads, T, ...) with ``pad`` zero steps appended (None stays None)."""
    if x is None or pad == 0:
        return x
    import torch

    return torch.cat([x, x.new_zeros((*x.shape[:2], pad, *x.shape[3:]))], dim=2)


def _inverse_unit_lower(attn):
    """(I + A)^{-1} from attn = -A (strictly lower, (..., c, c)) by forward substitution,
    row by row, as flash-linear-attention's ``delta_rule_chunkwise`` computes it."""
    import torch

    size = attn.shape[-1]
    for i in range(1, size):
        attn[..., i, :i] = attn[..., i, :i] + (attn[..., i, :, None].clone()
                                               * attn[..., :, :i].clone()).sum(-2)
    return attn + torch.eye(size, dtype=attn.dtype, device=attn.device)


def torch_gated_delta_rule_chunk(q, k, v, g, beta, scale=None, initial_state=None,
                                 output_final_state=False, chunk_size=CHUNK):
    """The (gated) delta rule, chunked, in torch: the WY/UT representation of
    flash-linear-attention's naive ``delta_rule_chunkwise`` with the per-step decays
    a_t = exp(g_t) of the gated delta rule (g None: the delta rule, that function's exact
    algorithm), any T (padded to whole chunks with steps of k = 0, beta = 0, g = 0).

    Per chunk, with G_t the chunk's cumulative sum of g up to t and S the state entering it:
    U = (I + A)^{-1} (diag(beta) V - diag(beta e^G) K S), A_ts = beta_t k_t.k_s e^(G_t - G_s)
    (s < t); O = scale (diag(e^G) Q S + tril(Q K^T * e^(G_t - G_s)) U);
    S <- e^(G_last) S + (K * e^(G_last - G))^T U.

    Parameters
    ----------
    q, k : torch.Tensor (batch, heads, T, dk)
    v : torch.Tensor (batch, heads, T, dv)
    g : torch.Tensor (batch, heads, T) or None, log-decays
    beta : torch.Tensor (batch, heads, T)
    scale : float or None (1 / sqrt(dk))
    initial_state : torch.Tensor (batch, heads, dk, dv) or None (zeros)
    output_final_state : bool
    chunk_size : int

    Returns
    -------
    o : torch.Tensor (batch, heads, T, dv);  final_state (batch, heads, dk, dv) or None
    """
    import torch

    batch, heads, T, dk = q.shape
    dv = v.shape[-1]
    scale = dk ** -0.5 if scale is None else scale
    pad = -T % chunk_size
    q, k, v, beta, g = (_padded(x, pad) for x in (q, k, v, beta, g))
    q = q * scale
    v = v * beta[..., None]
    k_beta = k * beta[..., None]
    q, k, v, k_beta = (_chunks(x, chunk_size) for x in (q, k, v, k_beta))
    upper = torch.triu(torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=q.device))
    strict = torch.triu(torch.ones(chunk_size, chunk_size, dtype=torch.bool,
                                   device=q.device), diagonal=1)
    attn = k_beta @ k.transpose(-1, -2)
    if g is not None:
        G = _chunks(g, chunk_size).cumsum(-1)  # (batch, heads, n, c)
        decay = (G[..., :, None] - G[..., None, :]).masked_fill(strict, 0).exp()
        attn = attn * decay
        k_beta = k_beta * G.exp()[..., None]
    attn = _inverse_unit_lower(-attn.masked_fill(upper, 0))
    u = attn @ v
    w = attn @ k_beta
    S = k.new_zeros(batch, heads, dk, dv) if initial_state is None else initial_state
    o = torch.zeros_like(v)
    for i in range(q.shape[2]):
        q_i, k_i = q[:, :, i], k[:, :, i]
        qk = q_i @ k_i.transpose(-1, -2)
        if g is not None:
            qk = qk * decay[:, :, i]
            q_i = q_i * G[:, :, i, :, None].exp()
        u_i = u[:, :, i] - w[:, :, i] @ S
        o[:, :, i] = q_i @ S + qk.masked_fill(strict, 0) @ u_i
        if g is not None:
            last = G[:, :, i, -1]
            S = S * last.exp()[..., None, None]
            k_i = k_i * (last[..., None] - G[:, :, i]).exp()[..., None]
        S = S + k_i.transpose(-1, -2) @ u_i
    o = o.reshape(batch, heads, T + pad, dv)[:, :, :T]
    return o, (S if output_final_state else None)


def torch_delta_rule_chunk(q, k, v, beta, scale=None, initial_state=None,
                           output_final_state=False, chunk_size=CHUNK):
    """The delta rule, chunked, in torch (``torch_gated_delta_rule_chunk`` with g None:
    flash-linear-attention's ``delta_rule_chunkwise`` with scale, initial state and any T)."""
    return torch_gated_delta_rule_chunk(q, k, v, None, beta, scale, initial_state,
                                        output_final_state, chunk_size)


def torch_gated_delta_rule_recurrent(q, k, v, g, beta, scale=None, initial_state=None,
                                     output_final_state=False):
    """The (gated) delta rule step by step in torch (flash-linear-attention's naive
    ``delta_rule_recurrence`` with decays): S <- a_t S; S <- S + beta_t k_t (v_t - S^T k_t)^T;
    o_t = scale S^T q_t. Arguments and results as ``torch_gated_delta_rule_chunk``."""
    import torch

    batch, heads, T, dk = q.shape
    scale = dk ** -0.5 if scale is None else scale
    S = q.new_zeros(batch, heads, dk, v.shape[-1]) if initial_state is None else initial_state
    outs = []
    for t in range(T):
        if g is not None:
            S = S * g[:, :, t].exp()[..., None, None]
        k_t = k[:, :, t]
        u_t = (v[:, :, t] - (S * k_t[..., None]).sum(-2)) * beta[:, :, t, None]
        S = S + k_t[..., None] * u_t[..., None, :]
        outs.append((S * (scale * q[:, :, t])[..., None]).sum(-2))
    return torch.stack(outs, dim=2), (S if output_final_state else None)


def torch_delta_rule_recurrent(q, k, v, beta, scale=None, initial_state=None,
                               output_final_state=False):
    """The delta rule step by step in torch (``torch_gated_delta_rule_recurrent``, g None)."""
    return torch_gated_delta_rule_recurrent(q, k, v, None, beta, scale, initial_state,
                                            output_final_state)


# ---- the workers ---------------------------------------------------------------------------

def _median(fn, repeats):
    """Median seconds of ``fn`` over ``repeats`` calls after one warm-up call (harness)."""
    from harness import median_times

    return median_times({"fn": fn}, repeats, warmup=1)["fn"]


def _nnkit_calls(shape, mode):
    import nnkit as nk
    import nnkit.functional as F

    args = problem(shape)
    r = args.pop("r")

    def forward():
        F.delta_rule(**args, mode=mode, chunk_size=CHUNK)

    def both():
        leaves = {name: nk.tensor(x, requires_grad=True) for name, x in args.items()}
        o, _ = F.delta_rule(**leaves, mode=mode, chunk_size=CHUNK)
        (o * r).sum().backward()

    return forward, both


def _torch_calls(shape, name):
    import numba
    import torch

    torch.set_num_threads(numba.get_num_threads())
    args = {key: torch.from_numpy(x) for key, x in problem(shape).items()}
    r = args.pop("r")
    fn = torch_delta_rule_chunk if name == "torch_chunk" else torch_delta_rule_recurrent

    def forward():
        with torch.no_grad():
            fn(**args)

    def both():
        leaves = {key: x.clone().requires_grad_() for key, x in args.items()}
        o, _ = fn(**leaves)
        (o * r).sum().backward()

    return forward, both


def _worker(name, shape, repeats):
    """Print the median seconds of ``name``'s forward and forward + backward as JSON."""
    if name.startswith("nnkit"):
        forward, both = _nnkit_calls(shape, name.split("_")[1])
    else:
        forward, both = _torch_calls(shape, name)
    print(json.dumps({"fwd": _median(forward, repeats), "fwd+bwd": _median(both, repeats)}))


def _times(name, shape, repeats):
    """``name``'s times from its own worker process, or None when it cannot run (torch
    absent)."""
    import importlib.util

    if name.startswith("torch") and importlib.util.find_spec("torch") is None:
        return None
    out = subprocess.run([sys.executable, str(HERE), "--worker", name, json.dumps(shape),
                          str(repeats)], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"the {name} worker failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


# ---- the report ----------------------------------------------------------------------------

def machine() -> dict:
    """The CPU, the instruction sets numba and nnkit's C kernels use here, and the threads."""
    import llvmlite.binding as llvm
    import numba

    from nnkit.cli import _c_kernels_isa

    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "cpus": os.cpu_count(), "numba threads (every contender)":
            numba.get_num_threads(), "numba target": llvm.get_host_cpu_name(),
            "C kernels ISA": _c_kernels_isa()}


def _ratio(times, num, den, work):
    if times.get(num) is None or times.get(den) is None:
        return "n/a"
    return f"{times[num][work] / times[den][work]:.1f}"


def run(quick: bool = False, with_torch: bool = True) -> list[dict]:
    """One row per work (fwd, fwd+bwd): each contender's median ms and the ratios."""
    shape = QUICK_SHAPE if quick else SHAPE
    repeats = {"nnkit_chunk": 3 if quick else 7, "nnkit_recurrent": 3 if quick else 5,
               "torch_chunk": 3, "torch_recurrent": 3 if quick else 1}
    names = CONTENDERS if with_torch else CONTENDERS[:2]
    times = {name: _times(name, shape, repeats[name]) for name in names}
    rows = []
    for work in ("fwd", "fwd+bwd"):
        row = {"work": f"{work} {shape} float32"}
        for name in CONTENDERS:
            row[f"{name} ms"] = ("n/a" if times.get(name) is None
                                 else f"{times[name][work] * 1e3:.1f}")
        for num, den in (("torch_chunk", "nnkit_chunk"), ("nnkit_recurrent", "nnkit_chunk"),
                         ("torch_recurrent", "nnkit_chunk")):
            row[f"{num}/{den}"] = _ratio(times, num, den, work)
        rows.append(row)
    return rows


MODE_SHAPES = [(1, 1, 16384, 64), (1, 4, 2048, 64), (4, 8, 1024, 128), (8, 16, 512, 16)]


def modes() -> list[dict]:
    """nnkit's two modes across shapes (what ``mode="auto"`` chooses between on a CPU)."""
    rows = []
    for shape in MODE_SHAPES:
        times = {name: _times(name, shape, 3) for name in CONTENDERS[:2]}
        for work in ("fwd", "fwd+bwd"):
            rows.append({"work": f"{work} {shape} float32",
                         **{f"{n} ms": f"{times[n][work] * 1e3:.1f}" for n in times},
                         "nnkit_chunk/nnkit_recurrent":
                             f"{times['nnkit_chunk'][work] / times['nnkit_recurrent'][work]:.1f}"})
    return rows


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    sys.path.insert(0, str(HERE.parent))
    from harness import environment, same_allocator

    same_allocator()  # glibc malloc tuned alike in every process, each contender's worker
    if argv and argv[0] == "--worker":
        _worker(argv[1], tuple(json.loads(argv[2])), int(argv[3]))
        return
    from nnkit.tour import format_table

    quick = "--quick" in argv
    env = {**machine(), **environment()}
    print(env)
    if "--modes" in argv:
        rows = modes()
    else:
        rows = run(quick=quick, with_torch="--no-torch" not in argv)
    print(format_table(rows, list(rows[0])))
    print("targets: " + ", ".join(f"{k} >= {v:g}" for k, v in TARGETS.items()))
    if "--json" in argv:
        path = Path(argv[argv.index("--json") + 1])
        path.write_text(json.dumps({"quick": quick, "machine": env, "chunk_size": CHUNK,
                                    "targets": TARGETS, "rows": rows}, indent=1))
        print(f"written to {path}")


if __name__ == "__main__":
    main()
