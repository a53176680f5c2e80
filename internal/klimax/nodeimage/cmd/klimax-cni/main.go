// Command klimax-cni is the pod network daemon of the klimax node image (the
// part kind's kindnetd plays in kindest/node). Run on every node with host
// networking, it
//   - writes a CNI config that gives the node's pods addresses from the
//     node's spec.podCIDR, with the standard bridge, host-local and portmap
//     plugins (installed in /opt/cni/bin of the node image), and
//   - keeps a route to every other node's podCIDR via that node's
//     InternalIP, so pods on different nodes reach each other over the
//     Docker network the nodes share.
//
// It polls the API every -interval; the config is rewritten only when it
// changes.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/k3sm-dev/k3sm/internal/atomicfile"
)

func main() {
	confDir := flag.String("cni-conf-dir", "/etc/cni/net.d", "directory the container runtime reads CNI configs from")
	interval := flag.Duration("interval", 10*time.Second, "how often nodes are read")
	flag.Parse()
	node := os.Getenv("NODE_NAME")
	if node == "" {
		fmt.Fprintln(os.Stderr, "klimax-cni: NODE_NAME is empty: set it from the pod's spec.nodeName (downward API)")
		os.Exit(2)
	}
	cfg, err := rest.InClusterConfig()
	if err != nil {
		fmt.Fprintln(os.Stderr, "klimax-cni:", err)
		os.Exit(1)
	}
	client := kubernetes.NewForConfigOrDie(cfg)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	log := slog.Default()
	t := time.NewTicker(*interval)
	defer t.Stop()
	for {
		if err := sync(ctx, client, node, *confDir, log); err != nil {
			log.Warn("sync", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func sync(ctx context.Context, client kubernetes.Interface, self, confDir string, log *slog.Logger) error {
	rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	nodes, err := client.CoreV1().Nodes().List(rctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	for i := range nodes.Items {
		n := &nodes.Items[i]
		if n.Spec.PodCIDR == "" {
			continue
		}
		if n.Name == self {
			changed, err := writeConfig(confDir, n.Spec.PodCIDR)
			if err != nil {
				return err
			}
			if changed {
				log.Info("wrote CNI config", "podCIDR", n.Spec.PodCIDR)
			}
			continue
		}
		if err := routeTo(n); err != nil {
			log.Warn("route", "node", n.Name, "err", err)
		}
	}
	return nil
}

// Config is the CNI network list written for podCIDR.
func Config(podCIDR string) ([]byte, error) {
	if _, _, err := net.ParseCIDR(podCIDR); err != nil {
		return nil, fmt.Errorf("podCIDR %q: %v", podCIDR, err)
	}
	conf := map[string]any{
		"cniVersion": "0.4.0",
		"name":       "klimax",
		"plugins": []any{
			map[string]any{
				"type": "bridge", "bridge": "klimax0", "isGateway": true, "ipMasq": true, "hairpinMode": true,
				"ipam": map[string]any{
					"type":   "host-local",
					"ranges": [][]map[string]string{{{"subnet": podCIDR}}},
					"routes": []map[string]string{{"dst": "0.0.0.0/0"}},
				},
			},
			map[string]any{"type": "portmap", "capabilities": map[string]bool{"portMappings": true}},
		},
	}
	return json.MarshalIndent(conf, "", "  ")
}

func writeConfig(dir, podCIDR string) (bool, error) {
	want, err := Config(podCIDR)
	if err != nil {
		return false, err
	}
	path := filepath.Join(dir, "10-klimax.conflist")
	if have, err := os.ReadFile(path); err == nil && bytes.Equal(have, want) {
		return false, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return false, err
	}
	return true, atomicfile.WriteFileNoSync(path, want, 0o644)
}

func routeTo(n *corev1.Node) error {
	_, dst, err := net.ParseCIDR(n.Spec.PodCIDR)
	if err != nil {
		return err
	}
	var gw net.IP
	for _, a := range n.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			if ip := net.ParseIP(a.Address); ip != nil && (ip.To4() == nil) == (dst.IP.To4() == nil) {
				gw = ip
			}
		}
	}
	if gw == nil {
		return fmt.Errorf("no InternalIP of the podCIDR's family")
	}
	return netlink.RouteReplace(&netlink.Route{Dst: dst, Gw: gw})
}
