"""``nk.save`` / ``nk.load``: modules, estimators, optimizers and checkpoints in one file.

One safetensors file (see ``nnkit._safetensors``): the arrays as tensors, and in its metadata
under the key ``"nnkit"`` a JSON config that says how to rebuild the object — the module
class and its constructor arguments, an estimator's parameters, an optimizer's
hyper-parameters, the format version, each tensor's dtype, shape and CRC32, and a CRC32 of
the config itself. Nothing is pickled, and a class
name from the file is only ever a key into a table: nnkit's public modules, optimizers and
estimators (``_nnkit_classes``), and the classes passed to ``load(..., classes=...)``. Any
other name is refused before anything is imported, built or called.

What can be saved (nested freely inside dicts, lists and tuples, which is how a checkpoint
looks: ``{"model": m, "optimizer": opt, "rng": rng, "step": 100}``):

- ``nn.Module``: class + constructor arguments (recorded when it was built) + ``state_dict``.
  ``Sequential``/``ModuleList`` are saved by their children, so modules appended later come
  back too. Sub-modules given as constructor arguments (``Residual(fn)``,
  ``TransformerEncoder(layer, n)``) are saved by class and arguments only: their tensors are
  those of the outer module's ``state_dict``. So the tensors of ``nk.save(model, path)`` are
  named exactly by ``model.state_dict()`` keys, and the file is a plain state dict for any
  safetensors reader (in a checkpoint, ``"model/0.weight"``: the place in the checkpoint, a
  slash, the ``state_dict`` key).
- Sharing is kept, as ``torch.save`` keeps it: a module that sits at several places (in one
  model, ``Sequential(l, act, l)``, or in several objects of a checkpoint) comes back as one
  module, and a ``Parameter`` assigned to two modules (weight tying) as one ``Parameter``.
  A tensor is stored once, under its first ``state_dict`` name; each other name of it is
  recorded in the safetensors metadata as ``{other name: stored name}``, as
  ``safetensors.torch.save_model`` does.
- estimators (scikit-learn style: constructor parameters + the fitted ``*_`` attributes; the
  Hopfield networks store their patterns again).
- ``optim.Optimizer``: its ``state_dict``; rebuilt over the loaded model's parameters when
  that model is saved in the same file, else loaded as the ``state_dict`` (for
  ``opt.load_state_dict``).
- ``numpy.random.Generator`` (its bit generator's state), arrays (NumPy, CuPy, Tensors; all
  come back as NumPy), None, bools, ints, floats, strings, dtypes.

Everything is encoded before the file is opened, and the write is atomic (temporary file +
rename): an object that cannot be saved, or a crash mid-save, leaves the previous file intact.

Format versions: 2 (this one); files of format 1 (tensors of constructor-argument modules
stored under names like ``"0.args.0/weight"``, sharing not recorded) still load.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import json
import math
import numbers
import zlib
from pathlib import Path

import numpy as np

from ._backend import is_gpu_array, to_host
from ._budget import MAX_BYTES, BudgetExceeded, allocation_budget
from ._safetensors import FileFormatError, read_file, write_file
from .autograd import Tensor
from .nn.module import Module, ModuleList, Parameter, Sequential, deepcopies
from .optim import Optimizer

__all__ = ["save", "load", "FileFormatError", "UnknownClassError", "FORMAT_VERSION"]

FORMAT_VERSION = 2
_BIT_GENERATORS = ("PCG64", "PCG64DXSM", "MT19937", "Philox", "SFC64")
_CONFIG_KEYS = ("nnkit", "nnkit_crc32")  # the metadata keys of the config
_MAX_CONFIG_DEPTH = 200  # JSON nesting of a config; bounds the decoder's recursion
_SCALAR_KINDS = "biuf"  # the NumPy scalars that save writes as {"__scalar__": [dtype, value]}
_ARGUMENT_SLACK = 4096  # how far a module's int argument may exceed the file's element count
# The namespaces whose public classes (their __all__) a file may name: a fixed list, never
# taken from a file.
_CLASS_NAMESPACES = ("nnkit.nn", "nnkit.optim", "nnkit.classic", "nnkit.models", "nnkit.approx")


# ----- encoding ------------------------------------------------------------------------------
class _Encoder:
    """Turns an object tree into JSON-able nodes and a dict of named tensors.

    A module is written once, as a full node (class, training flag, children or constructor
    arguments); every later sighting is a reference ``{"ref": n}`` to the n-th full node
    (numbered in the order they are completed, which is the order ``load`` builds them), or
    ``{"ref": n, "path": [names]}`` for a sub-module that the n-th module made itself. A
    module of the object tree (not a constructor argument) also carries its ``state``
    (state_dict key -> tensor) and what of its sharing the rebuilt module must reproduce:
    ``shared`` (module path -> the path where that module first appears) and ``tied``
    (parameter key -> the first key of the same Parameter, where not implied by ``shared``).
    """

    def __init__(self, obj):
        self.tensors = {}
        self.complex = []
        self.aliases = {}  # tensor name -> the name it is stored under (stored once)
        self._names = {}  # id(array) -> tensor name (tied weights are stored once)
        self._keep = []  # those arrays, held so that their ids stay theirs
        self._param_owner = {}  # id(Parameter) -> (module path, parameter name)
        self._index = {}  # id(Module) -> number of its full node
        self._inside = {}  # id(Module) -> (number of a full node, path of names below it)
        self._open = set()  # ids of the modules whose node is being written
        self._covered = set()  # ids of the modules whose tensors are already in the file
        self._arguments = 0  # > 0 while encoding constructor arguments
        self._collect_modules(obj, "")

    def _collect_modules(self, obj, path):
        if isinstance(obj, Module):
            for name, p in obj.named_parameters():
                self._param_owner.setdefault(id(p), (path, name))
        elif isinstance(obj, dict):
            for k, v in obj.items():
                self._collect_modules(v, _join(path, k))
        elif isinstance(obj, (list, tuple)):
            for i, v in enumerate(obj):
                self._collect_modules(v, _join(path, i))

    def tensor(self, name, value):
        source = value.data if isinstance(value, Tensor) else value
        if id(source) in self._names:
            stored = self._names[id(source)]
            if name != stored:
                self.aliases.setdefault(name, stored)
            return {"__tensor__": stored}
        array = to_host(source)
        if array.dtype == object:
            raise TypeError(f"cannot save '{name}': an array of Python objects")
        if array.dtype.kind == "c":
            self.complex.append(name)
            pairs = np.array(array, order="C", ndmin=1).view(array.real.dtype)  # (..., 2 n)
            stored = pairs.reshape(*array.shape, 2)
        else:
            stored = array
        if name in self.tensors or name == "__metadata__":  # {"a.b": x, "a": {"b": y}}: both
            name = next(f"{name}#{i}" for i in range(2, len(self.tensors) + 3)  # named 'a.b'
                        if f"{name}#{i}" not in self.tensors)
            if array.dtype.kind == "c":
                self.complex[-1] = name
        self.tensors[name] = stored
        self._names[id(source)] = name
        self._keep.append(source)
        return {"__tensor__": name}

    def encode(self, obj, path=""):
        """The JSON node of ``obj``; ``path`` names it in errors and tensor names."""
        if obj is None or isinstance(obj, (bool, str)):
            return obj
        if isinstance(obj, np.generic):
            return {"__scalar__": [obj.dtype.str, self.encode(obj.item(), path)]}
        if isinstance(obj, int):
            return obj
        if isinstance(obj, float):
            return obj if math.isfinite(obj) else {"__float__": repr(obj)}
        if isinstance(obj, (np.dtype, type)) and _is_dtype(obj):
            return {"__dtype__": np.dtype(obj).str}
        if isinstance(obj, Module):
            return {"__module__": self.module(obj, path, with_state=not self._arguments)}
        if isinstance(obj, Optimizer):
            return {"__optimizer__": self.optimizer(obj, path)}
        if isinstance(obj, np.random.Generator):
            return {"__generator__": self.encode(obj.bit_generator.state, path)}
        if _is_array(obj):
            return self.tensor(path or "tensor", obj)
        if isinstance(obj, dict):
            for k in obj:
                if not isinstance(k, (str, int)) or isinstance(k, bool):
                    raise TypeError(f"cannot save {_where(path)}: dict keys must be str or int, "
                                    f"got {type(k).__name__} {k!r}")
            return {"__dict__": [[k, self.encode(v, _join(path, k))] for k, v in obj.items()]}
        if isinstance(obj, list):
            return [self.encode(v, _join(path, i)) for i, v in enumerate(obj)]
        if isinstance(obj, tuple):
            return {"__tuple__": [self.encode(v, _join(path, i)) for i, v in enumerate(obj)]}
        if _is_estimator(obj):
            return {"__estimator__": self.estimator(obj, path)}
        raise TypeError(f"cannot save {_where(path)}: a {type(obj).__module__}."
                        f"{type(obj).__qualname__} is not a Module, estimator, optimizer, "
                        "generator, array or plain value (nnkit never pickles)")

    def module(self, module, path, with_state):
        key = id(module)
        if key in self._open:
            raise TypeError(f"cannot save {_where(path)}: the {type(module).__name__} is one "
                            "of its own constructor arguments or children")
        if key in self._index:
            node = {"ref": self._index[key]}
        elif key in self._inside:
            number, names = self._inside[key]
            node = {"ref": number, "path": names}
        else:
            node = None
        # the state first, so that its tensors get their state_dict names
        state = self.state(module, path) if with_state and key not in self._covered else None
        if node is None:
            node = self.structure(module, path)
        if state is not None:
            node.update(state)
        return node

    def structure(self, module, path):
        """The full node of ``module``: class, training flag, children or arguments."""
        self._open.add(id(module))
        node = {"class": _class_name(module), "training": bool(module.training)}
        if type(module) in (Sequential, ModuleList):
            node["children"] = [[name, self.module(child, _join(path, name), False)]
                                for name, child in module.named_children()]
        else:
            args, kwargs = module.__dict__.get("_init_args", ((), {}))
            self._arguments += 1
            node["args"] = [self.encode(a, _join(path, f"args.{i}")) for i, a in enumerate(args)]
            node["kwargs"] = {k: self.encode(v, _join(path, f"args.{k}"))
                              for k, v in kwargs.items()}
            self._arguments -= 1
        self._open.discard(id(module))
        number = self._index[id(module)] = len(self._index)
        for names, sub in _walk(module)[1:]:  # what it made itself: reachable from it
            if id(sub) not in self._index and id(sub) not in self._inside:
                self._inside[id(sub)] = (number, names)
        return node

    def state(self, module, path):
        """``state``, ``shared`` and ``tied`` of a module of the object tree."""
        state = {key: self.tensor(_join(path, key, sep="/"), value)
                 for key, value in module.state_dict().items()}
        self._covered.update(id(m) for m in module.modules())
        shared, tied = _sharing(module)
        return {"state": state, "shared": shared, "tied": tied}

    def optimizer(self, opt, path):
        owners = [self._param_owner.get(id(p)) for g in opt.param_groups for p in g["params"]]
        return {"class": _class_name(opt),
                "defaults": self.encode(opt.defaults, _join(path, "defaults")),
                "state_dict": self.encode(opt.state_dict(), path),
                "params": None if None in owners else [list(o) for o in owners]}

    def estimator(self, est, path):
        params = {name: getattr(est, name) for name in _init_parameters(type(est))}
        fitted = (est._nnkit_fitted() if hasattr(est, "_nnkit_fitted") else
                  {k: v for k, v in vars(est).items()
                   if k.endswith("_") and not k.startswith("_") and v is not None})
        return {"class": _class_name(est),
                "params": {k: self.encode(v, _join(path, k)) for k, v in params.items()},
                "fitted": {k: self.encode(v, _join(path, k)) for k, v in fitted.items()}}


def _walk(root):
    """[(names, module)] for ``root`` and each module below it, depth-first in registration
    order (as ``named_modules``), each module once: at the first place it is reached."""
    out, seen = [], set()
    stack = [([], root)]
    while stack:
        names, module = stack.pop()
        if id(module) in seen:
            continue
        seen.add(id(module))
        out.append((names, module))
        stack.extend(reversed([([*names, k], m) for k, m in module._modules.items()
                               if m is not None]))
    return out


def _sharing(root):
    """What ``root``'s rebuilt copy must share: (shared, tied), see ``_Encoder``."""
    shared, first = {}, {id(root): ""}
    stack = [(k, m) for k, m in reversed(root._modules.items()) if m is not None]
    while stack:
        path, module = stack.pop()
        if id(module) in first:
            shared[path] = first[id(module)]  # and all below it: not walked again
            continue
        first[id(module)] = path
        stack.extend(reversed([(f"{path}.{k}", m) for k, m in module._modules.items()
                               if m is not None]))
    tied, owner = {}, {}
    for key, (module, name, kind) in root._state_slots().items():
        if kind == "p":
            first_key, slot = owner.setdefault(id(module._parameters[name]),
                                               (key, (id(module), name)))
            if slot != (id(module), name):  # not the same module reached twice
                tied[key] = first_key
    return shared, tied


