package metrics

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/k3sm-dev/k3sm/internal/pki"
	"github.com/k3sm-dev/k3sm/internal/testutil/syncbuf"
	"github.com/prometheus/common/expfmt"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1listers "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	metricsclient "k8s.io/metrics/pkg/client/clientset/versioned"
)

// resourceText is what a kubelet's /metrics/resource answers for sm.
func resourceText(t *testing.T, sm *Sample) []byte {
	t.Helper()
	var buf bytes.Buffer
	enc := expfmt.NewEncoder(&buf, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, f := range ResourceFamilies(sm) {
		if err := enc.Encode(f); err != nil {
			t.Fatal(err)
		}
	}
	return buf.Bytes()
}

func TestParseResourceRoundTrip(t *testing.T) {
	sm := &Sample{NodeOK: true, Node: Usage{Time: at(0).Add(123 * time.Millisecond), CPUNanos: 1234567891, MemoryWorkingSet: 3 << 30},
		Pods: []PodSample{pod("a", ctr("web", 1, 3e9), ctr("log", 2, 1e9)), {Namespace: "kube-system", Name: "b", Containers: []ContainerSample{ctr("x", 3, 987654321)}}}}
	got, err := ParseResource(bytes.NewReader(resourceText(t, sm)), at(99))
	if err != nil {
		t.Fatal(err)
	}
	if n := got.Node; !got.NodeOK || !n.Time.Equal(sm.Node.Time) || n.CPUNanos != sm.Node.CPUNanos || n.MemoryWorkingSet != sm.Node.MemoryWorkingSet {
		t.Errorf("node: %+v, want %+v", got.Node, sm.Node)
	}
	if len(got.Pods) != 2 {
		t.Fatalf("pods: %+v", got.Pods)
	}
	for i, p := range got.Pods {
		want := sm.Pods[i]
		if p.Namespace != want.Namespace || p.Name != want.Name || p.UID != "" || len(p.Containers) != len(want.Containers) {
			t.Fatalf("pod %d: %+v, want %+v without a UID", i, p, want)
		}
		for j, c := range p.Containers {
			if w := want.Containers[j]; c.Name != w.Name || !c.Time.Equal(w.Time) || c.CPUNanos != w.CPUNanos || c.MemoryWorkingSet != w.MemoryWorkingSet {
				t.Errorf("%s/%s container %d: %+v, want %+v", p.Namespace, p.Name, j, c, w)
			}
		}
	}

	// Without a machine-wide reading the node is the sum of its containers.
	sm.NodeOK = false
	got, err = ParseResource(bytes.NewReader(resourceText(t, sm)), at(99))
	if err != nil || got.Node.CPUNanos != 3e9+1e9+987654321 {
		t.Errorf("node from containers: %+v %v", got, err)
	}
}

func TestParseResourceRefuses(t *testing.T) {
	node := "node_cpu_usage_seconds_total 10 1000\nnode_memory_working_set_bytes 5 1000\n"
	for name, tc := range map[string]struct {
		body, err string
	}{
		"scrape error":     {node + "resource_scrape_error 1\n", "resource_scrape_error"},
		"not the families": {"up 1\n", "node_cpu_usage_seconds_total"},
		"not the format":   {"{{{", "/metrics/resource"},
		"negative":         {"node_cpu_usage_seconds_total -1\nnode_memory_working_set_bytes 5\n", "negative"},
	} {
		if _, err := ParseResource(strings.NewReader(tc.body), at(0)); err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("%s: %v, want an error with %q", name, err, tc.err)
		}
	}
	// A timestamp-less reading is taken now; a pod with a container
	// missing its memory is left out, not reported with part of its usage.
	sm, err := ParseResource(strings.NewReader(node+`container_cpu_usage_seconds_total{container="a",namespace="ns",pod="p"} 1
container_cpu_usage_seconds_total{container="b",namespace="ns",pod="p"} 1
container_memory_working_set_bytes{container="a",namespace="ns",pod="p"} 7
container_cpu_usage_seconds_total{container="c",namespace="ns",pod="q"} 2
container_memory_working_set_bytes{container="c",namespace="ns",pod="q"} 9
`), at(5))
	if err != nil || len(sm.Pods) != 1 || sm.Pods[0].Name != "q" || !sm.Pods[0].Containers[0].Time.Equal(at(5)) || !sm.Node.Time.Equal(time.UnixMilli(1000)) {
		t.Fatalf("%+v %v", sm, err)
	}
}

