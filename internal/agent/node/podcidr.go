package node

import (
	"context"
	"log/slog"
	"time"

	runtimev1 "github.com/k3sm-dev/k3sm/api/runtime/v1"
	"github.com/k3sm-dev/k3sm/internal/backoff"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
)

// syncPodCIDR hands the runtime this node's pod range once the
// controller-manager's node-ipam controller assigned it (Node.spec.podCIDR,
// set once and never changed), as the kubelet does with CRI's
// UpdateRuntimeConfig; pods wait for their network until then. It retries
// until the runtime took it.
func syncPodCIDR(ctx context.Context, nodes typedcorev1.NodeInterface, name string, rt runtimev1.RuntimeClient, log *slog.Logger) bool {
	delay := backoff.Backoff{Initial: 100 * time.Millisecond, Max: 2 * time.Second}
	warned := time.Now()
	for {
		n, err := nodes.Get(ctx, name, metav1.GetOptions{})
		if err == nil && n.Spec.PodCIDR != "" {
			cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			_, err = rt.UpdateRuntimeConfig(cctx, &runtimev1.UpdateRuntimeConfigRequest{PodCidr: n.Spec.PodCIDR})
			cancel()
			if err == nil {
				log.Info("pod network range", "podCIDR", n.Spec.PodCIDR)
				return true
			}
		}
		if time.Since(warned) > 30*time.Second {
			warned = time.Now()
			if err == nil {
				log.Warn("node has no spec.podCIDR yet: pods wait for their network (is kube-controller-manager running with --allocate-node-cidrs?)")
			} else {
				log.Warn("pod network range not configured yet; retrying", "err", err)
			}
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(delay.Next()):
		}
	}
}
