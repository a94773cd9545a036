#!/usr/bin/env python3
"""Load generator for `quire serve` (standard library only).

  load:  N concurrent streaming clients, each sending R requests; reports
         throughput (completion tokens/s), TTFT and inter-token latency
         p50/p99 (client side: one SSE text chunk = one token).
  prefix: R requests sharing one long system prompt (default 32 requests,
         1000 shared tokens), C at a time; reports prefill tokens computed
         (from /metrics), wall time and throughput. Run it against servers
         with and without prefix caching (bench/serve_prefix.sh).
  sweep: concurrency levels (default 1,16,64) of streaming clients with
         prompts of exactly N token ids and M generated tokens each, against
         any OpenAI-compatible URL (quire serve, llama-server, vLLM): one JSON
         row per level with generated tokens/s, TTFT and ITL p50/p99.
         bench/serve_vs.sh runs it against Quire and llama-server on one file.
  stall: 8 decoding streams, then one long prompt (default 6000 tokens)
         arrives: reports the worst gap between decode tokens while it is
         prefilled, and its TTFT. Run it against servers with different
         budgets (bench/serve_stall.sh does decode-first vs one-shot prefill).

Examples:
  bench/serve_load.py load --url http://127.0.0.1:8080 --clients 16 --requests 2
  bench/serve_load.py stall --url http://127.0.0.1:8080 --prompt-tokens 6000
  bench/serve_load.py sweep --url http://127.0.0.1:8080 --concurrency 1,16,64 --label quire
"""

import argparse
import http.client
import random
import json
import statistics
import sys
import threading
import time
import urllib.parse
import urllib.request


def pct(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = min(len(xs) - 1, max(0, int(round(p / 100 * (len(xs) - 1)))))
    return xs[k]


def model_id(url, key):
    req = urllib.request.Request(url + "/v1/models", headers=auth(key))
    return json.load(urllib.request.urlopen(req, timeout=30))["data"][0]["id"]


def auth(key):
    return {"Authorization": f"Bearer {key}"} if key else {}


def stream(url, key, body, on_token=None, on_event=None):
    """POSTs a streaming completion; returns (send time, [token arrival times], finish)."""
    u = urllib.parse.urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=3600)
    payload = json.dumps(dict(body, stream=True))
    headers = {"Content-Type": "application/json", **auth(key)}
    t0 = time.perf_counter()
    conn.request("POST", "/v1/completions", payload, headers)
    r = conn.getresponse()
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status}: {r.read()[:300]!r}")
    times, finish = [], None
    while True:
        line = r.fp.readline()
        if not line:
            break
        line = line.decode().strip()
        if not line.startswith("data: "):
            continue
        data = line[6:]
        if data == "[DONE]":
            break
        ev = json.loads(data)
        if "error" in ev:
            raise RuntimeError(ev["error"]["message"])
        if on_event:
            on_event(ev)
        for c in ev.get("choices", []):
            if c.get("text"):
                now = time.perf_counter()
                times.append(now)
                if on_token:
                    on_token(now)
            if c.get("finish_reason"):
                finish = c["finish_reason"]
    conn.close()
    return t0, times, finish


