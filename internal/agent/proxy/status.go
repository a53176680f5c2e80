package proxy

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// syncIngress makes svc's status.loadBalancer.ingress list ips, patching
// the status subresource only when it differs.
func (p *Proxy) syncIngress(ctx context.Context, svc *corev1.Service, ips []netip.Addr) error {
	if sameIngress(svc.Status.LoadBalancer.Ingress, ips) {
		return nil
	}
	ingress := make([]corev1.LoadBalancerIngress, 0, len(ips))
	for _, ip := range ips {
		// VIP: traffic reaches the node addressed to the ingress IP, which
		// is where the socket listens.
		mode := corev1.LoadBalancerIPModeVIP
		ingress = append(ingress, corev1.LoadBalancerIngress{IP: ip.String(), IPMode: &mode})
	}
	// A merge patch replaces the whole list; null removes it.
	patch := map[string]any{"status": map[string]any{"loadBalancer": map[string]any{"ingress": ingress}}}
	if len(ingress) == 0 {
		patch = map[string]any{"status": map[string]any{"loadBalancer": map[string]any{"ingress": nil}}}
	}
	body, err := json.Marshal(patch)
	if err != nil {
		return err
	}
	_, err = p.cfg.Client.CoreV1().Services(svc.Namespace).Patch(ctx, svc.Name, types.MergePatchType, body, metav1.PatchOptions{}, "status")
	if err != nil {
		return fmt.Errorf("patch load balancer status: %w", err)
	}
	p.log.Info("service proxy: load balancer ingress", "service", svc.Namespace+"/"+svc.Name, "ips", ips)
	return nil
}

// sameIngress compares only the IPs: the apiserver may default ipMode, and
// hostnames are never ours.
func sameIngress(have []corev1.LoadBalancerIngress, want []netip.Addr) bool {
	if len(have) != len(want) {
		return false
	}
	got := make([]netip.Addr, 0, len(have))
	for _, in := range have {
		ip, err := netip.ParseAddr(in.IP)
		if err != nil || in.Hostname != "" {
			return false
		}
		got = append(got, ip.Unmap())
	}
	slices.SortFunc(got, func(a, b netip.Addr) int { return a.Compare(b) })
	return slices.Equal(got, want)
}
