// nvcdi-fixture: NVIDIA's own CDI edits (github.com/NVIDIA/nvidia-container-toolkit pkg/nvcdi) for a
// fixture driver root, with go-nvml's mock NVML (dgxa100) adapted to the fixture's GPUs.
//
// It does what the upstream DRA driver (kubernetes-sigs/dra-driver-nvidia-gpu cmd/gpu-kubelet-plugin/cdi.go)
// does per claim: nvcdi in "nvml" mode with nvsandboxutils disabled, GetCommonEdits() for the spec and
// GetDeviceSpecsByID(uuid) per full GPU; a MIG device gets its parent's device spec plus the GI and CI
// capability device nodes named by /proc/driver/nvidia/capabilities/gpuN/mig/giG[/ciC]/access.
// Host paths are rewritten from the fixture root to "/" with nvcdi's own transform/root, as the driver does.
//
// nvcdi finds device nodes only if they are character devices; fixture trees hold regular files, so the
// program mirrors the fixture's dev/ as character devices (mknod, needs CAP_MKNOD) in a temporary
// directory that serves as nvcdi's dev root, and reports paths relative to it.
//
// Input (stdin, JSON): {"driverRoot": DIR, "hookPath": "/usr/bin/nvidia-cdi-hook", "driverVersion": V,
// "gpus": [{"uuid", "minor", "pciBusID", "migs": [{"uuid", "gi", "ci"}]}], "realNvmlLibrary": PATH}.
// With realNvmlLibrary (make gpu-check on a GPU node) the real NVML from that file replaces the mock and
// the driver root's own /dev is used as is.
// Output (stdout, JSON): {"common": ContainerEdits, "devices": {uuid: ContainerEdits}}.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/NVIDIA/go-nvlib/pkg/nvlib/device"
	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"github.com/NVIDIA/nvidia-container-toolkit/pkg/nvcdi"
	"github.com/NVIDIA/nvidia-container-toolkit/pkg/nvcdi/spec"
	transformroot "github.com/NVIDIA/nvidia-container-toolkit/pkg/nvcdi/transform/root"
	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"
	"tags.cncf.io/container-device-interface/specs-go"
)

type migInput struct {
	UUID string `json:"uuid"`
	GI   int    `json:"gi"`
	CI   int    `json:"ci"`
}

type gpuInput struct {
	UUID     string     `json:"uuid"`
	Minor    int        `json:"minor"`
	PciBusID string     `json:"pciBusID"`
	Migs     []migInput `json:"migs"`
}

type input struct {
	DriverRoot    string     `json:"driverRoot"`
	HookPath      string     `json:"hookPath"`
	DriverVersion string     `json:"driverVersion"`
	GPUs          []gpuInput `json:"gpus"`
	RealNVML      string     `json:"realNvmlLibrary"`
}

type output struct {
	Common  *specs.ContainerEdits            `json:"common"`
	Devices map[string]*specs.ContainerEdits `json:"devices"`
	DevRoot string                           `json:"devRoot"` // the mirrored dev root ("" with the real NVML)
}

func main() {
	if err := run(os.Stdin, os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "nvcdi-fixture: %v\n", err)
		os.Exit(1)
	}
}

// mirrorDev creates character devices for every regular file under root/dev in a new directory.
func mirrorDev(root string) (string, error) {
	devRoot, err := os.MkdirTemp("", "nvcdi-devroot-")
	if err != nil {
		return "", err
	}
	src := filepath.Join(root, "dev")
	err = filepath.Walk(src, func(path string, info os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		target := filepath.Join(devRoot, rel)
		if info.IsDir() {
			return os.MkdirAll(target, 0o755)
		}
		if !info.Mode().IsRegular() {
			return nil
		}
		// 1:3 is /dev/null's number: a harmless node whose path is all that matters here.
		if err := unix.Mknod(target, unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err != nil {
			return fmt.Errorf("mknod %s (needs CAP_MKNOD): %w", target, err)
		}
		return nil
	})
	return devRoot, err
}

// capNode reads DeviceFileMinor from a /proc/driver/nvidia/capabilities access file.
func capNode(root, path string) (*specs.DeviceNode, error) {
	f, err := os.Open(filepath.Join(root, path))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		key, value, ok := strings.Cut(s.Text(), ":")
		if ok && strings.TrimSpace(key) == "DeviceFileMinor" {
			minor, err := strconv.Atoi(strings.TrimSpace(value))
			if err != nil {
				return nil, fmt.Errorf("%s: %w", path, err)
			}
			return &specs.DeviceNode{Path: fmt.Sprintf("/dev/nvidia-caps/nvidia-cap%d", minor)}, nil
		}
	}
	return nil, fmt.Errorf("%s: no DeviceFileMinor line", path)
}

