"""Kubelet-facing gRPC stubs generated from this folder's .proto files (see generate.py)."""
