package deploy

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/getter"
	"helm.sh/helm/v3/pkg/registry"
	"helm.sh/helm/v3/pkg/repo"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes"
	"oras.land/oras-go/v2/registry/remote/auth"
	"oras.land/oras-go/v2/registry/remote/errcode"
)

// source is where a chart comes from and how it is reached: the spec's
// fields with the Secrets and ConfigMap they name already read.
type source struct {
	Namespace string // the HelmChart's, where its Secrets and ConfigMap are
	Chart     string // spec.chart: a name in Repo, oci://host/path/name, or an http(s) URL of a .tgz
	Version   string
	Repo      string

	Username, Password string // spec.authSecret
	PassCredentialsAll bool   // spec.authPassCredentials
	CA                 []byte // PEM: spec.repoCA and spec.repoCAConfigMap
	Insecure           bool   // spec.insecureSkipTLSVerify
	PlainHTTP          bool
	// Docker holds spec.dockerRegistrySecret's credentials by registry
	// host[:port]; nil when the field is not set.
	Docker map[string]auth.Credential

	credField string // which field the OCI credentials came from, for errors
}

// The keys k3s reads from the Secrets it is given.
const (
	basicAuthUsername = corev1.BasicAuthUsernameKey // "username"
	basicAuthPassword = corev1.BasicAuthPasswordKey // "password"
	dockerConfigKey   = corev1.DockerConfigJsonKey  // ".dockerconfigjson"
)