func run(in io.Reader, out io.Writer) error {
	var req input
	if err := json.NewDecoder(in).Decode(&req); err != nil {
		return fmt.Errorf("reading the request: %w", err)
	}
	var nvmlLib nvml.Interface
	devRoot, reportedDevRoot := req.DriverRoot, ""
	if req.RealNVML != "" {
		nvmlLib = nvml.New(nvml.WithLibraryPath(req.RealNVML))
		if ret := nvmlLib.Init(); ret != nvml.SUCCESS {
			return fmt.Errorf("nvmlInit with %s: %v", req.RealNVML, ret)
		}
		defer func() { _ = nvmlLib.Shutdown() }()
	} else {
		server := dgxa100.New()
		if len(req.GPUs) > len(server.Devices) {
			return fmt.Errorf("%d GPUs requested; the mock has %d", len(req.GPUs), len(server.Devices))
		}
		server.Devices = server.Devices[:len(req.GPUs)]
		server.DriverVersion = req.DriverVersion
		for i, g := range req.GPUs {
			d := server.Devices[i].(*dgxa100.Device)
			d.UUID, d.Minor, d.PciBusID = g.UUID, g.Minor, g.PciBusID
			// Methods nvcdi calls that the dgxa100 mock leaves unset.
			d.IsMigDeviceHandleFunc = func() (bool, nvml.Return) { return false, nvml.SUCCESS }
		}
		nvmlLib = server
		mirrored, err := mirrorDev(req.DriverRoot)
		if err != nil {
			return err
		}
		defer os.RemoveAll(mirrored)
		devRoot, reportedDevRoot = mirrored, mirrored
	}

	logger := logrus.New()
	logger.SetOutput(os.Stderr)
	logger.SetLevel(logrus.WarnLevel)
	lib, err := nvcdi.New(
		nvcdi.WithDeviceLib(device.New(nvmlLib)),
		nvcdi.WithDriverRoot(req.DriverRoot),
		nvcdi.WithDevRoot(devRoot),
		nvcdi.WithLogger(logger),
		nvcdi.WithNvmlLib(nvmlLib),
		nvcdi.WithMode("nvml"),
		nvcdi.WithVendor("k8s.nvcdi-fixture"),
		nvcdi.WithClass("claim"),
		nvcdi.WithNVIDIACDIHookPath(req.HookPath),
		nvcdi.WithFeatureFlags(nvcdi.FeatureDisableNvsandboxUtils),
	)
	if err != nil {
		return fmt.Errorf("nvcdi.New: %w", err)
	}
	common, err := lib.GetCommonEdits()
	if err != nil {
		return fmt.Errorf("GetCommonEdits: %w", err)
	}
	var devices []specs.Device
	for _, g := range req.GPUs {
		specsForGPU, err := lib.GetDeviceSpecsByID(g.UUID)
		if err != nil {
			return fmt.Errorf("GetDeviceSpecsByID(%s): %w", g.UUID, err)
		}
		full := specsForGPU[0]
		full.Name = g.UUID
		devices = append(devices, full)
		for _, m := range g.Migs {
			mig := specs.Device{Name: m.UUID}
			mig.ContainerEdits = full.ContainerEdits
			mig.ContainerEdits.DeviceNodes = append([]*specs.DeviceNode(nil), full.ContainerEdits.DeviceNodes...)
			caps := fmt.Sprintf("proc/driver/nvidia/capabilities/gpu%d/mig/gi%d", g.Minor, m.GI)
			for _, p := range []string{caps + "/access", fmt.Sprintf("%s/ci%d/access", caps, m.CI)} {
				node, err := capNode(req.DriverRoot, p)
				if err != nil {
					return err
				}
				mig.ContainerEdits.DeviceNodes = append(mig.ContainerEdits.DeviceNodes, node)
			}
			devices = append(devices, mig)
		}
	}
	s, err := spec.New(spec.WithVendor("k8s.nvcdi-fixture"), spec.WithClass("claim"),
		spec.WithDeviceSpecs(devices), spec.WithEdits(*common.ContainerEdits))
	if err != nil {
		return fmt.Errorf("spec.New: %w", err)
	}
	raw := s.Raw()
	err = transformroot.New(
		transformroot.WithRoot(req.DriverRoot),
		transformroot.WithTargetRoot("/"),
		transformroot.WithRelativeTo("host"),
	).Transform(raw)
	if err != nil {
		return fmt.Errorf("transform root: %w", err)
	}
	result := output{Common: &raw.ContainerEdits, Devices: map[string]*specs.ContainerEdits{}, DevRoot: reportedDevRoot}
	for i := range raw.Devices {
		result.Devices[raw.Devices[i].Name] = &raw.Devices[i].ContainerEdits
	}
	enc := json.NewEncoder(out)
	enc.SetIndent("", " ")
	return enc.Encode(result)
}
