"""`python -m eks_dra.stacks.synth_summary ENV [CDK_OUT] [DIST]`: the one line `make synth` prints about what it wrote.

Reads only the written files (JSON and file names), so it costs no CDK or cdk8s import.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

from eks_dra.stacks.manifests import MANIFEST_SUFFIX, SAMPLES_DIR


def summary(env: str, cdk_out: Path = Path("cdk.out"), dist: Path = Path("dist")) -> str:
    parts = []
    for template_path in sorted(cdk_out.glob("*.template.json")):
        template = json.loads(template_path.read_text())
        kinds = Counter(r["Type"] for r in template.get("Resources", {}).values())
        parts.append(f"{template_path} ({sum(kinds.values())} resources, {kinds['AWS::EKS::Nodegroup']} node groups, "
                     f"{len(template.get('Outputs', {}))} outputs)")
    out = dist / env
    manifests = sorted(out.glob(f"*{MANIFEST_SUFFIX}"))
    samples = sorted((out / SAMPLES_DIR).glob(f"*{MANIFEST_SUFFIX}"))
    parts.append(f"{out}/ ({len(manifests)} manifests for kubectl apply -f {out}/"
                 + (f", samples in {out / SAMPLES_DIR}/" if samples else ", no samples") + ")")
    return f"eks-dra: synthesized {env}: " + "; ".join(parts)


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    print(summary(args[0], *(Path(a) for a in args[1:3])))


if __name__ == "__main__":
    main()
