"""The README's promises that code can check: the construct example synthesizes, the cost table is the one the
node groups give, the design document ships in the repository."""

from __future__ import annotations

import re
from pathlib import Path

from eks_dra.config import load_environment
from eks_dra.stacks.costs import cost_table

REPO = Path(__file__).resolve().parent.parent
README = (REPO / "README.md").read_text()


def test_construct_example_is_twenty_lines_and_synthesizes():
    code = re.search(r"<!-- construct-example -->\n```python\n(.*?)```", README, re.S).group(1)
    assert len(code.strip().splitlines()) <= 20
    namespace: dict = {}
    exec(compile(code, "README.md", "exec"), namespace)  # noqa: S102 - the README's own example
    template = namespace["app"].synth().get_stack_by_name("GpuCluster").template
    groups = {ng["Properties"]["AmiType"] for ng in template["Resources"].values() if ng["Type"] == "AWS::EKS::Nodegroup"}
    assert groups == {"AL2023_x86_64_STANDARD", "AL2023_x86_64_NVIDIA"}  # from the catalog, not the caller
    cluster = next(r for r in template["Resources"].values() if r["Type"] == "AWS::EKS::Cluster")["Properties"]
    assert cluster["ResourcesVpcConfig"]["PublicAccessCidrs"] == ["203.0.113.0/24"]


def test_cost_table_is_computed_from_the_dev_node_groups():
    assert cost_table(load_environment("dev", REPO / "config")) in README


def test_design_document_ships_in_the_repository():
    assert "](docs/DESIGN.md)" in README and (REPO / "docs" / "DESIGN.md").is_file()
    assert "../shared" not in README
