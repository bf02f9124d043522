"""Greedy token ids from vLLM for fixed prompt token ids, written as JSON (run with the python of a
virtual environment that has vLLM; it imports nothing from surgery):

    VLLM_PYTHON tests/support/vllm_greedy.py MODEL OUT.json [DTYPE]
"""

from __future__ import annotations

import json
import sys

# Token ids of a character tokenizer (tests/support/tokenizer.py): any id below its vocabulary works.
PROMPTS = ([5, 6, 7, 8, 9], [20, 30, 40, 50], [11, 12, 13, 70, 71, 72], [3, 90, 4, 60])


def main() -> None:
    from vllm import LLM, SamplingParams

    model, out, dtype = sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else "bfloat16"
    llm = LLM(model=model, dtype=dtype, max_model_len=128, enforce_eager=True, seed=0)
    params = SamplingParams(max_tokens=12, temperature=0.0)
    outputs = llm.generate([{"prompt_token_ids": list(p)} for p in PROMPTS], params, use_tqdm=False)
    with open(out, "w", encoding="utf-8") as f:
        json.dump([list(o.outputs[0].token_ids) for o in outputs], f)


if __name__ == "__main__":  # vLLM starts its engine in a spawned process, which imports this file again
    main()
