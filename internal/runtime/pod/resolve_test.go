package pod

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	runtimev1 "github.com/k3sm-dev/k3sm/api/runtime/v1"
	"github.com/k3sm-dev/k3sm/internal/runtime/image"
)

func TestExpand(t *testing.T) {
	vars := map[string]string{"A": "1", "B": "two"}
	for in, want := range map[string]string{
		"x$(A)y": "x1y", "$(B)$(A)": "two1", "$$(A)": "$(A)", "$(C)": "$(C)", "a$": "a$", "$(A": "$(A", "$x": "$x",
	} {
		if got := expand(in, vars); got != want {
			t.Errorf("expand(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestResolveProcess(t *testing.T) {
	root := t.TempDir()
	os.MkdirAll(filepath.Join(root, "app"), 0o755)
	os.WriteFile(filepath.Join(root, "app", "server"), []byte("#!/bin/sh\n"), 0o755)
	img := &image.Image{Config: v1.Config{Entrypoint: []string{"/app/server"}, Cmd: []string{"--default"},
		Env: []string{"PATH=/app:/usr/bin:/bin", "FOO=img"}, WorkingDir: "/app"}}
	pod := &runtimev1.PodSpec{Name: "web", Namespace: "ns"}

	// Image entrypoint + cmd, root mapping, env order and expansion.
	c := &runtimev1.ContainerSpec{Name: "c", Env: []*runtimev1.EnvVar{{Name: "FOO", Value: "ctr"}, {Name: "BAR", Value: "$(FOO)-x"}}}
	r, err := resolveProcess(pod, c, img, root, false)
	if err != nil {
		t.Fatal(err)
	}
	if r.Argv[0] != filepath.Join(root, "app/server") || r.Argv[1] != "--default" || r.Dir != filepath.Join(root, "app") {
		t.Errorf("resolved %+v", r)
	}
	env := strings.Join(r.Env, "\n")
	for _, want := range []string{"FOO=ctr", "BAR=ctr-x", "HOSTNAME=web", "K3SM_ROOT=" + root,
		"PATH=" + filepath.Join(root, "app") + ":/app:/usr/bin:/bin:/usr/local/sbin"} {
		if !strings.Contains(env, want) {
			t.Errorf("env lacks %q:\n%s", want, env)
		}
	}

	// args only: entrypoint + args. A bare name found in the root's PATH.
	c = &runtimev1.ContainerSpec{Args: []string{"a"}}
	r, _ = resolveProcess(pod, c, img, root, false)
	if strings.Join(r.Argv[1:], " ") != "a" {
		t.Errorf("args-only argv %v", r.Argv)
	}
	c = &runtimev1.ContainerSpec{Command: []string{"server"}, WorkingDir: "/data/work"}
	r, err = resolveProcess(pod, c, img, root, false)
	if err != nil || r.Argv[0] != filepath.Join(root, "app/server") || len(r.Argv) != 1 {
		t.Errorf("bare command: %v %v", r.Argv, err)
	}
	if fi, err := os.Stat(filepath.Join(root, "data/work")); err != nil || !fi.IsDir() || r.Dir != filepath.Join(root, "data/work") {
		t.Errorf("workingDir not created in the root: %v", err)
	}
	// An absolute command absent from the root runs from the host.
	c = &runtimev1.ContainerSpec{Command: []string{"/bin/sh", "-c", "true"}}
	if r, err = resolveProcess(pod, c, img, root, false); err != nil || r.Argv[0] != "/bin/sh" {
		t.Errorf("host command: %v %v", r.Argv, err)
	}
	// Host tools found through the host part of PATH.
	c = &runtimev1.ContainerSpec{Command: []string{"sh"}}
	if r, err = resolveProcess(pod, c, img, root, false); err != nil || !strings.HasSuffix(r.Argv[0], "/sh") {
		t.Errorf("sh via PATH: %v %v", r.Argv, err)
	}
	c = &runtimev1.ContainerSpec{Command: []string{"/no/such"}}
	if _, err = resolveProcess(pod, c, img, root, false); err == nil || !strings.Contains(err.Error(), "executable file not found") {
		t.Errorf("missing command: %v", err)
	}

	// native
	c = &runtimev1.ContainerSpec{Image: "native", Command: []string{"/bin/echo", "hi"}}
	if r, err = resolveProcess(pod, c, nil, root, false); err != nil || r.Argv[0] != "/bin/echo" || r.Dir != root {
		t.Errorf("native: %+v %v", r, err)
	}
	c = &runtimev1.ContainerSpec{Image: "native"}
	if _, err = resolveProcess(pod, c, nil, root, false); err == nil || !strings.Contains(err.Error(), "needs a command") {
		t.Errorf("native without command: %v", err)
	}
	c = &runtimev1.ContainerSpec{Image: "native", Command: []string{"/bin/true"}, WorkingDir: "/no/such/dir"}
	if _, err = resolveProcess(pod, c, nil, root, false); err == nil || !strings.Contains(err.Error(), "workingDir") {
		t.Errorf("native missing workingDir: %v", err)
	}
}

// TestResolveVerbatimEnv: verbatim variables (a current provider's) reach the
// process byte for byte; command and args still expand from them. Variables
// without the flag (an older provider's) expand as before.
func TestResolveVerbatimEnv(t *testing.T) {
	root := t.TempDir()
	pod := &runtimev1.PodSpec{Name: "web", Namespace: "ns"}
	img := &image.Image{Config: v1.Config{Entrypoint: []string{"/bin/echo", "$(PW)"}}}
	c := &runtimev1.ContainerSpec{Name: "c", Command: []string{"/bin/echo", "$(PW)", "$$(PW)"}, Args: []string{"$(LIT)", "$(NOPE)"},
		Env: []*runtimev1.EnvVar{
			{Name: "PW", Value: "pa$$w0rd", Verbatim: true},
			{Name: "HOMEX", Value: "$(HOME)x", Verbatim: true},
			{Name: "OTHER", Value: "$(PW)", Verbatim: true},
			{Name: "LIT", Value: "v-$", Verbatim: true},
			{Name: "OLD", Value: "$(LIT)$$"},
		}}
	r, err := resolveProcess(pod, c, img, root, false)
	if err != nil {
		t.Fatal(err)
	}
	env := "\n" + strings.Join(r.Env, "\n") + "\n"
	for _, want := range []string{"PW=pa$$w0rd", "HOMEX=$(HOME)x", "OTHER=$(PW)", "LIT=v-$", "OLD=v-$$"} {
		if !strings.Contains(env, "\n"+want+"\n") {
			t.Errorf("env lacks %q:%s", want, env)
		}
	}
	if got := strings.Join(r.Argv, " "); got != "/bin/echo pa$$w0rd $(PW) v-$ $(NOPE)" {
		t.Errorf("argv %q", got)
	}
	// The image's Entrypoint and Cmd are not expanded (the kubelet expands
	// only the container's command and args).
	c.Command = nil
	if r, err = resolveProcess(pod, c, img, root, false); err != nil || strings.Join(r.Argv, " ") != "/bin/echo $(PW) v-$ $(NOPE)" {
		t.Errorf("entrypoint + args: %q %v", r.Argv, err)
	}
}

// TestDefinitionChanged: with hashes, only the hash decides; without, the
// resolved fields as before.
func TestDefinitionChanged(t *testing.T) {
	env := func(v string, verbatim bool) []*runtimev1.EnvVar {
		return []*runtimev1.EnvVar{{Name: "L", Value: v, Verbatim: verbatim}}
	}
	spec := func(img, hash string, e []*runtimev1.EnvVar) *runtimev1.ContainerSpec {
		return &runtimev1.ContainerSpec{Name: "c", Image: img, DefinitionHash: hash, Env: e, Command: []string{"/bin/sleep"}}
	}
	for _, tc := range []struct {
		name string
		a, b *runtimev1.ContainerSpec
		want bool
	}{
		{"env only, same hash", spec("i:1", "h1", env("1", true)), spec("i:1", "h1", env("2", true)), false},
		{"new image, new hash", spec("i:1", "h1", env("1", true)), spec("i:2", "h2", env("1", true)), true},
		{"old client: env", spec("i:1", "", env("1", false)), spec("i:1", "", env("2", false)), true},
		{"old client: same", spec("i:1", "", env("1", false)), spec("i:1", "", env("1", false)), false},
		{"old client: image", spec("i:1", "", env("1", false)), spec("i:2", "", env("1", false)), true},
		{"adopted from an old client: env", spec("i:1", "", env("1", false)), spec("i:1", "h1", env("2", true)), false},
		{"adopted from an old client: image", spec("i:1", "", env("1", false)), spec("i:2", "h2", env("1", true)), true},
	} {
		if got := definitionChanged(tc.a, tc.b); got != tc.want {
			t.Errorf("%s: definitionChanged = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// An image without Entrypoint or Cmd (`crane append` of a bare layer) runs
// only with the container's command; without one the error says what is
// missing, and docs/runtime.md names the `crane mutate --entrypoint` fix.
func TestResolveImageWithoutEntrypoint(t *testing.T) {
	root := t.TempDir()
	os.MkdirAll(filepath.Join(root, "app"), 0o755)
	os.WriteFile(filepath.Join(root, "app", "server"), []byte("#!/bin/sh\n"), 0o755)
	img := &image.Image{}
	pod := &runtimev1.PodSpec{Name: "web", Namespace: "ns"}
	_, err := resolveProcess(pod, &runtimev1.ContainerSpec{Name: "c", Image: "127.0.0.1:5000/app:v1"}, img, root, false)
	if err == nil || !strings.Contains(err.Error(), `image "127.0.0.1:5000/app:v1" has no Entrypoint or Cmd and the container sets no command`) {
		t.Fatalf("no command anywhere: %v", err)
	}
	r, err := resolveProcess(pod, &runtimev1.ContainerSpec{Name: "c", Command: []string{"/app/server"}}, img, root, false)
	if err != nil || r.Argv[0] != filepath.Join(root, "app/server") {
		t.Fatalf("the container's command: %v %v", r.Argv, err)
	}
}
