"""``nn.Module``, ``nn.Parameter`` and the containers, with torch's ``state_dict`` names.

A Module registers ``Parameter``s, buffers and sub-modules assigned as attributes, in
assignment order; ``named_parameters()`` walks them depth-first with dotted names
(``layers.0.weight``), exactly as torch does, so ``state_dict`` keys port both ways.
"""

from __future__ import annotations

import copy
from collections import OrderedDict

import numpy as np

from .._backend import is_gpu_array, to_host
from .._budget import ensure_room, reserve
from ..autograd import Tensor

__all__ = ["Parameter", "Module", "Sequential", "ModuleList"]


class Parameter(Tensor):
    """A leaf tensor that a Module registers as a learnable parameter (requires grad)."""

    __slots__ = ()

    def __init__(self, data, requires_grad: bool = True):
        data = data.data if isinstance(data, Tensor) else data
        reserve(getattr(data, "nbytes", 0), f"a parameter of shape {np.shape(data)}")
        super().__init__(data, requires_grad=requires_grad)

    @classmethod
    def empty(cls, shape, dtype) -> Parameter:
        """A Parameter of uninitialised memory; refused before it is allocated when
        ``nk.load``'s allocation budget has no room for it."""
        shape = tuple(shape) if isinstance(shape, (tuple, list)) else (shape,)
        ensure_room(shape, dtype, f"a parameter of shape {shape}")
        return cls(np.empty(shape, dtype=dtype))

    def __repr__(self) -> str:
        return "Parameter containing:\n" + super().__repr__()


def _host_array(value):
    """An array from a state_dict value: nnkit Tensor, NumPy/CuPy array or a torch tensor."""
    if isinstance(value, Tensor):
        return value.data
    if hasattr(value, "detach") and hasattr(value, "cpu"):  # a torch tensor, without torch
        return value.detach().cpu().numpy()
    return value if is_gpu_array(value) else np.asarray(value)


_OBJECT_BYTES = 1024  # a copied module or parameter's Python objects (about 600 measured)


def deepcopies(module: Module, n: int) -> list:
    """``n`` deep copies of ``module``. Under ``nk.load``'s allocation budget the copies'
    parameters, buffers and Python objects are counted first, so a file asking for too
    many copies (a million layers of width 1) is refused before any is made (a deep copy
    makes no ``Parameter`` through its constructor, where the budget counts otherwise)."""
    arrays = [p.data for p in module.parameters()] + [b for _, b in module.named_buffers()]
    objects = len(arrays) + sum(1 for _ in module.modules())
    each = sum(int(getattr(a, "nbytes", 0)) for a in {id(a): a for a in arrays}.values()) + \
        objects * _OBJECT_BYTES
    reserve(n * each, f"{n} copies of a {type(module).__name__} of {each} bytes")
    return [copy.deepcopy(module) for _ in range(n)]


