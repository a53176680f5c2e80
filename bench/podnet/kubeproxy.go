//go:build linux

package main

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	kubeproxyv1alpha1 "k8s.io/kube-proxy/config/v1alpha1"
	"k8s.io/kubernetes/cmd/kube-proxy/app"
	kubeproxyconfig "k8s.io/kubernetes/pkg/proxy/apis/config"
	"k8s.io/kubernetes/pkg/proxy/apis/config/scheme"
	"k8s.io/kubernetes/pkg/proxy/nftables"
	proxyutil "k8s.io/kubernetes/pkg/proxy/util"
	"k8s.io/utils/ptr"

	"github.com/k3sm-dev/k3sm/internal/runtime/podnet"
)

// The Service kube-proxy serves (its own fake clientset: the Service proxy
// never sees it, and kube-proxy never sees the proxy's).
const kubeProxyIP = "10.96.0.11"

// startKubeProxy runs kube-proxy in nftables mode, from k8s.io/kubernetes at
// the module's pinned version: cmd/kube-proxy/app's ProxyServer.Run with
// pkg/proxy/nftables' Proxier, as newProxyServer would assemble them, but
// over a fake clientset holding one Service (kubeProxyIP:80 → backend) and
// its EndpointSlice instead of an apiserver, and without the Node watch
// (as kube-proxy's own hollow mode runs). Its rules go into this process's
// network namespace, the host's. It cannot be stopped (ProxyServer.Run
// never returns): it ends with the process. It returns once the ClusterIP
// answers from clientNS.
func startKubeProxy(ctx context.Context, clientNS string, backend netip.AddrPort) error {
	ext := &kubeproxyv1alpha1.KubeProxyConfiguration{}
	scheme.Scheme.Default(ext)
	cfg := &kubeproxyconfig.KubeProxyConfiguration{}
	if err := scheme.Scheme.Convert(ext, cfg, nil); err != nil {
		return fmt.Errorf("kube-proxy configuration: %w", err)
	}
	cfg.Mode = kubeproxyconfig.ProxyModeNFTables
	cfg.DetectLocalMode = kubeproxyconfig.LocalModeClusterCIDR
	cfg.DetectLocal.ClusterCIDRs = []string{node.ClusterCIDR.String()}
	cfg.MetricsBindAddress = "" // no metrics server
	cfg.HealthzBindAddress = ""
	cfg.Linux.OOMScoreAdj = nil
	// One sync when the objects arrive; nothing changes after.
	cfg.SyncPeriod = metav1.Duration{Duration: time.Hour}
	cfg.MinSyncPeriod = metav1.Duration{Duration: 0}

	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "bench-kp"},
		Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeClusterIP, ClusterIP: kubeProxyIP, ClusterIPs: []string{kubeProxyIP},
			IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol},
			Ports:      []corev1.ServicePort{{Name: "tcp", Protocol: corev1.ProtocolTCP, Port: servicePort}},
		},
	}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: "default", Name: "bench-kp-1",
			Labels: map[string]string{discoveryv1.LabelServiceName: "bench-kp"},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("tcp"), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To(int32(backend.Port()))}},
		Endpoints: []discoveryv1.Endpoint{{
			Addresses:  []string{backend.Addr().String()},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)},
		}},
	}
	recorder := &events.FakeRecorder{} // no channel: events are dropped
	// kube-proxy logs at info level from its start; whether it works is
	// what the dial below checks.
	klog.SetLogger(logr.Discard())
	proxier, err := nftables.NewProxier(ctx, cfg, corev1.IPv4Protocol, proxyutil.NewDetectLocalByCIDR(node.ClusterCIDR.String()),
		"bench", net.IP(node.Gateway.AsSlice()), recorder, nil, false)
	if err != nil {
		return fmt.Errorf("kube-proxy nftables proxier: %w", err)
	}
	s := &app.ProxyServer{
		Config:          cfg,
		Client:          fake.NewClientset(svc, slice),
		Recorder:        recorder,
		NodeRef:         &corev1.ObjectReference{Kind: "Node", Name: "bench"},
		NodeName:        "bench",
		PrimaryIPFamily: corev1.IPv4Protocol,
		NodeIPs:         map[corev1.IPFamily]net.IP{corev1.IPv4Protocol: net.IP(node.Gateway.AsSlice())},
		Proxier:         proxier,
	}
	errc := make(chan error, 1)
	go func() { errc <- s.Run(ctx) }()
	addr := net.JoinHostPort(kubeProxyIP, strconv.Itoa(servicePort))
	deadline := time.Now().Add(20 * time.Second)
	for {
		select {
		case err := <-errc:
			return fmt.Errorf("kube-proxy: %w", err)
		default:
		}
		c, err := podnet.Dial(ctx, clientNS, "tcp4", addr)
		if err == nil {
			c.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("kube-proxy not serving %s: %w", addr, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
