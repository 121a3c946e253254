"""Regenerate the committed gRPC stubs from the .proto files in this folder (`make protos`).

`python -m eks_dra.drivers.framework.proto.generate [--check]`: --check regenerates into a temporary folder and
exits 1 naming every stub that differs from the committed one (a test runs it, so stubs cannot drift).
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROTOS = ("dra_v1.proto", "dra_v1beta1.proto", "pluginregistration.proto", "dra_health_v1alpha1.proto")


def generate(out_dir: Path) -> list[Path]:
    """Run protoc (grpcio-tools) for every .proto and return the stub files it wrote."""
    from grpc_tools import protoc  # dev dependency only: the driver image never regenerates

    include = Path(protoc.__file__).resolve().parent / "_proto"
    for proto in PROTOS:
        rc = protoc.main(["protoc", f"-I{HERE}", f"-I{include}", f"--python_out={out_dir}",
                          f"--grpc_python_out={out_dir}", str(HERE / proto)])
        if rc != 0:
            raise SystemExit(f"protoc failed on {proto} (exit {rc})")
    written = []
    for proto in PROTOS:
        stem = proto.removesuffix(".proto")
        for path in (out_dir / f"{stem}_pb2.py", out_dir / f"{stem}_pb2_grpc.py"):
            # protoc writes `import x_pb2 as x__pb2`, which only works from the stub's own folder.
            text = re.sub(r"^import (\w+_pb2) as (\w+)$", r"from . import \1 as \2", path.read_text(), flags=re.M)
            path.write_text(text)
            written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the committed stubs, write nothing")
    args = parser.parse_args(argv)
    if not args.check:
        for path in generate(HERE):
            print(f"wrote {path.relative_to(HERE.parent.parent.parent)}")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        drifted = [p.name for p in generate(Path(tmp)) if not (HERE / p.name).is_file()
                   or (HERE / p.name).read_text() != p.read_text()]
    if drifted:
        print("stubs differ from the .proto files: " + ", ".join(drifted) + "; run `make protos`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
