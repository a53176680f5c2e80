package deploy

import (
	"context"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net/url"
	"sort"
	"strings"

	"github.com/k3sm-dev/k3sm/internal/server/deploy/helmwire"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes"
)

// The keys k3s reads from the Secrets it is given.
const (
	basicAuthUsername = corev1.BasicAuthUsernameKey // "username"
	basicAuthPassword = corev1.BasicAuthPasswordKey // "password"
	dockerConfigKey   = corev1.DockerConfigJsonKey  // ".dockerconfigjson"
)

// readSource resolves the spec's references. Secrets and the ConfigMap are
// looked up in the HelmChart's own namespace, as k3s mounts them into its
// helm Job there.
func readSource(ctx context.Context, kube kubernetes.Interface, hc *unstructured.Unstructured) (*helmwire.Source, error) {
	spec, _, _ := unstructured.NestedMap(hc.Object, "spec")
	str := func(k string) string { s, _ := spec[k].(string); return s }
	flag := func(k string) bool { b, _ := spec[k].(bool); return b }
	s := &helmwire.Source{Namespace: hc.GetNamespace(), Chart: str("chart"), Version: str("version"), Repo: str("repo"),
		PassCredentialsAll: flag("authPassCredentials"), Insecure: flag("insecureSkipTLSVerify"), PlainHTTP: flag("plainHTTP")}

	if name, err := refName(spec, "authSecret"); err != nil {
		return nil, err
	} else if name != "" {
		sec, err := getSecret(ctx, kube, s.Namespace, name, "authSecret", "kubectl create secret generic "+name+" -n "+s.Namespace+" --type=kubernetes.io/basic-auth --from-literal=username=U --from-literal=password=P")
		if err != nil {
			return nil, err
		}
		s.Username, s.Password = string(sec.Data[basicAuthUsername]), string(sec.Data[basicAuthPassword])
		if s.Username == "" || s.Password == "" {
			return nil, fmt.Errorf("spec.authSecret: Secret %s/%s needs the keys %q and %q (a kubernetes.io/basic-auth Secret); it has %s",
				s.Namespace, name, basicAuthUsername, basicAuthPassword, keyList(sec.Data))
		}
	}

	if ca := str("repoCA"); ca != "" {
		if err := checkPEM([]byte(ca)); err != nil {
			return nil, fmt.Errorf("spec.repoCA: %w: give one or more PEM CA certificates (-----BEGIN CERTIFICATE-----)", err)
		}
		s.CA = append(s.CA, strings.TrimSpace(ca)+"\n"...)
	}
	if name, err := refName(spec, "repoCAConfigMap"); err != nil {
		return nil, err
	} else if name != "" {
		cm, err := kube.CoreV1().ConfigMaps(s.Namespace).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("spec.repoCAConfigMap: ConfigMap %s/%s not found: create it with the CA under ca.crt (kubectl create configmap %s -n %s --from-file=ca.crt=ca.pem)", s.Namespace, name, name, s.Namespace)
		}
		if err != nil {
			return nil, fmt.Errorf("spec.repoCAConfigMap: %w", err)
		}
		// Every key, as k3s mounts the whole ConfigMap as helm's CA files.
		keys := make([]string, 0, len(cm.Data))
		for k := range cm.Data {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		if len(keys) == 0 {
			return nil, fmt.Errorf("spec.repoCAConfigMap: ConfigMap %s/%s has no data: put the PEM CA under ca.crt", s.Namespace, name)
		}
		for _, k := range keys {
			if err := checkPEM([]byte(cm.Data[k])); err != nil {
				return nil, fmt.Errorf("spec.repoCAConfigMap: ConfigMap %s/%s key %s: %w: every key must hold PEM CA certificates", s.Namespace, name, k, err)
			}
			s.CA = append(s.CA, strings.TrimSpace(cm.Data[k])+"\n"...)
		}
	}

	if name, err := refName(spec, "dockerRegistrySecret"); err != nil {
		return nil, err
	} else if name != "" {
		sec, err := getSecret(ctx, kube, s.Namespace, name, "dockerRegistrySecret", "kubectl create secret docker-registry "+name+" -n "+s.Namespace+" --docker-server=HOST --docker-username=U --docker-password=P")
		if err != nil {
			return nil, err
		}
		raw, ok := sec.Data[dockerConfigKey]
		if !ok {
			return nil, fmt.Errorf("spec.dockerRegistrySecret: Secret %s/%s has no %s key (make it a kubernetes.io/dockerconfigjson Secret: kubectl create secret docker-registry); it has %s", s.Namespace, name, dockerConfigKey, keyList(sec.Data))
		}
		if s.Docker, err = parseDockerConfig(raw); err != nil {
			return nil, fmt.Errorf("spec.dockerRegistrySecret: Secret %s/%s key %s: %w", s.Namespace, name, dockerConfigKey, err)
		}
	}
	return s, nil
}

