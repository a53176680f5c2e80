package server

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/k3sm-dev/k3sm/internal/netd/dataplane"
	"github.com/k3sm-dev/k3sm/internal/netd/wire"
)

// helperEnv makes the test binary a client run as another uid.
const helperEnv = "K3SM_NETD_TEST_DIAL"

func TestMain(m *testing.M) {
	if sock := os.Getenv(helperEnv); sock != "" {
		os.Exit(dialHelper(sock))
	}
	os.Exit(m.Run())
}

// dialHelper sends ListPods and prints the response's code, or the dial error.
func dialHelper(sock string) int {
	c, err := net.Dial("unix", sock)
	if err != nil {
		fmt.Println("dial:", err)
		return 0
	}
	defer c.Close()
	// A denial may come before the request is written (netd does not read
	// it): the answer is read either way.
	werr := wire.WriteRequest(c, &wire.Request{Version: wire.Version, Verb: wire.VerbListPods})
	resp, err := wire.ReadResponse(c)
	if err != nil && werr != nil {
		err = werr
	}
	if err != nil {
		fmt.Println("read:", err)
		return 0
	}
	fmt.Printf("code=%s pods=%d error=%s\n", resp.Code, len(resp.Pods), resp.Error)
	return 0
}

type env struct {
	dir, sock, state, netns string
	dp                      *fakeDP
	srv                     *Server
}

func newEnv(t *testing.T) *env {
	t.Helper()
	dir := t.TempDir()
	e := &env{dir: dir, sock: filepath.Join(dir, "run", "netd.sock"), state: filepath.Join(dir, "agent", "netd-state.json"),
		netns: filepath.Join(dir, "run", "netns")}
	e.dp = newFakeDP(e.netns)
	return e
}

func (e *env) config(uid int) Config {
	return Config{Socket: e.sock, StateFile: e.state, NetNSDir: e.netns, AllowedUID: uid, NewDataplane: e.dp.factory,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
}

func (e *env) start(t *testing.T) *Server {
	t.Helper()
	srv, err := Start(e.config(os.Getuid()))
	if err != nil {
		t.Fatal(err)
	}
	e.srv = srv
	t.Cleanup(func() { srv.Close() })
	return srv
}

func dial(t *testing.T, sock string) net.Conn {
	t.Helper()
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(10 * time.Second))
	return c
}

