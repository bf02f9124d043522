"""What vLLM makes of a model, written as JSON (run with the python of a virtual environment that has vLLM;
it imports nothing from surgery):

    VLLM_PYTHON tests/support/vllm_generate.py MODEL OUT.json [DTYPE]

``greedy``: each prompt's greedy continuation (12 token ids). ``logprobs``: for each fixed sequence, the
log-probability of every vocabulary entry at every position after the first (teacher-forced, as vLLM's
``prompt_logprobs`` gives them). Greedy tokens alone cannot compare two bfloat16 runs whose kernels sum in
different orders: they part at near-ties; the log-probabilities say by how much the two models differ.
"""

from __future__ import annotations

import json
import os
import sys

# Token ids of a character tokenizer (tests/support/tokenizer.py): any id below its vocabulary works.
PROMPTS = ([5, 6, 7, 8, 9], [20, 30, 40, 50], [11, 12, 13, 70, 71, 72], [3, 90, 4, 60])
SEQUENCES = (
    [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20],
    [20, 30, 40, 50, 60, 70, 80, 90, 100, 110, 120, 10, 21, 31, 41, 51, 61],
    [11, 12, 13, 70, 71, 72, 11, 12, 13, 70, 71, 72, 11, 12, 13, 70, 71, 72],
    [3, 90, 4, 60, 3, 90, 4, 60, 33, 44, 55, 66, 77, 88, 99, 101],
)


def main() -> None:
    from vllm import LLM, SamplingParams

    model, out, dtype = sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else "bfloat16"
    llm = LLM(model=model, dtype=dtype, max_model_len=128, enforce_eager=True, seed=0, max_logprobs=-1)
    vocab = llm.llm_engine.model_config.get_vocab_size()
    greedy = llm.generate(
        [{"prompt_token_ids": list(p)} for p in PROMPTS], SamplingParams(max_tokens=12, temperature=0.0), use_tqdm=False
    )
    forced = llm.generate(
        [{"prompt_token_ids": list(s)} for s in SEQUENCES],
        SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=vocab),
        use_tqdm=False,
    )
    logprobs = [
        [[position[token].logprob for token in range(vocab)] for position in o.prompt_logprobs[1:]] for o in forced
    ]
    with open(out, "w", encoding="utf-8") as f:
        json.dump({"greedy": [list(o.outputs[0].token_ids) for o in greedy], "logprobs": logprobs}, f)
    llm.llm_engine.engine_core.shutdown()
    # vLLM's interpreter teardown can abort after the JSON is written ("terminate called without an active
    # exception", exit 134): the file is complete, so leave without it.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":  # vLLM starts its engine in a spawned process, which imports this file again
    main()
