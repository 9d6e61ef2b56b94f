"""One backend choice: ``nnkit._backend.kernels_for`` is the only place that picks between
the CPU and the GPU code.

Every module of the nnkit package is parsed (its AST, never imported) and each finding is
reported as ``path:line: what``. The rules:

1. A device test picks code outside ``nnkit/_backend.py``. Device tests: ``backend(...)``
   compared with anything (or used as an index), a comparison with "cuda" or "cpu" (or a
   ``startswith("cuda")``/``startswith("cupy")``), ``_gpu_route(...)``, ``hasattr(x,
   "__cuda_array_interface__")``, an array module compared with NumPy by identity (``xp is
   np``) and ``is_gpu_array(...)``. One picks code in the test of an ``if``, ``while``,
   conditional expression or comprehension, and as a boolean stored, returned or passed on
   (a flag that picks code later). It does not:

   - to validate: the test of an ``if`` whose body only raises (no ``else``), or of an
     ``assert`` (a ``TypeError`` naming the device expected);
   - to word a message: a conditional expression whose two arms are strings;
   - ``is_gpu_array`` only (the one "is this a GPU array" test), to classify or convert:
     ``isinstance(x, np.ndarray) or is_gpu_array(x)`` (an array on either device), or a
     test whose GPU arm only raises, or returns or binds the value unchanged or converted
     on its own device (``asarray``, ``array``, ``copy``, ``ascontiguousarray``,
     ``astype``, ``array_module``): "a GPU array stays as it is, the rest becomes NumPy".

   The CUDA side of ``nnkit._ext`` (``*_cuda.py``, ``_launch.py``, and ``_cuda_audit.py``,
   which compiles the kernels) is below the choice: it tells CuPy arrays, Numba device arrays
   and the simulator's NumPy arrays apart to launch, so rule 1 does not look there.
2. ``cupy``, ``cupyx`` or ``numba.cuda`` is imported outside ``_backend`` and the CUDA side
   of ``nnkit._ext``.
3. ``load_kernels(...)`` is called outside ``_backend`` (``kernels_for`` picks the module).
4. A module above ``nnkit.kernels`` (outside nnkit/kernels and nnkit/_ext) imports from
   ``nnkit._ext``, or a module outside ``nnkit._ext`` imports a ``*_cuda`` module: both
   pick kernels without ``kernels_for``.

``EXCEPTIONS`` lists the functions where a finding is unavoidable, each with its reason;
an exception that no longer matches anything fails too. What the walk cannot see: a branch
on ``isinstance(x, np.ndarray)`` (also how nnkit tells an array from a list) or on a type's
name spelt another way; review catches those.
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "nnkit"
BACKEND = "nnkit/_backend.py"

# (path, function) -> why a finding there is no backend choice
EXCEPTIONS = {
    ("nnkit/nn/module.py", "Module._parse_device"):
        "parses the device the caller names in Module.to('cuda:N'): the caller picks it",
    ("nnkit/nn/module.py", "Module._array_mover"):
        "imports CuPy to put arrays on the GPU the caller named in Module.to",
    ("nnkit/_validation.py", "_needs_device_copy"):
        "which CuPy arrays check_array copies (Numba refuses negative strides): a layout fix",
    ("nnkit/_ext/simd_math.py", "__getattr__"):
        "imports numba.cuda to make the *_dev device functions the *_cuda modules import",
    ("nnkit/cli.py", "_c_kernels_isa"):
        "`nnkit info` reports the compiled C kernels' instruction set; it runs none",
}

CONVERSIONS = {"asarray", "array", "copy", "ascontiguousarray", "astype", "array_module"}
GPU_IMPORTS = ("cupy", "cupyx", "numba.cuda")


def _is_cuda_side(path: str) -> bool:
    return path.startswith("nnkit/_ext/") and (path.endswith("_cuda.py") or path.endswith(
        ("/_launch.py", "/_cuda_audit.py")))


# ----- the walk ----------------------------------------------------------------------------------
def _called(node) -> str | None:
    """The name a call calls: ``f`` for f(...) and for a.b.f(...)."""
    if not isinstance(node, ast.Call):
        return None
    func = node.func
    return func.id if isinstance(func, ast.Name) else \
        func.attr if isinstance(func, ast.Attribute) else None


def _string(node) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) \
        else None


def _names_a_device(node) -> bool:
    """"cuda"/"cpu" (or "cuda:N"), or a tuple/list/set holding one."""
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_names_a_device(e) for e in node.elts)
    text = _string(node)
    return text is not None and (text in ("cuda", "cpu") or text.startswith("cuda:"))


def _device_test(node) -> str | None:
    """What kind of device test ``node`` is, or None."""
    name = _called(node)
    if name == "is_gpu_array":
        return "is_gpu_array(...)"
    if name == "_gpu_route":
        return "_gpu_route(...)"
    if name in ("hasattr", "getattr") and len(node.args) >= 2 and \
            _string(node.args[1]) == "__cuda_array_interface__":
        return 'hasattr(x, "__cuda_array_interface__")'
    if name == "startswith" and node.args and \
            (_string(node.args[0]) or "").startswith(("cuda", "cupy")):
        return f"startswith({_string(node.args[0])!r})"
    if isinstance(node, ast.Subscript) and _called(node.slice) == "backend":
        return "indexing by backend(...)"
    if isinstance(node, ast.Compare):
        operands = [node.left, *node.comparators]
        if any(_called(o) == "backend" for o in operands):
            return "backend(...) compared"
        if any(_names_a_device(o) for o in operands):
            return 'a comparison with "cuda"/"cpu"'
        if any(isinstance(op, (ast.Is, ast.IsNot)) for op in node.ops) and \
                any(isinstance(o, ast.Name) and o.id in ("np", "numpy") for o in operands):
            return "an array module compared with numpy"
    return None


def _only_raises(body) -> bool:
    return bool(body) and all(isinstance(s, ast.Raise) for s in body)


def _is_conversion(node) -> bool:
    """A value left as it is or converted on its own device: names, attributes, constants
    and calls of ``CONVERSIONS`` on them."""
    if node is None or isinstance(node, (ast.Name, ast.Constant)):
        return True
    if isinstance(node, ast.Attribute):
        return _is_conversion(node.value)
    if isinstance(node, ast.IfExp):
        return all(_is_conversion(n) for n in (node.test, node.body, node.orelse))
    if isinstance(node, ast.Call) and _called(node) in CONVERSIONS:
        func_owner = node.func.value if isinstance(node.func, ast.Attribute) else None
        return _is_conversion(func_owner) and all(_is_conversion(a) for a in node.args) and \
            all(_is_conversion(k.value) for k in node.keywords)
    return False


def _converts_only(body) -> bool:
    for s in body:
        if isinstance(s, ast.Raise) or (isinstance(s, ast.If) and _only_raises(s.body)
                                        and not s.orelse):
            continue
        if isinstance(s, (ast.Assign, ast.AnnAssign, ast.Return)) and _is_conversion(s.value):
            continue
        return False
    return True


def _is_ndarray_isinstance(node) -> bool:
    return _called(node) == "isinstance" and len(node.args) == 2 and \
        "ndarray" in ast.dump(node.args[1])


class _Module:
    """One module's AST with parents and enclosing functions."""

    def __init__(self, source: str, path: str):
        self.path = path
        self.tree = ast.parse(source)
        self.parent, self.function = {}, {}
        self._index(self.tree, "")

    def _index(self, node, qualname):
        for child in ast.iter_child_nodes(node):
            self.parent[child] = node
            inner = qualname
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                inner = f"{qualname}.{child.name}" if qualname else child.name
            self.function[child] = inner
            self._index(child, inner)

    def test_root(self, node):
        """(the expression a device test sits in, the number of ``not`` above it)."""
        negations = 0
        while isinstance(self.parent.get(node), (ast.BoolOp, ast.UnaryOp, ast.Compare)):
            node = self.parent[node]
            negations += isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not)
        return node, negations

    def classifies(self, node, root) -> bool:
        """``node`` is or-ed with ``isinstance(x, np.ndarray)``: an array on either device."""
        while node is not root:
            node = self.parent[node]
            if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or) and \
                    any(_is_ndarray_isinstance(v) for v in node.values):
                return True
        return False


