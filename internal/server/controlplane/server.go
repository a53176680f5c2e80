package controlplane

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"k8s.io/client-go/rest"

	joinv1 "github.com/k3sm-dev/k3sm/api/join/v1"
	"github.com/k3sm-dev/k3sm/internal/datadir"
	"github.com/k3sm-dev/k3sm/internal/server/datastore"
	"github.com/k3sm-dev/k3sm/internal/server/serverboot"
	"github.com/k3sm-dev/k3sm/internal/supervisor"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// Timeouts of the bring-up phases.
const (
	apiserverReadyTimeout = 3 * time.Minute
	bootstrapTimeout      = time.Minute
	componentReadyTimeout = 2 * time.Minute
)

// Addon plugs more components into the server's bring-up, under the same
// supervisor (the runtime daemon, the node, later netd). Each hook is
// optional and runs at its phase:
//   - Early: before kine, for what needs only the data dir (e.g. runtimed);
//   - Starting: once the apiserver process is started, before it is ready,
//     for processes that get going meanwhile but wait for Verified before
//     they act (the node, at its start gate); they stop before it;
//   - Verified: once the apiserver is up and authorization is verified;
//   - Ready: after the scheduler and controller-manager are healthy, to
//     wait for what Verified started.
type Addon struct {
	Early, Starting, Verified, Ready AddonHook
}

// AddonHook is one phase of an Addon.
type AddonHook func(ctx context.Context, p *Plane, s *supervisor.Supervisor) error

// Server is a running control plane.
type Server struct {
	Plane      *Plane
	Supervisor *supervisor.Supervisor
	Started    time.Time
}

// Run brings up kine, the apiserver (waiting for /readyz), verifies
// authorization fail-closed, then starts the scheduler and controller-manager
// (one process) and any addons. It blocks until ctx ends, then stops every child.
func Run(ctx context.Context, cfg Config, log *slog.Logger, addons ...Addon) error {
	start := time.Now()
	if err := cfg.Validate(); err != nil {
		return err
	}
	release, err := Preflight(&cfg)
	if err != nil {
		return err
	}
	defer release()
	joinURLs, err := checkDatastore(ctx, &cfg, log)
	if err != nil {
		return err
	}
	p, err := NewPlane(&cfg)
	if err != nil {
		return err
	}
	sup, err := supervisor.New(p.Layout.LogDir(), log)
	if err != nil {
		return err
	}
	// What `k3sm status` reads; removed once every child is stopped (the
	// lock says whether a server runs, so a file left by a killed server
	// is never believed).
	sup.StateFile = p.Layout.ComponentsFile()
	if err := writeRunInfo(p.Layout, cfg.runInfo(start)); err != nil {
		return err
	}
	defer os.Remove(p.Layout.ServerInfoFile())
	defer os.Remove(p.Layout.ComponentsFile())
	defer sup.StopAll()
	if cfg.Datastore.Embedded {
		if err := startEtcd(ctx, p, sup, joinURLs, log); err != nil {
			return err
		}
	}

	for _, addon := range addons {
		if addon.Early != nil {
			if err := addon.Early(ctx, p, sup); err != nil {
				return err
			}
		}
	}
	apiComp, err := p.APIServer()
	if err != nil {
		return err
	}
	apiserver, err := sup.Start(ctx, apiComp)
	if err != nil {
		return err
	}
	for _, addon := range addons {
		if addon.Starting != nil {
			if err := addon.Starting(ctx, p, sup); err != nil {
				return err
			}
		}
	}
	actx, acancel := context.WithTimeout(ctx, apiserverReadyTimeout)
	err = apiserver.WaitReady(actx)
	acancel()
	if err != nil {
		return err
	}
	log.Info("apiserver ready", "after", time.Since(start).Round(time.Millisecond).String())

	// The scheduler and controller-manager (one process) start while
	// authorization is verified: they serve no users, and if verification
	// fails everything is stopped, so the server still never runs unverified.
	ctrlComp, err := p.Controllers()
	if err != nil {
		return err
	}
	ctrl, err := sup.Start(ctx, ctrlComp)
	if err != nil {
		return err
	}
	rc, err := p.AdminConfig()
	if err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return err
	}
	bctx, cancel := context.WithTimeout(ctx, bootstrapTimeout)
	bstart := time.Now()
	err = BootstrapAuthorization(bctx, client, log)
	cancel()
	if err != nil {
		return fmt.Errorf("%w (see %s)", err, sup.LogDir+"/kube-apiserver.log")
	}
	log.Debug("authorization verified", "took", time.Since(bstart).Round(time.Millisecond).String())
	// What a first pod in default needs, made now rather than when the
	// controller-manager gets to it, while the addons start (defaults.go).
	dctx, dcancel := context.WithTimeout(ctx, componentReadyTimeout)
	defer dcancel()
	go publishDefaults(dctx, client, controllerManager{p}.Args(), log)
	if cfg.Datastore.External() && !cfg.Datastore.Embedded {
		if err := startBootstrapSync(ctx, p, client, log); err != nil {
			return err
		}
	}
	if cfg.Datastore.Embedded {
		removeDeletedMembers(ctx, p, client, log)
	}
	for _, addon := range addons {
		if addon.Verified != nil {
			if err := addon.Verified(ctx, p, sup); err != nil {
				return err
			}
		}
	}
	wctx, cancel := context.WithTimeout(ctx, componentReadyTimeout)
	err = ctrl.WaitReady(wctx)
	cancel()
	if err != nil {
		return err
	}
	log.Debug("scheduler and controller-manager healthy")
	for _, addon := range addons {
		if addon.Ready != nil {
			if err := addon.Ready(ctx, p, sup); err != nil {
				return err
			}
		}
	}
	log.Debug("addons ready")
	// "Up" means a user can create a pod in default at once: admission
	// refuses pods until the default ServiceAccount exists, and a pod's
	// service-account volume needs kube-root-ca.crt. publishDefaults has
	// usually made both by now; if it could not, the controller-manager will.
	wctx, wcancel := context.WithTimeout(ctx, componentReadyTimeout)
	err = WaitUsable(wctx, client)
	wcancel()
	dcancel()
	if err != nil {
		return fmt.Errorf("%w (see %s)", err, ctrl.LogPath())
	}
	log.Info(fmt.Sprintf("k3sm is up in %s: API %s, kubeconfig %s, data %s, logs %s",
		time.Since(start).Round(time.Millisecond), cfg.LocalAPIURL(), p.Layout.AdminKubeconfig(), cfg.DataDir, p.Layout.LogDir()))
	// Start-up is over: the children lower their GC targets, and the
	// supervisor, which now only waits on them, does too.
	sup.Settle()
	supervisor.SettleSelf()
	<-ctx.Done()
	log.Info("stopping", "reason", context.Cause(ctx).Error())
	return nil
}

