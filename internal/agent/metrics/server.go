package metrics

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/k3sm-dev/k3sm/internal/roleconfig"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/group"
	"k8s.io/apiserver/pkg/authentication/request/headerrequest"
	x509request "k8s.io/apiserver/pkg/authentication/request/x509"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/apiserver/pkg/authorization/authorizerfactory"
	apirequest "k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corev1listers "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

// DefaultResolution is how often the node is scraped: metrics-server's
// default metric resolution, and the HPA's sync period.
const DefaultResolution = 15 * time.Second

// ServeConfig is what the node process needs to serve the metrics API:
// its part of the node's role config.
type ServeConfig = roleconfig.MetricsAPI

// Deps are what the node process hands over.
type Deps struct {
	Client kubernetes.Interface // the node's own client: SubjectAccessReviews and its Node
	// Config is the node's API client configuration: the scraper's client
	// is made from it (ScraperConfig).
	Config   *rest.Config
	NodeName string
	Pods     corev1listers.PodLister
	Source   Source
	Log      *slog.Logger
}

// Serve starts scraping and serving; it returns once the port listens and
// stops when ctx ends.
func Serve(ctx context.Context, cfg ServeConfig, d Deps) error {
	if cfg.Addr == "" {
		return nil
	}
	if cfg.Resolution <= 0 {
		cfg.Resolution = DefaultResolution
	}
	pair, err := tls.LoadX509KeyPair(cfg.CertFile, cfg.KeyFile)
	if err != nil {
		return fmt.Errorf("metrics serving certificate: %w", err)
	}
	caPEM, err := os.ReadFile(cfg.RequestHeaderCAFile)
	if err != nil {
		return fmt.Errorf("request-header CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return fmt.Errorf("request-header CA %s: no certificates", cfg.RequestHeaderCAFile)
	}
	authz, err := authorizerfactory.DelegatingAuthorizerConfig{
		SubjectAccessReviewClient: d.Client.AuthorizationV1(),
		AllowCacheTTL:             10 * time.Second,
		DenyCacheTTL:              10 * time.Second,
		WebhookRetryBackoff:       &wait.Backoff{Duration: 500 * time.Millisecond, Factor: 1.5, Jitter: 0.2, Steps: 5},
	}.New()
	if err != nil {
		return err
	}
	store := NewStore()
	api := &API{
		Store:    store,
		NodeName: d.NodeName,
		Pods:     d.Pods,
		MaxAge:   3 * cfg.Resolution,
		NodeLabels: cachedLabels(func(ctx context.Context) (map[string]string, error) {
			n, err := d.Client.CoreV1().Nodes().Get(ctx, d.NodeName, metav1.GetOptions{})
			if err != nil {
				return nil, err
			}
			return n.Labels, nil
		}, 30*time.Second),
	}
	var startRemote func()
	if cfg.ScrapeCertFile != "" {
		if api.Remote, startRemote, err = newRemote(ctx, cfg, d, api.MaxAge); err != nil {
			return err
		}
	}
	h := Handler(FrontProxyAuthenticator(pool, cfg.AllowedNames), authz, api)
	tc := &tls.Config{Certificates: []tls.Certificate{pair}, ClientCAs: pool, ClientAuth: tls.VerifyClientCertIfGiven, MinVersion: tls.VersionTLS12}
	ln, err := tls.Listen("tcp", cfg.Addr, tc)
	if err != nil {
		return fmt.Errorf("metrics API on %s: %w", cfg.Addr, err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 30 * time.Second, ErrorLog: nil}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			d.Log.Error("metrics API stopped", "err", err)
		}
	}()
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	go Scrape(ctx, d.Source, store, cfg.Resolution, d.Log)
	if startRemote != nil {
		startRemote()
	}
	d.Log.Info("serving metrics.k8s.io", "addr", cfg.Addr, "resolution", cfg.Resolution.String(), "otherNodes", api.Remote != nil)
	return nil
}

// newRemote prepares the scraping of the other nodes (see Remote) with the
// scraper's certificate; start lists the cluster's Nodes and pods and,
// once it has them, scrapes every resolution until ctx ends.
func newRemote(ctx context.Context, cfg ServeConfig, d Deps, maxAge time.Duration) (r *Remote, start func(), err error) {
	if d.Config == nil {
		return nil, nil, errors.New("metrics of other nodes: no API client configuration to list the nodes with")
	}
	hc, err := KubeletClient(cfg.ScrapeCertFile, cfg.ScrapeKeyFile, cfg.KubeletCAFile)
	if err != nil {
		return nil, nil, err
	}
	kc, err := kubernetes.NewForConfig(ScraperConfig(d.Config, cfg.ScrapeCertFile, cfg.ScrapeKeyFile))
	if err != nil {
		return nil, nil, fmt.Errorf("metrics scraper's API client: %w", err)
	}
	f := informers.NewSharedInformerFactoryWithOptions(kc, 0, informers.WithTransform(trimmed))
	nodes, pods := f.Core().V1().Nodes(), f.Core().V1().Pods()
	log := d.Log.With("component", "metrics-scraper")
	r = &Remote{Self: d.NodeName, Nodes: nodes.Lister(), Pods: pods.Lister(), Client: hc,
		Timeout: cfg.Resolution * 2 / 3, MaxAge: maxAge, Log: log}
	synced := []cache.InformerSynced{nodes.Informer().HasSynced, pods.Informer().HasSynced}
	return r, func() {
		f.Start(ctx.Done())
		go func() {
			wctx, cancel := context.WithTimeout(ctx, time.Minute)
			ok := cache.WaitForCacheSync(wctx.Done(), synced...)
			cancel()
			if !ok && ctx.Err() == nil {
				log.Warn("other nodes' metrics wait for the Node and pod lists: the scraper's certificate may lack the RBAC to list them")
				ok = cache.WaitForCacheSync(ctx.Done(), synced...)
			}
			if ok {
				log.Info("scraping the other nodes' kubelets", "resolution", cfg.Resolution.String())
				r.Run(ctx, cfg.Resolution)
			}
		}()
	}, nil
}

