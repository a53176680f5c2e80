//go:build linux

package main

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"time"

	"github.com/k3sm-dev/k3sm/internal/agent/proxy"
)

// k8sVersion is the k8s.io/kubernetes module this program was built with.
func k8sVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, m := range bi.Deps {
			if m.Path == "k8s.io/kubernetes" {
				return m.Version
			}
		}
	}
	return "(version unknown)"
}

// Issue goals for the ClusterIP path against direct pod→pod traffic.
const (
	goalThroughput = 0.90                  // ClusterIP ÷ pod→pod, at least
	goalAddedP50   = 50 * time.Microsecond // ClusterIP p50 − pod→pod p50, at most
)

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	v = slices.Sorted(slices.Values(v))
	if len(v)%2 == 1 {
		return v[len(v)/2]
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2
}

func us(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }

func met(ok bool) string {
	if ok {
		return "met"
	}
	return "**not met**"
}

func report(o options, tr *trafficResult, st *setupResult, fr *followResult, loadStart, loadEnd string) {
	fmt.Printf("## Pod network (bench/podnet)\n\n")
	fmt.Printf("- Date: %s\n", time.Now().UTC().Format("2006-01-02 15:04 UTC"))
	fmt.Printf("- Machine: kernel %s, %d CPUs, %s\n", kernel(), runtime.NumCPU(), runtime.Version())
	fmt.Printf("- Program: `bench/podnet -rounds %d -bytes %d -chunk %d -pings %d -pods %d -workers %d -burst-rounds %d -kube-proxy=%t -follows %d`\n",
		o.rounds, o.bytes, o.chunk, o.pings, o.pods, o.workers, o.burstRounds, o.kubeProxy, o.follows)
	fmt.Printf("- Load average (1/5/15 min) at start %s, at end %s (the machine is shared: rounds rotate which path goes first)\n", loadStart, loadEnd)
	fmt.Printf("- Setup: the process re-executed under `unshare --net --mount`; its own fresh network namespace is the\n")
	fmt.Printf("  node's \"host\". internal/netd/dataplane built the node (%v, gateway %v on bridge %s, Service range %v\n",
		node.CIDR, node.Gateway, node.Bridge, node.ServiceCIDR)
	fmt.Printf("  local, cluster range %v) and its pods; nothing touched the machine's network.\n", node.ClusterCIDR)
	if tr != nil {
		fmt.Printf("- Traffic: pods A (%v) and B (%v) set up in %.1f ms.\n", tr.podA.IP, tr.podB.IP, ms(tr.setup))
	}
	if fr != nil {
		fmt.Printf("- Follows: pods A (%v), B (%v) and C (%v) set up in %.1f ms.\n", fr.podA.IP, fr.podB.IP, fr.podC.IP, ms(fr.setup))
	}
	var skipped []string
	for _, p := range []struct {
		name string
		ran  bool
	}{{"traffic (-rounds 0)", tr != nil}, {"setup (-pods 0)", st != nil}, {"follows (-follows 0)", fr != nil}} {
		if !p.ran {
			skipped = append(skipped, p.name)
		}
	}
	if len(skipped) > 0 {
		fmt.Printf("- Not measured in this run: %s.\n", strings.Join(skipped, ", "))
	}
	fmt.Println()
	if tr != nil {
		reportTraffic(o, tr)
	}
	if st != nil {
		reportSetup(o, st)
	}
	if fr != nil {
		reportFollow(o, fr)
	}
}

