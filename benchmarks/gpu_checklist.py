"""The whole GPU checklist in one call: the first thing to run whenever an NVIDIA GPU is lent.

    python benchmarks/gpu_checklist.py [--out DIR] [--budget SECONDS] [--smoke]

It installs nothing (it needs what the ``cuda`` and ``test`` extras and torch with CUDA bring)
and runs four steps, each in its own process, so a crash or a hang costs that step only:

1. ``audit``: ``benchmarks/gpu_resources.py`` compiles every listed kernel signature with NVVM
   and ptxas for sm_80/89/90 (registers, spills, occupancy, float64 instructions);
2. ``pytest``: ``python -m pytest -m cuda``, the GPU tests on the device;
3. ``launch``: ``benchmarks/gpu_launch_check.py``, the raw and Numba launch paths computing
   the same, launches per op and the host cost of a launch;
4. ``bench``: ``benchmarks/bench_gpu.py``, the roofs, softmax and layer norm against the copy
   bandwidth, conv and attention against torch, the scan against its memory bound, the
   recurrent layers against cuDNN, training steps (the digits ViT against its torch twin),
   Hopfield recall, Mamba's selective scan against the copy bandwidth and torch's reference,
   and the delta rule (chunked and recurrent) against its chunked form in torch.

DIR (``--out``, default ``gpu-checklist/``) receives each step's own output
(``audit.json``, ``pytest.txt``, ``gpu_launch_check.json``, ``bench_gpu.json``) and the
summary, ``checklist.json`` and ``checklist.md``: each step's status and time, and each
target (``TARGETS``) with the measured figure, met or missed. ``--budget`` (seconds, default
480) is the whole run's: each step stops at its share of what is left, and the benchmarks
run at their full shapes only when their share is at least ``FULL_BENCH_SECONDS``, else at
the quick ones. ``--smoke`` runs on Numba's simulator with the tests' CuPy stand-in at tiny
shapes (one kernel audited, one test file): a check that the checklist works end to end,
not a measurement (tests/test_gpu_stand_in.py runs it).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks"
STAND_IN = ROOT / "tests" / "stand_in"

# Each step's share of the budget left when it starts (normalised over the steps still to run).
SHARES = {"audit": 0.15, "pytest": 0.30, "launch": 0.10, "bench": 0.45}
FULL_BENCH_SECONDS = 600

# (target, bench_gpu section, row key, threshold, what the key measures)
TARGETS = [
    ("recurrent >= 0.5x cuDNN (forward)", "recurrent", "torch/nnkit fwd", 0.5, "ratio"),
    ("recurrent >= 0.5x cuDNN (forward+backward)", "recurrent", "torch/nnkit fwd+bwd", 0.5,
     "ratio"),
    ("SDPA >= 0.5x torch", "attention", "torch/nnkit", 0.5, "ratio"),
    ("conv >= 0.5x torch (forward)", "conv2d", "torch/nnkit fwd", 0.5, "ratio"),
    ("conv >= 0.5x torch (forward+backward)", "conv2d", "torch/nnkit fwd+bwd", 0.5, "ratio"),
    ("softmax and layer norm >= 70% of copy bandwidth", "rows", "pct_of_bandwidth", 70,
     "% of copy"),
    ("scan forward >= 70% of its memory bound", "linear_scan", "fwd_pct_of_bound", 70,
     "% of bound"),
    ("scan backward >= 70% of its memory bound", "linear_scan", "bwd_pct_of_bound", 70,
     "% of bound"),
    ("ViT training step >= 0.5x torch", "steps", "torch/nnkit", 0.5, "ratio"),
]


@dataclass
class Step:
    """One step's command, outcome and summary."""

    name: str
    command: list[str]
    output: str  # the file (in the output folder) the step writes
    status: str = "not run"  # passed | failed | timeout | not run
    seconds: float = 0.0
    summary: dict = field(default_factory=dict)


