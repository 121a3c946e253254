"""The NVIDIA GPU family's node-side library: the driver root's files, CDI edits, NVML, MIG readiness."""