func reportTraffic(o options, tr *trafficResult) {
	fmt.Printf("### Traffic\n\n")
	fmt.Printf("Median of %d rounds. The server runs in pod B's namespace; **loopback floor** = the client in pod B's\n", o.rounds)
	fmt.Printf("namespace to 127.0.0.1; **pod→pod** = the client in pod A's namespace to %v:%d (veth, bridge, veth);\n", tr.podB.IP, backendPort)
	fmt.Printf("**ClusterIP relay** = the client in pod A to %s:%d, served by internal/agent/proxy's userspace relay in the host\n", clusterIP, servicePort)
	fmt.Printf("namespace (fake clientset: one Service, one EndpointSlice → pod B), which relays by splice(2) to pod B\n")
	fmt.Printf("(--service-proxy=userspace). **ClusterIP nftables** = the client in pod A to %s:%d, which the same proxy\n", kernelIP, servicePort)
	fmt.Printf("puts in the kernel (its Kernel path, applied by internal/netd/dataplane's SetServices as k3sm-netd does:\n")
	fmt.Printf("table ip k3sm-services DNATs it to pod B; the default on Linux as root).\n\n")
	paths := []int{pathLoopback, pathPod, pathClusterIP, pathKernel}
	if tr.kubeProxy {
		fmt.Printf("**kube-proxy ClusterIP** = the client in pod A to %s:%d, DNATed to pod B by kube-proxy in nftables mode\n", kubeProxyIP, servicePort)
		fmt.Printf("(k8s.io/kubernetes %s: cmd/kube-proxy/app's ProxyServer.Run with pkg/proxy/nftables' Proxier, in the host\n", k8sVersion())
		fmt.Printf("namespace, over its own fake clientset: one Service, one EndpointSlice → pod B; no apiserver, no Node watch).\n\n")
		paths = append(paths, pathKubeProxy)
	}
	fmt.Printf("|")
	for _, p := range paths {
		fmt.Printf(" | %s", pathNames[p])
	}
	ratios := []struct {
		name     string
		num, den int
	}{{"pod→pod ÷ floor", pathPod, pathLoopback}, {"relay ÷ pod→pod", pathClusterIP, pathPod}, {"nftables ÷ pod→pod", pathKernel, pathPod}}
	if tr.kubeProxy {
		ratios = append(ratios, struct {
			name     string
			num, den int
		}{"kube-proxy ÷ pod→pod", pathKubeProxy, pathPod}, struct {
			name     string
			num, den int
		}{"nftables ÷ kube-proxy", pathKernel, pathKubeProxy})
	}
	for _, r := range ratios {
		fmt.Printf(" | %s", r.name)
	}
	fmt.Printf(" |\n|---|%s\n", strings.Repeat("---:|", len(paths)+len(ratios)))
	row := func(name, unit, prec string, f func(round) float64) [nPaths]float64 {
		var m [nPaths]float64
		fmt.Printf("| %s |", name)
		for _, p := range paths {
			v := make([]float64, len(tr.rounds[p]))
			for i, r := range tr.rounds[p] {
				v[i] = f(r)
			}
			m[p] = median(v)
			fmt.Printf(" "+prec+" %s |", m[p], unit)
		}
		for _, r := range ratios {
			fmt.Printf(" %.2f× |", m[r.num]/m[r.den])
		}
		fmt.Println()
		return m
	}
	mb := row(fmt.Sprintf("throughput, %s upload in %d KiB writes", size(o.bytes), o.chunk>>10), "MB/s", "%.0f", func(r round) float64 { return r.mbps })
	p50 := row(fmt.Sprintf("1-byte round trip p50 (%d pings)", o.pings), "µs", "%.1f", func(r round) float64 { return us(r.p50) })
	row("1-byte round trip p99", "µs", "%.1f", func(r round) float64 { return us(r.p99) })

	// Added latency, paired per round (the paths ran back to back).
	addedOver := func(path int) float64 {
		var added []float64
		for i := range tr.rounds[pathPod] {
			added = append(added, us(tr.rounds[path][i].p50)-us(tr.rounds[pathPod][i].p50))
		}
		return median(added)
	}
	// Throughput ratio paired per round too: on a shared machine the
	// load moves between rounds more than between adjacent paths.
	pairedRatio := func(path int) float64 {
		var r []float64
		for i := range tr.rounds[pathPod] {
			r = append(r, tr.rounds[path][i].mbps/tr.rounds[pathPod][i].mbps)
		}
		return median(r)
	}
	ratio := mb[pathKernel] / mb[pathPod]
	add := addedOver(pathKernel)
	fmt.Printf("\n- ClusterIP (nftables, the default) throughput is **%.0f %%** of pod→pod (median of the per-round ratios %.0f %%; goal ≥ %.0f %%): %s.\n",
		100*ratio, 100*pairedRatio(pathKernel), 100*goalThroughput, met(ratio >= goalThroughput))
	fmt.Printf("- ClusterIP (nftables) adds **%.1f µs** to the p50 round trip over pod→pod (median of the per-round differences; "+
		"difference of the medians %.1f µs; goal ≤ %.0f µs): %s.\n", add, p50[pathKernel]-p50[pathPod], us(goalAddedP50), met(add <= us(goalAddedP50)))
	fmt.Printf("- ClusterIP relay (--service-proxy=userspace): **%.0f %%** of pod→pod throughput (per-round ratios %.0f %%), **%.1f µs** added p50.\n",
		100*mb[pathClusterIP]/mb[pathPod], 100*pairedRatio(pathClusterIP), addedOver(pathClusterIP))
	if tr.kubeProxy {
		fmt.Printf("- kube-proxy (nftables) ClusterIP: **%.0f %%** of pod→pod throughput (per-round ratios %.0f %%), **%.1f µs** added p50; k3sm's nftables path moves "+
			"**%.0f %%** of kube-proxy's throughput and adds %.1f µs p50 over it.\n",
			100*mb[pathKubeProxy]/mb[pathPod], 100*pairedRatio(pathKubeProxy), addedOver(pathKubeProxy), 100*mb[pathKernel]/mb[pathKubeProxy], add-addedOver(pathKubeProxy))
	}
	fmt.Println()

	fmt.Printf("Every round (MB/s; p50/p99 µs):\n\n| round |")
	for _, p := range paths {
		fmt.Printf(" %s |", pathNames[p])
	}
	fmt.Printf("\n|---:|%s\n", strings.Repeat("---:|", len(paths)))
	for i := range tr.rounds[pathPod] {
		fmt.Printf("| %d |", i+1)
		for _, p := range paths {
			r := tr.rounds[p][i]
			fmt.Printf(" %.0f MB/s, %.1f / %.1f |", r.mbps, us(r.p50), us(r.p99))
		}
		fmt.Println()
	}
	fmt.Println()
}

