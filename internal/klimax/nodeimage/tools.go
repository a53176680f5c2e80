//go:build tools

// Package nodeimage pins, in go.mod, the modules the klimax node image
// builds from this module (`klimax node-image build`): the Kubernetes
// commands below are built with `go build k8s.io/kubernetes/cmd/<name>` and
// need a few modules bin/k3sm does not link. The tools tag keeps this file out
// of every real build.
package nodeimage

import (
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kubeadm"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
