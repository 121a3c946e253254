"""Test helpers of the driver tests (in-test Kubernetes API, kubelet-side client, inventories)."""
