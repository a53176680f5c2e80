package deploy

import (
	"encoding/base64"
	"strings"
	"testing"

	"github.com/k3sm-dev/k3sm/internal/server/deploy/charttest"
)

func TestParseDockerConfig(t *testing.T) {
	enc := base64.StdEncoding.EncodeToString([]byte("u2:p:w"))
	got, err := parseDockerConfig([]byte(`{"auths": {"https://reg.example:5000/v1/": {"username": "u1", "password": "p1"}, "127.0.0.1:5001": {"auth": "` + enc + `"}}}`))
	if err != nil {
		t.Fatal(err)
	}
	if c := got["reg.example:5000"]; c.Username != "u1" || c.Password != "p1" {
		t.Errorf("reg.example:5000: %+v (all: %v)", c, got)
	}
	if c := got["127.0.0.1:5001"]; c.Username != "u2" || c.Password != "p:w" {
		t.Errorf("127.0.0.1:5001: %+v", c)
	}
	for _, bad := range []string{`{}`, `not json`, `{"auths": {"h": {"auth": "!!"}}}`, `{"auths": {"h": {"auth": "bm9jb2xvbg=="}}}`} {
		if _, err := parseDockerConfig([]byte(bad)); err == nil {
			t.Errorf("%s: no error", bad)
		}
	}
}

func TestCheckPEMAndRefName(t *testing.T) {
	if err := checkPEM(charttest.NewCA(t).PEM); err != nil {
		t.Error(err)
	}
	if err := checkPEM([]byte("hello")); err == nil || !strings.Contains(err.Error(), "no PEM certificate") {
		t.Errorf("not PEM: %v", err)
	}
	if err := checkPEM([]byte("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")); err == nil {
		t.Error("a broken certificate passed")
	}
	spec := map[string]any{"authSecret": map[string]any{"name": "creds"}, "repoCAConfigMap": "ca", "dockerRegistrySecret": map[string]any{}}
	if n, err := refName(spec, "authSecret"); n != "creds" || err != nil {
		t.Errorf("authSecret: %q %v", n, err)
	}
	if n, err := refName(spec, "absent"); n != "" || err != nil {
		t.Errorf("absent: %q %v", n, err)
	}
	for _, f := range []string{"repoCAConfigMap", "dockerRegistrySecret"} {
		if _, err := refName(spec, f); err == nil || !strings.Contains(err.Error(), "spec."+f+": give a reference {name: NAME}") {
			t.Errorf("%s: %v", f, err)
		}
	}
}