// raw sends body as one frame and reads the answer.
func raw(t *testing.T, c net.Conn, body string) *wire.Response {
	t.Helper()
	frame := binary.BigEndian.AppendUint32(nil, uint32(len(body)))
	if _, err := c.Write(append(frame, body...)); err != nil {
		t.Fatal(err)
	}
	resp, err := wire.ReadResponse(c)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

func call(t *testing.T, sock string, r wire.Request) *wire.Response {
	t.Helper()
	r.Version = wire.Version
	body, _ := json.Marshal(r)
	return raw(t, dial(t, sock), string(body))
}

func configure(t *testing.T, sock, cidr string) *wire.Response {
	return call(t, sock, wire.Request{Verb: wire.VerbConfigure, Configure: &wire.ConfigureArgs{PodCIDR: cidr}})
}

func setup(t *testing.T, sock, uid string) *wire.Response {
	return call(t, sock, wire.Request{Verb: wire.VerbSetupPod, SetupPod: &wire.SetupPodArgs{UID: uid, Namespace: "default", Name: "p-" + uid}})
}

func teardown(t *testing.T, sock, uid string) *wire.Response {
	return call(t, sock, wire.Request{Verb: wire.VerbTeardownPod, TeardownPod: &wire.TeardownPodArgs{UID: uid}})
}

func list(t *testing.T, sock string) []wire.PodResult {
	resp := call(t, sock, wire.Request{Verb: wire.VerbListPods})
	if resp.Code != "" {
		t.Fatalf("ListPods: %s", resp.Error)
	}
	return resp.Pods
}

func ok(t *testing.T, resp *wire.Response) *wire.Response {
	t.Helper()
	if resp.Code != "" || resp.Error != "" {
		t.Fatalf("%s: %s", resp.Code, resp.Error)
	}
	return resp
}

func wantCode(t *testing.T, resp *wire.Response, code string, msg ...string) {
	t.Helper()
	if resp.Code != code {
		t.Fatalf("got code %q (%s), want %q", resp.Code, resp.Error, code)
	}
	for _, m := range msg {
		if !strings.Contains(resp.Error, m) {
			t.Errorf("error %q does not say %q", resp.Error, m)
		}
	}
}

func uidN(i int) string { return fmt.Sprintf("%08x-0000-4000-8000-000000000000", i) }

func TestSocketPermissionsAndStaleSocket(t *testing.T) {
	e := newEnv(t)
	// A socket left by a netd that died.
	os.MkdirAll(filepath.Dir(e.sock), 0o700)
	stale, err := net.Listen("unix", e.sock)
	if err != nil {
		t.Fatal(err)
	}
	stale.(*net.UnixListener).SetUnlinkOnClose(false)
	stale.Close()
	e.start(t)
	st, err := os.Stat(e.sock)
	if err != nil || st.Mode().Perm() != 0o600 || st.Mode().Type() != os.ModeSocket {
		t.Fatalf("socket %v %v", st.Mode(), err)
	}
	ok(t, call(t, e.sock, wire.Request{Verb: wire.VerbListPods}))
	e.srv.Close()
	if _, err := os.Stat(e.sock); !os.IsNotExist(err) {
		t.Fatalf("socket left after Close: %v", err)
	}
}

func TestSocketDirectoryCreatedPrivateAndLooseOneRefused(t *testing.T) {
	e := newEnv(t)
	e.start(t)
	if st, _ := os.Stat(filepath.Dir(e.sock)); st.Mode().Perm() != 0o700 {
		t.Fatalf("socket dir %v, want 0700", st.Mode())
	}
	e.srv.Close()
	os.Chmod(filepath.Dir(e.sock), 0o777)
	if _, err := Start(e.config(os.Getuid())); err == nil || !strings.Contains(err.Error(), "chmod go-w") {
		t.Fatalf("a world-writable socket dir was accepted: %v", err)
	}
	os.Chmod(filepath.Dir(e.sock), 0o700)
	os.WriteFile(e.sock, nil, 0o600)
	if _, err := Start(e.config(os.Getuid())); err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Fatalf("a regular file at the socket path was replaced: %v", err)
	}
}

// The kernel says who the peer is; anyone but the allowed uid is refused.
func TestOtherUIDDenied(t *testing.T) {
	e := newEnv(t)
	srv, err := Start(e.config(4242))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	if os.Getuid() == 0 {
		// The socket belongs to the one uid allowed.
		if st, _ := os.Stat(e.sock); st.Sys().(*syscall.Stat_t).Uid != 4242 {
			t.Fatalf("socket owned by %d", st.Sys().(*syscall.Stat_t).Uid)
		}
	}
	c := dial(t, e.sock)
	body, _ := json.Marshal(wire.Request{Version: wire.Version, Verb: wire.VerbListPods})
	resp := raw(t, c, string(body))
	wantCode(t, resp, wire.CodeDenied, fmt.Sprintf("uid %d", os.Getuid()))
	if _, err := c.Read(make([]byte, 1)); err != io.EOF && !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("connection not closed after denial: %v", err)
	}
}

// A real other user, in a child process: with the socket 0600 the kernel
// refuses the connect; with the socket opened to everyone (a permissions
// slip) netd still refuses from the peer credentials.
func TestOtherUserProcessDenied(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to run a client as another uid")
	}
	e := newEnv(t)
	e.start(t)
	ok(t, configure(t, e.sock, "100.64.0.0/24"))
	ok(t, setup(t, e.sock, uidN(1)))
	// The test binary, where nobody can run it, and a path nobody can walk.
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(e.dir, "client.test")
	data, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	for d := e.dir; d != "/" && d != os.TempDir(); d = filepath.Dir(d) {
		os.Chmod(d, 0o711)
	}
	os.Chmod(filepath.Dir(e.sock), 0o711)
	runAs := func() string {
		cmd := exec.Command(bin)
		cmd.Env = []string{helperEnv + "=" + e.sock}
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("helper: %v\n%s", err, out)
		}
		return string(out)
	}
	if out := runAs(); !strings.Contains(out, "permission denied") {
		t.Fatalf("uid 65534 reached a 0600 socket: %s", out)
	}
	os.Chmod(e.sock, 0o666)
	if out := runAs(); !strings.Contains(out, "code=denied pods=0") || !strings.Contains(out, "uid 65534") {
		t.Fatalf("uid 65534 was not denied: %s", out)
	}
	if len(list(t, e.sock)) != 1 {
		t.Fatal("the allowed uid lost its pods")
	}
}

