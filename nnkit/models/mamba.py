"""Mamba language models (Gu and Dao 2023) with transformers' module tree and names.

``MambaModel`` is token embeddings, ``num_hidden_layers`` residual blocks
h = h + Mamba(RMSNorm(h)) (``nn.Mamba``, ``nn.RMSNorm``) and a final RMSNorm ``norm_f``;
``MambaForCausalLM`` puts the language-model head on it (by default the embedding matrix
itself: ``tie_word_embeddings``). Their ``state_dict`` names are transformers'
``MambaModel``'s and ``MambaForCausalLM``'s (``embeddings.weight``,
``layers.{i}.norm.weight``, ``layers.{i}.mixer.in_proj.weight``, ..., ``norm_f.weight``;
``backbone.`` before them in the LM), and ``from_pretrained`` / ``save_pretrained`` read and
write Hugging Face checkpoint folders (``nnkit.models.pretrained``).

``MambaConfig`` holds transformers' ``MambaConfig`` fields; the models take one, a dict of
its fields, or transformers' own config object.

Decoding is recurrent: ``MambaForCausalLM.generate`` runs the prompt through the fused
selective scan once, then each new token through every layer's ``Mamba.step`` with a state of
constant size (batch, E, d_conv) + (batch, E, N) per layer: O(1) time per token whatever the
length, and the same tokens as recomputing the whole sequence every step.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Mapping

import numpy as np

from .. import functional as F
from .._backend import array_module
from ..autograd import Tensor, no_grad
from ..nn.layers import Embedding, Linear, _dtype
from ..nn.mamba import Mamba, MambaState, RMSNorm
from ..nn.module import Module, ModuleList
from ._hub import PretrainedMixin

__all__ = ["MambaConfig", "MambaModel", "MambaForCausalLM"]


@dataclasses.dataclass
class MambaConfig:
    """transformers' ``MambaConfig`` fields (and its defaults: mamba-2.8b's sizes).

    ``intermediate_size`` is expand * hidden_size; ``time_step_rank`` "auto" is
    ceil(hidden_size / 16). ``hidden_act`` must be "silu" (the only activation Mamba's
    mixer has). ``residual_in_fp32`` only matters for float16/bfloat16 models: nnkit's run
    in float32 or float64 throughout.
    """

    vocab_size: int = 50280
    hidden_size: int = 768
    state_size: int = 16
    num_hidden_layers: int = 32
    layer_norm_epsilon: float = 1e-5
    pad_token_id: int | None = 0
    bos_token_id: int | None = 0
    eos_token_id: int | None = 0
    expand: int = 2
    conv_kernel: int = 4
    use_bias: bool = False
    use_conv_bias: bool = True
    hidden_act: str = "silu"
    initializer_range: float = 0.1
    residual_in_fp32: bool = True
    time_step_rank: int | str = "auto"
    time_step_scale: float = 1.0
    time_step_min: float = 0.001
    time_step_max: float = 0.1
    time_step_init_scheme: str = "random"
    time_step_floor: float = 1e-4
    rescale_prenorm_residual: bool = False
    tie_word_embeddings: bool = True

    def __post_init__(self):
        if self.hidden_act != "silu":
            raise ValueError(f"hidden_act must be 'silu' (Mamba's mixer activation), got "
                             f"{self.hidden_act!r:.100}")
        for name in ("vocab_size", "hidden_size", "state_size", "expand", "conv_kernel"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r:.100}")
        layers = self.num_hidden_layers
        if isinstance(layers, bool) or not isinstance(layers, numbers.Integral) or layers < 0:
            raise ValueError(f"num_hidden_layers must be an int >= 0, got {layers!r:.100}")
        if self.time_step_rank == "auto":
            self.time_step_rank = math.ceil(self.hidden_size / 16)

    @property
    def intermediate_size(self) -> int:
        return self.expand * self.hidden_size

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def of(cls, config=None, **fields) -> MambaConfig:
        """A MambaConfig from None (defaults), a MambaConfig, a dict of fields, or any object
        with the fields as attributes (transformers' ``MambaConfig``); ``fields`` override."""
        names = [f.name for f in dataclasses.fields(cls)]
        if config is None:
            base = {}
        elif isinstance(config, cls):
            base = config.to_dict()
        elif isinstance(config, Mapping):
            unknown = sorted(set(config) - set(names))
            if unknown:
                raise TypeError(f"config has fields MambaConfig does not know: {unknown}")
            base = dict(config)
        else:
            base = {n: getattr(config, n) for n in names if hasattr(config, n)}
        unknown = sorted(set(fields) - set(names))
        if unknown:
            raise TypeError(f"unknown MambaConfig fields: {unknown}")
        return cls(**{**base, **fields})


def _mixer_arguments(config: MambaConfig) -> dict:
    """``nn.Mamba``'s constructor arguments for the config's mixers."""
    return dict(d_state=config.state_size, d_conv=config.conv_kernel, expand=config.expand,
                dt_rank=config.time_step_rank, dt_min=config.time_step_min,
                dt_max=config.time_step_max, dt_init=config.time_step_init_scheme,
                dt_scale=config.time_step_scale, dt_init_floor=config.time_step_floor,
                conv_bias=config.use_conv_bias, bias=config.use_bias)


class MambaBlock(Module):
    """h + Mamba(RMSNorm(h)): transformers' ``MambaBlock`` (``norm``, ``mixer``)."""

    def __init__(self, hidden_size: int, eps: float = 1e-5, dtype=None, **mixer):
        super().__init__()
        self.norm = RMSNorm(hidden_size, eps=eps, dtype=dtype)
        self.mixer = Mamba(hidden_size, dtype=dtype, **mixer)

    def forward(self, h, return_state: bool = False):
        out = self.mixer(self.norm(h), return_state=return_state)
        if return_state:
            return h + out[0], out[1]
        return h + out

    def step(self, h_t, state: MambaState | None):
        """One token: (h_t (batch, H) array, state) -> (new h_t, new state)."""
        y, state = self.mixer.step(_rms(h_t, self.norm.weight.data, self.norm.eps), state)
        return h_t + y, state


def _rms(x, weight, eps):
    xp = array_module(x)
    return x / xp.sqrt((x * x).mean(-1, keepdims=True) + eps) * weight


class _Configured(Module):
    """Keeps the config as a plain dict among the constructor arguments (for ``nk.save``)."""

    def _configure(self, config, dtype, fields) -> MambaConfig:
        config = MambaConfig.of(config, **fields)
        object.__setattr__(self, "_init_args", ((config.to_dict(),),
                                                {"dtype": _dtype(dtype)}))
        self.config = config
        return config


class MambaModel(PretrainedMixin, _Configured):
    """The Mamba backbone: (batch, L) token ids -> (batch, L, hidden_size) hidden states.

    Parameters
    ----------
    config : MambaConfig, dict of its fields, transformers' MambaConfig, or None (defaults)
    dtype : float32 (default) or float64
    **fields : MambaConfig fields overriding the config's

    Attributes
    ----------
    embeddings : Embedding (vocab_size, hidden_size)
    layers : ModuleList of blocks, each ``norm`` (RMSNorm) and ``mixer`` (nn.Mamba)
    norm_f : RMSNorm (hidden_size)

    Examples
    --------
    >>> import numpy as np, nnkit as nk
    >>> model = nk.models.MambaModel(vocab_size=10, hidden_size=8, state_size=4,
    ...                              num_hidden_layers=2)
    >>> model(np.array([[1, 2, 3]])).shape
    (1, 3, 8)
    """

    def __init__(self, config=None, dtype=None, **fields):
        super().__init__()
        c = self._configure(config, dtype, fields)
        self.embeddings = Embedding(c.vocab_size, c.hidden_size, dtype=dtype)
        self.layers = ModuleList([MambaBlock(c.hidden_size, c.layer_norm_epsilon, dtype=dtype,
                                             **_mixer_arguments(c))
                                  for _ in range(c.num_hidden_layers)])
        self.norm_f = RMSNorm(c.hidden_size, eps=c.layer_norm_epsilon, dtype=dtype)

    def forward(self, input_ids, return_state: bool = False):
        """The last hidden states (after ``norm_f``), Tensor (batch, L, hidden_size); with
        ``return_state``, also every layer's ``MambaState`` after the last token."""
        h = F.embedding(_ids(input_ids, self.config.vocab_size), self.embeddings.weight)
        states = []
        for block in self.layers:
            if return_state:
                h, state = block(h, return_state=True)
                states.append(state)
            else:
                h = block(h)
        h = self.norm_f(h)
        return (h, states) if return_state else h

    def step(self, token_ids, states=None):
        """One token per sequence in O(1): ``token_ids`` (batch,) and the layers' states after
        the previous token (None: the start) -> (hidden (batch, hidden_size) array after
        ``norm_f``, new states)."""
        weight = self.embeddings.weight.data
        xp = array_module(weight)
        ids = _ids(xp.asarray(token_ids)[:, None], self.config.vocab_size)[:, 0]
        states = [None] * len(self.layers) if states is None else list(states)
        if len(states) != len(self.layers):
            raise ValueError(f"states must hold one state per layer ({len(self.layers)}), got "
                             f"{len(states)}")
        h = weight[ids]
        for i, block in enumerate(self.layers):
            h, states[i] = block.step(h, states[i])
        return _rms(h, self.norm_f.weight.data, self.norm_f.eps), states


def _ids(input_ids, vocab_size: int):
    """Token ids as an integer array (batch, L) in [0, vocab_size)."""
    data = input_ids.data if isinstance(input_ids, Tensor) else input_ids
    xp = array_module(data)
    data = xp.asarray(data)
    if data.dtype.kind not in "iu":
        raise TypeError(f"input_ids must be integers, got dtype {data.dtype}")
    if data.ndim != 2:
        raise ValueError(f"input_ids must have shape (batch, L), got {data.shape}")
    if data.size and (int(data.min()) < 0 or int(data.max()) >= vocab_size):
        raise ValueError(f"input_ids must lie in [0, vocab_size={vocab_size}), got values in "
                         f"[{int(data.min())}, {int(data.max())}]")
    return data


_FROM_CONFIG = "config"  # generate's default: the config's eos/pad ids, as transformers


class MambaForCausalLM(PretrainedMixin, _Configured):
    """Mamba with the language-model head: (batch, L) ids -> (batch, L, vocab_size) logits.

    Parameters
    ----------
    config, dtype, **fields : as ``MambaModel``

    Attributes
    ----------
    backbone : MambaModel
    lm_head : Linear (hidden_size -> vocab_size, no bias), only when
        ``tie_word_embeddings`` is false; else the head is ``backbone.embeddings.weight``.

    Examples
    --------
    >>> import numpy as np, nnkit as nk
    >>> lm = nk.models.MambaForCausalLM(vocab_size=10, hidden_size=8, state_size=4,
    ...                                 num_hidden_layers=1)
    >>> lm(np.array([[1, 2]])).shape
    (1, 2, 10)
    >>> lm.generate(np.array([[1, 2]]), max_new_tokens=3, eos_token_id=None).shape
    (1, 5)
    """

    def __init__(self, config=None, dtype=None, **fields):
        super().__init__()
        c = self._configure(config, dtype, fields)
        self.backbone = MambaModel(c, dtype=dtype)
        if not c.tie_word_embeddings:
            self.lm_head = Linear(c.hidden_size, c.vocab_size, bias=False, dtype=dtype)

    @property
    def head_weight(self):
        """The (vocab_size, hidden_size) output matrix (the embeddings when tied)."""
        head = self._modules.get("lm_head")
        return self.backbone.embeddings.weight if head is None else head.weight

    def forward(self, input_ids):
        """The next-token logits, Tensor (batch, L, vocab_size)."""
        return F.linear(self.backbone(input_ids), self.head_weight)

    def generate(self, input_ids, max_new_tokens: int = 20, eos_token_id=_FROM_CONFIG,
                 pad_token_id=_FROM_CONFIG):
        """Greedy decoding, as transformers' ``generate(do_sample=False)``.

        The prompt goes through the fused scan once; each new token then costs one
        ``step`` of every layer (O(1) in the length).

        Parameters
        ----------
        input_ids : int array (batch, L), L >= 1
        max_new_tokens : int >= 0
        eos_token_id : int or None
            A sequence that produced it is finished: later positions get ``pad_token_id``,
            and decoding stops when every sequence is. Default: the config's; None never
            stops early.
        pad_token_id : int or None
            Default: the config's (the eos id when that is None).

        Returns
        -------
        int64 array (batch, L + generated) on the model's device: the prompt and the tokens.
        """
        ids = _ids(input_ids, self.config.vocab_size)
        xp = array_module(ids)
        if ids.shape[1] < 1:
            raise ValueError("input_ids must hold at least one token per sequence")
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, numbers.Integral) \
                or max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r:.100}")
        eos = self.config.eos_token_id if eos_token_id == _FROM_CONFIG else eos_token_id
        pad = self.config.pad_token_id if pad_token_id == _FROM_CONFIG else pad_token_id
        pad = eos if pad is None else pad
        out = [ids.astype(np.int64)]
        if max_new_tokens == 0:
            return out[0]
        weight = self.head_weight.data
        unfinished = xp.ones(ids.shape[0], dtype=bool)
        with no_grad():
            hidden, states = self.backbone(ids, return_state=True)
            h = hidden.data[:, -1]
            for i in range(max_new_tokens):
                token = (h @ weight.T).argmax(-1).astype(np.int64)
                if eos is not None:
                    token = xp.where(unfinished, token, pad)
                    unfinished &= token != eos
                out.append(token[:, None])
                if (eos is not None and not bool(unfinished.any())) or i == max_new_tokens - 1:
                    break
                h, states = self.backbone.step(token, states)
        return xp.concatenate(out, axis=1)

