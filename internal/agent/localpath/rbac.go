package localpath

import (
	"context"

	"github.com/k3sm-dev/k3sm/internal/agent/agentrbac"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/client-go/kubernetes"
)

// RoleName names both the ClusterRole of the provisioner and the
// ClusterRoleBinding that grants it.
const RoleName = "k3sm:local-path-provisioner"

// Rules are what a Provisioner needs. It only creates volumes and reads
// claims: binding is the PV controller's job, so claims are never written.
// "nodes get" is granted for parity with external provisioners; the current
// code does not use it.
func Rules() []rbacv1.PolicyRule {
	return []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"persistentvolumes"}, Verbs: []string{"get", "list", "watch", "create", "delete"}},
		{APIGroups: []string{""}, Resources: []string{"persistentvolumeclaims"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{"storage.k8s.io"}, Resources: []string{"storageclasses"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}},
		{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get"}},
	}
}

// EnsureRBAC creates or updates the ClusterRole RoleName to Rules and binds
// it to user in the ClusterRoleBinding RoleName that every node shares (see
// package agentrbac).
func EnsureRBAC(ctx context.Context, c kubernetes.Interface, user string) error {
	return agentrbac.Ensure(ctx, c, RoleName, Rules(), user)
}