func TestInvalidRequestsAnswered(t *testing.T) {
	e := newEnv(t)
	e.start(t)
	c := dial(t, e.sock)
	for body, want := range map[string]string{
		`{"version":1,"verb":"Exec"}`:                                                                 `verb: "Exec"`,
		`{"version":2,"verb":"ListPods"}`:                                                             "version: got 2",
		`{"version":1,"verb":"ListPods","x":1}`:                                                       "unknown field",
		`{"version":1,"verb":"ListPods"}{}`:                                                           "trailing",
		`{"version":1,"verb":"TeardownPod","teardownPod":{"uid":"../etc"}}`:                           "uid:",
		`{"version":1,"verb":"SetupPod","setupPod":{"uid":"ab","namespace":"Bad","name":"p"}}`:        "namespace:",
		`{"version":1,"verb":"SetupPod","setupPod":{"uid":"ab","namespace":"ns","name":"p/../../x"}}`: "name:",
		`{"version":1,"verb":"Configure","configure":{"podCIDR":"127.0.0.0/16"}}`:                     "podCIDR:",
		`{"version":1,"verb":"Configure","configure":{"podCIDR":"10.0.0.1/24"}}`:                      "host bits",
	} {
		// One connection throughout: a bad frame does not end it.
		wantCode(t, raw(t, c, body), wire.CodeInvalid, want)
	}
	ok(t, raw(t, c, `{"version":1,"verb":"ListPods"}`))
	if n := e.dp.count(""); n != 0 {
		t.Fatalf("invalid requests reached the dataplane: %v", e.dp.calls)
	}
}

func TestOversizedFrameRefusedAndServerSurvives(t *testing.T) {
	e := newEnv(t)
	e.start(t)
	c := dial(t, e.sock)
	// Only the header: netd must answer without waiting for 64 KiB + 1.
	if _, err := c.Write(binary.BigEndian.AppendUint32(nil, wire.MaxFrame+1)); err != nil {
		t.Fatal(err)
	}
	resp, err := wire.ReadResponse(c)
	if err != nil {
		t.Fatal(err)
	}
	wantCode(t, resp, wire.CodeInvalid, "frame too large")
	if _, err := c.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("connection kept after an oversized frame: %v", err)
	}
	ok(t, call(t, e.sock, wire.Request{Verb: wire.VerbListPods}))
}

func TestIdleConnectionClosed(t *testing.T) {
	e := newEnv(t)
	cfg := e.config(os.Getuid())
	cfg.IdleTimeout = 50 * time.Millisecond
	srv, err := Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	c := dial(t, e.sock)
	c.Write([]byte{0, 0}) // half a header, then nothing
	if _, err := c.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("a stalled client kept its connection: %v", err)
	}
}

func TestSetupBeforeConfigure(t *testing.T) {
	e := newEnv(t)
	e.start(t)
	wantCode(t, setup(t, e.sock, uidN(1)), wire.CodeNotConfigured, "Configure")
}

