#!/usr/bin/env python3
"""llama.cpp's logits for fixed token ids, through llama-cpp-python (run with that environment's python).

    LLAMA_PYTHON examples/llamacpp_logits.py --gguf FILE --ids IDS.json --out LOGITS.npy

IDS.json is a list of prompts, each a list of token ids (the caller tokenizes, so that both engines
read the same ids). LOGITS.npy is a float32 array [prompts, positions, vocab] (prompts padded with
NaN to the longest). Tokens are evaluated one at a time (``n_batch=1``): batched evaluation crashed
llama.cpp's CPU kernels on the machine this was written on. Used by tests/gguf/test_llamacpp.py.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gguf", type=Path, required=True)
    parser.add_argument("--ids", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    from llama_cpp import Llama

    prompts = json.loads(args.ids.read_text(encoding="utf-8"))
    longest = max(len(p) for p in prompts)
    llm = Llama(model_path=str(args.gguf), logits_all=True, n_batch=1, n_ctx=max(64, longest), verbose=False)
    out = np.full((len(prompts), longest, llm.n_vocab()), np.nan, dtype=np.float32)
    for i, ids in enumerate(prompts):
        llm.reset()
        llm.eval(ids)
        out[i, : len(ids)] = np.asarray(llm.scores[: len(ids)], dtype=np.float32)
    np.save(args.out, out)


if __name__ == "__main__":
    main()
