package vm

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	goldenfile "github.com/k3sm-dev/k3sm/internal/golden"
)

func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	goldenfile.Check(t, name, got)
}

func testSpec() LimaSpec {
	return LimaSpec{
		Name: "klimax", CPUs: 4, Memory: "10GiB", Disk: "40GiB", Rosetta: true,
		DisablePortMirroring: true,
		DockerSocket:         "/Users/dev/.klimax.docker.sock",
		CacheDir:             "/Users/dev/.klimax/registry-cache",
		ProvisionScript:      "#!/bin/bash\necho provision\n",
	}
}

func TestRenderLimaYAMLGolden(t *testing.T) {
	got, err := RenderLimaYAML(testSpec())
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "lima-full.yaml", got)

	s := testSpec()
	s.Rosetta, s.DisablePortMirroring, s.CacheDir, s.ProvisionScript = false, false, "", ""
	got, err = RenderLimaYAML(s)
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "lima-minimal.yaml", got)
}

func TestRenderLimaYAMLRefusesIncompleteSpec(t *testing.T) {
	for _, mod := range []func(*LimaSpec){
		func(s *LimaSpec) { s.Name = "" },
		func(s *LimaSpec) { s.CPUs = 0 },
		func(s *LimaSpec) { s.DockerSocket = "relative.sock" },
		func(s *LimaSpec) { s.CacheDir = "cache" },
	} {
		s := testSpec()
		mod(&s)
		if _, err := RenderLimaYAML(s); err == nil {
			t.Errorf("spec %+v accepted", s)
		}
	}
}

// fakeLimactl builds the recording fake and returns a driver using it plus
// a func returning the recorded invocations (argv without the binary).
func fakeLimactl(t *testing.T) (*Lima, func() [][]string) {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, "limactl")
	cmd := exec.Command("go", "build", "-o", bin, "./fakelimactl")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build fake limactl: %v\n%s", err, out)
	}
	// First on PATH, as the real limactl would be.
	t.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
	logPath := filepath.Join(dir, "calls.log")
	t.Setenv("FAKE_LIMACTL_LOG", logPath)
	t.Setenv("FAKE_LIMACTL_STATE", filepath.Join(dir, "state.json"))
	l := NewLima(testSpec(), filepath.Join(dir, "state"))
	read := func() [][]string {
		f, err := os.Open(logPath)
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		var calls [][]string
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			var argv []string
			if err := json.Unmarshal(sc.Bytes(), &argv); err != nil {
				t.Fatal(err)
			}
			calls = append(calls, argv)
		}
		os.Remove(logPath)
		return calls
	}
	return l, read
}

func expectCalls(t *testing.T, what string, got [][]string, want ...string) {
	t.Helper()
	var g []string
	for _, c := range got {
		g = append(g, strings.Join(c, " "))
	}
	if !reflect.DeepEqual(g, want) && !(len(g) == 0 && len(want) == 0) {
		t.Fatalf("%s: limactl calls\n got: %q\nwant: %q", what, g, want)
	}
}

func TestLimaLifecycleCommandSequence(t *testing.T) {
	l, calls := fakeLimactl(t)
	ctx := context.Background()
	yamlPath := l.YAMLPath()

	// up on a fresh machine: create from the rendered YAML, then start.
	changed, err := l.Ensure(ctx)
	if err != nil || !changed {
		t.Fatalf("first Ensure = %v, %v", changed, err)
	}
	expectCalls(t, "up", calls(),
		"list --json",
		"create --name=klimax --tty=false "+yamlPath,
		"start --tty=false klimax")
	written, _ := os.ReadFile(yamlPath)
	want, _ := RenderLimaYAML(testSpec())
	if string(written) != string(want) {
		t.Fatal("create was given a YAML other than the rendered one")
	}

	// up again: only a read.
	changed, err = l.Ensure(ctx)
	if err != nil || changed {
		t.Fatalf("second Ensure = %v, %v; want no change", changed, err)
	}
	expectCalls(t, "up twice", calls(), "list --json")

	st, err := l.Status(ctx)
	if err != nil || st.Phase != PhaseRunning || !strings.Contains(st.Detail, "vz aarch64, 4 CPUs, 10.0 GiB") {
		t.Fatalf("status = %+v, %v", st, err)
	}
	expectCalls(t, "status", calls(), "list --json")

	// The lima0 address is read from the guest at run time.
	addr, err := l.HostAddress(ctx)
	if err != nil || addr.String() != "192.168.105.7" {
		t.Fatalf("HostAddress = %v, %v", addr, err)
	}
	expectCalls(t, "host address", calls(), "shell --workdir=/ klimax ip -4 -j addr show dev lima0")

	// down, and down again.
	if err := l.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	expectCalls(t, "down", calls(), "list --json", "stop klimax")
	if err := l.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	expectCalls(t, "down twice", calls(), "list --json")

	// up after down: start only, no create.
	if changed, err := l.Ensure(ctx); err != nil || !changed {
		t.Fatalf("Ensure after down = %v, %v", changed, err)
	}
	expectCalls(t, "up after down", calls(), "list --json", "start --tty=false klimax")

	// destroy, and destroy again.
	if err := l.Delete(ctx); err != nil {
		t.Fatal(err)
	}
	expectCalls(t, "destroy", calls(), "list --json", "delete --force klimax")
	if _, err := os.Stat(yamlPath); !errors.Is(err, os.ErrNotExist) {
		t.Error("destroy left the rendered YAML behind")
	}
	if err := l.Delete(ctx); err != nil {
		t.Fatal(err)
	}
	expectCalls(t, "destroy twice", calls(), "list --json")
	if st, _ := l.Status(ctx); st.Phase != PhaseAbsent {
		t.Fatalf("after destroy phase = %s", st.Phase)
	}
}

