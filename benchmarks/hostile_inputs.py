"""What hostile inputs cost: WordPiece on one long word, resizing a photo, and the refusals.

    python benchmarks/hostile_inputs.py [--sections words,resize,refusals]

1. ``words``: one word of n letters under ``max_input_chars_per_word=10**9`` (a limit a
   tokenizer.json may set), cut by a tokenizer whose vocabulary holds the letters and
   their ``##`` forms: seconds per word.
2. ``resize``: a 3000 x 4000 x 3 uint8 photo to 224 x 224 (bilinear), seconds.
3. ``refusals``: hostile checkpoint folders built in a temporary folder, each loaded once:
   seconds and peak bytes (tracemalloc) until the refusal, and the error's first words.

Sections 1 and 2 use only functions older nnkits have too, so the same script measures a
checkout of an earlier commit (``--sections words,resize``).
"""

from __future__ import annotations

import argparse
import json
import string
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np

import nnkit as nk
from nnkit.models.preprocess import resize
from nnkit.text import WordPieceTokenizer


def _seconds(fn, *args):
    start = time.perf_counter()
    fn(*args)
    return time.perf_counter() - start


def words(lengths=(1000, 2000, 4000, 10**5, 10**6)):
    letters = list(string.ascii_lowercase)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *letters, *("##" + c for c in letters)]
    tok = WordPieceTokenizer(vocab, max_input_chars_per_word=10**9)
    for n in lengths:
        word = "".join(np.random.default_rng(n).choice(letters, n))
        print(f"words   {n:>8} letters: {_seconds(tok.tokenize, word):8.3f} s")


def photo_resize():
    photo = np.random.default_rng(0).integers(0, 256, (1, 3000, 4000, 3), dtype=np.uint8)
    print(f"resize  3000 x 4000 -> 224 x 224: {_seconds(resize, photo, (224, 224)):.2f} s")


def _bert_folder(root: Path, name: str, **fields) -> Path:
    nk.manual_seed(0)
    folder = nk.models.Bert(99, 32, 2, 4, 37, 64).save_pretrained(root / name)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **fields}))
    return folder


def _encoder_file(path: Path, layers: int) -> Path:
    """An nk.save file of TransformerEncoder(TransformerEncoderLayer(1024, 8, 4096), layers)
    with no tensors: the constructor arguments alone."""
    import zlib

    from nnkit._safetensors import write_file

    layer = {"__module__": {"class": "nnkit.nn.transformer:TransformerEncoderLayer",
                            "training": True, "args": [1024, 8, 4096], "kwargs": {}}}
    module = {"class": "nnkit.nn.transformer:TransformerEncoder", "training": True,
              "args": [layer, layers], "kwargs": {}, "state": {}, "shared": {}, "tied": {}}
    text = json.dumps({"format": "nnkit", "format_version": 2, "nnkit_version": "0",
                       "object": {"__module__": module}, "complex": [], "tensors": {}})
    write_file(path, {}, {"nnkit": text, "nnkit_crc32": str(zlib.crc32(text.encode()))})
    return path


def refusals():
    from nnkit._safetensors import read_file, write_file

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        layers = _bert_folder(root, "layers", num_hidden_layers=2000, hidden_size=1024,
                              num_attention_heads=16, intermediate_size=4096)
        tensors, meta = read_file(layers / "model.safetensors")
        tensors["bert.encoder.layer.1999.x"] = np.zeros(1, np.float32)
        write_file(layers / "model.safetensors", tensors, meta)
        encoder = _encoder_file(root / "encoder.safetensors", 400)
        cases = {
            "2000 layers, one tensor": lambda: nk.models.Bert.from_pretrained(layers),
            "hidden_size 2**20": lambda: nk.models.Bert.from_pretrained(
                _bert_folder(root, "wide", hidden_size=2**20, num_attention_heads=16)),
            "num_labels 10**9": lambda: nk.models.BertForSequenceClassification
            .from_pretrained(_bert_folder(root, "labels", num_labels=10**9)),
            f"nk.load, {encoder.stat().st_size} B, 400 layers": lambda: nk.load(encoder),
        }
        for name, load in cases.items():
            tracemalloc.start()
            start = time.perf_counter()
            try:
                load()
                outcome = "loaded"
            except (ValueError, MemoryError) as exc:  # FileFormatError is a ValueError
                outcome = f"{type(exc).__name__}: {str(exc).replace(tmp, '')[:70]}..."
            seconds = time.perf_counter() - start
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
            print(f"refusal {name:<24} {seconds:6.3f} s, peak {peak / 2**20:6.1f} MiB  {outcome}")


SECTIONS = {"words": words, "resize": photo_resize, "refusals": refusals}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sections", default=",".join(SECTIONS))
    for section in parser.parse_args().sections.split(","):
        SECTIONS[section]()


if __name__ == "__main__":
    main()
