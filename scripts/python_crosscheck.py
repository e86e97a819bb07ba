"""Device-side cross-check (the GPU machine has Python with safetensors and torch; kimirt never needs them):
every file kimirt's writer produced (make-tiny checkpoints, --dump-logits output) must load with the
official safetensors package, with the tensor counts and bytes kimirt inspect reported here.

usage: python3 scripts/python_crosscheck.py gpu-data   (expects gpu-data/expected.json)
"""
import json
import pathlib
import sys

from safetensors import safe_open


def main(root: pathlib.Path) -> int:
    expected = json.loads((root / "expected.json").read_text())
    failures = 0
    for name, want in expected.items():
        path = root / name
        files = [path] if path.is_file() else sorted(path.glob("*.safetensors"))
        tensors = 0
        nbytes = 0
        for f in files:
            with safe_open(str(f), framework="pt") as st:
                for key in st.keys():
                    t = st.get_tensor(key)
                    tensors += 1
                    nbytes += t.numel() * t.element_size()
        ok = tensors == want["tensors"] and nbytes == want["bytes"]
        failures += 0 if ok else 1
        print(f"{'ok  ' if ok else 'FAIL'} {name}: {tensors} tensors, {nbytes} bytes "
              f"(kimirt: {want['tensors']}, {want['bytes']}) in {len(files)} file(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(pathlib.Path(sys.argv[1])))
