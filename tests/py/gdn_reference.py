"""Gated DeltaNet reference outputs from transformers' own qwen3_5 functions.

Used by tests/cpu_ops_gdn.rs. Reads one JSON object from stdin and prints one
JSON object. `check-imports` as the only argument exits 0 when torch and
transformers' qwen3_5 module import, else prints the reason and exits 1.

Inputs use Quire's (GGUF) conventions: token-major activations, value heads in
GGUF (tiled) order, where value head h reads key head h % H_k, and the
recurrent state laid out per head as [d_v][d_k] (element (h, i, j) at
h*d_k*d_v + j*d_k + i). transformers uses the grouped order (value head j
reads key head j // r) and a [d_k][d_v] state, so this script permutes value
heads the way the GGUF converter does (GGUF head h = s*H_k + g holds HF head
g*r + s) before calling transformers and permutes the results back. A wrong
head mapping on the Rust side therefore shows up as a mismatch here.
"""

import json
import sys


def main():
    if sys.argv[1:] == ["check-imports"]:
        try:
            import torch  # noqa: F401
            from transformers.models.qwen3_5 import modeling_qwen3_5  # noqa: F401
        except Exception as e:  # report any import failure as the skip reason
            print(f"{type(e).__name__}: {e}")
            sys.exit(1)
        return

    import torch
    import torch.nn.functional as F
    from transformers.models.qwen3_5 import modeling_qwen3_5 as m

    torch.set_num_threads(1)
    inp = json.load(sys.stdin)
    f32 = lambda xs: torch.tensor(xs, dtype=torch.float32)  # noqa: E731
    out = {}

    # Causal conv + SiLU with carried state: transformers' decode-path
    # function, whose conv_state is [batch, channels, K-1], time fastest.
    cv = inp["conv"]
    t, c, k = cv["T"], cv["channels"], cv["kernel"]
    x = f32(cv["x"]).reshape(1, t, c).transpose(1, 2).contiguous()
    w = f32(cv["w"]).reshape(c, k)
    state = f32(cv["state"]).reshape(1, c, k - 1).clone()
    y = m.causal_conv1d_update(x, state, w, None, "silu")
    out["conv_out"] = y.transpose(1, 2).reshape(-1).tolist()
    out["conv_state"] = state.reshape(-1).tolist()

    # Gates, exactly as Qwen3_5GatedDeltaNet.forward (ssm_a = -exp(A_log)).
    gt = inp["gates"]
    a, b = f32(gt["a"]), f32(gt["b"])
    hv = len(gt["dt_bias"])
    a = a.reshape(-1, hv)
    b = b.reshape(-1, hv)
    ssm_a = f32(gt["ssm_a"])
    out["g"] = (ssm_a * F.softplus(a.float() + f32(gt["dt_bias"]))).reshape(-1).tolist()
    out["beta"] = b.sigmoid().reshape(-1).tolist()

    # Delta rule, both of transformers' forms, q/k L2-normalised inside.
    d = inp["delta"]
    hk, hv, dk, dv, t = d["h_k"], d["h_v"], d["d_k"], d["d_v"], d["T"]
    r = hv // hk
    # hf_of_gguf[h] = HF head held at GGUF position h; gguf_of_hf is its inverse.
    hf_of_gguf = [(h % hk) * r + h // hk for h in range(hv)]
    gguf_of_hf = [0] * hv
    for h, j in enumerate(hf_of_gguf):
        gguf_of_hf[j] = h
    idx = torch.tensor(gguf_of_hf)
    back = torch.tensor(hf_of_gguf)
    q = f32(d["q"]).reshape(1, t, hk, dk)
    kk = f32(d["k"]).reshape(1, t, hk, dk)
    v = f32(d["v"]).reshape(1, t, hv, dv)[:, :, idx]
    g = f32(d["g"]).reshape(1, t, hv)[:, :, idx]
    beta = f32(d["beta"]).reshape(1, t, hv)[:, :, idx]
    s0 = f32(d["state"]).reshape(1, hv, dv, dk).transpose(2, 3)[:, idx].contiguous()
    for name, fn, extra in [
        ("recurrent", m.torch_recurrent_gated_delta_rule, {}),
        ("chunk", m.torch_chunk_gated_delta_rule, {"chunk_size": 64}),
    ]:
        o, s = fn(
            q,
            kk,
            v,
            g=g,
            beta=beta,
            initial_state=s0.clone(),
            output_final_state=True,
            use_qk_l2norm_in_kernel=True,
            **extra,
        )
        out[f"{name}_out"] = o[:, :, back].reshape(-1).tolist()
        out[f"{name}_state"] = s[:, back].transpose(2, 3).reshape(-1).tolist()

    # Gated RMSNorm (ssm_norm weight used as is).
    nm = inp["norm"]
    dim = len(nm["w"])
    layer = m.Qwen3_5RMSNormGated(dim, eps=nm["eps"])
    with torch.no_grad():
        layer.weight.copy_(f32(nm["w"]))
        y = layer(f32(nm["x"]).reshape(-1, dim), f32(nm["z"]).reshape(-1, dim))
    out["norm_out"] = y.reshape(-1).tolist()

    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
