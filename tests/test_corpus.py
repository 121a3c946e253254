"""The YAML of the EKS user guide and the vendors' docs (tests/corpus, verbatim, each file naming its source)
plans on the dev environment with `eks-dra plan -c env=dev --claims FILE` and nothing else, with the same
answers when a family switches to the vendor's driver (`drivers.<family>: upstream`).

Where a document cannot run as written, the expected reason says why; each was checked against the claim's
semantics (not against our output): Pods of the guide that tolerate no accelerator taint, an `All` request of
33 devices (limit 32), MIG layouts that need mixed profiles, MPS (refused by our driver until implemented),
an A100-only selector, and `allocationMode: all` (not a valid value).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from eks_dra import cli
from eks_dra.devices import DEFAULT_DRIVER_NAMES, FAMILIES

REPO = Path(__file__).resolve().parents[1]
CORPUS = Path(__file__).parent / "corpus"
TAINT = "is not tolerated"
MPS = "prepare would fail: gpu.nvidia.com: spec.spec.devices.config[{}].opaque.parameters.sharing.strategy: MPS " \
      "is not supported by this driver yet"

# file -> {claim name: None (allocated) or a substring of the reason it is not}
EXPECTED: dict[str, dict[str, str | None]] = {
    "eks-nvidia-single-gpu.yaml": {"gpu-workload-gpu": None},
    "eks-efa-single-efa.yaml": {"single-efa-claim": None},
    "eks-efa-aligned-efa-nvidia.yaml": {"aligned-efa-nvidia": None},
    "eks-efa-aligned-efa-neuron.yaml": {"aligned-efa-neuron": None},
    "eks-efa-aligned-all-efa-one-nvidia.yaml": {
        "aligned-all-efa-one-nvidia": "number of requested devices 33 exceeds the claim limit of 32"},
    "eks-efa-shared-efa.yaml": {"shared-efa": TAINT},
    "eks-mig-profile-any.yaml": {"mig-dra-pod-mig": None},
    "eks-mig-profile-1g.5gb.yaml": {"mig-profile-pod-mig": None},
    "eks-mig-multi-mig.yaml": {"multi-mig-pod-mig": "none of them the request's selectors"},
    "eks-neuron-all-neurons.yaml": {"all-neurons": None},
    "eks-neuron-1x4-connected-neurons.yaml": {"1x4-connected-neurons": None},
    "eks-neuron-all-neurons-lnc-1.yaml": {"all-neurons-lnc-1": None},
    "eks-time-slicing-shared-gpu.yaml": {"shared-timeslice-gpu": None},
    "neuron-sdk-1x4-connected-devices.yaml": {"pod0-neurons": TAINT},
    "neuron-sdk-sized-templates.yaml": {"xl-trn2": None, "l-trn2": None, "2.27-driver-trn2": None},
    "neuron-sdk-lnc-setting-trn2.yaml": {"pod0-neurons": TAINT},
    "nvidia-demo-gpu-test1.yaml": {"pod1-gpu": None, "pod2-gpu": None},
    "nvidia-demo-gpu-test2.yaml": {"pod-shared-gpu": None},
    "nvidia-demo-gpu-test3.yaml": {"single-gpu": None},
    "nvidia-demo-gpu-test4.yaml": {f"pod-{i}-mig-devices": "none of them the request's selectors" for i in range(4)},
    "nvidia-demo-gpu-test5.yaml": {"pod0-shared-gpus": MPS.format(1)},
    "nvidia-demo-gpu-test6.yaml": {f"pod-{i}-a100": "none of them the request's selectors" for i in range(4)},
    "nvidia-demo-gpu-test-mps.yaml": {"test-pod-shared-gpu": MPS.format(0)},
}
BAD_INPUT = {
    "neuron-sdk-lnc-neurons.yaml": "spec.spec.devices.requests[0].exactly.allocationMode: 'all' must be ExactCount "
                                   "or All",
}


def test_every_corpus_file_is_listed_and_names_its_source():
    files = sorted(p.name for p in CORPUS.glob("*.yaml"))
    assert files == sorted([*EXPECTED, *BAD_INPUT])
    for name in files:
        first = (CORPUS / name).read_text().splitlines()[0]
        assert first.startswith("# Source: "), name


def _plan(capsys, path: Path, config_dir: Path) -> tuple[int, dict]:
    code = cli.main(["plan", "-c", "env=dev", "--config-dir", str(config_dir), "--claims", str(path),
                     "--output", "json"])
    captured = capsys.readouterr()
    return code, json.loads(captured.out) if code in (0, 1) else {"error": captured.err}


def _dev_with(tmp_path: Path, family: str | None) -> Path:
    data = yaml.safe_load((REPO / "config" / "dev.yaml").read_text())
    if family is not None:
        data["drivers"][family] = "upstream"
    out = tmp_path / "config"
    out.mkdir(parents=True, exist_ok=True)
    (out / "dev.yaml").write_text(yaml.safe_dump(data))
    return out


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_corpus_plans_on_dev(capsys, name):
    code, out = _plan(capsys, CORPUS / name, REPO / "config")
    got = {c["name"]: c for c in out["claims"]}
    assert set(got) == set(EXPECTED[name])
    for claim_name, reason in EXPECTED[name].items():
        c = got[claim_name]
        if reason is None:
            assert c["allocated"], (claim_name, c["reason"])
            assert {d["driver"] for d in c["devices"]} <= {DEFAULT_DRIVER_NAMES.for_family(f) for f in FAMILIES}
        else:
            assert not c["allocated"] and reason in (c["reason"] or ""), (claim_name, c["reason"])
    assert code == (0 if all(r is None for r in EXPECTED[name].values()) else 1)


@pytest.mark.parametrize("name", sorted(BAD_INPUT))
def test_corpus_bad_input_is_refused_with_the_field(capsys, name):
    code, out = _plan(capsys, CORPUS / name, REPO / "config")
    assert code == 2 and BAD_INPUT[name] in out["error"]


@pytest.mark.parametrize("family", FAMILIES)
def test_corpus_plans_the_same_with_the_vendor_driver(tmp_path, capsys, family):
    """drivers.<family>: upstream: same names and vocabulary, so the same claims get the same devices; only our
    drivers' config decoding (MPS refused) does not apply to the vendor's driver."""
    ours, vendor = _dev_with(tmp_path / "ours", None), _dev_with(tmp_path / "vendor", family)
    vendor_driver = DEFAULT_DRIVER_NAMES.for_family(family)  # type: ignore[arg-type]
    for name in sorted(EXPECTED):
        _, a = _plan(capsys, CORPUS / name, ours)
        _, b = _plan(capsys, CORPUS / name, vendor)
        for x, y in zip(a["claims"], b["claims"], strict=True):
            decoded_by_us = (x["reason"] or "").startswith(f"prepare would fail: {vendor_driver}:")
            if decoded_by_us:
                assert y["allocated"], (name, x["name"], y["reason"])
                continue
            assert (x["allocated"], x["devices"]) == (y["allocated"], y["devices"]), (name, x["name"])