func TestLimaRunRootTimeoutCancelAndFailure(t *testing.T) {
	l, calls := fakeLimactl(t)
	l.LogLevel = "debug"
	ctx := context.Background()
	if _, err := l.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	calls()

	res, err := l.Run(ctx, []string{"echo", "hello world"}, RunOptions{Root: true})
	if err != nil || strings.TrimSpace(string(res.Stdout)) != "hello world" {
		t.Fatalf("Run = %q, %v", res.Stdout, err)
	}
	expectCalls(t, "root run", calls(), "--log-level=debug shell --workdir=/ klimax sudo -n -- echo hello world")

	res, err = l.Run(ctx, []string{"bash", "-s"}, RunOptions{Stdin: strings.NewReader("script body\n")})
	if err != nil || string(res.Stdout) != "script body\n" {
		t.Fatalf("stdin not passed: %q, %v", res.Stdout, err)
	}

	start := time.Now()
	_, err = l.Run(ctx, []string{"sleep", "20"}, RunOptions{Timeout: 300 * time.Millisecond})
	if !errors.Is(err, ErrTimeout) || time.Since(start) > 10*time.Second {
		t.Fatalf("timeout: err = %v after %s", err, time.Since(start))
	}

	cctx, cancel := context.WithCancel(ctx)
	time.AfterFunc(200*time.Millisecond, cancel)
	_, err = l.Run(cctx, []string{"sleep", "20"}, RunOptions{})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("cancel: err = %v", err)
	}

	_, err = l.Run(ctx, []string{"false"}, RunOptions{})
	var ee *ExitError
	if !errors.As(err, &ee) || ee.ExitCode != 1 || !strings.Contains(ee.Error(), "guest command failed") {
		t.Fatalf("failure: err = %v", err)
	}
}

func TestLimaBrokenInstanceIsRefused(t *testing.T) {
	l, _ := fakeLimactl(t)
	os.WriteFile(os.Getenv("FAKE_LIMACTL_STATE"), []byte(`{"klimax":{"name":"klimax","status":"Broken"}}`), 0o644)
	if _, err := l.Ensure(context.Background()); err == nil || !strings.Contains(err.Error(), "broken") {
		t.Fatalf("Ensure on a broken instance: %v", err)
	}
}

func TestParseIfacePrefix(t *testing.T) {
	out := []byte(`[{"ifindex":1,"ifname":"lo","addr_info":[{"family":"inet","local":"127.0.0.1","prefixlen":8,"scope":"host"}]},
{"ifindex":3,"ifname":"lima0","addr_info":[{"family":"inet","local":"192.168.64.3","prefixlen":24,"scope":"global","dynamic":true}]}]`)
	p, err := ParseIfacePrefix(out, "lima0")
	if err != nil || p.String() != "192.168.64.3/24" {
		t.Fatalf("got %v, %v", p, err)
	}
	if _, err := ParseIfacePrefix(out, "eth9"); err == nil {
		t.Fatal("missing interface accepted")
	}
	if _, err := ParseIfacePrefix([]byte("not json"), "lima0"); err == nil {
		t.Fatal("garbage accepted")
	}
}

func TestParseLimaList(t *testing.T) {
	ndjson := []byte(`{"name":"other","status":"Running"}
{"name":"klimax","status":"Stopped","vmType":"vz","cpus":4}
`)
	in, err := parseLimaList(ndjson, "klimax")
	if err != nil || in == nil || in.Status != "Stopped" || in.CPUs != 4 {
		t.Fatalf("ndjson: %+v, %v", in, err)
	}
	in, err = parseLimaList([]byte(`[{"name":"klimax","status":"Running"}]`), "klimax")
	if err != nil || in == nil || in.Status != "Running" {
		t.Fatalf("array: %+v, %v", in, err)
	}
	if in, err := parseLimaList(nil, "klimax"); err != nil || in != nil {
		t.Fatalf("empty: %+v, %v", in, err)
	}
}

func TestHostRunTimeoutAndExit(t *testing.T) {
	h := NewHost()
	_, err := h.Run(context.Background(), []string{"sleep", "20"}, RunOptions{Timeout: 200 * time.Millisecond})
	if !errors.Is(err, ErrTimeout) {
		t.Fatalf("err = %v", err)
	}
	_, err = h.Run(context.Background(), []string{"sh", "-c", "echo oops >&2; exit 3"}, RunOptions{})
	var ee *ExitError
	if !errors.As(err, &ee) || ee.ExitCode != 3 || ee.Stderr != "oops\n" {
		t.Fatalf("err = %v", err)
	}
	a, _ := h.HostAddress(context.Background())
	if a.String() != "127.0.0.1" || h.NeedsRoute() {
		t.Fatal(fmt.Sprint("host driver address/route: ", a))
	}
}
