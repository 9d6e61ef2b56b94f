r"""First-order optimizers (``nk.optim``) whose updates are torch.optim's, step for step.

Every optimizer updates ``p.data`` in place (modules keep their arrays), skips parameters
whose ``grad`` is None, and keeps torch's per-parameter state names (``momentum_buffer``,
``sum``, ``exp_avg``, ``exp_avg_sq``, ``max_exp_avg_sq``, ``step``), so a torch optimizer's
``state_dict`` loads here and ours loads there. Below, g_t is the gradient at step t (after
``maximize`` negates it), eta = ``lr``, lambda = ``weight_decay``; the update formulas are
torch's single-tensor ("for-loop") implementations, operation for operation.

Heavy ball (``SGD`` with ``momentum`` = beta). Notes §3.3 writes

    theta_{t+1} = theta_t - eta grad h(theta_t) + beta (theta_t - theta_{t-1}),
    theta_{-1} = theta_0,

torch keeps a buffer instead of the previous iterate:

    g_t <- g_t + lambda theta_t                              (if weight_decay)
    b_0 = g_0,  b_t = beta b_{t-1} + (1 - dampening) g_t     (the first buffer is the gradient)
    theta_{t+1} = theta_t - eta b_t                          (nesterov: - eta (g_t + beta b_t))

With dampening 0 the two are the same recursion: theta_{t+1} - theta_t = -eta b_t =
beta (theta_t - theta_{t-1}) - eta g_t. On a constant gradient delta the step after t + 1
updates is -eta (sum_{tau=0}^{t} beta^tau) delta, so the effective rate grows towards
eta / (1 - beta) (notes §3.3 prints the sum from tau = 1 to t - 1, which drops the plain
gradient step tau = 0). torch's ``nesterov=True`` is Sutskever's rewriting of the
extrapolate-then-step form of notes §3.3, chi = theta_t + beta (theta_t - theta_{t-1}),
theta_{t+1} = chi - eta grad h(chi), tracked at the extrapolated point.

Adagrad. Notes §3.3: gamma_t = gamma_{t-1} + g_t^2, theta_{t+1} = theta_t - eta g_t /
sqrt(gamma_t + delta). torch (and here) puts eps outside the root and decays the rate:

    sum_t = sum_{t-1} + g_t * g_t,  sum_0 = initial_accumulator_value
    theta_{t+1} = theta_t - eta / (1 + (t - 1) lr_decay) * g_t / (sqrt(sum_t) + eps)

so the form of notes §3.3 with delta is ``Adagrad(initial_accumulator_value=delta)`` as
eps -> 0, and the default (0, 1e-10) is that form as delta -> 0.

Adam (Kingma and Ba, 2014). Notes §3.3: m_t = beta m_{t-1} + (1 - beta) g_t, gamma_t =
alpha gamma_{t-1} + (1 - alpha) g_t^2, theta_{t+1} = theta_t - eta m_t / sqrt(gamma_t +
delta) (the rate of notes §3.3 is 1 / sqrt(gamma_t + delta), i.e. eta = 1). Without bias
correction its first step from m_0 = gamma_0 = 0 (delta = 0) is (1 - beta) / sqrt(1 - alpha)
times torch's (3.16 at the default betas). torch adds the bias corrections and again puts eps
outside the root:

    m_t = beta1 m_{t-1} + (1 - beta1) g_t            (computed as torch's lerp)
    v_t = beta2 v_{t-1} + (1 - beta2) g_t * g_t      (amsgrad: use vmax_t = max(vmax_{t-1}, v_t))
    theta_{t+1} = theta_t - eta / (1 - beta1^t) * m_t / (sqrt(v_t) / sqrt(1 - beta2^t) + eps)

``Adam``'s weight decay adds lambda theta_t to g_t (L2 penalty); ``AdamW`` decouples it,
theta_t <- theta_t (1 - eta lambda) before the moment updates (Loshchilov and Hutter, 2019).

Scalars (bias corrections, step sizes) are Python floats; arrays keep their dtype, so a
float32 model is updated in float32 as torch does. Results agree with torch to a few ulps,
not bit for bit: torch's CPU kernels use fused multiply-adds where NumPy and Numba do not.

Examples
--------
>>> import numpy as np
>>> import nnkit as nk
>>> w = nk.nn.Parameter(np.array([1.0, -2.0]))
>>> opt = nk.optim.SGD([w], lr=0.1, momentum=0.9)
>>> w.grad = np.array([1.0, 1.0])
>>> opt.step()
>>> w.data
array([ 0.9, -2.1])
"""

from __future__ import annotations

import abc
import copy
import math
import numbers
from collections import defaultdict

import numpy as np

from ._backend import array_module, is_gpu_array, to_host
from ._validation import check_bool, check_scalar, describe_dtype, dtype_names
from .autograd import Tensor, enable_grad
from .kernels.optim import adam_step, fusable, sgd_step

__all__ = ["Optimizer", "SGD", "Adagrad", "Adam", "AdamW", "clip_grad_norm_"]


# ----- helpers --------------------------------------------------------------------------------
def _check_betas(betas, name: str = "betas") -> tuple:
    if isinstance(betas, (str, bytes)) or not hasattr(betas, "__len__") or len(betas) != 2:
        raise TypeError(f"{name} must be a pair (beta1, beta2) of floats in [0, 1), "
                        f"got {betas!r}")
    betas = tuple(betas)
    for i, beta in enumerate(betas):
        check_scalar(beta, name=f"{name}[{i}]", low=0.0, high=1.0, high_inclusive=False)
    return betas


