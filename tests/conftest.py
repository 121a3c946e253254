import os
import pathlib

REPO = pathlib.Path(__file__).resolve().parent.parent

# jsii (used by the CDK and cdk8s tests) must run on the pinned, supported Node.js.
_node_bin = REPO / "node_modules" / ".bin"
if _node_bin.is_dir() and str(_node_bin) not in os.environ.get("PATH", ""):
    os.environ["PATH"] = f"{_node_bin}{os.pathsep}{os.environ.get('PATH', '')}"