func reportSetup(o options, st *setupResult) {
	fmt.Printf("### Network setup per pod\n\n")
	fmt.Printf("**%s**: what a pod start pays, SetupPod and TeardownPod from internal/netd/client over the\n", setupNames[setupNetd])
	fmt.Printf("unix socket to the real internal/netd/server (peer-credential check, one mutex, state file written per\n")
	fmt.Printf("change) over the real dataplane in the host namespace; **%s**: AddPod and DelPod of the same\n", setupNames[setupDirect])
	fmt.Printf("dataplane called in this process, the floor. Each pod's network is a fresh namespace, a veth pair on the\n")
	fmt.Printf("bridge, its address, lo and the default route.\n\n")
	fmt.Printf("One at a time: %d pods per path, each set up then torn down before the next, paths alternating.\n\n", o.pods)
	fmt.Printf("| ms | %s | %s | netd ÷ direct |\n|---|---:|---:|---:|\n", setupNames[setupNetd], setupNames[setupDirect])
	srow := func(name string, q float64, f func(p int) []time.Duration) {
		n, d := ms(pct(f(setupNetd), q)), ms(pct(f(setupDirect), q))
		fmt.Printf("| %s | %.2f | %.2f | %.2f× |\n", name, n, d, n/d)
	}
	both := func(p int) []time.Duration {
		out := make([]time.Duration, len(st.add[p]))
		for i := range out {
			out[i] = st.add[p][i] + st.del[p][i]
		}
		return out
	}
	srow("set up (SetupPod / AddPod) p50", 0.50, func(p int) []time.Duration { return st.add[p] })
	srow("set up p99", 0.99, func(p int) []time.Duration { return st.add[p] })
	srow("tear down (TeardownPod / DelPod) p50", 0.50, func(p int) []time.Duration { return st.del[p] })
	srow("tear down p99", 0.99, func(p int) []time.Duration { return st.del[p] })
	srow("set up + tear down p50", 0.50, both)
	srow("set up + tear down p99", 0.99, both)

	if o.burstRounds == 0 {
		fmt.Println()
		return
	}
	fmt.Printf("\nBurst: %d pods set up at once from %d goroutines, then torn down the same way; median of %d rounds\n",
		o.pods, o.workers, o.burstRounds)
	fmt.Printf("per path, alternating which goes first. k3sm-netd serves each connection on its own goroutine but\n")
	fmt.Printf("applies every request under one mutex but for a teardown's removal, which runs in parallel; the dataplane called directly runs the %d calls in parallel.\n\n", o.workers)
	fmt.Printf("| ms | %s | %s | netd ÷ direct |\n|---|---:|---:|---:|\n", setupNames[setupNetd], setupNames[setupDirect])
	brow := func(name, prec string, f func(b burst) float64) {
		var m [nSetups]float64
		for p := range nSetups {
			var v []float64
			for _, b := range st.bursts[p] {
				v = append(v, f(b))
			}
			m[p] = median(v)
		}
		fmt.Printf("| %s | "+prec+" | "+prec+" | %.2f× |\n", name, m[setupNetd], m[setupDirect], m[setupNetd]/m[setupDirect])
	}
	brow(fmt.Sprintf("all %d pods set up (wall)", o.pods), "%.0f", func(b burst) float64 { return ms(b.wall) })
	brow("pods set up per second", "%.0f", func(b burst) float64 { return float64(len(b.calls)) / b.wall.Seconds() })
	brow("one call p50 (its start to its return)", "%.2f", func(b burst) float64 { return ms(pct(b.calls, 0.5)) })
	brow("one call p99", "%.2f", func(b burst) float64 { return ms(pct(b.calls, 0.99)) })
	brow("pod ready p50 (burst start to its return)", "%.0f", func(b burst) float64 { return ms(pct(b.ready, 0.5)) })
	brow("pod ready p99", "%.0f", func(b burst) float64 { return ms(pct(b.ready, 0.99)) })
	brow(fmt.Sprintf("all %d torn down (wall)", o.pods), "%.0f", func(b burst) float64 { return ms(b.delWall) })
	fmt.Println()
}

