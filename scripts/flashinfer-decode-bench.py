#!/usr/bin/env python3
"""FlashInfer's paged decode attention on the shapes of `quire bench-attn`.

For the issue-5 comparison "paged decode-attention kernel alone vs
FlashInfer": run this and `quire bench-attn --mode fast` with the same
--batch / --ctx / heads on the same GPU, in one call. Needs torch and PyPI
`flashinfer-python` (carried to the GPU machine as wheels; FlashInfer
JIT-compiles its kernels there with nvcc).

Method (the same as bench-attn's): Llama-3.1-8B heads by default (32 query,
8 KV, head_dim 128), pages of 16 tokens, f16 K/V drawn at random from a
pool of --pool-gib GiB and each sequence's pages picked at random from it
(scattered), one query row per sequence at position ctx - 1. The output is
checked against a float32 torch reference first (the script fails when the
maximum absolute error exceeds --tol). Timing: CUDA events around a CUDA
graph of 20 calls, replayed; microseconds per call. GB/s counts K and V
once plus q and the output.

--pdl: FlashInfer's run() launches with programmatic dependent launch by
default on sm_90+ (enable_pdl=None means on there), which shortens the
gaps between the graph's kernels; `quire bench-attn` times its graph both
with and without programmatic edges, so compare like with like.
"""

import argparse
import math
import sys

import torch

GRAPH_CALLS = 20


def ints(s):
    return [int(v) for v in s.split(",") if v]


def reference(q, k_pool, v_pool, pages, last_len, page, scale):
    """Attention of one sequence's query rows (n_heads, hd) over its pages,
    in float32: softmax(q k^T * scale) v, query heads grouped over KV heads."""
    k = k_pool[pages].reshape(-1, k_pool.shape[2], k_pool.shape[3]).float()
    v = v_pool[pages].reshape(-1, v_pool.shape[2], v_pool.shape[3]).float()
    n_tok = (len(pages) - 1) * page + last_len
    k, v = k[:n_tok], v[:n_tok]
    nh, nkv = q.shape[0], k.shape[1]
    g = nh // nkv
    kq = k.repeat_interleave(g, dim=1)  # (tok, nh, hd)
    vq = v.repeat_interleave(g, dim=1)
    s = torch.einsum("hd,thd->ht", q.float(), kq) * scale
    p = torch.softmax(s, dim=-1)
    return torch.einsum("ht,thd->hd", p, vq)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=ints, default=[1, 8, 32, 64])
    ap.add_argument("--ctx", type=ints, default=[512, 2048, 8192])
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--page", type=int, default=16)
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--pool-gib", type=float, default=2.0)
    ap.add_argument("--tol", type=float, default=2e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--pdl",
        choices=["auto", "0", "1"],
        default="auto",
        help="enable_pdl of the wrapper's run(): auto is FlashInfer's own "
        "default (on for sm_90+), 0 / 1 force it",
    )
    a = ap.parse_args()
    pdl = None if a.pdl == "auto" else a.pdl == "1"

    import flashinfer

    dev = torch.device("cuda:0")
    torch.manual_seed(a.seed)
    nh, nkv, hd, page = a.heads, a.kv_heads, a.head_dim, a.page
    if nh % nkv:
        sys.exit(f"--heads {nh} must be a multiple of --kv-heads {nkv}")
    page_bytes = 2 * page * nkv * hd * 2  # K and V, f16
    need = max(b * math.ceil(c / page) for b in a.batch for c in a.ctx)
    n_pages = max(need, int(a.pool_gib * (1 << 30)) // page_bytes)
    # NHD layout: (pages, page, kv_heads, head_dim) for K and for V.
    k_pool = (torch.rand(n_pages, page, nkv, hd, device=dev) * 4 - 2).half()
    v_pool = (torch.rand(n_pages, page, nkv, hd, device=dev) * 4 - 2).half()
    scale = 1.0 / math.sqrt(hd)
    ws = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
    name = torch.cuda.get_device_name(dev)
    print(
        f"device: {name}; flashinfer {flashinfer.__version__}; torch {torch.__version__}; "
        f"enable_pdl={'default' if pdl is None else pdl}"
    )
    print("| B | ctx | FlashInfer us/call | GB/s | max abs err |")
    print("|---|---|---|---|---|")
    for b in a.batch:
        for ctx in a.ctx:
            per = math.ceil(ctx / page)
            last = ctx - (per - 1) * page
            perm = torch.randperm(n_pages, device=dev)[: b * per].int()
            indptr = torch.arange(0, b + 1, device=dev, dtype=torch.int32) * per
            last_len = torch.full((b,), last, device=dev, dtype=torch.int32)
            wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
                ws,
                "NHD",
                use_cuda_graph=True,
                paged_kv_indptr_buffer=indptr,
                paged_kv_indices_buffer=perm,
                paged_kv_last_page_len_buffer=last_len,
            )
            wrapper.plan(
                indptr,
                perm,
                last_len,
                nh,
                nkv,
                hd,
                page,
                pos_encoding_mode="NONE",
                sm_scale=scale,
                q_data_type=torch.float16,
                kv_data_type=torch.float16,
            )
            q = (torch.rand(b, nh, hd, device=dev) * 4 - 2).half()
            out = wrapper.run(q, (k_pool, v_pool), enable_pdl=pdl)
            torch.cuda.synchronize()
            err = 0.0
            for s in sorted({0, b - 1}):
                pages = perm[s * per : (s + 1) * per].long()
                r = reference(q[s], k_pool, v_pool, pages, last, page, scale)
                err = max(err, (out[s].float() - r).abs().max().item())
            if not err <= a.tol:
                sys.exit(f"B={b} ctx={ctx}: max abs error {err:.3e} over --tol {a.tol:.1e}")
            g = torch.cuda.CUDAGraph()
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(3):
                    wrapper.run(q, (k_pool, v_pool), out=out, enable_pdl=pdl)
            torch.cuda.current_stream().wait_stream(s)
            with torch.cuda.graph(g):
                for _ in range(GRAPH_CALLS):
                    wrapper.run(q, (k_pool, v_pool), out=out, enable_pdl=pdl)
            reps = max(1, a.iters // GRAPH_CALLS)
            g.replay()
            torch.cuda.synchronize()
            t0 = torch.cuda.Event(enable_timing=True)
            t1 = torch.cuda.Event(enable_timing=True)
            t0.record()
            for _ in range(reps):
                g.replay()
            t1.record()
            torch.cuda.synchronize()
            us = 1e3 * t0.elapsed_time(t1) / (reps * GRAPH_CALLS)
            bytes_ = b * ctx * nkv * hd * 2 * 2 + 2 * b * nh * hd * 2
            print(f"| {b} | {ctx} | {us:.1f} | {bytes_ / us / 1e3:,.0f} | {err:.1e} |")


if __name__ == "__main__":
    main()
