// Command pause is the pod sandbox's process (registry.k8s.io/pause): it holds the pod's namespaces,
// reaps the children it inherits as PID 1 when the pod shares one PID namespace, and exits on SIGINT
// or SIGTERM. Why our own: no registry can be pulled on the machines that build the kind node image,
// and the upstream pause is C; this is the same behaviour in a static Go binary.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "-v" {
		os.Stdout.WriteString("pause.go (txnkeeper e2e)\n")
		return
	}
	signals := make(chan os.Signal, 16)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for sig := range signals {
		if sig == syscall.SIGCHLD {
			for {
				var status syscall.WaitStatus
				pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
				if pid <= 0 || err != nil {
					break
				}
			}
			continue
		}
		os.Exit(0)
	}
}
