"""Times llama.cpp (through llama-cpp-python) like `quire bench`: pp N =
one prompt of N random tokens from an empty cache, tg N = N single-token
decode steps from an empty cache. Prints one JSON object.

usage: llama_cpp_bench.py MODEL.gguf THREADS PROMPT_TOKENS GEN_TOKENS REPS
"""
import json
import random
import sys
import time

import llama_cpp


def main():
    path, threads, pp, tg, reps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    llm = llama_cpp.Llama(
        model_path=path,
        n_threads=threads,
        n_threads_batch=threads,
        n_ctx=max(pp, tg) + 16,
        n_batch=max(pp, 1),
        n_ubatch=min(max(pp, 1), 512),
        verbose=False,
    )
    vocab = llm.n_vocab()
    rng = random.Random(1)
    res = {}

    def run_pp(toks):
        llm.reset()
        t = time.perf_counter()
        llm.eval(toks)
        return len(toks) / (time.perf_counter() - t)

    def run_tg(toks):
        llm.reset()
        t = time.perf_counter()
        for tok in toks:
            llm.eval([tok])
        return len(toks) / (time.perf_counter() - t)

    def stats(v):
        m = sum(v) / len(v)
        s = (sum((x - m) ** 2 for x in v) / len(v)) ** 0.5
        return {"tps": m, "std": s}

    if pp > 0:
        toks = [rng.randrange(vocab) for _ in range(pp)]
        run_pp(toks)
        res[f"pp{pp}"] = stats([run_pp(toks) for _ in range(reps)])
    if tg > 0:
        toks = [rng.randrange(vocab) for _ in range(tg)]
        run_tg(toks[:8])
        res[f"tg{tg}"] = stats([run_tg(toks) for _ in range(reps)])
    print(json.dumps({"engine": "llama.cpp", "version": llama_cpp.__version__, "threads": threads, "results": res}))


if __name__ == "__main__":
    main()