def _join(path, key, sep="."):
    """Where ``key`` sits under ``path``: 'model.args.0'; tensor names use sep='/'."""
    return f"{path}{sep}{key}" if path else str(key)


def _where(path):
    return f"'{path}'" if path else "the object"


def _is_array(obj):
    return isinstance(obj, (np.ndarray, Tensor)) or is_gpu_array(obj)


def _is_dtype(obj):
    try:
        np.dtype(obj)
    except TypeError:
        return False
    return isinstance(obj, np.dtype) or (isinstance(obj, type) and issubclass(obj, np.generic))


def _is_estimator(obj):
    return hasattr(obj, "get_params") or type(obj).__module__.startswith("nnkit.classic")


def _class_name(obj):
    cls = type(obj)
    return f"{cls.__module__}:{cls.__qualname__}"


def _init_parameters(cls):
    sig = inspect.signature(cls.__init__)
    return [n for n, p in sig.parameters.items() if n != "self" and
            p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


# ----- decoding ------------------------------------------------------------------------------
def _parameter_name(cls, argument: str) -> str:
    """The constructor parameter that ``argument`` ("args.0", "args.seed") binds to; the
    argument itself when the signature cannot tell."""
    key = argument.split(".", 1)[1]
    if not key.isdigit():
        return key
    try:
        names = [p.name for p in inspect.signature(cls).parameters.values()
                 if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        return key
    return names[int(key)] if int(key) < len(names) else key


def _is_seed(name: str) -> bool:
    return name in ("seed", "random_state") or name.endswith("_seed")


class _Decoder:
    def __init__(self, path, tensors, classes, version=FORMAT_VERSION, max_bytes=MAX_BYTES):
        self.path = path
        self.max_bytes = max_bytes
        self.tensors = tensors
        self.classes = classes
        self.version = version
        self.modules = {}  # tree path -> loaded top-level module
        self.built = []  # the modules of the full nodes, in file order: what "ref" names
        self.parameters = {}  # stored tensor name -> the Parameter loaded with it first
        self._arguments = 0  # > 0 while decoding constructor arguments
        self.elements = sum(int(a.size) for a in tensors.values())

    def bad(self, path, what):
        """A FileFormatError naming the config path of the malformed node."""
        where = f"the config at '{path}'" if path else "the config's top-level object"
        return FileFormatError(f"'{self.path}': {where} is malformed: {what}; the file is "
                               "corrupted")

    def tensor(self, name):
        if not isinstance(name, str) or name not in self.tensors:
            raise FileFormatError(f"'{self.path}': the config refers to tensor {name!r}, "
                                  "which the file does not hold; the file is corrupted")
        return self.tensors[name]

    def decode(self, node, path=""):
        if node is None or isinstance(node, (bool, int, float, str)):
            return node
        if isinstance(node, list):
            return [self.decode(v, _join(path, i)) for i, v in enumerate(node)]
        if not isinstance(node, dict) or len(node) != 1:
            raise self.bad(path, f"unexpected config node {node!r:.200}")
        (kind, body), = node.items()
        if kind == "__tensor__":
            return self.tensor(body)
        if kind == "__tuple__":
            if not isinstance(body, list):
                raise self.bad(path, f"__tuple__ holds {body!r:.100}, not a list")
            return tuple(self.decode(v, _join(path, i)) for i, v in enumerate(body))
        if kind == "__dict__":
            if not (isinstance(body, list) and all(
                    isinstance(item, list) and len(item) == 2 and isinstance(item[0], (str, int))
                    and not isinstance(item[0], bool) for item in body)):
                raise self.bad(path, f"__dict__ holds {body!r:.100}, not a list of "
                                     "[key, value] pairs with str or int keys")
            return {k: self.decode(v, _join(path, k)) for k, v in body}
        if kind == "__float__":
            try:
                return float(body) if isinstance(body, str) else float("invalid")
            except ValueError:
                raise self.bad(path, f"__float__ holds {body!r:.100}, not a float's "
                                     "string") from None
        if kind == "__scalar__":
            return self.scalar(body, path)
        if kind == "__dtype__":
            try:
                if not isinstance(body, str):
                    raise TypeError
                return np.dtype(body)
            except (TypeError, ValueError):
                raise self.bad(path, f"__dtype__ holds {body!r:.100}, not a NumPy dtype "
                                     "string") from None
        if kind == "__generator__":
            return self.generator(self.decode(body, path), path)
        if kind == "__module__":
            module = self.module(body, path)
            if not self._arguments:
                self.modules[path] = module
            return module
        if kind == "__estimator__":
            return self.estimator(body, path)
        if kind == "__optimizer__":
            return self.optimizer(body, path)
        raise self.bad(path, f"unknown config node kind {kind!r:.100}")

    def scalar(self, body, path):
        """{"__scalar__": [dtype string, value]}: a NumPy bool, integer or float scalar."""
        try:
            dtype = np.dtype(body[0]) if isinstance(body, list) and len(body) == 2 and \
                isinstance(body[0], str) else None
        except (TypeError, ValueError):
            dtype = None
        if dtype is None or dtype.kind not in _SCALAR_KINDS:
            raise self.bad(path, f"__scalar__ holds {body!r:.100}, not [dtype, value] with a "
                                 "bool, integer or float dtype")
        value = self.decode(body[1], path)
        if not isinstance(value, (bool, int, float)):
            raise self.bad(path, f"__scalar__ value {value!r:.100} is not a number")
        try:
            return dtype.type(value)
        except (TypeError, ValueError, OverflowError) as exc:
            raise self.bad(path, f"__scalar__ value {value!r:.100} is not a {dtype} "
                                 f"({exc})") from None

    def resolve(self, name, kind, path=""):
        """The class called ``name`` ('module:qualname') for a node of ``kind`` ('module',
        'optimizer' or 'estimator'): a key of the caller's ``classes`` or of nnkit's table,
        nothing else (no import, no attribute lookup)."""
        if not isinstance(name, str):
            raise self.bad(path, f"the class name is {name!r:.100}, not a string")
        base = _KIND_BASES[kind]
        cls = self.classes.get(name)
        if cls is None:
            cls, nnkit_kind = _nnkit_classes().get(name, (None, None))
            if cls is None:
                short = name.rpartition(":")[2].rpartition(".")[2]
                raise UnknownClassError(
                    f"'{self.path}' names the class {name!r:.100} (for {_where(path)}), which is "
                    f"not one of nnkit's public classes; if it is yours, pass "
                    f"classes=[{short:.60}] to nk.load to allow it")
            if nnkit_kind != kind:
                raise self.bad(path, f"{name!r:.100} is nnkit's {nnkit_kind} class, where "
                                     f"the file needs its {kind} class")
        elif base is not None and not issubclass(cls, base):
            raise FileFormatError(f"'{self.path}': {name!r:.100} (at '{path}') is not a "
                                  f"{base.__name__}")
        return cls

    def module(self, node, path):
        """The module of a node: built, or the one a reference names; then its state."""
        if not isinstance(node, dict):
            raise FileFormatError(f"'{self.path}': the config of module '{path}' is "
                                  f"{node!r:.100}; corrupted")
        if "ref" in node:
            keys = {"ref"} | ({"path"} if "path" in node else set())
        else:
            keys = {"class", "training"} | ({"children"} if "children" in node else
                                            {"args", "kwargs"})
        if "state" in node:
            keys |= {"state"} | ({"shared", "tied"} if self.version >= 2 else set())
        if set(node) != keys:
            raise FileFormatError(f"'{self.path}': the config of module '{path}' has the keys "
                                  f"{sorted(node)}, expected {sorted(keys)}; corrupted")
        if "ref" not in node:
            self.check_structure(node, path)
        if "state" in node and not isinstance(node["state"], dict):
            raise self.bad(path, f"the module's state is {node['state']!r:.100}, not a "
                                 "{key: tensor} object")
        module = self.reference(node, path) if "ref" in node else self.build(node, path)
        if "state" in node:
            _restore_sharing(module, node.get("shared", {}), node.get("tied", {}), self.path)
            saved = {key: self.decode(ref, _join(path, key, sep="/"))
                     for key, ref in node["state"].items()}
            for key, value in saved.items():
                if not isinstance(value, np.ndarray):
                    raise self.bad(_join(path, key, sep="/"), f"the state entry is "
                                   f"{value!r:.100}, not a tensor")
            _load_state(module, saved, self.path)
            self.tie_across(module, node["state"])
        return module

    def tie_across(self, module, state):
        """A Parameter stored once for several objects of the checkpoint (an embedding and
        an output layer saved as two entries, one weight) comes back as one Parameter: the
        first module loaded with that tensor lends its Parameter to the later ones."""
        slots = module._state_slots()
        for key, ref in state.items():
            name = ref.get("__tensor__") if isinstance(ref, dict) else None
            owner, slot, kind = slots.get(key, (None, None, None))
            if name is None or kind != "p":
                continue
            first = self.parameters.setdefault(name, owner._parameters[slot])
            if first is not owner._parameters[slot]:
                setattr(owner, slot, first)

    def check_structure(self, node, path):
        """The types of a full module node's fields (its keys are already checked)."""
        if not isinstance(node["class"], str):
            raise self.bad(path, f"the module's 'class' is {node['class']!r:.100}, not a "
                                 "string")
        if not isinstance(node["training"], bool):
            raise self.bad(path, f"the module's 'training' is {node['training']!r:.100}, not "
                                 "a bool")
        if "children" in node:
            children = node["children"]
            if not (isinstance(children, list) and all(
                    isinstance(c, list) and len(c) == 2 and isinstance(c[0], str)
                    for c in children)):
                raise self.bad(path, f"the module's 'children' is {children!r:.100}, not a "
                                     "list of [name, module] pairs")
            return
        if not isinstance(node["args"], list):
            raise self.bad(path, f"the module's 'args' is {node['args']!r:.100}, not a list")
        if not isinstance(node["kwargs"], dict):
            raise self.bad(path, f"the module's 'kwargs' is {node['kwargs']!r:.100}, not an "
                                 "object")

    def construct(self, cls, args, kwargs, path):
        """``cls(*args, **kwargs)``; arguments that do not fit it are a corrupted file, and
        arguments that would allocate past the budget are refused by name."""
        try:
            return cls(*args, **kwargs)
        except BudgetExceeded as exc:
            raise self.too_big(cls, args, kwargs, exc, path) from None
        except MemoryError:  # the machine's limit, not a corrupted file
            raise
        except Exception as exc:  # the arguments come from the file
            raise self.bad(path, f"its arguments do not fit {cls.__name__} ({type(exc).__name__}"
                                 f": {exc})") from exc

    def too_big(self, cls, args, kwargs, exc, path):
        """The FileFormatError of a build that would allocate past ``max_bytes``."""
        def short(v):  # a module argument by its class: its repr spans many lines
            return f"{type(v).__name__}(...)" if isinstance(v, Module) else repr(v)

        call = ", ".join([*map(short, args), *(f"{k}={short(v)}" for k, v in kwargs.items())])
        return FileFormatError(
            f"'{self.path}': {cls.__name__}({call:.300}) (for {_where(path)}) would allocate "
            f"{exc.nbytes} bytes for {exc.what}, beyond what loading may allocate (the "
            f"file's tensors plus max_bytes={self.max_bytes}; {exc.left} bytes were left); "
            "if you trust the file, pass a larger max_bytes to nk.load")

    def check_sizes(self, cls, arguments, path):
        """Refuse, before ``cls`` is built, an int among its constructor ``arguments``
        ([(name, value)], searched through lists, tuples and dicts) above the number of
        elements the file stores plus ``_ARGUMENT_SLACK``.

        Every parameter and buffer of a loaded module must equal a stored tensor, so a size
        that an argument gives one is at most the file's element count; the slack is for
        ints that size nothing stored (a MaxPool2d's kernel size, a loss's ignore_index,
        ...). So a hostile config (a Linear of 10**12 inputs) is refused by name instead
        of making the module allocate and fill arrays that could never match the file.
        The bound is on each argument, not on their product: a module may still be built
        larger than the file, and then fails the comparison of its tensors with the file's.
        Seeds size nothing and may be any int: a parameter named ``seed``, ``random_state``
        or ``*_seed`` is not checked.
        """
        limit = self.elements + _ARGUMENT_SLACK
        stack = [(name, value) for name, value in arguments
                 if not _is_seed(_parameter_name(cls, name))]
        while stack:
            name, value = stack.pop()
            if isinstance(value, (list, tuple)):
                stack.extend((_join(name, i), v) for i, v in enumerate(value))
            elif isinstance(value, dict):
                stack.extend((_join(name, k), v) for k, v in value.items())
            elif isinstance(value, numbers.Integral) and not isinstance(value, bool) and \
                    value > limit:
                raise self.bad(path, f"{cls.__name__}'s argument '{name}' is {value}, more "
                                     f"than the {limit} allowed (the file's {self.elements} "
                                     f"tensor elements + {_ARGUMENT_SLACK}): no tensor it "
                                     "sizes could match the file's")

    def build(self, node, path):
        cls = self.resolve(node["class"], "module", path)
        self._arguments += 1
        try:
            if "children" in node:
                children = {name: self.module(child, _join(path, name))
                            for name, child in node["children"]}
                module = (cls(children) if cls is Sequential else cls(list(children.values())))
            else:
                args = [self.decode(a, _join(path, f"args.{i}"))
                        for i, a in enumerate(node["args"])]
                kwargs = {k: self.decode(v, _join(path, f"args.{k}"))
                          for k, v in node["kwargs"].items()}
                self.check_sizes(cls, [*((f"args.{i}", a) for i, a in enumerate(args)),
                                       *((f"args.{k}", v) for k, v in kwargs.items())], path)
                module = self.construct(cls, args, kwargs, path)
        finally:
            self._arguments -= 1
        module.train(node["training"])
        self.built.append(module)
        return module

    def reference(self, node, path):
        number, names = node["ref"], node.get("path", [])
        if not (type(number) is int and 0 <= number < len(self.built)) or \
                not (isinstance(names, list) and all(isinstance(n, str) for n in names)):
            raise FileFormatError(f"'{self.path}': module '{path}' refers to module "
                                  f"{number!r} {names!r:.100}, which is not in the file; "
                                  "corrupted")
        module = self.built[number]
        for i, name in enumerate(names):
            module = module._modules.get(name) if isinstance(module, Module) else None
            if module is None:
                raise ValueError(f"'{self.path}': module '{path}' is the sub-module "
                                 f"'{'.'.join(names[:i + 1])}' of a "
                                 f"{type(self.built[number]).__name__}, which the rebuilt "
                                 "one does not have")
        return module

    def estimator(self, node, path):
        if not (isinstance(node, dict) and set(node) == {"class", "params", "fitted"}
                and isinstance(node["params"], dict) and isinstance(node["fitted"], dict)):
            raise self.bad(path, f"the estimator node is {node!r:.100}, not "
                                 "{class, params: {}, fitted: {}}")
        if any(k.startswith("__") for k in node["fitted"]):
            raise self.bad(path, "a fitted attribute name starts with '__'")
        cls = self.resolve(node["class"], "estimator", path)
        params = {k: self.decode(v, _join(path, k)) for k, v in node["params"].items()}
        est = self.construct(cls, (), params, path)
        fitted = {k: self.decode(v, _join(path, k)) for k, v in node["fitted"].items()}
        try:
            if hasattr(est, "_nnkit_restore"):
                est._nnkit_restore(fitted)
            else:
                for k, v in fitted.items():
                    setattr(est, k, v)
        except BudgetExceeded as exc:
            raise self.too_big(cls, (), params, exc, path) from None
        except Exception as exc:  # the fitted values come from the file
            raise self.bad(path, f"its fitted values do not fit {cls.__name__} "
                                 f"({type(exc).__name__}: {exc})") from exc
        return est

    def optimizer(self, node, path):
        if not (isinstance(node, dict) and set(node) == {"class", "defaults", "state_dict",
                                                         "params"}):
            raise self.bad(path, f"the optimizer node is {node!r:.100}, not "
                                 "{class, defaults, state_dict, params}")
        params_node = node["params"]
        if params_node is not None and not (isinstance(params_node, list) and all(
                isinstance(p, list) and len(p) == 2 and all(isinstance(n, str) for n in p)
                for p in params_node)):
            raise self.bad(path, f"the optimizer's 'params' is {params_node!r:.100}, not a "
                                 "list of [module, parameter] names")
        state_dict = self.decode(node["state_dict"], path)
        if params_node is None:
            return state_dict  # its parameters were not saved with it: opt.load_state_dict
        cls = self.resolve(node["class"], "optimizer", path)
        groups_node = state_dict.get("param_groups") if isinstance(state_dict, dict) else None
        if not (isinstance(groups_node, list) and all(
                isinstance(g, dict) and isinstance(g.get("params"), list) for g in groups_node)):
            raise self.bad(path, "the optimizer's state_dict has no list of param_groups")
        defaults = self.decode(node["defaults"], _join(path, "defaults"))
        if not isinstance(defaults, dict):
            raise self.bad(path, f"the optimizer's defaults are {defaults!r:.100}, not a dict")
        params = []
        for owner, name in params_node:
            if owner not in self.modules:
                raise FileFormatError(f"'{self.path}': the optimizer refers to module "
                                      f"'{owner}', which was not loaded before it")
            named = dict(self.modules[owner].named_parameters())
            if name not in named:
                raise FileFormatError(f"'{self.path}': the optimizer refers to parameter "
                                      f"'{name}' of module '{owner}', which it does not have")
            params.append(named[name])
        groups, start = [], 0
        for group in state_dict["param_groups"]:
            n = len(group["params"])
            hyper = {k: v for k, v in group.items() if k != "params"}
            groups.append({**hyper, "params": params[start:start + n]})
            start += n
        accepted = _init_parameters(cls)
        defaults = {k: v for k, v in defaults.items() if k in accepted}
        opt = self.construct(cls, (groups,), defaults, path)
        try:
            opt.load_state_dict(state_dict)
        except Exception as exc:  # the state comes from the file
            raise self.bad(path, f"its state does not fit {cls.__name__} "
                                 f"({type(exc).__name__}: {exc})") from exc
        return opt

    def generator(self, state, path=""):
        name = state.get("bit_generator") if isinstance(state, dict) else None
        if not isinstance(name, str) or name not in _BIT_GENERATORS:
            raise FileFormatError(f"'{self.path}': unknown bit generator {name!r:.100} at "
                                  f"'{path}'")
        gen = np.random.Generator(getattr(np.random, name)())
        try:
            gen.bit_generator.state = state
        except Exception as exc:  # the state comes from the file
            raise self.bad(path, f"the {name} state is invalid ({type(exc).__name__}: "
                                 f"{exc})") from None
        return gen


def _restore_sharing(root, shared, tied, path):
    """Make the rebuilt ``root`` share modules and Parameters as the saved one did.

    ``shared``: module path -> the path where that module first appears; ``tied``: parameter
    key -> the first key of the same Parameter (see ``_sharing``). Modules and Parameters
    that the constructors shared but the saved model did not are copied apart.
    """
    if not (isinstance(shared, dict) and isinstance(tied, dict) and
            all(isinstance(v, str) for v in (*shared, *shared.values(), *tied, *tied.values()))):
        raise FileFormatError(f"'{path}': the sharing of a module is not recorded as "
                              "{name: name}; corrupted")
    by_path, seen = {"": root}, {id(root)}
    stack = [(k, root, k) for k in reversed(root._modules) if root._modules[k] is not None]
    while stack:
        where, parent, name = stack.pop()
        module = parent._modules[name]
        if where in shared:
            target = by_path.get(shared[where])
            if target is None:
                raise ValueError(f"'{path}': module '{where}' was saved as module "
                                 f"'{shared[where]}', which the rebuilt "
                                 f"{type(root).__name__} does not have")
            parent._modules[name] = target
            continue
        if id(module) in seen:  # shared by a constructor, not in the saved model
            module = parent._modules[name] = deepcopies(module, 1)[0]
        seen.add(id(module))
        by_path[where] = module
        stack.extend((f"{where}.{k}", module, k) for k in reversed(module._modules)
                     if module._modules[k] is not None)
    groups, chosen, claimed = {}, {}, {}
    for key, (module, name, kind) in root._state_slots().items():
        if kind != "p" or (id(module), name) in groups:
            continue  # a buffer, or the same module reached again: its Parameter is shared
        group = groups[(id(module), name)] = tied.get(key, key)
        param = module._parameters[name]
        if group not in chosen:
            if id(param) in claimed:  # tied by a constructor, not in the saved model
                param = Parameter(param.data.copy(), requires_grad=param.requires_grad)
            chosen[group] = param
            claimed[id(param)] = group
        module._parameters[name] = chosen[group]


def _load_state(module, saved, path):
    """``module.load_state_dict(saved)`` keeping the saved dtypes; mismatches named."""
    own = module.state_dict()
    missing = [k for k in own if k not in saved]
    unexpected = [k for k in saved if k not in own]
    if missing or unexpected:
        raise ValueError(f"'{path}' does not match {type(module).__name__}: missing tensors "
                         f"{missing}, unexpected tensors {unexpected}")
    for name, p in module.named_parameters():
        if name in saved and saved[name].dtype != p.data.dtype:
            p.data = p.data.astype(saved[name].dtype)
    try:
        module.load_state_dict(saved)
    except (ValueError, TypeError) as exc:
        raise type(exc)(f"'{path}' does not match {type(module).__name__}: {exc}") from None


# ----- the public functions ---------------------------------------------------------------------
def save(obj, path) -> None:
    """Save ``obj`` (a module, estimator, optimizer, generator, array, or a dict/list of them:
    a checkpoint) to the file ``path`` in safetensors format, atomically.

    Parameters
    ----------
    obj : see the module docstring
    path : str or os.PathLike
        The file; its folder must exist. An existing file is replaced only once the new one
        is complete.

    Raises
    ------
    TypeError
        For an object that cannot be saved (naming where it sits in ``obj``); nothing is
        written.
    ValueError
        ``obj`` nests dicts, lists and tuples deeper than ``load`` reads (its config would
        be more than 200 JSON levels deep: about 65 nested dicts); nothing is written.
    FileNotFoundError
        When the folder of ``path`` does not exist.

    Examples
    --------
    >>> import nnkit as nk, tempfile, os
    >>> model = nk.nn.Sequential(nk.nn.Linear(4, 8), nk.nn.ReLU(), nk.nn.Linear(8, 2))
    >>> path = os.path.join(tempfile.mkdtemp(), "model.safetensors")
    >>> nk.save(model, path)
    >>> type(nk.load(path)).__name__
    'Sequential'
    """
    too_deep = ValueError(f"cannot save to '{path}': the object nests too deeply (its config "
                          f"would be more than {_MAX_CONFIG_DEPTH} JSON levels deep, which "
                          "load refuses); flatten its dicts and lists")
    try:
        encoder = _Encoder(obj)
        tree = encoder.encode(obj)
    except RecursionError:
        raise too_deep from None
    config = {"format": "nnkit", "format_version": FORMAT_VERSION,
              "nnkit_version": _version(), "object": tree, "complex": encoder.complex,
              "tensors": {name: _fingerprint(a) for name, a in encoder.tensors.items()}}
    if _depth(config) > _MAX_CONFIG_DEPTH:  # load's limit, checked before writing
        raise too_deep
    text = json.dumps(config, separators=(",", ":"), allow_nan=False)
    # the other names of tensors stored once, as safetensors.torch.save_model records them
    metadata = {name: stored for name, stored in encoder.aliases.items()
                if name not in encoder.tensors and name not in _CONFIG_KEYS}
    metadata.update(nnkit=text, nnkit_crc32=str(zlib.crc32(text.encode("utf-8"))))
    write_file(path, encoder.tensors, metadata)


def load(path, *, classes=None, max_bytes=MAX_BYTES):
    """Load what ``save`` wrote to ``path`` (NumPy arrays; move a model with ``.to``).

    Parameters
    ----------
    path : str or os.PathLike
    classes : list of classes or dict, optional
        Classes from outside nnkit (your own Module subclasses) that the file may name; a
        dict maps ``'module:qualname'`` or qualname to the class.
        Besides these, a file can name only nnkit's public modules, optimizers and
        estimators; a class name is looked up in that table, never imported or resolved
        through attributes, so loading runs no code that the file chooses.
    max_bytes : int >= 0 or None, default 256 MiB
        How much loading may allocate beyond the bytes of the file's tensors: constructor
        arguments read from the file (a ``Linear(100000, 100000)``, a dense
        ``Hopfield(n_neurons=16000)`` whose couplings are n^2 floats) are refused before
        they allocate past it. None: no limit (for files you trust).

    Raises
    ------
    FileNotFoundError
        No such file.
    FileFormatError
        (a ValueError) Truncated, corrupted (a tensor fails its CRC32), written by a newer
        nnkit, not a safetensors file, or a module's int constructor argument exceeds the
        number of elements the file stores by more than 4096 (it is refused before the
        module is built: no tensor it sizes could match the file's); the message says which.
    ValueError
        The saved tensors do not fit the class they belong to (names the tensors).
    UnknownClassError
        (a FileFormatError and a TypeError) The file names a class that is neither one of
        nnkit's public classes nor in ``classes``; nothing is imported or built.

    Notes
    -----
    A safetensors file written by another tool (no nnkit config) loads as a dict
    {name: ndarray}, ready for ``model.load_state_dict``.
    """
    path = Path(path)
    tensors, metadata = read_file(path)
    if "nnkit" not in metadata and "nnkit_crc32" not in metadata:
        return tensors
    text = metadata.get("nnkit", "")
    if metadata.get("nnkit_crc32") != str(zlib.crc32(text.encode("utf-8"))):
        raise FileFormatError(f"'{path}': the nnkit config fails its CRC32 check; the file is "
                              "corrupted")
    try:
        config = json.loads(text)
    except RecursionError:
        raise FileFormatError(f"'{path}': the nnkit config is JSON nested too deeply; the "
                              "file is corrupted or hostile") from None
    except ValueError as exc:  # JSONDecodeError, int digit limit
        raise FileFormatError(f"'{path}': the nnkit config is not valid JSON ({exc})") from None
    if _depth(config) > _MAX_CONFIG_DEPTH:
        raise FileFormatError(f"'{path}': the nnkit config is nested more than "
                              f"{_MAX_CONFIG_DEPTH} levels deep; the file is corrupted")
    _check_config(path, config, tensors)
    for name in config["complex"]:
        pairs = tensors[name]
        tensors[name] = np.ascontiguousarray(pairs).view(
            np.result_type(pairs.dtype, np.complex64)).reshape(pairs.shape[:-1])
    decoder = _Decoder(path, tensors, _class_table(classes), config["format_version"],
                       _check_max_bytes(max_bytes))
    if max_bytes is None:
        return decoder.decode(config["object"])
    with allocation_budget(sum(int(a.nbytes) for a in tensors.values()) + max_bytes):
        return decoder.decode(config["object"])


def _check_config(path, config, tensors):
    if not isinstance(config, dict) or config.get("format") != "nnkit":
        raise FileFormatError(f"'{path}': the 'nnkit' metadata is not an nnkit config")
    version = config.get("format_version")
    if type(version) is not int or not 1 <= version <= FORMAT_VERSION:
        raise FileFormatError(f"'{path}' was written in nnkit format {version!r} (by nnkit "
                              f"{config.get('nnkit_version')}); this nnkit "
                              f"({_version()}) reads formats 1 to {FORMAT_VERSION}")
    described = config.get("tensors")
    if not isinstance(described, dict) or set(described) != set(tensors) or \
            not isinstance(config.get("complex"), list) or "object" not in config:
        raise FileFormatError(f"'{path}': the nnkit config does not describe the file's "
                              "tensors; the file is corrupted")
    for name in config["complex"]:
        pairs = tensors.get(name) if isinstance(name, str) else None
        if pairs is None or pairs.dtype.kind != "f" or pairs.ndim < 1 or pairs.shape[-1] != 2:
            raise FileFormatError(f"'{path}': the nnkit config lists {name!r:.100} as a complex "
                                  "tensor, which is not a float tensor of (real, imag) pairs; "
                                  "the file is corrupted")
    for name, expected in described.items():
        found = _fingerprint(tensors[name])
        if found != expected:
            raise FileFormatError(f"'{path}': tensor '{name}' fails its check (dtype, shape, "
                                  f"CRC32 {found} in the file, {expected} in the config); "
                                  "the file is corrupted")


def _check_max_bytes(max_bytes):
    if max_bytes is not None and (not isinstance(max_bytes, numbers.Integral) or
                                  isinstance(max_bytes, bool) or max_bytes < 0):
        raise TypeError(f"max_bytes must be an int >= 0 or None, got {max_bytes!r:.100}")
    return max_bytes


def _depth(node) -> int:
    """How deeply a parsed JSON value nests (iteratively: no recursion on hostile input)."""
    deepest, stack = 0, [(node, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, (dict, list)):
            deepest = max(deepest, depth)
            stack.extend((v, depth + 1) for v in (node.values() if isinstance(node, dict)
                                                  else node))
    return deepest


def _fingerprint(array) -> list:
    """[dtype, shape, CRC32 of the bytes]: what the config says each tensor must be."""
    array = np.asarray(array)
    if array.dtype.byteorder == ">":  # stored little-endian (see _safetensors)
        array = array.astype(array.dtype.newbyteorder("<"))
    array = array if array.flags.c_contiguous else array.copy(order="C")
    return [array.dtype.str, list(array.shape), zlib.crc32(array.reshape(-1).view(np.uint8))]


class UnknownClassError(FileFormatError, TypeError):
    """The file names a class that is neither nnkit's nor among ``load``'s ``classes``."""


_KIND_BASES = {"module": Module, "optimizer": Optimizer, "estimator": None}


@functools.cache
def _nnkit_classes() -> dict:
    """{'module:qualname': (class, kind)}: every class of nnkit a file may name.

    The public classes (``__all__``) of ``_CLASS_NAMESPACES`` that are modules, optimizers
    or estimators, each under its public name ('nnkit.nn:Linear') and the name of its
    defining module ('nnkit.nn.linear:Linear', what ``save`` writes), plus the sub-module
    classes that nnkit's own modules build (``Bert``'s embeddings).
    """
    table = {}
    for namespace in _CLASS_NAMESPACES:
        module = importlib.import_module(namespace)
        for name in module.__all__:
            cls = getattr(module, name)
            kind = _class_kind(cls)
            if kind is not None:
                table[f"{namespace}:{name}"] = (cls, kind)
                table[f"{cls.__module__}:{cls.__qualname__}"] = (cls, kind)
    stack = [cls for cls, kind in table.values() if kind == "module"]
    while stack:  # sub-classes defined in nnkit, public by name (BertEmbeddings)
        for sub in stack.pop().__subclasses__():
            key = f"{sub.__module__}:{sub.__qualname__}"
            if sub.__module__.startswith("nnkit.") and not sub.__qualname__.startswith("_") \
                    and "<locals>" not in sub.__qualname__ and "._" not in sub.__module__:
                table.setdefault(key, (sub, "module"))
                stack.append(sub)
    return table


def _class_kind(cls):
    """'module', 'optimizer', 'estimator' or None for a class of nnkit's public namespaces."""
    if not (isinstance(cls, type) and cls.__module__.startswith("nnkit.")):
        return None
    if issubclass(cls, Module):
        return "module"
    if issubclass(cls, Optimizer):
        return "optimizer"
    return "estimator" if cls.__module__.startswith("nnkit.classic") or \
        hasattr(cls, "get_params") else None


def _class_table(classes):
    if classes is None:
        return {}
    if isinstance(classes, dict):
        items = classes.items()
    elif isinstance(classes, (list, tuple)):
        items = [(f"{c.__module__}:{c.__qualname__}", c) for c in classes]
    else:
        raise TypeError(f"classes must be a list of classes or a dict, got "
                        f"{type(classes).__name__}")
    table = {}
    for name, cls in items:
        if not isinstance(cls, type):
            raise TypeError(f"classes[{name!r}] must be a class, got {type(cls).__name__}")
        table[name if ":" in name else f"{cls.__module__}:{name}"] = cls
    return table


def _version():
    from . import __version__

    return __version__
