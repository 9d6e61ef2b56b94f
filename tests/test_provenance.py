"""Provenance in the code: the two source texts cited one way, no work history, no speeds.

The formulas come from two texts, named once in ``nnkit/__init__.py`` (``NOTES``,
``APPENDIX``) and in the README's "Sources"; everywhere else they are cited by section:
"notes §5.2" (or "notes §4.1, Theorem 4.6"), "appendix eq. E.B.2", "appendix fig. F.B.3".
Comments and docstrings state facts, not the piece of work that found them ("stop 14",
"issue 9", "the second session", a date), and measured speeds live in benchmarks/RESULTS.md,
which the code names by section heading. Design constants (a threshold, a size, a default)
stay in the code, and the speed patterns leave them alone.

The scan reads every line (comments, docstrings, strings) of nnkit's sources (.py, .pyx,
.h); the citation and history rules also cover examples/, benchmarks/*.py and tests/
(benchmarks/RESULTS.md, the history, is not scanned).
"""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# A reference to the notes not in the "notes §5.2" style: "the notes", "the notes'", "the
# lecture notes", "(notes, section 6.5)", "section 4.2 of the notes", "notes 2.5". The
# numpydoc header "Notes" (alone on its line), names such as ``_notes_adam`` or ``NOTES``
# and the title in ``NOTES`` ("notes on the lecture course") are not references.
_NOTES = re.compile(r"\b[Nn]otes\b(?! §\d)(?! on the lecture course)")
_NUMPYDOC_HEADER = re.compile(r"^\s*Notes\s*$")

CITATION_RULES = {
    "notes not cited as 'notes §N.M'": _NOTES,
    "appendix equation not cited as 'appendix eq. E.B.N'": re.compile(
        r"(?<![Aa]ppendix eq\. )\bE\.B\.\d"),
    "appendix figure not cited as 'appendix fig. F.B.N'": re.compile(
        r"(?<![Aa]ppendix fig\. )\bF\.B\.\d"),
    "the appendix cited as 'the book appendix'": re.compile(r"\bbook appendix\b", re.I),
}

HISTORY_RULES = {
    "a work stop cited ('stop 14')": re.compile(r"\bstops? \d+", re.I),
    "an issue cited ('issue 9')": re.compile(r"\bissues? #?\d+", re.I),
    "an issue item cited ('item 5')": re.compile(r"\bitems? \d+\b", re.I),
    "a work session cited": re.compile(
        r"\b(first|second|third|this|that|last|previous|next|earlier|later) session\b", re.I),
    "a dated run": re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b"),
}

# Measured speeds: times below a second, throughputs, "3x faster", "~15% slower", "loses
# 2.7-12x". A figure on a line that says it is a default, threshold, limit or budget is a
# design constant, not a measurement.
_NUMBER = r"~?\d+(\.\d+)?(-\d+(\.\d+)?)?"
SPEED_RULES = {
    "a measured time": re.compile(_NUMBER + r"\s?(ms|us|µs|ns)\b"),
    "a measured throughput": re.compile(r"\d\s?(GFLOP/s|Gflop/s|GB/s|MB/s)"),
    "a measured speed ratio": re.compile(
        _NUMBER + r"\s?x (faster|slower|the time|than torch)\b"
        r"|\b(faster|slower|lose|loses|lost)( by)? (about )?" + _NUMBER + r"x\b"),
    "a measured percentage": re.compile(
        _NUMBER + r"\s?% (faster|slower|less time|more time|of the (forward|backward|step))"),
}
_DESIGN_CONSTANT = re.compile(r"\b(default|threshold|limit|budget|timeout)\b", re.I)


def scan_lines(lines, rules, path="<text>", allow=None):
    """['path:line: what (text)', ...] for each line that matches one of ``rules``."""
    found = []
    for number, line in enumerate(lines, 1):
        if _NUMPYDOC_HEADER.match(line) or (allow is not None and allow.search(line)):
            continue
        for what, pattern in rules.items():
            if pattern.search(line):
                found.append(f"{path}:{number}: {what} ({line.strip()[:90]})")
    return found


def _scan(paths, rules, allow=None):
    found = []
    for path in paths:
        lines = path.read_text(encoding="utf-8").splitlines()
        found += scan_lines(lines, rules, path.relative_to(ROOT).as_posix(), allow)
    return found


def _package_sources():
    return sorted(p for p in (ROOT / "nnkit").rglob("*")
                  if p.suffix in (".py", ".pyx", ".h") and p.is_file())


def _other_sources():
    paths = [*(ROOT / "examples").rglob("*.py"), *(ROOT / "benchmarks").glob("*.py"),
             *(ROOT / "tests").rglob("*.py")]
    return sorted(p for p in paths if p.resolve() != Path(__file__).resolve())


def _report(found):
    return f"{len(found)} place(s):\n" + "\n".join(found)


def test_the_package_cites_its_sources_one_way_and_keeps_no_history():
    found = _scan(_package_sources(), {**CITATION_RULES, **HISTORY_RULES})
    assert not found, _report(found)


def test_the_package_leaves_measured_speeds_to_results_md():
    found = _scan(_package_sources(), SPEED_RULES, allow=_DESIGN_CONSTANT)
    assert not found, _report(found)


