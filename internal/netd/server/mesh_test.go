package server

import (
	"bytes"
	"crypto/ecdh"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io/fs"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/k3sm-dev/k3sm/internal/netd/dataplane"
	"github.com/k3sm-dev/k3sm/internal/netd/wire"
	"github.com/k3sm-dev/k3sm/internal/testutil/syncbuf"
)

// startLogged starts e's server logging into the returned buffer.
func (e *env) startLogged(t *testing.T) (*Server, *syncbuf.Buffer) {
	t.Helper()
	logs := &syncbuf.Buffer{}
	cfg := e.config(os.Getuid())
	cfg.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	srv, err := Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	e.srv = srv
	t.Cleanup(func() { srv.Close() })
	return srv, logs
}

func configureMesh(t *testing.T, sock, ref string) *wire.Response {
	return call(t, sock, wire.Request{Verb: wire.VerbConfigureMesh, ConfigureMesh: &wire.ConfigureMeshArgs{KeyRef: ref, ListenPort: 51820}})
}

func setPeers(t *testing.T, sock string, peers ...wire.MeshPeer) *wire.Response {
	return call(t, sock, wire.Request{Verb: wire.VerbSetMeshPeers, SetMeshPeers: &wire.SetMeshPeersArgs{Peers: peers}})
}

func meshStatus(t *testing.T, sock string) *wire.Response {
	return call(t, sock, wire.Request{Verb: wire.VerbMeshStatus})
}

func removeMesh(t *testing.T, sock string) *wire.Response {
	return call(t, sock, wire.Request{Verb: wire.VerbRemoveMesh})
}

func configureCluster(t *testing.T, sock string) {
	t.Helper()
	ok(t, call(t, sock, wire.Request{Verb: wire.VerbConfigure, Configure: &wire.ConfigureArgs{PodCIDR: "100.64.0.0/24",
		ServiceCIDR: "10.43.0.0/16", ClusterCIDR: "100.64.0.0/16"}}))
}

func testPeer(i byte) wire.MeshPeer {
	return wire.MeshPeer{PublicKey: base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{i}, 32)),
		Endpoint: netip.AddrPortFrom(netip.AddrFrom4([4]byte{192, 0, 2, i}), 51820).String(),
		PodCIDR:  netip.PrefixFrom(netip.AddrFrom4([4]byte{100, 64, i, 0}), 24).String()}
}

func (e *env) keyFile(ref string) string {
	return filepath.Join(e.dir, "agent", "mesh-keys", ref+".key")
}

// The private key's spellings a leak would use.
func keySpellings(k dataplane.PrivateKey) []string {
	arr := [32]byte(k)
	js, _ := json.Marshal(arr) // [1,2,...]
	return []string{base64.StdEncoding.EncodeToString(k[:]), base64.RawStdEncoding.EncodeToString(k[:]), hex.EncodeToString(k[:]), string(k[:]),
		fmt.Sprint(arr), string(js)}
}

