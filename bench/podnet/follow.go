//go:build linux

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/k3sm-dev/k3sm/bench/internal/isolated"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/k3sm-dev/k3sm/internal/agent/proxy"
	"github.com/k3sm-dev/k3sm/internal/netd/dataplane"
)

// The Services whose endpoint moves: one on the relay, one in the kernel,
// each on its own proxy and fake clientset.
const (
	followRelayIP  = "10.96.0.20"
	followKernelIP = "10.96.0.22"
)

// A follow path, in the order of the report's columns.
const (
	followRelay  = iota // the Service proxy's userspace relay
	followKernel        // the proxy's Kernel path: nftables DNAT by the dataplane
	nFollows
)

var followNames = [nFollows]string{"ClusterIP relay", "ClusterIP nftables"}

// Limits of the client loop: each try is a new connection that must answer
// within followTry; a change not followed within followLimit fails the run.
const (
	followTry   = 250 * time.Millisecond
	followLimit = 10 * time.Second
)

// change is one EndpointSlice update on one path.
type change struct {
	took   time.Duration // Update call to the first answer from the new endpoint
	tries  int           // connections made until then
	update time.Duration // the Update call itself (fake clientset)
}

type followResult struct {
	changes          [nFollows][]change
	noAnswer         [nFollows]int // tries that got no answer at all (refused, timed out)
	podA, podB, podC dataplane.Pod
	setup            time.Duration // EnsureNode + the three AddPods
}

// followBench builds the node and pods A and B, each serving its own name,
// and client pod C; starts a relay proxy and a kernel proxy, each with one
// Service whose EndpointSlice points at A; then o.follows times, on each
// path (alternating which goes first), moves the endpoint to the other
// pod and times the Update call until a new connection from C to the
// ClusterIP gets the new pod's name.
func followBench(ctx context.Context, dir, hostNS string, o options) (_ *followResult, err error) {
	netnsDir := filepath.Join(dir, "follow-netns")
	r := &followResult{
		podA: pod(netnsDir, "aaaaaaaa-0000-4000-8000-0000000000fa", "100.64.7.4"),
		podB: pod(netnsDir, "bbbbbbbb-0000-4000-8000-0000000000fb", "100.64.7.5"),
		podC: pod(netnsDir, "cccccccc-0000-4000-8000-0000000000fc", "100.64.7.6"),
	}
	dp, took, teardown, err := buildPods(hostNS, netnsDir, r.podA, r.podB, r.podC)
	if err != nil {
		return nil, err
	}
	defer func() {
		if derr := teardown(); derr != nil && err == nil {
			err = derr
		}
	}()
	r.setup = took

	names := map[netip.Addr]string{r.podA.IP: "a", r.podB.IP: "b"}
	for _, p := range []dataplane.Pod{r.podA, r.podB} {
		ln, err := isolated.ListenIn(p.NetNS, net.JoinHostPort("0.0.0.0", strconv.Itoa(backendPort)))
		if err != nil {
			return nil, fmt.Errorf("name server in pod %s: %w", names[p.IP], err)
		}
		defer ln.Close()
		go serveName(ln, names[p.IP])
	}

	type svc struct {
		client *fake.Clientset
		addr   string
	}
	var svcs [nFollows]svc
	for path, ip := range [nFollows]string{followRelayIP, followKernelIP} {
		var kernel proxy.Kernel // nil: the relay
		if path == followKernel {
			kernel = dpKernel{dp}
		}
		client, stop, err := startProxy(ctx, r.podC.NetNS, ip, netip.AddrPortFrom(r.podA.IP, backendPort), kernel)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", followNames[path], err)
		}
		defer stop()
		svcs[path] = svc{client, net.JoinHostPort(ip, strconv.Itoa(servicePort))}
	}

	// The whole loop runs on a thread in pod C's namespace: every try's
	// socket is C's, without a namespace switch per try.
	err = isolated.OnThread(r.podC.NetNS, func() error {
		for path := range nFollows {
			if _, _, err := waitAnswer(ctx, svcs[path].addr, "a"); err != nil {
				return fmt.Errorf("%s before the first change: %w", followNames[path], err)
			}
		}
		for i := range o.follows {
			to, want := r.podB, "b"
			if i%2 == 1 {
				to, want = r.podA, "a"
			}
			for k := range nFollows {
				path := (i + k) % nFollows
				if ctx.Err() != nil {
					return ctx.Err()
				}
				s := svcs[path]
				start := time.Now()
				if _, err := s.client.DiscoveryV1().EndpointSlices("default").Update(ctx,
					benchSlice(netip.AddrPortFrom(to.IP, backendPort)), metav1.UpdateOptions{}); err != nil {
					return fmt.Errorf("%s: update the EndpointSlice: %w", followNames[path], err)
				}
				updated := time.Since(start)
				tries, failed, err := waitAnswer(ctx, s.addr, want)
				took := time.Since(start)
				if err != nil {
					return fmt.Errorf("%s, change %d (to pod %s): %w", followNames[path], i+1, want, err)
				}
				r.changes[path] = append(r.changes[path], change{took: took, tries: tries, update: updated})
				r.noAnswer[path] += failed
				fmt.Fprintf(os.Stderr, "change %2d %-20s → pod %s in %8v (%d tries)\n", i+1, followNames[path], want, took.Round(time.Microsecond), tries)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return r, nil
}

// serveName answers every connection with name and closes it.
func serveName(ln net.Listener, name string) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		io.WriteString(c, name)
		c.Close()
	}
}

// waitAnswer connects to addr again and again (a new connection each try,
// no pause between tries) until one answers want. It returns the tries
// made and how many of them got no answer at all.
func waitAnswer(ctx context.Context, addr, want string) (tries, failed int, err error) {
	d := net.Dialer{Timeout: followTry}
	deadline := time.Now().Add(followLimit)
	var last error
	for time.Now().Before(deadline) && ctx.Err() == nil {
		tries++
		got, err := answer(ctx, &d, addr)
		if err != nil {
			failed++
			last = err
			continue
		}
		if got == want {
			return tries, failed, nil
		}
		last = fmt.Errorf("answered %q", got)
	}
	if ctx.Err() != nil {
		return tries, failed, ctx.Err()
	}
	return tries, failed, fmt.Errorf("no answer from pod %s within %v (%d tries; last: %v)", want, followLimit, tries, last)
}

func answer(ctx context.Context, d *net.Dialer, addr string) (string, error) {
	c, err := d.DialContext(ctx, "tcp4", addr)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(followTry))
	b, err := io.ReadAll(io.LimitReader(c, 16))
	if err != nil && !errors.Is(err, io.EOF) {
		return "", err
	}
	return string(b), nil
}