def cmd_load(a):
    model = model_id(a.url, a.key)
    ttfts, itls, ntok, errors = [], [], [0], []
    lock = threading.Lock()

    def client(i):
        for r in range(a.requests):
            body = dict(model=model, prompt=f"Request {i}.{r}: tell me a story about the number {i}.",
                        max_tokens=a.max_tokens, temperature=0.8, seed=i * 1000 + r)
            try:
                t0, times, _ = stream(a.url, a.key, body)
            except Exception as e:  # reported, counted as a failure
                with lock:
                    errors.append(str(e))
                continue
            with lock:
                if times:
                    ttfts.append(times[0] - t0)
                    itls.extend(b - x for x, b in zip(times, times[1:]))
                ntok[0] += len(times)

    t0 = time.perf_counter()
    th = [threading.Thread(target=client, args=(i,)) for i in range(a.clients)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    wall = time.perf_counter() - t0
    out = {
        "clients": a.clients, "requests": a.clients * a.requests, "errors": len(errors),
        "tokens": ntok[0], "wall_s": round(wall, 2), "tokens_per_s": round(ntok[0] / wall, 1),
        "ttft_p50_ms": round(pct(ttfts, 50) * 1e3, 1), "ttft_p99_ms": round(pct(ttfts, 99) * 1e3, 1),
        "itl_p50_ms": round(pct(itls, 50) * 1e3, 1), "itl_p99_ms": round(pct(itls, 99) * 1e3, 1),
    }
    print(json.dumps(out))
    if errors:
        print("first error:", errors[0], file=sys.stderr)
        return 1
    return 0


def cmd_stall(a):
    model = model_id(a.url, a.key)
    arrivals = [[] for _ in range(a.streams)]
    started = threading.Barrier(a.streams + 1)

    def decoder(i):
        first = [True]

        def tick(now):
            arrivals[i].append(now)
            if first[0]:
                first[0] = False
                started.wait()

        body = dict(model=model, prompt=f"Stream {i}: count slowly from one to a thousand.",
                    max_tokens=a.decode_tokens, temperature=0, seed=i)
        stream(a.url, a.key, body, on_token=tick)

    th = [threading.Thread(target=decoder, args=(i,), daemon=True) for i in range(a.streams)]
    for t in th:
        t.start()
    started.wait()  # every stream is decoding
    time.sleep(0.5)
    # Token ids avoid tokenizer effects: a fixed cycle of ordinary ids.
    prompt = [1000 + (i * 7) % 5000 for i in range(a.prompt_tokens)]
    body = dict(model=model, prompt=prompt, max_tokens=1, temperature=0)
    t0, times, _ = stream(a.url, a.key, body)
    t1 = times[0] if times else time.perf_counter()
    # The decoders keep going (daemon threads, cut at exit): look at the
    # window up to one second after the long prompt's first token.
    time.sleep(1.0)
    gaps = []
    for ts in arrivals:
        w = [x for x in ts if t0 <= x <= t1 + 1.0]
        before = [x for x in ts if x < t0]
        if before:
            w = [before[-1]] + w
        gaps.extend(b - x for x, b in zip(w, w[1:]))
    base = [b - x for ts in arrivals for x, b in zip(ts, ts[1:]) if b < t0]
    out = {
        "streams": a.streams, "prompt_tokens": a.prompt_tokens,
        "long_prompt_ttft_s": round(t1 - t0, 2),
        "worst_decode_gap_during_prefill_ms": round(max(gaps) * 1e3, 1) if gaps else None,
        "decode_itl_p50_before_ms": round(statistics.median(base) * 1e3, 1) if base else None,
        "decode_tokens_during_prefill": len(gaps),
    }
    print(json.dumps(out))
    return 0


def cmd_sweep(a):
    """Concurrency levels against one OpenAI-compatible server: at each
    level C clients each send R requests back to back (prompts of exactly
    --prompt-tokens random token ids, distinct per request, so no prefix
    cache helps; --max-tokens each, temperature 0). Reports per level the
    generated tokens/s (completion tokens from usage / wall time), TTFT and
    inter-token latency p50/p99 (client side, one SSE chunk = one token) and
    the mean prompt and completion tokens the server counted."""
    model = model_id(a.url, a.key)
    levels = [int(x) for x in a.concurrency.split(",") if x.strip()]
    if a.warmup:
        # Every batch size up to the largest level once (graph captures,
        # kernel loads), outside the measurement.
        one_level(a, model, max(levels), 1, 16, seed=10_000, label=None)
    rows = []
    for c in levels:
        rows.append(one_level(a, model, c, a.requests, a.max_tokens, seed=c, label=a.label))
    return 1 if any(r["errors"] for r in rows) else 0


def one_level(a, model, clients, requests, max_tokens, seed, label):
    ttfts, itls, errors = [], [], []
    usage = {"prompt": 0, "completion": 0, "n": 0}
    lock = threading.Lock()

    def client(i):
        rng = random.Random(seed * 100_003 + i)
        for r in range(requests):
            prompt = [1000 + rng.randrange(20_000) for _ in range(a.prompt_tokens)]
            body = dict(model=model, prompt=prompt, max_tokens=max_tokens,
                        temperature=a.temperature, stream_options={"include_usage": True})
            if a.response_format:
                body["response_format"] = json.loads(a.response_format)
            try:
                t0, times, _, u = stream_usage(a.url, a.key, body)
            except Exception as e:  # reported, counted as a failure
                with lock:
                    errors.append(str(e))
                continue
            with lock:
                if times:
                    ttfts.append(times[0] - t0)
                    itls.extend(b - x for x, b in zip(times, times[1:]))
                usage["n"] += 1
                usage["prompt"] += (u or {}).get("prompt_tokens", 0)
                usage["completion"] += (u or {}).get("completion_tokens", len(times))

    t0 = time.perf_counter()
    th = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    wall = time.perf_counter() - t0
    n = max(usage["n"], 1)
    out = {
        "label": label, "concurrency": clients, "requests": clients * requests,
        "errors": len(errors), "wall_s": round(wall, 2),
        "gen_tokens_per_s": round(usage["completion"] / wall, 1),
        "ttft_p50_ms": round(pct(ttfts, 50) * 1e3, 1), "ttft_p99_ms": round(pct(ttfts, 99) * 1e3, 1),
        "itl_p50_ms": round(pct(itls, 50) * 1e3, 2), "itl_p99_ms": round(pct(itls, 99) * 1e3, 2),
        "prompt_tokens_mean": round(usage["prompt"] / n, 1),
        "completion_tokens_mean": round(usage["completion"] / n, 1),
    }
    if label is not None:
        print(json.dumps(out), flush=True)
    if errors:
        print("first error:", errors[0], file=sys.stderr)
    return out


def stream_usage(url, key, body):
    """`stream`, plus the usage object of the last chunk (None if absent)."""
    usage = [None]

    def on_event(ev):
        if ev.get("usage"):
            usage[0] = ev["usage"]

    t0, times, finish = stream(url, key, body, on_event=on_event)
    return t0, times, finish, usage[0]


def metric(url, key, name):
    req = urllib.request.Request(url + "/metrics", headers=auth(key))
    with urllib.request.urlopen(req) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    raise RuntimeError(f"metric {name} not found")


def cmd_prefix(a):
    model = model_id(a.url, a.key)
    # Token ids avoid tokenizer effects: a shared prefix, then a short
    # per-request suffix.
    shared = [1000 + (i * 13) % 7000 for i in range(a.shared_tokens)]
    before = metric(a.url, a.key, "quire_prefill_tokens_computed_total")
    hits0 = metric(a.url, a.key, "quire_prefix_cache_hit_tokens_total")
    errors, ntok = [], [0]
    lock = threading.Lock()
    sem = threading.Semaphore(a.concurrency)

    def one(i):
        with sem:
            prompt = shared + [9000 + i * 17 + j for j in range(a.suffix_tokens)]
            body = dict(model=model, prompt=prompt, max_tokens=a.max_tokens, temperature=0)
            try:
                _, times, _ = stream(a.url, a.key, body)
                with lock:
                    ntok[0] += len(times)
            except Exception as e:  # reported, counted as a failure
                with lock:
                    errors.append(str(e))

    t0 = time.perf_counter()
    th = [threading.Thread(target=one, args=(i,)) for i in range(a.requests)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    wall = time.perf_counter() - t0
    computed = metric(a.url, a.key, "quire_prefill_tokens_computed_total") - before
    hits = metric(a.url, a.key, "quire_prefix_cache_hit_tokens_total") - hits0
    print(json.dumps({
        "requests": a.requests, "shared_tokens": a.shared_tokens, "errors": len(errors),
        "prompt_tokens": a.requests * (a.shared_tokens + a.suffix_tokens),
        "prefill_tokens_computed": int(computed), "prefix_hit_tokens": int(hits),
        "wall_s": round(wall, 2), "requests_per_s": round(a.requests / wall, 3),
        "completion_tokens_per_s": round(ntok[0] / wall, 2),
    }))
    if errors:
        print("first error:", errors[0], file=sys.stderr)
        return 1
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("load", "stall", "prefix", "sweep"):
        s = sub.add_parser(name)
        s.add_argument("--url", default="http://127.0.0.1:8080")
        s.add_argument("--key", default=None)
    s = sub.choices["load"]
    s.add_argument("--clients", type=int, default=8)
    s.add_argument("--requests", type=int, default=2, help="per client")
    s.add_argument("--max-tokens", type=int, default=32)
    s = sub.choices["stall"]
    s.add_argument("--streams", type=int, default=8)
    s.add_argument("--prompt-tokens", type=int, default=6000)
    s.add_argument("--decode-tokens", type=int, default=400)
    s = sub.choices["prefix"]
    s.add_argument("--requests", type=int, default=32)
    s.add_argument("--concurrency", type=int, default=8)
    s.add_argument("--shared-tokens", type=int, default=1000)
    s.add_argument("--suffix-tokens", type=int, default=16)
    s.add_argument("--max-tokens", type=int, default=8)
    s = sub.choices["sweep"]
    s.add_argument("--concurrency", default="1,16,64", help="comma-separated levels")
    s.add_argument("--requests", type=int, default=1, help="per client, back to back")
    s.add_argument("--prompt-tokens", type=int, default=512)
    s.add_argument("--max-tokens", type=int, default=128)
    s.add_argument("--temperature", type=float, default=0.0)
    s.add_argument("--label", default="server", help="names the server in the output rows")
    s.add_argument("--response-format", default=None,
                   help="a JSON response_format sent with every request (structured output)")
    s.add_argument("--no-warmup", dest="warmup", action="store_false",
                   help="skip the unmeasured pass at the largest level")
    a = p.parse_args()
    a.url = a.url.rstrip("/")
    cmds = {"load": cmd_load, "stall": cmd_stall, "prefix": cmd_prefix, "sweep": cmd_sweep}
    return cmds[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
