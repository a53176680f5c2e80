package metrics

// This file owns the metrics of the cluster's other nodes, got the way
// metrics-server gets them: every resolution, each other Ready node's
// kubelet /metrics/resource (the families ResourceFamilies renders, which
// are upstream's) is scraped over TLS with the scraper's client
// certificate, its serving certificate verified against the cluster's
// server CA for the IP dialled, and parsed into a Sample for a Store of
// that node's own. The kubelet names pods but gives no UIDs: a pod is
// kept only when the API has it on the node scraped, with the API's UID.
// A node that does not answer is logged when it starts and stops failing;
// its readings go stale (the API serves them for MaxAge after the node
// last answered, by this node's clock).

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	corev1listers "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/rest"
)

// ScraperRules are what the scraper's identity needs, as metrics-server's
// RBAC grants: the kubelets authorize /metrics/resource as get
// nodes/metrics (nodes/stats for /stats), and the Node and pod lists come
// from the API.
func ScraperRules() []rbacv1.PolicyRule {
	return []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"nodes/metrics", "nodes/stats"}, Verbs: []string{"get"}},
		{APIGroups: []string{""}, Resources: []string{"nodes", "pods"}, Verbs: []string{"get", "list", "watch"}},
	}
}

// Remote scrapes the cluster's other nodes into a Store each.
type Remote struct {
	// Self is this node: its readings come from its own Source.
	Self string
	// Nodes are the cluster's Nodes (addresses, kubelet ports, readiness,
	// labels); Pods are all its pods, not only this node's.
	Nodes corev1listers.NodeLister
	Pods  corev1listers.PodLister
	// Client dials the kubelets (see KubeletClient).
	Client *http.Client
	// Timeout bounds one node's scrape (0: 10 s).
	Timeout time.Duration
	// MaxAge: a node that answers again after this long starts its
	// readings over rather than rating across the gap (0: never).
	MaxAge time.Duration
	Log    *slog.Logger
	Now    func() time.Time

	mu    sync.Mutex
	nodes map[string]*remoteNode
}

type remoteNode struct {
	store   *Store
	scraped time.Time // when it last answered, by our clock
	failing bool
}