// testPKI is a cluster's two CAs: the server CA signs the kubelets'
// serving certificates, the client CA the scraper's.
type testPKI struct {
	dir              string
	serverCA, client *pki.CA
	clientPool       *x509.CertPool
}

func newTestPKI(t *testing.T) *testPKI {
	t.Helper()
	dir := t.TempDir()
	p := &testPKI{dir: dir}
	var err error
	if p.serverCA, err = pki.LoadOrCreateCA(dir, "server-ca", "server"); err != nil {
		t.Fatal(err)
	}
	if p.client, err = pki.LoadOrCreateCA(dir, "client-ca", "clients"); err != nil {
		t.Fatal(err)
	}
	p.clientPool = x509.NewCertPool()
	p.clientPool.AddCert(p.client.Cert)
	return p
}

// scraper is a KubeletClient with the client CA's scraper certificate.
func (p *testPKI) scraper(t *testing.T) *http.Client {
	t.Helper()
	leaf, err := p.client.Ensure(p.dir, "scraper", pki.LeafSpec{CommonName: "k3sm:metrics-scraper", Client: true})
	if err != nil {
		t.Fatal(err)
	}
	c, err := KubeletClient(leaf.CertPath, leaf.KeyPath, p.serverCA.CertPath)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// fakeKubelet serves /metrics/resource as a kubelet in webhook mode would
// to the scraper: only to a client certificate from the client CA. Each
// request answers the next of samples (the last one again after that),
// or 503 while down.
type fakeKubelet struct {
	srv     *httptest.Server
	mu      sync.Mutex
	samples []*Sample
	hits    int
	down    bool
	users   []string
}

func newFakeKubelet(t *testing.T, p *testPKI, serving *pki.CA, spec pki.LeafSpec, samples ...*Sample) *fakeKubelet {
	t.Helper()
	k := &fakeKubelet{samples: samples}
	k.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		k.mu.Lock()
		defer k.mu.Unlock()
		if r.URL.Path != "/metrics/resource" {
			http.NotFound(w, r)
			return
		}
		k.users = append(k.users, r.TLS.PeerCertificates[0].Subject.CommonName)
		if k.down {
			http.Error(w, "runtime not answering", http.StatusServiceUnavailable)
			return
		}
		sm := k.samples[min(k.hits, len(k.samples)-1)]
		k.hits++
		w.Header().Set("Content-Type", string(expfmt.NewFormat(expfmt.TypeTextPlain)))
		_, _ = w.Write(resourceText(t, sm))
	}))
	leaf, err := serving.Ensure(t.TempDir(), "serving", spec)
	if err != nil {
		t.Fatal(err)
	}
	pair, err := tls.LoadX509KeyPair(leaf.CertPath, leaf.KeyPath)
	if err != nil {
		t.Fatal(err)
	}
	k.srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshakes
	k.srv.TLS = &tls.Config{Certificates: []tls.Certificate{pair}, ClientCAs: p.clientPool, ClientAuth: tls.RequireAndVerifyClientCert}
	k.srv.StartTLS()
	t.Cleanup(k.srv.Close)
	return k
}

func (k *fakeKubelet) setDown(down bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.down = down
}

func (k *fakeKubelet) requests() (int, []string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.users), append([]string(nil), k.users...)
}

var kubeletSpec = pki.LeafSpec{CommonName: "system:node:n2", DNSNames: []string{"n2"}, IPs: []net.IP{net.ParseIP("127.0.0.1")}, Server: true}

// testNode is a Node whose kubelet is at addr (host:port).
func testNode(t *testing.T, name, addr string, ready bool, lbls map[string]string) *corev1.Node {
	t.Helper()
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	p, _ := strconv.Atoi(port)
	status := corev1.ConditionTrue
	if !ready {
		status = corev1.ConditionFalse
	}
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: lbls}, Status: corev1.NodeStatus{
		Addresses:       []corev1.NodeAddress{{Type: corev1.NodeHostName, Address: name}, {Type: corev1.NodeInternalIP, Address: host}},
		DaemonEndpoints: corev1.NodeDaemonEndpoints{KubeletEndpoint: corev1.DaemonEndpoint{Port: int32(p)}},
		Conditions:      []corev1.NodeCondition{{Type: corev1.NodeReady, Status: status}}}}
}

