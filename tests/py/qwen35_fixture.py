"""Tiny random-weight Qwen3.5 (llama.cpp architecture `qwen35`) test fixture.

usage: qwen35_fixture.py OUT_DIR [--seed N] [--cache DIR] [--sdist PATH]

Builds a small Qwen3_5ForCausalLM with transformers (float32, random
weights), saves it with a small byte-level BPE tokenizer, converts it to GGUF
with llama.cpp's own converter and writes transformers' reference outputs.
Files written to OUT_DIR:

  hf/                      the Hugging Face model + tokenizer
  hf-mtp/                  the same model plus one random MTP block
  qwen35-f32.gguf          converted with --no-mtp --outtype f32
  qwen35-f16.gguf          converted with --no-mtp --outtype f16
  qwen35-mtp-f32.gguf      converted from hf-mtp (block_count = layers + 1,
                           qwen35.nextn_predict_layers = 1); MTP is skipped in
                           normal decoding, so its logits equal the others'
  reference.json           {"vocab_size", "config", "cases": [{"prompt",
                           "f32": REF, "f16": REF}]}, REF = {"greedy",
                           "logits", "min_greedy_gap"}: transformers in f32
                           with the weights of that GGUF (for f16, the 2-D
                           matrices rounded to f16). "logits"[i] are the
                           logits after token i of prompt + greedy (one full
                           forward); "greedy" is the 16-token greedy
                           continuation, decoded token by token with
                           transformers' cache (its recurrent GDN path)

The converter comes from the PyPI sdist of llama-cpp-python (pinned version
and sha256 below), unpacked under the cache directory; only its Python
conversion code is used, for tests only. Nothing of llama.cpp is built.
"""
import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

SDIST_VERSION = "0.3.36"
SDIST_NAME = f"llama_cpp_python-{SDIST_VERSION}.tar.gz"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
SDIST_ROOT = f"llama_cpp_python-{SDIST_VERSION}/vendor/llama.cpp/"
CONVERTER_PARTS = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/")

# H_v = 2 * H_k so the converter's grouped->tiled v-head reorder is not the
# identity; 8 layers with interval 4 give layers 3 and 7 full attention and
# the other six Gated DeltaNet. Model vocab 384 > tokenizer size (320), as in
# the real checkpoints, so the converter writes padding tokens.
CONFIG = dict(
    vocab_size=384,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=8,
    full_attention_interval=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=16,
    linear_value_head_dim=16,
    linear_conv_kernel_dim=4,
    rope_parameters={
        "rope_type": "default",
        "rope_theta": 10000000.0,
        "partial_rotary_factor": 0.25,
        "mrope_section": [2, 1, 1],
        "mrope_interleaved": True,
    },
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
    max_position_embeddings=4096,
)
TOKENIZER_SIZE = 320
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# The Qwen3.5 split regex (llama.cpp pre-tokenizer "qwen35").
QWEN35_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
PROMPT_LENS = (24, 37, 77)  # 77 > 64: transformers' chunked GDN path spans two chunks
N_GREEDY = 16
# A greedy step whose top-2 logit gap is below this is a near-tie that f32
# rounding could flip; such prompts are redrawn (deterministically).
MIN_GREEDY_GAP = 0.02


