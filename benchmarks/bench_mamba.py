"""A Mamba language model on the CPU: nnkit's ``MambaForCausalLM`` against transformers' on the
same random weights, each in its own process with the same threads and malloc settings.

Full size (the issue's target): a Mamba-130M-shaped model (24 layers, d_model 768, vocab
50280), forward over one sequence of 2048 tokens (no gradient) and greedy generation of 256
tokens after a 16-token prompt. Target: >= 3x transformers for both. ``--quick``: 2 layers,
d_model 256, 256 tokens, 32 new tokens.

The weights: transformers' initialisation with seed 0, saved with ``save_pretrained`` to a
temporary folder that nnkit's ``from_pretrained`` reads, so both run the same numbers.

    python benchmarks/bench_mamba.py [--quick]
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve()
FULL = dict(num_hidden_layers=24, hidden_size=768, vocab_size=50280, tokens=2048, new=256)
QUICK = dict(num_hidden_layers=2, hidden_size=256, vocab_size=1000, tokens=256, new=32)
PROMPT = 16


def _seconds(fn, repeats):
    """The median of ``repeats`` timed calls after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def _ids(size, vocab):
    import numpy as np

    return np.random.default_rng(1).integers(0, vocab, (1, size))


def _write_checkpoint(folder, size):
    import torch
    from transformers import MambaConfig, MambaForCausalLM

    torch.manual_seed(0)
    config = MambaConfig(num_hidden_layers=size["num_hidden_layers"],
                         hidden_size=size["hidden_size"], vocab_size=size["vocab_size"],
                         eos_token_id=None)
    MambaForCausalLM(config).save_pretrained(folder)


def _worker(library, folder, size, repeats):
    """Print this library's median seconds for the forward and the generation."""
    import numba

    ids, prompt = _ids(size["tokens"], size["vocab_size"]), _ids(PROMPT, size["vocab_size"])
    if library == "torch":
        import torch
        from transformers import MambaForCausalLM

        torch.set_num_threads(numba.get_num_threads())
        model = MambaForCausalLM.from_pretrained(folder).eval()
        ids, prompt = torch.from_numpy(ids), torch.from_numpy(prompt)

        def forward():
            with torch.no_grad():
                model(ids, use_cache=False)

        def generate():
            with torch.no_grad():
                model.generate(prompt, max_new_tokens=size["new"], do_sample=False,
                               min_new_tokens=size["new"])
    else:
        import nnkit as nk
        from nnkit.models import MambaForCausalLM

        model = MambaForCausalLM.from_pretrained(folder)

        def forward():
            with nk.no_grad():
                model(ids)

        def generate():
            model.generate(prompt, max_new_tokens=size["new"], eos_token_id=None)

    print(json.dumps({"fwd": _seconds(forward, repeats), "generate": _seconds(generate,
                                                                               repeats)}))


def _times(library, folder, size, repeats):
    out = subprocess.run([sys.executable, str(HERE), "--worker", library, folder,
                          json.dumps(size), str(repeats)], capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def run(quick: bool = False) -> list[dict]:
    size = QUICK if quick else FULL
    repeats = 3 if quick else 1
    with tempfile.TemporaryDirectory() as folder:
        _write_checkpoint(folder, size)
        ours = _times("nnkit", folder, size, repeats)
        theirs = _times("torch", folder, size, repeats)
    shape = f"{size['num_hidden_layers']} layers, d {size['hidden_size']}"
    return [{"work": f"forward {size['tokens']} tokens ({shape})",
             "nnkit_s": f"{ours['fwd']:.3f}", "transformers_s": f"{theirs['fwd']:.3f}",
             "transformers/nnkit": f"{theirs['fwd'] / ours['fwd']:.1f}"},
            {"work": f"generate {size['new']} tokens ({shape})",
             "nnkit_s": f"{ours['generate']:.3f}", "transformers_s": f"{theirs['generate']:.3f}",
             "transformers/nnkit": f"{theirs['generate'] / ours['generate']:.1f}"}]


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    sys.path.insert(0, str(HERE.parent))
    from harness import report, same_allocator

    same_allocator()  # glibc malloc tuned alike in every process, each contender's worker
    if argv and argv[0] == "--worker":
        _worker(argv[1], argv[2], json.loads(argv[3]), int(argv[4]))
        return
    report(run, argv)


if __name__ == "__main__":
    main()
