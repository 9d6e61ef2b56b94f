"""Vision Transformer (notes §6.6; Dosovitskiy et al. 2020, "An image is worth 16x16
words").

An image (C, H, W) is cut into n = (H/p)(W/p) patches of p x p pixels, read row by row;
each patch, flattened in (C, p, p) order, is a token x_i in R^(C p^2):

    z_0 = [x_cls; x_1 E; ...; x_n E] + E_pos        E (C p^2, D), E_pos (n + 1, D), x_cls (D,)
    z_l = Encoder_l(z_{l-1}),  l = 1..depth          (pre-norm blocks: x + MSA(LN(x)),
                                                       x + MLP(LN(x)), MLP with GELU)
    y   = head(LN(z_depth)[0])                       the [CLS] token's final state

Patch embedding: a linear projection of flattened patches
---------------------------------------------------------
``patch_embed`` is ``nn.Linear(C p^2, D)`` applied to the patch vectors (``patchify``), the
form notes §6.6 and the paper write. It is the same map as a ``Conv2d(C, D, p, stride=p)``
(whose weight is ``patch_embed.weight.reshape(D, C, p, p)``, since patches are flattened in
(C, p, p) order), but one reshape/transpose and one GEMM (B n, C p^2) x (C p^2, D) instead
of a convolution kernel built for overlapping windows: non-overlapping patches make im2col
a plain reshape, so the linear form is the direct one and the fastest on the CPU.

The encoder is ``nn.TransformerEncoder`` of ``nn.TransformerEncoderLayer`` (batch_first,
norm_first=True as ViT, activation 'gelu') with the final LayerNorm as its ``norm``, so
parameter names match a torch model built from the same torch.nn layers.
"""

from __future__ import annotations

import numbers
from typing import TYPE_CHECKING

import numpy as np

from .._backend import array_module
from .._validation import check_bool, check_choice, check_input_dtype, check_scalar
from ..autograd import Tensor, as_tensor, concat, no_grad, stack
from ..nn import init
from ..nn.layers import Dropout, LayerNorm, Linear, _dtype
from ..nn.module import Module, Parameter
from ..nn.transformer import TransformerEncoder, TransformerEncoderLayer
from ._hub import PretrainedMixin

if TYPE_CHECKING:
    from .preprocess import ViTImageProcessor

__all__ = ["ViT", "patchify"]


def _pair(value, name: str) -> tuple[int, int]:
    """An int or a pair of ints (height, width), each >= 1."""
    pair = (value, value) if isinstance(value, numbers.Integral) else tuple(value)
    if len(pair) != 2:
        raise ValueError(f"{name} must be an int or a pair (height, width), got {value!r}")
    for v in pair:
        check_scalar(v, name=name, kind=numbers.Integral, low=1)
    return int(pair[0]), int(pair[1])