class Module:
    """Base class of every layer and model.

    Subclasses assign parameters and sub-modules in ``__init__`` (after
    ``super().__init__()``) and define ``forward``; calling the module calls ``forward``.
    """

    def __new__(cls, *args, **kwargs):
        # The constructor's arguments, kept so nk.save can rebuild the module (JSON config,
        # never pickle); containers (Sequential, ModuleList) are saved by their children.
        self = super().__new__(cls)
        object.__setattr__(self, "_init_args", (args, kwargs))
        return self

    def __init__(self):
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_buffers", OrderedDict())
        object.__setattr__(self, "_modules", OrderedDict())
        object.__setattr__(self, "training", True)

    # ----- registration ----------------------------------------------------------------
    def __setattr__(self, name, value):
        if "_parameters" not in self.__dict__:
            raise AttributeError(
                f"cannot assign '{name}' before Module.__init__() ran: call "
                f"super().__init__() first in {type(self).__name__}.__init__"
            )
        for store in (self._parameters, self._buffers, self._modules):
            store.pop(name, None)
        if isinstance(value, Parameter):
            self._parameters[name] = value
        elif isinstance(value, Module):
            self._modules[name] = value
        else:
            object.__setattr__(self, name, value)
            return
        self.__dict__.pop(name, None)

    def __getattr__(self, name):
        d = self.__dict__
        for store in ("_parameters", "_buffers", "_modules"):
            if store in d and name in d[store]:
                return d[store][name]
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    def __delattr__(self, name):
        for store in (self._parameters, self._buffers, self._modules):
            if name in store:
                del store[name]
                return
        object.__delattr__(self, name)

    def register_parameter(self, name: str, param) -> None:
        """Register ``param`` (a Parameter, or None for an absent optional one, as torch)."""
        if param is None:
            self._parameters.pop(name, None)
            object.__setattr__(self, name, None)
        else:
            setattr(self, name, param)

    def register_buffer(self, name: str, value) -> None:
        """Register a non-learnable array saved in ``state_dict`` (e.g. running statistics)."""
        reserve(getattr(value, "nbytes", 0), f"buffer '{name}'")
        self.__dict__.pop(name, None)
        self._buffers[name] = value

    def add_module(self, name: str, module) -> None:
        setattr(self, name, module)

    # ----- traversal --------------------------------------------------------------------
    def named_modules(self, prefix: str = "", remove_duplicate: bool = True):
        """(name, module) for this module and every descendant, depth-first, no repeats
        (with ``remove_duplicate=False``, a module registered twice comes under each name)."""
        seen = set()
        stack = [(prefix, self)]
        while stack:
            name, module = stack.pop()
            if remove_duplicate and id(module) in seen:
                continue
            seen.add(id(module))
            yield name, module
            children = [(f"{name}.{k}" if name else k, m) for k, m in module._modules.items()
                        if m is not None]
            stack.extend(reversed(children))

    def modules(self):
        for _, m in self.named_modules():
            yield m

    def named_children(self):
        yield from ((k, m) for k, m in self._modules.items() if m is not None)

    def children(self):
        for _, m in self.named_children():
            yield m

    def named_parameters(self, prefix: str = "", recurse: bool = True):
        """(dotted name, Parameter) pairs in registration order; shared ones once."""
        seen = set()
        modules = self.named_modules(prefix) if recurse else [(prefix, self)]
        for mname, module in modules:
            for pname, p in module._parameters.items():
                if p is None or id(p) in seen:
                    continue
                seen.add(id(p))
                yield (f"{mname}.{pname}" if mname else pname), p

    def parameters(self, recurse: bool = True):
        for _, p in self.named_parameters(recurse=recurse):
            yield p

    def named_buffers(self, prefix: str = ""):
        for mname, module in self.named_modules(prefix):
            for bname, b in module._buffers.items():
                if b is not None:
                    yield (f"{mname}.{bname}" if mname else bname), b

    # ----- state --------------------------------------------------------------------------
    def state_dict(self) -> OrderedDict:
        """Parameters and buffers by dotted name, as arrays (shared, not copied, as torch)."""
        state = OrderedDict()
        for mname, module in self.named_modules(remove_duplicate=False):  # as torch
            for pname, p in module._parameters.items():
                if p is not None:
                    state[f"{mname}.{pname}" if mname else pname] = p.data
            for bname, b in module._buffers.items():
                if b is not None:
                    state[f"{mname}.{bname}" if mname else bname] = _host_array(b)
        return state

    def load_state_dict(self, state_dict, strict: bool = True):
        """Copy arrays into the parameters and buffers (torch tensors are accepted too).

        Shapes must match exactly. With ``strict``, the keys must match exactly too;
        otherwise the missing and unexpected keys are returned.

        Returns
        -------
        (missing_keys, unexpected_keys) : tuple of lists
        """
        own = self._state_slots()
        missing = [k for k in own if k not in state_dict]
        unexpected = [k for k in state_dict if k not in own]
        if strict and (missing or unexpected):
            raise KeyError(
                f"state_dict does not match {type(self).__name__}: missing keys {missing}, "
                f"unexpected keys {unexpected}"
            )
        checked = []
        for key, (module, name, kind) in own.items():  # check everything, then copy
            if key not in state_dict:
                continue
            value = _host_array(state_dict[key])
            current = module._parameters[name].data if kind == "p" else module._buffers[name]
            if getattr(value, "dtype", np.dtype(object)).kind not in "biuf":
                raise TypeError(
                    f"state_dict['{key}'] must be a real numeric array, got "
                    f"{type(state_dict[key]).__name__} of dtype "
                    f"{getattr(value, 'dtype', None)}"
                )
            if tuple(value.shape) != tuple(current.shape):
                raise ValueError(
                    f"state_dict['{key}'] has shape {tuple(value.shape)} but the module's "
                    f"'{key}' has shape {tuple(current.shape)}"
                )
            checked.append((key, module, name, kind, value, current))
        for _key, module, name, kind, value, current in checked:
            if kind == "p":
                module._parameters[name].data = _as_module_array(value, current)
            else:
                module._buffers[name] = _as_module_array(value, current)
        return missing, unexpected

    def _state_slots(self):
        slots = OrderedDict()
        for mname, module in self.named_modules(remove_duplicate=False):
            for name, p in module._parameters.items():
                if p is not None:
                    slots[f"{mname}.{name}" if mname else name] = (module, name, "p")
            for name, b in module._buffers.items():
                if b is not None:
                    slots[f"{mname}.{name}" if mname else name] = (module, name, "b")
        return slots

    # ----- modes and gradients -----------------------------------------------------------
    def train(self, mode: bool = True):
        for m in self.modules():
            object.__setattr__(m, "training", bool(mode))
        return self

    def eval(self):
        return self.train(False)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.parameters():
            if set_to_none or p.grad is None:
                p.grad = None
            else:
                p.grad[...] = 0

    def requires_grad_(self, requires_grad: bool = True):
        for p in self.parameters():
            p.requires_grad_(requires_grad)
        return self

    def apply(self, fn):
        """Call ``fn(module)`` on every sub-module, children first, then on self."""
        for m in self.children():
            m.apply(fn)
        fn(self)
        return self

    def astype(self, dtype):
        """Cast every parameter (and floating buffer) to ``dtype`` in place (``.double()``)."""
        for p in self.parameters():
            p.data = p.data.astype(dtype)
            p.grad = None
        for m in self.modules():
            for name, b in m._buffers.items():
                if b is not None and b.dtype.kind == "f":
                    m._buffers[name] = b.astype(dtype)
        return self

    def double(self):
        return self.astype(np.float64)

    def float(self):
        return self.astype(np.float32)

    def to(self, device=None, dtype=None):
        """Move (and optionally cast) every parameter and buffer in place; returns self.

        Parameters
        ----------
        device : 'cpu', 'cuda', 'cuda:N' or None
            Where the arrays go: NumPy arrays ('cpu') or CuPy arrays on GPU N ('cuda' is
            the current GPU). None keeps them where they are. A dtype given here instead
            (``model.to(np.float64)``, as torch) is taken as ``dtype``.
        dtype : float32, float64 or None
            Cast the floating-point parameters and buffers too (as ``astype``).

        The Parameter objects stay the same (only their ``.data`` is replaced), so an
        optimizer built before the move keeps them; its state arrays follow the parameters
        at its next ``step()`` (one copy each). As in torch, moving the model before building
        the optimizer avoids that copy. Gradients are dropped (set to None).

        Raises RuntimeError for a GPU device when CuPy is missing or no GPU is visible.

        Examples
        --------
        >>> import numpy as np, nnkit as nk
        >>> model = nk.nn.Linear(3, 2)
        >>> model.to("cpu") is model
        True
        >>> model.to(np.float64).weight.dtype
        dtype('float64')
        """
        if dtype is None and device is not None and not isinstance(device, str):
            try:  # to(np.float64), as torch's to(dtype)
                device, dtype = None, Module._float_dtype(device)
            except TypeError:
                raise TypeError(f"device must be 'cpu', 'cuda', 'cuda:N' or a float dtype, got "
                                f"{device!r} ({type(device).__name__})") from None
        move = None if device is None else Module._array_mover(device)
        dtype = None if dtype is None else Module._float_dtype(dtype)
        for p in self.parameters():
            data = p.data if move is None else move(p.data)
            p.data = data if dtype is None or data.dtype.kind != "f" else data.astype(dtype)
            p.grad = None
        for m in self.modules():
            for name, b in m._buffers.items():
                if b is None:
                    continue
                b = b if move is None else move(b)
                m._buffers[name] = b if dtype is None or b.dtype.kind != "f" else b.astype(dtype)
        return self

    def cuda(self, device=None):
        """``to('cuda')`` (or ``to(f'cuda:{device}')`` for an int ``device``)."""
        if device is None:
            return self.to("cuda")
        if isinstance(device, bool) or not isinstance(device, (int, np.integer)):
            raise TypeError(f"device must be an int GPU index or None, got {device!r}")
        return self.to(f"cuda:{int(device)}")

    def cpu(self):
        """``to('cpu')``: every parameter and buffer as a NumPy array."""
        return self.to("cpu")

    @staticmethod
    def _float_dtype(dtype):
        """``dtype`` as float32 or float64, or raise (for ``to``)."""
        try:
            dt = np.dtype(dtype)
        except TypeError:
            raise TypeError(f"dtype must be float32 or float64, got {dtype!r}") from None
        if dt not in (np.dtype(np.float32), np.dtype(np.float64)):
            raise TypeError(f"dtype must be float32 or float64, got {dt}")
        return dt

    @staticmethod
    def _parse_device(device):
        """'cpu' -> None; 'cuda' -> -1 (the current GPU); 'cuda:N' -> N; else raise."""
        if not isinstance(device, str):
            raise TypeError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {device!r} "
                            f"({type(device).__name__})")
        name = device.strip().lower()
        if name == "cpu":
            return None
        if name == "cuda":
            return -1
        index = name[5:] if name.startswith("cuda:") else ""
        if not index.isdigit():
            raise ValueError(f"device must be 'cpu', 'cuda' or 'cuda:N' with N >= 0, got "
                             f"{device!r}")
        return int(index)

    @staticmethod
    def _array_mover(device):
        """A function putting one array on ``device`` (unchanged when it is already there)."""
        index = Module._parse_device(device)
        if index is None:
            return to_host
        hint = ('install CuPy with pip install "nnkit[cuda]" and check that an NVIDIA GPU is '
                'visible (nvidia-smi, CUDA_VISIBLE_DEVICES)')
        try:
            import cupy
        except ImportError:
            raise RuntimeError(f"to({device!r}) needs CuPy, which is not installed: {hint}"
                               ) from None
        try:
            count = cupy.cuda.runtime.getDeviceCount()
        except Exception as exc:  # CUDARuntimeError: no driver, or no device
            raise RuntimeError(f"to({device!r}): no GPU is visible to CuPy ({exc}); {hint}"
                               ) from None
        if count == 0:
            raise RuntimeError(f"to({device!r}): no GPU is visible to CuPy; {hint}")
        index = cupy.cuda.Device().id if index < 0 else index
        if index >= count:
            raise ValueError(f"device {device!r}: only {count} GPU(s) are visible "
                             f"(cuda:0 to cuda:{count - 1})")

        def move(a):
            if isinstance(a, cupy.ndarray) and a.device.id == index:
                return a
            with cupy.cuda.Device(index):
                host_or_gpu = a if isinstance(a, cupy.ndarray) else to_host(a)
                return cupy.array(host_or_gpu, copy=True)

        return move

    # ----- calling ----------------------------------------------------------------------
    def forward(self, *args, **kwargs):
        raise TypeError(f"{type(self).__name__} does not define forward()")

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def extra_repr(self) -> str:
        return ""

    def __repr__(self) -> str:
        lines = [f"{type(self).__name__}({self.extra_repr()}"]
        children = list(self.named_children())
        if not children:
            return lines[0] + ")"
        for name, m in children:
            body = repr(m).replace("\n", "\n  ")
            lines.append(f"  ({name}): {body}")
        return "\n".join(lines) + "\n)"


