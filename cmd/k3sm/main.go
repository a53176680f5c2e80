package main

import (
	_ "github.com/k3s-io/kine/pkg/endpoint"
	_ "github.com/virtual-kubelet/virtual-kubelet/node"
	_ "k8s.io/kubectl/pkg/cmd"
	_ "k8s.io/kubernetes/cmd/kube-apiserver/app"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	_ "k8s.io/kubernetes/cmd/kube-scheduler/app"
)

func main() {}
