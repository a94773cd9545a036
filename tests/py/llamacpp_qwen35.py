"""llama.cpp's view of a GGUF through llama-cpp-python, for
tests/model_qwen35_hf.rs: reads {"model": path, "prompts": [[ids]], "greedy": n}
on stdin, prints {"top1": [[id per position]], "greedy": [[ids]]}.

Only the test suite uses this; llama-cpp-python is optional (the test
prints SKIPPED without it).
"""

import json
import sys

import numpy as np
from llama_cpp import Llama


def main():
    req = json.load(sys.stdin)
    llm = Llama(model_path=req["model"], n_ctx=512, n_batch=512, logits_all=True,
                verbose=False, n_threads=2)
    top1, greedy = [], []
    for prompt in req["prompts"]:
        llm.reset()
        llm.eval(prompt)
        scores = np.asarray(llm.scores[: llm.n_tokens])
        top1.append([int(i) for i in scores.argmax(-1)])
        toks = []
        for _ in range(req["greedy"]):
            t = int(np.argmax(llm.scores[llm.n_tokens - 1]))
            toks.append(t)
            llm.eval([t])
        greedy.append(toks)
    json.dump({"top1": top1, "greedy": greedy}, sys.stdout)


if __name__ == "__main__":
    main()
