// Command etcd is the upstream etcd server (go.etcd.io/etcd/server/v3), built from the Go module proxy
// for the kind node image: kubeadm runs it as the control plane's static pod and needs etcd >= 3.6.
// Why a wrapper: etcd's own main module (go.etcd.io/etcd/v3) is not served by the proxy, but its server
// module is, and its etcdmain package is the whole command.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
