package image

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/url"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
)

// dockerConfig is the .dockerconfigjson of a kubernetes.io/dockerconfigjson
// Secret (or the bare auths map of a legacy .dockercfg).
type dockerConfig struct {
	Auths map[string]dockerAuth `json:"auths"`
}

type dockerAuth struct {
	Username      string `json:"username"`
	Password      string `json:"password"`
	Auth          string `json:"auth"`
	IdentityToken string `json:"identitytoken"`
}

// fromDockerConfig finds the credential for host in a docker config JSON.
func fromDockerConfig(b []byte, host string) (authn.Authenticator, bool, error) {
	var cfg dockerConfig
	if err := json.Unmarshal(b, &cfg); err != nil {
		return nil, false, fmt.Errorf("not docker config JSON: %w", err)
	}
	if cfg.Auths == nil {
		// Legacy .dockercfg: the auths map at top level.
		var legacy map[string]dockerAuth
		if err := json.Unmarshal(b, &legacy); err == nil {
			cfg.Auths = legacy
		}
	}
	for key, a := range cfg.Auths {
		if !matchHost(key, host) {
			continue
		}
		user, pass := a.Username, a.Password
		if a.Auth != "" && user == "" {
			dec, err := base64.StdEncoding.DecodeString(a.Auth)
			if err != nil {
				return nil, false, fmt.Errorf("auths[%q].auth is not base64: %w", key, err)
			}
			u, p, ok := strings.Cut(string(dec), ":")
			if !ok {
				return nil, false, fmt.Errorf("auths[%q].auth is not user:password", key)
			}
			user, pass = u, p
		}
		return authn.FromConfig(authn.AuthConfig{Username: user, Password: pass, IdentityToken: a.IdentityToken}), true, nil
	}
	return nil, false, nil
}

// matchHost compares a docker config key (a host, host:port or URL like
// https://index.docker.io/v1/) with a registry host.
func matchHost(key, host string) bool {
	k := key
	if strings.Contains(k, "://") {
		if u, err := url.Parse(k); err == nil {
			k = u.Host
		}
	} else if i := strings.IndexByte(k, '/'); i >= 0 {
		k = k[:i]
	}
	for _, h := range hostKeys(host) {
		if k == h {
			return true
		}
	}
	return false
}
