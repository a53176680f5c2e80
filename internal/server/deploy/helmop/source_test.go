package helmop

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/k3sm-dev/k3sm/internal/server/deploy/charttest"
	"github.com/k3sm-dev/k3sm/internal/server/deploy/helmwire"
)

func wantErr(t *testing.T, err error, parts ...string) {
	t.Helper()
	t.Logf("error: %v", err)
	if err == nil {
		t.Fatalf("no error, want one with %q", parts)
	}
	for _, p := range parts {
		if !strings.Contains(err.Error(), p) {
			t.Fatalf("error %q does not say %q", err, p)
		}
	}
}

func wantChart(t *testing.T, s *source, name, version string) {
	t.Helper()
	ch, err := s.fetch(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if ch.Metadata.Name != name || ch.Metadata.Version != version {
		t.Fatalf("chart %s-%s, want %s-%s", ch.Metadata.Name, ch.Metadata.Version, name, version)
	}
}

// A chart repository on 127.0.0.1 with a CA of its own and basic auth:
// each missing piece fails naming the field that supplies it.
func TestRepoWithBasicAuthAndPrivateCA(t *testing.T) {
	ca := charttest.NewCA(t)
	srv := charttest.Repo(t, ca, "alice", "s3cret", "private", "1.2.3")
	base := source{Source: helmwire.Source{Namespace: "kube-system", Chart: "private", Repo: srv.URL}}

	s := base
	_, err := s.fetch(t.TempDir())
	wantErr(t, err, "unknown authority", "set spec.repoCA", "spec.repoCAConfigMap")

	s.CA = ca.PEM
	_, err = s.fetch(t.TempDir())
	wantErr(t, err, "401 Unauthorized", "set spec.authSecret", "kubernetes.io/basic-auth", "kube-system")

	s.Username, s.Password = "alice", "wrong"
	_, err = s.fetch(t.TempDir())
	wantErr(t, err, "401", "refused the credentials of spec.authSecret")

	s.Password = "s3cret"
	refused := srv.Refused.Load()
	wantChart(t, &s, "private", "1.2.3")
	if n := srv.Refused.Load() - refused; n != 0 {
		t.Errorf("%d requests went without credentials (the index and the .tgz both need them)", n)
	}

	// A CA that did not sign the server's certificate.
	s.CA = charttest.NewCA(t).PEM
	_, err = s.fetch(t.TempDir())
	wantErr(t, err, "not signed by the CA of spec.repoCA")

	// insecureSkipTLSVerify still works without a CA.
	s.CA, s.Insecure = nil, true
	wantChart(t, &s, "private", "1.2.3")
}

// A chart given as an https:// URL; credentials go to another host only
// with authPassCredentials, as helm's --pass-credentials.
func TestChartURLAndPassCredentials(t *testing.T) {
	ca := charttest.NewCA(t)
	tgz := charttest.Chart(t, "elsewhere", "0.1.0")
	chartSrv := charttest.Serve(t, ca, "bob", "pw", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write(tgz) }))
	s := source{Source: helmwire.Source{Namespace: "default", Chart: chartSrv.URL + "/elsewhere-0.1.0.tgz", CA: ca.PEM, Username: "bob", Password: "pw"}}
	wantChart(t, &s, "elsewhere", "0.1.0")

	// A repository whose index points at that other server.
	index := fmt.Sprintf("apiVersion: v1\nentries:\n  elsewhere:\n  - {apiVersion: v2, name: elsewhere, version: 0.1.0, urls: [%s/elsewhere-0.1.0.tgz]}\n", chartSrv.URL)
	repoSrv := charttest.Serve(t, ca, "bob", "pw", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte(index)) }))
	s = source{Source: helmwire.Source{Namespace: "default", Chart: "elsewhere", Repo: repoSrv.URL, CA: ca.PEM, Username: "bob", Password: "pw"}}
	_, err := s.fetch(t.TempDir())
	wantErr(t, err, "downloading "+chartSrv.URL, "401", "set spec.authPassCredentials: true")
	s.PassCredentialsAll = true
	wantChart(t, &s, "elsewhere", "0.1.0")

	s = source{Source: helmwire.Source{Chart: "nameonly"}}
	_, err = s.fetch(t.TempDir())
	wantErr(t, err, "needs spec.repo")
}

// An OCI registry on 127.0.0.1 behind TLS and basic auth: the credentials
// come from spec.dockerRegistrySecret's entry for the registry's host.
func TestOCIRegistryWithDockerConfigCredentials(t *testing.T) {
	ca := charttest.NewCA(t)
	_, host := charttest.Registry(t, ca, "carol", "pa55", "ocipriv", "0.3.0")
	s := source{Source: helmwire.Source{Namespace: "kube-system", Chart: "oci://" + host + "/charts/ocipriv", Version: "0.3.0"}}

	_, err := s.fetch(t.TempDir())
	wantErr(t, err, "unknown authority", "spec.repoCA")

	s.CA = ca.PEM
	_, err = s.fetch(t.TempDir())
	wantErr(t, err, "set spec.dockerRegistrySecret", "kubernetes.io/dockerconfigjson")

	s.Docker = map[string]helmwire.Credential{"other.example:5000": {Username: "carol", Password: "pa55"}}
	_, err = s.fetch(t.TempDir())
	wantErr(t, err, "spec.dockerRegistrySecret has no credentials for "+host, "other.example:5000")

	s.Docker[host] = helmwire.Credential{Username: "carol", Password: "nope"}
	_, err = s.fetch(t.TempDir())
	wantErr(t, err, "refused the credentials of spec.dockerRegistrySecret")

	s.Docker[host] = helmwire.Credential{Username: "carol", Password: "pa55"}
	wantChart(t, &s, "ocipriv", "0.3.0")
	// Without a version the tags are listed (with the same credentials).
	s.Version = ""
	wantChart(t, &s, "ocipriv", "0.3.0")

	// authSecret's basic credentials serve an OCI registry too.
	s.Docker, s.Username, s.Password = nil, "carol", "pa55"
	wantChart(t, &s, "ocipriv", "0.3.0")
}
