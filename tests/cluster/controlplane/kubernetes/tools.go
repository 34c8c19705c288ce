//go:build tools

// The commands scripts/build_controlplane.sh builds; imported here so that go.mod and go.sum
// hold exactly what they need. etcd: the version k8s.io/kubernetes pins.
package tools

import (
	_ "go.etcd.io/etcd/server/v3"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
