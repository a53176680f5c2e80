package image

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"sigs.k8s.io/yaml"
)

// Registries is the node's registry configuration, in the shape of k3s's
// registries.yaml:
//
//	mirrors:
//	  docker.io:
//	    endpoint: ["http://127.0.0.1:5000", "https://mirror.example"]
//	configs:
//	  "127.0.0.1:5000":
//	    auth: {username: u, password: p}      # or auth: <base64 u:p>, identitytoken
//	    tls: {insecure_skip_verify: true, ca_file: /path/ca.pem}
//
// Mirror endpoints of a registry host are tried in order, then the host
// itself. An http:// endpoint is plain HTTP. "*" mirrors every registry.
type Registries struct {
	Mirrors map[string]Mirror         `json:"mirrors,omitempty"`
	Configs map[string]RegistryConfig `json:"configs,omitempty"`
}

// Mirror lists the endpoints that serve a registry host.
type Mirror struct {
	Endpoints []string `json:"endpoint,omitempty"`
}

// RegistryConfig holds credentials and TLS settings for one host.
type RegistryConfig struct {
	Auth *AuthConfig `json:"auth,omitempty"`
	TLS  *TLSConfig  `json:"tls,omitempty"`
}

// AuthConfig is a registry credential.
type AuthConfig struct {
	Username      string `json:"username,omitempty"`
	Password      string `json:"password,omitempty"`
	Auth          string `json:"auth,omitempty"`
	IdentityToken string `json:"identitytoken,omitempty"`
}

// TLSConfig is the TLS setting for one host.
type TLSConfig struct {
	InsecureSkipVerify bool   `json:"insecure_skip_verify,omitempty"`
	CAFile             string `json:"ca_file,omitempty"`
	CertFile           string `json:"cert_file,omitempty"`
	KeyFile            string `json:"key_file,omitempty"`
}

// LoadRegistries reads a registries file. A missing file is an empty
// configuration; a malformed one is an error naming the file and field.
func LoadRegistries(path string) (*Registries, error) {
	r := &Registries{}
	if path == "" {
		return r, nil
	}
	b, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return r, nil
	}
	if err != nil {
		return nil, err
	}
	if err := yaml.UnmarshalStrict(b, r); err != nil {
		return nil, fmt.Errorf("registries file %s: %w (expected keys: mirrors.<host>.endpoint, configs.<host>.auth/tls)", path, err)
	}
	for host, m := range r.Mirrors {
		for i, ep := range m.Endpoints {
			if _, _, err := parseEndpoint(ep); err != nil {
				return nil, fmt.Errorf("registries file %s: mirrors.%s.endpoint[%d]: %w", path, host, i, err)
			}
		}
	}
	for host, c := range r.Configs {
		if c.Auth != nil && c.Auth.Auth != "" {
			if _, err := base64.StdEncoding.DecodeString(c.Auth.Auth); err != nil {
				return nil, fmt.Errorf("registries file %s: configs.%s.auth.auth is not base64 of user:password: %w", path, host, err)
			}
		}
	}
	return r, nil
}

// parseEndpoint returns the registry host of an endpoint URL and whether it
// is plain HTTP.
func parseEndpoint(ep string) (host string, insecure bool, err error) {
	if !strings.Contains(ep, "://") {
		ep = "https://" + ep
	}
	u, err := url.Parse(ep)
	if err != nil {
		return "", false, err
	}
	if u.Host == "" {
		return "", false, fmt.Errorf("endpoint %q has no host", ep)
	}
	switch u.Scheme {
	case "http":
		return u.Host, true, nil
	case "https":
		return u.Host, false, nil
	}
	return "", false, fmt.Errorf("endpoint %q: scheme must be http or https", ep)
}

// endpoint is one place to pull a repository from.
type endpoint struct {
	registry name.Registry
	host     string
}

// hostKeys are the names a registry host may be configured under.
func hostKeys(host string) []string {
	if host == name.DefaultRegistry || host == "docker.io" {
		return []string{"docker.io", name.DefaultRegistry, "registry-1.docker.io"}
	}
	return []string{host}
}

// endpoints returns the mirror endpoints for host, then host itself.
func (r *Registries) endpoints(reg name.Registry) []endpoint {
	var eps []endpoint
	var m *Mirror
	for _, k := range hostKeys(reg.RegistryStr()) {
		if mm, ok := r.Mirrors[k]; ok {
			m = &mm
			break
		}
	}
	if m == nil {
		if mm, ok := r.Mirrors["*"]; ok {
			m = &mm
		}
	}
	if m != nil {
		for _, ep := range m.Endpoints {
			host, insecure, err := parseEndpoint(ep)
			if err != nil {
				continue
			}
			var opts []name.Option
			if insecure {
				opts = append(opts, name.Insecure)
			}
			mr, err := name.NewRegistry(host, opts...)
			if err != nil {
				continue
			}
			eps = append(eps, endpoint{registry: mr, host: host})
		}
	}
	return append(eps, endpoint{registry: reg, host: reg.RegistryStr()})
}

func (r *Registries) config(host string) RegistryConfig {
	for _, k := range hostKeys(host) {
		if c, ok := r.Configs[k]; ok {
			return c
		}
	}
	return RegistryConfig{}
}

// transport builds the HTTP transport for host (TLS settings).
func (r *Registries) transport(host string) (http.RoundTripper, error) {
	c := r.config(host)
	t := http.DefaultTransport.(*http.Transport).Clone()
	if c.TLS == nil {
		return t, nil
	}
	tc := &tls.Config{InsecureSkipVerify: c.TLS.InsecureSkipVerify}
	if c.TLS.CAFile != "" {
		pem, err := os.ReadFile(c.TLS.CAFile)
		if err != nil {
			return nil, fmt.Errorf("registries configs.%s.tls.ca_file: %w", host, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("registries configs.%s.tls.ca_file %s holds no PEM certificate", host, c.TLS.CAFile)
		}
		tc.RootCAs = pool
	}
	if c.TLS.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(c.TLS.CertFile, c.TLS.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("registries configs.%s.tls.cert_file/key_file: %w", host, err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	t.TLSClientConfig = tc
	return t, nil
}

// authFor picks the credential for host: the pod's pull secrets first (in
// order), then the registries file, else anonymous.
func (r *Registries) authFor(host string, secrets [][]byte) (authn.Authenticator, error) {
	for i, s := range secrets {
		a, ok, err := fromDockerConfig(s, host)
		if err != nil {
			return nil, fmt.Errorf("pull secret %d: %w", i, err)
		}
		if ok {
			return a, nil
		}
	}
	if c := r.config(host); c.Auth != nil {
		return authn.FromConfig(authn.AuthConfig{Username: c.Auth.Username, Password: c.Auth.Password,
			Auth: c.Auth.Auth, IdentityToken: c.Auth.IdentityToken}), nil
	}
	return authn.Anonymous, nil
}