func indexer(t *testing.T, objs ...any) cache.Indexer {
	t.Helper()
	idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	for _, o := range objs {
		if err := idx.Add(o); err != nil {
			t.Fatal(err)
		}
	}
	return idx
}

type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = t
}

// TestRemoteNodesThroughAPI: the server's node n1 scrapes n2's kubelet
// (not itself, not the NotReady n3) over mutual TLS; after two scrapes the
// API lists n2 and its pod beside n1's own, leaves out a pod the API has
// on another node and one it does not have, and once n2 stops answering
// its readings go stale; answering again after the gap, it starts over.
func TestRemoteNodesThroughAPI(t *testing.T) {
	p := newTestPKI(t)
	remoteSample := func(s int, cpu uint64) *Sample {
		return &Sample{NodeOK: true, Node: Usage{Time: at(s), CPUNanos: 100e9 + 20*cpu, MemoryWorkingSet: 2 << 30}, Pods: []PodSample{
			{Namespace: "ns", Name: "web", Containers: []ContainerSample{ctr("web", s, cpu)}},
			{Namespace: "ns", Name: "elsewhere", Containers: []ContainerSample{ctr("x", s, cpu)}},
			{Namespace: "ns", Name: "gone", Containers: []ContainerSample{ctr("x", s, cpu)}},
		}}
	}
	k := newFakeKubelet(t, p, p.serverCA, kubeletSpec, remoteSample(0, 1e9), remoteSample(10, 6e9), remoteSample(100, 10e9), remoteSample(110, 15e9))
	addr := k.srv.Listener.Addr().String()
	nodes := corev1listers.NewNodeLister(indexer(t,
		testNode(t, "n1", addr, true, map[string]string{"zone": "a"}),
		testNode(t, "n2", addr, true, map[string]string{"zone": "b"}),
		testNode(t, "n3", addr, false, nil)))
	allPods := corev1listers.NewPodLister(indexer(t,
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web", UID: "uid-web", Labels: map[string]string{"app": "web"}}, Spec: corev1.PodSpec{NodeName: "n2"}},
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "elsewhere", UID: "uid-e"}, Spec: corev1.PodSpec{NodeName: "n9"}}))
	clock := &fakeClock{now: at(1)}
	var logs syncbuf.Buffer
	remote := &Remote{Self: "n1", Nodes: nodes, Pods: allPods, Client: p.scraper(t), Timeout: 5 * time.Second, MaxAge: 30 * time.Second,
		Log: slog.New(slog.NewTextHandler(&logs, nil)), Now: clock.Now}

	own := NewStore()
	own.Add(&Sample{NodeOK: true, Node: Usage{Time: at(0), CPUNanos: 0, MemoryWorkingSet: 1 << 30}, Pods: []PodSample{pod("local", ctr("c", 0, 0))}})
	own.Add(&Sample{NodeOK: true, Node: Usage{Time: at(10), CPUNanos: 10e9, MemoryWorkingSet: 1 << 30}, Pods: []PodSample{pod("local", ctr("c", 10, 1e9))}})
	ownPods := corev1listers.NewPodLister(indexer(t, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "local", UID: "uid-local"}}))
	api := &API{Store: own, NodeName: "n1", Pods: ownPods, Remote: remote, MaxAge: 30 * time.Second, Now: clock.Now,
		NodeLabels: func(context.Context) map[string]string { return map[string]string{"zone": "a"} }}
	srv := httptest.NewServer(api)
	t.Cleanup(srv.Close)
	c, err := metricsclient.NewForConfig(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	podNames := func() []string {
		t.Helper()
		l, err := c.MetricsV1beta1().PodMetricses("").List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, pm := range l.Items {
			names = append(names, pm.Name)
		}
		return names
	}
	nodeNames := func() []string {
		t.Helper()
		l, err := c.MetricsV1beta1().NodeMetricses().List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, nm := range l.Items {
			names = append(names, nm.Name)
		}
		return names
	}

	remote.scrapeAll(ctx)
	if got := nodeNames(); strings.Join(got, ",") != "n1" {
		t.Fatalf("after one scrape n2 has no rate yet: %v", got)
	}
	clock.set(at(11))
	remote.scrapeAll(ctx)
	if n, users := k.requests(); n != 2 || users[0] != "k3sm:metrics-scraper" {
		t.Fatalf("kubelet requests %d by %v: want one a round, from n2 only (not n1 itself, not NotReady n3), as the scraper", n, users)
	}
	if got := strings.Join(nodeNames(), ","); got != "n1,n2" {
		t.Fatalf("nodes %s", got)
	}
	if got := strings.Join(podNames(), ","); got != "local,web" {
		t.Fatalf("pods %s: elsewhere is on n9 and gone is not in the API; neither is n2's", got)
	}
	web, err := c.MetricsV1beta1().PodMetricses("ns").Get(ctx, "web", metav1.GetOptions{})
	if err != nil || web.Labels["app"] != "web" || len(web.Containers) != 1 || web.Containers[0].Usage.Cpu().MilliValue() != 500 ||
		!web.Timestamp.Time.Equal(at(10)) || web.Window.Duration != 10*time.Second {
		t.Fatalf("web: %+v %v", web, err)
	}
	n2, err := c.MetricsV1beta1().NodeMetricses().Get(ctx, "n2", metav1.GetOptions{})
	if err != nil || n2.Usage.Cpu().Value() != 10 || n2.Usage.Memory().Value() != 2<<30 || n2.Labels["zone"] != "b" {
		t.Fatalf("n2: %+v %v", n2, err)
	}
	if l, err := c.MetricsV1beta1().NodeMetricses().List(ctx, metav1.ListOptions{LabelSelector: "zone=b"}); err != nil || len(l.Items) != 1 || l.Items[0].Name != "n2" {
		t.Fatalf("label selector: %+v %v", l, err)
	}
	if l, err := c.MetricsV1beta1().PodMetricses("").List(ctx, metav1.ListOptions{LabelSelector: "app=web"}); err != nil || len(l.Items) != 1 {
		t.Fatalf("pod label selector: %+v %v", l, err)
	}

	// n2 stops answering: logged once, its readings served until MaxAge
	// after its last answer, then not at all.
	k.setDown(true)
	for _, s := range []int{26, 41} {
		clock.set(at(s))
		remote.scrapeAll(ctx)
	}
	if _, err := c.MetricsV1beta1().NodeMetricses().Get(ctx, "n2", metav1.GetOptions{}); err != nil {
		t.Fatalf("n2 30 s after its last answer: %v", err)
	}
	clock.set(at(42))
	if got := podNames(); slices.Contains(got, "web") {
		t.Fatalf("stale pod served: %v", got)
	}
	if _, err := c.MetricsV1beta1().NodeMetricses().Get(ctx, "n2", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("stale node served: %v", err)
	}
	if n := strings.Count(logs.String(), "metrics scrape of node failed"); n != 1 || !strings.Contains(logs.String(), "503") {
		t.Fatalf("failure logged %d times, want once:\n%s", n, logs.String())
	}
	// Answering again after the gap, it rates only from new readings.
	k.setDown(false)
	clock.set(at(101))
	remote.scrapeAll(ctx)
	if !strings.Contains(logs.String(), "metrics scrape of node works again") {
		t.Fatalf("recovery not logged:\n%s", logs.String())
	}
	if got := nodeNames(); slices.Contains(got, "n2") {
		t.Fatalf("n2 rated across its gap: %v", got)
	}
	clock.set(at(111))
	remote.scrapeAll(ctx)
	web, err = c.MetricsV1beta1().PodMetricses("ns").Get(ctx, "web", metav1.GetOptions{})
	if err != nil || web.Window.Duration != 10*time.Second || web.Containers[0].Usage.Cpu().MilliValue() != 500 {
		t.Fatalf("web after recovery: %+v %v", web, err)
	}

	// A deleted Node is not served, and forgotten at the next round.
	nodes = corev1listers.NewNodeLister(indexer(t, testNode(t, "n1", addr, true, nil)))
	remote.Nodes = nodes
	if got := nodeNames(); slices.Contains(got, "n2") {
		t.Fatalf("deleted node served: %v", got)
	}
	remote.scrapeAll(ctx)
	if len(remote.nodes) != 0 {
		t.Fatalf("deleted node's store kept: %v", remote.nodes)
	}
}

