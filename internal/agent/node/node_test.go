package node

import (
	"testing"

	runtimev1 "github.com/k3sm-dev/k3sm/api/runtime/v1"
	"github.com/k3sm-dev/k3sm/internal/roleconfig"
)

// The node registers with the provider taint only when its config asks.
func TestNodeObjectTaint(t *testing.T) {
	info := &runtimev1.GetRuntimeInfoResponse{Os: "linux", Arch: "amd64"}
	if n := nodeObject(Config{NodeConfig: roleconfig.NodeConfig{Name: "n1"}}, info); len(n.Spec.Taints) != 0 {
		t.Errorf("untainted config: taints %v", n.Spec.Taints)
	}
	n := nodeObject(Config{NodeConfig: roleconfig.NodeConfig{Name: "n1", Taint: true}}, info)
	if len(n.Spec.Taints) != 1 || n.Spec.Taints[0] != Taint {
		t.Errorf("tainted config: taints %v", n.Spec.Taints)
	}
	if n.Labels["kubernetes.io/os"] != "linux" {
		t.Errorf("labels %v", n.Labels)
	}
}
