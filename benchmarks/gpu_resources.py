"""Per CUDA kernel and architecture: registers, spills, local memory, shared memory, the
occupancy at nnkit's launch configuration, and the PTX's float64/float32 instructions.

Compiles every kernel of nnkit._ext for every argument-type signature the tests launch it with
(tests/cuda_launch_types.json) with the real CUDA compilers, NVVM and ptxas from pip wheels;
no GPU is needed:

    pip install -e ".[test]"              # numba-cuda[cu12] brings NVVM and ptxas
    python benchmarks/gpu_resources.py    # the Markdown table on stdout
    python benchmarks/gpu_resources.py --json rows.json --jobs 2
    python benchmarks/gpu_resources.py --from-json rows.json --per-signature
    python benchmarks/gpu_resources.py --update-cache     # refresh tests/cuda_audit_cache.json

``--cache FILE`` takes the rows of every launch whose compile key (``_cuda_audit.compile_key``:
the kernel's sources, its argument types, the compilers' versions) FILE holds, and compiles
the rest; ``--update-cache`` writes FILE (default tests/cuda_audit_cache.json) anew with this
run's rows. The tests read that file, so CI compiles only the kernels whose sources or
compilers changed since it was written.

Occupancy is the CUDA occupancy formula (the least of the thread, block, register and shared
memory limits per SM) at the threads per block that nnkit's launcher uses at its default
settings (the largest, where it depends on the shape), with the kernel's static shared memory;
the recurrent kernels' dynamic shared memory (their state, when it fits) is not counted.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIST = ROOT / "tests" / "cuda_launch_types.json"
CACHE = ROOT / "tests" / "cuda_audit_cache.json"


def block_threads(name: str) -> int:
    """Threads per block of kernel ``name`` as nnkit launches it on a GPU, default settings."""
    from nnkit._ext import (
        activation_cuda,
        attention_cuda,
        conv_cuda,
        hopfield_cuda,
        layer_norm_cuda,
        linear_attention_cuda,
        optim_cuda,
        recurrent_cuda,
        scan_cuda,
        selective_scan_cuda,
        softmax_cuda,
    )

    module, _, rest = name.partition(".")
    m = re.match(r"_(forward|dkv|dq)_kernel\((.*)\)$", rest)
    if module == "attention_cuda" and m:  # (dtype, BM, BN, TY, TX, EP, EVP): TY x TX
        args = [a.strip() for a in m.group(2).split(",")]
        return int(args[3]) * int(args[4])
    if module == "scan_cuda":
        return scan_cuda.block if "_kernel(" in rest else scan_cuda.seq_threads
    if module == "layer_norm_cuda":
        return (softmax_cuda.block_max if rest in ("_layer_norm_kernel", "_layer_norm_dx_kernel")
                else layer_norm_cuda.col_threads)
    if module == "hopfield_cuda":
        return (hopfield_cuda.async_threads if rest.startswith("_async") else
                hopfield_cuda.block[0] * hopfield_cuda.block[1])
    threads = {"activation_cuda": activation_cuda.threads, "attention_cuda":
               attention_cuda.row_threads, "conv_cuda": conv_cuda.threads,
               "optim_cuda": optim_cuda.threads, "recurrent_cuda": recurrent_cuda.threads,
               "selective_scan_cuda": selective_scan_cuda.threads,
               "linear_attention_cuda": linear_attention_cuda.threads,
               "softmax_cuda": softmax_cuda.block_max}
    return threads[module]


_SHORT = {"float32": "f32", "float64": "f64", "complex64": "c64", "complex128": "c128",
          "int64": "i64", "int32": "i32", "int8": "i8", "uint64": "u64", "bool": "bool"}


def short_signature(sig) -> str:
    """``array(float32, 2d, C)`` -> ``f32[2C]``; tuples -> ``(f32[1C] x4)``."""
    def one(t):
        t = re.sub(r"array\((\w+), (\d)d, (\w)\)",
                   lambda m: f"{_SHORT.get(m.group(1), m.group(1))}[{m.group(2)}{m.group(3)}]", t)
        t = re.sub(r"UniTuple\((.*) x (\d+)\)", r"(\1 x\2)", t)
        return _SHORT.get(t, t)
    return ", ".join(one(t) for t in sig)


def _storage(sig) -> str:
    """The dtype of a signature's first array: the kernel's storage dtype."""
    for t in sig:
        m = re.search(r"array\((\w+),", t)
        if m:
            return _SHORT.get(m.group(1), m.group(1))
    return "-"


def markdown(rows, per_signature=False) -> str:
    """One line per kernel and storage dtype (``per_signature``: per signature), the largest
    figures over its signatures: each architecture's registers and occupancy; spills, stack
    and shared memory over the architectures; the PTX's f64 / f32 instructions (sm_90)."""
    from nnkit._ext._cuda_audit import occupancy

    groups: dict = {}
    for r in rows:
        sig = tuple(r["signature"])
        key = (r["kernel"], short_signature(sig) if per_signature else _storage(sig))
        groups.setdefault(key, []).append(r)
    ccs = sorted({r["cc"] for r in rows})
    head = ["kernel", "signature" if per_signature else "dtype", "signatures", "threads",
            *(f"regs {c}" for c in ccs), *(f"occ. {c}" for c in ccs), "spill B", "stack B",
            "smem B", "f64 / f32"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (kernel, what), group in sorted(groups.items()):
        threads = block_threads(kernel)
        n_sigs = len({tuple(r["signature"]) for r in group})
        cells = [kernel, what, str(n_sigs), str(threads)]
        errors = sorted({r["error"][:80] for r in group if "error" in r})
        if errors:
            lines.append("| " + " | ".join(cells + ["ERROR: " + "; ".join(errors)]) + " |")
            continue
        regs = {c: max(r["registers"] for r in group if r["cc"] == c) for c in ccs}
        smem = {c: max(r["shared"] for r in group if r["cc"] == c) for c in ccs}
        cells += [str(regs[c]) for c in ccs]
        for c in ccs:
            cc = (int(c[3:-1]), int(c[-1]))
            cells.append(f"{occupancy(cc, threads, regs[c], smem[c]):.0%}")
        last = [r for r in group if r["cc"] == ccs[-1]]
        cells += [str(max(r["spill_stores"] + r["spill_loads"] for r in group)),
                  str(max(r["stack"] for r in group)), str(max(smem.values())),
                  f"{max(r['f64'] for r in last)} / {max(r['f32'] for r in last)}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_cache(path: Path, rows: list[dict], ccs, compile_key) -> None:
    """``rows`` as {compile key: the rows of one kernel and signature} into ``path``."""
    keyed = {}
    for r in rows:
        row = {k: v for k, v in r.items() if k != "cached"}
        keyed.setdefault(compile_key(r["kernel"], tuple(r["signature"]), ccs), []).append(row)
    path.write_text(json.dumps({
        "about": "rows of benchmarks/gpu_resources.py by compile key (the kernel's sources, "
                 "argument types, compute capabilities and compiler versions); regenerate "
                 "with: python benchmarks/gpu_resources.py --update-cache",
        "rows": dict(sorted(keyed.items()))}, indent=0) + "\n")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--list", default=str(LIST), help="the launch-type list (JSON)")
    parser.add_argument("--cc", default="80,89,90", help="compute capabilities, e.g. 80,90")
    parser.add_argument("--jobs", type=int, default=2, help="compiling processes")
    parser.add_argument("--json", help="write the rows here")
    parser.add_argument("--from-json", help="print the table of rows written by --json")
    parser.add_argument("--per-signature", action="store_true",
                        help="a line per signature, not per kernel and dtype")
    parser.add_argument("--kernels", default="",
                        help="only kernels whose names start with this, e.g. softmax_cuda.")
    parser.add_argument("--cache", help="reuse the rows this file holds for unchanged launches")
    parser.add_argument("--update-cache", nargs="?", const=str(CACHE),
                        help=f"write this run's rows as the cache (default {CACHE})")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from tqdm import tqdm

    from nnkit._ext._cuda_audit import audit, compile_key
    from nnkit._ext._launch_types import read_list

    if args.from_json:
        print(markdown(json.loads(Path(args.from_json).read_text()), args.per_signature))
        return 0
    ccs = tuple((int(c[:-1]), int(c[-1])) for c in args.cc.split(","))
    bar = tqdm(total=None, desc="compiling", unit="kernel", file=sys.stderr)

    def progress(done, total):
        bar.total = total
        bar.update(done - bar.n)

    listed = {name: sigs for name, sigs in read_list(args.list).items()
              if name.startswith(args.kernels)}
    cache = json.loads(Path(args.cache).read_text())["rows"] if args.cache else None
    rows = audit(listed, ccs, jobs=args.jobs, progress=progress, cache=cache)
    bar.close()
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    if args.update_cache and not any("error" in r for r in rows):
        write_cache(Path(args.update_cache), rows, ccs, compile_key)
    print(markdown(rows, args.per_signature))
    errors = [r for r in rows if "error" in r]
    for r in errors:
        print(f"{r['kernel']} {r['signature']} {r['cc']}: {r['error']}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
