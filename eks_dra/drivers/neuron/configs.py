"""The Neuron driver's opaque config, the upstream Neuron driver's: neuron.aws.com/v1 NeuronConfig
{logicalNeuronCore: 1|2}."""

from __future__ import annotations

from eks_dra.devices import names

from ..framework.configs import ConfigError, ConfigSchema, DeviceSettings, check_fields

LOGICAL_NEURON_CORE = "logicalNeuronCore"  # the DeviceSettings key (and the checkpoint's)


def _neuron_config(params: dict, where: str) -> DeviceSettings:
    check_fields(params, where, {"apiVersion": str, "kind": str, "logicalNeuronCore": int})
    lnc = params.get("logicalNeuronCore")
    if lnc is not None and lnc not in (1, 2):
        raise ConfigError(f"{where}.logicalNeuronCore: {lnc} is not 1 or 2")
    return DeviceSettings.of(**{LOGICAL_NEURON_CORE: lnc})


NEURON_CONFIG_SCHEMAS = {
    names.NEURON_CONFIG_KIND: ConfigSchema(names.NEURON_CONFIG_API_VERSION, _neuron_config, None),
}