// datastoreWait is how long the server waits at start for an external
// database that does not answer yet (one started at the same boot).
var datastoreWait = 10 * time.Second

// checkDatastore refuses a datastore other than the one that holds the
// data directory's cluster, and one that does not answer, before
// anything is started; then records it as the data directory's (before
// the apiserver writes anything: a first start stopped half-way must find
// its own cluster, not "another data dir's", when it starts again).
// With embedded etcd, a server joining through --server first fills its
// data dir from the bootstrap record that server hands out, and returns
// the etcd members' client URLs it adds itself through.
func checkDatastore(ctx context.Context, cfg *Config, log *slog.Logger) ([]string, error) {
	var joinURLs []string
	if cfg.Datastore.Embedded {
		if err := datastore.Match(datadir.New(cfg.DataDir), cfg.Datastore); err != nil {
			return nil, err
		}
		if cfg.Server != "" && !isMember(datadir.New(cfg.DataDir)) {
			urls, err := joinEtcdBootstrap(ctx, cfg, log)
			if err != nil {
				return nil, err
			}
			joinURLs = urls
		}
	} else if err := datastoreUsable(ctx, cfg, log); err != nil {
		return nil, err
	}
	if err := datastore.Write(datadir.New(cfg.DataDir), cfg.Datastore); err != nil {
		return nil, fmt.Errorf("recording the datastore: %w", err)
	}
	return joinURLs, nil
}

