#!/usr/bin/env python3
"""Reference checks for Quire's GGUF and quant code, using the `gguf` package.

Usage:
  gguf_ref.py check-imports
      exit 0 when `gguf` and `numpy` import, else print the error, exit 3.
  gguf_ref.py dump <file.gguf> <outdir>
      read <file.gguf> with gguf.GGUFReader; for tensor i write
      <outdir>/<i>.raw (its bytes) and <outdir>/<i>.f32 (gguf.quants.dequantize
      as little-endian f32); write <outdir>/manifest.json with the version,
      tensors (name, GGML-order shape, type name, n_bytes, data_offset) and
      metadata (key -> {types, value}) for non-nested values.
  gguf_ref.py quantize <type> <in.f32> <out.bin>
      quantize little-endian f32 values with gguf.quants.quantize.
"""
import json
import os
import sys


def check_imports():
    try:
        import gguf  # noqa: F401
        import numpy  # noqa: F401
    except Exception as e:  # report any import failure as a skip reason
        print(f"{type(e).__name__}: {e}")
        sys.exit(3)


def dump(path, outdir):
    import numpy as np
    import gguf

    r = gguf.GGUFReader(path)
    tensors = []
    for i, t in enumerate(r.tensors):
        raw = np.frombuffer(np.asarray(t.data).tobytes(), dtype=np.uint8)
        with open(os.path.join(outdir, f"{i}.raw"), "wb") as f:
            f.write(raw.tobytes())
        deq = gguf.quants.dequantize(raw, t.tensor_type).astype("<f4", copy=False)
        with open(os.path.join(outdir, f"{i}.f32"), "wb") as f:
            f.write(np.ascontiguousarray(deq).tobytes())
        tensors.append({
            "name": t.name,
            "shape": [int(x) for x in t.shape],
            "type": t.tensor_type.name,
            "n_bytes": int(t.n_bytes),
            "data_offset": int(t.data_offset),
        })
    metadata = {}
    for key, field in r.fields.items():
        if key.startswith("GGUF."):
            continue
        types = [ty.name for ty in field.types]
        if types.count("ARRAY") > 1:
            continue  # nested arrays: contents() does not decode them
        metadata[key] = {"types": types, "value": field.contents()}
    version = int(r.fields["GGUF.version"].parts[-1][0])
    with open(os.path.join(outdir, "manifest.json"), "w") as f:
        json.dump({"version": version, "tensors": tensors, "metadata": metadata}, f)


def quantize(type_name, src, dst):
    import numpy as np
    import gguf

    qtype = gguf.GGMLQuantizationType[type_name]
    x = np.fromfile(src, dtype="<f4")
    q = gguf.quants.quantize(x.reshape(1, -1), qtype)
    with open(dst, "wb") as f:
        f.write(np.ascontiguousarray(q).tobytes())


def main():
    cmd = sys.argv[1] if len(sys.argv) > 1 else ""
    if cmd == "check-imports":
        check_imports()
    elif cmd == "dump" and len(sys.argv) == 4:
        dump(sys.argv[2], sys.argv[3])
    elif cmd == "quantize" and len(sys.argv) == 5:
        quantize(sys.argv[2], sys.argv[3], sys.argv[4])
    else:
        print(__doc__, file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