def _check_step(value, name: str, low: int) -> int:
    """A saved step count as an int >= ``low``: an integer, or an integral float or 0-d
    array (torch saves ``step`` as a float tensor); a ``TypeError``/``ValueError`` naming
    ``name`` otherwise."""
    if hasattr(value, "shape") and hasattr(value, "item"):
        if tuple(value.shape) != ():
            raise TypeError(f"{name} must be a scalar step count, got an array of shape "
                            f"{tuple(value.shape)}")
        value = value.item()
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return int(check_scalar(value, name=name, kind=numbers.Integral, low=low))


def _to_numpy(value):
    """A host copy of an array: NumPy, CuPy or a torch tensor (without importing torch)."""
    return np.array(to_host(value), copy=True)


def _real_view(a):
    """Complex arrays as interleaved real views (torch's ``view_as_real``), others as is."""
    return a.view(a.real.dtype) if a.dtype.kind == "c" else a


def _buckets(entries):
    """{key: [entry, ...]} keeping the parameters' order within each key."""
    out = {}
    for key, entry in entries:
        out.setdefault(key, []).append(entry)
    return out


def _flat(a):
    return a.reshape(a.size)  # a C-contiguous array: a view


class Optimizer(abc.ABC):
    """Abstract base class: parameter groups, per-parameter state, ``zero_grad`` and ``state_dict``.

    Parameters
    ----------
    params : iterable of Parameter, or iterable of dict
        The tensors to optimize, or parameter groups: dicts with a ``'params'`` entry and any
        hyper-parameters that override ``defaults`` for that group (torch's layout).
    defaults : dict
        The hyper-parameters each group starts from.

    Attributes
    ----------
    param_groups : list of dict
        One dict per group, ``'params'`` (a list of tensors) and the hyper-parameters; edit
        ``group['lr']`` between steps to schedule the learning rate.
    state : defaultdict(dict)
        Per-parameter state (buffers as arrays of the parameter's shape and dtype, ``step``
        as an int), keyed by the parameter.
    """

    # What a saved per-parameter state holds: buffer name -> whether it must be there (an
    # array of the parameter's shape), and the least valid ``step`` (None: no step count).
    _state_buffers: dict = {}
    _first_step: int | None = None
    # The parameter dtypes the update supports; None: any (floating-point or complex).
    _param_dtypes: tuple | None = None

    def __init__(self, params, defaults: dict):
        self.defaults = dict(defaults)
        self.state = defaultdict(dict)
        self.param_groups = []
        self._scratch = {}  # id(param) -> work arrays for the NumPy/CuPy path; never saved
        if isinstance(params, Tensor):
            raise TypeError("params must be an iterable of Parameters or of dicts, got a "
                            "single Tensor; wrap it in a list: [param]")
        if isinstance(params, dict):
            raise TypeError("params must be an iterable of Parameters or of dicts, got one "
                            "dict; wrap the parameter group in a list: [group]")
        if isinstance(params, (str, bytes)) or not hasattr(params, "__iter__"):
            raise TypeError(f"params must be an iterable of Parameters or of dicts, got "
                            f"{type(params).__name__}")
        groups = list(params)
        if len(groups) == 0:
            raise ValueError("optimizer got an empty parameter list: pass model.parameters() "
                             "of a model that has parameters")
        if not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        for group in groups:
            self.add_param_group(group)

    # ----- groups -------------------------------------------------------------------------
    def _check_options(self, options: dict, where: str = "") -> None:  # noqa: B027 (optional hook)
        """Validate a group's hyper-parameters (subclasses); ``where`` prefixes the names."""

    def add_param_group(self, param_group: dict) -> None:
        """Add a group of parameters with its own hyper-parameters (defaults fill the rest).

        Useful when fine-tuning: unfreeze layers and add them to the optimizer as training
        goes on. The dict is copied; the group appended to ``param_groups`` is the copy.
        """
        if not isinstance(param_group, dict):
            raise TypeError(f"param_group must be a dict with a 'params' entry, got "
                            f"{type(param_group).__name__}")
        if "params" not in param_group:
            raise ValueError(f"param_group must have a 'params' entry; got the keys "
                             f"{sorted(map(str, param_group))}")
        group = dict(param_group)
        params = group["params"]
        if isinstance(params, Tensor):
            params = [params]
        elif isinstance(params, (set, frozenset)):
            raise TypeError("the parameters of a group must be an ordered collection (a list), "
                            "not a set: the order of a set changes between runs")
        elif isinstance(params, (str, bytes, dict)) or not hasattr(params, "__iter__"):
            raise TypeError(f"param_group['params'] must be a Parameter or an iterable of "
                            f"Parameters, got {type(params).__name__}")
        params = list(params)
        for p in params:
            if not isinstance(p, Tensor):
                raise TypeError(f"an optimizer can only optimize Parameters (nnkit Tensors), "
                                f"but one of the params is a {type(p).__name__}")
            if not p.is_leaf:
                raise ValueError("can't optimize a non-leaf Tensor: pass the Parameters of the "
                                 "model (leaves), not results of ops on them")
        ids = {id(p) for p in params}
        if len(ids) != len(params):
            raise ValueError("a parameter group holds the same parameter twice")
        for other in self.param_groups:
            if not ids.isdisjoint(id(p) for p in other["params"]):
                raise ValueError("some parameters appear in more than one parameter group")
        first = sum(len(g["params"]) for g in self.param_groups)
        for i, p in enumerate(params):
            self._check_param(p, first + i, len(self.param_groups))
        group["params"] = params
        for name, default in self.defaults.items():
            group.setdefault(name, default)
        self._check_options(group, where=f" (param group {len(self.param_groups)})")
        self.param_groups.append(group)
        self._init_group_state(group)

    def _check_param(self, p, index: int, group_index: int) -> None:
        """Refuse a parameter the in-place update cannot write: a dtype outside
        ``_param_dtypes`` (``TypeError``) or a read-only NumPy array (``ValueError``); the
        message numbers it as ``state_dict`` does."""
        data = p.data
        where = (f"{type(self).__name__}: parameter {index} (param group {group_index}, "
                 f"shape {p.shape})")
        dtype = np.dtype(data.dtype)
        if self._param_dtypes is not None and dtype not in self._param_dtypes:
            native = dtype.newbyteorder("=")
            cast = native if native in self._param_dtypes else np.dtype(np.float32)
            raise TypeError(f"{where} has dtype {describe_dtype(dtype)}; "
                            f"{type(self).__name__} updates {dtype_names(self._param_dtypes)} "
                            f"parameters: cast it with p.data = p.data.astype(np.{cast.name})"
                            + (" (or the model with .float())" if cast == np.float32 else ""))
        if isinstance(data, np.ndarray) and not data.flags.writeable:
            raise ValueError(f"{where} is read-only (an array with writeable=False, such as a "
                             f"view from np.broadcast_to); the optimizer updates parameters in "
                             f"place: give it a writeable copy, p.data = p.data.copy()")

    def _check_params(self) -> None:
        """``_check_param`` on every parameter the step will update (a parameter's data may
        have been replaced since the optimizer was made), before any of them moves."""
        index = 0
        for group_index, group in enumerate(self.param_groups):
            for p in group["params"]:
                if p.grad is not None:
                    self._check_param(p, index, group_index)
                index += 1

    def _init_group_state(self, group: dict) -> None:  # noqa: B027 (optional hook)
        """Eager per-parameter state (Adagrad's accumulator, as torch); lazy elsewhere."""

    # ----- gradients and stepping ---------------------------------------------------------
    def zero_grad(self, set_to_none: bool = True) -> None:
        """Reset every parameter's gradient: to None (the default, as torch) or to zeros."""
        check_bool(set_to_none, name="set_to_none")
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    if set_to_none:
                        p.grad = None
                    else:
                        p.grad.fill(0)

    def step(self, closure=None):
        """Update the parameters once; ``closure`` re-evaluates the model and returns the loss.

        Returns the closure's loss, or None without a closure. Overflow and NaN propagate
        silently into the parameters, as in torch (NumPy's floating-point warnings are off
        during the update).
        """
        loss = None
        if closure is not None:
            if not callable(closure):
                raise TypeError(f"closure must be callable (returning the loss), got "
                                f"{type(closure).__name__}")
            with enable_grad():
                loss = closure()
        self._check_params()
        self._follow_parameters()
        with np.errstate(all="ignore"):
            self._update()
        return loss

    def _follow_parameters(self) -> None:
        """Move state arrays to where their parameter's data now lives (after
        ``model.to('cuda')`` or ``.cpu()`` on a model whose optimizer already has state);
        a no-op, without copies, when everything is in place."""
        for group in self.param_groups:
            for p in group["params"]:
                state = self.state.get(p)
                if not state:
                    continue
                kind = type(p.data)
                for name, value in state.items():
                    if isinstance(value, np.ndarray) or is_gpu_array(value):
                        if type(value) is not kind:
                            state[name] = self._cast_state(p, name, value)

    @abc.abstractmethod
    def _update(self) -> None:
        """One update of every parameter with a gradient (each optimizer's formula)."""

    def _work(self, p, n: int):
        """``n`` scratch arrays shaped like ``p`` for the array-at-a-time path (cached)."""
        bufs = self._scratch.get(id(p))
        data = p.data
        if bufs is None or len(bufs) < n or bufs[0].shape != data.shape or \
                bufs[0].dtype != data.dtype or type(bufs[0]) is not type(data):
            xp = array_module(data)
            bufs = [xp.empty_like(data) for _ in range(n)]
            self._scratch[id(p)] = bufs
        return bufs

    def _grad(self, p, g, maximize: bool, weight_decay: float, work):
        """torch's ``grad = -grad if maximize``; ``grad = grad + weight_decay * param``."""
        if g.shape != p.data.shape:
            raise ValueError(f"a parameter of shape {p.shape} has a gradient of shape "
                             f"{tuple(g.shape)}; gradients must match their parameters")
        if not maximize and weight_decay == 0:
            return g
        xp = array_module(p.data)
        if maximize:
            xp.negative(g, out=work)
        else:
            work[...] = g
        if weight_decay != 0:
            tmp = xp.multiply(p.data, weight_decay)
            work += tmp
        return work

    # ----- saving and resuming -------------------------------------------------------------
    def state_dict(self) -> dict:
        """The optimizer's state in torch's layout, as host copies.

        ``{'state': {index: {name: value}}, 'param_groups': [{..., 'params': [index, ...]}]}``
        where parameters are numbered in group order; arrays are NumPy copies, ``step`` an
        int. The parameters themselves are not saved (the model's ``state_dict`` holds them).
        """
        index = {}
        groups = []
        for group in self.param_groups:
            packed = {k: copy.deepcopy(v) for k, v in group.items() if k != "params"}
            for p in group["params"]:
                index.setdefault(id(p), len(index))
            packed["params"] = [index[id(p)] for p in group["params"]]
            groups.append(packed)
        state = {}
        for group in self.param_groups:
            for p in group["params"]:
                if p in self.state and self.state[p]:
                    state[index[id(p)]] = {
                        k: (_to_numpy(v) if hasattr(v, "shape") and hasattr(v, "dtype")
                            and k != "step" else copy.deepcopy(v))
                        for k, v in self.state[p].items()
                    }
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict) -> None:
        """Resume from a ``state_dict`` (ours or a torch optimizer's of the same kind).

        The saved groups must have as many parameters as this optimizer's, in the same order;
        arrays are copied into the parameters' array module and dtype.
        """
        if not isinstance(state_dict, dict) or "state" not in state_dict or \
                "param_groups" not in state_dict:
            raise TypeError("state_dict must be a dict with 'state' and 'param_groups' entries, "
                            "as returned by Optimizer.state_dict()")
        if not isinstance(state_dict["state"], dict):
            raise TypeError(f"state_dict['state'] must be a dict {{index: state}}, got "
                            f"{type(state_dict['state']).__name__}")
        saved_groups = copy.deepcopy(list(state_dict["param_groups"]))
        if not all(isinstance(g, dict) and "params" in g for g in saved_groups):
            raise TypeError("state_dict['param_groups'] must be a list of dicts, each with a "
                            "'params' list of parameter indices")
        if len(saved_groups) != len(self.param_groups):
            raise ValueError(f"the state_dict has {len(saved_groups)} parameter groups but the "
                             f"optimizer has {len(self.param_groups)}")
        for i, (group, saved) in enumerate(zip(self.param_groups, saved_groups, strict=True)):
            if len(group["params"]) != len(saved["params"]):
                raise ValueError(
                    f"parameter group {i} of the state_dict has {len(saved['params'])} "
                    f"parameters but the optimizer's has {len(group['params'])}"
                )
        id_map = {}
        for group, saved in zip(self.param_groups, saved_groups, strict=True):
            id_map.update(zip(saved["params"], group["params"], strict=True))
        new_groups = []
        for i, (group, saved) in enumerate(zip(self.param_groups, saved_groups, strict=True)):
            new_group = {**saved, "params": group["params"]}
            for name, default in self.defaults.items():
                new_group.setdefault(name, default)
            self._check_options(new_group, where=f" (param group {i} of the state_dict)")
            new_groups.append(new_group)
        state = defaultdict(dict)
        for key, values in state_dict["state"].items():
            if key not in id_map:
                continue
            state[id_map[key]] = self._load_state(id_map[key], values,
                                                  f"state_dict['state'][{key!r}]")
        self.param_groups = new_groups
        self.state = state
        self._scratch = {}

    def _load_state(self, p, values, where: str) -> dict:
        """A saved state of ``p`` (``where`` names it), checked entry by entry and cast."""
        if not isinstance(values, dict):
            raise TypeError(f"{where} must be a dict of state entries, got "
                            f"{type(values).__name__}")
        required = [k for k, needed in self._state_buffers.items() if needed]
        if self._first_step is not None:
            required.insert(0, "step")
        missing = [k for k in required if k not in values]
        if values and missing:
            raise ValueError(f"{where} lacks {missing}: a {type(self).__name__} state holds "
                             f"{required}")
        return {name: self._cast_state(p, name, v, where) for name, v in values.items()}

    def _cast_state(self, p, name, value, where="the state"):
        """One state entry on ``p``'s device and in its dtype, or a named error: ``step`` a
        count >= ``_first_step``; buffers arrays of ``p``'s shape and of a dtype that casts
        to ``p``'s without losing its kind (no complex moments for a real parameter)."""
        label = f"{where}[{name!r}]"
        if name == "step" and self._first_step is not None:
            return _check_step(value, label, self._first_step)
        if not (hasattr(value, "shape") and hasattr(value, "dtype")):
            if name in self._state_buffers and not (value is None and
                                                    not self._state_buffers[name]):
                raise TypeError(f"{label} must be an array of shape {p.shape}, got "
                                f"{type(value).__name__}")
            return copy.deepcopy(value)
        host = _to_numpy(value)
        if tuple(host.shape) != p.shape:
            raise ValueError(f"{label} has shape {tuple(host.shape)} but its parameter "
                             f"has shape {p.shape}")
        if not np.can_cast(host.dtype, p.data.dtype, casting="same_kind"):
            raise TypeError(f"{label} has dtype {host.dtype}, which does not cast to its "
                            f"parameter's dtype {p.data.dtype}")
        xp = array_module(p.data)
        return xp.array(host, dtype=p.data.dtype, order="C")

    def __repr__(self) -> str:
        lines = [f"{type(self).__name__} ("]
        for i, group in enumerate(self.param_groups):
            lines.append(f"Parameter Group {i}")
            lines.extend(f"    {k}: {group[k]}" for k in sorted(group) if k != "params")
        lines.append(")")
        return "\n".join(lines)


