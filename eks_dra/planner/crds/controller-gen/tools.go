//go:build tools

// Package tools records the generator and the API packages it reads, so `go mod tidy` keeps them in go.mod.
package tools

import (
	_ "sigs.k8s.io/controller-tools/cmd/controller-gen"
	_ "volcano.sh/apis/pkg/apis/batch/v1alpha1"
)