func TestConfigure(t *testing.T) {
	e := newEnv(t)
	e.start(t)
	resp := ok(t, configure(t, e.sock, "100.64.0.0/24"))
	if *resp.Configure != (wire.NodeResult{PodCIDR: "100.64.0.0/24", Gateway: "100.64.0.1", Bridge: "k3sm0"}) {
		t.Fatalf("%+v", resp.Configure)
	}
	ok(t, configure(t, e.sock, "100.64.0.0/24")) // again: the same
	ok(t, setup(t, e.sock, uidN(1)))
	ok(t, setup(t, e.sock, uidN(2)))
	wantCode(t, configure(t, e.sock, "100.65.0.0/24"), wire.CodeConflict, "100.64.0.0/24", "100.65.0.0/24", "2 pods")
	ok(t, teardown(t, e.sock, uidN(1)))
	ok(t, teardown(t, e.sock, uidN(2)))
	ok(t, configure(t, e.sock, "100.65.0.0/24"))
	if e.dp.count("DelNode 100.64.0.0/24") != 1 || e.dp.count("EnsureNode 100.65.0.0/24") != 1 {
		t.Fatalf("the old node was not replaced: %v", e.dp.calls)
	}
	if ip := ok(t, setup(t, e.sock, uidN(3))).Pod.IP; ip != "100.65.0.2" {
		t.Fatalf("first pod of the new range got %s", ip)
	}
}

func TestSetupPodIdempotentAndTeardown(t *testing.T) {
	e := newEnv(t)
	e.start(t)
	ok(t, configure(t, e.sock, "100.64.0.0/24"))
	first := ok(t, setup(t, e.sock, uidN(1))).Pod
	want := wire.PodResult{UID: uidN(1), Namespace: "default", Name: "p-" + uidN(1), IP: "100.64.0.2", PrefixLen: 24,
		Gateway: "100.64.0.1", NetNS: filepath.Join(e.netns, uidN(1))}
	if *first != want {
		t.Fatalf("got %+v, want %+v", first, want)
	}
	if _, err := os.Stat(first.NetNS); err != nil {
		t.Fatal(err)
	}
	again := ok(t, setup(t, e.sock, uidN(1))).Pod
	if *again != *first || e.dp.count("AddPod "+uidN(1)) != 2 {
		t.Fatalf("again: %+v, calls %v", again, e.dp.calls)
	}
	wantCode(t, call(t, e.sock, wire.Request{Verb: wire.VerbSetupPod, SetupPod: &wire.SetupPodArgs{UID: uidN(1), Namespace: "default", Name: "other"}}),
		wire.CodeConflict, "default/p-"+uidN(1))
	ok(t, teardown(t, e.sock, uidN(1)))
	if _, ok := e.dp.link(uidN(1)); ok || len(list(t, e.sock)) != 0 {
		t.Fatal("pod kept its network after teardown")
	}
	if _, err := os.Stat(first.NetNS); !os.IsNotExist(err) {
		t.Fatalf("netns file left: %v", err)
	}
	wantCode(t, teardown(t, e.sock, uidN(1)), wire.CodeNotFound)
}

// netd only tears down what it set up.
func TestTeardownOfUnknownPodTouchesNothing(t *testing.T) {
	e := newEnv(t)
	e.start(t)
	ok(t, configure(t, e.sock, "100.64.0.0/24"))
	foreign := filepath.Join(e.netns, uidN(9))
	os.MkdirAll(e.netns, 0o700)
	os.WriteFile(foreign, nil, 0o600)
	wantCode(t, teardown(t, e.sock, uidN(9)), wire.CodeNotFound, uidN(9))
	if e.dp.count("DelPod") != 0 {
		t.Fatalf("DelPod of a pod netd does not own: %v", e.dp.calls)
	}
	if _, err := os.Stat(foreign); err != nil {
		t.Fatal(err)
	}
}

func TestAddPodFailureRollsBack(t *testing.T) {
	e := newEnv(t)
	e.start(t)
	ok(t, configure(t, e.sock, "100.64.0.0/24"))
	e.dp.mu.Lock()
	e.dp.failAdd[uidN(1)] = fmt.Errorf("veth: file exists")
	e.dp.mu.Unlock()
	wantCode(t, setup(t, e.sock, uidN(1)), wire.CodeInternal, "veth: file exists", "default/p-"+uidN(1))
	if e.dp.count("DelPod "+uidN(1)) != 1 || len(list(t, e.sock)) != 0 {
		t.Fatalf("not rolled back: %v", e.dp.calls)
	}
	var st stateFile
	data, _ := os.ReadFile(e.state)
	json.Unmarshal(data, &st)
	if len(st.Pods) != 0 {
		t.Fatalf("state keeps the failed pod: %s", data)
	}
	ok(t, setup(t, e.sock, uidN(2)))
}