// Run scrapes every resolution until ctx ends, the first round at once.
func (r *Remote) Run(ctx context.Context, resolution time.Duration) {
	t := time.NewTicker(resolution)
	defer t.Stop()
	for {
		r.scrapeAll(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (r *Remote) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

// scrapeAll is one round: every other Ready node at once, each within the
// timeout. Nodes gone from the list are forgotten; a node not Ready is not
// dialled and its readings go stale.
func (r *Remote) scrapeAll(ctx context.Context) {
	nodes, err := r.Nodes.List(labels.Everything())
	if err != nil {
		return
	}
	type target struct {
		node  *corev1.Node
		state *remoteNode
	}
	var targets []target
	listed := map[string]bool{}
	r.mu.Lock()
	if r.nodes == nil {
		r.nodes = map[string]*remoteNode{}
	}
	for _, n := range nodes {
		if n.Name == r.Self {
			continue
		}
		listed[n.Name] = true
		if !nodeReady(n) {
			continue
		}
		st := r.nodes[n.Name]
		if st == nil {
			st = &remoteNode{store: NewStore()}
			r.nodes[n.Name] = st
		}
		targets = append(targets, target{n, st})
	}
	for name := range r.nodes {
		if !listed[name] {
			delete(r.nodes, name)
		}
	}
	r.mu.Unlock()
	var wg sync.WaitGroup
	for _, t := range targets {
		wg.Go(func() { r.scrapeNode(ctx, t.node, t.state) })
	}
	wg.Wait()
}

func (r *Remote) scrapeNode(ctx context.Context, n *corev1.Node, st *remoteNode) {
	addr, err := KubeletAddr(n)
	var sm *Sample
	if err == nil {
		timeout := r.Timeout
		if timeout <= 0 {
			timeout = 10 * time.Second
		}
		sctx, cancel := context.WithTimeout(ctx, timeout)
		sm, err = r.scrape(sctx, addr)
		cancel()
	}
	now := r.now()
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case err != nil && ctx.Err() == nil && !st.failing:
		r.Log.Warn("metrics scrape of node failed", "node", n.Name, "addr", addr, "err", err)
		st.failing = true
	case err == nil:
		if st.failing {
			r.Log.Info("metrics scrape of node works again", "node", n.Name, "addr", addr)
		} else if st.scraped.IsZero() {
			r.Log.Info("scraping metrics of node", "node", n.Name, "addr", addr)
		}
		st.failing = false
		if r.MaxAge > 0 && !st.scraped.IsZero() && now.Sub(st.scraped) > r.MaxAge {
			st.store = NewStore()
		}
		st.scraped = now
		st.store.Add(r.onNode(sm, n.Name))
	}
}

// maxResourceBody bounds what one scrape reads (the families of a
// node's pods take a few hundred bytes each).
const maxResourceBody = 32 << 20

// scrape reads the kubelet's /metrics/resource at addr (host:port).
func (r *Remote) scrape(ctx context.Context, addr string) (*Sample, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+addr+"/metrics/resource", nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", string(expfmt.NewFormat(expfmt.TypeTextPlain)))
	resp, err := r.Client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return nil, fmt.Errorf("/metrics/resource: %s: %s", resp.Status, strings.TrimSpace(string(body)))
	}
	return ParseResource(io.LimitReader(resp.Body, maxResourceBody), r.now())
}

// onNode keeps the pods the API has on node, with their UIDs.
func (r *Remote) onNode(sm *Sample, node string) *Sample {
	pods := sm.Pods[:0]
	for _, p := range sm.Pods {
		pod, err := r.Pods.Pods(p.Namespace).Get(p.Name)
		if err != nil || pod.Spec.NodeName != node {
			continue
		}
		p.UID = pod.UID
		pods = append(pods, p)
	}
	sm.Pods = pods
	return sm
}

// remoteReadings is another node's store as the API serves it.
type remoteReadings struct {
	name    string
	labels  map[string]string
	store   *Store
	scraped time.Time
}

// readings are the stores of the nodes that answered at least once (only
// name's, when set); a Node deleted since the last round is left out.
func (r *Remote) readings(name string) []remoteReadings {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []remoteReadings
	for n, st := range r.nodes {
		if (name != "" && n != name) || st.scraped.IsZero() {
			continue
		}
		node, err := r.Nodes.Get(n)
		if err != nil {
			continue
		}
		out = append(out, remoteReadings{name: n, labels: node.Labels, store: st.store, scraped: st.scraped})
	}
	return out
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// KubeletAddr is where a Node's kubelet API listens: its InternalIP (the
// first address if it has none) and its kubelet endpoint's port.
func KubeletAddr(n *corev1.Node) (string, error) {
	ip := ""
	for _, a := range n.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			ip = a.Address
			break
		}
	}
	if ip == "" && len(n.Status.Addresses) > 0 {
		ip = n.Status.Addresses[0].Address
	}
	port := n.Status.DaemonEndpoints.KubeletEndpoint.Port
	if ip == "" || port <= 0 {
		return "", fmt.Errorf("node %s reports no address or kubelet port in its status", n.Name)
	}
	return net.JoinHostPort(ip, strconv.Itoa(int(port))), nil
}

// KubeletClient dials kubelet APIs with the client certificate in
// certFile and keyFile, trusting serving certificates signed by the CA in
// caFile only, for the host dialled: the transport takes the TLS server
// name from the URL, a node's IP, which must be one of the certificate's
// IP addresses.
func KubeletClient(certFile, keyFile, caFile string) (*http.Client, error) {
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("metrics scraper certificate: %w", err)
	}
	caPEM, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("kubelet CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("kubelet CA %s: no certificates", caFile)
	}
	return &http.Client{Transport: &http.Transport{
		TLSClientConfig:     &tls.Config{Certificates: []tls.Certificate{pair}, RootCAs: pool, MinVersion: tls.VersionTLS12},
		TLSHandshakeTimeout: 10 * time.Second,
		IdleConnTimeout:     90 * time.Second,
		// No Proxy: kubelets are dialled directly, whatever the environment says.
	}}, nil
}

// ScraperConfig is the API client configuration of the scraper: the
// node's server and CA, with the scraper's certificate instead of the
// node's (a node may read only its own Node).
func ScraperConfig(node *rest.Config, certFile, keyFile string) *rest.Config {
	c := rest.AnonymousClientConfig(node)
	c.CertFile, c.KeyFile = certFile, keyFile
	c.UserAgent = node.UserAgent + " metrics-scraper"
	return c
}