// Only a serving certificate of the cluster's server CA, for the IP
// dialled, is trusted; the scraper's certificate is what gets it in.
func TestKubeletClientVerifiesKubelet(t *testing.T) {
	p := newTestPKI(t)
	other, err := pki.LoadOrCreateCA(t.TempDir(), "other-ca", "other")
	if err != nil {
		t.Fatal(err)
	}
	sample := &Sample{NodeOK: true, Node: Usage{Time: at(0)}}
	scrape := func(client *http.Client, k *fakeKubelet) error {
		r := &Remote{Client: client, Now: func() time.Time { return at(0) }}
		_, err := r.scrape(context.Background(), k.srv.Listener.Addr().String())
		return err
	}
	if err := scrape(p.scraper(t), newFakeKubelet(t, p, p.serverCA, kubeletSpec, sample)); err != nil {
		t.Fatalf("the cluster's kubelet: %v", err)
	}
	if err := scrape(p.scraper(t), newFakeKubelet(t, p, other, kubeletSpec, sample)); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("a serving certificate from another CA: %v", err)
	}
	notForIP := pki.LeafSpec{CommonName: "system:node:n2", DNSNames: []string{"n2"}, Server: true}
	if err := scrape(p.scraper(t), newFakeKubelet(t, p, p.serverCA, notForIP, sample)); err == nil || !strings.Contains(err.Error(), "127.0.0.1") {
		t.Errorf("a serving certificate not for the IP dialled: %v", err)
	}
	// A client certificate from another CA is not the scraper's.
	leaf, err := other.Ensure(t.TempDir(), "scraper", pki.LeafSpec{CommonName: "k3sm:metrics-scraper", Client: true})
	if err != nil {
		t.Fatal(err)
	}
	impostor, err := KubeletClient(leaf.CertPath, leaf.KeyPath, p.serverCA.CertPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := scrape(impostor, newFakeKubelet(t, p, p.serverCA, kubeletSpec, sample)); err == nil {
		t.Error("a client certificate from another CA was accepted")
	}
}