// ConfigureMesh makes the node's key in a private file of a private
// directory, hands it to the device, and answers with the public key
// only; the same KeyRef keeps the key, another makes another.
func TestConfigureMeshKey(t *testing.T) {
	e := newEnv(t)
	_, logs := e.startLogged(t)
	configureCluster(t, e.sock)
	res := ok(t, configureMesh(t, e.sock, "node-a")).Mesh
	if res == nil || res.Device != dataplane.MeshDevice || res.ListenPort != 51820 || res.MTU != wire.MeshMTU || len(res.Peers) != 0 {
		t.Fatalf("ConfigureMesh = %+v", res)
	}
	dir := filepath.Dir(e.keyFile("node-a"))
	for path, want := range map[string]fs.FileMode{dir: fs.ModeDir | 0o700, e.keyFile("node-a"): 0o600} {
		fi, err := os.Lstat(path)
		if err != nil || fi.Mode() != want {
			t.Errorf("%s: %v %v, want mode %v", path, fi.Mode(), err, want)
		}
	}
	m, _, up := e.dp.meshState()
	if !up {
		t.Fatal("no mesh device after ConfigureMesh")
	}
	text, _ := os.ReadFile(e.keyFile("node-a"))
	raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(string(text)))
	if err != nil || [32]byte(raw) != [32]byte(m.PrivateKey) {
		t.Fatalf("the key file does not hold the device's key: %v", err)
	}
	if m.PrivateKey[0]&7 != 0 || m.PrivateKey[31]&0xc0 != 0x40 {
		t.Error("the key is not clamped")
	}
	pk, _ := ecdh.X25519().NewPrivateKey(raw)
	if res.PublicKey != base64.StdEncoding.EncodeToString(pk.PublicKey().Bytes()) {
		t.Errorf("publicKey %s is not the key file's", res.PublicKey)
	}

	again := ok(t, configureMesh(t, e.sock, "node-a")).Mesh
	if again.PublicKey != res.PublicKey {
		t.Error("ConfigureMesh again changed the key")
	}
	other := ok(t, configureMesh(t, e.sock, "node-b")).Mesh
	if other.PublicKey == res.PublicKey {
		t.Error("another KeyRef got the same key")
	}
	m2, _, _ := e.dp.meshState()
	status := ok(t, meshStatus(t, e.sock))

	// No private key anywhere but its file: responses, state, logs.
	state, _ := os.ReadFile(e.state)
	body, _ := json.Marshal([]*wire.Response{status, {Mesh: res}, {Mesh: again}, {Mesh: other}})
	for _, k := range []dataplane.PrivateKey{m.PrivateKey, m2.PrivateKey} {
		for _, spelled := range keySpellings(k) {
			for where, text := range map[string]string{"responses": string(body), "state": string(state), "logs": logs.String()} {
				if strings.Contains(text, spelled) {
					t.Errorf("the private key is in the %s", where)
				}
			}
		}
	}
	if !strings.Contains(logs.String(), "made a mesh key") || !strings.Contains(logs.String(), res.PublicKey) {
		t.Errorf("the log does not say the key was made, with its public key:\n%s", logs)
	}
	if !strings.Contains(string(state), `"keyRef": "node-b"`) || !strings.Contains(string(state), `"listenPort": 51820`) {
		t.Errorf("state does not record the mesh:\n%s", state)
	}
	// And a Mesh printed by mistake shows no key either.
	var printed bytes.Buffer
	slog.New(slog.NewTextHandler(&printed, nil)).Info("x", "mesh", m, "key", m.PrivateKey)
	json.NewEncoder(&printed).Encode(m)
	for _, spelled := range keySpellings(m.PrivateKey) {
		if strings.Contains(printed.String(), spelled) {
			t.Errorf("a printed Mesh shows its key: %s", printed.String())
		}
	}
	if !strings.Contains(printed.String(), "(private key)") {
		t.Errorf("a printed Mesh does not say where its key is hidden: %s", printed.String())
	}
}

// The key directory and file must be netd's alone; a file that holds no
// key is refused without being quoted.
func TestMeshKeyFileRefused(t *testing.T) {
	e := newEnv(t)
	e.start(t)
	configureCluster(t, e.sock)
	dir := filepath.Dir(e.keyFile("k"))
	os.MkdirAll(dir, 0o755)
	os.Chmod(dir, 0o755)
	wantCode(t, configureMesh(t, e.sock, "k"), wire.CodeInternal, dir, "chmod 700")
	os.Chmod(dir, 0o700)

	os.WriteFile(e.keyFile("k"), []byte("c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0LXNlY3I=\n"), 0o644)
	os.Chmod(e.keyFile("k"), 0o644)
	wantCode(t, configureMesh(t, e.sock, "k"), wire.CodeInternal, e.keyFile("k"), "chmod 600")
	os.Chmod(e.keyFile("k"), 0o600)
	garbage := "not-a-key-but-secret-looking-text"
	os.WriteFile(e.keyFile("k"), []byte(garbage), 0o600)
	resp := configureMesh(t, e.sock, "k")
	wantCode(t, resp, wire.CodeInternal, "does not hold a key")
	if strings.Contains(resp.Error, garbage) || strings.Contains(resp.Error, "input byte") {
		t.Errorf("the error quotes the file: %s", resp.Error)
	}
	os.Remove(e.keyFile("k"))
	os.Symlink("/etc/hostname", e.keyFile("k"))
	wantCode(t, configureMesh(t, e.sock, "k"), wire.CodeInternal, "not a regular file")
	if _, _, up := e.dp.meshState(); up {
		t.Error("a mesh came up with a refused key")
	}
}

