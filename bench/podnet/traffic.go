//go:build linux

package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"github.com/k3sm-dev/k3sm/bench/internal/isolated"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/ptr"

	"github.com/k3sm-dev/k3sm/bench/internal/traffic"
	"github.com/k3sm-dev/k3sm/internal/agent/proxy"
	"github.com/k3sm-dev/k3sm/internal/netd/dataplane"
	"github.com/k3sm-dev/k3sm/internal/runtime/podnet"
)

// The Services: ClusterIP 10.96.0.10:80 → pod B on the proxy's relay,
// 10.96.0.12:80 → pod B in the kernel (the proxy's Kernel path, applied
// by the dataplane as k3sm-netd does).
const (
	clusterIP   = "10.96.0.10"
	kernelIP    = "10.96.0.12"
	servicePort = 80
	backendPort = 8080
)

// A traffic path, in the order of the report's columns.
const (
	pathLoopback  = iota // client and server in pod B's namespace, over 127.0.0.1
	pathPod              // client in pod A, server in pod B, over the bridge
	pathClusterIP        // client in pod A, through the Service proxy's relay, to pod B
	pathKernel           // client in pod A, through k3sm's nftables DNAT (table ip k3sm-services), to pod B
	pathKubeProxy        // client in pod A, through kube-proxy's nftables DNAT, to pod B
	nPaths
)

var pathNames = [nPaths]string{"loopback floor", "pod→pod", "ClusterIP relay", "ClusterIP nftables", "kube-proxy ClusterIP"}

// round is one measurement of one path.
type round struct {
	mbps     float64
	p50, p99 time.Duration
}

type trafficResult struct {
	rounds    [nPaths][]round
	podA      dataplane.Pod
	podB      dataplane.Pod
	setup     time.Duration // EnsureNode + both AddPods
	kubeProxy bool          // pathKubeProxy was measured
}

func pod(netnsDir, uid, ip string) dataplane.Pod {
	return dataplane.Pod{UID: uid, IP: netip.MustParseAddr(ip), NetNS: filepath.Join(netnsDir, uid), HostIf: dataplane.HostIfName(uid)}
}

// buildPods makes the node and pods with the dataplane in netnsDir. took is
// EnsureNode and the AddPods; teardown removes them again and returns the
// first removal that failed.
func buildPods(hostNS, netnsDir string, pods ...dataplane.Pod) (_ dataplane.Dataplane, took time.Duration, teardown func() error, err error) {
	dp, err := dataplane.New(dataplane.Options{HostNSPath: hostNS, NetNSDir: netnsDir})
	if err != nil {
		return nil, 0, nil, err
	}
	var added []dataplane.Pod
	teardown = func() error {
		var first error
		for i := len(added) - 1; i >= 0; i-- {
			if derr := dp.DelPod(added[i]); derr != nil && first == nil {
				first = fmt.Errorf("DelPod %s: %w", added[i].UID, derr)
			}
		}
		if derr := dp.DelNode(node); derr != nil && first == nil {
			first = fmt.Errorf("DelNode: %w", derr)
		}
		return first
	}
	t0 := time.Now()
	if err := dp.EnsureNode(node); err != nil {
		return nil, 0, nil, fmt.Errorf("EnsureNode: %w", err)
	}
	for _, p := range pods {
		if err := dp.AddPod(node, p); err != nil {
			return nil, 0, nil, errors.Join(fmt.Errorf("AddPod %s: %w", p.UID, err), teardown())
		}
		added = append(added, p)
	}
	return dp, time.Since(t0), teardown, nil
}

