"""Reference logits from Hugging Face transformers (torch, CPU) for a GGUF
model of the llama family, using the weights as the `gguf` package
dequantizes them.

usage: hf_reference.py MODEL.gguf TOKENS_JSON OUT.f32
Writes logits (n_tokens, vocab) as little-endian float32 to OUT.f32.
"""
import json
import sys

import numpy as np
import torch
import gguf
from gguf.quants import dequantize


def field(r, key, default=None):
    f = r.fields.get(key)
    if f is None:
        return default
    v = f.contents()
    return v


def build_model(path):
    """A transformers model with the GGUF file's (dequantized) weights."""
    r = gguf.GGUFReader(path)
    arch = field(r, "general.architecture")
    p = lambda k, d=None: field(r, f"{arch}.{k}", d)
    tensors = {}
    for t in r.tensors:
        a = dequantize(t.data, t.tensor_type).astype(np.float32)
        dims = [int(d) for d in t.shape]  # GGML order
        shape = list(reversed(dims))
        tensors[t.name] = torch.from_numpy(np.ascontiguousarray(a.reshape(shape)))
    dim = p("embedding_length")
    n_heads = p("attention.head_count")
    n_kv = p("attention.head_count_kv", n_heads)
    head_dim = p("attention.key_length", dim // n_heads)
    n_layers = p("block_count")
    vocab = tensors["token_embd.weight"].shape[0]
    tied = "output.weight" not in tensors
    common = dict(
        vocab_size=vocab,
        hidden_size=dim,
        intermediate_size=p("feed_forward_length"),
        num_hidden_layers=n_layers,
        num_attention_heads=n_heads,
        num_key_value_heads=n_kv,
        rms_norm_eps=float(p("attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=float(p("rope.freq_base", 10000.0)),
        max_position_embeddings=int(p("context_length", 4096)),
        tie_word_embeddings=tied,
        head_dim=head_dim,
    )
    import transformers as tf

    if arch == "llama":
        cfg = tf.LlamaConfig(attention_bias=False, mlp_bias=False, **common)
        model = tf.LlamaForCausalLM(cfg)
    elif arch == "qwen2":
        cfg = tf.Qwen2Config(**common)
        model = tf.Qwen2ForCausalLM(cfg)
    elif arch == "qwen3":
        cfg = tf.Qwen3Config(attention_bias=False, **common)
        model = tf.Qwen3ForCausalLM(cfg)
    else:
        raise SystemExit(f"unsupported arch {arch}")

    def unpermute(w, heads):
        # GGUF llama q/k rows are permuted for interleaved RoPE; undo it to
        # get Hugging Face's rotate-half layout.
        rows = w.shape[0]
        return (
            w.reshape(heads, head_dim // 2, 2, *w.shape[1:])
            .swapaxes(1, 2)
            .reshape(rows, *w.shape[1:])
        )

    sd = {}
    sd["model.embed_tokens.weight"] = tensors["token_embd.weight"]
    sd["model.norm.weight"] = tensors["output_norm.weight"]
    sd["lm_head.weight"] = tensors.get("output.weight", tensors["token_embd.weight"])
    for i in range(n_layers):
        b = f"blk.{i}."
        m = f"model.layers.{i}."
        q = tensors[b + "attn_q.weight"]
        k = tensors[b + "attn_k.weight"]
        if arch == "llama":
            q, k = unpermute(q, n_heads), unpermute(k, n_kv)
        sd[m + "self_attn.q_proj.weight"] = q
        sd[m + "self_attn.k_proj.weight"] = k
        sd[m + "self_attn.v_proj.weight"] = tensors[b + "attn_v.weight"]
        sd[m + "self_attn.o_proj.weight"] = tensors[b + "attn_output.weight"]
        for n, hn in (("attn_q.bias", "q_proj.bias"), ("attn_k.bias", "k_proj.bias"), ("attn_v.bias", "v_proj.bias")):
            if b + n in tensors:
                sd[m + "self_attn." + hn] = tensors[b + n]
        if arch == "qwen3":
            sd[m + "self_attn.q_norm.weight"] = tensors[b + "attn_q_norm.weight"]
            sd[m + "self_attn.k_norm.weight"] = tensors[b + "attn_k_norm.weight"]
        sd[m + "input_layernorm.weight"] = tensors[b + "attn_norm.weight"]
        sd[m + "post_attention_layernorm.weight"] = tensors[b + "ffn_norm.weight"]
        sd[m + "mlp.gate_proj.weight"] = tensors[b + "ffn_gate.weight"]
        sd[m + "mlp.up_proj.weight"] = tensors[b + "ffn_up.weight"]
        sd[m + "mlp.down_proj.weight"] = tensors[b + "ffn_down.weight"]
    missing, unexpected = model.load_state_dict(sd, strict=False)
    missing = [k for k in missing if not (tied and k == "lm_head.weight")]
    if missing or unexpected:
        raise SystemExit(f"state dict mismatch: missing={missing} unexpected={unexpected}")
    model.eval()
    return model


def main():
    path, toks_json, out = sys.argv[1], sys.argv[2], sys.argv[3]
    tokens = json.loads(toks_json)
    model = build_model(path)
    with torch.no_grad():
        logits = model(torch.tensor([tokens])).logits[0].float().numpy()
    logits.astype("<f4").tofile(out)


if __name__ == "__main__":
    main()
