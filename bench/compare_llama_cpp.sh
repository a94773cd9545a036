#!/usr/bin/env bash
# Side-by-side prefill/decode speed of Quire and llama.cpp on the same GGUF,
# same threads, same prompt sizes; prints both and the ratios.
#
# usage: bench/compare_llama_cpp.sh [MODEL.gguf] [THREADS] [PP] [TG] [REPS]
# llama.cpp comes from PyPI `llama-cpp-python`, built into bench/.venv-llama
# with a portable AVX2 configuration (a native build can die with an
# illegal instruction on machines whose CPU flags differ from the builder's).
set -euo pipefail
cd "$(dirname "$0")/.."
model="${1:-}"
threads="${2:-2}"
pp="${3:-512}"
tg="${4:-128}"
reps="${5:-3}"
venv="${LLAMA_VENV:-bench/.venv-llama}"
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import llama_cpp" 2>/dev/null; then
  python3 -m venv "$venv"
  echo "building llama-cpp-python (several minutes)..." >&2
  CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF" \
    "$venv/bin/pip" install -q llama-cpp-python >&2
fi
cargo build --release -q --bin quire
if [ -z "$model" ]; then
  # Resolves (and if needed fetches) the default model.
  ./target/release/quire tokenize x >/dev/null
  model="${QUIRE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/quire}/models/SmolLM2-135M-Instruct.Q4_1.gguf"
fi
q=$(./target/release/quire bench --model "$model" --threads "$threads" -p "$pp" -g "$tg" -r "$reps" --json)
l=$("$venv/bin/python" bench/llama_cpp_bench.py "$model" "$threads" "$pp" "$tg" "$reps")
python3 - "$q" "$l" "$model" <<'PY'
import json, sys, datetime, subprocess
q, l, model = json.loads(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3]
commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
print(f"model {model.split('/')[-1]}, threads {q['threads']}, commit {commit}, {datetime.date.today()}, llama-cpp-python {l.get('version')}")
print("| test | quire t/s | llama.cpp t/s | ratio |")
print("|---|---|---|---|")
for k, v in q["results"].items():
    lv = l["results"].get(k)
    if lv:
        print(f"| {k} | {v['tps']:.1f} ± {v['std']:.1f} | {lv['tps']:.1f} ± {lv['std']:.1f} | {v['tps']/lv['tps']:.2f}x |")
PY
