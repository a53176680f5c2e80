package localnode

import (
	"net"
	"os"

	joinv1 "github.com/k3sm-dev/k3sm/api/join/v1"
	"github.com/k3sm-dev/k3sm/internal/kubeconfig"
	"github.com/k3sm-dev/k3sm/internal/pki"
	"github.com/k3sm-dev/k3sm/internal/server/controlplane"
)

// localPathUser is the local-path provisioner's user name on a node: its
// own identity, bound to localpath.RoleName, never the node's or admin's
// (a joined agent's gets the same name from its join).
func localPathUser(node string) string { return joinv1.LocalPathUser(node) }

// issueCredentials gives the node its client certificate (system:node:<name>
// in system:nodes) and kubeconfig, its kubelet API serving certificate, the
// CA of the kubelet API's clients, and the provisioner's credential.
func issueCredentials(p *controlplane.Plane) error {
	cfg, l := p.Cfg, p.Layout
	tlsDir := l.AgentTLSDir()
	if err := os.MkdirAll(tlsDir, 0o700); err != nil {
		return err
	}
	client, err := p.Certs.ClientCA.Ensure(tlsDir, "client-kubelet", pki.LeafSpec{
		CommonName: "system:node:" + cfg.NodeName, Organization: []string{"system:nodes"}, Client: true})
	if err != nil {
		return err
	}
	host, _ := os.Hostname()
	ips := []net.IP{net.ParseIP("127.0.0.1")}
	if ip := net.ParseIP(cfg.NodeIP); ip != nil && !ip.Equal(ips[0]) {
		ips = append(ips, ip)
	}
	if _, err := p.Certs.ServerCA.Ensure(tlsDir, "serving-kubelet", pki.LeafSpec{
		CommonName: "system:node:" + cfg.NodeName, Organization: []string{"system:nodes"},
		DNSNames: uniq("localhost", cfg.NodeName, host), IPs: ips, Server: true}); err != nil {
		return err
	}
	if err := pki.WriteFile(l.KubeletClientCA(), p.Certs.ClientCA.CertPEM()); err != nil {
		return err
	}
	if err := kubeconfig.WriteClient(l.NodeKubeconfig(), cfg.LocalAPIURL(), p.Certs.ServerCA.CertPEM(), client, "node"); err != nil {
		return err
	}
	lp, err := p.Certs.ClientCA.Ensure(tlsDir, "client-local-path", pki.LeafSpec{CommonName: localPathUser(cfg.NodeName), Client: true})
	if err != nil {
		return err
	}
	return kubeconfig.WriteClient(l.LocalPathKubeconfig(), cfg.LocalAPIURL(), p.Certs.ServerCA.CertPEM(), lp, "local-path")
}

func uniq(xs ...string) []string {
	var out []string
	seen := map[string]bool{}
	for _, x := range xs {
		if x != "" && !seen[x] {
			seen[x] = true
			out = append(out, x)
		}
	}
	return out
}
