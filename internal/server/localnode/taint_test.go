package localnode

import (
	"context"
	"slices"
	"testing"

	"github.com/k3sm-dev/k3sm/internal/agent/node"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

// A Node kept from an earlier start gets the provider taint added or
// removed as --node-taint now says, and keeps its other taints.
func TestEnsureProviderTaint(t *testing.T) {
	other := corev1.Taint{Key: "dedicated", Value: "gpu", Effect: corev1.TaintEffectNoSchedule}
	oldValue := corev1.Taint{Key: node.Taint.Key, Value: "old", Effect: node.Taint.Effect}
	for _, tc := range []struct {
		name       string
		have, want []corev1.Taint
		taint      bool
	}{
		{"removed", []corev1.Taint{other, node.Taint}, []corev1.Taint{other}, false},
		{"added", []corev1.Taint{other}, []corev1.Taint{other, node.Taint}, true},
		{"value corrected", []corev1.Taint{oldValue}, []corev1.Taint{node.Taint}, true},
		{"already there", []corev1.Taint{node.Taint}, []corev1.Taint{node.Taint}, true},
		{"already absent", nil, nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}, Spec: corev1.NodeSpec{Taints: tc.have}})
			if err := EnsureProviderTaint(context.Background(), c, "n1", tc.taint); err != nil {
				t.Fatal(err)
			}
			n, err := c.CoreV1().Nodes().Get(context.Background(), "n1", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(n.Spec.Taints, tc.want) {
				t.Fatalf("taints %v, want %v", n.Spec.Taints, tc.want)
			}
			updates := 0
			for _, a := range c.Actions() {
				if a.GetVerb() == "update" {
					updates++
				}
			}
			if changed := !slices.Equal(tc.have, tc.want); (updates == 1) != changed {
				t.Fatalf("%d updates for a change %v", updates, changed)
			}
		})
	}
}
