// Package cluster owns the lifecycle of one klimax kind cluster: name
// validation, the generated artifacts (kind config, containerd hosts.toml per
// registry mirror, MetalLB pool objects, CoreDNS forward blocks), and the
// create/delete/list/label flows that run kind through the guest runner and
// configure the cluster with client-go.
//
// State: klimax keeps no local database. The cluster list and each cluster's
// slot come from the Docker engine (kind's node containers, labelled
// io.x-k8s.kind.cluster, and the host port their API server is published on:
// slot = port-7000); labels, fleet membership and topology are Kubernetes node
// labels on the control-plane node, read with client-go.
package cluster
