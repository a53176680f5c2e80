package docker

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func TestEnvLines(t *testing.T) {
	if got := EnvLines("unix:///Users/dev/.klimax.docker.sock", false); got != "export DOCKER_HOST=unix:///Users/dev/.klimax.docker.sock\n" {
		t.Errorf("got %q", got)
	}
	if got := EnvLines("unix:///Users/my dev/x.sock", false); got != "export DOCKER_HOST='unix:///Users/my dev/x.sock'\n" {
		t.Errorf("got %q", got)
	}
	if got := EnvLines("", true); got != "unset DOCKER_HOST\n" {
		t.Errorf("got %q", got)
	}
}

// TestContextStoreWithDockerCLI writes a context and lets the real docker
// CLI read it back (its own store code), then unsets it; other config.json
// keys survive.
func TestContextStoreWithDockerCLI(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "config.json"), []byte(`{"auths":{"example.test":{"auth":"eDp5"}},"detachKeys":"ctrl-x"}`), 0o600)
	s := ContextStore{Dir: dir}
	host := "unix:///tmp/klimax-test.docker.sock"
	if err := s.Set("klimax-test", host, "klimax test engine"); err != nil {
		t.Fatal(err)
	}
	if cur, _ := s.Current(); cur != "klimax-test" {
		t.Fatalf("current = %q", cur)
	}
	if h, _ := s.Get("klimax-test"); h != host {
		t.Fatalf("get = %q", h)
	}
	// Set again: idempotent.
	if err := s.Set("klimax-test", host, "klimax test engine"); err != nil {
		t.Fatal(err)
	}

	if docker, err := exec.LookPath("docker"); err == nil {
		cmd := exec.Command(docker, "context", "ls", "--format", "{{.Name}}|{{.Current}}|{{.DockerEndpoint}}|{{.Description}}")
		cmd.Env = append(os.Environ(), "DOCKER_CONFIG="+dir)
		cmd.Env = filterEnv(cmd.Env, "DOCKER_HOST", "DOCKER_CONTEXT")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("docker context ls: %v\n%s", err, out)
		}
		if !strings.Contains(string(out), "klimax-test|true|"+host+"|klimax test engine") {
			t.Fatalf("docker CLI does not see the context as current:\n%s", out)
		}
	} else {
		t.Log("docker CLI not installed: store format checked by our reader only")
	}

	removed, err := s.Unset("klimax-test")
	if err != nil || !removed {
		t.Fatalf("unset = %v, %v", removed, err)
	}
	if cur, _ := s.Current(); cur != "" {
		t.Fatalf("current after unset = %q", cur)
	}
	if removed, err := s.Unset("klimax-test"); err != nil || removed {
		t.Fatalf("second unset = %v, %v", removed, err)
	}
	var cfg map[string]json.RawMessage
	data, _ := os.ReadFile(filepath.Join(dir, "config.json"))
	if err := json.Unmarshal(data, &cfg); err != nil || cfg["auths"] == nil || string(cfg["detachKeys"]) != `"ctrl-x"` {
		t.Fatalf("config.json lost keys: %s", data)
	}
}

func TestContextStoreRefusesBrokenConfig(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "config.json"), []byte(`{not json`), 0o600)
	s := ContextStore{Dir: dir}
	if err := s.Set("klimax", "unix:///x.sock", ""); err == nil {
		t.Fatal("broken config.json overwritten")
	}
	if data, _ := os.ReadFile(filepath.Join(dir, "config.json")); string(data) != "{not json" {
		t.Fatal("broken config.json was changed")
	}
	if _, err := os.Stat(filepath.Join(dir, "contexts")); !os.IsNotExist(err) {
		t.Fatal("context written although config.json is broken")
	}
}

func filterEnv(env []string, drop ...string) []string {
	var out []string
	for _, e := range env {
		keep := true
		for _, d := range drop {
			if strings.HasPrefix(e, d+"=") {
				keep = false
			}
		}
		if keep {
			out = append(out, e)
		}
	}
	return out
}
