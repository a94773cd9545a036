#!/usr/bin/env bash
# The SASS of a kernel, counted without a GPU: for each loop (a backward
# branch) of one kernel entry, its instruction count and mix, then the
# entry's registers. Reads the CUBINs of a kernel cache, which `quire
# kernels` fills here (NVRTC only):
#
#   ./target/release/quire kernels --arch sm_90 --dir .devbin/kc
#   scripts/sass-loops.sh .devbin/kc matmul mv_exact32_r1
#
# (QUIRE_CUDA_DEFINES=... when filling the cache adds a variant's CUBINs;
# with several CUBINs of one file in the cache, name one: CUBIN=path.)
# cuobjdump and nvdisasm come from PyPI (nvidia-cuda-cuobjdump,
# nvidia-cuda-nvdisasm), installed into the
# project's .venv on first use. Used to count instructions per block
# before a device call (docs/PERF.md, 2026-11-27).
set -euo pipefail
[ $# -eq 3 ] || { echo "usage: $0 KERNEL_CACHE_DIR FILE_STEM ENTRY" >&2; exit 2; }
dir=$1 stem=$2 entry=$3
root=$(cd "$(dirname "$0")/.." && pwd)
venv="${QUIRE_VENV:-$root/.venv}"
py="$venv/bin/python"
[ -x "$py" ] || py=$(bash "$root/scripts/setup-test-env.sh" | tail -1)
bin() { compgen -G "$venv/lib/python*/site-packages/nvidia/cu13/bin/$1" | head -1 || true; }
if [ -z "$(bin cuobjdump)" ] || [ -z "$(bin nvdisasm)" ]; then
  "$py" -m pip install -q --no-deps nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm >&2
fi
tool=$(bin cuobjdump)
# cuobjdump runs nvdisasm for the SASS.
export PATH="$(dirname "$(bin nvdisasm)"):$PATH"
cubin="${CUBIN:-}"
if [ -z "$cubin" ]; then
  mapfile -t found < <(compgen -G "$dir/$stem.sm_*.cubin" || true)
  [ ${#found[@]} -eq 1 ] || { echo "$dir holds ${#found[@]} CUBINs of $stem; name one with CUBIN=" >&2; printf '  %s\n' "${found[@]}" >&2; exit 1; }
  cubin=${found[0]}
fi
"$tool" -sass -fun "$entry" "$cubin" | "$py" -c '
import re, sys
ins = []
for line in sys.stdin:
    m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
    if m:
        ins.append((int(m.group(1), 16), m.group(2).strip()))
if not ins:
    sys.exit("no SASS for that entry (is the name right?)")
print(f"{len(ins)} instructions in all")
for a, t in ins:
    m = re.search(r"BRA (?:\S+ )?0x([0-9a-f]+)", t)
    if m and int(m.group(1), 16) < a:
        lo = int(m.group(1), 16)
        ops = {}
        for b, x in ins:
            if lo <= b <= a:
                op = re.sub(r"^@!?U?P\w+\s+", "", x).split()[0].split(".")[0]
                ops[op] = ops.get(op, 0) + 1
        mix = ", ".join(f"{k} {v}" for k, v in sorted(ops.items(), key=lambda z: -z[1])[:12])
        print(f"loop {lo:#x}-{a:#x}: {sum(ops.values())} instructions: {mix}")
'
"$tool" -res-usage "$cubin" | grep -A1 "Function $entry:" | tail -1 | sed 's/^ */registers etc.: /'
