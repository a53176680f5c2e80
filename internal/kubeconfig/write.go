package kubeconfig

import (
	"fmt"
	"os"

	"github.com/k3sm-dev/k3sm/internal/pki"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// WriteClient writes a kubeconfig for one client certificate of a pki CA, with the
// certificate data embedded so the file works when copied elsewhere.
func WriteClient(path, server string, caPEM []byte, leaf pki.Leaf, user string) error {
	certPEM, err := os.ReadFile(leaf.CertPath)
	if err != nil {
		return err
	}
	keyPEM, err := os.ReadFile(leaf.KeyPath)
	if err != nil {
		return err
	}
	name := "k3sm"
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters[name] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: caPEM}
	cfg.AuthInfos[name+"-"+user] = &clientcmdapi.AuthInfo{ClientCertificateData: certPEM, ClientKeyData: keyPEM}
	cfg.Contexts[name] = &clientcmdapi.Context{Cluster: name, AuthInfo: name + "-" + user}
	cfg.CurrentContext = name
	data, err := clientcmd.Write(*cfg)
	if err != nil {
		return fmt.Errorf("kubeconfig %s: %w", path, err)
	}
	return pki.WriteFile(path, data)
}