# ----- SGD -----------------------------------------------------------------------------------
class SGD(Optimizer):
    """Stochastic gradient descent with optional heavy-ball or Nesterov momentum (torch's).

    Parameters
    ----------
    params : iterable of Parameter or of dict
        Parameters or parameter groups.
    lr : float, >= 0
        Learning rate eta.
    momentum : float, >= 0
        Momentum factor beta (0: plain gradient descent).
    dampening : float
        The buffer adds (1 - dampening) g_t.
    nesterov : bool
        Nesterov momentum; needs momentum > 0 and dampening 0.
    weight_decay : float, >= 0
        L2 penalty lambda added to the gradient.
    maximize : bool
        Ascend instead of descend.

    Examples
    --------
    >>> import numpy as np
    >>> import nnkit as nk
    >>> w = nk.nn.Parameter(np.zeros(3))
    >>> opt = nk.optim.SGD([w], lr=0.5)
    >>> w.grad = np.ones(3)
    >>> opt.step()
    >>> w.data
    array([-0.5, -0.5, -0.5])
    """

    _state_buffers = {"momentum_buffer": False}  # None in older torch state_dicts

    def __init__(self, params, lr=1e-3, momentum=0, dampening=0, nesterov=False,
                 weight_decay=0, maximize=False):
        defaults = {"lr": lr, "momentum": momentum, "dampening": dampening,
                    "weight_decay": weight_decay, "nesterov": nesterov, "maximize": maximize}
        self._check_options(defaults)
        super().__init__(params, defaults)

    def _check_options(self, options: dict, where: str = "") -> None:
        check_scalar(options["lr"], name="lr" + where, low=0.0)
        check_scalar(options["momentum"], name="momentum" + where, low=0.0)
        check_scalar(options["dampening"], name="dampening" + where)
        check_scalar(options["weight_decay"], name="weight_decay" + where, low=0.0)
        nesterov = check_bool(options["nesterov"], name="nesterov" + where)
        check_bool(options["maximize"], name="maximize" + where)
        if nesterov and (options["momentum"] <= 0 or options["dampening"] != 0):
            raise ValueError(f"nesterov=True{where} needs momentum > 0 and dampening=0, got "
                             f"momentum={options['momentum']!r}, "
                             f"dampening={options['dampening']!r}")

    def _update(self) -> None:
        for group in self.param_groups:
            lr = float(group["lr"])
            momentum = float(group["momentum"])
            dampening = float(group["dampening"])
            weight_decay = float(group["weight_decay"])
            nesterov = bool(group["nesterov"])
            maximize = bool(group["maximize"])
            fused = self._sgd_fused(group) if _USE_NUMBA else ()
            for p in group["params"]:
                g = p.grad
                if g is None or id(p) in fused:
                    continue
                data = p.data
                xp = array_module(data)
                work = self._work(p, 2)
                g = self._grad(p, g, maximize, weight_decay, work[0])
                if momentum != 0:
                    state = self.state[p]
                    buf = state.get("momentum_buffer")
                    if buf is None:
                        state["momentum_buffer"] = buf = g.copy()
                    else:
                        buf *= momentum
                        if dampening == 0:
                            buf += g
                        else:
                            xp.multiply(g, 1.0 - dampening, out=work[1])
                            buf += work[1]
                    if nesterov:
                        xp.multiply(buf, momentum, out=work[1])
                        if g is work[0]:
                            g += work[1]
                        else:
                            xp.add(g, work[1], out=work[0])
                            g = work[0]
                    else:
                        g = buf
                xp.multiply(g, lr, out=work[1])  # param.add_(grad, alpha=-lr)
                data -= work[1]

    def _sgd_fused(self, group) -> set:
        """The group's parameters a fused SGD step takes (``nnkit.kernels.optim.fusable``:
        on the GPU), updated by one multi-tensor step per device, dtype and first-or-later
        momentum step (a launch per 22 parameters); returns their ids (the loop skips
        them)."""
        momentum = float(group["momentum"])
        entries = []
        for p in group["params"]:
            g = p.grad
            if g is None:
                continue
            buf = self.state[p].get("momentum_buffer") if momentum != 0 else None
            if fusable("sgd", p.data, g, buf):
                entries.append(((type(p.data), p.data.dtype, momentum != 0 and buf is None), p))
        for (_kind, _dtype, first), params in _buckets(entries).items():
            if momentum != 0 and first:
                for p in params:  # written with the gradient by the step (torch's clone)
                    self.state[p]["momentum_buffer"] = array_module(p.data).empty_like(p.data)
            sgd_step(
                [_flat(p.data) for p in params], [_flat(p.grad) for p in params],
                [_flat(self.state[p]["momentum_buffer"]) for p in params]
                if momentum != 0 else None,
                lr=float(group["lr"]), momentum=momentum,
                dampening=float(group["dampening"]),
                weight_decay=float(group["weight_decay"]), nesterov=bool(group["nesterov"]),
                maximize=bool(group["maximize"]), first=first)
        return {id(p) for _key, p in entries}


