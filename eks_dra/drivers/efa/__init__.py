"""The EFA family's node-side library: discovery of EFA interfaces and their port health."""
