package client

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
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
func (nopDP) SetServices(dataplane.Node, []dataplane.Service) error {
	return nil
}

// svcDP records the Service sets netd applies.
type svcDP struct {
	nopDP
	sets chan []dataplane.Service
}

func (d svcDP) SetServices(_ dataplane.Node, svcs []dataplane.Service) error {
	d.sets <- svcs
	return nil
}

func startServer(t *testing.T, allowed int) string {
	return startServerWith(t, allowed, nopDP{})
}

func startServerWith(t *testing.T, allowed int, dp dataplane.Dataplane) string {
	dir := t.TempDir()
	sock := filepath.Join(dir, "run", "netd.sock")
	srv, err := server.Start(server.Config{Socket: sock, StateFile: filepath.Join(dir, "state.json"), NetNSDir: filepath.Join(dir, "netns"),
		AllowedUID: allowed, NewDataplane: func() (dataplane.Dataplane, error) { return dp, nil },
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

// A set of 800 Service ports with 8 endpoints each does not fit in one
// frame: it goes in chunks and netd applies it once, whole and in order.
func TestSetServicesChunks(t *testing.T) {
	dp := svcDP{sets: make(chan []dataplane.Service, 4)}
	c := New(startServerWith(t, os.Getuid(), dp))
	ctx := context.Background()
	if err := c.SetServices(ctx, nil); !IsNotConfigured(err) {
		t.Fatalf("SetServices before Configure: %v", err)
	}
	if _, err := c.Configure(ctx, "100.64.0.0/24"); err != nil {
		t.Fatal(err)
	}
	var svcs []wire.ServicePort
	for i := range 800 {
		s := wire.ServicePort{Protocol: "TCP", IP: fmt.Sprintf("10.43.%d.%d", i/200, i%200+1), Port: 8080}
		for j := range 8 {
			s.Endpoints = append(s.Endpoints, wire.Endpoint{IP: fmt.Sprintf("100.64.0.%d", j+2), Port: uint16(9000 + j)})
		}
		svcs = append(svcs, s)
	}
	chunks, err := chunkServices(svcs)
	if err != nil || len(chunks) < 2 {
		t.Fatalf("%d chunks, %v: the set should need several", len(chunks), err)
	}
	if err := c.SetServices(ctx, svcs); err != nil {
		t.Fatal(err)
	}
	got := <-dp.sets
	if len(got) != len(svcs) || got[799].IP.String() != "10.43.3.200" || len(got[799].Endpoints) != 8 || got[799].Endpoints[7].Port() != 9007 {
		t.Fatalf("netd applied %d Service ports (last %+v), want 800", len(got), got[len(got)-1])
	}
	select {
	case extra := <-dp.sets:
		t.Fatalf("a second application of %d ports: chunks must be applied once, at the last", len(extra))
	default:
	}
	// An empty set is one empty final chunk.
	if err := c.SetServices(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if got := <-dp.sets; len(got) != 0 {
		t.Fatalf("empty set applied as %d ports", len(got))
	}
	// A chunk out of order is refused as a conflict, and nothing applied.
	raw := func(gen uint64, chunk int, final bool) error {
		_, err := c.do(ctx, &wire.Request{Verb: wire.VerbSetServices, SetServices: &wire.SetServicesArgs{Generation: gen, Chunk: chunk, Final: final}})
		return err
	}
	if err := raw(99, 1, true); !hasCode(err, wire.CodeConflict) {
		t.Fatalf("chunk 1 without chunk 0: %v", err)
	}
	if err := raw(100, 0, false); err != nil {
		t.Fatal(err)
	}
	if err := raw(101, 1, true); !hasCode(err, wire.CodeConflict) {
		t.Fatalf("chunk 1 of another generation: %v", err)
	}
	// Duplicates across chunks are the dataplane's to refuse; the wire
	// refuses them within one.
	dup := []wire.ServicePort{{Protocol: "UDP", IP: "10.43.0.10", Port: 53}, {Protocol: "UDP", IP: "10.43.0.10", Port: 53}}
	if err := c.SetServices(ctx, dup); !hasCode(err, wire.CodeInvalid) {
		t.Fatalf("duplicate Service port: %v", err)
	}
	select {
	case s := <-dp.sets:
		t.Fatalf("applied %d ports of refused requests", len(s))
	default:
	}
}