def unpack_converter(cache: Path, sdist: Path | None) -> Path:
    """The converter's directory (convert_hf_to_gguf.py, conversion/, gguf-py/)."""
    dest = cache / f"llama.cpp-convert-{SDIST_VERSION}"
    if (dest / ".complete").exists():
        return dest
    tarball = sdist if sdist is not None else cache / SDIST_NAME
    if not tarball.exists():
        cache.mkdir(parents=True, exist_ok=True)
        # pip fetches the sdist only (no build, no dependencies).
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", "llama-cpp-python",
             f"llama-cpp-python=={SDIST_VERSION}", "-d", str(cache)],
            check=True,
        )
        tarball = cache / SDIST_NAME
    digest = hashlib.sha256(tarball.read_bytes()).hexdigest()
    if digest != SDIST_SHA256:
        raise SystemExit(f"{tarball}: sha256 {digest}, expected {SDIST_SHA256}")
    tmp = dest.with_name(dest.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    with tarfile.open(tarball) as tf:
        members = []
        for m in tf.getmembers():
            if not m.name.startswith(SDIST_ROOT) or not (m.isfile() or m.isdir()):
                continue
            rel = m.name[len(SDIST_ROOT):]
            if any(rel == p or rel.startswith(p) for p in CONVERTER_PARTS):
                m.name = rel
                members.append(m)
        tf.extractall(tmp, members=members, filter="data")
    (tmp / ".complete").write_text(SDIST_SHA256 + "\n")
    if dest.exists():
        shutil.rmtree(dest)
    tmp.rename(dest)
    return dest


def use_converter_gguf(conv: Path):
    """Puts the converter's gguf-py (which knows MODEL_ARCH.QWEN35) first."""
    sys.path.insert(0, str(conv / "gguf-py"))
    sys.path.insert(0, str(conv))


def convert_main(conv: Path, argv: list[str]):
    """Runs convert_hf_to_gguf.main() with `argv` in this process.

    The converter names the BPE pre-tokenizer by hashing the token ids of a
    probe text; the hash table only lists published tokenizers, and this
    fixture's tokenizer is trained locally, so the lookup would fail. It uses
    Qwen3.5's split regex, so the name is pinned to "qwen35" (what the real
    Qwen3.5 tokenizer maps to) by replacing get_vocab_base_pre."""
    use_converter_gguf(conv)
    from conversion import base

    base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "qwen35"
    import convert_hf_to_gguf

    sys.argv = ["convert_hf_to_gguf.py", *argv]
    convert_hf_to_gguf.main()


def build_tokenizer(out: Path):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN35_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    corpus = [
        "The quick brown fox jumps over the lazy dog. " * 3,
        "Gated delta networks keep a fixed-size state per head; attention keeps every key.",
        "def main():\n    print('hello, world')\n    return 0\n",
        "It's 12:45 and we've got 3 tests left, they'll pass.",
    ] * 4
    trainer = trainers.BpeTrainer(
        vocab_size=TOKENIZER_SIZE,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    fast.save_pretrained(out)
    return fast


def randomize(model, seed: int):
    """Weights with O(1) logits (so greedy gaps are not rounding-sized) and
    non-default norms, decays and biases, so the converter's transforms are
    all observable: +1 on the (1 + w) RMSNorms, none on the gated GDN norm,
    A_log -> -exp(A_log), dt_bias renamed, v-head reorder."""
    import torch

    g = torch.Generator().manual_seed(seed)

    def normal(p, std, mean=0.0):
        p.data.copy_(torch.randn(p.shape, generator=g) * std + mean)

    for name, p in sorted(model.named_parameters()):
        if name.endswith("linear_attn.norm.weight"):
            normal(p, 0.2, 1.0)  # plain multiplier (Qwen3_5RMSNormGated)
        elif name.endswith("norm.weight"):
            normal(p, 0.2)  # HF applies (1 + w)
        elif name.endswith("A_log"):
            p.data.copy_(torch.rand(p.shape, generator=g) * 3.5 - 3.0)  # A in [0.05, 1.6]
        elif name.endswith("dt_bias"):
            normal(p, 0.5)
        elif name.endswith("conv1d.weight"):
            normal(p, 0.4)
        elif name.endswith("embed_tokens.weight"):
            normal(p, 1.0)
        elif p.dim() == 2:
            normal(p, p.shape[1] ** -0.5)
        else:
            raise SystemExit(f"unexpected parameter {name} {tuple(p.shape)}")


def greedy_decode(model, prompt, n):
    """Greedy continuation with the cache: prefill, then one token per step
    (transformers' recurrent GDN path). Returns tokens and step logits."""
    import torch

    with torch.no_grad():
        out = model(torch.tensor([prompt]), use_cache=True)
        cache = out.past_key_values
        last = out.logits[0, -1]
        toks, steps = [], []
        for i in range(n):
            steps.append(last.clone())
            t = int(torch.argmax(last))
            toks.append(t)
            if i + 1 == n:
                break
            out = model(torch.tensor([[t]]), past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            last = out.logits[0, -1]
    return toks, steps


def nmse(a, b):
    import torch

    a, b = a.double(), b.double()
    return float(((a - b) ** 2).sum() / (b**2).sum().clamp_min(1e-30))


def reference(model, prompt):
    """Greedy continuation, full-forward logits and the smallest top-2 gap
    over the greedy steps."""
    import torch

    n = len(prompt)
    greedy, steps = greedy_decode(model, prompt, N_GREEDY)
    with torch.no_grad():
        full = model(torch.tensor([prompt + greedy]), use_cache=False).logits[0]
    gaps = []
    for i, s in enumerate(steps):
        f = full[n - 1 + i]
        # The cached (recurrent) and full (chunked) paths must agree.
        e = nmse(s, f)
        if e > 1e-9 or int(torch.argmax(f)) != greedy[i]:
            raise SystemExit(f"transformers decode vs prefill differ at step {i}: NMSE {e:.3e}")
        top2 = torch.topk(f, 2).values
        gaps.append(float(top2[0] - top2[1]))
    return {
        "greedy": greedy,
        "min_greedy_gap": min(gaps),
        "logits": [[float(f"{v:.8e}") for v in row] for row in full.tolist()],
    }


def make_cases(models: dict, seed: int):
    """One case per prompt length, with a reference per weight type (`models`:
    name -> transformers model holding exactly the weights of that GGUF)."""
    import torch

    g = torch.Generator().manual_seed(seed + 1)
    cases = []
    for n in PROMPT_LENS:
        for attempt in range(100):
            prompt = torch.randint(0, TOKENIZER_SIZE, (n,), generator=g).tolist()
            refs = {k: reference(m, prompt) for k, m in models.items()}
            if min(r["min_greedy_gap"] for r in refs.values()) >= MIN_GREEDY_GAP:
                break
        else:
            raise SystemExit(f"no prompt of length {n} without a greedy near-tie")
        cases.append({"prompt": prompt, **refs})
    return cases


def f16_twin(model):
    """A copy with the weights the f16 GGUF holds: the converter stores the
    2-D matrices (embeddings, projections, lm_head) as f16 and keeps norms,
    ssm_a, dt bias and the conv kernel in f32 (checked in verify_gguf)."""
    import copy

    import torch

    twin = copy.deepcopy(model)
    with torch.no_grad():
        for p in twin.parameters():
            if p.dim() == 2:
                p.copy_(p.half().float())
    return twin


def add_mtp(src: Path, dst: Path, seed: int):
    """Copies the model to `dst` with one random MTP block in the checkpoint
    layout of the published Qwen3.5 models (`mtp.*` tensors, config
    `mtp_num_hidden_layers`). transformers ignores these weights."""
    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst, dirs_exist_ok=True)
    cfg = json.loads((src / "config.json").read_text())
    cfg["mtp_num_hidden_layers"] = 1
    (dst / "config.json").write_text(json.dumps(cfg, indent=2))
    sd = load_file(str(src / "model.safetensors"))
    g = torch.Generator().manual_seed(seed + 2)
    d, hd = cfg["hidden_size"], cfg["head_dim"]
    nh, nkv, ff = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["intermediate_size"]
    shapes = {
        "mtp.fc.weight": (d, 2 * d),
        "mtp.pre_fc_norm_embedding.weight": (d,),
        "mtp.pre_fc_norm_hidden.weight": (d,),
        "mtp.norm.weight": (d,),
        "mtp.layers.0.input_layernorm.weight": (d,),
        "mtp.layers.0.post_attention_layernorm.weight": (d,),
        "mtp.layers.0.self_attn.q_proj.weight": (2 * nh * hd, d),
        "mtp.layers.0.self_attn.k_proj.weight": (nkv * hd, d),
        "mtp.layers.0.self_attn.v_proj.weight": (nkv * hd, d),
        "mtp.layers.0.self_attn.o_proj.weight": (d, nh * hd),
        "mtp.layers.0.self_attn.q_norm.weight": (hd,),
        "mtp.layers.0.self_attn.k_norm.weight": (hd,),
        "mtp.layers.0.mlp.gate_proj.weight": (ff, d),
        "mtp.layers.0.mlp.up_proj.weight": (ff, d),
        "mtp.layers.0.mlp.down_proj.weight": (d, ff),
    }
    for name, shape in shapes.items():
        std = 0.2 if len(shape) == 1 else shape[1] ** -0.5
        sd[name] = (torch.randn(shape, generator=g) * std).contiguous()
    save_file(sd, str(dst / "model.safetensors"), metadata={"format": "pt"})


def expected_tensors(cfg: dict, n_mtp: int) -> dict[str, tuple]:
    """GGUF tensor name -> ne (ggml order) for the converted model."""
    d, ff, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    hd, nh, nkv = cfg["head_dim"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hk, hv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    dk, dv, kc = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"], cfg["linear_conv_kernel_dim"]
    key_dim, value_dim = hk * dk, hv * dv
    conv_dim = 2 * key_dim + value_dim
    t = {"token_embd.weight": (d, v), "output_norm.weight": (d,), "output.weight": (d, v)}
    n = cfg["num_hidden_layers"]
    for i in range(n + n_mtp):
        b = f"blk.{i}."
        t[b + "attn_norm.weight"] = (d,)
        t[b + "post_attention_norm.weight"] = (d,)
        t[b + "ffn_gate.weight"] = (d, ff)
        t[b + "ffn_up.weight"] = (d, ff)
        t[b + "ffn_down.weight"] = (ff, d)
        if i < n and (i + 1) % cfg["full_attention_interval"] != 0:
            t[b + "attn_qkv.weight"] = (d, conv_dim)
            t[b + "attn_gate.weight"] = (d, value_dim)
            t[b + "ssm_beta.weight"] = (d, hv)
            t[b + "ssm_alpha.weight"] = (d, hv)
            t[b + "ssm_conv1d.weight"] = (kc, conv_dim)
            t[b + "ssm_dt.bias"] = (hv,)
            t[b + "ssm_a"] = (hv,)
            t[b + "ssm_norm.weight"] = (dv,)
            t[b + "ssm_out.weight"] = (value_dim, d)
        else:
            t[b + "attn_q.weight"] = (d, 2 * nh * hd)
            t[b + "attn_k.weight"] = (d, nkv * hd)
            t[b + "attn_v.weight"] = (d, nkv * hd)
            t[b + "attn_output.weight"] = (nh * hd, d)
            t[b + "attn_q_norm.weight"] = (hd,)
            t[b + "attn_k_norm.weight"] = (hd,)
        if i >= n:
            t[b + "nextn.eh_proj.weight"] = (2 * d, d)
            t[b + "nextn.enorm.weight"] = (d,)
            t[b + "nextn.hnorm.weight"] = (d,)
            t[b + "nextn.shared_head_norm.weight"] = (d,)
    return t


def field(r, key):
    f = r.fields.get(key)
    return None if f is None else f.contents()


def verify_gguf(path: Path, cfg: dict, hf_sd: dict, n_mtp: int) -> dict:
    """Checks names, shapes, metadata and a few converter transforms; returns
    the metadata (without token arrays) for the summary."""
    import gguf
    import numpy as np

    r = gguf.GGUFReader(path)
    meta = {}
    for k in r.fields:
        if k.startswith("tokenizer.ggml.") and k not in ("tokenizer.ggml.model", "tokenizer.ggml.pre"):
            v = field(r, k)
            meta[k] = f"<{len(v)} entries>" if isinstance(v, list) else v
        elif not k.startswith("GGUF."):
            meta[k] = field(r, k)
    want_meta = {
        "general.architecture": "qwen35",
        "qwen35.block_count": cfg["num_hidden_layers"] + n_mtp,
        "qwen35.embedding_length": cfg["hidden_size"],
        "qwen35.feed_forward_length": cfg["intermediate_size"],
        "qwen35.attention.head_count": cfg["num_attention_heads"],
        "qwen35.attention.head_count_kv": cfg["num_key_value_heads"],
        "qwen35.attention.key_length": cfg["head_dim"],
        "qwen35.attention.value_length": cfg["head_dim"],
        "qwen35.rope.dimension_count": int(cfg["head_dim"] * 0.25),
        "qwen35.rope.dimension_sections": [2, 1, 1, 0],
        "qwen35.ssm.conv_kernel": cfg["linear_conv_kernel_dim"],
        "qwen35.ssm.state_size": cfg["linear_key_head_dim"],
        "qwen35.ssm.group_count": cfg["linear_num_key_heads"],
        "qwen35.ssm.time_step_rank": cfg["linear_num_value_heads"],
        "qwen35.ssm.inner_size": cfg["linear_value_head_dim"] * cfg["linear_num_value_heads"],
        "qwen35.full_attention_interval": cfg["full_attention_interval"],
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "qwen35",
    }
    if n_mtp:
        want_meta["qwen35.nextn_predict_layers"] = n_mtp
    for k, v in want_meta.items():
        got = meta.get(k)
        if got != v:
            raise SystemExit(f"{path.name}: {k} = {got!r}, expected {v!r}")
    if n_mtp == 0 and "qwen35.nextn_predict_layers" in meta:
        raise SystemExit(f"{path.name}: unexpected qwen35.nextn_predict_layers")
    for k, v in (("qwen35.attention.layer_norm_rms_epsilon", cfg["rms_norm_eps"]),
                 ("qwen35.rope.freq_base", cfg["rope_parameters"]["rope_theta"])):
        if meta.get(k) is None or abs(meta[k] - v) > 1e-6 * abs(v):
            raise SystemExit(f"{path.name}: {k} = {meta.get(k)!r}, expected {v}")

    want = expected_tensors(cfg, n_mtp)
    got = {t.name: tuple(int(x) for x in t.shape) for t in r.tensors}
    if got != want:
        missing = sorted(set(want) - set(got))
        extra = sorted(set(got) - set(want))
        wrong = sorted(k for k in set(want) & set(got) if want[k] != got[k])
        raise SystemExit(f"{path.name}: tensors differ: missing {missing} extra {extra} "
                         f"wrong shapes {[(k, got[k], want[k]) for k in wrong]}")

    # Spot checks of the converter's transforms on layer 0 (GDN) and 3 (attention).
    arr = {t.name: np.asarray(t.data, dtype=np.float32).reshape(-1) for t in r.tensors}
    hk, hv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    r_ = hv // hk

    def hf(name):
        return hf_sd[name].double().numpy()

    def tiled(x, head):  # grouped [H_k, r, head] -> tiled [r, H_k, head] along dim 0
        return x.reshape(hk, r_, head, *x.shape[1:]).swapaxes(0, 1).reshape(x.shape)

    la = "model.layers.0.linear_attn."
    checks = [
        ("blk.0.ssm_a", -np.exp(tiled(hf(la + "A_log"), 1))),
        ("blk.0.ssm_dt.bias", tiled(hf(la + "dt_bias"), 1)),
        ("blk.0.ssm_alpha.weight", tiled(hf(la + "in_proj_a.weight"), 1)),
        ("blk.0.ssm_beta.weight", tiled(hf(la + "in_proj_b.weight"), 1)),
        ("blk.0.attn_gate.weight", tiled(hf(la + "in_proj_z.weight"), cfg["linear_value_head_dim"])),
        ("blk.0.ssm_norm.weight", hf(la + "norm.weight")),
        ("blk.0.attn_norm.weight", hf("model.layers.0.input_layernorm.weight") + 1),
        ("blk.3.attn_q_norm.weight", hf("model.layers.3.self_attn.q_norm.weight") + 1),
        ("output_norm.weight", hf("model.norm.weight") + 1),
    ]
    f16 = "f16" in path.name
    tol = 2e-3 if f16 else 1e-6
    want_f16 = {k for k, ne in want.items() if f16 and len(ne) == 2 and "ssm_conv1d" not in k}
    got_f16 = {t.name for t in r.tensors if t.tensor_type == gguf.GGMLQuantizationType.F16}
    others = {t.tensor_type.name for t in r.tensors if t.name not in got_f16}
    if got_f16 != want_f16 or others != {"F32"}:
        raise SystemExit(f"{path.name}: f16 tensors {sorted(got_f16 ^ want_f16)} differ from the "
                         f"reference's rounding rule, other types {others}")
    for name, want_v in checks:
        d = np.abs(arr[name] - want_v.reshape(-1)).max()
        if d > tol * max(1.0, np.abs(want_v).max()):
            raise SystemExit(f"{path.name}: {name} differs from the HF weights by {d}")
    return meta


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cache", type=Path, default=None,
                    help="where the converter sdist is kept (default OUT_DIR/..)")
    ap.add_argument("--sdist", type=Path, default=None,
                    help=f"a local copy of {SDIST_NAME} (else pip downloads it)")
    ap.add_argument("--convert", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    a = ap.parse_args()
    out = a.out_dir.resolve()
    cache = (a.cache or out.parent).resolve()
    conv = unpack_converter(cache, a.sdist)
    if a.convert is not None:
        convert_main(conv, a.convert)
        return

    use_converter_gguf(conv)
    import torch
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    torch.manual_seed(a.seed)
    out.mkdir(parents=True, exist_ok=True)
    hf_dir, mtp_dir = out / "hf", out / "hf-mtp"
    cfg = Qwen3_5TextConfig(**CONFIG)
    model = Qwen3_5ForCausalLM(cfg).float().eval()
    randomize(model, a.seed)
    model.save_pretrained(hf_dir, safe_serialization=True)
    build_tokenizer(hf_dir)
    add_mtp(hf_dir, mtp_dir, a.seed)

    # Deterministic: a second evaluation gives bitwise the same logits.
    probe = torch.arange(30) % TOKENIZER_SIZE
    with torch.no_grad():
        l1 = model(probe[None]).logits
        l2 = model(probe[None]).logits
    if not torch.equal(l1, l2):
        raise SystemExit("transformers logits are not deterministic")

    cases = make_cases({"f32": model, "f16": f16_twin(model)}, a.seed)
    saved = json.loads((hf_dir / "config.json").read_text())
    ref = {"vocab_size": CONFIG["vocab_size"], "config": saved, "cases": cases}
    (out / "reference.json").write_text(json.dumps(ref, separators=(",", ":")))

    me = Path(__file__).resolve()
    common = ["--cache", str(cache)]
    jobs = [("qwen35-f32.gguf", hf_dir, "f32", ["--no-mtp"], 0),
            ("qwen35-f16.gguf", hf_dir, "f16", ["--no-mtp"], 0),
            ("qwen35-mtp-f32.gguf", mtp_dir, "f32", [], 1)]
    hf_sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    for fname, src, ty, extra, n_mtp in jobs:
        run = subprocess.run(
            [sys.executable, str(me), str(out), *common, "--convert", str(src),
             "--outfile", str(out / fname), "--outtype", ty, *extra],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        if run.returncode != 0:
            raise SystemExit(f"converting {src.name} to {fname} failed:\n{run.stdout[-6000:]}")
        meta = verify_gguf(out / fname, CONFIG, hf_sd, n_mtp)
        print(f"{fname}: ok ({(out / fname).stat().st_size} bytes)")
        if fname == "qwen35-mtp-f32.gguf" or fname == "qwen35-f32.gguf":
            for k in sorted(meta):
                if k.startswith(("general.architecture", "qwen35.", "tokenizer.ggml.")):
                    print(f"  {k} = {meta[k]}")
    for c in cases:
        for k in ("f32", "f16"):
            print(f"prompt len {len(c['prompt'])} {k}: greedy {c[k]['greedy']} "
                  f"(min top-2 gap {c[k]['min_greedy_gap']:.3f})")
    print(f"hf config: {json.dumps({k: saved[k] for k in sorted(saved) if k not in ('dtype', 'transformers_version')})}")


if __name__ == "__main__":
    main()