func TestMeshVerbsNeedTheirPredecessors(t *testing.T) {
	e := newEnv(t)
	e.start(t)
	wantCode(t, configureMesh(t, e.sock, "k"), wire.CodeNotConfigured, "Configure")
	wantCode(t, setPeers(t, e.sock, testPeer(1)), wire.CodeNotConfigured, "ConfigureMesh")
	wantCode(t, meshStatus(t, e.sock), wire.CodeNotConfigured, "ConfigureMesh")
	ok(t, removeMesh(t, e.sock))
	configureCluster(t, e.sock)
	wantCode(t, setPeers(t, e.sock, testPeer(1)), wire.CodeNotConfigured, "ConfigureMesh")
	if e.dp.count("EnsureMesh") != 0 || e.dp.count("SetMeshPeers") != 0 {
		t.Fatalf("the mesh was touched: %v", e.dp.calls)
	}
	if _, err := os.Stat(filepath.Dir(e.keyFile("k"))); err == nil {
		t.Error("a key directory was made before Configure")
	}
}

// onlyDP is a data path without a mesh.
type onlyDP struct{ dataplane.Dataplane }

func TestMeshUnsupported(t *testing.T) {
	e := newEnv(t)
	cfg := e.config(os.Getuid())
	cfg.NewDataplane = func() (dataplane.Dataplane, error) { return onlyDP{e.dp}, nil }
	srv, err := Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	configureCluster(t, e.sock)
	for _, resp := range []*wire.Response{configureMesh(t, e.sock, "k"), setPeers(t, e.sock), meshStatus(t, e.sock), removeMesh(t, e.sock)} {
		wantCode(t, resp, wire.CodeUnsupported, "no mesh")
	}
}