// The state is written while the links are made: when it cannot be
// written, the pod's links go again and the file keeps what it had.
func TestStateSaveFailureRollsBack(t *testing.T) {
	e := newEnv(t)
	e.start(t)
	ok(t, configure(t, e.sock, "100.64.0.0/24"))
	ok(t, setup(t, e.sock, uidN(1)))
	before, err := os.ReadFile(e.state)
	if err != nil {
		t.Fatal(err)
	}
	// Root ignores permissions: the state's directory replaced by a file
	// makes the write fail.
	dir := filepath.Dir(e.state)
	if err := os.Rename(dir, dir+".moved"); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dir, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	wantCode(t, setup(t, e.sock, uidN(2)), wire.CodeInternal, "state")
	if _, ok := e.dp.link(uidN(2)); ok {
		t.Fatalf("links of the unsaved pod kept: %v", e.dp.calls)
	}
	if pods := list(t, e.sock); len(pods) != 1 || pods[0].UID != uidN(1) {
		t.Fatalf("pods after the failed save: %+v", pods)
	}
	os.Remove(dir)
	if err := os.Rename(dir+".moved", dir); err != nil {
		t.Fatal(err)
	}
	if after, _ := os.ReadFile(e.state); string(after) != string(before) {
		t.Fatalf("state changed by the failed save:\n%s\nwas\n%s", after, before)
	}
	// The address is given again: nothing holds it.
	r := setup(t, e.sock, uidN(2))
	ok(t, r)
	if r.Pod.IP != "100.64.0.3" {
		t.Fatalf("second pod got %s, want 100.64.0.3 (the first free after the gateway and pod 1)", r.Pod.IP)
	}
}

func TestAllocationRoundRobinAndExhaustion(t *testing.T) {
	e := newEnv(t)
	e.start(t)
	ok(t, configure(t, e.sock, "100.64.0.16/28")) // .16 network, .17 gateway, .31 broadcast
	var ips []string
	for i := range 13 {
		ips = append(ips, ok(t, setup(t, e.sock, uidN(i))).Pod.IP)
	}
	if ips[0] != "100.64.0.18" || ips[12] != "100.64.0.30" {
		t.Fatalf("allocated %v", ips)
	}
	wantCode(t, setup(t, e.sock, uidN(99)), wire.CodeConflict, "no free pod address", "13", "100.64.0.16/28")
	ok(t, teardown(t, e.sock, uidN(3)))
	ok(t, teardown(t, e.sock, uidN(5)))
	// After .30 the search wraps and finds .21, the first free.
	if ip := ok(t, setup(t, e.sock, uidN(100))).Pod.IP; ip != "100.64.0.21" {
		t.Fatalf("got %s, want 100.64.0.21", ip)
	}
	// Released .21 is not handed out again at once: .23 is next.
	ok(t, teardown(t, e.sock, uidN(100)))
	if ip := ok(t, setup(t, e.sock, uidN(101))).Pod.IP; ip != "100.64.0.23" {
		t.Fatalf("got %s, want 100.64.0.23", ip)
	}
}

func TestAllocate(t *testing.T) {
	cidr := netip.MustParsePrefix("10.0.0.0/24")
	none := func(netip.Addr) bool { return false }
	for last, want := range map[string]string{"": "10.0.0.2", "10.0.0.2": "10.0.0.3", "10.0.0.254": "10.0.0.2", "10.0.0.255": "10.0.0.2"} {
		var l netip.Addr
		if last != "" {
			l = netip.MustParseAddr(last)
		}
		if got, _ := allocate(cidr, l, none); got.String() != want {
			t.Errorf("after %q: got %s, want %s", last, got, want)
		}
	}
	if _, ok := allocate(cidr, netip.Addr{}, func(netip.Addr) bool { return true }); ok {
		t.Error("allocated from a full range")
	}
}

