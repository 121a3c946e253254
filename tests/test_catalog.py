"""The catalog's EC2-level fields against moto's copy of EC2 DescribeInstanceTypes, and `eks-dra catalog`."""

from __future__ import annotations

import copy

import boto3
import pytest
from moto import mock_aws

from eks_dra.catalog import INSTANCE_TYPES
from eks_dra.catalog.refresh import (
    EC2_FIELDS,
    catalog_fields,
    compare,
    describe_fields,
    describe_instance_types,
    refresh_patch,
    refreshed_module,
)
from eks_dra.constructs.efa_launch_template import efa_interface_layout

# Where the catalog deliberately differs from moto's data, and why. Each entry must still be a difference
# (test_known_disagreements_are_still_real), so this list cannot silently go stale.
KNOWN_DISAGREEMENTS = {
    ("trn2.48xlarge", "accelerator_memory_mib"):
        "moto reports 524288 MiB per Trainium2 device (the 512 GiB of the whole trn2.3xlarge/48xlarge device row); "
        "AWS documents 96 GiB HBM per Trainium2 chip (16 chips, 1.5 TiB per trn2.48xlarge)",
    ("trn2.3xlarge", "accelerator_memory_mib"): "same Trainium2 device memory as trn2.48xlarge",
}
# Catalog types moto's data does not have (compared with nothing, listed here with the reason).
ABSENT_FROM_MOTO = {
    "p6e-gb200.36xlarge": "not in moto's instance-type data; fields from the EKS UltraServer guide (UNVERIFIED)",
}


@pytest.fixture(scope="module")
def moto_instance_types():
    with mock_aws():
        ec2 = boto3.client("ec2", region_name="us-east-2", aws_access_key_id="x", aws_secret_access_key="x")
        yield describe_instance_types(ec2, sorted(INSTANCE_TYPES))


def test_catalog_matches_moto_except_the_listed_disagreements(moto_instance_types):
    differences, missing = compare(moto_instance_types)
    unexpected = [str(d) for d in differences if (d.instance_type, d.field) not in KNOWN_DISAGREEMENTS]
    assert not unexpected, "\n".join(unexpected)
    assert sorted(missing) == sorted(ABSENT_FROM_MOTO)


def test_every_catalog_type_but_the_absent_ones_was_compared(moto_instance_types):
    compared = set(moto_instance_types) & set(INSTANCE_TYPES)
    assert compared == set(INSTANCE_TYPES) - set(ABSENT_FROM_MOTO)
    assert len(compared) >= 40


def test_known_disagreements_are_still_real(moto_instance_types):
    for (name, field), _reason in KNOWN_DISAGREEMENTS.items():
        assert catalog_fields(INSTANCE_TYPES[name])[field] != describe_fields(moto_instance_types[name])[field]


@pytest.mark.parametrize("name", sorted(n for n, t in INSTANCE_TYPES.items()
                                         if t.max_efa_interfaces and n not in ABSENT_FROM_MOTO))
def test_efa_only_interfaces_go_on_cards_that_support_them(moto_instance_types, name):
    cards = {c["NetworkCardIndex"]: c for c in moto_instance_types[name]["NetworkInfo"].get("NetworkCards", [])}
    for slot in efa_interface_layout(name):
        card = cards[slot.network_card]
        assert slot.interface_type in card.get("InterfaceTypes", ["interface"]), (name, slot)
        assert slot.device_index < card["MaximumNetworkInterfaces"]


def test_compare_reports_every_field_and_missing_types(moto_instance_types):
    live = copy.deepcopy({k: moto_instance_types[k] for k in ("p5.48xlarge", "g6e.48xlarge")})
    live["p5.48xlarge"]["VCpuInfo"]["DefaultVCpus"] = 96
    live["g6e.48xlarge"]["NetworkInfo"]["EfaInfo"]["MaximumEfaInterfaces"] = 2
    types = {k: INSTANCE_TYPES[k] for k in ("p5.48xlarge", "g6e.48xlarge", "inf2.xlarge")}
    differences, missing = compare(live, types)
    assert [str(d) for d in differences] == ["g6e.48xlarge: max_efa_interfaces: catalog 4, EC2 2",
                                             "p5.48xlarge: vcpus: catalog 192, EC2 96"]
    assert missing == ["inf2.xlarge"]
    assert set(EC2_FIELDS) == set(catalog_fields(INSTANCE_TYPES["p5.48xlarge"]))


def test_refresh_patch_rewrites_only_the_drifted_row(moto_instance_types):
    live = copy.deepcopy({k: moto_instance_types[k] for k in ("p5.48xlarge", "g6.xlarge")})
    live["p5.48xlarge"]["MemoryInfo"]["SizeInMiB"] = 1048576
    patch = refresh_patch(live)
    changed = [line for line in patch.splitlines() if line[:1] in "+-" and not line.startswith(("+++", "---"))]
    assert changed == ['-    ("p5.48xlarge", "x86_64", 192, 2097152, "H100", 8, True, 32, 32, 64),',
                       '+    ("p5.48xlarge", "x86_64", 192, 1048576, "H100", 8, True, 32, 32, 64),']
    assert patch.startswith("--- a/eks_dra/catalog/instances.py")
    assert refresh_patch({k: moto_instance_types[k] for k in ("g6.xlarge",)}) == ""


def test_refreshed_module_is_the_identity_on_moto_data(moto_instance_types):
    from eks_dra.catalog.refresh import DATA_MODULE

    source = DATA_MODULE.read_text()
    agreeing = {k: v for k, v in moto_instance_types.items()
                if not any(name == k for name, _ in KNOWN_DISAGREEMENTS)}
    assert refreshed_module(agreeing, source) == source


def test_cli_show_and_check(capsys, monkeypatch):
    from eks_dra.cli import main

    assert main(["catalog", "show", "p5.48xlarge", "trn2.48xlarge"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[0] == "TYPE" and out[1].startswith("p5.48xlarge") and "8x H100 80 GiB" in out[1]
    assert main(["catalog", "show", "p5.48xlarg"]) == 2
    assert "closest: p5.48xlarge" in capsys.readouterr().err
    for key, value in {"AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "x", "AWS_DEFAULT_REGION": "us-east-2"}.items():
        monkeypatch.setenv(key, value)
    with mock_aws():
        assert main(["catalog", "check"]) == 1  # the Trainium2 memory disagreement is drift to EC2's eyes
    out = capsys.readouterr().out
    assert "trn2.48xlarge: accelerator_memory_mib: catalog 98304, EC2 524288" in out
    assert "p6e-gb200.36xlarge: not returned by DescribeInstanceTypes" in out
