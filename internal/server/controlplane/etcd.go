package controlplane

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	joinv1 "github.com/k3sm-dev/k3sm/api/join/v1"
	"github.com/k3sm-dev/k3sm/internal/datadir"
	"github.com/k3sm-dev/k3sm/internal/pki"
	"github.com/k3sm-dev/k3sm/internal/roleconfig"
	"github.com/k3sm-dev/k3sm/internal/server/datastore"
	"github.com/k3sm-dev/k3sm/internal/server/serverboot"
	"github.com/k3sm-dev/k3sm/internal/supervisor"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// Embedded etcd: a server started with --cluster-init keeps the cluster
// in an etcd member of its own (the Etcd role) instead of SQLite, and
// servers started with --server and --token add members to it, as k3s
// does. The apiserver speaks to its local member, with mutual TLS from
// the cluster's etcd CA, which the servers share (serverboot.EtcdCA).

// Default ports of the embedded etcd member, etcd's own.
const (
	DefaultEtcdClientPort = 2379
	DefaultEtcdPeerPort   = 2380
)

// File names under the TLS directory of the member's certificate (it
// serves both ports and authenticates the member to its peers) and of the
// apiserver's client certificate.
const (
	etcdMemberCert = "etcd-member"
	etcdClientCert = "client-etcd-apiserver"
)

// embeddedDatastore is the datastore of a server with an embedded etcd
// member: its client port on loopback, with the etcd CA and the
// apiserver's client certificate.
func (c *Config) embeddedDatastore() datastore.Config {
	l := datadir.New(c.DataDir)
	return datastore.Config{Endpoint: fmt.Sprintf("https://127.0.0.1:%d", c.EtcdClientPort),
		CAFile: l.TLS(serverboot.EtcdCA + ".crt"), CertFile: l.TLS(etcdClientCert + ".crt"), KeyFile: l.TLS(etcdClientCert + ".key"), Embedded: true}
}

// resolveEmbedded decides whether this server runs an etcd member: asked
// to (--cluster-init, or --server with --token and no external
// datastore), or its data dir's cluster lives in one. It checks the flags
// that go with it.
func (c *Config) resolveEmbedded(add func(flag, value, problem, fix string)) {
	joinsEtcd := c.Server != "" && c.Token != "" && c.Datastore.Endpoint == ""
	embedded := c.ClusterInit || joinsEtcd
	if !embedded && c.Datastore.Endpoint == "" && c.DataDir != "" {
		if rec, ok, _ := datastore.Recorded(datadir.New(c.DataDir)); ok && rec.Config.Embedded {
			embedded = true
		}
	}
	switch {
	case c.ClusterInit && c.Datastore.Endpoint != "":
		add("cluster-init", "true", "given with --datastore-endpoint", "drop one: --cluster-init keeps the cluster in an etcd member of this server, --datastore-endpoint in a database you run")
	case c.ClusterInit && c.Token != "":
		add("cluster-init", "true", "given with --token", "drop one: --cluster-init makes a new cluster, --token joins an existing one")
	case c.Server != "" && c.Token == "":
		add(serverboot.FlagServer, c.Server, "given without --token", "give the token `k3sm token create` printed on that server")
	case c.Server != "" && c.Datastore.Endpoint != "":
		add(serverboot.FlagServer, c.Server, "given with --datastore-endpoint",
			"drop --server: servers on an external datastore find their cluster in it (--token alone)")
	}
	if c.Server != "" {
		if u, err := url.Parse(c.Server); err != nil || u.Scheme != "https" || u.Host == "" || u.Port() == "" || (u.Path != "" && u.Path != "/") {
			add(serverboot.FlagServer, c.Server, "not the server's join endpoint", fmt.Sprintf("give https://HOST:PORT (its --supervisor-port, %d by default)", DefaultSupervisorPort))
		} else {
			c.Server = "https://" + u.Host
		}
	}
	for _, p := range []struct {
		flag string
		v    int
	}{{"etcd-client-port", c.EtcdClientPort}, {"etcd-peer-port", c.EtcdPeerPort}} {
		if p.v < 1 || p.v > 65535 {
			add(p.flag, fmt.Sprint(p.v), "not a TCP port", "use a number from 1 to 65535")
		}
	}
	if embedded && c.Datastore.Endpoint == "" {
		c.Datastore = c.embeddedDatastore()
	}
}

