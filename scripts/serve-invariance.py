#!/usr/bin/env python3
"""Batch invariance as a client sees it (standard library only).

Sends one greedy completion with logprobs alone, then the same request
again while N other requests (different prompts, sampled, some with a
json_schema) run beside it, and compares the two answers' token ids and
logprobs bit for bit (as the JSON numbers the server printed). Prints one
line, `identical` or `DIFFERENT at token K`, and exits 0 or 1.

`quire serve --mode deterministic` (or `exact`) must print `identical`;
`--mode fast` on a GPU is expected to print `DIFFERENT` somewhere (its
batched GEMMs change a row's bits with the batch): the negative control,
which shows that the check can fail.

  scripts/serve-invariance.py --url http://127.0.0.1:8080 [--strangers 63]
"""

import argparse
import json
import sys
import threading
import urllib.request


def post(url, body):
    req = urllib.request.Request(
        url + "/v1/completions",
        json.dumps(body).encode(),
        {"content-type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.load(r)


def model_id(url):
    with urllib.request.urlopen(url + "/v1/models", timeout=60) as r:
        return json.load(r)["data"][0]["id"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", required=True)
    ap.add_argument("--strangers", type=int, default=63)
    ap.add_argument("--tokens", type=int, default=64)
    a = ap.parse_args()
    model = model_id(a.url)
    probe = {
        "model": model,
        "prompt": "The history of the printing press begins",
        "max_tokens": a.tokens,
        "temperature": 0,
        "logprobs": 1,
    }
    alone = post(a.url, probe)["choices"][0]["logprobs"]

    def stranger(i):
        body = {
            "model": model,
            "prompt": f"Stranger {i} writes about topic {i * 7919 % 1000}:",
            "max_tokens": a.tokens * 2,
            "temperature": 0.8,
            "seed": i,
        }
        if i % 4 == 0:
            body["response_format"] = {"type": "json_object"}
        post(a.url, body)

    threads = [threading.Thread(target=stranger, args=(i,)) for i in range(a.strangers)]
    for t in threads:
        t.start()
    crowd = post(a.url, probe)["choices"][0]["logprobs"]
    for t in threads:
        t.join()
    if len(alone["tokens"]) != len(crowd["tokens"]):
        print(f"DIFFERENT: {len(alone['tokens'])} tokens alone, {len(crowd['tokens'])} among "
              f"{a.strangers}")
        return 1
    for k, (x, y) in enumerate(zip(alone["tokens"], crowd["tokens"])):
        if x != y or alone["token_logprobs"][k] != crowd["token_logprobs"][k]:
            print(f"DIFFERENT at token {k}: {x!r} {alone['token_logprobs'][k]!r} "
                  f"alone, {y!r} {crowd['token_logprobs'][k]!r} among {a.strangers}")
            return 1
    print(f"identical: {len(alone['tokens'])} tokens and logprobs alone and among "
          f"{a.strangers} strangers")
    return 0


if __name__ == "__main__":
    sys.exit(main())