func size(n int64) string {
	if n >= 1<<30 && n%(1<<30) == 0 {
		return fmt.Sprintf("%d GiB", n>>30)
	}
	if n >= 1<<20 && n%(1<<20) == 0 {
		return fmt.Sprintf("%d MiB", n>>20)
	}
	return fmt.Sprintf("%d B", n)
}

func reportFollow(o options, fr *followResult) {
	fmt.Printf("### Traffic following an EndpointSlice change\n\n")
	fmt.Printf("%d changes per path, the paths alternating which goes first. Pods A (%v) and B (%v) each answer a\n", o.follows, fr.podA.IP, fr.podB.IP)
	fmt.Printf("connection on :%d with their name and close it. Two Service proxies (internal/agent/proxy) run in the\n", backendPort)
	fmt.Printf("host namespace, each over its own fake clientset with one Service and its one EndpointSlice: **%s**\n", followNames[followRelay])
	fmt.Printf("= %s:%d on the userspace relay (--service-proxy=userspace); **%s** = %s:%d in the kernel (its\n", followRelayIP, servicePort, followNames[followKernel], followKernelIP, servicePort)
	fmt.Printf("Kernel path applied by internal/netd/dataplane's SetServices as k3sm-netd does; the default on Linux as root;\n")
	fmt.Printf("proxy.DefaultKernelDebounce = %v gathers a burst of changes into one nftables transaction). Each change\n", proxy.DefaultKernelDebounce)
	fmt.Printf("updates the slice to the other pod; the time runs from the Update call (fake clientset: no apiserver, no\n")
	fmt.Printf("watch over the network) until a client in pod C (%v), connecting to the ClusterIP in a loop (a new\n", fr.podC.IP)
	fmt.Printf("connection each try, no pause, %v timeout), first gets the new pod's name.\n\n", followTry)
	fmt.Printf("| ms | %s | %s |\n|---|---:|---:|\n", followNames[followRelay], followNames[followKernel])
	frow := func(name string, f func(cs []change) float64, prec string) {
		fmt.Printf("| %s |", name)
		for p := range nFollows {
			fmt.Printf(" "+prec+" |", f(fr.changes[p]))
		}
		fmt.Println()
	}
	took := func(cs []change) []time.Duration {
		out := make([]time.Duration, len(cs))
		for i, c := range cs {
			out[i] = c.took
		}
		return out
	}
	for _, q := range []struct {
		name string
		q    float64
	}{{"p50", 0.5}, {"p90", 0.9}, {"max", 1}} {
		frow("Update → new endpoint answers, "+q.name, func(cs []change) float64 { return ms(pct(took(cs), q.q)) }, "**%.2f**")
	}
	frow("min", func(cs []change) float64 { return ms(slices.Min(took(cs))) }, "%.2f")
	frow("the Update call alone, p50", func(cs []change) float64 {
		u := make([]time.Duration, len(cs))
		for i, c := range cs {
			u[i] = c.update
		}
		return ms(pct(u, 0.5))
	}, "%.3f")
	frow("connections per change, median", func(cs []change) float64 {
		v := make([]float64, len(cs))
		for i, c := range cs {
			v[i] = float64(c.tries)
		}
		return median(v)
	}, "%.0f")
	fmt.Printf("| tries with no answer (refused, timed out), all changes |")
	for p := range nFollows {
		fmt.Printf(" %d |", fr.noAnswer[p])
	}
	fmt.Printf("\n\nEvery change (ms):\n\n| change | to pod | %s | %s |\n|---:|---|---:|---:|\n", followNames[followRelay], followNames[followKernel])
	for i := range fr.changes[followRelay] {
		to := "b"
		if i%2 == 1 {
			to = "a"
		}
		fmt.Printf("| %d | %s | %.2f | %.2f |\n", i+1, to, ms(fr.changes[followRelay][i].took), ms(fr.changes[followKernel][i].took))
	}
	fmt.Println()
}