// refName reads a LocalObjectReference field ({name: x}).
func refName(spec map[string]any, field string) (string, error) {
	v, ok := spec[field]
	if !ok || v == nil {
		return "", nil
	}
	m, ok := v.(map[string]any)
	name, _ := m["name"].(string)
	if !ok || name == "" {
		return "", fmt.Errorf("spec.%s: give a reference {name: NAME} to an object in the HelmChart's namespace, not %v", field, v)
	}
	return name, nil
}

func getSecret(ctx context.Context, kube kubernetes.Interface, ns, name, field, create string) (*corev1.Secret, error) {
	sec, err := kube.CoreV1().Secrets(ns).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("spec.%s: Secret %s/%s not found (it must be in the HelmChart's namespace): %s", field, ns, name, create)
	}
	if err != nil {
		return nil, fmt.Errorf("spec.%s: %w", field, err)
	}
	return sec, nil
}

func keyList(data map[string][]byte) string {
	if len(data) == 0 {
		return "no keys"
	}
	keys := make([]string, 0, len(data))
	for k := range data {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return "keys " + strings.Join(keys, ", ")
}

// checkPEM wants at least one certificate and nothing that fails to parse.
func checkPEM(data []byte) error {
	n := 0
	for rest := data; ; {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		if b.Type != "CERTIFICATE" {
			continue
		}
		if _, err := x509.ParseCertificate(b.Bytes); err != nil {
			return fmt.Errorf("certificate %d: %w", n+1, err)
		}
		n++
	}
	if n == 0 {
		return errors.New("no PEM certificate in it")
	}
	return nil
}

// parseDockerConfig reads a ~/.docker/config.json's "auths": each entry's
// username/password, or its base64 "auth" of user:password.
func parseDockerConfig(raw []byte) (map[string]helmwire.Credential, error) {
	var cfg struct {
		Auths map[string]struct {
			Username      string `json:"username"`
			Password      string `json:"password"`
			Auth          string `json:"auth"`
			IdentityToken string `json:"identitytoken"`
		} `json:"auths"`
	}
	if err := json.Unmarshal(raw, &cfg); err != nil {
		return nil, fmt.Errorf("not a Docker config.json: %w", err)
	}
	if len(cfg.Auths) == 0 {
		return nil, errors.New(`no "auths" entries: the Secret must name the chart's registry`)
	}
	out := map[string]helmwire.Credential{}
	for server, a := range cfg.Auths {
		c := helmwire.Credential{Username: a.Username, Password: a.Password, RefreshToken: a.IdentityToken}
		if a.Auth != "" {
			dec, err := base64.StdEncoding.DecodeString(a.Auth)
			if err != nil {
				return nil, fmt.Errorf("auths[%q].auth is not base64 of user:password: %w", server, err)
			}
			user, pass, ok := strings.Cut(string(dec), ":")
			if !ok {
				return nil, fmt.Errorf("auths[%q].auth is not base64 of user:password", server)
			}
			c.Username, c.Password = user, pass
		}
		out[registryHost(server)] = c
	}
	return out, nil
}

// registryHost reduces a config.json key ("https://host:5000/v1/",
// "host:5000") to host:port, the form registries are looked up by.
func registryHost(server string) string {
	if u, err := url.Parse(server); err == nil && u.Host != "" {
		return u.Host
	}
	h, _, _ := strings.Cut(server, "/")
	return h
}
