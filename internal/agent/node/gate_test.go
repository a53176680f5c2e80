package node

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/k3sm-dev/k3sm/internal/pki"
	"github.com/k3sm-dev/k3sm/internal/roleconfig"
	"github.com/k3sm-dev/k3sm/internal/testutil/poll"
)

// A node started with a closed gate makes no API request and serves no
// kubelet API until the server opens the gate; then it goes on at once.
func TestNodeWaitsAtItsStartGate(t *testing.T) {
	dir := t.TempDir()
	var mu sync.Mutex
	var requests []string
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		requests = append(requests, r.Method+" "+r.URL.Path)
		mu.Unlock()
		http.Error(w, "not here", http.StatusServiceUnavailable)
	}))
	defer api.Close()
	kc := filepath.Join(dir, "node.kubeconfig")
	if err := os.WriteFile(kc, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "`+api.URL+`"}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
users: [{name: u, user: {}}]
current-context: c
`), 0o600); err != nil {
		t.Fatal(err)
	}
	ca, err := pki.LoadOrCreateCA(dir, "ca", "test-ca")
	if err != nil {
		t.Fatal(err)
	}
	serving, err := ca.Ensure(dir, "serving", pki.LeafSpec{CommonName: "n1", IPs: []net.IP{net.IPv4(127, 0, 0, 1)}, Server: true})
	if err != nil {
		t.Fatal(err)
	}
	// A free loopback port for the kubelet API, to see it is not served early.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	gate := filepath.Join(dir, "gate")
	cfg := Config{NodeConfig: roleconfig.NodeConfig{Name: "n1", IP: "127.0.0.1", KubeletPort: port, Kubeconfig: kc,
		ServingCert: serving.CertPath, ServingKey: serving.KeyPath, ClientCAFile: ca.CertPath,
		RuntimeSocket: filepath.Join(dir, "runtime.sock"), Instant: true, StartGate: gate},
		Log: slog.New(slog.NewTextHandler(os.Stderr, nil))}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, cfg) }()
	defer func() {
		cancel()
		<-done
	}()

	time.Sleep(500 * time.Millisecond)
	mu.Lock()
	early := len(requests)
	mu.Unlock()
	if early != 0 {
		t.Fatalf("the node used the API before its gate opened: %v", requests)
	}
	if c, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port))); err == nil {
		c.Close()
		t.Fatal("the kubelet API is served before the gate opened")
	}
	select {
	case err := <-done:
		t.Fatalf("the node returned before its gate opened: %v", err)
	default:
	}

	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 10*time.Second, "an API request once the gate opened", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(requests) > 0
	})
}

// Cancelling a node waiting at its gate ends it without error.
func TestStartGateCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- waitStartGate(ctx, filepath.Join(t.TempDir(), "gate")) }()
	time.Sleep(50 * time.Millisecond)
	select {
	case err := <-done:
		t.Fatalf("returned with no gate: %v", err)
	default:
	}
	cancel()
	if err := <-done; err == nil {
		t.Fatal("cancelled wait returned nil")
	}
}