def patchify(images, patch_size) -> Tensor:
    """Cut images into non-overlapping patches and flatten each one (differentiable).

    Parameters
    ----------
    images : array or Tensor (B, C, H, W)
    patch_size : int or (ph, pw)
        H must be a multiple of ph and W of pw.

    Returns
    -------
    Tensor (B, (H/ph)(W/pw), C ph pw)
        Patch (i, j) (row i, column j of the patch grid) is token i (W/pw) + j, its pixels
        in (c, y, x) order: ``images[b, :, i ph:(i+1) ph, j pw:(j+1) pw].reshape(-1)``.

    Examples
    --------
    >>> import numpy as np
    >>> from nnkit.models.vit import patchify
    >>> patchify(np.arange(16.0).reshape(1, 1, 4, 4), 2).numpy()[0, 1]   # top-right patch
    array([2., 3., 6., 7.])
    """
    ph, pw = _pair(patch_size, "patch_size")
    x = as_tensor(images)
    if x.ndim != 4:
        raise ValueError(f"images must be 4-D (B, C, H, W), got shape {x.shape}")
    B, C, H, W = x.shape
    if H % ph or W % pw:
        raise ValueError(f"images of size H x W = {H} x {W} are not a multiple of "
                         f"patch_size={(ph, pw)}; crop or pad them to a multiple of the patch")
    x = x.reshape(B, C, H // ph, ph, W // pw, pw)  # (B, C, Hp, ph, Wp, pw)
    x = x.transpose(0, 2, 4, 1, 3, 5)  # (B, Hp, Wp, C, ph, pw)
    return x.reshape(B, (H // ph) * (W // pw), C * ph * pw)  # (B, n, C ph pw)


class ViT(PretrainedMixin, Module):
    """Vision Transformer for image classification.

    Parameters
    ----------
    image_size : int or (H, W)
        Size of the input images; a multiple of ``patch_size``.
    patch_size : int or (ph, pw)
    in_channels : int
        C.
    num_classes : int
    dim : int
        Token width D (divisible by ``heads``).
    depth : int
        Encoder layers.
    heads : int
        Attention heads per layer.
    mlp_dim : int
        Hidden width of each layer's feed-forward network.
    dropout : float
        Dropout on the embeddings and inside every encoder layer (attention probabilities,
        residual branches, MLP).
    pool : 'cls' or 'mean'
        Classify from the [CLS] token's final state (ViT), or from the mean of the patch
        tokens' final states (global average pooling; the [CLS] token still takes part in
        attention).
    dtype : float32 (default) or float64
    layer_norm_eps : float > 0
        The epsilon of every LayerNorm (1e-5, torch's default; the published ViT checkpoints
        use 1e-12, which ``from_pretrained`` reads from their config).
    qkv_bias : bool
        Biases on the query, key and value projections (``in_proj_bias``); without them
        each layer's ``self_attn.in_proj_bias`` is None (the output projection keeps its
        bias), as a checkpoint built with ``qkv_bias=False``.

    Attributes
    ----------
    patch_embed : Linear (C ph pw -> D)
    cls_token : Parameter (1, 1, D), zeros
    pos_embed : Parameter (1, n + 1, D), N(0, 0.02^2); row 0 is the [CLS] position
    dropout : Dropout
    encoder : TransformerEncoder
        ``layers.{i}``: pre-norm GELU TransformerEncoderLayer, batch_first; ``norm``: the
        final LayerNorm.
    head : Linear (D -> num_classes)
    num_patches : int
        n = (H/ph)(W/pw).
    grid_size : (H/ph, W/pw)

    Notes
    -----
    Each encoder layer draws its own initial weights (torch's TransformerEncoder deep-copies
    one layer, so its layers start equal); the parameter names and shapes are torch's.

    Inputs to ``forward``: images (B, C, H, W), or flattened images (B, C H W) in (c, y, x)
    order (what ``nk.datasets.load_digits()`` returns), NumPy/CuPy arrays or Tensors.

    Examples
    --------
    >>> import numpy as np
    >>> from nnkit.models.vit import ViT
    >>> model = ViT(8, 2, 1, 10, dim=16, depth=1, heads=2, mlp_dim=32)
    >>> model(np.zeros((3, 1, 8, 8), dtype=np.float32)).shape          # (B, num_classes)
    (3, 10)
    >>> model.cls_attention(np.zeros((3, 64), dtype=np.float32)).shape  # (B, heads, 4, 4)
    (3, 2, 4, 4)
    """

    def __init__(self, image_size, patch_size, in_channels: int, num_classes: int, dim: int,
                 depth: int, heads: int, mlp_dim: int, dropout: float = 0.0,
                 pool: str = "cls", dtype=None, layer_norm_eps: float = 1e-5,
                 qkv_bias: bool = True):
        super().__init__()
        self.image_size = _pair(image_size, "image_size")
        self.patch_size = _pair(patch_size, "patch_size")
        (H, W), (ph, pw) = self.image_size, self.patch_size
        if H % ph or W % pw:
            raise ValueError(f"image_size={self.image_size} is not a multiple of "
                             f"patch_size={self.patch_size}: the patches must tile the image")
        for name, value in (("in_channels", in_channels), ("num_classes", num_classes),
                            ("dim", dim), ("depth", depth), ("heads", heads),
                            ("mlp_dim", mlp_dim)):
            check_scalar(value, name=name, kind=numbers.Integral, low=1)
        if dim % heads:
            raise ValueError(f"dim={dim} is not divisible by heads={heads}: each attention "
                             "head gets dim // heads features")
        check_scalar(dropout, name="dropout", low=0.0, high=1.0, high_inclusive=False)
        self.pool = check_choice(pool, name="pool", choices=("cls", "mean"))
        check_scalar(layer_norm_eps, name="layer_norm_eps", low=0.0, low_inclusive=False)
        check_bool(qkv_bias, name="qkv_bias")
        self.layer_norm_eps, self.qkv_bias = float(layer_norm_eps), bool(qkv_bias)
        self.dropout_p = float(dropout)
        self.in_channels, self.num_classes = int(in_channels), int(num_classes)
        self.dim, self.depth, self.heads = int(dim), int(depth), int(heads)
        self.grid_size = (H // ph, W // pw)
        self.num_patches = self.grid_size[0] * self.grid_size[1]
        dtype = _dtype(dtype)
        self.patch_embed = Linear(in_channels * ph * pw, dim, dtype=dtype)
        self.cls_token = Parameter(np.zeros((1, 1, dim), dtype=dtype))
        self.pos_embed = Parameter.empty((1, self.num_patches + 1, dim), dtype)
        init.normal_(self.pos_embed, 0.0, 0.02)
        self.dropout = Dropout(dropout)
        layer = TransformerEncoderLayer(dim, heads, dim_feedforward=mlp_dim, dropout=dropout,
                                        activation="gelu", layer_norm_eps=layer_norm_eps,
                                        batch_first=True, norm_first=True, dtype=dtype)
        if not qkv_bias:  # before the copies: no layer ever holds the bias
            layer.self_attn.register_parameter("in_proj_bias", None)
        self.encoder = TransformerEncoder(layer, depth, norm=LayerNorm(dim, eps=layer_norm_eps,
                                                                       dtype=dtype))
        for block in self.encoder.layers[1:]:  # fresh weights per layer (deep copies start equal)
            _reinitialise(block)
        self.head = Linear(dim, num_classes, dtype=dtype)

    # ----- input ------------------------------------------------------------------------------
    def _check_images(self, images, interpolate: bool = False) -> Tensor:
        """images (B, C, H, W) or (B, C H W) -> Tensor (B, C, H, W), shapes checked; with
        ``interpolate`` any size that the patches tile."""
        x = as_tensor(images)
        C, (H, W) = self.in_channels, self.image_size
        if x.dtype.kind != "f":
            raise TypeError(f"images must be floating-point, got dtype {x.dtype}")
        check_input_dtype(x, self.patch_embed.weight.dtype, name="images", owner="ViT")
        if x.ndim == 2:
            if x.shape[1] != C * H * W:
                raise ValueError(
                    f"flattened images have {x.shape[1]} values per row (shape {x.shape}) but "
                    f"ViT was built with in_channels={C}, image_size={(H, W)}: expected "
                    f"(B, {C * H * W}) or (B, {C}, {H}, {W})")
            return x.reshape(x.shape[0], C, H, W)  # (B, C, H, W)
        if x.ndim != 4:
            raise ValueError(f"images must be (B, C, H, W) or flattened (B, C*H*W), got shape "
                             f"{x.shape}")
        if x.shape[1] != C:
            raise ValueError(f"images have {x.shape[1]} channels (shape {x.shape}) but ViT was "
                             f"built with in_channels={C}")
        if interpolate:
            ph, pw = self.patch_size
            if x.shape[2] % ph or x.shape[3] % pw:
                raise ValueError(f"images of size H x W = {x.shape[2]} x {x.shape[3]} are not "
                                 f"a multiple of patch_size={(ph, pw)}")
            return x
        if tuple(x.shape[2:]) != (H, W):
            ph, pw = self.patch_size
            tiling = ("" if x.shape[2] % ph == 0 and x.shape[3] % pw == 0 else
                      f"; it is not even a multiple of patch_size={(ph, pw)}")
            raise ValueError(f"images have size H x W = {x.shape[2]} x {x.shape[3]} (shape "
                             f"{x.shape}) but ViT was built with image_size={(H, W)} (its "
                             f"learned positions fix the number of patches; pass "
                             f"interpolate_pos_encoding=True to interpolate them){tiling}")
        return x

    # ----- forward ------------------------------------------------------------------------------
    def embed(self, images, interpolate_pos_encoding: bool = False) -> Tensor:
        """Tokens z_0 (B, n + 1, D): [CLS] then the projected patches, plus positions.

        ``interpolate_pos_encoding``: images of another size (a multiple of the patch) get
        the learned grid of patch positions resized bicubically to their patch grid
        (``interpolate_positions``), as transformers' ViT does.
        """
        x = self._check_images(images, interpolate_pos_encoding)
        tokens = self.patch_embed(patchify(x, self.patch_size))  # (B, n, D)
        B = tokens.shape[0]
        xp = array_module(tokens.data)
        cls = self.cls_token + xp.zeros((B, 1, self.dim), dtype=tokens.dtype)  # (B, 1, D)
        pos = self.pos_embed
        if interpolate_pos_encoding:
            grid = (x.shape[2] // self.patch_size[0], x.shape[3] // self.patch_size[1])
            pos = self.interpolate_positions(grid, square=x.shape[2] == x.shape[3])
        z = concat([cls, tokens], axis=1) + pos  # (B, n + 1, D)
        return self.dropout(z)

    def interpolate_positions(self, grid, square: bool = True) -> Tensor:
        """The position embeddings (1, 1 + gh gw, D) for a patch grid ``grid`` = (gh, gw).

        Row 0 ([CLS]) is kept; the (Gh, Gw) grid of learned patch positions is resized to
        (gh, gw) by torch's bicubic interpolation (a = -0.75, align_corners=False, edges
        replicated), separably, as matrix products: differentiable. The learned table is
        returned unchanged for the model's own grid when the image is ``square``, as
        transformers does (it interpolates a non-square image even of the same patch
        count).
        """
        gh, gw = _pair(grid, "grid")
        if (gh, gw) == self.grid_size and square:
            return self.pos_embed
        D, (Gh, Gw) = self.dim, self.grid_size
        xp = array_module(self.pos_embed.data)
        dtype = self.pos_embed.dtype
        rows = Tensor(xp.asarray(_bicubic_weights(Gh, gh), dtype=dtype))  # (gh, Gh)
        cols = Tensor(xp.asarray(_bicubic_weights(Gw, gw), dtype=dtype))  # (gw, Gw)
        grid_pos = self.pos_embed[0, 1:].reshape(Gh, Gw * D)
        y = (rows @ grid_pos).reshape(gh, Gw, D).transpose(1, 0, 2).reshape(Gw, gh * D)
        y = (cols @ y).reshape(gw, gh, D).transpose(1, 0, 2).reshape(1, gh * gw, D)
        return concat([self.pos_embed[:, :1], y], axis=1)  # (1, 1 + gh gw, D)

    def preprocess(self, images):
        """Images (channels last, uint8 or float; see ``vit_preprocess``) -> this model's
        input (B, C, H, W): as the checkpoint's preprocessor_config.json says when the model
        was loaded with one (``self.preprocessing``), else transformers' ViT defaults (mean
        and std 0.5, bytes / 255) at ``image_size``."""
        from .preprocess import vit_preprocess

        args = getattr(self, "preprocessing", None) or {"size": self.image_size}
        return vit_preprocess(images, **args, dtype=self.patch_embed.weight.dtype)

    def image_processor(self) -> ViTImageProcessor:
        """A :class:`~nnkit.models.preprocess.ViTImageProcessor` preparing images as
        :meth:`preprocess` does, whose call returns ``{"pixel_values": ...}``:
        ``model(**model.image_processor()(images))``."""
        from .preprocess import ViTImageProcessor

        args = getattr(self, "preprocessing", None) or {"size": self.image_size}
        return ViTImageProcessor(**args, dtype=self.patch_embed.weight.dtype)

    def _classify(self, z) -> Tensor:
        """Logits (B, num_classes) from the final states z (B, n + 1, D)."""
        pooled = z[:, 0] if self.pool == "cls" else z[:, 1:].mean(axis=1)  # (B, D)
        return self.head(pooled)

    def forward(self, images=None, return_attention: bool = False,
                interpolate_pos_encoding: bool = False, *, pixel_values=None):
        """Class logits (B, num_classes) of images (B, C, H, W) or (B, C H W).

        ``pixel_values`` is the same input by transformers' name: ``model(**processor(x))``
        with a :class:`~nnkit.models.preprocess.ViTImageProcessor`; give one of the two.
        ``interpolate_pos_encoding``: accept images of another size (see ``embed``).

        With ``return_attention=True`` returns ``(logits, attention)``, attention a Tensor
        (depth, B, heads, n + 1, n + 1) of every layer's softmax weights (row i: how token i
        attends over the n + 1 tokens; token 0 is [CLS]; in training mode with dropout, the
        weights after dropout, as torch's MultiheadAttention returns them). That path
        composes the attention from autograd ops (it needs the weights); the default calls
        the fused kernel. Both give the same logits.
        """
        if (images is None) == (pixel_values is None):
            raise TypeError("give the images either as images or as pixel_values (one of "
                            "the two)")
        z = self.embed(images if pixel_values is None else pixel_values,
                       interpolate_pos_encoding)
        if not return_attention:
            return self._classify(self.encoder(z))
        weights = []
        for layer in self.encoder.layers:
            z, w = _layer_with_weights(layer, z)
            weights.append(w)
        z = self.encoder.norm(z)
        return self._classify(z), stack(weights, axis=0)

    def cls_attention(self, images, layer: int = -1) -> np.ndarray:
        """Attention from [CLS] to every patch, on the patch grid, without a graph.

        Parameters
        ----------
        images : (B, C, H, W) or (B, C H W)
        layer : int
            Which encoder layer (default the last).

        Returns
        -------
        ndarray (B, heads, H/ph, W/pw): the [CLS] query's softmax weights over the patch
        keys (in eval mode; the weight on [CLS] itself is left out, so a map sums to 1 minus
        [CLS]'s self-attention).
        """
        check_scalar(layer, name="layer", kind=numbers.Integral, low=-self.depth,
                     high=self.depth - 1)
        was_training = self.training
        self.eval()
        try:
            with no_grad():
                _, attention = self.forward(images, return_attention=True)
        finally:
            self.train(was_training)
        rows = attention.data[layer][:, :, 0, 1:]  # (B, heads, n)
        return rows.reshape(rows.shape[:2] + self.grid_size)  # (B, heads, Hp, Wp)

    def extra_repr(self) -> str:
        return (f"image_size={self.image_size}, patch_size={self.patch_size}, "
                f"num_patches={self.num_patches}, pool={self.pool!r}")


def _bicubic_weights(n_in: int, n_out: int, a: float = -0.75) -> np.ndarray:
    """(n_out, n_in) weights of torch's bicubic upsampling along one axis (align_corners
    False: source x = (i + 0.5) n_in / n_out - 0.5, four taps, indices clamped)."""
    out = np.zeros((n_out, n_in))
    scale = n_in / n_out
    for i in range(n_out):
        src = (i + 0.5) * scale - 0.5
        base = int(np.floor(src))
        t = src - base
        taps = (((a * (t + 1) - 5 * a) * (t + 1) + 8 * a) * (t + 1) - 4 * a,
                ((a + 2) * t - (a + 3)) * t * t + 1,
                ((a + 2) * (1 - t) - (a + 3)) * (1 - t) * (1 - t) + 1,
                ((a * (2 - t) - 5 * a) * (2 - t) + 8 * a) * (2 - t) - 4 * a)
        for k, w in enumerate(taps):
            out[i, min(max(base - 1 + k, 0), n_in - 1)] += w
    return out


def _reinitialise(layer: TransformerEncoderLayer) -> None:
    """Draw a layer's weights afresh, with the initialisers its constructor used."""
    layer.self_attn._reset_parameters()
    for linear in (layer.self_attn.out_proj, layer.linear1, layer.linear2):
        linear.reset_parameters()
    init.zeros_(layer.self_attn.out_proj.bias)


def _layer_with_weights(layer: TransformerEncoderLayer, x):
    """``layer(x)`` for a pre-norm batch-first layer, also returning its attention weights
    (B, heads, T, T); the same sub-modules in the same order as the layer's forward."""
    h = layer.norm1(x)
    out, weights = layer.self_attn(h, h, h, need_weights=True, average_attn_weights=False)
    x = x + layer.dropout1(out)
    return x + layer._ff_block(layer.norm2(x)), weights
