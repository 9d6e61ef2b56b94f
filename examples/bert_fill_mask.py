"""Fill in [MASK] with a pretrained BERT checkpoint from a Hugging Face folder.
============================================================================

    huggingface-cli download bert-base-uncased config.json model.safetensors vocab.txt \
        tokenizer_config.json --local-dir bert-base-uncased
    python examples/bert_fill_mask.py bert-base-uncased "the capital of france is [MASK]."

Reads the folder with nnkit alone (no transformers, no torch, no network): the tokenizer
from vocab.txt (+ tokenizer_config.json), the model from config.json + model.safetensors
(``BertForPreTraining.from_pretrained``; a masked-LM checkpoint without the next-sentence
head loads too). Prints, for every [MASK] of each text, the most likely tokens with their
probabilities.

Not run when the documentation is built: it needs a BERT checkpoint folder downloaded
from the Hugging Face Hub as above (bert-base-uncased: about 440 MB).
"""

from __future__ import annotations

import argparse
import warnings

import numpy as np

import nnkit as nk
from nnkit.models import BertForPreTraining
from nnkit.models.pretrained import NewlyInitializedWarning
from nnkit.text import WordPieceTokenizer


def fill_mask(model, tokenizer, text: str, top_k: int = 5) -> list[list[tuple[str, float]]]:
    """For each [MASK] of ``text``: the ``top_k`` (token, probability) pairs, best first."""
    enc = tokenizer.encode(text, truncation=True, max_length=model.bert.max_position)
    positions = np.flatnonzero(enc.ids == tokenizer.mask_token_id)
    if positions.size == 0:
        raise SystemExit(f"no {tokenizer.special_tokens['mask_token']} in {text!r}")
    with nk.no_grad():
        seq, _ = model.bert(enc.ids[None], enc.token_type_ids[None], enc.attention_mask[None])
        logits = model.mlm_head(seq[:, positions]).numpy()[0]  # (masks, V)
    logits = logits - logits.max(axis=-1, keepdims=True)
    probs = np.exp(logits) / np.exp(logits).sum(axis=-1, keepdims=True)
    best = np.argsort(-probs, axis=-1)[:, :top_k]
    return [[(tokenizer.id_to_token(int(i)), float(p[i])) for i in row]
            for row, p in zip(best, probs, strict=True)]


def main(argv=None) -> list:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", help="a BERT checkpoint folder (Hugging Face layout)")
    parser.add_argument("texts", nargs="*", default=["the capital of france is [MASK].",
                                                     "the man worked as a [MASK]."])
    parser.add_argument("--top-k", type=int, default=5)
    args = parser.parse_args(argv)

    tokenizer = WordPieceTokenizer.from_pretrained(args.folder)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NewlyInitializedWarning)  # checked below
        model, info = BertForPreTraining.from_pretrained(args.folder,
                                                         output_loading_info=True)
    if any(key.startswith("mlm") for key in info["missing_keys"]):
        raise SystemExit(f"{args.folder} holds no masked-LM head (missing "
                         f"{info['missing_keys']}): fill-mask needs a BertForMaskedLM or "
                         "BertForPreTraining checkpoint")
    results = []
    for text in args.texts:
        print(text)
        for k, candidates in enumerate(fill_mask(model, tokenizer, text, args.top_k)):
            shown = "  ".join(f"{token} {p:.3f}" for token, p in candidates)
            print(f"  [MASK] {k + 1}: {shown}")
            results.append(candidates)
    return results


if __name__ == "__main__":
    main()