func TestSetMeshPeers(t *testing.T) {
	e := newEnv(t)
	e.start(t)
	configureCluster(t, e.sock)
	own := ok(t, configureMesh(t, e.sock, "k")).Mesh.PublicKey
	e.dp.mu.Lock()
	e.dp.handshake = time.Unix(1700000000, 0)
	e.dp.mu.Unlock()
	res := ok(t, setPeers(t, e.sock, testPeer(1), testPeer(2))).Mesh
	if len(res.Peers) != 2 || res.Peers[0] != (wire.MeshPeerStatus{PublicKey: testPeer(1).PublicKey, Endpoint: testPeer(1).Endpoint,
		PodCIDR: testPeer(1).PodCIDR, LastHandshake: 1700000000, RxBytes: 7, TxBytes: 9}) || res.Peers[1].PodCIDR != "100.64.2.0/24" {
		t.Fatalf("SetMeshPeers = %+v", res)
	}
	_, peers, _ := e.dp.meshState()
	if len(peers) != 2 || peers[1].CIDR != netip.MustParsePrefix("100.64.2.0/24") || peers[1].Endpoint != netip.MustParseAddrPort("192.0.2.2:51820") ||
		peers[1].PublicKey != [32]byte(bytes.Repeat([]byte{2}, 32)) || peers[1].Keepalive != wire.MeshKeepalive*time.Second {
		t.Fatalf("device peers %+v", peers)
	}
	if st := ok(t, meshStatus(t, e.sock)).Mesh; len(st.Peers) != 2 || st.PublicKey != own || st.Device != dataplane.MeshDevice {
		t.Fatalf("MeshStatus = %+v", st)
	}

	mine := testPeer(3)
	mine.PublicKey = own
	outside := testPeer(4)
	outside.PodCIDR = "100.65.0.0/24"
	overlap := testPeer(5)
	overlap.PodCIDR = "100.64.0.0/23"
	for name, tc := range map[string]struct {
		peer      wire.MeshPeer
		code, msg string
	}{
		"own range":    {overlap, wire.CodeConflict, "overlaps this node's podCIDR 100.64.0.0/24"},
		"outside":      {outside, wire.CodeConflict, "outside the clusterCIDR 100.64.0.0/16"},
		"own key":      {mine, wire.CodeConflict, "this node's own"},
		"bad endpoint": {wire.MeshPeer{PublicKey: testPeer(6).PublicKey, Endpoint: "0.0.0.0:1", PodCIDR: "100.64.6.0/24"}, wire.CodeInvalid, "endpoint"},
	} {
		resp := setPeers(t, e.sock, tc.peer)
		if resp.Code != tc.code || !strings.Contains(resp.Error, tc.msg) {
			t.Errorf("%s: %s %s", name, resp.Code, resp.Error)
		}
	}
	if _, peers, _ := e.dp.meshState(); len(peers) != 2 {
		t.Fatalf("a refused set changed the device: %+v", peers)
	}
	// None: the peers go, the device stays.
	if res := ok(t, setPeers(t, e.sock)).Mesh; len(res.Peers) != 0 {
		t.Fatalf("%+v", res)
	}
	if _, peers, up := e.dp.meshState(); !up || len(peers) != 0 {
		t.Fatalf("device %v peers %+v", up, peers)
	}
}

// The device dies with netd; the next start makes it again with the same
// key and the recorded peers, and a state file of an older netd (no
// mesh) still loads.
func TestMeshRestartResyncs(t *testing.T) {
	e := newEnv(t)
	srv, _ := e.startLogged(t)
	configureCluster(t, e.sock)
	pub := ok(t, configureMesh(t, e.sock, "k")).Mesh.PublicKey
	ok(t, setPeers(t, e.sock, testPeer(1), testPeer(2)))
	m, _, _ := e.dp.meshState()
	srv.Close()

	e.dp = newFakeDP(e.netns) // a new process: no device
	_, logs := e.startLogged(t)
	got, peers, up := e.dp.meshState()
	if !up || got != m || len(peers) != 2 || peers[0].CIDR != netip.MustParsePrefix("100.64.1.0/24") {
		t.Fatalf("after restart: up %v, same mesh %v, peers %+v; calls %v", up, got == m, peers, e.dp.calls)
	}
	if st := ok(t, meshStatus(t, e.sock)).Mesh; st.PublicKey != pub || len(st.Peers) != 2 {
		t.Fatalf("MeshStatus after restart = %+v", st)
	}
	for _, spelled := range keySpellings(m.PrivateKey) {
		if strings.Contains(logs.String(), spelled) {
			t.Error("the restart logged the private key")
		}
	}

	// RemoveMesh: the device, its rules and the record go; the key stays.
	e.dp.mu.Lock()
	e.dp.calls = nil
	e.dp.mu.Unlock()
	ok(t, removeMesh(t, e.sock))
	if _, _, up := e.dp.meshState(); up || e.dp.count("DelMesh 100.64.0.0/24") != 1 {
		t.Fatalf("RemoveMesh: up %v, calls %v", up, e.dp.calls)
	}
	wantCode(t, meshStatus(t, e.sock), wire.CodeNotConfigured)
	if state, _ := os.ReadFile(e.state); strings.Contains(string(state), "mesh") {
		t.Fatalf("state still records the mesh:\n%s", state)
	}
	if _, err := os.Stat(e.keyFile("k")); err != nil {
		t.Fatalf("RemoveMesh removed the key: %v", err)
	}
	ok(t, removeMesh(t, e.sock)) // again: nothing to do
	if res := ok(t, configureMesh(t, e.sock, "k")).Mesh; res.PublicKey != pub || len(res.Peers) != 0 {
		t.Fatalf("ConfigureMesh after RemoveMesh = %+v, want the same key, no peers", res)
	}

	// An older netd's state file.
	e.srv.Close()
	old := `{"version":1,"podCIDR":"100.64.0.0/24","clusterCIDR":"100.64.0.0/16","lastIP":"100.64.0.2","pods":[]}`
	os.WriteFile(e.state, []byte(old), 0o600)
	e.dp = newFakeDP(e.netns)
	e.start(t)
	if _, _, up := e.dp.meshState(); up || e.dp.count("DelMesh") != 1 {
		t.Fatalf("old state: mesh up %v, calls %v (want the leftover rules cleared)", up, e.dp.calls)
	}
	wantCode(t, meshStatus(t, e.sock), wire.CodeNotConfigured)
}