func TestHundredPods(t *testing.T) {
	e := newEnv(t)
	e.start(t)
	ok(t, configure(t, e.sock, "100.64.0.0/24"))
	var mu sync.Mutex
	held := map[string]string{} // ip → uid
	var wg sync.WaitGroup
	for i := range 100 {
		wg.Go(func() {
			p := ok(t, setup(t, e.sock, uidN(i))).Pod
			mu.Lock()
			defer mu.Unlock()
			if other, dup := held[p.IP]; dup {
				t.Errorf("%s given to %s and %s", p.IP, other, p.UID)
			}
			held[p.IP] = p.UID
		})
	}
	wg.Wait()
	if len(held) != 100 || len(list(t, e.sock)) != 100 || e.dp.linkCount() != 100 {
		t.Fatalf("%d distinct addresses, %d links", len(held), e.dp.linkCount())
	}
	// Half go, fifty new ones come, all while the rest hold theirs.
	for i := range 50 {
		wg.Go(func() { ok(t, teardown(t, e.sock, uidN(i))) })
		wg.Go(func() { ok(t, setup(t, e.sock, uidN(1000+i))) })
	}
	wg.Wait()
	seen := map[string]bool{}
	for _, p := range list(t, e.sock) {
		if seen[p.IP] {
			t.Fatalf("%s in use twice", p.IP)
		}
		seen[p.IP] = true
	}
	if len(seen) != 100 {
		t.Fatalf("%d pods", len(seen))
	}
	for _, p := range list(t, e.sock) {
		wg.Go(func() { ok(t, teardown(t, e.sock, p.UID)) })
	}
	wg.Wait()
	if len(list(t, e.sock)) != 0 || e.dp.linkCount() != 0 {
		t.Fatal("not all released")
	}
	var st stateFile
	data, _ := os.ReadFile(e.state)
	if err := json.Unmarshal(data, &st); err != nil || len(st.Pods) != 0 || st.PodCIDR != "100.64.0.0/24" {
		t.Fatalf("state after teardown: %s %v", data, err)
	}
}

func TestRestartResyncs(t *testing.T) {
	e := newEnv(t)
	srv := e.start(t)
	ok(t, configure(t, e.sock, "100.64.0.0/24"))
	before := map[string]string{}
	for i := range 3 {
		p := ok(t, setup(t, e.sock, uidN(i))).Pod
		before[p.UID] = p.IP
	}
	ok(t, teardown(t, e.sock, uidN(2)))
	ok(t, setup(t, e.sock, uidN(3)))
	before[uidN(3)] = "100.64.0.5"
	srv.Close()
	if e.dp.linkCount() != 3 {
		t.Fatal("Close tore pods down")
	}
	// While netd was down: pod 1 ended (its namespace is gone), and
	// something of ours nobody claims was left (a link and a namespace).
	os.Remove(filepath.Join(e.netns, uidN(1)))
	orphan := filepath.Join(e.netns, uidN(7))
	os.WriteFile(orphan, nil, 0o600)
	e.dp.mu.Lock()
	e.dp.links[dataplane.HostIfName(uidN(8))] = dataplane.Pod{UID: uidN(8)}
	e.dp.node = nil // the bridge went too (a reboot)
	e.dp.calls = nil
	e.dp.mu.Unlock()

	e.start(t)
	pods := list(t, e.sock)
	if len(pods) != 2 || pods[0].UID != uidN(0) || pods[0].IP != before[uidN(0)] || pods[1].UID != uidN(3) || pods[1].IP != before[uidN(3)] {
		t.Fatalf("after restart: %+v, before %v", pods, before)
	}
	if e.dp.count("EnsureNode 100.64.0.0/24") != 1 || e.dp.count("AddPod "+uidN(0)) != 1 || e.dp.count("AddPod "+uidN(3)) != 1 || e.dp.count("AddPod "+uidN(1)) != 0 {
		t.Fatalf("resync calls: %v", e.dp.calls)
	}
	if _, ok := e.dp.link(uidN(1)); ok {
		t.Fatal("the gone pod's link was kept")
	}
	if _, ok := e.dp.link(uidN(8)); ok {
		t.Fatal("the unclaimed link was kept")
	}
	if _, err := os.Stat(orphan); !os.IsNotExist(err) {
		t.Fatalf("the unclaimed namespace was kept: %v", err)
	}
	// Pod 1's address is free again, but the cursor survived the restart:
	// the next pod gets .6, not the just-released .3.
	if ip := ok(t, setup(t, e.sock, uidN(4))).Pod.IP; ip != "100.64.0.6" {
		t.Fatalf("got %s", ip)
	}
}