func datastoreUsable(ctx context.Context, cfg *Config, log *slog.Logger) error {
	ds := cfg.Datastore
	if err := datastore.Match(datadir.New(cfg.DataDir), ds); err != nil {
		return err
	}
	if !ds.External() {
		return nil
	}
	log.Info("datastore", "kind", string(ds.Kind()), "endpoint", ds.Redacted())
	if err := ds.WaitAnswer(ctx, datastoreWait, func(err error) {
		log.Warn("the datastore does not answer yet; retrying", "endpoint", ds.Redacted(), "err", err)
	}); err != nil {
		return err
	}
	// A new data dir on a database that already holds a cluster would
	// serve it with new certificates: the other server's nodes and
	// credentials would stop working.
	if _, recorded, _ := datastore.Recorded(datadir.New(cfg.DataDir)); recorded {
		return nil
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	holds, err := ds.HoldsCluster(cctx)
	if err != nil {
		return &FieldError{Flag: datastore.FlagEndpoint, Value: ds.Redacted(), Problem: "cannot tell whether the database already holds a cluster: " + err.Error(),
			Fix: "check that the user may read the database; nothing was started"}
	}
	if cfg.Token != "" {
		if !holds {
			return &FieldError{Flag: serverboot.FlagToken, Value: "(given)", Problem: "the database " + ds.Redacted() + " holds no cluster to join",
				Fix: "start the cluster's first server on it without --token, or give the --datastore-endpoint of the token's cluster; nothing was started"}
		}
		return joinCluster(ctx, cfg, log)
	}
	if holds {
		return &FieldError{Flag: datastore.FlagEndpoint, Value: ds.Redacted(),
			Problem: "the database already holds a cluster, made by the server of another --data-dir",
			Fix:     "to add this server to it, give --token with a token from `k3sm token create` on one of its servers; or start with that server's --data-dir, or name an empty database; nothing was started"}
	}
	return nil
}

// bootstrapWait is how long a joining server waits for its token's
// record: the cluster's servers write it within a second of `k3sm token
// create`.
var bootstrapWait = 10 * time.Second

// joinCluster fills this server's new data directory from the bootstrap
// record of its token in the cluster's database.
func joinCluster(ctx context.Context, cfg *Config, log *slog.Logger) error {
	tok, err := joinv1.ParseToken(cfg.Token)
	if err != nil {
		return err
	}
	store, err := cfg.Datastore.Bootstrap()
	if err != nil {
		return err
	}
	defer store.Close()
	log.Info("joining the cluster in the datastore", "token", tok.ID)
	return serverboot.Join(ctx, store, tok, datadir.New(cfg.DataDir), cfg.SharedSettings(), time.Now(), bootstrapWait, func(err error) {
		log.Info("waiting for the cluster's servers to write the token's bootstrap record", "err", err)
	})
}

// SharedSettings are the flags every server of a cluster must give alike.
func (c *Config) SharedSettings() map[string]string {
	m := serverboot.Settings(c.ClusterCIDR, c.ServiceCIDR, c.ClusterDNS, c.ClusterDomain)
	m[serverboot.FlagSecretsEncryption] = fmt.Sprint(c.Ops.SecretsEncryption)
	return m
}

// startBootstrapSync keeps the sealed bootstrap record of every join token
// in the external datastore, so that another server can join with any
// token `k3sm token create` made on any server.
func startBootstrapSync(ctx context.Context, p *Plane, client kubernetes.Interface, log *slog.Logger) error {
	store, err := p.Cfg.Datastore.Bootstrap()
	if err != nil {
		return err
	}
	c := p.Cfg
	sy := &serverboot.Syncer{Client: client, Store: store, Layout: p.Layout, Log: log,
		Settings: serverboot.Settings(c.ClusterCIDR, c.ServiceCIDR, c.ClusterDNS, c.ClusterDomain)}
	go func() {
		defer store.Close()
		sy.Run(ctx)
	}()
	return nil
}

// publishDefaults makes default's ServiceAccount and kube-root-ca.crt as
// the controller-manager running with cmArgs would. A failure only means
// start-up waits for the controller-manager to make them, so it is logged.
func publishDefaults(ctx context.Context, client kubernetes.Interface, cmArgs []string, log *slog.Logger) {
	start := time.Now()
	ca, ok, err := PublishedRootCA(cmArgs)
	if err != nil {
		log.Warn("kube-root-ca.crt left to the controller-manager", "err", err)
	}
	if !ok {
		ca = nil
	}
	if err := EnsureNamespaceDefaults(ctx, client, metav1.NamespaceDefault, ca); err != nil {
		log.Debug("default ServiceAccount and kube-root-ca.crt left to the controller-manager", "err", err)
		return
	}
	log.Debug("created default ServiceAccount and kube-root-ca.crt", "took", time.Since(start).Round(time.Millisecond).String())
}

// WaitUsable waits until the controller-manager has made what a first pod
// in the default namespace needs: the default ServiceAccount (admission
// refuses pods without it) and the kube-root-ca.crt ConfigMap (the
// service-account volume of every pod projects it).
func WaitUsable(ctx context.Context, client kubernetes.Interface) error {
	missing := ""
	for {
		missing = ""
		if _, err := client.CoreV1().ServiceAccounts(metav1.NamespaceDefault).Get(ctx, "default", metav1.GetOptions{}); err != nil {
			missing = "ServiceAccount default/default: " + err.Error()
		} else if _, err := client.CoreV1().ConfigMaps(metav1.NamespaceDefault).Get(ctx, "kube-root-ca.crt", metav1.GetOptions{}); err != nil {
			missing = "ConfigMap default/kube-root-ca.crt: " + err.Error()
		}
		if missing == "" {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the controller-manager has not created %s", missing)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// AdminConfig is the server's own admin client config (user agent
// k3sm-supervisor). client-go's default of 5 requests/s would add seconds
// to start-up.
func (p *Plane) AdminConfig() (*rest.Config, error) {
	rc, err := clientcmd.BuildConfigFromFlags("", p.Layout.Cred("admin"))
	if err != nil {
		return nil, err
	}
	rc.UserAgent = "k3sm-supervisor"
	rc.QPS, rc.Burst = 100, 200
	return rc, nil
}