// A recorded mesh whose key file went is not brought up with a new key
// behind the peers' backs: it waits for ConfigureMesh.
func TestMeshResyncWithoutKey(t *testing.T) {
	e := newEnv(t)
	srv := e.start(t)
	configureCluster(t, e.sock)
	pub := ok(t, configureMesh(t, e.sock, "k")).Mesh.PublicKey
	ok(t, setPeers(t, e.sock, testPeer(1)))
	srv.Close()
	os.Remove(e.keyFile("k"))
	e.dp = newFakeDP(e.netns)
	_, logs := e.startLogged(t)
	if _, _, up := e.dp.meshState(); up {
		t.Fatal("the mesh came up without its key")
	}
	if !strings.Contains(logs.String(), "mesh not brought up") {
		t.Errorf("no error logged:\n%s", logs)
	}
	wantCode(t, setPeers(t, e.sock, testPeer(1)), wire.CodeNotConfigured, "ConfigureMesh again")
	st := ok(t, meshStatus(t, e.sock)).Mesh
	if st.Device != "" || len(st.Peers) != 1 || st.Peers[0].LastHandshake != 0 {
		t.Errorf("MeshStatus of a mesh that is down = %+v", st)
	}
	res := ok(t, configureMesh(t, e.sock, "k")).Mesh
	if res.PublicKey == pub || len(res.Peers) != 1 {
		t.Errorf("ConfigureMesh = %+v: want a new key and the recorded peer", res)
	}
	if _, peers, up := e.dp.meshState(); !up || len(peers) != 1 {
		t.Errorf("device up %v peers %+v", up, peers)
	}
}

func TestCorruptMeshStateStopsStart(t *testing.T) {
	for name, body := range map[string]string{
		"no cidr": `{"version":1,"pods":[],"mesh":{"keyRef":"k","listenPort":1}}`,
		"keyRef":  `{"version":1,"podCIDR":"100.64.0.0/24","pods":[],"mesh":{"keyRef":"../k","listenPort":1}}`,
		"port":    `{"version":1,"podCIDR":"100.64.0.0/24","pods":[],"mesh":{"keyRef":"k","listenPort":0}}`,
		"peer":    `{"version":1,"podCIDR":"100.64.0.0/24","pods":[],"mesh":{"keyRef":"k","listenPort":1,"peers":[{"publicKey":"x","endpoint":"192.0.2.1:1","podCIDR":"100.64.1.0/24"}]}}`,
		"unknown": `{"version":1,"podCIDR":"100.64.0.0/24","pods":[],"mesh":{"keyRef":"k","listenPort":1,"privateKey":"x"}}`,
	} {
		e := newEnv(t)
		os.MkdirAll(filepath.Dir(e.state), 0o700)
		os.WriteFile(e.state, []byte(body), 0o600)
		if _, err := Start(e.config(os.Getuid())); err == nil || !strings.Contains(err.Error(), e.state) {
			t.Errorf("%s: got %v", name, err)
		}
	}
}