def steps_for(out: Path, smoke: bool, bench_size: str) -> list[Step]:
    """The four steps' commands (``bench_size``: "full", "quick" or "smoke")."""
    py = sys.executable
    audit = [py, str(BENCH / "gpu_resources.py"), "--json", str(out / "audit.json")]
    audit += (["--kernels", "softmax_cuda._softmax_kernel", "--cc", "90", "--jobs", "1"]
              if smoke else ["--jobs", str(os.cpu_count() or 1)])
    pytest = [py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "cuda"]
    if smoke:
        pytest += ["tests/test_optim_cuda.py", "-k", "test_optimizers_on_gpu"]
    launch = [py, str(BENCH / "gpu_launch_check.py"), "--out", str(out)]
    bench = [py, str(BENCH / "bench_gpu.py"), "--json", str(out / "bench_gpu.json")]
    if bench_size != "full":
        bench.append(f"--{bench_size}")
    if smoke:
        launch.append("--smoke")
    return [Step("audit", audit, "audit.json"), Step("pytest", pytest, "pytest.txt"),
            Step("launch", launch, "gpu_launch_check.json"),
            Step("bench", bench, "bench_gpu.json")]


def child_env(smoke: bool) -> dict:
    """The environment of every step: the checkout first on the path; under ``smoke`` the
    simulator and the CuPy stand-in."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    paths = [str(ROOT)] + ([str(STAND_IN)] if smoke else [])
    env["PYTHONPATH"] = os.pathsep.join(paths + [p for p in [env.get("PYTHONPATH")] if p])
    if smoke:
        env.update(NUMBA_ENABLE_CUDASIM="1", NNKIT_CUPY_STAND_IN="1")
    return env


def run_step(step: Step, out: Path, env: dict, seconds: float) -> str:
    """Run ``step`` for at most ``seconds``; its output goes to DIR/<name>.log. Returns the
    output's tail."""
    log = out / f"{step.name}.log"
    start = time.perf_counter()
    with open(log, "w") as fh:
        print(f"+ {' '.join(step.command)}  (at most {seconds:.0f} s)", flush=True)
        proc = subprocess.Popen(step.command, cwd=ROOT, env=env, stdout=fh,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = proc.wait(timeout=max(seconds, 1))
            step.status = "passed" if rc == 0 else "failed"
            step.summary["exit"] = rc
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)  # the step and its children (pytest's, the compilers)
            proc.wait()
            step.status = "timeout"
    step.seconds = round(time.perf_counter() - start, 1)
    tail = log.read_text(errors="replace")[-20000:]
    print(f"  {step.name}: {step.status} in {step.seconds:.0f} s", flush=True)
    return tail


def _read_json(path: Path):
    """A step's JSON rows, or None when the step wrote none (or something unreadable)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def summarise(step: Step, out: Path, tail: str) -> None:
    """What each step found, in a few numbers (``step.summary``)."""
    if step.name == "pytest":
        (out / step.output).write_text(tail)
        last = tail.strip().splitlines()[-1] if tail.strip() else ""
        counts = {word: int(n) for n, word in re.findall(
            r"(\d+) (passed|failed|errors?|skipped|deselected)", last)}
        step.summary.update(counts, last_line=last[-300:])
        return
    rows = _read_json(out / step.output)
    if not isinstance(rows, list):
        step.summary["rows"] = 0
        return
    rows = [r for r in rows if isinstance(r, dict)]
    step.summary["rows"] = len(rows)
    step.summary["errors"] = sum("error" in r for r in rows)
    if step.summary["errors"] and step.status == "passed":
        step.status = "failed"  # bench_gpu.py goes on past a failing section, exit 0
    if step.name == "audit":
        step.summary["spills or local memory"] = sum(
            bool(r.get("stack") or r.get("spill_stores") or r.get("spill_loads")
                 or r.get("local_in_ptx")) for r in rows)
        step.summary["max registers"] = max((r.get("registers", 0) for r in rows), default=0)
    elif step.name == "launch":
        step.summary["paths disagree"] = sum(r.get("agree") is False for r in rows)


def targets(bench_rows: list[dict] | None) -> list[dict]:
    """Each target with its worst measured figure over the benchmark's rows, met or not."""
    found = []
    for name, section, key, threshold, unit in TARGETS:
        values = [r[key] for r in bench_rows or []
                  if r.get("section") == section and isinstance(r.get(key), (int, float))
                  and (section != "steps" or "vit" in str(r.get("case", "")).lower())]
        worst = min(values) if values else None
        found.append({"target": name, "threshold": threshold, "unit": unit,
                      "worst": worst, "rows": len(values),
                      "status": "not measured" if worst is None else
                      ("met" if worst >= threshold else "missed")})
    return found