func TestKubeletAddr(t *testing.T) {
	n := testNode(t, "n2", "10.0.0.2:10250", true, nil)
	if a, err := KubeletAddr(n); err != nil || a != "10.0.0.2:10250" {
		t.Errorf("InternalIP: %s %v", a, err)
	}
	n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeExternalIP, Address: "fd00::2"}}
	if a, err := KubeletAddr(n); err != nil || a != "[fd00::2]:10250" {
		t.Errorf("first address: %s %v", a, err)
	}
	n.Status.DaemonEndpoints.KubeletEndpoint.Port = 0
	if _, err := KubeletAddr(n); err == nil {
		t.Error("no kubelet port")
	}
}

// The scraper talks to the node's API server with its own certificate
// only.
func TestScraperConfig(t *testing.T) {
	node := &rest.Config{Host: "https://10.0.0.1:6443", UserAgent: "k3sm-node/v1", BearerToken: "t",
		TLSClientConfig: rest.TLSClientConfig{CAData: []byte("CA"), CertData: []byte("node cert"), KeyData: []byte("node key")}}
	c := ScraperConfig(node, "/s.crt", "/s.key")
	if c.Host != node.Host || string(c.CAData) != "CA" || c.CertData != nil || c.KeyData != nil || c.BearerToken != "" ||
		c.CertFile != "/s.crt" || c.KeyFile != "/s.key" || string(node.CertData) != "node cert" {
		t.Fatalf("%+v", c)
	}
}

func TestTrimmed(t *testing.T) {
	p, _ := trimmed(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "a", UID: "u", Labels: map[string]string{"app": "x"},
		Annotations: map[string]string{"big": "x"}}, Spec: corev1.PodSpec{NodeName: "n2", Containers: []corev1.Container{{Name: "c"}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{{Type: corev1.PodReady}}}})
	if pod := p.(*corev1.Pod); pod.UID != "u" || pod.Labels["app"] != "x" || pod.Spec.NodeName != "n2" || pod.Status.Phase != corev1.PodRunning ||
		pod.Annotations != nil || pod.Spec.Containers != nil || pod.Status.Conditions != nil {
		t.Errorf("pod %+v", pod)
	}
	n := testNode(t, "n2", "10.0.0.2:10250", true, map[string]string{"zone": "b"})
	n.Status.Images = []corev1.ContainerImage{{Names: []string{"big"}}}
	n.Status.Conditions = append([]corev1.NodeCondition{{Type: corev1.NodeMemoryPressure}}, n.Status.Conditions...)
	o, _ := trimmed(n)
	if node := o.(*corev1.Node); !nodeReady(node) || node.Labels["zone"] != "b" || node.Status.Images != nil || len(node.Status.Conditions) != 1 {
		t.Errorf("node %+v", node)
	} else if a, err := KubeletAddr(node); err != nil || a != "10.0.0.2:10250" {
		t.Errorf("node address %s %v", a, err)
	}
}