# ----- Adagrad -------------------------------------------------------------------------------
class Adagrad(Optimizer):
    """Adagrad (Duchi et al., 2011) as torch implements it.

    Parameters
    ----------
    params : iterable of Parameter or of dict
        Parameters or parameter groups.
    lr : float, >= 0
        Learning rate eta.
    lr_decay : float, >= 0
        The rate at step t is eta / (1 + (t - 1) lr_decay).
    weight_decay : float, >= 0
        L2 penalty added to the gradient.
    initial_accumulator_value : float, >= 0
        Starting value of the sum of squared gradients.
    eps : float, > 0
        Added to the root of the sum.
    maximize : bool
        Ascend instead of descend.

    Notes
    -----
    A parameter group's own ``initial_accumulator_value`` sets its accumulators here; torch
    2.13 reads the constructor's value for every group (the one difference from torch).

    Examples
    --------
    >>> import numpy as np
    >>> import nnkit as nk
    >>> w = nk.nn.Parameter(np.zeros(2))
    >>> opt = nk.optim.Adagrad([w], lr=0.1)
    >>> w.grad = np.array([2.0, -3.0])
    >>> opt.step()
    >>> np.round(w.data, 6)
    array([-0.1,  0.1])
    """

    _state_buffers = {"sum": True}
    _first_step = 0  # the state is made with the optimizer, before any step

    def __init__(self, params, lr=1e-2, lr_decay=0, weight_decay=0,
                 initial_accumulator_value=0, eps=1e-10, maximize=False):
        defaults = {"lr": lr, "lr_decay": lr_decay, "eps": eps, "weight_decay": weight_decay,
                    "initial_accumulator_value": initial_accumulator_value,
                    "maximize": maximize}
        self._check_options(defaults)
        super().__init__(params, defaults)

    def _check_options(self, options: dict, where: str = "") -> None:
        check_scalar(options["lr"], name="lr" + where, low=0.0)
        check_scalar(options["lr_decay"], name="lr_decay" + where, low=0.0)
        check_scalar(options["weight_decay"], name="weight_decay" + where, low=0.0)
        check_scalar(options["initial_accumulator_value"],
                     name="initial_accumulator_value" + where, low=0.0)
        check_scalar(options["eps"], name="eps" + where, low=0.0, low_inclusive=False)
        check_bool(options["maximize"], name="maximize" + where)

    def _init_group_state(self, group: dict) -> None:
        init = float(group["initial_accumulator_value"])
        for p in group["params"]:
            state = self.state[p]
            if not state:
                state["step"] = 0
                state["sum"] = array_module(p.data).full_like(p.data, init)

    def _update(self) -> None:
        for group in self.param_groups:
            lr = float(group["lr"])
            lr_decay = float(group["lr_decay"])
            weight_decay = float(group["weight_decay"])
            eps = float(group["eps"])
            maximize = bool(group["maximize"])
            for p in group["params"]:
                g = p.grad
                if g is None:
                    continue
                state = self.state[p]
                if not state:
                    self._init_group_state(group)
                state["step"] += 1
                step = state["step"]
                xp = array_module(p.data)
                work = self._work(p, 2)
                g = self._grad(p, g, maximize, weight_decay, work[0])
                clr = lr / (1 + (step - 1) * lr_decay)
                data, g, total = _real_view(p.data), _real_view(g), _real_view(state["sum"])
                tmp, tmp2 = _real_view(work[1]), _real_view(work[0])
                xp.multiply(g, g, out=tmp)  # state_sum.addcmul_(grad, grad, value=1)
                total += tmp
                xp.sqrt(total, out=tmp)  # std = state_sum.sqrt().add_(eps)
                tmp += eps
                xp.multiply(g, -clr, out=tmp2)  # param.addcdiv_(grad, std, value=-clr)
                tmp2 /= tmp
                data += tmp2


