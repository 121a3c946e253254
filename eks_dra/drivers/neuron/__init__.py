"""The AWS Neuron family's node-side library: discovery, ECC health, NeuronConfig and the runtime's environment."""
