package upstream

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"os/signal"
	"syscall"

	"go.etcd.io/etcd/server/v3/embed"

	"github.com/k3sm-dev/k3sm/internal/roleconfig"
	"github.com/k3sm-dev/k3sm/internal/supervisor"
)

// runEtcd is the Etcd role: one member of the cluster's embedded etcd,
// etcd's own server (go.etcd.io/etcd/server/v3/embed), as k3s embeds it.
// Both ports require a certificate of the cluster's etcd CA.
func runEtcd(args []string) int {
	supervisor.RunAsChild()
	var ec roleconfig.EtcdConfig
	if err := roleconfig.Read(roleconfig.Etcd, args, &ec); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	cfg, err := etcdConfig(ec)
	if err != nil {
		fmt.Fprintln(os.Stderr, "etcd:", err)
		return 2
	}
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "etcd:", err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	select {
	case <-e.Server.ReadyNotify():
		fmt.Fprintln(os.Stderr, "etcd: member", ec.Name, "ready")
	case err := <-e.Err():
		fmt.Fprintln(os.Stderr, "etcd:", err)
		e.Close()
		return 1
	case <-ctx.Done():
		e.Close()
		return 0
	}
	select {
	case err := <-e.Err():
		fmt.Fprintln(os.Stderr, "etcd:", err)
		e.Close()
		return 1
	case <-e.Server.StopNotify():
		fmt.Fprintln(os.Stderr, "etcd: the member stopped (removed from the cluster?)")
		e.Close()
		return 1
	case <-ctx.Done():
		e.Close()
		return 0
	}
}

func etcdConfig(ec roleconfig.EtcdConfig) (*embed.Config, error) {
	cfg := embed.NewConfig()
	cfg.Name, cfg.Dir = ec.Name, ec.DataDir
	urls := func(ss []string) ([]url.URL, error) {
		var us []url.URL
		for _, s := range ss {
			u, err := url.Parse(s)
			if err != nil {
				return nil, err
			}
			us = append(us, *u)
		}
		return us, nil
	}
	var err error
	if cfg.ListenClientUrls, err = urls(ec.ListenClient); err != nil {
		return nil, err
	}
	if cfg.AdvertiseClientUrls, err = urls(ec.AdvertiseClient); err != nil {
		return nil, err
	}
	if cfg.ListenPeerUrls, err = urls(ec.ListenPeer); err != nil {
		return nil, err
	}
	if cfg.AdvertisePeerUrls, err = urls(ec.AdvertisePeer); err != nil {
		return nil, err
	}
	cfg.InitialCluster, cfg.ClusterState = ec.InitialCluster, ec.ClusterState
	cfg.InitialClusterToken = "k3sm"
	cfg.ClientTLSInfo.CertFile, cfg.ClientTLSInfo.KeyFile, cfg.ClientTLSInfo.TrustedCAFile = ec.CertFile, ec.KeyFile, ec.TrustedCAFile
	cfg.ClientTLSInfo.ClientCertAuth = true
	cfg.PeerTLSInfo.CertFile, cfg.PeerTLSInfo.KeyFile, cfg.PeerTLSInfo.TrustedCAFile = ec.CertFile, ec.KeyFile, ec.TrustedCAFile
	cfg.PeerTLSInfo.ClientCertAuth = true
	// Compact what the apiserver no longer needs, as k3s does, and keep
	// the log readable in etcd.log.
	cfg.AutoCompactionMode, cfg.AutoCompactionRetention = "periodic", "5m"
	cfg.LogLevel = "warn"
	cfg.SnapshotCount = 10000
	return cfg, nil
}