# ----- Adam and AdamW ------------------------------------------------------------------------
# Set False to force the array-at-a-time path (the debugging path), for NumPy arrays (Adam's
# fused Numba pass) and CuPy arrays (SGD's and Adam's multi-tensor CUDA launches) alike.
_USE_NUMBA = True


class Adam(Optimizer):
    """Adam (Kingma and Ba, 2014), optionally AMSGrad, as torch implements it.

    Parameters
    ----------
    params : iterable of Parameter or of dict
        Parameters or parameter groups.
    lr : float, >= 0
        Learning rate eta.
    betas : (float, float), each in [0, 1)
        Decay rates (beta1, beta2) of the first and second moment averages.
    eps : float, > 0
        Added to the bias-corrected root of the second moment.
    weight_decay : float, >= 0
        L2 penalty added to the gradient (``decoupled_weight_decay=True``: AdamW's decay).
    amsgrad : bool
        Normalise by the running maximum of the second moment (Reddi et al., 2018).
    maximize : bool
        Ascend instead of descend.
    decoupled_weight_decay : bool
        Decay the parameters directly, theta <- theta (1 - eta lambda), as AdamW.

    Notes
    -----
    On C-contiguous NumPy arrays the update runs as one fused Numba pass per parameter
    (faster than torch.optim.Adam on a small MLP: benchmarks/RESULTS.md, "Foundation");
    on C-contiguous float CuPy arrays as one multi-tensor Numba CUDA launch per 17 parameters
    of a dtype and step count (``nnkit._ext.optim_cuda``, as torch's ``fused``); on other
    layouts and complex dtypes as in-place ufuncs with ``out=`` into a cached scratch array
    (13 or 14 kernels per parameter on the GPU). Parameters must be float32, float64,
    complex64 or complex128 (torch also takes float16; here it is a ``TypeError`` naming the
    parameter).

    Examples
    --------
    >>> import numpy as np
    >>> import nnkit as nk
    >>> w = nk.nn.Parameter(np.zeros(2))
    >>> opt = nk.optim.Adam([w], lr=0.1)
    >>> w.grad = np.array([2.0, -3.0])
    >>> opt.step()
    >>> np.round(w.data, 6)
    array([-0.1,  0.1])
    """

    _state_buffers = {"exp_avg": True, "exp_avg_sq": True, "max_exp_avg_sq": False}
    _first_step = 1  # made by the first step (step -1 would divide by 1 - beta1**0 = 0)
    # The fused Numba kernel's dtypes, and complex (the array path); not float16 as torch
    _param_dtypes = tuple(np.dtype(d) for d in (np.float32, np.float64, np.complex64,
                                                 np.complex128))

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0,
                 amsgrad=False, maximize=False, *, decoupled_weight_decay=False):
        defaults = {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay,
                    "amsgrad": amsgrad, "maximize": maximize,
                    "decoupled_weight_decay": decoupled_weight_decay}
        self._check_options(defaults)  # also makes betas a tuple
        super().__init__(params, defaults)

    def _check_options(self, options: dict, where: str = "") -> None:
        check_scalar(options["lr"], name="lr" + where, low=0.0)
        options["betas"] = _check_betas(options["betas"], name="betas" + where)
        check_scalar(options["eps"], name="eps" + where, low=0.0, low_inclusive=False)
        check_scalar(options["weight_decay"], name="weight_decay" + where, low=0.0)
        check_bool(options["amsgrad"], name="amsgrad" + where)
        check_bool(options["maximize"], name="maximize" + where)
        check_bool(options["decoupled_weight_decay"], name="decoupled_weight_decay" + where)

    def _update(self) -> None:
        for group in self.param_groups:
            lr = float(group["lr"])
            beta1, beta2 = float(group["betas"][0]), float(group["betas"][1])
            eps = float(group["eps"])
            weight_decay = float(group["weight_decay"])
            amsgrad = bool(group["amsgrad"])
            maximize = bool(group["maximize"])
            decoupled = bool(group["decoupled_weight_decay"])
            w1 = 1 - beta1
            fused = self._adam_fused(group) if _USE_NUMBA else ()
            for p in group["params"]:
                g = p.grad
                if g is None or id(p) in fused:
                    continue
                data = p.data
                state = self.state[p]
                if not state:
                    xp = array_module(data)
                    state["step"] = 0
                    state["exp_avg"] = xp.zeros_like(data)
                    state["exp_avg_sq"] = xp.zeros_like(data)
                    if amsgrad:
                        state["max_exp_avg_sq"] = xp.zeros_like(data)
                if amsgrad and "max_exp_avg_sq" not in state:  # amsgrad switched on later
                    state["max_exp_avg_sq"] = array_module(data).zeros_like(data)
                step = state["step"] = state["step"] + 1
                bias_correction1 = 1 - beta1**step
                bias_correction2 = 1 - beta2**step
                step_size = lr / bias_correction1
                bc2_sqrt = bias_correction2**0.5
                exp_avg = state["exp_avg"]
                exp_avg_sq = state["exp_avg_sq"]
                vmax = state["max_exp_avg_sq"] if amsgrad else exp_avg_sq
                self._adam_arrays(p, g, exp_avg, exp_avg_sq, vmax, lr, weight_decay,
                                  decoupled, maximize, amsgrad, w1, beta2, bc2_sqrt, eps,
                                  step_size)

    def _adam_fused(self, group) -> set:
        """The group's parameters a fused Adam step takes (``nnkit.kernels.optim.fusable``),
        their state made as the loop would, updated by one step per device, dtype and step
        count (one Numba pass per parameter on the CPU; on the GPU a launch per 17
        parameters, 13 with AMSGrad); returns their ids (the loop skips them)."""
        amsgrad = bool(group["amsgrad"])
        entries = []
        for p in group["params"]:
            g, data = p.grad, p.data
            if g is None:
                continue
            state = self.state[p]
            buffers = [state.get(k) for k in ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")]
            if not fusable("adam", data, g, *buffers[:2 if not amsgrad else 3]):
                continue
            if not state:
                state["step"] = 0
                state["exp_avg"] = array_module(data).zeros_like(data)
                state["exp_avg_sq"] = array_module(data).zeros_like(data)
            if amsgrad and "max_exp_avg_sq" not in state:
                state["max_exp_avg_sq"] = array_module(data).zeros_like(data)
            state["step"] += 1
            entries.append(((type(data), data.dtype, state["step"]), p))
        for (_kind, _dtype, step), params in _buckets(entries).items():
            states = [self.state[p] for p in params]
            adam_step(
                [_flat(p.data) for p in params], [_flat(p.grad) for p in params],
                [_flat(s["exp_avg"]) for s in states], [_flat(s["exp_avg_sq"]) for s in states],
                [_flat(s["max_exp_avg_sq"]) for s in states] if amsgrad else None,
                lr=float(group["lr"]), beta1=float(group["betas"][0]),
                beta2=float(group["betas"][1]), eps=float(group["eps"]),
                weight_decay=float(group["weight_decay"]), step=step,
                maximize=bool(group["maximize"]),
                decoupled=bool(group["decoupled_weight_decay"]))
        return {id(p) for _key, p in entries}

    def _adam_arrays(self, p, g, exp_avg, exp_avg_sq, vmax, lr, weight_decay, decoupled,
                     maximize, amsgrad, w1, beta2, bc2_sqrt, eps, step_size):
        """The same update as in-place ufuncs (CuPy arrays, odd layouts, complex dtypes)."""
        data = p.data
        xp = array_module(data)
        work = self._work(p, 2)
        if weight_decay != 0 and decoupled:
            data *= 1 - lr * weight_decay
        g = self._grad(p, g, maximize, 0.0 if decoupled else weight_decay, work[0])
        data, g, tmp = _real_view(data), _real_view(g), _real_view(work[1])
        exp_avg, exp_avg_sq, vmax = _real_view(exp_avg), _real_view(exp_avg_sq), _real_view(vmax)
        xp.subtract(g, exp_avg, out=tmp)  # exp_avg.lerp_(grad, 1 - beta1)
        if w1 < 0.5:
            tmp *= w1
            exp_avg += tmp
        else:
            tmp *= 1 - w1
            xp.subtract(g, tmp, out=exp_avg)
        exp_avg_sq *= beta2  # exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        xp.multiply(g, 1 - beta2, out=tmp)
        tmp *= g
        exp_avg_sq += tmp
        if amsgrad:
            xp.maximum(vmax, exp_avg_sq, out=vmax)
        else:
            vmax = exp_avg_sq
        xp.sqrt(vmax, out=tmp)  # denom = (v.sqrt() / bias_correction2_sqrt).add_(eps)
        tmp /= bc2_sqrt
        tmp += eps
        xp.divide(exp_avg, tmp, out=tmp)  # param.addcdiv_(exp_avg, denom, value=-step_size)
        tmp *= -step_size
        data += tmp


class AdamW(Adam):
    """Adam with decoupled weight decay (Loshchilov and Hutter, 2019), as torch.optim.AdamW.

    Same parameters as :class:`Adam` but ``weight_decay`` defaults to 1e-2 and decays the
    parameters directly: theta <- theta (1 - eta lambda) before the Adam update.

    Examples
    --------
    >>> import numpy as np
    >>> import nnkit as nk
    >>> w = nk.nn.Parameter(np.ones(2))
    >>> opt = nk.optim.AdamW([w], lr=0.1, weight_decay=0.5)
    >>> w.grad = np.zeros(2)
    >>> opt.step()
    >>> w.data
    array([0.95, 0.95])
    """

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2,
                 amsgrad=False, maximize=False):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                         amsgrad=amsgrad, maximize=maximize, decoupled_weight_decay=True)

    def load_state_dict(self, state_dict: dict) -> None:
        super().load_state_dict(state_dict)
        for group in self.param_groups:  # as torch: AdamW always decouples
            group["decoupled_weight_decay"] = True


