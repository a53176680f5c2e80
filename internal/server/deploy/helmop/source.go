package helmop

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/k3sm-dev/k3sm/internal/server/deploy/helmwire"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/getter"
	"helm.sh/helm/v3/pkg/registry"
	"helm.sh/helm/v3/pkg/repo"
	"oras.land/oras-go/v2/registry/remote/auth"
	"oras.land/oras-go/v2/registry/remote/errcode"
)

// source is a chart's source as k3sm read it from the HelmChart.
type source struct {
	helmwire.Source
	credField string // which field the OCI credentials came from, for errors
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
		cred = auth.Credential{Username: c.Username, Password: c.Password, RefreshToken: c.RefreshToken}
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
