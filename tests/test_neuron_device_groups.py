"""resource.aws.com/devicegroupN_id of our Neuron and EFA devices equal the ids computed from the public
Neuron<->EFA lookup tables (tests/data/connected-device-maps, see SOURCE there), for every device of every
EFA-enabled Trainium type, on fixture nodes (what the drivers publish) and in the planner's simulation.

The expected ids are computed here from the tables alone, with the rule DRANET and the Neuron driver use
(connected-device-maps lookup.go): group 1 is the device's EFA address; group N hashes the sorted, distinct EFA
addresses of Neuron devices floor(id/N)*N .. floor(id/N)*N+N-1 with sha256, keeping 16 hex characters.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from eks_dra.devices import simulate_node
from eks_dra.drivers.families import discover
from eks_dra.drivers.fixture import write_fixture

TABLES = Path(__file__).parent / "data" / "connected-device-maps"
EFA_ENABLED = json.loads((TABLES / "efa-enabled-instances.json").read_text())
TYPES = {"trn1.32xlarge": "trn1", "trn1n.32xlarge": "trn1n", "trn2.48xlarge": "trn2"}
NODE = "groups-node"


def expected_groups(table: dict[str, str], neuron_id: int) -> dict[str, str]:
    out = {"resource.aws.com/devicegroup1_id": table[str(neuron_id)]}
    for size in (4, 8, 16):
        start = neuron_id // size * size
        bdfs = sorted({table[str(i)] for i in range(start, start + size) if str(i) in table})
        out[f"resource.aws.com/devicegroup{size}_id"] = hashlib.sha256(",".join(bdfs).encode()).hexdigest()[:16]
    return out


def _groups(device) -> dict[str, str]:
    return {k: v for k, v in device.attributes.items() if k.startswith("resource.aws.com/devicegroup")}


@pytest.mark.parametrize("instance_type", sorted(TYPES))
def test_device_group_ids_equal_the_lookup_tables(tmp_path, instance_type):
    assert EFA_ENABLED.get(instance_type) is True
    table = json.loads((TABLES / f"{TYPES[instance_type]}.json").read_text())
    root = write_fixture(instance_type, tmp_path / "h", node_name=NODE)
    simulated = simulate_node(instance_type, NODE)
    for source, neurons, efas in (
        ("fixture", [d.device for d in discover("neuron", root, NODE).devices],
         [d.device for d in discover("efa", root, NODE).devices]),
        ("simulation", simulated["neuron"], simulated["efa"]),
    ):
        assert len(neurons) == len(table) == 16, source
        for d in neurons:
            assert _groups(d) == expected_groups(table, int(d.attributes["deviceId"])), (source, d.name)
        # Every EFA of the table carries the groups of the Neuron devices wired to it (equal for both on trn1).
        by_address = {d.attributes["pciAddress"]: d for d in efas}
        assert set(table.values()) <= set(by_address), (source, sorted(set(table.values()) - set(by_address)))
        for neuron_id, bdf in table.items():
            assert _groups(by_address[bdf]) == expected_groups(table, int(neuron_id)), (source, bdf)


def test_types_without_a_table_publish_no_groups():
    # trn2.3xlarge and trn1.2xlarge are not in efa-enabled-instances.json: DRANET publishes no group ids there.
    for instance_type in ("trn2.3xlarge", "trn1.2xlarge"):
        assert instance_type not in EFA_ENABLED
        for devices in simulate_node(instance_type, NODE).values():
            assert not any(_groups(d) for d in devices), instance_type