// trafficBench builds the node and pods A and B with the dataplane, serves
// the backend in B and the Service proxy in the host namespace, measures
// every path o.rounds times, and takes the node down again.
func trafficBench(ctx context.Context, dir, hostNS string, o options) (_ *trafficResult, err error) {
	netnsDir := filepath.Join(dir, "netns")
	r := &trafficResult{
		podA: pod(netnsDir, "aaaaaaaa-0000-4000-8000-00000000000a", "100.64.7.2"),
		podB: pod(netnsDir, "bbbbbbbb-0000-4000-8000-00000000000b", "100.64.7.3"),
	}
	dp, took, teardown, err := buildPods(hostNS, netnsDir, r.podA, r.podB)
	if err != nil {
		return nil, err
	}
	defer func() {
		if derr := teardown(); derr != nil && err == nil {
			err = derr
		}
	}()
	r.setup = took

	ln, err := isolated.ListenIn(r.podB.NetNS, net.JoinHostPort("0.0.0.0", strconv.Itoa(backendPort)))
	if err != nil {
		return nil, fmt.Errorf("backend in pod B: %w", err)
	}
	defer ln.Close()
	go serveBackend(ln)

	_, stop, err := startProxy(ctx, r.podA.NetNS, clusterIP, netip.AddrPortFrom(r.podB.IP, backendPort), nil)
	if err != nil {
		return nil, err
	}
	defer stop()
	_, stopKernel, err := startProxy(ctx, r.podA.NetNS, kernelIP, netip.AddrPortFrom(r.podB.IP, backendPort), dpKernel{dp})
	if err != nil {
		return nil, err
	}
	defer stopKernel()

	paths := []int{pathLoopback, pathPod, pathClusterIP, pathKernel}
	if o.kubeProxy {
		if _, err := exec.LookPath("nft"); err != nil {
			return nil, fmt.Errorf("kube-proxy's nftables mode needs nft(8) on the PATH (or run with -kube-proxy=false): %w", err)
		}
		if err := startKubeProxy(ctx, r.podA.NetNS, netip.AddrPortFrom(r.podB.IP, backendPort)); err != nil {
			return nil, err
		}
		paths = append(paths, pathKubeProxy)
		r.kubeProxy = true
	}

	type target struct{ ns, addr string }
	targets := [nPaths]target{
		pathLoopback:  {r.podB.NetNS, net.JoinHostPort("127.0.0.1", strconv.Itoa(backendPort))},
		pathPod:       {r.podA.NetNS, net.JoinHostPort(r.podB.IP.String(), strconv.Itoa(backendPort))},
		pathClusterIP: {r.podA.NetNS, net.JoinHostPort(clusterIP, strconv.Itoa(servicePort))},
		pathKernel:    {r.podA.NetNS, net.JoinHostPort(kernelIP, strconv.Itoa(servicePort))},
		pathKubeProxy: {r.podA.NetNS, net.JoinHostPort(kubeProxyIP, strconv.Itoa(servicePort))},
	}
	for i := range o.rounds {
		for k := range paths {
			path := paths[(i+k)%len(paths)] // rotate which path goes first
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			t := targets[path]
			m, err := measure(ctx, t.ns, t.addr, o)
			if err != nil {
				return nil, fmt.Errorf("%s (%s): %w", pathNames[path], t.addr, err)
			}
			r.rounds[path] = append(r.rounds[path], m)
			fmt.Fprintf(os.Stderr, "round %d %-20s %8.1f MB/s  p50 %v  p99 %v\n", i+1, pathNames[path], m.mbps, m.p50, m.p99)
		}
	}
	return r, nil
}

// serveBackend serves two protocols, chosen by the first byte: 'u' reads
// everything until EOF and answers with the byte count; 'p' echoes every
// byte back at once.
func serveBackend(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			var mode [1]byte
			if _, err := io.ReadFull(c, mode[:]); err != nil {
				return
			}
			switch mode[0] {
			case 'u':
				n, err := io.Copy(io.Discard, c)
				if err != nil {
					return
				}
				_ = binary.Write(c, binary.BigEndian, n)
			case 'p':
				var b [1]byte
				for {
					if _, err := io.ReadFull(c, b[:]); err != nil {
						return
					}
					if _, err := c.Write(b[:]); err != nil {
						return
					}
				}
			}
		}()
	}
}