def markdown(report: dict) -> str:
    """The summary a person reads: the steps, then the targets."""
    lines = [f"# GPU checklist: {report['device']}", "",
             f"{report['started']}; budget {report['budget_s']:.0f} s, benchmarks at "
             f"'{report['bench_size']}' shapes; {report['seconds']:.0f} s in all.", "",
             "| step | status | seconds | summary |", "|---|---|---|---|"]
    for step in report["steps"]:
        summary = ", ".join(f"{k} {v}" for k, v in step["summary"].items() if k != "last_line")
        lines.append(f"| {step['name']} | {step['status']} | {step['seconds']:.0f} | "
                     f"{summary} |")
    lines += ["", "| target | worst measured | rows | status |", "|---|---|---|---|"]
    for t in report["targets"]:
        worst = "-" if t["worst"] is None else f"{t['worst']:.3g} {t['unit']}"
        lines.append(f"| {t['target']} | {worst} | {t['rows']} | {t['status']} |")
    lines += ["", "Each step's output: " + ", ".join(
        f"`{s['output']}` (log `{s['name']}.log`)" for s in report["steps"]) + "."]
    return "\n".join(lines) + "\n"


def device_name(smoke: bool) -> str:
    if smoke:
        return "CuPy stand-in under Numba's CUDA simulator (a smoke run, not a measurement)"
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run([smi, "--query-gpu=name,driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=30).stdout.strip()
            if out:
                return out.splitlines()[0]
        except (OSError, subprocess.SubprocessError):
            pass
    return "unknown GPU (nvidia-smi not found)"


def run(out: Path, budget: float, smoke: bool) -> dict:
    """Every step in order within ``budget`` seconds; writes and returns the report."""
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    bench_share = budget * SHARES["bench"]
    bench_size = "smoke" if smoke else ("full" if bench_share >= FULL_BENCH_SECONDS else
                                        "quick")
    steps = steps_for(out, smoke, bench_size)
    for i, step in enumerate(steps):
        left = budget - (time.perf_counter() - start)
        share = SHARES[step.name] / sum(SHARES[s.name] for s in steps[i:])
        env = child_env(smoke and step.name != "audit")  # the compilers need no simulator
        summarise(step, out, run_step(step, out, env, left * share))
    report = {"device": device_name(smoke), "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
              "budget_s": budget, "bench_size": bench_size,
              "seconds": round(time.perf_counter() - start, 1),
              "steps": [asdict(s) for s in steps],
              "targets": targets(_read_json(out / "bench_gpu.json"))}
    (out / "checklist.json").write_text(json.dumps(report, indent=1, default=str))
    (out / "checklist.md").write_text(markdown(report))
    return report


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="gpu-checklist", help="the folder for the results")
    parser.add_argument("--budget", type=float, default=480, help="seconds for the whole run")
    parser.add_argument("--smoke", action="store_true",
                        help="the simulator and the CuPy stand-in, tiny shapes (a check)")
    args = parser.parse_args(argv)
    if args.budget <= 0:
        parser.error(f"--budget must be positive seconds, got {args.budget}")
    report = run(Path(args.out), args.budget, args.smoke)
    print((Path(args.out) / "checklist.md").read_text())
    return 0 if all(s["status"] == "passed" for s in report["steps"]) else 1


if __name__ == "__main__":
    sys.exit(main())
