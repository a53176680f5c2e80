package client

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/k3sm-dev/k3sm/internal/netd/dataplane"
	"github.com/k3sm-dev/k3sm/internal/netd/server"
	"github.com/k3sm-dev/k3sm/internal/netd/wire"
)

const uid = "0b7a3f2e-5c1d-4e8f-9a6b-1c2d3e4f5a6b"

// nopDP accepts everything: the server's own tests hold the strict fake;
// here only the client's side of the exchange is under test.
type nopDP struct{}

func (nopDP) EnsureNode(dataplane.Node) error            { return nil }
func (nopDP) AddPod(dataplane.Node, dataplane.Pod) error { return nil }
func (nopDP) DelPod(dataplane.Pod) error                 { return nil }
func (nopDP) SetPolicy(dataplane.Node, dataplane.Pod, dataplane.Policy) error {
	return nil
}
func (nopDP) Inventory(dataplane.Node) (dataplane.Inventory, error) {
	return dataplane.Inventory{}, nil
}
func (nopDP) DelNode(dataplane.Node) error { return nil }

func startServer(t *testing.T, allowed int) string {
	dir := t.TempDir()
	sock := filepath.Join(dir, "run", "netd.sock")
	srv, err := server.Start(server.Config{Socket: sock, StateFile: filepath.Join(dir, "state.json"), NetNSDir: filepath.Join(dir, "netns"),
		AllowedUID: allowed, NewDataplane: func() (dataplane.Dataplane, error) { return nopDP{}, nil },
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	return sock
}

func TestClient(t *testing.T) {
	c := New(startServer(t, os.Getuid()))
	ctx := context.Background()
	if _, err := c.SetupPod(ctx, uid, "default", "web"); !IsNotConfigured(err) {
		t.Fatalf("got %v", err)
	}
	node, err := c.Configure(ctx, "100.64.0.0/24")
	if err != nil || node != (wire.NodeResult{PodCIDR: "100.64.0.0/24", Gateway: "100.64.0.1", Bridge: "k3sm0"}) {
		t.Fatalf("%+v %v", node, err)
	}
	p, err := c.SetupPod(ctx, uid, "default", "web")
	if err != nil || p.IP != "100.64.0.2" || p.PrefixLen != 24 || p.Gateway != "100.64.0.1" {
		t.Fatalf("%+v %v", p, err)
	}
	pods, err := c.ListPods(ctx)
	if err != nil || len(pods) != 1 || pods[0] != p {
		t.Fatalf("%+v %v", pods, err)
	}
	if err := c.SetPolicy(ctx, wire.SetPolicyArgs{UID: uid, Ingress: wire.PolicyDirection{Isolated: true}}); err != nil {
		t.Fatal(err)
	}
	if err := c.SetPolicy(ctx, wire.SetPolicyArgs{UID: uid, Ingress: wire.PolicyDirection{Rules: []wire.PolicyRule{{}}}}); err == nil {
		t.Fatal("SetPolicy sent rules without isolation")
	}
	if err := c.TeardownPod(ctx, uid); err != nil {
		t.Fatal(err)
	}
	if err := c.TeardownPod(ctx, uid); !IsNotFound(err) {
		t.Fatalf("got %v", err)
	}
	if err := c.SetPolicy(ctx, wire.SetPolicyArgs{UID: uid}); !IsNotFound(err) {
		t.Fatalf("SetPolicy of a pod without a network: %v", err)
	}
	if pods, err := c.ListPods(ctx); err != nil || len(pods) != 0 {
		t.Fatalf("%+v %v", pods, err)
	}
}

func TestClientErrorsCarryCode(t *testing.T) {
	ctx := context.Background()
	c := New(startServer(t, os.Getuid()))
	var e *Error
	// Refused before sending.
	if _, err := c.Configure(ctx, "127.0.0.0/16"); !errors.As(err, &e) || e.Code != wire.CodeInvalid {
		t.Fatalf("got %v", err)
	}
	c.Configure(ctx, "100.64.0.0/24")
	c.SetupPod(ctx, uid, "default", "web")
	if _, err := c.Configure(ctx, "100.65.0.0/24"); !errors.As(err, &e) || e.Code != wire.CodeConflict || IsNotFound(err) {
		t.Fatalf("got %v", err)
	}
	denied := New(startServer(t, 4242))
	if _, err := denied.ListPods(ctx); !errors.As(err, &e) || e.Code != wire.CodeDenied {
		t.Fatalf("got %v", err)
	}
	if _, err := New(filepath.Join(t.TempDir(), "none.sock")).ListPods(ctx); err == nil {
		t.Fatal("no error without a netd")
	}
}

// A netd that never answers: the caller's deadline and cancellation end
// the call.
func TestClientHonoursContext(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "mute.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	c := New(sock)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	if _, err := c.ListPods(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v", err)
	}
	ctx, cancel = context.WithCancel(context.Background())
	time.AfterFunc(50*time.Millisecond, cancel)
	if _, err := c.ListPods(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("took %v", d)
	}
}

// A response from another protocol version is refused.
func TestClientRefusesOtherVersion(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "old.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		wire.ReadRequest(c)
		body := `{"version":2}`
		c.Write(append(binary.BigEndian.AppendUint32(nil, uint32(len(body))), body...))
	}()
	if _, err := New(sock).ListPods(context.Background()); !errors.Is(err, wire.ErrMalformed) {
		t.Fatalf("got %v", err)
	}
}