def _as_module_array(value, current):
    """``value`` copied into a fresh array of ``current``'s dtype and array module."""
    if isinstance(current, np.ndarray):
        return np.array(value, dtype=current.dtype, copy=True)
    from .._backend import array_module

    return array_module(current).array(value, dtype=current.dtype, copy=True)


class Sequential(Module):
    """Modules applied in order; sub-modules named '0', '1', ... as torch."""

    def __init__(self, *modules):
        super().__init__()
        if len(modules) == 1 and isinstance(modules[0], (dict, OrderedDict)):
            for name, m in modules[0].items():
                self.add_module(name, m)
        else:
            for i, m in enumerate(modules):
                if not isinstance(m, Module):
                    raise TypeError(f"Sequential takes Modules; argument {i} is "
                                    f"{type(m).__name__}")
                self.add_module(str(i), m)

    def __len__(self) -> int:
        return len(self._modules)

    def __getitem__(self, i):
        mods = list(self._modules.values())
        if isinstance(i, slice):
            return Sequential(*mods[i])
        return mods[i]

    def __iter__(self):
        return iter(self._modules.values())

    def append(self, module):
        self.add_module(str(len(self._modules)), module)
        return self

    def forward(self, x):
        for m in self._modules.values():
            x = m(x)
        return x


class ModuleList(Module):
    """A list of modules, registered as '0', '1', ... (no forward of its own)."""

    def __init__(self, modules=()):
        super().__init__()
        for m in modules:
            self.append(m)

    def append(self, module):
        if not isinstance(module, Module):
            raise TypeError(f"ModuleList holds Modules, got {type(module).__name__}")
        self.add_module(str(len(self._modules)), module)
        return self

    def extend(self, modules):
        for m in modules:
            self.append(m)
        return self

    def __len__(self) -> int:
        return len(self._modules)

    def __getitem__(self, i):
        mods = list(self._modules.values())
        return ModuleList(mods[i]) if isinstance(i, slice) else mods[i]

    def __iter__(self):
        return iter(self._modules.values())