// isMember reports whether this data dir's etcd member has started once
// (etcd keeps its data under member/).
func isMember(l datadir.Layout) bool {
	_, err := os.Stat(filepath.Join(l.EtcdDir(), "member"))
	return err == nil
}

// joinEtcdBootstrap fills a new data dir of a server joining a cluster
// with embedded etcd from the bootstrap record the server at --server
// hands out for the token.
func joinEtcdBootstrap(ctx context.Context, cfg *Config, log *slog.Logger) ([]string, error) {
	tok, err := joinv1.ParseToken(cfg.Token)
	if err != nil {
		return nil, err
	}
	log.Info("joining the cluster of the server", "server", cfg.Server, "token", tok.ID)
	resp, err := serverboot.Fetch(ctx, cfg.Server, tok)
	if err != nil {
		return nil, err
	}
	l := datadir.New(cfg.DataDir)
	b, err := serverboot.Open(resp.Record, tok)
	if err != nil {
		return nil, &FieldError{Flag: serverboot.FlagToken, Value: "(given)", Problem: err.Error(), Fix: "copy the whole token; nothing was started"}
	}
	if _, ok := b.Files[filepath.ToSlash(filepath.Join("server", "tls", serverboot.EtcdCA+".key"))]; !ok {
		return nil, &FieldError{Flag: serverboot.FlagServer, Value: cfg.Server, Problem: "its cluster has no embedded etcd",
			Fix: "give its --datastore-endpoint and --token, without --server; nothing was started"}
	}
	if err := serverboot.Accept(b, tok, l, cfg.SharedSettings(), time.Now()); err != nil {
		return nil, err
	}
	return resp.EtcdClientURLs, nil
}

// etcdPeerURL is what the other members dial.
func (c *Config) etcdPeerURL() string {
	return "https://" + net.JoinHostPort(c.AdvertiseAddress, strconv.Itoa(c.EtcdPeerPort))
}

