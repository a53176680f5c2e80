//go:build linux

// Command failover measures issue 32's failover figure: after kill -9 of
// the server holding the controllers' leases, the time to the first
// successful write through an agent's load balancer (internal/agent/apilb),
// p50 over -rounds kills (goal ≤ 5 s), in two modes:
//
//   - kill: SIGKILL of every process of the machine (the server's tree and
//     anything else in its network namespace), at once; the machine stays,
//     so its kernel closes their sockets (RST/FIN).
//   - partition: the machine vanishes: its link goes down first (no RST,
//     no FIN ever reaches anyone), then its processes are SIGKILLed.
//
// The failover is the first create acknowledged among the requests started
// after the kill, by another server (the writer reads which one answered
// from the connection's serving certificate).
//
// Three `k3sm server --disable-agent` share one PostgreSQL: the first makes
// the cluster, the others join with a token. Each runs in a network
// namespace of its own (`ip netns exec`) and a UTS namespace of its own
// (`unshare --uts`, hostname failover-<i>), so the kube-controller-manager
// Lease's holderIdentity (<hostname>_<uuid>) names the server holding it.
// A writer in this process creates ConfigMaps through a balancer over the
// three servers, the holder first, while the holder is killed; the killed
// server is restarted from its data dir before the next round. At the end
// every acknowledged ConfigMap must exist.
//
// It needs root and a network namespace of its own, which bench/run.sh
// gives it (`unshare --net`). There it puts 192.168.80.1 on a bridge of its
// own, with PostgreSQL on it; the servers are 192.168.80.2-4, each in a
// namespace it creates (`ip netns add`) plugged into the bridge by a veth
// pair. Traffic stays on 127.0.0.0/8 and those namespaces; what it made
// (namespaces, links, processes, files) is removed at exit.
//
//	sudo bench/run.sh failover
//	go build -o _output/bench/failover ./bench/failover && sudo unshare --net _output/bench/failover -bin bin/k3sm -results ""
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/k3sm-dev/k3sm/bench/internal/resultsfile"
)

type options struct {
	bin        string
	rounds     int
	results    string
	invocation string
}

func main() {
	var o options
	def := os.Getenv("K3SM_BIN")
	if def == "" {
		def = "bin/k3sm"
	}
	flag.StringVar(&o.bin, "bin", def, "k3sm binary to measure (default $K3SM_BIN or bin/k3sm)")
	flag.IntVar(&o.rounds, "rounds", 5, "kills per mode (kill, partition); the modes take turns")
	flag.StringVar(&o.results, "results", "bench/RESULTS.md", "file whose bench/failover section is replaced with the report (empty: print only)")
	flag.StringVar(&o.invocation, "invocation", "bench/run.sh failover", "the command that reproduces this, for the report")
	flag.Parse()
	if o.rounds < 1 || o.rounds > 99 {
		fmt.Fprintln(os.Stderr, "bench/failover: -rounds must be 1 to 99")
		os.Exit(2)
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "bench/failover: needs root: every server runs in a network namespace of its own (ip netns add) "+
			"and PostgreSQL as its own account; run it as root through `bench/run.sh failover`")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	err := run(ctx, o)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench/failover:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, o options) (err error) {
	if err := ownNetns(); err != nil {
		return err
	}
	bin, err := filepath.Abs(o.bin)
	if err != nil {
		return err
	}
	if st, err := os.Stat(bin); err != nil || st.Mode()&0o111 == 0 {
		return fmt.Errorf("%s is missing or not executable: build it with `make bin/k3sm` or pass -bin", bin)
	}
	m := collectMachine(bin)
	// Short path: unix sockets live under the data dirs.
	work, err := os.MkdirTemp("", "k3sm-failover-")
	if err != nil {
		return err
	}
	// PostgreSQL runs as its own account, which must reach its directory.
	if err := os.Chmod(work, 0o755); err != nil {
		os.RemoveAll(work)
		return err
	}
	logf("work dir %s", work)
	b := &bench{work: work, bin: bin, id: os.Getpid()}
	defer func() {
		if cerr := b.cleanup(); cerr != nil {
			logf("cleanup: %v", cerr)
			if err == nil {
				err = cerr
			}
		}
	}()
	if err := b.setup(ctx); err != nil {
		return err
	}
	var rounds []round
	for n := 1; n <= 2*o.rounds; n++ {
		mode := modeKill
		if n%2 == 0 {
			mode = modePartition
		}
		r, err := b.round(ctx, n, mode)
		if err != nil {
			return fmt.Errorf("round %d (%s): %w", n, mode, err)
		}
		rounds = append(rounds, r)
	}
	v, err := b.verify(ctx)
	if err != nil {
		return err
	}
	report := render(o, m, rounds, v)
	fmt.Print(report)
	if o.results != "" {
		if err := resultsfile.WriteSection(o.results, beginMark, endMark, report); err != nil {
			return err
		}
		logf("recorded in %s", o.results)
	}
	if len(v.lost) > 0 {
		return fmt.Errorf("%d acknowledged writes lost, e.g. %v", len(v.lost), v.lost[:min(5, len(v.lost))])
	}
	return nil
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "bench/failover: "+format+"\n", args...)
}

func sleep(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}