// dpKernel is the proxy's Kernel as k3sm-netd serves it, without the
// socket: the set goes to the dataplane's SetServices.
type dpKernel struct{ dp dataplane.Dataplane }

func (k dpKernel) SetServices(_ context.Context, svcs []proxy.KernelService) error {
	out := make([]dataplane.Service, 0, len(svcs))
	for _, s := range svcs {
		proto := dataplane.TCP
		if s.Protocol == corev1.ProtocolUDP {
			proto = dataplane.UDP
		}
		out = append(out, dataplane.Service{Protocol: proto, IP: s.IP, Port: s.Port, Endpoints: s.Endpoints})
	}
	return k.dp.SetServices(node, out)
}

// startProxy runs the Service proxy for one Service at clusterIP whose
// endpoint is backend: on its relay (kernel nil) or in the kernel. This
// process is in the host namespace, so the proxy's listeners and its
// dials to endpoints are the host's, as on a node. It returns once the
// ClusterIP answers from clientNS. Its EndpointSlice (benchSlice) can be
// updated through the returned clientset.
func startProxy(ctx context.Context, clientNS, clusterIP string, backend netip.AddrPort, kernel proxy.Kernel) (client *fake.Clientset, stop func(), err error) {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "bench"},
		Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeClusterIP, ClusterIP: clusterIP, ClusterIPs: []string{clusterIP},
			Ports: []corev1.ServicePort{{Name: "tcp", Protocol: corev1.ProtocolTCP, Port: servicePort}},
		},
	}
	client = fake.NewClientset(svc, benchSlice(backend))
	p, err := proxy.New(proxy.Config{
		Client:   client,
		NodeName: "bench",
		NodeIPs:  []netip.Addr{node.Gateway},
		Recorder: &record.FakeRecorder{},
		Log:      slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
		Kernel:   kernel,
		// Dial nil, as the node (internal/agent/node) passes it: a
		// net.Dialer, in the process's network, which here is the host's.
	})
	if err != nil {
		return nil, nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	stop = func() { cancel(); <-done }
	addr := net.JoinHostPort(clusterIP, strconv.Itoa(servicePort))
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := podnet.Dial(ctx, clientNS, "tcp4", addr)
		if err == nil {
			c.Close()
			return client, stop, nil
		}
		if time.Now().After(deadline) {
			stop()
			return nil, nil, fmt.Errorf("proxy not serving %s: %w", addr, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// benchSlice is the Service's one EndpointSlice, with backend its one
// ready endpoint.
func benchSlice(backend netip.AddrPort) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: "default", Name: "bench-1",
			Labels: map[string]string{discoveryv1.LabelServiceName: "bench"},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("tcp"), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To(int32(backend.Port()))}},
		Endpoints: []discoveryv1.Endpoint{{
			Addresses:  []string{backend.Addr().String()},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)},
		}},
	}
}

func measure(ctx context.Context, ns, addr string, o options) (round, error) {
	mbps, err := throughput(ctx, ns, addr, o.bytes, o.chunk)
	if err != nil {
		return round{}, err
	}
	p50, p99, err := latency(ctx, ns, addr, o.pings)
	if err != nil {
		return round{}, err
	}
	return round{mbps: mbps, p50: p50, p99: p99}, nil
}

// throughput uploads n bytes from ns in writes of chunk bytes and returns
// MB/s (10^6 bytes) from the first write to the backend's acknowledgement.
func throughput(ctx context.Context, ns, addr string, n int64, chunk int) (float64, error) {
	c, err := podnet.Dial(ctx, ns, "tcp4", addr)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	return traffic.Upload(c.(*net.TCPConn), n, chunk)
}

// latency returns the median and 99th percentile of n 1-byte round trips
// on one connection dialed from ns.
func latency(ctx context.Context, ns, addr string, n int) (p50, p99 time.Duration, err error) {
	c, err := podnet.Dial(ctx, ns, "tcp4", addr)
	if err != nil {
		return 0, 0, err
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	return traffic.RoundTrips(c, n)
}
