package proxy

import (
	"context"

	"github.com/k3sm-dev/k3sm/internal/agent/agentrbac"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/client-go/kubernetes"
)

// RoleName names both the ClusterRole of the proxy and the
// ClusterRoleBinding that grants it.
const RoleName = "k3sm:node-proxy"

// Rules are what a Proxy needs: to watch Services and EndpointSlices, to
// write the LoadBalancer ingress into Service status, and to record Events.
func Rules() []rbacv1.PolicyRule {
	return []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"services"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{""}, Resources: []string{"services/status"}, Verbs: []string{"patch", "update"}},
		{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}},
	}
}

// EnsureRBAC creates or updates the ClusterRole RoleName to Rules and binds
// it to user in the ClusterRoleBinding RoleName that every node shares (see
// package agentrbac).
func EnsureRBAC(ctx context.Context, c kubernetes.Interface, user string) error {
	return agentrbac.Ensure(ctx, c, RoleName, Rules(), user)
}
