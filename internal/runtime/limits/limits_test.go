package limits

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/k3sm-dev/k3sm/internal/runtime/cgroups"
)

func TestProtoRoundTrip(t *testing.T) {
	for _, s := range []cgroups.Support{
		{Version: cgroups.V2, Enforced: []string{cgroups.CPU, cgroups.Memory, cgroups.Pids}},
		{Version: cgroups.V1, Enforced: []string{cgroups.Memory}, Cause: cgroups.CauseNoController, Reason: "not available: cpu", Fix: "mount it"},
		{Cause: cgroups.CauseNotMounted, Reason: "nothing mounted", Fix: "mount cgroup2"},
	} {
		got := FromProto(Proto(s))
		if got.Version != s.Version || !slices.Equal(got.Enforced, s.Enforced) || got.Cause != s.Cause || got.Reason != s.Reason || got.Fix != s.Fix {
			t.Errorf("%+v came back %+v", s, got)
		}
	}
}

func TestImpairedAndUnenforced(t *testing.T) {
	all := cgroups.Support{Version: cgroups.V2, Enforced: []string{cgroups.CPU, cgroups.Memory, cgroups.Pids}}
	noPids := cgroups.Support{Version: cgroups.V2, Enforced: []string{cgroups.CPU, cgroups.Memory}}
	memOnly := cgroups.Support{Version: cgroups.V1, Enforced: []string{cgroups.Memory, cgroups.Pids}}
	for _, c := range []struct {
		goos       string
		s          cgroups.Support
		impaired   bool
		unenforced string
	}{
		{"linux", all, false, ""},
		{"linux", noPids, false, ""},
		{"linux", memOnly, true, "CPU limits"},
		{"linux", cgroups.Support{}, true, "CPU and memory limits"},
		{"darwin", cgroups.Support{Cause: cgroups.CauseNotLinux}, false, "CPU and memory limits"},
	} {
		if got := Impaired(c.goos, c.s); got != c.impaired {
			t.Errorf("%s %+v: impaired %v", c.goos, c.s, got)
		}
		if got := Unenforced(c.s); got != c.unenforced {
			t.Errorf("%+v: unenforced %q, want %q", c.s, got, c.unenforced)
		}
	}
}

// Nothing at the socket, or a socket nobody listens on: no runtime runs,
// and Ask falls back to Detect. Something else answering is not a
// runtime's report: Detect too, with the error.
func TestAskWithoutRuntime(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dir, err := os.MkdirTemp("", "k3sm-limits")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	missing := filepath.Join(dir, "none.sock")
	detected := cgroups.Detect(cgroups.Options{})
	r := Ask(ctx, missing)
	if r.FromRuntime || r.AskErr != nil || r.OS != runtime.GOOS || r.Version != detected.Version || !slices.Equal(r.Enforced, detected.Enforced) {
		t.Errorf("no socket: %+v, want Detect's %+v", r, detected)
	}
	if _, _, err := FromRuntime(ctx, missing); !errors.Is(err, ErrNotRunning) {
		t.Errorf("FromRuntime without a socket: %v", err)
	}

	stale := filepath.Join(dir, "stale.sock")
	ln := listenUnix(t, stale)
	ln.SetUnlinkOnClose(false)
	ln.Close()
	if r := Ask(ctx, stale); r.FromRuntime || r.AskErr != nil {
		t.Errorf("a socket left by a dead runtime: %+v", r)
	}

	// Accepts and hangs up: no gRPC there.
	other := filepath.Join(dir, "other.sock")
	ln = listenUnix(t, other)
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	short, cancelShort := context.WithTimeout(ctx, 2*time.Second)
	defer cancelShort()
	if r := Ask(short, other); r.FromRuntime || r.AskErr == nil {
		t.Errorf("something else at the socket: %+v, want an AskErr", r)
	}
}

// listenUnix listens on a unix socket at path.
func listenUnix(t *testing.T, path string) *net.UnixListener {
	t.Helper()
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	return ln
}
