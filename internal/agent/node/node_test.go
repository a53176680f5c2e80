package node

import (
	"testing"
	"time"

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

// The node's queues let an item through at once, back off its retries,
// and start over once it was handled.
func TestQueueLimiter(t *testing.T) {
	l := queueLimiter()
	if d := l.When("a"); d != 0 {
		t.Errorf("first time queued: delay %s, want none", d)
	}
	var last time.Duration
	for i := 0; i < 4; i++ {
		d := l.When("a")
		if d <= last {
			t.Errorf("retry %d: delay %s after %s, want it growing", i+1, d, last)
		}
		last = d
	}
	if last != 80*time.Millisecond {
		t.Errorf("fourth retry: delay %s, want 80ms", last)
	}
	if d := l.When("b"); d != 0 {
		t.Errorf("another item: delay %s, want none", d)
	}
	l.Forget("a")
	if d, n := l.When("a"), l.NumRequeues("a"); d != 0 || n != 1 {
		t.Errorf("after Forget: delay %s (want none), requeues %d (want 1)", d, n)
	}
}