def _branch(module: _Module, node, kind: str) -> str | None:
    """Why the device test ``node`` picks code, or None where it does not (rule 1)."""
    root, negations = module.test_root(node)
    holder = module.parent.get(root)
    gpu_only = kind == "is_gpu_array(...)"
    if gpu_only and module.classifies(node, root):
        return None
    if isinstance(holder, ast.Assert):
        return None
    if isinstance(holder, ast.If) and holder.test is root:
        if _only_raises(holder.body) and not holder.orelse:
            return None
        gpu_arm = holder.orelse if negations % 2 else holder.body
        if gpu_only and _converts_only(gpu_arm):
            return None
        return f"{kind} picks the code of an if"
    if isinstance(holder, ast.IfExp) and holder.test is root:
        if _string(holder.body) is not None or isinstance(holder.body, ast.JoinedStr):
            if _string(holder.orelse) is not None or isinstance(holder.orelse, ast.JoinedStr):
                return None
        gpu_arm = holder.orelse if negations % 2 else holder.body
        if gpu_only and _is_conversion(gpu_arm):
            return None
        return f"{kind} picks a conditional expression's value"
    if isinstance(holder, ast.While) and holder.test is root:
        return f"{kind} drives a while loop"
    if isinstance(holder, ast.comprehension) and root in holder.ifs:
        return f"{kind} filters a comprehension"
    return f"{kind} made a flag (stored, returned or passed on)"