// trimmed keeps what Remote and the API read of the Nodes and pods it
// holds: all of the cluster's, where the node's own informers hold its own.
func trimmed(obj any) (any, error) {
	meta := func(m metav1.ObjectMeta) metav1.ObjectMeta {
		return metav1.ObjectMeta{Name: m.Name, Namespace: m.Namespace, UID: m.UID, ResourceVersion: m.ResourceVersion, Labels: m.Labels}
	}
	switch o := obj.(type) {
	case *corev1.Pod:
		return &corev1.Pod{ObjectMeta: meta(o.ObjectMeta), Spec: corev1.PodSpec{NodeName: o.Spec.NodeName},
			Status: corev1.PodStatus{Phase: o.Status.Phase}}, nil
	case *corev1.Node:
		n := &corev1.Node{ObjectMeta: meta(o.ObjectMeta), Status: corev1.NodeStatus{Addresses: o.Status.Addresses, DaemonEndpoints: o.Status.DaemonEndpoints}}
		for _, c := range o.Status.Conditions {
			if c.Type == corev1.NodeReady {
				n.Status.Conditions = []corev1.NodeCondition{c}
			}
		}
		return n, nil
	}
	return obj, nil
}

// ParseResource reads a kubelet's /metrics/resource (the text format) into
// a Sample: the node's CPU seconds and working set, and each container's,
// with their timestamps (now where a reading has none). Pods have no UIDs.
// A pod one of whose containers lacks a reading is left out, rather than
// reported with part of its usage.
func ParseResource(in io.Reader, now time.Time) (*Sample, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(in)
	if err != nil {
		return nil, fmt.Errorf("/metrics/resource: %w", err)
	}
	if f := fams["resource_scrape_error"]; f != nil && len(f.Metric) > 0 && value(f.Metric[0]) != 0 {
		return nil, errors.New("/metrics/resource: the node could not read its usage (resource_scrape_error 1)")
	}
	cpu, mem := fams["node_cpu_usage_seconds_total"], fams["node_memory_working_set_bytes"]
	if len(cpu.GetMetric()) != 1 || len(mem.GetMetric()) != 1 {
		return nil, errors.New("/metrics/resource: no node_cpu_usage_seconds_total or node_memory_working_set_bytes: is it a kubelet's?")
	}
	ncpu, ok1 := nanos(value(cpu.Metric[0]))
	nmem, ok2 := count(value(mem.Metric[0]))
	if !ok1 || !ok2 {
		return nil, errors.New("/metrics/resource: the node's usage is negative or not a number")
	}
	sm := &Sample{NodeOK: true, Node: Usage{Time: stamp(cpu.Metric[0], now), CPUNanos: ncpu, MemoryWorkingSet: nmem}}

	type key struct{ ns, pod, container string }
	keyOf := func(m *dto.Metric) key {
		var k key
		for _, l := range m.GetLabel() {
			switch l.GetName() {
			case "namespace":
				k.ns = l.GetValue()
			case "pod":
				k.pod = l.GetValue()
			case "container":
				k.container = l.GetValue()
			}
		}
		return k
	}
	mems := map[key]*dto.Metric{}
	for _, m := range fams["container_memory_working_set_bytes"].GetMetric() {
		mems[keyOf(m)] = m
	}
	type podKey struct{ ns, name string }
	index := map[podKey]int{}
	partial := map[podKey]bool{}
	for _, m := range fams["container_cpu_usage_seconds_total"].GetMetric() {
		k := keyOf(m)
		if k.ns == "" || k.pod == "" || k.container == "" {
			continue
		}
		pk := podKey{k.ns, k.pod}
		c, ok1 := nanos(value(m))
		var w uint64
		ok2 := mems[k] != nil
		if ok2 {
			w, ok2 = count(value(mems[k]))
		}
		if !ok1 || !ok2 {
			partial[pk] = true
			continue
		}
		i, ok := index[pk]
		if !ok {
			i = len(sm.Pods)
			index[pk] = i
			sm.Pods = append(sm.Pods, PodSample{Namespace: k.ns, Name: k.pod})
		}
		sm.Pods[i].Containers = append(sm.Pods[i].Containers, ContainerSample{Name: k.container,
			Usage: Usage{Time: stamp(m, now), CPUNanos: c, MemoryWorkingSet: w}})
	}
	if len(partial) > 0 {
		pods := sm.Pods[:0]
		for _, p := range sm.Pods {
			if !partial[podKey{p.Namespace, p.Name}] {
				pods = append(pods, p)
			}
		}
		sm.Pods = pods
	}
	return sm, nil
}

// value is a reading whatever the family's declared type.
func value(m *dto.Metric) float64 {
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	default:
		return m.GetUntyped().GetValue()
	}
}

func stamp(m *dto.Metric, now time.Time) time.Time {
	if m.TimestampMs == nil {
		return now
	}
	return time.UnixMilli(m.GetTimestampMs())
}

// nanos turns CPU seconds into nanoseconds.
func nanos(secs float64) (uint64, bool) { return count(secs * 1e9) }

func count(v float64) (uint64, bool) {
	if math.IsNaN(v) || v < 0 || v >= math.MaxUint64 {
		return 0, false
	}
	return uint64(math.Round(v)), true
}