// etcdClientURLs are the member's client URLs: loopback for the local
// apiserver, the advertise address for joining servers.
func (c *Config) etcdClientURLs() []string {
	urls := []string{"https://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(c.EtcdClientPort))}
	if ip := net.ParseIP(c.AdvertiseAddress); ip != nil && !ip.IsLoopback() {
		urls = append(urls, "https://"+net.JoinHostPort(c.AdvertiseAddress, strconv.Itoa(c.EtcdClientPort)))
	}
	return urls
}

// EtcdClient is a client of the cluster's etcd through urls (the local
// member when empty), as the apiserver is.
func (p *Plane) EtcdClient(urls []string) (*clientv3.Client, error) {
	ds := p.Cfg.Datastore
	if len(urls) == 0 {
		urls = ds.EtcdEndpoints()
	}
	tc, err := ds.TLSConfig()
	if err != nil {
		return nil, err
	}
	return clientv3.New(clientv3.Config{Endpoints: urls, TLS: tc, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
}

// addEtcdMember adds this server as a member through the cluster's
// members at urls and returns the initial cluster its member starts
// with. A member added by an earlier start that stopped before its member
// ran is taken up again.
func addEtcdMember(ctx context.Context, p *Plane, urls []string, log *slog.Logger) (string, error) {
	cli, err := p.EtcdClient(urls)
	if err != nil {
		return "", err
	}
	defer cli.Close()
	peer := p.Cfg.etcdPeerURL()
	name := p.Cfg.NodeName
	actx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	list, err := cli.MemberList(actx)
	if err != nil {
		return "", fmt.Errorf("the cluster's etcd at %v: %w", urls, err)
	}
	var id uint64
	for _, m := range list.Members {
		switch {
		case slices.Contains(m.PeerURLs, peer) && m.Name == "":
			id = m.ID // added before, never started
		case slices.Contains(m.PeerURLs, peer):
			return "", &FieldError{Flag: "advertise-address", Value: p.Cfg.AdvertiseAddress,
				Problem: "etcd member " + m.Name + " already has the peer URL " + peer,
				Fix:     "a server that was a member with this address must be removed first (k3sm docs/ha.md); or use another --advertise-address"}
		case m.Name == name:
			return "", &FieldError{Flag: "node-name", Value: name, Problem: "the cluster's etcd already has a member of this name",
				Fix: "give every server its own --node-name"}
		}
	}
	for id == 0 {
		resp, err := cli.MemberAdd(actx, []string{peer})
		if err != nil {
			// etcd refuses a member while one just added is not yet
			// connected to the others for a few seconds (servers joining
			// one after the other): it is retried.
			if errors.Is(err, rpctypes.ErrUnhealthy) && actx.Err() == nil {
				log.Info("the cluster's etcd is not ready for another member yet; retrying", "err", err)
				select {
				case <-actx.Done():
				case <-time.After(time.Second):
				}
				continue
			}
			return "", fmt.Errorf("adding this server as an etcd member: %w", err)
		}
		id, list.Members = resp.Member.ID, resp.Members
		log.Info("added as an etcd member", "name", name, "peer", peer)
	}
	var parts []string
	for _, m := range list.Members {
		n := m.Name
		if m.ID == id {
			n = name
		}
		if n == "" {
			continue // another member added but not started yet
		}
		for _, u := range m.PeerURLs {
			parts = append(parts, n+"="+u)
		}
	}
	return strings.Join(parts, ","), nil
}

// etcdComponent is the embedded etcd member's process: ready when it
// answers on its client port.
type etcdComponent struct {
	p    *Plane
	args []string
}

func (e etcdComponent) Name() string { return roleconfig.Etcd }
func (e etcdComponent) Command() supervisor.Command {
	return supervisor.Command{Path: e.p.Cfg.Executable, Args: append([]string{roleconfig.Etcd}, e.args...), Dir: e.p.Layout.ServerDir()}
}
func (e etcdComponent) Ready(ctx context.Context) error { return e.p.Cfg.Datastore.Check(ctx) }

// startEtcd starts this server's etcd member (first adding it to the
// cluster when it joins) and waits until it answers.
func startEtcd(ctx context.Context, p *Plane, sup *supervisor.Supervisor, joinURLs []string, log *slog.Logger) error {
	c := p.Cfg
	ec := roleconfig.EtcdConfig{Name: c.NodeName, DataDir: p.Layout.EtcdDir(),
		ListenClient: c.etcdClientURLs(), AdvertiseClient: c.etcdClientURLs()[len(c.etcdClientURLs())-1:],
		ListenPeer: []string{c.etcdPeerURL()}, AdvertisePeer: []string{c.etcdPeerURL()},
		InitialCluster: c.NodeName + "=" + c.etcdPeerURL(), ClusterState: "new",
		CertFile: p.Certs.EtcdMember.CertPath, KeyFile: p.Certs.EtcdMember.KeyPath, TrustedCAFile: p.Certs.EtcdCA.CertPath}
	if ip := net.ParseIP(c.AdvertiseAddress); ip == nil || ip.IsLoopback() {
		// One member on a loopback-only machine: its peers are none.
		ec.ListenPeer = []string{"https://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(c.EtcdPeerPort))}
		ec.AdvertisePeer, ec.InitialCluster = ec.ListenPeer, c.NodeName+"="+ec.ListenPeer[0]
	}
	_, statErr := os.Stat(p.Layout.EtcdRestoreFile())
	// A restore stopped half-way is loaded again (puts of the same keys).
	restore := statErr == nil
	if !isMember(p.Layout) && len(joinURLs) > 0 {
		initial, err := addEtcdMember(ctx, p, joinURLs, log)
		if err != nil {
			return err
		}
		ec.InitialCluster, ec.ClusterState = initial, "existing"
	} else if !isMember(p.Layout) && !c.ClusterInit && !restore {
		return &FieldError{Flag: serverboot.FlagServer, Value: c.Server, Problem: "this data dir's etcd member never started",
			Fix: "start it with --server and --token of a running server of the cluster, or --cluster-init for a new cluster in a new --data-dir"}
	}
	args, err := roleconfig.Write(p.Layout.RoleConfig(roleconfig.Etcd), ec)
	if err != nil {
		return err
	}
	h, err := sup.Start(ctx, etcdComponent{p, args})
	if err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := h.WaitReady(wctx); err != nil {
		return fmt.Errorf("etcd member %s: %w (see %s)", c.NodeName, err, sup.LogDir+"/etcd.log")
	}
	log.Info("etcd member ready", "name", c.NodeName, "peer", ec.AdvertisePeer[0])
	if restore {
		// A snapshot restored onto this new first server (k3sm snapshot
		// restore): its keys go into the new member before the apiserver
		// starts, once.
		n, err := c.Datastore.EtcdLoad(ctx, p.Layout.EtcdRestoreFile())
		if err != nil {
			return err
		}
		if err := os.Remove(p.Layout.EtcdRestoreFile()); err != nil {
			return err
		}
		log.Info("restored the etcd snapshot into the new member", "keys", n)
	}
	return nil
}

// etcdLeafs issues the member's certificate (both ports, and towards its
// peers) and the apiserver's client certificate from the etcd CA.
func etcdLeafs(c *Config, dir string, certs *Certs) error {
	ca, err := pki.LoadOrCreateCA(dir, serverboot.EtcdCA, "k3sm-etcd-ca")
	if err != nil {
		return err
	}
	ips := []net.IP{net.ParseIP("127.0.0.1")}
	if ip := net.ParseIP(c.AdvertiseAddress); ip != nil && !ip.IsLoopback() {
		ips = append(ips, ip)
	}
	certs.EtcdCA = ca
	if certs.EtcdMember, err = ca.Ensure(dir, etcdMemberCert, pki.LeafSpec{CommonName: "etcd-" + c.NodeName,
		DNSNames: []string{"localhost", c.NodeName}, IPs: ips, Server: true, Client: true}); err != nil {
		return err
	}
	if certs.EtcdClient, err = ca.Ensure(dir, etcdClientCert, pki.LeafSpec{CommonName: "kube-apiserver-etcd-client", Client: true}); err != nil {
		return err
	}
	return nil
}

// removeDeletedMembers removes the etcd member of a server whose Node is
// deleted, as k3s does: `kubectl delete node NAME` is how a server that is
// gone for good leaves the quorum. Every server with a member runs it; the
// first to act removes it, the others find it gone.
func removeDeletedMembers(ctx context.Context, p *Plane, client kubernetes.Interface, log *slog.Logger) {
	f := informers.NewSharedInformerFactory(client, 0)
	_, _ = f.Core().V1().Nodes().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			n, ok := obj.(*corev1.Node)
			if !ok || n.Name == p.Cfg.NodeName {
				return
			}
			if err := removeMember(ctx, p, n.Name, log); err != nil {
				log.Warn("the etcd member of a deleted node was not removed; remove it with etcd's MemberRemove", "node", n.Name, "err", err)
			}
		},
	})
	f.Start(ctx.Done())
}

// removeMember removes the etcd member named name, if there is one.
func removeMember(ctx context.Context, p *Plane, name string, log *slog.Logger) error {
	cli, err := p.EtcdClient(nil)
	if err != nil {
		return err
	}
	defer cli.Close()
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	list, err := cli.MemberList(cctx)
	if err != nil {
		return err
	}
	for _, m := range list.Members {
		if m.Name != name {
			continue
		}
		if _, err := cli.MemberRemove(cctx, m.ID); err != nil && !errors.Is(err, rpctypes.ErrMemberNotFound) {
			return err
		}
		log.Info("removed the etcd member of a deleted node", "node", name, "member", fmt.Sprintf("%x", m.ID))
	}
	return nil
}