def _absolute(module: _Module, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = module.path[:-3].split("/")[:-1]  # nnkit/a/b.py -> ['nnkit', 'a']
    base = package[: len(package) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def _imported(module: _Module, node) -> list[str]:
    """The full module names an import statement brings in."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom):
        source = _absolute(module, node)
        return [source] + [f"{source}.{a.name}" for a in node.names]
    return []


def _import_findings(module: _Module, node) -> list[str]:
    path, names = module.path, _imported(module, node)
    found = []
    if not _is_cuda_side(path) and any(n == g or n.startswith(g + ".")
                                       for n in names for g in GPU_IMPORTS):
        found.append("imports " + next(n for n in names for g in GPU_IMPORTS
                                       if n == g or n.startswith(g + ".")))
    ext = [n for n in names if n.startswith("nnkit._ext.")]
    above = not path.startswith(("nnkit/kernels/", "nnkit/_ext/"))
    if above and ext:
        found.append(f"imports {ext[-1]} above nnkit.kernels")
    elif not path.startswith("nnkit/_ext/") and any(n.endswith("_cuda") for n in ext):
        found.append(f"imports {next(n for n in ext if n.endswith('_cuda'))} directly")
    return found


def findings(source: str, path: str) -> list[tuple[int, str, str]]:
    """(line, function, what) for every device branch of one module's ``source``."""
    if path == BACKEND:
        return []
    module = _Module(source, path)
    out = []
    for node in ast.walk(module.tree):
        where = module.function.get(node, "")
        for what in _import_findings(module, node):
            out.append((node.lineno, where, what))
        if _called(node) == "load_kernels":
            out.append((node.lineno, where, "calls load_kernels (kernels_for picks modules)"))
        kind = None if _is_cuda_side(path) else _device_test(node)
        if kind is not None and (why := _branch(module, node, kind)) is not None:
            out.append((node.lineno, where, why))
    return sorted(set(out))


def _package_modules() -> list[str]:
    return sorted(p.relative_to(ROOT).as_posix() for p in PACKAGE.rglob("*.py"))


def _unexcused(path: str) -> list[str]:
    source = (ROOT / path).read_text()
    return [f"{path}:{line}: {what}" for line, where, what in findings(source, path)
            if (path, where) not in EXCEPTIONS]


# ----- the package -------------------------------------------------------------------------------
@pytest.mark.parametrize("path", _package_modules())
def test_no_device_branch_outside_backend(path):
    problems = _unexcused(path)
    assert not problems, "device branches outside nnkit._backend.kernels_for:\n" + \
        "\n".join(problems)


def test_every_exception_is_still_needed():
    used = set()
    for path in _package_modules():
        source = (ROOT / path).read_text()
        used |= {(path, where) for _line, where, _what in findings(source, path)}
    assert set(EXCEPTIONS) <= used, f"exceptions that match nothing: {set(EXCEPTIONS) - used}"


# ----- the walk itself ---------------------------------------------------------------------------
CAUGHT = {
    "backend compared": """
        if backend(x) == "cuda":
            y = conv_gpu(x)
        """,
    "cpu string": """
        y = fast(x) if device != "cpu" else slow(x)
        """,
    "is_gpu_array picks a kernel": """
        y = _gpu_expit(x) if is_gpu_array(x) else special.expit(x)
        """,
    "is_gpu_array in an if": """
        if is_gpu_array(target):
            cupyx_scatter(target, index, values)
        else:
            np.add.at(target, index, values)
        """,
    "interface probe": """
        if hasattr(x, "__cuda_array_interface__"):
            y = 1
        """,
    "array module identity": """
        xp = array_module(x)
        y = special.expit(x) if xp is np else xp.tanh(x)
        """,
    "a flag": """
        run(x, backend(x) == "cuda")
        """,
    "cupy module name": """
        if not type(data).__module__.startswith("cupy"):
            return False
        """,
    "route": """
        while _gpu_route(x):
            pass
        """,
    "import cupy": """
        import cupy
        """,
    "import numba.cuda": """
        from numba import cuda
        """,
    "load_kernels": """
        module = load_kernels("conv_cpu")
        """,
    "an _ext import above the kernels": """
        from .._ext import scan_cpu
        """,
    "dict by backend": """
        kernels = {"cpu": a, "cuda": b}[backend(x)]
        """,
}

ALLOWED = {
    "validation": """
        if backend(a) != backend(b):
            raise TypeError("a and b must share a device")
        """,
    "validation with is_gpu_array": """
        if is_gpu_array(x) and xp is np:
            raise TypeError("GPU arrays must be CuPy arrays here")
        """,
    "a message": """
        where = "a GPU array" if device == "cuda" else "a NumPy array"
        """,
    "an array on either device": """
        if isinstance(value, np.ndarray) or is_gpu_array(value):
            state[name] = cast(value)
        """,
    "a GPU array stays as it is": """
        ids = ids if is_gpu_array(ids) else np.asarray(ids)
        """,
    "a GPU array converted on its device": """
        if is_gpu_array(data):
            xp = array_module(data)
            arr = xp.asarray(data, dtype=dtype)
            return arr.copy() if copy else arr
        """,
    "the device as a value": """
        dy = check_grad(dy, device=backend(x))
        kernels = kernels_for("softmax_cpu", "softmax_cuda", x)
        """,
}


def _snippet(code: str) -> str:
    return "def f():\n" + textwrap.indent(textwrap.dedent(code), "    ")


@pytest.mark.parametrize("name", list(CAUGHT))
def test_the_walk_catches_device_branches(name):
    found = findings(_snippet(CAUGHT[name]), "nnkit/functional/example.py")
    assert found, f"{name}: not caught"


@pytest.mark.parametrize("name", list(ALLOWED))
def test_the_walk_lets_validation_messages_and_conversions_pass(name):
    assert findings(_snippet(ALLOWED[name]), "nnkit/functional/example.py") == []


def test_backend_and_the_cuda_side_of_ext_may_choose():
    code = _snippet(CAUGHT["backend compared"] + CAUGHT["import cupy"])
    assert findings(code, BACKEND) == []
    assert findings(code, "nnkit/_ext/example_cuda.py") == []
    assert findings(code, "nnkit/_ext/example_cpu.py") != []


# ----- the launchers a CPU/CUDA pair shares --------------------------------------------------
def _module_path(name: str) -> Path:
    if name.startswith("nnkit."):
        return ROOT / (name.replace(".", "/") + ".py")
    return PACKAGE / "_ext" / f"{name}.py"


def _top_level_names(path: Path) -> set[str]:
    """What a module binds at its top level: defs, classes, assignments and imports."""
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def _kernels_for_pairs() -> set[tuple[str, str]]:
    """Every (cpu, cuda) pair that the package hands to ``kernels_for`` (string constants,
    or names of module-level string constants)."""
    pairs = set()
    for path in _package_modules():
        tree = ast.parse((ROOT / path).read_text())
        constants = {t.id: n.value.value for n in tree.body if isinstance(n, ast.Assign)
                     and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)
                     for t in n.targets if isinstance(t, ast.Name)}
        for node in ast.walk(tree):
            if _called(node) == "kernels_for" and len(node.args) >= 2:
                cpu, cuda = (constants.get(a.id) if isinstance(a, ast.Name) else _string(a)
                             for a in node.args[:2])
                if cpu is not None and cuda is not None:
                    pairs.add((cpu, cuda))
    return pairs


def test_every_pair_has_a_launcher_row():
    from nnkit._ext.launchers import LAUNCHERS

    pairs = _kernels_for_pairs()
    assert pairs, "the walk found no kernels_for(cpu, cuda, ...) call"
    assert pairs == set(LAUNCHERS), "nnkit/_ext/launchers.py: one row per CPU/CUDA pair"


@pytest.mark.parametrize("pair", sorted(_kernels_for_pairs()), ids="/".join)
def test_both_modules_of_a_pair_define_its_launchers(pair):
    from nnkit._ext.launchers import LAUNCHERS

    for module in pair:
        missing = set(LAUNCHERS[pair]) - _top_level_names(_module_path(module))
        assert not missing, f"{module} lacks the launchers {sorted(missing)}"
