package upstream

import (
	"context"
	"errors"
	"fmt"
	encryptionconfigcontroller "k8s.io/apiserver/pkg/server/options/encryptionconfig/controller"
	"math"
	"net"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/k3s-io/kine/pkg/drivers"
	"github.com/k3s-io/kine/pkg/drivers/mysql"
	"github.com/k3s-io/kine/pkg/drivers/pgsql"
	"github.com/k3s-io/kine/pkg/drivers/sqlite"
	"github.com/k3s-io/kine/pkg/server"
	kinetls "github.com/k3s-io/kine/pkg/tls"
	"github.com/k3s-io/kine/pkg/util"
	"github.com/k3sm-dev/k3sm/internal/roleconfig"
	"github.com/k3sm-dev/k3sm/internal/supervisor"
	"github.com/sirupsen/logrus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
	"k8s.io/component-base/cli"
	apiserverapp "k8s.io/kubernetes/cmd/kube-apiserver/app"
)

// runKine serves kine's etcd API on a unix socket from the SQLite,
// PostgreSQL or MySQL driver (--datastore-endpoint). kine's endpoint
// package would do the same but links every driver (NATS with an embedded
// server, t4 with S3, ...): 24 MB more binary, whose package initialisation
// every k3sm process pays for in memory.
func runKine(args []string) int {
	supervisor.RunAsChild()
	var kc roleconfig.KineConfig
	if err := roleconfig.Read(roleconfig.Kine, args, &kc); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	logrus.SetFormatter(&logrus.TextFormatter{FullTimestamp: true, TimestampFormat: time.RFC3339Nano})
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	var wg sync.WaitGroup
	if err := serveKine(ctx, &wg, kc); err != nil {
		fmt.Fprintln(os.Stderr, "kine:", err)
		return 1
	}
	// Wait for kine to drain and close the datastore, but no longer than
	// its graceful-stop limit.
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(kineGracefulStop + time.Second):
	}
	return 0
}

// runAPIServer is the APIServer role. With roleconfig.KineFlag first it
// serves kine in this process for as long as the apiserver runs: kine
// first, so the apiserver's first etcd call finds it, and stopped only
// after the apiserver has returned, so its shutdown still reaches the
// datastore. A kill -9 ends both; SQLite's WAL keeps every committed write.
func runAPIServer(args []string) int {
	supervisor.RunAsChild()
	if err := encryptionReloadFromEnv(); err != nil {
		fmt.Fprintln(os.Stderr, "k3sm:", err)
		return 2
	}
	path, upstreamArgs := roleconfig.SplitKine(args)
	var (
		wg         sync.WaitGroup
		stopKine   = func() {}
		kineServed = make(chan error, 1)
	)
	if path != "" {
		var kc roleconfig.KineConfig
		if err := roleconfig.ReadFile(roleconfig.Kine, path, &kc); err != nil {
			fmt.Fprintln(os.Stderr, "k3sm:", err)
			return 2
		}
		logrus.SetFormatter(&logrus.TextFormatter{FullTimestamp: true, TimestampFormat: time.RFC3339Nano})
		ctx, cancel := context.WithCancel(context.Background())
		ready := make(chan struct{})
		// The apiserver has returned when kine stops: its watches would
		// hold a graceful stop open, and no call of it is in flight.
		go func() { kineServed <- serveKineReady(ctx, &wg, kc, ready, inProcessKineGrace) }()
		select {
		case <-ready:
		case err := <-kineServed:
			cancel()
			fmt.Fprintln(os.Stderr, "kine:", err)
			return 1
		}
		stopKine = func() {
			cancel()
			done := make(chan struct{})
			go func() { <-kineServed; wg.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(inProcessKineGrace + time.Second):
			}
		}
	}
	cmd := apiserverapp.NewAPIServerCommand()
	cmd.SetArgs(upstreamArgs)
	code := cli.Run(cmd)
	stopKine()
	return code
}

// kineGracefulStop is how long in-flight calls may finish at stop (kine's).
const kineGracefulStop = 5 * time.Second

// inProcessKineGrace is kine's grace at stop inside the apiserver's
// process, once the apiserver has returned.
const inProcessKineGrace = 500 * time.Millisecond