def test_examples_benchmarks_and_tests_cite_sources_one_way_and_keep_no_history():
    found = _scan(_other_sources(), {**CITATION_RULES, **HISTORY_RULES})
    assert not found, _report(found)


def test_the_results_md_sections_the_package_names_exist():
    """Each ``benchmarks/RESULTS.md, "Heading"`` in the package names the start of a heading of
    that file (comment markers dropped and lines joined, so a citation may wrap)."""
    results = (ROOT / "benchmarks" / "RESULTS.md").read_text(encoding="utf-8").splitlines()
    headings = [line.lstrip("#").strip() for line in results if line.startswith("#")]
    cited, missing = 0, []
    for path in _package_sources():
        lines = path.read_text(encoding="utf-8").splitlines()
        text = " ".join(line.strip().lstrip("#*/").strip() for line in lines)
        for match in re.finditer(r'RESULTS\.md[,:]?\s*((?:"[^"]+"(?:,\s*|\s+and\s+)?)+)', text):
            for name in re.findall(r'"([^"]+)"', match.group(1)):
                cited += 1
                if not any(heading.startswith(name) for heading in headings):
                    missing.append(f"{path.relative_to(ROOT).as_posix()}: {name!r}")
    assert cited > 0 and not missing, missing


def test_the_sources_are_named_once_in_the_package():
    import nnkit

    assert "Perez Jensen" in nnkit.NOTES and "Scardapane" in nnkit.APPENDIX
    named = [p for p in _package_sources()
             if re.search(r"Perez Jensen|Scardapane", p.read_text(encoding="utf-8"))]
    assert [p.relative_to(ROOT).as_posix() for p in named] == ["nnkit/__init__.py"]


# ---- the scanner itself: bad snippets are caught, good ones pass ------------------------------
BAD = [
    ("the notes' thresholds are -b", "notes not cited"),
    ("The lecture notes write theta = -b.", "notes not cited"),
    ("(section 1.4 of the notes)", "notes not cited"),
    ("BERT (notes, section 6.5)", "notes not cited"),
    ("regions of ReLU networks (notes 2.5)", "notes not cited"),
    ("a bin (E.B.2), equal to a on the bin", "appendix equation"),
    ("next to the Figure F.B.3 caption", "appendix figure"),
    ("the book appendix's construction", "the book appendix"),
    ("# the reverse scan ran 4x slower since stop 15", "a work stop"),
    ("Target (issue 9): nnkit at least as fast", "an issue cited"),
    ("# ----- item 5: image preprocessing", "an issue item"),
    ("measured in the second session", "a work session"),
    ("measured on 2026-11-23", "a dated run"),
]
BAD_SPEEDS = [
    ("# (waking numba's pool costs ~10-30 us).", "a measured time"),
    ("0.3 ms pause", "a measured time"),
    ("~200-220 GFLOP/s a core", "a measured throughput"),
    ("runs about 3x faster than NumPy's ufuncs", "a measured speed ratio"),
    ("the product ran 1.5-6x slower with 2 BLAS threads", "a measured speed ratio"),
    ("the chunks on two threads lose 2.7-12x at (1, 10^7, 1)", "a measured speed ratio"),
    ("made the LSTM cell ~15% faster", "a measured percentage"),
    ("a step took 7-21% less time", "a measured percentage"),
]
GOOD = [
    "The margin of notes §1.2, gamma[w, b](S) = min_i y_i (w^T x_i + b) / ||w||.",
    "(notes §1.4, whose thresholds are -b)",
    "(notes §4.1, Theorem 4.6)",
    "(notes §1.2, §1.4 and §2.5)",
    "    Notes",
    "def _notes_adam(grad, theta0):",
    "NOTES = ('C. Perez Jensen, ...')",
    "a bin (appendix eq. E.B.2), see appendix fig. F.B.3",
    "it stops after the first pass without a mistake",
    "the reverse scan ran several times slower (benchmarks/RESULTS.md, \"Linear recurrences\")",
    "2 s n operations instead of n^2",
    "a ViT (2x2 patches of the 8x8 digits)",
    "max(30 s, 10 x the median seconds of the last 20 steps)",
    "15% of the non-special tokens, of which 80% become [MASK]",
]


@pytest.mark.parametrize("text, what", BAD)
def test_the_scanner_catches_a_bad_citation(text, what):
    found = scan_lines(["ok line", text], {**CITATION_RULES, **HISTORY_RULES}, "bad.py")
    assert len(found) == 1 and found[0].startswith("bad.py:2: ") and what in found[0], found


@pytest.mark.parametrize("text, what", BAD_SPEEDS)
def test_the_scanner_catches_a_measured_speed(text, what):
    found = scan_lines([text], SPEED_RULES, "bad.py", allow=_DESIGN_CONSTANT)
    assert found and found[0].startswith("bad.py:1: ") and what in found[0], found


@pytest.mark.parametrize("text", GOOD)
def test_the_scanner_leaves_good_lines_alone(text):
    rules = {**CITATION_RULES, **HISTORY_RULES, **SPEED_RULES}
    assert scan_lines([text], rules, allow=_DESIGN_CONSTANT) == []


def test_a_design_constant_is_not_a_measurement():
    line = "(For benchmarks/bench_conv_threads.py; the default is 100 us.)"
    assert scan_lines([line], SPEED_RULES, allow=_DESIGN_CONSTANT) == []
    assert scan_lines([line], SPEED_RULES) != []
