"""A tiny language-model data pipeline: text shipped with Python -> token sequences in a .beton file -> packed
fixed-length rows -> a small causal model trained on CPU.

    python examples/language_model.py [--steps N] [--quick]

The text is Python's own help pages (the ``pydoc_data`` package every CPython ships), cut into paragraphs:
documents from a few bytes to a few thousand, a long-tailed mix. Tokens are UTF-8 bytes (0..255) and an
end-of-document token (256) closes every document. The Loader reads at most 1024 tokens per document and
``PackRows`` cuts each batch's documents, laid end to end, into rows of 129 tokens (inputs and next-token
targets), the last row of a batch padded and masked by its length.

Exits with status 1 unless the loss falls well below that of guessing bytes uniformly.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile

import numpy as np
import torch
from pydoc_data.topics import topics

import beton
from beton import Loader, OrderOption
from beton.decoders import RaggedDecoder
from beton.fields import RaggedArrayField
from beton.transforms import PackRows, ToTensor

END_OF_DOCUMENT = 256
VOCABULARY = 257
ROW = 129  # 128 inputs and their 128 next tokens


def documents() -> list[np.ndarray]:
    paragraphs = [part.strip() for name in sorted(topics) for part in topics[name].split("\n\n") if part.strip()]
    return [np.frombuffer(text.encode("utf-8"), np.uint8).astype(np.int32) for text in paragraphs]


def write(path: str) -> list[int]:
    docs = [np.append(doc, np.int32(END_OF_DOCUMENT)) for doc in documents()]
    beton.DatasetWriter(path, {"tokens": RaggedArrayField(np.int32, (None,))}, num_workers=1,
                        progress=False).from_indexed_dataset([(doc,) for doc in docs])
    return [len(doc) for doc in docs]


class CausalConvolutions(torch.nn.Module):
    """Embeddings, dilated causal convolutions (each position sees only earlier ones), next-token logits."""

    def __init__(self, width: int = 96) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCABULARY, width)
        self.layers = torch.nn.ModuleList(torch.nn.Conv1d(width, width, 2, dilation=d) for d in (1, 2, 4, 8, 16))
        self.out = torch.nn.Linear(width, VOCABULARY)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens).transpose(1, 2)
        for layer in self.layers:
            x = x + torch.relu(layer(torch.nn.functional.pad(x, (layer.dilation[0], 0))))
        return self.out(x.transpose(1, 2))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--quick", action="store_true", help="60 steps (for CI)")
    arguments = parser.parse_args()
    steps = 60 if arguments.quick else arguments.steps
    torch.manual_seed(0)
    torch.set_num_threads(2)
    with tempfile.TemporaryDirectory() as temporary:
        path = os.path.join(temporary, "pydoc.beton")
        lengths = write(path)
        print(f"{len(lengths)} documents, {sum(lengths)} tokens, lengths {min(lengths)}..{max(lengths)} "
              f"(median {int(np.median(lengths))})")
        loader = Loader(path, batch_size=32, num_workers=2, order=OrderOption.RANDOM, seed=0,
                        pipelines={"tokens": [RaggedDecoder(max_length=1024), PackRows(ROW, pad_value=0),
                                              ToTensor()]})
        model = CausalConvolutions()
        optimiser = torch.optim.Adam(model.parameters(), lr=3e-3)
        losses: list[float] = []
        while len(losses) < steps:
            for (rows,) in loader:  # a Padded batch: rows.values (rows, 129) int32, rows.lengths (rows,)
                tokens = rows.values.long()
                mask = rows.mask()[:, 1:].float()  # the padded tail of the last row is not a target
                logits = model(tokens[:, :-1])
                loss = (torch.nn.functional.cross_entropy(logits.reshape(-1, VOCABULARY), tokens[:, 1:].reshape(-1),
                                                          reduction="none") * mask.reshape(-1)).sum() / mask.sum()
                optimiser.zero_grad()
                loss.backward()
                optimiser.step()
                losses.append(loss.item())
                if len(losses) == 1 or len(losses) % 40 == 0:
                    print(f"step {len(losses):4d}: {len(rows.lengths)} rows of {ROW}, loss {loss.item():.3f}")
                if len(losses) == steps:
                    break
        loader.close()
    uniform = math.log(VOCABULARY)
    final = float(np.mean(losses[-10:]))
    print(f"loss {losses[0]:.2f} -> {final:.2f} nats per token (guessing uniformly: {uniform:.2f})")
    return 0 if final < uniform - 2.0 else 1


if __name__ == "__main__":
    sys.exit(main())