// readSource resolves the spec's references. Secrets and the ConfigMap are
// looked up in the HelmChart's own namespace, as k3s mounts them into its
// helm Job there.
func readSource(ctx context.Context, kube kubernetes.Interface, hc *unstructured.Unstructured) (*source, error) {
	spec, _, _ := unstructured.NestedMap(hc.Object, "spec")
	str := func(k string) string { s, _ := spec[k].(string); return s }
	flag := func(k string) bool { b, _ := spec[k].(bool); return b }
	s := &source{Namespace: hc.GetNamespace(), Chart: str("chart"), Version: str("version"), Repo: str("repo"),
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
func parseDockerConfig(raw []byte) (map[string]auth.Credential, error) {
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
	out := map[string]auth.Credential{}
	for server, a := range cfg.Auths {
		c := auth.Credential{Username: a.Username, Password: a.Password, RefreshToken: a.IdentityToken}
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

// tlsConfig trusts spec.repoCA/repoCAConfigMap only when given, like helm's
// --ca-file (which k3s passes them as); otherwise the system's roots.
func (s *source) tlsConfig() (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: s.Insecure} //nolint:gosec // the user asked for it
	if len(s.CA) > 0 {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(s.CA) {
			return nil, errors.New("spec.repoCA/repoCAConfigMap: no usable certificate")
		}
		cfg.RootCAs = pool
	}
	return cfg, nil
}

// fetch loads the chart named by s (not spec.chartContent). tmp holds the
// repository index and the CA file helm's repo client reads.
func (s *source) fetch(tmp string) (*chart.Chart, error) {
	if s.Chart == "" {
		return nil, errors.New("spec.chart is empty: name a chart (with spec.repo), an OCI reference oci://host/path/chart, or set spec.chartContent")
	}
	if ref, ok := strings.CutPrefix(s.Chart, "oci://"); ok {
		return s.fetchOCI(ref)
	}
	caFile := ""
	if len(s.CA) > 0 {
		caFile = filepath.Join(tmp, "ca.pem")
		if err := os.WriteFile(caFile, s.CA, 0o600); err != nil {
			return nil, err
		}
	}
	chartURL, base := s.Chart, s.Chart
	if s.Repo != "" {
		u, err := s.findInRepo(tmp, caFile)
		if err != nil {
			return nil, fmt.Errorf("spec.repo %s: %w", s.Repo, s.hint(err))
		}
		chartURL, base = u, s.Repo
	} else if !strings.HasPrefix(s.Chart, "https://") && !strings.HasPrefix(s.Chart, "http://") {
		return nil, fmt.Errorf("spec.chart %q needs spec.repo (a chart repository URL); or give an https:// URL of a chart .tgz, an oci:// reference, or spec.chartContent", s.Chart)
	}
	g, err := getter.NewHTTPGetter(
		getter.WithURL(base), // credentials go to this host only, unless authPassCredentials
		getter.WithBasicAuth(s.Username, s.Password),
		getter.WithPassCredentialsAll(s.PassCredentialsAll),
		getter.WithTLSClientConfig("", "", caFile),
		getter.WithInsecureSkipVerifyTLS(s.Insecure),
	)
	if err != nil {
		return nil, err
	}
	buf, err := g.Get(chartURL)
	if err != nil {
		if s.Username != "" && !s.PassCredentialsAll && !sameOrigin(base, chartURL) {
			return nil, fmt.Errorf("downloading %s: %w: the credentials of spec.authSecret go only to %s; set spec.authPassCredentials: true to send them to the chart's host too", chartURL, err, base)
		}
		return nil, fmt.Errorf("downloading %s: %w", chartURL, s.hint(err))
	}
	ch, err := loader.LoadArchive(buf)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", chartURL, err)
	}
	return ch, nil
}

// sameOrigin is helm's test for sending a repository's credentials.
func sameOrigin(a, b string) bool {
	ua, err1 := url.Parse(a)
	ub, err2 := url.Parse(b)
	return err1 == nil && err2 == nil && ua.Scheme == ub.Scheme && ua.Host == ub.Host
}

// findInRepo resolves a chart's URL from the repository's index. helm's
// FindChartInRepoURL would cache the index under $HOME, which the k3sm
// system user may not have: the index goes to tmp.
func (s *source) findInRepo(tmp, caFile string) (string, error) {
	providers := getter.Providers{{Schemes: []string{"http", "https"}, New: getter.NewHTTPGetter}}
	r, err := repo.NewChartRepository(&repo.Entry{Name: "index", URL: s.Repo, Username: s.Username, Password: s.Password,
		PassCredentialsAll: s.PassCredentialsAll, CAFile: caFile, InsecureSkipTLSverify: s.Insecure}, providers)
	if err != nil {
		return "", err
	}
	r.CachePath = tmp
	path, err := r.DownloadIndexFile()
	if err != nil {
		return "", fmt.Errorf("reading its index.yaml: %w", err)
	}
	idx, err := repo.LoadIndexFile(path)
	if err != nil {
		return "", err
	}
	cv, err := idx.Get(s.Chart, s.Version)
	if err != nil {
		return "", fmt.Errorf("chart %q version %q not in the index: %w", s.Chart, s.Version, err)
	}
	if len(cv.URLs) == 0 {
		return "", fmt.Errorf("chart %q version %s has no URL in the index", s.Chart, cv.Version)
	}
	return repo.ResolveReferenceURL(s.Repo, cv.URLs[0])
}

func (s *source) fetchOCI(ref string) (*chart.Chart, error) {
	host, _, _ := strings.Cut(ref, "/")
	cred := auth.EmptyCredential
	switch {
	case s.Docker != nil:
		c, ok := s.Docker[host]
		if !ok {
			hosts := make([]string, 0, len(s.Docker))
			for h := range s.Docker {
				hosts = append(hosts, h)
			}
			sort.Strings(hosts)
			return nil, fmt.Errorf("spec.dockerRegistrySecret has no credentials for %s (it has %s): add an auths entry for %s", host, strings.Join(hosts, ", "), host)
		}
		cred = c
	case s.Username != "":
		cred = auth.Credential{Username: s.Username, Password: s.Password}
	}
	s.credField = "spec.authSecret"
	if s.Docker != nil {
		s.credField = "spec.dockerRegistrySecret"
	}
	tlsCfg, err := s.tlsConfig()
	if err != nil {
		return nil, err
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = tlsCfg
	// Only this HelmChart's credentials, never the server user's
	// ~/.docker/config.json that helm's default client would read.
	authz := auth.Client{Client: &http.Client{Transport: tr}, Cache: auth.NewCache(),
		Credential: func(_ context.Context, hostport string) (auth.Credential, error) {
			if hostport == host {
				return cred, nil
			}
			return auth.EmptyCredential, nil
		}}
	authz.SetUserAgent("k3sm-helm-controller")
	opts := []registry.ClientOption{registry.ClientOptAuthorizer(authz)}
	if s.PlainHTTP {
		opts = append(opts, registry.ClientOptPlainHTTP())
	}
	rc, err := registry.NewClient(opts...)
	if err != nil {
		return nil, err
	}
	if s.Version != "" {
		ref += ":" + s.Version
	} else if !strings.Contains(ref[strings.LastIndex(ref, "/")+1:], ":") {
		tags, err := rc.Tags(ref)
		if err != nil {
			return nil, fmt.Errorf("spec.chart %s: listing versions: %w", s.Chart, s.hint(err))
		}
		if len(tags) == 0 {
			return nil, fmt.Errorf("spec.chart %s: no versions in the registry: push one or set spec.version", s.Chart)
		}
		ref += ":" + tags[0] // newest semver first
	}
	res, err := rc.Pull(ref, registry.PullOptWithChart(true))
	if err != nil {
		return nil, fmt.Errorf("spec.chart %s: %w", s.Chart, s.hint(err))
	}
	return loader.LoadArchive(bytes.NewReader(res.Chart.Data))
}

// hint names the field that fixes an authentication or TLS failure.
func (s *source) hint(err error) error {
	oci := strings.HasPrefix(s.Chart, "oci://")
	var unknownCA x509.UnknownAuthorityError
	var certErr *tls.CertificateVerificationError
	var resp *errcode.ErrorResponse
	switch {
	case errors.As(err, &unknownCA) || (errors.As(err, &certErr) && errors.As(certErr.Err, &unknownCA)):
		if len(s.CA) > 0 {
			return fmt.Errorf("%w (the server's certificate is not signed by the CA of spec.repoCA/repoCAConfigMap)", err)
		}
		return fmt.Errorf("%w: set spec.repoCA (PEM) or spec.repoCAConfigMap (a ConfigMap with ca.crt) to the CA that signed the server's certificate", err)
	case oci && (errors.Is(err, auth.ErrBasicCredentialNotFound) || (errors.As(err, &resp) && resp.StatusCode == http.StatusUnauthorized)):
		if s.Docker != nil || s.Username != "" {
			return fmt.Errorf("%w: the registry refused the credentials of %s", err, s.credField)
		}
		return fmt.Errorf("%w: the registry wants credentials: set spec.dockerRegistrySecret to a kubernetes.io/dockerconfigjson Secret in namespace %s with an entry for the registry", err, s.Namespace)
	case !oci && strings.Contains(err.Error(), " 401 "+http.StatusText(http.StatusUnauthorized)):
		if s.Username != "" {
			return fmt.Errorf("%w: the repository refused the credentials of spec.authSecret", err)
		}
		return fmt.Errorf("%w: the repository wants credentials: set spec.authSecret to a kubernetes.io/basic-auth Secret (username, password) in namespace %s", err, s.Namespace)
	}
	return err
}