func TestCorruptStateStopsStart(t *testing.T) {
	for name, body := range map[string]string{
		"not json":      `{`,
		"unknown field": `{"version":1,"podCIDR":"100.64.0.0/24","pods":[],"x":1}`,
		"version":       `{"version":9,"pods":[]}`,
		"ip outside":    `{"version":1,"podCIDR":"100.64.0.0/24","pods":[{"uid":"ab","namespace":"n","name":"p","ip":"10.0.0.2"}]}`,
		"gateway ip":    `{"version":1,"podCIDR":"100.64.0.0/24","pods":[{"uid":"ab","namespace":"n","name":"p","ip":"100.64.0.1"}]}`,
		"shared ip":     `{"version":1,"podCIDR":"100.64.0.0/24","pods":[{"uid":"ab","namespace":"n","name":"p","ip":"100.64.0.2"},{"uid":"cd","namespace":"n","name":"q","ip":"100.64.0.2"}]}`,
		"bad uid":       `{"version":1,"podCIDR":"100.64.0.0/24","pods":[{"uid":"../x","namespace":"n","name":"p","ip":"100.64.0.2"}]}`,
		"no cidr":       `{"version":1,"pods":[{"uid":"ab","namespace":"n","name":"p","ip":"100.64.0.2"}]}`,
	} {
		e := newEnv(t)
		os.MkdirAll(filepath.Dir(e.state), 0o700)
		os.WriteFile(e.state, []byte(body), 0o600)
		if _, err := Start(e.config(os.Getuid())); err == nil || !strings.Contains(err.Error(), e.state) {
			t.Errorf("%s: got %v", name, err)
		}
	}
}

func TestStateFileIsPrivateJSON(t *testing.T) {
	e := newEnv(t)
	e.start(t)
	ok(t, configure(t, e.sock, "100.64.0.0/24"))
	ok(t, setup(t, e.sock, uidN(1)))
	st, _ := os.Stat(e.state)
	if st.Mode().Perm() != 0o600 {
		t.Fatalf("state mode %v", st.Mode())
	}
	data, _ := os.ReadFile(e.state)
	want := `{
  "version": 1,
  "podCIDR": "100.64.0.0/24",
  "lastIP": "100.64.0.2",
  "pods": [
    {
      "uid": "` + uidN(1) + `",
      "namespace": "default",
      "name": "p-` + uidN(1) + `",
      "ip": "100.64.0.2"
    }
  ]
}
`
	if !bytes.Equal(data, []byte(want)) {
		t.Fatalf("state:\n%s", data)
	}
}

