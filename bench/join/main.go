//go:build linux

// Command join measures issue 31's figures for `k3sm agent`: the time from
// starting an agent to its Node being Ready, p50 over -rounds joins (each a
// fresh agent: new data dir, node name and network namespace), and the
// memory (PSS) of an idle agent's processes, beside the server's own node
// processes on the same machine.
//
// It needs root and a network namespace of its own, which bench/run.sh
// gives it (`unshare --net`). There it starts one `k3sm server` and puts
// 192.168.77.1 on a bridge of its own; each agent runs in a namespace it
// creates (`ip netns add`), plugged into that bridge by a veth pair, as
// 192.168.77.2. Traffic stays on 127.0.0.0/8 and those namespaces; the
// namespaces and links it made are deleted at exit, and so are its
// processes and files.
//
//	sudo bench/run.sh join
//	go build -o /tmp/join ./bench/join && sudo unshare --net /tmp/join -bin bin/k3sm
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
	idle       time.Duration
	results    string
	invocation string
}

// settle is the pause before each join, so that every join meets a server
// that has finished with the one before (a Node deleted, its range freed).
const settle = 5 * time.Second

func main() {
	var o options
	def := os.Getenv("K3SM_BIN")
	if def == "" {
		def = "bin/k3sm"
	}
	flag.StringVar(&o.bin, "bin", def, "k3sm binary to measure; k3sm-runtimed, k3sm-shim and k3sm-netd must be beside it (default $K3SM_BIN or bin/k3sm)")
	flag.IntVar(&o.rounds, "rounds", 5, "joins, one after another, each a fresh agent (data dir, node name, network namespace)")
	flag.DurationVar(&o.idle, "idle", 30*time.Second, "how long the last agent idles before its memory is read")
	flag.StringVar(&o.results, "results", "", "file whose bench/join section is replaced with the report (empty: print only)")
	flag.StringVar(&o.invocation, "invocation", "bench/run.sh join", "the command that reproduces this, for the report")
	flag.Parse()
	if o.rounds < 1 || o.rounds > 999 || o.idle < 0 {
		fmt.Fprintln(os.Stderr, "bench/join: -rounds must be 1 to 999 and -idle at least 0")
		os.Exit(2)
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "bench/join: needs root: every agent runs in a network namespace of its own (ip netns add) "+
			"with k3sm-netd; run it as root through `bench/run.sh join`")
		os.Exit(1)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	err := run(ctx, o)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench/join:", err)
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
	for _, name := range binaries {
		if st, err := os.Stat(filepath.Join(filepath.Dir(bin), name)); err != nil || st.Mode()&0o111 == 0 {
			return fmt.Errorf("%s is missing or not executable beside %s: build with "+
				"`make bin/k3sm bin/k3sm-runtimed bin/k3sm-shim bin/k3sm-netd` or pass -bin", name, bin)
		}
	}
	m := collectMachine()
	// Short path: the runtime's unix sockets live under the data dirs.
	work, err := os.MkdirTemp("", "k3sm-join-")
	if err != nil {
		return err
	}
	logf("work dir %s", work)
	b := &bench{work: work, id: os.Getpid()}
	defer func() {
		if cerr := b.cleanup(); cerr != nil && err == nil {
			err = cerr
		}
	}()
	// Private copies, one set for the server and one for the agents: an
	// agent's pages are then shared with no process outside it, as on a
	// machine of its own.
	serverBin, err := copyBinaries(filepath.Dir(bin), filepath.Join(work, "server-bin"))
	if err != nil {
		return err
	}
	agentBin, err := copyBinaries(filepath.Dir(bin), filepath.Join(work, "agent-bin"))
	if err != nil {
		return err
	}
	if err := b.makeLAN(); err != nil {
		return err
	}
	if err := b.startServer(ctx, serverBin); err != nil {
		return err
	}
	tok, err := createToken(ctx, serverBin, b.serverDir)
	if err != nil {
		return err
	}
	var rounds []round
	for i := 1; i <= o.rounds; i++ {
		if err := sleep(ctx, settle); err != nil {
			return err
		}
		r, err := b.join(ctx, agentBin, tok, i)
		if err != nil {
			return fmt.Errorf("round %d: %w", i, err)
		}
		rounds = append(rounds, r)
		logf("round %d: joined %s ms, Ready %s ms, up %s ms", i, ms(r.Joined), ms(r.Ready), ms(r.Up))
		if i < o.rounds {
			if err := b.leave(ctx, i, r.Node); err != nil {
				return fmt.Errorf("round %d: %w", i, err)
			}
		}
	}
	logf("the last agent idles %s before its memory is read", o.idle)
	if err := sleep(ctx, o.idle); err != nil {
		return err
	}
	for _, c := range []*child{b.agent, b.server} {
		if err := c.exited(); err != nil {
			return err
		}
	}
	all := scan()
	agentProcs := readMems(tree(all, b.agent.pid()))
	serverProcs := readMems(tree(all, b.server.pid()))
	report := render(o, m, rounds, agentProcs, serverProcs)
	fmt.Print(report)
	if o.results != "" {
		if err := resultsfile.WriteSection(o.results, beginMark, endMark, report); err != nil {
			return err
		}
		logf("recorded in %s", o.results)
	}
	return nil
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "bench/join: "+format+"\n", args...)
}

func sleep(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}
