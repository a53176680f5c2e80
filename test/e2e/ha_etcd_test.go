package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/k3sm-dev/k3sm/internal/pki"
)

// etcdClientOf is a client of the embedded etcd at endpoints with a
// server's own credentials (its etcd CA and the apiserver's client
// certificate), as the apiserver is.
func etcdClientOf(t *testing.T, s *server, endpoints ...string) *clientv3.Client {
	t.Helper()
	tlsDir := filepath.Join(s.dataDir, "server", "tls")
	return etcdClientWith(t, filepath.Join(tlsDir, "etcd-ca.crt"), filepath.Join(tlsDir, "client-etcd-apiserver.crt"),
		filepath.Join(tlsDir, "client-etcd-apiserver.key"), endpoints...)
}

func etcdClientWith(t *testing.T, caFile, certFile, keyFile string, endpoints ...string) *clientv3.Client {
	t.Helper()
	ca, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		TLS: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{pair}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// TestHAEmbeddedEtcd: a cluster made with --cluster-init, two more servers
// joined with --server and a token, each in a network namespace of its
// own: three etcd members with mutual TLS from the cluster's etcd CA. A
// foreign certificate is refused on both etcd ports, a wrong token by the
// join; kill -9 of the server holding the etcd leader loses no
// acknowledged write, and the killed server rejoins.
func TestHAEmbeddedEtcd(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: each server runs in a network namespace of its own")
	}
	t.Parallel()
	nets := newNodeNetsOn(t, 79, 3)
	ports := []int{freePort(t), freePort(t), freePort(t), freePort(t), freePort(t), freePort(t)}
	supervisor := fmt.Sprintf("https://%s:%d", nets[0].nsIP, ports[4])
	servers := make([]*server, 3)
	servers[0] = newHAServer(t, nets[0], ports, "--cluster-init", "--disable-agent", "--node-name", "server-0")
	servers[0].start()
	out, err := nsK3sm(t, nets[0].name, time.Minute, "token", "create", "--data-dir", servers[0].dataDir)
	if err != nil {
		t.Fatalf("token create: %v\n%s", err, out)
	}
	tok := lastLine(out)
	id, secret, _ := strings.Cut(tok[strings.Index(tok, "::")+2:], ".")

	for _, r := range []struct{ name, tok, want string }{
		{"unknown token", tok[:strings.Index(tok, "::")+2] + "zzzzzz." + secret, "not valid"},
		{"another CA", "K10" + strings.Repeat("0", 64) + "::" + id + "." + secret, "another CA"},
	} {
		t.Run(r.name, func(t *testing.T) {
			s := newHAServer(t, nets[1], ports, "--server", supervisor, "--token", r.tok, "--disable-agent", "--node-name", "refused")
			out, err := nsK3sm(t, nets[1].name, 2*time.Minute, s.args()...)
			if err == nil || !strings.Contains(out, r.want) {
				t.Fatalf("server: %v, want a refusal saying %q:\n%s", err, r.want, out)
			}
			if files, _ := os.ReadDir(filepath.Join(s.dataDir, "server", "tls")); len(files) > 0 {
				t.Errorf("a refused join wrote %d files into server/tls", len(files))
			}
		})
	}
	for i := 1; i < 3; i++ {
		servers[i] = newHAServer(t, nets[i], ports, "--server", supervisor, "--token", tok, "--disable-agent", "--node-name", fmt.Sprintf("server-%d", i))
		servers[i].start()
	}
	endpoint := func(i int) string { return "https://" + net.JoinHostPort(nets[i].nsIP, "2379") }
	cli := etcdClientOf(t, servers[0], endpoint(0), endpoint(1), endpoint(2))
	members := func() map[uint64]string {
		t.Helper()
		l, err := cli.MemberList(ctx(t))
		if err != nil {
			t.Fatal(err)
		}
		m := map[uint64]string{}
		for _, mm := range l.Members {
			m[mm.ID] = mm.Name
		}
		return m
	}
	if m := members(); len(m) != 3 {
		t.Fatalf("etcd members %v, want three", m)
	}
	for i := 1; i < 3; i++ {
		a, _ := os.ReadFile(filepath.Join(servers[0].dataDir, "server", "tls", "etcd-ca.key"))
		b, _ := os.ReadFile(filepath.Join(servers[i].dataDir, "server", "tls", "etcd-ca.key"))
		if len(a) == 0 || string(a) != string(b) {
			t.Errorf("server-%d's etcd CA is not the cluster's", i)
		}
	}

	t.Run("foreign certificate", func(t *testing.T) {
		dir := t.TempDir()
		ca, err := pki.LoadOrCreateCA(dir, "foreign", "foreign-ca")
		if err != nil {
			t.Fatal(err)
		}
		leaf, err := ca.Ensure(dir, "member", pki.LeafSpec{CommonName: "etcd-intruder", IPs: []net.IP{net.ParseIP(nets[1].nsIP)}, Server: true, Client: true})
		if err != nil {
			t.Fatal(err)
		}
		// The peer port: a would-be member with another CA's certificate.
		pair, err := tls.LoadX509KeyPair(leaf.CertPath, leaf.KeyPath)
		if err != nil {
			t.Fatal(err)
		}
		conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", net.JoinHostPort(nets[0].nsIP, "2380"),
			&tls.Config{Certificates: []tls.Certificate{pair}, InsecureSkipVerify: true}) //nolint:gosec // the peer's answer is what is tested
		if err == nil {
			// TLS 1.3 reports the client's rejection on the first read.
			_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
			_, err = conn.Read(make([]byte, 1))
			conn.Close()
		}
		if err == nil || !strings.Contains(err.Error(), "certificate") {
			t.Errorf("peer port with a foreign certificate: %v, want a TLS refusal", err)
		}
		// The client port, with the cluster's CA to verify the member but
		// a foreign client certificate.
		foreign := etcdClientWith(t, filepath.Join(servers[0].dataDir, "server", "tls", "etcd-ca.crt"), leaf.CertPath, leaf.KeyPath, endpoint(0))
		c, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if _, err := foreign.MemberList(c); err == nil {
			t.Errorf("client port with a foreign certificate: member list answered")
		}
	})

	// Kill the server whose member leads etcd, during writes.
	st, err := cli.Status(ctx(t), endpoint(0))
	if err != nil {
		t.Fatal(err)
	}
	leaderName := members()[st.Leader]
	leader := slices.IndexFunc(servers, func(s *server) bool { return slices.Contains(s.args(), leaderName) })
	if leader < 0 {
		t.Fatalf("the etcd leader %q is none of the servers", leaderName)
	}
	via := servers[(leader+1)%3]
	t.Logf("etcd leader: %s", leaderName)
	writesAcrossKill(t, servers, via, func() { killTree(t, servers[leader].cmd.Process.Pid) })
	var others []string
	for i := range servers {
		if i != leader {
			others = append(others, endpoint(i))
		}
	}
	waitFor(t, 30*time.Second, "another etcd leader", func() error {
		st, err := etcdClientOf(t, via, others...).Status(ctx(t), others[0])
		if err != nil {
			return err
		}
		if st.Leader == 0 || members()[st.Leader] == leaderName {
			return fmt.Errorf("leader %x", st.Leader)
		}
		return nil
	})

	// The killed server starts again from its data dir (no flag needed
	// but its own) and its member catches up.
	servers[leader].start()
	waitFor(t, time.Minute, "the restarted member answers", func() error {
		_, err := etcdClientOf(t, via, endpoint(leader)).Status(ctx(t), endpoint(leader))
		return err
	})
	if _, err := servers[leader].client().CoreV1().ConfigMaps("default").Get(ctx(t), "ha-0999", metav1.GetOptions{}); err != nil {
		t.Errorf("the restarted server does not see the writes made while it was down: %v", err)
	}

	// A server gone for good leaves the quorum when its Node is deleted
	// (this one runs no node: its Node object is made here, as a server
	// with a node has one).
	gone := servers[(leader+2)%3]
	gone.stop()
	goneName := fmt.Sprintf("server-%d", (leader+2)%3)
	vc := via.client()
	if _, err := vc.CoreV1().Nodes().Create(ctx(t), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: goneName}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := vc.CoreV1().Nodes().Delete(ctx(t), goneName, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "the deleted node's etcd member removed", func() error {
		l, err := etcdClientOf(t, via, endpoint(slices.Index(servers, via))).MemberList(ctx(t))
		if err != nil {
			return err
		}
		for _, m := range l.Members {
			if m.Name == goneName {
				return fmt.Errorf("member %s still listed", goneName)
			}
		}
		if len(l.Members) != 2 {
			return fmt.Errorf("%d members", len(l.Members))
		}
		return nil
	})

	// A snapshot (etcd's own, through the running member) restored onto a
	// new first server once every server is gone, as after losing them all.
	viaNS := nets[slices.Index(servers, via)].name
	out, err = nsK3sm(t, viaNS, 2*time.Minute, "snapshot", "save", "--data-dir", via.dataDir, "--name", "ha")
	if err != nil {
		t.Fatalf("snapshot save: %v\n%s", err, out)
	}
	snaps, _ := filepath.Glob(filepath.Join(via.dataDir, "server", "snapshots", "ha-*"))
	if len(snaps) != 1 {
		t.Fatalf("snapshot save made %v:\n%s", snaps, out)
	}
	for _, s := range servers {
		s.stop()
	}
	fresh := newHAServer(t, nets[0], ports, "--disable-agent", "--node-name", "restored")
	out, err = k3sm(t, time.Minute, "snapshot", "restore", filepath.Base(snaps[0]), "--dir", filepath.Dir(snaps[0]), "--data-dir", fresh.dataDir)
	if err != nil {
		t.Fatalf("snapshot restore: %v\n%s", err, out)
	}
	fresh.start()
	if _, err := fresh.client().CoreV1().ConfigMaps("default").Get(ctx(t), "ha-0999", metav1.GetOptions{}); err != nil {
		t.Errorf("the restored server lacks the snapshot's objects: %v", err)
	}
	if !strings.Contains(fresh.output(), "restored the etcd snapshot") {
		t.Errorf("the restored server did not load the snapshot:\n%s", fresh.output())
	}
	if l, err := etcdClientOf(t, fresh, endpoint(0)).MemberList(ctx(t)); err != nil || len(l.Members) != 1 {
		t.Errorf("the restored cluster's members: %v %v, want one", l, err)
	}
	// The snapshot is refused over a data dir that holds a cluster.
	out, err = k3sm(t, time.Minute, "snapshot", "restore", filepath.Base(snaps[0]), "--dir", filepath.Dir(snaps[0]), "--data-dir", via.dataDir)
	if err == nil || !strings.Contains(out, "new --data-dir") {
		t.Errorf("restore over a cluster: %v\n%s", err, out)
	}
}