// Teardowns remove their pods' networks at the same time; meanwhile each
// pod keeps its address, cannot be set up again, gets no policy, and the
// rest of netd answers.
func TestTeardownsRunConcurrently(t *testing.T) {
	e := newEnv(t)
	e.dp.delEntered, e.dp.delRelease = make(chan string, 4), make(chan struct{})
	e.start(t)
	ok(t, configure(t, e.sock, "100.64.0.0/28"))
	held := map[string]string{}
	for i := 1; i <= 3; i++ {
		held[uidN(i)] = ok(t, setup(t, e.sock, uidN(i))).Pod.IP
	}
	results := make(chan *wire.Response, 4)
	async := func(uid string) {
		go func() {
			c, err := net.Dial("unix", e.sock)
			if err != nil {
				results <- failure("dial", "%v", err)
				return
			}
			defer c.Close()
			wire.WriteRequest(c, &wire.Request{Version: wire.Version, Verb: wire.VerbTeardownPod, TeardownPod: &wire.TeardownPodArgs{UID: uid}})
			resp, err := wire.ReadResponse(c)
			if err != nil {
				resp = failure("read", "%v", err)
			}
			results <- resp
		}()
	}
	for i := 1; i <= 3; i++ {
		async(uidN(i))
	}
	entered := map[string]bool{}
	for len(entered) < 3 {
		select {
		case uid := <-e.dp.delEntered:
			entered[uid] = true
		case <-time.After(5 * time.Second):
			t.Fatalf("only %d of 3 teardowns reached the dataplane at once: they are serialized", len(entered))
		}
	}
	wantCode(t, setup(t, e.sock, uidN(1)), wire.CodeConflict, "being torn down")
	wantCode(t, call(t, e.sock, wire.Request{Verb: wire.VerbSetPolicy, SetPolicy: &wire.SetPolicyArgs{UID: uidN(2)}}), wire.CodeNotFound)
	ok(t, configure(t, e.sock, "100.64.0.0/28")) // the node is not held up either
	if n := len(list(t, e.sock)); n != 3 {
		t.Fatalf("%d pods listed during their teardown, want 3", n)
	}
	fourth := ok(t, setup(t, e.sock, uidN(4))).Pod.IP
	for uid, ip := range held {
		if ip == fourth {
			t.Fatalf("address %s of %s, still being torn down, given to a new pod", ip, uid)
		}
	}
	async(uidN(1)) // a second teardown of the same pod waits for the first
	select {
	case r := <-results:
		t.Fatalf("a teardown answered before its removal was done: %+v", r)
	case <-time.After(100 * time.Millisecond):
	}
	close(e.dp.delRelease)
	codes := map[string]int{}
	for i := 0; i < 4; i++ {
		select {
		case r := <-results:
			codes[r.Code]++
		case <-time.After(5 * time.Second):
			t.Fatal("teardowns did not answer after the dataplane was released")
		}
	}
	if codes[""] != 3 || codes[wire.CodeNotFound] != 1 {
		t.Fatalf("teardown answers %v, want 3 successes and one NotFound (the second teardown of a gone pod)", codes)
	}
	if pods := list(t, e.sock); len(pods) != 1 || pods[0].UID != uidN(4) {
		t.Fatalf("after the teardowns: %+v", pods)
	}
	if e.dp.count("AddPod "+uidN(1)) != 1 || e.dp.count("DelPod "+uidN(1)) != 1 {
		t.Fatalf("pod 1 repaired or removed twice: %v", e.dp.calls)
	}
	// The state on disk agrees: a restart knows only the fourth pod.
	e.srv.Close()
	e.dp.delEntered = nil
	e.start(t)
	if pods := list(t, e.sock); len(pods) != 1 || pods[0].UID != uidN(4) {
		t.Fatalf("after a restart: %+v", pods)
	}
}

// Only a runtime that is not root brings its own namespaces (FromPid): a
// root one gets netd's.
func TestFromPidOnlyForAnUnprivilegedRuntime(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("the allowed uid is the caller's: the refusal is for uid 0")
	}
	e := newEnv(t)
	e.start(t)
	ok(t, configure(t, e.sock, "100.64.0.0/24"))
	wantCode(t, call(t, e.sock, wire.Request{Verb: wire.VerbSetupPod, SetupPod: &wire.SetupPodArgs{UID: uidN(1), Namespace: "default", Name: "p", FromPid: os.Getpid()}}),
		wire.CodeInvalid, "fromPid")
	if len(list(t, e.sock)) != 0 {
		t.Fatal("a refused pod got an address")
	}
}

// A pod with its runtime's namespaces is recorded so: after a restart
// netd pins them again rather than making one its runtime cannot enter.
func TestStateKeepsUserNSPods(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.json")
	cidr := netip.MustParsePrefix("100.64.0.0/24")
	pods := map[string]*pod{uidN(1): {uid: uidN(1), namespace: "default", name: "a", ip: netip.MustParseAddr("100.64.0.2"), userns: true},
		uidN(2): {uid: uidN(2), namespace: "default", name: "b", ip: netip.MustParseAddr("100.64.0.3")}}
	if err := saveState(path, cidr, netip.Addr{}, ranges{}, pods, nil); err != nil {
		t.Fatal(err)
	}
	_, _, _, got, _, err := loadState(path)
	if err != nil {
		t.Fatal(err)
	}
	if !got[uidN(1)].userns || got[uidN(2)].userns {
		t.Fatalf("userns flags after a reload: %v %v", got[uidN(1)].userns, got[uidN(2)].userns)
	}
}
