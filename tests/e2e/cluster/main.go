// Command e2e-cluster runs a real Kubernetes 1.34 control plane (embedded etcd,
// kube-apiserver, kube-scheduler, kube-controller-manager) in one process and a
// kubelet stand-in that drives DRA kubelet plugins, for the eks-dra e2e tests.
package main

import (
	"flag"
	"fmt"
	"os"

	"k8s.io/klog/v2"
)

const usage = `usage: e2e-cluster <command> [flags]

commands:
  up       --dir DIR [--etcd-dir DIR2] [--port N] [--v N]
           run etcd + kube-apiserver + kube-scheduler + kube-controller-manager on 127.0.0.1;
           writes DIR/admin.kubeconfig, then DIR/ready; stops on SIGTERM/SIGINT
  kubelet  --kubeconfig K --node NAME --registry-dir D --plugins-dir P [--report FILE]
           [--state-dir S] [--ready-file F] [--v N]
           kubelet stand-in for one simulated node (DRA plugin registration, prepare/unprepare)
  token    --kubeconfig K --namespace NS --serviceaccount SA --node NODE --out FILE
           write a kubeconfig holding a token of SA bound to a placeholder pod on NODE
`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	cmd, args := os.Args[1], os.Args[2:]
	var err error
	switch cmd {
	case "up":
		err = runUp(args)
	case "kubelet":
		err = runKubelet(args)
	case "token":
		err = runToken(args)
	case "example-plugin":
		err = runExamplePlugin(args)
	case "-h", "--help", "help":
		fmt.Print(usage)
		return
	default:
		fmt.Fprintf(os.Stderr, "unknown command %q\n\n%s", cmd, usage)
		os.Exit(2)
	}
	klog.Flush()
	if err != nil {
		fmt.Fprintf(os.Stderr, "e2e-cluster %s: %v\n", cmd, err)
		os.Exit(1)
	}
}

// initKlog routes klog to stderr at the given verbosity.
func initKlog(v int) {
	fs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(fs)
	_ = fs.Set("v", fmt.Sprint(v))
	_ = fs.Set("logtostderr", "true")
}
