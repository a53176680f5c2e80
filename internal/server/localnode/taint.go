package localnode

import (
	"context"
	"slices"

	"github.com/k3sm-dev/k3sm/internal/agent/node"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
)

// EnsureProviderTaint adds or removes the provider taint on an existing
// Node. The node sets its taints only when it registers, and NodeRestriction
// forbids it to change them later, so a Node kept from an earlier start
// (another --node-taint, or a release that always tainted) is put right
// here. Other taints are left alone.
func EnsureProviderTaint(ctx context.Context, c kubernetes.Interface, name string, want bool) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := c.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		taints, changed := withProviderTaint(n.Spec.Taints, want)
		if !changed {
			return nil
		}
		n.Spec.Taints = taints
		_, err = c.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
		return err
	})
}

// withProviderTaint returns taints with the provider taint present or not,
// and whether that changed anything.
func withProviderTaint(taints []corev1.Taint, want bool) ([]corev1.Taint, bool) {
	i := slices.IndexFunc(taints, func(t corev1.Taint) bool { return t.Key == node.Taint.Key && t.Effect == node.Taint.Effect })
	switch {
	case want && i < 0:
		return append(slices.Clone(taints), node.Taint), true
	case want && taints[i].Value != node.Taint.Value:
		out := slices.Clone(taints)
		out[i] = node.Taint
		return out, true
	case !want && i >= 0:
		return slices.Delete(slices.Clone(taints), i, i+1), true
	}
	return taints, false
}
