"""``from_pretrained`` / ``save_pretrained`` on nnkit's BERT and ViT classes (a mixin).

The work is in ``nnkit.models.pretrained``, imported when first called (it imports the model
modules, so they cannot import it at their top).
"""

from __future__ import annotations

from .._budget import MAX_BYTES


class PretrainedMixin:
    """Hugging Face checkpoint folders (config.json + model.safetensors) in and out."""

    @classmethod
    def from_pretrained(cls, folder, *, dtype=None, num_labels=None, max_bytes=MAX_BYTES,
                        output_loading_info: bool = False):
        """The model saved in a Hugging Face checkpoint folder, in eval mode.

        ``folder`` holds config.json and model.safetensors (as transformers'
        ``save_pretrained`` or ``huggingface-cli download`` leave them); no network, no
        pickle. ``dtype``: float32 (default) or float64. ``num_labels``: a classifier of
        this many labels instead of the checkpoint's. ``max_bytes``: what loading may
        allocate beyond the weights it uses (default 256 MiB; None: no limit, for folders
        you trust). Heads the file lacks are initialised and listed in a
        ``NewlyInitializedWarning``; with ``output_loading_info`` the call returns
        ``(model, {"missing_keys", "unexpected_keys"})``. See ``nnkit.models.pretrained``.
        """
        from . import pretrained

        return pretrained.load_pretrained(
            cls, folder, dtype=dtype, num_labels=num_labels, max_bytes=max_bytes,
            output_loading_info=output_loading_info)

    def save_pretrained(self, folder):
        """Write config.json and model.safetensors to ``folder`` (created when missing) in
        the Hugging Face layout: transformers' ``from_pretrained(folder)`` gives the same
        outputs. Returns the folder's path."""
        from . import pretrained

        return pretrained.save_pretrained(self, folder)
