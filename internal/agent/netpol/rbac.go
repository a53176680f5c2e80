package netpol

import (
	"context"

	"github.com/k3sm-dev/k3sm/internal/agent/agentrbac"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/client-go/kubernetes"
)

// RoleName names the ClusterRole of the controller and the
// ClusterRoleBinding that grants it.
const RoleName = "k3sm:node-netpol"

// Rules are what the controller watches. The Node authorizer lets a node
// read only its own pods; policy peers are pods anywhere.
func Rules() []rbacv1.PolicyRule {
	return []rbacv1.PolicyRule{
		{APIGroups: []string{"networking.k8s.io"}, Resources: []string{"networkpolicies"}, Verbs: []string{"list", "watch"}},
		{APIGroups: []string{""}, Resources: []string{"pods", "namespaces"}, Verbs: []string{"list", "watch"}},
	}
}

// EnsureRBAC creates or updates the ClusterRole RoleName to Rules and binds
// it to user in the ClusterRoleBinding RoleName that every node shares (see
// package agentrbac).
func EnsureRBAC(ctx context.Context, c kubernetes.Interface, user string) error {
	return agentrbac.Ensure(ctx, c, RoleName, Rules(), user)
}