# ----- gradient clipping ---------------------------------------------------------------------
def clip_grad_norm_(parameters, max_norm, norm_type=2.0, error_if_nonfinite=False) -> float:
    """Scale the gradients in place so that their total norm is at most ``max_norm`` (torch's).

    The total norm is the ``norm_type``-norm of all gradients viewed as one vector (the norm
    of the per-tensor norms); when ``max_norm / (total + 1e-6) < 1`` every gradient is
    multiplied by that factor. Parameters without a gradient are ignored.

    Parameters
    ----------
    parameters : Tensor or iterable of Tensor
        The parameters whose ``.grad`` to clip.
    max_norm : float, >= 0
        The largest allowed total norm.
    norm_type : float or inf, > 0
        The p of the p-norm; ``float('inf')`` (or ``'inf'``) for the largest absolute value.
    error_if_nonfinite : bool
        Raise ``RuntimeError`` (torch's exception) when the total norm is NaN or infinite.

    Returns
    -------
    float
        The total norm before clipping.

    Examples
    --------
    >>> import numpy as np
    >>> import nnkit as nk
    >>> w = nk.nn.Parameter(np.zeros(2))
    >>> w.grad = np.array([3.0, 4.0])
    >>> nk.optim.clip_grad_norm_([w], max_norm=1.0)
    5.0
    >>> np.round(w.grad, 6)
    array([0.6, 0.8])
    """
    check_scalar(max_norm, name="max_norm", low=0.0)
    if isinstance(norm_type, str) and norm_type.lower() == "inf":
        norm_type = math.inf
    if isinstance(norm_type, (bool, np.bool_)) or not isinstance(norm_type, numbers.Real):
        raise TypeError(f"norm_type must be a positive real number or inf, got {norm_type!r}")
    norm_type = float(norm_type)
    if not norm_type > 0:
        raise ValueError(f"norm_type must be > 0 (or inf), got {norm_type!r}")
    check_bool(error_if_nonfinite, name="error_if_nonfinite")
    if isinstance(parameters, Tensor):
        parameters = [parameters]
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return 0.0
    if norm_type == math.inf:
        total = max(float(array_module(g).abs(g).max()) if g.size else 0.0 for g in grads)
    else:
        norms = []
        for g in grads:
            xp = array_module(g)
            flat = g.reshape(-1)
            if norm_type == 2.0:
                norms.append(float(xp.sqrt(xp.vdot(flat, flat).real)))
            else:
                with np.errstate(over="ignore"):
                    norms.append(float((xp.abs(flat) ** norm_type).sum() ** (1.0 / norm_type)))
        if norm_type == 2.0:
            total = math.hypot(*norms)  # scaled: no overflow for huge norms
        else:
            with np.errstate(over="ignore", invalid="ignore"):
                total = float(np.linalg.norm(np.array(norms), ord=norm_type))
    if error_if_nonfinite and not math.isfinite(total):
        raise RuntimeError(
            f"the total norm of order {norm_type} of the gradients is non-finite, so it cannot "
            f"be clipped; pass error_if_nonfinite=False to scale by it anyway"
        )
    clip_coef = max_norm / (total + 1e-6)
    if not clip_coef >= 1.0:  # as torch's clamp(coef, max=1): a NaN norm spreads to the grads
        with np.errstate(invalid="ignore"):  # inf * 0 when the norm is infinite
            for g in grads:
                g *= clip_coef
    return total
