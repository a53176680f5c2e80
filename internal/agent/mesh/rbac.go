package mesh

import (
	"context"

	netv1 "github.com/k3sm-dev/k3sm/api/net/v1"
	"github.com/k3sm-dev/k3sm/internal/agent/agentrbac"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/client-go/kubernetes"
)

// RoleName names the ClusterRole of the mesh and the ClusterRoleBinding
// that grants it.
const RoleName = "k3sm:node-mesh"

// Rules are what the mesh reads and writes. RBAC cannot say "its own", so
// the rules grant every MeshPeer and the server's admission policy
// (internal/server/meshapi) refuses a node's write to another's. The Node
// authorizer already lets the node read its own Node (its pod range and
// UID).
func Rules() []rbacv1.PolicyRule {
	return []rbacv1.PolicyRule{
		{APIGroups: []string{netv1.GroupName}, Resources: []string{netv1.Resource},
			Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete"}},
		{APIGroups: []string{netv1.GroupName}, Resources: []string{netv1.Resource + "/status"}, Verbs: []string{"update", "patch"}},
	}
}

// EnsureRBAC creates or updates the ClusterRole RoleName to Rules and binds
// it to user in the ClusterRoleBinding RoleName that every node shares (see
// package agentrbac).
func EnsureRBAC(ctx context.Context, c kubernetes.Interface, user string) error {
	return agentrbac.Ensure(ctx, c, RoleName, Rules(), user)
}