// serveKine runs until ctx ends. The settings are kine's own CLI defaults,
// passed explicitly because the library has no defaults of its own.
func serveKine(ctx context.Context, wg *sync.WaitGroup, kc roleconfig.KineConfig) error {
	return serveKineReady(ctx, wg, kc, nil, kineGracefulStop)
}

// serveKineReady is serveKine closing ready (when not nil) once the socket
// accepts connections, and giving in-flight calls grace to finish at stop.
func serveKineReady(ctx context.Context, wg *sync.WaitGroup, kc roleconfig.KineConfig, ready chan<- struct{}, grace time.Duration) error {
	scheme, dsn := util.SchemeAndAddress(kc.Endpoint)
	var newBackend drivers.Constructor
	switch scheme {
	case "sqlite":
		newBackend = sqlite.New
	case "postgres", "postgresql":
		newBackend = pgsql.New
	case "mysql":
		newBackend = mysql.New
	default:
		return fmt.Errorf("endpoint scheme %q: k3sm's kine serves sqlite://, postgres:// and mysql://", scheme)
	}
	lscheme, sock := util.SchemeAndAddress(kc.Listen)
	if lscheme != "unix" {
		return fmt.Errorf("listen %q: k3sm's kine listens on unix:// only", kc.Listen)
	}
	cfg := &drivers.Config{
		Endpoint: kc.Endpoint, Scheme: scheme, DataSourceName: dsn,
		CompactTimeout: 5 * time.Second, CompactMinRetain: 1000, CompactBatchSize: 1000,
		PollBatchSize: 500, PollInterval: time.Second,
		BackendTLSConfig: kinetls.Config{CAFile: kc.CAFile, CertFile: kc.CertFile, KeyFile: kc.KeyFile},
	}
	cfg.ConnectionPoolConfig.MaxIdle = 20
	cfg.ConnectionPoolConfig.MaxIdleTime = 2 * time.Minute
	bctx, bcancel := context.WithCancel(context.Background())
	_, backend, err := newBackend(bctx, wg, cfg)
	if err != nil {
		bcancel()
		return fmt.Errorf("%s backend: %w", scheme, err)
	}
	if err := backend.Start(bctx); err != nil {
		bcancel()
		return fmt.Errorf("starting the backend: %w", err)
	}
	// etcd's server defaults, as kine's endpoint package sets them.
	g := grpc.NewServer(
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second}),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 2 * time.Hour, Timeout: 20 * time.Second}),
		grpc.MaxConcurrentStreams(math.MaxUint32),
		grpc.MaxRecvMsgSize(int(1.5*1024*1024)+512*1024),
		grpc.MaxSendMsgSize(math.MaxInt32),
	)
	server.New(backend, "unix", 5*time.Second, "3.6.11").Register(g)
	if err := os.Remove(sock); err != nil && !errors.Is(err, os.ErrNotExist) {
		bcancel()
		return err
	}
	l, err := (&net.ListenConfig{}).Listen(ctx, "unix", sock)
	if err != nil {
		bcancel()
		return err
	}
	if err := os.Chmod(sock, 0o600); err != nil {
		l.Close()
		bcancel()
		return err
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := g.Serve(l); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			logrus.Errorf("kine gRPC server exited: %v", err)
		}
	}()
	logrus.Infof("kine serving on unix://%s", sock)
	if ready != nil {
		close(ready)
	}
	<-ctx.Done()
	t := time.AfterFunc(grace, g.Stop)
	defer t.Stop()
	g.GracefulStop()
	bcancel()
	return nil
}

// EncryptionReloadEnv sets how often the apiserver re-reads its encryption
// configuration (upstream's fixed poll is a minute, which `k3sm
// secrets-encrypt rotate-keys` waits for twice): a Go duration from 1s to
// 1m. The e2e test of rotation sets it short, as RestartMaxDelayEnv
// shortens the supervisor's back-off.
const EncryptionReloadEnv = "K3SM_ENCRYPTION_CONFIG_RELOAD"

func encryptionReloadFromEnv() error {
	v := os.Getenv(EncryptionReloadEnv)
	if v == "" {
		return nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < time.Second || d > time.Minute {
		return fmt.Errorf("%s=%q: want a duration from 1s to 1m", EncryptionReloadEnv, v)
	}
	encryptionconfigcontroller.EncryptionConfigFileChangePollDuration = d
	return nil
}