// Scrape adds a scrape of src to store every resolution until ctx ends,
// the first one at once. Failures are logged when they start and stop.
func Scrape(ctx context.Context, src Source, store *Store, resolution time.Duration, log *slog.Logger) {
	t := time.NewTicker(resolution)
	defer t.Stop()
	failing := false
	for {
		sctx, cancel := context.WithTimeout(ctx, resolution)
		sm, err := src.Scrape(sctx)
		cancel()
		switch {
		case err != nil && ctx.Err() == nil && !failing:
			log.Warn("metrics scrape failed", "err", err)
			failing = true
		case err == nil:
			if failing {
				log.Info("metrics scrape works again")
			}
			failing = false
			store.Add(sm)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// FrontProxyAuthenticator authenticates the apiserver's aggregation proxy:
// a client certificate from the request-header CA whose common name is one
// of allowed (any, when allowed is empty), carrying the user in
// X-Remote-User, X-Remote-Uid, X-Remote-Group and X-Remote-Extra-*.
func FrontProxyAuthenticator(ca *x509.CertPool, allowed []string) authenticator.Request {
	verify := func() (x509.VerifyOptions, bool) {
		opts := x509request.DefaultVerifyOptions()
		opts.Roots = ca
		return opts, true
	}
	// As the apiserver does, every authenticated user is in
	// system:authenticated (RBAC's discovery roles are bound to it).
	return group.NewAuthenticatedGroupAdder(headerrequest.NewDynamicVerifyOptionsSecure(verify, headerrequest.StaticStringSlice(allowed),
		headerrequest.StaticStringSlice{"X-Remote-User"}, headerrequest.StaticStringSlice{"X-Remote-Uid"},
		headerrequest.StaticStringSlice{"X-Remote-Group"}, headerrequest.StaticStringSlice{"X-Remote-Extra-"}))
}

// Handler authenticates every request with authn, authorizes it with authz
// (as the apiserver would: verb, group, resource, namespace, name, or the
// path for discovery), then passes it to next.
func Handler(authn authenticator.Request, authz authorizer.UnconditionalAuthorizer, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		resp, ok, err := authn.AuthenticateRequest(r)
		if err != nil || !ok {
			msg := "Unauthorized: only the apiserver's front proxy may call the metrics API"
			if err != nil {
				msg += ": " + err.Error()
			}
			writeJSON(w, http.StatusUnauthorized, &metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
				Status: metav1.StatusFailure, Reason: metav1.StatusReasonUnauthorized, Code: http.StatusUnauthorized, Message: msg})
			return
		}
		info, err := requestInfo.NewRequestInfo(r)
		if err != nil {
			info = &apirequest.RequestInfo{Path: r.URL.Path, Verb: "get"}
		}
		attrs := authorizer.AttributesRecord{
			User: resp.User, Verb: info.Verb, Path: info.Path, ResourceRequest: info.IsResourceRequest,
			APIGroup: info.APIGroup, APIVersion: info.APIVersion, Resource: info.Resource, Subresource: info.Subresource,
			Namespace: info.Namespace, Name: info.Name,
		}
		if !info.IsResourceRequest {
			attrs.Verb = map[string]string{http.MethodGet: "get", http.MethodHead: "head", http.MethodPost: "post"}[r.Method]
		}
		dec, reason, err := authz.Authorize(r.Context(), attrs)
		if dec != authorizer.DecisionAllow {
			msg := fmt.Sprintf("%s is forbidden: User %q cannot %s resource %q in API group %q", info.Path, resp.User.GetName(), attrs.Verb, info.Resource, info.APIGroup)
			if !info.IsResourceRequest {
				msg = fmt.Sprintf("forbidden: User %q cannot %s path %q", resp.User.GetName(), attrs.Verb, info.Path)
			}
			if reason != "" {
				msg += ": " + reason
			}
			if err != nil {
				msg += ": " + err.Error()
			}
			writeJSON(w, http.StatusForbidden, &metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
				Status: metav1.StatusFailure, Reason: metav1.StatusReasonForbidden, Code: http.StatusForbidden, Message: msg})
			return
		}
		next.ServeHTTP(w, r)
	})
}

// ListenAddr is the loopback address the server's own node serves on.
func ListenAddr(port int) string { return net.JoinHostPort("127.0.0.1", fmt.Sprint(port)) }
