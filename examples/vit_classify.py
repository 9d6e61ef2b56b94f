"""Classify an image with a pretrained ViT checkpoint from a Hugging Face folder.
==============================================================================

    huggingface-cli download google/vit-base-patch16-224 config.json model.safetensors \
        preprocessor_config.json --local-dir vit-base-patch16-224
    python examples/vit_classify.py vit-base-patch16-224 cat.jpg

Reads the folder with nnkit alone (no transformers, no torch, no network):
``ViT.from_pretrained`` takes config.json + model.safetensors and preprocessor_config.json
(the resize, rescale and normalisation the checkpoint was trained with). The image is read
with Pillow (``pip install pillow``; a .npy array of shape (H, W, 3) works without it).
Prints the most likely labels with their probabilities.

Not run when the documentation is built: it needs a ViT checkpoint folder downloaded
from the Hugging Face Hub as above (vit-base-patch16-224: about 350 MB) and an image.
"""

from __future__ import annotations

import argparse

import numpy as np

import nnkit as nk
from nnkit.models import ViT


def read_image(path: str) -> np.ndarray:
    """(H, W, 3) uint8 RGB pixels of an image file (or a float/uint8 array in a .npy)."""
    if path.endswith(".npy"):
        return np.load(path, allow_pickle=False)
    try:
        from PIL import Image
    except ImportError:
        raise SystemExit("reading image files needs Pillow: pip install pillow (or pass "
                         "a .npy array of shape (H, W, 3))") from None
    with Image.open(path) as image:
        return np.asarray(image.convert("RGB"))


def classify(model: ViT, image: np.ndarray, top_k: int = 5) -> list[tuple[str, float]]:
    """The ``top_k`` (label, probability) pairs of one (H, W, 3) image, best first."""
    x = model.preprocess(image)  # (1, 3, H, W), as the checkpoint's preprocessor says
    with nk.no_grad():
        logits = model(x).numpy()[0]
    probs = np.exp(logits - logits.max())
    probs /= probs.sum()
    labels = getattr(model, "id2label", {})
    return [(labels.get(int(i), str(int(i))), float(probs[i]))
            for i in np.argsort(-probs)[:top_k]]


def main(argv=None) -> list:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", help="a ViT checkpoint folder (Hugging Face layout)")
    parser.add_argument("image", help="an image file (JPEG, PNG, ...) or a .npy array")
    parser.add_argument("--top-k", type=int, default=5)
    args = parser.parse_args(argv)

    model = ViT.from_pretrained(args.folder)
    results = classify(model, read_image(args.image), args.top_k)
    for label, p in results:
        print(f"{p:.3f}  {label}")
    return results


if __name__ == "__main__":
    main()
