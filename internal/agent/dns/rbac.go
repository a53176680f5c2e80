package dns

import (
	"context"

	"github.com/k3sm-dev/k3sm/internal/agent/agentrbac"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/client-go/kubernetes"
)

// RoleName names the ClusterRole of the resolver and the ClusterRoleBinding
// that grants it.
const RoleName = "k3sm:node-dns"

// Rules are what the resolver reads: Services and EndpointSlices, listed
// and watched (no get: informers never need it). Pods and Namespaces are
// not read.
func Rules() []rbacv1.PolicyRule {
	return []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"services"}, Verbs: []string{"list", "watch"}},
		{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"list", "watch"}},
	}
}

// EnsureRBAC creates or updates the ClusterRole RoleName to Rules and binds
// it to user in the ClusterRoleBinding RoleName that every node shares (see
// package agentrbac).
func EnsureRBAC(ctx context.Context, c kubernetes.Interface, user string) error {
	return agentrbac.Ensure(ctx, c, RoleName, Rules(), user)
}
